/* test_accept_train.c - the acceptance head's trainer end to end on a tiny
 * model (tools/train/accept_data.c, tools/train/accept_train.c).
 *
 * Target: tests/golden/data/tiny-gqa/hf (vocab 512, hidden 64). Speculator:
 * a random 3-stage MLPSpeculator for it, written by the test. Checks: the
 * examples line up with the target and the speculator (greedy stage-0
 * labels recomputed independently from a full prefill), the greedy
 * conditional rule (a stage only after an accepted one), the counts of a
 * teacher-forced window, soft labels in (0, 1], determinism, and that
 * training lowers the BCE well below where it starts; the written head,
 * read back, scores what the trained parameters score. A few seconds. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/util/dtype.h"
#include "common/model/model_file.h"
#include "common/model/safetensors_write.h"
#include "common/spec/sampling.h"
#include "common/model/accept_head.h"
#include "common/model/mlp_speculator.h"
#include "common/model/transformer.h"
#include "tests/harness/test_util.h"
#include "tools/train/accept_data.h"
#include "tools/train/accept_train.h"

#define MODEL "tests/golden/data/tiny-gqa/hf"
#define V 512
#define EMB 64
#define INNER 32
#define NP 3
#define WIN 30
#define LANES 4

typedef struct fixture {
    specd_model_file *mf;
    specd_transformer *t;
    specd_mlp_speculator *sp;
    char spec_dir[256];
    accept_sources src;
} fixture;

/* A random MLPSpeculator for the tiny target, in a fresh directory. */
static void write_speculator(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/specd_acctrain_%d", (int)getpid());
    mkdir(dir, 0755);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"model_type\": \"mlp_speculator\", \"vocab_size\": %d, \"emb_dim\": %d, "
               "\"inner_dim\": %d, \"n_predict\": %d, \"top_k_tokens_per_head\": [2, 2, 2]}",
            V, EMB, INNER, NP);
    fclose(f);
    static float emb[NP][V * INNER], head[NP][V * INNER], proj[NP][INNER * EMB], lnw[INNER],
        lnb[INNER];
    static char names[5 * NP][64];
    safetensors_out t[5 * NP];
    int n = 0;
    for (int i = 0; i < INNER; i++) lnw[i] = 1.0f;
    for (int s = 0; s < NP; s++) {
        int in = s == 0 ? EMB : INNER;
        test_fill_random(emb[s], V * INNER, 100 + s, 1.0f);
        test_fill_random(head[s], V * INNER, 200 + s, 0.6f);
        test_fill_random(proj[s], (size_t)INNER * in, 300 + s, 1.5f / sqrtf((float)in));
        const char *grp[5] = {"emb", "head", "proj", "ln", "ln"};
        const char *suf[5] = {"weight", "weight", "weight", "weight", "bias"};
        const void *data[5] = {emb[s], head[s], proj[s], lnw, lnb};
        for (int k = 0; k < 5; k++) {
            snprintf(names[n], sizeof names[n], "speculator.%s.%d.%s", grp[k], s, suf[k]);
            t[n] = (safetensors_out){.name = names[n], .type = SPECD_F32, .data = data[k]};
            if (k < 3) {
                t[n].n_dims = 2;
                t[n].shape[0] = k == 2 ? INNER : V;
                t[n].shape[1] = k == 2 ? (uint64_t)in : INNER;
            } else {
                t[n].n_dims = 1;
                t[n].shape[0] = INNER;
            }
            n++;
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    specd_error err = {{0}};
    if (safetensors_write(path, t, n, NULL, NULL, 0, &err)) fail_msg("%s", err.msg);
}

/* Sources: text windows of random tokens (teacher-forced) and prompts the
 * target continues itself. */
static void make_sources(accept_sources *s, int n_windows, int n_prompts) {
    s->n = n_windows + n_prompts;
    s->v = calloc((size_t)s->n, sizeof *s->v);
    assert_non_null(s->v);
    float r[WIN];
    for (int i = 0; i < s->n; i++) {
        int prompt = i >= n_windows, n = prompt ? 10 : WIN;
        test_fill_random(r, (size_t)n, 1000 + (uint64_t)i, 1.0f);
        s->v[i].ids = malloc(sizeof(int32_t) * (size_t)n);
        for (int k = 0; k < n; k++) s->v[i].ids[k] = 3 + (int32_t)((r[k] + 1.0f) * 250.0f) % 500;
        s->v[i].n_ids = n;
        s->v[i].n_prefix = prompt ? n - 1 : 0;
        s->v[i].generate = prompt ? 20 : 0;
    }
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    specd_error err = {{0}};
    write_speculator(f->spec_dir, sizeof f->spec_dir);
    if (!(f->mf = specd_model_open(test_path(MODEL), &err))) fail_msg("%s", err.msg);
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 2}, .n_slots = LANES,
                                .max_ctx = 64, .max_batch = 64};
    if (!(f->t = specd_transformer_create(f->mf, &o, &err))) fail_msg("%s", err.msg);
    if (!(f->sp = specd_mlp_speculator_load(f->spec_dir, 1, &err))) fail_msg("%s", err.msg);
    make_sources(&f->src, 6, 4);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    accept_sources_free(&f->src);
    specd_mlp_speculator_free(f->sp);
    specd_transformer_free(f->t);
    specd_model_close(f->mf);
    const char *files[] = {"accept_head/config.json", "accept_head/model.safetensors",
                           "accept_head", "config.json", "model.safetensors"};
    for (int i = 0; i < 5; i++) {
        char path[400];
        snprintf(path, sizeof path, "%s/%s", f->spec_dir, files[i]);
        if (i == 2) rmdir(path);
        else unlink(path);
    }
    rmdir(f->spec_dir);
    free(f);
    return 0;
}

static const int32_t eos_id = 2;

static void build(fixture *f, const accept_sources *src, float temperature, int lanes,
                  accept_examples *out) {
    memset(out, 0, sizeof *out);
    accept_data_opts o = {.temperature = temperature, .lanes = lanes, .seed = 42,
                          .end_ids = &eos_id, .n_end_ids = 1};
    specd_error err = {{0}};
    if (accept_data_build(f->t, f->sp, src, &o, out, NULL, NULL, &err)) fail_msg("%s", err.msg);
}

/* Greedy stage-0 labels of one window, recomputed from a whole-window
 * prefill: row t's state (fp16, as on the wire) with token t+1 through
 * stage 0, judged by argmax of the target's logits at row t+1. */
static void test_greedy_stage0_matches_prefill(void **state) {
    fixture *f = *state;
    accept_sources one = {.v = f->src.v, .n = 1};
    accept_examples ex;
    build(f, &one, 0.0f, 1, &ex);

    const accept_source *s = &f->src.v[0];
    float *logits = malloc(sizeof(float) * WIN * V), *hidden = malloc(sizeof(float) * WIN * EMB);
    int32_t rows[WIN];
    for (int i = 0; i < WIN; i++) rows[i] = i;
    specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = WIN};
    specd_batch b = {.n_tokens = WIN, .tokens = s->ids, .n_seqs = 1, .seqs = &in, .n_out = WIN,
                     .out_rows = rows, .logits = logits, .hidden = hidden};
    specd_error err = {{0}};
    assert_int_equal(specd_transformer_forward(f->t, &b, &err), 0);
    for (int i = 0; i < WIN * EMB; i++) hidden[i] = specd_fp16_to_f32(specd_f32_to_fp16(hidden[i]));
    float st[INNER], lg[V];
    long e = 0;
    int positives = 0;
    for (int t = 0; t + 1 < WIN; t++) {
        while (e < ex.n && ex.stage[e] != 0) e++;
        assert_true(e < ex.n);
        assert_int_equal(specd_mlp_speculator_stage(f->sp, 0, 1, hidden + t * EMB, &s->ids[t + 1],
                                                    st, lg, &err), 0);
        float want = specd_argmax(lg, V) == specd_argmax(logits + (t + 1) * V, V) ? 1.0f : 0.0f;
        assert_true(ex.label[e] == want);
        positives += want == 1.0f;
        /* the draft's own probability of its token: the softmax at the argmax */
        double z = 0, top = lg[specd_argmax(lg, V)];
        for (int v = 0; v < V; v++) z += exp((double)lg[v] - top);
        assert_float_equal(ex.qdraft[e], 1.0 / z, 1e-5);
        /* the row's two largest probabilities: the draft's, then the
         * runner-up's (the draft features' input) */
        double second = -INFINITY;
        for (int v = 0; v < V; v++)
            if (v != specd_argmax(lg, V) && lg[v] > second) second = lg[v];
        assert_float_equal(ex.qtop2[2 * e], 1.0 / z, 1e-5);
        assert_float_equal(ex.qtop2[2 * e + 1], exp(second - top) / z, 1e-5);
        /* the stored state is that stage's output (fp16) */
        for (int k = 0; k < INNER; k++)
            assert_float_equal(specd_fp16_to_f32(ex.states[e * INNER + k]), st[k],
                               1e-3 + 1e-3 * fabsf(st[k]));
        assert_int_equal(ex.source[e], 0);
        e++;
    }
    while (e < ex.n && ex.stage[e] != 0) e++;
    assert_int_equal(e, ex.n); /* one stage-0 example per position, no more */
    /* the conditional rule: a stage-1 example only after an accepted stage 0 */
    long n1 = 0;
    for (long i = 0; i < ex.n; i++) n1 += ex.stage[i] == 1;
    assert_true(n1 <= positives);
    free(logits);
    free(hidden);
    accept_examples_free(&ex);
}

/* The greedy chain goes on only past an ACCEPTED draft. A window built so
 * that the text always follows the speculator's stage-0 draft (x_{j+1} =
 * its argmax at row j) separates the two conditions: there every stage-0
 * draft matches the text, so a stage-1 example may only follow where the
 * target also agreed (label 1). */
static void test_greedy_chain_needs_acceptance(void **state) {
    fixture *f = *state;
    int32_t ids[WIN];
    float h_prev[EMB], h[EMB], st[INNER], lg[V];
    specd_error err = {{0}};
    ids[0] = 7;
    ids[1] = 11;
    for (int j = 0; j + 1 < WIN; j++) {
        if (j >= 1) {
            assert_int_equal(specd_mlp_speculator_stage(f->sp, 0, 1, h_prev, &ids[j], st, lg, &err),
                             0);
            ids[j + 1] = specd_argmax(lg, V);
        }
        /* the target's row j, decoded one token at a time as the builder does */
        specd_seq_input in = {.slot = 0, .n_past = j, .n_new = 1};
        int32_t row = 0;
        specd_batch b = {.n_tokens = 1, .tokens = &ids[j], .n_seqs = 1, .seqs = &in, .n_out = 1,
                         .out_rows = &row, .hidden = h};
        assert_int_equal(specd_transformer_forward(f->t, &b, &err), 0);
        for (int i = 0; i < EMB; i++) h_prev[i] = specd_fp16_to_f32(specd_f32_to_fp16(h[i]));
    }
    accept_source one_src = {.ids = ids, .n_ids = WIN};
    accept_sources one = {.v = &one_src, .n = 1};
    accept_examples ex;
    build(f, &one, 0.0f, 1, &ex);
    long n0 = 0, n1 = 0, accepted = 0, rejected = 0, last0 = -1;
    for (long i = 0; i < ex.n; i++)
        if (ex.stage[i] == 0) {
            n0++;
            last0 = i;
        }
    for (long i = 0; i < ex.n; i++) {
        n1 += ex.stage[i] == 1;
        /* the last row's draft has no next row to go on to */
        if (ex.stage[i] == 0 && i != last0) {
            accepted += ex.label[i] == 1.0f;
            rejected += ex.label[i] == 0.0f;
        }
    }
    assert_int_equal(n0, WIN - 1);
    assert_int_equal(n1, accepted);
    assert_true(rejected > 0); /* or the rule was not put to the test */
    accept_examples_free(&ex);
}

static void count(const accept_examples *ex, int src, long *by_stage, double *pos) {
    memset(by_stage, 0, sizeof(long) * NP);
    memset(pos, 0, sizeof(double) * NP);
    for (long i = 0; i < ex->n; i++)
        if (src < 0 || ex->source[i] == src) {
            by_stage[ex->stage[i]]++;
            pos[ex->stage[i]] += ex->label[i];
        }
}

static void test_examples_shape(void **state) {
    fixture *f = *state;
    accept_examples g, s, s2;
    build(f, &f->src, 0.0f, LANES, &g);
    build(f, &f->src, 1.0f, LANES, &s);
    long n[NP];
    double pos[NP];
    for (int src = 0; src < f->src.n; src++) {
        /* greedy: 0/1 labels; stage k+1 needs an accepted stage k */
        count(&g, src, n, pos);
        assert_true(n[0] > 0);
        for (int k = 0; k + 1 < NP; k++) assert_true(n[k + 1] <= pos[k] + 1e-9);
        /* sampling: every chain runs to the end of its sequence, so a window
         * of WIN tokens has WIN-1-k examples of stage k */
        count(&s, src, n, pos);
        if (src < 6)
            for (int k = 0; k < NP; k++) assert_int_equal(n[k], WIN - 1 - k);
        else
            for (int k = 0; k + 1 < NP; k++) assert_true(n[k + 1] == 0 || n[k + 1] == n[k] - 1);
    }
    for (long i = 0; i < g.n; i++) assert_true(g.label[i] == 0.0f || g.label[i] == 1.0f);
    int soft = 0;
    for (long i = 0; i < s.n; i++) {
        assert_true(s.label[i] > 0.0f && s.label[i] <= 1.0f);
        soft |= s.label[i] < 1.0f;
    }
    assert_true(soft);
    /* fixed seed, fixed order: a second run gives the same examples */
    build(f, &f->src, 1.0f, LANES, &s2);
    assert_int_equal(s2.n, s.n);
    assert_memory_equal(s2.label, s.label, sizeof(float) * (size_t)s.n);
    assert_memory_equal(s2.states, s.states, sizeof(uint16_t) * (size_t)s.n * INNER);
    accept_examples_free(&s2);
    /* max_examples stops early */
    accept_data_opts o = {.temperature = 1.0f, .lanes = LANES, .seed = 42, .max_examples = 50};
    specd_error err = {{0}};
    assert_int_equal(accept_data_build(f->t, f->sp, &f->src, &o, &s2, NULL, NULL, &err), 0);
    assert_int_equal(s2.n, 50);
    accept_examples_free(&s2);
    accept_examples_free(&g);
    accept_examples_free(&s);
}

static void test_training_lowers_bce(void **state) {
    fixture *f = *state;
    accept_examples ex;
    build(f, &f->src, 1.0f, LANES, &ex);
    long *tr, *va, n_tr, n_va;
    specd_error err = {{0}};
    assert_int_equal(accept_split(&ex, f->src.n, &tr, &n_tr, &va, &n_va, &err), 0);
    assert_int_equal(n_tr + n_va, ex.n);
    /* 10 sources: the held-out examples are source 9's, all of them */
    long of9 = 0;
    for (long i = 0; i < ex.n; i++) of9 += ex.source[i] == 9;
    assert_int_equal(n_va, of9);
    for (long i = 0; i < n_va; i++) assert_int_equal(ex.source[va[i]], 9);
    /* fewer than 10 sources: every 10th example instead */
    long *tr2, *va2, n_tr2, n_va2;
    assert_int_equal(accept_split(&ex, 9, &tr2, &n_tr2, &va2, &n_va2, &err), 0);
    assert_int_equal(n_va2, ex.n / 10);
    free(tr2);
    free(va2);
    double rate = 0;
    for (long i = 0; i < n_tr; i++) rate += ex.label[tr[i]];
    rate /= n_tr;
    specd_accept_head_config hc = {.input_dim = INNER, .hidden_dim = 64, .n_layers = 1,
                                   .n_stages = NP};
    accept_model m;
    assert_int_equal(accept_model_init(&m, &hc, (float)rate, 7, &err), 0);
    specd_accept_head_weights w;
    accept_model_weights(&m, &w);
    specd_accept_head *h0 = specd_accept_head_create(&hc, &w, &err);
    assert_non_null(h0);
    accept_eval before, after, reread;
    assert_int_equal(accept_evaluate(h0, &ex, tr, n_tr, &before, &err), 0);
    specd_accept_head_free(h0);
    accept_train_opts o = {.steps = 1000, .batch = 64, .lr = 3e-3f, .min_lr_ratio = 0.1f,
                           .weight_decay = 0.0f, .clip = 1.0f, .warmup = 20, .w_rej = 1.0f,
                           .seed = 3};
    assert_int_equal(accept_train(&m, &ex, tr, n_tr, &o, NULL, NULL, &err), 0);
    accept_model_weights(&m, &w);
    specd_accept_head *h1 = specd_accept_head_create(&hc, &w, &err);
    assert_int_equal(accept_evaluate(h1, &ex, tr, n_tr, &after, &err), 0);
    printf("  training BCE %.4f -> %.4f over %ld examples (%ld held out)\n", before.bce,
           after.bce, n_tr, n_va);
    /* the head starts at the base rate, so any drop is learned from states */
    assert_true(after.bce < 0.6 * before.bce);
    assert_int_equal(after.n, n_tr);
    long total = 0;
    for (int s = 0; s < NP; s++) total += after.stage_n[s];
    assert_int_equal(total, n_tr);
    /* the file holds what was trained: same scores through a reload */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/accept_head", f->spec_dir);
    assert_int_equal(specd_accept_head_save(dir, &hc, &w, "F32", NULL, &err), 0);
    specd_accept_head *h2 = specd_accept_head_load(dir, &err);
    if (!h2) fail_msg("%s", err.msg);
    assert_int_equal(accept_evaluate(h2, &ex, tr, n_tr, &reread, &err), 0);
    assert_true(reread.bce == after.bce);
    assert_true(reread.accuracy == after.accuracy);
    /* bad options are refused */
    o.w_rej = 0;
    assert_int_equal(accept_train(&m, &ex, tr, n_tr, &o, NULL, NULL, &err), -1);
    specd_accept_head_free(h1);
    specd_accept_head_free(h2);
    accept_model_free(&m);
    free(tr);
    free(va);
    accept_examples_free(&ex);
}

/* The draft-feature path learns: labels that depend only on the row's top
 * probability (accepted iff q1 > 0.5), states that are pure noise. A head
 * with draft features ranks them almost perfectly after training; one
 * without (the same data, the same steps) cannot beat chance by much. A
 * wrong gradient for draft_proj would leave the first where the second is. */
static void test_draft_features_learn(void **state) {
    (void)state;
    enum { N = 4000, D = 16 };
    accept_examples ex = {.n = N, .cap = N, .dim = D};
    ex.states = malloc(sizeof(uint16_t) * N * D);
    ex.stage = calloc(N, 1);
    ex.label = malloc(sizeof(float) * N);
    ex.qdraft = malloc(sizeof(float) * N);
    ex.qtop2 = malloc(sizeof(float) * 2 * N);
    ex.source = malloc(sizeof(int32_t) * N);
    float noise[D];
    for (long i = 0; i < N; i++) {
        test_fill_random(noise, D, 1000 + (uint64_t)i, 1.0f);
        for (int d = 0; d < D; d++) ex.states[i * D + d] = specd_f32_to_fp16(noise[d]);
        float q1 = 0.05f + 0.9f * (float)((i * 7919) % 1000) / 1000.0f;
        ex.qtop2[2 * i] = q1;
        ex.qtop2[2 * i + 1] = 0.5f * (1 - q1);
        ex.qdraft[i] = q1;
        ex.label[i] = q1 > 0.5f ? 1.0f : 0.0f;
        ex.source[i] = (int32_t)(i % 20);
        ex.stage[i] = (uint8_t)(i % 2);
    }
    long *tr, *va, n_tr, n_va;
    specd_error err = {{0}};
    assert_int_equal(accept_split(&ex, 20, &tr, &n_tr, &va, &n_va, &err), 0);
    double auc[2];
    for (int with = 0; with < 2; with++) {
        specd_accept_head_config hc = {.input_dim = D, .hidden_dim = 16, .n_layers = 1,
                                       .n_stages = 2,
                                       .n_draft_features = with ? SPECD_ACCEPT_HEAD_DRAFT_FEATURES : 0};
        accept_model m;
        assert_int_equal(accept_model_init(&m, &hc, 0.5f, 7, &err), 0);
        accept_train_opts o = {.steps = 300, .batch = 64, .lr = 3e-3f, .min_lr_ratio = 0.1f,
                               .clip = 1.0f, .warmup = 20, .w_rej = 1.0f, .seed = 3};
        assert_int_equal(accept_train(&m, &ex, tr, n_tr, &o, NULL, NULL, &err), 0);
        specd_accept_head_weights w;
        accept_model_weights(&m, &w);
        specd_accept_head *h = specd_accept_head_create(&hc, &w, &err);
        if (!h) fail_msg("%s", err.msg);
        accept_eval ev;
        assert_int_equal(accept_evaluate(h, &ex, va, n_va, &ev, &err), 0);
        auc[with] = ev.auc_head;
        printf("  draft features %s: held-out BCE %.4f, AUC %.3f\n", with ? "on " : "off", ev.bce,
               ev.auc_head);
        if (with) assert_true(ev.bce < 0.25);
        specd_accept_head_free(h);
        accept_model_free(&m);
    }
    assert_true(auc[1] > 0.98);
    assert_true(auc[0] < 0.7);
    free(tr);
    free(va);
    accept_examples_free(&ex);
}

/* accept_auc on rankings whose answer is known by hand. */
static void test_auc(void **state) {
    (void)state;
    const float perfect_s[] = {0.1f, 0.2f, 0.8f, 0.9f}, y[] = {0, 0, 1, 1};
    assert_float_equal(accept_auc(perfect_s, y, 4), 1.0, 1e-12);
    const float reversed_s[] = {0.9f, 0.8f, 0.2f, 0.1f};
    assert_float_equal(accept_auc(reversed_s, y, 4), 0.0, 1e-12);
    /* every score equal: each pair a tie, half */
    const float tie_s[] = {0.5f, 0.5f, 0.5f, 0.5f};
    assert_float_equal(accept_auc(tie_s, y, 4), 0.5, 1e-12);
    /* 2 accepted x 2 rejected pairs: (0.3 > 0.2), (0.3 < 0.6), (0.7 > 0.2),
     * (0.7 > 0.6): 3 of 4; the order of the input does not matter */
    const float s4[] = {0.6f, 0.3f, 0.2f, 0.7f}, y4[] = {0, 1, 0, 1};
    assert_float_equal(accept_auc(s4, y4, 4), 0.75, 1e-12);
    /* a tie across the classes counts half: (0.5 = 0.5) 0.5, (0.5 > 0.1) 1 */
    const float s5[] = {0.5f, 0.5f, 0.1f}, y5[] = {1, 0, 0};
    assert_float_equal(accept_auc(s5, y5, 3), 0.75, 1e-12);
    /* soft labels: an example of label 0.5 is half accepted mass, half
     * rejected. By hand, accepted mass x rejected mass: 0.9 (1) over 0.5
     * (0.5) and 0.1 (1): 1.5; 0.5 (0.5) over 0.1 (1): 0.5; 0.5's own two
     * halves tie: 0.5 x 0.5 x 1/2; out of accepted 1.5 x rejected 1.5 */
    const float s6[] = {0.9f, 0.5f, 0.1f}, y6[] = {1, 0.5f, 0};
    assert_float_equal(accept_auc(s6, y6, 3), (1.5 + 0.5 + 0.125) / (1.5 * 1.5), 1e-12);
    /* one class only: undefined */
    const float one[] = {1, 1};
    assert_float_equal(accept_auc(perfect_s, one, 2), -1.0, 0);
    assert_float_equal(accept_auc(perfect_s, y, 0), -1.0, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auc),
        cmocka_unit_test(test_draft_features_learn),
        cmocka_unit_test(test_greedy_stage0_matches_prefill),
        cmocka_unit_test(test_greedy_chain_needs_acceptance),
        cmocka_unit_test(test_examples_shape),
        cmocka_unit_test(test_training_lowers_bce),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
