/* rpc_client.c - the gRPC client layer (rpc_client.h) over the C core.
 *
 * No background threads. Every call, unary or streaming, gets a completion
 * queue of its own created for grpc_completion_queue_pluck: the thread using
 * the call starts a batch and plucks that batch's tag, so each function of
 * the API is plain blocking code and nothing ever needs to be dispatched.
 *
 * A stream keeps two kinds of batch apart:
 *   - STATUS, started with the call itself: SEND_INITIAL_METADATA,
 *     RECV_INITIAL_METADATA and RECV_STATUS_ON_CLIENT. It completes only
 *     when the call is over, so the final status is captured however and
 *     whenever the call ends, and is plucked once the read side has closed
 *     (recv saw the end) or in finish/free.
 *   - SEND and RECV, one at a time each. A RECV plucked with a timeout that
 *     expires stays in flight (like the server side's recv), and the next
 *     recv goes on plucking it; free drains it.
 * Waits have no deadline of their own: gRPC completes every batch when the
 * call ends, which its deadline, a cancel (from any thread) or keepalive
 * noticing a dead peer all bring about, so no wait outlives the call.
 *
 * In the C core a client's status is delivered only after every message the
 * server sent has been read (or the call was cancelled, which discards
 * them). That is why recv waits for the status right after the read that
 * finds the end, and why finish on a live stream cancels it rather than wait
 * for a status that unread messages may hold back forever. */
#include "common/rpc/rpc_client.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "common/rpc/rpc_internal.h"

#define RPC_DEFAULT_CONNECT_TIMEOUT_MS 5000
/* Keepalive: ping every 10 s, connections without calls included, and drop
 * the connection if no ack comes within 5 s. A target that vanishes without
 * a TCP reset (node lost, partition) then fails its calls with UNAVAILABLE
 * within ~15 s instead of the kernel's TCP timeout, and draft-svc fails over.
 * rpc_server.c accepts pings this frequent (RPC_MIN_RECV_PING_INTERVAL_MS). */
#define RPC_CLIENT_KEEPALIVE_MS 10000
#define RPC_CLIENT_KEEPALIVE_TIMEOUT_MS 5000
/* Reconnect backoff after a failed connection: gRPC's 1 s start, but capped
 * at 10 s instead of 120 s so a target that comes back is used again soon. */
#define RPC_CLIENT_INITIAL_BACKOFF_MS 1000
#define RPC_CLIENT_MAX_BACKOFF_MS 10000

struct specd_rpc_channel {
    grpc_channel *channel;
    char *target;
    size_t max_message;
};

/* Batch tags; every call has its own CQ, so small constants are unique. */
enum { TAG_STATUS = 1, TAG_SEND, TAG_RECV, TAG_UNARY };
#define TAG(t) ((void *)(intptr_t)(t))

struct specd_rpc_stream {
    specd_rpc_channel *ch;
    grpc_call *call;
    grpc_completion_queue *cq;
    char *method;

    /* the STATUS batch's outputs */
    grpc_metadata_array init_md, trail_md;
    grpc_status_code status;
    grpc_slice details;
    int status_done; /* STATUS plucked: status and details are final */
    grpc_metadata md; /* one initial-metadata entry sent with the call (md_n) */
    int md_n;

    grpc_byte_buffer *recv_bb; /* RECV_MESSAGE's output */
    int recv_pending;          /* a RECV batch is in flight (a TIMEOUT left it) */
    specd_rpc_cio ended;       /* 0, or END / FAILED once recv found the end: sticky */
    int send_failed;           /* a SEND batch failed: the call is over */
    int half_closed;
    /* set by specd_rpc_stream_cancel (any thread), read by the owner */
    atomic_int cancelled;
};

/* ---- small helpers --------------------------------------------------------- */

static gpr_timespec deadline_in(int timeout_ms) {
    if (timeout_ms < 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

/* Plucks tag, waiting at most until deadline. 1 = the batch completed
 * (*success set), 0 = still in flight at the deadline. */
static int pluck(grpc_completion_queue *cq, intptr_t tag, gpr_timespec deadline, int *success) {
    grpc_event ev = grpc_completion_queue_pluck(cq, TAG(tag), deadline, NULL);
    if (ev.type != GRPC_OP_COMPLETE) return 0; /* GRPC_QUEUE_TIMEOUT */
    if (success) *success = ev.success;
    return 1;
}

/* For a batch gRPC is bound to complete (see the top of the file). */
static int pluck_done(grpc_completion_queue *cq, intptr_t tag) {
    int success = 0;
    pluck(cq, tag, gpr_inf_future(GPR_CLOCK_MONOTONIC), &success);
    return success;
}

/* Shuts a CQ down, drains it and destroys it (every batch has been plucked
 * already, so this only waits for the shutdown event). */
static void cq_destroy(grpc_completion_queue *cq) {
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
}

const char *specd_rpc_status_name(grpc_status_code c) {
    /* The C core has no public name table; these are the canonical names
     * (grpc/status.h order), the ones users grep logs for. */
    static const char *names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if ((int)c >= 0 && (size_t)c < sizeof names / sizeof names[0]) return names[c];
    return "UNKNOWN_STATUS";
}

/* err = "method on target: CODE: details" for a non-OK status. */
static void status_err(specd_error *err, const specd_rpc_channel *ch, const char *method,
                       grpc_status_code code, grpc_slice details) {
    if (code == GRPC_STATUS_OK) return;
    int n = (int)GRPC_SLICE_LENGTH(details);
    const char *d = (const char *)GRPC_SLICE_START_PTR(details);
    const char *name = specd_rpc_status_name(code);
    /* gRPC's own cancel says just "CANCELLED": once is enough */
    if ((size_t)n == strlen(name) && !memcmp(d, name, (size_t)n)) n = 0;
    specd_seterr(err, "%s on %s: %s%s%.*s", method, ch->target, name, n ? ": " : "", n, d);
}

/* One message as a byte buffer. Encoded straight into a gRPC slice, so
 * there is no intermediate copy. NULL + err (naming the type) if it is over
 * max bytes. */
static grpc_byte_buffer *encode(const ProtobufCMessage *msg, size_t max, specd_error *err) {
    size_t n = protobuf_c_message_get_packed_size(msg);
    if (n > max) {
        specd_seterr(err, "%s: encoded size %zu exceeds the message limit of %zu bytes",
                     msg->descriptor->name, n, max);
        return NULL;
    }
    grpc_slice sl = n ? grpc_slice_malloc(n) : grpc_empty_slice();
    if (n) protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(sl));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl); /* the byte buffer holds its own reference */
    return bb;
}

static grpc_byte_buffer *bytes_bb(const void *buf, size_t len) {
    grpc_slice sl = len ? grpc_slice_from_copied_buffer(buf, len) : grpc_empty_slice();
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

/* A received message as one contiguous slice (a received buffer may be split
 * in several, or compressed; the reader undoes both). */
static int bb_slice(grpc_byte_buffer *bb, grpc_slice *out) {
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb)) return -1; /* cannot decompress */
    *out = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    return 0;
}

/* Decodes a received message as desc; takes bb. */
static int decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc, size_t max,
                  ProtobufCMessage **out, specd_error *err) {
    grpc_slice sl;
    int rc = bb_slice(bb, &sl);
    grpc_byte_buffer_destroy(bb);
    if (rc) return specd_seterr(err, "%s: cannot decompress the message", desc->name);
    rc = specd_rpc_unpack(desc, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl), max, out, err);
    grpc_slice_unref(sl);
    return rc;
}

/* Copies a received message into malloc'd memory with a NUL after it; takes bb. */
static int copy_out(grpc_byte_buffer *bb, uint8_t **buf, size_t *len, specd_error *err) {
    grpc_slice sl;
    int rc = bb_slice(bb, &sl);
    grpc_byte_buffer_destroy(bb);
    if (rc) return specd_seterr(err, "rpc client: cannot decompress the message");
    size_t n = GRPC_SLICE_LENGTH(sl);
    uint8_t *p = malloc(n + 1);
    if (p) {
        if (n) memcpy(p, GRPC_SLICE_START_PTR(sl), n);
        p[n] = 0;
    }
    grpc_slice_unref(sl);
    if (!p) return specd_seterr(err, "rpc client: out of memory for a %zu-byte message", n);
    *buf = p;
    *len = n;
    return 0;
}

/* ---- channel ---------------------------------------------------------------- */

static int check_opts(const specd_rpc_channel_opts *o, specd_error *err) {
    if (!o || !o->target || !o->target[0]) return specd_seterr(err, "rpc client: target is required");
    int tls = o->tls_ca_path || o->tls_cert_path || o->tls_key_path || o->tls_server_name;
    if (o->insecure && tls)
        return specd_seterr(err, "rpc client: %s: insecure = 1 and TLS settings are both set; "
                                 "choose one", o->target);
    if (!o->tls_cert_path != !o->tls_key_path)
        return specd_seterr(err, "rpc client: %s: a client certificate needs both "
                                 "tls_cert_path and tls_key_path", o->target);
    if (o->max_message_bytes > INT_MAX)
        return specd_seterr(err, "rpc client: max_message_bytes %zu exceeds %d",
                            o->max_message_bytes, INT_MAX);
    if (o->connect_timeout_ms < 0)
        return specd_seterr(err, "rpc client: connect_timeout_ms must be >= 0");
    return 0;
}

/* Channel credentials: plaintext (asked for by name), TLS trusting a CA file
 * or the system roots, or mutual TLS presenting a client certificate. */
static grpc_channel_credentials *make_credentials(const specd_rpc_channel_opts *o,
                                                  specd_error *err) {
    if (o->insecure) return grpc_insecure_credentials_create();
    const char *who = "rpc client";
    char *ca = NULL, *cert = NULL, *key = NULL;
    int ok = 1;
    if (o->tls_ca_path) ok = (ca = rpc_read_pem(o->tls_ca_path, who, "TLS CA", err)) != NULL;
    if (ok && o->tls_cert_path)
        ok = (cert = rpc_read_pem(o->tls_cert_path, who, "TLS client certificate", err)) != NULL;
    if (ok && o->tls_key_path)
        ok = (key = rpc_read_pem(o->tls_key_path, who, "TLS client key", err)) != NULL;
    grpc_channel_credentials *creds = NULL;
    if (ok) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        /* ca NULL: gRPC's default roots (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH or
         * the system bundle) */
        creds = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
        if (!creds) specd_seterr(err, "rpc client: %s: cannot create TLS credentials", o->target);
    }
    /* gRPC copies the PEM strings */
    free(ca);
    free(cert);
    free(key);
    return creds;
}

specd_rpc_channel *specd_rpc_channel_create(const specd_rpc_channel_opts *o, specd_error *err) {
    if (check_opts(o, err)) return NULL;
    specd_rpc_channel *ch = calloc(1, sizeof *ch);
    char *target = strdup(o->target);
    if (!ch || !target) {
        free(ch);
        free(target);
        specd_seterr(err, "rpc client: out of memory");
        return NULL;
    }
    ch->target = target;
    ch->max_message = o->max_message_bytes ? o->max_message_bytes : SPECD_RPC_DEFAULT_MAX_MESSAGE;
    int connect_ms = o->connect_timeout_ms ? o->connect_timeout_ms : RPC_DEFAULT_CONNECT_TIMEOUT_MS;
    grpc_init();
    grpc_channel_credentials *creds = make_credentials(o, err);
    if (!creds) {
        free(ch->target);
        free(ch);
        grpc_shutdown();
        return NULL;
    }
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)ch->max_message},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = (int)ch->max_message},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS,
         .value.integer = RPC_CLIENT_KEEPALIVE_MS},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
         .value.integer = RPC_CLIENT_KEEPALIVE_TIMEOUT_MS},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
         .value.integer = 1},
        /* gRPC stops pinging after two pings with no data sent in between
         * unless this is 0, which would blind keepalive exactly while a
         * Verify stream waits in silence */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA,
         .value.integer = 0},
        /* Despite its name, gRPC uses this as the minimum time one connection
         * attempt is given (default 20 s) before it fails the calls waiting
         * on it: our connect timeout. */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
         .value.integer = connect_ms},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
         .value.integer = RPC_CLIENT_INITIAL_BACKOFF_MS},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
         .value.integer = RPC_CLIENT_MAX_BACKOFF_MS},
        /* No transparent retries: failover is draft-svc's decision (it
         * re-opens a session elsewhere with the full history), and the retry
         * layer would otherwise keep a copy of every message a stream sends
         * until the call commits. */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ENABLE_RETRIES, .value.integer = 0},
        /* last, and only with TLS: the name the server certificate must carry */
        {.type = GRPC_ARG_STRING, .key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
         .value.string = (char *)o->tls_server_name},
    };
    size_t n_args = sizeof args / sizeof args[0];
    if (!o->tls_server_name) n_args--;
    grpc_channel_args cargs = {.num_args = n_args, .args = args};
    /* Calls are made without GRPC_INITIAL_METADATA_WAIT_FOR_READY, so a call
     * on a channel that cannot connect fails with UNAVAILABLE instead of
     * waiting for the target to come back. */
    ch->channel = grpc_channel_create(ch->target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    if (!ch->channel) {
        /* gRPC returns a "lame" channel rather than NULL for a bad target,
         * whose calls fail with UNAVAILABLE; NULL means something worse */
        specd_seterr(err, "rpc client: cannot create a channel to %s", ch->target);
        free(ch->target);
        free(ch);
        grpc_shutdown();
        return NULL;
    }
    return ch;
}

void specd_rpc_channel_free(specd_rpc_channel *ch) {
    if (!ch) return;
    grpc_channel_destroy(ch->channel);
    free(ch->target);
    free(ch);
    grpc_shutdown(); /* pairs with grpc_init in create */
}

const char *specd_rpc_channel_target(const specd_rpc_channel *ch) { return ch->target; }

void specd_rpc_channel_reset_backoff(specd_rpc_channel *ch) {
    grpc_channel_reset_connect_backoff(ch->channel);
}

static grpc_call *new_call(specd_rpc_channel *ch, grpc_completion_queue *cq, const char *method,
                           int timeout_ms) {
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m,
                                               NULL, deadline_in(timeout_ms > 0 ? timeout_ms : -1),
                                               NULL);
    grpc_slice_unref(m);
    return call;
}

/* ---- unary -------------------------------------------------------------------- */

/* One call with every op in one batch; takes req. On OK, *resp holds the
 * response (NULL if the server sent none). */
static grpc_status_code unary_bb(specd_rpc_channel *ch, const char *method, grpc_byte_buffer *req,
                                 grpc_byte_buffer **resp, int timeout_ms, specd_error *err) {
    *resp = NULL;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_call *call = new_call(ch, cq, method, timeout_ms);
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_status_code status = GRPC_STATUS_INTERNAL;
    grpc_slice details = grpc_empty_slice();
    grpc_byte_buffer *rbb = NULL;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &rbb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, TAG(TAG_UNARY), NULL);
    if (e == GRPC_CALL_OK) {
        /* bounded by the call's deadline, or without one by the connect
         * timeout and keepalive */
        pluck_done(cq, TAG_UNARY);
        if (status != GRPC_STATUS_OK) {
            status_err(err, ch, method, status, details);
        } else if (!rbb) {
            status = GRPC_STATUS_INTERNAL;
            specd_seterr(err, "%s on %s: the server sent status OK without a response message",
                         method, ch->target);
        }
    } else {
        specd_seterr(err, "%s on %s: cannot start the call: %s", method, ch->target,
                     grpc_call_error_to_string(e));
    }
    if (status == GRPC_STATUS_OK) {
        *resp = rbb;
    } else if (rbb) {
        grpc_byte_buffer_destroy(rbb);
    }
    grpc_byte_buffer_destroy(req);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_call_unref(call);
    cq_destroy(cq);
    return status;
}

grpc_status_code specd_rpc_unary(specd_rpc_channel *ch, const char *method,
                                 const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc,
                                 ProtobufCMessage **resp, int timeout_ms, specd_error *err) {
    *resp = NULL;
    grpc_byte_buffer *bb = encode(req, ch->max_message, err);
    if (!bb) {
        /* what gRPC itself answers for an oversize message; nothing was sent */
        specd_preferr(err, "%s on %s", method, ch->target);
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    grpc_byte_buffer *rbb;
    grpc_status_code st = unary_bb(ch, method, bb, &rbb, timeout_ms, err);
    if (st != GRPC_STATUS_OK) return st;
    if (decode(rbb, resp_desc, ch->max_message, resp, err)) {
        specd_preferr(err, "%s on %s", method, ch->target);
        return GRPC_STATUS_INTERNAL;
    }
    return GRPC_STATUS_OK;
}

grpc_status_code specd_rpc_unary_bytes(specd_rpc_channel *ch, const char *method, const void *req,
                                       size_t req_len, uint8_t **resp, size_t *resp_len,
                                       int timeout_ms, specd_error *err) {
    *resp = NULL;
    *resp_len = 0;
    if (req_len > ch->max_message) {
        specd_seterr(err, "%s on %s: request of %zu bytes exceeds the message limit of %zu bytes",
                     method, ch->target, req_len, ch->max_message);
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    grpc_byte_buffer *rbb;
    grpc_status_code st = unary_bb(ch, method, bytes_bb(req, req_len), &rbb, timeout_ms, err);
    if (st != GRPC_STATUS_OK) return st;
    if (copy_out(rbb, resp, resp_len, err)) {
        specd_preferr(err, "%s on %s", method, ch->target);
        return GRPC_STATUS_INTERNAL;
    }
    return GRPC_STATUS_OK;
}

/* ---- streams -------------------------------------------------------------------- */

specd_rpc_stream *specd_rpc_stream_start(specd_rpc_channel *ch, const char *method,
                                         int timeout_ms, specd_error *err) {
    return specd_rpc_stream_start_md(ch, method, timeout_ms, NULL, NULL, err);
}

specd_rpc_stream *specd_rpc_stream_start_md(specd_rpc_channel *ch, const char *method,
                                            int timeout_ms, const char *md_key,
                                            const char *md_value, specd_error *err) {
    specd_rpc_stream *st = calloc(1, sizeof *st);
    char *m = strdup(method);
    if (!st || !m) {
        free(st);
        free(m);
        specd_seterr(err, "%s on %s: out of memory", method, ch->target);
        return NULL;
    }
    st->ch = ch;
    st->method = m;
    atomic_init(&st->cancelled, 0);
    st->details = grpc_empty_slice();
    grpc_metadata_array_init(&st->init_md);
    grpc_metadata_array_init(&st->trail_md);
    st->cq = grpc_completion_queue_create_for_pluck(NULL);
    st->call = new_call(ch, st->cq, method, timeout_ms);
    /* The STATUS batch (top of file). Sending the initial metadata here also
     * lets the server's handler start before our first message. */
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (md_key && md_value) {
        /* the slices live with the stream: gRPC may read them until the
         * batch that sends them completes */
        st->md.key = grpc_slice_from_copied_string(md_key);
        st->md.value = grpc_slice_from_copied_string(md_value);
        st->md_n = 1;
        ops[0].data.send_initial_metadata.count = 1;
        ops[0].data.send_initial_metadata.metadata = &st->md;
    }
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &st->init_md;
    ops[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[2].data.recv_status_on_client.trailing_metadata = &st->trail_md;
    ops[2].data.recv_status_on_client.status = &st->status;
    ops[2].data.recv_status_on_client.status_details = &st->details;
    grpc_call_error e = grpc_call_start_batch(st->call, ops, 3, TAG(TAG_STATUS), NULL);
    if (e != GRPC_CALL_OK) {
        specd_seterr(err, "%s on %s: cannot start the call: %s", method, ch->target,
                     grpc_call_error_to_string(e));
        /* nothing is in flight: the STATUS batch is the first one */
        st->status_done = 1;
        specd_rpc_stream_free(st);
        return NULL;
    }
    return st;
}

/* Plucks the STATUS batch if not yet done (the call is over, or about to be). */
static void wait_status(specd_rpc_stream *st) {
    if (st->status_done) return;
    pluck_done(st->cq, TAG_STATUS);
    st->status_done = 1;
}

/* FAILED's message: the status if known, else why the call is over. */
static void failed_err(specd_rpc_stream *st, specd_error *err) {
    if (st->status_done && st->status != GRPC_STATUS_OK)
        status_err(err, st->ch, st->method, st->status, st->details);
    else if (atomic_load(&st->cancelled))
        specd_seterr(err, "%s on %s: cancelled", st->method, st->ch->target);
    else
        specd_seterr(err, "%s on %s: the call is over (specd_rpc_stream_finish gives its status)",
                     st->method, st->ch->target);
}

/* The read side has closed: the status is on its way (top of file). */
static specd_rpc_cio read_closed(specd_rpc_stream *st, specd_error *err) {
    wait_status(st);
    st->ended = st->status == GRPC_STATUS_OK && !atomic_load(&st->cancelled) ? SPECD_RPC_CIO_END
                                                                             : SPECD_RPC_CIO_FAILED;
    if (st->ended == SPECD_RPC_CIO_FAILED) failed_err(st, err);
    return st->ended;
}

/* Sends bb (taken) with an optional half-close. */
static specd_rpc_cio send_bb(specd_rpc_stream *st, grpc_byte_buffer *bb, int close,
                             specd_error *err) {
    specd_rpc_cio r;
    if (st->ended || st->send_failed || atomic_load(&st->cancelled)) {
        failed_err(st, err);
        r = SPECD_RPC_CIO_FAILED;
    } else if (st->half_closed) {
        specd_seterr(err, "%s on %s: send after the half-close", st->method, st->ch->target);
        r = SPECD_RPC_CIO_INVALID;
    } else {
        grpc_op ops[2];
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_MESSAGE;
        ops[0].data.send_message.send_message = bb;
        ops[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        size_t n = bb ? 1 : 0;
        if (close) n++;
        grpc_call_error e = grpc_call_start_batch(st->call, bb ? ops : ops + 1, n, TAG(TAG_SEND),
                                                  NULL);
        if (e != GRPC_CALL_OK) {
            /* our state machine went wrong; end the call rather than hang */
            specd_seterr(err, "%s on %s: cannot send: %s", st->method, st->ch->target,
                         grpc_call_error_to_string(e));
            specd_rpc_stream_cancel(st);
            st->send_failed = 1;
            r = SPECD_RPC_CIO_FAILED;
        } else if (pluck_done(st->cq, TAG_SEND)) {
            if (close) st->half_closed = 1;
            r = SPECD_RPC_CIO_OK;
        } else {
            st->send_failed = 1;
            failed_err(st, err);
            r = SPECD_RPC_CIO_FAILED;
        }
    }
    if (bb) grpc_byte_buffer_destroy(bb);
    return r;
}

specd_rpc_cio specd_rpc_stream_send(specd_rpc_stream *st, const ProtobufCMessage *msg, int close,
                                    specd_error *err) {
    grpc_byte_buffer *bb = encode(msg, st->ch->max_message, err);
    if (!bb) {
        specd_preferr(err, "%s on %s", st->method, st->ch->target);
        return SPECD_RPC_CIO_INVALID;
    }
    return send_bb(st, bb, close, err);
}

specd_rpc_cio specd_rpc_stream_send_bytes(specd_rpc_stream *st, const void *buf, size_t len,
                                          int close, specd_error *err) {
    if (len > st->ch->max_message) {
        specd_seterr(err, "%s on %s: message of %zu bytes exceeds the message limit of %zu bytes",
                     st->method, st->ch->target, len, st->ch->max_message);
        return SPECD_RPC_CIO_INVALID;
    }
    return send_bb(st, bytes_bb(buf, len), close, err);
}

specd_rpc_cio specd_rpc_stream_close_send(specd_rpc_stream *st, specd_error *err) {
    if (st->half_closed) return SPECD_RPC_CIO_OK; /* already: harmless */
    return send_bb(st, NULL, 1, err);
}

/* The next message as a byte buffer (*out, caller's), or how the stream stands. */
static specd_rpc_cio recv_bb(specd_rpc_stream *st, grpc_byte_buffer **out, int timeout_ms,
                             specd_error *err) {
    *out = NULL;
    if (st->ended) {
        if (st->ended == SPECD_RPC_CIO_FAILED) failed_err(st, err);
        return st->ended;
    }
    if (!st->recv_pending) {
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &st->recv_bb;
        grpc_call_error e = grpc_call_start_batch(st->call, &op, 1, TAG(TAG_RECV), NULL);
        if (e != GRPC_CALL_OK) {
            specd_seterr(err, "%s on %s: cannot receive: %s", st->method, st->ch->target,
                         grpc_call_error_to_string(e));
            /* end the call so that its status arrives; then say FAILED */
            specd_rpc_stream_cancel(st);
            wait_status(st);
            st->ended = SPECD_RPC_CIO_FAILED;
            return st->ended;
        }
        st->recv_pending = 1;
    }
    int success;
    if (!pluck(st->cq, TAG_RECV, deadline_in(timeout_ms), &success))
        return SPECD_RPC_CIO_TIMEOUT; /* the read stays in flight */
    st->recv_pending = 0;
    grpc_byte_buffer *bb = st->recv_bb;
    st->recv_bb = NULL;
    if (success && bb && !atomic_load(&st->cancelled)) {
        *out = bb;
        return SPECD_RPC_CIO_OK;
    }
    /* no message: the read side is closed (a message that raced our cancel
     * is dropped, so a cancelled stream reads FAILED as promised) */
    if (bb) grpc_byte_buffer_destroy(bb);
    return read_closed(st, err);
}

specd_rpc_cio specd_rpc_stream_recv(specd_rpc_stream *st, const ProtobufCMessageDescriptor *desc,
                                    ProtobufCMessage **out, int timeout_ms, specd_error *err) {
    *out = NULL;
    grpc_byte_buffer *bb;
    specd_rpc_cio r = recv_bb(st, &bb, timeout_ms, err);
    if (r != SPECD_RPC_CIO_OK) return r;
    if (decode(bb, desc, st->ch->max_message, out, err)) {
        specd_preferr(err, "%s on %s", st->method, st->ch->target);
        return SPECD_RPC_CIO_INVALID;
    }
    return SPECD_RPC_CIO_OK;
}

specd_rpc_cio specd_rpc_stream_recv_bytes(specd_rpc_stream *st, uint8_t **buf, size_t *len,
                                          int timeout_ms, specd_error *err) {
    *buf = NULL;
    *len = 0;
    grpc_byte_buffer *bb;
    specd_rpc_cio r = recv_bb(st, &bb, timeout_ms, err);
    if (r != SPECD_RPC_CIO_OK) return r;
    if (copy_out(bb, buf, len, err)) {
        specd_preferr(err, "%s on %s", st->method, st->ch->target);
        return SPECD_RPC_CIO_INVALID;
    }
    return SPECD_RPC_CIO_OK;
}

void specd_rpc_stream_cancel(specd_rpc_stream *st) {
    /* The grpc_call lives until free (finish does not unref it), so this is
     * safe at any time before free; grpc_call_cancel is thread-safe, and the
     * exchange makes a second cancel a no-op. */
    if (!atomic_exchange(&st->cancelled, 1)) grpc_call_cancel(st->call, NULL);
}

grpc_status_code specd_rpc_stream_finish(specd_rpc_stream *st, specd_error *err) {
    int success;
    if (!st->status_done && pluck(st->cq, TAG_STATUS, gpr_inf_past(GPR_CLOCK_MONOTONIC), &success))
        st->status_done = 1; /* the server (or gRPC) had ended the call already */
    if (!st->status_done) {
        /* A live call is ended by cancelling it. A call whose send failed is
         * over already, but its status may be held back by messages not yet
         * read (top of file): read and drop them instead of cancelling, so
         * the real status (the server's, or UNAVAILABLE for a lost
         * connection) is what we report, not CANCELLED. */
        if (!st->send_failed) specd_rpc_stream_cancel(st);
        while (!st->ended) {
            grpc_byte_buffer *bb;
            if (recv_bb(st, &bb, -1, NULL) == SPECD_RPC_CIO_OK) grpc_byte_buffer_destroy(bb);
        }
        wait_status(st);
    }
    status_err(err, st->ch, st->method, st->status, st->details);
    return st->status;
}

void specd_rpc_stream_free(specd_rpc_stream *st) {
    if (!st) return;
    if (!st->status_done) specd_rpc_stream_cancel(st);
    /* every batch in flight completes now that the call is over */
    if (st->recv_pending) {
        pluck_done(st->cq, TAG_RECV);
        if (st->recv_bb) grpc_byte_buffer_destroy(st->recv_bb);
    }
    wait_status(st);
    grpc_call_unref(st->call);
    cq_destroy(st->cq);
    grpc_slice_unref(st->details);
    grpc_metadata_array_destroy(&st->init_md);
    grpc_metadata_array_destroy(&st->trail_md);
    if (st->md_n) {
        grpc_slice_unref(st->md.key);
        grpc_slice_unref(st->md.value);
    }
    free(st->method);
    free(st);
}
