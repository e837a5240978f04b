/* vec_hsum.h - the one horizontal-sum network of the attention dots, used
 * by the AVX2 set (vec_avx2.c) and the AVX-512 set (vec_avx512.c), so their
 * scores are the same bits by construction.
 *
 * hsum8 (vec_avx2.c) pairs lane j with j+4 (t_j), then t_0 with t_2 and
 * t_1 with t_3, then those two; the steps below make the same pairs in the
 * same order for 4 rows per vector (IEEE addition is commutative, so only
 * the pairing matters). */
#ifndef SPECD_KERNELS_CPU_VEC_HSUM_H
#define SPECD_KERNELS_CPU_VEC_HSUM_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* [hsum8(v0), hsum8(v1), hsum8(v2), hsum8(v3)] */
static inline __attribute__((always_inline, target("avx2"))) __m128
cpu_hsum8x4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    /* t: [t(row0) | t(row1)] and [t(row2) | t(row3)], t_j = lane j + lane j+4 */
    const __m256 u01 = _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20),
                                     _mm256_permute2f128_ps(v0, v1, 0x31));
    const __m256 u23 = _mm256_add_ps(_mm256_permute2f128_ps(v2, v3, 0x20),
                                     _mm256_permute2f128_ps(v2, v3, 0x31));
    /* [t0+t2, t1+t3] of rows 0, 2 | rows 1, 3 */
    const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(u01, u23, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(u01, u23, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 h = _mm256_hadd_ps(w, w); /* [row0, row2, ., . | row1, row3, ., .] */
    return _mm_unpacklo_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#endif

#endif
