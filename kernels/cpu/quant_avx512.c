/* quant_avx512.c - AVX-512 dequantization and matmul kernels.
 *
 * Everything is built around one step: "expand a group of 32 weights into two
 * registers of 16 floats" (ex_* below, one per weight type). Then
 *
 *   - dequant stores the two registers (the expanders reproduce the reference
 *     arithmetic exactly, so results are bit-identical to quant_ref.c);
 *   - the matmul multiplies them with the activations of up to 8 tokens, so a
 *     weight group read from memory and decoded once serves 8 tokens
 *     (decode is n_tok = 1; verifying a tree of 8 drafted tokens costs one
 *     decode of the weights plus 16 extra FMAs per group instead of 8 decodes).
 *
 * Where the time goes. With 512-bit instructions only two execution ports
 * (0 and 5) do vector work, and only port 5 shuffles, so at n_tok = 1 the
 * kernel is bound by the number of vector instructions per group, not by
 * the FMAs. What keeps that number low:
 *
 *   - Scales are converted from fp16 once per 16 rows (a gather of the 16-bit
 *     fields of 16 blocks, one conversion), not per block; the group loop
 *     reads them as fp32 with broadcast loads, which the load ports execute
 *     without touching ports 0/5.
 *   - Bytes are widened to 32-bit lanes with a 128-bit broadcast load (load
 *     port only) and one in-lane vpshufb, instead of vpmovzxbd/vpmovsxbd,
 *     which take two port-5 cycles per 16 bytes on these cores.
 *   - 4-bit types do not convert nibbles to float at all: the 16 possible
 *     weights of a block (d*q + m for q = 0..15) are computed with one FMA
 *     into a register, and vpermps looks each nibble up in it (vpermps reads
 *     only the low 4 bits of each index, so low nibbles need no masking).
 *   - Tiles of 4 rows (one token) or 2 rows x 8 tokens share each load of x
 *     and hide FMA latency; their sums are reduced together (hsum16).
 *   - At one token, software prefetches keep enough weight reads in flight
 *     (see PF_BYTES); with several tokens, columns are processed in blocks
 *     whose packed activations stay in L1.
 *
 * The weights stay in their file format; nothing is repacked or copied. The
 * matmul may use an FMA where the reference does a multiply then an add
 * (Q4_1, Q4_K lookup tables); that moves each weight by at most half an ulp,
 * well inside the 1e-5 relative tolerance the tests use.
 *
 * Compiled with per-function target attributes (no -march), and only called
 * after matmul.c checked the CPU (common/util/simd.h). */
#include "quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) T512

/* Tokens handled together per weight group (the packed-x group size): with
 * 2 rows per tile and two accumulators per output (see DEF_TILE) that is 16
 * accumulators of the 32 zmm registers, leaving room for the expanded
 * weights, lookup tables and constants. */
#define NT_MAX 4

/* Groups (of 32 weights) whose scales are converted at once: 2048 columns,
 * a multiple of the 8 groups of a K-quant super-block. The fp32 scales
 * (at most 2*SEG floats) live on the stack, in L1. */
#define SEG 64

/* ---- scale preparation: fp16 fields -> fp32 arrays, per segment --------- */

/* Stores 16 floats, or the first n < 16 of them. Full stores are preferred:
 * a later load forwards from a full store at once but must wait for a
 * masked one to reach the cache. */
INL void store_n(float *p, __m512 v, int n) {
    if (n >= 16) _mm512_storeu_ps(p, v);
    else _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v);
}

/* For blocks b < n (n <= 16) at p + stride*b, the fp16 at offset 0 times
 * `scale` goes to lo[b] and, when hi != NULL, the fp16 at offset 2 to
 * hi[b]. One masked gather reads both halves of the 32-bit word at each
 * block start (never past the block: every block is at least 18 bytes). */
INL void gather_h2(const uint8_t *p, int stride, int n, float *lo, float *hi, float scale) {
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(stride));
    const __mmask16 k = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, idx, p, 1);
    __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
    store_n(lo, scale == 1.0f ? d : _mm512_mul_ps(d, _mm512_set1_ps(scale)), n);
    if (hi) store_n(hi, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))), n);
}

INL void prep_blocks(const uint8_t *row, int stride, int64_t g0, int n, float *sd, float *sm,
                     float scale) {
    for (int i = 0; i < n; i += 16)
        gather_h2(row + stride * (g0 + i), stride, n - i, sd + i, sm ? sm + i : NULL, scale);
}

INL void prep_none(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)row, (void)g0, (void)n, (void)sd, (void)sm;
}
INL void prep_q8_0(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    /* d * 2^-24: ex_q8_0 produces q * 2^24; see there. */
    prep_blocks(row, 34, g0, n, sd, NULL, 0x1p-24f);
}
INL void prep_q4_0(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    prep_blocks(row, 18, g0, n, sd, NULL, 1.0f);
}
INL void prep_q4_1(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    prep_blocks(row, 20, g0, n, sd, sm, 1.0f);
}
INL void prep_q5_0(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    prep_blocks(row, 22, g0, n, sd, NULL, 1.0f);
}
INL void prep_q5_1(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    prep_blocks(row, 24, g0, n, sd, sm, 1.0f);
}

/* Q4_K and Q5_K: prep_q4_k and prep_q5_k are quant_impl.h's (scalar,
 * shared by every path). */

/* Q6_K: sd[2i + h] = d*scale of the h-th 16-weight half of group i. The 16
 * scales of a super-block are in exactly that order. */
INL void prep_q6_k(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    for (int s = 0; s < n / 8; s++) {
        const uint8_t *b = row + 210 * (g0 / 8 + s);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(rd_u16(b + Q6K_D)));
        __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + Q6K_SCALES)));
        _mm512_storeu_ps(sd + 16 * s, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
    }
}

/* Q2_K, Q3_K and IQ4_XS: prep_q2_k, prep_q3_k and prep_iq4_xs are
 * quant_impl.h's (scalar, shared by every path); SDG 4, 2 and 1 in
 * CPU_WEIGHT_TYPES there. */
/* IQ4_NL: d, as Q4_0's */
INL void prep_iq4_nl(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    prep_blocks(row, 18, g0, n, sd, NULL, 1.0f);
}

/* ---- expanders: group g (weights 32g..32g+31) of a row ----------------- */
/* i is g's index within the current segment (for sd/sm). `exact` (constant
 * after inlining) selects the reference's operation order over FMA. */

#define EX_ARGS                                                                              \
    const uint8_t *row, int64_t g, int64_t i, const float *sd, const float *sm, __m512 *w0, \
        __m512 *w1, int exact

INL __m512 iota16(void) {
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

INL void ex_f32(EX_ARGS) {
    (void)i, (void)sd, (void)sm, (void)exact;
    const float *p = (const float *)(const void *)row + 32 * g;
    *w0 = _mm512_loadu_ps(p);
    *w1 = _mm512_loadu_ps(p + 16);
}

INL void ex_f16(EX_ARGS) {
    (void)i, (void)sd, (void)sm, (void)exact;
    const uint8_t *p = row + 64 * g;
    *w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    *w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
}

INL void ex_bf16(EX_ARGS) {
    (void)i, (void)sd, (void)sm, (void)exact;
    /* bf16 is the top half of an fp32: widen and shift left 16. */
    const uint8_t *p = row + 64 * g;
    __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 32)));
    *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
    *w1 = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
}

/* 16 bytes at p, broadcast to the four 128-bit lanes (a pure load) and
 * shuffled so that dword j of lane k holds byte 4k+j: in its top byte when
 * `top`, else in its low byte. vpshufb is one cycle on port 5, where
 * vpmovzxbd/vpmovsxbd to 512 bits take two. */
INL __m512i bytes_to_dwords(const uint8_t *p, int top) {
    const __m512i pat_top = _mm512_set_epi32(
        0x0F808080, 0x0E808080, 0x0D808080, 0x0C808080, 0x0B808080, 0x0A808080, 0x09808080,
        0x08808080, 0x07808080, 0x06808080, 0x05808080, 0x04808080, 0x03808080, 0x02808080,
        0x01808080, 0x00808080);
    const __m512i pat_low = _mm512_set_epi32(
        (int)0x8080800F, (int)0x8080800E, (int)0x8080800D, (int)0x8080800C, (int)0x8080800B,
        (int)0x8080800A, (int)0x80808009, (int)0x80808008, (int)0x80808007, (int)0x80808006,
        (int)0x80808005, (int)0x80808004, (int)0x80808003, (int)0x80808002, (int)0x80808001,
        (int)0x80808000);
    __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
    return _mm512_shuffle_epi8(b, top ? pat_top : pat_low);
}

INL void ex_q8_0(EX_ARGS) {
    (void)sm, (void)exact;
    /* The int8 lands in the top byte of each dword, so the dword is q * 2^24
     * (sign included) and converts to float exactly; sd holds d * 2^-24, and
     * (d * 2^-24) * (q * 2^24) rounds exactly like the reference's d * q
     * (power-of-two factors, far from under/overflow). */
    const uint8_t *b = row + 34 * g;
    const __m512 d = _mm512_set1_ps(sd[i]);
    *w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(bytes_to_dwords(b + 2, 1)));
    *w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(bytes_to_dwords(b + 18, 1)));
}

/* Looks the 32 nibbles of 16 bytes up in a 16-entry table (element order:
 * low nibbles are elements 0..15, high nibbles 16..31). */
INL void lut_nibbles(const uint8_t *qs, __m512 tab, __m512 *w0, __m512 *w1) {
    __m512i raw = bytes_to_dwords(qs, 0);
    *w0 = _mm512_permutexvar_ps(raw, tab);
    *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), tab);
}

INL void ex_q4_0(EX_ARGS) {
    (void)sm, (void)exact;
    /* (q-8)*d for q = 0..15, as the reference computes it */
    const __m512 iota_m8 = _mm512_sub_ps(iota16(), _mm512_set1_ps(8.0f));
    lut_nibbles(row + 18 * g + 2, _mm512_mul_ps(iota_m8, _mm512_set1_ps(sd[i])), w0, w1);
}

INL void ex_q4_1(EX_ARGS) {
    const __m512 d = _mm512_set1_ps(sd[i]), m = _mm512_set1_ps(sm[i]);
    __m512 tab = exact ? _mm512_add_ps(_mm512_mul_ps(iota16(), d), m)
                       : _mm512_fmadd_ps(iota16(), d, m);
    lut_nibbles(row + 20 * g + 4, tab, w0, w1);
}

/* 5-bit quants: the 32 possible weights in two tables (q = 0..15 and
 * 16..31), each element's q as its nibble with the fifth bit (bit e of qh,
 * set through a mask register) at bit 4, and vpermt2ps looks q up in both
 * tables at once (it reads the low 5 bits of each index). */
INL void lut5(const uint8_t *qh, const uint8_t *qs, __m512 tab0, __m512 tab1, __m512 *w0,
              __m512 *w1) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m512i lo4 = _mm512_set1_epi32(0x0F), b4 = _mm512_set1_epi32(0x10);
    __m512i raw = bytes_to_dwords(qs, 0);
    __m512i i0 = _mm512_and_si512(raw, lo4), i1 = _mm512_and_si512(_mm512_srli_epi32(raw, 4), lo4);
    i0 = _mm512_mask_or_epi32(i0, (__mmask16)(h & 0xFFFF), i0, b4);
    i1 = _mm512_mask_or_epi32(i1, (__mmask16)(h >> 16), i1, b4);
    *w0 = _mm512_permutex2var_ps(tab0, i0, tab1);
    *w1 = _mm512_permutex2var_ps(tab0, i1, tab1);
}

INL void ex_q5_0(EX_ARGS) {
    (void)sm, (void)exact;
    /* (q-16)*d for q = 0..31, as the reference computes it */
    const __m512 d = _mm512_set1_ps(sd[i]);
    const __m512 t0 = _mm512_mul_ps(_mm512_sub_ps(iota16(), _mm512_set1_ps(16.0f)), d);
    const __m512 t1 = _mm512_mul_ps(iota16(), d);
    lut5(row + 22 * g + 2, row + 22 * g + 6, t0, t1, w0, w1);
}

INL void ex_q5_1(EX_ARGS) {
    const __m512 d = _mm512_set1_ps(sd[i]), m = _mm512_set1_ps(sm[i]);
    const __m512 q0 = iota16(), q1 = _mm512_add_ps(iota16(), _mm512_set1_ps(16.0f));
    __m512 t0 = exact ? _mm512_add_ps(_mm512_mul_ps(q0, d), m) : _mm512_fmadd_ps(q0, d, m);
    __m512 t1 = exact ? _mm512_add_ps(_mm512_mul_ps(q1, d), m) : _mm512_fmadd_ps(q1, d, m);
    lut5(row + 24 * g + 4, row + 24 * g + 8, t0, t1, w0, w1);
}

INL void ex_q4_k(EX_ARGS) {
    const __m512 ds = _mm512_set1_ps(sd[i]), ms = _mm512_set1_ps(sm[i]);
    __m512 tab = exact ? _mm512_sub_ps(_mm512_mul_ps(ds, iota16()), ms)
                       : _mm512_fmsub_ps(iota16(), ds, ms);
    /* Sub-blocks 2k and 2k+1 share bytes 32k..32k+31 (low/high nibbles);
     * vpermps ignores index bits above 3, so only odd ones need a shift. */
    const int j = (int)(g & 7);
    const uint8_t *q = row + 144 * (g >> 3) + Q4K_QS + 32 * (j >> 1);
    const __m128i shift = _mm_cvtsi32_si128(4 * (j & 1));
    __m512i r0 = bytes_to_dwords(q, 0), r1 = bytes_to_dwords(q + 16, 0);
    *w0 = _mm512_permutexvar_ps(_mm512_srl_epi32(r0, shift), tab);
    *w1 = _mm512_permutexvar_ps(_mm512_srl_epi32(r1, shift), tab);
}

/* The 32 signed quants (q - 32) of Q6_K group j (0..7 within its
 * super-block) as bytes: 4 bits from ql (low or high nibbles of one of two
 * 32-byte runs), 2 bits from qh (one bit pair of a 32-byte run). 16-bit
 * shifts move bits across byte boundaries, but the masks keep only the bits
 * that belong to each byte. */
INL __m256i q6k_bytes(const uint8_t *b, int j) {
    const int h = j >> 2, k = j & 3;
    const uint8_t *ql = b + Q6K_QL + 64 * h + 32 * (k & 1);
    const uint8_t *qh = b + Q6K_QH + 32 * h;
    const __m128i sl = _mm_cvtsi32_si128(4 * (k >> 1)), sh = _mm_cvtsi32_si128(2 * k);
    __m256i l = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)ql), sl);
    __m256i hb = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)qh), sh);
    l = _mm256_and_si256(l, _mm256_set1_epi8(0x0F));
    hb = _mm256_and_si256(_mm256_slli_epi16(hb, 4), _mm256_set1_epi8(0x30));
    return _mm256_sub_epi8(_mm256_or_si256(l, hb), _mm256_set1_epi8(32));
}

/* ex_q4_k with each weight's fifth bit (bit j of qh[l] for element l,
 * tested into a mask register) at bit 4 of its index, looked up in two
 * tables at once as lut5 does. */
INL void ex_q5_k(EX_ARGS) {
    const __m512 ds = _mm512_set1_ps(sd[i]), ms = _mm512_set1_ps(sm[i]);
    const __m512 q0 = iota16(), q1 = _mm512_add_ps(iota16(), _mm512_set1_ps(16.0f));
    __m512 t0 = exact ? _mm512_sub_ps(_mm512_mul_ps(ds, q0), ms) : _mm512_fmsub_ps(q0, ds, ms);
    __m512 t1 = exact ? _mm512_sub_ps(_mm512_mul_ps(ds, q1), ms) : _mm512_fmsub_ps(q1, ds, ms);
    const int j = (int)(g & 7);
    const uint8_t *b = row + 176 * (g >> 3);
    const uint8_t *q = b + Q5K_QS + 32 * (j >> 1);
    const __m128i shift = _mm_cvtsi32_si128(4 * (j & 1));
    const __m512i lo4 = _mm512_set1_epi32(0x0F), b4 = _mm512_set1_epi32(0x10);
    const __m512i bit = _mm512_set1_epi32(1 << j);
    __m512i i0 = _mm512_and_si512(_mm512_srl_epi32(bytes_to_dwords(q, 0), shift), lo4);
    __m512i i1 = _mm512_and_si512(_mm512_srl_epi32(bytes_to_dwords(q + 16, 0), shift), lo4);
    i0 = _mm512_mask_or_epi32(i0, _mm512_test_epi32_mask(bytes_to_dwords(b + Q5K_QH, 0), bit),
                              i0, b4);
    i1 = _mm512_mask_or_epi32(
        i1, _mm512_test_epi32_mask(bytes_to_dwords(b + Q5K_QH + 16, 0), bit), i1, b4);
    *w0 = _mm512_permutex2var_ps(t0, i0, t1);
    *w1 = _mm512_permutex2var_ps(t0, i1, t1);
}

INL void ex_q6_k(EX_ARGS) {
    (void)sm, (void)exact;
    __m256i q = q6k_bytes(row + 210 * (g >> 3), (int)(g & 7));
    __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
    __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
    /* (d*sc) * q, the reference's order */
    *w0 = _mm512_mul_ps(_mm512_set1_ps(sd[2 * i]), f0);
    *w1 = _mm512_mul_ps(_mm512_set1_ps(sd[2 * i + 1]), f1);
}

/* IQ4_NL and IQ4_XS: the 16 levels times the block's scale, (d*sc) * level
 * as the reference computes it, looked up by Q4_0's nibbles. */
INL __m512 iq4_table(float d) {
    const __m512 lv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)k_iq4nl)));
    return _mm512_mul_ps(_mm512_set1_ps(d), lv);
}
INL void ex_iq4_nl(EX_ARGS) {
    (void)sm, (void)exact;
    lut_nibbles(row + 18 * g + 2, iq4_table(sd[i]), w0, w1);
}
INL void ex_iq4_xs(EX_ARGS) {
    (void)sm, (void)exact;
    const uint8_t *b = row + sizeof(blk_iq4_xs) * (size_t)(g >> 3);
    lut_nibbles(b + IQ4XS_QS + 16 * (g & 7), iq4_table(sd[i]), w0, w1);
}

/* Q2_K and Q3_K: group g's 2-bit quants are bits 2(g % 4) of the 32 bytes
 * at qs + 32 (g / 4), byte l for element l; Q3_K's third bit is bit g % 8
 * of hmask[l] (clear: minus 4). (d*sc) * q [- dmin*mn], the reference's
 * order. */
INL __m512i q2_bits(const uint8_t *q, __m128i shift) {
    return _mm512_and_si512(_mm512_srl_epi32(bytes_to_dwords(q, 0), shift), _mm512_set1_epi32(3));
}

INL void ex_q2_k(EX_ARGS) {
    (void)sm;
    const uint8_t *b = row + sizeof(blk_q2_k) * (size_t)(g >> 3);
    const int j = (int)(g & 7);
    int sh;
    const uint8_t *q = k2_group(b + Q2K_QS, j, &sh);
    const __m128i shift = _mm_cvtsi32_si128(sh);
    const __m512 f0 = _mm512_cvtepi32_ps(q2_bits(q, shift));
    const __m512 f1 = _mm512_cvtepi32_ps(q2_bits(q + 16, shift));
    const __m512 d0 = _mm512_set1_ps(sd[4 * i]), d1 = _mm512_set1_ps(sd[4 * i + 1]);
    const __m512 m0 = _mm512_set1_ps(sd[4 * i + 2]), m1 = _mm512_set1_ps(sd[4 * i + 3]);
    *w0 = exact ? _mm512_sub_ps(_mm512_mul_ps(d0, f0), m0) : _mm512_fmsub_ps(f0, d0, m0);
    *w1 = exact ? _mm512_sub_ps(_mm512_mul_ps(d1, f1), m1) : _mm512_fmsub_ps(f1, d1, m1);
}

INL void ex_q3_k(EX_ARGS) {
    (void)sm, (void)exact;
    const uint8_t *b = row + sizeof(blk_q3_k) * (size_t)(g >> 3);
    const int j = (int)(g & 7);
    int sh;
    const uint8_t *q = k2_group(b + Q3K_QS, j, &sh);
    const __m128i shift = _mm_cvtsi32_si128(sh);
    const __m512i four = _mm512_set1_epi32(4), bit = _mm512_set1_epi32(1 << j);
    __m512 *w[2] = {w0, w1};
    for (int h = 0; h < 2; h++) {
        __m512i v = _mm512_sub_epi32(q2_bits(q + 16 * h, shift), four);
        const __mmask16 set =
            _mm512_test_epi32_mask(bytes_to_dwords(b + Q3K_HMASK + 16 * h, 0), bit);
        v = _mm512_mask_add_epi32(v, set, v, four);
        *w[h] = _mm512_mul_ps(_mm512_set1_ps(sd[2 * i + h]), _mm512_cvtepi32_ps(v));
    }
}

/* ---- kernels generated per type ----------------------------------------- */

/* The last cols % 32 elements of a plain-typed (F32/F16/BF16) row, for
 * tokens t0..t0+nt-1. */
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

/* Horizontal sums of up to 16 vectors at once: lane i of the result is the
 * sum of the 16 lanes of v[i] (v[i] = 0 for i >= n). A tree of 15 merges,
 * each two shuffles and an add, costs ~3 instructions per sum instead of
 * ~8 for one reduction per vector; with short rows (576 columns are only
 * 18 groups) the reductions are a visible part of a row's work.
 *
 * Notation: a vector is 4 chunks of 4 lanes. Level 1 folds each vector to
 * 2 chunks and pairs vectors; level 2 to one chunk each, 4 vectors per
 * result; levels 3 and 4 fold lanes inside chunks. The result lane 4k+j then
 * holds the sum of input 4j+k, so inputs are fed in that transposed order. */
INL __m512 hsum16(const __m512 *v, int n) {
    __m512 in[16], l1[8], l2[4], l3[2];
    for (int s = 0; s < 16; s++) {
        const int src = 4 * (s & 3) + (s >> 2); /* transpose 4x4 */
        in[s] = src < n ? v[src] : _mm512_setzero_ps();
    }
    for (int i = 0; i < 8; i++) {
        __m512 a = in[2 * i], b = in[2 * i + 1];
        l1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    for (int i = 0; i < 4; i++) {
        __m512 a = l1[2 * i], b = l1[2 * i + 1];
        l2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    for (int i = 0; i < 2; i++) {
        __m512 a = l2[2 * i], b = l2[2 * i + 1];
        l3[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    return _mm512_add_ps(_mm512_shuffle_ps(l3[0], l3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(l3[0], l3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Rows per tile: with one token, 4 rows share each load of x and their 8
 * accumulators (2 per row: the two halves of a group, two independent FMA
 * chains) fill the 4-cycle FMA latency; with more tokens, 2 rows x up to 8
 * tokens = 16 accumulators, each x load feeding two FMAs. */
#define R1 4
#define RN 2

/* Decode (one token, or a few) streams the weights once at a low demand
 * rate (the expansion work sits between loads), and the hardware
 * prefetchers alone do not keep enough reads in flight: measured on a Xeon
 * with a model-sized working set, software prefetches PF_BYTES ahead made
 * the whole model's GEMVs ~40% faster at one token and up to ~1.5x at two.
 * Each row is prefetched at the position it will have PF_BYTES / row_bytes
 * rows later, one prefetch per group (repeats within a cache line are cheap:
 * they hit the line already requested). */
#define PF_BYTES (12 * 1024)

static inline size_t prefetch_distance(size_t rb) {
    size_t rows = PF_BYTES / rb;
    return (rows < 4 ? 4 : rows) * rb;
}

/* Prefetch addresses may lie past the matrix (prefetches never fault), so
 * they are formed as integers rather than as out-of-bounds pointers. */
INL void prefetch(const uint8_t *p, size_t ahead) {
    _mm_prefetch((const char *)(uintptr_t)((uintptr_t)p + ahead), _MM_HINT_T0);
}

/* Rows whose scales are prepared together (see rows_*): 16 rows of up to
 * SEG groups need 16*SEG*2 + 16*SEG floats = 12 KB of stack. */
#define RS 16


static inline int64_t col_block(int64_t ng, int nt) {
    (void)nt;
    /* Bitwise batch invariance: a row is always one pass over all its
     * columns, as at one token (per-block partial sums added afterwards
     * would round differently). With 4 tokens the packed activations of a
     * 1536-wide row take 24 KB, still L1-resident. */
    return ng > 0 ? (ng + 7) / 8 * 8 : 8;
}

/* out[r*nt + t] = sum over groups g in [gb, ge) of row r . x_t, for R rows
 * (row r at row0 + r*rb) and nt tokens; the 32 activations of group g for
 * token t are at x + g*32*nt + 32*t (the packed layout; with nt = 1 that is
 * plain x). With psd/psm the caller has prepared the scales (row r's at
 * psd + r*SDG*(ge-gb), psm + r*(ge-gb), indexed from gb); without, they are
 * prepared here, SEG groups at a time. R and nt are constants at every call
 * site, so all loops over them unroll and the accumulators live in
 * registers. `out` receives 16 floats. */
#define DEF_TILE(TY, SDG, GB)                                                                  \
    INL void tile_##TY(const uint8_t *row0, size_t rb, int R, int64_t gb, int64_t ge,         \
                       const float *x, int nt, const float *psd, const float *psm, size_t pf,  \
                       float *out) {                                                           \
        /* Two accumulators per output, the group's halves (two FMA chains),  \
         * summed at the end: the same operations for an output whatever nt   \
         * and R are, so a row's result never depends on its batch. */         \
        __m512 acc[16];                                                                        \
        const int na = 2 * R * nt;                                                             \
        for (int k = 0; k < na; k++) acc[k] = _mm512_setzero_ps();                             \
        float sdb[R1 * SDG * SEG], smb[R1 * SEG];                                              \
        for (int64_t g0 = gb; g0 < ge; g0 += SEG) {                                            \
            const int n = ge - g0 < SEG ? (int)(ge - g0) : SEG;                                \
            const float *sd = psd, *sm = psm;                                                  \
            if (!psd) {                                                                        \
                for (int r = 0; r < R; r++)                                                    \
                    prep_##TY(row0 + r * rb, g0, n, sdb + r * SDG * n, smb + r * n);           \
                sd = sdb, sm = smb;                                                            \
            }                                                                                  \
            for (int i = 0; i < n; i++) {                                                      \
                const float *xg = x + 32 * nt * (g0 + i);                                      \
                for (int r = 0; r < R; r++) {                                                  \
                    __m512 w0, w1;                                                             \
                    if (pf) prefetch(row0 + r * rb, pf + (size_t)((g0 + i) * GB));             \
                    ex_##TY(row0 + r * rb, g0 + i, i, sd + r * SDG * n, sm + r * n, &w0, &w1,  \
                            0);                                                                \
                    for (int t = 0; t < nt; t++) {                                             \
                        __m512 *a = &acc[2 * (r * nt + t)];                                    \
                        a[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xg + 32 * t), a[0]);        \
                        a[1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xg + 32 * t + 16), a[1]);   \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (int k = 0; k < R * nt; k++) acc[k] = _mm512_add_ps(acc[2 * k], acc[2 * k + 1]);   \
        /* A full-width store: narrower reloads of it forward from the store   \
         * buffer (they would wait for a masked store to retire). */                          \
        _mm512_storeu_ps(out, hsum16(acc, R * nt));                                            \
    }

#define TILE_NT(TY, R, NT) tile_##TY(row, rb, R, gb, ge, xg, NT, sd, sm, pf, out)
#define TILE_SWITCH(TY, R)                                                                     \
    switch (nt) {                                                                              \
    case 1: TILE_NT(TY, R, 1); break; /* the last of 5, 9, ... tokens */                       \
    case 2: TILE_NT(TY, R, 2); break;                                                          \
    case 3: TILE_NT(TY, R, 3); break;                                                          \
    default: TILE_NT(TY, R, 4); break;                                                         \
    }

/* Rows [r0, r1) for all tokens.
 *
 * One token (decode): tiles of 4 whole rows. Scales are prepared for RS rows
 * at a time (one run of blocks, rows being contiguous), which hides the
 * gathers' latency behind earlier tiles' work instead of stalling the start
 * of every tile.
 *
 * Several tokens: token groups of up to NT_MAX in the outer loop; inside,
 * RS rows at a time are swept column block by column block (KB groups), so
 * the block's packed activations stay in L1 while the RS rows' weights
 * (L1/L2) pass by; partial sums collect in `part`.
 *
 * Row lengths that are not a multiple of 32 (plain types only) finish in
 * plain_tail. */
#define DEF_ROWS(TY, TYPE, SDG, GB)                                                            \
    DEF_TILE(TY, SDG, GB)                                                                      \
    static T512 void rows_##TY(const cpu_mm_args *a, int64_t r0, int64_t r1) {                 \
        const int64_t cols = a->cols, ng = cols / 32, done = ng * 32;                          \
        const int64_t ngp = cpu_packed_groups(cols);                                           \
        const size_t rb = a->row_bytes;                                                        \
        float out[16];                                                                         \
        if (a->n_tok == 1) {                                                                   \
            const size_t pf = prefetch_distance(rb);                                           \
            float sdp[RS * SDG * SEG], smp[RS * SEG];                                          \
            const float *xg = a->x;                                                            \
            const int64_t gb = 0, ge = ng;                                                     \
            for (int64_t rs = r0; rs < r1; rs += RS) {                                         \
                const int64_t re = r1 - rs < RS ? r1 : rs + RS;                                \
                if (ng <= SEG) prep_##TY(a->w + rs * rb, 0, (int)((re - rs) * ng), sdp, smp);  \
                for (int64_t r = rs; r < re; r += R1) {                                        \
                    const uint8_t *row = a->w + r * rb;                                        \
                    const float *sd = ng <= SEG ? sdp + (r - rs) * SDG * ng : NULL;            \
                    const float *sm = ng <= SEG ? smp + (r - rs) * ng : NULL;                  \
                    const int nr = re - r < R1 ? (int)(re - r) : R1;                           \
                    switch (nr) {                                                              \
                    case 4: TILE_NT(TY, 4, 1); break;                                          \
                    case 3: TILE_NT(TY, 3, 1); break;                                          \
                    case 2: TILE_NT(TY, 2, 1); break;                                          \
                    default: TILE_NT(TY, 1, 1); break;                                         \
                    }                                                                          \
                    for (int k = 0; k < nr; k++) {                                             \
                        if (done < cols) plain_tail(TYPE, row + k * rb, done, a, 0, 1, out + k); \
                        a->y[r + k] = out[k];                                                  \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        float sdp[RS * SDG * SEG], smp[RS * SEG];                                              \
        for (int t0 = 0; t0 < a->n_tok; t0 += NT_MAX) {                                        \
            const int nt = a->n_tok - t0 < NT_MAX ? a->n_tok - t0 : NT_MAX;                    \
            const float *xg = a->xp + (int64_t)t0 * ngp * 32;                                  \
            const int64_t kb = col_block(ng, nt);                                              \
            const size_t pf = prefetch_distance(rb);                                           \
            /* One block per row: prepare RS rows' scales at once, as above. */                \
            const int whole = kb >= ng && ng <= SEG;                                           \
            for (int64_t rs = r0; rs < r1; rs += RS) {                                         \
                const int64_t re = r1 - rs < RS ? r1 : rs + RS;                                \
                float part[RS * NT_MAX] = {0};                                                 \
                if (whole) prep_##TY(a->w + rs * rb, 0, (int)((re - rs) * ng), sdp, smp);     \
                for (int64_t gb = 0; gb < ng; gb += kb) {                                      \
                    const int64_t ge = ng - gb < kb ? ng : gb + kb;                            \
                    for (int64_t r = rs; r < re; r += RN) {                                    \
                        const uint8_t *row = a->w + r * rb;                                    \
                        const float *sd = whole ? sdp + (r - rs) * SDG * ng : NULL;            \
                        const float *sm = whole ? smp + (r - rs) * ng : NULL;                  \
                        const int nr = re - r < RN ? (int)(re - r) : RN;                       \
                        if (nr == 2) {                                                         \
                            TILE_SWITCH(TY, 2)                                                 \
                        } else {                                                               \
                            TILE_SWITCH(TY, 1)                                                 \
                        }                                                                      \
                        float *p = part + (r - rs) * nt;                                       \
                        for (int k = 0; k < nr * nt; k++) p[k] += out[k];                      \
                    }                                                                          \
                }                                                                              \
                for (int64_t r = rs; r < re; r++) {                                            \
                    float *p = part + (r - rs) * nt;                                           \
                    if (done < cols) plain_tail(TYPE, a->w + r * rb, done, a, t0, nt, p);      \
                    for (int t = 0; t < nt; t++) a->y[(int64_t)(t0 + t) * a->ldy + r] = p[t];  \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    static T512 void deq_##TY(const void *src, float *dst, int64_t n) {                        \
        const uint8_t *s = src;                                                                \
        const int64_t ng = n / 32;                                                             \
        for (int64_t g0 = 0; g0 < ng; g0 += SEG) {                                             \
            const int cnt = ng - g0 < SEG ? (int)(ng - g0) : SEG;                              \
            float sd[SDG * SEG], sm[SEG];                                                      \
            prep_##TY(s, g0, cnt, sd, sm);                                                     \
            for (int i = 0; i < cnt; i++) {                                                    \
                __m512 w0, w1;                                                                 \
                ex_##TY(s, g0 + i, i, sd, sm, &w0, &w1, 1);                                    \
                _mm512_storeu_ps(dst + 32 * (g0 + i), w0);                                     \
                _mm512_storeu_ps(dst + 32 * (g0 + i) + 16, w1);                                \
            }                                                                                  \
        }                                                                                      \
        if (ng * 32 < n) plain_tail_deq(TYPE, s, ng * 32, n, dst);                             \
    }

#define prep_f32 prep_none
#define prep_f16 prep_none
#define prep_bf16 prep_none

CPU_WEIGHT_TYPES(DEF_ROWS)

int cpu_kernels_avx512(cpu_kernel_set *ks) {
    memset(ks, 0, sizeof *ks);
    ks->name = "avx512";
    ks->nt_max = NT_MAX;
    CPU_WEIGHT_TYPES(CPU_SET_TYPE_KERNELS)
    return 1;
}

#else /* not x86 */

int cpu_kernels_avx512(cpu_kernel_set *ks) {
    (void)ks;
    return 0;
}

#endif
