/* request_check.c - Draft.Generate request checks (request_check.h). */
#include "draft-svc/request_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc/prompt.h"
#include "draft-svc/driver.h"

/* Far above any useful tree (the targets cap tree tokens anyway); it only
 * bounds what a request may ask the drafters to consider. */
#define MAX_CANDIDATES 64

/* The drafter a request asked for: index, SPECD_N_DRAFTERS for none, -1 for
 * an unknown or unavailable one. */
static int pick_drafter(const specd_draft_limits *lim, const char *name) {
    if (!name || !*name) return lim->default_drafter;
    for (int i = 0; i <= SPECD_N_DRAFTERS; i++)
        if (!strcmp(name, specd_drafter_names[i]))
            return i == SPECD_N_DRAFTERS || lim->offered[i] ? i : -1;
    return -1;
}

static void offered(const specd_draft_limits *lim, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i <= SPECD_N_DRAFTERS; i++) {
        if (i < SPECD_N_DRAFTERS && !lim->offered[i]) continue;
        k += (size_t)snprintf(buf + k, k < cap ? cap - k : 0, "%s%s", k ? ", " : "",
                              specd_drafter_names[i]);
    }
}

/* The scalar fields: GRPC_STATUS_OK or a code + err. */
static grpc_status_code check_fields(const specd_draft_limits *lim,
                                     const Specd__V1__GenerateRequest *req, int *drafter,
                                     specd_error *err) {
    if ((*drafter = pick_drafter(lim, req->drafter)) < 0) {
        char have[128];
        offered(lim, have, sizeof have);
        /* %.100s: the name is the client's, of any length; the message must
         * still end with what is offered. */
        return specd_seterr(err, "request.drafter: '%.100s' is not offered here (offered: %s)",
                            req->drafter, have),
               GRPC_STATUS_INVALID_ARGUMENT;
    }
    grpc_status_code code = specd_admit_outputs("request", req->stop_ids, req->n_stop_ids,
                                                req->logprobs, req->top_logprobs, lim->vocab, err);
    if (code) return code;
    const Specd__V1__Speculation *sp = req->speculation;
    if (sp && (sp->candidates < 0 || sp->candidates > MAX_CANDIDATES))
        return specd_seterr(err, "request.speculation.candidates = %d: must be in 0..%d",
                            sp->candidates, MAX_CANDIDATES),
               GRPC_STATUS_INVALID_ARGUMENT;
    if (sp && (sp->depth < 0 || sp->depth > SPECD_MAX_DRAFT_DEPTH))
        return specd_seterr(err, "request.speculation.depth = %d: must be in 0..%d", sp->depth,
                            SPECD_MAX_DRAFT_DEPTH),
               GRPC_STATUS_INVALID_ARGUMENT;
    /* !(x < 1) also refuses NaN, which every comparison would let through */
    if (sp && !(sp->stop_threshold < 1.0f))
        return specd_seterr(err, "request.speculation.stop_threshold = %g: must be below 1 "
                                 "(0 = the server's, negative = off)", (double)sp->stop_threshold),
               GRPC_STATUS_INVALID_ARGUMENT;
    return GRPC_STATUS_OK;
}

grpc_status_code specd_draft_prepare(const specd_draft_limits *lim,
                                     const Specd__V1__GenerateRequest *req,
                                     specd_draft_prepared *out, specd_error *err) {
    memset(out, 0, sizeof *out);
    out->drafter = SPECD_N_DRAFTERS;
    grpc_status_code code;
    if ((code = specd_admit_strings(req, err))) return code;
    if ((code = check_fields(lim, req, &out->drafter, err))) return code;
    if (specd_sampling_from_proto(req->sampling, lim->vocab, "request.sampling", &out->samp, err))
        return GRPC_STATUS_INVALID_ARGUMENT;
    if (specd_text_stream_init(&out->ts, lim->tok, req->stop, req->n_stop, "request.stop", err))
        return lim->tok ? GRPC_STATUS_INVALID_ARGUMENT : GRPC_STATUS_FAILED_PRECONDITION;
    out->have_ts = 1;
    /* The size limits come after the conversion, in specd_admit_generate,
     * exactly as target-svc checks them (same order, same words). The
     * message size bounds what the conversion may cost. */
    if ((code = specd_prompt_from_request(lim->tok, req, lim->vocab, 0, &out->ids, &out->n_ids,
                                          err)))
        return code;
    return specd_admit_generate(&lim->adm, out->n_ids, req->max_new_tokens, &out->max_new_tokens,
                                err);
}

void specd_draft_prepared_free(specd_draft_prepared *p) {
    if (p->have_ts) specd_text_stream_free(&p->ts);
    specd_sampling_owned_free(&p->samp);
    free(p->ids);
    memset(p, 0, sizeof *p);
}
