/* test_prometheus.c - both services scraped by a real Prometheus server.
 *
 * Starts target-svc and draft-svc (the build's binaries, on the default
 * model, plaintext on loopback, each with --metrics.listen), checks both
 * /metrics expositions with `promtool check metrics`, starts Debian's
 * `prometheus` on loopback (scrape interval 1 s, TSDB in a temp dir), waits
 * until it has scraped both, sends one Draft.Generate through `specd
 * generate --server`, and then asks Prometheus's HTTP API
 * (/api/v1/query) until the counters of both services have moved:
 * requests, generated tokens, verify steps, batch tokens, forward passes
 * and the gRPC OK count.
 *
 * Bounded: every wait has a deadline (the whole test takes a few seconds,
 * at most ~60 s when something is wrong; a failed wait names its query and
 * last value and prints every log and both expositions), children die with the test
 * (PR_SET_PDEATHSIG, and an atexit handler), the temp dir is removed.
 * Without prometheus/promtool on PATH the test exits 77, which CMake marks
 * as SKIPPED (never a silent pass); scripts/setup.sh installs them. */
#include <math.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <cmocka.h>
#include <netinet/in.h>

#include "tests/harness/svc.h"
#include "tests/harness/test_util.h"

#define SMOL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define SKIP_CODE 77
#define START_WAIT_S 30  /* services loading the model, Prometheus starting */
/* Many 1 s scrape intervals: a wait ends as soon as its value is there,
 * so the deadline costs a passing run nothing, and a loaded CI machine
 * (a serial ctest beside other jobs once failed one wait at 15 s) gets room */
#define SCRAPE_WAIT_S 30

static char tmpdir[] = "/tmp/specd-prom-XXXXXX";
#define MAX_KIDS 4
static pid_t kids[MAX_KIDS];
static int n_kids;
static int p_target, p_target_m, p_draft, p_draft_m, p_prom;

static void kill_kids(void) {
    for (int i = 0; i < n_kids; i++) {
        if (kids[i] <= 0) continue;
        kill(kids[i], SIGTERM);
        for (int t = 0; t < 50 && waitpid(kids[i], NULL, WNOHANG) == 0; t++) usleep(100000);
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
        kids[i] = 0;
    }
    n_kids = 0;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (tmpdir[strlen(tmpdir) - 1] != 'X' && system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", tmpdir);
}

/* Runs argv in the background, output into tmpdir/log_name. */
static pid_t spawn(char *const argv[], const char *log_name) {
    char log[256];
    snprintf(log, sizeof log, "%s/%s", tmpdir, log_name);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    if (pid > 0 && n_kids < MAX_KIDS) kids[n_kids++] = pid;
    return pid;
}

static void dump_log(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    char *text = test_read_file(path, NULL);
    fprintf(stderr, "---- %s ----\n%s\n", name, text ? text : "(none)");
    free(text);
}

/* GET path on 127.0.0.1:port: the HTTP status, and the body into a static
 * buffer (*body). */
static int http_get(int port, const char *path, const char **body) {
    static char buf[1 << 20];
    char req[2048];
    snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    *body = "";
    if (test_http_raw(port, req, buf, sizeof buf) <= 0) return -1;
    int status = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) return -1;
    char *b = strstr(buf, "\r\n\r\n");
    *body = b ? b + 4 : "";
    return status;
}

static int wait_http_ok(int port, const char *path, int seconds) {
    for (int i = 0; i < seconds * 10; i++) {
        const char *body;
        if (http_get(port, path, &body) == 200) return 0;
        usleep(100000);
    }
    return -1;
}

/* GET /api/v1/query for promql: the HTTP status (400 for a PromQL error),
 * the JSON body in *body. */
static int prom_get(const char *promql, const char **body) {
    char path[4096] = "/api/v1/query?query=";
    size_t n = strlen(path);
    for (const unsigned char *p = (const unsigned char *)promql; *p && n + 4 < sizeof path; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '_' || *p == '.')
            path[n++] = (char)*p;
        else
            n += (size_t)snprintf(path + n, sizeof path - n, "%%%02X", *p);
    }
    path[n] = 0;
    return http_get(p_prom, path, body);
}

/* The value of a PromQL query with a one-element vector result; NAN when
 * it has none (yet). */
static double prom_query(const char *promql) {
    const char *body;
    if (prom_get(promql, &body) != 200) return NAN;
    cJSON *j = cJSON_Parse(body);
    double v = NAN;
    cJSON *res = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "data"), "result");
    if (cJSON_GetArraySize(res) == 1) {
        cJSON *val = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 0), "value"), 1);
        if (cJSON_IsString(val)) v = strtod(val->valuestring, NULL);
    }
    cJSON_Delete(j);
    return v;
}

/* Every query of the Grafana dashboard (deploy/grafana/) is valid PromQL
 * over these metrics: Prometheus evaluates each without an error, with
 * Grafana's variables replaced ($__rate_interval by 1m, $namespace by .*),
 * and the tau panel has a value. */
static void check_dashboard(void) {
    char *text = test_read_file(test_path("deploy/grafana/specd-dashboard.json"), NULL);
    assert_non_null(text);
    cJSON *d = cJSON_Parse(text);
    assert_non_null(d);
    int n = 0;
    cJSON *panel;
    cJSON_ArrayForEach(panel, cJSON_GetObjectItem(d, "panels")) {
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(panel, "targets")) {
            const char *expr = cJSON_GetObjectItem(t, "expr")->valuestring;
            char q[2048];
            size_t k = 0;
            for (const char *p = expr; *p && k + 8 < sizeof q;) {
                if (!strncmp(p, "$__rate_interval", 16)) {
                    memcpy(q + k, "1m", 2), k += 2, p += 16;
                } else if (!strncmp(p, "$namespace", 10)) {
                    memcpy(q + k, ".*", 2), k += 2, p += 10;
                } else {
                    q[k++] = *p++;
                }
            }
            q[k] = 0;
            const char *body;
            int st = prom_get(q, &body);
            if (st != 200) fail_msg("dashboard panel '%s': %s -> HTTP %d: %s",
                                    cJSON_GetObjectItem(panel, "title")->valuestring, q, st, body);
            n++;
        }
    }
    assert_true(n >= 10);
    cJSON_Delete(d);
    free(text);
}

/* Waits until query > floor; the last value seen. */
static double wait_above(const char *promql, double floor, int seconds) {
    double v = NAN;
    for (int i = 0; i < seconds * 5; i++) {
        v = prom_query(promql);
        if (v > floor) break;
        usleep(200000);
    }
    return v;
}

/* Everything a failed wait needs to be diagnosed from a CI log alone. */
static void dump_all(void) {
    dump_log("target.log");
    dump_log("draft.log");
    dump_log("prometheus.log");
    const char *body;
    int st = http_get(p_target_m, "/metrics", &body);
    fprintf(stderr, "---- target /metrics (HTTP %d) ----\n%s\n", st, body);
    st = http_get(p_draft_m, "/metrics", &body);
    fprintf(stderr, "---- draft /metrics (HTTP %d) ----\n%s\n", st, body);
    st = prom_get("up", &body);
    fprintf(stderr, "---- prometheus 'up' (HTTP %d) ----\n%s\n", st, body);
}

/* wait_above, failing with the query and its last value. */
static double expect_above(const char *promql, double floor) {
    double v = wait_above(promql, floor, SCRAPE_WAIT_S);
    if (!(v > floor)) {
        dump_all();
        fail_msg("%s = %g after %d s, expected > %g", promql, v, SCRAPE_WAIT_S, floor);
    }
    return v;
}

/* `promtool check metrics` on the exposition of one service. */
static void promtool_check(int port, const char *name) {
    const char *body;
    assert_int_equal(http_get(port, "/metrics", &body), 200);
    char path[128], cmd[640];
    snprintf(path, sizeof path, "%s/%s.prom", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' > '%s.lint' 2>&1", path, path);
    int rc = system(cmd);
    if (rc != 0) {
        snprintf(path, sizeof path, "%s.prom.lint", name);
        dump_log(path);
    }
    assert_int_equal(rc, 0);
}

static void test_prometheus_scrapes_both(void **state) {
    (void)state;
    p_target = svc_free_port();
    p_target_m = svc_free_port();
    p_draft = svc_free_port();
    p_draft_m = svc_free_port();
    p_prom = svc_free_port();
    char a_listen[64], a_tm[64], a_draft[64], a_dm[64], a_targets[64], a_prom[64];
    snprintf(a_listen, sizeof a_listen, "--listen=127.0.0.1:%d", p_target);
    snprintf(a_tm, sizeof a_tm, "--metrics.listen=127.0.0.1:%d", p_target_m);
    snprintf(a_draft, sizeof a_draft, "--listen=127.0.0.1:%d", p_draft);
    snprintf(a_dm, sizeof a_dm, "--metrics.listen=127.0.0.1:%d", p_draft_m);
    snprintf(a_targets, sizeof a_targets, "--targets=127.0.0.1:%d", p_target);
    snprintf(a_prom, sizeof a_prom, "--web.listen-address=127.0.0.1:%d", p_prom);

    char *target[] = {SPECD_TARGET_SVC_PATH, "--model", (char *)test_path(SMOL),
                      "--tls.insecure=true", a_listen, a_tm, "--threads=1",
                      "--limits.max_sessions=4", "--limits.kv_memory=64MiB", "--limits.max_context=1024",
                      /* a short start-up cost curve: the sanitizer build runs
                       * the model ~20x slower, and this test is about metrics */
                      "--batching.calibrate_tokens=4",
                      "--log.format=json",
                      NULL};
    char *draft[] = {SPECD_DRAFT_SVC_PATH, "--tokenizer", (char *)test_path(SMOL),
                     "--tls.insecure=true", "--target.tls.insecure=true", a_draft, a_dm,
                     a_targets, "--drafter.default=ngram", "--threads=1", "--log.format=json",
                     NULL};
    assert_true(spawn(target, "target.log") > 0);
    assert_true(spawn(draft, "draft.log") > 0);
    if (wait_http_ok(p_target_m, "/metrics", START_WAIT_S) ||
        wait_http_ok(p_draft_m, "/metrics", START_WAIT_S)) {
        dump_log("target.log");
        dump_log("draft.log");
        fail_msg("the services' /metrics did not come up in %d s", START_WAIT_S);
    }

    char cfg[512], cfg_path[256], data[256], a_cfg[320], a_data[320];
    snprintf(cfg, sizeof cfg,
             "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
             "scrape_configs:\n"
             "  - job_name: target-svc\n    static_configs: [{targets: ['127.0.0.1:%d']}]\n"
             "  - job_name: draft-svc\n    static_configs: [{targets: ['127.0.0.1:%d']}]\n",
             p_target_m, p_draft_m);
    snprintf(cfg_path, sizeof cfg_path, "%s/prometheus.yml", tmpdir);
    snprintf(data, sizeof data, "%s/data", tmpdir);
    FILE *f = fopen(cfg_path, "w");
    assert_non_null(f);
    fputs(cfg, f);
    fclose(f);
    snprintf(a_cfg, sizeof a_cfg, "--config.file=%s", cfg_path);
    snprintf(a_data, sizeof a_data, "--storage.tsdb.path=%s", data);
    char *prom[] = {"prometheus", a_cfg, a_data, a_prom, "--log.level=warn", NULL};
    assert_true(spawn(prom, "prometheus.log") > 0);
    if (wait_http_ok(p_prom, "/-/ready", START_WAIT_S)) {
        dump_log("prometheus.log");
        fail_msg("prometheus was not ready in %d s", START_WAIT_S);
    }
    /* both scraped at least once, with the counter at its starting value */
    double up = expect_above("sum(up{job=~\"target-svc|draft-svc\"})", 1.5);
    assert_true(up == 2);
    double steps0 = expect_above("specd_target_verify_steps_total", -1);
    assert_true(steps0 == 0);
    /* before any request, the page gauges already show the whole pool free */
    expect_above("specd_target_kv_pages_free", 0.5);
    assert_true(expect_above("specd_target_kv_pages_used", -1) == 0);

    /* one request through draft-svc */
    char server[64], cmd[512];
    snprintf(server, sizeof server, "127.0.0.1:%d", p_draft);
    snprintf(cmd, sizeof cmd,
             "'%s' generate --server %s --insecure -n 12 'Repeat after me: one two three "
             "one two three' > '%s/client.log' 2>&1",
             SPECD_CLI_PATH, server, tmpdir);
    int rc = system(cmd);
    if (rc) dump_log("client.log");
    assert_int_equal(rc, 0);

    /* the counters moved, as Prometheus sees them */
    struct { const char *q; double floor; } moved[] = {
        {"sum(specd_draft_requests_total)", 0.5},
        {"sum(specd_draft_generated_tokens_total)", 0.5},
        {"sum(specd_draft_target_steps_total)", 0.5},
        {"sum(specd_draft_e2e_request_latency_seconds_count)", 0.5},
        {"sum(specd_draft_step_seconds_total{part=\"target_wait\"})", 0.0},
        {"sum(specd_draft_step_seconds_total{part=\"target_forward\"})", 0.0},
        {"specd_target_verify_steps_total", steps0},
        {"specd_target_batch_tokens_count", 0.5},
        {"specd_target_forward_seconds_count", 0.5},
        {"specd_target_kv_pages_free", 0.5},
        {"sum(specd_grpc_server_handled_total{grpc_method=\"/specd.v1.Draft/Generate\","
         "grpc_code=\"OK\"})", 0.5},
        {"sum(specd_grpc_server_handled_total{grpc_method=\"/specd.v1.Target/Verify\","
         "grpc_code=\"OK\"})", 0.5},
    };
    for (size_t i = 0; i < sizeof moved / sizeof moved[0]; i++)
        expect_above(moved[i].q, moved[i].floor);
    check_dashboard();
    /* and both expositions (now with labelled series and filled histograms)
     * pass Prometheus's own linter */
    promtool_check(p_target_m, "target");
    promtool_check(p_draft_m, "draft");

    /* one JSON log line per request on each side, joined by the request id
     * that draft-svc sent in the Verify stream's metadata */
    char path[256];
    snprintf(path, sizeof path, "%s/draft.log", tmpdir);
    char *dlog = test_read_file(path, NULL);
    snprintf(path, sizeof path, "%s/target.log", tmpdir);
    char *tlog = test_read_file(path, NULL);
    assert_non_null(dlog);
    assert_non_null(tlog);
    char *line = strstr(dlog, "{\"ts\"");
    assert_non_null(line);
    line[strcspn(line, "\n")] = 0;
    cJSON *j = cJSON_Parse(line);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "method")->valuestring, "/specd.v1.Draft/Generate");
    assert_string_equal(cJSON_GetObjectItem(j, "code")->valuestring, "OK");
    const char *id = cJSON_GetObjectItem(j, "id")->valuestring;
    char want[128];
    snprintf(want, sizeof want, "\"id\":\"%s\",\"method\":\"/specd.v1.Target/Verify\"", id);
    if (!strstr(tlog, want)) dump_log("target.log");
    assert_non_null(strstr(tlog, want));
    cJSON_Delete(j);
    free(dlog);
    free(tlog);
}

int main(void) {
    const char *need[] = {"prometheus", "promtool"};
    for (int i = 0; i < 2; i++) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "command -v %s > /dev/null 2>&1", need[i]);
        if (system(cmd) != 0) {
            printf("SKIPPED: %s is not installed (scripts/setup.sh installs the Debian "
                   "'prometheus' package)\n", need[i]);
            return SKIP_CODE;
        }
    }
    if (!test_file_exists(test_path(SMOL))) {
        printf("SKIPPED: %s is missing (scripts/fetch_model.sh fetches it)\n", SMOL);
        return SKIP_CODE;
    }
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    atexit(kill_kids);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prometheus_scrapes_both),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
