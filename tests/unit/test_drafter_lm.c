/* test_drafter_lm.c - the classic draft model (draft-svc/drafter_lm.c) on the
 * tiny golden model tests/golden/data/tiny-gqa (GGUF F32), used as its own
 * draft model:
 *   - the greedy chain is the model's own greedy continuation (the golden
 *     reference's, and a direct run of the transformer's),
 *   - a session whose history diverged from the draft (rollback), or grew
 *     past it (full accept), proposes what a fresh session proposes,
 *   - a batch of jobs proposes what each job proposes alone, including
 *     catch-ups split across several forward passes,
 *   - histories that do not fit the context get shorter or empty trees,
 *   - KV slots run out cleanly and are reused cleanly, also when requests
 *     open and close sessions on several threads at once,
 *   - sampling: q is the adjusted, filtered distribution of the model's own
 *     logits, it contains the drawn child, the draw is the one at the
 *     documented RNG address, and seeded draws are reproducible;
 *   - logit adjustments (bias, penalties) reach the greedy choice too. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/util/rng.h"
#include "draft-svc/drafter.h"
#include "common/model/transformer.h"
#include "tests/harness/golden.h"
#include "tests/harness/test_util.h"

enum { MAXH = 1400, CAP = 64 };

static golden_set *g_set;
static const char *g_model; /* tiny-gqa GGUF F32 */
static int g_vocab;

static int group_setup(void **state) {
    (void)state;
    specd_error err = {{0}};
    g_set = golden_load(test_path("tests/golden/data/tiny-gqa"), &err);
    if (!g_set) {
        fprintf(stderr, "golden_load: %s\n", err.msg);
        return -1;
    }
    g_model = golden_format_path(g_set, "gguf_f32");
    g_vocab = g_set->config.vocab_size;
    return g_model ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    golden_free(g_set);
    return 0;
}

/* The gguf_f32 case for prompt k (lengths 1, 7, 33, 100). */
static const golden_case *gcase(int k) {
    char name[64];
    snprintf(name, sizeof name, "gguf_f32/prompt%d", k);
    for (int i = 0; i < g_set->n_cases; i++)
        if (!strcmp(g_set->cases[i].name, name)) return &g_set->cases[i];
    fail_msg("no golden case %s", name);
    return NULL;
}

static specd_drafter *make_lm(int sessions, int max_ctx, int max_batch) {
    specd_error err = {{0}};
    specd_lm_drafter_opts o = {.path = g_model, .n_threads = 2, .max_sessions = sessions,
                               .max_ctx = max_ctx, .max_batch = max_batch};
    specd_drafter *d = specd_lm_drafter_create(&o, &err);
    if (!d) fail_msg("create: %s", err.msg);
    return d;
}

static void *open_session(specd_drafter *d) {
    void *s = NULL;
    specd_error err = {{0}};
    if (specd_drafter_session_open(d, &s, &err)) fail_msg("session_open: %s", err.msg);
    return s;
}

static void greedy_sampling(specd_sampling *s) {
    specd_sampling_init(s);
    s->temperature = 0.0f;
}

static void tree_init(specd_tree_buf *b) {
    specd_error err = {{0}};
    /* room for a full-vocabulary q at every node */
    if (specd_tree_buf_init(b, CAP, (size_t)CAP * 512 + 512, &err)) fail_msg("%s", err.msg);
}

static specd_draft_job job_for(void *state, const int32_t *h, int n, const specd_sampling *s,
                               int depth, specd_tree_buf *out) {
    specd_tree_buf_reset(out);
    return (specd_draft_job){.state = state, .history = h, .n_history = n, .n_prompt = n,
                             .sampling = s, .position = 0, .candidates = 3, .depth = depth,
                             .out = out};
}

/* One job alone; checks the tree is a valid chain. */
static void propose1(specd_drafter *d, specd_draft_job *job) {
    specd_error err = {{0}};
    if (specd_drafter_propose(d, job, 1, &err)) fail_msg("propose: %s", err.msg);
    specd_tree view;
    int sampling = job->sampling->temperature > 0.0f;
    specd_tree_buf_view(job->out, sampling, &view);
    if (job->out->n_nodes && specd_tree_validate(&view, g_vocab, CAP, sampling, &err))
        fail_msg("invalid tree: %s", err.msg);
    for (int i = 0; i < job->out->n_nodes; i++) assert_int_equal(job->out->parents[i], i - 1);
}

static void assert_same_tree(const specd_tree_buf *a, const specd_tree_buf *b, int sampling) {
    assert_int_equal(a->n_nodes, b->n_nodes);
    for (int i = 0; i < a->n_nodes; i++) {
        assert_int_equal(a->tokens[i], b->tokens[i]);
        assert_int_equal(a->parents[i], b->parents[i]);
        assert_true(fabsf(a->logq[i] - b->logq[i]) < 1e-3f);
    }
    if (!sampling) return;
    for (int i = 0; i < a->n_nodes; i++) {
        const specd_sparse_dist *qa = &a->q[i], *qb = &b->q[i];
        assert_int_equal(qa->n, qb->n);
        for (int j = 0; j < qa->n; j++) {
            assert_int_equal(qa->ids[j], qb->ids[j]);
            assert_true(fabsf(qa->probs[j] - qb->probs[j]) < 1e-4f);
        }
    }
}

/* ---- a direct run of the transformer, the reference ------------------- */

typedef struct direct {
    specd_model_file *m;
    specd_transformer *t;
    float *logits;
} direct;

static void direct_open(direct *r) {
    specd_error err = {{0}};
    r->m = specd_model_open(g_model, &err);
    if (!r->m) fail_msg("%s", err.msg);
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 2}, .n_slots = 1,
                                .max_ctx = MAXH, .max_batch = MAXH};
    r->t = specd_transformer_create(r->m, &o, &err);
    if (!r->t) fail_msg("%s", err.msg);
    r->logits = malloc(sizeof(float) * (size_t)g_vocab);
}

static void direct_close(direct *r) {
    free(r->logits);
    specd_transformer_free(r->t);
    specd_model_close(r->m);
}

/* Logits after toks[0..n), computed from scratch in one forward. */
static const float *direct_logits(direct *r, const int32_t *toks, int n) {
    specd_error err = {{0}};
    int32_t last = n - 1;
    specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = n};
    specd_batch b = {.n_tokens = n, .tokens = toks, .n_seqs = 1, .seqs = &in, .n_out = 1,
                     .out_rows = &last, .logits = r->logits};
    if (specd_transformer_forward(r->t, &b, &err)) fail_msg("forward: %s", err.msg);
    return r->logits;
}

/* The model's greedy continuation of h (prefill, then one token per step)
 * and the log-softmax of each chosen token. */
static void direct_greedy(direct *r, const int32_t *h, int n, int depth, int32_t *toks,
                          float *lps) {
    specd_error err = {{0}};
    const float *l = direct_logits(r, h, n);
    for (int i = 0; i < depth; i++) {
        toks[i] = specd_argmax(l, g_vocab);
        specd_logprobs(l, g_vocab, toks[i], 0, &lps[i], NULL, NULL);
        if (i + 1 == depth) break;
        int32_t zero = 0;
        specd_seq_input in = {.slot = 0, .n_past = n + i, .n_new = 1};
        specd_batch b = {.n_tokens = 1, .tokens = &toks[i], .n_seqs = 1, .seqs = &in,
                         .n_out = 1, .out_rows = &zero, .logits = r->logits};
        if (specd_transformer_forward(r->t, &b, &err)) fail_msg("forward: %s", err.msg);
    }
}

/* ---- tests -------------------------------------------------------------- */

static void test_greedy_is_own_continuation(void **state) {
    (void)state;
    specd_drafter *d = make_lm(4, 0, 4);
    assert_string_equal(d->ops->name, "draft_lm");
    assert_int_equal(d->vocab, g_vocab);
    assert_int_equal(d->hidden_size, 0);
    direct r;
    direct_open(&r);
    specd_sampling s;
    greedy_sampling(&s);
    specd_tree_buf out;
    tree_init(&out);
    enum { DEPTH = 10 };
    for (int k = 0; k < 4; k++) {
        const golden_case *c = gcase(k);
        void *sess = open_session(d);
        specd_draft_job job = job_for(sess, c->prompt, c->n_prompt, &s, DEPTH, &out);
        propose1(d, &job);
        assert_int_equal(out.n_nodes, DEPTH);
        /* the golden reference's continuation (a flip is only acceptable at
         * a near-tie; none of these steps is one) */
        int diff = golden_greedy_first_diff(c, out.tokens, DEPTH);
        if (diff >= 0)
            fail_msg("%s: step %d: %d vs golden %d (margin %g)", c->name, diff, out.tokens[diff],
                     c->greedy[diff], (double)c->greedy_margins[diff]);
        /* and a direct run, with the path log-probabilities */
        int32_t toks[DEPTH];
        float lps[DEPTH], cum = 0.0f;
        direct_greedy(&r, c->prompt, c->n_prompt, DEPTH, toks, lps);
        for (int i = 0; i < DEPTH; i++) {
            assert_int_equal(out.tokens[i], toks[i]);
            cum += lps[i];
            assert_true(fabsf(out.logq[i] - cum) < 1e-3f);
        }
        /* greedy sends no q */
        assert_int_equal(out.q[0].n, 0);
        specd_drafter_session_close(d, sess);
    }
    specd_tree_buf_free(&out);
    direct_close(&r);
    specd_drafter_free(d);
}

/* Proposes on history h with session `sess`, and with a fresh session of a
 * fresh drafter, and requires the same tree. */
static void check_against_fresh(specd_drafter *d, void *sess, const int32_t *h, int n,
                                const specd_sampling *s, int depth, specd_tree_buf *out) {
    specd_drafter *d2 = make_lm(1, 0, 1);
    void *fresh = open_session(d2);
    specd_tree_buf ref;
    tree_init(&ref);
    specd_draft_job a = job_for(sess, h, n, s, depth, out);
    propose1(d, &a);
    specd_draft_job b = job_for(fresh, h, n, s, depth, &ref);
    propose1(d2, &b);
    assert_int_equal(out->n_nodes, depth);
    assert_same_tree(out, &ref, s->temperature > 0.0f);
    specd_tree_buf_free(&ref);
    specd_drafter_session_close(d2, fresh);
    specd_drafter_free(d2);
}

static void test_rollback_equals_fresh(void **state) {
    (void)state;
    for (int sampling = 0; sampling < 2; sampling++) {
        specd_drafter *d = make_lm(2, 0, 2);
        specd_sampling s;
        greedy_sampling(&s);
        if (sampling) {
            s.temperature = 0.9f;
            s.method = SPECD_SAMPLING_REJECTION; /* q-carrying trees */
            s.top_k = 40;
            s.seed = 77;
        }
        specd_tree_buf out;
        tree_init(&out);
        void *sess = open_session(d);
        const golden_case *c = gcase(2);
        int32_t h[MAXH];
        int n = c->n_prompt;
        memcpy(h, c->prompt, sizeof(int32_t) * (size_t)n);
        /* round 1: a fresh prefill */
        check_against_fresh(d, sess, h, n, &s, 6, &out);
        int32_t draft[CAP];
        memcpy(draft, out.tokens, sizeof(int32_t) * 6);
        /* round 2: two drafts accepted, then a different token (the cached
         * third draft token and beyond must be rolled back) */
        h[n++] = draft[0];
        h[n++] = draft[1];
        h[n++] = (draft[2] + 1) % g_vocab;
        check_against_fresh(d, sess, h, n, &s, 6, &out);
        memcpy(draft, out.tokens, sizeof(int32_t) * 6);
        /* round 3: everything accepted plus a bonus token (the slot holds
         * five of the six drafts; the sixth and the bonus are new) */
        for (int i = 0; i < 6; i++) h[n++] = draft[i];
        h[n++] = 5;
        check_against_fresh(d, sess, h, n, &s, 6, &out);
        /* round 4: nothing accepted, the correction is the first draft token
         * itself (possible in sampling mode): the pending token then matches
         * the cached row, which must still be fed to get its logits */
        h[n++] = out.tokens[0];
        check_against_fresh(d, sess, h, n, &s, 4, &out);
        /* round 5: a history the slot shares nothing with */
        const golden_case *o = gcase(3);
        check_against_fresh(d, sess, o->prompt, o->n_prompt, &s, 5, &out);
        /* round 6: a strict prefix of what the slot holds (history shrank) */
        check_against_fresh(d, sess, o->prompt, 40, &s, 5, &out);
        specd_tree_buf_free(&out);
        specd_drafter_free(d);
    }
}

/* Deterministic pseudo-random token ids. */
static void fill_tokens(int32_t *h, int n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        h[i] = (int32_t)((x >> 8) % (uint32_t)g_vocab);
    }
}

static void test_batch_equals_one_at_a_time(void **state) {
    (void)state;
    for (int sampling = 0; sampling < 2; sampling++) {
        /* max_ctx beyond the model's 256 so catch-ups exceed one forward's
         * 512 tokens: 7 + 1100 + 300 tokens go as [7, 505 of the second],
         * [512 of the second, finishing nothing], [its last 83, 300] */
        specd_drafter *d = make_lm(6, 1300, 3);
        specd_sampling s;
        greedy_sampling(&s);
        if (sampling) {
            s.temperature = 1.0f;
            s.method = SPECD_SAMPLING_REJECTION; /* q-carrying trees */
            s.top_p = 0.9f;
            s.seed = 5;
        }
        void *batched[3], *alone[3];
        for (int j = 0; j < 3; j++) batched[j] = open_session(d);
        for (int j = 0; j < 3; j++) alone[j] = open_session(d);
        static int32_t h[2][3][MAXH];
        int n[2][3];
        for (int round = 0; round < 2; round++) {
            for (int j = 0; j < 3; j++) {
                if (round == 0) {
                    /* a short golden prompt, and two long random ones */
                    const golden_case *c = gcase(j == 0 ? 1 : 3);
                    n[0][j] = j == 0 ? c->n_prompt : j == 1 ? 1100 : 300;
                    if (j == 0) memcpy(h[0][j], c->prompt, sizeof(int32_t) * (size_t)n[0][j]);
                    else fill_tokens(h[0][j], n[0][j], (uint32_t)j);
                }
            }
            specd_tree_buf outs[3], refs[3];
            specd_draft_job jobs[3];
            for (int j = 0; j < 3; j++) {
                tree_init(&outs[j]);
                tree_init(&refs[j]);
                jobs[j] = job_for(batched[j], h[round][j], n[round][j], &s, 4 + j, &outs[j]);
                jobs[j].position = (uint64_t)(10 * j + round);
            }
            specd_error err = {{0}};
            assert_int_equal(specd_drafter_propose(d, jobs, 3, &err), 0);
            for (int j = 0; j < 3; j++) {
                specd_draft_job one = job_for(alone[j], h[round][j], n[round][j], &s, 4 + j,
                                              &refs[j]);
                one.position = jobs[j].position;
                propose1(d, &one);
                assert_int_equal(outs[j].n_nodes, 4 + j);
                assert_same_tree(&outs[j], &refs[j], sampling);
            }
            /* next round: job j accepted j of its drafts, then a token of
             * the target's own */
            if (round == 0) {
                for (int j = 0; j < 3; j++) {
                    memcpy(h[1][j], h[0][j], sizeof(int32_t) * (size_t)n[0][j]);
                    n[1][j] = n[0][j];
                    for (int i = 0; i < j; i++) h[1][j][n[1][j]++] = outs[j].tokens[i];
                    h[1][j][n[1][j]++] = (outs[j].tokens[j] + 3) % g_vocab;
                }
            }
            for (int j = 0; j < 3; j++) {
                specd_tree_buf_free(&outs[j]);
                specd_tree_buf_free(&refs[j]);
            }
        }
        specd_drafter_free(d);
    }
}

static void test_context_limit(void **state) {
    (void)state;
    specd_drafter *d = make_lm(3, 16, 3);
    assert_int_equal(d->max_depth, 15);
    specd_sampling s;
    greedy_sampling(&s);
    int32_t h[40];
    fill_tokens(h, 40, 9);
    void *a = open_session(d), *b = open_session(d), *c = open_session(d);
    specd_tree_buf oa, ob, oc;
    tree_init(&oa);
    tree_init(&ob);
    tree_init(&oc);
    /* in one batch: too long (empty), fits with 3 drafts, fits exactly one */
    specd_draft_job jobs[3] = {job_for(a, h, 20, &s, 8, &oa), job_for(b, h, 14, &s, 8, &ob),
                               job_for(c, h, 16, &s, 8, &oc)};
    specd_error err = {{0}};
    assert_int_equal(specd_drafter_propose(d, jobs, 3, &err), 0);
    assert_int_equal(oa.n_nodes, 0);
    assert_int_equal(ob.n_nodes, 3);
    assert_int_equal(oc.n_nodes, 1);
    /* the shortened chains are the model's continuation all the same */
    direct r;
    direct_open(&r);
    int32_t toks[8];
    float lps[8];
    direct_greedy(&r, h, 14, 3, toks, lps);
    for (int i = 0; i < 3; i++) assert_int_equal(ob.tokens[i], toks[i]);
    direct_greedy(&r, h, 16, 1, toks, lps);
    assert_int_equal(oc.tokens[0], toks[0]);
    /* one past the context, alone: empty, not an error */
    specd_draft_job j17 = job_for(b, h, 17, &s, 1, &ob);
    propose1(d, &j17);
    assert_int_equal(ob.n_nodes, 0);
    /* and the session still drafts once its history fits again */
    specd_draft_job j10 = job_for(b, h, 10, &s, 2, &ob);
    propose1(d, &j10);
    direct_greedy(&r, h, 10, 2, toks, lps);
    assert_int_equal(ob.n_nodes, 2);
    assert_int_equal(ob.tokens[0], toks[0]);
    assert_int_equal(ob.tokens[1], toks[1]);
    /* a tree buffer smaller than depth caps the chain */
    specd_tree_buf small;
    assert_int_equal(specd_tree_buf_init(&small, 2, 0, &err), 0);
    specd_draft_job jsmall = job_for(c, h, 10, &s, 6, &small);
    propose1(d, &jsmall);
    assert_int_equal(small.n_nodes, 2);
    assert_int_equal(small.tokens[1], toks[1]);
    specd_tree_buf_free(&small);
    /* a job without a session drafts nothing; one session twice in a batch
     * is the caller's bug and fails the batch */
    specd_draft_job none = job_for(NULL, h, 10, &s, 2, &oa);
    propose1(d, &none);
    assert_int_equal(oa.n_nodes, 0);
    specd_draft_job twice[2] = {job_for(a, h, 5, &s, 2, &oa), job_for(a, h, 6, &s, 2, &ob)};
    assert_int_equal(specd_drafter_propose(d, twice, 2, &err), -1);
    assert_non_null(strstr(err.msg, "session"));
    direct_close(&r);
    specd_tree_buf_free(&oa);
    specd_tree_buf_free(&ob);
    specd_tree_buf_free(&oc);
    specd_drafter_free(d);
}

static void test_slots_run_out(void **state) {
    (void)state;
    specd_drafter *d = make_lm(2, 64, 4);
    assert_int_equal(d->max_batch, 2); /* never more jobs than slots */
    specd_sampling s;
    greedy_sampling(&s);
    specd_tree_buf out;
    tree_init(&out);
    void *a = open_session(d), *b = open_session(d), *c = (void *)1;
    assert_non_null(a);
    assert_non_null(b);
    specd_error err = {{0}};
    assert_int_equal(specd_drafter_session_open(d, &c, &err), -1);
    assert_null(c);
    assert_non_null(strstr(err.msg, "slots"));
    /* fill b's slot with one history, close it, reopen: the new session
     * must not trust the rows the old one left */
    const golden_case *g1 = gcase(1), *g3 = gcase(3);
    specd_draft_job jb = job_for(b, g3->prompt, 50, &s, 3, &out);
    propose1(d, &jb);
    specd_drafter_session_close(d, b);
    void *b2 = open_session(d);
    assert_non_null(b2);
    int32_t h[64];
    memcpy(h, g3->prompt, sizeof(int32_t) * 20);
    h[20] = g1->prompt[0];
    check_against_fresh(d, b2, h, 21, &s, 3, &out);
    specd_drafter_session_close(d, a);
    specd_drafter_session_close(d, b2);
    specd_tree_buf_free(&out);
    specd_drafter_free(d);
}

/* Requests open and close sessions on their own threads: never two open
 * sessions on one slot, and with as many threads as slots nobody is ever
 * refused (ThreadSanitizer found two concurrent opens taking one slot). */
enum { OPEN_THREADS = 4, OPEN_ROUNDS = 20000 };
typedef struct open_race {
    specd_drafter *d;
    pthread_mutex_t mu; /* guards open[]: the sessions now held */
    void *open[OPEN_THREADS];
    int twice, refused;
} open_race;

/* Records st as held; 0 when another thread holds it already. */
static int hold(open_race *r, void *st, int take) {
    pthread_mutex_lock(&r->mu);
    int ok = 1, free_i = -1;
    for (int i = 0; i < OPEN_THREADS; i++) {
        if (r->open[i] == st) {
            if (take) ok = 0;
            else r->open[i] = NULL;
        } else if (!r->open[i] && free_i < 0) {
            free_i = i;
        }
    }
    if (take && ok) {
        if (free_i < 0) ok = 0; /* more sessions held than slots */
        else r->open[free_i] = st;
    }
    if (!ok) r->twice++;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

static void *open_close_loop(void *arg) {
    open_race *r = arg;
    for (int i = 0; i < OPEN_ROUNDS; i++) {
        void *st = NULL;
        specd_error err = {{0}};
        if (specd_drafter_session_open(r->d, &st, &err)) {
            pthread_mutex_lock(&r->mu);
            r->refused++;
            pthread_mutex_unlock(&r->mu);
            continue;
        }
        if (hold(r, st, 1)) hold(r, st, 0);
        specd_drafter_session_close(r->d, st);
    }
    return NULL;
}

static void test_session_open_threads(void **state) {
    (void)state;
    open_race r = {.d = make_lm(OPEN_THREADS, 64, 4), .mu = PTHREAD_MUTEX_INITIALIZER};
    pthread_t th[OPEN_THREADS];
    for (int i = 0; i < OPEN_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, open_close_loop, &r), 0);
    for (int i = 0; i < OPEN_THREADS; i++) pthread_join(th[i], NULL);
    assert_int_equal(r.twice, 0);
    assert_int_equal(r.refused, 0);
    specd_drafter_free(r.d);
}

static void test_sampling_q_and_draws(void **state) {
    (void)state;
    specd_drafter *d = make_lm(4, 0, 4);
    direct r;
    direct_open(&r);
    const golden_case *c = gcase(2);
    int n = c->n_prompt;
    specd_error err = {{0}};
    specd_token_counts counts;
    assert_int_equal(specd_token_counts_init(&counts, g_vocab, &err), 0);
    /* the first 20 tokens as prompt, the rest as generated */
    for (int i = 0; i < n; i++) specd_token_counts_add(&counts, c->prompt[i], i >= 20);
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 0.8f;
    s.method = SPECD_SAMPLING_REJECTION; /* q-carrying trees */
    s.top_k = 50;
    s.top_p = 0.95f;
    s.seed = 1234;
    s.repetition_penalty = 1.3f;
    s.presence_penalty = 0.5f;
    enum { DEPTH = 5 };
    uint64_t position = 13;
    specd_tree_buf out, again;
    tree_init(&out);
    tree_init(&again);
    void *sess = open_session(d);
    specd_draft_job job = job_for(sess, c->prompt, n, &s, DEPTH, &out);
    job.counts = &counts;
    job.position = position;
    propose1(d, &job); /* validates: every q a distribution holding its child */
    assert_int_equal(out.n_nodes, DEPTH);

    /* each q is the model's logits, adjusted along the path, through the
     * request's filters; each child the draw at (seed ^ salt, position + i,
     * 0) from it */
    int32_t seq[MAXH];
    memcpy(seq, c->prompt, sizeof(int32_t) * (size_t)n);
    float *adj = malloc(sizeof(float) * (size_t)g_vocab);
    float *p = malloc(sizeof(float) * (size_t)g_vocab);
    void *scratch = malloc(specd_sampling_scratch_size(g_vocab));
    void *ascratch = malloc(specd_logits_adjust_scratch_size(DEPTH));
    float cum = 0.0f;
    for (int i = 0; i < DEPTH; i++) {
        memcpy(adj, direct_logits(&r, seq, n + i), sizeof(float) * (size_t)g_vocab);
        specd_logits_adjust(&s, &counts, out.tokens, i, adj, g_vocab, ascratch);
        specd_sampling_probs(&s, adj, g_vocab, p, scratch);
        const specd_sparse_dist *q = &out.q[i]; /* parent i-1's children */
        int nz = 0;
        double sum = 0.0;
        for (int v = 0; v < g_vocab; v++) nz += p[v] > 0.0f;
        assert_int_equal(q->n, nz);
        assert_true(q->n <= 50);
        for (int j = 0; j < q->n; j++) {
            assert_true(fabsf(q->probs[j] - p[q->ids[j]]) < 1e-5f);
            if (j) assert_true(q->ids[j] > q->ids[j - 1]);
            sum += q->probs[j];
        }
        assert_true(fabs(sum - 1.0) < 1e-4);
        double u = specd_rng_uniform(s.seed ^ SPECD_DRAFT_RNG_SALT, position + (uint64_t)i, 0);
        int pick = specd_sample_from_probs(q->probs, q->n, u);
        assert_int_equal(out.tokens[i], q->ids[pick]);
        cum += logf(q->probs[pick]);
        assert_true(fabsf(out.logq[i] - cum) < 1e-4f);
        seq[n + i] = out.tokens[i];
    }
    assert_int_equal(out.q[DEPTH].n, 0); /* the leaf has no children */

    /* reproducible: the same request in another session, same tree */
    void *sess2 = open_session(d);
    specd_draft_job job2 = job_for(sess2, c->prompt, n, &s, DEPTH, &again);
    job2.counts = &counts;
    job2.position = position;
    propose1(d, &job2);
    assert_same_tree(&out, &again, 1);
    /* and other seeds draw other chains */
    int differs = 0;
    for (uint64_t seed = 1; seed <= 5 && !differs; seed++) {
        specd_sampling s2 = s;
        s2.seed = seed;
        specd_draft_job j3 = job_for(sess2, c->prompt, n, &s2, DEPTH, &again);
        j3.counts = &counts;
        j3.position = position;
        propose1(d, &j3);
        for (int i = 0; i < DEPTH; i++) differs |= again.tokens[i] != out.tokens[i];
    }
    assert_true(differs);
    free(adj);
    free(p);
    free(scratch);
    free(ascratch);
    specd_token_counts_free(&counts);
    specd_tree_buf_free(&out);
    specd_tree_buf_free(&again);
    direct_close(&r);
    specd_drafter_free(d);
}

static void test_greedy_applies_adjustments(void **state) {
    (void)state;
    specd_drafter *d = make_lm(1, 0, 1);
    const golden_case *c = gcase(1);
    specd_sampling s;
    greedy_sampling(&s);
    /* a +100 bias on one token makes it the argmax everywhere... */
    int32_t bias_id = 7;
    float bias_v = 100.0f;
    s.n_logit_bias = 1;
    s.bias_ids = &bias_id;
    s.bias_values = &bias_v;
    specd_tree_buf out;
    tree_init(&out);
    void *sess = open_session(d);
    specd_draft_job job = job_for(sess, c->prompt, c->n_prompt, &s, 4, &out);
    propose1(d, &job);
    for (int i = 0; i < 4; i++) assert_int_equal(out.tokens[i], 7);
    /* ...and a bias just big enough to win the first two steps on its own,
     * with penalties that the drafted 7 itself (a path token, counted as
     * generated) triggers at the second step: only a drafter that applies
     * the path drafts something else there */
    direct r;
    direct_open(&r);
    int32_t seq[64];
    memcpy(seq, c->prompt, sizeof(int32_t) * (size_t)c->n_prompt);
    float need = 0.0f;
    for (int step = 0; step < 2; step++) {
        seq[c->n_prompt] = 7;
        const float *l = direct_logits(&r, seq, c->n_prompt + step);
        for (int v = 0; v < g_vocab; v++)
            if (v != 7 && l[v] - l[7] > need) need = l[v] - l[7];
    }
    float small_bias = need + 0.5f;
    s.bias_values = &small_bias;
    s.repetition_penalty = 10.0f;
    s.presence_penalty = 2.0f;
    s.frequency_penalty = 2.0f;
    specd_draft_job job2 = job_for(sess, c->prompt, c->n_prompt, &s, 4, &out);
    propose1(d, &job2);
    assert_int_equal(out.tokens[0], 7);
    assert_int_not_equal(out.tokens[1], 7);
    float *adj = malloc(sizeof(float) * (size_t)g_vocab);
    void *ascratch = malloc(specd_logits_adjust_scratch_size(4));
    for (int i = 0; i < 4; i++) {
        memcpy(adj, direct_logits(&r, seq, c->n_prompt + i), sizeof(float) * (size_t)g_vocab);
        specd_logits_adjust(&s, NULL, out.tokens, i, adj, g_vocab, ascratch);
        assert_int_equal(out.tokens[i], specd_argmax(adj, g_vocab));
        seq[c->n_prompt + i] = out.tokens[i];
    }
    free(adj);
    free(ascratch);
    direct_close(&r);
    specd_tree_buf_free(&out);
    specd_drafter_free(d);
}

static void test_create_errors(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_lm_drafter_opts o = {.path = "/nonexistent/model.gguf"};
    assert_null(specd_lm_drafter_create(&o, &err));
    assert_true(err.msg[0] != 0);
    o = (specd_lm_drafter_opts){.path = NULL};
    assert_null(specd_lm_drafter_create(&o, &err));
    assert_non_null(strstr(err.msg, "path"));
    o = (specd_lm_drafter_opts){.path = g_model, .max_sessions = -1};
    assert_null(specd_lm_drafter_create(&o, &err));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_is_own_continuation),
        cmocka_unit_test(test_rollback_equals_fresh),
        cmocka_unit_test(test_batch_equals_one_at_a_time),
        cmocka_unit_test(test_context_limit),
        cmocka_unit_test(test_slots_run_out),
        cmocka_unit_test(test_session_open_threads),
        cmocka_unit_test(test_sampling_q_and_draws),
        cmocka_unit_test(test_greedy_applies_adjustments),
        cmocka_unit_test(test_create_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
