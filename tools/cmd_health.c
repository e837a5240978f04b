/* cmd_health.c - `specd health ADDRESS [SERVICE]`: one grpc.health.v1 Check.
 *
 * Exit 0 when the service (default: the server as a whole) is SERVING, 1
 * otherwise (NOT_SERVING, unknown service, unreachable), with one line on
 * stderr saying which. Kubernetes' built-in gRPC probe only dials TCP ports;
 * the co-located pod's target-svc listens on a Unix socket only, so its
 * probes run this as an exec probe:
 *
 *     specd health unix:/run/specd/target.sock specd.v1.Target
 *
 * Plaintext only (a probe inside the pod; the socket is not on the network). */
#include <stdio.h>
#include <string.h>

#include "common/rpc/rpc_client.h"
#include "grpc/health/v1/health.pb-c.h"
#include "tools/cli.h"

#define PROBE_TIMEOUT_MS 2000

int cmd_health(int argc, char **argv) {
    if (argc < 2 || argc > 3 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fprintf(argc < 2 || argc > 3 ? stderr : stdout,
                "usage: specd health ADDRESS [SERVICE]\n"
                "  ADDRESS  host:port or unix:/path of a specd service (plaintext)\n"
                "  SERVICE  e.g. specd.v1.Target; default: the server as a whole\n"
                "exit status 0 when SERVING, 1 otherwise\n");
        return argc < 2 || argc > 3 ? 2 : 0;
    }
    const char *service = argc == 3 ? argv[2] : "";
    specd_error err = {{0}};
    specd_rpc_channel_opts co = {.target = argv[1], .insecure = 1,
                                 .connect_timeout_ms = PROBE_TIMEOUT_MS};
    specd_rpc_channel *ch = specd_rpc_channel_create(&co, &err);
    if (!ch) {
        fprintf(stderr, "specd health: %s\n", err.msg);
        return 1;
    }
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    Grpc__Health__V1__HealthCheckResponse *resp = NULL;
    grpc_status_code code =
        specd_rpc_unary(ch, "/grpc.health.v1.Health/Check", &req.base,
                        &grpc__health__v1__health_check_response__descriptor,
                        (ProtobufCMessage **)&resp, PROBE_TIMEOUT_MS, &err);
    int serving = code == GRPC_STATUS_OK &&
                  resp->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    if (code != GRPC_STATUS_OK)
        fprintf(stderr, "specd health: %s: %s\n", specd_rpc_status_name(code), err.msg);
    else if (!serving)
        fprintf(stderr, "specd health: %s is not serving\n", service[0] ? service : argv[1]);
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    specd_rpc_channel_free(ch);
    return serving ? 0 : 1;
}
