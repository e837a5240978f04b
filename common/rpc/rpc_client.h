/* rpc_client.h - the gRPC client layer: how specd calls a specd service.
 *
 * draft-svc calls target-svc (Verify streams, GetInfo), `specd generate
 * --server` and `specd bench` call draft-svc or target-svc, and the tests call
 * both. All of them go through this one small wrapper over the gRPC C core
 * (no C++), which gives:
 *
 *   - a channel to one address: plaintext (only when asked for by name), TLS
 *     with a CA bundle, or mutual TLS with a client certificate; a message
 *     size limit; keepalive pings so a silently dead peer is noticed;
 *   - unary calls (one request, one response, a deadline);
 *   - streams for server-streaming and bidirectional methods: send a
 *     message, receive the next one with a timeout, half-close, cancel,
 *     read the final status.
 *
 * Threading: a channel is thread-safe and meant to be shared by many calls.
 * A stream belongs to one thread at a time (each has its own completion
 * queue, polled only inside its own functions, so there is no background
 * thread), except specd_rpc_stream_cancel, which any thread may call at any
 * time, e.g. from a cancellation callback, to wake a blocked recv.
 *
 * Errors: every function that can fail fills a specd_error and, where a call
 * is involved, gives the gRPC status code (UNAVAILABLE when the peer cannot
 * be reached or went away, DEADLINE_EXCEEDED, or the server's own status),
 * which is what draft-svc's failover logic keys on. */
#ifndef SPECD_RPC_CLIENT_H
#define SPECD_RPC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "common/util/error.h"

typedef struct specd_rpc_channel specd_rpc_channel;
typedef struct specd_rpc_stream specd_rpc_stream;

typedef struct specd_rpc_channel_opts {
    /* "host:port", "dns:///name:port" (every address the name resolves to,
     * gRPC's resolver) or "unix:/path". Required. */
    const char *target;
    /* TLS: CA bundle (PEM) that the server's certificate must chain to; NULL
     * with insecure = 0 means the system roots. With tls_cert_path and
     * tls_key_path, the client presents that certificate (mutual TLS). */
    const char *tls_ca_path;
    const char *tls_cert_path;
    const char *tls_key_path;
    /* Override of the name checked against the server's certificate (tests
     * and IP-addressed pods); NULL = the host part of target. */
    const char *tls_server_name;
    /* 1 = plaintext. Must be said explicitly, as for the server. */
    int insecure;
    size_t max_message_bytes; /* 0 = SPECD_RPC_DEFAULT_MAX_MESSAGE (4 MiB) */
    /* 0 = 5000: how long one connection attempt (TCP + TLS handshake) may
     * take before the calls waiting on it fail with UNAVAILABLE. A refused
     * connection fails them at once; so does any call made while the
     * channel waits to retry (1 s doubling to 10 s), so failover is quick. */
    int connect_timeout_ms;
} specd_rpc_channel_opts;

/* Creates the channel (connects lazily, on the first call). Reads the TLS
 * files here, so a missing file is reported now. NULL + err on failure.
 * Calls grpc_init(); free calls grpc_shutdown(). */
specd_rpc_channel *specd_rpc_channel_create(const specd_rpc_channel_opts *o, specd_error *err);
void specd_rpc_channel_free(specd_rpc_channel *ch); /* NULL is a no-op; no calls may be live */
const char *specd_rpc_channel_target(const specd_rpc_channel *ch);
/* Connect now on the next call instead of waiting out gRPC's reconnect
 * backoff (up to 10 s): for a health probe that must notice a peer coming
 * back within a second. */
void specd_rpc_channel_reset_backoff(specd_rpc_channel *ch);

/* One request, one response. timeout_ms <= 0 = no deadline. Returns the
 * call's status: GRPC_STATUS_OK with *resp decoded as resp_desc (free with
 * protobuf_c_message_free_unpacked), or the failure code with err holding
 * the server's message (or what went wrong locally) and *resp = NULL.
 * Local failures use gRPC's codes: RESOURCE_EXHAUSTED for a request over
 * the channel's message limit (nothing is sent), INTERNAL for a response
 * that does not decode or is missing. */
grpc_status_code specd_rpc_unary(specd_rpc_channel *ch, const char *method,
                                 const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc,
                                 ProtobufCMessage **resp, int timeout_ms, specd_error *err);

/* Starts a streaming call on `method` ("/specd.v1.Target/Verify").
 * timeout_ms <= 0 = no deadline for the whole call. NULL + err if the call
 * cannot even be created (a failed connection shows up on the first
 * send/recv instead, as UNAVAILABLE). */
specd_rpc_stream *specd_rpc_stream_start(specd_rpc_channel *ch, const char *method,
                                         int timeout_ms, specd_error *err);

/* The same, sending one initial-metadata entry with the call (md_key in
 * lower case, e.g. "x-request-id"; NULL key or value = none): how draft-svc
 * hands its request id to target-svc (specd_rpc_call_metadata reads it). */
specd_rpc_stream *specd_rpc_stream_start_md(specd_rpc_channel *ch, const char *method,
                                            int timeout_ms, const char *md_key,
                                            const char *md_value, specd_error *err);

/* Result of the stream helpers: the same codes as the server side. */
typedef enum specd_rpc_cio {
    SPECD_RPC_CIO_OK = 0,      /* sent / received one message */
    SPECD_RPC_CIO_END = 1,     /* recv: the server ended the stream with status OK
                                * after its last message (finish returns OK) */
    SPECD_RPC_CIO_TIMEOUT = 2, /* recv: nothing within timeout_ms; the read stays
                                * pending and the next recv goes on waiting */
    SPECD_RPC_CIO_FAILED = -1, /* the call is dead: it ended with any other status
                                * (the server's error, cancelled, connection lost,
                                * deadline). recv puts that status in err; finish
                                * returns it. Repeated calls return FAILED again. */
    SPECD_RPC_CIO_INVALID = -2,/* a message that does not encode/decode or is too
                                * big, or a send after half-close; the call lives on */
} specd_rpc_cio;

/* Sends one message (encoded here); close = 1 also half-closes (no more
 * sends). Blocks until gRPC has taken it (flow control), at most as long as
 * the call lives. FAILED when the call is already over (recv or finish then
 * give its status); INVALID, with nothing sent, for a message over the
 * channel's limit or a send after the half-close. */
specd_rpc_cio specd_rpc_stream_send(specd_rpc_stream *st, const ProtobufCMessage *msg, int close,
                                    specd_error *err);
/* Half-closes without a message. */
specd_rpc_cio specd_rpc_stream_close_send(specd_rpc_stream *st, specd_error *err);

/* Receives the next message, decoded as desc (free with
 * protobuf_c_message_free_unpacked). timeout_ms < 0 = wait as long as the
 * call lives (its deadline, a cancel, or keepalive noticing a dead peer end
 * the wait). A message that does not decode is INVALID and skipped; the
 * next recv reads the one after it. */
specd_rpc_cio specd_rpc_stream_recv(specd_rpc_stream *st, const ProtobufCMessageDescriptor *desc,
                                    ProtobufCMessage **out, int timeout_ms, specd_error *err);

/* Cancels the call (the server sees CANCELLED). Idempotent, and callable
 * from any thread at any time between start and free, even after finish; a
 * recv or send blocked in another thread returns FAILED soon after. It must
 * not run concurrently with or after specd_rpc_stream_free: unregister
 * whatever may call it (e.g. specd_rpc_call_on_cancel(c, NULL, NULL)) before
 * freeing the stream. */
void specd_rpc_stream_cancel(specd_rpc_stream *st);

/* Returns the call's final status, with "method on target: CODE: message"
 * in err when it is not OK (the server's message, or gRPC's own reason).
 * After END or FAILED from recv the status is already known. Otherwise:
 *   - if the status has arrived it is returned (gRPC delivers a status only
 *     once every message sent before it has been read);
 *   - after a FAILED send the call is over: messages still unread are read
 *     and dropped to reach its real status (the server's, or UNAVAILABLE);
 *   - else the call is live and is cancelled (ending a stream early): the
 *     status is CANCELLED.
 * So to see a server's OK after half-closing, recv until END first. Calling
 * it again returns the same status. */
grpc_status_code specd_rpc_stream_finish(specd_rpc_stream *st, specd_error *err);

/* "UNAVAILABLE", "INVALID_ARGUMENT", ... for logs and CLI output. */
const char *specd_rpc_status_name(grpc_status_code c);

/* Frees the stream, cancelling it first if it is still live. NULL is a no-op. */
void specd_rpc_stream_free(specd_rpc_stream *st);

/* Raw-bytes twins of specd_rpc_unary, specd_rpc_stream_send and
 * specd_rpc_stream_recv, for payloads already encoded and for bytes that are
 * deliberately not valid protobuf (tests feeding a server malformed input).
 * Same results and errors. *resp / *buf is malloc'd with a NUL byte after
 * its *len bytes (free with free(); non-NULL even for an empty message),
 * NULL unless the result is OK. */
grpc_status_code specd_rpc_unary_bytes(specd_rpc_channel *ch, const char *method, const void *req,
                                       size_t req_len, uint8_t **resp, size_t *resp_len,
                                       int timeout_ms, specd_error *err);
specd_rpc_cio specd_rpc_stream_send_bytes(specd_rpc_stream *st, const void *buf, size_t len,
                                          int close, specd_error *err);
specd_rpc_cio specd_rpc_stream_recv_bytes(specd_rpc_stream *st, uint8_t **buf, size_t *len,
                                          int timeout_ms, specd_error *err);

#endif
