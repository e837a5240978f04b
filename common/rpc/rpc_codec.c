/* rpc_codec.c - protobuf-c encode/decode with size limits, and the call
 * helpers built on them.
 *
 * The server layer moves raw bytes; decoding is the service's business, but
 * every service needs the same two guards: refuse an input larger than the
 * caller allows *before* protobuf-c allocates for it, and report a decode
 * failure with the message type's name instead of a bare NULL. */
#include "common/rpc/rpc_internal.h"

#include <stdlib.h>

#include <grpc/byte_buffer.h>

int specd_rpc_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                     size_t max_len, ProtobufCMessage **out, specd_error *err) {
    *out = NULL;
    if (len > max_len)
        return specd_seterr(err, "%s: message of %zu bytes exceeds the limit of %zu bytes",
                            desc->name, len, max_len);
    /* protobuf-c reads nothing for len 0, but wants a valid pointer */
    static const uint8_t empty[1];
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, buf ? buf : empty);
    if (!m) return specd_seterr(err, "%s: malformed message (%zu bytes)", desc->name, len);
    *out = m;
    return 0;
}

uint8_t *specd_rpc_pack(const ProtobufCMessage *msg, size_t max_len, size_t *len,
                        specd_error *err) {
    size_t n = protobuf_c_message_get_packed_size(msg);
    if (n > max_len) {
        specd_seterr(err, "%s: encoded size %zu exceeds the limit of %zu bytes",
                     msg->descriptor->name, n, max_len);
        return NULL;
    }
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        specd_seterr(err, "%s: out of memory", msg->descriptor->name);
        return NULL;
    }
    *len = protobuf_c_message_pack(msg, buf);
    return buf;
}

specd_rpc_io specd_rpc_call_send_msg(specd_rpc_call *c, const ProtobufCMessage *msg) {
    size_t n = protobuf_c_message_get_packed_size(msg);
    if (n > c->server->max_message) return SPECD_RPC_IO_INVALID;
    if (specd_rpc_call_is_cancelled(c)) return SPECD_RPC_IO_CANCELLED;
    /* encode straight into a gRPC slice: no intermediate copy */
    grpc_slice sl = n ? grpc_slice_malloc(n) : grpc_empty_slice();
    if (n) protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(sl));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return rpc_call_enqueue(c, bb, n);
}

int specd_rpc_call_request_msg(const specd_rpc_call *c, const ProtobufCMessageDescriptor *desc,
                               ProtobufCMessage **out, specd_error *err) {
    size_t len;
    const uint8_t *buf = specd_rpc_call_request(c, &len);
    if (!buf) {
        *out = NULL;
        return specd_seterr(err, "%s: a bidi call has no single request message", desc->name);
    }
    return specd_rpc_unpack(desc, buf, len, c->server->max_message, out, err);
}

specd_rpc_io specd_rpc_call_recv_msg(specd_rpc_call *c, const ProtobufCMessageDescriptor *desc,
                                     ProtobufCMessage **out, int timeout_ms, specd_error *err) {
    const uint8_t *buf;
    size_t len;
    *out = NULL;
    specd_rpc_io r = specd_rpc_call_recv(c, &buf, &len, timeout_ms);
    if (r != SPECD_RPC_IO_OK) return r;
    return specd_rpc_unpack(desc, buf, len, c->server->max_message, out, err)
               ? SPECD_RPC_IO_INVALID
               : SPECD_RPC_IO_OK;
}
