/* test_rpc_client.c - the gRPC client layer (common/rpc/rpc_client.c) against
 * the project's own server layer over loopback.
 *
 * Every server listens on 127.0.0.1:0. The test methods live under
 * /specd.testing.Echo/ and carry grpc.health.v1.HealthCheckRequest as a
 * generic one-string message (its `service` field), so both sides go
 * through protobuf-c like the real services do; the built-in health service
 * is called for real once. The server and its channels come from
 * tests/harness/rpc_fixture.h. Every wait is bounded, so a bug fails an
 * assertion instead of hanging the suite.
 *
 * Covered: unary OK and error status passthrough (code and message), an
 * unknown method, server streaming of N messages then END + OK, bidi
 * ping-pong, an error status mid-stream, a message that does not decode,
 * recv timeout then a later success (the read stays pending), cancel from
 * another thread while recv blocks (prompt FAILED, the handler sees the
 * cancellation), finish on a live stream, deadline -> DEADLINE_EXCEEDED
 * (unary and stream), a port nobody listens on -> UNAVAILABLE at once,
 * server shutdown mid-stream -> FAILED / UNAVAILABLE, TLS and mutual TLS
 * (a client without a certificate, or with one the CA did not sign, is
 * refused), message size limits both ways, option checks and misuse. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <grpc/grpc.h>

#include "common/rpc/rpc_client.h"
#include "common/rpc/rpc_server.h"
#include "grpc/health/v1/health.pb-c.h"
#include "tests/harness/rpc_fixture.h"
#include "tests/harness/svc.h"
#include "tests/harness/test_util.h"
#include "common/util/clock.h"

typedef Grpc__Health__V1__HealthCheckRequest Msg;
#define MSG_DESC (&grpc__health__v1__health_check_request__descriptor)

/* ---- what the handlers saw ---------------------------------------------------------- */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started;   /* a Stall handler is running */
    int done;      /* ... and has returned */
    int saw_cancel;
} T = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void t_reset(void) {
    pthread_mutex_lock(&T.mu);
    T.started = T.done = T.saw_cancel = 0;
    pthread_mutex_unlock(&T.mu);
}

static void t_set(int *flag) {
    pthread_mutex_lock(&T.mu);
    *flag = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
}

/* Waits (bounded) until *flag is set; returns it. */
static int t_wait(int *flag) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += RPC_WAIT_MS / 1000;
    pthread_mutex_lock(&T.mu);
    while (!*flag && pthread_cond_timedwait(&T.cv, &T.mu, &dl) != ETIMEDOUT) {
    }
    int v = *flag;
    pthread_mutex_unlock(&T.mu);
    return v;
}

/* ---- test handlers -------------------------------------------------------------------- */

static Msg msg_of(const char *s) {
    Msg m = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    m.service = (char *)s;
    return m;
}

static int send_str(specd_rpc_call *c, const char *s) {
    Msg m = msg_of(s);
    return specd_rpc_call_send_msg(c, &m.base) == SPECD_RPC_IO_OK;
}

/* The request's string (malloc'd), or NULL after finishing the call with
 * INVALID_ARGUMENT. */
static char *request_str(specd_rpc_call *c) {
    ProtobufCMessage *m;
    specd_error err;
    if (specd_rpc_call_request_msg(c, MSG_DESC, &m, &err)) {
        specd_rpc_call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, err.msg);
        return NULL;
    }
    char *s = strdup(((Msg *)m)->service);
    protobuf_c_message_free_unpacked(m, NULL);
    return s;
}

/* Unary: the request back; "fail:WHAT" ends with INVALID_ARGUMENT naming WHAT. */
static void h_echo(specd_rpc_call *c, void *u) {
    (void)u;
    char *s = request_str(c);
    if (!s) return;
    if (!strncmp(s, "fail:", 5)) {
        char why[300];
        snprintf(why, sizeof why, "bad field %.200s", s + 5);
        specd_rpc_call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, why);
    } else if (send_str(c, s)) {
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
    }
    free(s);
}

/* Server streaming: "N" -> "0".."N-1". */
static void h_count(specd_rpc_call *c, void *u) {
    (void)u;
    char *s = request_str(c);
    if (!s) return;
    int n = atoi(s);
    free(s);
    for (int i = 0; i < n; i++) {
        char num[16];
        snprintf(num, sizeof num, "%d", i);
        if (!send_str(c, num)) return;
    }
    specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

/* Bidi: "x" -> "pong:x" until the half-close; "abort" ends with ABORTED. */
static void h_pingpong(specd_rpc_call *c, void *u) {
    (void)u;
    for (;;) {
        ProtobufCMessage *m;
        specd_rpc_io r = specd_rpc_call_recv_msg(c, MSG_DESC, &m, RPC_WAIT_MS, NULL);
        if (r == SPECD_RPC_IO_END) break;
        if (r != SPECD_RPC_IO_OK) {
            specd_rpc_call_finish(c, GRPC_STATUS_INTERNAL, "recv failed");
            return;
        }
        const char *s = ((Msg *)m)->service;
        if (!strcmp(s, "abort3")) {
            /* three answers, then an error status without reading on */
            protobuf_c_message_free_unpacked(m, NULL);
            for (int i = 0; i < 3; i++)
                if (!send_str(c, "before abort")) return;
            specd_rpc_call_finish(c, GRPC_STATUS_ABORTED, "aborted after 3");
            return;
        }
        if (!strcmp(s, "abort")) {
            protobuf_c_message_free_unpacked(m, NULL);
            specd_rpc_call_finish(c, GRPC_STATUS_ABORTED, "told to abort");
            return;
        }
        char out[300];
        snprintf(out, sizeof out, "pong:%.200s", s);
        protobuf_c_message_free_unpacked(m, NULL);
        if (!send_str(c, out)) return;
    }
    specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

/* Bidi: answers each message "late:x" 300 ms after it came. */
static void h_delay(specd_rpc_call *c, void *u) {
    (void)u;
    for (;;) {
        ProtobufCMessage *m;
        specd_rpc_io r = specd_rpc_call_recv_msg(c, MSG_DESC, &m, RPC_WAIT_MS, NULL);
        if (r != SPECD_RPC_IO_OK) break;
        char out[300];
        snprintf(out, sizeof out, "late:%.200s", ((Msg *)m)->service);
        protobuf_c_message_free_unpacked(m, NULL);
        svc_sleep_ms(300);
        if (!send_str(c, out)) return;
    }
    specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

/* Sends nothing; waits (at most RPC_WAIT_MS) for the call to be cancelled. */
static void h_stall(specd_rpc_call *c, void *u) {
    (void)u;
    t_set(&T.started);
    int64_t end = specd_now_ms_int() + RPC_WAIT_MS;
    while (!specd_rpc_call_is_cancelled(c) && specd_now_ms_int() < end) svc_sleep_ms(2);
    pthread_mutex_lock(&T.mu);
    T.saw_cancel = specd_rpc_call_is_cancelled(c);
    pthread_mutex_unlock(&T.mu);
    specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
    t_set(&T.done);
}

/* "N" -> one message of N bytes (raw, not protobuf), then OK. */
static void h_big(specd_rpc_call *c, void *u) {
    (void)u;
    size_t n;
    const uint8_t *req = specd_rpc_call_request(c, &n);
    char num[16] = {0};
    memcpy(num, req, n < sizeof num - 1 ? n : sizeof num - 1);
    size_t len = (size_t)atol(num);
    uint8_t *buf = calloc(1, len + 1);
    if (specd_rpc_call_send(c, buf, len) == SPECD_RPC_IO_OK)
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
    free(buf);
}

/* Server streaming: bytes that are not a HealthCheckRequest, then "ok", then OK. */
static void h_garbage(specd_rpc_call *c, void *u) {
    (void)u;
    if (specd_rpc_call_send(c, "\xff\xff\xff", 3) == SPECD_RPC_IO_OK && send_str(c, "ok"))
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

/* ---- fixtures ------------------------------------------------------------------------- */

static specd_rpc_server *server_new(specd_rpc_server_opts o) {
    static const rpc_fix_method methods[] = {
        {RPC_ECHO "Echo", SPECD_RPC_UNARY, h_echo},
        {RPC_ECHO "Count", SPECD_RPC_SERVER_STREAMING, h_count},
        {RPC_ECHO "PingPong", SPECD_RPC_BIDI_STREAMING, h_pingpong},
        {RPC_ECHO "Delay", SPECD_RPC_BIDI_STREAMING, h_delay},
        {RPC_ECHO "Stall", SPECD_RPC_BIDI_STREAMING, h_stall},
        {RPC_ECHO "StallUnary", SPECD_RPC_UNARY, h_stall},
        {RPC_ECHO "Big", SPECD_RPC_UNARY, h_big},
        {RPC_ECHO "BigStream", SPECD_RPC_SERVER_STREAMING, h_big},
        {RPC_ECHO "Garbage", SPECD_RPC_SERVER_STREAMING, h_garbage},
    };
    specd_rpc_server *s = rpc_fix_server(o, methods, sizeof methods / sizeof methods[0], NULL);
    t_reset();
    return s;
}

/* Unary Echo-style call with a string; the reply's string into out. */
static grpc_status_code call_str(specd_rpc_channel *ch, const char *method, const char *req,
                                 char *out, size_t cap, int timeout_ms, specd_error *err) {
    Msg m = msg_of(req);
    ProtobufCMessage *resp = (ProtobufCMessage *)&m; /* must be reset by the call */
    grpc_status_code st = specd_rpc_unary(ch, method, &m.base, MSG_DESC, &resp, timeout_ms, err);
    if (st == GRPC_STATUS_OK) {
        assert_non_null(resp);
        if (out) snprintf(out, cap, "%s", ((Msg *)resp)->service);
        protobuf_c_message_free_unpacked(resp, NULL);
    } else {
        assert_null(resp);
    }
    return st;
}

static specd_rpc_stream *stream(specd_rpc_channel *ch, const char *method, int timeout_ms) {
    specd_error err = {{0}};
    specd_rpc_stream *st = specd_rpc_stream_start(ch, method, timeout_ms, &err);
    if (!st) fail_msg("stream: %s", err.msg);
    return st;
}

static specd_rpc_cio sends(specd_rpc_stream *st, const char *s, int close) {
    Msg m = msg_of(s);
    specd_error err = {{0}};
    return specd_rpc_stream_send(st, &m.base, close, &err);
}

/* recv of a string message into out (empty unless OK). */
static specd_rpc_cio recvs(specd_rpc_stream *st, char *out, size_t cap, int timeout_ms,
                           specd_error *err) {
    ProtobufCMessage *m;
    specd_rpc_cio r = specd_rpc_stream_recv(st, MSG_DESC, &m, timeout_ms, err);
    out[0] = 0;
    if (r == SPECD_RPC_CIO_OK) {
        snprintf(out, cap, "%s", ((Msg *)m)->service);
        protobuf_c_message_free_unpacked(m, NULL);
    } else {
        assert_null(m);
    }
    return r;
}

/* ---- tests: unary --------------------------------------------------------------------- */

static void test_unary(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", specd_rpc_server_port(s));
    assert_string_equal(specd_rpc_channel_target(ch), target);
    char out[256];
    specd_error err = {{0}};
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "hello", out, sizeof out, 5000, &err),
                     GRPC_STATUS_OK);
    assert_string_equal(out, "hello");
    /* no deadline at all */
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "", out, sizeof out, 0, &err), GRPC_STATUS_OK);
    assert_string_equal(out, "");

    /* the server's code and message come through */
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "fail:open.prompt_ids[1]", NULL, 0, 5000, &err),
                     GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "bad field open.prompt_ids[1]"));
    assert_non_null(strstr(err.msg, "INVALID_ARGUMENT"));
    assert_non_null(strstr(err.msg, RPC_ECHO "Echo"));
    assert_int_equal(call_str(ch, RPC_ECHO "Nope", "x", NULL, 0, 5000, &err),
                     GRPC_STATUS_UNIMPLEMENTED);
    assert_non_null(strstr(err.msg, "UNIMPLEMENTED"));

    /* raw bytes: garbage to a protobuf method is the server's INVALID_ARGUMENT */
    uint8_t *resp = (uint8_t *)"not reset";
    size_t n = 99;
    assert_int_equal(specd_rpc_unary_bytes(ch, "/grpc.health.v1.Health/Check", "\xff\xff\xff", 3,
                                           &resp, &n, 5000, &err),
                     GRPC_STATUS_INVALID_ARGUMENT);
    assert_null(resp);
    assert_int_equal(n, 0);
    /* and the real health service, decoded as its own response type */
    Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    ProtobufCMessage *hresp;
    assert_int_equal(specd_rpc_unary(ch, "/grpc.health.v1.Health/Check", &hreq.base,
                                     &grpc__health__v1__health_check_response__descriptor, &hresp,
                                     5000, &err),
                     GRPC_STATUS_OK);
    assert_int_equal(((Grpc__Health__V1__HealthCheckResponse *)hresp)->status,
                     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    protobuf_c_message_free_unpacked(hresp, NULL);
    /* a response that does not decode as the expected type */
    assert_int_equal(specd_rpc_unary_bytes(ch, RPC_ECHO "Big", "3", 1, &resp, &n, 5000, &err),
                     GRPC_STATUS_OK);
    assert_int_equal(n, 3);
    assert_int_equal(resp[3], 0); /* NUL after the bytes */
    free(resp);

    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

/* ---- tests: streams ------------------------------------------------------------------- */

static void test_server_streaming(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    specd_rpc_stream *st = stream(ch, RPC_ECHO "Count", 5000);
    assert_int_equal(sends(st, "100", 1), SPECD_RPC_CIO_OK);
    char out[64];
    specd_error err = {{0}};
    for (int i = 0; i < 100; i++) {
        char want[16];
        snprintf(want, sizeof want, "%d", i);
        assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_OK);
        assert_string_equal(out, want);
    }
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_END);
    /* END is sticky, and finish can be asked twice */
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_END);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_OK);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_OK);
    /* cancel after the end is harmless */
    specd_rpc_stream_cancel(st);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_OK);
    specd_rpc_stream_free(st);

    /* a message that does not decode is skipped; the stream goes on */
    st = stream(ch, RPC_ECHO "Garbage", 5000);
    assert_int_equal(sends(st, "", 1), SPECD_RPC_CIO_OK);
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_INVALID);
    assert_non_null(strstr(err.msg, "malformed"));
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_OK);
    assert_string_equal(out, "ok");
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_END);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_OK);
    specd_rpc_stream_free(st);
    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void test_bidi(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    specd_rpc_stream *st = stream(ch, RPC_ECHO "PingPong", 0);
    char out[300], ping[16], want[32];
    specd_error err = {{0}};
    for (int i = 0; i < 20; i++) {
        snprintf(ping, sizeof ping, "p%d", i);
        snprintf(want, sizeof want, "pong:p%d", i);
        assert_int_equal(sends(st, ping, 0), SPECD_RPC_CIO_OK);
        assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_OK);
        assert_string_equal(out, want);
    }
    assert_int_equal(specd_rpc_stream_close_send(st, &err), SPECD_RPC_CIO_OK);
    assert_int_equal(specd_rpc_stream_close_send(st, &err), SPECD_RPC_CIO_OK);
    /* nothing can be sent after the half-close; the stream is unharmed */
    assert_int_equal(sends(st, "late", 0), SPECD_RPC_CIO_INVALID);
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_END);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_OK);
    specd_rpc_stream_free(st);

    /* the last message and the half-close in one send, raw bytes this time */
    st = stream(ch, RPC_ECHO "PingPong", 5000);
    Msg m = msg_of("raw");
    uint8_t buf[16];
    size_t len = protobuf_c_message_pack(&m.base, buf);
    assert_int_equal(specd_rpc_stream_send_bytes(st, buf, len, 1, &err), SPECD_RPC_CIO_OK);
    uint8_t *got;
    size_t n;
    assert_int_equal(specd_rpc_stream_recv_bytes(st, &got, &n, RPC_WAIT_MS, &err),
                     SPECD_RPC_CIO_OK);
    ProtobufCMessage *dec;
    assert_int_equal(specd_rpc_unpack(MSG_DESC, got, n, 1024, &dec, &err), 0);
    assert_string_equal(((Msg *)dec)->service, "pong:raw");
    protobuf_c_message_free_unpacked(dec, NULL);
    free(got);
    assert_int_equal(specd_rpc_stream_recv_bytes(st, &got, &n, RPC_WAIT_MS, &err),
                     SPECD_RPC_CIO_END);
    assert_null(got);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_OK);
    specd_rpc_stream_free(st);

    /* the server ends the stream with an error: recv says FAILED with the
     * server's message, finish gives the code; sends fail from then on */
    st = stream(ch, RPC_ECHO "PingPong", 5000);
    assert_int_equal(sends(st, "abort", 0), SPECD_RPC_CIO_OK);
    memset(&err, 0, sizeof err);
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_FAILED);
    assert_non_null(strstr(err.msg, "ABORTED: told to abort"));
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_FAILED);
    assert_int_equal(sends(st, "more", 0), SPECD_RPC_CIO_FAILED);
    memset(&err, 0, sizeof err);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_ABORTED);
    assert_non_null(strstr(err.msg, "told to abort"));
    specd_rpc_stream_free(st);

    /* The server answers three times and ends with an error while the
     * client is not reading: the next send fails, and finish reads past
     * the unread answers to report the server's status, not CANCELLED. */
    st = stream(ch, RPC_ECHO "PingPong", 5000);
    assert_int_equal(sends(st, "abort3", 0), SPECD_RPC_CIO_OK);
    int64_t end = specd_now_ms_int() + RPC_WAIT_MS;
    while (sends(st, "more", 0) == SPECD_RPC_CIO_OK && specd_now_ms_int() < end) svc_sleep_ms(5);
    assert_int_equal(sends(st, "more", 0), SPECD_RPC_CIO_FAILED);
    memset(&err, 0, sizeof err);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_ABORTED);
    assert_non_null(strstr(err.msg, "aborted after 3"));
    specd_rpc_stream_free(st);

    /* gRPC delivers a status only after every message before it was read:
     * finish on a stream with unread messages cannot see the server's OK,
     * so it ends the stream (the header's "recv until END first"). */
    st = stream(ch, RPC_ECHO "Count", 5000);
    assert_int_equal(sends(st, "5", 1), SPECD_RPC_CIO_OK);
    svc_sleep_ms(100);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_CANCELLED);
    specd_rpc_stream_free(st);
    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void test_recv_timeout(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    specd_rpc_stream *st = stream(ch, RPC_ECHO "Delay", 5000);
    char out[64];
    specd_error err = {{0}};
    assert_int_equal(sends(st, "x", 0), SPECD_RPC_CIO_OK);
    /* the answer comes 300 ms later: two short waits time out ... */
    int64_t t0 = specd_now_ms_int();
    assert_int_equal(recvs(st, out, sizeof out, 50, &err), SPECD_RPC_CIO_TIMEOUT);
    assert_int_equal(recvs(st, out, sizeof out, 0, &err), SPECD_RPC_CIO_TIMEOUT);
    assert_true(specd_now_ms_int() - t0 < 250);
    /* ... and a send while the read is pending still works ... */
    assert_int_equal(sends(st, "y", 0), SPECD_RPC_CIO_OK);
    /* ... then the pending read delivers, in order */
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_OK);
    assert_string_equal(out, "late:x");
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_OK);
    assert_string_equal(out, "late:y");
    assert_int_equal(specd_rpc_stream_close_send(st, &err), SPECD_RPC_CIO_OK);
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_END);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_OK);
    specd_rpc_stream_free(st);

    /* freed with a read still pending and no finish: cancelled, nothing leaks */
    st = stream(ch, RPC_ECHO "Stall", 5000);
    assert_true(t_wait(&T.started));
    assert_int_equal(recvs(st, out, sizeof out, 20, &err), SPECD_RPC_CIO_TIMEOUT);
    specd_rpc_stream_free(st);
    assert_true(t_wait(&T.done));
    assert_true(T.saw_cancel);
    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

typedef struct {
    specd_rpc_stream *st;
    int delay_ms;
} cancel_arg;

static void *cancel_thread(void *p) {
    cancel_arg *a = p;
    svc_sleep_ms(a->delay_ms);
    specd_rpc_stream_cancel(a->st);
    specd_rpc_stream_cancel(a->st); /* idempotent */
    return NULL;
}

static void test_cancel_from_another_thread(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    specd_rpc_stream *st = stream(ch, RPC_ECHO "Stall", 0);
    assert_true(t_wait(&T.started));
    cancel_arg a = {.st = st, .delay_ms = 100};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, cancel_thread, &a), 0);
    char out[64];
    specd_error err = {{0}};
    int64_t t0 = specd_now_ms_int();
    /* blocks with no timeout and no deadline: only the cancel ends it */
    assert_int_equal(recvs(st, out, sizeof out, -1, &err), SPECD_RPC_CIO_FAILED);
    int64_t took = specd_now_ms_int() - t0;
    assert_true(took >= 80 && took < 2000);
    assert_non_null(strstr(err.msg, "CANCELLED"));
    pthread_join(th, NULL);
    assert_int_equal(sends(st, "x", 0), SPECD_RPC_CIO_FAILED);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_CANCELLED);
    /* the handler saw it */
    assert_true(t_wait(&T.done));
    assert_true(T.saw_cancel);
    specd_rpc_stream_free(st);

    /* finish on a live stream ends it early: CANCELLED, the handler sees it */
    t_reset();
    st = stream(ch, RPC_ECHO "Stall", 0);
    assert_true(t_wait(&T.started));
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_CANCELLED);
    assert_true(t_wait(&T.done));
    assert_true(T.saw_cancel);
    specd_rpc_stream_free(st);
    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void test_deadline(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 0);
    specd_error err = {{0}};
    int64_t t0 = specd_now_ms_int();
    assert_int_equal(call_str(ch, RPC_ECHO "StallUnary", "x", NULL, 0, 300, &err),
                     GRPC_STATUS_DEADLINE_EXCEEDED);
    int64_t took = specd_now_ms_int() - t0;
    assert_true(took >= 250 && took < 3000);
    assert_non_null(strstr(err.msg, "DEADLINE_EXCEEDED"));
    assert_true(t_wait(&T.done));
    assert_true(T.saw_cancel);

    t_reset();
    specd_rpc_stream *st = stream(ch, RPC_ECHO "Stall", 300);
    char out[64];
    t0 = specd_now_ms_int();
    assert_int_equal(recvs(st, out, sizeof out, -1, &err), SPECD_RPC_CIO_FAILED);
    took = specd_now_ms_int() - t0;
    assert_true(took >= 250 && took < 3000);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_DEADLINE_EXCEEDED);
    specd_rpc_stream_free(st);
    assert_true(t_wait(&T.done));
    assert_true(T.saw_cancel);
    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

/* ---- tests: unreachable and vanishing servers ---------------------------------------- */

static void test_nobody_listening(void **state) {
    (void)state;
    const int port = svc_free_port(); /* bound, then closed: nobody listens */
    specd_rpc_channel *ch = rpc_fix_channel_plain(port, 0);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    specd_error err = {{0}};
    int64_t t0 = specd_now_ms_int();
    /* a generous deadline: the refusal, not the deadline, must end it */
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "x", NULL, 0, 20000, &err),
                     GRPC_STATUS_UNAVAILABLE);
    assert_true(specd_now_ms_int() - t0 < 2000);
    assert_non_null(strstr(err.msg, "UNAVAILABLE"));
    assert_non_null(strstr(err.msg, target));
    /* a stream starts, and its first recv says FAILED; no deadline at all */
    t0 = specd_now_ms_int();
    specd_rpc_stream *st = stream(ch, RPC_ECHO "PingPong", 0);
    char out[64];
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_FAILED);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_UNAVAILABLE);
    specd_rpc_stream_free(st);
    /* a send first: FAILED too, and finish still gives UNAVAILABLE */
    st = stream(ch, RPC_ECHO "PingPong", 0);
    specd_rpc_cio r = sends(st, "x", 0);
    assert_true(r == SPECD_RPC_CIO_FAILED || r == SPECD_RPC_CIO_OK);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_UNAVAILABLE);
    specd_rpc_stream_free(st);
    assert_true(specd_now_ms_int() - t0 < 2000);
    specd_rpc_channel_free(ch);
}

typedef struct {
    specd_rpc_server *s;
    int delay_ms;
} shutdown_arg;

static void *shutdown_thread(void *p) {
    shutdown_arg *a = p;
    svc_sleep_ms(a->delay_ms);
    specd_rpc_server_shutdown(a->s, 0);
    return NULL;
}

static void test_server_shutdown_mid_stream(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    int port = specd_rpc_server_port(s);
    specd_rpc_channel *ch = rpc_fix_channel_plain(port, 0);
    /* a live stream that has exchanged messages, then blocks in recv */
    specd_rpc_stream *st = stream(ch, RPC_ECHO "PingPong", 0);
    char out[64];
    specd_error err = {{0}};
    assert_int_equal(sends(st, "a", 0), SPECD_RPC_CIO_OK);
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_OK);
    shutdown_arg a = {.s = s, .delay_ms = 100};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, shutdown_thread, &a), 0);
    int64_t t0 = specd_now_ms_int();
    assert_int_equal(recvs(st, out, sizeof out, -1, &err), SPECD_RPC_CIO_FAILED);
    assert_true(specd_now_ms_int() - t0 < 3000);
    pthread_join(th, NULL);
    grpc_status_code code = specd_rpc_stream_finish(st, &err);
    if (code != GRPC_STATUS_UNAVAILABLE) fail_msg("finish gave %d: %s", code, err.msg);
    specd_rpc_stream_free(st);
    /* and with the server gone, new calls fail fast on the same channel */
    t0 = specd_now_ms_int();
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "x", NULL, 0, 20000, &err),
                     GRPC_STATUS_UNAVAILABLE);
    assert_true(specd_now_ms_int() - t0 < 2000);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

/* ---- tests: TLS ------------------------------------------------------------------------- */

static void test_tls(void **state) {
    (void)state;
    specd_rpc_server *s = server_new(rpc_fix_tls_opts(0));
    int port = specd_rpc_server_port(s);
    char out[64];
    specd_error err = {{0}};
    /* the certificate names localhost (override) and 127.0.0.1 (as dialled) */
    specd_rpc_channel *ch = rpc_fix_channel_tls(port, NULL, "localhost");
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "secret", out, sizeof out, 5000, &err),
                     GRPC_STATUS_OK);
    assert_string_equal(out, "secret");
    specd_rpc_stream *st = stream(ch, RPC_ECHO "PingPong", 5000);
    assert_int_equal(sends(st, "s", 1), SPECD_RPC_CIO_OK);
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_OK);
    assert_string_equal(out, "pong:s");
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_END);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_OK);
    specd_rpc_stream_free(st);
    specd_rpc_channel_free(ch);
    ch = rpc_fix_channel_tls(port, NULL, NULL);
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "x", NULL, 0, 5000, &err), GRPC_STATUS_OK);
    specd_rpc_channel_free(ch);
    /* a name the certificate does not carry is refused */
    ch = rpc_fix_channel_tls(port, NULL, "evil.example");
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "x", NULL, 0, 5000, &err),
                     GRPC_STATUS_UNAVAILABLE);
    specd_rpc_channel_free(ch);
    /* so is a plaintext client */
    ch = rpc_fix_channel_plain(port, 0);
    assert_int_not_equal(call_str(ch, RPC_ECHO "Echo", "x", NULL, 0, 5000, &err), GRPC_STATUS_OK);
    specd_rpc_channel_free(ch);
    specd_rpc_stats stats;
    specd_rpc_server_stats(s, &stats);
    assert_int_equal(stats.calls_started, 3);
    specd_rpc_server_destroy(s);
}

static void test_mutual_tls(void **state) {
    (void)state;
    specd_rpc_server *s = server_new(rpc_fix_tls_opts(1));
    int port = specd_rpc_server_port(s);
    specd_error err = {{0}};
    specd_rpc_channel *ch = rpc_fix_channel_tls(port, "client", "localhost");
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "x", NULL, 0, 5000, &err), GRPC_STATUS_OK);
    specd_rpc_channel_free(ch);
    /* no client certificate: refused in the handshake */
    ch = rpc_fix_channel_tls(port, NULL, "localhost");
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "x", NULL, 0, 5000, &err),
                     GRPC_STATUS_UNAVAILABLE);
    specd_rpc_channel_free(ch);
    /* a certificate the client CA never signed: refused too */
    ch = rpc_fix_channel_tls(port, "rogue", "localhost");
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", "x", NULL, 0, 5000, &err),
                     GRPC_STATUS_UNAVAILABLE);
    specd_rpc_channel_free(ch);
    specd_rpc_stats stats;
    specd_rpc_server_stats(s, &stats);
    assert_int_equal(stats.calls_started, 1);
    specd_rpc_server_destroy(s);
}

/* ---- tests: limits, options, misuse --------------------------------------------------- */

static void test_message_size_limits(void **state) {
    (void)state;
    specd_rpc_server *s = server_new((specd_rpc_server_opts){0});
    specd_rpc_channel *ch = rpc_fix_channel_plain(specd_rpc_server_port(s), 1024);
    specd_error err = {{0}};
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    /* too big to send: refused here, nothing reaches the server */
    assert_int_equal(call_str(ch, RPC_ECHO "Echo", big, NULL, 0, 5000, &err),
                     GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "exceeds"));
    uint8_t *resp;
    size_t n;
    assert_int_equal(specd_rpc_unary_bytes(ch, RPC_ECHO "Echo", big, 1025, &resp, &n, 5000, &err),
                     GRPC_STATUS_RESOURCE_EXHAUSTED);
    specd_rpc_stats stats;
    specd_rpc_server_stats(s, &stats);
    assert_int_equal(stats.calls_started, 0);
    /* the same on a stream, which stays usable */
    specd_rpc_stream *st = stream(ch, RPC_ECHO "PingPong", 5000);
    assert_int_equal(sends(st, big, 0), SPECD_RPC_CIO_INVALID);
    assert_int_equal(specd_rpc_stream_send_bytes(st, big, 1025, 0, &err), SPECD_RPC_CIO_INVALID);
    char out[64];
    assert_int_equal(sends(st, "small", 1), SPECD_RPC_CIO_OK);
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_OK);
    assert_string_equal(out, "pong:small");
    assert_int_equal(recvs(st, out, sizeof out, RPC_WAIT_MS, &err), SPECD_RPC_CIO_END);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_OK);
    specd_rpc_stream_free(st);
    /* just under the limit goes through */
    assert_int_equal(specd_rpc_unary_bytes(ch, RPC_ECHO "Big", "1024", 4, &resp, &n, 5000, &err),
                     GRPC_STATUS_OK);
    assert_int_equal(n, 1024);
    free(resp);
    /* too big to receive: gRPC refuses it, unary and stream alike */
    assert_int_equal(specd_rpc_unary_bytes(ch, RPC_ECHO "Big", "1025", 4, &resp, &n, 5000, &err),
                     GRPC_STATUS_RESOURCE_EXHAUSTED);
    st = stream(ch, RPC_ECHO "BigStream", 5000);
    assert_int_equal(specd_rpc_stream_send_bytes(st, "1500", 4, 1, &err), SPECD_RPC_CIO_OK);
    assert_int_equal(specd_rpc_stream_recv_bytes(st, &resp, &n, RPC_WAIT_MS, &err),
                     SPECD_RPC_CIO_FAILED);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_RESOURCE_EXHAUSTED);
    specd_rpc_stream_free(st);
    rpc_fix_wait_idle(s);
    specd_rpc_channel_free(ch);
    specd_rpc_server_destroy(s);
}

static void expect_create_error(specd_rpc_channel_opts o, const char *needle) {
    specd_error err = {{0}};
    specd_rpc_channel *ch = specd_rpc_channel_create(&o, &err);
    assert_null(ch);
    if (!strstr(err.msg, needle)) fprintf(stderr, "message was: %s\n", err.msg);
    assert_non_null(strstr(err.msg, needle));
}

static void test_options(void **state) {
    (void)state;
    expect_create_error((specd_rpc_channel_opts){.insecure = 1}, "target");
    expect_create_error((specd_rpc_channel_opts){.target = "127.0.0.1:1", .insecure = 1,
                                                 .tls_ca_path = "ca.pem"},
                        "choose one");
    expect_create_error((specd_rpc_channel_opts){.target = "127.0.0.1:1",
                                                 .tls_cert_path = "client.pem"},
                        "tls_key_path");
    expect_create_error((specd_rpc_channel_opts){.target = "127.0.0.1:1",
                                                 .tls_ca_path = "/nonexistent/ca.pem"},
                        "/nonexistent/ca.pem");
    const char *junk = "not a certificate\n";
    const char *junk_path = test_write_temp(junk, strlen(junk), ".pem");
    expect_create_error((specd_rpc_channel_opts){.target = "127.0.0.1:1", .tls_ca_path = junk_path},
                        "no PEM block");
    expect_create_error((specd_rpc_channel_opts){.target = "127.0.0.1:1", .insecure = 1,
                                                 .connect_timeout_ms = -1},
                        "connect_timeout_ms");
    /* TLS with the system roots: created (lazily connected, so no call here) */
    specd_rpc_channel *ch = rpc_fix_channel((specd_rpc_channel_opts){.target = "127.0.0.1:1"});
    specd_rpc_channel_free(ch);
    specd_rpc_channel_free(NULL);
    specd_rpc_stream_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_server_streaming),
        cmocka_unit_test(test_bidi),
        cmocka_unit_test(test_recv_timeout),
        cmocka_unit_test(test_cancel_from_another_thread),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_nobody_listening),
        cmocka_unit_test(test_server_shutdown_mid_stream),
        cmocka_unit_test(test_tls),
        cmocka_unit_test(test_mutual_tls),
        cmocka_unit_test(test_message_size_limits),
        cmocka_unit_test(test_options),
    };
    return cmocka_run_group_tests(tests, rpc_fix_suite_setup, rpc_fix_suite_teardown);
}
