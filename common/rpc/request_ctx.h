/* request_ctx.h - what a service knows about the request its handler thread
 * is serving, for the one log line written when it ends (request_log.h).
 *
 * Each gRPC call runs its handler on its own thread (rpc_server.h), so the
 * request in progress is a thread-local: a service's wrapper begins it, the
 * code deep inside (a verify step, the driver) adds its counts through
 * specd_request_current() without any parameter threading, and the wrapper
 * ends it, which writes the line with the call's final status:
 *
 *   ... id=6f1c.. method=/specd.v1.Draft/Generate code=OK duration_ms=812.4
 *       drafter=mlp finish=length prompt_tokens=14 generated_tokens=64 steps=23 ...
 *
 * Counts left at -1 (or strings left NULL) are not printed. */
#ifndef SPECD_REQUEST_CTX_H
#define SPECD_REQUEST_CTX_H

#include "common/rpc/request_log.h"
#include "common/rpc/rpc_server.h"

typedef struct specd_request_ctx {
    char id[SPECD_REQUEST_ID_MAX + 1];
    double t0_ms;
    const char *drafter, *finish; /* static strings */
    long long prompt_tokens, generated_tokens, steps, drafted_tokens, accepted_tokens, failovers;
} specd_request_ctx;

/* Starts r for call c on this thread: the id is the client's x-request-id
 * metadata when valid, else a new one (make_id = 1) or "-" (make_id = 0:
 * target-svc, whose caller is draft-svc and always sends one). */
void specd_request_begin(specd_request_ctx *r, specd_rpc_call *c, int make_id);

/* The request this thread serves, or NULL outside a wrapped handler. */
specd_request_ctx *specd_request_current(void);

/* Writes the line for `service` and clears the thread's current request. */
void specd_request_end(specd_request_ctx *r, specd_rpc_call *c, const char *service);

/* begin, h(c, user), end: a service registers its handlers through this
 * (make_id as for specd_request_begin). */
void specd_request_run(specd_rpc_handler h, specd_rpc_call *c, void *user, const char *service,
                       int make_id);

#endif
