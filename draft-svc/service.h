/* service.h - specd.v1.Draft: the front door clients call.
 *
 * Draft.Generate takes text, chat messages or token ids, checks every field
 * (a bad one ends the call with INVALID_ARGUMENT and a message naming it),
 * runs the request through the session driver (driver.h: drafter -> target
 * Verify stream, with failover) and streams GenerateResponse messages: one
 * per target step, carrying the step's token ids and the text they complete
 * (never half a UTF-8 character, never anything past a stop string), then a
 * last one with the finish reason and the request's stats. Draft.GetInfo
 * describes the model behind the targets and the drafters on offer.
 *
 * A client that cancels or disconnects stops its request at once: the
 * target stream is cancelled (the target frees the session's KV slot), the
 * drafter's session state is released. */
#ifndef SPECD_DRAFT_SERVICE_H
#define SPECD_DRAFT_SERVICE_H

#include "common/util/error.h"
#include "common/rpc/rpc_server.h"
#include "common/text/tokenizer.h"
#include "draft-svc/drafter.h"
#include "draft-svc/policy.h"
#include "draft-svc/target_pool.h"

/* GetInfo.version: the one specd version (CMake project VERSION) */
#include "common/util/version.h"

/* Indices of the drafters a service may offer. */
enum {
    SPECD_DRAFTER_MLP,
    SPECD_DRAFTER_LM,
    SPECD_DRAFTER_NGRAM,
    SPECD_DRAFTER_MLP_NGRAM, /* mlp and ngram merged (drafter_hybrid.c) */
    SPECD_N_DRAFTERS
};
/* Names by index, then "none" (plain decoding) at SPECD_N_DRAFTERS, then
 * "auto" at SPECD_DRAFTER_AUTO (drafter.default only: the best drafter
 * offered, specd_draft_default_drafter). */
#define SPECD_DRAFTER_AUTO (SPECD_N_DRAFTERS + 1)
extern const char *const specd_drafter_names[SPECD_N_DRAFTERS + 3];

typedef struct specd_draft_opts {
    const specd_tokenizer *tok;               /* NULL = token-id input only */
    specd_tpool *pool;                         /* not owned */
    specd_drafter *drafters[SPECD_N_DRAFTERS];/* NULL = not offered; owned by the caller */
    int default_drafter;                      /* index, or SPECD_N_DRAFTERS = none */
    specd_policy policy;
    int max_prompt_tokens;
    int max_new_tokens;         /* most a request may ask for */
    int default_max_new_tokens; /* when a request says 0 */
    int max_tree_tokens;
    int step_timeout_ms, open_timeout_ms, max_failovers;
    float stop_threshold; /* speculation.adaptive: default stop threshold, 0 = off */
    int min_depth;        /* speculation.adaptive.min_depth (0 = 1) */
    int pipeline;         /* speculation.pipeline (driver.h) */
} specd_draft_opts;

/* The drafter requests that name none get: o->default_drafter, or for
 * SPECD_DRAFTER_AUTO the first offered of mlp_ngram, mlp, ngram (the order
 * they drafted in on held-out prompts, docs/BENCHMARKS.md), else none. */
int specd_draft_default_drafter(const specd_draft_opts *o);

typedef struct specd_draft_service specd_draft_service;

/* Starts a batcher per drafter. NULL + err on failure. */
specd_draft_service *specd_draft_service_create(const specd_draft_opts *o, specd_error *err);
/* Registers Draft.Generate and Draft.GetInfo, sets health SERVING. */
int specd_draft_service_register(specd_draft_service *svc, specd_rpc_server *srv,
                                 specd_error *err);
/* After the server is destroyed (no handler may run). NULL is a no-op. */
void specd_draft_service_free(specd_draft_service *svc);

#endif
