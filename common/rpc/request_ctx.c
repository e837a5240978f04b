/* request_ctx.c - see request_ctx.h. */
#include "common/rpc/request_ctx.h"

#include <string.h>
#include <time.h>

#include "common/rpc/rpc_client.h"
#include "common/util/clock.h"

static _Thread_local specd_request_ctx *current;

void specd_request_begin(specd_request_ctx *r, specd_rpc_call *c, int make_id) {
    memset(r, 0, sizeof *r);
    r->prompt_tokens = r->generated_tokens = r->steps = r->drafted_tokens = r->accepted_tokens =
        r->failovers = -1;
    r->t0_ms = specd_now_ms();
    /* one byte more than an id may have, so an over-long value is seen as
     * such rather than cut into a valid-looking one */
    char got[SPECD_REQUEST_ID_MAX + 2];
    if (specd_rpc_call_metadata(c, SPECD_REQUEST_ID_KEY, got, sizeof got) >= 0 &&
        specd_request_id_valid(got))
        memcpy(r->id, got, strlen(got) + 1);
    else if (make_id)
        specd_request_id_new(r->id);
    else
        strcpy(r->id, "-");
    current = r;
}

specd_request_ctx *specd_request_current(void) { return current; }

void specd_request_end(specd_request_ctx *r, specd_rpc_call *c, const char *service) {
    current = NULL;
    specd_log_field f[16];
    int n = 0;
    f[n++] = SPECD_LOG_STR("id", r->id);
    f[n++] = SPECD_LOG_STR("method", specd_rpc_call_method(c));
    f[n++] = SPECD_LOG_STR("code", specd_rpc_status_name(specd_rpc_call_status(c)));
    f[n++] = SPECD_LOG_NUM("duration_ms", specd_now_ms() - r->t0_ms);
    if (r->drafter) f[n++] = SPECD_LOG_STR("drafter", r->drafter);
    if (r->finish) f[n++] = SPECD_LOG_STR("finish", r->finish);
    const struct { const char *k; long long v; } counts[] = {
        {"prompt_tokens", r->prompt_tokens},     {"generated_tokens", r->generated_tokens},
        {"steps", r->steps},                     {"drafted_tokens", r->drafted_tokens},
        {"accepted_tokens", r->accepted_tokens}, {"failovers", r->failovers},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (counts[i].v >= 0) f[n++] = SPECD_LOG_INT(counts[i].k, counts[i].v);
    specd_request_log(service, f, n);
}

void specd_request_run(specd_rpc_handler h, specd_rpc_call *c, void *user, const char *service,
                       int make_id) {
    specd_request_ctx r;
    specd_request_begin(&r, c, make_id);
    h(c, user);
    specd_request_end(&r, c, service);
}
