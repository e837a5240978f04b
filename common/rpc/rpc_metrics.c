/* rpc_metrics.c - every status a specd gRPC server sends, counted by method
 * and code in the process's metrics registry (common/rpc/metrics.h):
 *
 *     specd_grpc_server_handled_total{grpc_method="/specd.v1.Target/Verify",grpc_code="OK"}
 *
 * the meaning of go-grpc-prometheus' grpc_server_handled_total, so its
 * dashboards and alerts (error ratio by code) translate. Calls that end
 * cancelled without a status of ours count as CANCELLED. Methods the server
 * does not know are counted as "unknown": the path comes from the client and
 * must not make a series per path. Called under the call's mutex. */
#include <pthread.h>

#include "common/rpc/metrics.h"
#include "common/rpc/rpc_client.h"
#include "common/rpc/rpc_internal.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static specd_metric *handled;

static void init(void) {
    handled = specd_metrics_counter(specd_metrics_global(), "specd_grpc_server_handled_total",
                                    "gRPC calls ended by the server, by method and status code",
                                    "grpc_method,grpc_code");
}

void rpc_metrics_count(specd_rpc_call *c, grpc_status_code code) {
    pthread_once(&once, init);
    c->final_code = code; /* for the request log (specd_rpc_call_status) */
    c->status_known = 1;
    const char *method = c->method && c->method_path ? c->method_path : "unknown";
    specd_metric_add(handled, SPECD_LABELS(method, specd_rpc_status_name(code)), 1);
}

grpc_status_code specd_rpc_call_status(specd_rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    grpc_status_code code = c->status_known ? c->final_code : GRPC_STATUS_UNKNOWN;
    pthread_mutex_unlock(&c->mu);
    return code;
}
