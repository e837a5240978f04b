/* bench_step_lag.c - does a forward step's time depend on the step before
 * it? On the 2-vCPU Xeon VM of docs/BENCHMARKS.md (twentieth session) it
 * does: a plain step of 8 sequences right after a 72-token verify step ran
 * 25-35% slow, recovering over the next ~40 ms. This measures that, and
 * which side lags (the cores or the memory), so that `specd bench --verify`
 * could be made to time what a serving loop sees (its --settle-ms).
 *
 * Built by CMake as build/bench_step_lag.
 * Run: build/bench_step_lag [-m MODEL] [-t THREADS] [--rounds N] [--after N]
 *                           [--heavy-tokens N] [--probe step|alu|mem]
 *
 * Each round runs one "heavy" step (8 sequences x heavy-tokens/8 new
 * tokens, default 72 tokens: batch 8 verifying k=8) or, in alternate rounds,
 * one "light" step (8 sequences x 1 token, a batch-8 plain step), then
 * --after probes, each timed:
 *   step: a batch-8 plain step (8 sequences x 1 token);
 *   alu:  a dependent chain of scalar integer multiply-adds (the core's
 *         clock, nothing else);
 *   mem:  a read of one word per 64-byte line of a 64 MB buffer (the
 *         memory side: L3 and beyond).
 * It prints the mean time of probe 1, 2, ... after a heavy step and after a
 * light one. A lag shows as a first column that is slower after the heavy
 * step and a row that decays to the light one's. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/model/model_file.h"
#include "common/model/transformer.h"
#include "common/util/clock.h"

enum { SEQS = 8, CTX = 64, MAX_AFTER = 32, MEM_WORDS = 8 << 20 /* 64 MB of int64 */ };

static void die(const char *what) {
    fprintf(stderr, "bench_step_lag: %s\n", what);
    exit(1);
}

typedef struct lag_run {
    specd_transformer *t;
    int32_t toks[512], rows[512], ids[512];
    int64_t *mem;
} lag_run;

/* n_new tokens for each of the SEQS sequences after CTX cached ones, every
 * row's argmax out (a verify step's shape); nothing is committed. */
static void step(lag_run *r, int n_new) {
    specd_seq_input seqs[SEQS];
    for (int s = 0; s < SEQS; s++)
        seqs[s] = (specd_seq_input){.slot = s, .n_past = CTX, .n_new = n_new};
    specd_batch b = {.n_tokens = SEQS * n_new, .tokens = r->toks, .n_seqs = SEQS, .seqs = seqs,
                     .n_out = SEQS * n_new, .out_rows = r->rows, .argmax = r->ids};
    specd_error err = {{0}};
    if (specd_transformer_forward(r->t, &b, &err)) die(err.msg);
}

static volatile uint64_t g_sink;

static void probe(lag_run *r, char kind) {
    if (kind == 's') {
        step(r, 1);
    } else if (kind == 'a') {
        uint64_t x = 1;
        for (long j = 0; j < 3000000; j++) x = x * 3 + 1;
        g_sink = x;
    } else {
        int64_t sum = 0;
        for (long j = 0; j < MEM_WORDS; j += 8) sum += r->mem[j];
        g_sink = (uint64_t)sum;
    }
}

int main(int argc, char **argv) {
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int threads = 2, rounds = 60, after = 10, heavy = 72;
    char kind = 's';
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) die("every option takes a value");
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "--rounds")) rounds = atoi(v);
        else if (!strcmp(a, "--after")) after = atoi(v);
        else if (!strcmp(a, "--heavy-tokens")) heavy = atoi(v);
        else if (!strcmp(a, "--probe") && (!strcmp(v, "step") || !strcmp(v, "alu") || !strcmp(v, "mem")))
            kind = v[0];
        else die("usage: bench_step_lag [-m MODEL] [-t THREADS] [--rounds N] [--after N] "
                 "[--heavy-tokens N] [--probe step|alu|mem]");
        i++;
    }
    if (threads < 1 || rounds < 2 || after < 1 || after > MAX_AFTER || heavy < SEQS ||
        heavy > 256 || heavy % SEQS)
        die("-t >= 1, --rounds >= 2, --after 1..32, --heavy-tokens a multiple of 8 in 8..256");

    specd_error err = {{0}};
    specd_model_file *m = specd_model_open(model, &err);
    if (!m) die(err.msg);
    specd_transformer_opts to = {.backend = {.name = "cpu", .n_threads = threads},
                                 .n_slots = SEQS, .max_ctx = CTX + heavy / SEQS + 1,
                                 .max_batch = 512};
    lag_run r = {.t = specd_transformer_create(m, &to, &err)};
    if (!r.t) die(err.msg);
    for (int i = 0; i < 512; i++) {
        r.toks[i] = (int32_t)((i * 7919 + 13) % m->hp.vocab_size);
        r.rows[i] = i;
    }
    if (kind == 'm') {
        r.mem = malloc(sizeof(int64_t) * MEM_WORDS);
        if (!r.mem) die("out of memory");
        for (long j = 0; j < MEM_WORDS; j++) r.mem[j] = j;
    }
    for (int s = 0; s < SEQS; s++) { /* each sequence's cached context */
        specd_seq_input sq = {.slot = s, .n_past = 0, .n_new = CTX};
        specd_batch b = {.n_tokens = CTX, .tokens = r.toks, .n_seqs = 1, .seqs = &sq};
        if (specd_transformer_forward(r.t, &b, &err)) die(err.msg);
    }
    double sum[2][MAX_AFTER] = {{0}};
    int n[2] = {0, 0}; /* rounds of each kind */
    for (int rd = 0; rd < rounds; rd++) {
        const int heavy_round = rd % 2 == 0;
        n[heavy_round]++;
        step(&r, heavy_round ? heavy / SEQS : 1);
        for (int i = 0; i < after; i++) {
            double t0 = specd_now_ms();
            probe(&r, kind);
            sum[heavy_round][i] += specd_now_ms() - t0;
        }
    }
    printf("probe %s (ms, mean of %d and %d rounds), %d threads, %s\n",
           kind == 's' ? "step: batch-8 plain step" : kind == 'a' ? "alu: scalar chain" : "mem: 64 MB read",
           n[1], n[0], threads, model);
    printf("| after | probe 1 |");
    for (int i = 1; i < after; i++) printf(" %d |", i + 1);
    printf("\n|---|");
    for (int i = 0; i < after; i++) printf("--:|");
    printf("\n");
    for (int h = 1; h >= 0; h--) {
        if (h) printf("| a %d-token step |", heavy);
        else printf("| a %d-token step |", SEQS);
        for (int i = 0; i < after; i++) printf(" %.3f |", sum[h][i] / n[h]);
        printf("\n");
    }
    free(r.mem);
    specd_transformer_free(r.t);
    specd_model_close(m);
    return 0;
}
