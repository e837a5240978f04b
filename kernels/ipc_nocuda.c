/* ipc_nocuda.c - kernels/ipc.h in a build without nvcc: every entry point
 * exists and reports that CUDA is not built in, so draft-svc never offers
 * the capability and target-svc never grants it (the bytes path). */
#ifndef SPECD_HAVE_CUDA
#include "ipc.h"

static const char not_built[] = "ipc: CUDA is not built into this binary (no nvcc at build time)";

int specd_ipc_device_uuid(int device, char *out, specd_error *err) {
    (void)device;
    out[0] = '\0';
    return specd_seterr(err, "%s", not_built);
}

specd_ipc_export *specd_ipc_export_create(int device, int hidden_size, specd_error *err) {
    (void)device;
    (void)hidden_size;
    specd_seterr(err, "%s", not_built);
    return NULL;
}

/* unreachable without an export, which cannot be created here */
void specd_ipc_export_handle(const specd_ipc_export *e, specd_ipc_handle *h) {
    (void)e;
    (void)h;
}

int specd_ipc_export_put(specd_ipc_export *e, const float *hidden, specd_error *err) {
    (void)e;
    (void)hidden;
    return specd_seterr(err, "%s", not_built);
}

void specd_ipc_export_free(specd_ipc_export *e) { (void)e; }

specd_ipc_import *specd_ipc_import_map(const specd_ipc_handle *h, int device, specd_error *err) {
    (void)h;
    (void)device;
    specd_seterr(err, "%s", not_built);
    return NULL;
}

int specd_ipc_import_get(specd_ipc_import *m, float *hidden, specd_error *err) {
    (void)m;
    (void)hidden;
    return specd_seterr(err, "%s", not_built);
}

void specd_ipc_import_free(specd_ipc_import *m) { (void)m; }
#else
/* ISO C wants at least one declaration in a translation unit */
typedef int specd_ipc_nocuda_unused;
#endif
