/* backend.h - the one interface between the transformer and the hardware.
 *
 * The forward pass (target-svc/transformer.c) is written once, in terms of
 * the operations below. A backend owns memory ("device buffers": host memory
 * for the CPU backend, GPU memory for CUDA) and implements each op on it.
 * The transformer never dereferences a device buffer; data crosses to the
 * host only through to_host/from_host.
 *
 * Shapes: activations are row-major [n_tok][width] fp32. Weight matrices are
 * backend-prepared copies/views of model tensors (specd_bweight). */
#ifndef SPECD_BACKEND_H
#define SPECD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_file.h"

typedef struct specd_backend specd_backend;

/* A weight matrix or vector as the backend keeps it (CPU: a view of the
 * mmapped tensor; CUDA: a device copy). rows = ne[1], cols = ne[0]. */
typedef struct specd_bweight {
    const specd_tensor *src;
    int64_t rows, cols;
    void *impl;
} specd_bweight;

/* What one sequence contributes to an attention call. Tokens of a batch are
 * grouped by sequence, in order: sequence s owns batch rows
 * [tok_start, tok_start + n_new). */
typedef struct specd_attn_seq {
    float *k_cache;     /* device [capacity][n_kv_heads*head_dim] for this layer */
    float *v_cache;
    int n_past;         /* cache rows before this call; all visible */
    int tok_start;
    int n_new;
    /* n_new*n_new bytes on the host, mask[i*n_new + j] != 0 when new token
     * i may attend to new token j (j <= i required). NULL means causal. */
    const uint8_t *mask;
} specd_attn_seq;

typedef struct specd_rope_cfg {
    int head_dim;
    int rot_dim;     /* dims rotated (= head_dim for Llama) */
    int interleaved; /* see specd_llama_hparams.rope_interleaved */
} specd_rope_cfg;

typedef struct specd_backend_ops {
    const char *name;
    void (*destroy)(specd_backend *be);

    void *(*alloc)(specd_backend *be, size_t bytes); /* zeroed; NULL on OOM */
    void (*free)(specd_backend *be, void *buf);
    void (*to_host)(specd_backend *be, void *host, const void *dev, size_t bytes);
    void (*from_host)(specd_backend *be, void *dev, const void *host, size_t bytes);
    /* copies within device memory (KV compaction) */
    void (*copy)(specd_backend *be, void *dst, const void *src, size_t bytes);

    int (*prepare_weight)(specd_backend *be, specd_bweight *w, const specd_tensor *t,
                          specd_error *err);
    void (*release_weight)(specd_backend *be, specd_bweight *w);

    /* out[i] = row ids[i] of E as fp32; ids on the host */
    void (*embed)(specd_backend *be, float *out, const specd_bweight *E, const int32_t *ids,
                  int n_tok);
    /* out = x / rms(x) * w, per row of width `dim`; w is an fp32 weight vector */
    void (*rmsnorm)(specd_backend *be, float *out, const float *x, const specd_bweight *w,
                    int n_tok, int dim, float eps);
    /* y[n_tok][W.rows] = x[n_tok][W.cols] . W^T */
    void (*matmul)(specd_backend *be, float *y, const specd_bweight *W, const float *x,
                   int n_tok);
    /* rotates q [n_tok][n_heads*head_dim] and k [n_tok][n_kv_heads*head_dim]
     * in place; cos_sin is a device table [n_tok][rot_dim/2][2] of (cos, sin)
     * per token and frequency, computed once per forward pass and shared by
     * all layers */
    void (*rope)(specd_backend *be, float *q, float *k, const float *cos_sin, int n_tok,
                 int n_heads, int n_kv_heads, const specd_rope_cfg *cfg);
    /* writes k/v rows of the new tokens into each sequence's cache at
     * n_past.., then out[t] = softmax(q_t . K^T * scale, masked) . V with
     * grouped-query head sharing */
    void (*attention)(specd_backend *be, float *out, const float *q, const float *k,
                      const float *v, const specd_attn_seq *seqs, int n_seqs, int n_heads,
                      int n_kv_heads, int head_dim);
    /* out[i] = silu(gate[i]) * up[i] */
    void (*swiglu)(specd_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* x[i] += y[i] */
    void (*add)(specd_backend *be, float *x, const float *y, size_t n);
    /* gathers rows: dst[i] = src[rows[i]] for rows of `width` floats */
    void (*gather_rows)(specd_backend *be, float *dst, const float *src, const int32_t *rows,
                        int n_rows, int width);
} specd_backend_ops;

struct specd_backend {
    const specd_backend_ops *ops;
};

typedef struct specd_backend_opts {
    const char *name; /* "cpu" (default) or "cuda" */
    int n_threads;    /* CPU: 0 = all online CPUs */
    int device;       /* CUDA device id */
} specd_backend_opts;

/* Creates the named backend; a clear error if it is not compiled in or no
 * device is present. */
specd_backend *specd_backend_create(const specd_backend_opts *opts, specd_error *err);
specd_backend *specd_cpu_backend_create(int n_threads, specd_error *err);

#endif
