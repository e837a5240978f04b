/* test_verify_stats.c - speculative sampling through tree verification is
 * distributed exactly as plain sampling from the target.
 *
 * Model: the tiny golden Llama (tests/golden/data/tiny-gqa). Target sampling:
 * temperature 1.5, top-k 3. Draft: a deliberately different, context-free
 * distribution q (random weights over a set that covers some but not all of
 * the target's candidates, plus tokens the target never emits). Each step
 * sends a tree of 3 children drawn i.i.d. from q, each with 2 children drawn
 * from q. Over many seeded trials, the joint distribution of the first two
 * emitted tokens must match the exact plain-sampling distribution
 * p(t1) * p(t2 | t1), computed from the model's own logits (chi-square,
 * significance 1e-4). A negative control checks the test has the power to
 * reject a wrong distribution (the target at another temperature).
 *
 * Shapes (SpecDec++ adaptive length, draft-svc/drafter_mlp.c): a node's
 * number of children may depend on the tokens already drawn on its path
 * (its own included), as long as it is fixed before its children are drawn.
 * A tree where only a root child holding one particular token gets
 * grandchildren must stay lossless; a tree that drops root children AFTER
 * drawing them, by their value (what the i.i.d. rule forbids), must be
 * caught.
 *
 * All of that is the REJECTION method. Seed-exact sampling (the default,
 * sampling.h) promises more: every trial's two tokens must EQUAL plain
 * seed-exact decoding with the trial's seed, whatever the tree (the
 * forbidden shape included, and trees raced from q with the target's own
 * noise, which get accepted), and the counts must still fit p. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model/transformer.h"
#include "common/spec/verify.h"
#include "tests/harness/stats.h"
#include "tests/harness/test_util.h"

#define ALPHA 1e-4
#ifndef TRIALS
#define TRIALS 12000
#endif
#ifndef PEN_TRIALS
#define PEN_TRIALS 8000
#endif
#define PEN_REPETITION 1.8f
#define PEN_PRESENCE 1.5f
#define BIAS_UP 4.0f
#define TOPK 3
#define NODES 9 /* 3 children, 2 grandchildren each */
#define QSET 10

static const int32_t k_prompt[] = {3, 77, 154, 9, 201, 45, 12};
#define P ((int)(sizeof k_prompt / sizeof k_prompt[0]))

typedef struct fixture {
    specd_model_file *m;
    specd_transformer *t;
    int vocab;
    specd_sampling s;
    specd_token_counts counts; /* per trial: prompt, then the emitted tokens */
    void *scratch;
    long accepted; /* draft tokens accepted over all trials */
} fixture;

static void forward_rows(fixture *f, const int32_t *toks, int n, int n_past, const uint8_t *mask,
                         const int32_t *pos, float *logits) {
    int32_t rows[16];
    for (int i = 0; i < n; i++) rows[i] = i;
    specd_seq_input in = {.slot = 0, .n_past = n_past, .n_new = n, .mask = mask, .pos = pos};
    specd_batch b = {.n_tokens = n, .tokens = toks, .n_seqs = 1, .seqs = &in, .n_out = n,
                     .out_rows = rows, .logits = logits};
    specd_error err = {{0}};
    if (specd_transformer_forward(f->t, &b, &err)) fail_msg("forward: %s", err.msg);
}

/* The penalty history at the start of a trial: the prompt, nothing generated
 * (the pending token is the prompt's last one). */
static void counts_reset_to_prompt(fixture *f) {
    specd_token_counts_reset(&f->counts);
    for (int i = 0; i < P; i++) specd_token_counts_add(&f->counts, k_prompt[i], 0);
}

/* Plain sampling's p(. | prompt, extra...) under f->s, as doubles: the row's
 * logits, adjusted (penalties, bias) for the prompt plus the first
 * n_penalized of the extra tokens as generated ones, then temperature and
 * filters. n_penalized < n_extra models a verifier that forgets the path. */
static void target_probs(fixture *f, const int32_t *extra, int n_extra, int n_penalized,
                         double *out) {
    int32_t toks[8];
    toks[0] = k_prompt[P - 1];
    if (n_extra > 0) memcpy(toks + 1, extra, sizeof(int32_t) * n_extra);
    float *logits = malloc(sizeof(float) * (n_extra + 1) * f->vocab);
    float *probs = malloc(sizeof(float) * f->vocab);
    forward_rows(f, toks, n_extra + 1, P - 1, NULL, NULL, logits);
    float *row = logits + (size_t)n_extra * f->vocab;
    counts_reset_to_prompt(f);
    void *adj = malloc(specd_logits_adjust_scratch_size(n_extra) + 4);
    specd_logits_adjust(&f->s, &f->counts, extra, n_penalized, row, f->vocab, adj);
    free(adj);
    specd_sampling_probs(&f->s, row, f->vocab, probs, f->scratch);
    for (int i = 0; i < f->vocab; i++) out[i] = probs[i];
    free(probs);
    free(logits);
}

/* The target's raw logits after the prompt plus extra (n_extra <= 1). */
static void raw_row(fixture *f, const int32_t *extra, int n_extra, float *out) {
    int32_t toks[2] = {k_prompt[P - 1], n_extra ? extra[0] : 0};
    float *logits = malloc(sizeof(float) * (n_extra + 1) * f->vocab);
    forward_rows(f, toks, n_extra + 1, P - 1, NULL, NULL, logits);
    memcpy(out, logits + (size_t)n_extra * f->vocab, sizeof(float) * f->vocab);
    free(logits);
}

/* Plain decoding's first two tokens under f->s (its seed included) by
 * specd_decode_token, from the raw rows after the prompt (row0) and after
 * each candidate first token (row1[a] after t1_ids[a]). */
static void plain_two(fixture *f, const float *row0, float *const *row1, const int32_t *t1_ids,
                      int32_t *out2) {
    counts_reset_to_prompt(f);
    out2[0] = specd_decode_token(row0, f->vocab, &f->s, &f->counts, 0, f->scratch);
    int a = 0;
    while (a < TOPK && t1_ids[a] != out2[0]) a++;
    assert_true(a < TOPK);
    specd_token_counts_add(&f->counts, out2[0], 1);
    out2[1] = specd_decode_token(row1[a], f->vocab, &f->s, &f->counts, 1, f->scratch);
}

static int top_ids(const double *p, int vocab, int32_t *ids) {
    int n = 0;
    for (int i = 0; i < vocab; i++)
        if (p[i] > 0) ids[n++] = i;
    return n;
}

static uint64_t xs(uint64_t *st) {
    *st ^= *st << 13;
    *st ^= *st >> 7;
    *st ^= *st << 17;
    return *st;
}

static int32_t draw_q(const specd_sparse_dist *q, uint64_t *st) {
    double u = (double)(xs(st) >> 11) / 9007199254740992.0, c = 0;
    for (int j = 0; j < q->n; j++) {
        c += q->probs[j];
        if (u < c) return q->ids[j];
    }
    return q->ids[q->n - 1];
}

/* How each step's tree is shaped: the fixed 3 x 2; grandchildren only under
 * a root child whose token is the key (allowed); root children equal to the
 * key thrown away after the draw (forbidden). */
typedef enum shape { SHAPE_FIXED, SHAPE_BY_TOKEN, SHAPE_DROP_KEY, SHAPE_RACED } shape;

/* The k best of the race over q (dense over the vocabulary) at the seed's
 * noise for output index `stream`: a seed-exact drafter's children. */
static int race_q(const fixture *f, const specd_sparse_dist *q, uint64_t stream, int k,
                  int32_t *ids) {
    float *dense = calloc((size_t)f->vocab, sizeof(float));
    for (int j = 0; j < q->n; j++) dense[q->ids[j]] = q->probs[j];
    int n = specd_race_topk(dense, f->vocab, (specd_race_addr){f->s.seed, stream, 0}, k, ids);
    free(dense);
    return n;
}

/* Runs speculative steps from the prompt until two tokens are emitted. */
static void speculate_two(fixture *f, const specd_sparse_dist *q, uint64_t trial, shape sh,
                          int32_t key, int32_t *out2) {
    int32_t emitted[2 + NODES + 1];
    int n_emit = 0, n_past = P - 1;
    int32_t pending = k_prompt[P - 1];
    uint64_t st = 0x853c49e6748fea9bULL ^ (trial * 0x9e3779b97f4a7c15ULL);
    f->s.seed = trial + 1;
    counts_reset_to_prompt(f);
    specd_error err = {{0}};
    while (n_emit < 2) {
        int32_t tokens[NODES], parents[NODES];
        int n = 0;
        int32_t raced1[3], raced2[2];
        if (sh == SHAPE_RACED) {
            /* the context-free q races the same at every node of a depth */
            assert_int_equal(race_q(f, q, (uint64_t)n_emit, 3, raced1), 3);
            assert_int_equal(race_q(f, q, (uint64_t)n_emit + 1, 2, raced2), 2);
        }
        for (int c = 0; c < 3; c++) {
            int32_t tok = sh == SHAPE_RACED ? raced1[c] : draw_q(q, &st);
            if (sh == SHAPE_DROP_KEY && tok == key) continue;
            int child = n;
            tokens[n] = tok;
            parents[n++] = -1;
            int kids = sh == SHAPE_BY_TOKEN && tok != key ? 0 : 2;
            for (int g = 0; g < kids; g++) {
                tokens[n] = sh == SHAPE_RACED ? raced2[g] : draw_q(q, &st);
                parents[n++] = child;
            }
        }
        specd_sparse_dist qs[NODES + 1];
        for (int i = 0; i <= NODES; i++) qs[i] = *q;
        specd_tree tree = {n, tokens, parents, qs};
        if (specd_tree_validate(&tree, f->vocab, NODES, 1, &err)) fail_msg("%s", err.msg);
        uint8_t mask[(NODES + 1) * (NODES + 1)];
        int32_t pos[NODES + 1], toks[NODES + 1];
        specd_tree_mask(&tree, n_past, mask, pos);
        toks[0] = pending;
        memcpy(toks + 1, tokens, sizeof(int32_t) * (size_t)n);
        float *logits = malloc(sizeof(float) * (NODES + 1) * f->vocab);
        forward_rows(f, toks, n + 1, n_past, mask, pos, logits);
        int32_t acc[NODES], kept[NODES + 1];
        specd_verify_result res = {.accepted = acc, .kept_rows = kept};
        if (specd_verify_walk(&tree, logits, f->vocab, &f->s, &f->counts, (uint64_t)n_emit,
                              f->scratch, &res, &err))
            fail_msg("%s", err.msg);
        free(logits);
        assert_int_equal(specd_transformer_kv_compact(f->t, 0, n_past, kept, 1 + res.n_accepted,
                                                      &err), 0);
        f->accepted += res.n_accepted;
        for (int i = 0; i < res.n_accepted; i++) emitted[n_emit++] = acc[i];
        emitted[n_emit++] = res.next_token;
        for (int i = n_emit - 1 - res.n_accepted; i < n_emit; i++)
            specd_token_counts_add(&f->counts, emitted[i], 1);
        n_past += 1 + res.n_accepted;
        pending = res.next_token;
    }
    out2[0] = emitted[0];
    out2[1] = emitted[1];
}

/* The exact plain-sampling joint distribution of (t1, t2) over the cells
 * t1 in t1_ids, t2 in t2_ids[a]; n_penalized_t1 = 0 leaves t1 out of the
 * penalties of t2 (the negative control of the penalty case). */
static void joint_of(fixture *f, const int32_t *t1_ids, int32_t t2_ids[TOPK][TOPK],
                     int penalize_t1, double *joint) {
    double *p1 = malloc(sizeof(double) * f->vocab), *p2 = malloc(sizeof(double) * f->vocab);
    target_probs(f, NULL, 0, 0, p1);
    for (int a = 0; a < TOPK; a++) {
        target_probs(f, &t1_ids[a], 1, penalize_t1, p2);
        for (int b = 0; b < TOPK; b++) joint[a * TOPK + b] = p1[t1_ids[a]] * p2[t2_ids[a][b]];
    }
    free(p1);
    free(p2);
}

typedef enum control { CONTROL_TEMPERATURE, CONTROL_FORGET_PATH, CONTROL_NONE } control;

/* Runs `trials` seeded speculative trials with sampling `s` and trees shaped
 * by `sh`, and returns the chi-square p-value of the (t1, t2) counts against
 * plain sampling; then checks them against a wrong distribution (`ctl`),
 * which must be rejected. */
static double run_case(const char *what, const specd_sampling *s, long trials, control ctl,
                       int bias_top, shape sh) {
    fixture f = {0};
    specd_error err = {{0}};
    f.m = specd_model_open(test_path("tests/golden/data/tiny-gqa/hf"), &err);
    if (!f.m) fail_msg("%s", err.msg);
    f.vocab = f.m->hp.vocab_size;
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 1}, .n_slots = 1,
                                .max_ctx = P + 32, .max_batch = 16};
    f.t = specd_transformer_create(f.m, &o, &err);
    if (!f.t) fail_msg("%s", err.msg);
    if (specd_token_counts_init(&f.counts, f.vocab, &err)) fail_msg("%s", err.msg);
    f.s = *s;
    size_t scratch = specd_verify_scratch_size(f.vocab, NODES);
    if (specd_sampling_scratch_size(f.vocab) > scratch) scratch = specd_sampling_scratch_size(f.vocab);
    f.scratch = malloc(scratch);

    /* prefill all but the last prompt token, which becomes the pending one */
    float *pl = malloc(sizeof(float) * (P - 1) * f.vocab);
    forward_rows(&f, k_prompt, P - 1, 0, NULL, NULL, pl);
    free(pl);

    double *p1 = malloc(sizeof(double) * f.vocab), *p2 = malloc(sizeof(double) * f.vocab);
    int32_t t1_ids[TOPK], t2_ids[TOPK][TOPK];
    double joint[TOPK * TOPK];
    int32_t bias_ids[TOPK];
    float bias_values[TOPK];
    if (bias_top) {
        /* Bias the first position's candidates up by BIAS_UP everywhere, so
         * they are the candidates of the second position too: then the
         * penalties on t1 (a generated token) decide the second token's
         * weights, and a verifier that ignored the path would be caught. */
        target_probs(&f, NULL, 0, 0, p1);
        assert_int_equal(top_ids(p1, f.vocab, bias_ids), TOPK);
        for (int j = 0; j < TOPK; j++) bias_values[j] = BIAS_UP;
        f.s.n_logit_bias = TOPK;
        f.s.bias_ids = bias_ids;
        f.s.bias_values = bias_values;
    }

    /* exact plain-sampling distribution of (t1, t2) */
    target_probs(&f, NULL, 0, 0, p1);
    assert_int_equal(top_ids(p1, f.vocab, t1_ids), TOPK);
    for (int a = 0; a < TOPK; a++) {
        target_probs(&f, &t1_ids[a], 1, 1, p2);
        assert_int_equal(top_ids(p2, f.vocab, t2_ids[a]), TOPK);
    }
    joint_of(&f, t1_ids, t2_ids, 1, joint);

    /* the draft: random weights over the first candidate of each context,
     * one more of the root's, and tokens the target never emits (so q has
     * mass where p has none and vice versa) */
    int32_t qids[QSET];
    float qprobs[QSET];
    int nq = 0;
    qids[nq++] = t1_ids[0];
    qids[nq++] = t1_ids[2];
    for (int a = 0; a < TOPK; a++) {
        int dup = 0;
        for (int j = 0; j < nq; j++) dup |= qids[j] == t2_ids[a][0];
        if (!dup) qids[nq++] = t2_ids[a][0];
    }
    for (int32_t tok = 0; nq < QSET && tok < f.vocab; tok++)
        if (p1[tok] == 0) {
            int dup = 0;
            for (int j = 0; j < nq; j++) dup |= qids[j] == tok;
            if (!dup) qids[nq++] = tok;
        }
    double wsum = 0, w[QSET];
    uint64_t st = 42;
    for (int j = 0; j < nq; j++) wsum += w[j] = 0.2 + (double)(xs(&st) % 1000) / 1000.0;
    for (int j = 0; j < nq; j++) qprobs[j] = (float)(w[j] / wsum);
    specd_sparse_dist q = {nq, qids, qprobs};

    /* Seed-exact: the raw rows plain decoding reads, for the equality check */
    int exact = f.s.method == SPECD_SAMPLING_SEED_EXACT;
    float *row0 = NULL, *row1[TOPK] = {NULL};
    if (exact) {
        row0 = malloc(sizeof(float) * f.vocab);
        raw_row(&f, NULL, 0, row0);
        for (int a = 0; a < TOPK; a++) {
            row1[a] = malloc(sizeof(float) * f.vocab);
            raw_row(&f, &t1_ids[a], 1, row1[a]);
        }
    }

    long counts[TOPK * TOPK] = {0}, outside = 0;
    for (long trial = 0; trial < trials; trial++) {
        int32_t two[2];
        speculate_two(&f, &q, (uint64_t)trial, sh, t1_ids[0], two);
        if (exact) {
            int32_t plain[2];
            plain_two(&f, row0, row1, t1_ids, plain); /* f.s.seed is this trial's */
            if (two[0] != plain[0] || two[1] != plain[1])
                fail_msg("%s: trial %ld (seed %llu): speculative %d %d, plain %d %d", what, trial,
                         (unsigned long long)f.s.seed, two[0], two[1], plain[0], plain[1]);
        }
        int cell = -1;
        for (int a = 0; a < TOPK; a++)
            for (int b = 0; b < TOPK; b++)
                if (two[0] == t1_ids[a] && two[1] == t2_ids[a][b]) cell = a * TOPK + b;
        if (cell < 0) outside++;
        else counts[cell]++;
    }
    assert_int_equal(outside, 0); /* nothing outside the target's support */
    double pv = chi2_fit(counts, joint, TOPK * TOPK, trials);
    printf("  %s: speculative (t1, t2) vs plain sampling: chi-square p-value %.4g over %ld "
           "trials, %.3f drafts accepted per trial%s\n", what, pv, trials,
           (double)f.accepted / (double)trials, exact ? ", every trial equal to plain" : "");
    free(row0);
    for (int a = 0; a < TOPK; a++) free(row1[a]);

    double joint_wrong[TOPK * TOPK];
    const char *ctl_what = NULL;
    if (ctl == CONTROL_NONE) {
        /* the case is its own negative control */
    } else if (ctl == CONTROL_TEMPERATURE) {
        /* the target at temperature 1.0 (same support, different weights) */
        f.s.temperature = 1.0f;
        joint_of(&f, t1_ids, t2_ids, 1, joint_wrong);
        ctl_what = "target at T=1.0";
    } else {
        /* penalties that see the history but not the path: what a verifier
         * that adjusted every row for the pending token's history alone
         * would sample */
        joint_of(&f, t1_ids, t2_ids, 0, joint_wrong);
        ctl_what = "penalties without the path";
    }
    if (ctl_what) {
        double pv_wrong = chi2_fit(counts, joint_wrong, TOPK * TOPK, trials);
        printf("  %s: negative control (%s): p-value %.3g (must be < %g)\n", what, ctl_what,
               pv_wrong, ALPHA);
        assert_true(pv_wrong < ALPHA);
    }

    free(p1);
    free(p2);
    free(f.scratch);
    specd_token_counts_free(&f.counts);
    specd_transformer_free(f.t);
    specd_model_close(f.m);
    return pv;
}

static void run_lossless_case(const char *what, const specd_sampling *s, long trials,
                              control ctl, int bias_top) {
    assert_true(run_case(what, s, trials, ctl, bias_top, SHAPE_FIXED) >= ALPHA);
}

static void test_tree_sampling_lossless(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    s.method = SPECD_SAMPLING_REJECTION;
    s.temperature = 1.5f;
    s.top_k = TOPK;
    run_lossless_case("plain", &s, TRIALS, CONTROL_TEMPERATURE, 0);
}

/* Repetition and presence penalties plus logit bias: t2's distribution
 * depends on t1 (a generated token) and both depend on the prompt, so the
 * walk must adjust each row for its own path. */
static void test_tree_sampling_lossless_penalties(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    s.method = SPECD_SAMPLING_REJECTION;
    s.temperature = 1.5f;
    s.top_k = TOPK;
    s.repetition_penalty = PEN_REPETITION;
    s.presence_penalty = PEN_PRESENCE;
    run_lossless_case("penalties + bias", &s, PEN_TRIALS, CONTROL_FORGET_PATH, 1);
}

/* Adaptive shapes: children counts that depend on drawn ancestors keep the
 * output exact; dropping drawn siblings by value does not. */
static void test_tree_sampling_adaptive_shapes(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    s.method = SPECD_SAMPLING_REJECTION;
    s.temperature = 1.5f;
    s.top_k = TOPK;
    double pv = run_case("grandchildren by the child's token", &s, TRIALS, CONTROL_TEMPERATURE,
                         0, SHAPE_BY_TOKEN);
    assert_true(pv >= ALPHA);
    pv = run_case("drawn children dropped by value (forbidden)", &s, TRIALS / 3, CONTROL_NONE, 0,
                  SHAPE_DROP_KEY);
    assert_true(pv < ALPHA);
}

/* Seed-exact: any tree, even one that drops drawn children by value,
 * gives plain decoding's tokens (checked per trial in run_case) and so p's
 * distribution; trees raced from q with the target's noise get accepted. */
static void test_seed_exact_any_tree(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    assert_int_equal(s.method, SPECD_SAMPLING_SEED_EXACT); /* the default */
    s.temperature = 1.5f;
    s.top_k = TOPK;
    assert_true(run_case("seed-exact, children dropped by value", &s, TRIALS / 2,
                         CONTROL_TEMPERATURE, 0, SHAPE_DROP_KEY) >= ALPHA);
    assert_true(run_case("seed-exact, raced from q", &s, TRIALS / 2, CONTROL_TEMPERATURE, 0,
                         SHAPE_RACED) >= ALPHA);
    s.repetition_penalty = PEN_REPETITION;
    s.presence_penalty = PEN_PRESENCE;
    assert_true(run_case("seed-exact, penalties + bias, raced", &s, PEN_TRIALS / 2,
                         CONTROL_FORGET_PATH, 1, SHAPE_RACED) >= ALPHA);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_sampling_lossless),
        cmocka_unit_test(test_tree_sampling_lossless_penalties),
        cmocka_unit_test(test_tree_sampling_adaptive_shapes),
        cmocka_unit_test(test_seed_exact_any_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
