/* bench_sched_step.c - what target-svc's scheduler adds to a lone stream's
 * step beyond the forward pass itself: queueing the item, whichever thread
 * hand-offs the pass needs, the post-processing (the token's argmax, the
 * step's bookkeeping) and waking the submitter.
 *
 * A Verify handler submits one item per step and blocks in specd_sched_run
 * until it is done; between two steps it answers draft-svc and waits for
 * the next tree (the round trip and the draft, a few hundred microseconds
 * in which the machine's threads go idle). This does the same from one
 * thread: a decode item per step, then --think-us of sleep. It prints the
 * mean time specd_sched_run took, the mean forward time the scheduler
 * measured inside it (specd_work.forward_us), and their difference, the
 * scheduler's overhead per step.
 *
 * Built by CMake as build/bench_sched_step.
 * Run: build/bench_sched_step [-m MODEL] [-t THREADS] [--steps N] [--think-us LIST]
 *      (defaults: the default model, 2 threads, 300 steps, think 0,300)
 *
 * To compare two builds, alternate their binaries in one loop: the
 * difference is tens of microseconds on a forward of 2-3 ms, and these VMs
 * drift by more than that between runs minutes apart. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_args.h"
#include "common/model/model_file.h"
#include "common/model/transformer.h"
#include "target-svc/scheduler.h"
#include "common/util/clock.h"

#define PROMPT 32
#define WARMUP 20
#define MAX_LIST 8

static void die(const char *what) {
    fprintf(stderr, "bench_sched_step: %s\n", what);
    exit(1);
}

static void sleep_us(int us) {
    if (us <= 0) return;
    struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int threads = 2, steps = 300, thinks[MAX_LIST] = {0, 300}, n_thinks = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) die("every option takes a value");
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--think-us")) {
            if ((n_thinks = bench_int_list(v, thinks, MAX_LIST, 0, 1000000)) < 1)
                die("--think-us: a comma-separated list of up to 8 values in 0..1000000");
        } else {
            die("usage: bench_sched_step [-m MODEL] [-t THREADS] [--steps N] [--think-us LIST]");
        }
        i++;
    }
    if (threads < 1 || steps < 1 || n_thinks < 1) die("-t >= 1, --steps >= 1");

    specd_error err = {{0}};
    specd_model_file *m = specd_model_open(model, &err);
    if (!m) die(err.msg);
    /* room for the prompt and every step of every think level */
    int ctx = PROMPT + n_thinks * (WARMUP + steps) + 1;
    specd_transformer_opts to = {.backend = {.name = "cpu", .n_threads = threads}, .n_slots = 1,
                                 .max_ctx = ctx, .max_batch = 64};
    specd_transformer *t = specd_transformer_create(m, &to, &err);
    if (!t) die(err.msg);
    specd_sched_opts so = {.n_slots = 1, .max_batch_tokens = 64};
    specd_sched *s = specd_sched_create(t, &so, &err);
    if (!s) die(err.msg);
    int slot = specd_sched_acquire_slot(s);
    specd_sampling greedy;
    memset(&greedy, 0, sizeof greedy);

    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((i * 7919 + 13) % m->hp.vocab_size);
    specd_work w;
    memset(&w, 0, sizeof w);
    w.kind = SPECD_WORK_PREFILL;
    w.slot = slot;
    w.tokens = prompt;
    w.n_tokens = PROMPT;
    w.sampling = &greedy;
    if (specd_sched_run(s, &w)) die(w.err.msg);
    int32_t tok = w.next_token;
    int n_past = PROMPT;

    printf("%s, %d threads, a lone stream's decode steps through the scheduler, %d timed "
           "after %d\n\n",
           model, threads, steps, WARMUP);
    printf("| think us | step us | forward us | overhead us |\n");
    printf("|---------:|--------:|-----------:|------------:|\n");
    for (int k = 0; k < n_thinks; k++) {
        double step = 0, fwd = 0;
        for (int i = 0; i < WARMUP + steps; i++) {
            sleep_us(thinks[k]);
            memset(&w, 0, sizeof w);
            w.kind = SPECD_WORK_DECODE;
            w.slot = slot;
            w.n_past = n_past;
            w.tokens = &tok;
            w.n_tokens = 1;
            w.sampling = &greedy;
            double t0 = specd_now_us();
            if (specd_sched_run(s, &w)) die(w.err.msg);
            double t1 = specd_now_us();
            if (i >= WARMUP) {
                step += t1 - t0;
                fwd += w.forward_us;
            }
            tok = w.next_token;
            n_past++;
        }
        printf("| %8d | %7.1f | %10.1f | %11.1f |\n", thinks[k], step / steps, fwd / steps,
               (step - fwd) / steps);
    }
    specd_sched_release_slot(s, slot);
    specd_sched_free(s);
    specd_transformer_free(t);
    specd_model_close(m);
    return 0;
}
