/* test_batcher.c - draft-svc/batcher.c over a stand-in drafter: a lone job
 * runs on its submitter's own thread (no hand-off), calls never overlap,
 * concurrent jobs form batches of at most max_batch, every job gets its own
 * result exactly once, and a failed call fails each job of its batch with
 * the drafter's message. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "draft-svc/batcher.h"

enum { MAX_BATCH = 4, THREADS = 8, JOBS_EACH = 300, FAIL_POSITION = 999999 };

/* The stand-in: each job gets one node whose token is its position; a job
 * at FAIL_POSITION fails the call. It records the calls' threads, sizes and
 * overlap. */
typedef struct fake {
    atomic_int in_call, overlapped, max_n;
    pthread_t last_thread;
    int spin_us;
} fake;

static void spin(int us) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do clock_gettime(CLOCK_MONOTONIC, &b);
    while ((b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000 < us);
}

static int fake_propose(specd_drafter *d, specd_draft_job *jobs, int n, specd_error *err) {
    fake *f = d->impl;
    if (atomic_fetch_add(&f->in_call, 1) != 0) atomic_store(&f->overlapped, 1);
    f->last_thread = pthread_self();
    int m = atomic_load(&f->max_n);
    while (n > m && !atomic_compare_exchange_weak(&f->max_n, &m, n)) {
    }
    spin(f->spin_us);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (jobs[i].position == FAIL_POSITION) rc = specd_seterr(err, "stand-in failed");
        specd_tree_buf_add(jobs[i].out, -1, (int32_t)jobs[i].position, 0.0f);
    }
    atomic_fetch_sub(&f->in_call, 1);
    return rc;
}

static void fake_destroy(specd_drafter *d) { (void)d; }

static const specd_drafter_ops fake_ops = {
    .name = "fake", .propose = fake_propose, .destroy = fake_destroy};

typedef struct fixture {
    fake f;
    specd_drafter d;
    specd_batcher *b;
} fixture;

static int setup(void **state) {
    fixture *x = calloc(1, sizeof *x);
    x->d = (specd_drafter){.ops = &fake_ops, .vocab = 1 << 20, .max_batch = MAX_BATCH,
                           .max_depth = 1, .impl = &x->f};
    specd_error err = {{0}};
    if (!(x->b = specd_batcher_create(&x->d, &err))) fail_msg("%s", err.msg);
    *state = x;
    return 0;
}

static int teardown(void **state) {
    fixture *x = *state;
    specd_batcher_free(x->b);
    free(x);
    return 0;
}

static int run_one(specd_batcher *b, int position, specd_tree_buf *out, specd_error *err) {
    specd_tree_buf_reset(out);
    specd_draft_job job = {.candidates = 1, .depth = 1, .position = (uint64_t)position,
                           .out = out};
    return specd_batcher_run(b, &job, err);
}

static void test_lone_job_runs_on_its_thread(void **state) {
    fixture *x = *state;
    specd_error err = {{0}};
    specd_tree_buf out;
    if (specd_tree_buf_init(&out, 4, 0, &err)) fail_msg("%s", err.msg);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(run_one(x->b, 40 + i, &out, &err), 0);
        assert_int_equal(out.n_nodes, 1);
        assert_int_equal(out.tokens[0], 40 + i);
        assert_true(pthread_equal(x->f.last_thread, pthread_self()));
    }
    long calls, jobs;
    specd_batcher_counts(x->b, &calls, &jobs);
    assert_int_equal(calls, 3);
    assert_int_equal(jobs, 3);
    specd_tree_buf_free(&out);
}

typedef struct submitter {
    specd_batcher *b;
    int id, bad;
} submitter;

static void *submit_many(void *arg) {
    submitter *s = arg;
    specd_error err = {{0}};
    specd_tree_buf out;
    if (specd_tree_buf_init(&out, 4, 0, &err)) {
        s->bad = 1;
        return NULL;
    }
    for (int i = 0; i < JOBS_EACH && !s->bad; i++) {
        int pos = s->id * 10000 + i;
        if (run_one(s->b, pos, &out, &err) || out.n_nodes != 1 || out.tokens[0] != pos)
            s->bad = 1;
    }
    specd_tree_buf_free(&out);
    return NULL;
}

static void test_concurrent_jobs_batch(void **state) {
    fixture *x = *state;
    x->f.spin_us = 30; /* long enough that others queue behind a call */
    submitter s[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        s[i] = (submitter){.b = x->b, .id = i + 1};
        assert_int_equal(pthread_create(&th[i], NULL, submit_many, &s[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_false(s[i].bad);
    }
    assert_int_equal(atomic_load(&x->f.overlapped), 0);
    assert_true(atomic_load(&x->f.max_n) <= MAX_BATCH);
    assert_true(atomic_load(&x->f.max_n) > 1);
    long calls, jobs;
    specd_batcher_counts(x->b, &calls, &jobs);
    assert_int_equal(jobs, THREADS * JOBS_EACH);
    assert_true(calls < jobs);
}

static void test_failure_reaches_the_job(void **state) {
    fixture *x = *state;
    specd_error err = {{0}};
    specd_tree_buf out;
    if (specd_tree_buf_init(&out, 4, 0, &err)) fail_msg("%s", err.msg);
    assert_int_equal(run_one(x->b, FAIL_POSITION, &out, &err), -1);
    assert_non_null(strstr(err.msg, "stand-in failed"));
    /* and the batcher goes on */
    memset(&err, 0, sizeof err);
    assert_int_equal(run_one(x->b, 7, &out, &err), 0);
    assert_int_equal(out.tokens[0], 7);
    specd_tree_buf_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lone_job_runs_on_its_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_jobs_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_reaches_the_job, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
