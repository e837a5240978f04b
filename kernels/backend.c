/* backend.c - picks a compute backend by name. */
#include "backend.h"

#include <string.h>

const char *const specd_precision_names[] = {"fast", "exact", NULL};
const char *const specd_kv_dtype_names[] = {"auto", "f32", "f16", NULL};

specd_backend *specd_backend_create(const specd_backend_opts *opts, specd_error *err) {
    const char *name = opts && opts->name ? opts->name : "cpu";
    if (!strcmp(name, "cpu"))
        return specd_cpu_backend_create(opts ? opts->n_threads : 0,
                                        opts ? opts->precision : SPECD_PRECISION_FAST,
                                        opts ? opts->kv_dtype : SPECD_KV_AUTO, err);
    if (!strcmp(name, "cuda"))
        return specd_cuda_backend_create(opts->device, opts->kv_dtype == SPECD_KV_F32, err);
    specd_seterr(err, "backend: unknown backend '%s' (expected 'cpu' or 'cuda')", name);
    return NULL;
}

#ifndef SPECD_HAVE_CUDA
/* Built without nvcc: the CUDA entry points still exist, so callers link and
 * get a clear message instead of a missing symbol. */
specd_backend *specd_cuda_backend_create(int device, int kv_f32, specd_error *err) {
    (void)device;
    (void)kv_f32;
    specd_seterr(err, "backend: 'cuda' is not built into this binary (no nvcc at build time)");
    return NULL;
}
#endif
