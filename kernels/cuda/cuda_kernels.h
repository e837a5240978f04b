/* cuda_kernels.h - the CUDA kernels, as C-callable launchers.
 *
 * Each launcher queues one kernel (attention: two) on `stream` and returns
 * cudaGetLastError() - a launch problem (bad configuration, a sticky error
 * from an earlier kernel) shows up here, a fault inside the kernel only at
 * the next synchronization. The host side (cuda_ops.c) turns both into the
 * backend's first error.
 *
 * Every kernel has a CPU twin: the function in the CPU backend
 * (kernels/cpu/cpu_backend.c) or model code that computes the same thing,
 * named in the comment above each launcher. Tests compare the two.
 *
 * Graph replay (cuda_graph.c) re-runs the recorded launches with the
 * arguments they had when recorded, so nothing that changes from step to
 * step of the same shape may be an argument: the ragged per-step data
 * (sequence lengths, masks, page tables, rows) is read by the kernels from
 * the device step buffer (cuda_step_dev), whose address is fixed. Launch
 * configurations depend only on n_tokens, n_seqs, n_out and model shape. */
#ifndef SPECD_CUDA_KERNELS_H
#define SPECD_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/util/dtype.h"

/* What one sequence of the step looks like to the kernels. 32 bytes, so an
 * array of them is naturally aligned on both sides. */
typedef struct cuda_seq_meta {
    int32_t n_past;       /* committed cache rows, all visible */
    int32_t tok_start;    /* first batch row of the sequence */
    int32_t n_new;        /* batch rows it owns */
    int32_t mask_offset;  /* byte offset of its n_new*n_new mask in masks; -1 = causal */
    int32_t pages_offset; /* index of its page table in pages; -1 = none (no attention) */
    int32_t pad[3];
} cuda_seq_meta;

/* Device addresses of the sections of the step buffer (cuda_step.c packs
 * them). They change only when the buffer is reallocated, which drops every
 * recorded graph. */
typedef struct cuda_step_dev {
    const int32_t *tokens;   /* [n_tokens] ids for embed */
    const int32_t *tok_seq;  /* [n_tokens] sequence of each batch row; -1 = none */
    const int32_t *kv_row;   /* [n_tokens] physical KV row for the row's K/V; -1 = none */
    const int32_t *out_rows; /* [n_out] rows gather_out picks */
    const cuda_seq_meta *seqs;
    const float *cos_sin;    /* [n_tokens][rot_dim/2][2] */
    const int32_t *pages;    /* every sequence's page table, concatenated */
    const uint8_t *masks;    /* every masked sequence's mask, concatenated */
} cuda_step_dev;

/* = SPECD_KV_PAGE_ROWS (kernels/backend.h, which the .cu files do not
 * include; cuda_step.c checks the two agree at compile time). */
#define CUDA_KV_PAGE_ROWS 16

/* Split-KV attention splits a token's visible rows into at most this many
 * chunks processed by separate blocks (see cuda_attention.cu). */
#define CUDA_ATTN_MAX_SPLITS 16
#define CUDA_ATTN_MAX_HEAD_DIM 256

/* --- cuda_norm.cu ---------------------------------------------------------- */

/* CPU twin: cpu_rmsnorm. out = x * rsqrt(mean(x^2) + eps) * w per row of
 * `dim`; w is an fp32 device vector or NULL (ones). out may equal x. */
cudaError_t cuda_rmsnorm(float *out, const float *x, const float *w, int n_rows, int dim,
                         float eps, cudaStream_t stream);
/* CPU twin: the LayerNormParameterized + GELU loop of
 * specd_mlp_speculator_forward (common/model/mlp_speculator.c):
 * out = gelu_erf(w * (x * rsqrt(mean(x^2) + eps)) + b); w/b NULL = ones/zeros. */
cudaError_t cuda_norm_gelu(float *out, const float *x, const float *w, const float *b,
                           int n_rows, int dim, float eps, cudaStream_t stream);

/* --- cuda_elementwise.cu --------------------------------------------------- */

/* CPU twin: cpu_swiglu. out[i] = gate[i] / (1 + exp(-gate[i])) * up[i] */
cudaError_t cuda_swiglu(float *out, const float *gate, const float *up, size_t n,
                        cudaStream_t stream);
/* CPU twin: cpu_axpy. y[i] += a * x[i] */
cudaError_t cuda_axpy(float *y, float a, const float *x, size_t n, cudaStream_t stream);
/* CPU twin: cpu_scale. x[i] *= a */
cudaError_t cuda_scale(float *x, float a, size_t n, cudaStream_t stream);
/* CPU twin: specd_f32_to_fp16 / specd_f32_to_bf16 (round to nearest even).
 * dst_type is SPECD_F16 or SPECD_BF16: the GEMM's B operand, and weight
 * upload of fp32 rows. */
cudaError_t cuda_convert_f32(void *dst, specd_dtype dst_type, const float *src, size_t n,
                             cudaStream_t stream);
/* CPU twin: cpu_embed (cpu_tensor_row per id). out[i] = row ids[i] of the
 * [rows][cols] table of type F32/F16/BF16, as fp32. An id outside 0..rows-1
 * gives a row of zeros (never a read outside the table). */
cudaError_t cuda_embed(float *out, const void *table, specd_dtype type, int64_t rows,
                       int64_t cols, const int32_t *ids, int n, cudaStream_t stream);
/* CPU twin: cpu_gather_out. dst[i] = src[rows[i]] for n rows of `width`. */
cudaError_t cuda_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int width,
                             cudaStream_t stream);
/* No CPU twin (the CPU backend cannot invent weights): n values uniform in
 * [lo, hi) stored as F32/F16/BF16, a pure function of (seed, index), so a
 * run repeats. */
cudaError_t cuda_fill_random(void *dst, specd_dtype type, size_t n, uint64_t seed, float lo,
                             float hi, cudaStream_t stream);

/* --- cuda_rope.cu ------------------------------------------------------------ */

/* CPU twin: cpu_rope / rope_head. Rotates q [n_tok][n_heads*head_dim] and k
 * [n_tok][n_kv_heads*head_dim] in place; pairs (2i, 2i+1) when interleaved,
 * else (i, i + rot_dim/2); cos_sin [n_tok][rot_dim/2][2]. */
cudaError_t cuda_rope(float *q, float *k, const float *cos_sin, int n_tok, int n_heads,
                      int n_kv_heads, int head_dim, int rot_dim, int interleaved,
                      cudaStream_t stream);

/* --- cuda_attention.cu ------------------------------------------------------- */

/* CPU twin: the cache write at the top of cpu_attention. Row t of k and v
 * (fp32 [n_tok][kv_dim]) goes to physical row kv_row[t] of the pools, as
 * __half when kv_f16 else float. Rows with kv_row < 0 or >= n_rows are
 * skipped. */
cudaError_t cuda_kv_append(void *kpool, void *vpool, int kv_f16, const float *k, const float *v,
                           const int32_t *kv_row, int n_tok, int kv_dim, int64_t n_rows,
                           cudaStream_t stream);
/* Number of KV splits attention uses for this shape (1..CUDA_ATTN_MAX_SPLITS);
 * the host sizes the partials scratch with it. */
int cuda_attention_splits(int n_tok, int n_heads);
/* CPU twin: attn_task. out [n_tok][n_heads*head_dim] = softmax(q.K^T /
 * sqrt(head_dim), masked) . V over the rows each token sees (its sequence's
 * n_past committed rows, then the new rows its mask allows), K/V read
 * through the page tables; GQA kv head = h / (n_heads / n_kv_heads).
 * `partials` holds n_tok*n_heads*splits*(head_dim+2) floats. */
cudaError_t cuda_attention(float *out, float *partials, const float *q, const void *kpool,
                           const void *vpool, int kv_f16, cuda_step_dev step, int n_tok,
                           int n_heads, int n_kv_heads, int head_dim, int64_t n_rows,
                           cudaStream_t stream);

/* --- cuda_argmax.cu ---------------------------------------------------------- */

/* CPU twin: cpu_argmax. ids[r] = first index of the largest x[r][:]; NaN
 * never wins; a row with no non-NaN value gives 0. */
cudaError_t cuda_argmax(int32_t *ids, const float *x, int n_rows, int width,
                        cudaStream_t stream);

/* --- cuda_kv.cu -------------------------------------------------------------- */

/* CPU twin: cpu_kv_move. In every layer's K and V pool, physical row
 * pairs[i] is copied to row pairs[n + i], strictly in order of i (a later
 * pair may read a row an earlier one wrote). `base` holds 2*n_layers pools
 * of n_rows rows of row_bytes bytes each; pairs is a device array [2n]. */
cudaError_t cuda_kv_move(void *base, int n_layers, int64_t n_rows, size_t row_bytes,
                         const int32_t *pairs, int n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
