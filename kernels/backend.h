/* backend.h - the one interface between the models and the hardware.
 *
 * The forward passes (common/model/transformer.c, common/model/mlp_speculator.c)
 * are written once, in terms of the operations below. A backend owns memory
 * ("device buffers": host memory for the CPU backend, GPU memory for CUDA)
 * and implements each op on it. Callers never dereference a device buffer;
 * data crosses to the host only through to_host/from_host and the step
 * upload.
 *
 * A forward pass is a "step": the caller first hands the backend everything
 * about the batch that lives on the host (token ids, RoPE angles, which
 * sequence each token belongs to, masks, KV page tables, the rows to output)
 * with begin_step, then issues ops that refer to it implicitly. That is what
 * lets the CUDA backend upload one buffer per step and replay a recorded
 * CUDA graph for every step of the same shape: the ops' arguments (buffer
 * addresses and sizes) repeat, only the step's contents change.
 *
 * Shapes: activations are row-major [n_tok][width] fp32 device buffers.
 * Weight matrices are backend-prepared copies/views of model tensors
 * (specd_bweight). The KV cache is paged (see specd_kv_layout).
 *
 * Errors: ops return nothing (a GPU op only queues work); the first failure
 * is kept and reported by finish(), which every step ends with. */
#ifndef SPECD_BACKEND_H
#define SPECD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"
#include "common/util/tensor.h"

typedef struct specd_backend specd_backend;

/* A weight matrix or vector as the backend keeps it (CPU: a view of the
 * mmapped tensor; CUDA: a device copy in fp16/bf16/fp32). rows = ne[1],
 * cols = ne[0]. */
typedef struct specd_bweight {
    const specd_tensor *src;
    int64_t rows, cols;
    uint64_t bytes; /* what the backend holds (and a pass over it streams) */
    void *impl;
} specd_bweight;

/* KV cache rows are grouped into pages of SPECD_KV_PAGE_ROWS rows. A
 * sequence's logical row r lives in physical row
 *     pages[r / SPECD_KV_PAGE_ROWS] * SPECD_KV_PAGE_ROWS + r % SPECD_KV_PAGE_ROWS
 * of every layer's pool; pools are [n_pages * PAGE_ROWS][kv_dim] elements of
 * the backend's kv_type, and one allocation holds all layers, K then V:
 *     K of layer l at  base + (2*l)     * layer_elems
 *     V of layer l at  base + (2*l + 1) * layer_elems
 * so one kernel can move rows of every layer at once (kv_move). */
#define SPECD_KV_PAGE_ROWS 16

/* The most matrices one matmuls call takes (specd_backend_ops). */
#define SPECD_MATMULS_MAX 4

typedef struct specd_kv_layout {
    void *base;            /* device buffer */
    int n_layers;
    int kv_dim;            /* n_kv_heads * head_dim */
    int64_t n_rows;        /* physical rows per pool = n_pages * PAGE_ROWS */
} specd_kv_layout;

/* What one sequence contributes to a step. Tokens of a step are grouped by
 * sequence, in order: sequence s owns batch rows [tok_start, tok_start+n_new). */
typedef struct specd_step_seq {
    int n_past;    /* cache rows before this step; all visible */
    int tok_start;
    int n_new;
    /* n_new*n_new bytes, mask[i*n_new + j] != 0 when new token i may attend
     * to new token j (j <= i, i sees i). NULL means causal. */
    const uint8_t *mask;
    /* the sequence's page table: ceil((n_past + n_new) / PAGE_ROWS) page ids */
    const int32_t *pages;
} specd_step_seq;

/* Everything about one forward pass that comes from the host. */
typedef struct specd_step {
    int n_tokens;
    const int32_t *tokens;    /* [n_tokens] ids for embed */
    /* [n_tokens][rot_dim/2][2] (cos, sin) per token and frequency, shared by
     * all layers */
    const float *cos_sin;
    int rot_dim;
    int n_seqs;
    const specd_step_seq *seqs;
    int n_out;
    const int32_t *out_rows;  /* [n_out] batch rows gather_out picks */
} specd_step;

typedef struct specd_rope_cfg {
    int head_dim;
    int rot_dim;     /* dims rotated (= head_dim for Llama) */
    int interleaved; /* see specd_llama_hparams.rope_interleaved */
} specd_rope_cfg;

/* What a benchmark needs to know of the device to state its bounds. */
typedef struct specd_device_info {
    char name[128];
    double peak_bytes_per_s; /* memory bandwidth; 0 = unknown */
    uint64_t memory_bytes;   /* 0 = unknown */
} specd_device_info;

typedef struct specd_backend_ops {
    const char *name;
    void (*destroy)(specd_backend *be);

    void *(*alloc)(specd_backend *be, size_t bytes); /* zeroed; NULL on OOM */
    void (*free)(specd_backend *be, void *buf);
    /* to_host waits for the queued work that produces `dev` */
    void (*to_host)(specd_backend *be, void *host, const void *dev, size_t bytes);
    void (*from_host)(specd_backend *be, void *dev, const void *host, size_t bytes);

    /* t->data == NULL asks for storage filled with seeded pseudo-random
     * values (uniform in +-1/sqrt(cols), norm vectors near 1): benchmarks of
     * model shapes nobody ships, generated where they are used. Backends
     * that cannot (CPU: the weights are the file) refuse with a message. */
    int (*prepare_weight)(specd_backend *be, specd_bweight *w, const specd_tensor *t,
                          specd_error *err);
    void (*release_weight)(specd_backend *be, specd_bweight *w);

    /* --- a step: begin_step, ops, finish ---------------------------------- */

    /* Hands the step's host data to the backend. The arrays *st points to
     * must stay unchanged until finish() returns: the CPU backend reads them
     * in place; the CUDA backend copies them here, in one upload. */
    int (*begin_step)(specd_backend *be, const specd_step *st, specd_error *err);
    /* Optional (NULL when the backend has no such thing): between graph_begin
     * and graph_end the caller issues the same ops, on the same buffers, for
     * every step with the same `key` and the same n_tokens/n_seqs/n_out.
     * graph_begin returns 1 when it replayed a recorded graph (the caller
     * skips the ops), 0 when the caller must issue them (they may be
     * recorded). */
    int (*graph_begin)(specd_backend *be, uint32_t key);
    void (*graph_end)(specd_backend *be);
    /* Forgets recorded graphs (a buffer they use was reallocated). */
    void (*graph_reset)(specd_backend *be);
    /* Waits for the step's work; the first error of any op since the last
     * finish, or 0. */
    int (*finish)(specd_backend *be, specd_error *err);

    /* out[i] = row tokens[i] of E as fp32 (the step's tokens) */
    void (*embed)(specd_backend *be, float *out, const specd_bweight *E);
    /* out[i] = row ids[i] of E, ids a device buffer of n int32 (the
     * speculator's lookups, outside any step) */
    void (*embed_ids)(specd_backend *be, float *out, const specd_bweight *E,
                      const int32_t *ids, int n);
    /* out = x / rms(x) * w per row of width `dim`; w NULL = ones */
    void (*rmsnorm)(specd_backend *be, float *out, const float *x, const specd_bweight *w,
                    int n_rows, int dim, float eps);
    /* out = gelu_erf(w * (x / rms(x)) + b) per row: the MLP speculator's
     * LayerNormParameterized (no mean, elementwise scale and shift) + GELU */
    void (*norm_gelu)(specd_backend *be, float *out, const float *x, const specd_bweight *w,
                      const specd_bweight *b, int n_rows, int dim, float eps);
    /* y[n][W.rows] = x[n][W.cols] . W^T */
    void (*matmul)(specd_backend *be, float *y, const specd_bweight *W, const float *x, int n);
    /* y[i] = matmul(W[i], x) for i < n_mats (1..SPECD_MATMULS_MAX), every
     * W[i] of the same cols: a layer's q, k and v, or gate and up, on one
     * input. Each y[i] is exactly what matmul gives; a backend may share
     * the input's preparation and launch them as one parallel run. */
    void (*matmuls)(specd_backend *be, int n_mats, float *const *y,
                    const specd_bweight *const *W, const float *x, int n);
    /* rotates q [n_tok][n_heads*head_dim] and k [n_tok][n_kv_heads*head_dim]
     * in place with the step's cos_sin */
    void (*rope)(specd_backend *be, float *q, float *k, int n_heads, int n_kv_heads,
                 const specd_rope_cfg *cfg);
    /* Writes the step's new k/v rows into layer `layer` of the cache at each
     * sequence's rows n_past.., then out[t] = softmax(q_t . K^T / sqrt(d),
     * masked) . V over the rows token t sees, with grouped-query head
     * sharing. */
    void (*attention)(specd_backend *be, float *out, const float *q, const float *k,
                      const float *v, const specd_kv_layout *kv, int layer, int n_heads,
                      int n_kv_heads, int head_dim);
    /* out[i] = silu(gate[i]) * up[i] */
    void (*swiglu)(specd_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* y[i] += a * x[i] */
    void (*axpy)(specd_backend *be, float *y, float a, const float *x, size_t n);
    /* x[i] *= a */
    void (*scale)(specd_backend *be, float *x, float a, size_t n);
    /* dst[i] = src[out_rows[i]] for the step's out rows, rows of `width` */
    void (*gather_out)(specd_backend *be, float *dst, const float *src, int width);
    /* ids[r] = the first index of the largest x[r][:] (device int32 [n]);
     * NaN never wins */
    void (*argmax)(specd_backend *be, int32_t *ids, const float *x, int n_rows, int width);

    /* Moves KV rows, in every layer, K and V: physical row src[i] to dst[i],
     * in order i = 0, 1, ... (so a row may be read after an earlier move
     * wrote elsewhere, never after a later one). Host arrays, outside any
     * step. */
    void (*kv_move)(specd_backend *be, const specd_kv_layout *kv, const int32_t *src,
                    const int32_t *dst, int n);

    /* Optional: what the device is, for benchmarks. */
    int (*device_info)(specd_backend *be, specd_device_info *out);
} specd_backend_ops;

struct specd_backend {
    const specd_backend_ops *ops;
    /* SPECD_F32, SPECD_F16 or (CPU only) SPECD_Q8_0: what the KV pools
     * hold. Set at creation from specd_backend_opts.kv_dtype (CPU: see
     * specd_kv_dtype; CUDA: F16 unless F32). A test may also set it on a CPU
     * backend, before allocating a cache, to get the twin of the GPU's
     * layout. */
    specd_dtype kv_type;
    /* Untimed passes a step shape needs before its time is what later steps
     * of that shape take: CPU 0; CUDA 2 (a shape runs eagerly the first time
     * and is recorded as a graph the second, kernels/cuda/cuda_graph.c).
     * target-svc's start-up cost probe skips them. */
    int warm_passes;
};

/* How a CPU matmul treats activations. FAST (the default) quantizes each
 * activation row to int8 blocks and multiplies in integers, as llama.cpp
 * does (kernels/cpu/qmatmul.h); EXACT keeps fp32 activations, so results
 * equal an fp32 matmul on the dequantized weights up to rounding (the
 * Hugging Face golden tests use it). Both are bitwise batch-invariant on
 * the integer path's types; GPUs ignore the setting (fp16 GEMMs). */
typedef enum specd_precision { SPECD_PRECISION_FAST = 0, SPECD_PRECISION_EXACT = 1 } specd_precision;

/* Names as config and CLI spell them, indexed by specd_precision. */
extern const char *const specd_precision_names[];

/* What the KV cache stores. AUTO is the backend's own choice: on the CPU
 * fp16 with precision fast (the default) and fp32 with precision exact, on
 * CUDA fp16. F16 on the CPU halves the cache (twice the tokens in
 * the same limits.kv_memory, half the bytes a long-context decode step
 * reads); K and V are rounded to fp16 as they are written, as llama.cpp's
 * default cache does, and every attention product is still fp32. F32 on
 * CUDA is its fp32 reference mode: KV and the model's F32 matrices stay
 * fp32 (the small reference models of the golden tests).
 *
 * Q8_0 (CPU only; opt-in) stores each row of K and V in GGML's Q8_0 blocks,
 * as llama.cpp's `--cache-type-k q8_0 --cache-type-v q8_0` does: 32 values
 * as int8 with one fp16 scale, 34 bytes where fp16 takes 64, so the cache
 * holds 1.88x the tokens of fp16 in the same memory and a long-context
 * step reads 53% of the bytes. Rounding is to the nearest of 255 levels per
 * block (about 2 decimal digits against fp16's 3). q . K is computed as
 * llama.cpp computes it for such a cache: the query rounded to int8 blocks,
 * an exact integer dot per block, one fp32 fma per block in a fixed order
 * (kernels/cpu/kv_q8.c); softmax and the V side stay fp32 over exactly
 * dequantized rows. Each result is fixed per row: the same bits on every
 * SIMD path and in any batch. Heads must be a multiple of 32 wide. */
typedef enum specd_kv_dtype {
    SPECD_KV_AUTO = 0,
    SPECD_KV_F32 = 1,
    SPECD_KV_F16 = 2,
    SPECD_KV_Q8_0 = 3
} specd_kv_dtype;

/* Names as config and CLI spell them, indexed by specd_kv_dtype. */
extern const char *const specd_kv_dtype_names[];

typedef struct specd_backend_opts {
    const char *name; /* "cpu" (default) or "cuda" */
    int n_threads;    /* CPU: 0 = all online CPUs */
    int device;       /* CUDA device id */
    specd_kv_dtype kv_dtype;   /* see specd_kv_dtype */
    specd_precision precision; /* CPU: see specd_precision */
} specd_backend_opts;

/* Creates the named backend; a clear error if it is not compiled in or no
 * device is present. */
specd_backend *specd_backend_create(const specd_backend_opts *opts, specd_error *err);
specd_backend *specd_cpu_backend_create(int n_threads, specd_precision precision,
                                        specd_kv_dtype kv_dtype, specd_error *err);
/* NULL + "not built" message when the build had no nvcc. */
specd_backend *specd_cuda_backend_create(int device, int kv_f32, specd_error *err);

/* A KV type as config, GetInfo and logs spell it ("f32", "f16", "q8_0"). */
static inline const char *specd_kv_type_name(specd_dtype t) {
    return t == SPECD_F16 ? "f16" : t == SPECD_Q8_0 ? "q8_0" : "f32";
}

/* Bytes of one KV row of kv_dim elements (a multiple of 32 for Q8_0: whole
 * 34-byte blocks). */
static inline size_t specd_kv_row_bytes(specd_dtype t, int kv_dim) {
    if (t == SPECD_Q8_0) return (size_t)kv_dim / 32 * 34;
    return (size_t)kv_dim * (t == SPECD_F16 ? 2 : 4);
}

#endif
