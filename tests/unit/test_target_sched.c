/* test_target_sched.c - target-svc's model work path (session + scheduler +
 * verifier), without gRPC, as the Target service drives it:
 *
 *   - Generate (PREFILL + DECODE items) and Verify (PREFILL + TREE items)
 *     give the same tokens with repetition / frequency / presence penalties
 *     and logit bias on, and the same log-probabilities (to rounding);
 *   - a failover re-open (resumed_tokens) continues a seeded sampling run
 *     token for token: the resumed tokens count as generated for the
 *     penalties and the random draws go on at the same output index;
 *   - StepTimings' active_sessions counts the sessions holding a KV slot,
 *     draft_tokens a pass's draft-tree nodes and prompt_tokens its prompt
 *     rows.
 *
 * Model: the tiny golden Llama (tests/golden/data/tiny-gqa). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "specd.pb-c.h"
#include "target-svc/scheduler.h"
#include "target-svc/service.h" /* specd_session_open: a Verify Open into a session */
#include "target-svc/session.h"
#include "tests/harness/test_util.h"

#define N_GEN 24
#define MAX_TREE 8
#define TOP_N 3

typedef struct env {
    specd_model_file *m;
    specd_transformer *t;
    specd_sched *sched;
    specd_session_limits lim;
} env;

static void env_open(env *e) {
    specd_error err = {{0}};
    e->m = specd_model_open(test_path("tests/golden/data/tiny-gqa/hf"), &err);
    if (!e->m) fail_msg("%s", err.msg);
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 2}, .n_slots = 3,
                                .max_ctx = 128, .max_batch = 64};
    e->t = specd_transformer_create(e->m, &o, &err);
    if (!e->t) fail_msg("%s", err.msg);
    specd_sched_opts so = {.n_slots = 3, .max_batch_tokens = 64, .max_wait_ms = 0};
    e->sched = specd_sched_create(e->t, &so, &err);
    if (!e->sched) fail_msg("%s", err.msg);
    e->lim = (specd_session_limits){.vocab = e->m->hp.vocab_size, .context = 128,
                                    .max_prompt_tokens = 64, .max_tree_tokens = MAX_TREE,
                                    .eos_id = -1};
}

static void env_close(env *e) {
    specd_sched_free(e->sched);
    specd_transformer_free(e->t);
    specd_model_close(e->m);
}

/* SamplingParams with every adjustment on (bias ids picked to matter on this
 * model: 12 and 77 are in the prompt below). */
static Specd__V1__LogitBias g_bias[3];
static Specd__V1__LogitBias *g_bias_ptrs[3];
static void penalized(Specd__V1__SamplingParams *sp, float temperature, uint64_t seed) {
    specd__v1__sampling_params__init(sp);
    sp->temperature = temperature;
    sp->top_k = 20;
    sp->seed = seed;
    sp->repetition_penalty = 1.3f;
    sp->frequency_penalty = 0.4f;
    sp->presence_penalty = 0.3f;
    static const int32_t ids[3] = {12, 300, 77};
    static const float vals[3] = {1.5f, -100.0f, 0.75f};
    for (int i = 0; i < 3; i++) {
        specd__v1__logit_bias__init(&g_bias[i]);
        g_bias[i].token_id = ids[i];
        g_bias[i].bias = vals[i];
        g_bias_ptrs[i] = &g_bias[i];
    }
    sp->n_logit_bias = 3;
    sp->logit_bias = g_bias_ptrs;
}

static void session_open(env *e, specd_session *s, const int32_t *prompt, int n_prompt,
                         int resumed, Specd__V1__SamplingParams *sp) {
    Specd__V1__VerifyOpen o = SPECD__V1__VERIFY_OPEN__INIT;
    o.n_prompt_ids = (size_t)n_prompt;
    o.prompt_ids = (int32_t *)prompt;
    o.sampling = sp;
    o.max_new_tokens = N_GEN;
    o.resumed_tokens = resumed;
    o.logprobs = 1;
    o.top_logprobs = TOP_N;
    specd_error err = {{0}};
    specd_session_init(s, &e->lim);
    if (specd_session_open(s, &o, "open", &err)) fail_msg("%s", err.msg);
}

static void run(env *e, specd_work *w) {
    int rc = specd_sched_run(e->sched, w);
    if (rc != SPECD_WORK_OK) fail_msg("scheduler: %d %s", rc, w->err.msg);
}

/* Plain decoding as Target.Generate runs it. Returns tokens and logprobs. */
static void generate(env *e, const int32_t *prompt, int n_prompt, int resumed,
                     Specd__V1__SamplingParams *sp, int32_t *out, specd_token_logprob *lps) {
    specd_session s;
    session_open(e, &s, prompt, n_prompt, resumed, sp);
    int slot = specd_sched_acquire_slot(e->sched);
    assert_true(slot >= 0);
    specd_work w;
    memset(&w, 0, sizeof w);
    w.kind = SPECD_WORK_PREFILL;
    w.slot = slot;
    w.tokens = s.prompt;
    w.n_tokens = s.n_prompt;
    int n_past_after = s.n_prompt;
    for (int g = 0;; g++) {
        w.sampling = &s.sampling;
        w.counts = specd_session_counts(&s);
        w.position = specd_session_position(&s);
        w.logprobs = &lps[g];
        w.top_logprobs = s.top_logprobs;
        run(e, &w);
        specd_finish fr;
        out[g] = w.next_token;
        specd_session_emit(&s, &out[g], 1, n_past_after, &fr);
        if (fr) {
            assert_int_equal(fr, SPECD__V1__FINISH_REASON__FINISH_REASON_LENGTH);
            assert_int_equal(g + 1, N_GEN);
            break;
        }
        memset(&w, 0, sizeof w);
        w.kind = SPECD_WORK_DECODE;
        w.slot = slot;
        w.n_past = s.n_past;
        w.tokens = &s.pending;
        w.n_tokens = 1;
        n_past_after = s.n_past + 1;
    }
    specd_sched_release_slot(e->sched, slot);
    specd_session_free(&s);
}

static double logprob_diff(const specd_token_logprob *a, const specd_token_logprob *b) {
    assert_int_equal(a->token, b->token);
    assert_int_equal(a->n_top, b->n_top);
    double d = fabs((double)a->logprob - (double)b->logprob);
    for (int j = 0; j < a->n_top; j++) {
        assert_int_equal(a->top_ids[j], b->top_ids[j]);
        d = fmax(d, fabs((double)a->top_lps[j] - (double)b->top_lps[j]));
    }
    return d;
}

static const int32_t k_prompt[] = {3, 77, 154, 9, 201, 45, 12, 77, 9};
#define P ((int)(sizeof k_prompt / sizeof k_prompt[0]))

/* Verify with greedy penalties: trees whose first path follows the plain
 * output for 1..4 tokens and then goes wrong, with a wrong sibling at the
 * root, must give the plain tokens and the plain logprobs; every step also
 * reports the sessions holding a slot (this one plus an idle one). */
static void test_verify_matches_generate(void **state) {
    (void)state;
    env e;
    env_open(&e);
    Specd__V1__SamplingParams sp;
    penalized(&sp, 0.0f, 0);
    int32_t ref[N_GEN];
    specd_token_logprob ref_lp[N_GEN];
    generate(&e, k_prompt, P, 0, &sp, ref, ref_lp);

    int idle = specd_sched_acquire_slot(e.sched); /* a second session, doing nothing */
    specd_session s;
    session_open(&e, &s, k_prompt, P, 0, &sp);
    int slot = specd_sched_acquire_slot(e.sched);
    int32_t out[N_GEN + MAX_TREE + 1], toks[MAX_TREE + 1], acc[MAX_TREE], acc_nodes[MAX_TREE];
    specd_token_logprob lps[MAX_TREE + 1], out_lp[N_GEN + MAX_TREE + 1];
    int n_out = 0, steps = 0;
    specd_work w;
    memset(&w, 0, sizeof w);
    w.kind = SPECD_WORK_PREFILL;
    w.slot = slot;
    w.tokens = s.prompt;
    w.n_tokens = s.n_prompt;
    w.sampling = &s.sampling;
    w.counts = specd_session_counts(&s);
    w.position = specd_session_position(&s);
    w.logprobs = lps;
    w.top_logprobs = s.top_logprobs;
    run(&e, &w);
    assert_int_equal(w.active_sessions, 2);
    assert_int_equal(w.draft_tokens, 0); /* a prompt has no draft rows */
    assert_int_equal(w.prompt_tokens, P); /* ... and its rows are prompt rows */
    specd_finish fr;
    specd_session_emit(&s, &w.next_token, 1, s.n_prompt, &fr);
    out_lp[n_out] = lps[0];
    out[n_out++] = w.next_token;
    double worst = 0;
    while (!fr) {
        /* tree: [wrong root sibling, correct chain of len 1..4, then a wrong token] */
        int32_t tokens[MAX_TREE], parents[MAX_TREE];
        int n = 0, len = 1 + steps % 4, parent = -1;
        tokens[n] = (ref[n_out] + 1) % e.lim.vocab;
        parents[n++] = -1;
        for (int d = 0; d < len && n_out + d < N_GEN; d++) {
            tokens[n] = ref[n_out + d];
            parents[n] = parent;
            parent = n++;
        }
        tokens[n] = 0;
        parents[n++] = parent;
        specd_session_tree_req t = {.step = s.step + 1, .n_tokens = (size_t)n,
                                    .n_parents = (size_t)n, .tokens = tokens,
                                    .parents = parents, .bad_q = -1};
        specd_error err = {{0}};
        if (specd_session_tree(&s, &t, &err)) fail_msg("%s", err.msg);
        toks[0] = s.pending;
        memcpy(toks + 1, tokens, sizeof(int32_t) * (size_t)n);
        memset(&w, 0, sizeof w);
        w.kind = SPECD_WORK_TREE;
        w.slot = slot;
        w.n_past = s.n_past;
        w.tokens = toks;
        w.n_tokens = 1 + n;
        w.tree = &s.tree;
        w.sampling = &s.sampling;
        w.counts = specd_session_counts(&s);
        w.position = specd_session_position(&s);
        w.accepted = acc;
        w.accepted_nodes = acc_nodes;
        w.logprobs = lps;
        w.top_logprobs = s.top_logprobs;
        run(&e, &w);
        assert_int_equal(w.active_sessions, 2);
        /* alone in its pass: its nodes are the pass's draft rows, and the
         * pending token is not one */
        assert_int_equal(w.batch_tokens, 1 + n);
        assert_int_equal(w.draft_tokens, n);
        assert_int_equal(w.prompt_tokens, 0);
        int32_t emitted[MAX_TREE + 1];
        memcpy(emitted, acc, sizeof(int32_t) * (size_t)w.n_accepted);
        emitted[w.n_accepted] = w.next_token;
        s.step = t.step;
        int kept = specd_session_emit(&s, emitted, w.n_accepted + 1,
                                      s.n_past + 1 + w.n_accepted, &fr);
        for (int i = 0; i < kept; i++) {
            out_lp[n_out] = lps[i];
            out[n_out++] = emitted[i];
        }
        steps++;
    }
    assert_int_equal(n_out, N_GEN);
    for (int i = 0; i < N_GEN; i++) {
        if (out[i] != ref[i]) fail_msg("token %d: Verify gave %d, Generate %d", i, out[i], ref[i]);
        worst = fmax(worst, logprob_diff(&out_lp[i], &ref_lp[i]));
    }
    printf("  %d tokens in %d tree steps; logprobs Verify vs Generate: max |diff| %.3g\n", N_GEN,
           steps + 1, worst);
    assert_true(steps + 1 < N_GEN); /* the chains were accepted */
    assert_true(worst <= 1e-4);
    specd_sched_release_slot(e.sched, slot);
    specd_sched_release_slot(e.sched, idle);
    specd_session_free(&s);
    env_close(&e);
}

/* Failover: a new session opened with prompt + the first k generated tokens
 * as resumed_tokens continues a seeded, penalized sampling run exactly. */
static void test_resume_continues_exactly(void **state) {
    (void)state;
    env e;
    env_open(&e);
    Specd__V1__SamplingParams sp;
    penalized(&sp, 0.9f, 4242);
    int32_t ref[N_GEN];
    specd_token_logprob ref_lp[N_GEN];
    generate(&e, k_prompt, P, 0, &sp, ref, ref_lp);
    int32_t greedy[N_GEN];
    specd_token_logprob glp[N_GEN];
    Specd__V1__SamplingParams g;
    penalized(&g, 0.0f, 0);
    generate(&e, k_prompt, P, 0, &g, greedy, glp);
    int differ = 0;
    for (int i = 0; i < N_GEN; i++) differ += ref[i] != greedy[i];
    assert_true(differ > 0); /* really sampling */

    static const int ks[] = {1, 7, 16};
    for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++) {
        int k = ks[c];
        int32_t prompt[P + N_GEN];
        memcpy(prompt, k_prompt, sizeof k_prompt);
        memcpy(prompt + P, ref, sizeof(int32_t) * (size_t)k);
        int32_t out[N_GEN];
        specd_token_logprob lp[N_GEN];
        /* max_new_tokens counts only new tokens: N_GEN more of them */
        generate(&e, prompt, P + k, k, &sp, out, lp);
        for (int i = 0; k + i < N_GEN; i++)
            if (out[i] != ref[k + i])
                fail_msg("resumed at %d: token %d is %d, the uninterrupted run gave %d", k, k + i,
                         out[i], ref[k + i]);
        /* and without resumed_tokens the same prompt is a different request:
         * the resumed ids would count as prompt (no frequency / presence)
         * and the draws would restart at output index 0 */
        generate(&e, prompt, P + k, 0, &sp, out, lp);
        int same = 1;
        for (int i = 0; k + i < N_GEN; i++) same &= out[i] == ref[k + i];
        assert_false(same);
    }
    env_close(&e);
}

/* Open checks for the new fields, with messages naming them. */
static void test_open_checks(void **state) {
    (void)state;
    specd_session_limits lim = {.vocab = 100, .context = 32, .max_prompt_tokens = 4,
                                .max_tree_tokens = 4, .eos_id = 2};
    int32_t prompt[10] = {1, 5, 7, 9, 11, 13, 15, 17, 19, 21};
    struct {
        int n_prompt, resumed, logprobs, top;
        const char *want; /* NULL = accepted */
    } cases[] = {
        {4, 0, 0, 0, NULL},
        {5, 0, 0, 0, "open.prompt_ids: the prompt has 5 tokens, over the limit of 4"},
        {10, 6, 0, 0, NULL}, /* 4 new + 6 resumed: the limit counts new ones */
        {10, 5, 0, 0, "the prompt has 10 tokens (5 of them resumed), over the limit of 4"},
        {3, 3, 0, 0, "open.resumed_tokens = 3 must be in 0..2"},
        {3, -1, 0, 0, "open.resumed_tokens = -1"},
        {3, 0, 1, 20, NULL},
        {3, 0, 1, 21, "open.top_logprobs = 21 must be in 0..20"},
        {3, 0, 0, 2, "open.top_logprobs = 2 needs open.logprobs = true"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Specd__V1__VerifyOpen o = SPECD__V1__VERIFY_OPEN__INIT;
        o.n_prompt_ids = (size_t)cases[i].n_prompt;
        o.prompt_ids = prompt;
        o.max_new_tokens = 4;
        o.resumed_tokens = cases[i].resumed;
        o.logprobs = cases[i].logprobs;
        o.top_logprobs = cases[i].top;
        specd_session s;
        specd_session_init(&s, &lim);
        specd_error err = {{0}};
        grpc_status_code code = specd_session_open(&s, &o, "open", &err);
        if (!cases[i].want) {
            if (code) fail_msg("case %zu: refused: %s", i, err.msg);
            assert_int_equal(specd_session_position(&s), (uint64_t)cases[i].resumed);
            assert_null(specd_session_counts(&s)); /* nothing adjusts logits */
        } else {
            assert_int_equal(code, GRPC_STATUS_INVALID_ARGUMENT);
            if (!strstr(err.msg, cases[i].want))
                fail_msg("case %zu: '%s' does not contain '%s'", i, err.msg, cases[i].want);
        }
        specd_session_free(&s);
    }

    /* Sampling errors carry the field path; the bias list is copied (the
     * request may be freed) and the counts hold prompt + resumed tokens. */
    Specd__V1__SamplingParams sp;
    penalized(&sp, 0.0f, 0);
    Specd__V1__VerifyOpen o = SPECD__V1__VERIFY_OPEN__INIT;
    o.n_prompt_ids = 6;
    o.prompt_ids = (int32_t[]){4, 4, 6, 8, 8, 8};
    o.resumed_tokens = 3;
    o.max_new_tokens = 4;
    o.sampling = &sp;
    specd_session s;
    specd_error err = {{0}};
    specd_session_init(&s, &lim);
    assert_int_equal(specd_session_open(&s, &o, "open", &err), GRPC_STATUS_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "open.sampling.logit_bias[1].token_id = 300 is outside 0..99");
    specd_session_free(&s);
    g_bias[1].token_id = 50;
    specd_session_init(&s, &lim);
    assert_int_equal(specd_session_open(&s, &o, "open", &err), GRPC_STATUS_OK);
    g_bias[1].token_id = 51; /* the session kept its own copy */
    assert_int_equal(s.sampling.n_logit_bias, 3);
    assert_int_equal(s.sampling.bias_ids[1], 50);
    const specd_token_counts *c = specd_session_counts(&s);
    assert_non_null(c);
    assert_int_equal(c->out_count[4], 0); /* prompt */
    assert_int_equal(c->out_count[6], 0);
    assert_int_equal(c->out_count[8], 3); /* resumed: generated */
    assert_int_equal(c->n_seen, 3);
    assert_int_equal(specd_session_position(&s), 3);
    /* emitted tokens join the counts, and max_new_tokens counts only them */
    specd_finish fr;
    int32_t more[4] = {8, 9, 9, 9};
    assert_int_equal(specd_session_emit(&s, more, 4, 10, &fr), 4);
    assert_int_equal(fr, SPECD__V1__FINISH_REASON__FINISH_REASON_LENGTH);
    assert_int_equal(c->out_count[8], 4);
    assert_int_equal(c->out_count[9], 3);
    specd_session_free(&s);
    /* the model's other end tokens (Llama 3's <|eot_id|> where EOS is
     * <|end_of_text|>) end it as EOS does, and the token is kept */
    specd_session_limits lim_end = lim;
    lim_end.end_ids[0] = 9;
    lim_end.n_end_ids = 1;
    specd_session_init(&s, &lim_end);
    assert_int_equal(specd_session_open(&s, &o, "open", &err), GRPC_STATUS_OK);
    assert_int_equal(specd_session_emit(&s, more, 4, 10, &fr), 2);
    assert_int_equal(fr, SPECD__V1__FINISH_REASON__FINISH_REASON_EOS);
    specd_session_free(&s);
    sp.frequency_penalty = 3.0f;
    specd_session_init(&s, &lim);
    assert_int_equal(specd_session_open(&s, &o, "open", &err), GRPC_STATUS_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "open.sampling.frequency_penalty must be in [-2, 2], got 3");
    specd_session_free(&s);
}

/* A session's pages held after it generated go back to the pool once its
 * slot is released, while the target is idle (not at the next request's
 * pass), so GetInfo and the page gauges of an idle target show them free:
 * within a second. */
static void test_idle_release_returns_pages(void **state) {
    (void)state;
    env e;
    env_open(&e);
    Specd__V1__SamplingParams sp;
    penalized(&sp, 0.0f, 0);
    int32_t out[N_GEN];
    specd_token_logprob lps[N_GEN];
    generate(&e, k_prompt, P, 0, &sp, out, lps); /* releases its slot at the end */
    specd_kv_pool_stats st;
    for (int i = 0; i < 100; i++) {
        specd_sched_kv_stats(e.sched, &st);
        if (st.n_held == 0) break;
        usleep(10000);
    }
    if (st.n_held != 0) fail_msg("%d pages still held 1 s after the only session ended", st.n_held);
    env_close(&e);
}

/* The start-up cost curve: every grid point up to calibrate_tokens timed,
 * none beyond, a curve that never falls with the size, and the scratch
 * slot and its pages given back. */
static void test_cost_calibration(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_model_file *m = specd_model_open(test_path("tests/golden/data/tiny-gqa/hf"), &err);
    if (!m) fail_msg("%s", err.msg);
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 2}, .n_slots = 3,
                                .max_ctx = 128, .max_batch = 64};
    specd_transformer *t = specd_transformer_create(m, &o, &err);
    if (!t) fail_msg("%s", err.msg);
    specd_sched_opts so = {.n_slots = 3, .max_batch_tokens = 64, .calibrate_tokens = 16};
    specd_sched *s = specd_sched_create(t, &so, &err);
    if (!s) fail_msg("%s", err.msg);
    specd_step_cost c;
    specd_sched_step_cost(s, &c);
    assert_int_equal(c.tokens[c.n - 1], 64);
    for (int i = 0; i < c.n; i++) {
        if (c.tokens[i] <= 16) assert_true(c.us[i] > 0);
        else assert_true(c.us[i] == 0);
    }
    for (int n = 2; n <= 64; n++)
        assert_true(specd_step_cost_at(&c, n) >= specd_step_cost_at(&c, n - 1));
    assert_int_equal(specd_sched_free_slots(s), 3);
    specd_kv_pool_stats st;
    specd_sched_kv_stats(s, &st);
    assert_int_equal(st.n_held, 0);
    specd_sched_free(s);
    specd_transformer_free(t);
    specd_model_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_calibration),
        cmocka_unit_test(test_idle_release_returns_pages),
        cmocka_unit_test(test_open_checks),
        cmocka_unit_test(test_verify_matches_generate),
        cmocka_unit_test(test_resume_continues_exactly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
