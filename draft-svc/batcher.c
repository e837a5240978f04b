/* batcher.c - gathering ready sessions into one drafter call (batcher.h). */
#include "draft-svc/batcher.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Largest batch the worker gathers, whatever the drafter allows. */
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
    pthread_cond_t work_cv; /* the worker waits here for jobs */
    pending *head, *tail;
    int stopping;
    pthread_t worker;
    int cap;    /* most jobs per batch */
    long calls, jobs;
    /* The worker's batch arrays, max_batch long. */
    pending **batch;
    specd_draft_job *jobs_arr;
};

static void *worker_main(void *arg) {
    specd_batcher *b = arg;
    int cap = b->cap;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->head && !b->stopping) pthread_cond_wait(&b->work_cv, &b->mu);
        if (b->stopping) break;
        int n = 0;
        while (b->head && n < cap) {
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
    }
    /* Fail whatever is still queued. */
    for (pending *q = b->head; q; q = q->next) {
        q->rc = -1;
        specd_seterr(&q->err, "draft-svc is shutting down");
        q->done = 1;
        pthread_cond_signal(&q->cv);
    }
    b->head = b->tail = NULL;
    pthread_mutex_unlock(&b->mu);
    return NULL;
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
    pthread_cond_init(&b->work_cv, NULL);
    if (pthread_create(&b->worker, NULL, worker_main, b)) {
        pthread_mutex_destroy(&b->mu);
        pthread_cond_destroy(&b->work_cv);
        free(b->batch);
        free(b->jobs_arr);
        free(b);
        specd_seterr(err, "cannot start the drafter thread");
        return NULL;
    }
    return b;
}

void specd_batcher_free(specd_batcher *b) {
    if (!b) return;
    pthread_mutex_lock(&b->mu);
    b->stopping = 1;
    pthread_cond_signal(&b->work_cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->worker, NULL);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->work_cv);
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
    if (b->stopping) {
        pthread_mutex_unlock(&b->mu);
        pthread_cond_destroy(&q.cv);
        return specd_seterr(err, "draft-svc is shutting down");
    }
    if (b->tail)
        b->tail->next = &q;
    else
        b->head = &q;
    b->tail = &q;
    pthread_cond_signal(&b->work_cv);
    /* No cancellation here: a drafter call is a few milliseconds, and the
     * worker may be reading this job right now, so the caller must wait. */
    while (!q.done) pthread_cond_wait(&q.cv, &b->mu);
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
