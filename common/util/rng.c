/* rng.c - Philox4x32-10, see rng.h.
 *
 * Written from the description in the Random123 paper and checked against its
 * known-answer vectors (tests/unit/test_sampling.c). */
#include "common/util/rng.h"

#include "common/util/simd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/* Round multipliers and Weyl key increments from the paper (Table 2). The
 * increments are the golden ratio and sqrt(3) - 1 in 0.32 fixed point. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* One round: two 32x32->64 multiplies whose high halves are mixed with the
 * other two words and the round key, then a fixed word permutation. */
static void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k[0];
    uint32_t n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

void specd_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    /* The first round uses the key as given; each later round first bumps it
     * (Random123's philox4x32_R: round, then (bumpkey, round) x 9). */
    philox_round(c, k);
    for (int r = 1; r < 10; r++) {
        k[0] += PHILOX_W0;
        k[1] += PHILOX_W1;
        philox_round(c, k);
    }
    out[0] = c[0];
    out[1] = c[1];
    out[2] = c[2];
    out[3] = c[3];
}

void specd_rng_u32x4(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    specd_philox4x32_10(ctr, key, out);
}

double specd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint32_t w[4];
    specd_rng_u32x4(seed, stream, counter, w);
    /* Top 53 bits of the first 64 output bits: every double k * 2^-53 for
     * k in [0, 2^53) is equally likely, and the product is exact. */
    uint64_t bits = ((uint64_t)w[0] << 32 | w[1]) >> 11;
    return (double)bits * 0x1.0p-53;
}

/* ---- many blocks at once ---------------------------------------------------
 *
 * The vector forms run Philox on 8 or 16 counters side by side, one lane per
 * block: word r of every block in one register. A 32x32->64 multiply exists
 * only for the even 32-bit lanes (vpmuludq), so each round multiplies the
 * even lanes and the odd lanes (shifted down) separately and blends the
 * halves back. After the rounds a 4 x 4 transpose (and, across 128-bit
 * lanes, one more) puts each block's four words together, as the scalar
 * loop writes them. The lanes differ only in the counter's low word, so a
 * run whose low word wraps inside one group of lanes takes the scalar loop
 * for that group. */

static void run_scalar(uint64_t seed, uint64_t stream, uint64_t counter, size_t n, uint32_t *out) {
    for (size_t i = 0; i < n; i++) specd_rng_u32x4(seed, stream, counter + i, out + 4 * i);
}

#if defined(__x86_64__) || defined(__i386__)
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2")))
#define T256 __attribute__((target("avx2")))

T512 static inline void mulhilo16(__m512i m, __m512i c, __m512i *hi, __m512i *lo) {
    __m512i pe = _mm512_mul_epu32(m, c);                        /* even lanes' products */
    __m512i po = _mm512_mul_epu32(m, _mm512_srli_epi64(c, 32)); /* odd lanes' */
    *lo = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
}

/* 16 blocks at counters counter .. counter + 15 (no wrap of the low word). */
T512 static void blocks16(uint32_t k0, uint32_t k1, uint64_t counter, uint64_t stream,
                          uint32_t *out) {
    const __m512i m0 = _mm512_set1_epi32((int)PHILOX_M0), m1 = _mm512_set1_epi32((int)PHILOX_M1);
    __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)counter),
                                  _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                    14, 15));
    __m512i c1 = _mm512_set1_epi32((int)(uint32_t)(counter >> 32));
    __m512i c2 = _mm512_set1_epi32((int)(uint32_t)stream);
    __m512i c3 = _mm512_set1_epi32((int)(uint32_t)(stream >> 32));
    for (int r = 0; r < 10; r++) {
        if (r > 0) k0 += PHILOX_W0, k1 += PHILOX_W1;
        __m512i hi0, lo0, hi1, lo1;
        mulhilo16(m0, c0, &hi0, &lo0);
        mulhilo16(m1, c2, &hi1, &lo1);
        /* 0x96: a ^ b ^ c */
        c0 = _mm512_ternarylogic_epi32(hi1, c1, _mm512_set1_epi32((int)k0), 0x96);
        c2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32((int)k1), 0x96);
        c1 = lo1;
        c3 = lo0;
    }
    /* in each 128-bit lane L: o_j = block 4L + j's four words */
    __m512i a = _mm512_unpacklo_epi32(c0, c1), b = _mm512_unpackhi_epi32(c0, c1);
    __m512i c = _mm512_unpacklo_epi32(c2, c3), d = _mm512_unpackhi_epi32(c2, c3);
    __m512i o0 = _mm512_unpacklo_epi64(a, c), o1 = _mm512_unpackhi_epi64(a, c);
    __m512i o2 = _mm512_unpacklo_epi64(b, d), o3 = _mm512_unpackhi_epi64(b, d);
    /* then lane L of o0..o3 side by side is blocks 4L .. 4L + 3 */
    __m512i t0 = _mm512_shuffle_i32x4(o0, o1, 0x44), t1 = _mm512_shuffle_i32x4(o2, o3, 0x44);
    __m512i t2 = _mm512_shuffle_i32x4(o0, o1, 0xEE), t3 = _mm512_shuffle_i32x4(o2, o3, 0xEE);
    _mm512_storeu_si512(out, _mm512_shuffle_i32x4(t0, t1, 0x88));
    _mm512_storeu_si512(out + 16, _mm512_shuffle_i32x4(t0, t1, 0xDD));
    _mm512_storeu_si512(out + 32, _mm512_shuffle_i32x4(t2, t3, 0x88));
    _mm512_storeu_si512(out + 48, _mm512_shuffle_i32x4(t2, t3, 0xDD));
}

T256 static inline void mulhilo8(__m256i m, __m256i c, __m256i *hi, __m256i *lo) {
    __m256i pe = _mm256_mul_epu32(m, c);
    __m256i po = _mm256_mul_epu32(m, _mm256_srli_epi64(c, 32));
    *lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
}

/* 8 blocks at counters counter .. counter + 7 (no wrap of the low word). */
T256 static void blocks8(uint32_t k0, uint32_t k1, uint64_t counter, uint64_t stream,
                         uint32_t *out) {
    const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)counter),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i c1 = _mm256_set1_epi32((int)(uint32_t)(counter >> 32));
    __m256i c2 = _mm256_set1_epi32((int)(uint32_t)stream);
    __m256i c3 = _mm256_set1_epi32((int)(uint32_t)(stream >> 32));
    for (int r = 0; r < 10; r++) {
        if (r > 0) k0 += PHILOX_W0, k1 += PHILOX_W1;
        __m256i hi0, lo0, hi1, lo1;
        mulhilo8(m0, c0, &hi0, &lo0);
        mulhilo8(m1, c2, &hi1, &lo1);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
        c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
        c1 = lo1;
        c3 = lo0;
    }
    __m256i a = _mm256_unpacklo_epi32(c0, c1), b = _mm256_unpackhi_epi32(c0, c1);
    __m256i c = _mm256_unpacklo_epi32(c2, c3), d = _mm256_unpackhi_epi32(c2, c3);
    __m256i o0 = _mm256_unpacklo_epi64(a, c), o1 = _mm256_unpackhi_epi64(a, c);
    __m256i o2 = _mm256_unpacklo_epi64(b, d), o3 = _mm256_unpackhi_epi64(b, d);
    _mm256_storeu_si256((__m256i *)out, _mm256_permute2x128_si256(o0, o1, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 8), _mm256_permute2x128_si256(o2, o3, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 16), _mm256_permute2x128_si256(o0, o1, 0x31));
    _mm256_storeu_si256((__m256i *)(out + 24), _mm256_permute2x128_si256(o2, o3, 0x31));
}
#endif

void specd_rng_u32x4_run(uint64_t seed, uint64_t stream, uint64_t counter, size_t n,
                         uint32_t *out) {
    size_t i = 0;
#if defined(__x86_64__) || defined(__i386__)
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    specd_simd_level lv = specd_simd_active();
    const size_t w = lv == SPECD_SIMD_AVX512 ? 16 : lv == SPECD_SIMD_AVX2 ? 8 : 0;
    for (; w && i + w <= n; i += w) {
        uint64_t c = counter + i;
        if ((uint32_t)c > UINT32_MAX - (w - 1)) /* the low word wraps in this group */
            run_scalar(seed, stream, c, w, out + 4 * i);
        else if (w == 16)
            blocks16(k0, k1, c, stream, out + 4 * i);
        else
            blocks8(k0, k1, c, stream, out + 4 * i);
    }
#endif
    run_scalar(seed, stream, counter + i, n - i, out + 4 * i);
}
