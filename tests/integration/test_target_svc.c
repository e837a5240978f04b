/* test_target_svc.c - target-svc end to end over loopback gRPC.
 *
 * The Target service runs in-process on 127.0.0.1:0 (plaintext) with the
 * tiny golden model; the project's client layer (common/rpc/rpc_client.h)
 * drives it:
 *   1. greedy Verify sessions fed all-correct, all-wrong and mixed trees give
 *      exactly the tokens of plain greedy decoding (run on a separate
 *      transformer, no service involved);
 *   2. concurrent sessions (threads) with different prompts and trees give
 *      the same tokens as each alone;
 *   3. every kind of bad input ends its own call with the right status and a
 *      message naming the field, while a healthy session goes on;
 *   4. too many sessions is RESOURCE_EXHAUSTED, and a client cancel frees the
 *      slot for the next session (max_sessions = 1);
 *   5. Generate streams the plain greedy tokens;
 *   6. GetInfo describes the model.
 * Every call has a deadline and every wait is bounded, so it cannot hang.
 * Client helpers report errors by return value (no cmocka asserts) because
 * they also run on worker threads. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <grpc/grpc.h>

#include "common/rpc/ipc_caps.h"
#include "common/rpc/metrics.h"
#include "common/rpc/rpc_client.h"
#include "common/rpc/rpc_server.h"
#include "common/spec/sampling.h"
#include "common/text/tokenizer.h"
#include "specd.pb-c.h"
#include "target-svc/service.h"
#include "common/model/transformer.h"
#include "kernels/cpu/matmul.h"
#include "tests/harness/golden.h"
#include "tests/harness/test_util.h"

#define MODEL "tests/golden/data/tiny-gqa/hf"
#define CALL_DEADLINE_MS 20000
#define WAIT_MS 20000
#define CTX 128
#define MAX_TREE 16
#define N_GEN 24

/* ---- a served model ---------------------------------------------------------- */

typedef struct served {
    specd_model_file *m;
    specd_tokenizer *tok;
    specd_transformer *t;
    specd_target_service *svc;
    specd_rpc_server *srv;
    specd_rpc_channel *ch;
} served;

static void serve_kv(served *s, int max_sessions, specd_kv_dtype kv) {
    specd_error err = {{0}};
    memset(s, 0, sizeof *s);
    s->m = specd_model_open(test_path(MODEL), &err);
    if (!s->m) fail_msg("%s", err.msg);
    s->tok = specd_tokenizer_from_model(s->m, &err); /* the tiny model has none: NULL */
    specd_transformer_opts to = {.backend = {.name = "cpu", .n_threads = 1, .kv_dtype = kv},
                                 .n_slots = max_sessions, .max_ctx = CTX, .max_batch = 64};
    s->t = specd_transformer_create(s->m, &to, &err);
    if (!s->t) fail_msg("%s", err.msg);
    specd_target_opts o = {.max_sessions = max_sessions, .max_prompt_tokens = 32,
                           .max_tree_tokens = MAX_TREE, .max_batch_tokens = 64,
                           .max_wait_ms = 1};
    s->svc = specd_target_service_create(s->m, s->t, s->tok, &o, &err);
    if (!s->svc) fail_msg("%s", err.msg);
    specd_rpc_server_opts ro = {.listen_addr = "127.0.0.1:0", .insecure = 1};
    s->srv = specd_rpc_server_create(&ro, &err);
    if (!s->srv) fail_msg("%s", err.msg);
    assert_int_equal(specd_target_service_register(s->svc, s->srv, &err), 0);
    assert_int_equal(specd_rpc_server_start(s->srv, &err), 0);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", specd_rpc_server_port(s->srv));
    specd_rpc_channel_opts co = {.target = target, .insecure = 1};
    s->ch = specd_rpc_channel_create(&co, &err);
    if (!s->ch) fail_msg("%s", err.msg);
}

static void serve(served *s, int max_sessions) { serve_kv(s, max_sessions, SPECD_KV_AUTO); }

static void unserve(served *s) {
    specd_rpc_channel_free(s->ch);
    specd_rpc_server_destroy(s->srv);
    specd_target_service_free(s->svc);
    specd_transformer_free(s->t);
    specd_tokenizer_free(s->tok);
    specd_model_close(s->m);
}

/* ---- client helpers --------------------------------------------------------------- */

/* Over the project's client layer (common/rpc/rpc_client.h); nothing here needs
 * raw C-core control. They report by return value, never by cmocka assert,
 * because verify_session runs on worker threads. */

typedef struct ccall {
    specd_rpc_stream *st;
    char detail[512]; /* the final status's message, after cc_end */
} ccall;

static int cc_start(ccall *cc, specd_rpc_channel *ch, const char *method) {
    memset(cc, 0, sizeof *cc);
    specd_error err = {{0}};
    cc->st = specd_rpc_stream_start(ch, method, CALL_DEADLINE_MS, &err);
    if (!cc->st) snprintf(cc->detail, sizeof cc->detail, "%s", err.msg);
    return cc->st ? 0 : -1;
}

static int cc_send_msg(ccall *cc, const ProtobufCMessage *msg, int close) {
    return specd_rpc_stream_send(cc->st, msg, close, NULL) == SPECD_RPC_CIO_OK ? 0 : -1;
}

/* The next message decoded as desc, or NULL at the end of the stream, on
 * failure, or if nothing came within WAIT_MS. */
static ProtobufCMessage *cc_recv(ccall *cc, const ProtobufCMessageDescriptor *desc) {
    ProtobufCMessage *m;
    return specd_rpc_stream_recv(cc->st, desc, &m, WAIT_MS, NULL) == SPECD_RPC_CIO_OK ? m : NULL;
}

/* Reads and drops messages up to the end of the stream. */
static void cc_drain(ccall *cc) {
    uint8_t *buf;
    size_t n;
    while (specd_rpc_stream_recv_bytes(cc->st, &buf, &n, WAIT_MS, NULL) == SPECD_RPC_CIO_OK)
        free(buf);
}

/* Waits for the end of the stream and its status (message in cc->detail),
 * and frees the call. The caller has read every message it expected, so the
 * stream must end now: a further message is reported in cc->detail (and the
 * call cancelled), as is a stream that does not end within WAIT_MS. */
static grpc_status_code cc_end(ccall *cc) {
    uint8_t *extra;
    size_t n;
    specd_rpc_cio r = specd_rpc_stream_recv_bytes(cc->st, &extra, &n, WAIT_MS, NULL);
    free(extra);
    specd_error err = {{0}};
    grpc_status_code st = specd_rpc_stream_finish(cc->st, &err);
    if (r == SPECD_RPC_CIO_OK)
        snprintf(cc->detail, sizeof cc->detail, "a message of %zu bytes after the last one", n);
    else if (r == SPECD_RPC_CIO_TIMEOUT)
        snprintf(cc->detail, sizeof cc->detail, "the stream did not end within %d ms", WAIT_MS);
    else
        snprintf(cc->detail, sizeof cc->detail, "%s", err.msg);
    specd_rpc_stream_free(cc->st);
    cc->st = NULL;
    return st;
}

/* ---- Verify client ------------------------------------------------------------- */

static int v_open(ccall *cc, const int32_t *prompt, int n, int max_new) {
    Specd__V1__VerifyRequest r = SPECD__V1__VERIFY_REQUEST__INIT;
    Specd__V1__VerifyOpen o = SPECD__V1__VERIFY_OPEN__INIT;
    o.n_prompt_ids = (size_t)n;
    o.prompt_ids = (int32_t *)prompt;
    o.max_new_tokens = max_new;
    o.ignore_eos = 1; /* plain greedy does not stop at EOS either */
    o.return_hidden = 1;
    /* Every session offers co-location from this very node (as draft-svc
     * with a CUDA speculator does): this CPU target must refuse it, and the
     * hidden states keep coming as bytes (checked in verify_session). */
    Specd__V1__CudaIpcOffer off = SPECD__V1__CUDA_IPC_OFFER__INIT;
    char node[SPECD_IPC_NODE_MAX];
    specd_error err = {{0}};
    if (!specd_ipc_node_id(node, &err)) {
        off.node_id = node;
        o.cuda_ipc = &off;
    }
    r.msg_case = SPECD__V1__VERIFY_REQUEST__MSG_OPEN;
    r.open = &o;
    return cc_send_msg(cc, &r.base, 0);
}

/* Tree `step` with `run` plain steps after it (VerifyTree.plain_steps). */
static int v_tree_run(ccall *cc, uint32_t step, const int32_t *tokens, const int32_t *parents,
                      int n, uint32_t run) {
    Specd__V1__VerifyRequest r = SPECD__V1__VERIFY_REQUEST__INIT;
    Specd__V1__VerifyTree t = SPECD__V1__VERIFY_TREE__INIT;
    t.step = step;
    t.plain_steps = run;
    t.n_tokens = t.n_parents = (size_t)n;
    t.tokens = (int32_t *)tokens;
    t.parents = (int32_t *)parents;
    r.msg_case = SPECD__V1__VERIFY_REQUEST__MSG_TREE;
    r.tree = &t;
    return cc_send_msg(cc, &r.base, 0);
}

static int v_tree(ccall *cc, uint32_t step, const int32_t *tokens, const int32_t *parents,
                  int n) {
    return v_tree_run(cc, step, tokens, parents, n, 0);
}

static Specd__V1__VerifyResponse *v_recv(ccall *cc) {
    return (Specd__V1__VerifyResponse *)cc_recv(cc, &specd__v1__verify_response__descriptor);
}

static uint64_t rnd(uint64_t *st) {
    *st ^= *st << 13;
    *st ^= *st >> 7;
    *st ^= *st << 17;
    return *st;
}

/* A tree after out[0..n_out) knowing the reference ref[]:
 * 0 all-correct chain, 1 all-wrong, 2 correct path among wrong siblings,
 * 3 a mix of the three. */
static int make_tree(int kind, int n_out, const int32_t *ref, int n_ref, int vocab,
                     uint64_t *st, int32_t *tokens, int32_t *parents) {
    if (kind == 3) kind = (int)(rnd(st) % 3);
    int n = 0, parent = -1;
    if (kind == 1) {
        int32_t want = n_out < n_ref ? ref[n_out] : -1;
        for (int i = 0; i < 4; i++) {
            int32_t tok = (int32_t)(rnd(st) % (uint64_t)vocab);
            if (tok == want) tok = (tok + 1) % vocab;
            tokens[n] = tok;
            parents[n++] = i == 0 ? -1 : (int32_t)(rnd(st) % 2 ? -1 : i - 1);
        }
        return n;
    }
    int len = 1 + (int)(rnd(st) % 5);
    for (int d = 0; d < len && n_out + d < n_ref && n + 2 < MAX_TREE; d++) {
        if (kind == 2) {
            tokens[n] = (ref[n_out + d] + 1 + (int32_t)(rnd(st) % 50)) % vocab;
            parents[n++] = parent;
        }
        tokens[n] = ref[n_out + d];
        parents[n] = parent;
        parent = n++;
    }
    if (n == 0) {
        tokens[0] = 1;
        parents[n++] = -1;
    }
    return n;
}

/* One greedy Verify session to the end; the tokens go to out[]. 0 or -1 with
 * why in msg. */
static int verify_session(specd_rpc_channel *ch, const int32_t *prompt, int n_prompt, int n_gen,
                          const int32_t *ref, int n_ref, int kind, int vocab, int32_t *out,
                          char *msg, size_t msg_cap) {
    ccall cc;
    if (cc_start(&cc, ch, "/specd.v1.Target/Verify")) {
        snprintf(msg, msg_cap, "cannot start the call: %.200s", cc.detail);
        return -1;
    }
    if (v_open(&cc, prompt, n_prompt, n_gen)) {
        grpc_status_code code = cc_end(&cc);
        snprintf(msg, msg_cap, "cannot send Open: %d %.200s", code, cc.detail);
        return -1;
    }
    int n_out = 0, rc = -1, finished = 0;
    uint64_t st = 0x9e3779b97f4a7c15ULL + (uint64_t)kind * 7 + (uint64_t)n_prompt;
    Specd__V1__VerifyResponse *r = v_recv(&cc);
    for (uint32_t step = 1; r; step++) {
        /* The hidden state may be left out only on the final response; a
         * CPU target never grants CUDA IPC (the bytes path, v_open). */
        if (r->step != step - 1 || (r->hidden_fp16.len != 64 * 2 && !r->finish_reason) ||
            r->cuda_ipc || r->hidden_in_ipc ||
            n_out + (int)r->n_accepted + 1 > n_gen) {
            snprintf(msg, msg_cap, "bad response at step %u", r->step);
            break;
        }
        for (size_t i = 0; i < r->n_accepted; i++) out[n_out++] = r->accepted[i];
        out[n_out++] = r->next_token;
        finished = r->finish_reason != SPECD__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED;
        if (finished) {
            if (r->finish_reason != SPECD__V1__FINISH_REASON__FINISH_REASON_LENGTH ||
                n_out != n_gen)
                snprintf(msg, msg_cap, "finished with reason %d after %d tokens",
                         r->finish_reason, n_out);
            else
                rc = 0;
            break;
        }
        specd__v1__verify_response__free_unpacked(r, NULL);
        r = NULL;
        int32_t tokens[MAX_TREE], parents[MAX_TREE];
        int n = make_tree(kind, n_out, ref, n_ref, vocab, &st, tokens, parents);
        if (v_tree(&cc, step, tokens, parents, n)) break;
        r = v_recv(&cc);
    }
    if (r) specd__v1__verify_response__free_unpacked(r, NULL);
    grpc_status_code code = cc_end(&cc);
    if (rc == 0 && code != GRPC_STATUS_OK) {
        snprintf(msg, msg_cap, "status %d: %.200s", code, cc.detail);
        rc = -1;
    }
    if (rc && !msg[0]) snprintf(msg, msg_cap, "stream ended early: %d %.200s", code, cc.detail);
    return rc;
}

static void prompt_for(int i, int32_t *p, int *n) {
    *n = 3 + (i * 5) % 11;
    for (int k = 0; k < *n; k++) p[k] = (int32_t)((7 + i * 31 + k * 13) % 200 + 3);
}

/* ---- tests ------------------------------------------------------------------ */

static served S;        /* max_sessions = 4 */
static int VOCAB;

static int setup(void **state) {
    (void)state;
    grpc_init(); /* the client side's own reference */
    serve(&S, 4);
    VOCAB = S.m->hp.vocab_size;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unserve(&S);
    grpc_shutdown();
    return 0;
}

/* Every tree kind through ch gives exactly ref, the plain greedy tokens. */
static void expect_lossless(specd_rpc_channel *ch, const int32_t *prompt, int n,
                            const int32_t *ref, const char *what) {
    int32_t out[N_GEN];
    for (int kind = 0; kind <= 3; kind++) {
        char msg[256] = "";
        memset(out, 0xff, sizeof out);
        if (verify_session(ch, prompt, n, N_GEN, ref, N_GEN + MAX_TREE, kind, VOCAB, out, msg,
                           sizeof msg))
            fail_msg("%s, tree kind %d: %s", what, kind, msg);
        for (int i = 0; i < N_GEN; i++)
            if (out[i] != ref[i])
                fail_msg("%s, tree kind %d: token %d is %d, plain greedy gave %d", what, kind, i,
                         out[i], ref[i]);
    }
}

static void test_greedy_lossless(void **state) {
    (void)state;
    int32_t prompt[32], ref[N_GEN + MAX_TREE];
    int n;
    prompt_for(0, prompt, &n);
    golden_plain_greedy(test_path(MODEL), CTX, prompt, n, N_GEN + MAX_TREE, ref);
    expect_lossless(S.ch, prompt, n, ref, "fp32 KV");
}

/* The same with an fp16 KV cache (kv_cache_dtype f16): verification against
 * plain greedy decoding on an fp16 cache, every tree kind. The fp16 rows
 * change the numbers, not the rule: speculation must still give exactly
 * what the target alone gives. */
static void test_greedy_lossless_kv_f16(void **state) {
    (void)state;
    served f;
    serve_kv(&f, 4, SPECD_KV_F16); /* as S: a closed session is released a moment later */
    int32_t prompt[32], ref[N_GEN + MAX_TREE];
    int n;
    prompt_for(1, prompt, &n);
    golden_plain_greedy_kv(test_path(MODEL), CTX, prompt, n, N_GEN + MAX_TREE, SPECD_KV_F16, ref);
    expect_lossless(f.ch, prompt, n, ref, "fp16 KV");
    unserve(&f);
}

typedef struct job {
    int idx, n_prompt, rc;
    int32_t prompt[32], ref[N_GEN + MAX_TREE], out[N_GEN];
    char msg[256];
} job;

static void *run_job(void *arg) {
    job *j = arg;
    j->rc = verify_session(S.ch, j->prompt, j->n_prompt, N_GEN, j->ref, N_GEN + MAX_TREE,
                           j->idx % 4, VOCAB, j->out, j->msg, sizeof j->msg);
    return NULL;
}

static void test_concurrent_sessions(void **state) {
    (void)state;
    enum { N = 4 };
    job jobs[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].idx = i + 1;
        prompt_for(i + 1, jobs[i].prompt, &jobs[i].n_prompt);
        golden_plain_greedy(test_path(MODEL), CTX, jobs[i].prompt, jobs[i].n_prompt,
                            N_GEN + MAX_TREE, jobs[i].ref);
    }
    for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, run_job, &jobs[i]);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        if (jobs[i].rc) fail_msg("session %d: %s", i, jobs[i].msg);
        for (int k = 0; k < N_GEN; k++)
            if (jobs[i].out[k] != jobs[i].ref[k])
                fail_msg("session %d: token %d is %d, alone it is %d", i, k, jobs[i].out[k],
                         jobs[i].ref[k]);
    }
}

/* Sends an Open (good or not) and optionally a tree; expects the call to end
 * with `want` and a detail containing `field`. */
static void expect_bad(const int32_t *prompt, int n_prompt, int send_open, uint32_t step,
                       const int32_t *tokens, const int32_t *parents, int n_nodes,
                       grpc_status_code want, const char *field) {
    ccall cc;
    assert_int_equal(cc_start(&cc, S.ch, "/specd.v1.Target/Verify"), 0);
    if (send_open) {
        assert_int_equal(v_open(&cc, prompt, n_prompt, 8), 0);
        if (tokens || n_nodes == 0) {
            Specd__V1__VerifyResponse *r = v_recv(&cc);
            if (r) { /* a good Open is answered first */
                specd__v1__verify_response__free_unpacked(r, NULL);
                v_tree(&cc, step, tokens, parents, n_nodes);
            }
        }
    } else {
        v_tree(&cc, step, tokens, parents, n_nodes);
    }
    cc_drain(&cc);
    grpc_status_code st = cc_end(&cc);
    if (st != want || !strstr(cc.detail, field))
        fail_msg("expected status %d naming '%s', got %d: %s", want, field, st, cc.detail);
}

static void test_bad_input(void **state) {
    (void)state;
    int32_t prompt[40], ref[N_GEN + MAX_TREE];
    int n;
    prompt_for(9, prompt, &n);
    golden_plain_greedy(test_path(MODEL), CTX, prompt, n, N_GEN + MAX_TREE, ref);

    /* A healthy session opens first and is continued after the bad calls. */
    ccall good;
    assert_int_equal(cc_start(&good, S.ch, "/specd.v1.Target/Verify"), 0);
    assert_int_equal(v_open(&good, prompt, n, N_GEN), 0);
    Specd__V1__VerifyResponse *r = v_recv(&good);
    assert_non_null(r);
    int32_t out[N_GEN];
    int n_out = 0;
    out[n_out++] = r->next_token;
    specd__v1__verify_response__free_unpacked(r, NULL);

    int32_t bad_prompt[] = {5, VOCAB};
    expect_bad(bad_prompt, 2, 1, 0, NULL, NULL, -1, GRPC_STATUS_INVALID_ARGUMENT,
               "open.prompt_ids[1]");
    int32_t long_prompt[33];
    for (int i = 0; i < 33; i++) long_prompt[i] = 5;
    expect_bad(long_prompt, 33, 1, 0, NULL, NULL, -1, GRPC_STATUS_INVALID_ARGUMENT,
               "open.prompt_ids: the prompt has 33 tokens");
    int32_t tok_oob[] = {3, VOCAB + 7}, par_ok[] = {-1, 0};
    expect_bad(prompt, n, 1, 1, tok_oob, par_ok, 2, GRPC_STATUS_INVALID_ARGUMENT,
               "tree.tokens[1]");
    int32_t toks4[] = {3, 4, 5, 6}, par_bad[] = {-1, 0, 1, 3};
    expect_bad(prompt, n, 1, 1, toks4, par_bad, 4, GRPC_STATUS_INVALID_ARGUMENT,
               "tree.parents[3]");
    /* (An empty tree is valid: a plain decode step, which draft-svc sends
     * when it has nothing to draft; test_draft_svc covers it end to end.) */
    int32_t big[MAX_TREE + 1], big_par[MAX_TREE + 1];
    for (int i = 0; i <= MAX_TREE; i++) {
        big[i] = 3;
        big_par[i] = i - 1;
    }
    expect_bad(prompt, n, 1, 1, big, big_par, MAX_TREE + 1, GRPC_STATUS_INVALID_ARGUMENT,
               "tree.tokens has 17 nodes");
    expect_bad(prompt, n, 0, 1, toks4, par_ok, 2, GRPC_STATUS_FAILED_PRECONDITION, "tree");
    expect_bad(prompt, n, 1, 2, toks4, par_ok, 2, GRPC_STATUS_INVALID_ARGUMENT, "tree.step");

    /* The healthy session goes on, untouched, to plain greedy's tokens. */
    uint64_t st = 42;
    for (uint32_t step = 1;; step++) {
        int32_t tokens[MAX_TREE], parents[MAX_TREE];
        int nn = make_tree(3, n_out, ref, N_GEN + MAX_TREE, VOCAB, &st, tokens, parents);
        assert_int_equal(v_tree(&good, step, tokens, parents, nn), 0);
        r = v_recv(&good);
        assert_non_null(r);
        assert_true(n_out + (int)r->n_accepted + 1 <= N_GEN);
        for (size_t i = 0; i < r->n_accepted; i++) out[n_out++] = r->accepted[i];
        out[n_out++] = r->next_token;
        int fin = r->finish_reason != 0;
        specd__v1__verify_response__free_unpacked(r, NULL);
        if (fin) break;
    }
    assert_int_equal(cc_end(&good), GRPC_STATUS_OK);
    assert_int_equal(n_out, N_GEN);
    for (int i = 0; i < N_GEN; i++) assert_int_equal(out[i], ref[i]);
}

static void test_limit_and_cancel(void **state) {
    (void)state;
    served one;
    serve(&one, 1);
    int32_t prompt[32];
    int n;
    prompt_for(3, prompt, &n);

    ccall a, b;
    assert_int_equal(cc_start(&a, one.ch, "/specd.v1.Target/Verify"), 0);
    assert_int_equal(v_open(&a, prompt, n, 8), 0);
    Specd__V1__VerifyResponse *r = v_recv(&a);
    assert_non_null(r);
    int32_t pending = r->next_token;
    specd__v1__verify_response__free_unpacked(r, NULL);

    /* Too many sessions: the second is refused, the first is unaffected. */
    assert_int_equal(cc_start(&b, one.ch, "/specd.v1.Target/Verify"), 0);
    assert_int_equal(v_open(&b, prompt, n, 8), 0);
    cc_drain(&b);
    assert_int_equal(cc_end(&b), GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(b.detail, "limits.max_sessions"));
    int32_t t1[] = {pending}, p1[] = {-1};
    assert_int_equal(v_tree(&a, 1, t1, p1, 1), 0);
    r = v_recv(&a);
    assert_non_null(r);
    assert_int_equal(r->step, 1);
    specd__v1__verify_response__free_unpacked(r, NULL);

    /* Cancel: the slot comes back, so a new session gets it. The handler
     * notices at once; allow a short bounded time for the round trip. */
    specd_rpc_stream_cancel(a.st);
    assert_int_equal(cc_end(&a), GRPC_STATUS_CANCELLED);
    int opened = 0;
    for (int attempt = 0; attempt < 100 && !opened; attempt++) {
        assert_int_equal(cc_start(&b, one.ch, "/specd.v1.Target/Verify"), 0);
        assert_int_equal(v_open(&b, prompt, n, 8), 0);
        r = v_recv(&b);
        if (r) {
            opened = 1;
            specd__v1__verify_response__free_unpacked(r, NULL);
            Specd__V1__VerifyRequest close = SPECD__V1__VERIFY_REQUEST__INIT;
            Specd__V1__VerifyClose cl = SPECD__V1__VERIFY_CLOSE__INIT;
            close.msg_case = SPECD__V1__VERIFY_REQUEST__MSG_CLOSE;
            close.close = &cl;
            cc_send_msg(&b, &close.base, 1);
            assert_int_equal(cc_end(&b), GRPC_STATUS_OK);
        } else {
            assert_int_equal(cc_end(&b), GRPC_STATUS_RESOURCE_EXHAUSTED);
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    assert_true(opened);
    unserve(&one);
}

/* A plain run (VerifyTree.plain_steps): Open's answer offers runs of up to
 * max_new_tokens; a tree with a run behind it is answered, then every step
 * of the run, numbered on, with plain greedy's tokens and the hidden state
 * only on the run's last step; a run past the last token ends at LENGTH
 * with status OK; a run over the limit is refused naming the field; a
 * client that cancels mid-run gets its slot back. */
static void test_plain_run(void **state) {
    (void)state;
    int32_t prompt[32], ref[N_GEN];
    int n;
    prompt_for(7, prompt, &n);
    golden_plain_greedy(test_path(MODEL), CTX, prompt, n, N_GEN, ref);
    ccall cc;
    assert_int_equal(cc_start(&cc, S.ch, "/specd.v1.Target/Verify"), 0);
    assert_int_equal(v_open(&cc, prompt, n, N_GEN), 0);
    Specd__V1__VerifyResponse *r = v_recv(&cc);
    assert_non_null(r);
    assert_int_equal(r->max_plain_steps, N_GEN);
    int32_t out[N_GEN + 1];
    int n_out = 0;
    out[n_out++] = r->next_token;
    specd__v1__verify_response__free_unpacked(r, NULL);
    /* a correct chain of 2, then 3 plain steps by the target itself */
    int32_t toks[2] = {ref[1], ref[2]}, pars[2] = {-1, 0};
    assert_int_equal(v_tree_run(&cc, 1, toks, pars, 2, 3), 0);
    for (uint32_t step = 1; step <= 4; step++) {
        r = v_recv(&cc);
        assert_non_null(r);
        assert_int_equal(r->step, step);
        assert_int_equal(r->n_accepted, step == 1 ? 2 : 0);
        assert_int_equal(r->hidden_fp16.len, step == 4 ? 64 * 2 : 0);
        assert_int_equal(r->max_plain_steps, 0);
        assert_int_equal(r->finish_reason, 0);
        for (size_t i = 0; i < r->n_accepted; i++) out[n_out++] = r->accepted[i];
        out[n_out++] = r->next_token;
        specd__v1__verify_response__free_unpacked(r, NULL);
    }
    assert_int_equal(n_out, 7);
    /* a plain step with a run longer than the tokens left: it ends at the
     * last token, LENGTH, and the call ends OK */
    assert_int_equal(v_tree_run(&cc, 5, NULL, NULL, 0, N_GEN), 0);
    for (uint32_t step = 5;; step++) {
        r = v_recv(&cc);
        assert_non_null(r);
        assert_int_equal(r->step, step);
        assert_true(n_out < N_GEN);
        out[n_out++] = r->next_token;
        int fin = r->finish_reason;
        specd__v1__verify_response__free_unpacked(r, NULL);
        if (fin) {
            assert_int_equal(fin, SPECD__V1__FINISH_REASON__FINISH_REASON_LENGTH);
            break;
        }
    }
    assert_int_equal(cc_end(&cc), GRPC_STATUS_OK);
    assert_int_equal(n_out, N_GEN);
    for (int i = 0; i < N_GEN; i++) assert_int_equal(out[i], ref[i]);

    /* over the limit: refused, naming the field */
    assert_int_equal(cc_start(&cc, S.ch, "/specd.v1.Target/Verify"), 0);
    assert_int_equal(v_open(&cc, prompt, n, 8), 0);
    r = v_recv(&cc);
    assert_non_null(r);
    specd__v1__verify_response__free_unpacked(r, NULL);
    assert_int_equal(v_tree_run(&cc, 1, NULL, NULL, 0, 9), 0);
    cc_drain(&cc);
    assert_int_equal(cc_end(&cc), GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cc.detail, "tree.plain_steps = 9"));

    /* cancelled mid-run: every slot comes back (the run stops) */
    for (int k = 0; k < 4; k++) {
        assert_int_equal(cc_start(&cc, S.ch, "/specd.v1.Target/Verify"), 0);
        assert_int_equal(v_open(&cc, prompt, n, N_GEN), 0);
        r = v_recv(&cc);
        assert_non_null(r);
        specd__v1__verify_response__free_unpacked(r, NULL);
        assert_int_equal(v_tree_run(&cc, 1, NULL, NULL, 0, N_GEN - 1), 0);
        r = v_recv(&cc);
        assert_non_null(r);
        specd__v1__verify_response__free_unpacked(r, NULL);
        specd_rpc_stream_cancel(cc.st);
        assert_int_equal(cc_end(&cc), GRPC_STATUS_CANCELLED);
    }
    int32_t again[N_GEN];
    char msg[256] = "";
    int ok = 0;
    for (int attempt = 0; attempt < 100 && !ok; attempt++) {
        ok = verify_session(S.ch, prompt, n, N_GEN, ref, N_GEN, 0, VOCAB, again, msg,
                            sizeof msg) == 0;
        if (!ok) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (!ok) fail_msg("a session after the cancelled runs: %s", msg);
}

static void test_generate(void **state) {
    (void)state;
    int32_t prompt[32], ref[N_GEN];
    int n;
    prompt_for(5, prompt, &n);
    golden_plain_greedy(test_path(MODEL), CTX, prompt, n, N_GEN, ref);
    Specd__V1__GenerateRequest g = SPECD__V1__GENERATE_REQUEST__INIT;
    Specd__V1__TokenIds ids = SPECD__V1__TOKEN_IDS__INIT;
    ids.n_ids = (size_t)n;
    ids.ids = prompt;
    g.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS;
    g.token_ids = &ids;
    g.max_new_tokens = N_GEN;
    g.ignore_eos = 1;
    ccall cc;
    assert_int_equal(cc_start(&cc, S.ch, "/specd.v1.Target/Generate"), 0);
    assert_int_equal(cc_send_msg(&cc, &g.base, 1), 0);
    int got = 0, finished = 0;
    Specd__V1__GenerateResponse *r;
    while ((r = (Specd__V1__GenerateResponse *)cc_recv(
                &cc, &specd__v1__generate_response__descriptor))) {
        assert_false(finished); /* nothing after the final message */
        for (size_t i = 0; i < r->n_token_ids; i++) {
            assert_true(got < N_GEN);
            assert_int_equal(r->token_ids[i], ref[got]);
            got++;
        }
        if (r->finish_reason) {
            finished = 1;
            assert_int_equal(r->finish_reason, SPECD__V1__FINISH_REASON__FINISH_REASON_LENGTH);
            assert_non_null(r->stats);
            assert_int_equal(r->stats->generated_tokens, N_GEN);
            assert_int_equal(r->stats->prompt_tokens, n);
        }
        specd__v1__generate_response__free_unpacked(r, NULL);
    }
    assert_int_equal(cc_end(&cc), GRPC_STATUS_OK);
    assert_true(finished);
    assert_int_equal(got, N_GEN);

    /* Text input needs a tokenizer, which the tiny model lacks. */
    Specd__V1__GenerateRequest t = SPECD__V1__GENERATE_REQUEST__INIT;
    t.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_TEXT;
    t.text = "hello";
    t.max_new_tokens = 4;
    assert_int_equal(cc_start(&cc, S.ch, "/specd.v1.Target/Generate"), 0);
    assert_int_equal(cc_send_msg(&cc, &t.base, 1), 0);
    cc_drain(&cc);
    assert_int_equal(cc_end(&cc), S.tok ? GRPC_STATUS_OK : GRPC_STATUS_FAILED_PRECONDITION);
}

static void test_get_info(void **state) {
    (void)state;
    Specd__V1__InfoRequest q = SPECD__V1__INFO_REQUEST__INIT;
    ProtobufCMessage *resp;
    specd_error err = {{0}};
    grpc_status_code code = specd_rpc_unary(S.ch, "/specd.v1.Target/GetInfo", &q.base,
                                            &specd__v1__info__descriptor, &resp, CALL_DEADLINE_MS,
                                            &err);
    if (code != GRPC_STATUS_OK) fail_msg("GetInfo: %s", err.msg);
    Specd__V1__Info *info = (Specd__V1__Info *)resp;
    assert_string_equal(info->service, "specd.v1.Target");
    assert_string_equal(info->version, SPECD_VERSION);
    assert_string_equal(info->model_id, "hf");
    assert_int_equal(info->vocab_size, VOCAB);
    assert_int_equal(info->hidden_size, 64);
    assert_int_equal(info->context_length, CTX);
    assert_int_equal(info->eos_token_id, 2);
    if (!S.tok) { /* no messages without a tokenizer; EOS the one end */
        assert_string_equal(info->chat_format, "");
        assert_int_equal((int)info->n_end_token_ids, 1);
        assert_int_equal(info->end_token_ids[0], 2);
    }
    assert_string_equal(info->backend, "cpu");
    assert_int_equal(info->max_tree_tokens, MAX_TREE);
    assert_int_equal(info->max_sessions, 4);
    assert_int_equal(info->queue_wait_ms, 600000); /* the default limits.queue_wait */
    /* No tokenizer in the tiny model: no fingerprint to compare. */
    assert_int_equal(strlen(info->tokenizer_sha256), S.tok ? 64 : 0);
    specd__v1__info__free_unpacked(info, NULL);
}

/* The scrape names the backend and the kernel path the forward passes run
 * (the active SIMD path on the CPU backend), as the start-up line does. */
static void test_backend_info_metric(void **state) {
    (void)state;
    const char *kernels = specd_target_service_kernels(S.svc);
    assert_string_equal(kernels, cpu_simd_name());
    char want[128];
    snprintf(want, sizeof want, "specd_target_backend_info{backend=\"cpu\",kernels=\"%s\"} 1\n",
             kernels);
    size_t len = 0;
    char *text = specd_metrics_render(specd_metrics_global(), &len);
    assert_non_null(text);
    if (!strstr(text, want)) fail_msg("no '%s' in the scrape", want);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_lossless),
        cmocka_unit_test(test_greedy_lossless_kv_f16),
        cmocka_unit_test(test_concurrent_sessions),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_limit_and_cancel),
        cmocka_unit_test(test_plain_run),
        cmocka_unit_test(test_generate),
        cmocka_unit_test(test_get_info),
        cmocka_unit_test(test_backend_info_metric),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
