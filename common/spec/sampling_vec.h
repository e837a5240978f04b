/* sampling_vec.h - the loops of sampling.c that touch every token of the
 * vocabulary, as a scalar twin and AVX2 / AVX-512 forms with the same bits.
 *
 * A sampled step runs them once per verified row (the target's p) and once
 * per drafted node (the draft's q), over 49,152 tokens for SmolLM2; one by
 * one, in scalar code calling libm's expf and Philox block by block, they
 * took 0.5 ms of every sampled step on the 2-vCPU Xeon of BENCHMARKS.md,
 * a fifth of a decode step. The width comes from common/util/simd.h.
 *
 * Internal to common/spec: sampling.c is the only caller. */
#ifndef SPECD_SAMPLING_VEC_H
#define SPECD_SAMPLING_VEC_H

#include <stdint.h>

#include "common/util/simd.h"

/* Beyond this many nats below the best token the float weight is 0 anyway
 * (expf underflows below about -103.97); checking first also keeps the
 * double->float conversion of a huge gap in range. */
#define SAMPLING_MAX_GAP 110.0
#define SAMPLING_NBUCKETS 64
#define SAMPLING_INV_LN2 1.4426950408889634074 /* 1 / ln 2 */

/* exp(-gap) for a gap in nats, computed in double and rounded once to
 * float; 0 unless gap < SAMPLING_MAX_GAP (so NaN and +inf give 0). The
 * scalar definition every form keeps bit for bit. */
float sampling_exp_neg(double gap);

/* exp(x) in double for x <= 0 (a logit minus the row's largest), to about
 * 1e-13 relative; 0 for x < -700 (far below what a sum >= 1 can hold), for
 * -inf and for NaN. The scalar definition of the log-probabilities'
 * normalizer, which every form keeps bit for bit. */
double sampling_exp_d(double x);

typedef struct sampling_vec {
    /* w[i] = sampling_exp_neg((lmax - logits[i]) / T) with inv_t = 1 / T,
     * then 0 where !(w[i] >= wmin); acc[i % 8] += w[i] in id order. lmax
     * must be finite and >= every logit (the +inf case is sampling.c's). */
    void (*weights)(const float *logits, int n, float lmax, double inv_t, float wmin, float *w,
                    double acc[8]);
    /* acc[i % 8] += sampling_exp_d(logits[i] - m) in id order */
    void (*exp_sum)(const float *logits, int n, float m, double acc[8]);
    /* specd_argmax: the first index of the largest non-NaN value, 0 if
     * every value is NaN */
    int (*argmax)(const float *x, int n);
    /* p[i] = (float)(p[i] * scale) */
    void (*scale)(float *p, int n, double scale);
    /* The rank bucket of each token with w[i] > 0: floor(gap / ln 2) with
     * gap = (lmax - logits[i]) * inv_t in double, at most 63; 0xFF where
     * w[i] is 0. (The +inf case is sampling.c's.) */
    void (*buckets)(const float *logits, const float *w, int n, float lmax, double inv_t,
                    uint8_t *bucket);
    /* bit i set (i < len <= 64) where lo <= x[i] <= hi */
    uint64_t (*in_range)(const uint8_t *x, int len, uint8_t lo, uint8_t hi);
    /* p[i] = p[i] < 0 ? (float)(p[i] * scale) : 0 */
    void (*finish)(float *p, int n, double scale);
    /* bit i set (i < len <= 64) where p[i] > thr */
    uint64_t (*above)(const float *p, int len, float thr);
    /* bit i set (i < len <= 64) where p[i] > 0 and the race draw with
     * Philox word w[i] may still beat `cut`: not sampling.c's
     * race_hopeless(). Only a filter; sampling.c decides each set bit
     * exactly, so the forms may differ in rounding here (they do not). */
    uint64_t (*contenders)(const uint32_t *w, const float *p, int len, double cut);
} sampling_vec;

/* The form of the active SIMD level (simd.h). */
const sampling_vec *sampling_vec_active(void);

/* The race's test: a token with probability p and uniform u certainly loses
 * to cut, since E = -log(u) >= 1 - u, so 1 - u >= cut * p (plus a margin far
 * above the rounding of the exact comparison) means E / p > cut. */
static inline int race_hopeless(double u, float p, double cut) {
    return 1.0 - u >= cut * (double)p + 1e-9;
}

/* The uniform in (0, 1) a race draw's Philox word stands for. */
static inline double race_u(uint32_t w) { return ((double)w + 0.5) * 0x1.0p-32; }

#endif
