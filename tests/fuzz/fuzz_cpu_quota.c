/* fuzz_cpu_quota.c - libFuzzer target for specd_cpu_quota_parse, which reads
 * a cgroup's cpu.max file to size the compute thread pools.
 *
 * Any input gives -1 (not a cpu.max line), 0 (no limit) or a CPU count of
 * at least 1; a count must agree with the quota and period it was read from
 * when the line is re-made from them. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/cpu_count.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int c = specd_cpu_quota_parse((const char *)data, size);
    if (c < -1 || c > (1 << 20)) abort();
    if (c <= 0) return 0;
    /* a count came from "QUOTA PERIOD[\n]": parse the numbers back */
    char buf[80];
    if (size >= sizeof buf) abort();
    memcpy(buf, data, size);
    buf[size] = 0;
    unsigned long long quota, period;
    if (sscanf(buf, "%llu %llu", &quota, &period) != 2 || period == 0) abort();
    unsigned long long want = (quota + period - 1) / period;
    if (want > (1u << 20)) want = 1u << 20;
    if ((unsigned long long)c != want) abort();
    return 0;
}
