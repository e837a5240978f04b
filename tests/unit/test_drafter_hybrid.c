/* test_drafter_hybrid.c - the mlp_ngram drafter (draft-svc/drafter_hybrid.c)
 * over a scripted stand-in for the model and a real ngram lookup: how the
 * two trees merge (model first, shared paths become one BOTH node with the
 * higher score, the lookup's other nodes under their parents' places, each
 * node's source), that the lookup gets its own larger shape while the
 * model gets the priced one, that a full buffer cuts the lookup's nodes
 * first, that a job of depth 0 gets the lookup alone, and that rejection
 * sampling gets the model's tree alone; and that propose_inline drafts a
 * depth-0 job exactly as propose does, on several threads at once, and
 * leaves every other job to propose. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "draft-svc/drafter.h"

enum { VOCAB = 100 };

/* The stand-in model: under the root 13 (score 0.6) and 20 (0.3), under 13
 * the token 14 (0.5), whatever the history; it records the shape it was
 * asked for. */
typedef struct fake_model {
    int calls, last_candidates, last_depth;
} fake_model;

static int fake_propose(specd_drafter *d, specd_draft_job *jobs, int n, specd_error *err) {
    (void)err;
    fake_model *m = d->impl;
    for (int i = 0; i < n; i++) {
        specd_tree_buf *out = jobs[i].out;
        m->calls++;
        m->last_candidates = jobs[i].candidates;
        m->last_depth = jobs[i].depth;
        int a = specd_tree_buf_add(out, -1, 13, logf(0.6f));
        if (a >= 0) out->pcond[a] = 0.6f;
        int b = specd_tree_buf_add(out, -1, 20, logf(0.3f));
        if (b >= 0) out->pcond[b] = 0.3f;
        int c = a >= 0 ? specd_tree_buf_add(out, a, 14, logf(0.3f)) : -1;
        if (c >= 0) out->pcond[c] = 0.5f;
    }
    return 0;
}

static void fake_destroy(specd_drafter *d) { free(d); }

static const specd_drafter_ops fake_ops = {
    .name = "fake", .propose = fake_propose, .destroy = fake_destroy};

typedef struct fixture {
    fake_model model_state;
    specd_drafter *model, *lookup, *hybrid;
    void *session;
    specd_tree_buf out;
    specd_sampling greedy, rejection;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->model = calloc(1, sizeof *f->model);
    *f->model = (specd_drafter){.ops = &fake_ops, .vocab = VOCAB, .hidden_size = 8,
                                .max_batch = 4, .max_depth = 2, .impl = &f->model_state};
    specd_error err = {{0}};
    specd_ngram_drafter_opts no = {.vocab = VOCAB};
    if (!(f->lookup = specd_ngram_drafter_create(&no, &err))) fail_msg("ngram: %s", err.msg);
    specd_hybrid_drafter_opts o = {.model = f->model, .lookup = f->lookup};
    if (!(f->hybrid = specd_hybrid_drafter_create(&o, &err))) fail_msg("create: %s", err.msg);
    if (specd_drafter_session_open(f->hybrid, &f->session, &err)) fail_msg("%s", err.msg);
    if (specd_tree_buf_init(&f->out, 32, 0, &err)) fail_msg("%s", err.msg);
    specd_sampling_init(&f->greedy);
    f->greedy.temperature = 0.0f;
    specd_sampling_init(&f->rejection);
    f->rejection.temperature = 0.8f;
    f->rejection.method = SPECD_SAMPLING_REJECTION;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    specd_drafter_session_close(f->hybrid, f->session);
    specd_drafter_free(f->hybrid);
    specd_drafter_free(f->lookup);
    specd_drafter_free(f->model);
    specd_tree_buf_free(&f->out);
    free(f);
    return 0;
}

/* The history ends in 10 11 12, which appeared before followed by
 * 13 14 10 11 12: the lookup's chain is that continuation. */
static const int32_t HIST[] = {5, 10, 11, 12, 13, 14, 10, 11, 12};
static const float HIDDEN[8] = {0};

static void run_shape(fixture *f, const specd_sampling *s, int cap, int candidates, int depth) {
    specd_tree_buf_reset(&f->out);
    f->out.cap = cap;
    specd_draft_job job = {.state = f->session, .history = HIST,
                           .n_history = (int)(sizeof HIST / sizeof HIST[0]), .n_prompt = 1,
                           .hidden = HIDDEN, .sampling = s, .candidates = candidates,
                           .depth = depth,
                           .lookup_candidates = 4, .lookup_depth = 6, .out = &f->out};
    specd_error err = {{0}};
    if (specd_drafter_propose(f->hybrid, &job, 1, &err)) fail_msg("propose: %s", err.msg);
    f->out.cap = 32;
}

static void run(fixture *f, const specd_sampling *s, int cap) { run_shape(f, s, cap, 2, 2); }

static int find(const specd_tree_buf *t, int parent, int32_t tok) {
    for (int i = 0; i < t->n_nodes; i++)
        if (t->parents[i] == parent && t->tokens[i] == tok) return i;
    return -1;
}

static void test_merge(void **state) {
    fixture *f = *state;
    run(f, &f->greedy, 32);
    specd_tree_buf *t = &f->out;
    /* the model asked for the priced shape, not the lookup's */
    assert_int_equal(f->model_state.last_candidates, 2);
    assert_int_equal(f->model_state.last_depth, 2);
    /* the model's nodes first, in their order */
    assert_true(t->n_nodes > 3);
    assert_int_equal(t->tokens[0], 13);
    assert_int_equal(t->tokens[1], 20);
    assert_int_equal(t->tokens[2], 14);
    assert_int_equal(t->parents[2], 0);
    /* 13 and 13 14 were the lookup's too: one node each, BOTH, scored with
     * the higher chance (the lookup's single continuation is near-sure) */
    assert_int_equal(t->src[0], SPECD_SRC_BOTH);
    assert_int_equal(t->src[2], SPECD_SRC_BOTH);
    assert_true(t->pcond[0] > 0.6f && t->pcond[0] <= 1.0f);
    assert_true(t->pcond[2] > 0.5f && t->pcond[2] <= 1.0f);
    assert_int_equal(t->src[1], SPECD_SRC_MODEL);
    assert_true(t->pcond[1] == 0.3f);
    /* the rest of the lookup's chain hangs under 14, at the lookup's depth
     * (past the model's 2) */
    int n10 = find(t, 2, 10), n11 = find(t, n10, 11), n12 = find(t, n11, 12);
    assert_true(n10 > 2 && n11 > n10 && n12 > n11);
    assert_int_equal(t->src[n10], SPECD_SRC_LOOKUP);
    assert_int_equal(t->depth[n12], 5);
    for (int i = 0; i < t->n_nodes; i++) {
        assert_true(t->pcond[i] >= 0.0f && t->pcond[i] <= 1.0f);
        assert_true(t->parents[i] < i); /* parents first: a valid wire tree */
        /* no two siblings hold the same token */
        for (int j = 0; j < i; j++)
            assert_false(t->parents[j] == t->parents[i] && t->tokens[j] == t->tokens[i]);
    }
    /* a lookup node's log q continues its parent's */
    assert_true(t->logq[n10] <= t->logq[2] + 1e-6f);
}

static void test_full_buffer(void **state) {
    fixture *f = *state;
    /* room for the model's three nodes only: the lookup still marks the
     * shared ones, and adds nothing */
    run(f, &f->greedy, 3);
    assert_int_equal(f->out.n_nodes, 3);
    assert_int_equal(f->out.src[0], SPECD_SRC_BOTH);
    assert_int_equal(f->out.src[1], SPECD_SRC_MODEL);
    /* room for four: the first lookup node after them */
    run(f, &f->greedy, 4);
    assert_int_equal(f->out.n_nodes, 4);
    assert_int_equal(f->out.tokens[3], 10);
    assert_int_equal(f->out.parents[3], 2);
    assert_int_equal(f->out.src[3], SPECD_SRC_LOOKUP);
}

/* Depth 0: the driver skips the model this step; the lookup drafts alone. */
static void test_lookup_only(void **state) {
    fixture *f = *state;
    run_shape(f, &f->greedy, 32, 0, 0);
    assert_int_equal(f->model_state.calls, 0);
    assert_int_equal(f->out.n_nodes, 5); /* 13 14 10 11 12 */
    for (int i = 0; i < f->out.n_nodes; i++) {
        assert_int_equal(f->out.src[i], SPECD_SRC_LOOKUP);
        assert_int_equal(f->out.parents[i], i - 1);
    }
    assert_int_equal(f->out.tokens[0], 13);
}

/* A depth-0 job with the session's own state, into out. */
static specd_draft_job lookup_only_job(void *session, const specd_sampling *s,
                                       specd_tree_buf *out) {
    specd_tree_buf_reset(out);
    return (specd_draft_job){.state = session, .history = HIST,
                             .n_history = (int)(sizeof HIST / sizeof HIST[0]), .n_prompt = 1,
                             .hidden = HIDDEN, .sampling = s, .candidates = 0, .depth = 0,
                             .lookup_candidates = 4, .lookup_depth = 6, .out = out};
}

static void assert_same_tree(const specd_tree_buf *a, const specd_tree_buf *b) {
    assert_int_equal(a->n_nodes, b->n_nodes);
    for (int i = 0; i < a->n_nodes; i++) {
        assert_int_equal(a->tokens[i], b->tokens[i]);
        assert_int_equal(a->parents[i], b->parents[i]);
        assert_int_equal(a->src[i], b->src[i]);
        assert_true(a->logq[i] == b->logq[i]);
        assert_true(a->pcond[i] == b->pcond[i]);
    }
}

/* The inline path gives the batch path's tree, bit for bit, and takes only
 * depth-0 jobs of a session. */
static void test_inline_lookup(void **state) {
    fixture *f = *state;
    specd_error err = {{0}};
    run_shape(f, &f->greedy, 32, 0, 0); /* through propose */
    specd_tree_buf inl;
    if (specd_tree_buf_init(&inl, 32, 0, &err)) fail_msg("%s", err.msg);
    specd_draft_job job = lookup_only_job(f->session, &f->greedy, &inl);
    assert_int_equal(specd_drafter_propose_inline(f->hybrid, &job, &err), 0);
    assert_int_equal(f->model_state.calls, 0);
    assert_int_equal(inl.n_nodes, 5);
    assert_same_tree(&inl, &f->out);
    /* a smaller buffer: the scratch follows the job's capacity */
    job = lookup_only_job(f->session, &f->greedy, &inl);
    inl.cap = 3;
    assert_int_equal(specd_drafter_propose_inline(f->hybrid, &job, &err), 0);
    assert_int_equal(inl.n_nodes, 3);
    inl.cap = 32;
    /* the model's part is the batch's: untouched, 1 */
    job = lookup_only_job(f->session, &f->greedy, &inl);
    job.candidates = job.depth = 1;
    assert_int_equal(specd_drafter_propose_inline(f->hybrid, &job, &err), 1);
    assert_int_equal(inl.n_nodes, 0);
    assert_int_equal(f->model_state.calls, 0);
    /* so is a job without a session (it has no scratch of its own) */
    job = lookup_only_job(NULL, &f->greedy, &inl);
    assert_int_equal(specd_drafter_propose_inline(f->hybrid, &job, &err), 1);
    /* rejection sampling: the lookup has nothing for it, as in propose */
    job = lookup_only_job(f->session, &f->rejection, &inl);
    assert_int_equal(specd_drafter_propose_inline(f->hybrid, &job, &err), 0);
    assert_int_equal(inl.n_nodes, 0);
    /* the lookup alone drafts inline every job; the stand-in model none */
    job = lookup_only_job(NULL, &f->greedy, &inl);
    job.candidates = job.depth = 2;
    assert_int_equal(specd_drafter_propose_inline(f->lookup, &job, &err), 0);
    assert_int_equal(specd_drafter_propose_inline(f->model, &job, &err), 1);
    specd_tree_buf_free(&inl);
}

/* Sessions of one drafter drafting inline on their own threads while the
 * batch path runs: every tree is the single-threaded one (and, under the
 * sanitizer build, no shared scratch is touched). */
typedef struct inline_worker {
    fixture *f;
    void *session;
    const specd_tree_buf *want;
    int bad;
} inline_worker;

static void *inline_thread(void *arg) {
    inline_worker *w = arg;
    specd_error err = {{0}};
    specd_tree_buf t;
    if (specd_tree_buf_init(&t, 32, 0, &err)) {
        w->bad = 1;
        return NULL;
    }
    for (int i = 0; i < 2000 && !w->bad; i++) {
        specd_draft_job job = lookup_only_job(w->session, &w->f->greedy, &t);
        if (specd_drafter_propose_inline(w->f->hybrid, &job, &err) ||
            t.n_nodes != w->want->n_nodes)
            w->bad = 1;
        for (int k = 0; k < t.n_nodes && !w->bad; k++)
            if (t.tokens[k] != w->want->tokens[k] || t.parents[k] != w->want->parents[k] ||
                t.pcond[k] != w->want->pcond[k])
                w->bad = 1;
    }
    specd_tree_buf_free(&t);
    return NULL;
}

static void test_inline_threads(void **state) {
    fixture *f = *state;
    specd_error err = {{0}};
    run_shape(f, &f->greedy, 32, 0, 0); /* the reference, single-threaded */
    enum { N = 4 };
    inline_worker w[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        w[i] = (inline_worker){.f = f, .want = &f->out};
        if (specd_drafter_session_open(f->hybrid, &w[i].session, &err)) fail_msg("%s", err.msg);
    }
    specd_tree_buf ref;
    if (specd_tree_buf_init(&ref, 32, 0, &err)) fail_msg("%s", err.msg);
    specd_tree_buf_reset(&ref);
    for (int i = 0; i < ref.cap && i < f->out.n_nodes; i++) /* keep a copy of the reference */
        specd_tree_buf_add(&ref, f->out.parents[i], f->out.tokens[i], f->out.logq[i]);
    for (int i = 0; i < f->out.n_nodes; i++) ref.pcond[i] = f->out.pcond[i];
    for (int i = 0; i < N; i++) w[i].want = &ref;
    for (int i = 0; i < N; i++) assert_int_equal(pthread_create(&th[i], NULL, inline_thread, &w[i]), 0);
    /* the batch path on the fixture's own session meanwhile */
    for (int i = 0; i < 500; i++) run(f, &f->greedy, 32);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_false(w[i].bad);
        specd_drafter_session_close(f->hybrid, w[i].session);
    }
    specd_tree_buf_free(&ref);
}

static void test_rejection_model_only(void **state) {
    fixture *f = *state;
    run(f, &f->rejection, 32);
    assert_int_equal(f->out.n_nodes, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(f->out.src[i], SPECD_SRC_MODEL);
}

static void test_create_checks(void **state) {
    fixture *f = *state;
    specd_error err = {{0}};
    specd_hybrid_drafter_opts none = {.model = f->model};
    assert_null(specd_hybrid_drafter_create(&none, &err));
    assert_non_null(strstr(err.msg, "lookup"));
    specd_ngram_drafter_opts no = {.vocab = VOCAB + 1};
    specd_drafter *other = specd_ngram_drafter_create(&no, &err);
    specd_hybrid_drafter_opts wrong = {.model = f->model, .lookup = other};
    assert_null(specd_hybrid_drafter_create(&wrong, &err));
    assert_non_null(strstr(err.msg, "vocab"));
    specd_drafter_free(other);
    /* what it tells the driver: the model's needs, the lookup's reach */
    assert_int_equal(f->hybrid->hidden_size, 8);
    assert_int_equal(f->hybrid->vocab, VOCAB);
    assert_int_equal(f->hybrid->max_batch, 4);
    assert_true(f->hybrid->max_depth > 2);
    assert_string_equal(f->hybrid->ops->name, "mlp_ngram");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_merge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inline_lookup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inline_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejection_model_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_checks, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
