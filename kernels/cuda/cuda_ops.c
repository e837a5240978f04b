/* cuda_ops.c - the compute ops of kernels/backend.h on the GPU.
 *
 * Each op checks what it can on the host (shapes, that a step exists),
 * then queues its kernel(s) on the backend's stream; a failed check or
 * launch is recorded and reported by finish(). Ops never synchronize, so
 * they can be recorded into a graph; an op that must grow a scratch buffer
 * first ends any recording (cuda_scratch_reserve). Step data (tokens,
 * rows, masks, page tables) is passed as device addresses into the step
 * buffer, never as values. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

static int need_step(cuda_backend *cb, const char *op) {
    if (cb->have_step) return 1;
    cuda_fail(cb, "%s: no step (begin_step failed or was not called)", op);
    return 0;
}

static const cuda_weight *weight_of(cuda_backend *cb, const specd_bweight *w, const char *op) {
    if (w && w->impl) return w->impl;
    cuda_fail(cb, "%s: weight not prepared by this backend", op);
    return NULL;
}

/* A norm's weight/bias: an fp32 vector of `dim` (prepare_weight stores 1-D
 * tensors as fp32), or NULL for none (w NULL, or an empty specd_bweight).
 * *ok = 0 when it is something else. */
static const float *norm_vector(cuda_backend *cb, const specd_bweight *w, int dim, const char *op,
                                int *ok) {
    if (!w || (!w->impl && !w->src)) return NULL;
    if (!w->impl) {
        cuda_fail(cb, "%s: '%s' was not prepared by this backend", op, w->src->name);
        *ok = 0;
        return NULL;
    }
    const cuda_weight *cw = w->impl;
    if (cw->type != SPECD_F32 || w->rows * w->cols != dim) {
        cuda_fail(cb, "%s: '%s' is not an fp32 vector of %d", op, w->src ? w->src->name : "?",
                  dim);
        *ok = 0;
    }
    return cw->data;
}

int cuda_scratch_reserve(cuda_backend *cb, void **buf, size_t *cap, size_t bytes,
                         const char *what) {
    if (bytes <= *cap) return 0;
    /* cudaMalloc/cudaFree may not run inside a capture; the shape records
     * next time, when the buffer is big enough */
    cuda_capture_abort(cb, 1);
    size_t c = *cap ? *cap : (size_t)1 << 20;
    while (c < bytes) c *= 2;
    /* recorded graphs hold the old address */
    cuda_graph_reset(&cb->base);
    if (*buf) {
        cuda_ok(cb, cudaStreamSynchronize(cb->stream), what);
        cudaFree(*buf);
        *buf = NULL;
        *cap = 0;
    }
    if (!cuda_ok(cb, cudaMalloc(buf, c), what)) {
        *buf = NULL;
        return -1;
    }
    *cap = c;
    return 0;
}

void cuda_ops_free(cuda_backend *cb) {
    if (cb->gemm_x) cudaFree(cb->gemm_x);
    if (cb->attn_part) cudaFree(cb->attn_part);
    if (cb->move_host) cudaFreeHost(cb->move_host);
    if (cb->move_dev) cudaFree(cb->move_dev);
    if (cb->move_copied) cudaEventDestroy(cb->move_copied);
    cb->gemm_x = NULL;
    cb->attn_part = NULL;
    cb->move_host = cb->move_dev = NULL;
    cb->move_copied = NULL;
    cb->gemm_x_bytes = cb->attn_part_bytes = 0;
    cb->move_cap = 0;
}

void cuda_op_embed(specd_backend *be, float *out, const specd_bweight *E) {
    cuda_backend *cb = cuda_of(be);
    const cuda_weight *cw = weight_of(cb, E, "embed");
    if (!cw || !need_step(cb, "embed")) return;
    cuda_ok(cb, cuda_embed(out, cw->data, cw->type, E->rows, E->cols, cb->dev.tokens, cb->n_tokens,
                           cb->stream),
            "embed");
}

void cuda_op_embed_ids(specd_backend *be, float *out, const specd_bweight *E, const int32_t *ids,
                       int n) {
    cuda_backend *cb = cuda_of(be);
    const cuda_weight *cw = weight_of(cb, E, "embed_ids");
    if (!cw) return;
    cuda_ok(cb, cuda_embed(out, cw->data, cw->type, E->rows, E->cols, ids, n, cb->stream),
            "embed_ids");
}

void cuda_op_rmsnorm(specd_backend *be, float *out, const float *x, const specd_bweight *w,
                     int n_rows, int dim, float eps) {
    cuda_backend *cb = cuda_of(be);
    int ok = 1;
    const float *wv = norm_vector(cb, w, dim, "rmsnorm", &ok);
    if (!ok) return;
    cuda_ok(cb, cuda_rmsnorm(out, x, wv, n_rows, dim, eps, cb->stream), "rmsnorm");
}

void cuda_op_norm_gelu(specd_backend *be, float *out, const float *x, const specd_bweight *w,
                       const specd_bweight *b, int n_rows, int dim, float eps) {
    cuda_backend *cb = cuda_of(be);
    int ok = 1;
    const float *wv = norm_vector(cb, w, dim, "norm_gelu", &ok);
    const float *bv = norm_vector(cb, b, dim, "norm_gelu", &ok);
    if (!ok) return;
    cuda_ok(cb, cuda_norm_gelu(out, x, wv, bv, n_rows, dim, eps, cb->stream), "norm_gelu");
}

/* y[n][rows] = x[n][cols] . W^T with one cuBLAS GEMM. cuBLAS is
 * column-major: row-major W [rows][cols] is the column-major cols x rows
 * matrix W^T, so op(A) = A^T (CUBLAS_OP_T, lda = cols) gives W; x and y
 * read column-major are cols x n and rows x n. fp16/bf16 weights take x
 * converted to the same type (tensor cores, fp32 accumulate, fp32 out);
 * fp32 weights multiply fp32 x with fp32 compute, no TF32, so fp32 models
 * match the CPU to rounding. */
void cuda_op_matmul(specd_backend *be, float *y, const specd_bweight *W, const float *x, int n) {
    cuda_backend *cb = cuda_of(be);
    if (n <= 0) return;
    const cuda_weight *cw = weight_of(cb, W, "matmul");
    if (!cw) return;
    if (W->rows > INT_MAX || W->cols > INT_MAX) {
        cuda_fail(cb, "matmul: '%s' [%lld x %lld] x %d rows is too large for one GEMM",
                  W->src ? W->src->name : "?", (long long)W->rows, (long long)W->cols, n);
        return;
    }
    int rows = (int)W->rows, cols = (int)W->cols;
    const void *B = x;
    cudaDataType_t t = CUDA_R_32F;
    if (cw->type != SPECD_F32) {
        t = cw->type == SPECD_F16 ? CUDA_R_16F : CUDA_R_16BF;
        size_t elems = (size_t)n * (size_t)cols;
        if (cuda_scratch_reserve(cb, &cb->gemm_x, &cb->gemm_x_bytes, elems * 2, "matmul scratch"))
            return;
        if (!cuda_ok(cb, cuda_convert_f32(cb->gemm_x, cw->type, x, elems, cb->stream),
                     "matmul: convert x"))
            return;
        B = cb->gemm_x;
    }
    const float one = 1.0f, zero = 0.0f; /* host pointer mode: read now, baked into a capture */
    cublas_ok(cb,
              cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, cw->data, t,
                           cols, B, t, cols, &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
              "matmul: cublasGemmEx");
}

/* One GEMM each: cuBLAS reads x from device memory every time, so there
 * is no preparation to share (a grouped GEMM would save launches, which a
 * captured graph already makes cheap). */
void cuda_op_matmuls(specd_backend *be, int n_mats, float *const *y, const specd_bweight *const *W,
                     const float *x, int n) {
    for (int i = 0; i < n_mats; i++) cuda_op_matmul(be, y[i], W[i], x, n);
}

void cuda_op_rope(specd_backend *be, float *q, float *k, int n_heads, int n_kv_heads,
                  const specd_rope_cfg *cfg) {
    cuda_backend *cb = cuda_of(be);
    if (!need_step(cb, "rope")) return;
    if (!cfg || cfg->rot_dim != cb->rot_dim || cfg->rot_dim <= 0 || cfg->rot_dim % 2 ||
        cfg->rot_dim > cfg->head_dim) {
        cuda_fail(cb, "rope: rot_dim %d does not match the step's cos_sin (rot_dim %d, head_dim %d)",
                  cfg ? cfg->rot_dim : -1, cb->rot_dim, cfg ? cfg->head_dim : -1);
        return;
    }
    cuda_ok(cb, cuda_rope(q, k, cb->dev.cos_sin, cb->n_tokens, n_heads, n_kv_heads, cfg->head_dim,
                          cfg->rot_dim, cfg->interleaved, cb->stream),
            "rope");
}

void cuda_op_attention(specd_backend *be, float *out, const float *q, const float *k,
                       const float *v, const specd_kv_layout *kv, int layer, int n_heads,
                       int n_kv_heads, int head_dim) {
    cuda_backend *cb = cuda_of(be);
    if (!need_step(cb, "attention") || cb->n_tokens == 0) return;
    if (head_dim <= 0 || head_dim % 2 || head_dim > CUDA_ATTN_MAX_HEAD_DIM || n_heads <= 0 ||
        n_kv_heads <= 0 || n_heads % n_kv_heads) {
        cuda_fail(cb, "attention: unsupported shape (%d heads, %d kv heads, head_dim %d; head_dim "
                      "must be even and <= %d)",
                  n_heads, n_kv_heads, head_dim, CUDA_ATTN_MAX_HEAD_DIM);
        return;
    }
    if (!kv || !kv->base || layer < 0 || layer >= kv->n_layers ||
        kv->kv_dim != n_kv_heads * head_dim || kv->n_rows <= 0) {
        cuda_fail(cb, "attention: KV layout does not match layer %d (kv_dim %d, expected %d)", layer,
                  kv ? kv->kv_dim : -1, n_kv_heads * head_dim);
        return;
    }
    int splits = cuda_attention_splits(cb->n_tokens, n_heads);
    if (splits > 1) {
        size_t bytes = sizeof(float) * (size_t)cb->n_tokens * n_heads * splits * (head_dim + 2);
        if (cuda_scratch_reserve(cb, (void **)&cb->attn_part, &cb->attn_part_bytes, bytes,
                                 "attention scratch"))
            return;
    }
    /* pools of this layer: K at 2*layer, V at 2*layer + 1 (specd_kv_layout) */
    size_t layer_bytes =
        (size_t)kv->n_rows * specd_kv_row_bytes(cb->base.kv_type, kv->kv_dim);
    unsigned char *kpool = (unsigned char *)kv->base + 2 * (size_t)layer * layer_bytes;
    unsigned char *vpool = kpool + layer_bytes;
    int f16 = cb->base.kv_type == SPECD_F16;
    if (!cuda_ok(cb, cuda_kv_append(kpool, vpool, f16, k, v, cb->dev.kv_row, cb->n_tokens,
                                    kv->kv_dim, kv->n_rows, cb->stream),
                 "attention: kv append"))
        return;
    cuda_ok(cb, cuda_attention(out, cb->attn_part, q, kpool, vpool, f16, cb->dev, cb->n_tokens,
                               n_heads, n_kv_heads, head_dim, kv->n_rows, cb->stream),
            "attention");
}

void cuda_op_swiglu(specd_backend *be, float *out, const float *gate, const float *up, size_t n) {
    cuda_backend *cb = cuda_of(be);
    cuda_ok(cb, cuda_swiglu(out, gate, up, n, cb->stream), "swiglu");
}

void cuda_op_axpy(specd_backend *be, float *y, float a, const float *x, size_t n) {
    cuda_backend *cb = cuda_of(be);
    cuda_ok(cb, cuda_axpy(y, a, x, n, cb->stream), "axpy");
}

void cuda_op_scale(specd_backend *be, float *x, float a, size_t n) {
    cuda_backend *cb = cuda_of(be);
    cuda_ok(cb, cuda_scale(x, a, n, cb->stream), "scale");
}

void cuda_op_gather_out(specd_backend *be, float *dst, const float *src, int width) {
    cuda_backend *cb = cuda_of(be);
    if (!need_step(cb, "gather_out")) return;
    cuda_ok(cb, cuda_gather_rows(dst, src, cb->dev.out_rows, cb->n_out, width, cb->stream),
            "gather_out");
}

void cuda_op_argmax(specd_backend *be, int32_t *ids, const float *x, int n_rows, int width) {
    cuda_backend *cb = cuda_of(be);
    cuda_ok(cb, cuda_argmax(ids, x, n_rows, width, cb->stream), "argmax");
}

/* The (src, dst) pairs come from the host: staged in pinned memory, sent
 * with one copy, then one kernel moves the rows of every layer. */
void cuda_op_kv_move(specd_backend *be, const specd_kv_layout *kv, const int32_t *src,
                     const int32_t *dst, int n) {
    cuda_backend *cb = cuda_of(be);
    if (n <= 0) return;
    cuda_capture_abort(cb, 0); /* outside any step; may wait and allocate below */
    cuda_enter(cb);
    if (!kv || !kv->base || kv->n_layers <= 0 || kv->kv_dim <= 0) {
        cuda_fail(cb, "kv_move: bad KV layout");
        return;
    }
    for (int i = 0; i < n; i++)
        if (src[i] < 0 || src[i] >= kv->n_rows || dst[i] < 0 || dst[i] >= kv->n_rows) {
            cuda_fail(cb, "kv_move: pair %d (%d -> %d) outside the %lld rows", i, src[i], dst[i],
                      (long long)kv->n_rows);
            return;
        }
    if (n > cb->move_cap) {
        cuda_ok(cb, cudaStreamSynchronize(cb->stream), "kv_move: cudaStreamSynchronize");
        if (cb->move_host) cudaFreeHost(cb->move_host);
        if (cb->move_dev) cudaFree(cb->move_dev);
        cb->move_host = cb->move_dev = NULL;
        cb->move_cap = 0;
        int cap = n < 256 ? 256 : n;
        if (!cuda_ok(cb, cudaHostAlloc((void **)&cb->move_host, 8 * (size_t)cap, cudaHostAllocDefault),
                     "kv_move: cudaHostAlloc") ||
            !cuda_ok(cb, cudaMalloc((void **)&cb->move_dev, 8 * (size_t)cap), "kv_move: cudaMalloc"))
            return;
        cb->move_cap = cap;
    } else if (!cuda_ok(cb, cudaEventSynchronize(cb->move_copied), "kv_move: cudaEventSynchronize")) {
        return; /* (the last upload must be done reading the staging buffer) */
    }
    memcpy(cb->move_host, src, 4 * (size_t)n);
    memcpy(cb->move_host + n, dst, 4 * (size_t)n);
    if (!cuda_ok(cb, cudaMemcpyAsync(cb->move_dev, cb->move_host, 8 * (size_t)n,
                                     cudaMemcpyHostToDevice, cb->stream),
                 "kv_move: cudaMemcpyAsync") ||
        !cuda_ok(cb, cudaEventRecord(cb->move_copied, cb->stream), "kv_move: cudaEventRecord"))
        return;
    size_t row_bytes = specd_kv_row_bytes(cb->base.kv_type, kv->kv_dim);
    cuda_ok(cb, cuda_kv_move(kv->base, kv->n_layers, kv->n_rows, row_bytes, cb->move_dev, n,
                             cb->stream),
            "kv_move");
}
