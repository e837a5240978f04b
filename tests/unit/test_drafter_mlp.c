/* test_drafter_mlp.c - the MLP speculator drafter (draft-svc/drafter_mlp.c).
 *
 * Uses the tiny speculators of tests/golden/data/mlp-spec-* (the model itself
 * is checked against its reference in tests/golden/test_mlp_speculator.c).
 * Checks tree shapes (node counts per depth, parents before children, depth
 * <= n_predict, capacity), that a greedy chain with candidates = 1 is the
 * stage-by-stage argmax, that sampling-mode q's are distributions holding
 * every child, that one batched call equals separate calls, that a fixed
 * seed gives the same tree, and that the request's logit adjustments reach
 * the draft. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/spec/sampling.h"
#include "common/spec/tree.h"
#include "common/util/rng.h"
#include "draft-svc/drafter.h"
#include "draft-svc/tree_builder.h"
#include "common/model/mlp_speculator.h"
#include "tests/harness/test_util.h"

#define UNTIED "tests/golden/data/mlp-spec-untied" /* vocab 100, emb 32, top_k [4,3,2] */
#define SHARDED "tests/golden/data/mlp-spec-sharded" /* vocab 80, n_predict 4, tied 0 */
#define CAP 256
#define QPOOL (CAP * 128)

typedef struct fixture {
    specd_drafter *d;
    int vocab, emb, n_predict;
    float hidden[4][64];
    int32_t history[4][8];
    specd_token_counts counts[4];
    specd_tree_buf out[4];
} fixture;

static specd_drafter *open_drafter(const char *rel, const int *topk_override) {
    specd_mlp_drafter_opts o = {.path = test_path(rel), .n_threads = 1};
    if (topk_override) memcpy(o.top_k_per_stage, topk_override, sizeof o.top_k_per_stage);
    specd_error err = {{0}};
    specd_drafter *d = specd_mlp_drafter_create(&o, &err);
    if (!d) fail_msg("%s", err.msg);
    return d;
}

static void fixture_init(fixture *f, const char *rel, const int *topk_override) {
    memset(f, 0, sizeof *f);
    f->d = open_drafter(rel, topk_override);
    f->vocab = f->d->vocab;
    f->emb = f->d->hidden_size;
    f->n_predict = f->d->max_depth;
    assert_true(f->emb <= 64);
    specd_error err = {{0}};
    for (int j = 0; j < 4; j++) {
        test_fill_random(f->hidden[j], (size_t)f->emb, 100 + j, 2.0f);
        for (int i = 0; i < 8; i++) f->history[j][i] = (int32_t)((j * 31 + i * 7 + 3) % f->vocab);
        assert_int_equal(specd_token_counts_init(&f->counts[j], f->vocab, &err), 0);
        for (int i = 0; i < 8; i++) specd_token_counts_add(&f->counts[j], f->history[j][i], i >= 5);
        assert_int_equal(specd_tree_buf_init(&f->out[j], CAP, QPOOL, &err), 0);
    }
}

static void fixture_free(fixture *f) {
    for (int j = 0; j < 4; j++) {
        specd_token_counts_free(&f->counts[j]);
        specd_tree_buf_free(&f->out[j]);
    }
    specd_drafter_free(f->d);
}

static specd_draft_job make_job(fixture *f, int j, const specd_sampling *s, int candidates,
                                int depth) {
    specd_tree_buf_reset(&f->out[j]);
    return (specd_draft_job){.history = f->history[j], .n_history = 8, .n_prompt = 5,
                             .hidden = f->hidden[j], .sampling = s, .counts = &f->counts[j],
                             .position = 3, .candidates = candidates, .depth = depth,
                             .out = &f->out[j]};
}

static void propose(fixture *f, specd_draft_job *jobs, int n) {
    specd_error err = {{0}};
    if (specd_drafter_propose(f->d, jobs, n, &err)) fail_msg("propose: %s", err.msg);
}

/* Structural checks every tree must pass; returns its largest depth. */
static int check_tree(const fixture *f, const specd_tree_buf *b, int sampling) {
    specd_tree t;
    specd_tree_buf_view(b, sampling, &t);
    specd_error err = {{0}};
    if (b->n_nodes > 0 && specd_tree_validate(&t, f->vocab, CAP, sampling, &err))
        fail_msg("invalid tree: %s", err.msg);
    int max_depth = 0;
    for (int i = 0; i < b->n_nodes; i++) {
        int p = b->parents[i];
        assert_true(p >= -1 && p < i);
        assert_int_equal(b->depth[i], p < 0 ? 1 : b->depth[p] + 1);
        assert_true(b->depth[i] <= f->n_predict);
        /* a path only gets less likely as it grows */
        if (p >= 0) assert_true(b->logq[i] <= b->logq[p] + 1e-6f);
        assert_true(b->logq[i] <= 1e-6f);
        if (b->depth[i] > max_depth) max_depth = b->depth[i];
    }
    return max_depth;
}

static int count_at_depth(const specd_tree_buf *b, int d) {
    int n = 0;
    for (int i = 0; i < b->n_nodes; i++) n += b->depth[i] == d;
    return n;
}

/* ---- greedy ------------------------------------------------------------------------ */

static void test_greedy_chain_is_argmax(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 0.0f;
    for (int set = 0; set < 2; set++) {
        fixture f;
        fixture_init(&f, set ? SHARDED : UNTIED, NULL);
        specd_draft_job job = make_job(&f, 0, &s, 1, 16);
        propose(&f, &job, 1);
        const specd_tree_buf *b = &f.out[0];
        assert_int_equal(b->n_nodes, f.n_predict); /* depth clipped to n_predict */
        check_tree(&f, b, 0);

        /* the same chain stage by stage with the speculator itself */
        specd_error err = {{0}};
        specd_mlp_speculator *sp = specd_mlp_speculator_load(test_path(set ? SHARDED : UNTIED),
                                                             1, &err);
        assert_non_null(sp);
        const specd_mlp_spec_config *c = specd_mlp_speculator_config(sp);
        float in[64], st[64], *logits = malloc(sizeof(float) * (size_t)c->vocab_size);
        memcpy(in, f.hidden[0], sizeof(float) * (size_t)c->emb_dim);
        int32_t tok = f.history[0][7];
        for (int i = 0; i < c->n_predict; i++) {
            assert_int_equal(specd_mlp_speculator_stage(sp, i, 1, in, &tok, st, logits, &err), 0);
            tok = specd_argmax(logits, c->vocab_size);
            assert_int_equal(b->tokens[i], tok);
            assert_int_equal(b->parents[i], i - 1);
            memcpy(in, st, sizeof(float) * (size_t)c->inner_dim);
        }
        free(logits);
        specd_mlp_speculator_free(sp);
        fixture_free(&f);
    }
}

static void test_greedy_tree_shape(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 0.0f;
    fixture f;
    fixture_init(&f, UNTIED, NULL); /* top_k [4, 3, 2] */
    /* candidates 4: depth 1 has all 4 of the root's top-4; depth 2 keeps 4
     * of 4*3; depth 3 keeps 4 of 4*2 */
    specd_draft_job job = make_job(&f, 0, &s, 4, 3);
    propose(&f, &job, 1);
    assert_int_equal(check_tree(&f, &f.out[0], 0), 3);
    assert_int_equal(count_at_depth(&f.out[0], 1), 4);
    assert_int_equal(count_at_depth(&f.out[0], 2), 4);
    assert_int_equal(count_at_depth(&f.out[0], 3), 4);
    assert_int_equal(f.out[0].n_nodes, 12);
    /* children of one parent are distinct tokens (top-k, not samples) */
    for (int i = 0; i < f.out[0].n_nodes; i++)
        for (int j = i + 1; j < f.out[0].n_nodes; j++)
            if (f.out[0].parents[i] == f.out[0].parents[j])
                assert_int_not_equal(f.out[0].tokens[i], f.out[0].tokens[j]);

    /* candidates 100: nothing is pruned, the full 4 x 3 x 2 tree */
    job = make_job(&f, 0, &s, 100, 3);
    propose(&f, &job, 1);
    check_tree(&f, &f.out[0], 0);
    assert_int_equal(count_at_depth(&f.out[0], 1), 4);
    assert_int_equal(count_at_depth(&f.out[0], 2), 12);
    assert_int_equal(count_at_depth(&f.out[0], 3), 24);

    /* depth 2 stops after two stages */
    job = make_job(&f, 0, &s, 3, 2);
    propose(&f, &job, 1);
    assert_int_equal(check_tree(&f, &f.out[0], 0), 2);
    assert_int_equal(f.out[0].n_nodes, 3 + 3);

    /* a small tree buffer: filled, never overrun, still a valid tree */
    specd_tree_buf small;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&small, 5, 0, &err), 0);
    job = make_job(&f, 0, &s, 4, 3);
    job.out = &small;
    propose(&f, &job, 1);
    assert_int_equal(small.n_nodes, 5);
    check_tree(&f, &small, 0);
    specd_tree_buf_free(&small);
    fixture_free(&f);

    /* the options' top-k override: 1 per stage gives a chain whatever the
     * candidates */
    int ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    fixture_init(&f, UNTIED, ones);
    job = make_job(&f, 0, &s, 5, 3);
    propose(&f, &job, 1);
    assert_int_equal(f.out[0].n_nodes, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(f.out[0].parents[i], i - 1);
    fixture_free(&f);
}

/* A logit bias against the argmax token moves the draft off it: the drafter
 * applies the request's adjustments, as the target will. */
static void test_greedy_applies_adjustments(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 0.0f;
    fixture f;
    fixture_init(&f, UNTIED, NULL);
    specd_draft_job job = make_job(&f, 0, &s, 1, 1);
    propose(&f, &job, 1);
    int32_t first = f.out[0].tokens[0];
    float minus = -100.0f;
    s.n_logit_bias = 1;
    s.bias_ids = &first;
    s.bias_values = &minus;
    job = make_job(&f, 0, &s, 1, 1);
    propose(&f, &job, 1);
    assert_int_equal(f.out[0].n_nodes, 1);
    assert_int_not_equal(f.out[0].tokens[0], first);
    fixture_free(&f);
}

/* ---- sampling ---------------------------------------------------------------------- */

static void check_q(const fixture *f, const specd_tree_buf *b) {
    /* every node with children, and the root, has a q that sums to 1 and
     * holds every child */
    for (int p = -1; p < b->n_nodes; p++) {
        int has_child = 0;
        for (int i = 0; i < b->n_nodes; i++) has_child |= b->parents[i] == p;
        if (!has_child) continue;
        const specd_sparse_dist *q = &b->q[p + 1];
        assert_true(q->n >= 1 && q->n <= f->vocab);
        double sum = 0;
        for (int k = 0; k < q->n; k++) {
            assert_true(q->probs[k] > 0.0f);
            sum += q->probs[k];
        }
        assert_true(fabs(sum - 1.0) < 1e-5);
        for (int i = 0; i < b->n_nodes; i++) {
            if (b->parents[i] != p) continue;
            int found = -1;
            for (int k = 0; k < q->n; k++)
                if (q->ids[k] == b->tokens[i]) found = k;
            assert_true(found >= 0);
            /* logq is the parent's plus log q(child) */
            float base = p < 0 ? 0.0f : b->logq[p];
            assert_float_equal(b->logq[i], base + logf(q->probs[found]), 1e-5);
        }
    }
}

static void test_sampling_shape_and_q(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 1.3f;
    s.method = SPECD_SAMPLING_REJECTION; /* q-carrying trees */
    s.top_k = 30;
    s.top_p = 0.95f;
    s.seed = 42;
    fixture f;
    fixture_init(&f, SHARDED, NULL); /* n_predict 4 */
    specd_draft_job job = make_job(&f, 0, &s, 3, 4);
    propose(&f, &job, 1);
    const specd_tree_buf *b = &f.out[0];
    /* 3 chains of 4: the root has 3 children, every other inner node 1 */
    assert_int_equal(check_tree(&f, b, 1), 4);
    assert_int_equal(b->n_nodes, 12);
    for (int d = 1; d <= 4; d++) assert_int_equal(count_at_depth(b, d), 3);
    for (int p = 0; p < b->n_nodes; p++) {
        int kids = 0;
        for (int i = 0; i < b->n_nodes; i++) kids += b->parents[i] == p;
        assert_int_equal(kids, b->depth[p] < 4 ? 1 : 0);
    }
    check_q(&f, b);
    /* top_k 30 bounds every q */
    for (int p = -1; p < b->n_nodes; p++) assert_true(b->q[p + 1].n <= 30);

    /* a tree buffer too small for 3 x 4: fewer chains, same rules */
    specd_tree_buf small;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&small, 9, 9 * 100, &err), 0);
    job = make_job(&f, 0, &s, 3, 4);
    job.out = &small;
    propose(&f, &job, 1);
    assert_int_equal(small.n_nodes, 8); /* 2 chains of 4 */
    check_tree(&f, &small, 1);
    check_q(&f, &small);
    specd_tree_buf_free(&small);
    fixture_free(&f);
}

static int same_tree(const specd_tree_buf *a, const specd_tree_buf *b) {
    if (a->n_nodes != b->n_nodes) return 0;
    for (int i = 0; i < a->n_nodes; i++)
        if (a->tokens[i] != b->tokens[i] || a->parents[i] != b->parents[i] ||
            a->logq[i] != b->logq[i])
            return 0;
    return 1;
}

static void test_sampling_deterministic(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 1.5f;
    s.method = SPECD_SAMPLING_REJECTION; /* q-carrying trees */
    s.seed = 7;
    fixture f;
    fixture_init(&f, UNTIED, NULL);
    specd_tree_buf first;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&first, CAP, 0, &err), 0);
    specd_draft_job job = make_job(&f, 0, &s, 4, 3);
    propose(&f, &job, 1);
    check_q(&f, &f.out[0]);
    first.n_nodes = f.out[0].n_nodes;
    memcpy(first.tokens, f.out[0].tokens, sizeof(int32_t) * (size_t)first.n_nodes);
    memcpy(first.parents, f.out[0].parents, sizeof(int32_t) * (size_t)first.n_nodes);
    memcpy(first.logq, f.out[0].logq, sizeof(float) * (size_t)first.n_nodes);
    /* same seed and position: the same tree */
    job = make_job(&f, 0, &s, 4, 3);
    propose(&f, &job, 1);
    assert_true(same_tree(&first, &f.out[0]));
    /* other seeds: other draws (at temperature 1.5 over 100 tokens, twelve
     * identical draws for all of 8 seeds would be astronomically unlikely) */
    int differ = 0;
    for (uint64_t seed = 8; seed < 16; seed++) {
        s.seed = seed;
        job = make_job(&f, 0, &s, 4, 3);
        propose(&f, &job, 1);
        differ += !same_tree(&first, &f.out[0]);
    }
    assert_true(differ > 0);
    /* the chains of one tree are drawn at distinct addresses: with 4
     * chains at temperature 1.5 they are not all the same sequence */
    s.seed = 7;
    job = make_job(&f, 0, &s, 4, 3);
    propose(&f, &job, 1);
    int leaves_differ = 0;
    for (int i = 0; i < f.out[0].n_nodes; i++)
        for (int k = i + 1; k < f.out[0].n_nodes; k++)
            if (f.out[0].depth[i] == 3 && f.out[0].depth[k] == 3 &&
                f.out[0].tokens[i] != f.out[0].tokens[k])
                leaves_differ = 1;
    assert_true(leaves_differ);
    specd_tree_buf_free(&first);
    fixture_free(&f);
}

/* Seed-exact sampling: the sampling shape (chains), no q, and each node's
 * children are the race's best over its q with the request's own noise at
 * the children's output index: the root's, checked against the speculator
 * and specd_race_topk directly; then each chain continues with the race
 * winner of its own row. */
static void test_seed_exact_children_are_the_race(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 0.8f;
    s.top_k = 20;
    s.seed = 1234;
    fixture f;
    fixture_init(&f, SHARDED, NULL); /* n_predict 4 */
    specd_draft_job job = make_job(&f, 0, &s, 3, 4);
    propose(&f, &job, 1);
    const specd_tree_buf *b = &f.out[0];
    assert_int_equal(check_tree(&f, b, 0), 4); /* valid without any q */
    assert_int_equal(b->n_nodes, 12);
    for (int p = -1; p < b->n_nodes; p++) assert_int_equal(b->q[p + 1].n, 0);

    specd_error err = {{0}};
    specd_mlp_speculator *sp = specd_mlp_speculator_load(test_path(SHARDED), 1, &err);
    assert_non_null(sp);
    const specd_mlp_spec_config *c = specd_mlp_speculator_config(sp);
    int V = c->vocab_size;
    float in[64], st[64], *logits = malloc(sizeof(float) * (size_t)V);
    float *probs = malloc(sizeof(float) * (size_t)V);
    void *scratch = malloc(specd_sampling_scratch_size(V));
    int32_t tok = f.history[0][7];
    assert_int_equal(specd_mlp_speculator_stage(sp, 0, 1, f.hidden[0], &tok, st, logits, &err),
                     0);
    /* the row's adjustments (none here but the history's counts, which
     * only penalties read) then the request's sampling */
    specd_sampling_probs(&s, logits, V, probs, scratch);
    int32_t want[3];
    assert_int_equal(specd_race_topk(probs, V, (specd_race_addr){s.seed, job.position, 0}, 3, want),
                     3);
    int root_kids = 0;
    for (int i = 0; i < b->n_nodes; i++)
        if (b->parents[i] == -1) assert_int_equal(b->tokens[i], want[root_kids++]);
    assert_int_equal(root_kids, 3);
    /* chain 0 to the end, stage by stage: the winner of each row */
    int node = -1;
    for (int d = 0; d < 4; d++) {
        int child = -1;
        for (int i = 0; i < b->n_nodes && child < 0; i++)
            if (b->parents[i] == node) child = i;
        assert_true(child >= 0);
        if (d > 0) {
            memcpy(in, st, sizeof(float) * (size_t)c->inner_dim);
            assert_int_equal(specd_mlp_speculator_stage(sp, d, 1, in, &tok, st, logits, &err), 0);
            specd_sampling_probs(&s, logits, V, probs, scratch);
            assert_int_equal(b->tokens[child],
                             specd_race_pick(probs, V, (specd_race_addr){s.seed, job.position + (uint64_t)d, 0}));
        }
        tok = b->tokens[child];
        node = child;
    }
    free(scratch);
    free(probs);
    free(logits);
    specd_mlp_speculator_free(sp);
    fixture_free(&f);
}

/* The shipped speculator (8k draft ids over SmolLM2's 49k), as a drafter
 * and as the bare model the tests compare its trees with, with the buffers
 * those comparisons use: a random hidden state, stage states, target-width
 * rows (aux starts all zero) and an empty history count. */
typedef struct shipped {
    specd_drafter *d;
    specd_mlp_speculator *sp;
    int V, E, I;
    float *hidden, *st, *in;
    float *logits, *probs, *aux;
    void *scratch;
    specd_token_counts counts;
} shipped;

static void shipped_open(shipped *x, uint64_t seed) {
    const char *dir = "models/SmolLM2-135M-Instruct.speculator";
    x->d = open_drafter(dir, NULL);
    specd_error err = {{0}};
    x->sp = specd_mlp_speculator_load(test_path(dir), 1, &err);
    if (!x->sp) fail_msg("%s", err.msg);
    const specd_mlp_spec_config *c = specd_mlp_speculator_config(x->sp);
    assert_true(c->vocab_size < c->target_vocab_size); /* a reduced vocabulary */
    x->V = c->target_vocab_size, x->E = c->emb_dim, x->I = c->inner_dim;
    x->hidden = malloc(sizeof(float) * (size_t)x->E);
    x->st = malloc(sizeof(float) * (size_t)x->I);
    x->in = malloc(sizeof(float) * (size_t)x->I);
    x->logits = malloc(sizeof(float) * (size_t)x->V);
    x->probs = malloc(sizeof(float) * (size_t)x->V);
    x->aux = calloc((size_t)x->V, sizeof(float));
    x->scratch = malloc(specd_sampling_scratch_size(x->V));
    assert_true(x->hidden && x->st && x->in && x->logits && x->probs && x->aux && x->scratch);
    test_fill_random(x->hidden, (size_t)x->E, seed, 2.0f);
    assert_int_equal(specd_token_counts_init(&x->counts, x->V, &err), 0);
}

static void shipped_close(shipped *x) {
    specd_token_counts_free(&x->counts);
    free(x->scratch);
    free(x->aux);
    free(x->probs);
    free(x->logits);
    free(x->in);
    free(x->st);
    free(x->hidden);
    specd_mlp_speculator_free(x->sp);
    specd_drafter_free(x->d);
}

/* Seed-exact over a reduced vocabulary (the shipped speculator: 8k draft
 * ids over SmolLM2's 49k): the drafter takes q over the draft ids alone
 * and races it scattered into target ids. The children must be what the
 * race picks over q taken across the full target-width row, -inf outside
 * the map: the same distribution, up to the rounding of its sum. Plain
 * temperature and top-p, and a greedy job in the same call. */
static void test_seed_exact_reduced_vocab(void **state) {
    (void)state;
    shipped x;
    shipped_open(&x, 77);
    specd_drafter *d = x.d;
    specd_mlp_speculator *sp = x.sp;
    specd_error err = {{0}};
    int V = x.V, I = x.I;
    float *hidden = x.hidden, *st = x.st, *in = x.in, *logits = x.logits, *probs = x.probs;
    void *scratch = x.scratch;
    int32_t history[4] = {1, 504, 2683, 28};
    specd_token_counts *counts = &x.counts;
    specd_tree_buf out[2];
    for (int j = 0; j < 2; j++) assert_int_equal(specd_tree_buf_init(&out[j], CAP, QPOOL, &err), 0);
    for (int cfg = 0; cfg < 2; cfg++) {
        specd_sampling s, greedy;
        specd_sampling_init(&s);
        specd_sampling_init(&greedy);
        s.temperature = 0.8f;
        s.top_p = cfg ? 0.9f : 1.0f;
        s.seed = 99 + (uint64_t)cfg;
        specd_draft_job jobs[2];
        for (int j = 0; j < 2; j++) {
            specd_tree_buf_reset(&out[j]);
            jobs[j] = (specd_draft_job){.history = history, .n_history = 4, .n_prompt = 4,
                                        .hidden = hidden, .sampling = j ? &greedy : &s,
                                        .counts = counts, .position = 11, .candidates = 2,
                                        .depth = 3, .out = &out[j]};
        }
        if (specd_drafter_propose(d, jobs, 2, &err)) fail_msg("propose: %s", err.msg);
        const specd_tree_buf *b = &out[0];
        assert_true(b->n_nodes >= 2);
        /* the root's two children: the race's two best over full-width q */
        int32_t tok = history[3];
        assert_int_equal(specd_mlp_speculator_stage(sp, 0, 1, hidden, &tok, st, logits, &err), 0);
        specd_sampling_probs(&s, logits, V, probs, scratch);
        int32_t want[2];
        assert_int_equal(specd_race_topk(probs, V, (specd_race_addr){s.seed, 11, 0}, 2, want), 2);
        int kids = 0;
        for (int i = 0; i < b->n_nodes; i++)
            if (b->parents[i] == -1) {
                assert_true(kids < 2);
                assert_int_equal(b->tokens[i], want[kids++]);
                assert_true(fabsf(b->logq[i] - logf(probs[want[kids - 1]])) < 1e-5f);
            }
        assert_int_equal(kids, 2);
        /* chain 0 goes on with each row's winner */
        int node = -1;
        for (int dd = 0; dd < 3; dd++) {
            int child = -1;
            for (int i = 0; i < b->n_nodes && child < 0; i++)
                if (b->parents[i] == node) child = i;
            if (child < 0) break; /* the tree may end early */
            if (dd > 0) {
                memcpy(in, st, sizeof(float) * (size_t)I);
                assert_int_equal(specd_mlp_speculator_stage(sp, dd, 1, in, &tok, st, logits, &err),
                                 0);
                specd_sampling_probs(&s, logits, V, probs, scratch);
                assert_int_equal(b->tokens[child],
                                 specd_race_pick(probs, V, (specd_race_addr){s.seed, 11 + (uint64_t)dd, 0}));
            }
            tok = b->tokens[child];
            node = child;
        }
        /* the greedy job of the same call: the argmax is one of its root's children */
        assert_true(out[1].n_nodes >= 1);
        assert_int_equal(specd_mlp_speculator_stage(sp, 0, 1, hidden, &history[3], st, logits, &err),
                         0);
        int am = specd_argmax(logits, V), found = 0;
        for (int i = 0; i < out[1].n_nodes; i++) found |= out[1].parents[i] == -1 && out[1].tokens[i] == am;
        assert_true(found);
    }
    for (int j = 0; j < 2; j++) specd_tree_buf_free(&out[j]);
    shipped_close(&x);
}

/* Rejection sampling with the shipped speculator (a reduced vocabulary,
 * whose q is taken over its 8k draft ids): the root's q as sent is the
 * full-width q (the speculator's logits over the target's vocabulary, -inf
 * outside the map) cut to its SPECD_DRAFT_Q_MAX best, in target-id order,
 * summing to 1; and every root child is the draw of its chain's uniform
 * from that q, as the dense target-width walk makes it. */
static void test_rejection_reduced_vocab(void **state) {
    (void)state;
    shipped x;
    shipped_open(&x, 78);
    specd_drafter *d = x.d;
    specd_mlp_speculator *sp = x.sp;
    specd_error err = {{0}};
    int V = x.V;
    float *hidden = x.hidden, *st = x.st, *logits = x.logits, *probs = x.probs;
    float *dense = x.aux; /* all zero */
    void *scratch = x.scratch;
    int32_t history[4] = {1, 504, 2683, 28};
    specd_token_counts *counts = &x.counts;
    specd_tree_buf out;
    assert_int_equal(specd_tree_buf_init(&out, CAP, QPOOL, &err), 0);
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 0.8f;
    s.method = SPECD_SAMPLING_REJECTION;
    s.seed = 5;
    specd_draft_job job = {.history = history, .n_history = 4, .n_prompt = 4, .hidden = hidden,
                           .sampling = &s, .counts = counts, .position = 11, .candidates = 3,
                           .depth = 2, .out = &out};
    if (specd_drafter_propose(d, &job, 1, &err)) fail_msg("propose: %s", err.msg);
    const specd_sparse_dist *q = &out.q[0];
    assert_int_equal(q->n, SPECD_DRAFT_Q_MAX);
    /* the full-width q, from the test's own pass */
    assert_int_equal(specd_mlp_speculator_stage(sp, 0, 1, hidden, &history[3], st, logits, &err), 0);
    specd_sampling_probs(&s, logits, V, probs, scratch);
    double sum = 0, kept_mass = 0;
    float kept_min = 1.0f;
    for (int k = 0; k < q->n; k++) {
        if (k) assert_true(q->ids[k - 1] < q->ids[k]);
        assert_true(q->ids[k] >= 0 && q->ids[k] < V);
        assert_true(probs[q->ids[k]] > 0.0f);
        sum += q->probs[k];
        kept_mass += probs[q->ids[k]];
        if (probs[q->ids[k]] < kept_min) kept_min = probs[q->ids[k]];
        dense[q->ids[k]] = q->probs[k];
    }
    assert_true(fabs(sum - 1.0) < 1e-5);
    for (int k = 0; k < q->n; k++) /* renormalized by the kept mass */
        assert_true(fabsf(q->probs[k] - (float)(probs[q->ids[k]] / kept_mass)) <= 1e-5f * q->probs[k] + 1e-9f);
    /* nothing left out beats what was kept (up to the rounding of two sums) */
    for (int i = 0; i < V; i++)
        if (dense[i] == 0.0f) assert_true(probs[i] <= kept_min * (1.0f + 1e-5f));
    /* the root's children: chain c's uniform drawn from q as a dense walk */
    int kids = 0;
    for (int i = 0; i < out.n_nodes; i++) {
        if (out.parents[i] != -1) continue;
        double u = specd_rng_uniform(s.seed ^ SPECD_DRAFT_RNG_SALT, 11, (uint64_t)kids);
        assert_int_equal(out.tokens[i], specd_sample_from_probs(dense, V, u));
        kids++;
    }
    assert_int_equal(kids, 3);
    specd_tree_buf_free(&out);
    shipped_close(&x);
}

/* Penalties and a logit bias with the shipped speculator: its rows stay at
 * the draft ids, and still give the target-width row's choices after the
 * adjustments. A greedy job's root children are the top-k of the adjusted
 * full-width logits (a bias of -100 pushes out their unadjusted best); a
 * seed-exact job's are the race's picks over their q; and a job without
 * adjustments in the same call gets the tree it gets alone. */
static void test_adjusted_reduced_vocab(void **state) {
    (void)state;
    shipped x;
    shipped_open(&x, 79);
    specd_drafter *d = x.d;
    specd_mlp_speculator *sp = x.sp;
    specd_error err = {{0}};
    int V = x.V;
    float *hidden = x.hidden, *st = x.st, *raw = x.aux, *logits = x.logits, *probs = x.probs;
    void *scratch = x.scratch;
    int32_t history[6] = {1, 504, 2683, 28, 2683, 28};
    specd_token_counts *counts = &x.counts;
    for (int i = 0; i < 6; i++) specd_token_counts_add(counts, history[i], i >= 4);
    int32_t tok = history[5];
    assert_int_equal(specd_mlp_speculator_stage(sp, 0, 1, hidden, &tok, st, raw, &err), 0);
    int32_t best = specd_argmax(raw, V);
    float minus = -100.0f;

    specd_sampling greedy, race, plain;
    specd_sampling_init(&greedy);
    greedy.temperature = 0.0f;
    greedy.repetition_penalty = 1.3f;
    greedy.n_logit_bias = 1;
    greedy.bias_ids = &best;
    greedy.bias_values = &minus;
    specd_sampling_init(&race);
    race.temperature = 0.8f;
    race.seed = 17;
    race.frequency_penalty = 0.5f;
    race.presence_penalty = 0.2f;
    race.n_logit_bias = 1;
    race.bias_ids = &best;
    race.bias_values = &minus;
    specd_sampling_init(&plain);
    plain.temperature = 0.0f;
    const specd_sampling *which[3] = {&greedy, &race, &plain};
    int cands[3] = {5, 2, 3};
    specd_tree_buf out[3], alone;
    for (int j = 0; j < 3; j++) assert_int_equal(specd_tree_buf_init(&out[j], CAP, QPOOL, &err), 0);
    assert_int_equal(specd_tree_buf_init(&alone, CAP, QPOOL, &err), 0);
    specd_draft_job jobs[3];
    for (int j = 0; j < 3; j++)
        jobs[j] = (specd_draft_job){.history = history, .n_history = 6, .n_prompt = 4,
                                    .hidden = hidden, .sampling = which[j], .counts = counts,
                                    .position = 21, .candidates = cands[j], .depth = 1,
                                    .out = &out[j]};
    if (specd_drafter_propose(d, jobs, 3, &err)) fail_msg("propose: %s", err.msg);

    /* greedy: the top 5 of the adjusted full-width row, best first */
    memcpy(logits, raw, sizeof(float) * (size_t)V);
    specd_logits_adjust(&greedy, counts, NULL, 0, logits, V, NULL);
    int32_t want[5];
    float vals[5];
    assert_int_equal(specd_topk(logits, V, 5, want, vals), 5);
    assert_int_equal(out[0].n_nodes, 5);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(out[0].parents[i], -1);
        assert_int_equal(out[0].tokens[i], want[i]);
        assert_int_not_equal(out[0].tokens[i], best);
    }
    /* seed-exact: the race's two best over q of the adjusted row */
    memcpy(logits, raw, sizeof(float) * (size_t)V);
    specd_logits_adjust(&race, counts, NULL, 0, logits, V, NULL);
    specd_sampling_probs(&race, logits, V, probs, scratch);
    assert_true(probs[best] < 1e-20f);
    int32_t picks[2];
    assert_int_equal(specd_race_topk(probs, V, (specd_race_addr){race.seed, 21, 0}, 2, picks), 2);
    assert_int_equal(out[1].n_nodes, 2);
    for (int i = 0; i < 2; i++) assert_int_equal(out[1].tokens[i], picks[i]);
    /* the unadjusted job: as alone */
    specd_draft_job one = jobs[2];
    one.out = &alone;
    if (specd_drafter_propose(d, &one, 1, &err)) fail_msg("propose: %s", err.msg);
    assert_int_equal(alone.n_nodes, out[2].n_nodes);
    for (int i = 0; i < alone.n_nodes; i++) assert_int_equal(alone.tokens[i], out[2].tokens[i]);
    assert_int_equal(out[2].tokens[0], best);

    for (int j = 0; j < 3; j++) specd_tree_buf_free(&out[j]);
    specd_tree_buf_free(&alone);
    shipped_close(&x);
}

/* ---- batching ---------------------------------------------------------------------- */

/* Four jobs in one call (greedy and sampling mixed, one without a hidden
 * state) give exactly the trees they get one at a time. */
static void test_batch_equals_single(void **state) {
    (void)state;
    specd_sampling greedy, samp;
    specd_sampling_init(&greedy);
    greedy.temperature = 0.0f;
    greedy.repetition_penalty = 1.3f;
    specd_sampling_init(&samp);
    samp.temperature = 0.9f;
    samp.method = SPECD_SAMPLING_REJECTION; /* q-carrying trees */
    samp.seed = 99;
    samp.frequency_penalty = 0.5f;
    fixture f;
    fixture_init(&f, UNTIED, NULL);
    specd_tree_buf single[4];
    specd_error err = {{0}};
    const specd_sampling *which[4] = {&greedy, &samp, &greedy, &samp};
    int cands[4] = {3, 2, 1, 4};
    for (int j = 0; j < 4; j++) {
        assert_int_equal(specd_tree_buf_init(&single[j], CAP, 0, &err), 0);
        specd_draft_job job = make_job(&f, j, which[j], cands[j], 3);
        if (j == 2) job.hidden = NULL;
        propose(&f, &job, 1);
        single[j].n_nodes = f.out[j].n_nodes;
        memcpy(single[j].tokens, f.out[j].tokens, sizeof(int32_t) * (size_t)CAP);
        memcpy(single[j].parents, f.out[j].parents, sizeof(int32_t) * (size_t)CAP);
        memcpy(single[j].logq, f.out[j].logq, sizeof(float) * (size_t)CAP);
    }
    specd_draft_job jobs[4];
    for (int j = 0; j < 4; j++) {
        jobs[j] = make_job(&f, j, which[j], cands[j], 3);
        if (j == 2) jobs[j].hidden = NULL;
    }
    propose(&f, jobs, 4);
    for (int j = 0; j < 4; j++) {
        check_tree(&f, &f.out[j], which[j] == &samp);
        if (which[j] == &samp) check_q(&f, &f.out[j]);
        /* the batched matmul sums in another order than a single row; the
         * trees still agree token for token at these margins, and logq to
         * float rounding */
        assert_int_equal(f.out[j].n_nodes, single[j].n_nodes);
        for (int i = 0; i < single[j].n_nodes; i++) {
            assert_int_equal(f.out[j].tokens[i], single[j].tokens[i]);
            assert_int_equal(f.out[j].parents[i], single[j].parents[i]);
            assert_float_equal(f.out[j].logq[i], single[j].logq[i], 1e-4);
        }
        specd_tree_buf_free(&single[j]);
    }
    assert_int_equal(f.out[2].n_nodes, 0); /* no hidden state: no tree */
    fixture_free(&f);
}

static void test_create_errors(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_mlp_drafter_opts o = {.path = NULL};
    assert_null(specd_mlp_drafter_create(&o, &err));
    assert_non_null(strstr(err.msg, "no speculator path"));
    o.path = "/nonexistent/speculator";
    assert_null(specd_mlp_drafter_create(&o, &err));
    assert_non_null(strstr(err.msg, "config.json"));
    o.path = test_path(UNTIED);
    o.top_k_per_stage[1] = -2;
    assert_null(specd_mlp_drafter_create(&o, &err));
    assert_non_null(strstr(err.msg, "top_k_per_stage[1]"));
    o.top_k_per_stage[1] = 0;
    o.max_batch = 2;
    specd_drafter *d = specd_mlp_drafter_create(&o, &err);
    assert_non_null(d);
    assert_string_equal(d->ops->name, "mlp");
    assert_int_equal(d->vocab, 100);
    assert_int_equal(d->hidden_size, 32);
    assert_int_equal(d->max_depth, 3);
    assert_int_equal(d->max_batch, 2);
    /* stateless: sessions are NULL and fine */
    void *st = (void *)1;
    assert_int_equal(specd_drafter_session_open(d, &st, &err), 0);
    assert_null(st);
    specd_drafter_session_close(d, st);
    /* more jobs than max_batch: an error, not an overrun */
    specd_draft_job jobs[3];
    memset(jobs, 0, sizeof jobs);
    assert_int_equal(specd_drafter_propose(d, jobs, 3, &err), -1);
    specd_drafter_free(d);
}

/* sqrt(sum (a - b)^2) and sqrt(sum b^2) over the n values where b is
 * finite (a reduced vocabulary's logits are -inf outside it); a must be
 * -inf exactly where b is */
static void diff_norms(const float *a, const float *b, int n, double *d, double *ref) {
    *d = *ref = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(isfinite(a[i]), isfinite(b[i]));
        if (!isfinite(b[i])) continue;
        *d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        *ref += (double)b[i] * b[i];
    }
    *d = sqrt(*d);
    *ref = sqrt(*ref);
}

/* The speculator's matrices quantized at load (specd_mlp_quant): Q8_0 stays
 * close to the stored weights, and Q4_HEAD changes the heads alone (a
 * stage's new state is bit for bit Q8_0's, its logits close to them but not
 * equal); an unknown value is refused. The fixtures' heads (48 columns)
 * are not a whole number of blocks and stay as stored; the shipped
 * speculator's (512) are quantized. */
static void test_quantized_loads(void **state) {
    (void)state;
    specd_backend_opts bo = {.name = "cpu", .n_threads = 1};
    const char *dirs[] = {UNTIED, SHARDED, "models/SmolLM2-135M-Instruct.speculator"};
    for (int set = 0; set < 3; set++) {
        const char *dir = test_path(dirs[set]);
        specd_error err = {{0}};
        specd_mlp_speculator *sp[3];
        for (int q = 0; q < 3; q++)
            if (!(sp[q] = specd_mlp_speculator_load_ex(dir, &bo, (specd_mlp_quant)q, &err)))
                fail_msg("%s", err.msg);
        const specd_mlp_spec_config *c = specd_mlp_speculator_config(sp[0]);
        enum { ROWS = 3 };
        int V = c->target_vocab_size, E = c->emb_dim, I = c->inner_dim;
        float *in = malloc(sizeof(float) * ROWS * (size_t)E);
        float *st[3], *lg[3];
        int32_t tok[ROWS] = {1, 7, 42 % V};
        for (int i = 0; i < ROWS * E; i++) in[i] = (float)sin(0.37 * i) * 2.0f;
        for (int q = 0; q < 3; q++) {
            st[q] = malloc(sizeof(float) * ROWS * (size_t)I);
            lg[q] = malloc(sizeof(float) * ROWS * (size_t)V);
            assert_int_equal(specd_mlp_speculator_stage(sp[q], 0, ROWS, in, tok, st[q], lg[q], &err), 0);
        }
        double d, ref;
        /* Q8_0 against the stored weights: within a few percent */
        diff_norms(st[SPECD_MLP_Q8_0], st[SPECD_MLP_AS_STORED], ROWS * I, &d, &ref);
        assert_true(d > 0 && d < 0.05 * ref);
        diff_norms(lg[SPECD_MLP_Q8_0], lg[SPECD_MLP_AS_STORED], ROWS * V, &d, &ref);
        assert_true(d < 0.05 * ref);
        /* Q4_HEAD: the state is Q8_0's exactly, the logits move a little */
        assert_memory_equal(st[SPECD_MLP_Q4_HEAD], st[SPECD_MLP_Q8_0], sizeof(float) * ROWS * (size_t)I);
        diff_norms(lg[SPECD_MLP_Q4_HEAD], lg[SPECD_MLP_Q8_0], ROWS * V, &d, &ref);
        if (I % 32 == 0) assert_true(d > 0 && d < 0.25 * ref);
        else assert_true(d == 0);
        for (int q = 0; q < 3; q++) {
            free(st[q]);
            free(lg[q]);
            specd_mlp_speculator_free(sp[q]);
        }
        free(in);
        assert_null(specd_mlp_speculator_load_ex(dir, &bo, (specd_mlp_quant)7, &err));
        assert_non_null(strstr(err.msg, "quantization"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantized_loads),
        cmocka_unit_test(test_greedy_chain_is_argmax),
        cmocka_unit_test(test_greedy_tree_shape),
        cmocka_unit_test(test_greedy_applies_adjustments),
        cmocka_unit_test(test_sampling_shape_and_q),
        cmocka_unit_test(test_sampling_deterministic),
        cmocka_unit_test(test_seed_exact_children_are_the_race),
        cmocka_unit_test(test_seed_exact_reduced_vocab),
        cmocka_unit_test(test_rejection_reduced_vocab),
        cmocka_unit_test(test_adjusted_reduced_vocab),
        cmocka_unit_test(test_batch_equals_single),
        cmocka_unit_test(test_create_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
