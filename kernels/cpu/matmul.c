/* matmul.c - picks a SIMD kernel set and spreads matmuls over the pool.
 *
 * The kernel set (quant_avx512.c, quant_avx2.c or quant_scalar.c) is chosen
 * once, from __builtin_cpu_supports, the first time any entry point runs.
 * SPECD_SIMD=avx512|avx2|scalar in the environment, or cpu_simd_force(),
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

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static cpu_kernel_set g_scalar, g_avx2, g_avx512;
static int g_have_avx2, g_have_avx512;
static _Atomic(const cpu_kernel_set *) g_active;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void detect(void) {
    cpu_kernels_scalar(&g_scalar);
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    /* The kernels also use F16C (fp16 scales) and FMA; every AVX2 CPU made
     * has them, but a hypervisor can mask features, so check all. */
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int f16c = 0;
    {
        /* __builtin_cpu_supports has no "f16c" in older GCCs: ask CPUID. */
        unsigned a, b, c, d;
        if (__get_cpuid(1, &a, &b, &c, &d)) f16c = (c & bit_F16C) != 0;
    }
    g_have_avx2 = avx2 && f16c && cpu_kernels_avx2(&g_avx2);
    g_have_avx512 = g_have_avx2 && __builtin_cpu_supports("avx512f") &&
                    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512dq") && cpu_kernels_avx512(&g_avx512);
#endif
    const cpu_kernel_set *best = g_have_avx512 ? &g_avx512 : g_have_avx2 ? &g_avx2 : &g_scalar;
    const char *env = getenv("SPECD_SIMD");
    if (env && *env && strcmp(env, "auto") != 0) {
        if (!strcmp(env, "avx512") && g_have_avx512) best = &g_avx512;
        else if (!strcmp(env, "avx2") && g_have_avx2) best = &g_avx2;
        else if (!strcmp(env, "scalar")) best = &g_scalar;
        else fprintf(stderr, "specd: SPECD_SIMD=%s not available here, using %s\n", env, best->name);
    }
    atomic_store(&g_active, best);
}

static const cpu_kernel_set *active(void) {
    pthread_once(&g_once, detect);
    return atomic_load_explicit(&g_active, memory_order_relaxed);
}

const char *cpu_simd_name(void) { return active()->name; }

int cpu_simd_force(const char *name) {
    active();
    const cpu_kernel_set *ks = NULL;
    if (!name || !strcmp(name, "auto"))
        ks = g_have_avx512 ? &g_avx512 : g_have_avx2 ? &g_avx2 : &g_scalar;
    else if (!strcmp(name, "avx512") && g_have_avx512) ks = &g_avx512;
    else if (!strcmp(name, "avx2") && g_have_avx2) ks = &g_avx2;
    else if (!strcmp(name, "scalar")) ks = &g_scalar;
    if (!ks) return 0;
    atomic_store(&g_active, ks);
    return 1;
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
