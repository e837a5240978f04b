/* test_rpc_server.c - the gRPC server layer (common/rpc_*.c) against a real
 * gRPC client over loopback.
 *
 * Every server listens on 127.0.0.1:0 (an ephemeral loopback port, never any
 * other address). The client side is the project's client layer
 * (common/rpc/rpc_client.h, tested on its own in test_rpc_client.c); the
 * server and its channels come from tests/harness/rpc_fixture.h, and every
 * wait is bounded, so a bug shows up as a failed assertion, never as a hung
 * suite. Test methods live under
 * /specd.testing.Echo/ and move raw bytes; only the health service uses
 * protobuf.
 *
 * Covered: unary echo, server streaming order, bidi ping-pong, UNIMPLEMENTED,
 * deadline -> DEADLINE_EXCEEDED with the handler seeing the cancellation,
 * client cancel mid-stream (handler stops, callback fires once, call freed),
 * graceful shutdown draining a stream and cancelling past the grace,
 * RESOURCE_EXHAUSTED beyond max_calls, message size limits, health
 * Check/Watch, TLS and mutual TLS (tests/unit/certs/), option checks, the
 * protobuf-c helpers and the SIGTERM runner. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <grpc/grpc.h>

#include "common/rpc/rpc_client.h"
#include "common/rpc/rpc_health.h"
#include "common/rpc/rpc_server.h"
#include "grpc/health/v1/health.pb-c.h"
#include "tests/harness/rpc_fixture.h"
#include "tests/harness/svc.h"
#include "tests/harness/test_util.h"
#include "common/util/clock.h"

/* ---- what the handlers saw ------------------------------------------------------ */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int cancel_cb_count;
    int saw_cancel;
    int64_t deadline_left;
    specd_rpc_io last_io;
    int finish_rc;
    int done;
    int started;
} T = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void t_reset(void) {
    pthread_mutex_lock(&T.mu);
    T.cancel_cb_count = T.saw_cancel = T.done = T.started = 0;
    T.finish_rc = 99;
    T.deadline_left = 0;
    T.last_io = SPECD_RPC_IO_OK;
    pthread_mutex_unlock(&T.mu);
}

/* Waits (bounded) until *flag is non-zero; returns it. */
static int t_wait(int *flag, int ms) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&T.mu);
    while (!*flag && pthread_cond_timedwait(&T.cv, &T.mu, &dl) != ETIMEDOUT) {
    }
    int v = *flag;
    pthread_mutex_unlock(&T.mu);
    return v;
}

static void t_set(int *flag, int v) {
    pthread_mutex_lock(&T.mu);
    *flag = v;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
}

static void on_cancel_count(void *arg) {
    (void)arg;
    pthread_mutex_lock(&T.mu);
    T.cancel_cb_count++;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
}

/* ---- test handlers ---------------------------------------------------------------- */

/* Unary: the request back. */
static void h_unary(specd_rpc_call *c, void *u) {
    (void)u;
    size_t n;
    const uint8_t *req = specd_rpc_call_request(c, &n);
    if (specd_rpc_call_send(c, req, n) == SPECD_RPC_IO_OK)
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

/* Server streaming: request "N" -> messages "0".."N-1". */
static void h_count(specd_rpc_call *c, void *u) {
    (void)u;
    size_t n;
    const uint8_t *req = specd_rpc_call_request(c, &n);
    char num[16] = {0};
    memcpy(num, req, n < sizeof num - 1 ? n : sizeof num - 1);
    int count = atoi(num);
    for (int i = 0; i < count; i++) {
        char msg[16];
        int len = snprintf(msg, sizeof msg, "%d", i);
        if (specd_rpc_call_send(c, msg, (size_t)len) != SPECD_RPC_IO_OK) return;
    }
    specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

/* Bidi: "x" -> "pong:x" until the client half-closes. */
static void h_pingpong(specd_rpc_call *c, void *u) {
    (void)u;
    for (;;) {
        const uint8_t *buf;
        size_t n;
        specd_rpc_io r = specd_rpc_call_recv(c, &buf, &n, 5000);
        if (r == SPECD_RPC_IO_END) break;
        if (r != SPECD_RPC_IO_OK) {
            specd_rpc_call_finish(c, GRPC_STATUS_ABORTED, "recv failed");
            return;
        }
        char out[300];
        int len =
            snprintf(out, sizeof out, "pong:%.*s", (int)(n < 256 ? n : 256), (const char *)buf);
        if (specd_rpc_call_send(c, out, (size_t)len) != SPECD_RPC_IO_OK) return;
    }
    specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

/* Waits (at most 5 s) for the call to be cancelled, then tries to finish. */
static void h_stall(specd_rpc_call *c, void *u) {
    (void)u;
    pthread_mutex_lock(&T.mu);
    T.deadline_left = specd_rpc_call_deadline_ms_left(c);
    T.started = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
    specd_rpc_call_on_cancel(c, on_cancel_count, NULL);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 5;
    pthread_mutex_lock(&T.mu);
    while (!specd_rpc_call_is_cancelled(c) &&
           pthread_cond_timedwait(&T.cv, &T.mu, &dl) != ETIMEDOUT) {
    }
    T.saw_cancel = specd_rpc_call_is_cancelled(c);
    pthread_mutex_unlock(&T.mu);
    int rc = specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
    pthread_mutex_lock(&T.mu);
    T.finish_rc = rc;
    T.done = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
}

/* Streams until the call dies. */
static void h_forever(specd_rpc_call *c, void *u) {
    (void)u;
    specd_rpc_call_on_cancel(c, on_cancel_count, NULL);
    specd_rpc_io r;
    int i = 0;
    do {
        char msg[16];
        int len = snprintf(msg, sizeof msg, "m%d", i++);
        r = specd_rpc_call_send(c, msg, (size_t)len);
    } while (r == SPECD_RPC_IO_OK);
    pthread_mutex_lock(&T.mu);
    T.last_io = r;
    T.saw_cancel = specd_rpc_call_is_cancelled(c);
    T.done = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
}

/* 5 messages 60 ms apart: a stream still running when shutdown starts. */
static void h_slow(specd_rpc_call *c, void *u) {
    (void)u;
    t_set(&T.started, 1);
    for (int i = 0; i < 5; i++) {
        if (i) svc_sleep_ms(60);
        char msg[16];
        int len = snprintf(msg, sizeof msg, "s%d", i);
        if (specd_rpc_call_send(c, msg, (size_t)len) != SPECD_RPC_IO_OK) return;
    }
    int rc = specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
    pthread_mutex_lock(&T.mu);
    T.finish_rc = rc;
    T.done = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
}

/* Misuse: an oversize send, a send after finish, a double finish. */
static void h_misuse(specd_rpc_call *c, void *u) {
    size_t max = *(size_t *)u;
    uint8_t *big = calloc(1, max + 1);
    specd_rpc_io big_r = specd_rpc_call_send(c, big, max + 1);
    free(big);
    int ok = big_r == SPECD_RPC_IO_INVALID;
    ok &= specd_rpc_call_finish(c, ok ? GRPC_STATUS_OK : GRPC_STATUS_INTERNAL, NULL) == 0;
    ok &= specd_rpc_call_send(c, "x", 1) == SPECD_RPC_IO_INVALID;
    ok &= specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL) == -1;
    t_set(&T.done, ok ? 1 : -1);
}

/* Bidi: nothing arrives within 50 ms, so it finishes with the read still
 * pending; that read must complete and the call be freed anyway. */
static void h_recv_timeout(specd_rpc_call *c, void *u) {
    (void)u;
    const uint8_t *buf;
    size_t n;
    specd_rpc_io r = specd_rpc_call_recv(c, &buf, &n, 50);
    t_set(&T.done, r == SPECD_RPC_IO_TIMEOUT ? 1 : -1);
    specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

/* Returns without a status. */
static void h_silent(specd_rpc_call *c, void *u) {
    (void)c;
    (void)u;
}

/* ---- server fixture ------------------------------------------------------------ */

/* The running server's message limit: every test method's `user` (Misuse reads it). */
static size_t g_max_message;

static specd_rpc_server *server_new(specd_rpc_server_opts o) {
    static const rpc_fix_method methods[] = {
        {RPC_ECHO "Unary", SPECD_RPC_UNARY, h_unary},
        {RPC_ECHO "Count", SPECD_RPC_SERVER_STREAMING, h_count},
        {RPC_ECHO "PingPong", SPECD_RPC_BIDI_STREAMING, h_pingpong},
        {RPC_ECHO "Stall", SPECD_RPC_UNARY, h_stall},
        {RPC_ECHO "Forever", SPECD_RPC_SERVER_STREAMING, h_forever},
        {RPC_ECHO "Slow", SPECD_RPC_SERVER_STREAMING, h_slow},
        {RPC_ECHO "Misuse", SPECD_RPC_UNARY, h_misuse},
        {RPC_ECHO "Silent", SPECD_RPC_UNARY, h_silent},
        {RPC_ECHO "RecvTimeout", SPECD_RPC_BIDI_STREAMING, h_recv_timeout},
    };
    g_max_message = o.max_message_bytes ? o.max_message_bytes : SPECD_RPC_DEFAULT_MAX_MESSAGE;
    specd_rpc_server *s =
        rpc_fix_server(o, methods, sizeof methods / sizeof methods[0], &g_max_message);
    t_reset();
    return s;
}

/* ---- client helpers ---------------------------------------------------------------- */

/* The client side is the project's own client layer (common/rpc/rpc_client.c),
 * in its raw-bytes form since the test methods move raw bytes. None of these
 * tests needs C-core control the client layer lacks: what the server must
 * handle (cancel, deadline, half-close, unread responses, TLS refusals) is
 * all expressible through it. */

typedef struct ccall {
    specd_rpc_stream *st;
    char *msg; /* last received message, NUL-terminated */
    size_t msg_len;
} ccall;

static void cc_start(ccall *cc, specd_rpc_channel *ch, const char *method, int deadline_ms) {
    memset(cc, 0, sizeof *cc);
    specd_error err = {{0}};
    cc->st = specd_rpc_stream_start(ch, method, deadline_ms, &err);
    if (!cc->st) fail_msg("stream: %s", err.msg);
}

/* Sends one message (and the half-close if close). 1 on success. */
static int cc_send(ccall *cc, const void *buf, size_t len, int close) {
    return specd_rpc_stream_send_bytes(cc->st, buf, len, close, NULL) == SPECD_RPC_CIO_OK;
}

static int cc_send_str(ccall *cc, const char *s, int close) {
    return cc_send(cc, s, strlen(s), close);
}

static void cc_close(ccall *cc) {
    assert_int_equal(specd_rpc_stream_close_send(cc->st, NULL), SPECD_RPC_CIO_OK);
}

/* 1: a message in cc->msg; 0: end of stream or failure. Bounded by RPC_WAIT_MS. */
static int cc_recv(ccall *cc) {
    free(cc->msg);
    cc->msg = NULL;
    cc->msg_len = 0;
    uint8_t *buf;
    specd_rpc_cio r = specd_rpc_stream_recv_bytes(cc->st, &buf, &cc->msg_len, RPC_WAIT_MS, NULL);
    assert_int_not_equal(r, SPECD_RPC_CIO_TIMEOUT);
    cc->msg = (char *)buf;
    return r == SPECD_RPC_CIO_OK;
}

/* Waits for the status and frees the call. */
static grpc_status_code cc_end(ccall *cc) {
    specd_error err = {{0}};
    grpc_status_code st = specd_rpc_stream_finish(cc->st, &err);
    if (st != GRPC_STATUS_OK) fprintf(stderr, "  (client saw %s)\n", err.msg);
    specd_rpc_stream_free(cc->st);
    free(cc->msg);
    return st;
}

/* One unary call; the response (if any) is left in *resp (malloc'd). */
static grpc_status_code unary(specd_rpc_channel *ch, const char *method, const void *req,
                              size_t len, char **resp, size_t *resp_len, int deadline_ms) {
    uint8_t *buf;
    size_t n;
    specd_error err = {{0}};
    grpc_status_code st = specd_rpc_unary_bytes(ch, method, req, len, &buf, &n, deadline_ms, &err);
    if (st != GRPC_STATUS_OK) fprintf(stderr, "  (client saw %s)\n", err.msg);
    if (resp) {
        *resp = (char *)buf;
        *resp_len = n;
    } else {
        free(buf);
    }
    return st;
}

/* ---- tests: calls --------------------------------------------------------------- */

static void test_unary_echo(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    char *resp;
    size_t n;
    assert_int_equal(unary(ch, RPC_ECHO "Unary", "hello", 5, &resp, &n, 5000), GRPC_STATUS_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(resp, "hello", 5);
    free(resp);
    /* an empty message is a valid request and a valid response */
    assert_int_equal(unary(ch, RPC_ECHO "Unary", "", 0, &resp, &n, 5000), GRPC_STATUS_OK);
    assert_non_null(resp);
    assert_int_equal(n, 0);
    free(resp);
    /* a handler that forgets its status still ends the call */
    assert_int_equal(unary(ch, RPC_ECHO "Silent", "x", 1, NULL, NULL, 5000), GRPC_STATUS_UNKNOWN);
    rpc_fix_wait_idle(s);
    specd_rpc_stats st;
    specd_rpc_server_stats(s, &st);
    assert_int_equal(st.calls_started, 3);
    assert_int_equal(st.calls_cancelled, 0);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void test_server_streaming_order(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    ccall cc;
    cc_start(&cc, ch, RPC_ECHO "Count", 5000);
    cc_send_str(&cc, "200", 1);
    for (int i = 0; i < 200; i++) {
        char want[16];
        snprintf(want, sizeof want, "%d", i);
        assert_true(cc_recv(&cc));
        assert_string_equal(cc.msg, want);
    }
    assert_false(cc_recv(&cc));
    assert_int_equal(cc_end(&cc), GRPC_STATUS_OK);
    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void test_bidi_pingpong(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    ccall cc;
    cc_start(&cc, ch, RPC_ECHO "PingPong", 5000);
    for (int i = 0; i < 20; i++) {
        char ping[16], want[32];
        snprintf(ping, sizeof ping, "p%d", i);
        snprintf(want, sizeof want, "pong:p%d", i);
        assert_true(cc_send_str(&cc, ping, 0));
        assert_true(cc_recv(&cc));
        assert_string_equal(cc.msg, want);
    }
    cc_close(&cc);
    assert_false(cc_recv(&cc));
    assert_int_equal(cc_end(&cc), GRPC_STATUS_OK);
    rpc_fix_wait_idle(s);

    /* a recv that times out leaves the call live; finishing with that read
     * still pending ends the call cleanly while the client stays open */
    cc_start(&cc, ch, RPC_ECHO "RecvTimeout", 5000);
    assert_false(cc_recv(&cc)); /* the status arrives instead of a message */
    assert_int_equal(cc_end(&cc), GRPC_STATUS_OK);
    assert_int_equal(t_wait(&T.done, RPC_WAIT_MS), 1);
    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void test_unknown_method(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    assert_int_equal(unary(ch, RPC_ECHO "Nope", "x", 1, NULL, NULL, 5000),
                     GRPC_STATUS_UNIMPLEMENTED);
    assert_int_equal(unary(ch, "/other.Service/Unary", "x", 1, NULL, NULL, 5000),
                     GRPC_STATUS_UNIMPLEMENTED);
    rpc_fix_wait_idle(s);
    specd_rpc_stats st;
    specd_rpc_server_stats(s, &st);
    assert_int_equal(st.calls_rejected, 2);
    assert_int_equal(st.calls_started, 0);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void test_deadline_exceeded(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    int64_t t0 = specd_now_ms_int();
    assert_int_equal(unary(ch, RPC_ECHO "Stall", "x", 1, NULL, NULL, 300),
                     GRPC_STATUS_DEADLINE_EXCEEDED);
    int64_t took = specd_now_ms_int() - t0;
    assert_true(took < 3000);
    /* the handler saw the deadline, then the cancellation gRPC raised at it */
    assert_true(t_wait(&T.done, RPC_WAIT_MS));
    assert_true(T.deadline_left > 0 && T.deadline_left <= 300);
    assert_true(T.saw_cancel);
    assert_int_equal(T.finish_rc, -1);
    /* once the call is freed its callback has run, exactly once */
    rpc_fix_wait_idle(s);
    assert_int_equal(T.cancel_cb_count, 1);
    specd_rpc_stats st;
    specd_rpc_server_stats(s, &st);
    assert_int_equal(st.calls_cancelled, 1);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void test_client_cancel_mid_stream(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    ccall cc;
    cc_start(&cc, ch, RPC_ECHO "Forever", 5000);
    cc_send_str(&cc, "go", 1);
    for (int i = 0; i < 3; i++) {
        char want[16];
        snprintf(want, sizeof want, "m%d", i);
        assert_true(cc_recv(&cc));
        assert_string_equal(cc.msg, want);
    }
    int64_t t0 = specd_now_ms_int();
    specd_rpc_stream_cancel(cc.st);
    assert_int_equal(cc_end(&cc), GRPC_STATUS_CANCELLED);
    /* promptly: the handler's blocked send returns CANCELLED */
    assert_true(t_wait(&T.done, RPC_WAIT_MS));
    assert_true(specd_now_ms_int() - t0 < 2000);
    assert_int_equal(T.last_io, SPECD_RPC_IO_CANCELLED);
    assert_true(T.saw_cancel);
    /* and everything the call held is freed, after its callback ran once */
    rpc_fix_wait_idle(s);
    assert_int_equal(T.cancel_cb_count, 1);
    specd_rpc_stats st;
    specd_rpc_server_stats(s, &st);
    assert_int_equal(st.calls_cancelled, 1);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void test_max_calls_resource_exhausted(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){.max_calls = 1});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    ccall busy;
    cc_start(&busy, ch, RPC_ECHO "Stall", 5000);
    cc_send_str(&busy, "x", 1);
    assert_true(t_wait(&T.started, RPC_WAIT_MS));
    assert_int_equal(unary(ch, RPC_ECHO "Unary", "x", 1, NULL, NULL, 5000),
                     GRPC_STATUS_RESOURCE_EXHAUSTED);
    specd_rpc_stream_cancel(busy.st);
    assert_int_equal(cc_end(&busy), GRPC_STATUS_CANCELLED);
    assert_true(t_wait(&T.done, RPC_WAIT_MS));
    rpc_fix_wait_idle(s);
    /* the slot is free again */
    assert_int_equal(unary(ch, RPC_ECHO "Unary", "x", 1, NULL, NULL, 5000), GRPC_STATUS_OK);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void test_message_size_limits(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){.max_message_bytes = 1024});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    char big[2000];
    memset(big, 'a', sizeof big);
    /* gRPC refuses the oversize request before any handler runs */
    assert_int_equal(unary(ch, RPC_ECHO "Unary", big, sizeof big, NULL, NULL, 5000),
                     GRPC_STATUS_RESOURCE_EXHAUSTED);
    char *resp;
    size_t n;
    assert_int_equal(unary(ch, RPC_ECHO "Unary", big, 1024, &resp, &n, 5000), GRPC_STATUS_OK);
    assert_int_equal(n, 1024);
    free(resp);
    /* the handler's oversize send is refused; send/finish after finish too.
     * It ends with OK and no response, which the client layer's unary call
     * would report as INTERNAL (a unary call owes a response), so read the
     * status the server put on the wire through a stream instead. */
    ccall cc;
    cc_start(&cc, ch, RPC_ECHO "Misuse", 5000);
    assert_true(cc_send_str(&cc, "x", 1));
    assert_false(cc_recv(&cc));
    assert_int_equal(cc_end(&cc), GRPC_STATUS_OK);
    assert_int_equal(t_wait(&T.done, RPC_WAIT_MS), 1);
    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

typedef struct {
    specd_rpc_channel *ch;
    int id, ok;
} load_arg;

static void *load_thread(void *p) {
    load_arg *a = p;
    for (int i = 0; i < 20; i++) {
        char req[32], *resp = NULL;
        size_t n = 0;
        int len = snprintf(req, sizeof req, "t%d-%d", a->id, i);
        if (i % 2) {
            /* a short stream every other call */
            ccall cc;
            cc_start(&cc, a->ch, RPC_ECHO "Count", 5000);
            cc_send_str(&cc, "5", 1);
            int got = 0;
            while (cc_recv(&cc)) got++;
            a->ok += cc_end(&cc) == GRPC_STATUS_OK && got == 5;
        } else {
            grpc_status_code st = unary(a->ch, RPC_ECHO "Unary", req, (size_t)len, &resp, &n, 5000);
            a->ok += st == GRPC_STATUS_OK && n == (size_t)len && !memcmp(resp, req, n);
            free(resp);
        }
    }
    return NULL;
}

/* Several clients at once, unary and streaming mixed, over one channel:
 * every call right, and nothing left behind. */
static void test_concurrent_calls(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    enum { N = 8 };
    load_arg a[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        a[i] = (load_arg){.ch = ch, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, load_thread, &a[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].ok, 20);
    }
    rpc_fix_wait_idle(s);
    specd_rpc_stats st;
    specd_rpc_server_stats(s, &st);
    assert_int_equal(st.calls_started, N * 20);
    assert_int_equal(st.calls_cancelled, 0);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

/* ---- tests: shutdown ---------------------------------------------------------- */

typedef struct {
    specd_rpc_server *s;
    int grace_ms;
    int64_t took_ms;
} shutdown_arg;

static void *shutdown_thread(void *p) {
    shutdown_arg *a = p;
    int64_t t0 = specd_now_ms_int();
    specd_rpc_server_shutdown(a->s, a->grace_ms);
    a->took_ms = specd_now_ms_int() - t0;
    return NULL;
}

static void test_graceful_shutdown_drains(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    int port = specd_rpc_server_port(s);
    specd_rpc_channel *ch = rpc_fix_channel_plain(port, 0);
    ccall cc;
    cc_start(&cc, ch, RPC_ECHO "Slow", 5000);
    cc_send_str(&cc, "go", 1);
    assert_true(cc_recv(&cc));
    assert_string_equal(cc.msg, "s0");
    /* shutdown starts with the stream in flight */
    shutdown_arg a = {.s = s, .grace_ms = 5000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, shutdown_thread, &a), 0);
    for (int i = 1; i < 5; i++) {
        char want[16];
        snprintf(want, sizeof want, "s%d", i);
        assert_true(cc_recv(&cc));
        assert_string_equal(cc.msg, want);
    }
    assert_false(cc_recv(&cc));
    assert_int_equal(cc_end(&cc), GRPC_STATUS_OK);
    pthread_join(th, NULL);
    assert_true(t_wait(&T.done, RPC_WAIT_MS));
    assert_int_equal(T.finish_rc, 0);
    /* it ended because the call finished, not because the grace ran out */
    assert_true(a.took_ms < 4000);
    /* nothing listens any more */
    assert_int_not_equal(unary(ch, RPC_ECHO "Unary", "x", 1, NULL, NULL, 1000), GRPC_STATUS_OK);
    specd_rpc_stats st;
    specd_rpc_server_stats(s, &st);
    assert_int_equal(st.calls_live, 0);
    assert_int_equal(st.handlers_running, 0);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s); /* after shutdown: frees only */
}

static void test_shutdown_cancels_after_grace(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    ccall cc;
    cc_start(&cc, ch, RPC_ECHO "Stall", 8000);
    cc_send_str(&cc, "x", 1);
    assert_true(t_wait(&T.started, RPC_WAIT_MS));
    int64_t t0 = specd_now_ms_int();
    specd_rpc_server_shutdown(s, 200);
    int64_t took = specd_now_ms_int() - t0;
    assert_true(took >= 150 && took < 3000);
    assert_true(T.done);
    assert_true(T.saw_cancel);
    assert_int_equal(T.cancel_cb_count, 1);
    assert_int_not_equal(cc_end(&cc), GRPC_STATUS_OK);
    /* a second shutdown is a no-op */
    specd_rpc_server_shutdown(s, 1000);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

/* ---- tests: health ---------------------------------------------------------------- */

static grpc_status_code health_check(specd_rpc_channel *ch, const char *service, int *status) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    ProtobufCMessage *resp;
    specd_error err = {{0}};
    grpc_status_code st =
        specd_rpc_unary(ch, "/grpc.health.v1.Health/Check", &req.base,
                        &grpc__health__v1__health_check_response__descriptor, &resp, 5000, &err);
    *status = -1;
    if (resp) {
        *status = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return st;
}

enum {
    H_SERVING = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING,
    H_NOT_SERVING = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING,
    H_UNKNOWN = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN,
};

static void test_health_check(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    int st;
    assert_int_equal(health_check(ch, "", &st), GRPC_STATUS_OK);
    assert_int_equal(st, H_SERVING);
    specd_rpc_set_health(s, "specd.v1.Target", 0);
    assert_int_equal(health_check(ch, "specd.v1.Target", &st), GRPC_STATUS_OK);
    assert_int_equal(st, H_NOT_SERVING);
    specd_rpc_set_health(s, "specd.v1.Target", 1);
    assert_int_equal(health_check(ch, "specd.v1.Target", &st), GRPC_STATUS_OK);
    assert_int_equal(st, H_SERVING);
    assert_int_equal(health_check(ch, "no.such.Service", &st), GRPC_STATUS_NOT_FOUND);
    /* garbage is INVALID_ARGUMENT, not a crash */
    assert_int_equal(unary(ch, "/grpc.health.v1.Health/Check", "\xff\xff\xff", 3, NULL, NULL, 5000),
                     GRPC_STATUS_INVALID_ARGUMENT);
    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static int watch_next(ccall *cc) {
    ProtobufCMessage *m;
    specd_rpc_cio r = specd_rpc_stream_recv(
        cc->st, &grpc__health__v1__health_check_response__descriptor, &m, RPC_WAIT_MS, NULL);
    assert_int_not_equal(r, SPECD_RPC_CIO_TIMEOUT);
    assert_int_not_equal(r, SPECD_RPC_CIO_INVALID);
    if (r != SPECD_RPC_CIO_OK) return -1;
    int st = ((Grpc__Health__V1__HealthCheckResponse *)m)->status;
    protobuf_c_message_free_unpacked(m, NULL);
    return st;
}

static void watch_start(ccall *cc, specd_rpc_channel *ch, const char *service) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    cc_start(cc, ch, "/grpc.health.v1.Health/Watch", 8000);
    assert_int_equal(specd_rpc_stream_send(cc->st, &req.base, 1, NULL), SPECD_RPC_CIO_OK);
}

static void test_health_watch(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    specd_rpc_set_health(s, "svc", 1);
    ccall w;
    watch_start(&w, ch, "svc");
    assert_int_equal(watch_next(&w), H_SERVING);
    specd_rpc_set_health(s, "svc", 0);
    assert_int_equal(watch_next(&w), H_NOT_SERVING);
    specd_rpc_set_health(s, "svc", 0); /* no change, no message */
    specd_rpc_set_health(s, "svc", 1);
    assert_int_equal(watch_next(&w), H_SERVING);
    specd_rpc_stream_cancel(w.st);
    assert_int_equal(cc_end(&w), GRPC_STATUS_CANCELLED);
    rpc_fix_wait_idle(s); /* the cancelled watcher woke up and ended */

    /* an unknown name is SERVICE_UNKNOWN until it is set */
    watch_start(&w, ch, "later");
    assert_int_equal(watch_next(&w), H_UNKNOWN);
    specd_rpc_set_health(s, "later", 1);
    assert_int_equal(watch_next(&w), H_SERVING);
    /* shutdown: the watcher hears NOT_SERVING, then the stream ends, and
     * the stop is quick, not held up for the whole grace period */
    int64_t t0 = specd_now_ms_int();
    shutdown_arg a = {.s = s, .grace_ms = 5000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, shutdown_thread, &a), 0);
    assert_int_equal(watch_next(&w), H_NOT_SERVING);
    assert_int_equal(watch_next(&w), -1);
    assert_int_equal(cc_end(&w), GRPC_STATUS_UNAVAILABLE);
    pthread_join(th, NULL);
    assert_true(specd_now_ms_int() - t0 < 4000);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

/* ---- tests: TLS ------------------------------------------------------------------- */

static void test_tls(void **state) {
    (void)state;
    specd_rpc_server *s = server_new(rpc_fix_tls_opts(0));
    int port = specd_rpc_server_port(s);
    specd_rpc_channel *ch = rpc_fix_channel_tls(port, NULL, "localhost");
    char *resp;
    size_t n;
    assert_int_equal(unary(ch, RPC_ECHO "Unary", "secret", 6, &resp, &n, 5000), GRPC_STATUS_OK);
    assert_int_equal(n, 6);
    assert_memory_equal(resp, "secret", 6);
    free(resp);
    specd_rpc_channel_free(ch);
    /* a plaintext client gets nowhere */
    ch = rpc_fix_channel_plain(port, 0);
    assert_int_not_equal(unary(ch, RPC_ECHO "Unary", "x", 1, NULL, NULL, 2000), GRPC_STATUS_OK);
    specd_rpc_channel_free(ch);
    specd_rpc_stats st;
    specd_rpc_server_stats(s, &st);
    assert_int_equal(st.calls_started, 1);
    specd_rpc_server_destroy(s);
}

static void test_mutual_tls(void **state) {
    (void)state;
    specd_rpc_server *s = server_new(rpc_fix_tls_opts(1));
    int port = specd_rpc_server_port(s);
    specd_rpc_channel *ch = rpc_fix_channel_tls(port, "client", "localhost");
    assert_int_equal(unary(ch, RPC_ECHO "Unary", "x", 1, NULL, NULL, 5000), GRPC_STATUS_OK);
    specd_rpc_channel_free(ch);
    /* no client certificate: refused in the handshake */
    ch = rpc_fix_channel_tls(port, NULL, "localhost");
    assert_int_not_equal(unary(ch, RPC_ECHO "Unary", "x", 1, NULL, NULL, 2000), GRPC_STATUS_OK);
    specd_rpc_channel_free(ch);
    /* a certificate the client CA did not sign: refused too */
    ch = rpc_fix_channel_tls(port, "rogue", "localhost");
    assert_int_not_equal(unary(ch, RPC_ECHO "Unary", "x", 1, NULL, NULL, 2000), GRPC_STATUS_OK);
    specd_rpc_channel_free(ch);
    specd_rpc_stats st;
    specd_rpc_server_stats(s, &st);
    assert_int_equal(st.calls_started, 1); /* no handler ever ran for the refused */
    specd_rpc_server_destroy(s);
}

/* ---- tests: options, registration, codec, signals ------------------------------ */

static void expect_create_error(specd_rpc_server_opts o, const char *needle) {
    specd_error err = {{0}};
    specd_rpc_server *s = specd_rpc_server_create(&o, &err);
    assert_null(s);
    if (!strstr(err.msg, needle)) fprintf(stderr, "message was: %s\n", err.msg);
    assert_non_null(strstr(err.msg, needle));
}

static void test_options_and_registration(void **state) {
    (void)state;
    /* plaintext only on request */
    expect_create_error((specd_rpc_server_opts){.listen_addr = "127.0.0.1:0"}, "insecure = 1");
    specd_rpc_server_opts both = rpc_fix_tls_opts(0);
    both.listen_addr = "127.0.0.1:0";
    both.insecure = 1;
    expect_create_error(both, "choose one");
    expect_create_error((specd_rpc_server_opts){.listen_addr = "127.0.0.1:0",
                                                .tls_cert_path = "/nonexistent/cert.pem",
                                                .tls_key_path = "/nonexistent/key.pem"},
                        "/nonexistent/cert.pem");
    expect_create_error((specd_rpc_server_opts){.insecure = 1}, "listen_addr");
    /* a PEM that is not a usable key: the listener cannot be built */
    specd_rpc_server_opts bad = rpc_fix_tls_opts(0);
    bad.listen_addr = "127.0.0.1:0";
    const char *junk = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
    bad.tls_key_path = test_write_temp(junk, strlen(junk), ".key");
    expect_create_error(bad, "cannot listen");
    /* a port in use is an error, not a shared port */
    specd_rpc_server *a = server_new((specd_rpc_server_opts){0});
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", specd_rpc_server_port(a));
    expect_create_error((specd_rpc_server_opts){.listen_addr = addr, .insecure = 1},
                        "cannot listen");
    /* registration: duplicates, bad paths, after start */
    assert_int_equal(specd_rpc_register(a, RPC_ECHO "Late", SPECD_RPC_UNARY, h_unary, NULL), -1);
    specd_rpc_server_destroy(a);
    specd_error err;
    specd_rpc_server *b = specd_rpc_server_create(
        &(specd_rpc_server_opts){.listen_addr = "127.0.0.1:0", .insecure = 1}, &err);
    assert_non_null(b);
    assert_int_equal(specd_rpc_register(b, RPC_ECHO "A", SPECD_RPC_UNARY, h_unary, NULL), 0);
    assert_int_equal(specd_rpc_register(b, RPC_ECHO "A", SPECD_RPC_UNARY, h_unary, NULL), -1);
    assert_int_equal(specd_rpc_register(b, "NoSlash", SPECD_RPC_UNARY, h_unary, NULL), -1);
    assert_int_equal(specd_rpc_register(b, "/NoMethod", SPECD_RPC_UNARY, h_unary, NULL), -1);
    /* the built-in health service owns its paths */
    assert_int_equal(
        specd_rpc_register(b, "/grpc.health.v1.Health/Check", SPECD_RPC_UNARY, h_unary, NULL), -1);
    /* destroyed without ever starting */
    specd_rpc_server_destroy(b);
    specd_rpc_server_destroy(NULL);
}

static void test_codec_limits(void **state) {
    (void)state;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "specd.v1.Target";
    specd_error err = {{0}};
    size_t len;
    uint8_t *buf = specd_rpc_pack(&req.base, 1024, &len, &err);
    assert_non_null(buf);
    assert_int_equal(len, 2 + strlen(req.service));
    assert_null(specd_rpc_pack(&req.base, len - 1, &len, &err));
    assert_non_null(strstr(err.msg, "grpc.health.v1.HealthCheckRequest"));
    ProtobufCMessage *m;
    assert_int_equal(specd_rpc_unpack(&grpc__health__v1__health_check_request__descriptor, buf, 17,
                                      16, &m, &err),
                     -1);
    assert_null(m);
    assert_non_null(strstr(err.msg, "exceeds"));
    assert_int_equal(specd_rpc_unpack(&grpc__health__v1__health_check_request__descriptor, buf, 5,
                                      1024, &m, &err),
                     -1); /* truncated string */
    assert_non_null(strstr(err.msg, "malformed"));
    char *service;
    assert_int_equal(specd_rpc_health_parse_request(buf, 17, &service, &err), 0);
    assert_string_equal(service, "specd.v1.Target");
    free(service);
    assert_int_equal(specd_rpc_health_parse_request(NULL, 0, &service, &err), 0);
    assert_string_equal(service, "");
    free(service);
    free(buf);
}

typedef struct {
    specd_rpc_server *s;
    int sig;
} signal_arg;

static void *signal_thread(void *p) {
    signal_arg *a = p;
    a->sig = specd_rpc_server_run_until_signal(a->s, 1000);
    return NULL;
}

static void test_run_until_signal(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    signal_arg a = {.s = s, .sig = 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, signal_thread, &a), 0);
    /* send SIGTERM only once the runner's handler is in place */
    struct sigaction cur;
    int64_t end = specd_now_ms_int() + RPC_WAIT_MS;
    do {
        svc_sleep_ms(2);
        sigaction(SIGTERM, NULL, &cur);
    } while (cur.sa_handler == SIG_DFL && specd_now_ms_int() < end);
    assert_true(cur.sa_handler != SIG_DFL);
    kill(getpid(), SIGTERM);
    pthread_join(th, NULL);
    assert_int_equal(a.sig, SIGTERM);
    /* the previous disposition is back, and the server is stopped */
    sigaction(SIGTERM, NULL, &cur);
    assert_true(cur.sa_handler == SIG_DFL);
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    assert_int_not_equal(unary(ch, RPC_ECHO "Unary", "x", 1, NULL, NULL, 1000), GRPC_STATUS_OK);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary_echo),
        cmocka_unit_test(test_server_streaming_order),
        cmocka_unit_test(test_bidi_pingpong),
        cmocka_unit_test(test_unknown_method),
        cmocka_unit_test(test_deadline_exceeded),
        cmocka_unit_test(test_client_cancel_mid_stream),
        cmocka_unit_test(test_max_calls_resource_exhausted),
        cmocka_unit_test(test_message_size_limits),
        cmocka_unit_test(test_concurrent_calls),
        cmocka_unit_test(test_graceful_shutdown_drains),
        cmocka_unit_test(test_shutdown_cancels_after_grace),
        cmocka_unit_test(test_health_check),
        cmocka_unit_test(test_health_watch),
        cmocka_unit_test(test_tls),
        cmocka_unit_test(test_mutual_tls),
        cmocka_unit_test(test_options_and_registration),
        cmocka_unit_test(test_codec_limits),
        cmocka_unit_test(test_run_until_signal),
    };
    return cmocka_run_group_tests(tests, rpc_fix_suite_setup, rpc_fix_suite_teardown);
}
