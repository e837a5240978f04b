/* target_metrics.c - see target_metrics.h. */
#include "target-svc/target_metrics.h"

#include <pthread.h>
#include <stdlib.h>

#include "common/rpc/metrics.h"
#include "common/rpc/request_ctx.h"

static struct {
    specd_metric *active, *max_sessions, *queued_items, *queued_tokens;
    specd_metric *batch_tokens, *forward_s, *forward_errors, *kv_used, *kv_free;
    specd_metric *steps, *accepted, *generated, *plain_run;
    specd_metric *kv_cached, *prefix_lookup, *prefix_hit, *kv_evictions;
    specd_metric *preemptions, *queue_timeouts, *backend_info;
} M;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    specd_metrics *r = specd_metrics_global();
    M.active = specd_metrics_gauge(r, "specd_target_active_sessions",
                                   "Verify sessions holding a KV slot", NULL);
    M.max_sessions = specd_metrics_gauge(r, "specd_target_max_sessions",
                                         "Configured limits.max_sessions", NULL);
    M.backend_info = specd_metrics_gauge(r, "specd_target_backend_info",
                                         "Always 1: the compute backend and its kernel path "
                                         "(cpu: amx, avx512vnni, avx512, avxvnni, avx2 or "
                                         "scalar; cuda: cuda)",
                                         "backend,kernels");
    M.queued_items = specd_metrics_gauge(r, "specd_target_queued_items",
                                         "Work items (prompt chunks, trees) waiting for a "
                                         "forward pass", NULL);
    M.queued_tokens = specd_metrics_gauge(r, "specd_target_queued_tokens",
                                          "Tokens the queued work items still need to run", NULL);
    M.batch_tokens = specd_metrics_histogram(r, "specd_target_batch_tokens",
                                             "Tokens in one forward pass (all sessions)", NULL,
                                             specd_metrics_count_buckets,
                                             specd_metrics_n_count_buckets);
    M.forward_s = specd_metrics_histogram(r, "specd_target_forward_seconds",
                                          "Seconds one batched forward pass took", NULL,
                                          specd_metrics_fast_buckets,
                                          specd_metrics_n_fast_buckets);
    M.forward_errors = specd_metrics_counter(r, "specd_target_forward_errors_total",
                                             "Forward passes that failed", NULL);
    M.kv_used = specd_metrics_gauge(r, "specd_target_kv_pages_used",
                                    "KV cache pages holding rows of some session", NULL);
    M.kv_free = specd_metrics_gauge(r, "specd_target_kv_pages_free",
                                    "KV cache pages a session can take (free, or cached for "
                                    "prefix reuse)", NULL);
    M.kv_cached = specd_metrics_gauge(r, "specd_target_kv_pages_cached",
                                      "KV pages no session holds, kept for prefix reuse", NULL);
    M.prefix_lookup = specd_metrics_counter(r, "specd_target_prefix_cache_queries_total",
                                            "Full prompt pages looked up in the prefix cache",
                                            NULL);
    M.prefix_hit = specd_metrics_counter(r, "specd_target_prefix_cache_hits_total",
                                         "Full prompt pages found in the prefix cache (their "
                                         "prefill skipped)", NULL);
    M.kv_evictions = specd_metrics_counter(r, "specd_target_kv_evictions_total",
                                           "Cached prefix pages evicted (LRU) for new rows",
                                           NULL);
    M.preemptions = specd_metrics_counter(r, "specd_target_kv_preemptions_total",
                                          "Sessions ended with RESOURCE_EXHAUSTED to free KV "
                                          "pages (draft-svc re-opens them from their tokens)",
                                          NULL);
    M.queue_timeouts = specd_metrics_counter(r, "specd_target_queue_timeouts_total",
                                             "New prompts refused after waiting "
                                             "limits.queue_wait for KV pages", NULL);
    M.steps = specd_metrics_counter(r, "specd_target_verify_steps_total",
                                    "Candidate trees verified", NULL);
    M.plain_run = specd_metrics_counter(r, "specd_target_plain_run_steps_total",
                                        "Plain steps the target ran by itself in a Verify "
                                        "session's plain run (no round trip each)", NULL);
    M.accepted = specd_metrics_counter(r, "specd_target_accepted_tokens_total",
                                       "Draft tokens accepted by verification", NULL);
    M.generated = specd_metrics_counter(r, "specd_target_generated_tokens_total",
                                        "Tokens emitted by verify steps (accepted + the "
                                        "target's own next token)", NULL);
}

void specd_target_metrics_pass(specd_transformer *t, int batch_tokens, uint32_t forward_us,
                               int ok, specd_kv_pool_stats *seen) {
    pthread_once(&once, init);
    if (!ok) {
        specd_metric_add(M.forward_errors, NULL, 1);
        return;
    }
    specd_metric_observe(M.batch_tokens, NULL, batch_tokens);
    specd_metric_observe(M.forward_s, NULL, forward_us / 1e6);
    /* The pool keeps running totals; the counters get what is new since
     * `seen`, the scheduler's totals at its last pass. */
    specd_kv_pool_stats st;
    specd_transformer_kv_stats(t, &st);
    if (st.lookup_pages >= seen->lookup_pages)
        specd_metric_add(M.prefix_lookup, NULL, (double)(st.lookup_pages - seen->lookup_pages));
    if (st.hit_pages >= seen->hit_pages)
        specd_metric_add(M.prefix_hit, NULL, (double)(st.hit_pages - seen->hit_pages));
    if (st.evictions >= seen->evictions)
        specd_metric_add(M.kv_evictions, NULL, (double)(st.evictions - seen->evictions));
    *seen = st;
}

void specd_target_metrics_plain_run(void) {
    pthread_once(&once, init);
    specd_metric_add(M.plain_run, NULL, 1);
}

void specd_target_metrics_verify(int n_accepted, int n_emitted) {
    pthread_once(&once, init);
    specd_metric_add(M.steps, NULL, 1);
    specd_metric_add(M.accepted, NULL, n_accepted);
    specd_metric_add(M.generated, NULL, n_emitted);
    specd_request_ctx *r = specd_request_current();
    if (!r) return;
    if (r->steps < 0) r->steps = r->accepted_tokens = r->generated_tokens = 0; /* first step */
    r->steps++;
    r->accepted_tokens += n_accepted;
    r->generated_tokens += n_emitted;
}

void specd_target_metrics_backend(const char *backend, const char *kernels) {
    pthread_once(&once, init);
    specd_metric_set(M.backend_info, SPECD_LABELS(backend, kernels), 1);
}

/* ---- scrape hook ----------------------------------------------------------- */

struct specd_target_watch {
    specd_sched *s;
    int max_sessions;
};

static void on_scrape(void *arg) {
    specd_target_watch *w = arg;
    int items = 0, tokens = 0;
    specd_sched_queue(w->s, &items, &tokens);
    specd_metric_set(M.active, NULL, w->max_sessions - specd_sched_free_slots(w->s));
    specd_metric_set(M.max_sessions, NULL, w->max_sessions);
    specd_metric_set(M.queued_items, NULL, items);
    specd_metric_set(M.queued_tokens, NULL, tokens);
    /* The page gauges at scrape time, from the scheduler's copy (the pool as
     * of its last pass, or of its start): set only after passes, a fresh
     * target read 0 free pages until its first request. */
    specd_kv_pool_stats st;
    specd_sched_kv_stats(w->s, &st);
    specd_metric_set(M.kv_used, NULL, st.n_held);
    specd_metric_set(M.kv_free, NULL, st.n_free + st.n_cached); /* a cached page is free to take */
    specd_metric_set(M.kv_cached, NULL, st.n_cached);
}

specd_target_watch *specd_target_metrics_watch(specd_sched *s, int max_sessions) {
    pthread_once(&once, init);
    specd_target_watch *w = malloc(sizeof *w);
    if (!w) return NULL;
    *w = (specd_target_watch){s, max_sessions};
    if (specd_metrics_add_hook(specd_metrics_global(), on_scrape, w)) {
        free(w);
        return NULL;
    }
    return w;
}

void specd_target_metrics_unwatch(specd_target_watch *w) {
    if (!w) return;
    /* waits for a scrape in progress, so the scheduler may go afterwards */
    specd_metrics_remove_hook(specd_metrics_global(), on_scrape, w);
    free(w);
}


void specd_target_metrics_no_pages(int queued) {
    pthread_once(&once, init);
    specd_metric_add(queued ? M.queue_timeouts : M.preemptions, NULL, 1);
}
