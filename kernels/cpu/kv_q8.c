/* kv_q8.c - attention's kernels over a Q8_0 KV cache (kv_cache_dtype q8_0):
 * each with its scalar twin here beside it, and the installer that gives
 * every kernel set (matmul.c) its versions.
 *
 * A Q8_0 cache row holds, per 32 values, an fp16 scale d and 32 int8 q
 * (GGML's block, quant_impl.h blk_q8_0), written by cpu_quantize_row_q8_0.
 *
 *   K side (kv_dots_q8): llama.cpp's arithmetic for a quantized K cache.
 *     The query is quantized as the integer matmuls quantize activations
 *     (the kernel set's `quantize`: int8 per 32 values, an fp32 scale, the
 *     block's sum), and each score is an integer dot product per block:
 *
 *         acc = 0; for b in blocks, in order:
 *             acc = fma((float)isum_b, dq_b * dk_b, acc)
 *         score = acc * scale
 *
 *     isum_b is the exact int32 dot of the block's 32 int8 pairs. Integer
 *     sums are exact in any order, so the vector kernels only have to keep
 *     the fp32 epilogue's order to give the scalar twin's bits: a score
 *     never depends on the SIMD path, the batch or the rows beside it.
 *     The vector kernels put cache rows in the lanes (8 for AVX2, a page
 *     of 16 for AVX-512): the rows' 4-byte groups are transposed once per
 *     tile and then serve every query of the block, so a prompt block's
 *     48 queries pay for that shuffle once. AVX-512 VNNI multiplies with
 *     vpdpbusd (unsigned x signed bytes): the tile is stored as K + 128
 *     (the sign bit flipped) and the accumulator starts at -128 * sum(q),
 *     which the quantizer gives. Plain AVX2's byte multiply (vpmaddubsw)
 *     saturates, so the AVX2 kernel (and the AVX-512 one without VNNI,
 *     on 16 lanes) splits each group into its even and odd bytes
 *     sign-extended to int16 and multiplies with vpmaddwd; AVX2 CPUs with
 *     AVX-VNNI take vpdpbusd on 8 lanes as AVX-512 VNNI does. The kernels
 *     also give each query's max over the rows every query of its block
 *     sees, which softmax needs.
 *
 *   V side (kv_rows_q8): rows dequantized to fp32 (d * q, exact), which
 *     the fp32 V kernels then read (cpu_backend.c, "a Q8_0 cache").
 *
 *   Storing (quantize_q8_0): a new K or V row rounded to Q8_0 exactly as
 *     cpu_quantize_row_q8_0 (llama.cpp's reference) rounds it.
 *
 * test_matmul compares every path with the scalar twins, bit for bit, and
 * the twins with the definitions above written out again. */
#include <math.h>
#include <string.h>

#include "common/util/dtype.h"
#include "matmul.h" /* cpu_quantize_row_q8_0 */
#include "quant_impl.h"

/* Blocks a head may have for the vector K kernels (heads up to 256 wide);
 * wider heads take the scalar twin. */
#define KQ8_MAX_BLOCKS 8

/* ---- the scalar twins ------------------------------------------------------ */

void cpu_kv_rows_q8_scalar(float *dst, const void *pool, const int32_t *pages, int r, int nr,
                           size_t stride, size_t off, int n) {
    const cpu_dequant_fn deq = cpu_dequant_ref_fn(SPECD_Q8_0);
    for (int i = 0; i < nr; i++)
        deq(cpu_kv_paged_row_q8(pool, pages, r + i, stride, off), dst + (size_t)i * n, n);
}

void cpu_kv_dots_q8_scalar(const int8_t *qv, const float *qd, const int32_t *qsum, int nq,
                           const void *pool, const int32_t *pages, int n_rows, size_t stride,
                           size_t off, int n, float scale, float *const *scores, int n_max,
                           float *maxs) {
    (void)qsum; /* the VNNI kernel's correction term only */
    const int nb = n / 32;
    for (int k = 0; k < nq; k++) maxs[k] = -INFINITY;
    for (int r = 0; r < n_rows; r++) {
        const uint8_t *kr = cpu_kv_paged_row_q8(pool, pages, r, stride, off);
        for (int k = 0; k < nq; k++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const int8_t *x = qv + (size_t)k * n + (size_t)b * 32;
                const uint8_t *blk = kr + (size_t)b * sizeof(blk_q8_0);
                const int8_t *y = (const int8_t *)(blk + offsetof(blk_q8_0, qs));
                int32_t isum = 0;
                for (int i = 0; i < 32; i++) isum += (int32_t)x[i] * (int32_t)y[i];
                const float dk = specd_fp16_to_f32(rd_u16(blk + offsetof(blk_q8_0, d)));
                acc = fmaf((float)isum, qd[(size_t)k * nb + b] * dk, acc);
            }
            scores[k][r] = acc * scale;
            if (r < n_max && scores[k][r] > maxs[k]) maxs[k] = scores[k][r]; /* NaN never */
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define TAVX2F16 __attribute__((target("avx2,fma,f16c")))
#define TAVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define TAVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define TVNNI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/* Prefetches the head's slice of the 16 rows of the page after row r (the
 * pages are scattered, which the hardware prefetcher cannot follow). */
static inline void prefetch_next_page(const void *pool, const int32_t *pages, int r, int n_rows,
                                      size_t stride, size_t off, int n) {
    const int next = (r / SPECD_KV_PAGE_ROWS + 1) * SPECD_KV_PAGE_ROWS;
    for (int i = next; i < next + SPECD_KV_PAGE_ROWS && i < n_rows; i++)
        cpu_kv_prefetch_q8(pool, pages, i, stride, off, n);
}

/* ---- AVX2 ------------------------------------------------------------------ */

/* per block of 32, the fp16 scale widened by F16C and the int8 values
 * sign-extended and converted (both exact), one multiply each: d * q as
 * the reference rounds it */
static TAVX2F16 void kv_rows_q8_avx2(float *dst, const void *pool, const int32_t *pages, int r,
                                     int nr, size_t stride, size_t off, int n) {
    for (int i = 0; i < nr; i++) {
        if (i + SPECD_KV_PAGE_ROWS < nr)
            cpu_kv_prefetch_q8(pool, pages, r + i + SPECD_KV_PAGE_ROWS, stride, off, n);
        const uint8_t *b = cpu_kv_paged_row_q8(pool, pages, r + i, stride, off);
        float *o = dst + (size_t)i * n;
        for (int c = 0; c < n; c += 32, b += 34) {
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(rd_u16(b)));
            for (int k = 0; k < 4; k++) {
                const __m256i q =
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * k)));
                _mm256_storeu_ps(o + c + 8 * k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
            }
        }
    }
}

/* out[p] lane l = dword p of in[l]: the 8 x 8 transpose of 32-bit
 * elements */
static inline TAVX2F16 void transpose8_epi32(const __m256i *in, __m256i *out) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    /* u[p] (p < 4): dword p of rows 0-3 | dword p + 4 of rows 0-3; u[p + 4]
     * the same of rows 4-7 */
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    for (int p = 0; p < 4; p++) {
        out[p] = _mm256_permute2x128_si256(u[p], u[p + 4], 0x20);
        out[p + 4] = _mm256_permute2x128_si256(u[p], u[p + 4], 0x31);
    }
}

/* Rows 0-7 from blk (rowb bytes apart) of one block: t[p] lane l = dword p
 * of row l's 32 int8 values, and the rows' scales widened. */
static inline TAVX2F16 void tile8_q8(const uint8_t *blk, size_t rowb, __m256i *t, __m256 *dk) {
    __m256i rows[8];
    uint16_t d[8];
    for (int l = 0; l < 8; l++) {
        rows[l] = _mm256_loadu_si256(
            (const __m256i *)(blk + (size_t)l * rowb + offsetof(blk_q8_0, qs)));
        d[l] = rd_u16(blk + (size_t)l * rowb);
    }
    transpose8_epi32(rows, t);
    *dk = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
}

/* Each of nblk query blocks' 8 groups of 4 bytes (x0 x1 x2 x3) as the
 * int16 pairs (x0, x2) in qe and (x1, x3) in qo, the vpmaddwd kernels'
 * operands. */
static inline TAVX2F16 void split_even_odd(const int8_t *qv, int nblk, int32_t *qe, int32_t *qo) {
    for (int i = 0; i < nblk; i++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qv + (size_t)i * 32));
        _mm256_storeu_si256((__m256i *)(qe + 8 * i), _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8));
        _mm256_storeu_si256((__m256i *)(qo + 8 * i), _mm256_srai_epi16(v, 8));
    }
}

/* The largest of 8 lanes (no NaN among them). */
static inline TAVX2F16 float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* The K side with 8 rows in the lanes. A 4-byte group (x0 x1 x2 x3) of a
 * row becomes two int16 pairs, (x0, x2) and (x1, x3), and the query's
 * group the same, so two vpmaddwd give the group's 4 products summed in
 * int32 (at most 2 * 127 * 128 per pair: no saturation). */
static TAVX2F16 void kv_dots_q8_avx2(const int8_t *qv, const float *qd, const int32_t *qsum,
                                     int nq, const void *pool, const int32_t *pages, int n_rows,
                                     size_t stride, size_t off, int n, float scale,
                                     float *const *scores, int n_max, float *maxs) {
    const int nb = n / 32;
    if (nb > KQ8_MAX_BLOCKS || nq > CPU_ATTN_MAXQ) {
        cpu_kv_dots_q8_scalar(qv, qd, qsum, nq, pool, pages, n_rows, stride, off, n, scale,
                              scores, n_max, maxs);
        return;
    }
    const size_t rowb = stride / 32 * sizeof(blk_q8_0);
    int32_t qe[CPU_ATTN_MAXQ * KQ8_MAX_BLOCKS * 8], qo[CPU_ATTN_MAXQ * KQ8_MAX_BLOCKS * 8];
    split_even_odd(qv, nq * nb, qe, qo);
    const __m256 vscale = _mm256_set1_ps(scale);
    /* each query's running max, lane-wise over the rows below n_max */
    __m256 vmax[CPU_ATTN_MAXQ];
    for (int k = 0; k < nq; k++) vmax[k] = _mm256_set1_ps(-INFINITY);
    __m256i te[KQ8_MAX_BLOCKS][8], to[KQ8_MAX_BLOCKS][8];
    __m256 dk[KQ8_MAX_BLOCKS];
    for (int r0 = 0; r0 < n_rows; r0 += 8) {
        /* rows r0..r0+7 lie in one page (r0 is a multiple of 8): rows past
         * n_rows are read (the page is whole) but never stored */
        const int nr = n_rows - r0 < 8 ? n_rows - r0 : 8;
        const uint8_t *base = cpu_kv_paged_row_q8(pool, pages, r0, stride, off);
        if (r0 % SPECD_KV_PAGE_ROWS == 0) prefetch_next_page(pool, pages, r0, n_rows, stride, off, n);
        for (int b = 0; b < nb; b++) {
            __m256i t[8];
            tile8_q8(base + (size_t)b * sizeof(blk_q8_0), rowb, t, &dk[b]);
            for (int p = 0; p < 8; p++) {
                te[b][p] = _mm256_srai_epi16(_mm256_slli_epi16(t[p], 8), 8);
                to[b][p] = _mm256_srai_epi16(t[p], 8);
            }
        }
        const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lanes);
        const __m256 inmax = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n_max - r0), lanes));
        for (int k = 0; k < nq; k++) {
            __m256 acc = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const int32_t *e = qe + ((size_t)k * nb + b) * 8, *o = qo + ((size_t)k * nb + b) * 8;
                __m256i s = _mm256_setzero_si256();
                for (int p = 0; p < 8; p++) {
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(te[b][p], _mm256_set1_epi32(e[p])));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(to[b][p], _mm256_set1_epi32(o[p])));
                }
                const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(qd[(size_t)k * nb + b]), dk[b]);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, acc);
            }
            const __m256 sc = _mm256_mul_ps(acc, vscale);
            _mm256_maskstore_ps(scores[k] + r0, keep, sc);
            /* max's second operand on NaN: a NaN score never becomes it */
            vmax[k] = _mm256_blendv_ps(vmax[k], _mm256_max_ps(sc, vmax[k]), inmax);
        }
    }
    for (int k = 0; k < nq; k++) maxs[k] = hmax8(vmax[k]);
}

/* kv_dots_q8_avx2 for AVX2 CPUs with AVX-VNNI (vpdpbusd on 8 lanes): the
 * tile as K + 128 and the accumulator from -128 * sum(q), as the AVX-512
 * VNNI kernel does, one instruction per 4-byte group instead of two
 * vpmaddwd and two adds. */
static TAVXVNNI void kv_dots_q8_avxvnni(const int8_t *qv, const float *qd, const int32_t *qsum,
                                        int nq, const void *pool, const int32_t *pages,
                                        int n_rows, size_t stride, size_t off, int n,
                                        float scale, float *const *scores, int n_max,
                                        float *maxs) {
    const int nb = n / 32;
    if (nb > KQ8_MAX_BLOCKS || nq > CPU_ATTN_MAXQ) {
        cpu_kv_dots_q8_scalar(qv, qd, qsum, nq, pool, pages, n_rows, stride, off, n, scale,
                              scores, n_max, maxs);
        return;
    }
    const size_t rowb = stride / 32 * sizeof(blk_q8_0);
    int32_t corr[CPU_ATTN_MAXQ * KQ8_MAX_BLOCKS];
    for (int i = 0; i < nq * nb; i++) corr[i] = -128 * qsum[i];
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const __m256 vscale = _mm256_set1_ps(scale);
    __m256 vmax[CPU_ATTN_MAXQ];
    for (int k = 0; k < nq; k++) vmax[k] = _mm256_set1_ps(-INFINITY);
    __m256i tile[KQ8_MAX_BLOCKS][8];
    __m256 dk[KQ8_MAX_BLOCKS];
    for (int r0 = 0; r0 < n_rows; r0 += 8) {
        const int nr = n_rows - r0 < 8 ? n_rows - r0 : 8;
        const uint8_t *base = cpu_kv_paged_row_q8(pool, pages, r0, stride, off);
        if (r0 % SPECD_KV_PAGE_ROWS == 0) prefetch_next_page(pool, pages, r0, n_rows, stride, off, n);
        for (int b = 0; b < nb; b++) {
            tile8_q8(base + (size_t)b * sizeof(blk_q8_0), rowb, tile[b], &dk[b]);
            for (int p = 0; p < 8; p++) tile[b][p] = _mm256_xor_si256(tile[b][p], flip);
        }
        const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lanes);
        const __m256 inmax = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n_max - r0), lanes));
        for (int k = 0; k < nq; k++) {
            __m256 acc = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const int8_t *q = qv + (size_t)k * n + (size_t)b * 32;
                __m256i s = _mm256_set1_epi32(corr[k * nb + b]);
                for (int p = 0; p < 8; p++)
                    s = _mm256_dpbusd_avx_epi32(s, tile[b][p], _mm256_set1_epi32(ld32(q + 4 * p)));
                const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(qd[(size_t)k * nb + b]), dk[b]);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, acc);
            }
            const __m256 sc = _mm256_mul_ps(acc, vscale);
            _mm256_maskstore_ps(scores[k] + r0, keep, sc);
            vmax[k] = _mm256_blendv_ps(vmax[k], _mm256_max_ps(sc, vmax[k]), inmax);
        }
    }
    for (int k = 0; k < nq; k++) maxs[k] = hmax8(vmax[k]);
}

/* cpu_quantize_row_q8_0's bits (matmul.h: llama.cpp's reference rounding)
 * 8 lanes at a time: the same max, d and 1 / d in scalar code, and
 * roundf's half-away-from-zero as trunc(y) plus the sign of y where
 * |y - trunc(y)| >= 0.5 (the difference is exact); NaN lanes give 0. A
 * prompt's K and V rows are stored by this (cpu_backend.c kv_store). */
static TAVX2F16 void quantize_q8_0_avx2(const float *x, void *dst, int64_t n) {
    uint8_t *out = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / 32; b++, x += 32, out += sizeof(blk_q8_0)) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            /* max's second operand on NaN: a NaN never becomes the max */
            amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), amax);
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float d = _mm_cvtss_f32(m) / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        const uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(out + offsetof(blk_q8_0, d), &dh, 2);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            const __m256 y = _mm256_mul_ps(v[i], vid);
            const __m256 t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t));
            const __m256 away = _mm256_or_ps(one, _mm256_and_ps(sign, y));
            __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), away));
            r = _mm256_and_ps(r, _mm256_cmp_ps(y, y, _CMP_ORD_Q));
            q[i] = _mm256_cvttps_epi32(r);
        }
        /* packs work per 128-bit lane: dwords (q0 0-3, q1 0-3, q2, q3 | q0
         * 4-7, ...) back into element order */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(out + offsetof(blk_q8_0, qs)),
                            _mm256_permutevar8x32_epi32(p, order));
    }
}

/* ---- AVX-512 ---------------------------------------------------------------- */

/* vec_avx2's kv_rows_q8 with a block's 32 values in two zmm */
static TAVX512 void kv_rows_q8_avx512(float *dst, const void *pool, const int32_t *pages, int r,
                                      int nr, size_t stride, size_t off, int n) {
    for (int i = 0; i < nr; i++) {
        if (i + SPECD_KV_PAGE_ROWS < nr)
            cpu_kv_prefetch_q8(pool, pages, r + i + SPECD_KV_PAGE_ROWS, stride, off, n);
        const uint8_t *b = cpu_kv_paged_row_q8(pool, pages, r + i, stride, off);
        float *o = dst + (size_t)i * n;
        for (int c = 0; c < n; c += 32, b += 34) {
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(rd_u16(b)));
            const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
            const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)));
            _mm512_storeu_ps(o + c, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q0)));
            _mm512_storeu_ps(o + c + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q1)));
        }
    }
}

/* out[p] lane l = dword p of row l, for 16 rows of 8 dwords given as z[j]
 * = (row j | row j + 8): transpose8_epi32's unpacks on each 256-bit half
 * leave u[p] = (dword p, rows 0-3 | dword p + 4, rows 0-3 | dword p, rows
 * 8-11 | dword p + 4, rows 8-11) and u[p + 4] the same of rows 4-7 and
 * 12-15; one vpermt2q each puts the 16 rows of a dword in order. */
static inline TAVX512 void transpose16x8_epi32(const __m512i *z, __m512i *out) {
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    __m512i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    for (int p = 0; p < 4; p++) {
        out[p] = _mm512_permutex2var_epi64(u[p], lo, u[p + 4]);
        out[p + 4] = _mm512_permutex2var_epi64(u[p], hi, u[p + 4]);
    }
}

/* A page's 16 rows from blk (rowb bytes apart) of one block: t[p] lane l
 * = dword p of row l's 32 int8 values, and the rows' scales widened (the
 * low half of the dword at each block, gathered). */
static inline TAVX512 void tile16_q8(const uint8_t *blk, size_t rowb, __m512i rowoff, __m512i *t,
                                    __m512 *dk) {
    const uint8_t *qs = blk + offsetof(blk_q8_0, qs);
    __m512i z[8];
    for (int j = 0; j < 8; j++)
        z[j] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(qs + (size_t)j * rowb))),
            _mm256_loadu_si256((const __m256i *)(qs + (size_t)(j + 8) * rowb)), 1);
    transpose16x8_epi32(z, t);
    *dk = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(rowoff, (const void *)blk, 1)));
}

/* kv_dots_q8_avx2's even/odd int16 split and vpmaddwd on a page of 16
 * rows, for AVX-512 CPUs without VNNI (Skylake-SP). */
static TAVX512 void kv_dots_q8_avx512(const int8_t *qv, const float *qd, const int32_t *qsum,
                                      int nq, const void *pool, const int32_t *pages, int n_rows,
                                      size_t stride, size_t off, int n, float scale,
                                      float *const *scores, int n_max, float *maxs) {
    const int nb = n / 32;
    if (nb > KQ8_MAX_BLOCKS || nq > CPU_ATTN_MAXQ) {
        cpu_kv_dots_q8_scalar(qv, qd, qsum, nq, pool, pages, n_rows, stride, off, n, scale,
                              scores, n_max, maxs);
        return;
    }
    const size_t rowb = stride / 32 * sizeof(blk_q8_0);
    int32_t qe[CPU_ATTN_MAXQ * KQ8_MAX_BLOCKS * 8], qo[CPU_ATTN_MAXQ * KQ8_MAX_BLOCKS * 8];
    split_even_odd(qv, nq * nb, qe, qo);
    const __m512i rowoff = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)rowb));
    const __m512 vscale = _mm512_set1_ps(scale);
    __m512 vmax[CPU_ATTN_MAXQ];
    for (int k = 0; k < nq; k++) vmax[k] = _mm512_set1_ps(-INFINITY);
    __m512i te[KQ8_MAX_BLOCKS][8], to[KQ8_MAX_BLOCKS][8];
    __m512 dk[KQ8_MAX_BLOCKS];
    for (int r0 = 0; r0 < n_rows; r0 += SPECD_KV_PAGE_ROWS) {
        const int nr = n_rows - r0 < SPECD_KV_PAGE_ROWS ? n_rows - r0 : SPECD_KV_PAGE_ROWS;
        const __mmask16 keep = (__mmask16)((1u << nr) - 1u);
        const int nm = n_max - r0 < 0 ? 0 : n_max - r0 < 16 ? n_max - r0 : 16;
        const __mmask16 inmax = (__mmask16)((1u << nm) - 1u);
        const uint8_t *base = cpu_kv_paged_row_q8(pool, pages, r0, stride, off);
        prefetch_next_page(pool, pages, r0, n_rows, stride, off, n);
        for (int b = 0; b < nb; b++) {
            __m512i t[8];
            tile16_q8(base + (size_t)b * sizeof(blk_q8_0), rowb, rowoff, t, &dk[b]);
            for (int p = 0; p < 8; p++) {
                te[b][p] = _mm512_srai_epi16(_mm512_slli_epi16(t[p], 8), 8);
                to[b][p] = _mm512_srai_epi16(t[p], 8);
            }
        }
        for (int k = 0; k < nq; k++) {
            __m512 acc = _mm512_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const int32_t *e = qe + ((size_t)k * nb + b) * 8, *o = qo + ((size_t)k * nb + b) * 8;
                __m512i s = _mm512_setzero_si512();
                for (int p = 0; p < 8; p++) {
                    s = _mm512_add_epi32(s, _mm512_madd_epi16(te[b][p], _mm512_set1_epi32(e[p])));
                    s = _mm512_add_epi32(s, _mm512_madd_epi16(to[b][p], _mm512_set1_epi32(o[p])));
                }
                const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(qd[(size_t)k * nb + b]), dk[b]);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, acc);
            }
            const __m512 sc = _mm512_mul_ps(acc, vscale);
            _mm512_mask_storeu_ps(scores[k] + r0, keep, sc);
            vmax[k] = _mm512_mask_max_ps(vmax[k], inmax, sc, vmax[k]);
        }
    }
    for (int k = 0; k < nq; k++) maxs[k] = _mm512_reduce_max_ps(vmax[k]);
}

/* The K side with a page of 16 rows in the lanes, by vpdpbusd on the
 * rows' transposed bytes. */
static TVNNI void kv_dots_q8_avx512vnni(const int8_t *qv, const float *qd, const int32_t *qsum,
                                        int nq, const void *pool, const int32_t *pages,
                                        int n_rows, size_t stride, size_t off, int n,
                                        float scale, float *const *scores, int n_max,
                                        float *maxs) {
    const int nb = n / 32;
    if (nb > KQ8_MAX_BLOCKS || nq > CPU_ATTN_MAXQ) {
        cpu_kv_dots_q8_scalar(qv, qd, qsum, nq, pool, pages, n_rows, stride, off, n, scale,
                              scores, n_max, maxs);
        return;
    }
    const size_t rowb = stride / 32 * sizeof(blk_q8_0);
    /* vpdpbusd sums (k + 128) * q: start each block at -128 * sum(q) */
    int32_t corr[CPU_ATTN_MAXQ * KQ8_MAX_BLOCKS];
    for (int i = 0; i < nq * nb; i++) corr[i] = -128 * qsum[i];
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i rowoff = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)rowb));
    const __m512 vscale = _mm512_set1_ps(scale);
    /* each query's running max, lane-wise over the rows below n_max */
    __m512 vmax[CPU_ATTN_MAXQ];
    for (int k = 0; k < nq; k++) vmax[k] = _mm512_set1_ps(-INFINITY);
    __m512i tile[KQ8_MAX_BLOCKS][8];
    __m512 dk[KQ8_MAX_BLOCKS];
    for (int r0 = 0; r0 < n_rows; r0 += SPECD_KV_PAGE_ROWS) {
        /* one page: rows past n_rows are read (the page is whole) but never
         * stored */
        const int nr = n_rows - r0 < SPECD_KV_PAGE_ROWS ? n_rows - r0 : SPECD_KV_PAGE_ROWS;
        const __mmask16 keep = (__mmask16)((1u << nr) - 1u);
        const int nm = n_max - r0 < 0 ? 0 : n_max - r0 < 16 ? n_max - r0 : 16;
        const __mmask16 inmax = (__mmask16)((1u << nm) - 1u);
        const uint8_t *base = cpu_kv_paged_row_q8(pool, pages, r0, stride, off);
        prefetch_next_page(pool, pages, r0, n_rows, stride, off, n);
        for (int b = 0; b < nb; b++) {
            tile16_q8(base + (size_t)b * sizeof(blk_q8_0), rowb, rowoff, tile[b], &dk[b]);
            for (int p = 0; p < 8; p++) tile[b][p] = _mm512_xor_si512(tile[b][p], flip);
        }
        for (int k = 0; k < nq; k++) {
            __m512 acc = _mm512_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const int8_t *q = qv + (size_t)k * n + (size_t)b * 32;
                __m512i s = _mm512_set1_epi32(corr[k * nb + b]);
                for (int p = 0; p < 8; p++)
                    s = _mm512_dpbusd_epi32(s, tile[b][p], _mm512_set1_epi32(ld32(q + 4 * p)));
                const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(qd[(size_t)k * nb + b]), dk[b]);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, acc);
            }
            const __m512 sc = _mm512_mul_ps(acc, vscale);
            _mm512_mask_storeu_ps(scores[k] + r0, keep, sc);
            /* max's second operand on NaN: a NaN score never becomes it */
            vmax[k] = _mm512_mask_max_ps(vmax[k], inmax, sc, vmax[k]);
        }
    }
    for (int k = 0; k < nq; k++) maxs[k] = _mm512_reduce_max_ps(vmax[k]);
}
#endif

void cpu_kv_q8_install(cpu_kernel_set *ks, cpu_kv_q8_level level) {
    ks->kv_rows_q8 = cpu_kv_rows_q8_scalar;
    ks->kv_dots_q8 = cpu_kv_dots_q8_scalar;
    ks->quantize_q8_0 = cpu_quantize_row_q8_0;
#if defined(__x86_64__) || defined(__i386__)
    if (level == CPU_KV_Q8_SCALAR) return;
    ks->kv_rows_q8 = level >= CPU_KV_Q8_AVX512 ? kv_rows_q8_avx512 : kv_rows_q8_avx2;
    ks->quantize_q8_0 = quantize_q8_0_avx2; /* a small pass: AVX2 serves every set */
    switch (level) {
    case CPU_KV_Q8_AVXVNNI: ks->kv_dots_q8 = kv_dots_q8_avxvnni; break;
    case CPU_KV_Q8_AVX512VNNI: ks->kv_dots_q8 = kv_dots_q8_avx512vnni; break;
    case CPU_KV_Q8_AVX512: ks->kv_dots_q8 = kv_dots_q8_avx512; break;
    default: ks->kv_dots_q8 = kv_dots_q8_avx2;
    }
#else
    (void)level;
#endif
}
