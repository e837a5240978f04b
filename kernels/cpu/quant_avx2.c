/* quant_avx2.c - AVX2 + FMA + F16C dequantization and matmul kernels, for
 * x86 CPUs without AVX-512.
 *
 * Same structure as quant_avx512.c (read that file's header first): each
 * weight type has an expander that turns a group of 32 weights into four
 * registers of 8 floats, the dequantizers store them (bit-identical to the
 * reference), and the matmul multiplies each expanded group with the
 * activations of up to 4 tokens. Scales are converted to fp32 once per 16
 * rows, decode prefetches weights ahead, and several tokens sweep columns in
 * L1-sized blocks, as there. AVX2 has 16 ymm registers: tiles are 2 rows x
 * 1 token or 1 row x up to 4 tokens (2 accumulators each), which with the 4
 * weight registers and constants fit without spilling. AVX2's vpmovzxbd is
 * a single cycle, so bytes are widened with it directly.
 *
 * Compiled with per-function target attributes (no -march), and only called
 * after matmul.c checked the CPU (common/util/simd.h). */
#include "quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define T256 __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) T256

#define NT_MAX 4

INL float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* 8 bytes at p, zero- or sign-extended to 8 int32 lanes. */
INL __m256i u8x8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
INL __m256i i8x8(const void *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* Groups whose scales are converted to fp32 at once (see quant_avx512.c:
 * converting per segment instead of per block takes the fp16 conversions
 * and broadcasts out of the group loop). A multiple of 8 (K-quants). */
#define SEG 64

/* ---- scale preparation -------------------------------------------------- */

INL void prep_none(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)row, (void)g0, (void)n, (void)sd, (void)sm;
}

INL void prep_blocks(const uint8_t *row, int stride, int64_t g0, int n, float *sd, float *sm) {
    const uint8_t *b = row + stride * g0;
    for (int i = 0; i < n; i++, b += stride) {
        sd[i] = h2f(rd_u16(b));
        if (sm) sm[i] = h2f(rd_u16(b + 2));
    }
}

INL void prep_q8_0(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    prep_blocks(row, 34, g0, n, sd, NULL);
}
INL void prep_q4_0(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    prep_blocks(row, 18, g0, n, sd, NULL);
}
INL void prep_q4_1(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    prep_blocks(row, 20, g0, n, sd, sm);
}
INL void prep_q5_0(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    prep_blocks(row, 22, g0, n, sd, NULL);
}
INL void prep_q5_1(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    prep_blocks(row, 24, g0, n, sd, sm);
}

/* Q4_K and Q5_K: prep_q4_k and prep_q5_k are quant_impl.h's (scalar,
 * shared by every path). */

INL void prep_q6_k(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    for (int s = 0; s < n / 8; s++) {
        const uint8_t *b = row + 210 * (g0 / 8 + s);
        const float d = h2f(rd_u16(b + Q6K_D));
        const int8_t *sc = (const int8_t *)(b + Q6K_SCALES);
        for (int j = 0; j < 16; j++) sd[16 * s + j] = d * (float)sc[j];
    }
}

/* Q2_K, Q3_K and IQ4_XS: prep_q2_k, prep_q3_k and prep_iq4_xs are
 * quant_impl.h's (scalar, shared by every path); SDG 4, 2 and 1 in
 * CPU_WEIGHT_TYPES there. */
/* IQ4_NL: d, as Q4_0's */
INL void prep_iq4_nl(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    prep_blocks(row, 18, g0, n, sd, NULL);
}

#define prep_f32 prep_none
#define prep_f16 prep_none
#define prep_bf16 prep_none

/* ---- expanders: group g (weights 32g..32g+31) into w[0..3] ------------- */
/* i: g's index in the current segment (for sd/sm); `exact` selects the
 * reference's operation order over FMA. */

#define EX_ARGS \
    const uint8_t *row, int64_t g, int64_t i, const float *sd, const float *sm, __m256 w[4], \
        int exact

INL void ex_f32(EX_ARGS) {
    (void)i, (void)sd, (void)sm, (void)exact;
    const float *p = (const float *)(const void *)row + 32 * g;
    for (int k = 0; k < 4; k++) w[k] = _mm256_loadu_ps(p + 8 * k);
}

INL void ex_f16(EX_ARGS) {
    (void)i, (void)sd, (void)sm, (void)exact;
    const uint8_t *p = row + 64 * g;
    for (int k = 0; k < 4; k++)
        w[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * k)));
}

INL void ex_bf16(EX_ARGS) {
    (void)i, (void)sd, (void)sm, (void)exact;
    const uint8_t *p = row + 64 * g;
    for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * k)));
        w[k] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
}

INL void ex_q8_0(EX_ARGS) {
    (void)sm, (void)exact;
    const uint8_t *b = row + 34 * g;
    const __m256 d = _mm256_set1_ps(sd[i]);
    for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(i8x8(b + 2 + 8 * k)));
}

/* Nibbles of 16 bytes as 32 int32 values in element order: low nibbles are
 * elements 0..15, high nibbles 16..31. */
INL void nibbles(const uint8_t *qs, __m256i q[4]) {
    const __m256i mask = _mm256_set1_epi32(0x0F);
    __m256i a = u8x8(qs), b = u8x8(qs + 8);
    q[0] = _mm256_and_si256(a, mask);
    q[1] = _mm256_and_si256(b, mask);
    q[2] = _mm256_srli_epi32(a, 4);
    q[3] = _mm256_srli_epi32(b, 4);
}

INL void ex_q4_0(EX_ARGS) {
    (void)sm, (void)exact;
    const __m256 d = _mm256_set1_ps(sd[i]);
    /* fma(q, d, -8d) == round((q-8)*d), the reference value (-8d is exact). */
    const __m256 off = _mm256_set1_ps(-8.0f * sd[i]);
    __m256i q[4];
    nibbles(row + 18 * g + 2, q);
    for (int k = 0; k < 4; k++) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, off);
}

INL void ex_q4_1(EX_ARGS) {
    const __m256 d = _mm256_set1_ps(sd[i]), m = _mm256_set1_ps(sm[i]);
    __m256i q[4];
    nibbles(row + 20 * g + 4, q);
    for (int k = 0; k < 4; k++) {
        __m256 f = _mm256_cvtepi32_ps(q[k]);
        w[k] = exact ? _mm256_add_ps(_mm256_mul_ps(f, d), m) : _mm256_fmadd_ps(f, d, m);
    }
}

/* A 5-bit block's 32 q values as int32 in element order: the nibbles, with
 * element e's fifth bit (bit e of the 32-bit qh) shifted to bit 4. */
INL void q5_values(const uint8_t *qh, const uint8_t *qs, __m256i q[4]) {
    nibbles(qs, q);
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i hv = _mm256_set1_epi32((int)h), one = _mm256_set1_epi32(1);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int k = 0; k < 4; k++) {
        __m256i bit = _mm256_and_si256(
            _mm256_srlv_epi32(hv, _mm256_add_epi32(lane, _mm256_set1_epi32(8 * k))), one);
        q[k] = _mm256_or_si256(q[k], _mm256_slli_epi32(bit, 4));
    }
}

INL void ex_q5_0(EX_ARGS) {
    (void)sm, (void)exact;
    /* fma(q, d, -16d) == round((q-16)*d), the reference value (ex_q4_0) */
    const __m256 d = _mm256_set1_ps(sd[i]), off = _mm256_set1_ps(-16.0f * sd[i]);
    const uint8_t *b = row + 22 * g;
    __m256i q[4];
    q5_values(b + 2, b + 6, q);
    for (int k = 0; k < 4; k++) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, off);
}

INL void ex_q5_1(EX_ARGS) {
    const __m256 d = _mm256_set1_ps(sd[i]), m = _mm256_set1_ps(sm[i]);
    const uint8_t *b = row + 24 * g;
    __m256i q[4];
    q5_values(b + 4, b + 8, q);
    for (int k = 0; k < 4; k++) {
        __m256 f = _mm256_cvtepi32_ps(q[k]);
        w[k] = exact ? _mm256_add_ps(_mm256_mul_ps(f, d), m) : _mm256_fmadd_ps(f, d, m);
    }
}

INL void ex_q4_k(EX_ARGS) {
    const __m256 ds = _mm256_set1_ps(sd[i]), ms = _mm256_set1_ps(sm[i]);
    const int j = (int)(g & 7);
    const uint8_t *q = row + 144 * (g >> 3) + Q4K_QS + 32 * (j >> 1);
    const __m128i shift = _mm_cvtsi32_si128(4 * (j & 1));
    const __m256i mask = _mm256_set1_epi32(0x0F);
    for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_and_si256(_mm256_srl_epi32(u8x8(q + 8 * k), shift), mask);
        __m256 f = _mm256_cvtepi32_ps(v);
        w[k] = exact ? _mm256_sub_ps(_mm256_mul_ps(ds, f), ms) : _mm256_fmsub_ps(ds, f, ms);
    }
}

/* 16 signed Q6_K quants (q - 32) as bytes; see quant_avx512.c. */
INL __m128i q6k_bytes(const uint8_t *ql, const uint8_t *qh, __m128i sl, __m128i sh) {
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(0x30);
    __m128i l = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)ql), sl), m4);
    __m128i h = _mm_srl_epi16(_mm_loadu_si128((const __m128i *)qh), sh);
    h = _mm_and_si128(_mm_slli_epi16(h, 4), m2);
    return _mm_sub_epi8(_mm_or_si128(l, h), _mm_set1_epi8(32));
}

/* ex_q4_k with each weight's fifth bit, bit j of qh[l] for element l */
INL void ex_q5_k(EX_ARGS) {
    const __m256 ds = _mm256_set1_ps(sd[i]), ms = _mm256_set1_ps(sm[i]);
    const int j = (int)(g & 7);
    const uint8_t *b = row + 176 * (g >> 3);
    const uint8_t *q = b + Q5K_QS + 32 * (j >> 1);
    const __m128i shift = _mm_cvtsi32_si128(4 * (j & 1)), hshift = _mm_cvtsi32_si128(j);
    const __m256i mask = _mm256_set1_epi32(0x0F), one = _mm256_set1_epi32(1);
    for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_and_si256(_mm256_srl_epi32(u8x8(q + 8 * k), shift), mask);
        __m256i h = _mm256_and_si256(_mm256_srl_epi32(u8x8(b + Q5K_QH + 8 * k), hshift), one);
        __m256 f = _mm256_cvtepi32_ps(_mm256_or_si256(v, _mm256_slli_epi32(h, 4)));
        w[k] = exact ? _mm256_sub_ps(_mm256_mul_ps(ds, f), ms) : _mm256_fmsub_ps(ds, f, ms);
    }
}

INL void ex_q6_k(EX_ARGS) {
    (void)sm, (void)exact;
    const uint8_t *b = row + 210 * (g >> 3);
    const int j = (int)(g & 7), h = j >> 2, k = j & 3;
    const uint8_t *ql = b + Q6K_QL + 64 * h + 32 * (k & 1);
    const uint8_t *qh = b + Q6K_QH + 32 * h;
    const __m128i sl = _mm_cvtsi32_si128(4 * (k >> 1)), sh = _mm_cvtsi32_si128(2 * k);
    for (int half = 0; half < 2; half++) {
        /* (d*sc) * q, the reference's order */
        const __m256 s = _mm256_set1_ps(sd[2 * i + half]);
        __m128i q = q6k_bytes(ql + 16 * half, qh + 16 * half, sl, sh);
        __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q, q)));
        w[2 * half] = _mm256_mul_ps(s, lo);
        w[2 * half + 1] = _mm256_mul_ps(s, hi);
    }
}

/* IQ4_NL and IQ4_XS: each nibble's level by vpshufb from the 16 bytes of
 * k_iq4nl, then (d*sc) * level as the reference computes it. */
INL void iq4_expand(const uint8_t *qs, float d, __m256 w[4]) {
    const __m128i lv = _mm_loadu_si128((const __m128i *)k_iq4nl), lo4 = _mm_set1_epi8(0x0F);
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m128i v0 = _mm_shuffle_epi8(lv, _mm_and_si128(raw, lo4));
    const __m128i v1 = _mm_shuffle_epi8(lv, _mm_and_si128(_mm_srli_epi16(raw, 4), lo4));
    const __m256 dv = _mm256_set1_ps(d);
    const __m128i v[4] = {v0, _mm_unpackhi_epi64(v0, v0), v1, _mm_unpackhi_epi64(v1, v1)};
    for (int k = 0; k < 4; k++)
        w[k] = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v[k])));
}
INL void ex_iq4_nl(EX_ARGS) {
    (void)sm, (void)exact;
    iq4_expand(row + 18 * g + 2, sd[i], w);
}
INL void ex_iq4_xs(EX_ARGS) {
    (void)sm, (void)exact;
    const uint8_t *b = row + sizeof(blk_iq4_xs) * (size_t)(g >> 3);
    iq4_expand(b + IQ4XS_QS + 16 * (g & 7), sd[i], w);
}

/* Q2_K and Q3_K (quant_avx512.c's ex_q2_k, ex_q3_k): 8 weights per
 * register, k-th 8 from byte 8k of the group's run; sub-block k / 2. */
INL __m256i q2_bits8(const uint8_t *q, __m128i shift) {
    return _mm256_and_si256(_mm256_srl_epi32(u8x8(q), shift), _mm256_set1_epi32(3));
}

INL void ex_q2_k(EX_ARGS) {
    (void)sm;
    const uint8_t *b = row + sizeof(blk_q2_k) * (size_t)(g >> 3);
    const int j = (int)(g & 7);
    int sh;
    const uint8_t *q = k2_group(b + Q2K_QS, j, &sh);
    const __m128i shift = _mm_cvtsi32_si128(sh);
    for (int k = 0; k < 4; k++) {
        const __m256 f = _mm256_cvtepi32_ps(q2_bits8(q + 8 * k, shift));
        const __m256 d = _mm256_set1_ps(sd[4 * i + (k >> 1)]);
        const __m256 m = _mm256_set1_ps(sd[4 * i + 2 + (k >> 1)]);
        w[k] = exact ? _mm256_sub_ps(_mm256_mul_ps(d, f), m) : _mm256_fmsub_ps(f, d, m);
    }
}

INL void ex_q3_k(EX_ARGS) {
    (void)sm, (void)exact;
    const uint8_t *b = row + sizeof(blk_q3_k) * (size_t)(g >> 3);
    const int j = (int)(g & 7);
    int sh;
    const uint8_t *q = k2_group(b + Q3K_QS, j, &sh);
    const __m128i shift = _mm_cvtsi32_si128(sh);
    const __m256i four = _mm256_set1_epi32(4), bit = _mm256_set1_epi32(1 << j);
    for (int k = 0; k < 4; k++) {
        const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(u8x8(b + Q3K_HMASK + 8 * k), bit), bit);
        /* minus 4 where the third bit is clear */
        const __m256i v = _mm256_sub_epi32(q2_bits8(q + 8 * k, shift), _mm256_andnot_si256(set, four));
        w[k] = _mm256_mul_ps(_mm256_set1_ps(sd[2 * i + (k >> 1)]), _mm256_cvtepi32_ps(v));
    }
}

INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- kernels generated per type (see quant_avx512.c for the layout) ---- */

static void plain_tail(specd_dtype type, const uint8_t *row, int64_t from, const cpu_mm_args *a,
                       int t0, int nt, float *out) {
    const int64_t esz = type == SPECD_F32 ? 4 : 2, cols = a->cols;
    float w[32];
    cpu_dequant_ref_fn(type)(row + from * esz, w, cols - from);
    for (int t = 0; t < nt; t++)
        for (int64_t c = from; c < cols; c++) out[t] += w[c - from] * a->x[(t0 + t) * cols + c];
}

static void plain_tail_deq(specd_dtype type, const uint8_t *src, int64_t from, int64_t n,
                           float *dst) {
    const int64_t esz = type == SPECD_F32 ? 4 : 2;
    cpu_dequant_ref_fn(type)(src + from * esz, dst + from, n - from);
}

/* Rows per tile at one token (2 rows x 2 accumulators; 16 ymm registers
 * leave no room for more) and rows whose scales are prepared together (see
 * quant_avx512.c for the reasoning behind each). */
#define R1 2
#define RS 16

/* Software prefetch at decode: see quant_avx512.c. */
#define PF_BYTES (12 * 1024)

static inline size_t prefetch_distance(size_t rb) {
    size_t rows = PF_BYTES / rb;
    return (rows < 4 ? 4 : rows) * rb;
}

INL void prefetch(const uint8_t *p, size_t ahead) {
    _mm_prefetch((const char *)(uintptr_t)((uintptr_t)p + ahead), _MM_HINT_T0);
}

static inline int64_t col_block(int64_t ng, int nt) {
    (void)nt;
    /* Bitwise batch invariance: a row is always one pass over all its
     * columns, as at one token (per-block partial sums added afterwards
     * would round differently). With 4 tokens the packed activations of a
     * 1536-wide row take 24 KB, still L1-resident. */
    return ng > 0 ? (ng + 7) / 8 * 8 : 8;
}

/* out[r*nt + t] = sum over groups [gb, ge) of row r . x_t (R rows, nt
 * tokens, packed x: group g of token t at x + g*32*nt + 32*t). With psd/psm
 * the caller prepared the scales (indexed from gb); without, they are
 * prepared here SEG groups at a time. R*nt <= 4. Two accumulators per
 * (row, token): even and odd 8-float quarters of each group. */
#define DEF_TILE(TY, SDG, GB)                                                                 \
    INL void tile_##TY(const uint8_t *row0, size_t rb, int R, int64_t gb, int64_t ge,        \
                       const float *x, int nt, const float *psd, const float *psm, size_t pf, \
                       float *out) {                                                          \
        __m256 acc[NT_MAX][2];                                                                \
        for (int k = 0; k < R * nt; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();         \
        float sdb[R1 * SDG * SEG], smb[R1 * SEG];                                             \
        for (int64_t g0 = gb; g0 < ge; g0 += SEG) {                                           \
            const int n = ge - g0 < SEG ? (int)(ge - g0) : SEG;                               \
            const float *sd = psd, *sm = psm;                                                 \
            if (!psd) {                                                                       \
                for (int r = 0; r < R; r++)                                                   \
                    prep_##TY(row0 + r * rb, g0, n, sdb + r * SDG * n, smb + r * n);          \
                sd = sdb, sm = smb;                                                           \
            }                                                                                 \
            for (int i = 0; i < n; i++) {                                                     \
                const float *xg = x + 32 * nt * (g0 + i);                                     \
                for (int r = 0; r < R; r++) {                                                 \
                    __m256 w[4];                                                              \
                    if (pf) prefetch(row0 + r * rb, pf + (size_t)((g0 + i) * GB));            \
                    ex_##TY(row0 + r * rb, g0 + i, i, sd + r * SDG * n, sm + r * n, w, 0);    \
                    for (int t = 0; t < nt; t++) {                                            \
                        const float *xt = xg + 32 * t;                                        \
                        __m256 *c = acc[r * nt + t];                                          \
                        c[0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xt), c[0]);              \
                        c[1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), c[1]);          \
                        c[0] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), c[0]);         \
                        c[1] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), c[1]);         \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        for (int k = 0; k < R * nt; k++) out[k] = hsum8(_mm256_add_ps(acc[k][0], acc[k][1])); \
    }

#define TILE_NT(TY, R, NT) tile_##TY(row, rb, R, gb, ge, xg, NT, sd, sm, pf, out)

/* Rows [r0, r1) for all tokens; the same loop structure as quant_avx512.c
 * (one token: tiles of whole rows with scales prepared RS rows at a time;
 * several tokens: token groups, then RS rows swept by column blocks). */
#define DEF_ROWS(TY, TYPE, SDG, GB)                                                           \
    DEF_TILE(TY, SDG, GB)                                                                     \
    static T256 void rows_##TY(const cpu_mm_args *a, int64_t r0, int64_t r1) {                \
        const int64_t cols = a->cols, ng = cols / 32, done = ng * 32;                         \
        const int64_t ngp = cpu_packed_groups(cols);                                          \
        const size_t rb = a->row_bytes;                                                       \
        float out[NT_MAX];                                                                    \
        float sdp[RS * SDG * SEG], smp[RS * SEG];                                             \
        if (a->n_tok == 1) {                                                                  \
            const size_t pf = prefetch_distance(rb);                                          \
            const float *xg = a->x;                                                           \
            const int64_t gb = 0, ge = ng;                                                    \
            for (int64_t rs = r0; rs < r1; rs += RS) {                                        \
                const int64_t re = r1 - rs < RS ? r1 : rs + RS;                               \
                if (ng <= SEG) prep_##TY(a->w + rs * rb, 0, (int)((re - rs) * ng), sdp, smp); \
                for (int64_t r = rs; r < re; r += R1) {                                       \
                    const uint8_t *row = a->w + r * rb;                                       \
                    const float *sd = ng <= SEG ? sdp + (r - rs) * SDG * ng : NULL;           \
                    const float *sm = ng <= SEG ? smp + (r - rs) * ng : NULL;                 \
                    const int nr = re - r < R1 ? (int)(re - r) : R1;                          \
                    if (nr == 2) TILE_NT(TY, 2, 1);                                           \
                    else TILE_NT(TY, 1, 1);                                                   \
                    for (int k = 0; k < nr; k++) {                                            \
                        if (done < cols) plain_tail(TYPE, row + k * rb, done, a, 0, 1, out + k); \
                        a->y[r + k] = out[k];                                                 \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            return;                                                                           \
        }                                                                                     \
        for (int t0 = 0; t0 < a->n_tok; t0 += NT_MAX) {                                       \
            const int nt = a->n_tok - t0 < NT_MAX ? a->n_tok - t0 : NT_MAX;                   \
            const float *xg = a->xp + (int64_t)t0 * ngp * 32;                                 \
            const int64_t kb = col_block(ng, nt);                                             \
            const size_t pf = prefetch_distance(rb);                                          \
            const int whole = kb >= ng && ng <= SEG;                                          \
            for (int64_t rs = r0; rs < r1; rs += RS) {                                        \
                const int64_t re = r1 - rs < RS ? r1 : rs + RS;                               \
                float part[RS * NT_MAX] = {0};                                                \
                if (whole) prep_##TY(a->w + rs * rb, 0, (int)((re - rs) * ng), sdp, smp);    \
                for (int64_t gb = 0; gb < ng; gb += kb) {                                     \
                    const int64_t ge = ng - gb < kb ? ng : gb + kb;                           \
                    for (int64_t r = rs; r < re; r++) {                                       \
                        const uint8_t *row = a->w + r * rb;                                   \
                        const float *sd = whole ? sdp + (r - rs) * SDG * ng : NULL;           \
                        const float *sm = whole ? smp + (r - rs) * ng : NULL;                 \
                        switch (nt) {                                                         \
                        case 1: TILE_NT(TY, 1, 1); break;                                     \
                        case 2: TILE_NT(TY, 1, 2); break;                                     \
                        case 3: TILE_NT(TY, 1, 3); break;                                     \
                        default: TILE_NT(TY, 1, 4); break;                                    \
                        }                                                                     \
                        float *p = part + (r - rs) * nt;                                      \
                        for (int t = 0; t < nt; t++) p[t] += out[t];                          \
                    }                                                                         \
                }                                                                             \
                for (int64_t r = rs; r < re; r++) {                                           \
                    float *p = part + (r - rs) * nt;                                          \
                    if (done < cols) plain_tail(TYPE, a->w + r * rb, done, a, t0, nt, p);     \
                    for (int t = 0; t < nt; t++) a->y[(int64_t)(t0 + t) * a->ldy + r] = p[t]; \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static T256 void deq_##TY(const void *src, float *dst, int64_t n) {                       \
        const uint8_t *s = src;                                                               \
        const int64_t ng = n / 32;                                                            \
        for (int64_t g0 = 0; g0 < ng; g0 += SEG) {                                            \
            const int cnt = ng - g0 < SEG ? (int)(ng - g0) : SEG;                             \
            float sd[SDG * SEG], sm[SEG];                                                     \
            prep_##TY(s, g0, cnt, sd, sm);                                                    \
            for (int i = 0; i < cnt; i++) {                                                   \
                __m256 w[4];                                                                  \
                ex_##TY(s, g0 + i, i, sd, sm, w, 1);                                          \
                for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + 32 * (g0 + i) + 8 * k, w[k]); \
            }                                                                                 \
        }                                                                                     \
        if (ng * 32 < n) plain_tail_deq(TYPE, s, ng * 32, n, dst);                            \
    }

CPU_WEIGHT_TYPES(DEF_ROWS)

int cpu_kernels_avx2(cpu_kernel_set *ks) {
    memset(ks, 0, sizeof *ks);
    ks->name = "avx2";
    ks->nt_max = NT_MAX;
    CPU_WEIGHT_TYPES(CPU_SET_TYPE_KERNELS)
    return 1;
}

#else /* not x86 */

int cpu_kernels_avx2(cpu_kernel_set *ks) {
    (void)ks;
    return 0;
}

#endif
