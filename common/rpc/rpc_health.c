/* rpc_health.c - the standard grpc.health.v1.Health service, built into
 * every specd_rpc_server (proto/grpc/health/v1/health.proto).
 *
 *   Check(service)  unary: SERVING / NOT_SERVING, or status NOT_FOUND for a
 *                   name never set. Kubernetes gRPC probes and
 *                   grpc_health_probe call this.
 *   Watch(service)  server streaming: the current status at once, then each
 *                   change, until the client cancels. An unknown name is
 *                   SERVICE_UNKNOWN (it may be registered later), as the
 *                   protocol says. When the server shuts down every status
 *                   turns NOT_SERVING, watchers send that and end the stream
 *                   with UNAVAILABLE, so they do not hold up a graceful stop.
 *
 * State is a small table (service -> serving) under h->mu; a generation
 * counter and h->cv let Watch handlers sleep until something changes. A
 * watcher's cancellation callback broadcasts h->cv so a cancelled Watch ends
 * at once instead of at the next change. */
#include "common/rpc/rpc_health.h"

#include <stdlib.h>
#include <string.h>

#include "common/rpc/rpc_internal.h"
#include "grpc/health/v1/health.pb-c.h"

#define ST_SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define ST_NOT_SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
#define ST_SERVICE_UNKNOWN GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN

int specd_rpc_health_parse_request(const uint8_t *buf, size_t len, char **service,
                                   specd_error *err) {
    ProtobufCMessage *m;
    *service = NULL;
    if (specd_rpc_unpack(&grpc__health__v1__health_check_request__descriptor, buf, len,
                         SPECD_RPC_HEALTH_MAX_REQUEST, &m, err))
        return -1;
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
    /* protobuf-c gives proto3 strings a default of "" (never NULL), but a
     * NULL here would be a crash, so do not rely on it */
    *service = strdup(req->service ? req->service : "");
    protobuf_c_message_free_unpacked(m, NULL);
    if (!*service) return specd_seterr(err, "HealthCheckRequest: out of memory");
    return 0;
}

/* ---- state -------------------------------------------------------------------- */

void rpc_health_init(rpc_health *h) {
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
}

void rpc_health_destroy(rpc_health *h) {
    for (size_t i = 0; i < h->n; i++) free(h->entries[i].service);
    free(h->entries);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
}

/* The wire status of a service, or -1 if the name was never set (h->mu held). */
static int lookup_locked(const rpc_health *h, const char *service) {
    for (size_t i = 0; i < h->n; i++)
        if (!strcmp(h->entries[i].service, service))
            return h->entries[i].serving ? ST_SERVING : ST_NOT_SERVING;
    return -1;
}

void specd_rpc_set_health(specd_rpc_server *s, const char *service, int serving) {
    rpc_health *h = &s->health;
    if (!service) service = "";
    pthread_mutex_lock(&h->mu);
    if (h->shutting_down) goto out; /* it stays NOT_SERVING until the end */
    size_t i = 0;
    while (i < h->n && strcmp(h->entries[i].service, service)) i++;
    if (i == h->n) {
        if (h->n == h->cap) {
            size_t cap = h->cap ? 2 * h->cap : 4;
            rpc_health_entry *e = realloc(h->entries, cap * sizeof *e);
            if (!e) goto out; /* out of memory: the name stays unknown */
            h->entries = e;
            h->cap = cap;
        }
        char *name = strdup(service);
        if (!name) goto out;
        h->entries[h->n++] = (rpc_health_entry){.service = name, .serving = -1};
    }
    if (h->entries[i].serving != !!serving) {
        h->entries[i].serving = !!serving;
        h->generation++;
        pthread_cond_broadcast(&h->cv);
    }
out:
    pthread_mutex_unlock(&h->mu);
}

void rpc_health_begin_shutdown(rpc_health *h) {
    pthread_mutex_lock(&h->mu);
    for (size_t i = 0; i < h->n; i++) h->entries[i].serving = 0;
    h->shutting_down = 1;
    h->generation++;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* ---- handlers ----------------------------------------------------------------- */

static specd_rpc_io send_status(specd_rpc_call *c, int status) {
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    return specd_rpc_call_send_msg(c, &resp.base);
}

/* Decodes the request or finishes the call with INVALID_ARGUMENT. */
static char *request_service(specd_rpc_call *c) {
    size_t len;
    const uint8_t *buf = specd_rpc_call_request(c, &len);
    char *service;
    specd_error err;
    if (specd_rpc_health_parse_request(buf, len, &service, &err)) {
        specd_rpc_call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, err.msg);
        return NULL;
    }
    return service;
}

static void health_check(specd_rpc_call *c, void *user) {
    rpc_health *h = &((specd_rpc_server *)user)->health;
    char *service = request_service(c);
    if (!service) return;
    pthread_mutex_lock(&h->mu);
    int st = lookup_locked(h, service);
    pthread_mutex_unlock(&h->mu);
    if (st < 0) {
        specd_rpc_call_finish(c, GRPC_STATUS_NOT_FOUND, "unknown service");
    } else if (send_status(c, st) == SPECD_RPC_IO_OK) {
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
    }
    free(service);
}

/* Cancellation callback: wake the watcher sleeping on h->cv. Taking h->mu
 * first means a watcher between its is_cancelled check and its wait cannot
 * miss this broadcast. */
static void wake_watchers(void *arg) {
    rpc_health *h = arg;
    pthread_mutex_lock(&h->mu);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static void health_watch(specd_rpc_call *c, void *user) {
    rpc_health *h = &((specd_rpc_server *)user)->health;
    char *service = request_service(c);
    if (!service) return;
    specd_rpc_call_on_cancel(c, wake_watchers, h);
    int sent = -1; /* nothing sent yet */
    pthread_mutex_lock(&h->mu);
    while (!specd_rpc_call_is_cancelled(c)) {
        int st = lookup_locked(h, service);
        if (st < 0) st = ST_SERVICE_UNKNOWN;
        if (st != sent) {
            /* never hold h->mu across a send: it may block on a slow client */
            pthread_mutex_unlock(&h->mu);
            if (send_status(c, st) != SPECD_RPC_IO_OK) goto out;
            sent = st;
            pthread_mutex_lock(&h->mu);
            continue; /* it may have changed again meanwhile */
        }
        if (h->shutting_down) {
            pthread_mutex_unlock(&h->mu);
            specd_rpc_call_finish(c, GRPC_STATUS_UNAVAILABLE, "server is shutting down");
            goto out;
        }
        uint64_t gen = h->generation;
        while (gen == h->generation && !specd_rpc_call_is_cancelled(c))
            pthread_cond_wait(&h->cv, &h->mu);
    }
    pthread_mutex_unlock(&h->mu);
out:
    /* unregister before returning: the callback points into the server */
    specd_rpc_call_on_cancel(c, NULL, NULL);
    free(service);
}

int rpc_health_register(specd_rpc_server *s) {
    if (specd_rpc_register(s, "/grpc.health.v1.Health/Check", SPECD_RPC_UNARY, health_check, s))
        return -1;
    return specd_rpc_register(s, "/grpc.health.v1.Health/Watch", SPECD_RPC_SERVER_STREAMING,
                              health_watch, s);
}
