/* fuzz_verify_request.c - libFuzzer target for the Verify request path of
 * target-svc without a model: bytes -> size-limited VerifyRequest decode ->
 * the session state machine's checks (session.c), exactly as the service
 * feeds them. The input drives a session through Open and Tree messages: it is
 * split at 0xff 0xfe markers into messages, each one decoded and applied in
 * order, so multi-message sequences (tree before open, step numbers, a second
 * open) are explored too.
 *
 * Invariants: never a crash; every refusal has a message; an accepted Open
 * has valid sampling (bias ids in the vocabulary and distinct), 0 <= resumed
 * < prompt with at most max_prompt_tokens new ones, top_logprobs in 0..20,
 * and penalty counts exactly when something reads them; an accepted Tree is a
 * valid tree for specd_tree_validate, and the logit adjustment along its
 * first path (what the verifier runs) stays in bounds; emitting tokens never
 * returns more tokens than given and keeps the output within
 * max_new_tokens. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc/rpc_server.h"
#include "specd.pb-c.h"
#include "target-svc/service.h" /* specd_session_open: a Verify Open into a session */
#include "target-svc/session.h"

#define MAX_REQUEST (64u << 10) /* far below the server's 4 MiB; enough to explore */

static void apply(specd_session *s, const uint8_t *buf, size_t len) {
    specd_error err = {{0}};
    ProtobufCMessage *msg = NULL;
    if (specd_rpc_unpack(&specd__v1__verify_request__descriptor, buf, len, MAX_REQUEST, &msg,
                         &err)) {
        if (!err.msg[0]) abort();
        return;
    }
    Specd__V1__VerifyRequest *req = (Specd__V1__VerifyRequest *)msg;
    grpc_status_code code = GRPC_STATUS_OK;
    if (req->msg_case == SPECD__V1__VERIFY_REQUEST__MSG_OPEN) {
        code = specd_session_open(s, req->open, "open", &err);
        if (code == GRPC_STATUS_OK) { /* stand in for the prefill */
            if (specd_sampling_validate(&s->sampling, s->lim.vocab, NULL)) abort();
            if (s->resumed < 0 || s->resumed >= s->n_prompt ||
                s->n_prompt - s->resumed > s->lim.max_prompt_tokens)
                abort();
            if (s->top_logprobs < 0 || s->top_logprobs > SPECD_MAX_TOP_LOGPROBS) abort();
            if ((specd_session_counts(s) != NULL) != specd_sampling_adjusts_logits(&s->sampling))
                abort();
            if (specd_session_position(s) != (uint64_t)s->resumed) abort();
            int32_t first = s->prompt[0];
            specd_finish fr;
            if (specd_session_emit(s, &first, 1, s->n_prompt, &fr) != 1) abort();
        }
    } else if (req->msg_case == SPECD__V1__VERIFY_REQUEST__MSG_TREE) {
        /* the service's path: the wire's Tree converted once, then the core */
        specd_session_tree_req tr;
        if (specd_session_tree_from_pb(s, req->tree, &tr, &err)) abort(); /* only on OOM */
        code = specd_session_tree(s, &tr, &err);
        if (code == GRPC_STATUS_OK) {
            /* only rejection sampling carries (and checks) q */
            int sampling = specd_sampling_is(&s->sampling, SPECD_SAMPLING_REJECTION);
            if (specd_tree_validate(&s->tree, s->lim.vocab, s->lim.max_tree_tokens, sampling,
                                    NULL))
                abort();
            /* Stand in for the verifier: accept the chain of first children. */
            int32_t toks[65];
            int n = 0;
            for (int i = 0, want = -1; i < s->tree.n_nodes && n < 64; i++)
                if (s->tree.parents[i] == want) {
                    toks[n++] = s->tree.tokens[i];
                    want = i;
                }
            /* What the verifier does at the last row of that path: adjust a
             * row for history + path (in bounds for any fuzzed bias ids and
             * counts), then the log-probabilities of the raw row. */
            if (specd_session_counts(s) || specd_sampling_adjusts_logits(&s->sampling)) {
                float row[100] = {0};
                int32_t scratch[64];
                specd_logits_adjust(&s->sampling, specd_session_counts(s), toks, n, row,
                                    s->lim.vocab, scratch);
            }
            /* The target's own next token after the path: any token of the
             * vocabulary; the pending one stands in. (Not tree.tokens[0]: an
             * empty tree, a plain decode step, is legal and has no tokens.) */
            int32_t next = s->pending;
            if (next < 0 || next >= s->lim.vocab) abort();
            if (s->logprobs) {
                float row[100] = {0}, lp, top_lps[SPECD_MAX_TOP_LOGPROBS];
                int32_t top_ids[SPECD_MAX_TOP_LOGPROBS];
                specd_logprobs(row, s->lim.vocab, next, s->top_logprobs, &lp, top_ids, top_lps);
            }
            toks[n++] = next;
            int before = s->n_out;
            specd_finish fr;
            int kept = specd_session_emit(s, toks, n, s->n_past + n, &fr);
            s->step = req->tree->step;
            if (kept < 1 || kept > n || s->n_out - before != kept || s->n_out > s->max_new_tokens)
                abort();
        }
    }
    if (code != GRPC_STATUS_OK && !err.msg[0]) abort();
    protobuf_c_message_free_unpacked(msg, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* Small limits so the fuzzer reaches every boundary quickly. */
    specd_session_limits lim = {.vocab = 100, .context = 64, .max_prompt_tokens = 16,
                                .max_tree_tokens = 8, .eos_id = 2};
    specd_session s;
    specd_session_init(&s, &lim);
    size_t start = 0;
    for (size_t i = 0; i + 1 <= size; i++) {
        int marker = i + 1 < size && data[i] == 0xff && data[i + 1] == 0xfe;
        if (marker || i + 1 == size) {
            size_t end = marker ? i : size;
            apply(&s, data + start, end - start);
            start = i + 2;
            i++;
        }
    }
    if (size == 0) apply(&s, data, 0);
    specd_session_free(&s);
    return 0;
}
