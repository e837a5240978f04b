/* metrics.h - Prometheus metrics for both specd services: a registry of
 * counters, gauges and histograms, and its text exposition.
 *
 *     specd_metrics *r = specd_metrics_global();
 *     specd_metric *req = specd_metrics_counter(r, "specd_draft_requests_total",
 *                                               "Requests by drafter and finish reason",
 *                                               "drafter,finish_reason");
 *     specd_metric_add(req, SPECD_LABELS("mlp", "stop"), 1);
 *     char *text = specd_metrics_render(r, &len);   // what GET /metrics serves
 *
 * Naming follows Prometheus: a specd_ prefix, counters end in _total, base
 * units (_seconds, _tokens), histograms of seconds. The HTTP side is
 * metrics_http.h.
 *
 * Threading: every function is thread-safe. Recording (add, set, observe)
 * on a series that exists is lock-free: a linear scan of the metric's
 * published series, then atomic updates (doubles are stored as their bits
 * and added with compare-and-swap). Creating a series (the first use of a
 * label combination) takes the metric's mutex. A series is never removed,
 * so a reader never sees one vanish; label values must therefore come from
 * small fixed sets (drafters, finish reasons, status codes, draft positions,
 * configured targets). A metric holds at most SPECD_METRIC_MAX_SERIES
 * series; a new combination beyond that is not recorded and is counted in
 * specd_metrics_dropped_series_total instead, so a bug can never grow memory
 * without bound.
 *
 * A metric without labels has its one series from registration on (value
 * 0), as Prometheus' client libraries do; labelled series appear on first
 * use. Registration is idempotent: asking again for a name returns the same
 * metric when the type, labels (and buckets) match, so services created
 * several times in one process (the tests, `specd generate`) share them.
 * A mismatch returns NULL, and every recording function accepts NULL and
 * does nothing, so a metric can never crash a request.
 *
 * Scrape hooks: values that are cheaper to read on demand (sessions in use
 * per target, the scheduler's queue) are set by a hook that runs at the
 * start of every render, before any value is read. */
#ifndef SPECD_METRICS_H
#define SPECD_METRICS_H

#include <stddef.h>

typedef struct specd_metrics specd_metrics;
typedef struct specd_metric specd_metric;

#define SPECD_METRIC_MAX_SERIES 256
#define SPECD_METRIC_MAX_LABELS 4
#define SPECD_METRIC_MAX_BUCKETS 32
/* Longest label value kept (longer ones are cut there, on a UTF-8 boundary
 * the caller is responsible for: values here are ASCII names). */
#define SPECD_METRIC_MAX_VALUE 128

/* Label values for one series, in the order of the metric's label names. */
#define SPECD_LABELS(...) ((const char *const[]){__VA_ARGS__})

/* Buckets (upper bounds, ascending) shared by the services. */
extern const double specd_metrics_latency_buckets[]; /* seconds: 1 ms .. 60 s */
extern const int specd_metrics_n_latency_buckets;
extern const double specd_metrics_fast_buckets[];    /* seconds: 100 us .. 10 s */
extern const int specd_metrics_n_fast_buckets;
extern const double specd_metrics_count_buckets[];   /* 1, 2, 4, .. 4096 */
extern const int specd_metrics_n_count_buckets;

/* The process's registry, which the services and `GET /metrics` use. */
specd_metrics *specd_metrics_global(void);

/* A registry of its own (tests). NULL on out of memory. */
specd_metrics *specd_metrics_new(void);
void specd_metrics_free(specd_metrics *r); /* NULL is a no-op */

/* label_names: comma-separated ("drafter,finish_reason") or NULL / "".
 * Names must match [a-zA-Z_:][a-zA-Z0-9_:]* and labels [a-zA-Z_][a-zA-Z0-9_]*
 * (checked; NULL if not). */
specd_metric *specd_metrics_counter(specd_metrics *r, const char *name, const char *help,
                                    const char *label_names);
specd_metric *specd_metrics_gauge(specd_metrics *r, const char *name, const char *help,
                                  const char *label_names);
specd_metric *specd_metrics_histogram(specd_metrics *r, const char *name, const char *help,
                                      const char *label_names, const double *bounds,
                                      int n_bounds);

/* labels: one value per label name (SPECD_LABELS(...)), NULL when the metric
 * has none. Counter: v >= 0 (a negative v is ignored: counters only go up). */
void specd_metric_add(specd_metric *m, const char *const *labels, double v);
/* Gauge: set, or add (v may be negative). */
void specd_metric_set(specd_metric *m, const char *const *labels, double v);
void specd_metric_gauge_add(specd_metric *m, const char *const *labels, double v);
/* Histogram: one observation. */
void specd_metric_observe(specd_metric *m, const char *const *labels, double v);
/* Gauge: sets every existing series to 0 (a scrape hook then sets the live
 * ones, so a target that left the pool reads 0 rather than its last value). */
void specd_metric_zero(specd_metric *m);

/* Current value of a counter or gauge series (0 if it does not exist); for a
 * histogram, its observation count. For tests and the request log. */
double specd_metric_value(specd_metric *m, const char *const *labels);

/* Hooks run, in the order added, at the start of every render. A hook is
 * identified by (fn, arg); removal waits for a render in progress, so arg
 * may be freed once specd_metrics_remove_hook returns. -1 on out of memory. */
typedef void (*specd_metrics_hook)(void *arg);
int specd_metrics_add_hook(specd_metrics *r, specd_metrics_hook fn, void *arg);
void specd_metrics_remove_hook(specd_metrics *r, specd_metrics_hook fn, void *arg);

/* The Prometheus text exposition format (version 0.0.4) of every metric, in
 * registration order: # HELP, # TYPE, then one line per series (histograms:
 * cumulative _bucket{le=...} lines, _sum, _count). Returns a malloc'd,
 * NUL-terminated string and its length in *len; NULL on out of memory. */
char *specd_metrics_render(specd_metrics *r, size_t *len);

#endif
