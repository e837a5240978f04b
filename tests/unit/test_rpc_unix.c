/* test_rpc_unix.c - gRPC over a Unix domain socket, and request metadata.
 *
 * The co-located deployment (deploy/k8s-colocated/) runs draft-svc and
 * target-svc in one pod talking over `unix:/path`: the server layer must
 * listen there and the client layer connect there, with the same calls as
 * over TCP. The same echo service checks that the x-request-id metadata
 * draft-svc sends (specd_rpc_stream_start_md) reaches the handler
 * (specd_rpc_call_metadata), over both transports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "bench/echo_service.h"
#include "common/rpc/request_log.h"
#include "common/rpc/rpc_client.h"

/* One stream to target: the echoed request id must be `id` ("" for none),
 * then one message must come back unchanged. */
static void round_trip(const char *target, const char *id) {
    specd_error err = {{0}};
    specd_rpc_channel_opts co = {.target = target, .insecure = 1};
    specd_rpc_channel *ch = specd_rpc_channel_create(&co, &err);
    assert_non_null(ch);
    specd_rpc_stream *st =
        specd_rpc_stream_start_md(ch, SPECD_ECHO_METHOD, 10000, SPECD_REQUEST_ID_KEY, id, &err);
    assert_non_null(st);
    uint8_t *back = NULL;
    size_t len = 0;
    assert_int_equal(specd_rpc_stream_recv_bytes(st, &back, &len, 10000, &err), SPECD_RPC_CIO_OK);
    assert_int_equal(len, id ? strlen(id) : 0);
    if (id) assert_memory_equal(back, id, len);
    free(back);
    const char msg[] = "a verify step";
    assert_int_equal(specd_rpc_stream_send_bytes(st, msg, sizeof msg, 1, &err), SPECD_RPC_CIO_OK);
    specd_rpc_cio io = specd_rpc_stream_recv_bytes(st, &back, &len, 10000, &err);
    if (io != SPECD_RPC_CIO_OK)
        print_error("%s (id %s): echo recv gave %d: %s (status %s)\n", target, id ? id : "none",
                    (int)io, err.msg, specd_rpc_status_name(specd_rpc_stream_finish(st, &err)));
    assert_int_equal(io, SPECD_RPC_CIO_OK);
    assert_int_equal(len, sizeof msg);
    assert_memory_equal(back, msg, sizeof msg);
    free(back);
    /* the status arrives after the echo: read up to it (finish on a live
     * stream would cancel it) */
    assert_int_equal(specd_rpc_stream_recv_bytes(st, &back, &len, 10000, &err), SPECD_RPC_CIO_END);
    assert_int_equal(specd_rpc_stream_finish(st, &err), GRPC_STATUS_OK);
    specd_rpc_stream_free(st);
    specd_rpc_channel_free(ch);
}

static void test_unix_socket(void **state) {
    (void)state;
    char dir[] = "/tmp/specd-unix-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128], addr[160];
    snprintf(path, sizeof path, "%s/target.sock", dir);
    snprintf(addr, sizeof addr, "unix:%s", path);
    specd_error err = {{0}};
    specd_rpc_server *s = specd_echo_server_start(addr, &err);
    assert_non_null(s);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true(S_ISSOCK(sb.st_mode));
    round_trip(addr, "req-42");
    round_trip(addr, NULL);
    specd_rpc_server_destroy(s);
    unlink(path);
    rmdir(dir);
}

static void test_tcp_metadata(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_rpc_server *s = specd_echo_server_start("127.0.0.1:0", &err);
    assert_non_null(s);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", specd_rpc_server_port(s));
    round_trip(addr, "6f1c0b2e9d7a4c3b8e5f1a2b3c4d5e6f");
    specd_rpc_server_destroy(s);
}

/* A socket path in a directory that does not exist: create fails with an
 * error naming the address, no crash. */
static void test_unix_bad_path(void **state) {
    (void)state;
    specd_error err = {{0}};
    assert_null(specd_echo_server_start("unix:/nonexistent-dir-specd/x.sock", &err));
    assert_non_null(strstr(err.msg, "unix:/nonexistent-dir-specd/x.sock"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unix_socket),
        cmocka_unit_test(test_tcp_metadata),
        cmocka_unit_test(test_unix_bad_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
