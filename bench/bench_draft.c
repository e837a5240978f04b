/* bench_draft.c - how long the mlp drafter takes to draft one tree, by tree
 * shape and thread count: the time a speculative step spends before the
 * target sees its tree (with one stream it is on the critical path: the
 * speculator needs the target's hidden state of the last accepted token, so
 * it cannot draft ahead).
 *
 * Built by CMake as build/bench_draft.
 * Run: build/bench_draft [--speculator DIR] [--threads 1,2] [--shapes 1x1,1x2,1x4,3x4]
 *                        [--evict-mb 96] [--gap-ms 0] [--reps 300]
 *                        [--quant none|q8_0|q4_1_head] [--stop-threshold T]
 *      --speculator  an MLPSpeculator directory; its accept_head/ is loaded
 *                    when present, as draft-svc does (default: the shipped
 *                    models/SmolLM2-135M-Instruct.speculator)
 *      --stop-threshold  drafts are adaptive (SpecDec++) at this threshold,
 *                    so the acceptance head runs on every level; without it
 *                    the head is loaded but not run, as for a request with
 *                    no threshold. 1 never stops a path: the same trees as
 *                    without, plus the head's time
 *      --shapes      candidates x depth, as the driver asks for them
 *      --evict-mb    before each draft the calling thread reads this many MB
 *                    (default 96, the default target's weights), as the
 *                    target's pass between two drafts does: the speculator's
 *                    weights leave the core's L2 and the core stays busy
 *      --gap-ms      and then sleeps this long (default 0). A sleep alone is
 *                    not a target step: an idle core clocks down, and on the
 *                    VM of docs/BENCHMARKS.md every level then took about
 *                    twice as long; 0 and 0 = back to back, caches warm
 *      --quant       how the speculator's matrices are stored, as
 *                    draft-svc's drafter.mlp.quantize (default q4_1_head,
 *                    its default)
 *
 * Prints one row per (threads, shape): the nodes drafted, the median and
 * fastest draft in microseconds, and the median per level (depth). The
 * hidden state and the history are fixed pseudo-random values: what a draft
 * costs does not depend on them, only the shape (nodes per level) does. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench/bench_args.h"
#include "common/model/mlp_speculator.h"
#include "common/util/rng.h"
#include "draft-svc/draft_config.h"
#include "draft-svc/drafter.h"
#include "common/util/clock.h"

#define MAX_LIST 16
#define HIDDEN_MAX 8192

static void sleep_ms(double ms) {
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000 * (double)(time_t)(ms / 1000)) * 1e6)};
    nanosleep(&ts, NULL);
}

/* Reads n bytes of p (the sum keeps the reads). */
static volatile unsigned long g_sink;
static void stream_read(const unsigned char *p, size_t n) {
    unsigned long sum = 0;
    for (size_t i = 0; i < n; i += 64) sum += p[i];
    g_sink += sum;
}

/* "1x1,3x4" into candidates and depths; the count, or -1. */
static int parse_shapes(const char *s, int *cands, int *depths) {
    int n = 0;
    while (*s) {
        int c, d, used;
        if (n == MAX_LIST || sscanf(s, "%dx%d%n", &c, &d, &used) != 2 || c < 1 || d < 1 ||
            c > 64 || d > 8)
            return -1;
        cands[n] = c, depths[n++] = d;
        s += used;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static int usage(void) {
    fprintf(stderr, "usage: bench_draft [--speculator DIR] [--threads LIST] [--shapes CxD,...]\n"
                    "                   [--evict-mb N] [--gap-ms X] [--reps N]\n"
                    "                   [--quant none|q8_0|q4_1_head] [--stop-threshold T]\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *dir = "models/SmolLM2-135M-Instruct.speculator";
    int threads[MAX_LIST] = {1, 2}, n_threads = 2;
    int cands[MAX_LIST] = {1, 1, 1, 3}, depths[MAX_LIST] = {1, 2, 4, 4}, n_shapes = 4;
    double gap_ms = 0, evict_mb = 96, stop_threshold = 0;
    int reps = 300, quant = SPECD_MLP_Q4_HEAD;
    const char *const *quant_names = specd_mlp_quant_names;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        else if (!strcmp(a, "--quant")) {
            for (quant = 0; quant_names[quant] && strcmp(v, quant_names[quant]); quant++) {
            }
            if (!quant_names[quant]) return usage();
            i++;
        }
        else if (!strcmp(a, "--speculator")) dir = v, i++;
        else if (!strcmp(a, "--threads")) {
            if ((n_threads = bench_int_list(v, threads, MAX_LIST, 1, 1024)) < 1) return usage();
            i++;
        } else if (!strcmp(a, "--shapes")) {
            if ((n_shapes = parse_shapes(v, cands, depths)) < 1) return usage();
            i++;
        } else if (!strcmp(a, "--evict-mb")) {
            evict_mb = atof(v), i++;
            if (evict_mb < 0 || evict_mb > 65536) return usage();
        } else if (!strcmp(a, "--stop-threshold")) {
            stop_threshold = atof(v), i++;
            if (!(stop_threshold > 0 && stop_threshold <= 1)) return usage();
        } else if (!strcmp(a, "--gap-ms")) {
            gap_ms = atof(v), i++;
            if (gap_ms < 0 || gap_ms > 1000) return usage();
        } else if (!strcmp(a, "--reps")) {
            reps = atoi(v), i++;
            if (reps < 1 || reps > 1000000) return usage();
        } else return usage();
    }

    char head[4096];
    struct stat st;
    snprintf(head, sizeof head, "%s/accept_head", dir);
    int have_head = stat(head, &st) == 0 && S_ISDIR(st.st_mode);
    double *times = malloc(sizeof(double) * (size_t)reps);
    size_t evict_bytes = (size_t)(evict_mb * 1024 * 1024);
    unsigned char *evict = evict_bytes ? malloc(evict_bytes) : NULL;
    if (!times || (evict_bytes && !evict)) return 1;
    if (evict) memset(evict, 1, evict_bytes);
    char head_note[96] = "";
    if (have_head && stop_threshold > 0)
        snprintf(head_note, sizeof head_note, ", its acceptance head run at stop threshold %g",
                 stop_threshold);
    else if (have_head)
        snprintf(head_note, sizeof head_note, ", its acceptance head loaded, not run");
    printf("speculator %s (%s%s), %d drafts per row, each after a %.0f MB read and %.1f ms idle\n\n",
           dir, quant_names[quant], head_note, reps, evict_mb, gap_ms);
    printf("| threads | shape | nodes | median us | fastest us | median us per level |\n");
    printf("|--------:|------:|------:|----------:|-----------:|--------------------:|\n");
    for (int ti = 0; ti < n_threads; ti++) {
        specd_error err = {{0}};
        specd_mlp_drafter_opts o = {.path = dir, .n_threads = threads[ti],
                                    .accept_head = have_head ? head : NULL, .quant = quant};
        specd_drafter *d = specd_mlp_drafter_create(&o, &err);
        if (!d) {
            fprintf(stderr, "bench_draft: %s\n", err.msg);
            return 1;
        }
        if (d->hidden_size < 1 || d->hidden_size > HIDDEN_MAX) {
            fprintf(stderr, "bench_draft: hidden size %d not supported\n", d->hidden_size);
            return 1;
        }
        static float hidden[HIDDEN_MAX];
        for (int i = 0; i < d->hidden_size; i++)
            hidden[i] = (float)(4.0 * specd_rng_uniform(7, 0, (uint64_t)i) - 2.0);
        int32_t hist[16];
        for (int i = 0; i < 16; i++)
            hist[i] = (int32_t)(specd_rng_uniform(7, 1, (uint64_t)i) * (d->vocab - 1));
        specd_tree_buf tb;
        if (specd_tree_buf_init(&tb, 64, 0, &err)) {
            fprintf(stderr, "bench_draft: %s\n", err.msg);
            return 1;
        }
        for (int si = 0; si < n_shapes; si++) {
            int nodes = 0;
            for (int r = -10; r < reps; r++) { /* 10 untimed drafts first */
                specd_tree_buf_reset(&tb);
                specd_draft_job j = {.history = hist, .n_history = 16, .n_prompt = 8,
                                     .hidden = hidden, .candidates = cands[si],
                                     .depth = depths[si], .out = &tb,
                                     .stop_threshold = (float)stop_threshold, .min_depth = 1};
                if (evict) stream_read(evict, evict_bytes);
                sleep_ms(gap_ms);
                double t0 = specd_now_us();
                if (specd_drafter_propose(d, &j, 1, &err)) {
                    fprintf(stderr, "bench_draft: %s\n", err.msg);
                    return 1;
                }
                if (r >= 0) times[r] = specd_now_us() - t0;
                nodes = tb.n_nodes;
            }
            qsort(times, (size_t)reps, sizeof *times, bench_cmp_double);
            int depth = depths[si] < d->max_depth ? depths[si] : d->max_depth;
            printf("| %7d | %2dx%-2d | %5d | %9.1f | %10.1f | %19.1f |\n", threads[ti], cands[si],
                   depths[si], nodes, times[reps / 2], times[0], times[reps / 2] / depth);
            fflush(stdout);
        }
        specd_tree_buf_free(&tb);
        specd_drafter_free(d);
    }
    free(times);
    free(evict);
    return 0;
}
