/* rpc_fixture.c - the gRPC layer tests' loopback server and channels (see
 * rpc_fixture.h). */
#include "rpc_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>
#include <grpc/grpc.h>

#include "common/util/clock.h"
#include "tests/harness/svc.h"
#include "tests/harness/test_util.h"

specd_rpc_server *rpc_fix_server(specd_rpc_server_opts o, const rpc_fix_method *methods, size_t n,
                                 void *user) {
    if (!o.listen_addr) o.listen_addr = "127.0.0.1:0";
    if (!o.tls_cert_path && !o.tls_key_path) o.insecure = 1;
    specd_error err = {{0}};
    specd_rpc_server *s = specd_rpc_server_create(&o, &err);
    if (!s) fail_msg("server: %s", err.msg);
    assert_true(specd_rpc_server_port(s) > 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(
            specd_rpc_register(s, methods[i].path, methods[i].kind, methods[i].handler, user), 0);
    if (specd_rpc_server_start(s, &err)) fail_msg("server start: %s", err.msg);
    return s;
}

specd_rpc_server_opts rpc_fix_tls_opts(int mutual) {
    static char cert[4096], key[4096], ca[4096];
    snprintf(cert, sizeof cert, "%s", test_path("tests/unit/certs/server.pem"));
    snprintf(key, sizeof key, "%s", test_path("tests/unit/certs/server.key"));
    snprintf(ca, sizeof ca, "%s", test_path("tests/unit/certs/ca.pem"));
    return (specd_rpc_server_opts){.tls_cert_path = cert, .tls_key_path = key,
                                   .tls_client_ca_path = mutual ? ca : NULL};
}

void rpc_fix_wait_idle(specd_rpc_server *s) {
    int64_t end = specd_now_ms_int() + RPC_WAIT_MS;
    specd_rpc_stats st;
    for (;;) {
        specd_rpc_server_stats(s, &st);
        if ((st.calls_live == 0 && st.handlers_running == 0) || specd_now_ms_int() > end) break;
        svc_sleep_ms(5);
    }
    assert_int_equal(st.calls_live, 0);
    assert_int_equal(st.handlers_running, 0);
}

int rpc_fix_suite_setup(void **state) {
    (void)state;
    grpc_init();
    return 0;
}

int rpc_fix_suite_teardown(void **state) {
    (void)state;
    grpc_shutdown();
    return 0;
}

specd_rpc_channel *rpc_fix_channel(specd_rpc_channel_opts o) {
    specd_error err = {{0}};
    specd_rpc_channel *ch = specd_rpc_channel_create(&o, &err);
    if (!ch) fail_msg("channel: %s", err.msg);
    return ch;
}

specd_rpc_channel *rpc_fix_channel_plain(int port, size_t max_message) {
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    return rpc_fix_channel((specd_rpc_channel_opts){.target = target, .insecure = 1,
                                                    .max_message_bytes = max_message});
}

specd_rpc_channel *rpc_fix_channel_tls(int port, const char *who, const char *server_name) {
    char target[64], ca[4096], cert[4096], key[4096], rel[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    snprintf(ca, sizeof ca, "%s", test_path("tests/unit/certs/ca.pem"));
    if (who) {
        snprintf(rel, sizeof rel, "tests/unit/certs/%s.pem", who);
        snprintf(cert, sizeof cert, "%s", test_path(rel));
        snprintf(rel, sizeof rel, "tests/unit/certs/%s.key", who);
        snprintf(key, sizeof key, "%s", test_path(rel));
    }
    return rpc_fix_channel((specd_rpc_channel_opts){.target = target, .tls_ca_path = ca,
                                                    .tls_cert_path = who ? cert : NULL,
                                                    .tls_key_path = who ? key : NULL,
                                                    .tls_server_name = server_name});
}
