/* vec_avx512.c - AVX-512 kernels of attention over the paged KV cache (read
 * quant_impl.h's kv_* kernels, then vec_avx2.c, whose arithmetic these
 * keep bit for bit).
 *
 *   K side: q . K_r for 4 rows at a time. vec_avx2.c keeps two 8-lane FMA
 *     chains per row and sums them with one fixed network; here one zmm
 *     chain holds both (lanes 0-7 and 8-15), so the scores are the AVX2
 *     set's bits with half the fma instructions. A block of 12-16 queries
 *     (a prompt's, a tree's) instead puts the queries in the lanes and
 *     runs the same chains and sums lane-wise (dots_qlanes): no
 *     horizontal sums, 15% less time per score.
 *   V side: o += w_r * V_r for up to 4 queries whose 64-wide outputs stay
 *     in 16 zmm while the rows stream by. One fma per element per row in
 *     row order, as in every set: an elementwise chain does not depend on
 *     the vector width.
 *
 * Also softmax's exp and SwiGLU, 16 lanes wide with vec_avx2.c's bits.
 *
 * fp16 pools are widened to fp32 (exact) once per block before the same
 * arithmetic. test_backend_ops' test_attention_blocks_bitwise compares this
 * set's attention with the AVX2 set's, bit for bit. Compiled with
 * per-function target attributes (no -march), and only installed after
 * matmul.c checked the CPU (common/util/simd.h). */
#include <math.h>
#include <string.h>

#include "quant_impl.h"
#include "vec_exp.h"
#include "vec_hsum.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define TBW "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"

/* Prefetch distance of the K and V passes, in rows: vec_avx2.c's (a KV
 * head's slice of a row is a short piece of a long stride, which the
 * hardware prefetcher follows slowly; read its comment). A decode step's
 * attention over 1,000-3,000 rows x 30 layers, one thread, Zen 5 VM
 * (bench/kernel_ab.sh with vec_avx512.c): at 48-128 rows 0.63-0.74x the
 * time of 16 rows, which did not cover a DRAM miss; _MM_HINT_T1 or T2
 * instead of T0 gained less (0.70-0.83x). */
#define K_PREFETCH_ROWS CPU_KV_PREFETCH_ROWS

/* Prefetches every cache line of one KV head's slice (n elements) of the
 * sequence's row r: the K passes ask for rows K_PREFETCH_ROWS ahead. */
static inline __attribute__((always_inline)) void prefetch_kv_row(const void *pool, int f16,
                                                                 const int32_t *pages, int r,
                                                                 size_t stride, size_t off, int n) {
    const char *p = f16 ? (const char *)cpu_kv_paged_row_f16(pool, pages, r, stride, off)
                        : (const char *)cpu_kv_paged_row(pool, pages, r, stride, off);
    const uintptr_t end = (uintptr_t)p + (size_t)n * (f16 ? 2u : 4u) - 1;
    for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)63; a <= end; a += 64)
        _mm_prefetch((const char *)a, _MM_HINT_T0);
}

/* An fp16 row of n (a multiple of 16) widened to fp32 (exact). */
static inline __attribute__((always_inline, target(TBW))) void widen16(float *dst,
                                                                      const uint16_t *src, int n) {
    for (int d = 0; d < n; d += 16)
        _mm512_storeu_ps(dst + d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + d))));
}

/* ---- attention's V side for a query block (quant_impl.h kv_axpys_block) -- */


/* One query's 64-wide output in 4 zmm: o += w * v, elementwise fma, the
 * same per element as kv_axpy's 8-wide one. */
#define AXPY4(o0, o1, o2, o3, w)                      \
    do {                                              \
        const __m512 wv_ = _mm512_set1_ps(w);         \
        o0 = _mm512_fmadd_ps(wv_, v0, o0);            \
        o1 = _mm512_fmadd_ps(wv_, v1, o1);            \
        o2 = _mm512_fmadd_ps(wv_, v2, o2);            \
        o3 = _mm512_fmadd_ps(wv_, v3, o3);            \
    } while (0)

/* The weights sc * inv of rows r0 .. r0+cn-1 (cn <= W_CHUNK) for nq <= 4
 * queries, 16 at a time; returns nonzero if any score among them is zero
 * (a row the caller must skip for that query, as kv_axpys does). */
#define W_CHUNK 64
static inline __attribute__((always_inline, target(TBW))) __mmask16
chunk_weights(float (*w)[W_CHUNK], const float *const *sc, const float *inv, int nq, int r0,
              int cn) {
    __mmask16 zero = 0;
    for (int k = 0; k < nq; k++) {
        const __m512 iv = _mm512_set1_ps(inv[k]);
        for (int i = 0; i < cn; i += 16) {
            const __mmask16 m = cn - i >= 16 ? 0xFFFF : (__mmask16)((1u << (cn - i)) - 1);
            const __m512 s = _mm512_maskz_loadu_ps(m, sc[k] + r0 + i);
            zero |= _mm512_mask_cmp_ps_mask(m, s, _mm512_setzero_ps(), _CMP_EQ_OQ);
            _mm512_store_ps(w[k] + i, _mm512_mul_ps(s, iv));
        }
    }
    return zero;
}

/* Up to 4 queries whose outputs stay in 16 zmm while rows t0 .. t0+nt-1
 * stream by: read from the fp32 pool, or, with `tile`, from fp16 rows
 * already widened into it (tile[r] is row t0 + r). always_inline: each
 * caller gets a copy with `tile` fixed, and nq == 4 its own copy.
 *
 * The weights sc * inv of W_CHUNK rows are formed first, 16 at a time (the
 * same products), so the row loop is loads and fmas only: one broadcast
 * from memory and 4 fmas per query and row, where forming each weight in
 * the loop (load, test, multiply, broadcast) doubled its instructions. A
 * zero score adds nothing and is skipped, as kv_axpys skips it; the rows
 * these kernels get are visible ones, whose exp is never 0 (softmax_exp
 * clamps), so a chunk with a zero takes the per-row test instead. */
static inline __attribute__((always_inline, target(TBW))) void
axpys_rows4(float *const *o, const float *const *sc, const float *inv, int nq, const float *pool,
            const int32_t *pages, size_t stride, size_t off, const float (*tile)[64], int t0,
            int nt) {
    __m512 a0 = _mm512_loadu_ps(o[0]), a1 = _mm512_loadu_ps(o[0] + 16),
           a2 = _mm512_loadu_ps(o[0] + 32), a3 = _mm512_loadu_ps(o[0] + 48);
    __m512 b0 = a0, b1 = a1, b2 = a2, b3 = a3, c0 = a0, c1 = a1, c2 = a2, c3 = a3,
           d0 = a0, d1 = a1, d2 = a2, d3 = a3;
    if (nq > 1) b0 = _mm512_loadu_ps(o[1]), b1 = _mm512_loadu_ps(o[1] + 16),
        b2 = _mm512_loadu_ps(o[1] + 32), b3 = _mm512_loadu_ps(o[1] + 48);
    if (nq > 2) c0 = _mm512_loadu_ps(o[2]), c1 = _mm512_loadu_ps(o[2] + 16),
        c2 = _mm512_loadu_ps(o[2] + 32), c3 = _mm512_loadu_ps(o[2] + 48);
    if (nq > 3) d0 = _mm512_loadu_ps(o[3]), d1 = _mm512_loadu_ps(o[3] + 16),
        d2 = _mm512_loadu_ps(o[3] + 32), d3 = _mm512_loadu_ps(o[3] + 48);
    float w[4][W_CHUNK] __attribute__((aligned(64)));
    for (int c = 0; c < nt; c += W_CHUNK) {
        const int cn = nt - c < W_CHUNK ? nt - c : W_CHUNK;
        const __mmask16 zero = chunk_weights(w, sc, inv, nq, t0 + c, cn);
        for (int i = 0; i < cn; i++) {
            const int r = t0 + c + i;
            const float *row = tile ? tile[c + i] : cpu_kv_paged_row(pool, pages, r, stride, off);
            const __m512 v0 = _mm512_loadu_ps(row), v1 = _mm512_loadu_ps(row + 16),
                         v2 = _mm512_loadu_ps(row + 32), v3 = _mm512_loadu_ps(row + 48);
            if (!zero) {
                AXPY4(a0, a1, a2, a3, w[0][i]);
                if (nq > 1) AXPY4(b0, b1, b2, b3, w[1][i]);
                if (nq > 2) AXPY4(c0, c1, c2, c3, w[2][i]);
                if (nq > 3) AXPY4(d0, d1, d2, d3, w[3][i]);
                continue;
            }
            if (sc[0][r] != 0.0f) AXPY4(a0, a1, a2, a3, w[0][i]);
            if (nq > 1 && sc[1][r] != 0.0f) AXPY4(b0, b1, b2, b3, w[1][i]);
            if (nq > 2 && sc[2][r] != 0.0f) AXPY4(c0, c1, c2, c3, w[2][i]);
            if (nq > 3 && sc[3][r] != 0.0f) AXPY4(d0, d1, d2, d3, w[3][i]);
        }
    }
    _mm512_storeu_ps(o[0], a0), _mm512_storeu_ps(o[0] + 16, a1);
    _mm512_storeu_ps(o[0] + 32, a2), _mm512_storeu_ps(o[0] + 48, a3);
    if (nq > 1) _mm512_storeu_ps(o[1], b0), _mm512_storeu_ps(o[1] + 16, b1),
        _mm512_storeu_ps(o[1] + 32, b2), _mm512_storeu_ps(o[1] + 48, b3);
    if (nq > 2) _mm512_storeu_ps(o[2], c0), _mm512_storeu_ps(o[2] + 16, c1),
        _mm512_storeu_ps(o[2] + 32, c2), _mm512_storeu_ps(o[2] + 48, c3);
    if (nq > 3) _mm512_storeu_ps(o[3], d0), _mm512_storeu_ps(o[3] + 16, d1),
        _mm512_storeu_ps(o[3] + 32, d2), _mm512_storeu_ps(o[3] + 48, d3);
}

/* axpys_rows4 with nq == 4 compiled on its own (the common group). */
#define AXPYS_ROWS(o, sc, inv, nq, pool, pages, stride, off, tile, t0, nt)                   \
    do {                                                                                     \
        if ((nq) == 4) axpys_rows4(o, sc, inv, 4, pool, pages, stride, off, tile, t0, nt);   \
        else axpys_rows4(o, sc, inv, nq, pool, pages, stride, off, tile, t0, nt);            \
    } while (0)

/* axpys_rows4 for a half head (n == 32: two zmm per query), the V side of
 * a long decode step split by head elements across threads (cpu_backend.c,
 * "split decode"): the same weights (sc * inv, 16 at a time), the same fma
 * per element per row in row order, the same zero skip, so each element
 * is the full-head kernels' bits. tile[r] is row t0 + r, widened or read. */
static inline __attribute__((always_inline, target(TBW))) void
axpys_rows_half(float *const *o, const float *const *sc, const float *inv, int nq,
                const float *const *tile, int t0, int nt) {
    __m512 a[4][2];
    for (int k = 0; k < nq; k++)
        a[k][0] = _mm512_loadu_ps(o[k]), a[k][1] = _mm512_loadu_ps(o[k] + 16);
    float w[4][W_CHUNK] __attribute__((aligned(64)));
    for (int c = 0; c < nt; c += W_CHUNK) {
        const int cn = nt - c < W_CHUNK ? nt - c : W_CHUNK;
        const __mmask16 zero = chunk_weights(w, sc, inv, nq, t0 + c, cn);
        for (int i = 0; i < cn; i++) {
            const float *row = tile[c + i];
            const __m512 v0 = _mm512_loadu_ps(row), v1 = _mm512_loadu_ps(row + 16);
            for (int k = 0; k < nq; k++) {
                if (zero && sc[k][t0 + c + i] == 0.0f) continue;
                const __m512 wv = _mm512_set1_ps(w[k][i]);
                a[k][0] = _mm512_fmadd_ps(wv, v0, a[k][0]);
                a[k][1] = _mm512_fmadd_ps(wv, v1, a[k][1]);
            }
        }
    }
    for (int k = 0; k < nq; k++)
        _mm512_storeu_ps(o[k], a[k][0]), _mm512_storeu_ps(o[k] + 16, a[k][1]);
}

/* A half head's V side for a block: rows V_TILE at a time (fp16 ones
 * widened once for all queries), 4 queries at a time. */
#define V_TILE_HALF 64
static inline __attribute__((always_inline, target(TBW))) void
axpys_block_half(float *const *o, const float *const *scores, const float *inv, int nq,
                 const void *pool, int f16, const int32_t *pages, int n_rows, size_t stride,
                 size_t off) {
    float buf[V_TILE_HALF][32] __attribute__((aligned(64)));
    const float *tile[V_TILE_HALF];
    for (int t0 = 0; t0 < n_rows; t0 += V_TILE_HALF) {
        const int nt = n_rows - t0 < V_TILE_HALF ? n_rows - t0 : V_TILE_HALF;
        for (int r = 0; r < nt; r++) {
            if (t0 + r + K_PREFETCH_ROWS < n_rows)
                prefetch_kv_row(pool, f16, pages, t0 + r + K_PREFETCH_ROWS, stride, off, 32);
            if (f16) {
                widen16(buf[r], cpu_kv_paged_row_f16(pool, pages, t0 + r, stride, off), 32);
                tile[r] = buf[r];
            } else {
                tile[r] = cpu_kv_paged_row(pool, pages, t0 + r, stride, off);
            }
        }
        for (int k = 0; k < nq; k += 4) {
            const int g = nq - k < 4 ? nq - k : 4;
            if (g == 4) axpys_rows_half(o + k, scores + k, inv + k, 4, tile, t0, nt);
            else axpys_rows_half(o + k, scores + k, inv + k, g, tile, t0, nt);
        }
    }
}

static __attribute__((target(TBW))) void kv_axpys_block_avx512(float *const *o,
                                                              const float *const *scores,
                                                              const float *inv, int nq,
                                                              const float *pool,
                                                              const int32_t *pages, int n_rows,
                                                              size_t stride, size_t off, int n) {
    if (n == 32) {
        axpys_block_half(o, scores, inv, nq, pool, 0, pages, n_rows, stride, off);
        return;
    }
    for (int k = 0; k < nq; k += 4) {
        int g = nq - k < 4 ? nq - k : 4;
        if (n == 64)
            AXPYS_ROWS(o + k, scores + k, inv + k, g, pool, pages, stride, off, NULL, 0, n_rows);
        else /* the general path: quant_impl.h's per-query kernel of this set */
            for (int j = 0; j < g; j++)
                cpu_active_kernels()->kv_axpys(o[k + j], scores[k + j], inv[k + j], pool, pages,
                                               n_rows, stride, off, n);
    }
}

/* The fp16 pool's V side: each tile of V_TILE rows (16 KB) is widened to
 * fp32 once (exact) for the whole block, then every group of 4 queries
 * runs the fp32 loop above on it, so each output element is the same fma
 * chain, in row order, as the fp32 kernels on the widened rows (and as
 * vec_avx2.c's fp16 kernels: an elementwise chain does not depend on the
 * vector width). Since fp16 became the default cache this is the V side
 * of every AVX-512 attention pass of more than one query. */
#define V_TILE 64
static __attribute__((target(TBW))) void kv_axpys_block_f16_avx512(
    float *const *o, const float *const *scores, const float *inv, int nq, const uint16_t *pool,
    const int32_t *pages, int n_rows, size_t stride, size_t off, int n) {
    if (n == 32) {
        axpys_block_half(o, scores, inv, nq, pool, 1, pages, n_rows, stride, off);
        return;
    }
    if (n != 64) {
        for (int k = 0; k < nq; k++)
            cpu_active_kernels()->kv_axpys_f16(o[k], scores[k], inv[k], pool, pages, n_rows,
                                               stride, off, n);
        return;
    }
    float tile[V_TILE][64] __attribute__((aligned(64))); /* whole lines: no split loads */
    for (int t0 = 0; t0 < n_rows; t0 += V_TILE) {
        int nt = n_rows - t0 < V_TILE ? n_rows - t0 : V_TILE;
        for (int r = 0; r < nt; r++) {
            if (t0 + r + K_PREFETCH_ROWS < n_rows) { /* the K side's prefetch, for V */
                const char *p =
                    (const char *)cpu_kv_paged_row_f16(pool, pages, t0 + r + K_PREFETCH_ROWS, stride, off);
                _mm_prefetch(p, _MM_HINT_T0);
                _mm_prefetch(p + 64, _MM_HINT_T0);
            }
            widen16(tile[r], cpu_kv_paged_row_f16(pool, pages, t0 + r, stride, off), 64);
        }
        for (int k = 0; k < nq; k += 4) {
            int g = nq - k < 4 ? nq - k : 4;
            AXPYS_ROWS(o + k, scores + k, inv + k, g, NULL, pages, stride, off,
                        (const float(*)[64])tile, t0, nt);
        }
    }
}

/* ---- softmax (quant_impl.h softmax_exp) ---------------------------------- */

/* vec_avx2.c's exp_avx2 on 16 lanes: the same definition (vec_exp.h), and
 * elementwise IEEE operations, so each lane gets the AVX2 kernel's bits. */
CPU_DEFINE_EXP(exp512, 512, _mm512_roundscale_ps, __attribute__((always_inline, target(TBW))))

/* acc[0] lane l += b[i + l], acc[1] lane l += b[i + 8 + l] for i = 0, 16,
 * ... < m (m a multiple of 16): vec_avx2.c's sum16_pd with its four 4-wide
 * accumulators as two 8-wide ones, the same adds per lane. */
static inline __attribute__((always_inline, target(TBW))) void sum16_pd512(const float *b, int m,
                                                                          __m512d acc[2]) {
    for (int i = 0; i < m; i += 16) {
        acc[0] = _mm512_add_pd(acc[0], _mm512_cvtps_pd(_mm256_loadu_ps(b + i)));
        acc[1] = _mm512_add_pd(acc[1], _mm512_cvtps_pd(_mm256_loadu_ps(b + i + 8)));
    }
}

/* The AVX2 set's kernels, which this set keeps for head sizes that are not
 * a multiple of 16 and for SwiGLU's tail (cpu_vec_avx512 saves them before
 * replacing). */
static cpu_kernel_set avx2_k;

/* ---- SwiGLU (quant_impl.h swiglu) ---------------------------------------- */

/* vec_avx2.c's swiglu_avx2 16 lanes at a time: the same exp and the same
 * IEEE operations per lane, so the same bits; the last n % 16 go to the
 * AVX2 kernel, which then takes the same elements to its vector loop and
 * its scalar tail as it would over the whole array. On the Cascade Lake VM
 * 7,680 values (a 5-token verify's layer) take 9.7 us against 14.9. */
static __attribute__((target(TBW))) void swiglu_avx512(float *out, const float *gate,
                                                       const float *up, size_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 g = _mm512_loadu_ps(gate + i);
        /* -g as vec_avx2.c makes it: the sign bit flipped (avx512f has no
         * float xor; the integer one is the same bits) */
        const __m512 e =
            exp512(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), sign)));
        const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
    }
    if (i < n) avx2_k.swiglu(out + i, gate + i, up + i, n - i);
}

#define SQUEEZE_CHUNK 256 /* a multiple of 16, as vec_avx2.c's */

/* vec_avx2.c's softmax_exp_avx2 (read its comment: the sum runs over the
 * non-zero values in order, the k-th into lane k % 16, in double), 16 rows
 * at a time, with vcompressps doing its table-driven squeeze. The values
 * and the sum are the AVX2 kernel's bits. */
static __attribute__((target(TBW))) double softmax_exp_avx512(float *s, int n, float max) {
    const __m512 mv = _mm512_set1_ps(max), ninf = _mm512_set1_ps(-INFINITY);
    float buf[SQUEEZE_CHUNK + 16] __attribute__((aligned(64)));
    __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    int m = 0;
    for (int r = 0; r < n; r += 16) {
        const __mmask16 in = n - r >= 16 ? 0xFFFF : (__mmask16)((1u << (n - r)) - 1);
        /* lanes past n read as -inf, whose exp is 0 */
        const __m512 x = _mm512_mask_loadu_ps(ninf, in, s + r);
        const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, ninf, _CMP_NEQ_UQ),
                                             exp512(_mm512_sub_ps(x, mv)));
        _mm512_mask_storeu_ps(s + r, in, e);
        const __mmask16 nz = _mm512_cmp_ps_mask(e, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        if (nz == 0xFFFF && m == 0) {
            /* 16 visible values with none pending: value l is the k-th
             * visible with k % 16 == l, so it goes to lane l directly, as
             * sum16_pd512 would add it from buf (the common case: a prompt's
             * rows before its query block are all visible) */
            acc[0] = _mm512_add_pd(acc[0], _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
            acc[1] = _mm512_add_pd(acc[1], _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
            continue;
        }
        _mm512_mask_compressstoreu_ps(buf + m, nz, e);
        m += __builtin_popcount((unsigned)nz);
        if (m >= SQUEEZE_CHUNK) {
            sum16_pd512(buf, SQUEEZE_CHUNK, acc);
            m -= SQUEEZE_CHUNK;
            memmove(buf, buf + SQUEEZE_CHUNK, sizeof(float) * (size_t)m);
        }
    }
    /* zeros up to a multiple of 16 add nothing (x + 0 = x) */
    const int m16 = (m + 15) & ~15;
    for (int i = m; i < m16; i++) buf[i] = 0.0f;
    sum16_pd512(buf, m16, acc);
    /* the AVX2 kernel's final order: (acc0 + acc1) + (acc2 + acc3), then
     * the two halves, then the two lanes */
    const __m256d a = _mm256_add_pd(
        _mm256_add_pd(_mm512_castpd512_pd256(acc[0]), _mm512_extractf64x4_pd(acc[0], 1)),
        _mm256_add_pd(_mm512_castpd512_pd256(acc[1]), _mm512_extractf64x4_pd(acc[1], 1)));
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

/* ---- attention's K side (quant_impl.h kv_dots, kv_dots_block, f16) ------ */

/* The AVX2 set's dot (vec_avx2.c's kv_dot_avx2, dots4_avx2) keeps two
 * 8-lane FMA chains per row, a0 over elements d..d+7 and a1 over
 * d+8..d+15 for d = 0, 16, 32 ..., and returns hsum8(a0 + a1). One zmm
 * chain over d in steps of 16 holds exactly a0 in lanes 0-7 and a1 in
 * lanes 8-15 (the same fmas, in the same order), so the sums below are
 * bitwise the AVX2 set's, with half the fma instructions and every K row
 * element loaded once per query instead of twice. */
static inline __attribute__((always_inline, target(TBW))) __m256 half_sum(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
}

/* hsum8 of 4 rows' (a0 + a1), with dots4_avx2's network (vec_hsum.h). */
static inline __attribute__((always_inline, target(TBW))) __m128 reduce4(__m512 a0, __m512 a1,
                                                                        __m512 a2, __m512 a3) {
    return cpu_hsum8x4(half_sum(a0), half_sum(a1), half_sum(a2), half_sum(a3));
}


/* The 16 dots of 4 queries x 4 rows in one zmm: a[4 * i + k] is the chain
 * of query k with row i, and the result's quarter k (lanes 4k .. 4k+3) is
 * query k's 4 scores [row 0, row 1, row 2, row 3]. Each score is
 * hsum8(half_sum(chain)) with reduce4's pairs, in its order (see
 * vec_hsum.h), but 16 chains share every shuffle: 45 vector operations
 * instead of 4 x 24 for reduce4 (perf had reduce4's chain at half of the
 * K side's samples on a 2,000-token prefill).
 *   1. u_j = lane j + lane j+8 (half_sum) for two chains per vector;
 *   2. t_j = u_j + u_{j+4}: one chain per 128-bit quarter;
 *   3. t_0 + t_2 and t_1 + t_3 of two chains per quarter;
 *   4. (t_0 + t_2) + (t_1 + t_3) of four chains per quarter. */
static inline __attribute__((always_inline, target(TBW))) __m512 reduce16(const __m512 *a) {
    __m512 u[8], t[4], w[2];
    for (int i = 0; i < 8; i++) /* [A.u0-3 | A.u4-7 | B.u0-3 | B.u4-7] */
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++) /* quarter m: t0..t3 of chain 4i + m */
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++) /* quarter m: [t0+t2, t1+t3] of chains 8i+m, 8i+4+m */
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* quarter m: the sums of chains m, 4+m, 8+m, 12+m */
    return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* vec_avx2.c's dots_paged for heads of n % 16 == 0 (n <= 256 with f16):
 * rows 4 at a time (fp16 ones widened once into buf for all the queries),
 * each query's 4 dots in 4 zmm chains; 4 queries' 16 chains reduced at
 * once (reduce16), the rest of the queries one by one (reduce4); the
 * leftover rows take this set's kv_dot on the (widened) row, as
 * dots_paged does. always_inline: a copy per caller with f16 fixed. */
static inline __attribute__((always_inline, target(TBW))) void
dots_paged512(const float *const *q, int nq, const void *pool, int f16, const int32_t *pages,
              int n_rows, size_t stride, size_t off, int n, float scale, float *const *scores,
              float *maxs) {
    float buf[4][CPU_KV_F16_MAX_HEAD] __attribute__((aligned(64)));
    const float *rows[4];
    const __m128 sv = _mm_set1_ps(scale);
    __m128 mv[CPU_ATTN_MAXQ];
    for (int k = 0; k < nq; k++) mv[k] = _mm_set1_ps(maxs[k]);
    /* the partial maxima of the 4-query groups: quarter j is query 4g+j's
     * 4 lanes, each kept exactly as mv[] keeps them */
    const __m512 svz = _mm512_set1_ps(scale);
    __m512 mvz[CPU_ATTN_MAXQ / 4];
    for (int k = 0; k + 4 <= nq; k += 4)
        mvz[k / 4] = _mm512_setr_ps(maxs[k], maxs[k], maxs[k], maxs[k], maxs[k + 1], maxs[k + 1],
                                    maxs[k + 1], maxs[k + 1], maxs[k + 2], maxs[k + 2],
                                    maxs[k + 2], maxs[k + 2], maxs[k + 3], maxs[k + 3],
                                    maxs[k + 3], maxs[k + 3]);
    int r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        for (int i = 0; i < 4 && r + K_PREFETCH_ROWS + i < n_rows; i++)
            prefetch_kv_row(pool, f16, pages, r + K_PREFETCH_ROWS + i, stride, off, n);
        for (int i = 0; i < 4; i++) {
            if (f16) {
                widen16(buf[i], cpu_kv_paged_row_f16(pool, pages, r + i, stride, off), n);
                rows[i] = buf[i];
            } else {
                rows[i] = cpu_kv_paged_row(pool, pages, r + i, stride, off);
            }
        }
        int k = 0;
        for (; k + 4 <= nq; k += 4) { /* 4 queries at a time: one reduce16 */
            __m512 a[16];
            for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
            for (int d = 0; d < n; d += 16) {
                const __m512 r0v = _mm512_loadu_ps(rows[0] + d), r1v = _mm512_loadu_ps(rows[1] + d),
                             r2v = _mm512_loadu_ps(rows[2] + d), r3v = _mm512_loadu_ps(rows[3] + d);
                for (int j = 0; j < 4; j++) {
                    const __m512 qv = _mm512_loadu_ps(q[k + j] + d);
                    a[j] = _mm512_fmadd_ps(qv, r0v, a[j]);
                    a[4 + j] = _mm512_fmadd_ps(qv, r1v, a[4 + j]);
                    a[8 + j] = _mm512_fmadd_ps(qv, r2v, a[8 + j]);
                    a[12 + j] = _mm512_fmadd_ps(qv, r3v, a[12 + j]);
                }
            }
            const __m512 sc = _mm512_mul_ps(reduce16(a), svz);
            _mm_storeu_ps(scores[k] + r, _mm512_castps512_ps128(sc));
            _mm_storeu_ps(scores[k + 1] + r, _mm512_extractf32x4_ps(sc, 1));
            _mm_storeu_ps(scores[k + 2] + r, _mm512_extractf32x4_ps(sc, 2));
            _mm_storeu_ps(scores[k + 3] + r, _mm512_extractf32x4_ps(sc, 3));
            mvz[k / 4] = _mm512_max_ps(sc, mvz[k / 4]); /* as mv[k] below, lane by lane */
        }
        for (; k < nq; k++) {
            const float *qk = q[k];
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < n; d += 16) {
                const __m512 qv = _mm512_loadu_ps(qk + d);
                a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows[0] + d), a0);
                a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows[1] + d), a1);
                a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows[2] + d), a2);
                a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows[3] + d), a3);
            }
            const __m128 sc = _mm_mul_ps(reduce4(a0, a1, a2, a3), sv);
            _mm_storeu_ps(scores[k] + r, sc);
            mv[k] = _mm_max_ps(sc, mv[k]); /* a NaN score never becomes the max */
        }
    }
    for (int k = 0; k + 4 <= nq; k += 4) {
        mv[k] = _mm512_castps512_ps128(mvz[k / 4]);
        mv[k + 1] = _mm512_extractf32x4_ps(mvz[k / 4], 1);
        mv[k + 2] = _mm512_extractf32x4_ps(mvz[k / 4], 2);
        mv[k + 3] = _mm512_extractf32x4_ps(mvz[k / 4], 3);
    }
    for (int k = 0; k < nq; k++) {
        float m4[4];
        _mm_storeu_ps(m4, mv[k]);
        for (int i = 0; i < 4; i++)
            if (m4[i] > maxs[k]) maxs[k] = m4[i];
    }
    const cpu_kernel_set *ks = cpu_active_kernels();
    for (; r < n_rows; r++) {
        const float *row;
        if (f16) {
            widen16(buf[0], cpu_kv_paged_row_f16(pool, pages, r, stride, off), n);
            row = buf[0];
        } else {
            row = cpu_kv_paged_row(pool, pages, r, stride, off);
        }
        for (int k = 0; k < nq; k++) {
            float sc = ks->kv_dot(q[k], row, 0, n) * scale;
            scores[k][r] = sc;
            if (sc > maxs[k]) maxs[k] = sc; /* the caller starts it at -inf */
        }
    }
}

/* ---- the K side with queries in lanes (query blocks of QLANES_MIN+) ------
 *
 * dots_paged512 keeps each dot in one zmm whose lanes are head elements, so
 * every score costs a horizontal sum: reduce16's 45 shuffles and adds per
 * 16 scores, beside the 64 fmas. With a block's queries in the lanes
 * instead (qt[d] = element d of queries 0..15), one zmm fma advances the
 * same chain for 16 queries, and the horizontal network becomes lane-wise
 * adds: per key, chain (h, j) (j = 0..7, h = 0, 1) is the AVX2 set's lane j
 * of a0 (h = 0: elements 16c + j) or a1 (h = 1: 16c + 8 + j), an fma per
 * c = 0, 1, ... from zero; then u_j = a0_j + a1_j, t_j = u_j + u_{j+4},
 * score = (t_0 + t_2) + (t_1 + t_3): hsum8(a0 + a1)'s pairs, operation for
 * operation, so the scores are the other kernels' bits (test_backend_ops
 * compares them). The key's elements come in as broadcasts from memory
 * (an fma's own load), QL_KEYS keys share each qt load, and 16 keys' scores
 * are transposed in registers into the per-query score rows.
 *
 * More than 16 queries (a prompt block of 16 tokens with its KV head's 3
 * query heads) are sets of 16 lanes that take each 16-key tile in turn
 * while it is in L1: a K row is widened from fp16 once for all of them. */
#define QLANES_MIN 12 /* fewer queries leave too many lanes idle */
#define QL_SETS (CPU_ATTN_MAXQ / 16)
/* Measured (Cascade Lake, one thread, 16 queries over 1,500 cached fp16
 * rows of 64, min of 8 alternated runs): 2.07 ns a score, against 2.44
 * for dots_paged512. Sets sharing one broadcast (3 sets x 2 keys, 3 x 4)
 * measured no faster than sets in turn: the chains' registers spill. */
#define QL_KEYS 4

/* acc[x] = chain dd of key x (the fmas over elements 16c + dd, from zero) */
static inline __attribute__((always_inline, target(TBW))) void
ql_chains(const float (*qt)[16], const float *const *kr, int dd, int nc, __m512 *acc) {
    for (int x = 0; x < QL_KEYS; x++) acc[x] = _mm512_setzero_ps();
    for (int c = 0; c < nc; c++) {
        const __m512 qv = _mm512_load_ps(qt[16 * c + dd]);
        for (int x = 0; x < QL_KEYS; x++)
            acc[x] = _mm512_fmadd_ps(qv, _mm512_set1_ps(kr[x][16 * c + dd]), acc[x]);
    }
}

/* t_j = (a0_j + a1_j) + (a0_{j+4} + a1_{j+4}) of QL_KEYS keys */
static inline __attribute__((always_inline, target(TBW))) void
ql_t(const float (*qt)[16], const float *const *kr, int j, int nc, __m512 *t) {
    __m512 a[QL_KEYS], b[QL_KEYS], u[QL_KEYS];
    ql_chains(qt, kr, j, nc, a);
    ql_chains(qt, kr, 8 + j, nc, b);
    for (int x = 0; x < QL_KEYS; x++) u[x] = _mm512_add_ps(a[x], b[x]);
    ql_chains(qt, kr, 4 + j, nc, a);
    ql_chains(qt, kr, 12 + j, nc, b);
    for (int x = 0; x < QL_KEYS; x++) t[x] = _mm512_add_ps(u[x], _mm512_add_ps(a[x], b[x]));
}

/* out[k] = column k of the 16 x 16 matrix in rows m[0..15] */
static inline __attribute__((always_inline, target(TBW))) void transpose16(const __m512 *m,
                                                                          __m512 *out) {
    __m512 a[16], b[16];
    for (int i = 0; i < 16; i += 2) { /* pairs of rows interleaved per 128-bit lane */
        a[i] = _mm512_unpacklo_ps(m[i], m[i + 1]);
        a[i + 1] = _mm512_unpackhi_ps(m[i], m[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* 4 x 4 blocks transposed per 128-bit lane */
        b[i] = _mm512_shuffle_ps(a[i], a[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        b[i + 1] = _mm512_shuffle_ps(a[i], a[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        b[i + 2] = _mm512_shuffle_ps(a[i + 1], a[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        b[i + 3] = _mm512_shuffle_ps(a[i + 1], a[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    /* b[4g + p], 128-bit lane l: column 4l + p of rows 4g .. 4g+3; gather
     * the four lanes l of the four groups */
    for (int p = 0; p < 4; p++) {
        const __m512 x0 = _mm512_shuffle_f32x4(b[p], b[4 + p], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 x1 = _mm512_shuffle_f32x4(b[8 + p], b[12 + p], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 y0 = _mm512_shuffle_f32x4(b[p], b[4 + p], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512 y1 = _mm512_shuffle_f32x4(b[8 + p], b[12 + p], _MM_SHUFFLE(3, 1, 3, 1));
        out[p] = _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
        out[8 + p] = _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
        out[4 + p] = _mm512_shuffle_f32x4(y0, y1, _MM_SHUFFLE(2, 0, 2, 0));
        out[12 + p] = _mm512_shuffle_f32x4(y0, y1, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* dots_paged512's contract for nq <= 16 * ns queries (ns sets, the last
 * padded with zero queries whose scores are dropped), n a multiple of 16
 * up to CPU_KV_F16_MAX_HEAD, computed with the queries in lanes.
 * always_inline: a copy per caller with f16 fixed, and one with n == 64. */
static inline __attribute__((always_inline, target(TBW))) void
dots_qlanes(const float *const *q, int nq, const void *pool, int f16, const int32_t *pages,
            int n_rows, size_t stride, size_t off, int n, float scale, float *const *scores,
            float *maxs) {
    static const float zero_row[CPU_KV_F16_MAX_HEAD] __attribute__((aligned(64)));
    float qt[QL_SETS][CPU_KV_F16_MAX_HEAD][16] __attribute__((aligned(64)));
    float kbuf[16][CPU_KV_F16_MAX_HEAD] __attribute__((aligned(64)));
    const int ns = (nq + 15) / 16;
    const int nc = n / 16;
    /* qt[s][16c + k][l] = q[16s + l][16c + k]: 16 x 16 blocks transposed in
     * registers (element by element this was ~45% of the kernel's time for
     * a tree's 15 queries over 64 cached rows, one thread, Cascade Lake) */
    for (int s = 0; s < ns; s++)
        for (int c = 0; c < nc; c++) {
            __m512 m[16], col[16];
            for (int l = 0; l < 16; l++)
                m[l] = 16 * s + l < nq ? _mm512_loadu_ps(q[16 * s + l] + 16 * c)
                                       : _mm512_setzero_ps();
            transpose16(m, col);
            for (int k = 0; k < 16; k++) _mm512_store_ps(qt[s][16 * c + k], col[k]);
        }
    const __m512 svz = _mm512_set1_ps(scale);
    __m512 mv[QL_SETS];
    for (int s = 0; s < ns; s++) {
        const int in = nq - 16 * s < 16 ? nq - 16 * s : 16;
        mv[s] = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), (__mmask16)((1u << in) - 1),
                                     maxs + 16 * s);
    }
    for (int r = 0; r < n_rows; r += 16) {
        const int nr = n_rows - r < 16 ? n_rows - r : 16;
        for (int i = K_PREFETCH_ROWS; i < K_PREFETCH_ROWS + 16 && r + i < n_rows; i++)
            prefetch_kv_row(pool, f16, pages, r + i, stride, off, n);
        const float *kr[16];
        for (int i = 0; i < 16; i++) {
            if (i >= nr) {
                kr[i] = zero_row; /* scores made and dropped */
            } else if (f16) {
                widen16(kbuf[i], cpu_kv_paged_row_f16(pool, pages, r + i, stride, off), n);
                kr[i] = kbuf[i];
            } else {
                kr[i] = cpu_kv_paged_row(pool, pages, r + i, stride, off);
            }
        }
        const __mmask16 rm = (__mmask16)((1u << nr) - 1);
        for (int s = 0; s < ns; s++) {
            const float(*qs)[16] = (const float(*)[16])qt[s];
            __m512 sv[16];
            for (int i = 0; i < 16; i += QL_KEYS) {
                __m512 t0[QL_KEYS], t1[QL_KEYS], t2[QL_KEYS], t3[QL_KEYS];
                ql_t(qs, kr + i, 0, nc, t0);
                ql_t(qs, kr + i, 2, nc, t2);
                ql_t(qs, kr + i, 1, nc, t1);
                ql_t(qs, kr + i, 3, nc, t3);
                for (int x = 0; x < QL_KEYS; x++) {
                    sv[i + x] = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(t0[x], t2[x]),
                                                            _mm512_add_ps(t1[x], t3[x])),
                                              svz);
                    if (i + x < nr) mv[s] = _mm512_max_ps(sv[i + x], mv[s]); /* NaN never the max */
                }
            }
            __m512 col[16];
            transpose16(sv, col);
            for (int k = 16 * s; k < nq && k < 16 * s + 16; k++)
                _mm512_mask_storeu_ps(scores[k] + r, rm, col[k - 16 * s]);
        }
    }
    for (int s = 0; s < ns; s++) {
        float m16[16];
        _mm512_storeu_ps(m16, mv[s]);
        for (int k = 16 * s; k < nq && k < 16 * s + 16; k++)
            if (m16[k - 16 * s] > maxs[k]) maxs[k] = m16[k - 16 * s];
    }
}

/* The K side of a block: queries in lanes when there are enough of them. */
static inline __attribute__((always_inline, target(TBW))) void
dots_block512(const float *const *q, int nq, const void *pool, int f16, const int32_t *pages,
              int n_rows, size_t stride, size_t off, int n, float scale, float *const *scores,
              float *maxs) {
    if (nq < QLANES_MIN)
        dots_paged512(q, nq, pool, f16, pages, n_rows, stride, off, n, scale, scores, maxs);
    else if (n == 64)
        dots_qlanes(q, nq, pool, f16, pages, n_rows, stride, off, 64, scale, scores, maxs);
    else
        dots_qlanes(q, nq, pool, f16, pages, n_rows, stride, off, n, scale, scores, maxs);
}

static __attribute__((target(TBW))) void kv_dots_block_avx512(const float *const *q, int nq,
                                                             const float *pool,
                                                             const int32_t *pages, int n_rows,
                                                             size_t stride, size_t off, int n,
                                                             float scale, float *const *scores,
                                                             float *maxs) {
    if (n % 16) {
        avx2_k.kv_dots_block(q, nq, pool, pages, n_rows, stride, off, n, scale, scores, maxs);
        return;
    }
    dots_block512(q, nq, pool, 0, pages, n_rows, stride, off, n, scale, scores, maxs);
}

static __attribute__((target(TBW))) float kv_dots_avx512(const float *q, const float *pool,
                                                        const int32_t *pages, int n_rows,
                                                        size_t stride, size_t off, int n,
                                                        float scale, float *scores) {
    if (n % 16) return avx2_k.kv_dots(q, pool, pages, n_rows, stride, off, n, scale, scores);
    float m = -INFINITY;
    dots_paged512(&q, 1, pool, 0, pages, n_rows, stride, off, n, scale, &scores, &m);
    return m;
}

static __attribute__((target(TBW))) void kv_dots_block_f16_avx512(
    const float *const *q, int nq, const uint16_t *pool, const int32_t *pages, int n_rows,
    size_t stride, size_t off, int n, float scale, float *const *scores, float *maxs) {
    if (n % 16 || n > CPU_KV_F16_MAX_HEAD) {
        avx2_k.kv_dots_block_f16(q, nq, pool, pages, n_rows, stride, off, n, scale, scores, maxs);
        return;
    }
    dots_block512(q, nq, pool, 1, pages, n_rows, stride, off, n, scale, scores, maxs);
}

static __attribute__((target(TBW))) float kv_dots_f16_avx512(const float *q, const uint16_t *pool,
                                                            const int32_t *pages, int n_rows,
                                                            size_t stride, size_t off, int n,
                                                            float scale, float *scores) {
    if (n % 16 || n > CPU_KV_F16_MAX_HEAD)
        return avx2_k.kv_dots_f16(q, pool, pages, n_rows, stride, off, n, scale, scores);
    float m = -INFINITY;
    dots_paged512(&q, 1, pool, 1, pages, n_rows, stride, off, n, scale, &scores, &m);
    return m;
}

void cpu_vec_avx512(cpu_kernel_set *ks) {
    avx2_k = *ks;
    ks->kv_axpys_block = kv_axpys_block_avx512;
    ks->kv_axpys_block_f16 = kv_axpys_block_f16_avx512;
    ks->kv_dots_block = kv_dots_block_avx512;
    ks->kv_dots = kv_dots_avx512;
    ks->kv_dots_block_f16 = kv_dots_block_f16_avx512;
    ks->kv_dots_f16 = kv_dots_f16_avx512;
    ks->softmax_exp = softmax_exp_avx512;
    ks->swiglu = swiglu_avx512;
}

#else
void cpu_vec_avx512(cpu_kernel_set *ks) { (void)ks; }
#endif
