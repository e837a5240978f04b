/* request_check.h - every check of a Draft.Generate request that needs no
 * target, and the conversion of its fields into what the driver runs on.
 *
 * Split out of service.c so the exact code the handler runs on untrusted
 * bytes can be fuzzed without a server (tests/fuzz/fuzz_generate_request.c).
 * A refused request gets a gRPC status and a message naming the field
 * ("request.speculation.depth = 100: must be in 0..64"). */
#ifndef SPECD_DRAFT_REQUEST_CHECK_H
#define SPECD_DRAFT_REQUEST_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>

#include "common/rpc/admission.h"
#include "common/util/error.h"
#include "common/rpc/sampling_proto.h"
#include "common/text/text_stream.h"
#include "common/text/tokenizer.h"
#include "draft-svc/service.h"
#include "specd.pb-c.h"

/* What the checks compare against: the service's configuration. */
typedef struct specd_draft_limits {
    const specd_tokenizer *tok;       /* NULL = token-id input only, no stop strings */
    int vocab;                        /* 0 = unknown (ids are then checked by the target) */
    int offered[SPECD_N_DRAFTERS];    /* nonzero: that drafter is configured */
    int default_drafter;              /* index, or SPECD_N_DRAFTERS = none */
    /* Prompt and max_new_tokens limits, shared with target-svc
     * (common/rpc/admission.h). adm.context is 0 here: the context is the
     * target's, which the driver checks the prompt against (the same
     * specd_admit_prompt) when it opens the first session. */
    specd_admission_limits adm;
} specd_draft_limits;

/* A checked request, ready for the driver. Free with
 * specd_draft_prepared_free (also after a failed prepare). */
typedef struct specd_draft_prepared {
    int drafter;              /* index, or SPECD_N_DRAFTERS = no speculation */
    int max_new_tokens;       /* the request's, or the default */
    specd_sampling_owned samp;
    specd_text_stream ts;     /* detokenizer + stop strings */
    int have_ts;
    int32_t *ids;             /* the prompt */
    size_t n_ids;
} specd_draft_prepared;

/* GRPC_STATUS_OK and *out filled, or the status for the client + err. */
grpc_status_code specd_draft_prepare(const specd_draft_limits *lim,
                                     const Specd__V1__GenerateRequest *req,
                                     specd_draft_prepared *out, specd_error *err);
void specd_draft_prepared_free(specd_draft_prepared *p);

#endif
