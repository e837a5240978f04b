/* backend.c - picks a compute backend by name. */
#include "backend.h"

#include <string.h>

specd_backend *specd_backend_create(const specd_backend_opts *opts, specd_error *err) {
    const char *name = opts && opts->name ? opts->name : "cpu";
    if (!strcmp(name, "cpu")) return specd_cpu_backend_create(opts ? opts->n_threads : 0, err);
    if (!strcmp(name, "cuda")) {
        specd_seterr(err, "backend: 'cuda' is not built into this binary (no nvcc at build time)");
        return NULL;
    }
    specd_seterr(err, "backend: unknown backend '%s' (expected 'cpu' or 'cuda')", name);
    return NULL;
}
