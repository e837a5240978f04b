/* cpu_count.c - see cpu_count.h. */
#include "common/util/cpu_count.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util/small_file.h"

/* Longest cpu.max line accepted: two 20-digit numbers and a space. */
#define QUOTA_MAX_TEXT 64

/* Parses a decimal at *p (no sign), advancing it; -1 if none or if it
 * would exceed 2^62. */
static int64_t parse_u62(const char **p, const char *end) {
    const char *s = *p;
    int64_t v = 0;
    if (s == end || *s < '0' || *s > '9') return -1;
    while (s < end && *s >= '0' && *s <= '9') {
        if (v > ((INT64_C(1) << 62) - 9) / 10) return -1;
        v = v * 10 + (*s - '0');
        s++;
    }
    *p = s;
    return v;
}

int specd_cpu_quota_parse(const char *text, size_t len) {
    if (!text || len == 0 || len > QUOTA_MAX_TEXT) return -1;
    const char *p = text, *end = text + len;
    /* one trailing newline, as the kernel writes it */
    if (end[-1] == '\n') end--;
    int64_t quota = -1;
    if (end - p >= 3 && memcmp(p, "max", 3) == 0) {
        p += 3;
    } else if ((quota = parse_u62(&p, end)) < 0) {
        return -1;
    }
    if (p == end || *p != ' ') return -1;
    p++;
    int64_t period = parse_u62(&p, end);
    if (period <= 0 || p != end) return -1;
    if (quota < 0) return 0; /* "max": no limit */
    if (quota == 0) return -1;
    int64_t cpus = (quota + period - 1) / period;
    return cpus > 1 << 20 ? 1 << 20 : (int)cpus;
}

/* The cgroup's CPU quota in whole CPUs, 0 for none (or none readable).
 * The files at the cgroup root are the container's own under a cgroup
 * namespace, as in Kubernetes pods; a process in a nested cgroup without
 * one reads the root's, which has no quota. */
static int cgroup_cpus(void) {
    specd_error err = {{0}}; /* a file that is not there is no limit */
    size_t n;
    char *text = specd_read_small_file("/sys/fs/cgroup/cpu.max", QUOTA_MAX_TEXT, &n, &err);
    if (text) {
        int c = specd_cpu_quota_parse(text, n);
        free(text);
        return c > 0 ? c : 0;
    }
    /* cgroup v1: the quota and the period in two files; a quota of -1 is
     * no limit */
    char *q = specd_read_small_file("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", 32, &n, &err);
    char *per = specd_read_small_file("/sys/fs/cgroup/cpu/cpu.cfs_period_us", 32, &n, &err);
    long long quota = 0, period = 0;
    int ok = q && per && sscanf(q, "%lld", &quota) == 1 && sscanf(per, "%lld", &period) == 1 &&
             quota > 0 && period > 0;
    free(q);
    free(per);
    if (!ok) return 0;
    long long c = (quota + period - 1) / period;
    return c > 1 << 20 ? 1 << 20 : (int)c;
}

int specd_cpu_count(void) {
    int n = 0;
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    int quota = cgroup_cpus();
    if (quota > 0 && quota < n) n = quota;
    return n > 0 ? n : 1;
}
