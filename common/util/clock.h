/* clock.h - the one clock specd times things with: CLOCK_MONOTONIC, which
 * never jumps with the wall clock (NTP, an operator's `date`), read as
 * milliseconds or microseconds since an arbitrary start. Durations,
 * deadlines and rates take differences of two readings; nothing compares a
 * reading with the time of day. */
#ifndef SPECD_CLOCK_H
#define SPECD_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline double specd_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double specd_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline double specd_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Whole milliseconds and microseconds, for sums and timestamps kept as
 * integers. */
static inline int64_t specd_now_ms_int(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t specd_now_us_int(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

#endif
