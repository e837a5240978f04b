/* target_metrics.h - target-svc's Prometheus metrics and request log.
 *
 * Every metric lives in the process registry (common/rpc/metrics.h) under
 * specd_target_*; the scheduler and the Verify/Generate handlers report at a
 * few clear points, and a scrape hook reads the live load:
 *
 *   specd_target_active_sessions           gauge   sessions holding a KV slot
 *   specd_target_max_sessions              gauge   limits.max_sessions
 *   specd_target_queued_items              gauge   work items waiting for a pass
 *   specd_target_queued_tokens             gauge   tokens those items still need
 *   specd_target_batch_tokens              histogram tokens per forward pass
 *   specd_target_forward_seconds           histogram seconds per forward pass
 *   specd_target_forward_errors_total      counter failed forward passes
 *   specd_target_kv_pages_used / _free     gauge   KV cache pages
 *   specd_target_kv_pages_cached            gauge   unheld pages kept for prefix reuse
 *   specd_target_prefix_cache_queries_total / _hits_total, _kv_evictions_total
 *                                           counter prefix cache, in pages
 *   specd_target_kv_preemptions_total      counter sessions ended to free KV pages
 *   specd_target_queue_timeouts_total      counter prompts refused after queue_wait
 *   specd_target_verify_steps_total        counter trees verified (plain steps too)
 *   specd_target_plain_run_steps_total     counter of those, plain steps run by the
 *                                                  target itself (VerifyTree.plain_steps)
 *   specd_target_accepted_tokens_total     counter draft tokens accepted
 *   specd_target_generated_tokens_total    counter tokens emitted (accepted +
 *                                                  the target's own next token)
 *   specd_target_backend_info{backend,kernels} gauge 1: the compute backend and
 *                                                  its kernel path (cpu: amx,
 *                                                  avx512vnni, ...; cuda: cuda)
 *   specd_grpc_server_handled_total        counter by method and status code
 *                                                  (common/rpc/rpc_metrics.c) */
#ifndef SPECD_TARGET_METRICS_H
#define SPECD_TARGET_METRICS_H

#include <stdint.h>

#include "common/rpc/rpc_server.h"
#include "target-svc/scheduler.h"
#include "common/model/transformer.h"

/* After every forward pass, by the scheduler's runner (which owns t): the
 * pass's size and time, and the prefix cache's lookups, hits and evictions
 * since `seen` (the scheduler's totals at its last pass; updated here).
 * ok = 0 for a failed pass. (The KV page gauges are set at scrape time,
 * specd_target_metrics_watch.) */
void specd_target_metrics_pass(specd_transformer *t, int batch_tokens, uint32_t forward_us,
                               int ok, specd_kv_pool_stats *seen);

/* A tree verified: n_accepted draft tokens kept, n_emitted tokens sent. Also
 * counted into the request log of the calling handler thread. */
void specd_target_metrics_verify(int n_accepted, int n_emitted);
/* One step of a plain run is about to be verified (counted by
 * specd_target_metrics_verify as well). */
void specd_target_metrics_plain_run(void);
/* One item failed for want of KV pages: a new prompt past limits.queue_wait
 * (queued), or a session preempted. */
void specd_target_metrics_no_pages(int queued);

/* Sets specd_target_backend_info{backend, kernels} to 1 (the Prometheus
 * "info" pattern: a dashboard or an alert can join on it, and a node whose
 * CPU runs slower kernels than its neighbours shows up by label). */
void specd_target_metrics_backend(const char *backend, const char *kernels);

/* Registers the scrape hook that reads the scheduler's load; unwatch
 * before the scheduler goes (it waits for a scrape in progress). NULL on out
 * of memory. */
typedef struct specd_target_watch specd_target_watch;
specd_target_watch *specd_target_metrics_watch(specd_sched *s, int max_sessions);
void specd_target_metrics_unwatch(specd_target_watch *w); /* NULL is a no-op */

#endif
