/* matmul.c - picks a SIMD kernel set and spreads matmuls over the pool.
 *
 * The kernel set (quant_avx512.c, quant_avx2.c or quant_scalar.c) is chosen
 * once, from common/util/simd.h's feature check, the first time any entry
 * point runs.
 * SPECD_SIMD=amx|avx512vnni|avx512|avxvnni|avx2|scalar in the environment,
 * or cpu_simd_force(),
 * overrides the choice (tests and benches compare paths this way).
 *
 * A matmul is split by output rows into chunks, one task per chunk; every
 * task computes its rows for all tokens, so a weight row is read from memory
 * once per call however many tokens there are. Chunks are small enough to
 * give every thread several tasks (the atomic task counter then evens out
 * uneven progress) and large enough that the per-task overhead (one atomic
 * increment, an L1-warm start) stays negligible.
 *
 * With several tokens the caller first repacks x so that the activations a
 * kernel needs for one weight group (32 columns x up to nt_max tokens) are
 * contiguous (layout in quant_impl.h); the tasks share the packed copy. */
#include "matmul.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/simd.h"
#include "quant_impl.h"

/* The kernel sets, best last. A set with VNNI shares its fp32 kernels with
 * the plain set of its width and differs only in the integer kernels. */
enum { SET_SCALAR, SET_AVX2, SET_AVXVNNI, SET_AVX512, SET_AVX512VNNI, SET_AMX, N_SETS };
static const char *const k_set_names[N_SETS] = {CPU_SIMD_PATH_NAMES};
static cpu_kernel_set g_sets[N_SETS];
static int g_have[N_SETS];
static _Atomic(const cpu_kernel_set *) g_active;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static const cpu_kernel_set *best_set(void) {
    for (int i = N_SETS - 1; i > 0; i--)
        if (g_have[i]) return &g_sets[i];
    return &g_sets[SET_SCALAR];
}

static const cpu_kernel_set *set_named(const char *name) {
    for (int i = 0; i < N_SETS; i++)
        if (!strcmp(name, k_set_names[i])) return g_have[i] ? &g_sets[i] : NULL;
    return NULL;
}

static void detect(void) {
    g_have[SET_SCALAR] = cpu_kernels_scalar(&g_sets[SET_SCALAR]) &&
                         cpu_qkernels_scalar(&g_sets[SET_SCALAR]);
#if defined(__x86_64__) || defined(__i386__)
    /* The kernels also use F16C (fp16 scales) and FMA; every AVX2 CPU made
     * has them, but a hypervisor can mask features, so check all. */
    const specd_cpu_features *cpu = specd_cpu_features_get();
    int avx2 = cpu->avx2, f16c = cpu->f16c, avxvnni = cpu->avxvnni;
    int avx512 = cpu->avx512, avx512vnni = cpu->avx512vnni;
    g_have[SET_AVX2] = avx2 && f16c && cpu_kernels_avx2(&g_sets[SET_AVX2]) &&
                       cpu_qkernels_avx2(&g_sets[SET_AVX2], 0) && cpu_vec_avx2(&g_sets[SET_AVX2]);
    if (g_have[SET_AVX2] && avxvnni) {
        g_sets[SET_AVXVNNI] = g_sets[SET_AVX2];
        g_have[SET_AVXVNNI] = cpu_qkernels_avx2(&g_sets[SET_AVXVNNI], 1);
    }
    g_have[SET_AVX512] = g_have[SET_AVX2] && avx512 && cpu_kernels_avx512(&g_sets[SET_AVX512]) &&
                         cpu_qkernels_avx512(&g_sets[SET_AVX512], 0);
    /* SwiGLU and the row ops are small passes: AVX2's kernels serve
     * AVX-512 too (cpu_vec_avx512 below replaces the ones that pay; the
     * activation quantizer is cpu_qkernels_avx512's own) */
    g_sets[SET_AVX512].swiglu = g_sets[SET_AVX2].swiglu;
    g_sets[SET_AVX512].argmax = g_sets[SET_AVX2].argmax;
    g_sets[SET_AVX512].kv_dot = g_sets[SET_AVX2].kv_dot;
    g_sets[SET_AVX512].softmax_exp = g_sets[SET_AVX2].softmax_exp;
    g_sets[SET_AVX512].kv_axpy = g_sets[SET_AVX2].kv_axpy;
    g_sets[SET_AVX512].kv_dots = g_sets[SET_AVX2].kv_dots;
    g_sets[SET_AVX512].kv_axpys = g_sets[SET_AVX2].kv_axpys;
    g_sets[SET_AVX512].kv_dots_block = g_sets[SET_AVX2].kv_dots_block;
    g_sets[SET_AVX512].kv_dots_f16 = g_sets[SET_AVX2].kv_dots_f16;
    g_sets[SET_AVX512].f32_to_f16_row = g_sets[SET_AVX2].f32_to_f16_row;
    g_sets[SET_AVX512].kv_axpys_f16 = g_sets[SET_AVX2].kv_axpys_f16;
    g_sets[SET_AVX512].kv_dots_block_f16 = g_sets[SET_AVX2].kv_dots_block_f16;
    g_sets[SET_AVX512].kv_axpys_block_f16 = g_sets[SET_AVX2].kv_axpys_block_f16;
    g_sets[SET_AVX512].kv_axpys_block = g_sets[SET_AVX2].kv_axpys_block;
    g_sets[SET_AVX512].rmsnorm_row = g_sets[SET_AVX2].rmsnorm_row;
    g_sets[SET_AVX512].rope_heads = g_sets[SET_AVX2].rope_heads;
    g_sets[SET_AVX512].axpy = g_sets[SET_AVX2].axpy;
    if (g_have[SET_AVX512]) cpu_vec_avx512(&g_sets[SET_AVX512]);
    if (g_have[SET_AVX512] && avx512vnni) {
        g_sets[SET_AVX512VNNI] = g_sets[SET_AVX512];
        g_have[SET_AVX512VNNI] = cpu_qkernels_avx512(&g_sets[SET_AVX512VNNI], 1);
    }
    /* AMX: the VNNI set with AMX passes for many-token Q4 and Q8_0
     * matmuls (qmatmul_amx.c); the kernel must grant the tile state */
    if (g_have[SET_AVX512VNNI] && cpu_amx_usable()) {
        g_sets[SET_AMX] = g_sets[SET_AVX512VNNI];
        g_have[SET_AMX] = cpu_qkernels_amx(&g_sets[SET_AMX]);
    }
#endif
    static const cpu_kv_q8_level q8_level[N_SETS] = {CPU_KV_Q8_SCALAR, CPU_KV_Q8_AVX2,
                                                     CPU_KV_Q8_AVXVNNI, CPU_KV_Q8_AVX512,
                                                     CPU_KV_Q8_AVX512VNNI, CPU_KV_Q8_AVX512VNNI};
    for (int i = 0; i < N_SETS; i++) {
        g_sets[i].name = k_set_names[i];
        if (g_have[i]) cpu_kv_q8_install(&g_sets[i], q8_level[i]);
    }
    const cpu_kernel_set *best = best_set();
    const char *env = getenv("SPECD_SIMD");
    if (env && *env && strcmp(env, "auto") != 0) {
        const cpu_kernel_set *ks = set_named(env);
        if (ks) best = ks;
        else fprintf(stderr, "specd: SPECD_SIMD=%s not available here, using %s\n", env, best->name);
    }
    atomic_store(&g_active, best);
}

static const cpu_kernel_set *active(void) {
    pthread_once(&g_once, detect);
    return atomic_load_explicit(&g_active, memory_order_relaxed);
}

const char *cpu_simd_name(void) { return active()->name; }

const cpu_kernel_set *cpu_active_kernels(void) { return active(); }

int cpu_simd_force(const char *name) {
    active();
    const cpu_kernel_set *ks = !name || !strcmp(name, "auto") ? best_set() : set_named(name);
    if (!ks) return 0;
    atomic_store(&g_active, ks);
    /* the loops below kernels/ (sampling, rng) follow at their width */
    specd_simd_force(name);
    return 1;
}

int cpu_simd_available(const char *name) {
    active();
    return set_named(name) != NULL;
}

void cpu_dequant_row(specd_dtype type, const void *src, float *dst, int64_t n) {
    cpu_dequant_fn f = (unsigned)type < SPECD_DTYPE_COUNT ? active()->dequant[type] : NULL;
    if (!f) {
        fprintf(stderr, "cpu_dequant_row: unsupported type %d\n", (int)type);
        abort();
    }
    f(src, dst, n);
}

static size_t row_bytes_of(const specd_tensor *W) {
    const specd_dtype_info *in = specd_dtype_get(W->type);
    return (size_t)(W->ne[0] / in->block_elems) * in->block_bytes;
}

void cpu_tensor_row(const specd_tensor *W, int64_t r, float *dst) {
    cpu_dequant_row(W->type, (const uint8_t *)W->data + (size_t)r * row_bytes_of(W), dst,
                    (int64_t)W->ne[0]);
}

typedef struct mm_job {
    cpu_rows_fn fn;
    cpu_mm_args args;
    int64_t rows, chunk;
} mm_job;

static void mm_task(void *ctx, int task, int thread) {
    (void)thread;
    const mm_job *j = ctx;
    int64_t r0 = (int64_t)task * j->chunk;
    int64_t r1 = r0 + j->chunk < j->rows ? r0 + j->chunk : j->rows;
    j->fn(&j->args, r0, r1);
}

/* Rows per task: about 4 tasks per thread, in multiples of 16 rows, between
 * 16 and 256 rows. With fewer rows per task than 16 the task overhead shows
 * at decode; with much more than 4 tasks per thread it buys no balance. */
static int64_t chunk_rows(int64_t rows, int n_threads) {
    int64_t c = rows / ((int64_t)n_threads * 4);
    c = (c + 15) / 16 * 16;
    if (c < 16) c = 16;
    if (c > 256) c = 256;
    return c;
}

/* Per calling thread: the buffer for packed activations, grown on demand
 * and kept (a forward pass packs hundreds of times), freed at thread exit. */
static pthread_key_t g_pack_key;
static pthread_once_t g_pack_once = PTHREAD_ONCE_INIT;

typedef struct pack_buf {
    float *p;
    size_t cap; /* floats */
} pack_buf;

static void pack_buf_free(void *v) {
    pack_buf *b = v;
    free(b->p);
    free(b);
}

static void pack_key_init(void) { pthread_key_create(&g_pack_key, pack_buf_free); }

static float *pack_buffer(size_t n) {
    if (n < 16) n = 16; /* never a zero-sized allocation (cols == 0) */
    pthread_once(&g_pack_once, pack_key_init);
    pack_buf *b = pthread_getspecific(g_pack_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b || pthread_setspecific(g_pack_key, b) != 0) abort();
    }
    if (b->cap < n) {
        free(b->p);
        /* 64-byte aligned: every packed 32-float run starts a cache line */
        b->p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
        if (!b->p) abort();
        b->cap = n;
    }
    return b->p;
}

void cpu_matmul(specd_pool *pool, float *y, const specd_tensor *W, const float *x, int n_tok) {
    const cpu_kernel_set *ks = active();
    cpu_rows_fn fn = (unsigned)W->type < SPECD_DTYPE_COUNT ? ks->rows[W->type] : NULL;
    if (!fn) {
        fprintf(stderr, "cpu_matmul: unsupported type %d for '%s'\n", (int)W->type, W->name);
        abort();
    }
    if (n_tok <= 0) return;
    mm_job j = {
        .fn = fn,
        .args =
            {
                .w = W->data,
                .row_bytes = row_bytes_of(W),
                .cols = (int64_t)W->ne[0],
                .x = x,
                .xp = NULL,
                .n_tok = n_tok,
                .y = y,
                .ldy = (int64_t)W->ne[1],
            },
        .rows = (int64_t)W->ne[1],
    };
    if (n_tok > 1 && ks->nt_max > 0) {
        /* Packing costs one pass over x (n_tok*cols floats), small next to
         * the rows*cols*n_tok multiply-adds it speeds up. */
        size_t n = (size_t)n_tok * (size_t)cpu_packed_groups(j.args.cols) * 32;
        float *xp = pack_buffer(n);
        cpu_pack_x(x, n_tok, j.args.cols, ks->nt_max, xp);
        j.args.xp = xp;
    }
    j.chunk = chunk_rows(j.rows, specd_pool_size(pool));
    int n_tasks = (int)((j.rows + j.chunk - 1) / j.chunk);
    specd_pool_run(pool, n_tasks, mm_task, &j);
}

/* ---- the integer-activation path (qmatmul.h) ------------------------------ */

typedef struct qmm_job {
    cpu_qrows_fn fn;
    cpu_qmm_args args;
    int64_t groups, chunk; /* row groups of 16, per task */
} qmm_job;

static void qmm_task(void *ctx, int task, int thread) {
    (void)thread;
    const qmm_job *j = ctx;
    int64_t g0 = (int64_t)task * j->chunk;
    int64_t g1 = g0 + j->chunk < j->groups ? g0 + j->chunk : j->groups;
    j->fn(&j->args, g0, g1);
}

void cpu_quantize_act_active(const float *x, int n_tok, int64_t cols, int8_t *q, float *d,
                             float *s, int32_t *sq) {
    active()->quantize(x, n_tok, cols, q, d, s, sq);
}

/* SwiGLU by the active path, split over the pool from SWIGLU_SPLIT_MIN
 * values: a decode step's 1,536 a layer are not worth a hand-off, a 5-token
 * verify's 7,680 are (in-process alternation on the Cascade Lake VM, 2
 * threads: a 5-token step 7.82 -> 7.70 ms; a decode step unchanged). */
#define SWIGLU_SPLIT_MIN 3072
typedef struct swiglu_job {
    void (*fn)(float *, const float *, const float *, size_t);
    float *out;
    const float *gate, *up;
    size_t n, chunk;
} swiglu_job;

static void swiglu_task(void *ctx, int task, int thread) {
    (void)thread;
    const swiglu_job *j = ctx;
    size_t i0 = (size_t)task * j->chunk, n = j->n - i0 < j->chunk ? j->n - i0 : j->chunk;
    j->fn(j->out + i0, j->gate + i0, j->up + i0, n);
}

/* Each row's argmax; rows split over the pool (a verification step asks
 * for one per tree node, each a pass over the vocabulary). */
typedef struct argmax_job {
    int (*fn)(const float *, int);
    int32_t *ids;
    const float *x;
    int width;
} argmax_job;

static void argmax_task(void *ctx, int task, int thread) {
    (void)thread;
    const argmax_job *j = ctx;
    j->ids[task] = j->fn(j->x + (size_t)task * j->width, j->width);
}

void cpu_argmax_rows(specd_pool *pool, int32_t *ids, const float *x, int n_rows, int width) {
    argmax_job j = {active()->argmax, ids, x, width};
    if (n_rows == 1) ids[0] = j.fn(x, width);
    else if (n_rows > 1) specd_pool_run(pool, n_rows, argmax_task, &j);
}

void cpu_swiglu(specd_pool *pool, float *out, const float *gate, const float *up, size_t n) {
    const cpu_kernel_set *ks = active();
    const size_t threads = (size_t)specd_pool_size(pool);
    if (n < SWIGLU_SPLIT_MIN || threads < 2) {
        ks->swiglu(out, gate, up, n);
        return;
    }
    /* an even share per thread, in multiples of 16 (so every path's vector
     * loop takes the same elements as over the whole array: the same bits),
     * at most 8192 values a task */
    size_t chunk = (n / threads + 15) / 16 * 16;
    if (chunk > 8192) chunk = 8192;
    swiglu_job j = {ks->swiglu, out, gate, up, n, chunk};
    specd_pool_run(pool, (int)((n + j.chunk - 1) / j.chunk), swiglu_task, &j);
}

/* Tokens from which the activations' quantization goes over the pool, a
 * range of tokens per thread: each token's blocks are quantized by the same
 * kernel either way (no bit changes). On a 512-token prefill it was the
 * largest thing the calling thread did alone (perf: 3.7% of all samples,
 * the other thread waiting), and on a 9-row verify step still 5% of the
 * step's time (AMD EPYC Zen 5 VM, 2 threads): split from 4 rows, 9-row
 * forwards took 4.20 ms against 4.46 (median of 10 alternated runs, 1.70x
 * a 1-row forward against 1.74x). Below 4 rows a hand-off (about 0.2 us)
 * costs about what it saves: one row takes 0.14-0.4 us a matmul. */
#define QUANT_SPLIT_MIN 4

typedef struct quant_job {
    const float *x;
    int n_tok, tasks;
    int64_t cols, nb;
    int8_t *q;
    float *d, *s;
    int32_t *sq;
} quant_job;

static void quant_task(void *ctx, int task, int thread) {
    (void)thread;
    const quant_job *j = ctx;
    const int t0 = specd_pool_share(j->n_tok, j->tasks, task);
    const int t1 = specd_pool_share(j->n_tok, j->tasks, task + 1);
    const size_t b0 = (size_t)t0 * (size_t)j->nb;
    active()->quantize(j->x + (size_t)t0 * j->cols, t1 - t0, j->cols, j->q + (size_t)t0 * j->cols,
                       j->d + b0, j->s + b0, j->sq + b0);
}

/* The activation buffer of one quantized input, from the caller's thread
 * buffer: per-block scales, scaled sums, sums and (for a Q6K or Q2K
 * matrix, `half`) first halves' sums, then the int8 values (n_tok * cols bytes).
 * The quantization is a pass over x, small next to rows * cols * n_tok
 * multiply-adds, and done once for all tasks. */
static cpu_qact quantize_input(specd_pool *pool, const float *x, int n_tok, int64_t cols,
                               int64_t nb, int half) {
    const size_t nbt = (size_t)n_tok * (size_t)nb;
    const size_t qfloats = ((size_t)n_tok * (size_t)cols + 3) / 4;
    float *buf = pack_buffer(4 * nbt + qfloats);
    float *d = buf, *s = buf + nbt;
    int32_t *sq = (int32_t *)(buf + 2 * nbt), *sh = (int32_t *)(buf + 3 * nbt);
    int8_t *q = (int8_t *)(buf + 4 * nbt);
    cpu_qact a = {.n_tok = n_tok, .cols = cols, .nb = nb, .q = q, .d = d, .s = s, .sq = sq,
                  .sh = half ? sh : NULL};
    const int threads = specd_pool_size(pool);
    if (n_tok < QUANT_SPLIT_MIN || threads < 2) {
        active()->quantize(x, n_tok, cols, q, d, s, sq);
    } else {
        quant_job j = {.x = x, .n_tok = n_tok, .tasks = threads, .cols = cols, .nb = nb,
                       .q = q, .d = d, .s = s, .sq = sq};
        specd_pool_run(pool, threads, quant_task, &j);
    }
    if (half) cpu_act_half_sums(q, n_tok, cols, sh);
    return a;
}

/* Row groups per task on the integer path: each matrix in one contiguous
 * run per thread, at most QMM_TASK_GROUPS groups (so the LM head's 49k rows
 * still come in tasks that a faster thread can take over). The weights
 * stream in from memory, and every task's start is a cold stream whose
 * first lines the prefetch has not asked for yet; four tasks a thread, as
 * the fp32 path cuts them (chunk_rows), measured slower: in-process
 * alternation on the Cascade Lake VM, 2 threads, a decode step 5.78 ->
 * 5.46 ms and a 5-token verify step 7.82 -> 7.28 ms (one task a thread up
 * to 64 groups against chunk_rows; 16 groups lost 5%, 256 changed nothing). */
#define QMM_TASK_GROUPS 64

static int64_t qmm_task_groups(int64_t groups, int threads) {
    int64_t c = (groups + threads - 1) / threads;
    if (c > QMM_TASK_GROUPS) c = QMM_TASK_GROUPS;
    return c < 1 ? 1 : c;
}

/* Several matrices on one input, as one pool run: task t belongs to the
 * first part whose tasks end after it. */
typedef struct qmms_job {
    qmm_job part[CPU_QMATMULS_MAX];
    int end_task[CPU_QMATMULS_MAX]; /* tasks of parts 0..i */
} qmms_job;

static void qmms_task(void *ctx, int task, int thread) {
    const qmms_job *j = ctx;
    int i = 0;
    while (task >= j->end_task[i]) i++;
    qmm_task((void *)&j->part[i], task - (i ? j->end_task[i - 1] : 0), thread);
}

int cpu_qmatmuls(specd_pool *pool, int n_mats, float *const *y, const cpu_qweight *const *W,
                 const float *x, int n_tok) {
    if (n_mats < 1 || n_mats > CPU_QMATMULS_MAX) return -1;
    for (int i = 0; i < n_mats; i++)
        if (W[i]->cols != W[0]->cols) return -1;
    if (n_tok <= 0) return 0;
    int half = 0;
    for (int i = 0; i < n_mats; i++) half |= cpu_qkind_half_sums(W[i]->kind);
    cpu_qact a = quantize_input(pool, x, n_tok, W[0]->cols, W[0]->nb, half);
    qmms_job j;
    int tasks = 0;
    const int threads = specd_pool_size(pool);
    for (int i = 0; i < n_mats; i++) {
        const int64_t chunk = qmm_task_groups(W[i]->n_groups, threads);
        j.part[i] = (qmm_job){.fn = active()->qrows[W[i]->kind],
                              .args = {.w = W[i], .a = a, .y = y[i], .ldy = W[i]->rows},
                              .groups = W[i]->n_groups,
                              .chunk = chunk};
        tasks += (int)((j.part[i].groups + chunk - 1) / chunk);
        j.end_task[i] = tasks;
    }
    specd_pool_run(pool, tasks, qmms_task, &j);
    return 0;
}

/* One matrix: the same run with a single part. */
void cpu_qmatmul(specd_pool *pool, float *y, const cpu_qweight *W, const float *x, int n_tok) {
    cpu_qmatmuls(pool, 1, &y, &W, x, n_tok);
}
