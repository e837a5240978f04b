/* target_watch.h - draft-svc's view of which targets are alive, and its own
 * readiness from it.
 *
 * One thread probes every target of the pool with grpc.health.v1 Check
 * ("specd.v1.Target") every interval, in order, each with a short deadline.
 * A SERVING answer is recorded on the member (specd_tpool_note_health:
 * "alive at t"), which is what the driver judges a slow step by: a target
 * that is busy (a long prefill holds its step loop) still answers health
 * checks from its gRPC threads, so its sessions wait; a hung one (SIGSTOP,
 * a dead host) answers nothing, and its sessions fail over once it has been
 * silent for step_timeout (driver.h).
 *
 * Readiness: "specd.v1.Draft" and the server as a whole ("") are SERVING
 * while at least one target answered within the last alive window and
 * passed the GetInfo compatibility check, else NOT_SERVING, so a Kubernetes
 * readiness probe stops routing to a draft-svc that could only answer
 * UNAVAILABLE (every target down, or refused by TLS). A target coming back
 * is seen within one interval: the probe skips gRPC's reconnect backoff.
 * Liveness is separate: the name "liveness" is always SERVING while the
 * process runs (the Kubernetes liveness probe asks for it). */
#ifndef SPECD_DRAFT_TARGET_WATCH_H
#define SPECD_DRAFT_TARGET_WATCH_H

#include "common/util/error.h"
#include "common/rpc/rpc_server.h"
#include "draft-svc/target_pool.h"

typedef struct specd_target_watch specd_target_watch;

typedef struct specd_target_watch_opts {
    int interval_ms;      /* between probe rounds; 0 = 250 */
    int probe_timeout_ms; /* one Check's deadline; 0 = 500 */
    int alive_window_ms;  /* "usable" = answered within this; 0 = 1000 */
    /* > 0: also return the allocator's free pages to the system this often
     * (malloc_trim). draft-svc's handler threads each allocate in their own
     * glibc arena; memory they freed stays resident in it, and a 10-minute
     * soak (bench/soak.sh) saw RSS still creeping after the working set had
     * levelled off. The watch thread is the process's one periodic thread,
     * so it does this too. 0 = never. */
    int trim_interval_ms;
} specd_target_watch_opts;

/* Starts the thread; srv (may be NULL) gets the readiness described above.
 * Readiness starts NOT_SERVING until a target has answered. */
specd_target_watch *specd_target_watch_start(specd_tpool *pool, specd_rpc_server *srv,
                                             const specd_target_watch_opts *o, specd_error *err);
/* 1 while some target is usable (what readiness says). */
int specd_target_watch_ready(specd_target_watch *w);
void specd_target_watch_stop(specd_target_watch *w); /* NULL is a no-op */

#endif
