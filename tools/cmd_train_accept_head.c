/* cmd_train_accept_head.c - `specd train accept-head`: trains the SpecDec++
 * acceptance head (draft-svc/accept_head.h) for a trained MLP speculator and
 * its frozen target.
 *
 *   1. examples: the target runs over the data (its own continuations of
 *      the prompts, or text windows), the speculator drafts at every
 *      position as in serving, and each stage's state is labeled with the
 *      target's verdict (tools/train/accept_data.h);
 *   2. training: weighted BCE, AdamW, warm-up + cosine, clipping, fixed
 *      seed, on 90% of the examples (tools/train/accept_train.h);
 *   3. the head is written (default SPECULATOR/accept_head, where draft-svc
 *      tools look for it), read back and scored on the held-out 10%: BCE,
 *      accuracy, and calibration (mean predicted vs actual acceptance per
 *      stage), beside the BCE of a constant guess for scale.
 *
 * --temperature decides what the head is for: 0 trains it on greedy
 * verification (0/1 labels), T > 0 on sampling at T (soft labels
 * min(1, p/q)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli.h"
#include "common/model/model_file.h"
#include "common/text/tokenizer.h"
#include "common/model/accept_head.h"
#include "common/model/mlp_speculator.h"
#include "common/model/transformer.h"
#include "tools/train/accept_data.h"
#include "tools/train/accept_train.h"
#include "tools/train/corpus.h"

#define MAX_DATA_FILES 16

typedef struct head_opts {
    const char *model, *speculator, *out, *dtype;
    const char *eval_head; /* --eval-head: score this head, train nothing */
    const char *data[MAX_DATA_FILES];
    int n_data;
    int threads, lanes, max_prompt, gen_len, seq_len;
    long max_examples;
    long skip; /* leading documents of the data left out */
    float temperature;
    int hidden, layers;
    int draft_features; /* the head also reads the draft's probabilities */
    accept_train_opts train;
    int w_rej_auto;
} head_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: specd train accept-head [options]\n"
            "\n"
            "Trains the SpecDec++ acceptance head of an MLP speculator: a small network on\n"
            "the speculator's state that predicts whether the target accepts each drafted\n"
            "token, so draft-svc can stop a path once it stops paying\n"
            "(speculation.adaptive, drafter.mlp.accept_head).\n"
            "\n"
            "  -m, --model PATH      target model (default %s)\n"
            "  --speculator DIR      the trained MLPSpeculator (default %s)\n"
            "  --data FILE           JSONL {\"prompt\"}: the target continues it (exact labels);\n"
            "                        {\"text\"} or plain text: windows of it (repeatable;\n"
            "                        default data/train/prompts.jsonl)\n"
            "  -o, --out DIR         output (default SPECULATOR/accept_head)\n"
            "  --eval-head DIR       train nothing: score that head on every example made\n"
            "                        (BCE, calibration, and how well it ranks accepted tokens\n"
            "                        above rejected ones against the draft's own probability)\n"
            "  -t, --threads N       CPU threads (default: all cores)\n"
            "examples:\n"
            "  --temperature T       0: greedy verification, 0/1 labels (default); T > 0:\n"
            "                        sampling at T, soft labels min(1, p/q)\n"
            "  --gen-len N           tokens the target generates per prompt (default 128)\n"
            "  --max-prompt N        prompts are cut to their last N tokens (default 512)\n"
            "  --seq-len N           text window length (default 256)\n"
            "  --lanes N             sequences run side by side (default 16)\n"
            "  --max-examples N      stop collecting after N (default 200000)\n"
            "  --skip N              leave out the first N documents (e.g. the prompts the\n"
            "                        speculator was trained on, so the head learns the\n"
            "                        acceptance of unseen text; default 0)\n"
            "model:\n"
            "  --hidden N            hidden width (default 256)\n"
            "  --layers N            residual SiLU blocks (default 2)\n"
            "  --no-draft-features   the state alone: without the draft's two largest\n"
            "                        probabilities beside it (accept_head.h; they rank\n"
            "                        accepted drafts better than the state alone)\n"
            "  --dtype f16|bf16|f32  stored weights (default f32: the head is small)\n"
            "optimization:\n"
            "  --steps N             (default 2000)\n"
            "  --batch N             examples per step (default 512)\n"
            "  --lr X                peak learning rate (default 1e-3)\n"
            "  --warmup N            warm-up steps (default 100)\n"
            "  --min-lr-ratio X      cosine floor as a fraction of the peak (default 0.1)\n"
            "  --weight-decay X      AdamW decay of matrices (default 0.01)\n"
            "  --clip X              global gradient-norm clip (default 1.0)\n"
            "  --w-rej W|auto        weight of the rejection term of the BCE (default 1: p stays\n"
            "                        a calibrated probability); > 1 stops paths earlier at a\n"
            "                        given threshold, as the paper does; auto balances the\n"
            "                        classes (accepted / rejected mass)\n"
            "  --seed N              (default 42)\n",
            SPECD_DEFAULT_MODEL, SPECD_DEFAULT_SPECULATOR);
}

static void opts_default(head_opts *o) {
    memset(o, 0, sizeof *o);
    o->model = SPECD_DEFAULT_MODEL;
    o->speculator = SPECD_DEFAULT_SPECULATOR;
    o->dtype = "F32";
    o->lanes = 16;
    o->max_prompt = 512;
    o->gen_len = 128;
    o->seq_len = 256;
    o->max_examples = 200000;
    o->hidden = 256;
    o->layers = 2;
    o->draft_features = 1;
    o->train = (accept_train_opts){.steps = 2000, .batch = 512, .lr = 1e-3f, .min_lr_ratio = 0.1f,
                                   .weight_decay = 0.01f, .clip = 1.0f, .warmup = 100,
                                   .w_rej = 1.0f, .seed = 42, .log_every = 10};
}

static int parse(int argc, char **argv, head_opts *o) {
    opts_default(o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--speculator")) o->speculator = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--data")) {
            if (o->n_data == MAX_DATA_FILES) {
                fprintf(stderr, "specd train accept-head: at most %d --data files\n",
                        MAX_DATA_FILES);
                return 2;
            }
            o->data[o->n_data++] = cli_value(argc, argv, &i);
        } else if (!strcmp(a, "-o") || !strcmp(a, "--out")) o->out = cli_value(argc, argv, &i);
        else if (!strcmp(a, "--eval-head")) o->eval_head = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            o->threads = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--temperature"))
            o->temperature = (float)cli_float(a, cli_value(argc, argv, &i), 0, 10);
        else if (!strcmp(a, "--gen-len")) o->gen_len = (int)cli_int(a, cli_value(argc, argv, &i), 0, 1 << 16);
        else if (!strcmp(a, "--max-prompt"))
            o->max_prompt = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 16);
        else if (!strcmp(a, "--seq-len")) o->seq_len = (int)cli_int(a, cli_value(argc, argv, &i), 2, 1 << 16);
        else if (!strcmp(a, "--lanes")) o->lanes = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--max-examples"))
            o->max_examples = cli_int(a, cli_value(argc, argv, &i), 1, 1L << 32);
        else if (!strcmp(a, "--skip"))
            o->skip = cli_int(a, cli_value(argc, argv, &i), 0, 1L << 40);
        else if (!strcmp(a, "--hidden"))
            o->hidden = (int)cli_int(a, cli_value(argc, argv, &i), 1, SPECD_ACCEPT_HEAD_MAX_HIDDEN);
        else if (!strcmp(a, "--no-draft-features")) o->draft_features = 0;
        else if (!strcmp(a, "--layers"))
            o->layers = (int)cli_int(a, cli_value(argc, argv, &i), 0, SPECD_ACCEPT_HEAD_MAX_LAYERS);
        else if (!strcmp(a, "--dtype")) {
            const char *d = cli_value(argc, argv, &i);
            if (!strcasecmp(d, "f16")) o->dtype = "F16";
            else if (!strcasecmp(d, "bf16")) o->dtype = "BF16";
            else if (!strcasecmp(d, "f32")) o->dtype = "F32";
            else {
                fprintf(stderr, "specd train accept-head: --dtype must be f16, bf16 or f32, got "
                                "'%s'\n", d);
                return 2;
            }
        } else if (!strcmp(a, "--steps")) o->train.steps = cli_int(a, cli_value(argc, argv, &i), 1, 1L << 30);
        else if (!strcmp(a, "--batch"))
            o->train.batch = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--lr")) o->train.lr = (float)cli_float(a, cli_value(argc, argv, &i), 1e-8, 1);
        else if (!strcmp(a, "--warmup")) o->train.warmup = cli_int(a, cli_value(argc, argv, &i), 0, 1L << 30);
        else if (!strcmp(a, "--min-lr-ratio"))
            o->train.min_lr_ratio = (float)cli_float(a, cli_value(argc, argv, &i), 0, 1);
        else if (!strcmp(a, "--weight-decay"))
            o->train.weight_decay = (float)cli_float(a, cli_value(argc, argv, &i), 0, 10);
        else if (!strcmp(a, "--clip")) o->train.clip = (float)cli_float(a, cli_value(argc, argv, &i), 0, 1e6);
        else if (!strcmp(a, "--w-rej")) {
            const char *v = cli_value(argc, argv, &i);
            o->w_rej_auto = !strcmp(v, "auto");
            if (!o->w_rej_auto) o->train.w_rej = (float)cli_float(a, v, 1e-3, 1e3);
        } else if (!strcmp(a, "--seed"))
            o->train.seed = (uint64_t)cli_int(a, cli_value(argc, argv, &i), 0, 1L << 62);
        else {
            fprintf(stderr, "specd train accept-head: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (o->n_data == 0) o->data[o->n_data++] = "data/train/prompts.jsonl";
    return 0;
}

/* ---- progress ------------------------------------------------------------------ */

static void fmt_eta(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e7) snprintf(buf, n, "?");
    else if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

typedef struct progress {
    double t0, last;
    int tty;
    long max_examples; /* data: the run also ends here (0 = no limit) */
} progress;

/* One line, rewritten in place on a terminal, every few seconds otherwise. */
static int due(progress *p, int final) {
    double now = cli_now();
    if (!final && now - p->last < (p->tty ? 0.5 : 15)) return 0;
    p->last = now;
    return 1;
}

static void data_progress(void *ctx, int done, int total, long examples) {
    progress *p = ctx;
    if (!due(p, done == total)) return;
    double dt = cli_now() - p->t0, rate = done / (dt + 1e-9), ex_rate = examples / (dt + 1e-9);
    /* whichever ends the run first: the last sequence or --max-examples */
    double left = (total - done) / (rate + 1e-9);
    if (p->max_examples > 0 && (p->max_examples - examples) / (ex_rate + 1e-9) < left)
        left = (p->max_examples - examples) / (ex_rate + 1e-9);
    char eta[32];
    fmt_eta(left, eta, sizeof eta);
    fprintf(stderr, "%sexamples: %d/%d sequences, %ld examples (%.0f/s, ETA %s)%s",
            p->tty ? "\r" : "", done, total, examples, ex_rate, eta,
            p->tty && done < total ? "" : "\n");
}

static void train_progress(void *ctx, long step, long total, double loss, double ex_s) {
    progress *p = ctx;
    if (!due(p, step == total)) return;
    double dt = cli_now() - p->t0;
    char eta[32];
    fmt_eta(dt / step * (total - step), eta, sizeof eta);
    fprintf(stderr, "%sstep %ld/%ld  loss %.4f  %.0f examples/s  ETA %s%s", p->tty ? "\r" : "",
            step, total, loss, ex_s, eta, p->tty && step < total ? "" : "\n");
}

/* ---- the run ------------------------------------------------------------------- */

/* An AUC, or "-" where the examples held one class only (accept_auc's -1). */
static const char *auc_text(double auc, char *buf, size_t n) {
    if (auc < 0) snprintf(buf, n, "    -");
    else snprintf(buf, n, "%.3f", auc);
    return buf;
}

static void print_eval(const char *what, const accept_eval *ev) {
    printf("%s: %ld examples, BCE %.4f, accuracy %.1f%%\n", what, ev->n, ev->bce,
           100 * ev->accuracy);
    printf("  calibration by stage (mean predicted vs actual acceptance):\n");
    for (int s = 0; s < ev->n_stages; s++)
        if (ev->stage_n[s])
            printf("    stage %d: %7ld examples  predicted %.3f  actual %.3f\n", s,
                   ev->stage_n[s], ev->stage_p[s], ev->stage_y[s]);
    /* the draft's own probability is what draft-svc prices trees with
     * (tree_builder.h); the head is worth its time where it ranks better */
    printf("  ranking (AUC: accepted above rejected; 0.5 = chance), the head vs the draft's\n"
           "  own probability of its token:\n");
    char h[16], d[16];
    printf("    all:     head %s  draft %s\n", auc_text(ev->auc_head, h, sizeof h),
           auc_text(ev->auc_draft, d, sizeof d));
    for (int s = 0; s < ev->n_stages; s++)
        if (ev->stage_n[s])
            printf("    stage %d: head %s  draft %s\n", s,
                   auc_text(ev->stage_auc_head[s], h, sizeof h),
                   auc_text(ev->stage_auc_draft[s], d, sizeof d));
    /* what draft-svc's calibration learns per bin, all stages together */
    printf("  acceptance by the draft's probability (draft-svc's calibration bins):\n");
    for (int b = 0; b < SPECD_CALIB_BINS; b++) {
        if (!ev->qbin_n[b]) continue;
        float lo, hi;
        specd_calib_bin_range(b, &lo, &hi);
        printf("    %.2f-%.2f: %7ld examples  accepted %.3f\n", (double)lo, (double)hi,
               ev->qbin_n[b], ev->qbin_y[b]);
    }
}

/* The BCE of predicting `rate` for every example idx[0..n): the score to beat. */
static double constant_bce(const accept_examples *e, const long *idx, long n, double rate) {
    double r = rate < 1e-6 ? 1e-6 : rate > 1 - 1e-6 ? 1 - 1e-6 : rate, s = 0;
    for (long i = 0; i < n; i++) {
        double y = e->label[idx[i]];
        s -= y * log(r) + (1 - y) * log(1 - r);
    }
    return n ? s / n : 0;
}

int cmd_train_accept_head(int argc, char **argv) {
    head_opts o;
    int prc = parse(argc, argv, &o);
    if (prc) return prc == 1 ? 0 : prc;
    char out_dir[2048];
    if (o.out) snprintf(out_dir, sizeof out_dir, "%s", o.out);
    else if ((size_t)snprintf(out_dir, sizeof out_dir, "%s/accept_head", o.speculator) >= sizeof out_dir) {
        fprintf(stderr, "specd train accept-head: --speculator path too long\n");
        return 2;
    }

    specd_error err = {{0}};
    int status = 1;
    corpus c = {0};
    specd_model_file *mf = NULL;
    specd_tokenizer *tok = NULL;
    specd_mlp_speculator *sp = NULL;
    specd_transformer *t = NULL;
    accept_sources src = {0};
    accept_examples ex = {0};
    long *train_idx = NULL, *val_idx = NULL, n_train = 0, n_val = 0;
    accept_model m = {0};
    specd_accept_head *head = NULL;

    for (int i = 0; i < o.n_data; i++)
        if (corpus_read_file(&c, o.data[i], &err)) goto fail;
    if (o.skip > 0) {
        size_t k = (size_t)o.skip < c.n_docs ? (size_t)o.skip : c.n_docs;
        for (size_t i = 0; i < k; i++) free(c.docs[i].text);
        memmove(c.docs, c.docs + k, sizeof(*c.docs) * (c.n_docs - k));
        c.n_docs -= k;
    }
    if (!(mf = specd_model_open(o.model, &err)) || !(tok = specd_tokenizer_from_model(mf, &err)))
        goto fail;
    if (!(sp = specd_mlp_speculator_load(o.speculator, o.threads, &err))) goto fail;
    /* a head to score is read before the data pass, which takes minutes */
    if (o.eval_head && !(head = specd_accept_head_load(o.eval_head, &err))) goto fail;
    if (accept_sources_from_corpus(tok, &c, o.max_prompt, o.gen_len, o.seq_len, &src, &err))
        goto fail;
    int longest = 0;
    for (int i = 0; i < src.n; i++) {
        int len = src.v[i].n_ids + src.v[i].generate + 1;
        if (len > longest) longest = len;
    }
    specd_transformer_opts to = {.backend = {.n_threads = o.threads}, .n_slots = o.lanes,
                                 .max_ctx = longest < mf->hp.max_seq_len ? longest : mf->hp.max_seq_len,
                                 /* a prompt's prefill, or one token per lane */
                                 .max_batch = o.max_prompt > o.lanes ? o.max_prompt : o.lanes};
    if (!(t = specd_transformer_create(mf, &to, &err))) goto fail;
    const specd_mlp_spec_config *sc = specd_mlp_speculator_config(sp);
    int32_t end_ids[SPECD_TOKENIZER_MAX_END];
    int n_end = specd_tokenizer_end_ids(tok, end_ids);
    fprintf(stderr, "examples: %d sequences through %s and the %d-stage speculator %s (%s "
                    "labels)\n", src.n, o.model, sc->n_predict, o.speculator,
            o.temperature > 0 ? "sampling" : "greedy");
    progress pd = {.t0 = cli_now(), .tty = isatty(2), .max_examples = o.max_examples};
    accept_data_opts dopt = {.temperature = o.temperature, .lanes = o.lanes,
                             .max_examples = o.max_examples, .seed = o.train.seed,
                             .end_ids = end_ids, .n_end_ids = n_end};
    if (accept_data_build(t, sp, &src, &dopt, &ex, data_progress, &pd, &err)) goto fail;
    /* the progress line may have been left open by --max-examples */
    fprintf(stderr, "%sexamples: %ld in %.0f s\n", pd.tty ? "\n" : "", ex.n, cli_now() - pd.t0);
    specd_transformer_free(t); /* the target's KV cache is not needed to train */
    t = NULL;
    if (o.eval_head) {
        /* every example, as the head has not seen them (the user's word) */
        if (!(val_idx = malloc(sizeof(long) * (size_t)(ex.n > 0 ? ex.n : 1)))) {
            specd_seterr(&err, "out of memory");
            goto fail;
        }
        double acc = 0;
        for (long i = 0; i < ex.n; i++) acc += ex.label[val_idx[i] = i];
        accept_eval ev;
        if (accept_evaluate(head, &ex, val_idx, ex.n, &ev, &err)) goto fail;
        print_eval(o.eval_head, &ev);
        if (ex.n)
            printf("  a constant p = %.3f would score BCE %.4f\n", acc / (double)ex.n,
                   constant_bce(&ex, val_idx, ex.n, acc / (double)ex.n));
        status = 0;
        goto out;
    }
    if (accept_split(&ex, src.n, &train_idx, &n_train, &val_idx, &n_val, &err)) goto fail;
    if (n_train == 0) {
        specd_seterr(&err, "no training examples (%ld in all); give more --data", ex.n);
        goto fail;
    }
    double pos = 0;
    for (long i = 0; i < n_train; i++) pos += ex.label[train_idx[i]];
    double rate = pos / n_train;
    if (o.w_rej_auto) {
        /* accepted mass / rejected mass: both classes weigh the same in all */
        o.train.w_rej = (float)(rate < 1e-3 ? 1e3 * rate : rate >= 1 ? 1e3 : rate / (1 - rate));
        if (o.train.w_rej < 1e-3f) o.train.w_rej = 1e-3f;
    }
    fprintf(stderr, "training: %ld examples (%ld held out), acceptance rate %.3f, w_rej %.3g, "
                    "head %d x %d%s, %ld steps of %d\n", n_train, n_val, rate,
            (double)o.train.w_rej, o.hidden, o.layers,
            o.draft_features ? " with draft features" : "", o.train.steps, o.train.batch);
    specd_accept_head_config hc = {
        .input_dim = sc->inner_dim, .hidden_dim = o.hidden, .n_layers = o.layers,
        .n_stages = sc->n_predict,
        .n_draft_features = o.draft_features ? SPECD_ACCEPT_HEAD_DRAFT_FEATURES : 0};
    if (accept_model_init(&m, &hc, (float)rate, o.train.seed, &err)) goto fail;
    progress pt = {.t0 = cli_now(), .tty = isatty(2)};
    if (accept_train(&m, &ex, train_idx, n_train, &o.train, train_progress, &pt, &err)) goto fail;

    specd_accept_head_weights w;
    accept_model_weights(&m, &w);
    char extra[512];
    snprintf(extra, sizeof extra,
             "{\"training\": {\"temperature\": %g, \"w_rej\": %g, \"examples\": %ld, "
             "\"steps\": %ld, \"acceptance_rate\": %.4f, \"seed\": %llu}}",
             (double)o.temperature, (double)o.train.w_rej, n_train, o.train.steps, rate,
             (unsigned long long)o.train.seed);
    if (specd_accept_head_save(out_dir, &hc, &w, o.dtype, extra, &err)) goto fail;
    /* score what was written, through the forward draft-svc runs */
    if (!(head = specd_accept_head_load(out_dir, &err))) goto fail;
    accept_eval ev;
    if (n_val) {
        if (accept_evaluate(head, &ex, val_idx, n_val, &ev, &err)) goto fail;
        print_eval("validation", &ev);
        printf("  a constant p = %.3f would score BCE %.4f\n", rate,
               constant_bce(&ex, val_idx, n_val, rate));
    } else {
        printf("validation: no held-out examples (too little data)\n");
    }
    printf("acceptance head written to %s\n", out_dir);
    status = 0;
    goto out;
fail:
    fprintf(stderr, "specd train accept-head: %s\n", err.msg);
out:
    specd_accept_head_free(head);
    accept_model_free(&m);
    free(train_idx);
    free(val_idx);
    accept_examples_free(&ex);
    accept_sources_free(&src);
    specd_transformer_free(t);
    specd_mlp_speculator_free(sp);
    specd_tokenizer_free(tok);
    specd_model_close(mf);
    corpus_free(&c);
    return status;
}
