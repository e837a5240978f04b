/* bench_args.h - what the micro-benchmarks share: the command-line list,
 * the comparison their medians sort by and the generator of their random
 * inputs. Header only: each bench/ program is one file plus this. */
#ifndef SPECD_BENCH_ARGS_H
#define SPECD_BENCH_ARGS_H

#include <stdint.h>
#include <stdlib.h>

/* "1,2,4" into v[cap], each value in [lo, hi]; the count, or -1 on a
 * malformed list, a value out of range or more than cap values. */
static inline int bench_int_list(const char *s, int *v, int cap, long lo, long hi) {
    int n = 0;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < lo || x > hi || n == cap) return -1;
        v[n++] = (int)x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

/* qsort's order for doubles, ascending (a median is then v[n / 2]). */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A uniform float in [-0.5, 0.5) from a 64-bit LCG state: inputs whose
 * values the kernels' speed does not depend on. */
static inline float bench_urand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(*s >> 40) / (float)(1 << 24) - 0.5f;
}

#endif
