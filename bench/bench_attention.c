/* bench_attention.c - speed of the CPU backend's attention op alone, on the
 * default model's shape (SmolLM2-135M: 9 query heads on 3 KV heads of 64,
 * 30 layers), for long prompts.
 *
 * Built by CMake as build/bench_attention.
 * Run: build/bench_attention [--threads N] [--reps R] [--kv f16|f32|q8_0] [--kv-heads 1|3|9]
 *                            [--prompts 512,1000,3000] [--trees 5,9] [path ...]
 *      (--kv-heads 1: the 9 heads on one KV head, where a decode step's
 *      attention is one task, so it splits across threads (cpu_backend.c,
 *      "split decode") at 1,024 cached rows and more)
 *      (paths: scalar avx2 avxvnni avx512 avx512vnni, as SPECD_SIMD; default
 *      the one this CPU picks)
 *
 * For each path and prompt length P it prints, the fastest of R runs:
 *   - prefill: one layer's attention over a P-token prompt in one causal
 *     pass (query blocks of 16 against the rows before them), in ms, and
 *     per query-key pair (9 x P(P+1)/2 of them) in ns;
 *   - the same times 30 layers: the attention share of prefilling P tokens;
 *   - decode: one token's attention over the P cached rows, all 30 layers,
 *     in ms (a read of the whole cache: bound by memory, not arithmetic);
 *   - with --trees: a verify step's attention, a chain of T new tokens
 *     (the pending token and T - 1 candidates, under their ancestor mask)
 *     over the P cached rows, all 30 layers, in ms.
 * Each layer has its own cache pool, as in the model, so a run reads what
 * the model would read. Inputs are random; the kernels' speed does not
 * depend on the values (no data-dependent branches on visible rows). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_args.h"
#include "kernels/backend.h"
#include "kernels/cpu/matmul.h"
#include "common/util/clock.h"

enum { N_HEADS = 9, HEAD = 64, N_LAYERS = 30, MAX_PROMPTS = 16 };
/* KV heads: SmolLM2's 3, or (--kv-heads) 1 or 9, the multi-query and
 * multi-head shapes of the same 9 heads */
static int N_KV = 3;

static void die(const char *what) {
    fprintf(stderr, "bench_attention: %s\n", what);
    exit(1);
}

/* One step over every layer: n_new tokens after n_past cached ones.
 * Returns the seconds per layer. */
static double run_step(specd_backend *be, const specd_kv_layout *kv, int32_t *pages, int n_past,
                       int n_new, const uint8_t *mask, const float *q, const float *k,
                       const float *v, float *out, int n_layers) {
    specd_step_seq sq = {n_past, 0, n_new, mask, pages};
    float *cs = calloc((size_t)n_new * HEAD, sizeof(float));
    int32_t *ids = calloc((size_t)n_new, sizeof(int32_t));
    if (!cs || !ids) die("out of memory");
    specd_step st = {n_new, ids, cs, HEAD, 1, &sq, 0, NULL};
    specd_error err = {0};
    if (be->ops->begin_step(be, &st, &err)) die(err.msg);
    double t0 = specd_now_s();
    for (int l = 0; l < n_layers; l++)
        be->ops->attention(be, out, q, k, v, kv, l, N_HEADS, N_KV, HEAD);
    if (be->ops->finish(be, &err)) die(err.msg);
    double t = (specd_now_s() - t0) / n_layers;
    free(cs);
    free(ids);
    return t;
}

/* "512,1000,3000" into out[MAX_PROMPTS]; the count. */
static int int_list(const char *opt, char *p, int *out) {
    int n = 0;
    while (*p && n < MAX_PROMPTS) {
        out[n++] = (int)strtol(p, &p, 10);
        if (*p == ',') p++;
        else if (*p) {
            char msg[96];
            snprintf(msg, sizeof msg, "%s: a comma-separated list of token counts", opt);
            die(msg);
        }
    }
    return n;
}

int main(int argc, char **argv) {
    int threads = 2, reps = 3, n_prompts = 0, prompts[MAX_PROMPTS];
    specd_kv_dtype kvt = SPECD_KV_F16;
    int n_trees = 0, trees[MAX_PROMPTS];
    const char *paths[16];
    int n_paths = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) {
            const char *t = argv[++i];
            kvt = !strcmp(t, "f32") ? SPECD_KV_F32 : !strcmp(t, "q8_0") ? SPECD_KV_Q8_0 : SPECD_KV_F16;
        }
        else if (!strcmp(argv[i], "--kv-heads") && i + 1 < argc) N_KV = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompts") && i + 1 < argc)
            n_prompts = int_list("--prompts", argv[++i], prompts);
        else if (!strcmp(argv[i], "--trees") && i + 1 < argc)
            n_trees = int_list("--trees", argv[++i], trees);
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [--threads N] [--reps R] [--kv f16|f32|q8_0] [--kv-heads 1|3|9] "
                            "[--prompts 512,1000,3000] [--trees 5,9] [path ...]\n", argv[0]);
            return 2;
        } else if (n_paths < 16) {
            paths[n_paths++] = argv[i];
        }
    }
    if (!n_prompts) prompts[0] = 512, prompts[1] = 1000, prompts[2] = 3000, n_prompts = 3;
    if (!n_paths) paths[n_paths++] = "auto";
    if (threads < 1 || reps < 1) die("--threads and --reps must be at least 1");
    if (N_KV != 1 && N_KV != 3 && N_KV != 9) die("--kv-heads: 1, 3 or 9 (9 heads share them)");
    for (int i = 0; i < n_prompts; i++)
        if (prompts[i] < 1 || prompts[i] > 32768) die("--prompts: each from 1 to 32768");
    for (int i = 0; i < n_trees; i++)
        if (trees[i] < 2 || trees[i] > 64) die("--trees: each from 2 to 64");

    printf("attention, SmolLM2-135M shape (%d heads on %d KV heads of %d, %d layers), "
           "%d threads, KV cache %s, fastest of %d\n\n", N_HEADS, N_KV, HEAD, N_LAYERS,
           threads, specd_kv_dtype_names[kvt], reps);
    int max_tree = 1;
    for (int i = 0; i < n_trees; i++)
        if (trees[i] > max_tree) max_tree = trees[i];
    printf("| path | prompt | prefill ms/layer | ns per pair | x %d layers, s | decode ms, "
           "%d layers |", N_LAYERS, N_LAYERS);
    for (int i = 0; i < n_trees; i++) printf(" chain of %d ms, %d layers |", trees[i], N_LAYERS);
    printf("\n|---|--:|--:|--:|--:|--:|");
    for (int i = 0; i < n_trees; i++) printf("--:|");
    printf("\n");
    long splits[16] = {0}; /* per path: decode passes that ran split */
    for (int pi = 0; pi < n_paths; pi++) {
        if (!cpu_simd_force(paths[pi])) {
            printf("| %s | (not on this CPU) | | | | |\n", paths[pi]);
            continue;
        }
        specd_error err = {0};
        specd_backend *be = specd_cpu_backend_create(
            threads, SPECD_PRECISION_FAST, kvt, &err);
        if (!be) die(err.msg);
        for (int j = 0; j < n_prompts; j++) {
            int P = prompts[j], rows_needed = P + max_tree, toks = P > max_tree ? P : max_tree;
            int n_pages = (rows_needed + SPECD_KV_PAGE_ROWS - 1) / SPECD_KV_PAGE_ROWS;
            int64_t n_rows = (int64_t)n_pages * SPECD_KV_PAGE_ROWS;
            int32_t *pages = malloc(sizeof(int32_t) * (size_t)n_pages);
            size_t q_n = (size_t)toks * N_HEADS * HEAD, kv_n = (size_t)toks * N_KV * HEAD;
            float *q = malloc(sizeof(float) * q_n), *out = malloc(sizeof(float) * q_n);
            float *k = malloc(sizeof(float) * kv_n), *v = malloc(sizeof(float) * kv_n);
            size_t pool = 2 * (size_t)N_LAYERS * (size_t)n_rows * specd_kv_row_bytes(be->kv_type, N_KV * HEAD);
            specd_kv_layout kv = {be->ops->alloc(be, pool), N_LAYERS, N_KV * HEAD, n_rows};
            if (!pages || !q || !out || !k || !v || !kv.base) die("out of memory");
            for (int i = 0; i < n_pages; i++) pages[i] = i;
            uint64_t s = 42;
            for (size_t i = 0; i < q_n; i++) q[i] = bench_urand(&s);
            for (size_t i = 0; i < kv_n; i++) k[i] = bench_urand(&s), v[i] = bench_urand(&s);
            double pre = 1e30, dec = 1e30;
            for (int r = 0; r < reps; r++) {
                /* prefill: 4 layers are enough to time (each has its own pool) */
                double t = run_step(be, &kv, pages, 0, P, NULL, q, k, v, out, 4);
                if (t < pre) pre = t;
            }
            /* fill every layer's cache, then time decode over all of them */
            run_step(be, &kv, pages, 0, P, NULL, q, k, v, out, N_LAYERS);
            for (int r = 0; r < reps; r++) {
                double t = run_step(be, &kv, pages, P, 1, NULL, q, k, v, out, N_LAYERS) * N_LAYERS;
                if (t < dec) dec = t;
            }
            double pairs = (double)N_HEADS * P * (P + 1) / 2;
            printf("| %s | %d | %.2f | %.3f | %.2f | %.3f |", cpu_simd_name(), P, pre * 1e3,
                   pre / pairs * 1e9, pre * N_LAYERS, dec * 1e3);
            for (int ti = 0; ti < n_trees; ti++) {
                /* a verify step: the chain's rows after P, committed nowhere
                 * (the next step writes the same rows again) */
                int T = trees[ti];
                uint8_t *mask = malloc((size_t)T * T);
                if (!mask) die("out of memory");
                /* a chain's ancestor mask: token a sees tokens 0..a */
                for (int a = 0; a < T; a++)
                    for (int b = 0; b < T; b++) mask[a * T + b] = b <= a;
                double tr = 1e30;
                for (int r = 0; r < reps; r++) {
                    double t = run_step(be, &kv, pages, P, T, mask, q, k, v, out, N_LAYERS) *
                               N_LAYERS;
                    if (t < tr) tr = t;
                }
                printf(" %.3f |", tr * 1e3);
                free(mask);
            }
            printf("\n");
            be->ops->free(be, kv.base);
            free(pages), free(q), free(out), free(k), free(v);
        }
        splits[pi] = cpu_split_decodes(be);
        be->ops->destroy(be);
    }
    /* which decode passes took the split path (cpu_backend.c, "split
     * decode"): it depends on threads, KV heads and the prompt length */
    printf("\ndecode passes run split (cpu_backend.c, \"split decode\"):");
    for (int pi = 0; pi < n_paths; pi++) printf(" %s %ld", paths[pi], splits[pi]);
    printf("\n");
    cpu_simd_force("auto");
    return 0;
}
