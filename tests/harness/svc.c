/* svc.c - see svc.h. */
#include "tests/harness/svc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include <cmocka.h>
#include <netinet/in.h>

#include "common/util/config.h"
#include "draft-svc/draft_config.h"
#include "draft-svc/draft_opts.h"
#include "grpc/health/v1/health.pb-c.h"
#include "tests/harness/test_util.h"

#define MAX_KIDS 8
static pid_t kids[MAX_KIDS];
static char kid_logs[MAX_KIDS][96];

int svc_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(fd, (struct sockaddr *)&a, &len))
        fail_msg("cannot find a free port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

void svc_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

double svc_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

specd_rpc_channel *svc_channel_to(const char *addr) {
    specd_error err = {{0}};
    specd_rpc_channel_opts co = {.target = addr, .insecure = 1};
    specd_rpc_channel *ch = specd_rpc_channel_create(&co, &err);
    if (!ch) fail_msg("channel to %s: %s", addr, err.msg);
    return ch;
}

pid_t svc_start_target(int port, const char *model, const char *const *extra) {
    char bin[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", bin, sizeof bin - 16);
    if (n <= 0) return 0;
    bin[n] = 0;
    char *slash = strrchr(bin, '/');
    if (!slash) return 0;
    strcpy(slash + 1, "target-svc");
    if (access(bin, X_OK)) return 0;
    char listen[64], log[96], model_arg[PATH_MAX + 16];
    snprintf(listen, sizeof listen, "--listen=127.0.0.1:%d", port);
    snprintf(log, sizeof log, "/tmp/specd-test-target-%d-%d.log", (int)getpid(), port);
    snprintf(model_arg, sizeof model_arg, "--model=%s", model);
    const char *argv[24] = {bin, model_arg, listen, "--tls.insecure=true"};
    int argc = 4;
    for (int i = 0; extra && extra[i] && argc < 23; i++) argv[argc++] = extra[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid < 0) fail_msg("fork: %s", strerror(errno));
    if (pid == 0) {
        /* Dies with the test process whatever ends it (a crash skips the
         * atexit handler and cmocka's teardown). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            dup2(fd, 1);
        }
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < MAX_KIDS; i++)
        if (!kids[i]) {
            kids[i] = pid;
            snprintf(kid_logs[i], sizeof kid_logs[i], "%s", log);
            break;
        }
    /* Up to 60 s: a start loads the model and times the start-up cost
     * probe's passes (scheduler.c calibrate), which a loaded machine
     * stretches (the real model took over 20 s beside two fuzzers); what
     * the tests time starts after this. */
    for (int i = 0; i < 3000; i++) {
        size_t len = 0;
        char *text = test_read_file(log, &len);
        int up = text && strstr(text, "serving");
        free(text);
        if (up) return pid;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            for (int k = 0; k < MAX_KIDS; k++)
                if (kids[k] == pid) kids[k] = 0;
            text = test_read_file(log, &len);
            fail_msg("target-svc exited at start: %s", text ? text : "(no log)");
        }
        svc_sleep_ms(20);
    }
    fail_msg("target-svc on port %d did not come up in 60 s", port);
    return 0;
}

void svc_kill(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
    for (int i = 0; i < MAX_KIDS; i++)
        if (kids[i] == pid) {
            kids[i] = 0;
            unlink(kid_logs[i]);
        }
}

void svc_kill_all(void) {
    for (int i = 0; i < MAX_KIDS; i++)
        if (kids[i] > 0) svc_kill(kids[i]);
}

void svc_generate(specd_rpc_channel *ch, const char *method,
                  const Specd__V1__GenerateRequest *req, svc_gen *o) {
    o->code = GRPC_STATUS_OK;
    o->detail[0] = 0;
    o->n_ids = o->finish = o->failovers = o->target_steps = o->generated = 0;
    atomic_store(&o->progress, 0);
    o->max_gap_ms = 0;
    double t_last = 0;
    specd_error err = {{0}};
    specd_rpc_stream *s = specd_rpc_stream_start(ch, method, 120000, &err);
    if (!s) {
        o->code = GRPC_STATUS_UNAVAILABLE;
        snprintf(o->detail, sizeof o->detail, "%s", err.msg);
        return;
    }
    if (specd_rpc_stream_send(s, &req->base, 1, &err) == SPECD_RPC_CIO_OK) {
        for (;;) {
            Specd__V1__GenerateResponse *r = NULL;
            specd_rpc_cio io = specd_rpc_stream_recv(s, &specd__v1__generate_response__descriptor,
                                                     (ProtobufCMessage **)&r, -1, &err);
            if (io == SPECD_RPC_CIO_INVALID) continue;
            if (io != SPECD_RPC_CIO_OK) break;
            if (r->n_token_ids) {
                double t = svc_now_ms();
                if (t_last > 0 && t - t_last > o->max_gap_ms) o->max_gap_ms = t - t_last;
                t_last = t;
            }
            for (size_t i = 0; i < r->n_token_ids && o->n_ids < SVC_MAXOUT; i++)
                o->ids[o->n_ids++] = r->token_ids[i];
            atomic_store(&o->progress, o->n_ids);
            if (r->finish_reason) o->finish = r->finish_reason;
            if (r->stats) {
                o->failovers = r->stats->failovers;
                o->target_steps = r->stats->target_steps;
                o->generated = r->stats->generated_tokens;
            }
            protobuf_c_message_free_unpacked(&r->base, NULL);
        }
    }
    o->code = specd_rpc_stream_finish(s, &err);
    if (o->code != GRPC_STATUS_OK) snprintf(o->detail, sizeof o->detail, "%s", err.msg);
    specd_rpc_stream_free(s);
}

static void *bg_main(void *arg) {
    svc_gen *o = arg;
    svc_generate(o->ch, o->method, o->req, o);
    atomic_store(&o->done, 1);
    return NULL;
}

void svc_generate_bg(specd_rpc_channel *ch, const char *method,
                     const Specd__V1__GenerateRequest *req, svc_gen *o) {
    o->ch = ch;
    o->method = method;
    o->req = req;
    atomic_init(&o->progress, 0);
    atomic_init(&o->done, 0);
    assert_int_equal(pthread_create(&o->th, NULL, bg_main, o), 0);
}

void svc_gen_join(svc_gen *o) { pthread_join(o->th, NULL); }

const char *svc_gen_message(const svc_gen *o) {
    char code[64];
    snprintf(code, sizeof code, "%s: ", specd_rpc_status_name(o->code));
    const char *p = strstr(o->detail, code);
    return p ? p + strlen(code) : o->detail;
}

int svc_health(specd_rpc_channel *ch, const char *service) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    Grpc__Health__V1__HealthCheckResponse *r = NULL;
    specd_error err = {{0}};
    grpc_status_code code = specd_rpc_unary(ch, "/grpc.health.v1.Health/Check", &req.base,
                                            &grpc__health__v1__health_check_response__descriptor,
                                            (ProtobufCMessage **)&r, 2000, &err);
    if (code != GRPC_STATUS_OK || !r) return -1;
    int st = (int)r->status;
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return st;
}

void svc_policy(specd_policy *p, char *const *table, int n) {
    specd_error err = {{0}};
    specd_draft_cfg c;
    specd_draft_opts o;
    if (specd_config_defaults(specd_draft_cfg_fields, specd_draft_cfg_n_fields, &c, &err) ||
        specd_draft_opts_from_config(&c, &o, &err))
        fail_msg("%s", err.msg);
    specd_config_free(specd_draft_cfg_fields, specd_draft_cfg_n_fields, &c);
    *p = o.policy;
    p->n_rules = 0;
    if (specd_policy_parse_table(p, table, n, "load_table", &err)) fail_msg("%s", err.msg);
}

double svc_wait_health(specd_rpc_channel *ch, const char *service, int want, int limit_ms) {
    double t0 = svc_now_ms();
    while (svc_now_ms() - t0 < limit_ms) {
        if (svc_health(ch, service) == want) return svc_now_ms() - t0;
        svc_sleep_ms(20);
    }
    return -1;
}
