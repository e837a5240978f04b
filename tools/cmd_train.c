/* cmd_train.c - `specd train speculator` (and the dispatch to
 * `specd train accept-head`, cmd_train_accept_head.c).
 *
 * The two-stage recipe of IBM's MLP speculator (DESIGN.md):
 *   0. data: run the frozen target once over the training text (stage 1)
 *      and let it continue the prompts itself, greedily as the server
 *      decodes by default, with an optional sampled fraction (stage 2);
 *      both are cached with their hidden states in shards
 *      (tools/train/spec_data.h), so the expensive target work is done once
 *      per dataset, not once per epoch, and an interrupted preparation
 *      resumes at the last complete shard;
 *   1. stage 1: batches of a few long sequences of ground-truth text;
 *   2. stage 2: batches of many short self-generated sequences, with a
 *      lower learning rate; steps about 2:1.
 * Each stage warms up linearly and decays by a cosine. The loss is the sum
 * over heads of the mean cross-entropy; gradients are clipped by their
 * global norm; AdamW. Everything random is addressed by (seed, step), so a
 * resumed run draws the same batches an uninterrupted one would.
 *
 * Output directory: config.json + model.safetensors (the MLPSpeculator
 * format draft-svc loads), written at every checkpoint, and
 * train_state.safetensors (parameters, Adam moments, step) to resume from. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <strings.h>
#include <unistd.h>

#include <cblas.h>

#include "cli.h"
#include "common/util/simd.h"
#include "common/util/dtype.h"
#include "common/model/model_file.h"
#include "common/util/rng.h"
#include "common/util/small_file.h"
#include "common/text/tokenizer.h"
#include "common/model/transformer.h"
#include "tools/train/corpus.h"
#include "tools/train/nn.h"
#include "tools/train/spec_data.h"
#include "tools/train/spec_model.h"

#define MAX_DATA_FILES 16

typedef struct train_opts {
    const char *model, *out, *prompts, *cache, *dtype, *eval_dir, *init_dir;
    const char *data[MAX_DATA_FILES];
    int n_data;
    int threads, heads, inner, draft_vocab, tied, scale_input;
    long stage1_tokens;
    int seq_len, encode_batch;
    long stage2_prompts;
    int gen_len, gen_parallel, top_k, shard_seqs;
    float temperature, sampled_frac;
    long steps1, steps2, warmup, checkpoint_every;
    int batch1, batch2; /* sequences per step */
    float lr1, lr2, min_lr_ratio, weight_decay, clip;
    uint64_t seed;
    int resume, prepare_only;
} train_opts;

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: specd train speculator [options]\n"
            "       specd train accept-head [options]   (specd train accept-head --help)\n"
            "\n"
            "Trains an MLP speculator for a frozen target in two stages (ground-truth text,\n"
            "then the target's own greedy continuations of prompts) and writes it in the\n"
            "MLPSpeculator format draft-svc loads.\n"
            "\n"
            "  -m, --model PATH        target model (default %s)\n"
            "  --data FILE             training text, plain or JSONL {\"text\"} (repeatable;\n"
            "                          default data/train/corpus.jsonl)\n"
            "  --prompts FILE          stage-2 prompts, JSONL {\"prompt\"} (default\n"
            "                          data/train/prompts.jsonl)\n"
            "  -o, --out DIR           output directory (default %s)\n"
            "  --cache DIR             encoded-data caches (default OUT/cache)\n"
            "  -t, --threads N         CPU threads (default: all cores)\n"
            "model:\n"
            "  --heads N               stages / tokens drafted per path (default 4)\n"
            "  --inner N               speculator state width (default 512)\n"
            "  --draft-vocab N         most frequent tokens the heads predict, plus one\n"
            "                          'other' bucket (default 8192; 0 = the full vocabulary)\n"
            "  --untied                one emb/head/ln per stage (default: tied)\n"
            "  --dtype f16|bf16|f32    exported weights (default f16)\n"
            "data:\n"
            "  --stage1-tokens N       tokens of text to encode (default 524288)\n"
            "  --seq-len N             stage-1 sequence length (default 256)\n"
            "  --encode-batch N        stage-1 windows per target forward (default 2)\n"
            "  --stage2-prompts N      first N prompts to continue (default 1536; the rest\n"
            "                          are left for `specd train accept-head --skip 1536`)\n"
            "  --gen-len N             tokens generated per prompt (default 256)\n"
            "  --gen-parallel N        sequences decoded side by side (default 32)\n"
            "  --stage2-sampled-frac F fraction of the prompts continued sampled (for the\n"
            "                          sampling mode); the rest greedy, as the server decodes\n"
            "                          by default (default 0: all greedy)\n"
            "  --temperature T, --top-k K  the sampled fraction's sampling (default 0.7, 50)\n"
            "  --shard-seqs N          sequences per cache shard, OUT/cache/stageK-NNNNN;\n"
            "                          an interrupted run continues from the last complete\n"
            "                          shard (default 64)\n"
            "optimization:\n"
            "  --steps1 N, --steps2 N  steps per stage (default 500, 240)\n"
            "  --batch1 N, --batch2 N  sequences per step (default 8, 16)\n"
            "  --lr1 X, --lr2 X        peak learning rates (default 1e-3, 3e-4)\n"
            "  --warmup N              warm-up steps of each stage (default 30)\n"
            "  --min-lr-ratio X        cosine floor as a fraction of the peak (default 0.1)\n"
            "  --weight-decay X        AdamW decay of matrices (default 0.01)\n"
            "  --clip X                global gradient-norm clip (default 1.0)\n"
            "  --seed N                (default 42)\n"
            "  --checkpoint-every N    steps (default 100)\n"
            "  --resume                continue from OUT/train_state.safetensors\n"
            "  --init DIR              start from the exported checkpoint DIR (its weights and\n"
            "                          draft vocabulary; same --heads, --inner, tying) instead\n"
            "                          of random weights: a fine-tune. With --steps1 0 no\n"
            "                          stage-1 text is encoded\n"
            "  --prepare-only          build the data caches and stop\n"
            "  --eval DIR              no training: the held-out loss and top-1 per head of\n"
            "                          the exported checkpoint DIR (same --heads, --inner,\n"
            "                          tying) on this recipe's held-out rows of both stages\n",
            SPECD_DEFAULT_MODEL, SPECD_DEFAULT_SPECULATOR);
}

static void opts_default(train_opts *o) {
    memset(o, 0, sizeof(*o));
    o->model = SPECD_DEFAULT_MODEL;
    o->out = SPECD_DEFAULT_SPECULATOR;
    o->prompts = "data/train/prompts.jsonl";
    o->dtype = "F16";
    o->heads = 4;
    o->inner = 512;
    o->draft_vocab = 8192;
    o->tied = 1;
    o->stage1_tokens = 524288;
    o->seq_len = 256;
    o->encode_batch = 2;
    o->stage2_prompts = 1536;
    o->gen_len = 256;
    o->gen_parallel = 32;
    o->shard_seqs = 64;
    o->sampled_frac = 0;
    o->top_k = 50;
    o->temperature = 0.7f;
    o->steps1 = 500;
    o->steps2 = 240;
    o->warmup = 30;
    o->checkpoint_every = 100;
    o->batch1 = 8;
    o->batch2 = 16;
    o->lr1 = 1e-3f;
    o->lr2 = 3e-4f;
    o->min_lr_ratio = 0.1f;
    o->weight_decay = 0.01f;
    o->clip = 1.0f;
    o->seed = 42;
}

static void parse_opts(int argc, char **argv, train_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            train_usage(stdout);
            exit(0);
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--data")) {
            if (o->n_data == MAX_DATA_FILES) {
                fprintf(stderr, "specd train: at most %d --data files\n", MAX_DATA_FILES);
                exit(2);
            }
            o->data[o->n_data++] = cli_value(argc, argv, &i);
        } else if (!strcmp(a, "--prompts")) o->prompts = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) o->out = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--cache")) o->cache = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            o->threads = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--heads"))
            o->heads = (int)cli_int(a, cli_value(argc, argv, &i), 1, SPECD_MLP_SPEC_MAX_PREDICT);
        else if (!strcmp(a, "--inner")) o->inner = (int)cli_int(a, cli_value(argc, argv, &i), 8, 16384);
        else if (!strcmp(a, "--draft-vocab"))
            o->draft_vocab = (int)cli_int(a, cli_value(argc, argv, &i), 0, SPECD_MLP_SPEC_MAX_VOCAB);
        else if (!strcmp(a, "--untied")) o->tied = 0;
        else if (!strcmp(a, "--dtype")) {
            const char *d = cli_value(argc, argv, &i);
            if (!strcasecmp(d, "f16")) o->dtype = "F16";
            else if (!strcasecmp(d, "bf16")) o->dtype = "BF16";
            else if (!strcasecmp(d, "f32")) o->dtype = "F32";
            else {
                fprintf(stderr, "specd train: --dtype must be f16, bf16 or f32, got '%s'\n", d);
                exit(2);
            }
        } else if (!strcmp(a, "--stage1-tokens"))
            o->stage1_tokens = cli_int(a, cli_value(argc, argv, &i), 1, 1L << 34);
        else if (!strcmp(a, "--seq-len")) o->seq_len = (int)cli_int(a, cli_value(argc, argv, &i), 8, 8192);
        else if (!strcmp(a, "--stage2-prompts"))
            o->stage2_prompts = cli_int(a, cli_value(argc, argv, &i), 0, 1L << 30);
        else if (!strcmp(a, "--gen-len")) o->gen_len = (int)cli_int(a, cli_value(argc, argv, &i), 4, 8192);
        else if (!strcmp(a, "--gen-parallel"))
            o->gen_parallel = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--encode-batch"))
            o->encode_batch = (int)cli_int(a, cli_value(argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--shard-seqs"))
            o->shard_seqs = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--stage2-sampled-frac"))
            o->sampled_frac = (float)cli_float(a, cli_value(argc, argv, &i), 0, 1);
        else if (!strcmp(a, "--temperature"))
            o->temperature = (float)cli_float(a, cli_value(argc, argv, &i), 0, 10);
        else if (!strcmp(a, "--top-k")) o->top_k = (int)cli_int(a, cli_value(argc, argv, &i), 0, 1 << 20);
        else if (!strcmp(a, "--steps1")) o->steps1 = cli_int(a, cli_value(argc, argv, &i), 0, 1L << 30);
        else if (!strcmp(a, "--steps2")) o->steps2 = cli_int(a, cli_value(argc, argv, &i), 0, 1L << 30);
        else if (!strcmp(a, "--batch1")) o->batch1 = (int)cli_int(a, cli_value(argc, argv, &i), 1, 4096);
        else if (!strcmp(a, "--batch2")) o->batch2 = (int)cli_int(a, cli_value(argc, argv, &i), 1, 4096);
        else if (!strcmp(a, "--lr1")) o->lr1 = (float)cli_float(a, cli_value(argc, argv, &i), 0, 1);
        else if (!strcmp(a, "--lr2")) o->lr2 = (float)cli_float(a, cli_value(argc, argv, &i), 0, 1);
        else if (!strcmp(a, "--warmup")) o->warmup = cli_int(a, cli_value(argc, argv, &i), 0, 1L << 30);
        else if (!strcmp(a, "--min-lr-ratio"))
            o->min_lr_ratio = (float)cli_float(a, cli_value(argc, argv, &i), 0, 1);
        else if (!strcmp(a, "--weight-decay"))
            o->weight_decay = (float)cli_float(a, cli_value(argc, argv, &i), 0, 10);
        else if (!strcmp(a, "--clip")) o->clip = (float)cli_float(a, cli_value(argc, argv, &i), 0, 1e6);
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)cli_int(a, cli_value(argc, argv, &i), 0, 1L << 62);
        else if (!strcmp(a, "--checkpoint-every"))
            o->checkpoint_every = cli_int(a, cli_value(argc, argv, &i), 1, 1L << 30);
        else if (!strcmp(a, "--resume")) o->resume = 1;
        else if (!strcmp(a, "--prepare-only")) o->prepare_only = 1;
        else if (!strcmp(a, "--eval")) o->eval_dir = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--init")) o->init_dir = cli_value(argc, argv, &i);
        else {
            fprintf(stderr, "specd train speculator: unknown option '%s'\n", a);
            train_usage(stderr);
            exit(2);
        }
    }
    if (o->n_data == 0) o->data[o->n_data++] = "data/train/corpus.jsonl";
}

/* ---- progress ---------------------------------------------------------------- */

static void fmt_eta(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e7) snprintf(buf, n, "?");
    else if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

typedef struct progress_ctx {
    const char *what;
    double t0, last;
} progress_ctx;

/* Data preparation: one line, rewritten in place on a terminal, every few
 * seconds otherwise. */
static void data_progress(void *vctx, long done, long total) {
    progress_ctx *p = vctx;
    double now = cli_now();
    int tty = isatty(2);
    if (done < total && now - p->last < (tty ? 0.5 : 15)) return;
    p->last = now;
    double rate = done / (now - p->t0 + 1e-9);
    char eta[32];
    fmt_eta((total - done) / (rate + 1e-9), eta, sizeof(eta));
    fprintf(stderr, "%s%s %ld/%ld (%.0f/s, ETA %s)%s", tty ? "\r" : "", p->what, done, total, rate,
            eta, tty && done < total ? "" : "\n");
}

static void bar(char *buf, int width, double frac) {
    int full = (int)(frac * width + 0.5);
    for (int i = 0; i < width; i++) buf[i] = i < full ? '#' : '.';
    buf[width] = 0;
}

/* ---- data ---------------------------------------------------------------------- */

static int mkdir_p(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Data preparation state shared by the shard builders: the target's
 * transformer is made on the first shard that has to be built and kept for
 * the next ones. */
typedef struct data_ctx {
    const train_opts *o;
    specd_model_file *m;
    const specd_tokenizer *tok;
    specd_transformer *t;
    const int32_t *stream; /* stage 1 */
    const corpus *prompts; /* stage 2 */
    progress_ctx p;
    long done, total;      /* work over every shard, for the progress line */
    long gen_tokens;       /* stage 2: tokens kept */
} data_ctx;

static void shard_progress(void *vctx, long done, long total) {
    (void)done, (void)total;
    data_ctx *d = vctx;
    data_progress(&d->p, d->done, d->total);
}

static int build_stage1_shard(void *vctx, long first, int count, spec_seqs *out, specd_error *err) {
    data_ctx *d = vctx;
    const train_opts *o = d->o;
    if (!d->t) {
        specd_transformer_opts to = {.backend = {.name = "cpu", .n_threads = o->threads},
                                     .n_slots = o->encode_batch, .max_ctx = o->seq_len,
                                     .max_batch = o->encode_batch * o->seq_len};
        if (!(d->t = specd_transformer_create(d->m, &to, err))) return -1;
    }
    int rc = spec_data_encode_windows(d->t, d->stream, o->seq_len, o->encode_batch, first, count,
                                      out, NULL, NULL, err);
    d->done += (long)count * o->seq_len;
    shard_progress(d, 0, 0);
    return rc;
}

static int build_stage2_shard(void *vctx, long first, int count, spec_seqs *out, specd_error *err) {
    data_ctx *d = vctx;
    const train_opts *o = d->o;
    int max_prompt = 384;
    if (!d->t) {
        specd_transformer_opts to = {
            .backend = {.name = "cpu", .n_threads = o->threads}, .n_slots = o->gen_parallel,
            .max_ctx = max_prompt + o->gen_len + 1,
            .max_batch = max_prompt > o->gen_parallel ? max_prompt : o->gen_parallel};
        if (!(d->t = specd_transformer_create(d->m, &to, err))) return -1;
    }
    spec_gen_opts g = {.gen_len = o->gen_len, .max_prompt = max_prompt,
                       .n_parallel = o->gen_parallel, .sampled_frac = o->sampled_frac,
                       .temperature = o->temperature, .top_k = o->top_k, .seed = o->seed,
                       .first_prompt = first, .max_prompts = count};
    int rc = spec_data_generate(d->t, d->tok, d->prompts, &g, out, NULL, NULL, err);
    if (rc == 0)
        for (int r = 0; r < out->n_seqs; r++) d->gen_tokens += out->len[r];
    d->done += count;
    shard_progress(d, 0, 0);
    return rc;
}

static void data_ctx_end(data_ctx *d) {
    specd_transformer_free(d->t);
    d->t = NULL;
}

static int prepare_stage1(const train_opts *o, specd_model_file *m, const specd_tokenizer *tok,
                          const char *dir, spec_seqs *out, specd_error *err) {
    corpus c = {0};
    int32_t *stream = NULL;
    long n_stream = 0;
    double t0 = cli_now();
    for (int i = 0; i < o->n_data; i++)
        if (corpus_read_file(&c, o->data[i], err) != 0) {
            corpus_free(&c);
            return -1;
        }
    int rc = spec_data_text_stream(tok, &c, o->stage1_tokens, &stream, &n_stream, err);
    corpus_free(&c);
    if (rc != 0) return -1;
    long n_windows = n_stream / o->seq_len;
    fprintf(stderr, "stage 1: %ld tokens of text (tokenized in %.1f s), %ld windows of %d\n",
            n_stream, cli_now() - t0, n_windows, o->seq_len);
    if (n_windows < 1) {
        free(stream);
        return specd_seterr(err, "the text has %ld tokens, fewer than one window of %d", n_stream,
                            o->seq_len);
    }
    char meta[1024];
    snprintf(meta, sizeof meta, "stage1 model=%s precision=fast seq_len=%d data=%s%s", o->model,
             o->seq_len, o->data[0], o->n_data > 1 ? "+more" : "");
    data_ctx d = {.o = o, .m = m, .tok = tok, .stream = stream,
                  .p = {.what = "stage 1: encoding text, tokens", .t0 = cli_now()},
                  .total = n_windows * o->seq_len};
    int built = 0;
    rc = spec_data_sharded(dir, "stage1", meta, n_windows, o->shard_seqs, build_stage1_shard, &d,
                           out, &built, stderr, err);
    if (rc == 0 && built)
        fprintf(stderr, "stage 1: built %d shards in %.1f s\n", built, cli_now() - d.p.t0);
    data_ctx_end(&d);
    free(stream);
    return rc;
}

static int prepare_stage2(const train_opts *o, specd_model_file *m, const specd_tokenizer *tok,
                          const char *dir, spec_seqs *out, specd_error *err) {
    corpus c = {0};
    if (corpus_read_file(&c, o->prompts, err) != 0) {
        corpus_free(&c);
        return -1;
    }
    long n = (long)c.n_docs;
    if (o->stage2_prompts < n) n = o->stage2_prompts;
    char meta[1024];
    snprintf(meta, sizeof meta,
             "stage2 model=%s precision=fast prompts=%s gen_len=%d max_prompt=384 sampled_frac=%g "
             "T=%g top_k=%d seed=%llu",
             o->model, o->prompts, o->gen_len, o->sampled_frac, o->temperature, o->top_k,
             (unsigned long long)o->seed);
    data_ctx d = {.o = o, .m = m, .tok = tok, .prompts = &c,
                  .p = {.what = "stage 2: generating, prompts", .t0 = cli_now()}, .total = n};
    int built = 0;
    int rc = spec_data_sharded(dir, "stage2", meta, n, o->shard_seqs, build_stage2_shard, &d, out,
                               &built, stderr, err);
    if (rc == 0 && built)
        fprintf(stderr, "stage 2: built %d shards (%ld tokens) in %.1f s\n", built, d.gen_tokens,
                cli_now() - d.p.t0);
    data_ctx_end(&d);
    corpus_free(&c);
    return rc;
}

/* The draft vocabulary: the n-1 most frequent target tokens of the training
 * data (ties to the lower id), in frequency order, then the 'other' bucket.
 * qsort has no context argument, hence the file-level pointer. */
static const long *vocab_sort_count;
static int by_count_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    long cx = vocab_sort_count[x], cy = vocab_sort_count[y];
    if (cx != cy) return cx > cy ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int32_t *build_vocab_map(const spec_seqs *sets, int n_sets, int target_vocab, int n,
                                double *coverage, specd_error *err) {
    long *count = calloc((size_t)target_vocab, sizeof(long));
    int32_t *order = malloc(sizeof(int32_t) * target_vocab);
    int32_t *map = malloc(sizeof(int32_t) * n);
    if (!count || !order || !map) {
        free(count), free(order), free(map);
        specd_seterr(err, "out of memory");
        return NULL;
    }
    long total = 0, kept = 0;
    for (int s = 0; s < n_sets; s++)
        for (int r = 0; r < sets[s].n_seqs; r++)
            for (int j = 0; j < sets[s].len[r]; j++) {
                int32_t tkn = sets[s].tokens[(size_t)r * sets[s].seq_len + j];
                if (tkn >= 0 && tkn < target_vocab) count[tkn]++, total++;
            }
    for (int i = 0; i < target_vocab; i++) order[i] = i;
    vocab_sort_count = count;
    qsort(order, (size_t)target_vocab, sizeof(int32_t), by_count_desc);
    for (int i = 0; i < n - 1; i++) map[i] = order[i], kept += count[order[i]];
    map[n - 1] = -1;
    *coverage = total ? (double)kept / total : 0;
    free(count);
    free(order);
    return map;
}

/* ---- the training loop ----------------------------------------------------------- */

/* A stage's sequences, split into training rows and the held-out tail. */
typedef struct stage_data {
    const spec_seqs *seqs;
    int n_train, n_val; /* rows [0, n_train) train, [n_train, n_seqs) validate */
    int batch;          /* sequences per step */
} stage_data;

static void split(stage_data *sd, const spec_seqs *s, int batch) {
    sd->seqs = s;
    sd->batch = batch;
    sd->n_val = s->n_seqs / 50; /* 2% */
    if (sd->n_val < 1 && s->n_seqs > 1) sd->n_val = 1;
    if (sd->n_val > 16) sd->n_val = 16;
    sd->n_train = s->n_seqs - sd->n_val;
}

typedef struct batch_buf {
    float *hidden;
    int32_t *tokens;
    int cap;
} batch_buf;

/* Appends every usable position of row r (see spec_data.h) to the batch. */
static void add_row(const spec_model *m, const spec_seqs *s, int r, batch_buf *bb, int *n) {
    int H = m->cfg.n_predict, L = s->seq_len, dim = s->dim;
    for (int j = 0; j + H + 1 < s->len[r] && *n < bb->cap; j++) {
        const uint16_t *h = s->hidden + ((size_t)r * L + j) * dim;
        float *dst = bb->hidden + (size_t)*n * dim;
        for (int k = 0; k < dim; k++) dst[k] = specd_fp16_to_f32(h[k]);
        for (int i = 0; i <= H; i++)
            bb->tokens[(size_t)*n * (H + 1) + i] =
                spec_model_draft_id(m, s->tokens[(size_t)r * L + j + 1 + i]);
        (*n)++;
    }
}

/* The step's batch: `batch` rows drawn uniformly with replacement, the
 * draws addressed by (seed, step) so a resumed run sees the same ones. */
static int make_batch(const spec_model *m, const stage_data *sd, uint64_t seed, long step,
                      batch_buf *bb) {
    int n = 0;
    for (int b = 0; b < sd->batch; b++) {
        double u = specd_rng_uniform(seed, (uint64_t)step, (uint64_t)b);
        int r = (int)(u * sd->n_train);
        if (r >= sd->n_train) r = sd->n_train - 1;
        add_row(m, sd->seqs, r, bb, &n);
    }
    return n;
}

static double validate(const spec_model *m, spec_work *w, const stage_data *sd, batch_buf *bb,
                       float *stage_acc) {
    int n = 0;
    for (int r = sd->n_train; r < sd->seqs->n_seqs; r++) add_row(m, sd->seqs, r, bb, &n);
    if (n == 0) return NAN;
    spec_batch b = {.n = n, .hidden = bb->hidden, .tokens = bb->tokens};
    return spec_model_step(m, w, &b, NULL, NULL, stage_acc);
}

static int save_all(const spec_model *m, const float *am, const float *av, const train_opts *o,
                    long step, specd_error *err) {
    if (spec_model_export(m, o->out, o->dtype, err) != 0) return -1;
    char meta[256], path[4096];
    snprintf(meta, sizeof(meta), "{\"step\": %ld, \"steps1\": %ld, \"steps2\": %ld, \"seed\": %llu}",
             step, o->steps1, o->steps2, (unsigned long long)o->seed);
    snprintf(path, sizeof(path), "%s/train_state.safetensors", o->out);
    return spec_model_save_state(m, am, av, meta, path, err);
}

static long meta_step(const char *meta) {
    const char *p = meta ? strstr(meta, "\"step\":") : NULL;
    return p ? strtol(p + 7, NULL, 10) : -1;
}

static int train_speculator(int argc, char **argv) {
    train_opts o;
    opts_default(&o);
    parse_opts(argc, argv, &o);
    specd_error err = {0};
    int rc = 1;
    char cache_dir[2048];
    snprintf(cache_dir, sizeof(cache_dir), "%s", o.cache ? o.cache : "");
    if (!o.cache) snprintf(cache_dir, sizeof(cache_dir), "%s/cache", o.out);
    if (mkdir_p(o.out) != 0 || mkdir_p(cache_dir) != 0) {
        fprintf(stderr, "specd train: cannot create %s: %s\n", cache_dir, strerror(errno));
        return 1;
    }

    specd_model_file *model = specd_model_open(o.model, &err);
    specd_tokenizer *tok = model ? specd_tokenizer_from_model(model, &err) : NULL;
    spec_seqs s1 = {0}, s2 = {0};
    spec_model m = {0};
    spec_work *work = NULL;
    float *grads = NULL, *am = NULL, *av = NULL;
    batch_buf bb = {0};
    if (!tok) goto fail;

    /* Shards made the same way are reused; others are rebuilt. */
    double tdata = cli_now();
    /* A run with no stage-1 steps (a fine-tune from --init) needs no text,
     * except --eval, which reports both stages. */
    int want_stage1 = o.steps1 > 0 || o.eval_dir;
    if (want_stage1) {
        if (prepare_stage1(&o, model, tok, cache_dir, &s1, &err) != 0) goto fail;
        fprintf(stderr, "stage 1 data ready: %d sequences, %ld examples (%.1f s)\n", s1.n_seqs,
                spec_seqs_n_examples(&s1, o.heads), cli_now() - tdata);
    }
    if (o.steps2 > 0 && o.stage2_prompts > 0) {
        double t2 = cli_now();
        if (prepare_stage2(&o, model, tok, cache_dir, &s2, &err) != 0) goto fail;
        long n_tok = 0;
        for (int r = 0; r < s2.n_seqs; r++) n_tok += s2.len[r];
        fprintf(stderr, "stage 2 data ready: %d sequences, %ld tokens, %ld examples (%.1f s)\n",
                s2.n_seqs, n_tok, spec_seqs_n_examples(&s2, o.heads), cli_now() - t2);
    }
    if (o.prepare_only) {
        rc = 0;
        goto done;
    }

    const specd_llama_hparams *hp = &model->hp;
    specd_mlp_spec_config cfg = {.vocab_size = o.draft_vocab ? o.draft_vocab : hp->vocab_size,
                                 .emb_dim = hp->dim, .inner_dim = o.inner, .n_predict = o.heads,
                                 .n_candidates = 5, .tie_weights = o.tied, .scale_input = 1};
    for (int i = 0; i < o.heads; i++) cfg.top_k[i] = i < 3 ? 5 - i : 2;
    int32_t *vocab_map = NULL;
    const char *from_dir = o.eval_dir ? o.eval_dir : o.init_dir; /* weights to load */
    if (from_dir) {
        int n_map = 0;
        if (spec_model_read_vocab_map(from_dir, &vocab_map, &n_map, &err) != 0) goto fail;
        cfg.vocab_size = vocab_map ? n_map : hp->vocab_size;
    } else if (o.draft_vocab && o.draft_vocab < hp->vocab_size) {
        spec_seqs sets[2] = {s1, s2};
        double coverage = 0;
        vocab_map = build_vocab_map(sets, s2.n_seqs ? 2 : 1, hp->vocab_size, o.draft_vocab,
                                    &coverage, &err);
        if (!vocab_map) goto fail;
        fprintf(stderr, "draft vocabulary: %d tokens cover %.2f%% of the training tokens\n",
                o.draft_vocab - 1, 100 * coverage);
    } else {
        cfg.vocab_size = hp->vocab_size;
    }
    int irc = spec_model_init(&m, &cfg, hp->vocab_size, vocab_map, o.seed, &err);
    free(vocab_map);
    if (irc != 0) goto fail;
    if (from_dir && spec_model_load_export(&m, from_dir, &err) != 0) goto fail;
    if (o.init_dir) fprintf(stderr, "starting from %s\n", o.init_dir);

    stage_data st1, st2;
    if (s1.n_seqs) split(&st1, &s1, o.batch1);
    else memset(&st1, 0, sizeof(st1));
    if (s2.n_seqs) split(&st2, &s2, o.batch2);
    else memset(&st2, 0, sizeof(st2));
    long steps1 = st1.n_train > 0 ? o.steps1 : 0, steps2 = st2.n_train > 0 ? o.steps2 : 0;
    long total = steps1 + steps2;
    bb.cap = o.batch1 * s1.seq_len;
    if (s2.n_seqs && o.batch2 * s2.seq_len > bb.cap) bb.cap = o.batch2 * s2.seq_len;
    if (16 * s1.seq_len > bb.cap) bb.cap = 16 * s1.seq_len; /* validation rows */
    if (s2.n_seqs && 16 * s2.seq_len > bb.cap) bb.cap = 16 * s2.seq_len;
    bb.hidden = malloc(sizeof(float) * (size_t)bb.cap * hp->dim);
    bb.tokens = malloc(sizeof(int32_t) * (size_t)bb.cap * (o.heads + 1));
    grads = malloc(sizeof(float) * m.n_params);
    am = calloc(m.n_params, sizeof(float));
    av = calloc(m.n_params, sizeof(float));
    work = spec_work_create(&m, bb.cap);
    if (!bb.hidden || !bb.tokens || !grads || !am || !av || !work) {
        specd_seterr(&err, "out of memory");
        goto fail;
    }

    if (o.eval_dir) {
        const stage_data *sds[2] = {&st1, &st2};
        for (int k = 0; k < 2; k++) {
            if (!sds[k]->seqs || sds[k]->n_val < 1) continue;
            float acc[SPECD_MLP_SPEC_MAX_PREDICT];
            double vl = validate(&m, work, sds[k], &bb, acc);
            fprintf(stderr, "%s: held-out stage-%d loss %.3f (%d rows), top-1 per head", o.eval_dir,
                    k + 1, vl, sds[k]->n_val);
            for (int i = 0; i < o.heads; i++) fprintf(stderr, " %.1f%%", 100 * acc[i]);
            fprintf(stderr, "\n");
        }
        rc = 0;
        goto done;
    }

    long start = 0;
    char state_path[4096];
    snprintf(state_path, sizeof(state_path), "%s/train_state.safetensors", o.out);
    if (o.resume && access(state_path, R_OK) == 0) {
        char *meta = NULL;
        if (spec_model_load_state(&m, am, av, &meta, state_path, &err) != 0) goto fail;
        start = meta_step(meta);
        free(meta);
        if (start < 0 || start > total) {
            specd_seterr(&err, "%s: bad step in its metadata", state_path);
            goto fail;
        }
        fprintf(stderr, "resuming at step %ld of %ld\n", start, total);
    }
    fprintf(stderr,
            "speculator: %d heads, inner %d, draft vocab %d, %s, %.2fM parameters; "
            "stage 1 %ld steps x %d seqs of %d, stage 2 %ld steps x %d seqs of %d\n",
            o.heads, o.inner, cfg.vocab_size, o.tied ? "tied" : "untied", m.n_params / 1e6, steps1,
            o.batch1, s1.seq_len, steps2, o.batch2, s2.seq_len);

    nn_adamw opt = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
    float stage_loss[SPECD_MLP_SPEC_MAX_PREDICT], stage_acc[SPECD_MLP_SPEC_MAX_PREDICT];
    double t0 = cli_now(), tlast = 0;
    long tokens_done = 0;
    int tty = isatty(2);
    for (long step = start; step < total; step++) {
        int stage = step < steps1 ? 1 : 2;
        long local = stage == 1 ? step : step - steps1, n_local = stage == 1 ? steps1 : steps2;
        const stage_data *sd = stage == 1 ? &st1 : &st2;
        float lr = nn_lr_at(local, o.warmup, n_local, stage == 1 ? o.lr1 : o.lr2, o.min_lr_ratio);
        int n = make_batch(&m, sd, o.seed, step, &bb);
        memset(grads, 0, sizeof(float) * m.n_params);
        spec_batch b = {.n = n, .hidden = bb.hidden, .tokens = bb.tokens};
        double loss = spec_model_step(&m, work, &b, grads, stage_loss, stage_acc);
        double gnorm = sqrt(nn_sumsq(grads, m.n_params));
        if (o.clip > 0 && gnorm > o.clip) {
            float sc = (float)(o.clip / gnorm);
            for (size_t i = 0; i < m.n_params; i++) grads[i] *= sc;
        }
        for (int ti = 0; ti < m.n_tensors; ti++) {
            const struct spec_tensor *te = &m.tensors[ti];
            size_t off = (size_t)(te->data - m.params);
            nn_adamw_update(&opt, step + 1, lr, te->decay ? o.weight_decay : 0, te->data,
                            grads + off, am + off, av + off, te->numel);
        }
        tokens_done += n;
        double now = cli_now();
        int last = step + 1 == total;
        if (now - tlast >= (tty ? 0.5 : 20) || last) {
            tlast = now;
            double rate = tokens_done / (now - t0 + 1e-9);
            double eta_s = (total - step - 1) * (now - t0) / (step + 1 - start);
            char eta[32], bars[32], heads[160] = "";
            fmt_eta(eta_s, eta, sizeof(eta));
            bar(bars, 20, (double)(step + 1) / total);
            for (int i = 0, k = 0; i < o.heads && k < (int)sizeof(heads) - 16; i++)
                k += snprintf(heads + k, sizeof(heads) - k, " %.2f/%.0f%%", stage_loss[i],
                              100 * stage_acc[i]);
            fprintf(stderr, "%s[%s] stage %d step %ld/%ld loss %.3f heads(ce/acc)%s |g| %.2f lr %.2e %.0f tok/s ETA %s%s",
                    tty ? "\r" : "", bars, stage, step + 1, total, loss, heads, gnorm, lr, rate,
                    eta, tty && !last ? "\033[K" : "\n");
        }
        int boundary = step + 1 == steps1 || last || (step + 1) % o.checkpoint_every == 0;
        if (boundary) {
            float acc[SPECD_MLP_SPEC_MAX_PREDICT];
            double vl = validate(&m, work, sd, &bb, acc);
            if (tty) fprintf(stderr, "\n");
            fprintf(stderr, "checkpoint step %ld: held-out stage-%d loss %.3f, top-1 per head", step + 1,
                    stage, vl);
            for (int i = 0; i < o.heads; i++) fprintf(stderr, " %.1f%%", 100 * acc[i]);
            fprintf(stderr, "\n");
            if (save_all(&m, am, av, &o, step + 1, &err) != 0) goto fail;
        }
    }
    fprintf(stderr, "trained %ld steps in %.1f s; speculator written to %s\n", total - start,
            cli_now() - t0, o.out);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "specd train speculator: %s\n", err.msg);
done:
    spec_work_free(work);
    free(grads), free(am), free(av), free(bb.hidden), free(bb.tokens);
    spec_model_free(&m);
    spec_seqs_free(&s1);
    spec_seqs_free(&s2);
    specd_tokenizer_free(tok);
    if (model) specd_model_close(model);
    return rc;
}

/* OpenBLAS chooses its kernels from the CPU model when it loads. On a CPU
 * its table does not know (newer Xeons, VMs that hide the model) it falls
 * back to the SSE3 "Prescott" kernels, about 3x slower than its AVX-512 ones
 * on the development VM. OPENBLAS_CORETYPE overrides the choice, but it is
 * read only at load time; so if the fallback was taken on a CPU with
 * AVX-512 or AVX2, set it and run this command again, once. A user's own
 * OPENBLAS_CORETYPE is left alone. */
static void ensure_fast_blas(char **argv_from_program) {
    const char *core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") || !core || (strcasecmp(core, "prescott") &&
                                                 strcasecmp(core, "core2") && strcasecmp(core, "nehalem")))
        return;
    const specd_cpu_features *cpu = specd_cpu_features_get();
    const char *want = cpu->avx512 ? "SkylakeX" : cpu->avx2 ? "Haswell" : NULL;
    if (!want) return;
    fprintf(stderr, "specd train: OpenBLAS chose its %s kernels; running again with "
                    "OPENBLAS_CORETYPE=%s\n", core, want);
    setenv("OPENBLAS_CORETYPE", want, 1);
    execv("/proc/self/exe", argv_from_program);
    /* exec failed: go on with the slow kernels */
}

int cmd_train(int argc, char **argv) {
    /* argv[-1] is the program name: main passed argv + 1. */
    ensure_fast_blas(argv - 1);
    if (argc >= 2 && !strcmp(argv[1], "speculator")) return train_speculator(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "accept-head"))
        return cmd_train_accept_head(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        train_usage(stdout);
        return 0;
    }
    train_usage(stderr);
    return 2;
}
