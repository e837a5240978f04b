/* echo_service.c - see echo_service.h. */
#include "bench/echo_service.h"

#include <string.h>

#include "common/rpc/request_log.h"

static void h_echo(specd_rpc_call *c, void *user) {
    (void)user;
    char id[SPECD_REQUEST_ID_MAX + 1];
    int n = specd_rpc_call_metadata(c, SPECD_REQUEST_ID_KEY, id, sizeof id);
    if (specd_rpc_call_send(c, id, n > 0 ? (size_t)n : 0) != SPECD_RPC_IO_OK) return;
    for (;;) {
        const uint8_t *buf;
        size_t len;
        specd_rpc_io io = specd_rpc_call_recv(c, &buf, &len, -1);
        if (io == SPECD_RPC_IO_END) break;
        if (io != SPECD_RPC_IO_OK || specd_rpc_call_send(c, buf, len) != SPECD_RPC_IO_OK) return;
    }
    specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

specd_rpc_server *specd_echo_server_start(const char *addr, specd_error *err) {
    specd_rpc_server_opts o = {.listen_addr = addr, .insecure = 1};
    specd_rpc_server *s = specd_rpc_server_create(&o, err);
    if (!s) return NULL;
    if (specd_rpc_register(s, SPECD_ECHO_METHOD, SPECD_RPC_BIDI_STREAMING, h_echo, NULL) ||
        specd_rpc_server_start(s, err)) {
        if (!err->msg[0]) specd_seterr(err, "echo: cannot register");
        specd_rpc_server_destroy(s);
        return NULL;
    }
    return s;
}
