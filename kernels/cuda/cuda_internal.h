/* cuda_internal.h - the CUDA backend's state, shared by its host files:
 *   cuda_backend.c  create/destroy, memory, errors, finish, device info, ops table
 *   cuda_step.c     begin_step: packing the step into one upload
 *   cuda_graph.c    recording and replaying CUDA graphs per step shape
 *   cuda_ops.c      the compute ops (kernel launches, cuBLAS matmul, kv_move)
 *   cuda_weights.c  prepare/release weights
 * The kernels themselves are in the .cu files (cuda_kernels.h). */
#ifndef SPECD_CUDA_INTERNAL_H
#define SPECD_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda_kernels.h"
#include "kernels/backend.h"

/* Graph cache: at most this many (key, shape) entries, least recently used
 * evicted; graphs only for steps of at most CUDA_GRAPH_MAX_TOKENS tokens
 * (decode and tree verification, where launch overhead dominates; a long
 * prefill's kernels run long enough that launching them costs nothing).
 * Speculative steps under load come in many shapes (every session's tree
 * size adds up to the step's token count): on an H100, 32 entries and 64
 * tokens left such steps eager at 2.5x a replayed one. An entry costs host
 * memory and a graph's device-side launch state, not activations.
 * SPECD_CUDA_GRAPH_SLOTS (1..CUDA_GRAPH_SLOTS) sets a smaller table. */
#define CUDA_GRAPH_SLOTS 256
#define CUDA_GRAPH_MAX_TOKENS 128

typedef enum cuda_graph_state {
    CG_FREE = 0, /* slot unused */
    CG_SEEN,     /* ran eagerly before; the next time it is recorded */
    CG_RECORDED, /* exec holds the instantiated graph */
    CG_EAGER,    /* recording failed: always eager (until evicted) */
} cuda_graph_state;

typedef struct cuda_graph_entry {
    cuda_graph_state state;
    uint32_t key;
    int n_tokens, n_seqs, n_out;
    cudaGraphExec_t exec;
    uint64_t last_used;
} cuda_graph_entry;

/* Step buffer capacities: the sections sit at offsets computed from these,
 * not from one step's sizes, so every step of a shape gets the same device
 * addresses (what a recorded graph needs). Each grows x2 when exceeded. */
typedef struct cuda_step_caps {
    int tokens;      /* tokens, tok_seq, kv_row (int32 each) */
    int cos_sin;     /* floats of cos_sin */
    int seqs;        /* cuda_seq_meta entries */
    int pages;       /* int32 page-table entries, all sequences */
    int64_t masks;   /* mask bytes, all sequences */
    int out;         /* int32 out rows */
} cuda_step_caps;

typedef struct cuda_backend {
    specd_backend base;
    int device;
    cudaStream_t stream;    /* non-blocking: never serialized with the legacy stream */
    cublasHandle_t blas;
    void *blas_workspace;   /* fixed, so cuBLAS never allocates inside a capture */

    /* first error since the last finish() */
    int has_err;
    char err[512];

    /* --- the step (cuda_step.c) ------------------------------------------ */
    cuda_step_caps caps;
    size_t off_tokens, off_tok_seq, off_kv_row, off_out, off_seqs, off_cos, off_pages, off_masks;
    size_t step_bytes;
    unsigned char *step_host; /* pinned staging, packed by begin_step */
    unsigned char *step_dev;  /* device copy the kernels read */
    cudaEvent_t step_copied;  /* recorded after the upload: staging reusable */
    cuda_step_dev dev;        /* section addresses in step_dev */
    int have_step;            /* a valid begin_step happened */
    int n_tokens, n_seqs, n_out, rot_dim;

    /* --- op scratch (cuda_ops.c); growing one drops recorded graphs ------ */
    void *gemm_x;           /* x converted to the weight's type */
    size_t gemm_x_bytes;
    float *attn_part;       /* split-KV partials */
    size_t attn_part_bytes;

    /* --- kv_move staging ----------------------------------------------- */
    int32_t *move_host;     /* pinned [2 * cap] */
    int32_t *move_dev;
    int move_cap;
    cudaEvent_t move_copied;

    /* --- weight upload staging (cuda_weights.c), allocated on first use -- */
    float *load_host;       /* pinned */
    float *load_dev;
    size_t load_elems;

    /* --- graphs (cuda_graph.c) ------------------------------------------- */
    cuda_graph_entry graphs[CUDA_GRAPH_SLOTS];
    uint64_t graph_clock;
    int capturing;          /* index of the entry being recorded, -1 = none */
    int graphs_off;         /* SPECD_CUDA_GRAPHS=0 in the environment */
    int graph_slots;        /* entries in use: SPECD_CUDA_GRAPH_SLOTS, default all */
    int capture_nest;       /* graph_begin calls nested inside a recording */
} cuda_backend;

static inline cuda_backend *cuda_of(specd_backend *be) { return (cuda_backend *)be; }

/* Errors: keep the first, formatted "cuda backend: <what>: <reason>".
 * cuda_ok/cublas_ok return 1 when the call succeeded. */
void cuda_fail(cuda_backend *cb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cuda_ok(cuda_backend *cb, cudaError_t e, const char *what);
int cublas_ok(cuda_backend *cb, cublasStatus_t s, const char *what);
/* Makes the backend's GPU the calling thread's current device (calls that
 * name no stream, like cudaMalloc, act on the current device). */
void cuda_enter(cuda_backend *cb);

/* Grows a device scratch buffer to at least `bytes` (x2 steps). Growing
 * reallocates, so it first closes any recording in progress and then drops
 * every recorded graph. Returns 0, or -1 (error recorded). */
int cuda_scratch_reserve(cuda_backend *cb, void **buf, size_t *cap, size_t bytes,
                         const char *what);

/* cuda_step.c */
int cuda_step_init(cuda_backend *cb);
void cuda_step_free(cuda_backend *cb);
int cuda_begin_step(specd_backend *be, const specd_step *st, specd_error *err);

/* cuda_graph.c */
int cuda_graph_begin(specd_backend *be, uint32_t key);
void cuda_graph_end(specd_backend *be);
void cuda_graph_reset(specd_backend *be);
/* Ends a recording early (a call that must not be captured came in): the
 * ops recorded so far are launched once and the rest of the step runs
 * eagerly. retry: the shape records again next time (the cause was a
 * one-off, like a scratch buffer growing); else it stays eager. No-op when
 * not recording. */
void cuda_capture_abort(cuda_backend *cb, int retry);

/* cuda_ops.c: the compute ops (semantics in kernels/backend.h) */
void cuda_op_embed(specd_backend *be, float *out, const specd_bweight *E);
void cuda_op_embed_ids(specd_backend *be, float *out, const specd_bweight *E, const int32_t *ids,
                       int n);
void cuda_op_rmsnorm(specd_backend *be, float *out, const float *x, const specd_bweight *w,
                     int n_rows, int dim, float eps);
void cuda_op_norm_gelu(specd_backend *be, float *out, const float *x, const specd_bweight *w,
                       const specd_bweight *b, int n_rows, int dim, float eps);
void cuda_op_matmul(specd_backend *be, float *y, const specd_bweight *W, const float *x, int n);
void cuda_op_matmuls(specd_backend *be, int n_mats, float *const *y, const specd_bweight *const *W,
                     const float *x, int n);
void cuda_op_rope(specd_backend *be, float *q, float *k, int n_heads, int n_kv_heads,
                  const specd_rope_cfg *cfg);
void cuda_op_attention(specd_backend *be, float *out, const float *q, const float *k,
                       const float *v, const specd_kv_layout *kv, int layer, int n_heads,
                       int n_kv_heads, int head_dim);
void cuda_op_swiglu(specd_backend *be, float *out, const float *gate, const float *up, size_t n);
void cuda_op_axpy(specd_backend *be, float *y, float a, const float *x, size_t n);
void cuda_op_scale(specd_backend *be, float *x, float a, size_t n);
void cuda_op_gather_out(specd_backend *be, float *dst, const float *src, int width);
void cuda_op_argmax(specd_backend *be, int32_t *ids, const float *x, int n_rows, int width);
void cuda_op_kv_move(specd_backend *be, const specd_kv_layout *kv, const int32_t *src,
                     const int32_t *dst, int n);
void cuda_ops_free(cuda_backend *cb); /* the ops' scratch and kv_move staging */

/* cuda_weights.c */
int cuda_prepare_weight(specd_backend *be, specd_bweight *w, const specd_tensor *t,
                        specd_error *err);
void cuda_release_weight(specd_backend *be, specd_bweight *w);
void cuda_weights_free_staging(cuda_backend *cb);

/* What prepare_weight keeps in specd_bweight.impl. */
typedef struct cuda_weight {
    void *data;        /* device: rows*cols elements of `type` */
    specd_dtype type;  /* F32, F16 or BF16 */
} cuda_weight;

#endif
