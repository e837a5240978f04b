/* threadpool.h - a fixed pool of worker threads for data-parallel kernels.
 *
 * Kernels split their work into `n_tasks` independent pieces (rows of a
 * matmul, heads of attention); specd_pool_run hands the pieces out and
 * returns when all are done. The calling thread works too, so a pool of
 * n threads starts n-1 workers. Workers sleep on a condition variable between
 * runs (a server is idle most of the time) after a short spin (a forward pass
 * issues hundreds of runs back to back). */
#ifndef SPECD_THREADPOOL_H
#define SPECD_THREADPOOL_H

typedef struct specd_pool specd_pool;

/* task: 0..n_tasks-1; thread: 0..n_threads-1 (for per-thread scratch). */
typedef void (*specd_task_fn)(void *ctx, int task, int thread);

/* n_threads <= 0 means one per CPU this process may use (cpu_count.h). */
specd_pool *specd_pool_create(int n_threads);
void specd_pool_destroy(specd_pool *pool);
int specd_pool_size(const specd_pool *pool);

/* Runs fn(ctx, task, thread) for every task; blocks until all finish.
 * Not re-entrant: one run at a time per pool. */
void specd_pool_run(specd_pool *pool, int n_tasks, specd_task_fn fn, void *ctx);

/* The first of n items that task t of `tasks` takes when they are cut into
 * contiguous, near-equal ranges (task t takes [share(t), share(t + 1))). */
static inline int specd_pool_share(int n, int tasks, int t) {
    return (int)((long long)n * t / tasks);
}

#endif
