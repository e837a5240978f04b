/* batcher.h - many sessions, one drafter call per round.
 *
 * A drafter with a model (the MLP speculator, a draft LM) is far cheaper per
 * session when it runs many sessions in one call: the weights are read once
 * for all rows. Each session's driver thread submits its job and blocks; the
 * first of them to find no call running takes every job queued at that
 * moment (up to the drafter's max_batch) and runs them in ONE propose()
 * call on its own thread (batcher.c). No timer is involved: while a call
 * runs, the jobs of sessions that became ready meanwhile queue up and form
 * the next batch, so a lone session pays no waiting and no thread hand-off,
 * and N busy sessions cost about one call per round instead of N.
 *
 * A failed batch fails each of its jobs with the drafter's message (the
 * drivers then decode that step without a tree). Jobs that involve no model
 * do not come here: the driver drafts them on its own thread (drafter.h,
 * propose_inline). */
#ifndef SPECD_BATCHER_H
#define SPECD_BATCHER_H

#include "common/util/error.h"
#include "draft-svc/drafter.h"

typedef struct specd_batcher specd_batcher;

specd_batcher *specd_batcher_create(specd_drafter *d, specd_error *err);
/* Stops the worker (queued jobs fail) and frees. After every submitter returned. */
void specd_batcher_free(specd_batcher *b);

/* Runs one job through the drafter in the next batch; blocks until done.
 * 0, or -1 + err. Thread-safe. */
int specd_batcher_run(specd_batcher *b, specd_draft_job *job, specd_error *err);

/* Calls and jobs so far (for stats and the batching test). */
void specd_batcher_counts(specd_batcher *b, long *calls, long *jobs);

#endif
