/* fuzz_generate_request.c - libFuzzer target for draft-svc's request path
 * without a server: bytes -> size-limited GenerateRequest decode -> every
 * check Draft.Generate runs before it talks to a target (specd_draft_prepare,
 * draft-svc/request_check.h: fields, drafter choice, sampling, stop strings,
 * prompt from ids / text / chat), exactly as the handler calls it.
 *
 * Input: one control byte, then the encoded request. Control bit 0: the
 * service has a tokenizer (SmolLM2's, from tests/golden/tokenizer/, so text,
 * chat and stop strings are explored too); bit 1: it offers the draft LM
 * besides ngram; bit 2: its default is "none" instead of ngram.
 *
 * Invariants: never a crash; a refusal has a status other than OK and a
 * message; an accepted request has a drafter that is offered (or none),
 * 1..max max_new_tokens, a non-empty prompt within the limit and inside
 * the vocabulary, valid UTF-8 in every string, stop ids within the vocabulary, and sampling settings that
 * validate; its text stream takes the prompt's tokens without failing. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc/rpc_server.h"
#include "common/text/tokenizer.h"
#include "common/util/utf8.h"
#include "draft-svc/request_check.h"
#include "specd.pb-c.h"

#define MAX_REQUEST (64u << 10) /* far below the server's 4 MiB; enough to explore */

static specd_tokenizer *tok;

static void init_once(void) {
    if (tok) return;
    const char *root = getenv("SPECD_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/tokenizer/smollm2_tokenizer.json",
             root ? root : ".");
    specd_error err = {{0}};
    tok = specd_tokenizer_from_json(path, &err);
    if (!tok) {
        fprintf(stderr, "fuzz_generate_request: %s\n", err.msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init_once();
    uint8_t ctl = size ? data[0] : 0;
    const uint8_t *buf = size ? data + 1 : data;
    size_t len = size ? size - 1 : 0;
    /* Small limits so the fuzzer reaches every boundary quickly. */
    specd_draft_limits lim = {.adm = {.max_prompt_tokens = 16,
                                      .max_new_tokens = 64, .default_max_new_tokens = 8}};
    lim.tok = ctl & 1 ? tok : NULL;
    lim.vocab = ctl & 1 ? specd_tokenizer_n_vocab(tok) : 100;
    lim.offered[SPECD_DRAFTER_NGRAM] = 1;
    lim.offered[SPECD_DRAFTER_LM] = (ctl & 2) != 0;
    lim.default_drafter = ctl & 4 ? SPECD_N_DRAFTERS : SPECD_DRAFTER_NGRAM;

    specd_error err = {{0}};
    ProtobufCMessage *msg = NULL;
    if (specd_rpc_unpack(&specd__v1__generate_request__descriptor, buf, len, MAX_REQUEST, &msg,
                         &err)) {
        if (!err.msg[0]) abort();
        return 0;
    }
    const Specd__V1__GenerateRequest *req = (const Specd__V1__GenerateRequest *)msg;
    specd_draft_prepared pr;
    grpc_status_code code = specd_draft_prepare(&lim, req, &pr, &err);
    if (code != GRPC_STATUS_OK) {
        if (!err.msg[0]) abort();
    } else {
        if (pr.drafter < 0 || pr.drafter > SPECD_N_DRAFTERS) abort();
        if (pr.drafter < SPECD_N_DRAFTERS && !lim.offered[pr.drafter]) abort();
        if (pr.max_new_tokens < 1 || pr.max_new_tokens > lim.adm.max_new_tokens) abort();
        if (!pr.ids || pr.n_ids < 1 || pr.n_ids > (size_t)lim.adm.max_prompt_tokens) abort();
        for (size_t i = 0; i < req->n_stop; i++)
            if (!specd_utf8_valid((const uint8_t *)req->stop[i], strlen(req->stop[i]))) abort();
        for (size_t i = 0; i < pr.n_ids; i++)
            if (pr.ids[i] < 0 || pr.ids[i] >= lim.vocab) abort();
        for (size_t i = 0; i < req->n_stop_ids; i++)
            if (req->stop_ids[i] < 0 || req->stop_ids[i] >= lim.vocab) abort();
        if (specd_sampling_validate(&pr.samp.s, lim.vocab, &err)) abort();
        if (req->n_stop && !lim.tok) abort();
        /* Stream the prompt's tokens as if generated: text comes out whole
         * characters, nothing fails for ids inside the vocabulary. */
        for (size_t i = 0; i < pr.n_ids; i++) {
            int rc = specd_text_stream_push(&pr.ts, pr.ids[i], &err);
            if (rc < 0) abort();
            size_t tl;
            const char *t = specd_text_stream_take(&pr.ts, &tl);
            if (!t || !specd_utf8_valid((const uint8_t *)t, tl)) abort();
            if (rc == 1) break;
        }
        if (specd_text_stream_finish(&pr.ts)) abort();
    }
    specd_draft_prepared_free(&pr);
    protobuf_c_message_free_unpacked(msg, NULL);
    return 0;
}
