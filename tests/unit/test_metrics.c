/* test_metrics.c - the metrics registry, its text exposition, the /metrics
 * HTTP listener and the request log (common/metrics*.c, request_log.c).
 *
 * Exposition is checked byte for byte on a registry of our own, so a format
 * slip (a missing _total, an unescaped quote, buckets not cumulative) fails
 * here before promtool and Prometheus see it in the integration test
 * (tests/integration/test_prometheus.c). Concurrency: threads hammer one
 * counter and one histogram and the totals must be exact. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/rpc/metrics.h"
#include "common/rpc/metrics_http.h"
#include "common/rpc/request_log.h"
#include "tests/harness/test_util.h"

static void test_render_exact(void **state) {
    (void)state;
    specd_metrics *r = specd_metrics_new();
    assert_non_null(r);
    specd_metric *c = specd_metrics_counter(r, "t_requests_total", "Requests \\ by\nkind", "kind,code");
    specd_metric *g = specd_metrics_gauge(r, "t_sessions", "Sessions", NULL);
    const double b[] = {0.1, 1};
    specd_metric *h = specd_metrics_histogram(r, "t_latency_seconds", "Latency", "m", b, 2);
    assert_non_null(c);
    assert_non_null(g);
    assert_non_null(h);
    specd_metric_add(c, SPECD_LABELS("a\"b", "OK"), 2);
    specd_metric_add(c, SPECD_LABELS("x\\y\nz", "OK"), 1);
    specd_metric_add(c, SPECD_LABELS("a\"b", "OK"), 0.5);
    specd_metric_add(c, SPECD_LABELS("a\"b", "OK"), -7); /* counters never go down */
    specd_metric_set(g, NULL, 3);
    specd_metric_gauge_add(g, NULL, -1);
    specd_metric_observe(h, SPECD_LABELS("v"), 0.05);
    specd_metric_observe(h, SPECD_LABELS("v"), 0.1); /* le is inclusive */
    specd_metric_observe(h, SPECD_LABELS("v"), 0.5);
    specd_metric_observe(h, SPECD_LABELS("v"), 30);
    size_t len = 0;
    char *text = specd_metrics_render(r, &len);
    assert_non_null(text);
    const char *want =
        "# HELP specd_metrics_dropped_series_total Label combinations not recorded because a "
        "metric already had its maximum number of series\n"
        "# TYPE specd_metrics_dropped_series_total counter\n"
        "specd_metrics_dropped_series_total 0\n"
        "# HELP t_requests_total Requests \\\\ by\\nkind\n"
        "# TYPE t_requests_total counter\n"
        "t_requests_total{kind=\"a\\\"b\",code=\"OK\"} 2.5\n"
        "t_requests_total{kind=\"x\\\\y\\nz\",code=\"OK\"} 1\n"
        "# HELP t_sessions Sessions\n"
        "# TYPE t_sessions gauge\n"
        "t_sessions 2\n"
        "# HELP t_latency_seconds Latency\n"
        "# TYPE t_latency_seconds histogram\n"
        "t_latency_seconds_bucket{m=\"v\",le=\"0.1\"} 2\n"
        "t_latency_seconds_bucket{m=\"v\",le=\"1\"} 3\n"
        "t_latency_seconds_bucket{m=\"v\",le=\"+Inf\"} 4\n"
        "t_latency_seconds_sum{m=\"v\"} 30.65\n"
        "t_latency_seconds_count{m=\"v\"} 4\n";
    assert_string_equal(text, want);
    assert_int_equal(len, strlen(want));
    assert_true(specd_metric_value(c, SPECD_LABELS("a\"b", "OK")) == 2.5);
    assert_true(specd_metric_value(h, SPECD_LABELS("v")) == 4);
    assert_true(specd_metric_value(h, SPECD_LABELS("never")) == 0);
    free(text);
    specd_metrics_free(r);
}

static void test_registration_rules(void **state) {
    (void)state;
    specd_metrics *r = specd_metrics_new();
    specd_metric *a = specd_metrics_counter(r, "t_total", "x", "a");
    assert_ptr_equal(specd_metrics_counter(r, "t_total", "other help", "a"), a); /* idempotent */
    assert_null(specd_metrics_gauge(r, "t_total", "x", "a"));                    /* other type */
    assert_null(specd_metrics_counter(r, "t_total", "x", "b"));                  /* other labels */
    assert_null(specd_metrics_counter(r, "9bad", "x", NULL));
    assert_null(specd_metrics_counter(r, "bad-name", "x", NULL));
    assert_null(specd_metrics_counter(r, "t2_total", "x", "le"));      /* reserved */
    assert_null(specd_metrics_counter(r, "t3_total", "x", "a,,b"));    /* empty label */
    assert_null(specd_metrics_counter(r, "t4_total", "x", "a,b,c,d,e")); /* too many */
    const double unsorted[] = {1, 0.5};
    assert_null(specd_metrics_histogram(r, "t_h", "x", NULL, unsorted, 2));
    /* NULL metrics are accepted everywhere and do nothing */
    specd_metric_add(NULL, NULL, 1);
    specd_metric_observe(NULL, NULL, 1);
    specd_metric_set(NULL, NULL, 1);
    /* a gauge operation on a counter is ignored */
    specd_metric_set(a, SPECD_LABELS("x"), 5);
    assert_true(specd_metric_value(a, SPECD_LABELS("x")) == 0);
    specd_metrics_free(r);
}

static void test_series_cap(void **state) {
    (void)state;
    specd_metrics *r = specd_metrics_new();
    specd_metric *c = specd_metrics_counter(r, "t_total", "x", "id");
    char id[16];
    for (int i = 0; i < SPECD_METRIC_MAX_SERIES + 10; i++) {
        snprintf(id, sizeof id, "%d", i);
        specd_metric_add(c, SPECD_LABELS(id), 1);
    }
    specd_metric *dropped = specd_metrics_counter(r, "specd_metrics_dropped_series_total",
                                                  "Label combinations not recorded because a "
                                                  "metric already had its maximum number of "
                                                  "series", NULL);
    assert_true(specd_metric_value(dropped, NULL) == 10);
    /* an existing series still records */
    specd_metric_add(c, SPECD_LABELS("0"), 1);
    assert_true(specd_metric_value(c, SPECD_LABELS("0")) == 2);
    specd_metrics_free(r);
}

typedef struct {
    specd_metric *c, *h;
} hammer_arg;

#define HAMMER_THREADS 4
#define HAMMER_N 20000

static void *hammer(void *p) {
    hammer_arg *a = p;
    char lbl[8];
    for (int i = 0; i < HAMMER_N; i++) {
        snprintf(lbl, sizeof lbl, "%d", i % 3); /* series created concurrently too */
        specd_metric_add(a->c, SPECD_LABELS(lbl), 1);
        specd_metric_observe(a->h, NULL, 0.5);
    }
    return NULL;
}

static void test_concurrent_updates(void **state) {
    (void)state;
    specd_metrics *r = specd_metrics_new();
    const double b[] = {1};
    hammer_arg a = {specd_metrics_counter(r, "t_total", "x", "k"),
                    specd_metrics_histogram(r, "t_h", "x", NULL, b, 1)};
    pthread_t th[HAMMER_THREADS];
    for (int i = 0; i < HAMMER_THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, hammer, &a), 0);
    for (int i = 0; i < 5; i++) free(specd_metrics_render(r, NULL)); /* reads race with writes */
    for (int i = 0; i < HAMMER_THREADS; i++) pthread_join(th[i], NULL);
    double total = 0;
    for (int k = 0; k < 3; k++) {
        char lbl[8];
        snprintf(lbl, sizeof lbl, "%d", k);
        total += specd_metric_value(a.c, SPECD_LABELS(lbl));
    }
    assert_true(total == (double)HAMMER_THREADS * HAMMER_N);
    assert_true(specd_metric_value(a.h, NULL) == (double)HAMMER_THREADS * HAMMER_N);
    char *text = specd_metrics_render(r, NULL);
    char want[128];
    snprintf(want, sizeof want, "t_h_sum %d\n", HAMMER_THREADS * HAMMER_N / 2);
    assert_non_null(strstr(text, want));
    free(text);
    specd_metrics_free(r);
}

static void set_seven(void *arg) { specd_metric_set(arg, NULL, 7); }

static void test_hooks(void **state) {
    (void)state;
    specd_metrics *r = specd_metrics_new();
    specd_metric *g = specd_metrics_gauge(r, "t_g", "x", NULL);
    assert_int_equal(specd_metrics_add_hook(r, set_seven, g), 0);
    char *text = specd_metrics_render(r, NULL);
    assert_non_null(strstr(text, "\nt_g 7\n"));
    free(text);
    specd_metrics_remove_hook(r, set_seven, g);
    specd_metric_set(g, NULL, 1);
    text = specd_metrics_render(r, NULL);
    assert_non_null(strstr(text, "\nt_g 1\n"));
    free(text);
    specd_metric_zero(g);
    assert_true(specd_metric_value(g, NULL) == 0);
    specd_metrics_free(r);
}

/* ---- HTTP ------------------------------------------------------------------- */

static void test_http(void **state) {
    (void)state;
    specd_metrics *r = specd_metrics_new();
    specd_metric_add(specd_metrics_counter(r, "t_http_total", "x", NULL), NULL, 3);
    specd_error err = {{0}};
    specd_metrics_http *h = specd_metrics_http_start("127.0.0.1:0", r, &err);
    assert_non_null(h);
    int port = specd_metrics_http_port(h);
    assert_true(port > 0);
    static char buf[1 << 16];
    assert_true(test_http_raw(port, "GET /metrics HTTP/1.0\r\n\r\n", buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, "HTTP/1.0 200") ? buf : strstr(buf, "HTTP/1.1 200"));
    assert_non_null(strstr(buf, "text/plain; version=0.0.4"));
    assert_non_null(strstr(buf, "\r\n\r\n# HELP"));
    assert_non_null(strstr(buf, "\nt_http_total 3\n"));
    assert_true(test_http_raw(port, "GET /other HTTP/1.0\r\n\r\n", buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, " 404 "));
    assert_true(test_http_raw(port, "DELETE /metrics HTTP/1.0\r\n\r\n", buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, " 405 "));
    /* garbage is libmicrohttpd's to refuse; the daemon keeps serving */
    test_http_raw(port, "\x01\x02 nonsense\r\n\r\n", buf, sizeof buf);
    assert_true(test_http_raw(port, "GET /metrics HTTP/1.0\r\n\r\n", buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, " 200 "));
    specd_metrics_http_stop(h);

    /* bad addresses name the key */
    const char *bad[] = {"nocolon", "127.0.0.1:", "127.0.0.1:70000", "[::1:80", "h:8x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        assert_null(specd_metrics_http_start(bad[i], r, &err));
        assert_non_null(strstr(err.msg, "metrics.listen"));
    }
    specd_metrics_free(r);
}

/* ---- request log --------------------------------------------------------------- */

static void test_request_ids(void **state) {
    (void)state;
    char id[33];
    specd_request_id_new(id);
    assert_int_equal(strlen(id), 32);
    assert_true(specd_request_id_valid(id));
    char id2[33];
    specd_request_id_new(id2);
    assert_string_not_equal(id, id2);
    assert_true(specd_request_id_valid("abc-DEF_1.2:3"));
    assert_false(specd_request_id_valid(""));
    assert_false(specd_request_id_valid(NULL));
    assert_false(specd_request_id_valid("a b"));
    assert_false(specd_request_id_valid("a\"b"));
    assert_false(specd_request_id_valid("a\nb"));
    char longid[SPECD_REQUEST_ID_MAX + 2];
    memset(longid, 'a', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    assert_false(specd_request_id_valid(longid));
    longid[SPECD_REQUEST_ID_MAX] = 0;
    assert_true(specd_request_id_valid(longid));
}

static void test_log_lines(void **state) {
    (void)state;
    specd_log_field f[] = {SPECD_LOG_STR("id", "r1"), SPECD_LOG_STR("msg", "say \"hi\"\n"),
                           SPECD_LOG_INT("tokens", 64), SPECD_LOG_NUM("ms", 1.5),
                           SPECD_LOG_STR("absent", NULL)};
    specd_request_log_set_format(SPECD_LOG_JSON);
    char *line = specd_request_log_format("draft-svc", f, 5);
    cJSON *o = cJSON_Parse(line);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "service")->valuestring, "draft-svc");
    assert_string_equal(cJSON_GetObjectItem(o, "event")->valuestring, "request");
    assert_string_equal(cJSON_GetObjectItem(o, "msg")->valuestring, "say \"hi\"\n");
    assert_int_equal(cJSON_GetObjectItem(o, "tokens")->valueint, 64);
    assert_true(cJSON_GetObjectItem(o, "ms")->valuedouble == 1.5);
    assert_null(cJSON_GetObjectItem(o, "absent"));
    assert_non_null(cJSON_GetObjectItem(o, "ts"));
    assert_null(strchr(line, '\n')); /* one line */
    cJSON_Delete(o);
    free(line);
    specd_request_log_set_format(SPECD_LOG_TEXT);
    line = specd_request_log_format("target-svc", f, 5);
    assert_non_null(strstr(line, " target-svc request id=r1 msg=\"say \\\"hi\\\"\\x0a\" tokens=64 ms=1.5"));
    assert_null(strstr(line, "absent"));
    free(line);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_exact),     cmocka_unit_test(test_registration_rules),
        cmocka_unit_test(test_series_cap),       cmocka_unit_test(test_concurrent_updates),
        cmocka_unit_test(test_hooks),            cmocka_unit_test(test_http),
        cmocka_unit_test(test_request_ids),      cmocka_unit_test(test_log_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
