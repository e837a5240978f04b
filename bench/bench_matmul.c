/* bench_matmul.c - speed of the CPU matmul kernels on the default model's
 * shapes, against this machine's memory bandwidth.
 *
 * Built by CMake as build/bench_matmul.
 * Run: build/bench_matmul [--quick] [--precision fast|exact] [--kquants]
 *                         [--tokens N,N,...] [path ...]
 *      (paths: scalar avx2 avx512; precision: fast, the default, is the
 *      server's integer-activation matmul (qmatmul.h), exact the fp32 one;
 *      --kquants: a Llama-3.2-1B-shaped model in Q4_K_M's types instead,
 *      where `exact` is what those types ran on before they had tiles)
 *
 * Prints:
 *   1. memory bandwidth: a streaming read of a 512 MB buffer (DRAM) and of a
 *      96 MB buffer (the model's size; may be served by a large L3), with 1
 *      and 2 threads;
 *   2. per matrix of SmolLM2-135M (Q4_1 layers, Q8_0 tied LM head): us per
 *      call for n_tok = 1..32 (5 and 9: a verified chain of 4 or 8 candidates) and the weight bytes streamed per second at
 *      n_tok = 1 (decode is a GEMV, bound by reading the weights). Each call
 *      uses the next of several copies of the matrix, spanning >= 96 MB, so
 *      weights come from wherever the real model's weights would; the
 *      fastest of repeated passes over all copies is reported;
 *   3. the sum over the whole model (30 layers x 7 matrices + LM head): the
 *      matmul time of one forward pass of n_tok tokens, the floor for decode
 *      (n_tok = 1) and for verifying a draft tree (n_tok > 1);
 *   4. the thread pool's hand-off cost: a run of 2 empty tasks back to back
 *      (workers spinning) and after the workers fell asleep;
 *   5. the arithmetic peak of one core (int8 dot instructions, fp32 FMA),
 *      and the integer kernels' rate at 32 tokens as a share of it. */
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util/simd.h"
#include "common/util/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/peak.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/cpu/weight_arena.h"
#include "common/util/clock.h"

/* ---- memory bandwidth --------------------------------------------------- */

typedef struct bw_arg {
    const uint8_t *p;
    size_t n;
    double sum;
} bw_arg;

__attribute__((target("avx2"))) static double read_avx2(const uint8_t *p, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps((const float *)(const void *)(p + i)));
        a1 = _mm256_add_ps(a1, _mm256_load_ps((const float *)(const void *)(p + i + 32)));
        a2 = _mm256_add_ps(a2, _mm256_load_ps((const float *)(const void *)(p + i + 64)));
        a3 = _mm256_add_ps(a3, _mm256_load_ps((const float *)(const void *)(p + i + 96)));
    }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    return out[0];
}

static void *bw_thread(void *p) {
    bw_arg *a = p;
    a->sum = read_avx2(a->p, a->n);
    return NULL;
}

/* GB/s of reading `bytes` with n threads (each reads its own slice), best of
 * `reps` passes. */
static double bandwidth(const uint8_t *buf, size_t bytes, int n_threads, int reps) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        pthread_t th[8];
        bw_arg args[8];
        size_t slice = bytes / (size_t)n_threads / 128 * 128;
        double t0 = specd_now_s();
        for (int i = 0; i < n_threads; i++) {
            args[i] = (bw_arg){buf + (size_t)i * slice, slice, 0};
            pthread_create(&th[i], NULL, bw_thread, &args[i]);
        }
        for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
        double dt = specd_now_s() - t0;
        double gbs = (double)slice * n_threads / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

/* ---- weights ------------------------------------------------------------- */

static uint64_t g_rng = 88172645463325252ULL;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* A matrix of random valid blocks (random bytes, sane fp16 scales). */
static specd_tensor make_tensor(specd_dtype type, int64_t rows, int64_t cols) {
    const specd_dtype_info *in = specd_dtype_get(type);
    size_t bytes = (size_t)(cols / in->block_elems) * in->block_bytes * (size_t)rows;
    uint8_t *w = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!w) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t v = rnd();
        memcpy(w + i, &v, bytes - i < 8 ? bytes - i : 8);
    }
    uint16_t d = specd_f32_to_fp16(0.01f), m = specd_f32_to_fp16(-0.08f);
    for (size_t b = 0; b < bytes / in->block_bytes; b++) {
        uint8_t *p = w + b * in->block_bytes;
        /* Q6_K keeps its d last; Q4_K's d and dmin come first, as Q4_1's */
        memcpy(p + (type == SPECD_Q6_K ? 208 : 0), &d, 2);
        if (type == SPECD_Q4_1 || type == SPECD_Q4_K) memcpy(p + 2, &m, 2);
    }
    specd_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "bench");
    t.type = type;
    t.n_dims = 2;
    t.ne[0] = (uint64_t)cols;
    t.ne[1] = (uint64_t)rows;
    t.ne[2] = t.ne[3] = 1;
    t.data = w;
    t.nbytes = bytes;
    return t;
}

typedef struct mat_spec {
    const char *name;
    specd_dtype type;
    int64_t rows, cols;
    int per_layer; /* how many of this matrix one layer has (0: LM head) */
} mat_spec;

/* SmolLM2-135M: dim 576, 9 heads / 3 kv heads of 64, MLP 1536, 30 layers,
 * vocab 49152 (tied embeddings, Q8_0). Rows = output dim. */
static const mat_spec k_smollm2[] = {
    {"attn_q/o  576x576 Q4_1", SPECD_Q4_1, 576, 576, 2},
    {"attn_k/v  192x576 Q4_1", SPECD_Q4_1, 192, 576, 2},
    {"gate/up  1536x576 Q4_1", SPECD_Q4_1, 1536, 576, 2},
    {"down     576x1536 Q4_1", SPECD_Q4_1, 576, 1536, 1},
    {"lm_head 49152x576 Q8_0", SPECD_Q8_0, 49152, 576, 0},
};
/* --kquants: Llama-3.2-1B (dim 2048, 32 heads / 8 kv heads of 64, MLP
 * 8192, 16 layers, vocab 128256, tied) as llama-quantize's Q4_K_M makes
 * it: Q4_K, with attn_v and ffn_down in Q6_K (Q4_K_M gives half the
 * layers' Q6_K; all of them here) and the LM head in Q6_K. */
static const mat_spec k_llama1b_q4km[] = {
    {"attn_q/o 2048x2048 Q4_K", SPECD_Q4_K, 2048, 2048, 2},
    {"attn_k    512x2048 Q4_K", SPECD_Q4_K, 512, 2048, 1},
    {"attn_v    512x2048 Q6_K", SPECD_Q6_K, 512, 2048, 1},
    {"gate/up  8192x2048 Q4_K", SPECD_Q4_K, 8192, 2048, 2},
    {"down     2048x8192 Q6_K", SPECD_Q6_K, 2048, 8192, 1},
    {"lm_head 128256x2048 Q6_K", SPECD_Q6_K, 128256, 2048, 0},
};
#define N_MATS_MAX 6
static const mat_spec *k_mats = k_smollm2;
static int g_n_mats = (int)(sizeof k_smollm2 / sizeof k_smollm2[0]);
static int g_n_layers = 30;
#define WORKSET (96u << 20) /* the model's size */

/* The token counts measured (--tokens replaces all but the first, which
 * stays 1: decode, and the bandwidth column); 5, 9: verifying chains of 4,
 * 8. At most 32 (the activations allocated below). */
#define MAX_TOKS 12
static int k_toks[MAX_TOKS] = {1, 2, 4, 5, 8, 9, 16, 32};
static int N_TOKS = 8;

typedef struct mat_set {
    specd_tensor *copies;
    cpu_qweight *qcopies; /* the same, repacked for the fast path */
    int n;
} mat_set;

static int g_fast = 1; /* --precision: 1 fast (default), 0 exact */

static void matmul_copy(specd_pool *pool, float *y, const mat_set *s, int i, const float *x,
                        int n_tok) {
    if (g_fast) cpu_qmatmul(pool, y, &s->qcopies[i], x, n_tok);
    else cpu_matmul(pool, y, &s->copies[i], x, n_tok);
}

static mat_set g_sets[N_MATS_MAX];

/* Seconds per call: passes over all copies of the matrix (a model-sized
 * working set) until `min_time`; the fastest pass counts. On a shared
 * machine the other passes include time other processes took. */
static double time_matmul(specd_pool *pool, int m, const float *x, float *y, int n_tok,
                          double min_time) {
    mat_set *s = &g_sets[m];
    for (int i = 0; i < s->n; i++) matmul_copy(pool, y, s, i, x, n_tok); /* warm-up */
    double best = 1e30, t_start = specd_now_s();
    do {
        double t0 = specd_now_s();
        for (int i = 0; i < s->n; i++) matmul_copy(pool, y, s, i, x, n_tok);
        double dt = specd_now_s() - t0;
        if (dt < best) best = dt;
    } while (specd_now_s() - t_start < min_time);
    return best / (double)s->n;
}

static void empty_task(void *ctx, int task, int thread) {
    (void)task, (void)thread;
    atomic_fetch_add((atomic_int *)ctx, 1);
}

static void bench_pool(void) {
    printf("\n== thread pool hand-off (2 threads, 2 empty tasks per run) ==\n");
    specd_pool *pool = specd_pool_create(2);
    atomic_int n;
    atomic_init(&n, 0);
    specd_pool_run(pool, 2, empty_task, &n);
    const int runs = 100000;
    double t0 = specd_now_s();
    for (int i = 0; i < runs; i++) specd_pool_run(pool, 2, empty_task, &n);
    double hot = (specd_now_s() - t0) / runs;
    double cold = 0;
    const int naps = 20;
    for (int i = 0; i < naps; i++) {
        struct timespec nap = {0, 10 * 1000 * 1000}; /* past the spin window */
        nanosleep(&nap, NULL);
        double t = specd_now_s();
        specd_pool_run(pool, 2, empty_task, &n);
        cold += specd_now_s() - t;
    }
    printf("  back to back: %.2f us per run;  after 10 ms idle: %.1f us per run\n", hot * 1e6,
           cold / naps * 1e6);
    specd_pool_destroy(pool);
}

/* 2. The arithmetic peak of one core (kernels/cpu/peak.h) on every path this
 * CPU has, so a kernel's rate reads as a fraction of what the core can do. */

/* int8 multiply-adds per second of one core on the best integer path */
static double g_int8_peak;

static void bench_peak(void) {
    printf("\n== arithmetic peak of one core (kernels/cpu/peak.h) ==\n");
    /* not amx: its peak is avx512vnni's (peak.c) */
    const char *paths[] = {"avx2", "avxvnni", "avx512", "avx512vnni"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        if (!cpu_simd_force(paths[i])) continue;
        double fp32 = cpu_peak_fp32_macs(NULL), int8 = cpu_peak_int8_macs(NULL);
        printf("  %-10s int8 %6.1f, fp32 %6.1f G multiply-adds/s\n", paths[i], int8 / 1e9,
               fp32 / 1e9);
        if (int8 > g_int8_peak) g_int8_peak = int8;
    }
    cpu_simd_force("auto");
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *paths[3];
    int n_paths = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            const char *p = argv[++i];
            if (strcmp(p, "fast") && strcmp(p, "exact")) {
                fprintf(stderr, "--precision: fast or exact, not %s\n", p);
                return 2;
            }
            g_fast = !strcmp(p, "fast");
        } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            /* 2..32 each, at most MAX_TOKS - 1 of them, after the 1 */
            N_TOKS = 1;
            for (char *p = argv[++i], *end; *p && N_TOKS < MAX_TOKS; p = *end ? end + 1 : end) {
                long v = strtol(p, &end, 10);
                if (end == p || v < 2 || v > 32 || (*end && *end != ',')) {
                    fprintf(stderr, "--tokens: a list of 2..32, not %s\n", argv[i]);
                    return 2;
                }
                k_toks[N_TOKS++] = (int)v;
            }
        } else if (!strcmp(argv[i], "--kquants")) {
            k_mats = k_llama1b_q4km;
            g_n_mats = (int)(sizeof k_llama1b_q4km / sizeof k_llama1b_q4km[0]);
            g_n_layers = 16;
        } else if (n_paths < 3) {
            paths[n_paths++] = argv[i];
        }
    }
    if (!n_paths) {
        paths[0] = "avx512";
        paths[1] = "avx2";
        paths[2] = "scalar";
        n_paths = 3;
    }
    const double min_time = quick ? 0.05 : 0.25;
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows when piped to a file */

    /* 1. memory bandwidth */
    printf("== memory bandwidth (streaming read, best of 5) ==\n");
    if (specd_cpu_features_get()->avx2) {
        size_t big = (size_t)512 << 20;
        uint8_t *buf = aligned_alloc(64, big);
        memset(buf, 1, big); /* fault the pages in */
        printf("  512 MB (DRAM):       1 thread %6.1f GB/s   2 threads %6.1f GB/s\n",
               bandwidth(buf, big, 1, 5), bandwidth(buf, big, 2, 5));
        printf("   96 MB (model size): 1 thread %6.1f GB/s   2 threads %6.1f GB/s\n",
               bandwidth(buf, WORKSET, 1, 5), bandwidth(buf, WORKSET, 2, 5));
        free(buf);
    } else {
        printf("  (needs AVX2)\n");
    }

    bench_pool();
    bench_peak();

    /* weights: enough copies of each matrix to span the working set, the
     * fast path's repacked into a huge-page arena as the CPU backend keeps
     * them (weight_arena.h): on 4 KiB pages each page costs a TLB walk the
     * server never pays (on the Zen 5 VM an 8-token 1536x576 Q4_1 matmul on
     * one thread read 39.7 us on them, 23-28 us from an arena) */
    cpu_arena *arena = g_fast ? cpu_arena_create() : NULL;
    if (g_fast && !arena) return 1;
    for (int m = 0; m < g_n_mats; m++) {
        const specd_dtype_info *in = specd_dtype_get(k_mats[m].type);
        size_t bytes = (size_t)(k_mats[m].cols / in->block_elems) * in->block_bytes *
                       (size_t)k_mats[m].rows;
        int n = (int)((WORKSET + bytes - 1) / bytes);
        g_sets[m].n = n;
        g_sets[m].copies = malloc(sizeof(specd_tensor) * (size_t)n);
        g_sets[m].qcopies = calloc((size_t)n, sizeof(cpu_qweight));
        for (int i = 0; i < n; i++) {
            g_sets[m].copies[i] = make_tensor(k_mats[m].type, k_mats[m].rows, k_mats[m].cols);
            if (g_fast && cpu_qweight_make(&g_sets[m].copies[i], &g_sets[m].qcopies[i], arena) != 1) {
                fprintf(stderr, "%s: no integer-activation path\n", k_mats[m].name);
                return 1;
            }
        }
    }
    const int64_t max_cols = 8192, max_rows = 128256, max_tok = 32;
    float *x = malloc(sizeof(float) * (size_t)(max_tok * max_cols));
    float *y = malloc(sizeof(float) * (size_t)(max_tok * max_rows));
    for (int64_t i = 0; i < max_tok * max_cols; i++) x[i] = (float)(rnd() >> 40) / 16777216.0f - 0.5f;

    for (int p = 0; p < n_paths; p++) {
        if (!cpu_simd_force(paths[p])) {
            printf("\n(path %s not available)\n", paths[p]);
            continue;
        }
        for (int threads = 1; threads <= 2; threads++) {
            specd_pool *pool = specd_pool_create(threads);
            printf("\n== %s, precision %s, %d thread%s: us per call (GB/s of weights at "
                   "n_tok=1) ==\n",
                   cpu_simd_name(), g_fast ? "fast" : "exact", threads, threads > 1 ? "s" : "");
            printf("  %-24s %15s", "matrix", "n_tok=1");
            for (int k = 1; k < N_TOKS; k++) printf("  %7d", k_toks[k]);
            printf("\n");
            double model_s[MAX_TOKS] = {0};
            for (int m = 0; m < g_n_mats; m++) {
                const specd_tensor *t = &g_sets[m].copies[0];
                printf("  %-24s", k_mats[m].name);
                for (int k = 0; k < N_TOKS; k++) {
                    /* The scalar path at 32 tokens takes seconds per model;
                     * one pass is enough there. */
                    double s = time_matmul(pool, m, x, y, k_toks[k], min_time);
                    if (k == 0) printf(" %7.1f (%5.1f)", s * 1e6, (double)t->nbytes / s / 1e9);
                    else printf("  %7.1f", s * 1e6);
                    int count = k_mats[m].per_layer ? k_mats[m].per_layer * g_n_layers : 1;
                    model_s[k] += s * count;
                }
                printf("\n");
            }
            printf("  %-24s", "whole model (ms/forward)");
            printf(" %7.2f        ", model_s[0] * 1e3);
            for (int k = 1; k < N_TOKS; k++) printf("  %7.2f", model_s[k] * 1e3);
            printf("\n  %-24s", "  ... per token (ms)");
            printf(" %7.2f        ", model_s[0] * 1e3);
            for (int k = 1; k < N_TOKS; k++) printf("  %7.3f", model_s[k] * 1e3 / k_toks[k]);
            printf("\n");
            if (g_fast && g_int8_peak > 0) { /* the integer kernels against the core's peak */
                double macs = 0;
                for (int m = 0; m < g_n_mats; m++)
                    macs += (double)k_mats[m].rows * (double)k_mats[m].cols *
                            (k_mats[m].per_layer ? k_mats[m].per_layer * g_n_layers : 1);
                double rate = macs * k_toks[N_TOKS - 1] / model_s[N_TOKS - 1];
                printf("  at %d tokens: %.1f G int8 multiply-adds/s, %.0f%% of %d x the best "
                       "one-core peak above\n",
                       k_toks[N_TOKS - 1], rate / 1e9, 100.0 * rate / (threads * g_int8_peak),
                       threads);
            }
            specd_pool_destroy(pool);
        }
    }
    return 0;
}
