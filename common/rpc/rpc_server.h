/* rpc_server.h - the gRPC server layer both specd services stand on.
 *
 * A small wrapper over the gRPC C core (completion queues, no C++) that gives
 * a service four things:
 *
 *   - a server: listen address (an ephemeral port with "127.0.0.1:0"), TLS or
 *     mutual TLS, plaintext only when asked for by name, message size limit,
 *     a cap on concurrent calls, graceful shutdown and SIGTERM/SIGINT handling;
 *   - method registration by full path ("/specd.v1.Target/Verify") with a
 *     kind (unary, server streaming, bidi) and a handler function;
 *   - a call object with blocking helpers for the handler: the request bytes,
 *     ordered flow-controlled send, receive, finish with a status, deadline
 *     and cancellation (flag and callback);
 *   - the standard grpc.health.v1.Health service (Check, Watch) built in.
 *
 * Threading model (details in rpc_server.c):
 *   One shared completion queue is polled by `cq_threads` threads; every gRPC
 *   event (new call, a send/receive/status finishing, the client going away)
 *   is dispatched by tag to the call it belongs to and only updates that
 *   call's state under its mutex.  Each accepted call gets its own handler
 *   thread, which runs the registered handler; the handler's helpers start a
 *   gRPC operation and sleep on the call's condition variable until a CQ
 *   thread reports it done, so handlers are plain sequential code.  A call
 *   object is freed when its handler has returned and every operation it
 *   started has completed (a reference count), never earlier.
 *
 * Dead clients: a client cancel or disconnect cancels its calls at once;
 * a peer that vanishes silently is found by server keepalive pings within
 * about 40 s.
 *
 * Limits: at most `max_calls` handlers run at once (default 256); a call
 * beyond that is answered RESOURCE_EXHAUSTED at once without a thread.
 * Messages larger than `max_message_bytes` (default 4 MiB) are refused in
 * both directions.  A handler must return soon after its call is cancelled
 * (every blocking helper returns SPECD_RPC_IO_CANCELLED then); shutdown waits
 * for handlers to return.
 *
 * Unless stated otherwise functions are thread-safe.  A call object is valid
 * from the handler's start until the handler returns; other threads (a model
 * worker) may use it in that window, e.g. to send results, but only one
 * thread at a time may be inside specd_rpc_call_recv. */
#ifndef SPECD_RPC_SERVER_H
#define SPECD_RPC_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "common/util/error.h"

typedef struct specd_rpc_server specd_rpc_server;
typedef struct specd_rpc_call specd_rpc_call;

/* ---- server --------------------------------------------------------------- */

#define SPECD_RPC_DEFAULT_MAX_MESSAGE (4u << 20) /* gRPC's own default */
#define SPECD_RPC_DEFAULT_MAX_CALLS 256
#define SPECD_RPC_DEFAULT_CQ_THREADS 2

typedef struct specd_rpc_server_opts {
    /* "0.0.0.0:50051", "[::]:50051", "127.0.0.1:0" (0 = any free port; see
     * specd_rpc_server_port). Required. */
    const char *listen_addr;
    /* TLS: PEM files for the server's certificate chain and private key.
     * With tls_client_ca_path set too, clients must present a certificate
     * signed by that CA (mutual TLS: required and verified). */
    const char *tls_cert_path;
    const char *tls_key_path;
    const char *tls_client_ca_path;
    /* 1 = plaintext. Must be said explicitly: without TLS files and without
     * this flag, create fails rather than silently serving in the clear. */
    int insecure;
    size_t max_message_bytes; /* 0 = SPECD_RPC_DEFAULT_MAX_MESSAGE */
    int max_calls;            /* 0 = SPECD_RPC_DEFAULT_MAX_CALLS */
    int cq_threads;           /* 0 = SPECD_RPC_DEFAULT_CQ_THREADS */
} specd_rpc_server_opts;

/* Binds the listening port (so a port conflict or bad TLS file is reported
 * here) but does not accept calls until specd_rpc_server_start. The health
 * service is registered, with the server as a whole ("") SERVING. Calls
 * grpc_init(); destroy calls grpc_shutdown(). NULL + err on failure. */
specd_rpc_server *specd_rpc_server_create(const specd_rpc_server_opts *o, specd_error *err);

/* The TCP port actually bound (the ephemeral one for ":0"). */
int specd_rpc_server_port(const specd_rpc_server *s);

typedef enum specd_rpc_kind {
    SPECD_RPC_UNARY,            /* one request, one response */
    SPECD_RPC_SERVER_STREAMING, /* one request, a stream of responses */
    SPECD_RPC_BIDI_STREAMING,   /* streams both ways; the handler calls recv */
} specd_rpc_kind;

/* Runs on the call's own thread. For UNARY and SERVER_STREAMING the request
 * message has been read already (specd_rpc_call_request). The handler ends the
 * call with specd_rpc_call_finish; if it returns without doing so the call
 * ends with UNKNOWN "handler returned without a status". */
typedef void (*specd_rpc_handler)(specd_rpc_call *call, void *user);

/* Adds a method by its full path "/package.Service/Method". Only before
 * specd_rpc_server_start. -1 for a NULL/malformed path, a duplicate path,
 * a bad kind, or a started server. Calls to paths never registered are
 * answered UNIMPLEMENTED. */
int specd_rpc_register(specd_rpc_server *s, const char *method, specd_rpc_kind kind,
                       specd_rpc_handler handler, void *user);

/* Starts accepting calls. -1 + err if already started or shut down. */
int specd_rpc_server_start(specd_rpc_server *s, specd_error *err);

/* Graceful stop: health turns NOT_SERVING, new calls are refused, calls in
 * flight get up to grace_ms to finish, then the rest are cancelled; returns
 * once every handler has returned and every thread of the server has been
 * joined. Idempotent; concurrent callers all wait for the end. Not from a
 * handler or a cancellation callback (it waits for those to end). */
void specd_rpc_server_shutdown(specd_rpc_server *s, int grace_ms);

/* Shuts down (grace 0) if still running, frees everything. NULL is a no-op. */
void specd_rpc_server_destroy(specd_rpc_server *s);

/* For a service's main: installs SIGTERM/SIGINT handlers (a self-pipe; the
 * handler only writes one byte), waits for one of them, restores the previous
 * handlers, then shuts the server down with grace_ms. Returns the signal
 * number, or -1 if the handlers could not be installed. One server per
 * process at a time may wait here. */
int specd_rpc_server_run_until_signal(specd_rpc_server *s, int grace_ms);

/* Sets the health of a service name as seen by grpc.health.v1.Health
 * ("" or NULL = the server as a whole). The first call for a name makes it
 * known; Check for a name never set answers NOT_FOUND. Watchers are told at
 * once. Ignored after shutdown has begun (everything is NOT_SERVING then). */
void specd_rpc_set_health(specd_rpc_server *s, const char *service, int serving);

typedef struct specd_rpc_stats {
    int64_t calls_live;      /* call objects not yet freed (incl. rejected ones) */
    int64_t handlers_running;
    int64_t calls_started;   /* handlers started since create */
    int64_t calls_rejected;  /* UNIMPLEMENTED or RESOURCE_EXHAUSTED at the door */
    int64_t calls_cancelled; /* calls that ended cancelled (client, deadline, shutdown) */
} specd_rpc_stats;

void specd_rpc_server_stats(specd_rpc_server *s, specd_rpc_stats *out);

/* ---- calls (from a handler) ---------------------------------------------- */

/* Result of the blocking I/O helpers. */
typedef enum specd_rpc_io {
    SPECD_RPC_IO_OK = 0,        /* sent (queued in order) / received a message */
    SPECD_RPC_IO_END = 1,       /* recv: the client half-closed, no more messages */
    SPECD_RPC_IO_TIMEOUT = 2,   /* recv: nothing arrived in timeout_ms; call still live */
    SPECD_RPC_IO_CANCELLED = -1,/* the call is dead (client cancel or disconnect,
                                   deadline, server shutdown): stop working */
    SPECD_RPC_IO_INVALID = -2,  /* too large, malformed, or used after finish */
} specd_rpc_io;

/* Full method path, e.g. "/specd.v1.Target/Verify". */
const char *specd_rpc_call_method(const specd_rpc_call *c);

/* The request message of a UNARY / SERVER_STREAMING call (valid until the
 * handler returns; *len may be 0 for an empty message). NULL for BIDI. */
const uint8_t *specd_rpc_call_request(const specd_rpc_call *c, size_t *len);

/* Queues one response message (copied) behind those queued before it; a CQ
 * thread writes them one at a time as HTTP/2 flow control allows. Blocks
 * while the queue is full (64 messages or 1 MiB), so a slow client slows the
 * handler instead of growing memory. */
specd_rpc_io specd_rpc_call_send(specd_rpc_call *c, const void *buf, size_t len);

/* Waits for the next client message (timeout_ms < 0: no limit except the
 * call's deadline and cancellation). On OK, *buf and *len hold the message, valid
 * until the next recv or the handler's return. After TIMEOUT the read stays
 * pending and the next recv continues waiting for it. */
specd_rpc_io specd_rpc_call_recv(specd_rpc_call *c, const uint8_t **buf, size_t *len,
                                 int timeout_ms);

/* Ends the call: waits until every queued message is written, then sends the
 * status (message may be NULL) and waits for that to be written. 0 on
 * success, -1 if the call was cancelled first or was finished already. */
int specd_rpc_call_finish(specd_rpc_call *c, grpc_status_code code, const char *message);

/* Milliseconds until the client's deadline (<= 0 once passed), INT64_MAX if
 * the client set none. gRPC cancels the call at the deadline by itself. */
int64_t specd_rpc_call_deadline_ms_left(const specd_rpc_call *c);

/* 1 once the call can no longer complete: the client cancelled or went away,
 * the deadline passed, a write failed, or shutdown cancelled it. A cheap
 * atomic load: a model worker may poll it between steps. */
int specd_rpc_call_is_cancelled(const specd_rpc_call *c);

/* Registers fn(arg) to run once when the call becomes cancelled (at once, in
 * this thread, if it already is). It runs on a CQ thread, never inside a
 * specd_rpc_call_* function of the handler: it must be quick and must not
 * call specd_rpc_call_* functions other than is_cancelled (typically it sets
 * a flag and signals the worker's condition variable). fn = NULL unregisters;
 * after that returns, fn is not running and will not run, so arg may be
 * freed. The handler's registration is dropped when it returns. */
void specd_rpc_call_on_cancel(specd_rpc_call *c, void (*fn)(void *arg), void *arg);

/* The value of the client's initial-metadata entry `key` (lower case) into
 * buf, NUL-terminated; the length, or -1 when the client sent none. The value
 * comes from the client: a caller must check it before logging it (see
 * common/rpc/request_log.h). A longer value is cut at cap - 1 bytes. */
int specd_rpc_call_metadata(const specd_rpc_call *c, const char *key, char *buf, size_t cap);

/* The status the call ended with (CANCELLED if it ended without one of
 * ours), UNKNOWN while it has not ended. For the request log. */
grpc_status_code specd_rpc_call_status(specd_rpc_call *c);

/* The client's address ("ipv4:127.0.0.1:53412") into buf; returns buf. */
const char *specd_rpc_call_peer(specd_rpc_call *c, char *buf, size_t cap);

/* ---- protobuf-c helpers (rpc_codec.c) ------------------------------------ */

/* Decodes buf as a message of type desc, refusing inputs over max_len bytes
 * before parsing. 0 and *out (free with protobuf_c_message_free_unpacked)
 * or -1 + err naming the type. */
int specd_rpc_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                     size_t max_len, ProtobufCMessage **out, specd_error *err);

/* Encodes msg into a malloc'd buffer, refusing a result over max_len bytes.
 * NULL + err on failure; a zero-length message gives a non-NULL buffer. */
uint8_t *specd_rpc_pack(const ProtobufCMessage *msg, size_t max_len, size_t *len,
                        specd_error *err);

/* specd_rpc_call_send of msg encoded (INVALID if over the server's limit). */
specd_rpc_io specd_rpc_call_send_msg(specd_rpc_call *c, const ProtobufCMessage *msg);

/* The request decoded as desc: 0 + *out, or -1 + err (the handler would then
 * finish with INVALID_ARGUMENT). */
int specd_rpc_call_request_msg(const specd_rpc_call *c, const ProtobufCMessageDescriptor *desc,
                               ProtobufCMessage **out, specd_error *err);

/* specd_rpc_call_recv + decode; a message that does not decode gives
 * SPECD_RPC_IO_INVALID with err set. */
specd_rpc_io specd_rpc_call_recv_msg(specd_rpc_call *c, const ProtobufCMessageDescriptor *desc,
                                     ProtobufCMessage **out, int timeout_ms, specd_error *err);

#endif
