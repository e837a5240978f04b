/* clock.h - the one clock specd times things with: CLOCK_MONOTONIC, which
 * never jumps with the wall clock (NTP, an operator's `date`), read as
 * seconds, milliseconds, microseconds or nanoseconds since an arbitrary
 * start. Durations, deadlines and rates take differences of two readings;
 * nothing compares a reading with the time of day. */
#ifndef SPECD_CLOCK_H
#define SPECD_CLOCK_H

#include <stdint.h>
#include <time.h>

/* The one reading; the others are its units. */
static inline int64_t specd_now_ns_int(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline double specd_now_s(void) { return (double)specd_now_ns_int() * 1e-9; }
static inline double specd_now_ms(void) { return (double)specd_now_ns_int() * 1e-6; }
static inline double specd_now_us(void) { return (double)specd_now_ns_int() * 1e-3; }

/* Whole milliseconds and microseconds, for sums and timestamps kept as
 * integers. */
static inline int64_t specd_now_ms_int(void) { return specd_now_ns_int() / 1000000; }
static inline int64_t specd_now_us_int(void) { return specd_now_ns_int() / 1000; }

#endif
