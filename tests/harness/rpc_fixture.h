/* rpc_fixture.h - what the gRPC layer's own tests (test_rpc_client.c,
 * test_rpc_server.c) share: a loopback server carrying a table of test
 * methods, channels to it in plaintext or TLS with the test certificates
 * (tests/unit/certs/), and a bounded wait for the server to go idle.
 *
 * Every server listens on 127.0.0.1:0 (an ephemeral loopback port, never
 * any other address), and every wait is bounded, so a bug fails an
 * assertion instead of hanging the suite. A failure to create anything
 * fails the calling test. */
#ifndef SPECD_TEST_RPC_FIXTURE_H
#define SPECD_TEST_RPC_FIXTURE_H

#include <stddef.h>

#include "common/rpc/rpc_client.h"
#include "common/rpc/rpc_server.h"

/* The test methods' service: not in any .proto, so no real client calls it. */
#define RPC_ECHO "/specd.testing.Echo/"
/* Upper bound on any wait: far above what a step needs, far below ctest's
 * timeout. */
#define RPC_WAIT_MS 10000

typedef struct rpc_fix_method {
    const char *path;
    specd_rpc_kind kind;
    specd_rpc_handler handler;
} rpc_fix_method;

/* Creates and starts a server with opts (listening on 127.0.0.1:0 unless
 * opts names an address; plaintext unless opts names a certificate or key)
 * and the n methods, each registered with `user`. */
specd_rpc_server *rpc_fix_server(specd_rpc_server_opts opts, const rpc_fix_method *methods,
                                 size_t n, void *user);
/* A server's TLS options: tests/unit/certs/server.pem and .key; with
 * `mutual` also the CA that client certificates must chain to. The paths
 * live in static buffers until the next call. */
specd_rpc_server_opts rpc_fix_tls_opts(int mutual);
/* Waits (bounded) until the server holds no call and runs no handler, and
 * asserts that it got there. */
void rpc_fix_wait_idle(specd_rpc_server *s);

/* cmocka group setup and teardown: the suite holds a gRPC reference of its
 * own, so gRPC is not torn down and set up again between tests (every
 * server and channel holds one while it lives), and the last grpc_shutdown
 * joins gRPC's threads, so LeakSanitizer sees a clean exit. */
int rpc_fix_suite_setup(void **state);
int rpc_fix_suite_teardown(void **state);

/* A channel with opts. */
specd_rpc_channel *rpc_fix_channel(specd_rpc_channel_opts opts);
/* A plaintext channel to 127.0.0.1:port (max_message 0: the default limit). */
specd_rpc_channel *rpc_fix_channel_plain(int port, size_t max_message);
/* A TLS channel to 127.0.0.1:port trusting tests/unit/certs/ca.pem; `who`
 * ("client", "rogue" or NULL for none) the client certificate it presents,
 * server_name (or NULL) the name to check the server's certificate against. */
specd_rpc_channel *rpc_fix_channel_tls(int port, const char *who, const char *server_name);

#endif
