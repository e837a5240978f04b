/* fuzz_health_request.c - libFuzzer target for the grpc.health.v1 request
 * decoder (specd_rpc_health_parse_request), the first thing the built-in
 * Health service does with bytes from an unauthenticated prober.
 *
 * Any input must give a service name or an error message; over-size inputs
 * must be refused before decoding; an accepted name must survive an
 * encode/decode round trip through the size-limited helpers unchanged. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc/rpc_health.h"
#include "common/rpc/rpc_server.h"
#include "grpc/health/v1/health.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    specd_error err;
    err.msg[0] = 0;
    char *service = NULL;
    if (specd_rpc_health_parse_request(data, size, &service, &err)) {
        if (service || !err.msg[0]) abort(); /* failure: no result, a message */
        return 0;
    }
    if (!service || size > SPECD_RPC_HEALTH_MAX_REQUEST) abort();

    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = service;
    size_t len;
    uint8_t *buf = specd_rpc_pack(&req.base, SPECD_RPC_HEALTH_MAX_REQUEST, &len, &err);
    /* re-encoding keeps only the name, minimally encoded (unknown fields,
     * repeats, long varints and anything after an embedded NUL are gone),
     * so it can never be longer than the input */
    if (!buf || len > size) abort();
    char *again = NULL;
    if (specd_rpc_health_parse_request(buf, len, &again, &err) || strcmp(again, service)) abort();
    free(again);
    free(buf);
    free(service);
    return 0;
}
