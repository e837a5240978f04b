/* sampling_vec.c - see sampling_vec.h.
 *
 * The weight w = exp(-gap) is computed the same way in every form, in
 * double, so that the one rounding to float at the end decides the bits:
 *
 *     t = -8 gap / ln 2                 (w = 2^(t/8))
 *     k = nearest integer to t          (ties to even), f = t - k in [-1/2, 1/2]
 *     2^(t/8) = 2^(k >> 3) * 2^((k & 7)/8) * exp(f ln2 / 8)
 *
 * with 2^(j/8) from a table of eight and exp(x), |x| <= 0.0434, by its
 * Taylor polynomial to degree 6 (error below 6e-14, relative: a float result
 * lands on the other side of a rounding boundary in about 2 of a million
 * cases against the exact exp, which is as good as libm's expf). Every
 * multiply and add is its own IEEE operation: C11 mode (CMAKE_C_EXTENSIONS
 * OFF) compiles with -ffp-contract=off, so the compiler fuses nothing, and
 * the vector forms use no FMA. Lane sums go into eight accumulators by
 * token id mod 8, which is what an 8-lane double vector does on its own.
 * test_sampling compares the forms bit for bit. */
#include "common/spec/sampling_vec.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#define NEG_8_OVER_LN2 (-0x1.71547652b82fep+3)
#define LN2_OVER_8 0x1.62e42fefa39efp-4
#define C2 0x1.0000000000000p-1
#define C3 0x1.5555555555555p-3
#define C4 0x1.5555555555555p-5
#define C5 0x1.1111111111111p-7
#define C6 0x1.6c16c16c16c17p-10

/* 2^(j/8), correctly rounded */
static const double k_exp2_8th[8] = {
    0x1.0000000000000p+0, 0x1.172b83c7d517bp+0, 0x1.306fe0a31b715p+0, 0x1.4bfdad5362a27p+0,
    0x1.6a09e667f3bcdp+0, 0x1.8ace5422aa0dbp+0, 0x1.ae89f995ad3adp+0, 0x1.d5818dcfba487p+0,
};

/* Adding and subtracting 1.5 * 2^52 rounds a double below 2^51 in size to
 * the nearest integer, ties to even (the current rounding mode, which
 * nothing in specd changes): nearbyint() without the libm call. */
#define ROUNDER 0x1.8p52

float sampling_exp_neg(double gap) {
    if (!(gap < SAMPLING_MAX_GAP)) return 0.0f;
    double t = gap * NEG_8_OVER_LN2;
    double k = (t + ROUNDER) - ROUNDER;
    double x = (t - k) * LN2_OVER_8;
    double p = ((((((C6 * x + C5) * x + C4) * x + C3) * x + C2) * x + 1.0) * x + 1.0);
    int ki = (int)k, j = ki & 7, q = (ki - j) / 8;
    /* gap >= 0 keeps q in [-160, 0]: 2^q and the product stay normal
     * doubles, so the multiply by 2^q (built from its bits) is exact */
    uint64_t bits = (uint64_t)(q + 1023) << 52;
    double two_q;
    memcpy(&two_q, &bits, sizeof two_q);
    return (float)(k_exp2_8th[j] * p * two_q);
}

/* The log-probabilities' exp keeps double precision: the same reduction
 * with t = 8x / ln 2 and the Taylor polynomial to degree 8 (its error is
 * below 2e-18; the rounding of t, up to 9e-13 at x = -700, dominates). */
#define POS_8_OVER_LN2 0x1.71547652b82fep+3
#define C7 0x1.a01a01a01a01ap-13
#define C8 0x1.a01a01a01a01ap-16
#define EXP_D_MIN (-700.0)

double sampling_exp_d(double x) {
    if (!(x >= EXP_D_MIN)) return 0.0;
    double t = x * POS_8_OVER_LN2;
    double k = (t + ROUNDER) - ROUNDER;
    double r = (t - k) * LN2_OVER_8;
    double p = ((((((((C8 * r + C7) * r + C6) * r + C5) * r + C4) * r + C3) * r + C2) * r + 1.0) *
                    r +
                1.0);
    int ki = (int)k, j = ki & 7, q = (ki - j) / 8;
    /* x >= -700 keeps q >= -1010: 2^q is a normal double */
    uint64_t bits = (uint64_t)(q + 1023) << 52;
    double two_q;
    memcpy(&two_q, &bits, sizeof two_q);
    return k_exp2_8th[j] * p * two_q;
}

/* ---- the scalar twin -------------------------------------------------------- */

static void weights_scalar(const float *logits, int n, float lmax, double inv_t, float wmin,
                           float *w, double acc[8]) {
    for (int i = 0; i < n; i++) {
        float v = sampling_exp_neg(((double)lmax - (double)logits[i]) * inv_t);
        if (!(v >= wmin)) v = 0.0f;
        w[i] = v;
        acc[i & 7] += v;
    }
}

static void exp_sum_scalar(const float *logits, int n, float m, double acc[8]) {
    for (int i = 0; i < n; i++) acc[i & 7] += sampling_exp_d((double)logits[i] - (double)m);
}

static int argmax_scalar(const float *x, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) continue;
        /* Strict > keeps the first of equal values: lowest index wins ties. */
        if (best < 0 || x[i] > x[best]) best = i;
    }
    return best < 0 ? 0 : best;
}

static void scale_scalar(float *p, int n, double scale) {
    for (int i = 0; i < n; i++) p[i] = (float)(p[i] * scale);
}

static void buckets_scalar(const float *logits, const float *w, int n, float lmax, double inv_t,
                           uint8_t *bucket) {
    for (int i = 0; i < n; i++) {
        if (!(w[i] > 0.0f)) {
            bucket[i] = 0xFF;
            continue;
        }
        double bb = ((double)lmax - (double)logits[i]) * inv_t * SAMPLING_INV_LN2;
        bucket[i] = (uint8_t)(bb < SAMPLING_NBUCKETS - 1 ? (int)bb : SAMPLING_NBUCKETS - 1);
    }
}

static uint64_t in_range_scalar(const uint8_t *x, int len, uint8_t lo, uint8_t hi) {
    uint64_t m = 0;
    for (int i = 0; i < len; i++) m |= (uint64_t)(x[i] >= lo && x[i] <= hi) << i;
    return m;
}

static void finish_scalar(float *p, int n, double scale) {
    for (int i = 0; i < n; i++) p[i] = p[i] < 0.0f ? (float)(p[i] * scale) : 0.0f;
}

static uint64_t above_scalar(const float *p, int len, float thr) {
    uint64_t m = 0;
    /* most eights hold nothing above (a top-k row, a reduced vocabulary):
     * test them whole before building their bits */
    for (int i = 0; i < len; i += 8) {
        int e = len - i < 8 ? len - i : 8, any = 0;
        for (int j = 0; j < e; j++) any |= p[i + j] > thr;
        if (!any) continue;
        for (int j = 0; j < e; j++) m |= (uint64_t)(p[i + j] > thr) << (i + j);
    }
    return m;
}

static uint64_t contenders_scalar(const uint32_t *w, const float *p, int len, double cut) {
    uint64_t m = 0;
    for (int i = 0; i < len; i++)
        if (p[i] > 0.0f && !race_hopeless(race_u(w[i]), p[i], cut)) m |= 1ull << i;
    return m;
}

static const sampling_vec k_scalar = {
    weights_scalar, exp_sum_scalar, argmax_scalar, scale_scalar,     buckets_scalar,
    in_range_scalar, finish_scalar,  above_scalar,  contenders_scalar};

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define T256 __attribute__((target("avx2")))
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2")))

/* ---- AVX2: 4 doubles a register, two registers per 8 tokens ---------------- */

/* sampling_exp_neg of 4 gaps */
T256 static __m128 exp_neg4(__m256d gap) {
    __m256d ok = _mm256_cmp_pd(gap, _mm256_set1_pd(SAMPLING_MAX_GAP), _CMP_LT_OQ);
    __m256d t = _mm256_mul_pd(gap, _mm256_set1_pd(NEG_8_OVER_LN2));
    __m256d k = _mm256_round_pd(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d x = _mm256_mul_pd(_mm256_sub_pd(t, k), _mm256_set1_pd(LN2_OVER_8));
    __m256d p = _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(C6), x), _mm256_set1_pd(C5));
    p = _mm256_add_pd(_mm256_mul_pd(p, x), _mm256_set1_pd(C4));
    p = _mm256_add_pd(_mm256_mul_pd(p, x), _mm256_set1_pd(C3));
    p = _mm256_add_pd(_mm256_mul_pd(p, x), _mm256_set1_pd(C2));
    p = _mm256_add_pd(_mm256_mul_pd(p, x), _mm256_set1_pd(1.0));
    p = _mm256_add_pd(_mm256_mul_pd(p, x), _mm256_set1_pd(1.0));
    /* lanes that are not ok (NaN, huge) give garbage here, zeroed below */
    __m256d kc = _mm256_and_pd(k, ok);
    __m128i ki = _mm256_cvtpd_epi32(kc);
    __m128i j = _mm_and_si128(ki, _mm_set1_epi32(7)), q = _mm_srai_epi32(ki, 3);
    __m256d tj = _mm256_i32gather_pd(k_exp2_8th, j, 8);
    __m256i e = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(q),
                                                   _mm256_set1_epi64x(1023)), 52);
    __m256d r = _mm256_mul_pd(_mm256_mul_pd(tj, p), _mm256_castsi256_pd(e));
    return _mm256_cvtpd_ps(_mm256_and_pd(r, ok));
}

T256 static void weights_avx2(const float *logits, int n, float lmax, double inv_t, float wmin,
                              float *w, double acc[8]) {
    const __m256d vmax = _mm256_set1_pd((double)lmax), vinv = _mm256_set1_pd(inv_t);
    const __m128 vmin = _mm_set1_ps(wmin);
    __m256d a0 = _mm256_loadu_pd(acc), a1 = _mm256_loadu_pd(acc + 4);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d g0 = _mm256_mul_pd(_mm256_sub_pd(vmax, _mm256_cvtps_pd(_mm_loadu_ps(logits + i))),
                                   vinv);
        __m256d g1 = _mm256_mul_pd(
            _mm256_sub_pd(vmax, _mm256_cvtps_pd(_mm_loadu_ps(logits + i + 4))), vinv);
        __m128 w0 = exp_neg4(g0), w1 = exp_neg4(g1);
        w0 = _mm_and_ps(w0, _mm_cmp_ps(w0, vmin, _CMP_GE_OQ));
        w1 = _mm_and_ps(w1, _mm_cmp_ps(w1, vmin, _CMP_GE_OQ));
        _mm_storeu_ps(w + i, w0);
        _mm_storeu_ps(w + i + 4, w1);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(w0));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(w1));
    }
    _mm256_storeu_pd(acc, a0);
    _mm256_storeu_pd(acc + 4, a1);
    weights_scalar(logits + i, n - i, lmax, inv_t, wmin, w + i, acc); /* i % 8 == 0 */
}

/* sampling_exp_d of 4 values */
T256 static __m256d exp_d4(__m256d x) {
    __m256d ok = _mm256_cmp_pd(x, _mm256_set1_pd(EXP_D_MIN), _CMP_GE_OQ);
    __m256d t = _mm256_mul_pd(x, _mm256_set1_pd(POS_8_OVER_LN2));
    __m256d k = _mm256_round_pd(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_mul_pd(_mm256_sub_pd(t, k), _mm256_set1_pd(LN2_OVER_8));
    __m256d p = _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(C8), r), _mm256_set1_pd(C7));
    p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(C6));
    p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(C5));
    p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(C4));
    p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(C3));
    p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(C2));
    p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(1.0));
    p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(1.0));
    __m128i ki = _mm256_cvtpd_epi32(_mm256_and_pd(k, ok));
    __m128i j = _mm_and_si128(ki, _mm_set1_epi32(7)), q = _mm_srai_epi32(ki, 3);
    __m256d tj = _mm256_i32gather_pd(k_exp2_8th, j, 8);
    __m256i e = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(q),
                                                   _mm256_set1_epi64x(1023)), 52);
    __m256d res = _mm256_mul_pd(_mm256_mul_pd(tj, p), _mm256_castsi256_pd(e));
    return _mm256_and_pd(res, ok);
}

T256 static void exp_sum_avx2(const float *logits, int n, float m, double acc[8]) {
    const __m256d vm = _mm256_set1_pd((double)m);
    __m256d a0 = _mm256_loadu_pd(acc), a1 = _mm256_loadu_pd(acc + 4);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = _mm256_add_pd(a0, exp_d4(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(logits + i)), vm)));
        a1 = _mm256_add_pd(a1,
                           exp_d4(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(logits + i + 4)), vm)));
    }
    _mm256_storeu_pd(acc, a0);
    _mm256_storeu_pd(acc + 4, a1);
    exp_sum_scalar(logits + i, n - i, m, acc); /* i % 8 == 0 */
}

/* The largest non-NaN value (NaN lanes count as -inf), then the first
 * index holding it: with no NaN present and every value -inf, index 0, as
 * the scalar loop; with all NaN no index matches, and 0 again. */
T256 static int argmax_avx2(const float *x, int n) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        vm = _mm256_max_ps(vm, _mm256_blendv_ps(v, vm, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    }
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, vm);
    for (int l = 0; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
    for (int r = i; r < n; r++) m = x[r] > m ? x[r] : m;
    const __m256 vmax = _mm256_set1_ps(m);
    for (i = 0; i + 8 <= n; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vmax, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

T256 static void scale_avx2(float *p, int n, double scale) {
    const __m256d s = _mm256_set1_pd(scale);
    int i = 0;
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(p + i, _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(p + i)), s)));
    scale_scalar(p + i, n - i, scale);
}

T256 static void buckets_avx2(const float *logits, const float *w, int n, float lmax,
                              double inv_t, uint8_t *bucket) {
    const __m256d vmax = _mm256_set1_pd((double)lmax), vinv = _mm256_set1_pd(inv_t),
                  il2 = _mm256_set1_pd(SAMPLING_INV_LN2),
                  top = _mm256_set1_pd(SAMPLING_NBUCKETS - 1);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d g0 = _mm256_mul_pd(
            _mm256_mul_pd(_mm256_sub_pd(vmax, _mm256_cvtps_pd(_mm_loadu_ps(logits + i))), vinv), il2);
        __m256d g1 = _mm256_mul_pd(
            _mm256_mul_pd(_mm256_sub_pd(vmax, _mm256_cvtps_pd(_mm_loadu_ps(logits + i + 4))), vinv),
            il2);
        /* min(NaN, 63) is 63; such a token has w = 0 and is masked below */
        __m128i b0 = _mm256_cvttpd_epi32(_mm256_min_pd(g0, top));
        __m128i b1 = _mm256_cvttpd_epi32(_mm256_min_pd(g1, top));
        __m256 pos = _mm256_cmp_ps(_mm256_loadu_ps(w + i), _mm256_setzero_ps(), _CMP_GT_OQ);
        __m256i b = _mm256_blendv_epi8(_mm256_set1_epi32(0xFF), _mm256_set_m128i(b1, b0),
                                       _mm256_castps_si256(pos));
        __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        _mm_storel_epi64((__m128i *)(bucket + i), _mm_packus_epi16(w16, w16));
    }
    buckets_scalar(logits + i, w + i, n - i, lmax, inv_t, bucket + i);
}

T256 static uint64_t in_range_avx2(const uint8_t *x, int len, uint8_t lo, uint8_t hi) {
    const __m256i vlo = _mm256_set1_epi8((char)lo), vhi = _mm256_set1_epi8((char)hi);
    uint64_t m = 0;
    int i = 0;
    for (; i + 32 <= len; i += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(x + i));
        __m256i ok = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_max_epu8(v, vlo), v),
                                      _mm256_cmpeq_epi8(_mm256_min_epu8(v, vhi), v));
        m |= (uint64_t)(uint32_t)_mm256_movemask_epi8(ok) << i;
    }
    return m | (i < len ? in_range_scalar(x + i, len - i, lo, hi) << i : 0);
}

T256 static void finish_avx2(float *p, int n, double scale) {
    const __m256d s = _mm256_set1_pd(scale);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128 v = _mm_loadu_ps(p + i);
        __m128 r = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(v), s));
        _mm_storeu_ps(p + i, _mm_and_ps(r, _mm_cmp_ps(v, _mm_setzero_ps(), _CMP_LT_OQ)));
    }
    finish_scalar(p + i, n - i, scale);
}

T256 static uint64_t above_avx2(const float *p, int len, float thr) {
    const __m256 t = _mm256_set1_ps(thr);
    uint64_t m = 0;
    int i = 0;
    for (; i + 8 <= len; i += 8)
        m |= (uint64_t)(unsigned)_mm256_movemask_ps(
                 _mm256_cmp_ps(_mm256_loadu_ps(p + i), t, _CMP_GT_OQ))
             << i;
    return m | (i < len ? above_scalar(p + i, len - i, thr) << i : 0);
}

/* AVX2 has no unsigned int32 -> double: flip the sign bit, convert, add
 * 2^31 back (exact). */
T256 static __m256d u32_to_pd(__m128i w) {
    __m128i s = _mm_xor_si128(w, _mm_set1_epi32((int)0x80000000u));
    return _mm256_add_pd(_mm256_cvtepi32_pd(s), _mm256_set1_pd(2147483648.0));
}

T256 static uint64_t contenders_avx2(const uint32_t *w, const float *p, int len, double cut) {
    const __m256d half = _mm256_set1_pd(0.5), sc = _mm256_set1_pd(0x1.0p-32),
                  one = _mm256_set1_pd(1.0), vcut = _mm256_set1_pd(cut),
                  eps = _mm256_set1_pd(1e-9), zero = _mm256_setzero_pd();
    uint64_t m = 0;
    int i = 0;
    for (; i + 4 <= len; i += 4) {
        __m256d u = _mm256_mul_pd(_mm256_add_pd(u32_to_pd(_mm_loadu_si128((const __m128i *)(w + i))),
                                                half),
                                  sc);
        __m256d pd = _mm256_cvtps_pd(_mm_loadu_ps(p + i));
        __m256d lose = _mm256_cmp_pd(_mm256_sub_pd(one, u),
                                     _mm256_add_pd(_mm256_mul_pd(vcut, pd), eps), _CMP_GE_OQ);
        __m256d pos = _mm256_cmp_pd(pd, zero, _CMP_GT_OQ);
        m |= (uint64_t)(unsigned)_mm256_movemask_pd(_mm256_andnot_pd(lose, pos)) << i;
    }
    return m | (i < len ? contenders_scalar(w + i, p + i, len - i, cut) << i : 0);
}

static const sampling_vec k_avx2 = {weights_avx2,  exp_sum_avx2, argmax_avx2,
                                    scale_avx2,    buckets_avx2, in_range_avx2,
                                    finish_avx2,   above_avx2,   contenders_avx2};

/* ---- AVX-512: 8 doubles a register ------------------------------------------ */

T512 static __m256 exp_neg8(__m512d gap) {
    __mmask8 ok = _mm512_cmp_pd_mask(gap, _mm512_set1_pd(SAMPLING_MAX_GAP), _CMP_LT_OQ);
    __m512d t = _mm512_mul_pd(gap, _mm512_set1_pd(NEG_8_OVER_LN2));
    __m512d k = _mm512_roundscale_pd(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d x = _mm512_mul_pd(_mm512_sub_pd(t, k), _mm512_set1_pd(LN2_OVER_8));
    __m512d p = _mm512_add_pd(_mm512_mul_pd(_mm512_set1_pd(C6), x), _mm512_set1_pd(C5));
    p = _mm512_add_pd(_mm512_mul_pd(p, x), _mm512_set1_pd(C4));
    p = _mm512_add_pd(_mm512_mul_pd(p, x), _mm512_set1_pd(C3));
    p = _mm512_add_pd(_mm512_mul_pd(p, x), _mm512_set1_pd(C2));
    p = _mm512_add_pd(_mm512_mul_pd(p, x), _mm512_set1_pd(1.0));
    p = _mm512_add_pd(_mm512_mul_pd(p, x), _mm512_set1_pd(1.0));
    __m256i ki = _mm512_cvtpd_epi32(_mm512_maskz_mov_pd(ok, k));
    __m512i j = _mm512_cvtepi32_epi64(_mm256_and_si256(ki, _mm256_set1_epi32(7)));
    __m512i q = _mm512_cvtepi32_epi64(_mm256_srai_epi32(ki, 3));
    __m512d tj = _mm512_permutexvar_pd(j, _mm512_loadu_pd(k_exp2_8th));
    __m512i e = _mm512_slli_epi64(_mm512_add_epi64(q, _mm512_set1_epi64(1023)), 52);
    __m512d r = _mm512_mul_pd(_mm512_mul_pd(tj, p), _mm512_castsi512_pd(e));
    return _mm512_cvtpd_ps(_mm512_maskz_mov_pd(ok, r));
}

T512 static void weights_avx512(const float *logits, int n, float lmax, double inv_t, float wmin,
                                float *w, double acc[8]) {
    const __m512d vmax = _mm512_set1_pd((double)lmax), vinv = _mm512_set1_pd(inv_t);
    const __m256 vmin = _mm256_set1_ps(wmin);
    __m512d a = _mm512_loadu_pd(acc);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d g =
            _mm512_mul_pd(_mm512_sub_pd(vmax, _mm512_cvtps_pd(_mm256_loadu_ps(logits + i))), vinv);
        __m256 v = exp_neg8(g);
        v = _mm256_and_ps(v, _mm256_cmp_ps(v, vmin, _CMP_GE_OQ));
        _mm256_storeu_ps(w + i, v);
        a = _mm512_add_pd(a, _mm512_cvtps_pd(v));
    }
    _mm512_storeu_pd(acc, a);
    weights_scalar(logits + i, n - i, lmax, inv_t, wmin, w + i, acc); /* i % 8 == 0 */
}

T512 static __m512d exp_d8(__m512d x) {
    __mmask8 ok = _mm512_cmp_pd_mask(x, _mm512_set1_pd(EXP_D_MIN), _CMP_GE_OQ);
    __m512d t = _mm512_mul_pd(x, _mm512_set1_pd(POS_8_OVER_LN2));
    __m512d k = _mm512_roundscale_pd(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_mul_pd(_mm512_sub_pd(t, k), _mm512_set1_pd(LN2_OVER_8));
    __m512d p = _mm512_add_pd(_mm512_mul_pd(_mm512_set1_pd(C8), r), _mm512_set1_pd(C7));
    p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(C6));
    p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(C5));
    p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(C4));
    p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(C3));
    p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(C2));
    p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(1.0));
    p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(1.0));
    __m256i ki = _mm512_cvtpd_epi32(_mm512_maskz_mov_pd(ok, k));
    __m512i j = _mm512_cvtepi32_epi64(_mm256_and_si256(ki, _mm256_set1_epi32(7)));
    __m512i q = _mm512_cvtepi32_epi64(_mm256_srai_epi32(ki, 3));
    __m512d tj = _mm512_permutexvar_pd(j, _mm512_loadu_pd(k_exp2_8th));
    __m512i e = _mm512_slli_epi64(_mm512_add_epi64(q, _mm512_set1_epi64(1023)), 52);
    return _mm512_maskz_mov_pd(ok, _mm512_mul_pd(_mm512_mul_pd(tj, p), _mm512_castsi512_pd(e)));
}

T512 static void exp_sum_avx512(const float *logits, int n, float m, double acc[8]) {
    const __m512d vm = _mm512_set1_pd((double)m);
    __m512d a = _mm512_loadu_pd(acc);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        a = _mm512_add_pd(a, exp_d8(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(logits + i)), vm)));
    _mm512_storeu_pd(acc, a);
    exp_sum_scalar(logits + i, n - i, m, acc); /* i % 8 == 0 */
}

T512 static int argmax_avx512(const float *x, int n) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        vm = _mm512_mask_max_ps(vm, _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), vm, v);
    }
    float m = _mm512_reduce_max_ps(vm);
    for (int r = i; r < n; r++) m = x[r] > m ? x[r] : m;
    const __m512 vmax = _mm512_set1_ps(m);
    for (i = 0; i + 16 <= n; i += 16) {
        __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vmax, _CMP_EQ_OQ);
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

T512 static void scale_avx512(float *p, int n, double scale) {
    const __m512d s = _mm512_set1_pd(scale);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(p + i,
                         _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(p + i)), s)));
    scale_scalar(p + i, n - i, scale);
}

T512 static void buckets_avx512(const float *logits, const float *w, int n, float lmax,
                                double inv_t, uint8_t *bucket) {
    const __m512d vmax = _mm512_set1_pd((double)lmax), vinv = _mm512_set1_pd(inv_t),
                  il2 = _mm512_set1_pd(SAMPLING_INV_LN2),
                  top = _mm512_set1_pd(SAMPLING_NBUCKETS - 1);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d g = _mm512_mul_pd(
            _mm512_mul_pd(_mm512_sub_pd(vmax, _mm512_cvtps_pd(_mm256_loadu_ps(logits + i))), vinv),
            il2);
        __m256i b = _mm512_cvttpd_epi32(_mm512_min_pd(g, top));
        __mmask8 pos = _mm256_cmp_ps_mask(_mm256_loadu_ps(w + i), _mm256_setzero_ps(), _CMP_GT_OQ);
        b = _mm256_mask_mov_epi32(_mm256_set1_epi32(0xFF), pos, b);
        _mm_storel_epi64((__m128i *)(bucket + i), _mm256_cvtepi32_epi8(b));
    }
    buckets_scalar(logits + i, w + i, n - i, lmax, inv_t, bucket + i);
}

T512 static uint64_t in_range_avx512(const uint8_t *x, int len, uint8_t lo, uint8_t hi) {
    if (len < 64) return in_range_avx2(x, len, lo, hi);
    __m512i v = _mm512_loadu_si512(x);
    return _mm512_cmp_epu8_mask(v, _mm512_set1_epi8((char)lo), _MM_CMPINT_NLT) &
           _mm512_cmp_epu8_mask(v, _mm512_set1_epi8((char)hi), _MM_CMPINT_LE);
}

T512 static void finish_avx512(float *p, int n, double scale) {
    const __m512d s = _mm512_set1_pd(scale);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(p + i);
        __m256 r = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(v), s));
        _mm256_storeu_ps(p + i, _mm256_maskz_mov_ps(
                                    _mm256_cmp_ps_mask(v, _mm256_setzero_ps(), _CMP_LT_OQ), r));
    }
    finish_scalar(p + i, n - i, scale);
}

T512 static uint64_t above_avx512(const float *p, int len, float thr) {
    const __m512 t = _mm512_set1_ps(thr);
    uint64_t m = 0;
    int i = 0;
    for (; i + 16 <= len; i += 16)
        m |= (uint64_t)_mm512_cmp_ps_mask(_mm512_loadu_ps(p + i), t, _CMP_GT_OQ) << i;
    return m | (i < len ? above_scalar(p + i, len - i, thr) << i : 0);
}

T512 static uint64_t contenders_avx512(const uint32_t *w, const float *p, int len, double cut) {
    const __m512d half = _mm512_set1_pd(0.5), sc = _mm512_set1_pd(0x1.0p-32),
                  one = _mm512_set1_pd(1.0), vcut = _mm512_set1_pd(cut),
                  eps = _mm512_set1_pd(1e-9), zero = _mm512_setzero_pd();
    uint64_t m = 0;
    int i = 0;
    for (; i + 8 <= len; i += 8) {
        __m512d u = _mm512_mul_pd(
            _mm512_add_pd(_mm512_cvtepu32_pd(_mm256_loadu_si256((const __m256i *)(w + i))), half),
            sc);
        __m512d pd = _mm512_cvtps_pd(_mm256_loadu_ps(p + i));
        __mmask8 lose = _mm512_cmp_pd_mask(_mm512_sub_pd(one, u),
                                           _mm512_add_pd(_mm512_mul_pd(vcut, pd), eps), _CMP_GE_OQ);
        __mmask8 pos = _mm512_cmp_pd_mask(pd, zero, _CMP_GT_OQ);
        m |= (uint64_t)(uint8_t)(pos & (__mmask8)~lose) << i;
    }
    return m | (i < len ? contenders_scalar(w + i, p + i, len - i, cut) << i : 0);
}

static const sampling_vec k_avx512 = {
    weights_avx512, exp_sum_avx512,  argmax_avx512,     scale_avx512,     buckets_avx512,
    in_range_avx512, finish_avx512, above_avx512, contenders_avx512};
#endif

const sampling_vec *sampling_vec_active(void) {
#if defined(__x86_64__) || defined(__i386__)
    switch (specd_simd_active()) {
    case SPECD_SIMD_AVX512: return &k_avx512;
    case SPECD_SIMD_AVX2: return &k_avx2;
    default: break;
    }
#endif
    return &k_scalar;
}
