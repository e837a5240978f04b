/* rpc_call.c - one call's state machine and the blocking helpers handlers use.
 *
 * Two kinds of thread touch a call:
 *   - CQ threads (rpc_server.c) report completed gRPC operations through
 *     rpc_call_on_*: they update state under c->mu, start the next queued
 *     send, and broadcast c->cv;
 *   - the handler thread (and any worker it lends the call to) calls
 *     specd_rpc_call_*: they start an operation under c->mu and wait on c->cv
 *     for its completion, for queue space, or for cancellation.
 *
 * Lifetime is a reference count under c->mu: one for the handler thread and
 * one per gRPC batch in flight (the RECV_CLOSE_ON_SERVER batch is started the
 * moment a call is accepted and completes only when the call is over, so it
 * pins the call for its whole life). Whoever drops the last reference frees
 * the call, including grpc_call_unref, and then tells the server (calls_live),
 * which is how shutdown knows everything is gone.
 *
 * Cancellation: `cancelled` becomes 1 when RECV_CLOSE_ON_SERVER reports the
 * call cancelled (client cancel or disconnect, deadline, shutdown's
 * cancel_all) or when any of our operations fails. Then queued sends are
 * dropped, every waiter wakes up with SPECD_RPC_IO_CANCELLED, and the
 * registered cancellation callback runs once, on the CQ thread that saw it,
 * outside c->mu. */
#include "common/rpc/rpc_internal.h"
#include "common/util/thread_name.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

/* ---- allocation ------------------------------------------------------------ */

specd_rpc_call *rpc_call_new(specd_rpc_server *s) {
    specd_rpc_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->server = s;
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    c->t_new = (rpc_tag){RPC_TAG_NEW, c};
    c->t_close = (rpc_tag){RPC_TAG_CLOSE, c};
    c->t_send = (rpc_tag){RPC_TAG_SEND, c};
    c->t_recv = (rpc_tag){RPC_TAG_RECV, c};
    c->t_status = (rpc_tag){RPC_TAG_STATUS, c};
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->cb_mu, NULL);
    /* recv timeouts are measured on CLOCK_MONOTONIC */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&c->cancelled, 0);
    c->status_details = grpc_empty_slice();
    return c;
}

static void drop_queue_locked(specd_rpc_call *c) {
    while (c->q_head) {
        rpc_msg *m = c->q_head;
        c->q_head = m->next;
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    c->q_tail = NULL;
    c->q_msgs = c->q_bytes = 0;
}

static void destroy_sync(specd_rpc_call *c) {
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->cb_mu);
    pthread_mutex_destroy(&c->mu);
}

void rpc_call_free_unused(specd_rpc_call *c) {
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    grpc_slice_unref(c->status_details);
    destroy_sync(c);
    free(c);
}

static void call_free(specd_rpc_call *c) {
    specd_rpc_server *s = c->server;
    int was_cancelled = atomic_load(&c->cancelled);
    drop_queue_locked(c); /* no one else holds a reference: no lock needed */
    if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
    if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
    if (c->call) grpc_call_unref(c->call);
    free(c->msg);
    free(c->request);
    free(c->method_path);
    rpc_call_free_unused(c);
    /* last touch of the server: shutdown may free it once calls_live is 0 */
    pthread_mutex_lock(&s->mu);
    s->stats.calls_live--;
    if (was_cancelled) s->stats.calls_cancelled++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Drops one reference; c->mu is held on entry and released here (the call
 * may be gone afterwards). */
static void unref_unlock(specd_rpc_call *c) {
    int last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (last) call_free(c);
}

/* ---- cancellation ---------------------------------------------------------- */

static void mark_cancelled_locked(specd_rpc_call *c) {
    if (!atomic_load(&c->cancelled)) {
        atomic_store(&c->cancelled, 1);
        /* nothing queued will ever be written; free it now */
        drop_queue_locked(c);
    }
    pthread_cond_broadcast(&c->cv);
}

/* Every CQ completion runs between completion_begin and completion_end.
 * cb_mu is taken *before* the state changes and held until the callback has
 * run, so the two cannot be pulled apart: a handler that sees the call
 * cancelled and then unregisters its callback (or returns) waits in
 * specd_rpc_call_on_cancel until the callback is done, and a callback
 * registered at the moment of cancellation always runs exactly once.
 * Lock order: cb_mu before mu. The callback only ever runs here (or at
 * registration), never inside the handler's send/recv/finish, which may be
 * called with locks held that the callback wants. (A handler-side batch that
 * fails to start cancels the grpc_call, and the callback then fires from the
 * RECV_CLOSE_ON_SERVER completion like any other cancellation.) */
static void completion_begin(specd_rpc_call *c) {
    pthread_mutex_lock(&c->cb_mu);
    pthread_mutex_lock(&c->mu);
}

static void completion_end(specd_rpc_call *c) {
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (atomic_load(&c->cancelled) && c->cancel_cb && !c->cancel_cb_fired) {
        c->cancel_cb_fired = 1;
        c->cancel_cb(c->cancel_arg);
    }
    pthread_mutex_unlock(&c->cb_mu);
    /* the completed batch's reference; the call may be freed here */
    pthread_mutex_lock(&c->mu);
    unref_unlock(c);
}

int specd_rpc_call_is_cancelled(const specd_rpc_call *c) {
    return atomic_load(&((specd_rpc_call *)c)->cancelled);
}

void specd_rpc_call_on_cancel(specd_rpc_call *c, void (*fn)(void *arg), void *arg) {
    /* cb_mu is held while a callback runs, so once this returns the old
     * callback is neither running nor going to run */
    pthread_mutex_lock(&c->cb_mu);
    c->cancel_cb = fn;
    c->cancel_arg = arg;
    c->cancel_cb_fired = 0;
    if (fn && atomic_load(&c->cancelled)) {
        c->cancel_cb_fired = 1;
        fn(arg);
    }
    pthread_mutex_unlock(&c->cb_mu);
}

/* ---- starting batches (c->mu held) ----------------------------------------- */

/* Starts a batch that holds a reference until its tag comes back. A start
 * error is a bug in our state machine, but the call must not hang on it:
 * the call is marked cancelled instead. */
static int start_batch_locked(specd_rpc_call *c, const grpc_op *ops, size_t n, rpc_tag *tag) {
    c->refs++;
    RPC_TSAN_RELEASE(tag);
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
    if (e == GRPC_CALL_OK) return 0;
    fprintf(stderr, "rpc: %s: grpc_call_start_batch: %s\n", c->method_path ? c->method_path : "?",
            grpc_call_error_to_string(e));
    c->refs--;
    grpc_call_cancel(c->call, NULL);
    mark_cancelled_locked(c);
    return -1;
}

/* Adds SEND_INITIAL_METADATA to ops the first time anything is sent: gRPC
 * needs exactly one, before the first message or the status. */
static size_t add_initial_md_locked(specd_rpc_call *c, grpc_op *ops) {
    if (c->initial_md_sent) return 0;
    c->initial_md_sent = 1;
    memset(ops, 0, sizeof *ops);
    ops->op = GRPC_OP_SEND_INITIAL_METADATA;
    return 1;
}

static void start_next_send_locked(specd_rpc_call *c) {
    rpc_msg *m = c->q_head;
    c->q_head = m->next;
    if (!c->q_head) c->q_tail = NULL;
    c->q_msgs--;
    c->q_bytes -= m->len;
    grpc_op ops[2];
    size_t n = add_initial_md_locked(c, ops);
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = m->bb;
    n++;
    c->send_bb = m->bb;
    free(m);
    c->send_in_flight = 1;
    if (start_batch_locked(c, ops, n, &c->t_send)) {
        c->send_in_flight = 0;
        grpc_byte_buffer_destroy(c->send_bb);
        c->send_bb = NULL;
    }
    /* waiters for queue space */
    pthread_cond_broadcast(&c->cv);
}

static void start_status_locked(specd_rpc_call *c, grpc_status_code code, const char *message) {
    rpc_metrics_count(c, code);
    grpc_op ops[2];
    size_t n = add_initial_md_locked(c, ops);
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = code;
    if (message) {
        grpc_slice_unref(c->status_details);
        c->status_details = grpc_slice_from_copied_string(message);
        ops[n].data.send_status_from_server.status_details = &c->status_details;
    }
    n++;
    c->status_in_flight = 1;
    if (start_batch_locked(c, ops, n, &c->t_status)) c->status_in_flight = 0;
}

/* ---- accepting (CQ thread) ------------------------------------------------- */

static void *handler_main(void *arg);

void rpc_call_accept(specd_rpc_call *c) {
    specd_rpc_server *s = c->server;
    const char *path = (const char *)GRPC_SLICE_START_PTR(c->details.method);
    size_t path_len = GRPC_SLICE_LENGTH(c->details.method);
    c->method_path = strndup(path, path_len);
    c->method = rpc_server_find_method(s, path, path_len);

    pthread_mutex_lock(&c->mu);
    /* first of all, hear about the end of the call (and any cancellation) */
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    start_batch_locked(c, &close_op, 1, &c->t_close);

    grpc_status_code reject = GRPC_STATUS_OK;
    const char *why = NULL;
    if (!c->method_path) {
        reject = GRPC_STATUS_RESOURCE_EXHAUSTED;
        why = "out of memory";
    } else if (!c->method) {
        reject = GRPC_STATUS_UNIMPLEMENTED;
        why = "unknown method";
    } else {
        pthread_mutex_lock(&s->mu);
        if (s->stats.handlers_running >= s->max_calls) {
            reject = GRPC_STATUS_RESOURCE_EXHAUSTED;
            why = "too many concurrent calls";
        } else {
            s->stats.handlers_running++;
            s->stats.calls_started++;
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (reject == GRPC_STATUS_OK) {
        /* the handler thread's reference; detached because nobody needs its
         * result: shutdown waits on handlers_running instead of joining */
        c->refs++;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_t tid;
        int e = pthread_create(&tid, &attr, handler_main, c);
        pthread_attr_destroy(&attr);
        if (e) {
            c->refs--;
            pthread_mutex_lock(&s->mu);
            s->stats.handlers_running--;
            s->stats.calls_started--;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            reject = GRPC_STATUS_RESOURCE_EXHAUSTED;
            why = "cannot start a handler thread";
        }
    }
    if (reject != GRPC_STATUS_OK) {
        pthread_mutex_lock(&s->mu);
        s->stats.calls_rejected++;
        pthread_mutex_unlock(&s->mu);
        c->finish_started = 1;
        /* the call ends when the status and close batches complete */
        if (!atomic_load(&c->cancelled)) start_status_locked(c, reject, why);
    }
    int orphan = c->refs == 0; /* only if every batch failed to start */
    pthread_mutex_unlock(&c->mu);
    if (orphan) call_free(c);
}

/* ---- CQ completions ---------------------------------------------------------- */

void rpc_call_on_close(specd_rpc_call *c) {
    completion_begin(c);
    if (c->close_cancelled) mark_cancelled_locked(c);
    completion_end(c);
}

void rpc_call_on_send(specd_rpc_call *c, int success) {
    completion_begin(c);
    grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
    c->send_in_flight = 0;
    if (!success) mark_cancelled_locked(c);
    else if (!atomic_load(&c->cancelled) && c->q_head) start_next_send_locked(c);
    completion_end(c);
}

void rpc_call_on_recv(specd_rpc_call *c, int success) {
    completion_begin(c);
    c->recv_in_flight = 0;
    c->recv_ready = 1;
    c->recv_ok = success;
    if (!success) mark_cancelled_locked(c);
    completion_end(c);
}

void rpc_call_on_status(specd_rpc_call *c, int success) {
    completion_begin(c);
    c->status_in_flight = 0;
    c->status_ok = success;
    if (!success) mark_cancelled_locked(c);
    completion_end(c);
}

/* ---- the handler thread ------------------------------------------------------ */

static void *handler_main(void *arg) {
    specd_rpc_call *c = arg;
    specd_rpc_server *s = c->server;
    const rpc_method *m = c->method;
    /* "/specd.v1.Target/Verify" -> "Target/Verify" */
    const char *dot = c->method_path ? strrchr(c->method_path, '.') : NULL;
    specd_thread_name("%s", dot ? dot + 1 : c->method_path ? c->method_path : "rpc-call");
    int run = 1;
    if (m->kind != SPECD_RPC_BIDI_STREAMING) {
        /* unary and server-streaming handlers start with their request */
        const uint8_t *buf;
        size_t len;
        specd_rpc_io r = specd_rpc_call_recv(c, &buf, &len, -1);
        if (r == SPECD_RPC_IO_OK) {
            /* keep it apart from the recv buffer so a stray recv in the
             * handler cannot overwrite the request */
            c->request = c->msg;
            c->request_len = c->msg_len;
            c->msg = NULL;
            c->msg_len = c->msg_cap = 0;
        } else {
            run = 0;
            if (r == SPECD_RPC_IO_END)
                specd_rpc_call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, "no request message");
            else if (r == SPECD_RPC_IO_INVALID)
                specd_rpc_call_finish(c, GRPC_STATUS_INTERNAL, "cannot read the request message");
        }
    }
    if (run) m->handler(c, m->user);
    /* a handler's cancellation callback must not outlive it: this waits for
     * a callback that is running right now */
    specd_rpc_call_on_cancel(c, NULL, NULL);
    pthread_mutex_lock(&c->mu);
    int finished = c->finish_started;
    pthread_mutex_unlock(&c->mu);
    if (!finished)
        specd_rpc_call_finish(c, GRPC_STATUS_UNKNOWN, "handler returned without a status");
    pthread_mutex_lock(&c->mu);
    unref_unlock(c);
    /* last touch of the server, after which shutdown may free it */
    pthread_mutex_lock(&s->mu);
    s->stats.handlers_running--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- helpers for handlers ---------------------------------------------------- */

const char *specd_rpc_call_method(const specd_rpc_call *c) { return c->method_path; }

const uint8_t *specd_rpc_call_request(const specd_rpc_call *c, size_t *len) {
    if (len) *len = c->request_len;
    if (!c->method || c->method->kind == SPECD_RPC_BIDI_STREAMING) return NULL;
    /* an empty message is valid protobuf: hand out a non-NULL pointer */
    static const uint8_t empty[1];
    return c->request ? c->request : empty;
}

specd_rpc_io rpc_call_enqueue(specd_rpc_call *c, grpc_byte_buffer *bb, size_t len) {
    specd_rpc_io r = SPECD_RPC_IO_OK;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (atomic_load(&c->cancelled)) {
            r = SPECD_RPC_IO_CANCELLED;
            break;
        }
        if (c->finish_started) {
            r = SPECD_RPC_IO_INVALID;
            break;
        }
        /* an empty queue always takes one message, however large, so a
         * message bigger than the byte bound can still be sent */
        if (c->q_msgs == 0 ||
            (c->q_msgs < RPC_SEND_QUEUE_MAX_MSGS && c->q_bytes + len <= RPC_SEND_QUEUE_MAX_BYTES))
            break;
        pthread_cond_wait(&c->cv, &c->mu);
    }
    rpc_msg *m = r == SPECD_RPC_IO_OK ? malloc(sizeof *m) : NULL;
    if (m) {
        *m = (rpc_msg){.bb = bb, .len = len, .next = NULL};
        if (c->q_tail) c->q_tail->next = m;
        else c->q_head = m;
        c->q_tail = m;
        c->q_msgs++;
        c->q_bytes += len;
        if (!c->send_in_flight) start_next_send_locked(c);
    } else {
        if (r == SPECD_RPC_IO_OK) r = SPECD_RPC_IO_INVALID; /* out of memory */
        grpc_byte_buffer_destroy(bb);
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

specd_rpc_io specd_rpc_call_send(specd_rpc_call *c, const void *buf, size_t len) {
    if (len > c->server->max_message) return SPECD_RPC_IO_INVALID;
    if (specd_rpc_call_is_cancelled(c)) return SPECD_RPC_IO_CANCELLED;
    grpc_slice sl = len ? grpc_slice_from_copied_buffer(buf, len) : grpc_empty_slice();
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl); /* the byte buffer holds its own reference */
    return rpc_call_enqueue(c, bb, len);
}

/* Copies a received byte buffer (decompressing if needed) into c->msg. */
static specd_rpc_io copy_message(specd_rpc_call *c, grpc_byte_buffer *bb) {
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb)) return SPECD_RPC_IO_INVALID;
    specd_rpc_io r = SPECD_RPC_IO_OK;
    size_t len = 0;
    grpc_slice sl;
    while (grpc_byte_buffer_reader_next(&rd, &sl)) {
        size_t n = GRPC_SLICE_LENGTH(sl);
        if (r == SPECD_RPC_IO_OK && len + n > c->server->max_message) r = SPECD_RPC_IO_INVALID;
        if (r == SPECD_RPC_IO_OK && len + n > c->msg_cap) {
            size_t cap = c->msg_cap ? c->msg_cap : 256;
            while (cap < len + n) cap *= 2;
            uint8_t *p = realloc(c->msg, cap);
            if (p) {
                c->msg = p;
                c->msg_cap = cap;
            } else {
                r = SPECD_RPC_IO_INVALID;
            }
        }
        if (r == SPECD_RPC_IO_OK && n) memcpy(c->msg + len, GRPC_SLICE_START_PTR(sl), n);
        len += n;
        grpc_slice_unref(sl);
    }
    grpc_byte_buffer_reader_destroy(&rd);
    c->msg_len = r == SPECD_RPC_IO_OK ? len : 0;
    return r;
}

specd_rpc_io specd_rpc_call_recv(specd_rpc_call *c, const uint8_t **buf, size_t *len,
                                 int timeout_ms) {
    struct timespec deadline;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    specd_rpc_io r;
    grpc_byte_buffer *bb = NULL;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (atomic_load(&c->cancelled)) {
            r = SPECD_RPC_IO_CANCELLED;
            break;
        }
        if (c->recv_ready) {
            c->recv_ready = 0;
            bb = c->recv_bb;
            c->recv_bb = NULL;
            if (!bb) c->recv_end = 1; /* half-close: no message, clean end */
            r = bb ? SPECD_RPC_IO_OK : SPECD_RPC_IO_END;
            break;
        }
        if (c->recv_end) {
            r = SPECD_RPC_IO_END;
            break;
        }
        if (!c->recv_in_flight) {
            grpc_op op;
            memset(&op, 0, sizeof op);
            op.op = GRPC_OP_RECV_MESSAGE;
            op.data.recv_message.recv_message = &c->recv_bb;
            c->recv_in_flight = 1;
            if (start_batch_locked(c, &op, 1, &c->t_recv)) c->recv_in_flight = 0;
            continue; /* re-check: a failed start cancelled the call */
        }
        if (timeout_ms < 0) {
            pthread_cond_wait(&c->cv, &c->mu);
        } else if (pthread_cond_timedwait(&c->cv, &c->mu, &deadline) == ETIMEDOUT) {
            /* the read stays in flight; the next recv picks it up */
            r = SPECD_RPC_IO_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (bb) {
        /* only one thread receives at a time, so c->msg is ours here */
        r = copy_message(c, bb);
        grpc_byte_buffer_destroy(bb);
    }
    if (r == SPECD_RPC_IO_OK) {
        static const uint8_t empty[1];
        *buf = c->msg ? c->msg : empty;
        *len = c->msg_len;
    } else {
        *buf = NULL;
        *len = 0;
    }
    return r;
}

int specd_rpc_call_finish(specd_rpc_call *c, grpc_status_code code, const char *message) {
    pthread_mutex_lock(&c->mu);
    if (c->finish_started) {
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    c->finish_started = 1;
    pthread_cond_broadcast(&c->cv); /* senders blocked on a full queue: stop */
    /* the status goes after every message queued before it */
    while (!atomic_load(&c->cancelled) && (c->send_in_flight || c->q_head))
        pthread_cond_wait(&c->cv, &c->mu);
    int rc = -1;
    if (!atomic_load(&c->cancelled)) {
        start_status_locked(c, code, message);
        /* wait even if the call is cancelled meanwhile: the batch completes
         * either way, and then the status is off our hands */
        while (c->status_in_flight) pthread_cond_wait(&c->cv, &c->mu);
        rc = c->status_ok ? 0 : -1;
    } else {
        rpc_metrics_count(c, GRPC_STATUS_CANCELLED); /* no status of ours goes out */
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int64_t specd_rpc_call_deadline_ms_left(const specd_rpc_call *c) {
    gpr_timespec d = c->details.deadline;
    if (gpr_time_cmp(d, gpr_inf_future(d.clock_type)) == 0) return INT64_MAX;
    d = gpr_convert_clock_type(d, GPR_CLOCK_MONOTONIC);
    gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
    return (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
}

const char *specd_rpc_call_peer(specd_rpc_call *c, char *buf, size_t cap) {
    char *p = grpc_call_get_peer(c->call);
    snprintf(buf, cap, "%s", p ? p : "?");
    gpr_free(p);
    return buf;
}

int specd_rpc_call_metadata(const specd_rpc_call *c, const char *key, char *buf, size_t cap) {
    size_t klen = strlen(key);
    for (size_t i = 0; i < c->md.count; i++) {
        const grpc_metadata *m = &c->md.metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) != klen || memcmp(GRPC_SLICE_START_PTR(m->key), key, klen))
            continue;
        size_t n = GRPC_SLICE_LENGTH(m->value);
        if (cap) {
            size_t k = n < cap - 1 ? n : cap - 1;
            memcpy(buf, GRPC_SLICE_START_PTR(m->value), k);
            buf[k] = 0;
        }
        return (int)(n < cap ? n : (cap ? cap - 1 : 0));
    }
    if (cap) buf[0] = 0;
    return -1;
}
