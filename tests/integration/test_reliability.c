/* test_reliability.c - the services under the conditions issue 20 found
 * weak, each as a test (about a minute in all):
 *
 *   1. bad inputs, side by side: every malformed request goes to
 *      Draft.Generate and Target.Generate, which must answer with the same
 *      status code and the same message (one admission check,
 *      common/rpc/admission.h), among them a prompt over the context (was OK
 *      with 0 tokens on draft-svc), max_new_tokens 2^31-1 (was accepted by
 *      target-svc), and invalid UTF-8 in every string field;
 *   2. honest health: a draft-svc whose target is down is NOT_SERVING for
 *      specd.v1.Draft and overall, while "liveness" says SERVING; once a
 *      target comes up it turns SERVING within about a second, and NOT_SERVING
 *      again when the target goes;
 *   2b. busy is not dead: a target that answers its health checks while one
 *      step takes 3.5 s, with step_timeout 1 s, is waited for (no failover);
 *   3. seeds at any load: a seeded T=0.8 request gives the same tokens alone
 *      and beside 6 other streams, for every drafter (the load changes the
 *      tree shape the policy would pick: 1x5 alone, 1x2 at 7 sessions);
 *   4. failover across target-svc processes: SIGKILL while the Open
 *      (prefill) is outstanding, SIGKILL during decode, and a hung target
 *      (SIGSTOP) that is given up within step_timeout, all with the exact
 *      greedy tokens of an undisturbed run;
 *   5. the prefix cache across processes (issue 15): prompts that share a
 *      70-token prefix give the same greedy tokens from a target with the
 *      cache on and one started with --limits.prefix_cache=false, the one
 *      reporting exactly the shared full pages as hits in GetInfo and the
 *      other none; then a session whose target is killed mid-decode is
 *      re-prefilled on the survivor, which already holds the prompt's pages:
 *      GetInfo there counts exactly the prompt's full pages as new hits, and
 *      the tokens are still the cache-off target's.
 *   6. a long prompt beside a running stream: a real target-svc with the
 *      default model and configuration, a stream decoding through draft-svc,
 *      and a 2,000-token prompt arriving: the stream's longest gap stays
 *      under 2 s and under a third of the prompt's time (chunked prefill),
 *      with no failover. */
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model/model_file.h"
#include "common/rpc/rpc_client.h"
#include "common/rpc/rpc_server.h"
#include "draft-svc/drafter.h"
#include "draft-svc/service.h"
#include "draft-svc/target_pool.h"
#include "draft-svc/target_watch.h"
#include "specd.pb-c.h"
#include "target-svc/service.h"
#include "common/model/transformer.h"
#include "tests/harness/svc.h"
#include "tests/harness/test_util.h"

#define TINY "tests/golden/data/tiny-gqa/hf"
#define TINY_DRAFT "tests/golden/data/tiny-gqa/model-q8_0.gguf"
#define TINY_GGUF "tests/golden/data/tiny-gqa/model-f32.gguf"
#define CTX 128
#define MAX_PROMPT 200 /* above CTX, so a long prompt meets the context check */
#define MAX_NEW 240
#define DEFAULT_NEW 16
#define VOCAB 512
#define DRAFT_M "/specd.v1.Draft/Generate"
#define TARGET_M "/specd.v1.Target/Generate"

/* ---- an in-process target and draft-svc ------------------------------------ */

typedef struct target_side {
    specd_model_file *m;
    specd_transformer *t;
    specd_target_service *svc;
    specd_rpc_server *srv;
    char addr[64];
} target_side;

static void target_up(target_side *ts, const char *listen) {
    specd_error err = {{0}};
    memset(ts, 0, sizeof *ts);
    ts->m = specd_model_open(test_path(TINY), &err);
    if (!ts->m) fail_msg("%s", err.msg);
    specd_transformer_opts to = {.backend = {.name = "cpu", .n_threads = 1}, .n_slots = 16,
                                 .max_ctx = CTX, .max_batch = 256};
    if (!(ts->t = specd_transformer_create(ts->m, &to, &err))) fail_msg("%s", err.msg);
    specd_target_opts o = {.max_sessions = 16, .max_prompt_tokens = MAX_PROMPT,
                           .max_tree_tokens = 32, .max_batch_tokens = 256, .max_wait_ms = 1,
                           .max_new_tokens = MAX_NEW, .default_max_new_tokens = DEFAULT_NEW};
    if (!(ts->svc = specd_target_service_create(ts->m, ts->t, NULL, &o, &err)))
        fail_msg("%s", err.msg);
    specd_rpc_server_opts ro = {.listen_addr = listen, .insecure = 1};
    if (!(ts->srv = specd_rpc_server_create(&ro, &err))) fail_msg("%s", err.msg);
    assert_int_equal(specd_target_service_register(ts->svc, ts->srv, &err), 0);
    assert_int_equal(specd_rpc_server_start(ts->srv, &err), 0);
    snprintf(ts->addr, sizeof ts->addr, "127.0.0.1:%d", specd_rpc_server_port(ts->srv));
}

static void target_down(target_side *ts) {
    specd_rpc_server_destroy(ts->srv);
    specd_target_service_free(ts->svc);
    specd_transformer_free(ts->t);
    specd_model_close(ts->m);
    memset(ts, 0, sizeof *ts);
}

typedef struct draft_side {
    specd_drafter *drafters[SPECD_N_DRAFTERS];
    specd_tpool *pool;
    specd_draft_service *svc;
    specd_rpc_server *srv;
    specd_target_watch *watch;
    specd_rpc_channel *ch;
} draft_side;

static char spec_dir[64];

/* draft-svc as main.c assembles it (with the health watch), in front of
 * `targets`, offering ngram, draft_lm (8 sessions), mlp (a random
 * speculator) and mlp_ngram, step_timeout as given. */
static void draft_up_vocab(draft_side *d, const char *const *targets, int n,
                           int step_timeout_ms, int vocab) {
    specd_error err = {{0}};
    memset(d, 0, sizeof *d);
    specd_ngram_drafter_opts no = {.vocab = vocab};
    d->drafters[SPECD_DRAFTER_NGRAM] = specd_ngram_drafter_create(&no, &err);
    if (!d->drafters[SPECD_DRAFTER_NGRAM]) fail_msg("ngram drafter: %s", err.msg);
    /* the tiny model's drafters speak its vocabulary only */
    if (vocab == VOCAB) {
        specd_lm_drafter_opts lo = {.path = test_path(TINY_DRAFT), .n_threads = 1,
                                    .max_sessions = 8, .max_ctx = CTX};
        d->drafters[SPECD_DRAFTER_LM] = specd_lm_drafter_create(&lo, &err);
        specd_mlp_drafter_opts mo = {.path = spec_dir, .n_threads = 1};
        d->drafters[SPECD_DRAFTER_MLP] = specd_mlp_drafter_create(&mo, &err);
        specd_hybrid_drafter_opts ho = {.model = d->drafters[SPECD_DRAFTER_MLP],
                                        .lookup = d->drafters[SPECD_DRAFTER_NGRAM]};
        if (ho.model) d->drafters[SPECD_DRAFTER_MLP_NGRAM] = specd_hybrid_drafter_create(&ho, &err);
        for (int i = 0; i < SPECD_N_DRAFTERS; i++)
            if (!d->drafters[i]) fail_msg("drafter %d: %s", i, err.msg);
    }
    specd_tpool_opts po = {.targets = targets, .n_targets = n,
                          .channel = {.insecure = 1, .connect_timeout_ms = 2000},
                          .min_backoff_ms = 100, .max_backoff_ms = 400,
                          .info_timeout_ms = 5000, .expect_vocab = vocab};
    if (!(d->pool = specd_tpool_create(&po, &err))) fail_msg("pool: %s", err.msg);
    specd_draft_opts o = {.pool = d->pool, .default_drafter = SPECD_DRAFTER_NGRAM,
                          .max_prompt_tokens = vocab == VOCAB ? MAX_PROMPT : 32768,
                          .max_new_tokens = MAX_NEW,
                          .default_max_new_tokens = DEFAULT_NEW, .max_tree_tokens = 32,
                          .step_timeout_ms = step_timeout_ms, .open_timeout_ms = 30000,
                          .max_failovers = 3};
    for (int i = 0; i < SPECD_N_DRAFTERS; i++) o.drafters[i] = d->drafters[i];
    /* draft_config.c's defaults */
    char *table[] = {"1:1x5", "4:1x4", "16:1x2"};
    svc_policy(&o.policy, table, 3);
    if (!(d->svc = specd_draft_service_create(&o, &err))) fail_msg("%s", err.msg);
    specd_rpc_server_opts ro = {.listen_addr = "127.0.0.1:0", .insecure = 1};
    if (!(d->srv = specd_rpc_server_create(&ro, &err))) fail_msg("%s", err.msg);
    assert_int_equal(specd_draft_service_register(d->svc, d->srv, &err), 0);
    assert_int_equal(specd_rpc_server_start(d->srv, &err), 0);
    if (!(d->watch = specd_target_watch_start(d->pool, d->srv, &(specd_target_watch_opts){0},
                                              &err)))
        fail_msg("%s", err.msg);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", specd_rpc_server_port(d->srv));
    d->ch = svc_channel_to(addr);
}

static void draft_up(draft_side *d, const char *const *targets, int n, int step_timeout_ms) {
    draft_up_vocab(d, targets, n, step_timeout_ms, VOCAB);
}

static void draft_down(draft_side *d) {
    specd_rpc_channel_free(d->ch);
    specd_target_watch_stop(d->watch);
    specd_rpc_server_destroy(d->srv);
    specd_draft_service_free(d->svc);
    specd_tpool_free(d->pool);
    for (int i = 0; i < SPECD_N_DRAFTERS; i++) specd_drafter_free(d->drafters[i]);
    memset(d, 0, sizeof *d);
}

static target_side T;
static draft_side D;
static specd_rpc_channel *tch;

static int group_setup(void **state) {
    (void)state;
    snprintf(spec_dir, sizeof spec_dir, "/tmp/specd-test-rel-XXXXXX");
    if (!mkdtemp(spec_dir)) fail_msg("mkdtemp");
    assert_int_equal(test_write_random_speculator(spec_dir), 0);
    target_up(&T, "127.0.0.1:0");
    tch = svc_channel_to(T.addr);
    const char *targets[] = {T.addr};
    draft_up(&D, targets, 1, 20000);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    draft_down(&D);
    specd_rpc_channel_free(tch);
    target_down(&T);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", spec_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", spec_dir);
    unlink(path);
    rmdir(spec_dir);
    svc_kill_all();
    return 0;
}

/* ---- requests ---------------------------------------------------------------- */

typedef struct req {
    Specd__V1__GenerateRequest r;
    Specd__V1__TokenIds ids;
    Specd__V1__SamplingParams sp;
    Specd__V1__ChatMessages chat;
    Specd__V1__ChatMessage msg;
    Specd__V1__ChatMessage *msgp;
    int32_t buf[256];
    char *stops[2];
} req;

/* token-id input: n ids (a repeating pattern inside the vocabulary) */
static void req_ids(req *q, int n, int max_new) {
    memset(q, 0, sizeof *q);
    specd__v1__generate_request__init(&q->r);
    specd__v1__token_ids__init(&q->ids);
    specd__v1__sampling_params__init(&q->sp);
    for (int i = 0; i < n; i++) q->buf[i] = 5 + (i * 37) % 200;
    q->ids.n_ids = (size_t)n;
    q->ids.ids = q->buf;
    q->r.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS;
    q->r.token_ids = &q->ids;
    q->r.max_new_tokens = max_new;
}

/* ---- 1. bad inputs, side by side --------------------------------------------- */

typedef enum bad_kind {
    BAD_PROMPT_OVER_CONTEXT, BAD_PROMPT_OVER_LIMIT, BAD_MAX_NEW_HUGE, BAD_MAX_NEW_NEGATIVE,
    BAD_EMPTY_PROMPT, BAD_NO_INPUT, BAD_TOKEN_ID, BAD_TEXT_UTF8, BAD_CHAT_UTF8, BAD_STOP_UTF8,
    BAD_DRAFTER_UTF8, BAD_STOP_ID, BAD_TOP_LOGPROBS, BAD_TOP_WITHOUT_LOGPROBS,
    BAD_TEMPERATURE, BAD_TEXT_NO_TOKENIZER, BAD_STOP_NO_TOKENIZER, N_BAD
} bad_kind;

static const struct {
    grpc_status_code code;
    const char *want; /* the whole message, or its start when it ends in '*' */
} bad_expect[N_BAD] = {
    [BAD_PROMPT_OVER_CONTEXT] = {GRPC_STATUS_INVALID_ARGUMENT,
                                 "request.input: the prompt has 150 tokens, but the context "
                                 "holds 128"},
    [BAD_PROMPT_OVER_LIMIT] = {GRPC_STATUS_INVALID_ARGUMENT,
                               "request.input: the prompt has 201 tokens, over the limit of 200"},
    [BAD_MAX_NEW_HUGE] = {GRPC_STATUS_INVALID_ARGUMENT,
                          "request.max_new_tokens = 2147483647: must be in 1..240 (0 = 16)"},
    [BAD_MAX_NEW_NEGATIVE] = {GRPC_STATUS_INVALID_ARGUMENT,
                              "request.max_new_tokens = -1: must be in 1..240 (0 = 16)"},
    [BAD_EMPTY_PROMPT] = {GRPC_STATUS_INVALID_ARGUMENT, "request.input: the prompt is empty"},
    [BAD_NO_INPUT] = {GRPC_STATUS_INVALID_ARGUMENT,
                      "request.input: one of text, chat, token_ids is required"},
    [BAD_TOKEN_ID] = {GRPC_STATUS_INVALID_ARGUMENT,
                      "request.input: token id 512 at 1 is outside the vocabulary (0..511)"},
    [BAD_TEXT_UTF8] = {GRPC_STATUS_INVALID_ARGUMENT,
                       "request.text is not valid UTF-8 (byte 2 of 4)"},
    [BAD_CHAT_UTF8] = {GRPC_STATUS_INVALID_ARGUMENT,
                       "request.chat.messages[0].content is not valid UTF-8 (byte 0 of 3)"},
    [BAD_STOP_UTF8] = {GRPC_STATUS_INVALID_ARGUMENT,
                       "request.stop[1] is not valid UTF-8 (byte 0 of 3)"},
    [BAD_DRAFTER_UTF8] = {GRPC_STATUS_INVALID_ARGUMENT,
                          "request.drafter is not valid UTF-8 (byte 1 of 2)"},
    [BAD_STOP_ID] = {GRPC_STATUS_INVALID_ARGUMENT, "request.stop_ids[0] = 512 is outside 0..511"},
    [BAD_TOP_LOGPROBS] = {GRPC_STATUS_INVALID_ARGUMENT,
                          "request.top_logprobs = 21 must be in 0..20"},
    [BAD_TOP_WITHOUT_LOGPROBS] = {GRPC_STATUS_INVALID_ARGUMENT,
                                  "request.top_logprobs = 2 needs request.logprobs = true"},
    [BAD_TEMPERATURE] = {GRPC_STATUS_INVALID_ARGUMENT, "request.sampling.temperature*"},
    [BAD_TEXT_NO_TOKENIZER] = {GRPC_STATUS_FAILED_PRECONDITION,
                               "request.input: this server has no tokenizer; send token_ids"},
    [BAD_STOP_NO_TOKENIZER] = {GRPC_STATUS_FAILED_PRECONDITION, "request.stop*"},
};

static void build_bad(req *q, bad_kind k) {
    static int32_t oob_stop = VOCAB;
    req_ids(q, 8, 8);
    switch (k) {
    case BAD_PROMPT_OVER_CONTEXT: req_ids(q, 150, 8); break;
    case BAD_PROMPT_OVER_LIMIT: req_ids(q, 201, 8); break;
    case BAD_MAX_NEW_HUGE: q->r.max_new_tokens = 2147483647; break;
    case BAD_MAX_NEW_NEGATIVE: q->r.max_new_tokens = -1; break;
    case BAD_EMPTY_PROMPT: q->ids.n_ids = 0; break;
    case BAD_NO_INPUT: q->r.input_case = SPECD__V1__GENERATE_REQUEST__INPUT__NOT_SET; break;
    case BAD_TOKEN_ID: q->buf[1] = VOCAB; break;
    case BAD_TEXT_UTF8:
        q->r.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_TEXT;
        q->r.text = "ab\xc3\x28";
        break;
    case BAD_CHAT_UTF8:
        specd__v1__chat_messages__init(&q->chat);
        specd__v1__chat_message__init(&q->msg);
        q->msg.role = "user";
        q->msg.content = "\xbdhx";
        q->msgp = &q->msg;
        q->chat.n_messages = 1;
        q->chat.messages = &q->msgp;
        q->r.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_CHAT;
        q->r.chat = &q->chat;
        break;
    case BAD_STOP_UTF8: /* the fuzzer's input */
        q->stops[0] = "fine";
        q->stops[1] = "\xbdhx";
        q->r.n_stop = 2;
        q->r.stop = q->stops;
        break;
    case BAD_DRAFTER_UTF8: q->r.drafter = "n\xff"; break;
    case BAD_STOP_ID:
        q->r.n_stop_ids = 1;
        q->r.stop_ids = &oob_stop;
        break;
    case BAD_TOP_LOGPROBS:
        q->r.logprobs = 1;
        q->r.top_logprobs = 21;
        break;
    case BAD_TOP_WITHOUT_LOGPROBS: q->r.top_logprobs = 2; break;
    case BAD_TEMPERATURE:
        q->sp.temperature = -1.0f;
        q->r.sampling = &q->sp;
        break;
    case BAD_TEXT_NO_TOKENIZER:
        q->r.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_TEXT;
        q->r.text = "hello";
        break;
    case BAD_STOP_NO_TOKENIZER:
        q->stops[0] = "fine";
        q->r.n_stop = 1;
        q->r.stop = q->stops;
        break;
    case N_BAD: break;
    }
}

static void test_refusals_side_by_side(void **state) {
    (void)state;
    svc_gen *d = calloc(1, sizeof *d), *t = calloc(1, sizeof *t);
    for (int k = 0; k < N_BAD; k++) {
        req q;
        build_bad(&q, (bad_kind)k);
        svc_generate(D.ch, DRAFT_M, &q.r, d);
        svc_generate(tch, TARGET_M, &q.r, t);
        const char *dm = svc_gen_message(d), *tm = svc_gen_message(t);
        printf("  case %2d: %s: %s\n", k, specd_rpc_status_name(d->code), dm);
        if (d->code != t->code || strcmp(dm, tm))
            fail_msg("case %d: draft-svc says %s '%s', target-svc %s '%s'", k,
                     specd_rpc_status_name(d->code), dm, specd_rpc_status_name(t->code), tm);
        if (d->code != bad_expect[k].code)
            fail_msg("case %d: %s, want %s", k, specd_rpc_status_name(d->code),
                     specd_rpc_status_name(bad_expect[k].code));
        const char *w = bad_expect[k].want;
        size_t wl = strlen(w);
        int prefix = w[wl - 1] == '*';
        if (prefix ? strncmp(dm, w, wl - 1) : strcmp(dm, w))
            fail_msg("case %d: message '%s', want '%s'", k, dm, w);
        if (d->n_ids || t->n_ids) fail_msg("case %d: tokens came with a refusal", k);
    }
    /* The edge that must still run: a prompt that fits, with max_new_tokens
     * past the context, ends with finish CONTEXT on both. */
    req q;
    req_ids(&q, 120, 40);
    q.r.ignore_eos = 1;
    svc_generate(D.ch, DRAFT_M, &q.r, d);
    svc_generate(tch, TARGET_M, &q.r, t);
    assert_int_equal(d->code, GRPC_STATUS_OK);
    assert_int_equal(t->code, GRPC_STATUS_OK);
    assert_int_equal(d->finish, SPECD__V1__FINISH_REASON__FINISH_REASON_CONTEXT);
    assert_int_equal(t->finish, SPECD__V1__FINISH_REASON__FINISH_REASON_CONTEXT);
    assert_int_equal(d->n_ids, t->n_ids);
    assert_memory_equal(d->ids, t->ids, sizeof(int32_t) * (size_t)t->n_ids);
    free(d);
    free(t);
}

/* ---- 2. honest health ----------------------------------------------------------- */

static void test_health_no_targets(void **state) {
    (void)state;
    int port = svc_free_port();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *targets[] = {addr};
    draft_side d;
    draft_up(&d, targets, 1, 20000);
    enum { SERVING = 1, NOT_SERVING = 2 };
    /* Nothing listens there: not ready, but alive. */
    svc_sleep_ms(600);
    assert_int_equal(svc_health(d.ch, "specd.v1.Draft"), NOT_SERVING);
    assert_int_equal(svc_health(d.ch, ""), NOT_SERVING);
    assert_int_equal(svc_health(d.ch, "liveness"), SERVING);
    req q;
    req_ids(&q, 8, 4);
    svc_gen *g = calloc(1, sizeof *g);
    svc_generate(d.ch, DRAFT_M, &q.r, g);
    assert_int_equal(g->code, GRPC_STATUS_UNAVAILABLE);
    /* A target comes up on that address: SERVING within about a second. */
    target_side ts;
    target_up(&ts, addr);
    double up_ms = svc_wait_health(d.ch, "specd.v1.Draft", SERVING, 5000);
    printf("  draft-svc SERVING %.0f ms after its target came up\n", up_ms);
    assert_true(up_ms >= 0);
    /* 1 s is the promise; the slack is for a loaded CI machine */
    assert_true(up_ms < 2000);
    assert_int_equal(svc_health(d.ch, ""), SERVING);
    svc_generate(d.ch, DRAFT_M, &q.r, g);
    assert_int_equal(g->code, GRPC_STATUS_OK);
    /* ... and NOT_SERVING again when it goes. */
    target_down(&ts);
    double down_ms = svc_wait_health(d.ch, "specd.v1.Draft", NOT_SERVING, 5000);
    printf("  draft-svc NOT_SERVING %.0f ms after its target went\n", down_ms);
    assert_true(down_ms >= 0 && down_ms < 3000);
    assert_int_equal(svc_health(d.ch, "liveness"), SERVING);
    free(g);
    draft_down(&d);
}

/* ---- 2b. busy is not dead ------------------------------------------------------- */

/* A stand-in target that is alive but busy: it answers health checks (the
 * server's own Health service) while one Verify step takes SLOW_STEP_MS,
 * far beyond draft-svc's step_timeout, as a target whose step loop a long
 * prefill holds. It decodes plainly (empty trees: drafter "none"). */
#define SLOW_STEP_MS 3500
#define BUSY_STEP_TIMEOUT_MS 1000

static void fake_info(specd_rpc_call *c, void *user) {
    (void)user;
    Specd__V1__Info r = SPECD__V1__INFO__INIT;
    r.service = "specd.v1.Target";
    r.version = SPECD_VERSION;
    r.model_id = "busy-stand-in";
    r.vocab_size = VOCAB;
    r.context_length = CTX;
    r.max_tree_tokens = 32;
    r.max_sessions = 4;
    r.tokenizer_sha256 = "";
    r.backend = "cpu";
    if (specd_rpc_call_send_msg(c, &r.base) == SPECD_RPC_IO_OK)
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

static void fake_verify(specd_rpc_call *c, void *user) {
    (void)user;
    int max_new = 1, n = 0;
    for (;;) {
        Specd__V1__VerifyRequest *q = NULL;
        specd_error err = {{0}};
        if (specd_rpc_call_recv_msg(c, &specd__v1__verify_request__descriptor,
                                    (ProtobufCMessage **)&q, -1, &err) != SPECD_RPC_IO_OK)
            break;
        uint32_t step = 0;
        if (q->msg_case == SPECD__V1__VERIFY_REQUEST__MSG_OPEN)
            max_new = q->open->max_new_tokens;
        else if (q->msg_case == SPECD__V1__VERIFY_REQUEST__MSG_TREE)
            step = q->tree->step;
        int close = q->msg_case == SPECD__V1__VERIFY_REQUEST__MSG_CLOSE;
        protobuf_c_message_free_unpacked(&q->base, NULL);
        if (close) break;
        if (step == 2) svc_sleep_ms(SLOW_STEP_MS); /* busy */
        Specd__V1__VerifyResponse r = SPECD__V1__VERIFY_RESPONSE__INIT;
        r.step = step;
        r.next_token = 7 + n % 50;
        if (++n >= max_new) r.finish_reason = SPECD__V1__FINISH_REASON__FINISH_REASON_LENGTH;
        if (specd_rpc_call_send_msg(c, &r.base) != SPECD_RPC_IO_OK || r.finish_reason) break;
    }
    specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

static void test_busy_is_not_dead(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_rpc_server_opts ro = {.listen_addr = "127.0.0.1:0", .insecure = 1};
    specd_rpc_server *srv = specd_rpc_server_create(&ro, &err);
    if (!srv) fail_msg("%s", err.msg);
    assert_int_equal(specd_rpc_register(srv, "/specd.v1.Target/GetInfo", SPECD_RPC_UNARY,
                                        fake_info, NULL), 0);
    assert_int_equal(specd_rpc_register(srv, "/specd.v1.Target/Verify", SPECD_RPC_BIDI_STREAMING,
                                        fake_verify, NULL), 0);
    specd_rpc_set_health(srv, "specd.v1.Target", 1);
    assert_int_equal(specd_rpc_server_start(srv, &err), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", specd_rpc_server_port(srv));
    const char *targets[] = {addr};
    draft_side d;
    draft_up(&d, targets, 1, BUSY_STEP_TIMEOUT_MS);
    assert_true(svc_wait_health(d.ch, "specd.v1.Draft", 1, 5000) >= 0);
    req q;
    req_ids(&q, 8, 6);
    q.r.drafter = "none";
    svc_gen *g = calloc(1, sizeof *g);
    double t0 = svc_now_ms();
    svc_generate(d.ch, DRAFT_M, &q.r, g);
    double ms = svc_now_ms() - t0;
    printf("  a %d ms step with step_timeout %d ms: %s after %.0f ms, failovers %d\n",
           SLOW_STEP_MS, BUSY_STEP_TIMEOUT_MS, specd_rpc_status_name(g->code), ms, g->failovers);
    if (g->code != GRPC_STATUS_OK) fail_msg("busy target given up: %s", g->detail);
    assert_int_equal(g->n_ids, 6);
    assert_int_equal(g->failovers, 0);
    assert_true(ms >= SLOW_STEP_MS);
    free(g);
    draft_down(&d);
    specd_rpc_server_destroy(srv);
}

/* ---- 3. seeds at any load ---------------------------------------------------------- */

/* Both methods keep a seed at any load. Seed-exact (the default) promises
 * more: every drafter's output, alone or beside six streams, equals plain
 * sampling with that seed (drafter "none", first in the list). Rejection
 * keeps it by fixing the tree shape per request. */
static void test_seed_under_load(void **state) {
    (void)state;
    const char *drafters[] = {"none", "ngram", "draft_lm", "mlp", "mlp_ngram"};
    const char *methods[] = {"seed-exact", "rejection"};
    svc_gen *alone = calloc(1, sizeof *alone), *loaded = calloc(1, sizeof *loaded);
    svc_gen *plain = calloc(1, sizeof *plain);
    svc_gen *bg = calloc(6, sizeof *bg);
    req bgq[6];
    for (int m = 0; m < 2; m++)
    for (int d = 0; d < (int)(sizeof drafters / sizeof drafters[0]); d++) {
        req q;
        req_ids(&q, 24, 48);
        q.r.ignore_eos = 1;
        q.sp.temperature = 0.8f;
        q.sp.seed = 1234567;
        q.sp.method = m ? SPECD__V1__SAMPLING_METHOD__SAMPLING_METHOD_REJECTION
                        : SPECD__V1__SAMPLING_METHOD__SAMPLING_METHOD_SEED_EXACT;
        q.r.sampling = &q.sp;
        q.r.drafter = (char *)drafters[d];
        svc_generate(D.ch, DRAFT_M, &q.r, alone);
        if (alone->code != GRPC_STATUS_OK) fail_msg("%s alone: %s", drafters[d], alone->detail);
        /* Six long streams beside it: the target has 7 sessions. */
        for (int i = 0; i < 6; i++) {
            req_ids(&bgq[i], 10 + i, MAX_NEW - 40);
            bgq[i].r.ignore_eos = 1;
            bgq[i].buf[0] = 100 + i; /* different prompts */
            svc_generate_bg(D.ch, DRAFT_M, &bgq[i].r, &bg[i]);
        }
        for (int i = 0; i < 6; i++)
            for (int w = 0; w < 1000 && atomic_load(&bg[i].progress) < 2 &&
                            !atomic_load(&bg[i].done); w++)
                svc_sleep_ms(5);
        svc_generate(D.ch, DRAFT_M, &q.r, loaded);
        int still = 0;
        for (int i = 0; i < 6; i++) still += !atomic_load(&bg[i].done);
        for (int i = 0; i < 6; i++) {
            svc_gen_join(&bg[i]);
            if (bg[i].code != GRPC_STATUS_OK) fail_msg("background %d: %s", i, bg[i].detail);
        }
        printf("  %-10s %-8s seeded T=0.8: %d tokens in %d steps alone, %d steps beside 6 "
               "streams (%d still running at its end)\n",
               methods[m], drafters[d], alone->n_ids, alone->target_steps, loaded->target_steps,
               still);
        if (loaded->code != GRPC_STATUS_OK) fail_msg("%s loaded: %s", drafters[d], loaded->detail);
        assert_int_equal(loaded->n_ids, alone->n_ids);
        for (int i = 0; i < alone->n_ids; i++)
            if (loaded->ids[i] != alone->ids[i])
                fail_msg("%s %s: token %d is %d beside other streams, %d alone", methods[m],
                         drafters[d], i, loaded->ids[i], alone->ids[i]);
        if (d == 0) {
            *plain = *alone;
        } else if (m == 0) {
            assert_int_equal(alone->n_ids, plain->n_ids);
            for (int i = 0; i < plain->n_ids; i++)
                if (alone->ids[i] != plain->ids[i])
                    fail_msg("seed-exact %s: token %d is %d, plain sampling gives %d",
                             drafters[d], i, alone->ids[i], plain->ids[i]);
        }
    }
    free(plain);
    free(alone);
    free(loaded);
    free(bg);
}

/* ---- 4. failover across target-svc processes ------------------------------------- */

#define FO_TOKENS 200

static int failover_teardown(void **state) {
    (void)state;
    svc_kill_all(); /* reaped even after a failed assertion */
    return 0;
}

/* The address of the target holding draft-svc's one open session, or NULL. */
static const char *holder(draft_side *d) {
    specd_tpool_member *ms[8];
    int n = specd_tpool_members(d->pool, ms, 8);
    const char *who = NULL;
    for (int i = 0; i < n; i++) {
        if (specd_tpool_member_sessions(ms[i]) > 0) who = specd_tpool_member_addr(ms[i]);
        specd_tpool_member_put(d->pool, ms[i]);
    }
    return who; /* the pool keeps listed members: the string stays valid */
}

static void expect_ref(const svc_gen *got, const svc_gen *ref, const char *what) {
    if (got->code != GRPC_STATUS_OK) fail_msg("%s: %s", what, got->detail);
    if (got->n_ids != ref->n_ids) fail_msg("%s: %d tokens, want %d", what, got->n_ids, ref->n_ids);
    for (int i = 0; i < ref->n_ids; i++)
        if (got->ids[i] != ref->ids[i])
            fail_msg("%s: token %d is %d, undisturbed %d", what, i, got->ids[i], ref->ids[i]);
}

/* Starts q on draft-svc and waits until it is mid-stream: at least 20
 * tokens in, a session open on some target (whose address it returns).
 * A lone stream's steps do not wait for batching.max_wait (a plain run on
 * the tiny model can finish 200 tokens in a few milliseconds), so a request
 * that ends before it is caught is checked against ref and started again,
 * up to 8 times; NULL if none was caught. before_each (may be NULL) runs
 * before every attempt, e.g. to read counters that the attempt moves. */
static const char *start_mid_stream(draft_side *d, const Specd__V1__GenerateRequest *q,
                                    svc_gen *got, const svc_gen *ref, const char *what,
                                    void (*before_each)(void *), void *arg) {
    for (int attempt = 0; attempt < 8; attempt++) {
        if (before_each) before_each(arg);
        svc_generate_bg(d->ch, DRAFT_M, q, got);
        while (atomic_load(&got->progress) < 20 && !atomic_load(&got->done)) svc_sleep_ms(1);
        const char *h = atomic_load(&got->done) ? NULL : holder(d);
        if (h) return h;
        svc_gen_join(got);
        expect_ref(got, ref, what);
        printf("  %s: the request ended before it was caught mid-stream (%d tokens); again\n",
               what, got->n_ids);
    }
    return NULL;
}

/* Monotonic ms of the last SERVING health answer draft-svc saw from addr (0:
 * none yet, or not listed). */
static int64_t last_alive(draft_side *d, const char *addr) {
    specd_tpool_member *ms[8];
    int n = specd_tpool_members(d->pool, ms, 8);
    int64_t t = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(specd_tpool_member_addr(ms[i]), addr))
            t = specd_tpool_member_last_alive(ms[i]);
        specd_tpool_member_put(d->pool, ms[i]);
    }
    return t;
}

/* Waits (up to 20 s) until draft-svc's health probes have seen addr alive
 * after `since` (its last_alive before the target was started). A fixed
 * 700 ms was too short for a sanitizer-built target-svc to start on a
 * loaded CI machine: A was killed before B was up. */
static void wait_seen_alive(draft_side *d, const char *addr, int64_t since) {
    for (int i = 0; i < 2000 && last_alive(d, addr) <= since; i++) svc_sleep_ms(10);
    if (last_alive(d, addr) <= since) fail_msg("draft-svc never saw %s alive", addr);
}

#define STEP_TIMEOUT_MS 5000

static void test_failover_kill_and_hang(void **state) {
    (void)state;
    /* max_wait batches concurrent streams; a lone stream does not wait for
     * it (start_mid_stream catches a request mid-generation). */
    const char *flags[] = {"--batching.max_wait=15ms", "--threads=1", "--limits.kv_memory=64MiB",
                           NULL};
    char model[PATH_MAX];
    snprintf(model, sizeof model, "%s", test_path(TINY_GGUF));
    int port[2] = {svc_free_port(), svc_free_port()};
    while (port[1] == port[0]) port[1] = svc_free_port();
    char addr[2][32];
    for (int i = 0; i < 2; i++) snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", port[i]);
    pid_t pid[2] = {svc_start_target(port[0], model, flags), 0};
    if (!pid[0]) {
        printf("  target-svc is not built: failover skipped\n");
        skip();
    }
    req q;
    req_ids(&q, 12, FO_TOKENS);
    q.r.ignore_eos = 1;
    q.r.drafter = "ngram";
    svc_gen *ref = calloc(1, sizeof *ref), *got = calloc(1, sizeof *got);
    specd_rpc_channel *cha = svc_channel_to(addr[0]);
    svc_generate(cha, TARGET_M, &q.r, ref);
    specd_rpc_channel_free(cha);
    if (ref->code != GRPC_STATUS_OK) fail_msg("reference: %s", ref->detail);
    const char *targets[] = {addr[0], addr[1]};
    draft_side d;
    draft_up(&d, targets, 2, STEP_TIMEOUT_MS);
    assert_true(svc_wait_health(d.ch, "specd.v1.Draft", 1, 5000) >= 0);

    /* (a) SIGKILL while the Open (prefill) is outstanding: only A is up,
     * frozen, so the session's Open waits on A; B comes up, and once
     * draft-svc's probes see it, A is killed: the Open fails and the
     * session moves to B. */
    kill(pid[0], SIGSTOP);
    svc_generate_bg(d.ch, DRAFT_M, &q.r, got);
    svc_sleep_ms(200);
    assert_int_equal(atomic_load(&got->progress), 0);
    int64_t seen = last_alive(&d, addr[1]);
    pid[1] = svc_start_target(port[1], model, flags);
    wait_seen_alive(&d, addr[1], seen); /* B is seen alive */
    assert_int_equal(atomic_load(&got->progress), 0); /* still waiting for A's prefill */
    svc_kill(pid[0]);
    svc_gen_join(got);
    printf("  SIGKILL during the prefill: failovers %d\n", got->failovers);
    expect_ref(got, ref, "SIGKILL during prefill");
    assert_int_equal(got->failovers, 1);

    /* (b) SIGKILL during decode: A back; the target holding the session
     * dies mid-stream. */
    seen = last_alive(&d, addr[0]);
    pid[0] = svc_start_target(port[0], model, flags);
    wait_seen_alive(&d, addr[0], seen);
    const char *h = start_mid_stream(&d, &q.r, got, ref, "decode kill", NULL, NULL);
    if (!h) fail_msg("decode kill: no request was caught mid-stream");
    int k = !strcmp(h, addr[1]);
    svc_kill(pid[k]);
    svc_gen_join(got);
    printf("  SIGKILL during decode (target %c): failovers %d\n", "AB"[k], got->failovers);
    expect_ref(got, ref, "SIGKILL during decode");
    assert_int_equal(got->failovers, 1);

    /* (c) A hung target (SIGSTOP: it answers neither steps nor health
     * checks) is given up within step_timeout. */
    seen = last_alive(&d, addr[k]);
    pid[k] = svc_start_target(port[k], model, flags);
    wait_seen_alive(&d, addr[k], seen);
    if (!(h = start_mid_stream(&d, &q.r, got, ref, "hang", NULL, NULL)))
        fail_msg("hang: no request was caught mid-stream");
    k = !strcmp(h, addr[1]);
    kill(pid[k], SIGSTOP);
    double t0 = svc_now_ms();
    /* answers already on the wire still arrive: count from after them */
    svc_sleep_ms(200);
    int at = atomic_load(&got->progress);
    while (atomic_load(&got->progress) == at && !atomic_load(&got->done) &&
           svc_now_ms() - t0 < 4 * STEP_TIMEOUT_MS)
        svc_sleep_ms(10);
    double stall = svc_now_ms() - t0;
    svc_gen_join(got);
    printf("  SIGSTOP (target %c): the stream went on after %.0f ms (step_timeout %d ms), "
           "failovers %d\n", "AB"[k], stall, STEP_TIMEOUT_MS, got->failovers);
    expect_ref(got, ref, "SIGSTOP");
    assert_int_equal(got->failovers, 1);
    /* step_timeout of silence, plus at most a probe and a slice */
    assert_true(stall >= STEP_TIMEOUT_MS - 500 && stall < STEP_TIMEOUT_MS + 1500);
    kill(pid[k], SIGCONT);
    draft_down(&d);
    svc_kill(pid[0]);
    svc_kill(pid[1]);
    free(ref);
    free(got);
}

/* ---- 5. the prefix cache across processes ------------------------------------ */

#define PC_SHARED 70 /* 4 full pages of 16 tokens, then 6 rows of a fifth */
#define PC_PROMPTS 4
#define PC_PAGE 16

/* A target's KV pool as GetInfo's kv_pool reports it: the prefix-cache
 * counters, the element type, bytes a token and pages. */
typedef struct kv_info {
    int on;
    uint64_t lookup, hit;
    char dtype[8];
    uint64_t bytes_per_token;
    int pages_total;
} kv_info;

static kv_info get_kv_info(const char *addr) {
    specd_rpc_channel *ch = svc_channel_to(addr);
    Specd__V1__InfoRequest q = SPECD__V1__INFO_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    specd_error err = {{0}};
    grpc_status_code code = specd_rpc_unary(ch, "/specd.v1.Target/GetInfo", &q.base,
                                            &specd__v1__info__descriptor, &resp, 10000, &err);
    specd_rpc_channel_free(ch);
    if (code != GRPC_STATUS_OK) fail_msg("GetInfo on %s: %s", addr, err.msg);
    const Specd__V1__Info *info = (const Specd__V1__Info *)resp;
    const Specd__V1__KvPoolInfo *kv = info->kv_pool;
    if (!kv) fail_msg("GetInfo on %s: no kv_pool", addr);
    kv_info k = {kv->prefix_cache, kv->prefix_lookup_pages, kv->prefix_hit_pages, "",
                 kv->bytes_per_token, kv->pages_total};
    snprintf(k.dtype, sizeof k.dtype, "%s", kv->dtype ? kv->dtype : "");
    protobuf_c_message_free_unpacked(resp, NULL);
    return k;
}

/* Both targets' kv_info, read again on every call (start_mid_stream). */
typedef struct kv_snapshot {
    const char *addr[2];
    kv_info info[2];
} kv_snapshot;

static void kv_snapshot_take(void *arg) {
    kv_snapshot *k = arg;
    for (int i = 0; i < 2; i++) k->info[i] = get_kv_info(k->addr[i]);
}

/* kv_cache_dtype through the whole service: a target started with
 * --kv_cache_dtype=f16 reports it in GetInfo, stores half the bytes a token
 * and so holds twice the pages in the same limits.kv_memory (2 MiB: below
 * the sessions x context cap on pages), and serves. */
static void test_kv_cache_dtype_info(void **state) {
    (void)state;
    char model[PATH_MAX];
    snprintf(model, sizeof model, "%s", test_path(TINY_GGUF));
    const char *f32[] = {"--threads=1", "--limits.kv_memory=2MiB", NULL};
    const char *f16[] = {"--threads=1", "--limits.kv_memory=2MiB", "--kv_cache_dtype=f16", NULL};
    int port[2] = {svc_free_port(), 0};
    do port[1] = svc_free_port(); while (port[1] == port[0]);
    if (!svc_start_target(port[0], model, f32)) {
        printf("  target-svc is not built: kv_cache_dtype test skipped\n");
        skip();
    }
    if (!svc_start_target(port[1], model, f16)) fail_msg("target-svc with f16 KV did not start");
    kv_info kv[2];
    for (int i = 0; i < 2; i++) {
        char addr[32];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", port[i]);
        kv[i] = get_kv_info(addr);
        assert_string_equal(kv[i].dtype, i ? "f16" : "f32");
    }
    /* and the f16 one serves */
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port[1]);
    specd_rpc_channel *ch = svc_channel_to(addr);
    req r;
    req_ids(&r, 12, 8);
    r.r.ignore_eos = 1;
    svc_gen *g = calloc(1, sizeof *g);
    svc_generate(ch, TARGET_M, &r.r, g);
    if (g->code != GRPC_STATUS_OK || g->n_ids != 8)
        fail_msg("Generate on the f16 target: code %d, %d tokens: %s", g->code, g->n_ids,
                 g->detail);
    free(g);
    specd_rpc_channel_free(ch);
    printf("  f32: %llu bytes a token, %d pages; f16: %llu bytes a token, %d pages\n",
           (unsigned long long)kv[0].bytes_per_token, kv[0].pages_total,
           (unsigned long long)kv[1].bytes_per_token, kv[1].pages_total);
    assert_true(kv[0].bytes_per_token > 0);
    assert_true(kv[0].bytes_per_token == 2 * kv[1].bytes_per_token);
    assert_true(kv[1].pages_total >= 2 * kv[0].pages_total - 1);
}

/* Prompt i: the shared PC_SHARED tokens, then 5 + 3i tokens of its own (so
 * no prompt ends on a page boundary). */
static void req_shared(req *q, int i, int max_new) {
    int n = PC_SHARED + 5 + 3 * i;
    req_ids(q, n, max_new);
    for (int j = PC_SHARED; j < n; j++) q->buf[j] = 7 + (j * 13 + i * 29) % 190;
    q->r.ignore_eos = 1;
}

static void test_prefix_cache_failover(void **state) {
    (void)state;
    /* 15 ms steps, so the kill lands mid-generation, as in test 4 */
    const char *on[] = {"--batching.max_wait=15ms", "--threads=1", "--limits.kv_memory=64MiB",
                        NULL};
    const char *off[] = {"--batching.max_wait=15ms", "--threads=1", "--limits.kv_memory=64MiB",
                         "--limits.prefix_cache=false", NULL};
    char model[PATH_MAX];
    snprintf(model, sizeof model, "%s", test_path(TINY_GGUF));
    int port[3];
    for (int i = 0; i < 3; i++) {
        int dup;
        do { /* three different ports */
            port[i] = svc_free_port();
            dup = 0;
            for (int j = 0; j < i; j++) dup |= port[j] == port[i];
        } while (dup);
    }
    char addr[3][32];
    for (int i = 0; i < 3; i++) snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", port[i]);
    /* A and B with the cache (the default), C without */
    pid_t pid[3] = {svc_start_target(port[0], model, on), 0, 0};
    if (!pid[0]) {
        printf("  target-svc is not built: prefix cache test skipped\n");
        skip();
    }
    pid[1] = svc_start_target(port[1], model, on);
    pid[2] = svc_start_target(port[2], model, off);
    specd_rpc_channel *cha = svc_channel_to(addr[0]), *chc = svc_channel_to(addr[2]);
    svc_gen *ref = calloc(PC_PROMPTS, sizeof *ref), *got = calloc(1, sizeof *got);

    /* (a) cache on vs off: the same tokens; A reuses the 4 shared full pages
     * for prompts 1..3 (prompt 0 published them; none of the prompts' fifth
     * pages is full, so nothing else can hit) */
    kv_info a0 = get_kv_info(addr[0]);
    for (int i = 0; i < PC_PROMPTS; i++) {
        req q;
        req_shared(&q, i, 40);
        svc_generate(chc, TARGET_M, &q.r, &ref[i]);
        if (ref[i].code != GRPC_STATUS_OK) fail_msg("cache off, prompt %d: %s", i, ref[i].detail);
        svc_generate(cha, TARGET_M, &q.r, got);
        expect_ref(got, &ref[i], "cache on vs off");
    }
    kv_info a1 = get_kv_info(addr[0]), c1 = get_kv_info(addr[2]);
    printf("  cache on: %llu of %llu pages looked up were hits; cache off: %llu hits, "
           "reported %s\n", (unsigned long long)(a1.hit - a0.hit),
           (unsigned long long)(a1.lookup - a0.lookup), (unsigned long long)c1.hit,
           c1.on ? "on" : "off");
    assert_true(a1.on);
    assert_int_equal(a1.hit - a0.hit, (PC_PROMPTS - 1) * (PC_SHARED / PC_PAGE));
    assert_false(c1.on);
    assert_int_equal(c1.hit, 0);

    /* (b) failover re-prefill hits the survivor's cache. Prompt 0 again,
     * longer: B computes it once (so both A and B hold its pages, whichever
     * draft-svc opens the session on), the reference is C's (no cache). */
    req q;
    req_shared(&q, 0, 150);
    svc_gen *fo_ref = calloc(1, sizeof *fo_ref);
    svc_generate(chc, TARGET_M, &q.r, fo_ref);
    if (fo_ref->code != GRPC_STATUS_OK) fail_msg("cache off reference: %s", fo_ref->detail);
    specd_rpc_channel *chb = svc_channel_to(addr[1]);
    svc_generate(chb, TARGET_M, &q.r, got);
    specd_rpc_channel_free(chb);
    expect_ref(got, fo_ref, "priming B");
    const char *targets[] = {addr[0], addr[1]};
    draft_side d;
    draft_up(&d, targets, 2, STEP_TIMEOUT_MS);
    assert_true(svc_wait_health(d.ch, "specd.v1.Draft", 1, 5000) >= 0);
    for (int i = 0; i < 2; i++) wait_seen_alive(&d, addr[i], 0); /* both targets are known */
    /* read before each attempt: an attempt that ended uncaught moved them */
    kv_snapshot snap = {.addr = {addr[0], addr[1]}};
    q.r.drafter = "ngram";
    const char *h =
        start_mid_stream(&d, &q.r, got, fo_ref, "prefix failover", kv_snapshot_take, &snap);
    const kv_info *before = snap.info;
    if (!h) fail_msg("prefix failover: no request was caught mid-stream");
    int k = !strcmp(h, addr[1]), s = 1 - k;
    svc_kill(pid[k]);
    pid[k] = 0;
    svc_gen_join(got);
    kv_info after = get_kv_info(addr[s]);
    printf("  SIGKILL during decode (target %c): failovers %d; the survivor %c counted %llu "
           "prefix hit pages for the re-prefill (%llu looked up)\n", "AB"[k], got->failovers,
           "AB"[s], (unsigned long long)(after.hit - before[s].hit),
           (unsigned long long)(after.lookup - before[s].lookup));
    expect_ref(got, fo_ref, "failover with the prefix cached");
    assert_int_equal(got->failovers, 1);
    /* the prompt's 4 full pages; the fifth holds generated tokens that no
     * prefill on the survivor ever published */
    assert_int_equal(after.hit - before[s].hit, PC_SHARED / PC_PAGE);
    assert_true(after.lookup - before[s].lookup > PC_SHARED / PC_PAGE);
    draft_down(&d);
    specd_rpc_channel_free(cha);
    specd_rpc_channel_free(chc);
    for (int i = 0; i < 3; i++) svc_kill(pid[i]);
    free(ref);
    free(fo_ref);
    free(got);
}

/* ---- 6. a long prompt beside a running stream ------------------------------------- */

#define SMOL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define SMOL_VOCAB 49152
#define LONG_PROMPT 2000
#define STALL_LIMIT_MS 2000.0

/* A real target-svc process with the default model and its DEFAULT
 * configuration (chunked prefill of 256 prompt tokens per pass), a stream
 * decoding through draft-svc, and a 2,000-token prompt arriving beside it.
 * The running stream may stall for at most one chunk's pass at a time: its
 * longest gap between tokens must stay under 2 s on this machine, and under
 * a third of the time the long prompt took (it spans 8 chunks; without
 * chunking the stream would wait the whole prefill), with no failover for
 * either request (a busy target is not a dead one). */
static void test_long_prompt_beside_stream(void **state) {
    (void)state;
#ifdef SPECD_SANITIZE_BUILD
    /* A timing test on the real model: under ASan/UBSan the target alone
     * takes longer than 20 s to start, and gaps mean nothing. The plain
     * build's run of this suite checks it. */
    printf("  a timing test: skipped in the sanitizer build\n");
    skip();
#endif
    if (access(test_path(SMOL), R_OK)) {
        printf("  %s is missing: skipped\n", SMOL);
        skip();
    }
    int port = svc_free_port();
    if (!svc_start_target(port, test_path(SMOL), NULL)) {
        printf("  target-svc is not built: skipped\n");
        skip();
    }
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *targets[] = {addr};
    draft_side d;
    draft_up_vocab(&d, targets, 1, 20000, SMOL_VOCAB);
    assert_true(svc_wait_health(d.ch, "specd.v1.Draft", 1, 60000) >= 0);

    req a;
    req_ids(&a, 16, MAX_NEW);
    for (int i = 0; i < 16; i++) a.buf[i] = 1000 + i * 97;
    a.r.ignore_eos = 1;
    svc_gen *ga = calloc(1, sizeof *ga), *gb = calloc(1, sizeof *gb);
    svc_generate_bg(d.ch, DRAFT_M, &a.r, ga);
    for (int w = 0; w < 2000 && atomic_load(&ga->progress) < 4 && !atomic_load(&ga->done); w++)
        svc_sleep_ms(5);

    req b;
    req_ids(&b, 16, 4);
    int32_t *long_ids = malloc(sizeof(int32_t) * LONG_PROMPT);
    for (int i = 0; i < LONG_PROMPT; i++) long_ids[i] = 300 + (i * 7919) % 30000;
    b.ids.n_ids = LONG_PROMPT;
    b.ids.ids = long_ids;
    double t0 = svc_now_ms();
    svc_generate(d.ch, DRAFT_M, &b.r, gb);
    double long_ms = svc_now_ms() - t0;
    int running = !atomic_load(&ga->done);
    svc_gen_join(ga);
    printf("  a %d-token prompt took %.0f ms beside a running stream (still running at its "
           "end: %s); the stream's longest gap %.0f ms, failovers %d / %d\n",
           LONG_PROMPT, long_ms, running ? "yes" : "no", ga->max_gap_ms, ga->failovers,
           gb->failovers);
    if (gb->code != GRPC_STATUS_OK) fail_msg("long prompt: %s", gb->detail);
    if (ga->code != GRPC_STATUS_OK) fail_msg("running stream: %s", ga->detail);
    assert_true(running); /* else the prefill had nothing to stall */
    assert_int_equal(ga->n_ids, MAX_NEW);
    assert_int_equal(ga->failovers, 0);
    assert_int_equal(gb->failovers, 0);
    assert_true(ga->max_gap_ms < STALL_LIMIT_MS);
    assert_true(ga->max_gap_ms < long_ms / 3);
    free(long_ids);
    free(ga);
    free(gb);
    draft_down(&d);
    svc_kill_all();
}

int main(void) {
    atexit(svc_kill_all);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals_side_by_side),
        cmocka_unit_test(test_health_no_targets),
        cmocka_unit_test(test_busy_is_not_dead),
        cmocka_unit_test(test_seed_under_load),
        cmocka_unit_test_setup_teardown(test_failover_kill_and_hang, NULL, failover_teardown),
        cmocka_unit_test_setup_teardown(test_prefix_cache_failover, NULL, failover_teardown),
        cmocka_unit_test_setup_teardown(test_kv_cache_dtype_info, NULL, failover_teardown),
        cmocka_unit_test_setup_teardown(test_long_prompt_beside_stream, NULL, failover_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
