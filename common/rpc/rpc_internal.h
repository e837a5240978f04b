/* rpc_internal.h - the structures shared by rpc_server.c (server lifecycle,
 * CQ threads), rpc_call.c (per-call state machine and blocking helpers),
 * rpc_health.c and rpc_signal.c. Not for use outside common/rpc_*.c.
 *
 * Every gRPC operation we start carries a tag: a pointer to an rpc_tag
 * embedded in the object it belongs to. A CQ thread turns the tag back into
 * (kind, call) and calls the matching rpc_call_on_* function. */
#ifndef SPECD_RPC_INTERNAL_H
#define SPECD_RPC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include <grpc/grpc.h>

#include "common/rpc/rpc_server.h"

/* ThreadSanitizer cannot see inside gRPC (an uninstrumented library), so a
 * tag handed from the thread that starts an operation to the thread that
 * gets it back from a completion queue looks like a race on everything the
 * tag's object holds. These tell it what gRPC guarantees: starting an
 * operation happens before its completion is returned. Nothing in other
 * builds (the SPECD_TSAN build, CMakeLists.txt). */
#if defined(__SANITIZE_THREAD__)
#define RPC_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RPC_TSAN 1
#endif
#endif
#ifdef RPC_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define RPC_TSAN_RELEASE(tag) __tsan_release((void *)(tag))
#define RPC_TSAN_ACQUIRE(tag) __tsan_acquire((void *)(tag))
#else
#define RPC_TSAN_RELEASE(tag) ((void)(tag))
#define RPC_TSAN_ACQUIRE(tag) ((void)(tag))
#endif

/* Outbound queue bounds (see specd_rpc_call_send): whichever is hit first. */
#define RPC_SEND_QUEUE_MAX_MSGS 64
#define RPC_SEND_QUEUE_MAX_BYTES (1u << 20)
/* grpc_server_request_call slots kept open so a burst of new calls does not
 * wait for a CQ thread to re-arm one. */
#define RPC_PENDING_REQUESTS 8

typedef enum rpc_tag_kind {
    RPC_TAG_NEW,      /* grpc_server_request_call delivered a call (or failed at shutdown) */
    RPC_TAG_CLOSE,    /* RECV_CLOSE_ON_SERVER: the call is over, cancelled or not */
    RPC_TAG_SEND,     /* one SEND_MESSAGE (with initial metadata the first time) */
    RPC_TAG_RECV,     /* one RECV_MESSAGE */
    RPC_TAG_STATUS,   /* SEND_STATUS_FROM_SERVER */
    RPC_TAG_SHUTDOWN, /* grpc_server_shutdown_and_notify is done */
} rpc_tag_kind;

typedef struct rpc_tag {
    rpc_tag_kind kind;
    struct specd_rpc_call *call; /* NULL for RPC_TAG_SHUTDOWN */
} rpc_tag;

typedef struct rpc_method {
    char *path;
    size_t path_len;
    specd_rpc_kind kind;
    specd_rpc_handler handler;
    void *user;
} rpc_method;

typedef struct rpc_msg {
    grpc_byte_buffer *bb;
    size_t len;
    struct rpc_msg *next;
} rpc_msg;

/* grpc.health.v1 state (rpc_health.c). */
typedef struct rpc_health_entry {
    char *service;
    int serving;
} rpc_health_entry;

typedef struct rpc_health {
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* broadcast on every change, shutdown and watcher cancel */
    rpc_health_entry *entries;
    size_t n, cap;
    uint64_t generation; /* bumped on every change so watchers notice */
    int shutting_down;   /* everything NOT_SERVING, further sets ignored */
} rpc_health;

typedef enum rpc_server_state {
    RPC_CREATED,  /* port bound, CQ threads running, not accepting */
    RPC_RUNNING,  /* grpc_server_start done */
    RPC_STOPPING, /* specd_rpc_server_shutdown in progress */
    RPC_STOPPED,  /* grpc server destroyed, CQ threads joined */
} rpc_server_state;

struct specd_rpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    pthread_t *cq_threads;
    int n_cq_threads;
    int port;
    size_t max_message;
    int max_calls;

    rpc_method *methods;
    size_t n_methods, cap_methods;

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;  /* broadcast when a counter below drops or shutdown ends */
    rpc_server_state state;
    int shutdown_notified;  /* RPC_TAG_SHUTDOWN received */
    int64_t pending_requests; /* request_call slots outstanding */
    specd_rpc_stats stats;
    rpc_tag shutdown_tag;

    rpc_health health;
};

struct specd_rpc_call {
    specd_rpc_server *server;
    grpc_call *call;           /* NULL while a request slot is still open */
    grpc_call_details details;
    grpc_metadata_array md;
    const rpc_method *method;  /* NULL: rejected at the door */
    char *method_path;         /* NUL-terminated copy of details.method */

    rpc_tag t_new, t_close, t_send, t_recv, t_status;

    pthread_mutex_t mu;        /* guards the state below */
    pthread_cond_t cv;         /* broadcast on every state change */
    int refs;                  /* handler thread + each operation in flight */

    /* cancellation: `cancelled` is read without the lock (is_cancelled) */
    atomic_int cancelled;
    int close_cancelled;       /* out-argument of RECV_CLOSE_ON_SERVER */
    pthread_mutex_t cb_mu;     /* held by a completion while it may cancel and fire
                                  the callback, and by (un)registration */
    void (*cancel_cb)(void *);
    void *cancel_arg;
    int cancel_cb_fired;

    /* sending: one SEND_MESSAGE in flight, the rest queued in order */
    rpc_msg *q_head, *q_tail;
    size_t q_msgs, q_bytes;
    grpc_byte_buffer *send_bb; /* the one in flight */
    int send_in_flight;
    int initial_md_sent;

    /* receiving: at most one RECV_MESSAGE in flight */
    grpc_byte_buffer *recv_bb; /* filled by gRPC; NULL at end of stream */
    int recv_in_flight;
    int recv_ready;            /* completed, result not yet consumed */
    int recv_ok;               /* the batch's success flag */
    int recv_end;              /* end of stream seen */
    uint8_t *msg;              /* last message received, owned by the call */
    size_t msg_len, msg_cap;
    uint8_t *request;          /* UNARY / SERVER_STREAMING request (moved from msg) */
    size_t request_len;

    /* finishing */
    int finish_started;
    int status_known;          /* final_code is set (rpc_metrics_count) */
    grpc_status_code final_code;
    int status_in_flight;
    int status_ok;
    grpc_slice status_details;
};

/* rpc_call.c */
specd_rpc_call *rpc_call_new(specd_rpc_server *s);
/* Dispatches a new call (CQ thread): rejects it or starts its handler. */
void rpc_call_accept(specd_rpc_call *c);
void rpc_call_on_close(specd_rpc_call *c);
void rpc_call_on_send(specd_rpc_call *c, int success);
void rpc_call_on_recv(specd_rpc_call *c, int success);
void rpc_call_on_status(specd_rpc_call *c, int success);
/* Queues an encoded message (takes bb) behind the others: the body of
 * specd_rpc_call_send, shared with specd_rpc_call_send_msg. */
specd_rpc_io rpc_call_enqueue(specd_rpc_call *c, grpc_byte_buffer *bb, size_t len);
/* Frees a request slot whose request_call failed (no grpc_call attached). */
void rpc_call_free_unused(specd_rpc_call *c);

/* rpc_server.c */
const rpc_method *rpc_server_find_method(const specd_rpc_server *s, const char *path, size_t len);
/* PEM files are a few KiB; a bigger one is a wrong path (a log, a binary). */
#define RPC_MAX_PEM_BYTES (1u << 20)
/* A whole PEM file as a NUL-terminated string (gRPC wants C strings), or
 * NULL + err "<who>: <what> <path>: why" (also shared by rpc_client.c, which
 * reports its TLS files the same way). Checks that it holds a PEM block at
 * all, so a wrong path is reported now rather than at the first handshake. */
char *rpc_read_pem(const char *path, const char *who, const char *what, specd_error *err);

/* rpc_metrics.c: counts the status a call ends with (metrics.h). */
void rpc_metrics_count(specd_rpc_call *c, grpc_status_code code);

/* rpc_health.c */
void rpc_health_init(rpc_health *h);
void rpc_health_destroy(rpc_health *h);
/* Marks everything NOT_SERVING and wakes watchers so they end. */
void rpc_health_begin_shutdown(rpc_health *h);
/* Registers Check and Watch on the server. */
int rpc_health_register(specd_rpc_server *s);

#endif
