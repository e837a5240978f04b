/* cuda_weights.c - model tensors as the GPU keeps them.
 *
 * Stored types (what cuBLAS and the kernels read):
 *   1-D tensors (norm weights, biases)       fp32 always (tiny; read by the
 *                                            norm kernels as fp32)
 *   F16 / BF16 matrices                      as they are in the file
 *   F32 matrices                             F16, or F32 with kv_f32 (the
 *                                            small fp32 reference models)
 *   quantized matrices (Q4_0, Q4_1, Q8_0,    dequantized on the host with
 *   Q4_K, Q6_K)                              cpu_tensor_row, stored F16 (F32
 *                                            with kv_f32)
 * Quantized GEMMs on the GPU would save memory and bandwidth; fp16 keeps
 * this backend one cuBLAS call per matmul, and the models specd serves on
 * GPUs ship fp16/bf16.
 *
 * t->data == NULL (benchmark shapes nobody ships): the storage is filled
 * on the GPU with seeded pseudo-random values - matrices uniform in
 * +-1/sqrt(cols) (activations keep their scale through a layer), vectors
 * uniform in [0.9, 1.1] (norm weights near 1); seed = hash of the tensor's
 * name, so every run builds the same model.
 *
 * Loading is synchronous (it happens once, before any step). Rows that need
 * conversion go through a 16 MiB pinned fp32 buffer: dequantize a chunk of
 * rows on the host, copy it up, convert to fp16 on the GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "kernels/cpu/matmul.h"

#define LOAD_CHUNK_ELEMS ((size_t)4 << 20) /* fp32 elements per upload chunk */

/* FNV-1a, 64-bit: a stable seed per tensor name. */
static uint64_t name_seed(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static int load_fail(specd_error *err, const specd_tensor *t, const char *what, cudaError_t e) {
    (void)cudaGetLastError();
    return specd_seterr(err, "cuda backend: tensor '%s': %s: %s", t->name, what,
                        cudaGetErrorString(e));
}

/* The staging buffers, kept for the next tensor (freed with the backend). */
static int ensure_staging(cuda_backend *cb, size_t elems, const specd_tensor *t, specd_error *err) {
    if (elems <= cb->load_elems) return 0;
    cuda_weights_free_staging(cb);
    cudaError_t e = cudaHostAlloc((void **)&cb->load_host, elems * 4, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        cb->load_host = NULL;
        return load_fail(err, t, "staging cudaHostAlloc", e);
    }
    if ((e = cudaMalloc((void **)&cb->load_dev, elems * 4)) != cudaSuccess) {
        cb->load_dev = NULL;
        cuda_weights_free_staging(cb);
        return load_fail(err, t, "staging cudaMalloc", e);
    }
    cb->load_elems = elems;
    return 0;
}

void cuda_weights_free_staging(cuda_backend *cb) {
    if (cb->load_host) cudaFreeHost(cb->load_host);
    if (cb->load_dev) cudaFree(cb->load_dev);
    cb->load_host = NULL;
    cb->load_dev = NULL;
    cb->load_elems = 0;
}

/* Rows of any supported type -> fp32 on the host -> stored type on the GPU. */
static int upload_converted(cuda_backend *cb, cuda_weight *cw, const specd_tensor *t,
                            int64_t rows, int64_t cols, specd_error *err) {
    size_t chunk_rows = LOAD_CHUNK_ELEMS / (size_t)cols;
    if (chunk_rows < 1) chunk_rows = 1;
    if (ensure_staging(cb, chunk_rows * (size_t)cols, t, err)) return -1;
    size_t esz = cw->type == SPECD_F32 ? 4 : 2;
    for (int64_t r0 = 0; r0 < rows; r0 += (int64_t)chunk_rows) {
        int64_t nr = rows - r0 < (int64_t)chunk_rows ? rows - r0 : (int64_t)chunk_rows;
        for (int64_t r = 0; r < nr; r++) cpu_tensor_row(t, r0 + r, cb->load_host + r * cols);
        size_t n = (size_t)nr * (size_t)cols;
        unsigned char *dst = (unsigned char *)cw->data + (size_t)r0 * (size_t)cols * esz;
        cudaError_t e;
        if (cw->type == SPECD_F32) {
            e = cudaMemcpyAsync(dst, cb->load_host, n * 4, cudaMemcpyHostToDevice, cb->stream);
        } else {
            e = cudaMemcpyAsync(cb->load_dev, cb->load_host, n * 4, cudaMemcpyHostToDevice,
                                cb->stream);
            if (e == cudaSuccess) e = cuda_convert_f32(dst, cw->type, cb->load_dev, n, cb->stream);
        }
        /* the host buffer is refilled next round: wait for this chunk */
        if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
        if (e != cudaSuccess) return load_fail(err, t, "upload", e);
    }
    return 0;
}

int cuda_prepare_weight(specd_backend *be, specd_bweight *w, const specd_tensor *t,
                        specd_error *err) {
    cuda_backend *cb = cuda_of(be);
    memset(w, 0, sizeof *w);
    cuda_capture_abort(cb, 0); /* allocates and waits */
    cudaError_t e = cudaSetDevice(cb->device);
    if (e != cudaSuccess) return specd_seterr(err, "cuda backend: cudaSetDevice: %s",
                                              cudaGetErrorString(e));
    int64_t cols = (int64_t)t->ne[0], rows = t->n_dims > 1 ? (int64_t)t->ne[1] : 1;
    if (t->n_dims > 2 && t->ne[2] * t->ne[3] != 1)
        return specd_seterr(err, "cuda backend: tensor '%s' has %u dimensions; weights have at "
                                 "most 2", t->name, t->n_dims);
    if (cols <= 0 || rows <= 0)
        return specd_seterr(err, "cuda backend: tensor '%s' is empty", t->name);
    const specd_dtype_info *info = specd_dtype_get(t->type);
    if (t->data && (!info || !info->supported))
        return specd_seterr(err, "cuda backend: tensor '%s': type %s is not supported", t->name,
                            info && info->name ? info->name : "?");

    int vector = t->n_dims <= 1, kv_f32 = cb->base.kv_type == SPECD_F32;
    specd_dtype store = vector ? SPECD_F32
                        : (t->type == SPECD_F16 || t->type == SPECD_BF16) ? t->type
                        : kv_f32 ? SPECD_F32
                                 : SPECD_F16;
    size_t n = (size_t)rows * (size_t)cols, bytes = n * (store == SPECD_F32 ? 4 : 2);
    cuda_weight *cw = calloc(1, sizeof *cw);
    if (!cw) return specd_seterr(err, "cuda backend: out of host memory");
    cw->type = store;
    if ((e = cudaMalloc(&cw->data, bytes)) != cudaSuccess) {
        free(cw);
        (void)cudaGetLastError();
        return specd_seterr(err, "cuda backend: tensor '%s': cannot allocate %zu bytes on the GPU: %s",
                            t->name, bytes, cudaGetErrorString(e));
    }

    int rc = 0;
    if (!t->data) {
        float lo = 0.9f, hi = 1.1f;
        if (!vector) {
            hi = 1.0f / sqrtf((float)cols);
            lo = -hi;
        }
        e = cuda_fill_random(cw->data, store, n, name_seed(t->name), lo, hi, cb->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
        if (e != cudaSuccess) rc = load_fail(err, t, "random fill", e);
    } else if (t->type == store) {
        /* straight from the mapped file; pageable, so the copy is staged by
         * the driver - then wait, the mapping is the caller's */
        e = cudaMemcpyAsync(cw->data, t->data, bytes, cudaMemcpyHostToDevice, cb->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
        if (e != cudaSuccess) rc = load_fail(err, t, "upload", e);
    } else {
        rc = upload_converted(cb, cw, t, rows, cols, err);
    }
    if (rc) {
        cudaFree(cw->data);
        free(cw);
        return -1;
    }
    w->src = t;
    w->rows = rows;
    w->cols = cols;
    w->bytes = bytes;
    w->impl = cw;
    return 0;
}

void cuda_release_weight(specd_backend *be, specd_bweight *w) {
    cuda_backend *cb = cuda_of(be);
    cuda_weight *cw = w->impl;
    if (cw) {
        cuda_capture_abort(cb, 0);
        (void)cudaSetDevice(cb->device);
        /* queued work may still read it */
        cuda_ok(cb, cudaStreamSynchronize(cb->stream), "release_weight: cudaStreamSynchronize");
        cudaFree(cw->data);
        free(cw);
    }
    memset(w, 0, sizeof *w);
}
