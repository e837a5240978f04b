/* draft_metrics.h - draft-svc's Prometheus metrics and request log.
 *
 * Recorded once per request when the driver returns (from its stats), plus
 * the speculation-off decisions as they happen and the sessions per target
 * read at scrape time. The spec-decode counters have vLLM's meanings
 * (vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens /
 * _num_accepted_tokens_per_pos), so its dashboards translate: acceptance
 * rate = accepted / draft tokens, mean acceptance length = 1 + accepted /
 * drafts, acceptance at position p = accepted_per_pos{position=p} / drafts.
 * A tree's draft tokens are all its nodes, so with several candidates the
 * acceptance rate is lower than a chain's for the same tau.
 *
 *   specd_draft_requests_total{drafter,finish_reason}   finish_reason: eos,
 *       stop, length, context, cancelled, or error (any non-OK status)
 *   specd_draft_prompt_tokens_total{drafter}, specd_draft_generated_tokens_total{drafter}
 *   specd_draft_target_steps_total{drafter}       Verify steps (tau = generated / steps)
 *   specd_draft_target_round_trips_total{drafter} Verify messages answered (Open, Trees):
 *       the waits for draft-svc between target steps (plain runs save them)
 *   specd_spec_decode_num_drafts_total{drafter}    steps that sent a non-empty tree
 *   specd_spec_decode_num_draft_tokens_total{drafter}
 *   specd_spec_decode_num_accepted_tokens_total{drafter}
 *   specd_spec_decode_num_accepted_tokens_per_pos_total{drafter,position}
 *   specd_spec_decode_num_drafts_per_pos_total{drafter,position}   steps whose
 *       tree reached depth position+1 (acceptance by position's denominator)
 *   specd_draft_tau                histogram: tokens per target step, per request
 *   specd_draft_time_to_first_token_seconds, _time_per_output_token_seconds,
 *   specd_draft_e2e_request_latency_seconds        histograms
 *   specd_draft_failovers_total
 *   specd_draft_pipelined_drafts_total{drafter,outcome}   trees drafted ahead
 *       (driver_draft.c, pipelined drafting): used, or wasted (the guess failed)
 *   specd_draft_target_sessions{target}            gauge: sessions open per target
 *   specd_draft_targets_up                         gauge: targets usable now
 *   specd_draft_speculation_off_total{reason}      steps decoded plainly because
 *       of load (policy load table) or collapse (acceptance fell)
 *   specd_grpc_server_handled_total{grpc_method,grpc_code}  (common/rpc/rpc_metrics.c) */
#ifndef SPECD_DRAFT_METRICS_H
#define SPECD_DRAFT_METRICS_H

#include "common/rpc/rpc_server.h"
#include "draft-svc/driver.h"
#include "draft-svc/target_pool.h"

/* One request the driver ran (st filled by specd_driver_generate), with its
 * status and drafter name; also fills the thread's request log, whose start
 * is the end-to-end latency's. */
void specd_draft_metrics_request(const specd_gen_stats *st, grpc_status_code code,
                                 const char *drafter);

typedef enum {
    SPECD_SPEC_OFF_LOAD,     /* the load table said none at this load */
    SPECD_SPEC_OFF_COLLAPSE, /* the table mode's collapse rule */
    SPECD_SPEC_OFF_COST,     /* the cost model priced no tree above a plain step */
} specd_spec_off_reason;
void specd_draft_metrics_spec_off(specd_spec_off_reason why);

/* The scrape hook reading sessions per target (0, or -1 on out of
 * memory); unwatch before the pool goes (it waits for a scrape running). */
int specd_draft_metrics_watch(specd_tpool *pool);
void specd_draft_metrics_unwatch(specd_tpool *pool);

#endif
