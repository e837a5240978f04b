/* backend.c - picks a compute backend by name. */
#include "backend.h"

#include <string.h>

const char *const specd_precision_names[] = {"fast", "exact", NULL};
const char *const specd_kv_dtype_names[] = {"auto", "f32", "f16", "q8_0", NULL};

specd_backend *specd_backend_create(const specd_backend_opts *opts, specd_error *err) {
    const char *name = opts && opts->name ? opts->name : "cpu";
    if (!strcmp(name, "cpu"))
        return specd_cpu_backend_create(opts ? opts->n_threads : 0,
                                        opts ? opts->precision : SPECD_PRECISION_FAST,
                                        opts ? opts->kv_dtype : SPECD_KV_AUTO, err);
    if (!strcmp(name, "cuda")) {
        /* the CUDA attention kernels read fp16 or fp32 rows only */
        if (opts->kv_dtype == SPECD_KV_Q8_0) {
            specd_seterr(err, "backend: kv_cache_dtype 'q8_0' is CPU only; the cuda backend "
                              "stores 'f16' (the default) or 'f32'");
            return NULL;
        }
        return specd_cuda_backend_create(opts->device, opts->kv_dtype == SPECD_KV_F32, err);
    }
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
