/* cpu_count.h - how many CPUs this process may actually use.
 *
 * "threads: 0" means one compute thread per available core. Online CPUs
 * (sysconf) is the wrong count inside a container: a Kubernetes pod may be
 * pinned to a few cores (a cpuset, the static CPU manager) or given a CPU
 * quota on a node of 64, and a pool of 64 spinning workers on 4 cores' worth
 * of time only takes turns (8 threads on a 2-vCPU VM decoded 15-20% slower
 * than 2). So the count is the CPUs in this thread's affinity mask, capped by
 * the cgroup's CPU quota rounded up (cgroup v2 cpu.max, or v1
 * cpu.cfs_quota_us / cpu.cfs_period_us), as container-aware runtimes do. */
#ifndef SPECD_CPU_COUNT_H
#define SPECD_CPU_COUNT_H

#include <stddef.h>

/* CPUs available to this process: at least 1. */
int specd_cpu_count(void);

/* The whole CPUs a cgroup v2 `cpu.max` file grants ("QUOTA PERIOD" in
 * microseconds, or "max PERIOD"), rounded up: 0 for no limit, -1 for text
 * that is not such a line. Pure (fuzzed: tests/fuzz/fuzz_cpu_quota.c). */
int specd_cpu_quota_parse(const char *text, size_t len);

#endif
