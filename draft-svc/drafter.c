/* drafter.c - the NULL-safe wrappers around a drafter's ops (drafter.h). */
#include "draft-svc/drafter.h"

#include <stddef.h>

int specd_drafter_session_open(specd_drafter *d, void **state, specd_error *err) {
    *state = NULL;
    if (!d || !d->ops->session_open) return 0;
    return d->ops->session_open(d, state, err);
}

void specd_drafter_session_close(specd_drafter *d, void *state) {
    if (d && d->ops->session_close && state) d->ops->session_close(d, state);
}

int specd_drafter_propose(specd_drafter *d, specd_draft_job *jobs, int n, specd_error *err) {
    if (n < 1) return 0;
    if (n > d->max_batch)
        return specd_seterr(err, "%s drafter: %d jobs in one call, at most %d", d->ops->name, n,
                            d->max_batch);
    return d->ops->propose(d, jobs, n, err);
}

int specd_drafter_propose_inline(specd_drafter *d, specd_draft_job *job, specd_error *err) {
    if (!d->ops->propose_inline) return 1;
    return d->ops->propose_inline(d, job, err);
}

void specd_drafter_free(specd_drafter *d) {
    if (d) d->ops->destroy(d);
}
