/* metrics.c - the metrics registry and its Prometheus text exposition (see
 * metrics.h).
 *
 * Layout: a registry is a list of metrics (appended under the registry's
 * mutex, never removed); a metric is a fixed array of series pointers with an
 * atomic count of the published ones. A new series is fully built, then
 * published with a release store of the count, so the lock-free readers
 * (acquire load, then scan) only ever see finished series. Values are 64-bit
 * atomics; doubles are kept as their bit patterns.
 *
 * Histograms keep one non-cumulative count per bucket (the last is +Inf);
 * render adds them up, and _count is that total, so _count always equals the
 * +Inf bucket even while observations race with a scrape. */
#include "common/rpc/metrics.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double specd_metrics_latency_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                0.1,   0.25,   0.5,   1,    2.5,   5,
                                                10,    30,     60};
const int specd_metrics_n_latency_buckets =
    sizeof specd_metrics_latency_buckets / sizeof specd_metrics_latency_buckets[0];
const double specd_metrics_fast_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                             0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                             1,      2.5,     10};
const int specd_metrics_n_fast_buckets =
    sizeof specd_metrics_fast_buckets / sizeof specd_metrics_fast_buckets[0];
const double specd_metrics_count_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                              4096};
const int specd_metrics_n_count_buckets =
    sizeof specd_metrics_count_buckets / sizeof specd_metrics_count_buckets[0];

typedef enum { M_COUNTER, M_GAUGE, M_HISTOGRAM } mtype;
static const char *const type_names[] = {"counter", "gauge", "histogram"};

typedef struct series series;
struct series {
    char *values[SPECD_METRIC_MAX_LABELS];
    _Atomic uint64_t bits; /* counter / gauge value; histogram sum */
    _Atomic uint64_t buckets[SPECD_METRIC_MAX_BUCKETS + 1];
};

struct specd_metric {
    specd_metric *next;
    specd_metrics *reg;
    char *name, *help;
    mtype type;
    char *labels[SPECD_METRIC_MAX_LABELS];
    int n_labels;
    double bounds[SPECD_METRIC_MAX_BUCKETS];
    int n_bounds;
    pthread_mutex_t mu; /* creating a series */
    series *series[SPECD_METRIC_MAX_SERIES];
    _Atomic int n_series;
};

typedef struct hook {
    specd_metrics_hook fn;
    void *arg;
} hook;

struct specd_metrics {
    pthread_mutex_t mu;        /* the metric list */
    pthread_mutex_t render_mu; /* one render at a time; the hook list */
    specd_metric *head, *tail;
    hook *hooks;
    int n_hooks, cap_hooks;
    specd_metric *dropped;
};

/* ---- doubles in atomics ------------------------------------------------ */

static uint64_t d2b(double d) {
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

static double b2d(uint64_t b) {
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static void atomic_add_d(_Atomic uint64_t *p, double v) {
    uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(p, &old, d2b(b2d(old) + v), memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

/* ---- registry ------------------------------------------------------------ */

static series *get_series(specd_metric *m, const char *const *labels, int create);

static void metric_free(specd_metric *m) {
    int n = atomic_load(&m->n_series);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m->n_labels; j++) free(m->series[i]->values[j]);
        free(m->series[i]);
    }
    for (int j = 0; j < m->n_labels; j++) free(m->labels[j]);
    pthread_mutex_destroy(&m->mu);
    free(m->name);
    free(m->help);
    free(m);
}

specd_metrics *specd_metrics_new(void) {
    specd_metrics *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->render_mu, NULL);
    r->dropped = specd_metrics_counter(r, "specd_metrics_dropped_series_total",
                                       "Label combinations not recorded because a metric "
                                       "already had its maximum number of series",
                                       NULL);
    return r;
}

void specd_metrics_free(specd_metrics *r) {
    if (!r) return;
    for (specd_metric *m = r->head, *next; m; m = next) {
        next = m->next;
        metric_free(m);
    }
    free(r->hooks);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->render_mu);
    free(r);
}

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static specd_metrics *global_reg;
static void global_init(void) { global_reg = specd_metrics_new(); }

/* Lives as long as the process: handles to its metrics are kept in statics
 * by the services, so it is never freed. */
specd_metrics *specd_metrics_global(void) {
    pthread_once(&global_once, global_init);
    return global_reg;
}

static int valid_name(const char *s, int colon_ok) {
    if (!s || !*s || isdigit((unsigned char)*s)) return 0;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_' || (colon_ok && *s == ':'))) return 0;
    return 1;
}

/* Splits "a,b" into owned names; -1 if malformed or too many. */
static int split_labels(const char *list, char **out, int *n) {
    *n = 0;
    if (!list || !*list) return 0;
    const char *p = list;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (*n == SPECD_METRIC_MAX_LABELS || !(out[*n] = strndup(p, len))) return -1;
        /* "le" is the histogram bucket label; __ names are reserved */
        if (!valid_name(out[(*n)++], 0) || !strcmp(out[*n - 1], "le") ||
            !strncmp(out[*n - 1], "__", 2))
            return -1;
        if (!comma) return 0;
        p = comma + 1;
    }
}

static int same_shape(const specd_metric *m, mtype type, char **labels, int n_labels,
                      const double *bounds, int n_bounds) {
    if (m->type != type || m->n_labels != n_labels) return 0;
    for (int i = 0; i < n_labels; i++)
        if (strcmp(m->labels[i], labels[i])) return 0;
    if (type != M_HISTOGRAM) return 1;
    if (m->n_bounds != n_bounds) return 0;
    for (int i = 0; i < n_bounds; i++)
        if (m->bounds[i] != bounds[i]) return 0;
    return 1;
}

static specd_metric *reg_metric(specd_metrics *r, mtype type, const char *name, const char *help,
                                const char *label_names, const double *bounds, int n_bounds) {
    char *labels[SPECD_METRIC_MAX_LABELS] = {0};
    int n_labels = 0;
    specd_metric *m = NULL;
    if (!r || !valid_name(name, 1) || split_labels(label_names, labels, &n_labels)) goto out;
    if (type == M_HISTOGRAM) {
        if (n_bounds < 1 || n_bounds > SPECD_METRIC_MAX_BUCKETS) goto out;
        for (int i = 0; i < n_bounds; i++)
            if (!isfinite(bounds[i]) || (i && bounds[i] <= bounds[i - 1])) goto out;
    }
    pthread_mutex_lock(&r->mu);
    for (m = r->head; m; m = m->next)
        if (!strcmp(m->name, name)) break;
    if (m) {
        if (!same_shape(m, type, labels, n_labels, bounds, n_bounds)) m = NULL;
        pthread_mutex_unlock(&r->mu);
        goto out;
    }
    m = calloc(1, sizeof *m);
    if (m && (m->name = strdup(name)) && (m->help = strdup(help ? help : ""))) {
        m->reg = r;
        m->type = type;
        memcpy(m->labels, labels, sizeof labels);
        m->n_labels = n_labels;
        n_labels = 0; /* owned by m now */
        if (type == M_HISTOGRAM) {
            memcpy(m->bounds, bounds, sizeof(double) * (size_t)n_bounds);
            m->n_bounds = n_bounds;
        }
        pthread_mutex_init(&m->mu, NULL);
        atomic_init(&m->n_series, 0);
        if (r->tail) r->tail->next = m;
        else r->head = m;
        r->tail = m;
    } else if (m) {
        free(m->name);
        free(m);
        m = NULL;
    }
    pthread_mutex_unlock(&r->mu);
    /* A metric without labels has exactly one series: it exists (at 0) from
     * the start, so the first scrape sees it and increase() has a base. */
    if (m && !m->n_labels) get_series(m, NULL, 1);
out:
    for (int i = 0; i < n_labels; i++) free(labels[i]);
    return m;
}

specd_metric *specd_metrics_counter(specd_metrics *r, const char *name, const char *help,
                                    const char *label_names) {
    return reg_metric(r, M_COUNTER, name, help, label_names, NULL, 0);
}

specd_metric *specd_metrics_gauge(specd_metrics *r, const char *name, const char *help,
                                  const char *label_names) {
    return reg_metric(r, M_GAUGE, name, help, label_names, NULL, 0);
}

specd_metric *specd_metrics_histogram(specd_metrics *r, const char *name, const char *help,
                                      const char *label_names, const double *bounds,
                                      int n_bounds) {
    return reg_metric(r, M_HISTOGRAM, name, help, label_names, bounds, n_bounds);
}

/* ---- series -------------------------------------------------------------- */

static const char *val(const char *const *labels, int i) {
    return labels && labels[i] ? labels[i] : "";
}

static series *scan(specd_metric *m, int n, const char *const *labels) {
    for (int i = 0; i < n; i++) {
        series *s = m->series[i];
        int j = 0;
        while (j < m->n_labels && !strncmp(s->values[j], val(labels, j), SPECD_METRIC_MAX_VALUE))
            j++;
        if (j == m->n_labels) return s;
    }
    return NULL;
}

/* The series for these label values, created on first use; NULL when the
 * metric is full (counted) or memory ran out. */
static series *get_series(specd_metric *m, const char *const *labels, int create) {
    series *s = scan(m, atomic_load_explicit(&m->n_series, memory_order_acquire), labels);
    if (s || !create) return s;
    pthread_mutex_lock(&m->mu);
    int n = atomic_load_explicit(&m->n_series, memory_order_relaxed);
    if (!(s = scan(m, n, labels)) && n < SPECD_METRIC_MAX_SERIES && (s = calloc(1, sizeof *s))) {
        int j = 0;
        while (j < m->n_labels && (s->values[j] = strndup(val(labels, j), SPECD_METRIC_MAX_VALUE)))
            j++;
        if (j < m->n_labels) {
            while (j--) free(s->values[j]);
            free(s);
            s = NULL;
        } else {
            m->series[n] = s;
            atomic_store_explicit(&m->n_series, n + 1, memory_order_release);
        }
    } else if (!s && n >= SPECD_METRIC_MAX_SERIES) {
        specd_metric_add(m->reg->dropped, NULL, 1);
    }
    pthread_mutex_unlock(&m->mu);
    return s;
}

void specd_metric_add(specd_metric *m, const char *const *labels, double v) {
    if (!m || m->type != M_COUNTER || !(v >= 0)) return;
    series *s = get_series(m, labels, 1);
    if (s) atomic_add_d(&s->bits, v);
}

void specd_metric_set(specd_metric *m, const char *const *labels, double v) {
    if (!m || m->type != M_GAUGE) return;
    series *s = get_series(m, labels, 1);
    if (s) atomic_store_explicit(&s->bits, d2b(v), memory_order_relaxed);
}

void specd_metric_gauge_add(specd_metric *m, const char *const *labels, double v) {
    if (!m || m->type != M_GAUGE) return;
    series *s = get_series(m, labels, 1);
    if (s) atomic_add_d(&s->bits, v);
}

void specd_metric_observe(specd_metric *m, const char *const *labels, double v) {
    if (!m || m->type != M_HISTOGRAM || isnan(v)) return;
    series *s = get_series(m, labels, 1);
    if (!s) return;
    int b = 0; /* the first bucket whose bound holds v; n_bounds = +Inf */
    while (b < m->n_bounds && v > m->bounds[b]) b++;
    atomic_fetch_add_explicit(&s->buckets[b], 1, memory_order_relaxed);
    atomic_add_d(&s->bits, v);
}

void specd_metric_zero(specd_metric *m) {
    if (!m || m->type != M_GAUGE) return;
    int n = atomic_load_explicit(&m->n_series, memory_order_acquire);
    for (int i = 0; i < n; i++) atomic_store_explicit(&m->series[i]->bits, d2b(0), memory_order_relaxed);
}

double specd_metric_value(specd_metric *m, const char *const *labels) {
    series *s = m ? get_series(m, labels, 0) : NULL;
    if (!s) return 0;
    if (m->type != M_HISTOGRAM) return b2d(atomic_load_explicit(&s->bits, memory_order_relaxed));
    uint64_t n = 0;
    for (int b = 0; b <= m->n_bounds; b++) n += atomic_load_explicit(&s->buckets[b], memory_order_relaxed);
    return (double)n;
}

/* ---- hooks ----------------------------------------------------------------- */

int specd_metrics_add_hook(specd_metrics *r, specd_metrics_hook fn, void *arg) {
    if (!r || !fn) return -1;
    pthread_mutex_lock(&r->render_mu);
    int rc = 0;
    if (r->n_hooks == r->cap_hooks) {
        int cap = r->cap_hooks ? 2 * r->cap_hooks : 8;
        hook *h = realloc(r->hooks, sizeof *h * (size_t)cap);
        if (h) {
            r->hooks = h;
            r->cap_hooks = cap;
        } else {
            rc = -1;
        }
    }
    if (!rc) r->hooks[r->n_hooks++] = (hook){fn, arg};
    pthread_mutex_unlock(&r->render_mu);
    return rc;
}

void specd_metrics_remove_hook(specd_metrics *r, specd_metrics_hook fn, void *arg) {
    if (!r) return;
    pthread_mutex_lock(&r->render_mu);
    for (int i = 0; i < r->n_hooks; i++) {
        if (r->hooks[i].fn == fn && r->hooks[i].arg == arg) {
            memmove(&r->hooks[i], &r->hooks[i + 1], sizeof(hook) * (size_t)(r->n_hooks - i - 1));
            r->n_hooks--;
            break;
        }
    }
    pthread_mutex_unlock(&r->render_mu);
}

/* ---- exposition ---------------------------------------------------------------- */

/* The shortest of %.15g / %.17g that reads back exactly, so 0.1 prints as
 * 0.1; infinities as Prometheus spells them. */
static void put_num(FILE *f, double v) {
    if (isinf(v)) {
        fputs(v > 0 ? "+Inf" : "-Inf", f);
        return;
    }
    if (isnan(v)) {
        fputs("NaN", f);
        return;
    }
    char buf[40];
    snprintf(buf, sizeof buf, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, sizeof buf, "%.17g", v);
    fputs(buf, f);
}

/* Escapes as the format requires: \\ and \n always, \" inside label values. */
static void put_escaped(FILE *f, const char *s, int quote) {
    for (; *s; s++) {
        if (*s == '\\') fputs("\\\\", f);
        else if (*s == '\n') fputs("\\n", f);
        else if (quote && *s == '"') fputs("\\\"", f);
        else fputc(*s, f);
    }
}

/* name{a="x",b="y"[,le="..."]} */
static void put_series_name(FILE *f, const specd_metric *m, const series *s, const char *suffix,
                            const double *le) {
    fputs(m->name, f);
    fputs(suffix, f);
    if (!m->n_labels && !le) return;
    fputc('{', f);
    for (int j = 0; j < m->n_labels; j++) {
        fprintf(f, "%s%s=\"", j ? "," : "", m->labels[j]);
        put_escaped(f, s->values[j], 1);
        fputc('"', f);
    }
    if (le) {
        fprintf(f, "%sle=\"", m->n_labels ? "," : "");
        put_num(f, *le);
        fputc('"', f);
    }
    fputc('}', f);
}

static void render_metric(FILE *f, specd_metric *m) {
    int n = atomic_load_explicit(&m->n_series, memory_order_acquire);
    fprintf(f, "# HELP %s ", m->name);
    put_escaped(f, m->help, 0);
    fprintf(f, "\n# TYPE %s %s\n", m->name, type_names[m->type]);
    for (int i = 0; i < n; i++) {
        series *s = m->series[i];
        double sum = b2d(atomic_load_explicit(&s->bits, memory_order_relaxed));
        if (m->type != M_HISTOGRAM) {
            put_series_name(f, m, s, "", NULL);
            fputc(' ', f);
            put_num(f, sum);
            fputc('\n', f);
            continue;
        }
        uint64_t cum = 0;
        for (int b = 0; b <= m->n_bounds; b++) {
            cum += atomic_load_explicit(&s->buckets[b], memory_order_relaxed);
            double le = b < m->n_bounds ? m->bounds[b] : INFINITY;
            put_series_name(f, m, s, "_bucket", &le);
            fprintf(f, " %llu\n", (unsigned long long)cum);
        }
        put_series_name(f, m, s, "_sum", NULL);
        fputc(' ', f);
        put_num(f, sum);
        fputc('\n', f);
        put_series_name(f, m, s, "_count", NULL);
        fprintf(f, " %llu\n", (unsigned long long)cum);
    }
}

char *specd_metrics_render(specd_metrics *r, size_t *len) {
    if (!r) return NULL;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    pthread_mutex_lock(&r->render_mu);
    for (int i = 0; i < r->n_hooks; i++) r->hooks[i].fn(r->hooks[i].arg);
    /* Metrics may be registered while we render: the links are read under
     * mu (a metric appears complete or not at all), the values without it. */
    pthread_mutex_lock(&r->mu);
    specd_metric *m = r->head;
    pthread_mutex_unlock(&r->mu);
    while (m) {
        render_metric(f, m);
        pthread_mutex_lock(&r->mu);
        m = m->next;
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&r->render_mu);
    if (ferror(f)) {
        fclose(f);
        free(buf);
        return NULL;
    }
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    if (len) *len = n;
    return buf;
}
