/* bench_sampling.c - what one sampled row costs the sampling core, on each
 * SIMD path: the final distribution over the vocabulary
 * (specd_sampling_probs) under four filter settings, and the seed-exact
 * race that draws from it (specd_race_pick; with top-k 50 most tokens are
 * 0 and the race skips them). The target pays both once per verified row
 * of a sampled request, the draft once per drafted node. Also the
 * log-probabilities of one token with its top 5 (specd_logprobs), which a
 * request asking for logprobs pays per emitted token, greedy or not.
 *
 * Built by CMake as build/bench_sampling.
 * Run: build/bench_sampling [--vocab 49152] [--reps 200] [--temperature 0.7]
 *
 * The logits are pseudo-random, a standard normal times 4 (a spread like a
 * small chat model's); the cost barely depends on them. Prints one row per
 * path the CPU has: the fastest of --reps calls of each, in microseconds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/spec/sampling.h"
#include "common/util/rng.h"
#include "common/util/simd.h"
#include "common/util/clock.h"

int main(int argc, char **argv) {
    int vocab = 49152, reps = 200;
    float temperature = 0.7f;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--temperature") && i + 1 < argc)
            temperature = (float)atof(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_sampling [--vocab N] [--reps N] [--temperature T]\n");
            return 2;
        }
    }
    if (vocab < 1 || reps < 1 || !(temperature > 0.0f)) {
        fprintf(stderr, "bench_sampling: --vocab, --reps and --temperature must be positive\n");
        return 2;
    }
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    float *probs = malloc(sizeof(float) * (size_t)vocab);
    void *scratch = malloc(specd_sampling_scratch_size(vocab));
    if (!logits || !probs || !scratch) return 1;
    for (int i = 0; i < vocab; i++) { /* Box-Muller on addressed uniforms */
        double u1 = specd_rng_uniform(1, 0, (uint64_t)i * 2), u2 = specd_rng_uniform(1, 0, (uint64_t)i * 2 + 1);
        logits[i] = (float)(4.0 * sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
    }
    static const struct {
        const char *name;
        int top_k;
        float top_p, min_p;
    } filters[] = {{"none", 0, 1.0f, 0.0f}, {"min_p 0.05", 0, 1.0f, 0.05f},
                   {"top_p 0.9", 0, 0.9f, 0.0f}, {"top_k 50", 50, 1.0f, 0.0f}};
    enum { N_FILTERS = sizeof filters / sizeof filters[0] };
    static const char *const paths[] = {"scalar", "avx2", "avx512"};
    printf("vocab %d, temperature %.2f, fastest of %d calls, microseconds per row\n\n", vocab,
           (double)temperature, reps);
    printf("| path   | probs: none | min_p 0.05 | top_p 0.9 | top_k 50 | race: none | top_k 50 | none: probs + race | logprobs, top 5 |\n");
    printf("|--------|------------:|-----------:|----------:|---------:|-----------:|---------:|------------------:|----------------:|\n");
    int sink = 0;
    for (int p = 0; p < 3; p++) {
        if (!specd_simd_force(paths[p])) continue;
        double probs_us[N_FILTERS], race_us[N_FILTERS];
        for (int f = 0; f < N_FILTERS; f++) {
            specd_sampling s;
            specd_sampling_init(&s);
            s.temperature = temperature;
            s.top_k = filters[f].top_k;
            s.top_p = filters[f].top_p;
            s.min_p = filters[f].min_p;
            double best_p = 1e30, best_r = 1e30;
            for (int r = 0; r < reps; r++) {
                double t0 = specd_now_us();
                specd_sampling_probs(&s, logits, vocab, probs, scratch);
                double t1 = specd_now_us();
                sink += specd_race_pick(probs, vocab, (specd_race_addr){7, 1, (uint64_t)r});
                double t2 = specd_now_us();
                if (t1 - t0 < best_p) best_p = t1 - t0;
                if (t2 - t1 < best_r) best_r = t2 - t1;
            }
            probs_us[f] = best_p;
            race_us[f] = best_r;
        }
        double best_lp = 1e30;
        for (int r = 0; r < reps; r++) {
            float lp, top_lps[5];
            int32_t top_ids[5];
            double t0 = specd_now_us();
            specd_logprobs(logits, vocab, r % vocab, 5, &lp, top_ids, top_lps);
            double t1 = specd_now_us();
            sink += top_ids[0];
            if (t1 - t0 < best_lp) best_lp = t1 - t0;
        }
        printf("| %-6s | %11.1f | %10.1f | %9.1f | %8.1f | %10.1f | %8.1f | %17.1f | %15.1f |\n",
               paths[p], probs_us[0], probs_us[1], probs_us[2], probs_us[3], race_us[0], race_us[3],
               probs_us[0] + race_us[0], best_lp);
    }
    specd_simd_force("auto");
    fprintf(stderr, "(checksum %d)\n", sink);
    free(scratch);
    free(probs);
    free(logits);
    return 0;
}
