/* driver.h - one generation request, driven through a target's Verify stream.
 *
 * The driver is the loop at the heart of draft-svc:
 *
 *     pick a target -> Open(history) -> first token
 *     repeat: shape the tree (policy) -> draft it (batcher -> drafter)
 *             -> Tree -> [draft the next tree ahead] -> accepted tokens +
 *             the target's next token -> sink
 *     until the target reports a finish reason or the sink stops (a stop
 *     string matched, or the client went away).
 *
 * It owns the request's history: prompt + every token handed to the sink.
 * Tokens are handed on only after the target returned them, so they are
 * final. If the target fails mid-stream (connection lost, UNAVAILABLE, a
 * step that never answers), the driver opens a session on another target
 * with the whole history and VerifyOpen.resumed_tokens = tokens generated so
 * far, so the random draws and the penalties continue where they stopped;
 * the sink sees no token lost or repeated. Greedy output is token-identical
 * to an undisturbed run.
 *
 * One thread per request (the handler's). Cancellation comes from another
 * thread through specd_gen_cancel. */
#ifndef SPECD_DRIVER_H
#define SPECD_DRIVER_H

#include <pthread.h>
#include <stdint.h>

#include <grpc/status.h>

#include "common/util/error.h"
#include "common/rpc/rpc_client.h"
#include "common/spec/sampling.h"
#include "draft-svc/batcher.h"
#include "draft-svc/drafter.h"
#include "draft-svc/policy.h"
#include "draft-svc/target_pool.h"
#include "draft-svc/tree_choice.h"
#include "specd.pb-c.h"

#define SPECD_MAX_DRAFT_DEPTH 64

/* Shared by every request of a draft-svc. */
typedef struct specd_driver_env {
    specd_tpool *pool;
    const specd_policy *policy;
    int max_tree_tokens;   /* own cap on tree size (also capped by each target's) */
    /* A target that answers neither a step (or Open) nor its health checks
     * for step_timeout is given up: the session fails over. A slow step
     * from a target that still answers health checks (busy, not dead) is
     * waited for, up to open_timeout for any one response. For a target
     * never probed (no target_watch running) they are plain deadlines:
     * step_timeout per step, open_timeout for Open. */
    int step_timeout_ms;
    int open_timeout_ms;
    int max_failovers;     /* per request */
    /* SpecDec++ adaptive length for drafters with an acceptance head
     * (drafter.h's specd_draft_job): the default stop threshold (0 = off)
     * and the shortest path it may cut. */
    float stop_threshold;
    int min_depth;
    /* Pipelined drafting (speculation.pipeline): while the target verifies
     * a tree, a drafter with draft_ahead drafts the next one, guessing that
     * the target accepts the tree's most likely path whole. See driver_draft.c. */
    int pipeline;
} specd_driver_env;

typedef struct specd_gen_request {
    const int32_t *prompt;
    int n_prompt;
    int max_new_tokens;
    const Specd__V1__SamplingParams *sampling_pb; /* sent to the target as is; may be NULL */
    specd_sampling sampling;                      /* the same, for the drafter */
    const int32_t *stop_ids;
    int n_stop_ids;
    int ignore_eos;
    int logprobs, top_logprobs;
    specd_drafter *drafter; /* NULL = no speculation */
    specd_batcher *batcher; /* the drafter's */
    int candidates, depth;  /* request's tree shape; 0 = the policy's */
    float stop_threshold;   /* request's; 0 = env's, negative = off */
    const char *request_id; /* sent to targets as x-request-id metadata; may be NULL */
    /* The drafter's acceptance calibration (tree_choice.h), shared by its
     * requests; NULL = trees are never priced (fixed shapes only). */
    specd_accept_calib *calib;
} specd_gen_request;

/* Where tokens go. on_tokens gets each step's new tokens (already cut at
 * EOS / stop id / max_new_tokens by the target), their logprobs (NULL unless
 * asked) and the finish reason (UNSPECIFIED while the request goes on). It
 * returns how many tokens it took and sets *stop when a stop string ended
 * the text at the last token it took (the rest are dropped, never counted,
 * and the request ends with STOP); -1 = abort (the client is gone). */
typedef struct specd_gen_sink {
    int (*on_tokens)(void *arg, const int32_t *toks, int n, Specd__V1__TokenLogprob **lps,
                     int n_lps, Specd__V1__FinishReason finish, int *stop);
    void *arg;
} specd_gen_sink;

typedef struct specd_gen_stats {
    int prompt_tokens, generated_tokens, target_steps;
    int drafted_tokens, accepted_tokens;
    int drafted_at[SPECD_MAX_DRAFT_DEPTH];  /* steps whose tree reached depth d+1 */
    int accepted_at[SPECD_MAX_DRAFT_DEPTH]; /* steps that accepted >= d+1 tokens */
    int max_depth_seen;
    /* speculation.tree = cost: steps whose tree the cost model cut to
     * nothing (or that skipped drafting), and the expected accepted tokens
     * it predicted for the trees it sent (against accepted_tokens) */
    int plain_by_cost;
    double predicted_tokens;
    int failovers;
    double ttft_ms, tpot_ms;
    /* the decode steps' time (ms, steps after the first token): drafting,
     * waiting for the answers, the target's forward passes within that */
    double draft_ms, wait_ms, forward_ms;
    /* trees drafted ahead (pipelined, within wait_ms) and the ones used */
    int pipelined_drafts, pipelined_hits;
    /* Verify messages (Open and Trees, failovers' re-opens included) the
     * target answered: the round trips the request paid */
    int round_trips;
    Specd__V1__FinishReason finish;
} specd_gen_stats;

/* Cancellation from another thread (the gRPC cancel callback): sets the flag
 * and cancels the target stream in flight so a blocked recv returns. */
typedef struct specd_gen_cancel {
    pthread_mutex_t mu;
    int cancelled;
    specd_rpc_stream *stream; /* the driver's current stream, under mu */
} specd_gen_cancel;

void specd_gen_cancel_init(specd_gen_cancel *c);
void specd_gen_cancel_destroy(specd_gen_cancel *c);
void specd_gen_cancel_fire(specd_gen_cancel *c);

/* Runs the request to its end. GRPC_STATUS_OK with st->finish set, or a
 * status for the client + err (UNAVAILABLE when no target could finish it,
 * CANCELLED when cancelled, INVALID_ARGUMENT when a target refused the
 * request itself). */
grpc_status_code specd_driver_generate(const specd_driver_env *env, const specd_gen_request *req,
                                       const specd_gen_sink *sink, specd_gen_cancel *cancel,
                                       specd_gen_stats *st, specd_error *err);

#endif
