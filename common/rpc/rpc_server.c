/* rpc_server.c - the server's life: create (listen, TLS), method table, start,
 * the completion-queue threads, graceful shutdown, stats.
 *
 * Threading model.  The server has ONE completion queue (CQ), registered for
 * new-call notifications and bound to every call. `cq_threads` threads block
 * in grpc_completion_queue_next on it and dispatch each event by its tag
 * (rpc_internal.h): a new call is accepted or rejected (rpc_call_accept), an
 * operation's completion updates its call's state and wakes the call's
 * handler (rpc_call.c). CQ threads never run user code except the short
 * cancellation callbacks, so a slow handler cannot stall other calls. Each
 * accepted call runs its handler on a thread of its own (detached; counted
 * in stats.handlers_running so shutdown can wait for them).
 *
 * New calls arrive through RPC_PENDING_REQUESTS open grpc_server_request_call
 * slots; each delivered call re-arms one slot. We use the generic (not
 * registered-method) request so that every call, known method or not, comes
 * to us: unknown paths get UNIMPLEMENTED from rpc_call_accept.
 *
 * Shutdown (specd_rpc_server_shutdown): health goes NOT_SERVING (Watch
 * streams end), grpc_server_shutdown_and_notify refuses new calls and fails
 * the open request slots; we wait up to grace_ms for the notification plus
 * every call object freed and every handler returned; past the grace
 * grpc_server_cancel_all_calls cancels what is left (handlers see
 * SPECD_RPC_IO_CANCELLED) and we wait for them to return. Then the gRPC
 * server is destroyed, the CQ shut down and drained, the CQ threads joined. */
#include "common/rpc/rpc_internal.h"
#include "common/util/thread_name.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

/* Server-side keepalive (see the channel args in create): a dead peer is
 * noticed, and its calls cancelled, within about 40 s. */
#define RPC_KEEPALIVE_MS 30000
#define RPC_KEEPALIVE_TIMEOUT_MS 10000
/* Clients may ping this often without it counting as abuse: half of
 * rpc_client.c's keepalive interval, so timer jitter never makes a strike. */
#define RPC_MIN_RECV_PING_INTERVAL_MS 5000

/* ---- small helpers --------------------------------------------------------- */

char *rpc_read_pem(const char *path, const char *who, const char *what, specd_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        specd_seterr(err, "%s: %s %s: %s", who, what, path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(RPC_MAX_PEM_BYTES + 1);
    size_t n = buf ? fread(buf, 1, RPC_MAX_PEM_BYTES + 1, f) : 0;
    int rerr = ferror(f);
    fclose(f);
    if (!buf || rerr) {
        specd_seterr(err, "%s: %s %s: %s", who, what, path,
                     buf ? "read error" : "out of memory");
        free(buf);
        return NULL;
    }
    if (n > RPC_MAX_PEM_BYTES) {
        specd_seterr(err, "%s: %s %s: larger than %u bytes, not a PEM file", who, what, path,
                     RPC_MAX_PEM_BYTES);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    /* gRPC would only notice at the first handshake; say it now, by name */
    if (!strstr(buf, "-----BEGIN ")) {
        specd_seterr(err, "%s: %s %s: no PEM block (-----BEGIN ...)", who, what, path);
        free(buf);
        return NULL;
    }
    return buf;
}

/* Server credentials from the options: TLS, mutual TLS or (explicitly)
 * plaintext. Option consistency was checked by the caller. */
static grpc_server_credentials *make_credentials(const specd_rpc_server_opts *o,
                                                 specd_error *err) {
    if (o->insecure) return grpc_insecure_server_credentials_create();
    char *cert = rpc_read_pem(o->tls_cert_path, "rpc server", "TLS certificate", err);
    char *key = cert ? rpc_read_pem(o->tls_key_path, "rpc server", "TLS private key", err) : NULL;
    char *ca = NULL;
    if (key && o->tls_client_ca_path)
        ca = rpc_read_pem(o->tls_client_ca_path, "rpc server", "TLS client CA", err);
    grpc_server_credentials *creds = NULL;
    if (cert && key && (ca || !o->tls_client_ca_path)) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        /* With a client CA the client certificate is both required and
         * verified against it: an mTLS deployment must not quietly accept
         * anonymous clients. */
        creds = grpc_ssl_server_credentials_create_ex(
            ca, &pair, 1,
            ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (!creds) specd_seterr(err, "rpc server: cannot create TLS credentials");
    }
    /* gRPC copies the PEM strings into the credentials */
    free(cert);
    free(key);
    free(ca);
    return creds;
}

static int check_opts(const specd_rpc_server_opts *o, specd_error *err) {
    if (!o || !o->listen_addr || !o->listen_addr[0])
        return specd_seterr(err, "rpc server: listen_addr is required");
    int tls = o->tls_cert_path || o->tls_key_path || o->tls_client_ca_path;
    if (o->insecure && tls)
        return specd_seterr(err, "rpc server: insecure = 1 and TLS files are both set; choose one");
    if (!o->insecure && !tls)
        return specd_seterr(err, "rpc server: no TLS certificate and key given; "
                                 "set insecure = 1 to serve plaintext on purpose");
    if (tls && (!o->tls_cert_path || !o->tls_key_path))
        return specd_seterr(err, "rpc server: TLS needs both a certificate chain and a "
                                 "private key");
    if (o->max_message_bytes > INT_MAX)
        return specd_seterr(err, "rpc server: max_message_bytes %zu exceeds %d",
                            o->max_message_bytes, INT_MAX);
    if (o->max_calls < 0 || o->cq_threads < 0 || o->cq_threads > 64)
        return specd_seterr(err, "rpc server: max_calls must be >= 0 and cq_threads 0..64");
    return 0;
}

/* ---- CQ threads ----------------------------------------------------------- */

/* Keeps RPC_PENDING_REQUESTS slots open: one grpc_server_request_call with a
 * fresh call object that gRPC fills in when a call arrives. */
static void arm_request_slot(specd_rpc_server *s) {
    specd_rpc_call *c = rpc_call_new(s);
    if (!c) return; /* out of memory: one slot fewer; the others keep serving */
    pthread_mutex_lock(&s->mu);
    s->pending_requests++;
    pthread_mutex_unlock(&s->mu);
    RPC_TSAN_RELEASE(&c->t_new);
    grpc_call_error e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq,
                                                 s->cq, &c->t_new);
    if (e != GRPC_CALL_OK) {
        pthread_mutex_lock(&s->mu);
        s->pending_requests--;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        rpc_call_free_unused(c);
    }
}

static void on_new_call(specd_rpc_server *s, specd_rpc_call *c, int success) {
    pthread_mutex_lock(&s->mu);
    s->pending_requests--;
    /* counted live in the same critical section, so "no slots and no live
     * calls" is never observed in between */
    if (success) s->stats.calls_live++;
    int rearm = success && s->state == RPC_RUNNING;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (!success) {
        /* the server is shutting down: the slot is closed, no call came */
        rpc_call_free_unused(c);
        return;
    }
    if (rearm) arm_request_slot(s);
    rpc_call_accept(c);
}

static void *cq_thread_main(void *arg) {
    specd_rpc_server *s = arg;
    specd_thread_name("rpc-cq:%d", s->port);
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break; /* drained after shutdown: done */
        if (ev.type != GRPC_OP_COMPLETE) continue; /* no deadline, so no timeouts */
        rpc_tag *t = ev.tag;
        RPC_TSAN_ACQUIRE(t);
        switch (t->kind) {
        case RPC_TAG_NEW: on_new_call(s, t->call, ev.success); break;
        case RPC_TAG_CLOSE: rpc_call_on_close(t->call); break;
        case RPC_TAG_SEND: rpc_call_on_send(t->call, ev.success); break;
        case RPC_TAG_RECV: rpc_call_on_recv(t->call, ev.success); break;
        case RPC_TAG_STATUS: rpc_call_on_status(t->call, ev.success); break;
        case RPC_TAG_SHUTDOWN:
            pthread_mutex_lock(&s->mu);
            s->shutdown_notified = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            break;
        }
    }
    return NULL;
}

/* ---- create / register / start -------------------------------------------- */

static void server_free(specd_rpc_server *s) {
    for (size_t i = 0; i < s->n_methods; i++) free(s->methods[i].path);
    free(s->methods);
    free(s->cq_threads);
    rpc_health_destroy(&s->health);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    grpc_shutdown(); /* pairs with grpc_init in create */
}

specd_rpc_server *specd_rpc_server_create(const specd_rpc_server_opts *o, specd_error *err) {
    if (check_opts(o, err)) return NULL;
    specd_rpc_server *s = calloc(1, sizeof *s);
    if (!s) {
        specd_seterr(err, "rpc server: out of memory");
        return NULL;
    }
    grpc_init();
    s->max_message = o->max_message_bytes ? o->max_message_bytes : SPECD_RPC_DEFAULT_MAX_MESSAGE;
    s->max_calls = o->max_calls ? o->max_calls : SPECD_RPC_DEFAULT_MAX_CALLS;
    int want_threads = o->cq_threads ? o->cq_threads : SPECD_RPC_DEFAULT_CQ_THREADS;
    s->shutdown_tag = (rpc_tag){RPC_TAG_SHUTDOWN, NULL};
    s->state = RPC_CREATED;
    pthread_mutex_init(&s->mu, NULL);
    /* CLOCK_MONOTONIC so the grace period is immune to wall-clock jumps */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    rpc_health_init(&s->health);

    grpc_server_credentials *creds = make_credentials(o, err);
    if (!creds) {
        server_free(s);
        return NULL;
    }
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)s->max_message},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = (int)s->max_message},
        /* gRPC defaults to SO_REUSEPORT, which lets a second server bind a
         * port already in use and silently steal half the connections; we
         * want "address in use" instead. */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
        /* A client that vanishes without a TCP reset (node lost, network
         * partition) must not hold a model slot for the kernel's hours-long
         * TCP timeout: ping every RPC_KEEPALIVE_MS and drop the connection
         * (cancelling its calls) if no ack comes back within
         * RPC_KEEPALIVE_TIMEOUT_MS. Unlimited pings without data, or gRPC
         * stops pinging after two while a handler computes in silence. */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS,
         .value.integer = RPC_KEEPALIVE_MS},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
         .value.integer = RPC_KEEPALIVE_TIMEOUT_MS},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA,
         .value.integer = 0},
        /* Accept the keepalive pings of our own clients (rpc_client.c pings
         * every 10 s, idle connections included). gRPC's server defaults
         * count a ping as abuse when it comes less than 5 minutes after the
         * last one while the server has sent no data, or at all on a
         * connection with no calls, and after two such strikes it sends
         * GOAWAY "too_many_pings", killing every stream on the connection:
         * a Verify session waiting on a slow client would die after ~30 s. */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
         .value.integer = RPC_MIN_RECV_PING_INTERVAL_MS},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
         .value.integer = 1},
    };
    grpc_channel_args cargs = {.num_args = sizeof args / sizeof args[0], .args = args};
    s->server = grpc_server_create(&cargs, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    s->port = grpc_server_add_http2_port(s->server, o->listen_addr, creds);
    grpc_server_credentials_release(creds);

    /* CQ threads run from here on, so every failure below can take the one
     * shutdown path (which needs them to receive the shutdown tag). */
    s->cq_threads = calloc((size_t)want_threads, sizeof *s->cq_threads);
    for (int i = 0; s->cq_threads && i < want_threads; i++) {
        if (pthread_create(&s->cq_threads[i], NULL, cq_thread_main, s)) break;
        s->n_cq_threads++;
    }
    if (s->n_cq_threads == 0) {
        /* nothing can drain the CQ: tear down by hand (the server was never
         * started, so shutting it down completes at once) */
        grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
        grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        grpc_server_destroy(s->server);
        grpc_completion_queue_shutdown(s->cq);
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(s->cq);
        specd_seterr(err, "rpc server: cannot start completion-queue threads");
        server_free(s);
        return NULL;
    }
    if (s->port <= 0) {
        specd_seterr(err, "rpc server: cannot listen on %s (address in use or invalid, "
                          "or TLS certificate/key rejected)", o->listen_addr);
        specd_rpc_server_destroy(s);
        return NULL;
    }
    if (rpc_health_register(s)) {
        specd_seterr(err, "rpc server: out of memory");
        specd_rpc_server_destroy(s);
        return NULL;
    }
    specd_rpc_set_health(s, "", 1);
    return s;
}

int specd_rpc_server_port(const specd_rpc_server *s) { return s->port; }

const rpc_method *rpc_server_find_method(const specd_rpc_server *s, const char *path, size_t len) {
    /* the table is frozen once the server starts, so no lock; a linear scan
     * is fine for the handful of methods a service has */
    for (size_t i = 0; i < s->n_methods; i++)
        if (s->methods[i].path_len == len && !memcmp(s->methods[i].path, path, len))
            return &s->methods[i];
    return NULL;
}

int specd_rpc_register(specd_rpc_server *s, const char *method, specd_rpc_kind kind,
                       specd_rpc_handler handler, void *user) {
    if (!s || !method || !handler || method[0] != '/' || !strchr(method + 1, '/')) return -1;
    if (kind != SPECD_RPC_UNARY && kind != SPECD_RPC_SERVER_STREAMING &&
        kind != SPECD_RPC_BIDI_STREAMING)
        return -1;
    size_t len = strlen(method);
    pthread_mutex_lock(&s->mu);
    int rc = -1;
    if (s->state != RPC_CREATED || rpc_server_find_method(s, method, len)) goto out;
    if (s->n_methods == s->cap_methods) {
        size_t cap = s->cap_methods ? 2 * s->cap_methods : 8;
        rpc_method *m = realloc(s->methods, cap * sizeof *m);
        if (!m) goto out;
        s->methods = m;
        s->cap_methods = cap;
    }
    char *path = strdup(method);
    if (!path) goto out;
    s->methods[s->n_methods++] =
        (rpc_method){.path = path, .path_len = len, .kind = kind, .handler = handler, .user = user};
    rc = 0;
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int specd_rpc_server_start(specd_rpc_server *s, specd_error *err) {
    pthread_mutex_lock(&s->mu);
    if (s->state != RPC_CREATED) {
        pthread_mutex_unlock(&s->mu);
        return specd_seterr(err, "rpc server: start: already started or shut down");
    }
    s->state = RPC_RUNNING;
    pthread_mutex_unlock(&s->mu);
    grpc_server_start(s->server);
    for (int i = 0; i < RPC_PENDING_REQUESTS; i++) arm_request_slot(s);
    return 0;
}

/* ---- shutdown ------------------------------------------------------------- */

/* Everything gRPC and our handlers hold is gone (s->mu held). */
static int drained(const specd_rpc_server *s) {
    return s->shutdown_notified && s->pending_requests == 0 && s->stats.calls_live == 0 &&
           s->stats.handlers_running == 0;
}

void specd_rpc_server_shutdown(specd_rpc_server *s, int grace_ms) {
    pthread_mutex_lock(&s->mu);
    if (s->state == RPC_STOPPING || s->state == RPC_STOPPED) {
        while (s->state != RPC_STOPPED) pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->state = RPC_STOPPING;
    pthread_mutex_unlock(&s->mu);

    /* probes see NOT_SERVING first; Watch streams send it and end */
    rpc_health_begin_shutdown(&s->health);
    RPC_TSAN_RELEASE(&s->shutdown_tag);
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);

    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (grace_ms < 0) grace_ms = 0;
    deadline.tv_sec += grace_ms / 1000;
    deadline.tv_nsec += (long)(grace_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    while (!drained(s) && pthread_cond_timedwait(&s->cv, &s->mu, &deadline) != ETIMEDOUT) {
    }
    if (!drained(s)) {
        /* grace is over: cancel what is left; every blocking helper returns
         * CANCELLED and the cancellation callbacks fire, so handlers end */
        pthread_mutex_unlock(&s->mu);
        grpc_server_cancel_all_calls(s->server);
        pthread_mutex_lock(&s->mu);
        while (!drained(s)) pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);

    grpc_server_destroy(s->server);
    s->server = NULL;
    /* the CQ threads see GRPC_QUEUE_SHUTDOWN once it is empty and exit */
    grpc_completion_queue_shutdown(s->cq);
    for (int i = 0; i < s->n_cq_threads; i++) pthread_join(s->cq_threads[i], NULL);
    grpc_completion_queue_destroy(s->cq);
    s->cq = NULL;

    pthread_mutex_lock(&s->mu);
    s->state = RPC_STOPPED;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void specd_rpc_server_destroy(specd_rpc_server *s) {
    if (!s) return;
    specd_rpc_server_shutdown(s, 0);
    server_free(s);
}

void specd_rpc_server_stats(specd_rpc_server *s, specd_rpc_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}
