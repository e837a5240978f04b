/* thread_name.h - names for specd's threads, as `top -H`, `ps -L`, perf and
 * gdb show them ("sched", "pool-1", "rpc-cq0", "Target/Verify", ...).
 *
 * A process holds a dozen threads of a few kinds (the scheduler's worker, the
 * kernels' pool, gRPC's completion-queue pollers, one handler per call);
 * without names every one of them reads "specd", and an operator cannot tell
 * which is spinning or where a step's time goes. */
#ifndef SPECD_THREAD_NAME_H
#define SPECD_THREAD_NAME_H

/* Names the calling thread, printf-style. Linux keeps 15 bytes; a longer
 * name keeps its last 15, the part that tells calls apart ("Target/Verify"
 * of "/specd.v1.Target/Verify"). Best effort: a failure changes nothing. */
void specd_thread_name(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
