/* svc.h - helpers for tests that run the services: target-svc child
 * processes (to SIGKILL / SIGSTOP), free ports, channels, and a
 * Generate call collected into one result, in the foreground or on a
 * thread of its own. Shared by test_reliability.c and test_draft_svc.c. */
#ifndef SPECD_TEST_SVC_UTIL_H
#define SPECD_TEST_SVC_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include <grpc/status.h>

#include "common/rpc/rpc_client.h"
#include "draft-svc/policy.h"
#include "specd.pb-c.h"

/* A free TCP port on 127.0.0.1 (bound, read back, released). */
int svc_free_port(void);
void svc_sleep_ms(int ms);
double svc_now_ms(void); /* monotonic */
specd_rpc_channel *svc_channel_to(const char *addr); /* plaintext; fails the test if it cannot */

/* Starts the built target-svc (next to the test binary) on 127.0.0.1:port
 * with the model and extra flags (NULL-terminated, may be NULL) and waits
 * until it serves. Returns its pid, or 0 when target-svc is not built (the
 * caller skips). Killed with the test process whatever ends it. */
pid_t svc_start_target(int port, const char *model, const char *const *extra);
void svc_kill(pid_t pid);   /* SIGKILL + reap + remove its log; 0 is a no-op */
void svc_kill_all(void);    /* every child still running */

/* One Generate call's outcome. */
#define SVC_MAXOUT 1024
typedef struct svc_gen {
    grpc_status_code code;
    char detail[512];   /* "method on addr: CODE: message" when not OK */
    int32_t ids[SVC_MAXOUT];
    int n_ids;
    int finish, failovers, target_steps, generated;
    atomic_int progress; /* tokens so far (for the threaded form) */
    double max_gap_ms;   /* longest wait between two messages with tokens */
    atomic_int done;
    /* threaded form */
    pthread_t th;
    specd_rpc_channel *ch;
    const char *method;
    const Specd__V1__GenerateRequest *req;
} svc_gen;

/* Runs method ("/specd.v1.Draft/Generate") with req to its end (deadline
 * 120 s). */
void svc_generate(specd_rpc_channel *ch, const char *method,
                  const Specd__V1__GenerateRequest *req, svc_gen *o);
/* The same on a thread; svc_gen_join waits for it. req must outlive it. */
void svc_generate_bg(specd_rpc_channel *ch, const char *method,
                     const Specd__V1__GenerateRequest *req, svc_gen *o);
void svc_gen_join(svc_gen *o);
/* The server's message alone: detail after "CODE: " (or all of it). */
const char *svc_gen_message(const svc_gen *o);

/* draft-svc's speculation policy as its configuration's defaults set it
 * (draft_config.c through specd_draft_opts_from_config: off_above 32,
 * min_acceptance 0.1, warm-up 4, cool-down 16, ewma_alpha 0.2), with the
 * given load table ("SESSIONS:CxD" entries). */
void svc_policy(specd_policy *p, char *const *table, int n);

/* grpc.health.v1 Check of `service` at ch: the status (1 SERVING,
 * 2 NOT_SERVING, ...), or -1 when the call failed. */
int svc_health(specd_rpc_channel *ch, const char *service);

/* ms until `service` at ch reports `want`, polling every 20 ms; -1 after
 * limit_ms. */
double svc_wait_health(specd_rpc_channel *ch, const char *service, int want, int limit_ms);

#endif
