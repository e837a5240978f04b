/* vec_exp.h - the vector exp that softmax and SwiGLU use, one definition
 * for the AVX2 set (vec_avx2.c's exp_avx2) and the AVX-512 set
 * (vec_avx512.c's exp512): both are CPU_DEFINE_EXP at their own width, the
 * same operations lane for lane, so each lane of either gives the same bits
 * (test_softmax_exp_paths).
 *
 * exp(x) = 2^n * p(r): x clamped to [LO, HI] (so the result is a normal
 * number), n = round(x * LOG2E), r = x - n * ln2 in two steps (LN2_HI is
 * exact in few bits, LN2_LO the rest), p the degree-7 polynomial
 * 1 + r + r^2 * (P5 + r * (P4 + ... )) in Horner form, highest first. */
#ifndef SPECD_KERNELS_CPU_VEC_EXP_H
#define SPECD_KERNELS_CPU_VEC_EXP_H

#define CPU_EXP_LO (-87.3f)
#define CPU_EXP_HI 88.7f
#define CPU_EXP_LOG2E 1.44269504088896341f
#define CPU_EXP_LN2_HI 0.693359375f
#define CPU_EXP_LN2_LO (-2.12194440e-4f)
#define CPU_EXP_P0 1.9875691500e-4f
#define CPU_EXP_P1 1.3981999507e-3f
#define CPU_EXP_P2 8.3334519073e-3f
#define CPU_EXP_P3 4.1665795894e-2f
#define CPU_EXP_P4 1.6666665459e-1f
#define CPU_EXP_P5 5.0000001201e-1f

/* static inline ATTRS __m<W> NAME(__m<W> x): exp of each lane, with W 256
 * or 512 and ROUND that width's round-to-nearest (_mm256_round_ps,
 * _mm512_roundscale_ps; the immediate means the same to both). Expanded
 * where immintrin.h and the target attributes are in scope. 2^n is built
 * as n + 127 in the exponent field (n in [-126, 128] after the clamp; 2^128
 * would overflow the field, so it scales by 2^(n/2) and 2^(n - n/2)). */
#define CPU_DEFINE_EXP(NAME, W, ROUND, ATTRS)                                                 \
    static inline ATTRS __m##W NAME(__m##W x) {                                               \
        x = _mm##W##_min_ps(_mm##W##_max_ps(x, _mm##W##_set1_ps(CPU_EXP_LO)),                \
                            _mm##W##_set1_ps(CPU_EXP_HI));                                    \
        const __m##W n = ROUND(_mm##W##_mul_ps(x, _mm##W##_set1_ps(CPU_EXP_LOG2E)),           \
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                \
        __m##W r = _mm##W##_fnmadd_ps(n, _mm##W##_set1_ps(CPU_EXP_LN2_HI), x);                \
        r = _mm##W##_fnmadd_ps(n, _mm##W##_set1_ps(CPU_EXP_LN2_LO), r);                       \
        __m##W p = _mm##W##_set1_ps(CPU_EXP_P0);                                              \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(CPU_EXP_P1));                            \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(CPU_EXP_P2));                            \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(CPU_EXP_P3));                            \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(CPU_EXP_P4));                            \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(CPU_EXP_P5));                            \
        p = _mm##W##_fmadd_ps(p, _mm##W##_mul_ps(r, r),                                       \
                              _mm##W##_add_ps(r, _mm##W##_set1_ps(1.0f)));                    \
        const __m##W##i ni = _mm##W##_cvtps_epi32(n);                                         \
        const __m##W##i half = _mm##W##_srai_epi32(ni, 1);                                    \
        const __m##W s1 = _mm##W##_castsi##W##_ps(                                            \
            _mm##W##_slli_epi32(_mm##W##_add_epi32(half, _mm##W##_set1_epi32(127)), 23));      \
        const __m##W s2 = _mm##W##_castsi##W##_ps(_mm##W##_slli_epi32(                        \
            _mm##W##_add_epi32(_mm##W##_sub_epi32(ni, half), _mm##W##_set1_epi32(127)), 23)); \
        return _mm##W##_mul_ps(_mm##W##_mul_ps(p, s1), s2);                                   \
    }

#endif
