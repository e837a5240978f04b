/* cuda_ipc.c - kernels/ipc.h on the CUDA runtime: one exported fp16 buffer
 * per granted session on the target, one mapping per session on the
 * client. Host code in C; the copies are synchronous cudaMemcpy on the
 * legacy default stream, which is what makes "written before the response
 * is sent" and "read after it arrived" true across the two processes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "common/util/dtype.h"
#include "kernels/ipc.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == SPECD_IPC_HANDLE_BYTES,
               "SPECD_IPC_HANDLE_BYTES must be the size of cudaIpcMemHandle_t");

struct specd_ipc_export {
    int device, hidden_size;
    void *dev;                /* hidden_size fp16 values */
    cudaIpcMemHandle_t handle;
    char uuid[33];
    uint16_t *host;           /* fp16 staging for put */
};

struct specd_ipc_import {
    int device, hidden_size;
    void *dev;                /* mapped: base of the exporter's allocation */
    size_t offset;
    uint16_t *host;
};

static int cuda_err(specd_error *err, const char *what, cudaError_t e) {
    return specd_seterr(err, "ipc: %s: %s", what, cudaGetErrorString(e));
}

int specd_ipc_device_uuid(int device, char *out, specd_error *err) {
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    out[0] = '\0';
    if (e != cudaSuccess) return cuda_err(err, "device properties", e);
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", (unsigned char)p.uuid.bytes[i]);
    return 0;
}

specd_ipc_export *specd_ipc_export_create(int device, int hidden_size, specd_error *err) {
    specd_ipc_export *e = calloc(1, sizeof *e);
    if (!e || !(e->host = malloc(sizeof(uint16_t) * (size_t)hidden_size))) {
        free(e);
        specd_seterr(err, "ipc: out of memory");
        return NULL;
    }
    e->device = device;
    e->hidden_size = hidden_size;
    cudaError_t ce;
    /* a thread of the service, not the scheduler's: it picks the device
     * itself (the primary context is shared by every thread) */
    if ((ce = cudaSetDevice(device)) != cudaSuccess ||
        (ce = cudaMalloc(&e->dev, sizeof(uint16_t) * (size_t)hidden_size)) != cudaSuccess) {
        cuda_err(err, "allocating the hidden-state buffer", ce);
        specd_ipc_export_free(e);
        return NULL;
    }
    if ((ce = cudaIpcGetMemHandle(&e->handle, e->dev)) != cudaSuccess) {
        cuda_err(err, "cudaIpcGetMemHandle", ce);
        specd_ipc_export_free(e);
        return NULL;
    }
    if (specd_ipc_device_uuid(device, e->uuid, err)) {
        specd_ipc_export_free(e);
        return NULL;
    }
    return e;
}

void specd_ipc_export_handle(const specd_ipc_export *e, specd_ipc_handle *h) {
    h->mem_handle = (const uint8_t *)e->handle.reserved;
    h->mem_handle_len = sizeof e->handle;
    h->offset = 0; /* one allocation per session: the state starts it */
    h->hidden_size = e->hidden_size;
    h->device_uuid = e->uuid;
}

int specd_ipc_export_put(specd_ipc_export *e, const float *hidden, specd_error *err) {
    for (int i = 0; i < e->hidden_size; i++) e->host[i] = specd_f32_to_fp16(hidden[i]);
    cudaError_t ce = cudaSetDevice(e->device);
    if (ce == cudaSuccess)
        ce = cudaMemcpy(e->dev, e->host, sizeof(uint16_t) * (size_t)e->hidden_size,
                        cudaMemcpyHostToDevice);
    /* cudaMemcpy from pageable memory returns once the bytes are staged, not
     * when they have landed: another process reading the buffer right after
     * our answer could see the previous step's values (test_hidden_ipc did,
     * on the first GPU run). Wait for the copy on the legacy stream. */
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(0);
    return ce == cudaSuccess ? 0 : cuda_err(err, "writing the hidden state", ce);
}

void specd_ipc_export_free(specd_ipc_export *e) {
    if (!e) return;
    if (e->dev) {
        cudaSetDevice(e->device);
        cudaFree(e->dev);
    }
    free(e->host);
    free(e);
}

specd_ipc_import *specd_ipc_import_map(const specd_ipc_handle *g, int device, specd_error *err) {
    specd_ipc_import *m = calloc(1, sizeof *m);
    if (!m || !(m->host = malloc(sizeof(uint16_t) * (size_t)g->hidden_size))) {
        free(m);
        specd_seterr(err, "ipc: out of memory");
        return NULL;
    }
    m->device = device;
    m->hidden_size = g->hidden_size;
    m->offset = (size_t)g->offset;
    cudaIpcMemHandle_t h;
    memcpy(h.reserved, g->mem_handle, sizeof h);
    cudaError_t ce = cudaSetDevice(device);
    /* lazy peer access: a buffer on another GPU of the node (NVLink) maps
     * too; on another node, or in the exporting process itself, this fails
     * and the caller keeps the bytes path */
    if (ce == cudaSuccess) ce = cudaIpcOpenMemHandle(&m->dev, h, cudaIpcMemLazyEnablePeerAccess);
    if (ce != cudaSuccess) {
        m->dev = NULL;
        cuda_err(err, "cudaIpcOpenMemHandle", ce);
        specd_ipc_import_free(m);
        return NULL;
    }
    return m;
}

int specd_ipc_import_get(specd_ipc_import *m, float *hidden, specd_error *err) {
    cudaError_t ce = cudaSetDevice(m->device);
    if (ce == cudaSuccess)
        ce = cudaMemcpy(m->host, (const char *)m->dev + m->offset,
                        sizeof(uint16_t) * (size_t)m->hidden_size, cudaMemcpyDeviceToHost);
    if (ce != cudaSuccess) return cuda_err(err, "reading the hidden state", ce);
    for (int i = 0; i < m->hidden_size; i++) hidden[i] = specd_fp16_to_f32(m->host[i]);
    return 0;
}

void specd_ipc_import_free(specd_ipc_import *m) {
    if (!m) return;
    if (m->dev) {
        cudaSetDevice(m->device);
        cudaIpcCloseMemHandle(m->dev);
    }
    free(m->host);
    free(m);
}
