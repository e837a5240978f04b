/* draft_metrics.c - see draft_metrics.h. */
#include "draft-svc/draft_metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "common/rpc/metrics.h"
#include "common/rpc/request_ctx.h"
#include "common/util/clock.h"

static struct {
    specd_metric *requests, *prompt, *generated, *steps, *round_trips;
    specd_metric *drafts, *draft_tokens, *accepted, *accepted_pos, *drafts_pos;
    specd_metric *tau, *ttft, *tpot, *e2e, *failovers, *sessions, *up, *spec_off;
    specd_metric *step_seconds, *pipelined;
} M;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Tokens per target step: 1 is plain decoding, the default speculator
 * reaches 2-4. */
static const double tau_buckets[] = {1, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 2.75, 3, 3.5, 4, 5, 6, 8};

static void init(void) {
    specd_metrics *r = specd_metrics_global();
    M.requests = specd_metrics_counter(r, "specd_draft_requests_total",
                                       "Generate requests finished, by drafter and finish reason "
                                       "(error = ended with a non-OK status)",
                                       "drafter,finish_reason");
    M.prompt = specd_metrics_counter(r, "specd_draft_prompt_tokens_total",
                                     "Prompt tokens of finished requests", "drafter");
    M.generated = specd_metrics_counter(r, "specd_draft_generated_tokens_total",
                                        "Tokens generated (streamed to clients)", "drafter");
    M.steps = specd_metrics_counter(r, "specd_draft_target_steps_total",
                                    "Verify steps on targets (tau = generated / steps)",
                                    "drafter");
    M.round_trips = specd_metrics_counter(
        r, "specd_draft_target_round_trips_total",
        "Verify messages (Open and Trees) that targets answered: the round trips the requests paid "
        "(a plain run's later steps cost none)",
        "drafter");
    M.drafts = specd_metrics_counter(r, "specd_spec_decode_num_drafts_total",
                                     "Steps that sent a non-empty draft tree (vLLM num_drafts)",
                                     "drafter");
    M.draft_tokens = specd_metrics_counter(r, "specd_spec_decode_num_draft_tokens_total",
                                           "Draft tokens (tree nodes) sent for verification",
                                           "drafter");
    M.accepted = specd_metrics_counter(r, "specd_spec_decode_num_accepted_tokens_total",
                                       "Draft tokens the target accepted", "drafter");
    M.accepted_pos = specd_metrics_counter(r, "specd_spec_decode_num_accepted_tokens_per_pos_total",
                                           "Steps that accepted a draft token at this position "
                                           "(0 = first drafted token)",
                                           "drafter,position");
    M.drafts_pos = specd_metrics_counter(r, "specd_spec_decode_num_drafts_per_pos_total",
                                         "Steps whose tree reached this position", "drafter,position");
    M.tau = specd_metrics_histogram(r, "specd_draft_tau",
                                    "Tokens per target step of each finished request", "drafter",
                                    tau_buckets, (int)(sizeof tau_buckets / sizeof tau_buckets[0]));
    M.ttft = specd_metrics_histogram(r, "specd_draft_time_to_first_token_seconds",
                                     "Seconds from request to the first token", "drafter",
                                     specd_metrics_latency_buckets,
                                     specd_metrics_n_latency_buckets);
    M.tpot = specd_metrics_histogram(r, "specd_draft_time_per_output_token_seconds",
                                     "Mean seconds per output token after the first, per request",
                                     "drafter", specd_metrics_fast_buckets,
                                     specd_metrics_n_fast_buckets);
    M.e2e = specd_metrics_histogram(r, "specd_draft_e2e_request_latency_seconds",
                                    "Seconds from request to its end", "drafter",
                                    specd_metrics_latency_buckets,
                                    specd_metrics_n_latency_buckets);
    M.step_seconds = specd_metrics_counter(
        r, "specd_draft_step_seconds_total",
        "Seconds of the decode steps by part: draft (drafting and pricing the trees), "
        "target_wait (waiting for the target's answers), target_forward (the target's forward "
        "passes within those waits; the rest of the wait is transport and the target's queue)",
        "drafter,part");
    M.pipelined = specd_metrics_counter(
        r, "specd_draft_pipelined_drafts_total",
        "Trees drafted ahead while the target verified the step before (speculation.pipeline), "
        "by outcome: used (the guess held) or wasted", "drafter,outcome");
    M.failovers = specd_metrics_counter(r, "specd_draft_failovers_total",
                                        "Requests moved to another target mid-stream", NULL);
    M.sessions = specd_metrics_gauge(r, "specd_draft_target_sessions",
                                     "Verify sessions open on each target", "target");
    M.up = specd_metrics_gauge(r, "specd_draft_targets_up", "Targets usable now", NULL);
    M.spec_off = specd_metrics_counter(r, "specd_draft_speculation_off_total",
                                       "Steps decoded without a draft, by reason (load: the "
                                       "target's load; collapse: acceptance fell; cost: no "
                                       "tree was worth its verification time)",
                                       "reason");
}

void specd_draft_metrics_request(const specd_gen_stats *st, grpc_status_code code,
                                 const char *drafter) {
    pthread_once(&once, init);
    const char *const *d = SPECD_LABELS(drafter);
    const char *finish = code == GRPC_STATUS_OK ? specd_finish_reason_name(st->finish) : "error";
    specd_metric_add(M.requests, SPECD_LABELS(drafter, finish), 1);
    specd_metric_add(M.prompt, d, st->prompt_tokens);
    specd_metric_add(M.generated, d, st->generated_tokens);
    specd_metric_add(M.steps, d, st->target_steps);
    specd_metric_add(M.round_trips, d, st->round_trips);
    specd_metric_add(M.failovers, NULL, st->failovers);
    specd_metric_add(M.step_seconds, SPECD_LABELS(drafter, "draft"), st->draft_ms / 1e3);
    specd_metric_add(M.step_seconds, SPECD_LABELS(drafter, "target_wait"), st->wait_ms / 1e3);
    specd_metric_add(M.step_seconds, SPECD_LABELS(drafter, "target_forward"),
                     st->forward_ms / 1e3);
    if (st->pipelined_drafts) {
        specd_metric_add(M.pipelined, SPECD_LABELS(drafter, "used"), st->pipelined_hits);
        specd_metric_add(M.pipelined, SPECD_LABELS(drafter, "wasted"),
                         st->pipelined_drafts - st->pipelined_hits);
    }
    if (st->drafted_tokens) {
        specd_metric_add(M.drafts, d, st->drafted_at[0]);
        specd_metric_add(M.draft_tokens, d, st->drafted_tokens);
        specd_metric_add(M.accepted, d, st->accepted_tokens);
        for (int p = 0; p < st->max_depth_seen && p < SPECD_MAX_DRAFT_DEPTH; p++) {
            char pos[8];
            snprintf(pos, sizeof pos, "%d", p);
            specd_metric_add(M.drafts_pos, SPECD_LABELS(drafter, pos), st->drafted_at[p]);
            specd_metric_add(M.accepted_pos, SPECD_LABELS(drafter, pos), st->accepted_at[p]);
        }
    }
    if (st->target_steps)
        specd_metric_observe(M.tau, d, (double)st->generated_tokens / st->target_steps);
    if (st->generated_tokens) specd_metric_observe(M.ttft, d, st->ttft_ms / 1e3);
    if (st->generated_tokens > 1) specd_metric_observe(M.tpot, d, st->tpot_ms / 1e3);
    specd_request_ctx *r = specd_request_current();
    if (!r) return;
    specd_metric_observe(M.e2e, d, (specd_now_ms() - r->t0_ms) / 1e3);
    r->drafter = drafter;
    r->finish = code == GRPC_STATUS_OK ? finish : NULL;
    r->prompt_tokens = st->prompt_tokens;
    r->generated_tokens = st->generated_tokens;
    r->steps = st->target_steps;
    r->drafted_tokens = st->drafted_tokens;
    r->accepted_tokens = st->accepted_tokens;
    r->failovers = st->failovers;
}

void specd_draft_metrics_spec_off(specd_spec_off_reason why) {
    pthread_once(&once, init);
    const char *name = why == SPECD_SPEC_OFF_LOAD       ? "load"
                       : why == SPECD_SPEC_OFF_COLLAPSE ? "collapse"
                                                        : "cost";
    specd_metric_add(M.spec_off, SPECD_LABELS(name), 1);
}

/* ---- scrape hook ------------------------------------------------------------ */

static void each_target(void *arg, const char *addr, int sessions, int up) {
    int *n_up = arg;
    specd_metric_set(M.sessions, SPECD_LABELS(addr), sessions);
    *n_up += up;
}

static void on_scrape(void *pool) {
    int n_up = 0;
    /* a target that left the pool (DNS) reads 0, not its last count */
    specd_metric_zero(M.sessions);
    specd_tpool_each(pool, each_target, &n_up);
    specd_metric_set(M.up, NULL, n_up);
}

int specd_draft_metrics_watch(specd_tpool *pool) {
    pthread_once(&once, init);
    return specd_metrics_add_hook(specd_metrics_global(), on_scrape, pool);
}

void specd_draft_metrics_unwatch(specd_tpool *pool) {
    specd_metrics_remove_hook(specd_metrics_global(), on_scrape, pool);
}

