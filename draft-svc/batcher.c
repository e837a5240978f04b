/* batcher.c - gathering ready sessions into one drafter call (batcher.h).
 *
 * There is no worker thread: the submitters take turns (flat combining).
 * Whoever finds no batch running becomes the runner, takes every job queued
 * at that moment (its own among them) and makes the one drafter call on its
 * own thread; the others wait on their own condition variable until their
 * job is done or the runner hands the turn to the oldest job still queued.
 * A lone session thus drafts with no thread hand-off at all: a worker
 * thread cost two (submit, wake the worker; done, wake the session), 65 us
 * of a 690 us draft at one stream on 2 vCPUs, and the same jobs are still
 * batched under load. */
#include "draft-svc/batcher.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Largest batch a runner gathers, whatever the drafter allows. */
#define SPECD_BATCHER_MAX_BATCH 256

typedef struct pending {
    specd_draft_job *job;
    int done, rc;
    specd_error err;
    pthread_cond_t cv;
    struct pending *next;
} pending;

struct specd_batcher {
    specd_drafter *d;
    pthread_mutex_t mu;
    pending *head, *tail; /* queued, not yet taken by a runner */
    int running;          /* a submitter is making a drafter call */
    int cap;              /* most jobs per batch */
    long calls, jobs;
    /* The runner's batch arrays, cap long (one runner at a time). */
    pending **batch;
    specd_draft_job *jobs_arr;
};

/* Runs one batch from the head of the queue; called with mu held and no
 * batch running, returns with mu held. */
static void run_batch(specd_batcher *b) {
    int n = 0;
    while (b->head && n < b->cap) {
        pending *q = b->head;
        b->head = q->next;
        if (!b->head) b->tail = NULL;
        b->batch[n] = q;
        /* The drafter gets a contiguous array; results are copied back
         * through the job's own tree buffer pointer, so a struct copy is
         * enough. */
        b->jobs_arr[n] = *q->job;
        n++;
    }
    b->running = 1;
    b->calls++;
    b->jobs += n;
    pthread_mutex_unlock(&b->mu);
    specd_error err = {{0}};
    int rc = specd_drafter_propose(b->d, b->jobs_arr, n, &err);
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < n; i++) {
        pending *q = b->batch[i];
        q->rc = rc;
        if (rc) q->err = err;
        q->done = 1;
        pthread_cond_signal(&q->cv);
    }
    b->running = 0;
    /* the turn passes to the oldest job still queued: its submitter runs
     * the next batch */
    if (b->head) pthread_cond_signal(&b->head->cv);
}

specd_batcher *specd_batcher_create(specd_drafter *d, specd_error *err) {
    specd_batcher *b = calloc(1, sizeof *b);
    if (!b) {
        specd_seterr(err, "out of memory");
        return NULL;
    }
    b->d = d;
    /* A model-free drafter says "any batch" with INT_MAX (ngram does); the
     * batch arrays are allocated up front, so cap them: more sessions than
     * this are never ready in the same instant anyway, and the rest simply
     * form the next batch. */
    int cap = d->max_batch > 0 ? d->max_batch : 1;
    if (cap > SPECD_BATCHER_MAX_BATCH) cap = SPECD_BATCHER_MAX_BATCH;
    b->cap = cap;
    b->batch = calloc((size_t)cap, sizeof *b->batch);
    b->jobs_arr = calloc((size_t)cap, sizeof *b->jobs_arr);
    if (!b->batch || !b->jobs_arr) {
        free(b->batch);
        free(b->jobs_arr);
        free(b);
        specd_seterr(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&b->mu, NULL);
    return b;
}

void specd_batcher_free(specd_batcher *b) {
    if (!b) return;
    pthread_mutex_destroy(&b->mu);
    free(b->batch);
    free(b->jobs_arr);
    free(b);
}

int specd_batcher_run(specd_batcher *b, specd_draft_job *job, specd_error *err) {
    pending q;
    memset(&q, 0, sizeof q);
    q.job = job;
    pthread_cond_init(&q.cv, NULL);
    pthread_mutex_lock(&b->mu);
    if (b->tail)
        b->tail->next = &q;
    else
        b->head = &q;
    b->tail = &q;
    /* No cancellation here: a drafter call is a few milliseconds, and a
     * runner may be reading this job right now, so the caller must wait. */
    while (!q.done) {
        if (!b->running)
            run_batch(b); /* ours is queued, so this batch or a later one takes it */
        else
            pthread_cond_wait(&q.cv, &b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    pthread_cond_destroy(&q.cv);
    if (q.rc && err) *err = q.err;
    return q.rc;
}

void specd_batcher_counts(specd_batcher *b, long *calls, long *jobs) {
    pthread_mutex_lock(&b->mu);
    *calls = b->calls;
    *jobs = b->jobs;
    pthread_mutex_unlock(&b->mu);
}
