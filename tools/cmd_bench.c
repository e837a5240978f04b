/* cmd_bench.c - `specd bench`: how fast the transformer prefills and decodes
 * (`specd bench --e2e`, the end-to-end benchmark of the services, lives in
 * cmd_bench_e2e.c).
 *
 * Prints a table of prefill and decode tokens/s for one stream (the median
 * of --reps runs), the bytes of weights one decode step reads, and the
 * memory read bandwidth of this machine measured in the same run, so the
 * decode figure can be read as a fraction of the bandwidth bound. The decode
 * loop is real greedy decoding (argmax fed back), not a synthetic kernel
 * loop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/sampling.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/threadpool.h"
#include "target-svc/transformer.h"

static void bench_usage(void) {
    printf("usage: specd bench [options]\n"
           "  -m, --model PATH     .gguf file or Hugging Face directory (default %s)\n"
           "  -t, --threads N      CPU threads (default: all cores)\n"
           "  --prompt-len N       prefill length in tokens (default 128)\n"
           "  --gen N              decoded tokens per run (default 128)\n"
           "  --reps N             runs; the median is reported (default 3)\n"
           "  --no-bandwidth       skip the memory-bandwidth measurement\n"
           "  --verify             instead: cost of verifying k tokens per sequence for a\n"
           "                       batch of B sequences, vs one decode step (ms per step)\n"
           "  --batches LIST       B values for --verify (default 1,2,4,8,16,32)\n"
           "  --ks LIST            k values for --verify (default 1,2,4,8,16)\n"
           "  --ctx N              cached tokens per sequence for --verify (default 64)\n"
           "  --e2e                instead: tokens/s and tau through draft-svc + target-svc,\n"
           "                       plain vs each drafter at 1..32 streams (specd bench --e2e -h)\n",
           SPECD_DEFAULT_MODEL);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Bytes a single decode step must stream from memory: every layer matrix and
 * norm, the final norm and the LM head (one embedding row is negligible). */
static double decode_weight_bytes(const specd_model_file *m) {
    double total = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const specd_tensor *t = &m->tensors[i];
        if (!strncmp(t->name, "blk.", 4) || !strcmp(t->name, "output_norm.weight") ||
            !strcmp(t->name, "output.weight"))
            total += (double)t->nbytes;
    }
    if (m->hp.tied_embeddings) total += (double)specd_model_tensor(m, "token_embd.weight")->nbytes;
    return total;
}

typedef struct bw_job {
    const uint64_t *buf;
    size_t words_per_task;
    uint64_t sums[64];
} bw_job;

static void bw_task(void *ctx, int task, int thread) {
    bw_job *j = ctx;
    const uint64_t *p = j->buf + (size_t)task * j->words_per_task;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < j->words_per_task; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    j->sums[thread % 64] += a ^ b ^ c ^ d; /* keeps the loads alive */
}

/* Read bandwidth with all threads: sum a 512 MiB buffer (far beyond any
 * cache) several times and keep the best pass. */
static double measure_bandwidth(int n_threads) {
    size_t bytes = (size_t)512 << 20;
    uint64_t *buf = malloc(bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes);
    specd_pool *pool = specd_pool_create(n_threads);
    int tasks = 64;
    bw_job j = {buf, bytes / sizeof(uint64_t) / tasks, {0}};
    double best = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = cli_now();
        specd_pool_run(pool, tasks, bw_task, &j);
        double gbs = (double)bytes / (cli_now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    specd_pool_destroy(pool);
    free(buf);
    return best;
}

/* Parses "1,2,4" into v (at most cap values, each 1..hi). */
static int parse_list(const char *opt, const char *s, int *v, int cap, int hi) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (n == cap) {
            fprintf(stderr, "specd bench: %s takes at most %d values\n", opt, cap);
            exit(2);
        }
        v[n++] = (int)cli_int(opt, tok, 1, hi);
    }
    return n;
}

/* Verification cost (the shape of Table 1 in IBM's speculator paper): B
 * sequences, each with `ctx` cached tokens, each adding k new tokens with
 * logits for every one of them (a verifier needs the target's distribution
 * at every node). k = 1 is a plain decode step. */
static int bench_verify(specd_model_file *m, int threads, const int *batches, int n_b,
                        const int *ks, int n_k, int ctx, int reps) {
    int max_b = 0, max_k = 0;
    for (int i = 0; i < n_b; i++) max_b = batches[i] > max_b ? batches[i] : max_b;
    for (int i = 0; i < n_k; i++) max_k = ks[i] > max_k ? ks[i] : max_k;
    int max_tok = max_b * max_k > max_b * ctx ? max_b * max_k : max_b * ctx;
    specd_error err = {{0}};
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = threads},
                                .n_slots = max_b, .max_ctx = ctx + max_k,
                                .max_batch = max_tok};
    specd_transformer *t = specd_transformer_create(m, &o, &err);
    if (!t) {
        fprintf(stderr, "specd bench: %s\n", err.msg);
        return 1;
    }
    int vocab = m->hp.vocab_size;
    int32_t *toks = malloc(sizeof(int32_t) * max_tok), *rows = malloc(sizeof(int32_t) * max_tok);
    specd_seq_input *seqs = calloc((size_t)max_b, sizeof *seqs);
    float *logits = malloc(sizeof(float) * (size_t)max_b * max_k * vocab);
    for (int i = 0; i < max_tok; i++) {
        toks[i] = (int32_t)((i * 7919u + 13) % vocab);
        rows[i] = i;
    }
    /* fill every slot's cache once; later steps write after it and are
     * simply overwritten by the next measurement */
    for (int s = 0; s < max_b; s++) seqs[s] = (specd_seq_input){.slot = s, .n_past = 0, .n_new = ctx};
    specd_batch pre = {.n_tokens = max_b * ctx, .tokens = toks, .n_seqs = max_b, .seqs = seqs};
    int rc = specd_transformer_forward(t, &pre, &err);
    double *ms = calloc((size_t)n_b * n_k, sizeof(double)), *runs = calloc((size_t)reps, sizeof(double));
    for (int bi = 0; bi < n_b && !rc; bi++) {
        for (int ki = 0; ki < n_k && !rc; ki++) {
            int B = batches[bi], k = ks[ki];
            for (int s = 0; s < B; s++)
                seqs[s] = (specd_seq_input){.slot = s, .n_past = ctx, .n_new = k};
            specd_batch b = {.n_tokens = B * k, .tokens = toks, .n_seqs = B, .seqs = seqs,
                             .n_out = B * k, .out_rows = rows, .logits = logits};
            for (int r = 0; r <= reps && !rc; r++) { /* r = 0 warms up */
                double t0 = cli_now();
                rc = specd_transformer_forward(t, &b, &err);
                if (r > 0) runs[r - 1] = (cli_now() - t0) * 1e3;
            }
            ms[bi * n_k + ki] = median(runs, reps);
        }
    }
    if (rc) {
        fprintf(stderr, "specd bench: %s\n", err.msg);
    } else {
        printf("verification cost: ms per forward step (ratio to k=1 at the same batch), %d cached "
               "tokens per sequence, backend %s (%s), median of %d\n\n",
               ctx, specd_transformer_backend_name(t), cpu_simd_name(), reps);
        printf("| batch |");
        for (int ki = 0; ki < n_k; ki++) printf("      k=%-2d      |", ks[ki]);
        printf("\n|------:|");
        for (int ki = 0; ki < n_k; ki++) printf("----------------:|");
        printf("\n");
        for (int bi = 0; bi < n_b; bi++) {
            printf("| %5d |", batches[bi]);
            for (int ki = 0; ki < n_k; ki++)
                printf(" %7.1f (%4.2fx) |", ms[bi * n_k + ki], ms[bi * n_k + ki] / ms[bi * n_k]);
            printf("\n");
        }
    }
    free(ms);
    free(runs);
    free(toks);
    free(rows);
    free(seqs);
    free(logits);
    specd_transformer_free(t);
    return rc ? 1 : 0;
}

int cmd_bench(int argc, char **argv) {
    /* --e2e is a different benchmark (through the services) with its own
     * options; hand the whole command line over. */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--e2e")) return cmd_bench_e2e(argc, argv);
    const char *model = SPECD_DEFAULT_MODEL;
    int threads = 0, prompt_len = 128, gen = 128, reps = 3, bandwidth = 1, verify = 0, vctx = 64;
    int batches[16] = {1, 2, 4, 8, 16, 32}, n_batches = 6, ks[16] = {1, 2, 4, 8, 16}, n_ks = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            threads = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--prompt-len"))
            prompt_len = (int)cli_int(a, cli_value(argc, argv, &i), 1, 8192);
        else if (!strcmp(a, "--gen")) gen = (int)cli_int(a, cli_value(argc, argv, &i), 1, 8192);
        else if (!strcmp(a, "--reps")) reps = (int)cli_int(a, cli_value(argc, argv, &i), 1, 100);
        else if (!strcmp(a, "--no-bandwidth")) bandwidth = 0;
        else if (!strcmp(a, "--verify")) verify = 1;
        else if (!strcmp(a, "--batches"))
            n_batches = parse_list(a, cli_value(argc, argv, &i), batches, 16, 256);
        else if (!strcmp(a, "--ks")) n_ks = parse_list(a, cli_value(argc, argv, &i), ks, 16, 256);
        else if (!strcmp(a, "--ctx")) vctx = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage();
            return 0;
        } else {
            fprintf(stderr, "specd bench: unknown option '%s'\n", a);
            return 2;
        }
    }
    specd_error err = {{0}};
    specd_model_file *m = specd_model_open(model, &err);
    if (!m) {
        fprintf(stderr, "specd bench: %s\n", err.msg);
        return 1;
    }
    const specd_llama_hparams *hp = &m->hp;
    if (verify) {
        int vrc = bench_verify(m, threads, batches, n_batches, ks, n_ks, vctx, reps);
        specd_model_close(m);
        return vrc;
    }
    int ctx = prompt_len + gen;
    if (ctx > hp->max_seq_len) {
        fprintf(stderr, "specd bench: --prompt-len + --gen = %d exceeds the model context %d\n",
                ctx, hp->max_seq_len);
        specd_model_close(m);
        return 2;
    }
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = threads}, .n_slots = 1,
                                .max_ctx = ctx, .max_batch = prompt_len};
    specd_transformer *t = specd_transformer_create(m, &o, &err);
    if (!t) {
        fprintf(stderr, "specd bench: %s\n", err.msg);
        specd_model_close(m);
        return 1;
    }
    int n_threads = threads;
    if (n_threads <= 0) {
        specd_pool *p = specd_pool_create(0);
        n_threads = specd_pool_size(p);
        specd_pool_destroy(p);
    }

    /* a fixed pseudo-random prompt: content does not change the cost */
    int32_t *prompt = malloc(sizeof(int32_t) * prompt_len);
    for (int i = 0; i < prompt_len; i++) prompt[i] = (int32_t)((i * 7919u + 13) % hp->vocab_size);
    float *logits = malloc(sizeof(float) * hp->vocab_size);
    double *pre_s = calloc((size_t)reps, sizeof(double)), *dec_s = calloc((size_t)reps, sizeof(double));
    int rc = 0;

    for (int r = 0; r <= reps && !rc; r++) { /* run 0 warms caches and pages */
        int32_t last = prompt_len - 1;
        specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = prompt_len};
        specd_batch b = {.n_tokens = prompt_len, .tokens = prompt, .n_seqs = 1, .seqs = &in,
                         .n_out = 1, .out_rows = &last, .logits = logits};
        double t0 = cli_now();
        rc = specd_transformer_forward(t, &b, &err);
        double t1 = cli_now();
        int32_t tok = specd_argmax(logits, hp->vocab_size), zero = 0;
        for (int g = 0; g < gen && !rc; g++) {
            in = (specd_seq_input){.slot = 0, .n_past = prompt_len + g, .n_new = 1};
            b = (specd_batch){.n_tokens = 1, .tokens = &tok, .n_seqs = 1, .seqs = &in,
                              .n_out = 1, .out_rows = &zero, .logits = logits};
            rc = specd_transformer_forward(t, &b, &err);
            tok = specd_argmax(logits, hp->vocab_size);
        }
        double t2 = cli_now();
        if (r > 0) {
            pre_s[r - 1] = t1 - t0;
            dec_s[r - 1] = t2 - t1;
        }
    }
    if (rc) {
        fprintf(stderr, "specd bench: %s\n", err.msg);
    } else {
        double pre = median(pre_s, reps), dec = median(dec_s, reps);
        double wbytes = decode_weight_bytes(m);
        double achieved = wbytes * gen / dec / 1e9;
        printf("model    %s (%d layers, dim %d, vocab %d)\n", model, hp->n_layers, hp->dim,
               hp->vocab_size);
        printf("backend  %s (%s), %d threads, median of %d runs\n\n",
               specd_transformer_backend_name(t), cpu_simd_name(), n_threads, reps);
        printf("| phase   | tokens | time (ms) | tokens/s |\n");
        printf("|---------|-------:|----------:|---------:|\n");
        printf("| prefill | %6d | %9.1f | %8.1f |\n", prompt_len, pre * 1e3, prompt_len / pre);
        printf("| decode  | %6d | %9.1f | %8.1f |\n", gen, dec * 1e3, gen / dec);
        printf("\nweights read per decode token: %.1f MB -> %.1f GB/s achieved\n", wbytes / 1e6,
               achieved);
        if (bandwidth) {
            double bw = measure_bandwidth(n_threads);
            printf("memory read bandwidth (%d threads): %.1f GB/s -> decode bound %.1f tokens/s; "
                   "decode runs at %.0f%% of it\n",
                   n_threads, bw, bw * 1e9 / wbytes, 100.0 * achieved / bw);
        }
    }
    free(prompt);
    free(logits);
    free(pre_s);
    free(dec_s);
    specd_transformer_free(t);
    specd_model_close(m);
    return rc ? 1 : 0;
}
