/* rpc_health.h - the grpc.health.v1 request parser, shared by the built-in
 * Health service (rpc_health.c) and its fuzz target.
 *
 * The service itself needs no public API beyond specd_rpc_set_health
 * (rpc_server.h): every specd_rpc_server serves Check and Watch. */
#ifndef SPECD_RPC_HEALTH_H
#define SPECD_RPC_HEALTH_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"

/* A HealthCheckRequest is one short service name; anything longer than this
 * is refused before decoding (probes are unauthenticated callers). */
#define SPECD_RPC_HEALTH_MAX_REQUEST 1024

/* Decodes a HealthCheckRequest and returns its service name (malloc'd, ""
 * for the server as a whole) in *service. -1 + err if it is too large or
 * malformed. */
int specd_rpc_health_parse_request(const uint8_t *buf, size_t len, char **service,
                                   specd_error *err);

#endif
