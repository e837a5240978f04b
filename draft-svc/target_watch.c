/* target_watch.c - target health probes and draft-svc readiness
 * (target_watch.h). */
#include "draft-svc/target_watch.h"
#include "common/util/thread_name.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "common/rpc/rpc_client.h"
#include "grpc/health/v1/health.pb-c.h"
#include "common/util/clock.h"

#define WATCH_MAX_MEMBERS 256 /* probed per round; a larger pool is probed in part */

struct specd_target_watch {
    specd_tpool *pool;
    specd_rpc_server *srv;
    specd_target_watch_opts o;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop; /* under mu */
    atomic_int ready;
};

/* One Check of "specd.v1.Target": 1 = SERVING. A failed probe resets the
 * channel's reconnect backoff, so the next one connects at once: that is
 * what makes a restarted target visible within one interval. */
static int probe(specd_target_watch *w, specd_tpool_member *m) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "specd.v1.Target";
    Grpc__Health__V1__HealthCheckResponse *r = NULL;
    specd_error err = {{0}};
    specd_rpc_channel *ch = specd_tpool_member_channel(m);
    grpc_status_code code = specd_rpc_unary(
        ch, "/grpc.health.v1.Health/Check", &req.base,
        &grpc__health__v1__health_check_response__descriptor, (ProtobufCMessage **)&r,
        w->o.probe_timeout_ms, &err);
    int serving = code == GRPC_STATUS_OK && r &&
                  r->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
    if (!serving) specd_rpc_channel_reset_backoff(ch);
    return serving;
}

static void set_ready(specd_target_watch *w, int ready) {
    atomic_store(&w->ready, ready);
    if (!w->srv) return;
    specd_rpc_set_health(w->srv, "specd.v1.Draft", ready);
    specd_rpc_set_health(w->srv, "", ready);
}

static void *watch_main(void *arg) {
    specd_target_watch *w = arg;
    specd_thread_name("target-watch");
    specd_tpool_member *ms[WATCH_MAX_MEMBERS];
    int last = -1;
    int64_t trimmed_at = specd_now_ms_int();
    for (;;) {
        int n = specd_tpool_members(w->pool, ms, WATCH_MAX_MEMBERS);
        int ready = 0;
        for (int i = 0; i < n; i++) {
            int serving = probe(w, ms[i]);
            specd_tpool_note_health(w->pool, ms[i], serving);
            /* usable: answered lately and compatible (GetInfo once, here or
             * at a session's acquire) */
            if (specd_now_ms_int() - specd_tpool_member_last_alive(ms[i]) <= w->o.alive_window_ms &&
                specd_tpool_member_last_alive(ms[i]) > 0 && specd_tpool_check(w->pool, ms[i]))
                ready = 1;
            specd_tpool_member_put(w->pool, ms[i]);
        }
        if (ready != last) {
            set_ready(w, ready);
            last = ready;
        }
        if (w->o.trim_interval_ms > 0 && specd_now_ms_int() - trimmed_at >= w->o.trim_interval_ms) {
            malloc_trim(0);
            trimmed_at = specd_now_ms_int();
        }
        pthread_mutex_lock(&w->mu);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)(w->o.interval_ms % 1000) * 1000000L;
        until.tv_sec += w->o.interval_ms / 1000 + until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        while (!w->stop && pthread_cond_timedwait(&w->cv, &w->mu, &until) != ETIMEDOUT) {
        }
        int stop = w->stop;
        pthread_mutex_unlock(&w->mu);
        if (stop) return NULL;
    }
}

specd_target_watch *specd_target_watch_start(specd_tpool *pool, specd_rpc_server *srv,
                                             const specd_target_watch_opts *o, specd_error *err) {
    specd_target_watch *w = calloc(1, sizeof *w);
    if (!w) {
        specd_seterr(err, "out of memory");
        return NULL;
    }
    w->pool = pool;
    w->srv = srv;
    w->o = *o;
    if (w->o.interval_ms <= 0) w->o.interval_ms = 250;
    if (w->o.probe_timeout_ms <= 0) w->o.probe_timeout_ms = 500;
    if (w->o.alive_window_ms <= 0) w->o.alive_window_ms = 1000;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* Not ready until a target answers; alive whatever happens. */
    if (srv) specd_rpc_set_health(srv, "liveness", 1);
    set_ready(w, 0);
    if (pthread_create(&w->th, NULL, watch_main, w)) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        specd_seterr(err, "cannot start the target health thread");
        return NULL;
    }
    return w;
}

int specd_target_watch_ready(specd_target_watch *w) { return atomic_load(&w->ready); }

void specd_target_watch_stop(specd_target_watch *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
