/* vec_avx2.c - AVX2 elementwise kernels: SwiGLU (the FFN's silu(gate) * up,
 * 46k exponentials per token on the default model, a serial step between
 * matmuls that libm's scalar expf made visible at decode).
 *
 * exp(x) = 2^n * e^r with n = round(x / ln 2) and r = x - n ln 2 (ln 2 split
 * in a high part exact in float and a low part), e^r by a degree-6
 * polynomial (Cephes' expf coefficients), 2^n built in the exponent bits.
 * x is clamped to [-87.3, 88.7], where the result stays normal; silu needs no
 * more (silu(g) = g / (1 + e^-g) is -0 or g itself beyond). Error: within 2
 * ulp of expf (test_backend_ops compares the op with the scalar twin). */
#include <string.h>

#include "common/spec/sampling.h"
#include "quant_impl.h"
#include "vec_exp.h"
#include "vec_hsum.h"


#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define TAVX2 __attribute__((target("avx2,fma")))

CPU_DEFINE_EXP(exp_avx2, 256, _mm256_round_ps, TAVX2)

static TAVX2 void swiglu_avx2(float *out, const float *gate, const float *up, size_t n) {
    size_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp_avx2(_mm256_xor_ps(g, neg));
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) out[i] = cpu_swiglu_scalar_one(gate[i], up[i]);
}

/* Attention's inner loops over one KV row (fp32 or fp16 cache): q . row and
 * o += w * row. The dot's reduction order is fixed (two 8-lane FMA chains
 * over alternating chunks, their sum, one lane tree, then the tail), so a
 * query's scores depend only on the rows it sees, never on the batch. */
static inline TAVX2 float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define TAVX2F16 __attribute__((target("avx2,fma,f16c")))

static TAVX2F16 float kv_dot_avx2(const float *q, const void *row, int f16, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int d = 0;
    if (f16) {
        const uint16_t *r = row;
        for (; d + 16 <= n; d += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d),
                                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + d))), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8),
                                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + d + 8))), a1);
        }
        float s = hsum8(_mm256_add_ps(a0, a1));
        for (; d < n; d++) s += q[d] * _cvtsh_ss(r[d]);
        return s;
    }
    const float *r = row;
    for (; d + 16 <= n; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(r + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(r + d + 8), a1);
    }
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; d < n; d++) s += q[d] * r[d];
    return s;
}

static TAVX2F16 void kv_axpy_avx2(float *o, float w, const void *row, int f16, int n) {
    const __m256 wv = _mm256_set1_ps(w);
    int d = 0;
    if (f16) {
        const uint16_t *r = row;
        for (; d + 8 <= n; d += 8)
            _mm256_storeu_ps(o + d, _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128(
                                                           (const __m128i *)(r + d))),
                                                    _mm256_loadu_ps(o + d)));
        for (; d < n; d++) o[d] += w * _cvtsh_ss(r[d]);
        return;
    }
    const float *r = row;
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(o + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(r + d), _mm256_loadu_ps(o + d)));
    for (; d < n; d++) o[d] += w * r[d];
}

/* s[r] = exp(s[r] - max) for r < n, -inf (a masked row) giving exactly 0;
 * returns the sum. Each row's value is the vector exp's whatever its lane
 * (the tail runs through the same vector code), and the exp is clamped to
 * normal numbers, so only masked rows are 0.
 *
 * The sum must not depend on where masked rows sit: a tree node's row set
 * is the committed rows, then its ancestors among masked siblings, while
 * the same token decoded plainly sees the same values with no gaps. So the
 * sum skips zeros and runs over the visible values in order, in double:
 * the k-th visible value goes to lane k % 16 of four 4-wide double
 * accumulators, summed in a fixed order at the end. (It used to be one
 * serial double add per row, 4 cycles each: 0.3 ms a token of a
 * 3000-token prompt.) Zeros are squeezed out 8 rows at a time by a
 * permutation from a table indexed by the non-zero mask. */
static int32_t squeeze_lut[256][8]; /* set lanes of the mask first */

static void squeeze_lut_init(void) {
    for (int m = 0; m < 256; m++) {
        int k = 0;
        for (int l = 0; l < 8; l++)
            if (m >> l & 1) squeeze_lut[m][k++] = l;
        while (k < 8) squeeze_lut[m][k++] = 0;
    }
}

static inline TAVX2 __m256 exp_shifted(__m256 x, __m256 mv) {
    const __m256 e = exp_avx2(_mm256_sub_ps(x, mv));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), e);
}

/* Appends e's non-zero lanes, in lane order, at buf + m; returns the new m.
 * Writes 8 floats at buf + m whatever the count. */
static inline TAVX2 int squeeze8(__m256 e, float *buf, int m) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(e, _mm256_setzero_ps(), _CMP_NEQ_UQ));
    const __m256i perm = _mm256_loadu_si256((const __m256i *)squeeze_lut[mask]);
    _mm256_storeu_ps(buf + m, _mm256_permutevar8x32_ps(e, perm));
    return m + __builtin_popcount((unsigned)mask);
}

/* acc[j] lane l += b[i + 4j + l] for i = 0, 16, ... < m (m a multiple of 16) */
static inline TAVX2 void sum16_pd(const float *b, int m, __m256d acc[4]) {
    for (int i = 0; i < m; i += 16) {
        acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm_loadu_ps(b + i)));
        acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm_loadu_ps(b + i + 4)));
        acc[2] = _mm256_add_pd(acc[2], _mm256_cvtps_pd(_mm_loadu_ps(b + i + 8)));
        acc[3] = _mm256_add_pd(acc[3], _mm256_cvtps_pd(_mm_loadu_ps(b + i + 12)));
    }
}

#define SQUEEZE_CHUNK 256 /* a multiple of 16: lane k % 16 holds across chunks */

static TAVX2 double softmax_exp_avx2(float *s, int n, float max) {
    const __m256 mv = _mm256_set1_ps(max);
    float buf[SQUEEZE_CHUNK + 16] __attribute__((aligned(32)));
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                      _mm256_setzero_pd()};
    int m = 0, r = 0;
    for (; r + 16 <= n; r += 16) {
        const __m256 e0 = exp_shifted(_mm256_loadu_ps(s + r), mv);
        const __m256 e1 = exp_shifted(_mm256_loadu_ps(s + r + 8), mv);
        _mm256_storeu_ps(s + r, e0);
        _mm256_storeu_ps(s + r + 8, e1);
        const __m256 z = _mm256_setzero_ps();
        if (m == 0 && _mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(e0, z, _CMP_NEQ_UQ),
                                                       _mm256_cmp_ps(e1, z, _CMP_NEQ_UQ))) == 0xFF) {
            /* 16 visible values with none pending: value l is the k-th
             * visible with k % 16 == l, so it goes to lane l directly, as
             * sum16_pd would add it from buf (the common case: a prompt's
             * rows before its query block are all visible) */
            acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(e0)));
            acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps(e0, 1)));
            acc[2] = _mm256_add_pd(acc[2], _mm256_cvtps_pd(_mm256_castps256_ps128(e1)));
            acc[3] = _mm256_add_pd(acc[3], _mm256_cvtps_pd(_mm256_extractf128_ps(e1, 1)));
            continue;
        }
        m = squeeze8(e0, buf, m);
        m = squeeze8(e1, buf, m);
        if (m >= SQUEEZE_CHUNK) {
            sum16_pd(buf, SQUEEZE_CHUNK, acc);
            m -= SQUEEZE_CHUNK;
            memmove(buf, buf + SQUEEZE_CHUNK, sizeof(float) * (size_t)m);
        }
    }
    for (; r + 8 <= n; r += 8) {
        const __m256 e = exp_shifted(_mm256_loadu_ps(s + r), mv);
        _mm256_storeu_ps(s + r, e);
        m = squeeze8(e, buf, m);
    }
    if (r < n) {
        float tail[8];
        for (int k = 0; k < 8; k++) tail[k] = r + k < n ? s[r + k] : -INFINITY;
        const __m256 e = exp_shifted(_mm256_loadu_ps(tail), mv); /* lanes past n: 0 */
        _mm256_storeu_ps(tail, e);
        for (int k = 0; r + k < n; k++) s[r + k] = tail[k];
        m = squeeze8(e, buf, m);
    }
    /* zeros up to a multiple of 16 add nothing (x + 0 = x) */
    int m16 = (m + 15) & ~15;
    for (int i = m; i < m16; i++) buf[i] = 0.0f;
    sum16_pd(buf, m16, acc);
    const __m256d a = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

/* q . K_r for 4 rows at once, each bitwise hsum8(a0 + a1) of kv_dot_avx2's
 * two FMA chains: the 4 horizontal sums share their shuffles
 * (vec_hsum.h). n is a multiple of 16. Returns [row 0, row 1, row 2, row 3]. */
static inline TAVX2 __m128 dots4_avx2(const float *q, const float *const *rows, int n) {
    /* the 4 rows' 8 FMA chains interleaved: independent, so they overlap */
    const float *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
           a30 = a00, a31 = a00;
    for (int d = 0; d < n; d += 16) {
        const __m256 q0 = _mm256_loadu_ps(q + d), q1 = _mm256_loadu_ps(q + d + 8);
        a00 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(r0 + d), a00);
        a01 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(r0 + d + 8), a01);
        a10 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(r1 + d), a10);
        a11 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(r1 + d + 8), a11);
        a20 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(r2 + d), a20);
        a21 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(r2 + d + 8), a21);
        a30 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(r3 + d), a30);
        a31 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(r3 + d + 8), a31);
    }
    return cpu_hsum8x4(_mm256_add_ps(a00, a01), _mm256_add_ps(a10, a11),
                       _mm256_add_ps(a20, a21), _mm256_add_ps(a30, a31));
}

/* x rounded to fp16 (F16C, to nearest even: specd_f32_to_fp16's rounding,
 * subnormals and overflow included). */
static TAVX2F16 void f32_to_f16_row_avx2(uint16_t *dst, const float *x, int n) {
    int d = 0;
    for (; d + 8 <= n; d += 8)
        _mm_storeu_si128((__m128i *)(dst + d),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + d), _MM_FROUND_TO_NEAREST_INT));
    for (; d < n; d++) dst[d] = _cvtss_sh(x[d], _MM_FROUND_TO_NEAREST_INT);
}

/* An fp16 row widened to fp32 (exact). */
static inline TAVX2F16 void widen_row(float *dst, const uint16_t *src, int n) {
    int d = 0;
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + d))));
    for (; d < n; d++) dst[d] = _cvtsh_ss(src[d]);
}

/* Decode at a long context streams the cache from memory, and one KV
 * head's slice of a row is a few lines out of every row (256 of 768 bytes
 * for SmolLM2): a stride the hardware prefetcher follows slowly. The K pass
 * (dots_paged) and the fp16 V pass ask for the row KV_PREFETCH_ROWS ahead
 * themselves. The distance must cover a DRAM miss at the pass's pace (~5
 * ns a head's row): 16 rows did not. A decode step's attention over 3,000
 * rows x 30 layers, one thread, on the Zen 5 VM (bench/kernel_ab.sh HEAD~1
 * kernels/cpu/vec_avx2.c): 0.68x the time at 64 rows with the V pass
 * prefetching, 0.85x with the V prefetch at 16 rows, no faster at 64 rows
 * without the V prefetch. Prefetches never fault, but the page table
 * lookup must stay inside the sequence. */
#define KV_PREFETCH_ROWS CPU_KV_PREFETCH_ROWS

static inline __attribute__((always_inline)) void
kv_prefetch_row(const void *pool, int f16, const int32_t *pages, int r, int n_rows,
                size_t stride, size_t off, int n) {
    if (r >= n_rows) return;
    const char *p = f16 ? (const char *)cpu_kv_paged_row_f16(pool, pages, r, stride, off)
                        : (const char *)cpu_kv_paged_row(pool, pages, r, stride, off);
    const uintptr_t end = (uintptr_t)p + (size_t)n * (f16 ? 2u : 4u) - 1;
    for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)63; a <= end; a += 64)
        _mm_prefetch((const char *)a, _MM_HINT_T0);
}

/* kv_dots_avx2 for nq queries: every query takes each group of 4 K rows
 * while it is in L1 (the group is 1 KB for a head of 64), each score
 * bitwise the per-query one. With f16 the pool holds fp16 rows, widened
 * (exactly) into buf once for all the queries; the arithmetic is then the
 * fp32 one. always_inline: each caller gets its own copy with f16 fixed. */
static inline __attribute__((always_inline)) TAVX2F16 void
dots_paged(const float *const *q, int nq, const void *pool, int f16, const int32_t *pages,
           int n_rows, size_t stride, size_t off, int n, float scale, float *const *scores,
           float *maxs) {
    float buf[4][CPU_KV_F16_MAX_HEAD] __attribute__((aligned(32)));
    const float *rows[4];
    int r = 0;
    if (n % 16 == 0) {
        const __m128 sv = _mm_set1_ps(scale);
        __m128 mv[CPU_ATTN_MAXQ];
        for (int k = 0; k < nq; k++) mv[k] = _mm_set1_ps(maxs[k]);
        for (; r + 4 <= n_rows; r += 4) {
            for (int i = 0; i < 4; i++)
                kv_prefetch_row(pool, f16, pages, r + KV_PREFETCH_ROWS + i, n_rows, stride, off, n);
            for (int i = 0; i < 4; i++) {
                if (f16) {
                    widen_row(buf[i], cpu_kv_paged_row_f16(pool, pages, r + i, stride, off), n);
                    rows[i] = buf[i];
                } else {
                    rows[i] = cpu_kv_paged_row(pool, pages, r + i, stride, off);
                }
            }
            for (int k = 0; k < nq; k++) {
                const __m128 sc = _mm_mul_ps(dots4_avx2(q[k], rows, n), sv);
                _mm_storeu_ps(scores[k] + r, sc);
                mv[k] = _mm_max_ps(sc, mv[k]); /* a NaN score never becomes the max */
            }
        }
        for (int k = 0; k < nq; k++) {
            float m4[4];
            _mm_storeu_ps(m4, mv[k]);
            for (int i = 0; i < 4; i++)
                if (m4[i] > maxs[k]) maxs[k] = m4[i];
        }
    }
    for (; r < n_rows; r++) {
        const float *row;
        if (f16) {
            widen_row(buf[0], cpu_kv_paged_row_f16(pool, pages, r, stride, off), n);
            row = buf[0];
        } else {
            row = cpu_kv_paged_row(pool, pages, r, stride, off);
        }
        for (int k = 0; k < nq; k++) {
            float sc = kv_dot_avx2(q[k], row, 0, n) * scale;
            scores[k][r] = sc;
            if (sc > maxs[k]) maxs[k] = sc; /* the caller starts it at -inf */
        }
    }
}

static TAVX2F16 void kv_dots_block_avx2(const float *const *q, int nq, const float *pool,
                                        const int32_t *pages, int n_rows, size_t stride,
                                        size_t off, int n, float scale, float *const *scores,
                                        float *maxs) {
    dots_paged(q, nq, pool, 0, pages, n_rows, stride, off, n, scale, scores, maxs);
}

/* dots_paged with one query: its scores, and their maximum returned. */
static inline TAVX2F16 __attribute__((always_inline)) float
dots_paged_one(const float *q, const void *pool, int f16, const int32_t *pages, int n_rows,
               size_t stride, size_t off, int n, float scale, float *scores) {
    float maxs = -INFINITY;
    dots_paged(&q, 1, pool, f16, pages, n_rows, stride, off, n, scale, &scores, &maxs);
    return maxs;
}

/* kv_dot_avx2 over a sequence's paged rows (quant_impl.h's kv_dots): the
 * block routine with one query. */
static TAVX2F16 float kv_dots_avx2(const float *q, const float *pool, const int32_t *pages,
                                   int n_rows, size_t stride, size_t off, int n, float scale,
                                   float *scores) {
    return dots_paged_one(q, pool, 0, pages, n_rows, stride, off, n, scale, scores);
}

/* kv_axpys_avx2 for nq queries. The rows go by in tiles of AXPY_TILE (16 KB
 * of V for a head of 64: it stays in L1), and within a tile a group of up
 * to 4 queries takes 16 output elements at a time (8 accumulators), so each
 * V row is read from memory once per tile for the whole block instead of
 * once per query (per query, a 3,000-token prefill streamed every query's
 * V from L3). Each output element still takes one fma per row, in row
 * order, with weight scores[r] * inv, zero scores skipped: bitwise
 * kv_axpys_avx2's. */
#define AXPY_TILE 64

static inline TAVX2 __attribute__((always_inline)) void
axpys_tile_group(float *const *o, const float (*w)[AXPY_TILE], int g, int any_zero,
                 const float *const *rows, int n_tile, int n) {
    for (int d = 0; d < n; d += 16) {
        __m256 acc[4][2];
        for (int k = 0; k < g; k++) {
            acc[k][0] = _mm256_loadu_ps(o[k] + d);
            acc[k][1] = _mm256_loadu_ps(o[k] + d + 8);
        }
        for (int r = 0; r < n_tile; r++) {
            const __m256 v0 = _mm256_loadu_ps(rows[r] + d), v1 = _mm256_loadu_ps(rows[r] + d + 8);
            for (int k = 0; k < g; k++) {
                if (any_zero && w[k][r] == 0.0f) continue;
                const __m256 wv = _mm256_broadcast_ss(&w[k][r]);
                acc[k][0] = _mm256_fmadd_ps(wv, v0, acc[k][0]);
                acc[k][1] = _mm256_fmadd_ps(wv, v1, acc[k][1]);
            }
        }
        for (int k = 0; k < g; k++) {
            _mm256_storeu_ps(o[k] + d, acc[k][0]);
            _mm256_storeu_ps(o[k] + d + 8, acc[k][1]);
        }
    }
}

/* axpys_tile_group with g as a constant, so the compiler keeps acc in
 * registers (any_zero is a constant at each call site too). */
static inline TAVX2 __attribute__((always_inline)) void
axpys_tile_groups(float *const *o, const float (*w)[AXPY_TILE], int g, int any_zero,
                  const float *const *rows, int n_tile, int n) {
    switch (g) {
    case 4: axpys_tile_group(o, w, 4, any_zero, rows, n_tile, n); break;
    case 3: axpys_tile_group(o, w, 3, any_zero, rows, n_tile, n); break;
    case 2: axpys_tile_group(o, w, 2, any_zero, rows, n_tile, n); break;
    default: axpys_tile_group(o, w, 1, any_zero, rows, n_tile, n); break;
    }
}

/* One query over a tile, for a head of 64: o in 8 registers, 8 fma chains.
 * axpys_tile uses it for a group of fewer than 4 queries, whose 2
 * registers a query would leave the fma units waiting on their chains
 * (3 queries, one token's GQA group, over 3,000 rows: 1.2x longer from
 * cache and 1.5x from memory, in a one-thread kernel microbenchmark, not
 * committed). Each element still takes one fma per row, in row
 * order, with kv_axpys_avx2's weight: the same bits. The tile's rows come
 * from L1 after the group's first query. */
static inline TAVX2 __attribute__((always_inline)) void
axpys_tile_one64(float *o, const float *sc, float inv, const float *const *rows, int nt) {
    __m256 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm256_loadu_ps(o + 8 * i);
    for (int r = 0; r < nt; r++) {
        if (sc[r] == 0.0f) continue;
        const __m256 wv = _mm256_set1_ps(sc[r] * inv);
        for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(rows[r] + 8 * i), a[i]);
    }
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + 8 * i, a[i]);
}

/* kv_axpy_avx2 over a sequence's paged rows (quant_impl.h's kv_axpys); a
 * head of 64 goes through axpys_tile_one64 a tile of rows at a time, o in 8
 * registers across each tile. */
static TAVX2 void kv_axpys_avx2(float *o, const float *scores, float inv, const float *pool,
                                const int32_t *pages, int n_rows, size_t stride, size_t off,
                                int n) {
    if (n != 64) {
        for (int r = 0; r < n_rows; r++) {
            if (scores[r] == 0.0f) continue;
            const float *row = cpu_kv_paged_row(pool, pages, r, stride, off);
            kv_axpy_avx2(o, scores[r] * inv, row, 0, n);
        }
        return;
    }
    const float *rows[AXPY_TILE];
    for (int t0 = 0; t0 < n_rows; t0 += AXPY_TILE) {
        int nt = n_rows - t0 < AXPY_TILE ? n_rows - t0 : AXPY_TILE;
        for (int r = 0; r < nt; r++) rows[r] = cpu_kv_paged_row(pool, pages, t0 + r, stride, off);
        axpys_tile_one64(o, scores + t0, inv, rows, nt);
    }
}

/* One tile of rows rows[0..nt) (the block's rows t0..t0+nt) for all nq
 * queries, 4 at a time. */
static inline TAVX2 void axpys_tile(float *const *o, const float *const *scores, const float *inv,
                                    int nq, const float *const *rows, int t0, int nt, int n) {
    float w[4][AXPY_TILE];
    for (int k0 = 0; k0 < nq; k0 += 4) {
        int g = nq - k0 < 4 ? nq - k0 : 4, any_zero = 0;
        if (g < 4 && n == 64) {
            for (int k = k0; k < nq; k++) axpys_tile_one64(o[k], scores[k] + t0, inv[k], rows, nt);
            break;
        }
        /* the weights as kv_axpys_avx2 forms them (sc * inv; a zero score,
         * which it skips, as 0), 8 at a time: the scalar loop with its
         * compare and branch per weight was 29% of this function in a
         * 3,000-token prefill (perf) */
        const __m256 zero = _mm256_setzero_ps();
        for (int k = 0; k < g; k++) {
            const float *sc = scores[k0 + k] + t0;
            const __m256 iv = _mm256_set1_ps(inv[k0 + k]);
            int r = 0;
            for (; r + 8 <= nt; r += 8) {
                const __m256 sv = _mm256_loadu_ps(sc + r);
                const __m256 z = _mm256_cmp_ps(sv, zero, _CMP_EQ_OQ);
                any_zero |= _mm256_movemask_ps(z);
                _mm256_storeu_ps(&w[k][r], _mm256_andnot_ps(z, _mm256_mul_ps(sv, iv)));
            }
            for (; r < nt; r++) {
                any_zero |= sc[r] == 0.0f;
                w[k][r] = sc[r] == 0.0f ? 0.0f : sc[r] * inv[k0 + k];
            }
        }
        /* a constant zero check drops it from the loop where no weight is 0 */
        if (any_zero) axpys_tile_groups(o + k0, w, g, 1, rows, nt, n);
        else axpys_tile_groups(o + k0, w, g, 0, rows, nt, n);
    }
}

static TAVX2 void kv_axpys_block_avx2(float *const *o, const float *const *scores,
                                      const float *inv, int nq, const float *pool,
                                      const int32_t *pages, int n_rows, size_t stride, size_t off,
                                      int n) {
    if (n % 16 != 0) {
        for (int k = 0; k < nq; k++)
            kv_axpys_avx2(o[k], scores[k], inv[k], pool, pages, n_rows, stride, off, n);
        return;
    }
    const float *rows[AXPY_TILE];
    for (int t0 = 0; t0 < n_rows; t0 += AXPY_TILE) {
        int nt = n_rows - t0 < AXPY_TILE ? n_rows - t0 : AXPY_TILE;
        for (int r = 0; r < nt; r++) rows[r] = cpu_kv_paged_row(pool, pages, t0 + r, stride, off);
        axpys_tile(o, scores, inv, nq, rows, t0, nt, n);
    }
}

/* ---- fp16 pools (quant_impl.h's kv_*_f16) ----------------------------------
 * Rows are widened to fp32 (exact) into a stack buffer, then the fp32 code
 * above runs on the buffer, so every score and output is bitwise what the
 * fp32 kernels give on the widened rows, which is what kv_dot_avx2 /
 * kv_axpy_avx2 give on the fp16 row itself. */


static TAVX2F16 float kv_dots_f16_avx2(const float *q, const uint16_t *pool, const int32_t *pages,
                                       int n_rows, size_t stride, size_t off, int n, float scale,
                                       float *scores) {
    return dots_paged_one(q, pool, 1, pages, n_rows, stride, off, n, scale, scores);
}

static TAVX2F16 void kv_axpys_f16_avx2(float *o, const float *scores, float inv,
                                       const uint16_t *pool, const int32_t *pages, int n_rows,
                                       size_t stride, size_t off, int n) {
    if (n != 64) {
        for (int r = 0; r < n_rows; r++)
            if (scores[r] != 0.0f)
                kv_axpy_avx2(o, scores[r] * inv, cpu_kv_paged_row_f16(pool, pages, r, stride, off),
                             1, n);
        return;
    }
    /* kv_axpys_avx2's register loop, widening each row as it is loaded */
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_loadu_ps(o + 8 * i);
    for (int r = 0; r < n_rows; r++) {
        if (scores[r] == 0.0f) continue;
        const uint16_t *row = cpu_kv_paged_row_f16(pool, pages, r, stride, off);
        const __m256 wv = _mm256_set1_ps(scores[r] * inv);
        for (int i = 0; i < 8; i++)
            acc[i] = _mm256_fmadd_ps(
                wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8 * i))), acc[i]);
    }
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + 8 * i, acc[i]);
}

static TAVX2F16 void kv_dots_block_f16_avx2(const float *const *q, int nq, const uint16_t *pool,
                                            const int32_t *pages, int n_rows, size_t stride,
                                            size_t off, int n, float scale,
                                            float *const *scores, float *maxs) {
    dots_paged(q, nq, pool, 1, pages, n_rows, stride, off, n, scale, scores, maxs);
}

static TAVX2F16 void kv_axpys_block_f16_avx2(float *const *o, const float *const *scores,
                                             const float *inv, int nq, const uint16_t *pool,
                                             const int32_t *pages, int n_rows, size_t stride,
                                             size_t off, int n) {
    if (n % 16 != 0 || n > 64) {
        for (int k = 0; k < nq; k++)
            kv_axpys_f16_avx2(o[k], scores[k], inv[k], pool, pages, n_rows, stride, off, n);
        return;
    }
    /* kv_axpys_block_avx2 on a tile widened once for the whole block */
    float tile[AXPY_TILE][64] __attribute__((aligned(32)));
    const float *rows[AXPY_TILE];
    for (int t0 = 0; t0 < n_rows; t0 += AXPY_TILE) {
        int nt = n_rows - t0 < AXPY_TILE ? n_rows - t0 : AXPY_TILE;
        for (int r = 0; r < nt; r++) {
            kv_prefetch_row(pool, 1, pages, t0 + r + KV_PREFETCH_ROWS, n_rows, stride, off, n);
            widen_row(tile[r], cpu_kv_paged_row_f16(pool, pages, t0 + r, stride, off), n);
            rows[r] = tile[r];
        }
        axpys_tile(o, scores, inv, nq, rows, t0, nt, n);
    }
}

/* ---- a layer's row ops (row_ops.c's twins, bit for bit) ----------------- */

/* RMSNorm of one row: the eight double partial sums as two registers of
 * four (lanes 0-3 and 4-7 of each 8-float chunk), the tail and the final
 * tree as row_ops.c adds them; then (x * scale) * w eight at a time. */
static TAVX2 void rmsnorm_row_avx2(float *out, const float *x, const float *w, int dim,
                                   float eps) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= dim; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
        hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
    }
    double s[8];
    _mm256_storeu_pd(s, lo);
    _mm256_storeu_pd(s + 4, hi);
    for (int k = 0; i < dim; i++, k++) s[k] += (double)x[i] * x[i];
    const float scale = cpu_inv_rms_finish(s, dim, eps);
    const __m256 sc = _mm256_set1_ps(scale);
    i = 0;
    if (w) {
        for (; i + 8 <= dim; i += 8)
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sc),
                                                    _mm256_loadu_ps(w + i)));
        for (; i < dim; i++) out[i] = (x[i] * scale) * w[i];
    } else {
        for (; i + 8 <= dim; i += 8)
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sc));
        for (; i < dim; i++) out[i] = x[i] * scale;
    }
}

/* RoPE. Interleaved pairs: four pairs a register; x * (c, c) and the pairs
 * swapped times (s, s), then addsub: even lanes x0 c - x1 s, odd lanes
 * x1 c + x0 s (= x0 s + x1 c: a sum of two rounded products is the same in
 * either order). Split halves: (c, s) pairs deinterleaved, eight at a time.
 * Whatever is left of a head goes to row_ops.c's loop (see there why it
 * is not written here). */
static TAVX2 void rope_heads_avx2(float *v, int n_heads, int head_dim, const float *cos_sin,
                                  int rot_dim, int interleaved) {
    const int half = rot_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *hv = v + (size_t)h * head_dim;
        int i = 0;
        if (interleaved) {
            for (; i + 4 <= half; i += 4) {
                const __m256 x = _mm256_loadu_ps(hv + 2 * i), cs = _mm256_loadu_ps(cos_sin + 2 * i);
                const __m256 t1 = _mm256_mul_ps(x, _mm256_moveldup_ps(cs));
                const __m256 t2 =
                    _mm256_mul_ps(_mm256_permute_ps(x, 0xB1), _mm256_movehdup_ps(cs));
                _mm256_storeu_ps(hv + 2 * i, _mm256_addsub_ps(t1, t2));
            }
        } else {
            for (; i + 8 <= half; i += 8) {
                const __m256 p0 = _mm256_loadu_ps(cos_sin + 2 * i),
                             p1 = _mm256_loadu_ps(cos_sin + 2 * i + 8);
                /* shuffle keeps 128-bit lanes: (c0 c1 c4 c5 | c2 c3 c6 c7) -> order */
                const __m256i ord = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
                const __m256 c = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(p0, p1, 0x88), ord);
                const __m256 s = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(p0, p1, 0xDD), ord);
                const __m256 x0 = _mm256_loadu_ps(hv + i), x1 = _mm256_loadu_ps(hv + i + half);
                _mm256_storeu_ps(hv + i, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
                _mm256_storeu_ps(hv + i + half,
                                 _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
            }
        }
        cpu_rope_pairs(hv, cos_sin, i, half, interleaved);
    }
}

static TAVX2 void axpy_avx2(float *y, float a, const float *x, size_t n) {
    const __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i),
                                              _mm256_mul_ps(av, _mm256_loadu_ps(x + i))));
    cpu_axpy_scalar(y + i, a, x + i, n - i); /* the tail: see cpu_rope_pairs */
}

int cpu_vec_avx2(cpu_kernel_set *ks) {
    ks->kv_dots_block = kv_dots_block_avx2;
    ks->kv_axpys_block = kv_axpys_block_avx2;
    ks->kv_dots = kv_dots_avx2;
    ks->kv_axpys = kv_axpys_avx2;
    ks->kv_dots_f16 = kv_dots_f16_avx2;
    ks->f32_to_f16_row = f32_to_f16_row_avx2;
    ks->kv_axpys_f16 = kv_axpys_f16_avx2;
    ks->kv_dots_block_f16 = kv_dots_block_f16_avx2;
    ks->kv_axpys_block_f16 = kv_axpys_block_f16_avx2;
    squeeze_lut_init();
    ks->softmax_exp = softmax_exp_avx2;
    ks->kv_dot = kv_dot_avx2;
    ks->kv_axpy = kv_axpy_avx2;
    /* argmax: specd_argmax itself, which runs at this width
     * (common/spec/sampling_vec.c) */
    ks->argmax = specd_argmax;
    ks->swiglu = swiglu_avx2;
    ks->rmsnorm_row = rmsnorm_row_avx2;
    ks->rope_heads = rope_heads_avx2;
    ks->axpy = axpy_avx2;
    return 1;
}

#else
int cpu_vec_avx2(cpu_kernel_set *ks) {
    (void)ks;
    return 0;
}
#endif
