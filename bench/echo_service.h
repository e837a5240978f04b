/* echo_service.h - a bidi echo method on the common gRPC server, shared by
 * the transport benchmark (bench_rpc_transport.c) and the Unix-socket test
 * (tests/unit/test_rpc_unix.c).
 *
 * "/specd.bench.Echo/Echo": the first message back is the client's
 * x-request-id metadata (empty if none), then every message is echoed until
 * the client half-closes. */
#ifndef SPECD_ECHO_SERVICE_H
#define SPECD_ECHO_SERVICE_H

#include "common/rpc/rpc_server.h"

#define SPECD_ECHO_METHOD "/specd.bench.Echo/Echo"

/* A plaintext server on addr ("127.0.0.1:0" or "unix:/path") with the echo
 * method, started. NULL + err on failure. */
specd_rpc_server *specd_echo_server_start(const char *addr, specd_error *err);

#endif
