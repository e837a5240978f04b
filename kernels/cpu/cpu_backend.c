/* cpu_backend.c - the CPU implementation of kernels/backend.h.
 *
 * Device buffers are plain host memory. With precision "fast" (the default)
 * Q4_0/Q4_1/Q8_0 matrices are repacked once into the integer path's tiles
 * (qmatmul.h); every other matrix, and every matrix under "exact", is used
 * where it lies in the mmapped model file (no copy) by the fp32-activation
 * kernels (matmul.h). Embedding lookups always read the file's rows. Everything
 * else (norms, RoPE, attention) is simple fp32 code here, split across the
 * thread pool where the work is large enough to pay for the hand-off. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/spec/sampling.h"
#include "kernels/backend.h"
#include "matmul.h"
#include "qmatmul.h"
#include "quant_impl.h"
#include "threadpool.h"
#include "weight_arena.h"

/* A Q8_0 cache's rows reach the fp32 attention kernels in chunks of this
 * many rows at most, dequantized (q8_rows). */
#define Q8_MAX_CHUNK 256

typedef struct cpu_backend {
    specd_backend base;
    specd_pool *pool;
    specd_precision precision;
    /* per-thread attention score buffers, grown on demand */
    float **scores;
    size_t scores_cap;
    /* Q8_0 cache only (see "a Q8_0 cache" below): per-thread buffers of
     * q8_rows() dequantized V rows of one head (kvbuf_floats each) and of
     * a task's quantized queries (qbuf, qbuf_bytes each); the step's
     * prepass buffer of V rows (deq, deq_cap floats) with each sequence's
     * offset into it and its rows there (0: not in it), deq_seq_cap
     * sequences; and the identity page table the fp32 kernels read both
     * through (ident_cap entries) */
    float **kvbuf;
    size_t kvbuf_floats;
    int8_t **qbuf;
    size_t qbuf_bytes;
    float *deq;
    size_t deq_cap;
    size_t *deq_off;
    int *deq_rows;
    int deq_seq_cap;
    int32_t *ident;
    int ident_cap;
    /* the current step (begin_step): the caller's host arrays, which live
     * until its forward pass returns, plus the sequence of each token */
    specd_step step;
    int *tok_seq;
    int tok_seq_cap;
    /* attention's tasks in the current layer: each one's first token (of
     * its query block) and first head, in KV head order (cpu_attention) */
    int *task_tok;
    int *task_h0;
    int task_cap;
    long split_decodes; /* decode steps' attention passes run split (cpu_split_decodes) */
    long seq_tasks;     /* attention passes with a task per sequence (cpu_attention_seq_tasks) */
    cpu_arena *weights; /* the repacked weights, on huge pages (weight_arena.h) */
} cpu_backend;

static cpu_backend *cpu(specd_backend *be) { return (cpu_backend *)be; }

static void cpu_destroy(specd_backend *be) {
    cpu_backend *c = cpu(be);
    int n = specd_pool_size(c->pool);
    for (int i = 0; i < n && c->scores; i++) free(c->scores[i]);
    free(c->scores);
    for (int i = 0; i < n && c->kvbuf; i++) free(c->kvbuf[i]);
    for (int i = 0; i < n && c->qbuf; i++) free(c->qbuf[i]);
    free(c->kvbuf);
    free(c->qbuf);
    free(c->deq);
    free(c->deq_off);
    free(c->deq_rows);
    free(c->ident);
    free(c->tok_seq);
    free(c->task_tok);
    free(c->task_h0);
    cpu_arena_destroy(c->weights);
    specd_pool_destroy(c->pool);
    free(c);
}

static void *cpu_alloc(specd_backend *be, size_t bytes) {
    (void)be;
    /* calloc: large blocks come straight from mmap as untouched zero pages,
     * so a KV cache sized for the full context costs memory only as it
     * fills. */
    return calloc(1, bytes ? bytes : 1);
}

static void cpu_free(specd_backend *be, void *buf) {
    (void)be;
    free(buf);
}

static void cpu_memcpy(specd_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
}

static int cpu_prepare_weight(specd_backend *be, specd_bweight *w, const specd_tensor *t,
                              specd_error *err) {
    if (!t->data)
        return specd_seterr(err, "cpu backend: tensor '%s' has no data (random weights are "
                                 "generated only on a GPU backend)",
                            t->name);
    w->src = t;
    w->cols = (int64_t)t->ne[0];
    w->rows = t->n_dims > 1 ? (int64_t)t->ne[1] : 1;
    w->bytes = t->nbytes; /* the file's own blocks */
    w->impl = NULL;
    cpu_backend *c = cpu(be);
    if (c->precision != SPECD_PRECISION_FAST || t->n_dims < 2) return 0;
    if (!c->weights && !(c->weights = cpu_arena_create()))
        return specd_seterr(err, "cpu backend: out of memory repacking '%s'", t->name);
    cpu_qweight *q = calloc(1, sizeof *q);
    int r = q ? cpu_qweight_make(t, q, c->weights) : -1;
    if (r < 0) {
        free(q);
        return specd_seterr(err, "cpu backend: out of memory repacking '%s'", t->name);
    }
    if (r == 0) { /* no integer path for this type: the fp32 kernels */
        free(q);
        return 0;
    }
    w->impl = q;
    w->bytes = cpu_qweight_bytes(q);
    return 0;
}

static void cpu_release_weight(specd_backend *be, specd_bweight *w) {
    (void)be;
    if (w->impl) {
        cpu_qweight_free(w->impl);
        free(w->impl);
    }
    memset(w, 0, sizeof *w);
}

static void cpu_embed_ids(specd_backend *be, float *out, const specd_bweight *E,
                          const int32_t *ids, int n) {
    (void)be;
    for (int i = 0; i < n; i++) cpu_tensor_row(E->src, ids[i], out + (size_t)i * E->cols);
}

static void cpu_embed(specd_backend *be, float *out, const specd_bweight *E) {
    cpu_embed_ids(be, out, E, cpu(be)->step.tokens, cpu(be)->step.n_tokens);
}

static int cpu_begin_step(specd_backend *be, const specd_step *st, specd_error *err) {
    cpu_backend *c = cpu(be);
    if (st->n_tokens > c->tok_seq_cap) {
        int *p = realloc(c->tok_seq, sizeof(int) * (size_t)st->n_tokens);
        if (!p) return specd_seterr(err, "cpu backend: out of memory for a %d-token step",
                                    st->n_tokens);
        c->tok_seq = p;
        c->tok_seq_cap = st->n_tokens;
    }
    for (int s = 0; s < st->n_seqs; s++)
        for (int i = 0; i < st->seqs[s].n_new; i++) c->tok_seq[st->seqs[s].tok_start + i] = s;
    c->step = *st;
    return 0;
}

/* Everything already happened when the ops returned. */
static int cpu_finish(specd_backend *be, specd_error *err) {
    (void)be;
    (void)err;
    return 0;
}

/* ---- row-wise ops over the pool -------------------------------------------
 *
 * RMSNorm, RoPE and the residual add are per row (per element for the
 * add), cheap next to a matmul, and were run by the calling thread alone
 * while the other threads waited between runs: on a 512-token prefill
 * they, with the activations' quantization (matmul.c), were 13% of the
 * calling thread's time. From ROWS_SPLIT_MIN rows they go over the pool
 * in one contiguous range of rows per thread. Each row is computed by the
 * same code either way, so no bit changes; below that a hand-off costs
 * more than the work (a decode step's one row, a small tree's few). */
#define ROWS_SPLIT_MIN 32
/* The residual add gets elements, not rows: ROWS_SPLIT_MIN rows of
 * SmolLM2's width (576) */
#define AXPY_SPLIT_MIN (ROWS_SPLIT_MIN * 576)

typedef struct rows_job {
    void (*fn)(const struct rows_job *j, int r0, int r1);
    int n, tasks;
    cpu_backend *c;
    float *out, *y;
    const float *x;
    const specd_bweight *w;
    int dim, n_heads, n_kv_heads;
    float eps, a;
    const specd_rope_cfg *rope;
} rows_job;

static void rows_task(void *ctx, int task, int thread) {
    (void)thread;
    const rows_job *j = ctx;
    j->fn(j, specd_pool_share(j->n, j->tasks, task), specd_pool_share(j->n, j->tasks, task + 1));
}

/* j->fn over rows [0, j->n): on the pool from `min` rows */
static void run_rows(cpu_backend *c, rows_job *j, int min) {
    const int threads = specd_pool_size(c->pool);
    if (j->n < min || threads < 2) {
        j->fn(j, 0, j->n);
        return;
    }
    j->tasks = threads;
    specd_pool_run(c->pool, threads, rows_task, j);
}

/* Norm weights are tiny vectors; they may be F32, F16 or BF16 on disk. */
static float weight_at(const specd_tensor *t, int i) {
    switch (t->type) {
    case SPECD_F16: return specd_fp16_to_f32(((const uint16_t *)t->data)[i]);
    case SPECD_BF16: return specd_bf16_to_f32(((const uint16_t *)t->data)[i]);
    default: return ((const float *)t->data)[i];
    }
}

static void rmsnorm_rows(const rows_job *j, int r0, int r1) {
    const specd_bweight *w = j->w;
    const int dim = j->dim;
    const float *x = j->x;
    float *out = j->out;
    /* fp32 weights (every GGUF norm) or none take the path's row kernel
     * (row_ops.c); weight_at converts the others element by element */
    if (!w || w->src->type == SPECD_F32) {
        const float *w32 = w ? (const float *)w->src->data : NULL;
        const cpu_kernel_set *ks = cpu_active_kernels();
        for (int t = r0; t < r1; t++)
            ks->rmsnorm_row(out + (size_t)t * dim, x + (size_t)t * dim, w32, dim, j->eps);
        return;
    }
    for (int t = r0; t < r1; t++) {
        const float *xr = x + (size_t)t * dim;
        float *o = out + (size_t)t * dim;
        float scale = cpu_inv_rms(xr, dim, j->eps);
        for (int i = 0; i < dim; i++) o[i] = (xr[i] * scale) * weight_at(w->src, i);
    }
}

static void cpu_rmsnorm(specd_backend *be, float *out, const float *x, const specd_bweight *w,
                        int n_rows, int dim, float eps) {
    rows_job j = {.fn = rmsnorm_rows, .n = n_rows, .out = out, .x = x, .w = w, .dim = dim,
                  .eps = eps};
    run_rows(cpu(be), &j, ROWS_SPLIT_MIN);
}

/* exact erf form, torch.nn.GELU's default */
static float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2)); }

static void cpu_norm_gelu(specd_backend *be, float *out, const float *x, const specd_bweight *w,
                          const specd_bweight *b, int n_rows, int dim, float eps) {
    (void)be;
    for (int t = 0; t < n_rows; t++) {
        const float *xr = x + (size_t)t * dim;
        float *o = out + (size_t)t * dim;
        float scale = cpu_inv_rms(xr, dim, eps);
        for (int i = 0; i < dim; i++)
            o[i] = gelu_erf(weight_at(w->src, i) * (xr[i] * scale) + weight_at(b->src, i));
    }
}

static void cpu_matmul_op(specd_backend *be, float *y, const specd_bweight *W, const float *x,
                          int n_tok) {
    if (W->impl) cpu_qmatmul(cpu(be)->pool, y, W->impl, x, n_tok);
    else cpu_matmul(cpu(be)->pool, y, W->src, x, n_tok);
}

_Static_assert(SPECD_MATMULS_MAX <= CPU_QMATMULS_MAX, "a matmuls call fits one cpu_qmatmuls");

/* One quantization of x and one pool run for all of them when every matrix
 * has the integer path (matmul.c's cpu_qmatmuls); otherwise one by one. */
static void cpu_matmuls_op(specd_backend *be, int n_mats, float *const *y,
                           const specd_bweight *const *W, const float *x, int n_tok) {
    const cpu_qweight *qw[CPU_QMATMULS_MAX];
    int all_q = n_mats <= CPU_QMATMULS_MAX;
    for (int i = 0; all_q && i < n_mats; i++) all_q = (qw[i] = W[i]->impl) != NULL;
    if (all_q && !cpu_qmatmuls(cpu(be)->pool, n_mats, y, qw, x, n_tok)) return;
    for (int i = 0; i < n_mats; i++) cpu_matmul_op(be, y[i], W[i], x, n_tok);
}

static void rope_rows(const rows_job *j, int r0, int r1) {
    const specd_rope_cfg *cfg = j->rope;
    const float *cos_sin = j->c->step.cos_sin;
    const cpu_kernel_set *ks = cpu_active_kernels();
    const int hd = cfg->head_dim;
    for (int t = r0; t < r1; t++) {
        const float *cs = cos_sin + (size_t)t * cfg->rot_dim;
        ks->rope_heads(j->out + (size_t)t * j->n_heads * hd, j->n_heads, hd, cs, cfg->rot_dim,
                       cfg->interleaved);
        ks->rope_heads(j->y + (size_t)t * j->n_kv_heads * hd, j->n_kv_heads, hd, cs, cfg->rot_dim,
                       cfg->interleaved);
    }
}

static void cpu_rope(specd_backend *be, float *q, float *k, int n_heads, int n_kv_heads,
                     const specd_rope_cfg *cfg) {
    rows_job j = {.fn = rope_rows, .n = cpu(be)->step.n_tokens, .c = cpu(be), .out = q, .y = k,
                  .n_heads = n_heads, .n_kv_heads = n_kv_heads, .rope = cfg};
    run_rows(cpu(be), &j, ROWS_SPLIT_MIN);
}

typedef struct attn_job {
    cpu_backend *c;
    float *out;
    const float *q;
    const void *k_pool, *v_pool; /* this layer's */
    int f16;                     /* pools hold fp16 */
    int q8;                      /* pools hold Q8_0 (else fp32 unless f16) */
    int n_heads, n_kv_heads, head_dim;
    int qb; /* tokens per query block (cpu_attention) */
} attn_job;

/* The physical row of a sequence's logical cache row (backend.h). */
static size_t kv_row(const specd_step_seq *s, int r) {
    return cpu_kv_phys_row(s->pages, r);
}

/* q . (a cache row) and o += w * (a cache row), for either KV type. The
 * type test sits outside the loop: these are the attention hot loops. */
/* q . (a cache row) and o += w * (a cache row), for either KV type: the
 * scalar twins of vec_avx2.c's; the attention loop calls the active path's
 * (cpu_active_kernels). */
float cpu_kv_dot_scalar(const float *q, const void *row, int f16, int n) {
    float dot = 0;
    if (f16) {
        const uint16_t *r = row;
        for (int d = 0; d < n; d++) dot += q[d] * specd_fp16_to_f32(r[d]);
    } else {
        const float *r = row;
        for (int d = 0; d < n; d++) dot += q[d] * r[d];
    }
    return dot;
}

void cpu_kv_axpy_scalar(float *o, float w, const void *row, int f16, int n) {
    if (f16) {
        const uint16_t *r = row;
        for (int d = 0; d < n; d++) o[d] += w * specd_fp16_to_f32(r[d]);
    } else {
        const float *r = row;
        for (int d = 0; d < n; d++) o[d] += w * r[d];
    }
}

void cpu_f32_to_f16_row_scalar(uint16_t *dst, const float *x, int n) {
    for (int d = 0; d < n; d++) dst[d] = specd_f32_to_fp16(x[d]);
}

double cpu_softmax_exp_scalar(float *s, int n, float max) {
    double sum = 0;
    for (int r = 0; r < n; r++) {
        s[r] = s[r] == -INFINITY ? 0.0f : expf(s[r] - max);
        sum += s[r];
    }
    return sum;
}

/* The address of element `base` of a pool of the given KV type. */
static const void *kv_at(const void *pool, int f16, size_t base) {
    return f16 ? (const void *)((const uint16_t *)pool + base)
               : (const void *)((const float *)pool + base);
}

/* Query block: up to ATTN_QB (quant_impl.h's CPU_ATTN_QB) consecutive new
 * tokens of one sequence. They all see the sequence's committed rows, so the paged kernels read each K
 * and V row once for the block instead of once per token: a prompt chunk
 * or a tree reads its context ATTN_QB times less. */
#define ATTN_QB CPU_ATTN_QB

/* Heads one task takes of a block of n_tok tokens when `group` query heads
 * share each KV head (GQA): the most that divide the group and fit in
 * CPU_ATTN_MAXQ queries, so each K and V row is read (and an fp16 row
 * widened) once for all of them instead of once per query head. A decode
 * step's token, a tree and a prompt chunk's block of ATTN_QB tokens all
 * take their KV head's whole group for SmolLM2 (3 heads; 48 queries for a
 * prompt block). At a long context a decode step's attention is that
 * read (docs/BENCHMARKS.md, "GQA heads share their K and V reads": with
 * the K prefetch of vec_avx2.c, decode after 1,000-3,000 tokens 10-11%
 * faster, a batch-4 step at 2,048 tokens 22% faster); a prompt block's is the widening and the loads that feed
 * each fma, which three heads share (vec_avx512.c's dots_qlanes). */
static int heads_per_task(int n_tok, int group) {
    int hg = group;
    while (hg > 1 && (n_tok * hg > CPU_ATTN_MAXQ || group % hg)) hg--;
    return hg;
}

/* 1 if a sequence's n_new new tokens are a single query block that takes
 * all of its KV head's heads (cpu_attention may make it one task). */
static int single_block(int n_new, int qb, int group) {
    return n_new >= 1 && n_new <= qb && heads_per_task(n_new, group) == group;
}

/* Floats between two queries' score rows in a task's buffer: the width
 * rounded up to an odd number of cache lines, so that the 16 rows the
 * attention kernels walk side by side fall into 16 different L1 sets (an
 * odd multiple of 64 bytes times k = 0..63 is distinct modulo 4 KB; a
 * width of 1,024 would put all 16 rows 4 KB apart, in one set). One layer
 * of a 3,000-token prefill, Cascade Lake: 5-10% faster. */
static size_t score_stride(int width) { return (((size_t)width + 15) / 16 | 1) * 16; }

/* ---- a Q8_0 cache ----------------------------------------------------------
 *
 * The K side is kv_q8.c's integer kernel (llama.cpp's arithmetic for a
 * quantized K cache): each query of a task is quantized as the integer
 * matmuls quantize activations, then scored against every row the block
 * sees in int8, and the rows a query may not see are masked afterwards,
 * as a tree's are. The kernel reads 34 bytes per 32 values where the fp32
 * kernels would read 128 of a dequantized copy, and its score is one
 * rounding per block: fixed, whatever the batch or SIMD path.
 *
 * The V side is fp32 over rows dequantized by kv_rows_q8 (exact), read
 * through an identity page table, in one of two ways:
 *
 *   - a sequence with more than one query block this step (a prompt
 *     chunk) has its V rows, every KV head, dequantized once before the
 *     attention tasks into a buffer the step shares (q8_prepare): its
 *     blocks would otherwise each dequantize the same rows again;
 *   - any other (a decode step, a tree) is dequantized by its one task, a
 *     chunk of q8_rows() rows at a time into its thread's buffer, which
 *     stays in L1 while the task's queries use it.
 *
 * Either way every V element is one fma per row in row order with o kept
 * in memory between calls, so the output is the same bits whatever the
 * chunking (test_backend_ops' test_attention_q8_cache). */

/* Rows per chunk for heads of hd: as many as fill 32 KB, a whole number of
 * pages, at least one page. */
static int q8_rows(int hd) {
    int rows = 8192 / hd / SPECD_KV_PAGE_ROWS * SPECD_KV_PAGE_ROWS;
    if (rows > Q8_MAX_CHUNK) rows = Q8_MAX_CHUNK;
    return rows < SPECD_KV_PAGE_ROWS ? SPECD_KV_PAGE_ROWS : rows;
}

/* Where a task reads its sequence's KV head: pools addressed through a
 * page table (the cache itself, or for a Q8_0 cache's V side the step's
 * dequantized copy through the identity table), and whether rows are fp16
 * (widened by the f16 kernels) or Q8_0 (kv_q8.c's kernels). */
typedef struct kv_view {
    const void *k, *v;
    const int32_t *pages;
    size_t stride, off; /* elements per row; the head's first element */
    int f16, q8;
} kv_view;

/* The view a task's V side reads (for a Q8_0 cache, the K side always
 * reads the cache: attn_q8_scores). */
static kv_view task_view(const attn_job *j, int seq, const specd_step_seq *s, int kvh) {
    const cpu_backend *c = j->c;
    const int hd = j->head_dim;
    if (j->q8 && c->deq_rows[seq] > 0) {
        const size_t plane = (size_t)c->deq_rows[seq] * (size_t)hd;
        return (kv_view){NULL, c->deq + c->deq_off[seq] + (size_t)kvh * plane, c->ident,
                         (size_t)hd, 0, 0, 0};
    }
    return (kv_view){j->k_pool, j->v_pool, s->pages, (size_t)j->n_kv_heads * hd,
                     (size_t)kvh * hd, j->f16, j->q8};
}

/* Row r of the view's K (v = 0) or V (v = 1) as kv_dot and kv_axpy take
 * it: where it lies, or a Q8_0 V row dequantized into buf. */
static const void *view_row(const kv_view *w, int v, int r, int hd, float *buf) {
    const void *pool = v ? w->v : w->k;
    if (w->q8) {
        cpu_active_kernels()->kv_rows_q8(buf, pool, w->pages, r, 1, w->stride, w->off, hd);
        return buf;
    }
    return kv_at(pool, w->f16, cpu_kv_phys_row(w->pages, r) * w->stride + w->off);
}

/* A Q8_0 view's rows dequantized into buf, as the fp32 view the task's
 * kernels read them through (rows from 0, one head wide). */
static kv_view chunk_view(float *buf, const int32_t *ident, int hd) {
    return (kv_view){buf, buf, ident, (size_t)hd, 0, 0, 0};
}

/* The K side of rows [0, r0) for nq queries of an fp32 or fp16 view:
 * scores ss[k][r] and their maxima (maxs start at -inf; each call takes
 * the larger). */
static void task_scores(const kv_view *w, const float *const *qs, int nq, int r0, int hd,
                        float scale, float *const *ss, float *maxs) {
    const cpu_kernel_set *ks = cpu_active_kernels();
    if (w->f16) {
        if (nq > 1 && ks->kv_dots_block_f16)
            ks->kv_dots_block_f16(qs, nq, w->k, w->pages, r0, w->stride, w->off, hd, scale, ss,
                                  maxs);
        else
            for (int k = 0; k < nq; k++)
                maxs[k] = ks->kv_dots_f16(qs[k], w->k, w->pages, r0, w->stride, w->off, hd, scale,
                                          ss[k]);
    } else {
        if (nq > 1 && ks->kv_dots_block)
            ks->kv_dots_block(qs, nq, w->k, w->pages, r0, w->stride, w->off, hd, scale, ss, maxs);
        else
            for (int k = 0; k < nq; k++) {
                const float m =
                    ks->kv_dots(qs[k], w->k, w->pages, r0, w->stride, w->off, hd, scale, ss[k]);
                if (m > maxs[k]) maxs[k] = m; /* NaN never the max, as in the kernels */
            }
    }
}

/* A Q8_0 cache's K side (see "a Q8_0 cache"): the task's nq queries
 * quantized into its thread's buffer, then scores for rows [0, width) of
 * the sequence's KV head kvh, and each query's max over rows [0, n_max). */
static void attn_q8_scores(const attn_job *j, int thread, const specd_step_seq *s, int kvh,
                           const float *const *qs, int nq, int width, float scale,
                           float *const *ss, int n_max, float *maxs) {
    const cpu_backend *c = j->c;
    const cpu_kernel_set *ks = cpu_active_kernels();
    const int hd = j->head_dim, nb = hd / 32;
    int8_t *qv = c->qbuf[thread];
    float *qd = (float *)(qv + (size_t)CPU_ATTN_MAXQ * hd), *qsc = qd + CPU_ATTN_MAXQ * nb;
    int32_t *qsum = (int32_t *)(qsc + CPU_ATTN_MAXQ * nb);
    for (int k = 0; k < nq; k++)
        ks->quantize(qs[k], 1, hd, qv + (size_t)k * hd, qd + k * nb, qsc + k * nb, qsum + k * nb);
    ks->kv_dots_q8(qv, qd, qsum, nq, j->k_pool, s->pages, width, (size_t)j->n_kv_heads * hd,
                   (size_t)kvh * hd, hd, scale, ss, n_max, maxs);
}

/* The V side of rows [0, r0): os[k] += (ss[k][r] * invs[k]) * V_r; a
 * Q8_0 view goes a chunk of dequantized rows at a time through the fp32
 * branch. */
static void task_values(const kv_view *w, float *const *os, const float *const *ss,
                        const float *invs, int nq, int r0, int hd, float *buf,
                        const int32_t *ident) {
    const cpu_kernel_set *ks = cpu_active_kernels();
    if (w->q8) {
        const int ch = q8_rows(hd);
        const kv_view cw = chunk_view(buf, ident, hd);
        for (int ra = 0; ra < r0; ra += ch) {
            const int nr = r0 - ra < ch ? r0 - ra : ch;
            ks->kv_rows_q8(buf, w->v, w->pages, ra, nr, w->stride, w->off, hd);
            const float *sc[CPU_ATTN_MAXQ];
            for (int k = 0; k < nq; k++) sc[k] = ss[k] + ra;
            task_values(&cw, os, sc, invs, nq, nr, hd, NULL, NULL);
        }
    } else if (w->f16) {
        if (nq > 1 && ks->kv_axpys_block_f16)
            ks->kv_axpys_block_f16(os, ss, invs, nq, w->v, w->pages, r0, w->stride, w->off, hd);
        else
            for (int k = 0; k < nq; k++)
                ks->kv_axpys_f16(os[k], ss[k], invs[k], w->v, w->pages, r0, w->stride, w->off, hd);
    } else {
        if (nq > 1 && ks->kv_axpys_block)
            ks->kv_axpys_block(os, ss, invs, nq, w->v, w->pages, r0, w->stride, w->off, hd);
        else
            for (int k = 0; k < nq; k++)
                ks->kv_axpys(os[k], ss[k], invs[k], w->v, w->pages, r0, w->stride, w->off, hd);
    }
}

/* One block = one query block (from token t0) and heads_per_task() of its
 * heads (one KV head's, from h0): for each query (token t, head h),
 * softmax(q_th . K^T / sqrt(d)) . V over the rows t sees: the n_past
 * committed rows plus the new rows the mask allows. Every query's
 * arithmetic is the per-row kernels' whatever the block (the blocked
 * kernels are bitwise the same per query), so a row's output does not
 * depend on what else is in the batch, nor on how its heads were grouped
 * or its blocks shared out among tasks. */
static void attn_block(attn_job *j, int t0, int h0, int thread);

/* One task = one block (task_tok, task_h0), or where task_h0 is -1 one
 * sequence's query block for every KV head in turn (cpu_attention). */
static void attn_task(void *ctx, int task, int thread) {
    attn_job *j = ctx;
    const cpu_backend *c = j->c;
    if (c->task_h0[task] < 0) { /* one sequence's query block, every KV head in turn */
        const int group = j->n_heads / j->n_kv_heads;
        for (int kvh = 0; kvh < j->n_kv_heads; kvh++)
            attn_block(j, c->task_tok[task], kvh * group, thread);
        return;
    }
    attn_block(j, c->task_tok[task], c->task_h0[task], thread);
}

static void attn_block(attn_job *j, int t0, int h0, int thread) {
    const cpu_backend *c = j->c;
    const specd_step *st = &c->step;
    const cpu_kernel_set *ks = cpu_active_kernels();
    const int seq = c->tok_seq[t0];
    const specd_step_seq *s = &st->seqs[seq];
    int i0 = t0 - s->tok_start; /* index among the sequence's new tokens */
    int n_tok = s->n_new - i0 < j->qb ? s->n_new - i0 : j->qb;
    int group = j->n_heads / j->n_kv_heads, hg = heads_per_task(n_tok, group);
    int nq = n_tok * hg; /* queries: hg heads x n_tok tokens */
    int hd = j->head_dim;
    int kvh = h0 / group;
    float scale = 1.0f / sqrtf((float)hd);
    int width = s->n_past + i0 + n_tok; /* rows the block's last token sees */
    float *scores = c->scores[thread];  /* [nq][width] */
    float *buf = j->q8 ? c->kvbuf[thread] : NULL; /* dequantized Q8_0 rows */
    const kv_view w = task_view(j, seq, s, kvh);
    const float *qs[CPU_ATTN_MAXQ];
    float *os[CPU_ATTN_MAXQ], *ss[CPU_ATTN_MAXQ], maxs[CPU_ATTN_MAXQ], invs[CPU_ATTN_MAXQ];
    int tok[CPU_ATTN_MAXQ]; /* each query's token, 0..n_tok-1 */
    for (int k = 0; k < nq; k++) {
        int h = h0 + k / n_tok;
        tok[k] = k % n_tok;
        qs[k] = j->q + ((size_t)(t0 + tok[k]) * j->n_heads + h) * hd;
        os[k] = j->out + ((size_t)(t0 + tok[k]) * j->n_heads + h) * hd;
        ss[k] = scores + (size_t)k * score_stride(width);
        maxs[k] = -INFINITY;
    }
    /* Rows before r0 are seen by every token of the block and done by the
     * paged kernels: the committed rows, and with a causal mask the new
     * rows up to the block's first token too (a prompt chunk's own rows). */
    int r0 = s->n_past + (s->mask ? 0 : i0 + 1);
    if (!(w.f16 ? ks->kv_dots_f16 && hd <= CPU_KV_F16_MAX_HEAD : ks->kv_dots != NULL)) r0 = 0;
    /* A tree (a mask): the paged kernels take its new rows as well, for
     * every query, and the rows a query may not see are masked afterwards.
     * Each score is the per-row kernel's bits either way; row by row below
     * the new rows cost a call per (query, row), a third of a verify's
     * attention for a tree of 5 over 64 rows. */
    const int tree = s->mask && r0 > 0;
    if (tree) r0 = width;
    if (j->q8) {
        /* every row the block sees, by the integer kernel: a query's
         * softmax below stops at its own token's row, and a tree's rows a
         * query may not see are masked */
        const int n_max = s->n_past + (s->mask ? 0 : i0 + 1); /* rows every query sees */
        attn_q8_scores(j, thread, s, kvh, qs, nq, width, scale, ss, n_max, maxs);
        for (int k = 0; k < nq; k++) {
            int i = i0 + tok[k], n_rows = tree ? width : s->n_past + i + 1;
            float *sc = ss[k];
            for (int r = n_max; r < n_rows; r++) {
                if (s->mask &&
                    (r > s->n_past + i || !s->mask[(size_t)i * s->n_new + (r - s->n_past)])) {
                    sc[r] = -INFINITY;
                    continue;
                }
                if (sc[r] > maxs[k]) maxs[k] = sc[r]; /* NaN never the max, as in the kernel */
            }
        }
    } else {
        if (r0 > 0) task_scores(&w, qs, nq, r0, hd, scale, ss, maxs);
        if (tree)
            for (int k = 0; k < nq; k++) {
                /* -inf where the query may not look (later nodes, other
                 * branches), then its max over what it sees: the max the
                 * row by row loop would reach, a max being the same in any
                 * order (NaN never wins either way) */
                int i = i0 + tok[k];
                float *sc = ss[k];
                for (int r = s->n_past; r < width; r++)
                    if (r > s->n_past + i || !s->mask[(size_t)i * s->n_new + (r - s->n_past)])
                        sc[r] = -INFINITY;
                /* the vector argmax's maximum (a NaN only where all are NaN) */
                float m = sc[ks->argmax(sc, width)];
                maxs[k] = isnan(m) ? -INFINITY : m;
            }
        for (int k = 0; k < nq; k++) {
            int i = i0 + tok[k], n_rows = tree ? width : s->n_past + i + 1;
            float *sc = ss[k];
            for (int r = r0; r < n_rows; r++) {
                int visible = r < s->n_past || !s->mask ||
                              s->mask[(size_t)i * s->n_new + (r - s->n_past)];
                if (!visible) {
                    sc[r] = -INFINITY;
                    continue;
                }
                sc[r] = ks->kv_dot(qs[k], view_row(&w, 0, r, hd, buf), w.f16, hd) * scale;
                if (sc[r] > maxs[k]) maxs[k] = sc[r];
            }
        }
    }
    for (int k = 0; k < nq; k++) {
        int n_rows = tree ? width : s->n_past + i0 + tok[k] + 1;
        double sum = ks->softmax_exp(ss[k], n_rows, maxs[k]);
        invs[k] = (float)(1.0 / sum);
        memset(os[k], 0, sizeof(float) * hd);
    }
    if (r0) task_values(&w, os, (const float *const *)ss, invs, nq, r0, hd, buf, c->ident);
    for (int k = 0; k < nq; k++) {
        int n_rows = tree ? width : s->n_past + i0 + tok[k] + 1;
        for (int r = r0; r < n_rows; r++) {
            if (ss[k][r] == 0.0f) continue;
            float wt = ss[k][r] * invs[k];
            ks->kv_axpy(os[k], wt, view_row(&w, 1, r, hd, buf), w.f16, hd);
        }
    }
}

/* The Q8_0 prepass (see "a Q8_0 cache" above): for each sequence with more
 * than one query block, rows [0, n_past + n_new) of every KV head's V into
 * c->deq, one plane per KV head, each rows x head_dim; tasks of up to
 * Q8_MAX_CHUNK rows of one plane. The step's new rows are in the cache
 * already. At most Q8_PREPASS_MAX floats (16 MB: a context of 21,000 for
 * SmolLM2) in all; sequences past that take the per-task path. */
#define Q8_PREPASS_MAX ((size_t)4 << 20)

typedef struct q8_prepass_job {
    cpu_backend *c;
    const void *v_pool;
    int n_kv_heads, head_dim;
    int *task_seq, *task_plane, *task_row; /* per task */
} q8_prepass_job;

static void q8_prepass_task(void *ctx, int task, int thread) {
    (void)thread;
    q8_prepass_job *j = ctx;
    const cpu_backend *c = j->c;
    const int seq = j->task_seq[task], kvh = j->task_plane[task], r = j->task_row[task];
    const specd_step_seq *s = &c->step.seqs[seq];
    const int rows = c->deq_rows[seq], hd = j->head_dim;
    const int nr = rows - r < Q8_MAX_CHUNK ? rows - r : Q8_MAX_CHUNK;
    float *dst = c->deq + c->deq_off[seq] + ((size_t)kvh * rows + (size_t)r) * hd;
    cpu_active_kernels()->kv_rows_q8(dst, j->v_pool, s->pages, r, nr,
                                     (size_t)j->n_kv_heads * hd, (size_t)kvh * hd, hd);
}

/* ---- split decode: one token's attention over a long context -----------
 *
 * A decode step of one sequence has one task per KV head above. With more
 * threads than KV heads (3 for SmolLM2 on a 4-core machine, 8 for Llama-3
 * on 16 cores, 1 for a multi-query model on any), some threads have no
 * task at all while the others read the whole cache, and at a long context
 * that pass is most of the step. With KV heads that do not divide among
 * the threads (SmolLM2's 3 on 2) one thread reads two heads' rows while
 * the other waits for it after one. Rows are independent on the K side and
 * head elements on the V side, so the pass then splits into three runs
 * that every thread shares, each value computed by the same kernel calls
 * as above:
 *
 *   1. scores: each KV head's rows in page-aligned chunks, one per thread,
 *      by the block kernel (every row's score is kv_dot's bits wherever
 *      its block starts, test_matmul), with each chunk's maximum;
 *   2. softmax: per query head, the chunks' maximum (a maximum does not
 *      depend on order) and softmax_exp over all the rows in order, as
 *      attn_task calls it;
 *   3. V: each KV head's output elements in slices of 32, every slice's
 *      elements the same fma chains over the rows in row order.
 *
 * So the output is attn_task's, bit for bit (test_backend_ops compares
 * the two), and batch invariance holds. Measured (bench_attention
 * --kv-heads 1, 2 threads, Sapphire Rapids VM): decode over 3,000 rows,
 * 30 layers, 2.71-3.03 ms in one run against 2.15-2.29 ms split; over
 * 1,000 rows even (0.96-1.00 against 0.89-1.03), the two extra runs eating
 * the gain, hence SPLIT_MIN_ROWS. There, 3 KV heads on 2 threads split
 * measured no faster than the one run (3,000 rows 4.46-4.75 ms against
 * 4.56-4.70; 1,000 rows 1.44-1.45 against 1.64-1.73). On the 2-vCPU AMD
 * EPYC Zen 5 VM, where two threads stream the cache at a third of the
 * memory's pace, they split faster (bench_attention, alternated, three
 * runs: 3,000 rows 4.63/5.04/4.66 ms against 6.87/5.39/5.22, 2,000 rows
 * 2.90-4.28 against 3.23-4.35, 1,500 rows 1.94-3.06 against 2.35-3.01;
 * decode after a 3,000-token prompt 133-137 tok/s against 122-129), so
 * heads that do not divide evenly among the threads split too, and heads
 * that do (4 on 2 threads, 3 on 3) keep the one run. Re-measure on a
 * machine like the first. */
#define SPLIT_MIN_ROWS 1024
#define SPLIT_SLICE 32   /* V side: head elements per task */
#define SPLIT_MAX_CHUNKS 64

typedef struct split_job {
    const cpu_kernel_set *ks;
    float *out;
    const float *q;
    const void *k_pool, *v_pool;
    int f16, n_heads, group, head_dim, kvw;
    const specd_step_seq *s;
    int width;                   /* rows the token sees: n_past + 1 */
    int n_chunks, chunk_rows;    /* run 1: rows per task, a multiple of the page */
    int n_slices;                /* run 3: head_dim / SPLIT_SLICE */
    float *scores;               /* [n_heads][stride] */
    size_t stride;
    float maxs[CPU_ATTN_MAXQ * SPLIT_MAX_CHUNKS]; /* [head][chunk] */
    float invs[CPU_ATTN_MAXQ];
} split_job;

static const float *split_q(const split_job *j, int h) {
    return j->q + ((size_t)j->s->tok_start * j->n_heads + h) * j->head_dim;
}

static float *split_out(const split_job *j, int h) {
    return j->out + ((size_t)j->s->tok_start * j->n_heads + h) * j->head_dim;
}

static void split_scores_task(void *ctx, int task, int thread) {
    (void)thread;
    split_job *j = ctx;
    const int kvh = task / j->n_chunks, ci = task % j->n_chunks, h0 = kvh * j->group;
    const int ra = ci * j->chunk_rows;
    const int nr = j->width - ra < j->chunk_rows ? j->width - ra : j->chunk_rows;
    const float *qs[CPU_ATTN_MAXQ];
    float *ss[CPU_ATTN_MAXQ], m[CPU_ATTN_MAXQ];
    for (int k = 0; k < j->group; k++) {
        qs[k] = split_q(j, h0 + k);
        ss[k] = j->scores + (size_t)(h0 + k) * j->stride + ra;
        m[k] = -INFINITY;
    }
    if (nr > 0) {
        const int32_t *pages = j->s->pages + ra / SPECD_KV_PAGE_ROWS;
        const size_t off = (size_t)kvh * j->head_dim, kvw = (size_t)j->kvw;
        const int hd = j->head_dim;
        const float scale = 1.0f / sqrtf((float)hd);
        if (j->f16 && j->group > 1)
            j->ks->kv_dots_block_f16(qs, j->group, j->k_pool, pages, nr, kvw, off, hd, scale, ss, m);
        else if (j->f16)
            m[0] = j->ks->kv_dots_f16(qs[0], j->k_pool, pages, nr, kvw, off, hd, scale, ss[0]);
        else if (j->group > 1)
            j->ks->kv_dots_block(qs, j->group, j->k_pool, pages, nr, kvw, off, hd, scale, ss, m);
        else
            m[0] = j->ks->kv_dots(qs[0], j->k_pool, pages, nr, kvw, off, hd, scale, ss[0]);
    }
    for (int k = 0; k < j->group; k++) j->maxs[(h0 + k) * j->n_chunks + ci] = m[k];
}

static void split_softmax_task(void *ctx, int h, int thread) {
    (void)thread;
    split_job *j = ctx;
    float m = -INFINITY;
    for (int ci = 0; ci < j->n_chunks; ci++) {
        const float x = j->maxs[h * j->n_chunks + ci];
        if (x > m) m = x; /* as the kernels fold their lanes: NaN never wins */
    }
    const double sum = j->ks->softmax_exp(j->scores + (size_t)h * j->stride, j->width, m);
    j->invs[h] = (float)(1.0 / sum);
    memset(split_out(j, h), 0, sizeof(float) * (size_t)j->head_dim);
}

static void split_values_task(void *ctx, int task, int thread) {
    (void)thread;
    split_job *j = ctx;
    const int kvh = task / j->n_slices, d0 = (task % j->n_slices) * SPLIT_SLICE;
    const int h0 = kvh * j->group;
    float *os[CPU_ATTN_MAXQ];
    const float *ss[CPU_ATTN_MAXQ];
    for (int k = 0; k < j->group; k++) {
        os[k] = split_out(j, h0 + k) + d0;
        ss[k] = j->scores + (size_t)(h0 + k) * j->stride;
    }
    const size_t off = (size_t)kvh * j->head_dim + (size_t)d0, kvw = (size_t)j->kvw;
    if (j->f16)
        j->ks->kv_axpys_block_f16(os, ss, j->invs + h0, j->group, j->v_pool, j->s->pages, j->width,
                                  kvw, off, SPLIT_SLICE);
    else
        j->ks->kv_axpys_block(os, ss, j->invs + h0, j->group, j->v_pool, j->s->pages, j->width, kvw,
                              off, SPLIT_SLICE);
}

/* The split decode for this step, or 0 where attn_task's one run serves:
 * one sequence, one new token, no mask, a context of SPLIT_MIN_ROWS or
 * more, KV heads that leave a thread idle or do not divide evenly among
 * the threads, and the block kernels to call (not the scalar set). */
static int split_decode(cpu_backend *c, float *out, const float *q, const void *k_pool,
                        const void *v_pool, int f16, int n_heads, int n_kv_heads, int head_dim) {
    const specd_step *st = &c->step;
    const cpu_kernel_set *ks = cpu_active_kernels();
    const int threads = specd_pool_size(c->pool);
    if (st->n_seqs != 1 || (threads <= n_kv_heads && n_kv_heads % threads == 0)) return 0;
    const specd_step_seq *s = &st->seqs[0];
    const int width = s->n_past + 1;
    if (s->n_new != 1 || s->mask || width < SPLIT_MIN_ROWS) return 0;
    if (n_heads > CPU_ATTN_MAXQ || head_dim % SPLIT_SLICE) return 0;
    if (f16 ? !ks->kv_dots_block_f16 || !ks->kv_axpys_block_f16 || head_dim > CPU_KV_F16_MAX_HEAD
            : !ks->kv_dots_block || !ks->kv_axpys_block)
        return 0;
    split_job j; /* on this stack while the three runs last */
    int chunks = threads < SPLIT_MAX_CHUNKS ? threads : SPLIT_MAX_CHUNKS;
    int rows = (width + chunks - 1) / chunks;
    rows = (rows + SPECD_KV_PAGE_ROWS - 1) / SPECD_KV_PAGE_ROWS * SPECD_KV_PAGE_ROWS;
    j = (split_job){.ks = ks, .out = out, .q = q, .k_pool = k_pool, .v_pool = v_pool, .f16 = f16,
                    .n_heads = n_heads, .group = n_heads / n_kv_heads, .head_dim = head_dim,
                    .kvw = n_kv_heads * head_dim, .s = s, .width = width,
                    .n_chunks = (width + rows - 1) / rows, .chunk_rows = rows,
                    .n_slices = head_dim / SPLIT_SLICE, .scores = c->scores[0],
                    .stride = score_stride(width)};
    specd_pool_run(c->pool, n_kv_heads * j.n_chunks, split_scores_task, &j);
    specd_pool_run(c->pool, n_heads, split_softmax_task, &j);
    specd_pool_run(c->pool, n_kv_heads * j.n_slices, split_values_task, &j);
    c->split_decodes++;
    return 1;
}

long cpu_split_decodes(const specd_backend *be) {
    return be && !strcmp(be->ops->name, "cpu") ? ((const cpu_backend *)be)->split_decodes : 0;
}

long cpu_attention_seq_tasks(const specd_backend *be) {
    return be && !strcmp(be->ops->name, "cpu") ? ((const cpu_backend *)be)->seq_tasks : 0;
}

/* The buffers a Q8_0 cache's attention needs this step, and its prepass
 * (see "a Q8_0 cache"). Allocation failures abort, as the score buffers'
 * do: a few KB a thread, and the prepass only where it fits its cap. */
static void q8_prepare(cpu_backend *c, const void *v_pool, int n_kv_heads, int head_dim) {
    const specd_step *st = &c->step;
    const size_t kvbuf_floats = (size_t)q8_rows(head_dim) * (size_t)head_dim;
    if (kvbuf_floats > c->kvbuf_floats) {
        for (int i = 0; i < specd_pool_size(c->pool); i++) {
            free(c->kvbuf[i]);
            c->kvbuf[i] = aligned_alloc(64, sizeof(float) * kvbuf_floats);
            if (!c->kvbuf[i]) abort();
        }
        c->kvbuf_floats = kvbuf_floats;
    }
    /* a task's queries' int8 values, then their blocks' scales, scale x
     * sum (unused here) and sums (attn_q8_scores) */
    const size_t qbytes = (size_t)CPU_ATTN_MAXQ *
                          ((size_t)head_dim + 3 * sizeof(float) * (size_t)(head_dim / 32));
    if (qbytes > c->qbuf_bytes) {
        for (int i = 0; i < specd_pool_size(c->pool); i++) {
            free(c->qbuf[i]);
            c->qbuf[i] = aligned_alloc(64, (qbytes + 63) / 64 * 64);
            if (!c->qbuf[i]) abort();
        }
        c->qbuf_bytes = qbytes;
    }
    if (st->n_seqs > c->deq_seq_cap) {
        free(c->deq_off);
        free(c->deq_rows);
        c->deq_off = malloc(sizeof(size_t) * (size_t)st->n_seqs);
        c->deq_rows = malloc(sizeof(int) * (size_t)st->n_seqs);
        if (!c->deq_off || !c->deq_rows) abort();
        c->deq_seq_cap = st->n_seqs;
    }
    /* which sequences the prepass takes, and the floats and tasks they need */
    size_t floats = 0;
    int n_tasks = 0, max_rows = q8_rows(head_dim);
    for (int s = 0; s < st->n_seqs; s++) {
        const specd_step_seq *sq = &st->seqs[s];
        const int rows = sq->n_past + sq->n_new;
        const size_t need = (size_t)n_kv_heads * (size_t)rows * (size_t)head_dim;
        c->deq_rows[s] = 0;
        if (sq->n_new <= ATTN_QB || floats + need > Q8_PREPASS_MAX) continue;
        c->deq_rows[s] = rows;
        c->deq_off[s] = floats;
        floats += need;
        n_tasks += n_kv_heads * ((rows + Q8_MAX_CHUNK - 1) / Q8_MAX_CHUNK);
        if (rows > max_rows) max_rows = rows;
    }
    const int pages = (max_rows + SPECD_KV_PAGE_ROWS - 1) / SPECD_KV_PAGE_ROWS;
    if (pages > c->ident_cap) {
        int32_t *p = realloc(c->ident, sizeof(int32_t) * (size_t)pages);
        if (!p) abort();
        for (int i = c->ident_cap; i < pages; i++) p[i] = i;
        c->ident = p;
        c->ident_cap = pages;
    }
    if (!n_tasks) return;
    if (floats > c->deq_cap) {
        free(c->deq);
        c->deq = aligned_alloc(64, sizeof(float) * floats);
        if (!c->deq) abort();
        c->deq_cap = floats;
    }
    int *tasks = malloc(sizeof(int) * 3 * (size_t)n_tasks);
    if (!tasks) abort();
    q8_prepass_job j = {c, v_pool, n_kv_heads, head_dim, tasks, tasks + n_tasks,
                        tasks + 2 * n_tasks};
    int t = 0;
    for (int s = 0; s < st->n_seqs; s++)
        for (int plane = 0; c->deq_rows[s] && plane < n_kv_heads; plane++)
            for (int r = 0; r < c->deq_rows[s]; r += Q8_MAX_CHUNK) {
                j.task_seq[t] = s;
                j.task_plane[t] = plane;
                j.task_row[t++] = r;
            }
    specd_pool_run(c->pool, n_tasks, q8_prepass_task, &j);
    free(tasks);
}

/* Stores one fp32 row of n elements as row `row` of a pool of the backend's
 * KV type. */
static void kv_store(void *pool, specd_dtype type, size_t row, const float *src, int n) {
    if (type == SPECD_F16)
        cpu_active_kernels()->f32_to_f16_row((uint16_t *)pool + row * (size_t)n, src, n);
    else if (type == SPECD_Q8_0)
        cpu_active_kernels()->quantize_q8_0(src, (char *)pool + row * specd_kv_row_bytes(type, n),
                                            n);
    else
        memcpy((float *)pool + row * (size_t)n, src, sizeof(float) * n);
}

static void cpu_attention(specd_backend *be, float *out, const float *q, const float *k,
                          const float *v, const specd_kv_layout *kv, int layer, int n_heads,
                          int n_kv_heads, int head_dim) {
    cpu_backend *c = cpu(be);
    const specd_step *st = &c->step;
    int kvw = n_kv_heads * head_dim;
    int f16 = be->kv_type == SPECD_F16, q8 = be->kv_type == SPECD_Q8_0;
    size_t layer_bytes = (size_t)kv->n_rows * specd_kv_row_bytes(be->kv_type, kv->kv_dim);
    char *k_pool = (char *)kv->base + (size_t)(2 * layer) * layer_bytes;
    char *v_pool = k_pool + layer_bytes;
    size_t longest = 0;
    for (int s = 0; s < st->n_seqs; s++) {
        const specd_step_seq *sq = &st->seqs[s];
        /* the new rows go into the cache first, so a token's own K/V and its
         * visible siblings are read from one place */
        for (int i = 0; i < sq->n_new; i++) {
            size_t dst = kv_row(sq, sq->n_past + i);
            size_t src = (size_t)(sq->tok_start + i) * kvw;
            kv_store(k_pool, be->kv_type, dst, k + src, kvw);
            kv_store(v_pool, be->kv_type, dst, v + src, kvw);
        }
        size_t len = (size_t)sq->n_past + sq->n_new;
        if (len > longest) longest = len;
    }
    if (longest > c->scores_cap) {
        int nt = specd_pool_size(c->pool);
        for (int i = 0; i < nt; i++) {
            free(c->scores[i]);
            /* on a cache line, as every score row then is (score_stride):
             * the kernels' 64-byte loads and stores never split a line */
            c->scores[i] = aligned_alloc(64, sizeof(float) * score_stride((int)longest) * CPU_ATTN_MAXQ);
            /* 64 bytes per context row: a process that cannot get that has
             * nothing sensible left to do, and attention has no error path */
            if (!c->scores[i]) abort();
        }
        c->scores_cap = longest;
    }
    if (q8) q8_prepare(c, v_pool, n_kv_heads, head_dim);
    /* a Q8_0 cache is left to the one run (its tasks dequantize per KV head) */
    if (!q8 && split_decode(c, out, q, k_pool, v_pool, f16, n_heads, n_kv_heads, head_dim)) return;
    /* The tasks: each sequence's new tokens in query blocks of ATTN_QB (qb
     * below), times the block's head groups, taken in this order:
     * sequence by sequence, and within a sequence by KV head first. So both
     * threads work on one KV head's K and V rows (768 KB for SmolLM2 at
     * 3,000 tokens) while it stays in their L2, instead of cycling through
     * every KV head's rows block after block (one layer of a 3,000-token
     * prefill's attention, 2 threads, Cascade Lake: 6% faster; min of 6
     * alternated runs), and several sequences' steps finish one sequence's
     * rows before the next: a KV head's slice is a third of each cached row
     * of SmolLM2 (128 of 384 bytes), and the lines around it that the
     * prefetchers bring in are the other heads' slices of the same rows,
     * which then serve those heads from the cache instead of being read
     * again after every other sequence's (KV head first over 8 sequences
     * of 2,048 cached tokens, Sapphire Rapids VM: a plain step 38.8-41.8 ms
     * against 33.5-35.2 in this order). The order changes no result: every
     * task's arithmetic is its own. */
    if ((size_t)st->n_tokens * (size_t)n_heads > (size_t)c->task_cap) {
        size_t cap = (size_t)st->n_tokens * (size_t)n_heads;
        int *p = realloc(c->task_tok, sizeof(int) * cap);
        if (p) c->task_tok = p;
        int *h = realloc(c->task_h0, sizeof(int) * cap);
        if (h) c->task_h0 = h;
        if (!p || !h) abort(); /* a few bytes per token: nothing sensible is left to do */
        c->task_cap = (int)cap;
    }
    /* A lone verify tree: its one query block per KV head makes as many
     * tasks as KV heads (3 for SmolLM2), which two threads share 2 + 1.
     * Halves of the tree make twice as many, shared evenly, each reading
     * the KV head's rows again (bench_attention --trees, 2 threads, Cascade
     * Lake: a chain of 9 after 64 rows 1.33-1.45 -> 1.14-1.15 ms, after
     * 1,000 rows 16.1-16.9 -> 14.4-14.7 ms; a chain of 5 after 64 rows
     * 0.73-0.80 -> 0.68-0.71 ms, after 200 and 1,000 rows unchanged). A
     * query's arithmetic does not depend on its block (attn_block). */
    const int threads = specd_pool_size(c->pool);
    int n_tasks = 0, group = n_heads / n_kv_heads, qb = ATTN_QB;
    if (st->n_seqs == 1 && st->seqs[0].mask && st->seqs[0].n_new > 1 &&
        st->seqs[0].n_new <= ATTN_QB && n_kv_heads < 2 * threads)
        qb = (st->seqs[0].n_new + 1) / 2;
    /* A sequence whose new tokens are one query block (a decode token, a
     * verify tree, a short prompt chunk) beside others: one task for the
     * sequence, its KV heads in turn (task_h0 -1), so one thread reads its
     * whole cached rows and finds the next head's slice in its own L2 (8
     * sequences of 2,048 cached tokens, Sapphire Rapids VM, 2 threads: a
     * plain step 29.9-30.7 ms against 33.5-35.2 with a task per KV head in
     * the order above; 4 sequences 15.6-15.8 against 17.6-18.7). Only where
     * the step's tasks still share out evenly enough: as many as the
     * threads, or at least twice as many (3 decode tokens on 2 threads
     * measured slower, one thread doing two sequences). */
    int whole = 0, others = 0;
    for (int s = 0; s < st->n_seqs; s++) {
        const int n_new = st->seqs[s].n_new;
        if (single_block(n_new, qb, group)) whole++;
        else others += n_kv_heads * ((n_new + qb - 1) / qb); /* at least */
    }
    const int use_whole = st->n_seqs > 1 && whole > 0 &&
                          (whole + others == threads || whole + others >= 2 * threads);
    /* the whole-sequence tasks first, the longest first (each is the
     * longest kind of task, so the small ones are left to even out the
     * threads' ends: a decode step of sequences of unequal contexts, or
     * decodes beside a prompt chunk) */
    if (use_whole) {
        for (int s = 0; s < st->n_seqs; s++) {
            const int n_new = st->seqs[s].n_new;
            if (!single_block(n_new, qb, group)) continue;
            const int width = st->seqs[s].n_past + n_new;
            int at = n_tasks++;
            for (; at > 0; at--) { /* insertion by width, descending */
                const specd_step_seq *o = &st->seqs[c->tok_seq[c->task_tok[at - 1]]];
                if (o->n_past + o->n_new >= width) break;
                c->task_tok[at] = c->task_tok[at - 1];
                c->task_h0[at] = -1;
            }
            c->task_tok[at] = st->seqs[s].tok_start;
            c->task_h0[at] = -1;
        }
    }
    for (int s = 0; s < st->n_seqs; s++) {
        const int n_new = st->seqs[s].n_new;
        if (use_whole && single_block(n_new, qb, group)) continue;
        for (int kvh = 0; kvh < n_kv_heads; kvh++)
            for (int i = 0; i < n_new; i += qb) {
                int n_tok = n_new - i < qb ? n_new - i : qb;
                int hg = heads_per_task(n_tok, group);
                for (int h = kvh * group; h < (kvh + 1) * group; h += hg) {
                    c->task_tok[n_tasks] = st->seqs[s].tok_start + i;
                    c->task_h0[n_tasks++] = h;
                }
            }
    }
    if (use_whole) c->seq_tasks++;
    attn_job j = {c, out, q, k_pool, v_pool, f16, q8, n_heads, n_kv_heads, head_dim, qb};
    specd_pool_run(c->pool, n_tasks, attn_task, &j);
}

static void cpu_swiglu_op(specd_backend *be, float *out, const float *gate, const float *up,
                          size_t n) {
    cpu_swiglu(cpu(be)->pool, out, gate, up, n);
}

/* y += a x over elements [i0, i1) (a "row" is an element here) */
static void axpy_rows(const rows_job *j, int i0, int i1) {
    cpu_active_kernels()->axpy(j->y + i0, j->a, j->x + i0, (size_t)(i1 - i0));
}

static void cpu_axpy(specd_backend *be, float *y, float a, const float *x, size_t n) {
    if (n > (size_t)INT_MAX) { /* beyond any step's activations; one range */
        for (size_t i = 0; i < n; i++) y[i] += a * x[i];
        return;
    }
    rows_job j = {.fn = axpy_rows, .n = (int)n, .y = y, .x = x, .a = a};
    run_rows(cpu(be), &j, AXPY_SPLIT_MIN);
}

static void cpu_scale(specd_backend *be, float *x, float a, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) x[i] *= a;
}

static void cpu_gather_out(specd_backend *be, float *dst, const float *src, int width) {
    const specd_step *st = &cpu(be)->step;
    for (int i = 0; i < st->n_out; i++)
        memcpy(dst + (size_t)i * width, src + (size_t)st->out_rows[i] * width,
               sizeof(float) * width);
}

/* specd_argmax's rule (common/spec/sampling.c): first of equal maxima, NaN never
 * wins; the CUDA kernel's twin. */
static void cpu_argmax(specd_backend *be, int32_t *ids, const float *x, int n_rows, int width) {
    cpu_argmax_rows(cpu(be)->pool, ids, x, n_rows, width);
}

static void cpu_kv_move(specd_backend *be, const specd_kv_layout *kv, const int32_t *src,
                        const int32_t *dst, int n) {
    size_t row_bytes = specd_kv_row_bytes(be->kv_type, kv->kv_dim);
    size_t pool_bytes = (size_t)kv->n_rows * row_bytes;
    for (int p = 0; p < 2 * kv->n_layers; p++) {
        char *pool = (char *)kv->base + (size_t)p * pool_bytes;
        for (int i = 0; i < n; i++)
            memmove(pool + (size_t)dst[i] * row_bytes, pool + (size_t)src[i] * row_bytes, row_bytes);
    }
}

static const specd_backend_ops k_cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_memcpy,
    .from_host = cpu_memcpy,
    .prepare_weight = cpu_prepare_weight,
    .release_weight = cpu_release_weight,
    .begin_step = cpu_begin_step,
    /* no graphs: graph_begin/graph_end/graph_reset stay NULL */
    .finish = cpu_finish,
    .embed = cpu_embed,
    .embed_ids = cpu_embed_ids,
    .rmsnorm = cpu_rmsnorm,
    .norm_gelu = cpu_norm_gelu,
    .matmul = cpu_matmul_op,
    .matmuls = cpu_matmuls_op,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu_op,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .gather_out = cpu_gather_out,
    .argmax = cpu_argmax,
    .kv_move = cpu_kv_move,
};

specd_backend *specd_cpu_backend_create(int n_threads, specd_precision precision,
                                        specd_kv_dtype kv_dtype, specd_error *err) {
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) {
        specd_seterr(err, "cpu backend: out of memory");
        return NULL;
    }
    c->base.ops = &k_cpu_ops;
    /* auto follows the precision: the fast path is llama.cpp's arithmetic
     * (int8 activations, and its fp16 cache), half the bytes a long-context
     * step reads; exact keeps fp32 throughout. */
    int f16 = kv_dtype == SPECD_KV_F16 || (kv_dtype == SPECD_KV_AUTO && precision == SPECD_PRECISION_FAST);
    c->base.kv_type = kv_dtype == SPECD_KV_Q8_0 ? SPECD_Q8_0 : f16 ? SPECD_F16 : SPECD_F32;
    c->base.warm_passes = 0;
    c->precision = precision;
    c->pool = specd_pool_create(n_threads);
    if (!c->pool) {
        free(c);
        specd_seterr(err, "cpu backend: cannot start %d threads", n_threads);
        return NULL;
    }
    c->scores = calloc((size_t)specd_pool_size(c->pool), sizeof(float *));
    c->kvbuf = calloc((size_t)specd_pool_size(c->pool), sizeof(float *));
    c->qbuf = calloc((size_t)specd_pool_size(c->pool), sizeof(int8_t *));
    if (!c->scores || !c->kvbuf || !c->qbuf) {
        cpu_destroy(&c->base);
        specd_seterr(err, "cpu backend: out of memory");
        return NULL;
    }
    return &c->base;
}
