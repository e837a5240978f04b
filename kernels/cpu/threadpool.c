/* threadpool.c - persistent worker threads with a low-latency hand-off.
 *
 * A forward pass issues hundreds of small parallel runs back to back (one per
 * matmul, attention, ...), each only tens of microseconds long at decode, so
 * the cost of starting and ending a run matters as much as the work itself.
 * The scheme:
 *
 *   - The pool keeps n-1 workers; the caller of specd_pool_run is thread 0
 *     and works too, so a 1-thread pool never touches another thread.
 *   - A run is published by bumping `gen`. Workers watch `gen`: right after a
 *     run they spin on it for a short while (they notice a new run in well
 *     under a microsecond), then fall asleep on a condition variable (an idle
 *     server must not burn CPU).
 *   - Tasks are handed out by an atomic counter (`next`), so uneven tasks and
 *     a late worker balance themselves: whoever is running takes the next
 *     task. A run is over when `done` counts every task.
 *   - The caller never waits for a worker that has not joined the run. On a
 *     busy machine a worker may not get a CPU for milliseconds; the caller
 *     then simply does all the tasks itself. To make that safe, a worker
 *     registers in `active` before it looks at the run, and backs off if the
 *     run is no longer open (`gen` moved on or `closed` caught up). The
 *     caller, after the last task, marks the run closed and waits only for
 *     registered workers to leave; from then on no worker reads this run's
 *     fn/ctx/counters, so the next run may reuse them. (Registering and
 *     closing are sequentially consistent, so at least one side sees the
 *     other: either the worker sees the run closed, or the caller sees the
 *     worker registered and waits for it.)
 *
 * The shared counters sit on separate cache lines so that spinning readers of
 * one do not slow down writers of another. */
#include "threadpool.h"
#include "common/util/thread_name.h"
#include "common/util/clock.h"
#include "common/util/cpu_count.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPIN_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define SPIN_PAUSE() __asm__ __volatile__("yield")
#else
#define SPIN_PAUSE() ((void)0)
#endif

/* How long an idle worker waits actively before sleeping. Long enough to
 * bridge the serial gaps inside and between forward passes (rmsnorm,
 * sampling, a gRPC round trip on loopback), short enough that an idle server
 * sleeps at once in human terms. Measured in wall time because the cost of a
 * PAUSE instruction varies 10x between CPU generations. */
#define SPIN_NS 2000000LL
/* For the first part of that window the worker spins on PAUSE alone; after
 * that it calls sched_yield between checks, which costs nothing when the CPU
 * is otherwise idle but hands the core over at once when more threads than
 * cores want it (a busy machine, sanitizer runs). */
#define SPIN_PURE_NS 50000LL

/* Pauses between clock reads while spinning (a clock read is ~20 ns). */
#define SPIN_CHECK_EVERY 64

#define CACHE_LINE 64

typedef struct worker_arg {
    specd_pool *pool;
    int thread;
} worker_arg;

struct specd_pool {
    int n_threads;
    pthread_t *threads;
    worker_arg *args;

    /* The current run; written by the caller before `gen` is bumped. */
    specd_task_fn fn;
    void *ctx;
    int n_tasks;

    _Alignas(CACHE_LINE) atomic_uint gen;     /* id of the latest run */
    _Alignas(CACHE_LINE) atomic_uint closed;  /* id of the latest closed run */
    _Alignas(CACHE_LINE) atomic_int next;     /* next task index to take */
    _Alignas(CACHE_LINE) atomic_int done;     /* tasks finished this run */
    _Alignas(CACHE_LINE) atomic_int active;   /* workers registered in a run */
    _Alignas(CACHE_LINE) atomic_int sleeping; /* workers on (or going to) cv */
    atomic_int stop;

    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Takes tasks until none are left, counting each finished one. */
static void drain(specd_pool *pool, specd_task_fn fn, void *ctx, int n_tasks, int thread) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
        if (t >= n_tasks) break;
        fn(ctx, t, thread);
        /* release: the task's writes happen before the caller's acquire of
         * the final count */
        atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
    }
}

/* Waits until `gen` differs from `seen` (or stop), spinning first. Returns the
 * new generation. */
static unsigned wait_for_run(specd_pool *pool, unsigned seen) {
    int64_t start = specd_now_ns_int();
    int yielding = 0;
    for (int i = 1;; i++) {
        unsigned g = atomic_load_explicit(&pool->gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&pool->stop, memory_order_relaxed)) return g;
        if (yielding) sched_yield();
        else SPIN_PAUSE();
        if (i % SPIN_CHECK_EVERY == 0) {
            int64_t dt = specd_now_ns_int() - start;
            if (dt > SPIN_NS) break;
            yielding = dt > SPIN_PURE_NS;
        }
    }
    /* Sleep. `sleeping` is raised (seq_cst) before `gen` is re-checked, and
     * the caller bumps `gen` (seq_cst) before reading `sleeping`, so at least
     * one side sees the other: either we see the new run here, or the caller
     * sees a sleeper and broadcasts under the mutex we hold until cond_wait. */
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add(&pool->sleeping, 1);
    unsigned g;
    while ((g = atomic_load(&pool->gen)) == seen && !atomic_load(&pool->stop))
        pthread_cond_wait(&pool->cv, &pool->mu);
    atomic_fetch_sub(&pool->sleeping, 1);
    pthread_mutex_unlock(&pool->mu);
    return g;
}

static void *worker_main(void *p) {
    worker_arg *arg = p;
    specd_pool *pool = arg->pool;
    specd_thread_name("pool-%d", arg->thread);
    /* Runs are numbered from 1. */
    unsigned seen = 0;
    for (;;) {
        unsigned g = wait_for_run(pool, seen);
        if (atomic_load_explicit(&pool->stop, memory_order_acquire)) break;
        seen = g;
        atomic_fetch_add(&pool->active, 1);
        /* Joined only if run g is still open; it then stays open (its fields
         * stable) until we deregister. */
        if (atomic_load(&pool->gen) == g && atomic_load(&pool->closed) != g)
            drain(pool, pool->fn, pool->ctx, pool->n_tasks, arg->thread);
        atomic_fetch_sub_explicit(&pool->active, 1, memory_order_release);
    }
    return NULL;
}

specd_pool *specd_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = specd_cpu_count();
    specd_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    atomic_init(&pool->gen, 0);
    atomic_init(&pool->closed, 0);
    atomic_init(&pool->next, 0);
    atomic_init(&pool->done, 0);
    atomic_init(&pool->active, 0);
    atomic_init(&pool->sleeping, 0);
    atomic_init(&pool->stop, 0);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    int n_workers = n_threads - 1;
    if (n_workers > 0) {
        pool->threads = calloc((size_t)n_workers, sizeof *pool->threads);
        pool->args = calloc((size_t)n_workers, sizeof *pool->args);
        if (!pool->threads || !pool->args) {
            free(pool->threads);
            free(pool->args);
            pthread_mutex_destroy(&pool->mu);
            pthread_cond_destroy(&pool->cv);
            free(pool);
            return NULL;
        }
    }
    for (int i = 0; i < n_workers; i++) {
        pool->args[i].pool = pool;
        pool->args[i].thread = i + 1;
        if (pthread_create(&pool->threads[i], NULL, worker_main, &pool->args[i]) != 0) {
            /* Fewer threads than asked is still a working pool. */
            pool->n_threads = i + 1;
            break;
        }
    }
    return pool;
}

void specd_pool_destroy(specd_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->n_threads - 1; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->threads);
    free(pool->args);
    free(pool);
}

int specd_pool_size(const specd_pool *pool) { return pool ? pool->n_threads : 1; }

/* Spins until *v >= target (acquire), yielding the CPU now and then in case
 * the thread we wait for was preempted (more threads than cores). */
static void wait_at_least(atomic_int *v, int target) {
    for (int i = 1; atomic_load_explicit(v, memory_order_acquire) < target; i++) {
        SPIN_PAUSE();
        if (i % (4 * SPIN_CHECK_EVERY) == 0) sched_yield();
    }
}

void specd_pool_run(specd_pool *pool, int n_tasks, specd_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    /* One task or one thread: waking workers would only add latency. */
    if (!pool || pool->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n_tasks;
    atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    /* seq_cst: publishes the fields above and orders against `sleeping`. */
    unsigned g = atomic_fetch_add(&pool->gen, 1) + 1;
    if (atomic_load(&pool->sleeping) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
    }

    drain(pool, fn, ctx, n_tasks, 0);
    wait_at_least(&pool->done, n_tasks);

    /* Close the run, then wait for the workers still registered in it (they
     * are at most finishing a failed fetch of `next`). */
    atomic_store(&pool->closed, g);
    for (int i = 1; atomic_load(&pool->active) > 0; i++) {
        SPIN_PAUSE();
        if (i % (4 * SPIN_CHECK_EVERY) == 0) sched_yield();
    }
}
