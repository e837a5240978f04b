/* qmatmul_avx2.c - AVX2 kernels of the integer-activation matmul, with and
 * without AVX-VNNI (read qmatmul.h, then qmatmul_avx512.c: same scheme).
 *
 * A ymm register holds 4 consecutive weights of 8 rows, so a 16-row tile is
 * processed as two halves of 8 rows (bytes 0..31 and 32..63 of each 64-byte
 * chunk). AVX2 has 16 registers: 8 decoded chunks, up to NT = 4 token
 * accumulators, and the temporaries fit without spilling.
 *
 *   AVX-VNNI: isum = vpdpbusd(isum, w_u8, x_s8)
 *   AVX2:     isum += vpmaddwd(vpmaddubsw(w_u8, x_s8), 1)
 *
 * Signed Q8_0 weights: VNNI adds 128 and subtracts 128 * sum(x); plain AVX2
 * uses vpsignb to move the weight's sign onto the activation. */
#include "qmatmul.h"
#include "quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define TAVX2 "avx2,fma,f16c"
#define NT 4

#define DOT_VNNI(acc, w, x) _mm256_dpbusd_avx_epi32((acc), (w), (x))
#define DOT_AVX2(acc, w, x) \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((w), (x)), ones))

/* A 4-bit block's int32 sums for one token: `q` the 8 decoded chunks, `xq`
 * the token's 32 activation bytes. With VNNI, two vpdpbusd chains. Without
 * it, vpmaddubsw's int16 pair sums of 4-bit weights are at most
 * 2 * 15 * 127 = 3810 in magnitude (the quantizer never makes -128), so all
 * eight chunks add up in int16 (at most 30480 < 32767) and ONE vpmaddwd
 * widens them, instead of one per chunk: vpmaddubsw and vpmaddwd share the
 * vector multiplier, which bounds this loop once the weights are in cache
 * (verification, batches, prefill). Integer sums are exact either way, so
 * this changes no bit. */
#define ISUM4_VNNI(is, q, xq)                                                       \
    do {                                                                            \
        __m256i s0_ = _mm256_setzero_si256(), s1_ = _mm256_setzero_si256();         \
        for (int c_ = 0; c_ < 8; c_ += 2) {                                         \
            s0_ = DOT_VNNI(s0_, (q)[c_], _mm256_set1_epi32(ld32((xq) + 4 * c_)));   \
            s1_ = DOT_VNNI(s1_, (q)[c_ + 1], _mm256_set1_epi32(ld32((xq) + 4 * c_ + 4))); \
        }                                                                           \
        (is) = _mm256_add_epi32(s0_, s1_);                                          \
    } while (0)
/* Without VNNI: the even and the odd chunks' int16 pair sums, then
 * widened, once for 4-bit weights, each alone for 5-bit ones (Q5: p0 and
 * p1 reach 31,496 each; qmatmul_avx512.c's PAIRS_BW). */
#define PAIRS_AVX2(p0, p1, q, xq)                                                   \
    __m256i p0 = _mm256_maddubs_epi16((q)[0], _mm256_set1_epi32(ld32(xq)));        \
    __m256i p1 = _mm256_maddubs_epi16((q)[1], _mm256_set1_epi32(ld32((xq) + 4)));  \
    for (int c_ = 2; c_ < 8; c_ += 2) {                                             \
        p0 = _mm256_add_epi16(                                                      \
            p0, _mm256_maddubs_epi16((q)[c_], _mm256_set1_epi32(ld32((xq) + 4 * c_)))); \
        p1 = _mm256_add_epi16(                                                      \
            p1, _mm256_maddubs_epi16((q)[c_ + 1], _mm256_set1_epi32(ld32((xq) + 4 * c_ + 4)))); \
    }
#define ISUM4_AVX2(is, q, xq)                                                       \
    do {                                                                            \
        PAIRS_AVX2(p0_, p1_, q, xq)                                                 \
        (is) = _mm256_madd_epi16(_mm256_add_epi16(p0_, p1_), ones);                 \
    } while (0)
#define ISUM5_AVX2(is, q, xq)                                                       \
    do {                                                                            \
        PAIRS_AVX2(p0_, p1_, q, xq)                                                 \
        (is) = _mm256_add_epi32(_mm256_madd_epi16(p0_, ones), _mm256_madd_epi16(p1_, ones)); \
    } while (0)

/* A pass's nt tokens' 8 outputs of half h of row group g (fewer where the
 * matrix ends). */
#define STORE_PASS(a, g, h, t0, nt, acc)                                                      \
    do {                                                                                      \
        const int64_t n_ = (a)->w->rows - (g) * QT_ROWS - 8 * (h);                            \
        for (int t_ = 0; t_ < (nt); t_++)                                                     \
            STORE8((a)->y + (size_t)((t0) + t_) * (a)->ldy + (g) * QT_ROWS + 8 * (h), (acc)[t_], n_); \
    } while (0)

/* Stores 8 outputs, or the first n of them. */
#define STORE8(p, v, n)                                                     \
    do {                                                                    \
        if ((n) >= 8) {                                                     \
            _mm256_storeu_ps((p), (v));                                     \
        } else if ((n) > 0) {                                               \
            float tmp_[8];                                                  \
            _mm256_storeu_ps(tmp_, (v));                                    \
            memcpy((p), tmp_, sizeof(float) * (size_t)(n));                 \
        }                                                                   \
    } while (0)

/* Block b of the row group at gp, half h: its 8 rows' scales wd and mins
 * wm, and where its nibbles start (qmatmul_avx512.c's tile_fp16, tile_kmin;
 * `bytes` a constant in every call). */
static inline __attribute__((always_inline, target(TAVX2))) const uint8_t *
tile_fp16(const uint8_t *gp, int64_t b, int h, int bytes, __m256 *wd, __m256 *wm) {
    const uint8_t *tile = gp + (size_t)b * bytes;
    PREFETCH_TILE(tile, bytes);
    *wd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 16 * h)));
    *wm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 32 + 16 * h)));
    return tile + 64;
}
static inline __attribute__((always_inline, target(TAVX2))) const uint8_t *
tile_q4(const uint8_t *gp, int64_t b, int h, __m256 *wd, __m256 *wm) {
    return tile_fp16(gp, b, h, QT_Q4_BYTES, wd, wm);
}
static inline __attribute__((always_inline, target(TAVX2))) const uint8_t *
tile_q5(const uint8_t *gp, int64_t b, int h, __m256 *wd, __m256 *wm) {
    return tile_fp16(gp, b, h, QT_Q5_BYTES, wd, wm);
}

/* Q5's fifth bits (qmatmul_avx512.c's HI_Q5), half h's 32 bytes. */
#define HI_NONE(q, qs, h) ((void)0)
#define HI_Q5(q, qs, h)                                                                       \
    do {                                                                                      \
        const __m256i hp_ = _mm256_loadu_si256((const __m256i *)((qs) + 256 + 32 * (h)));     \
        const __m256i b4_ = _mm256_set1_epi8(0x10);                                           \
        (q)[0] = _mm256_or_si256((q)[0], _mm256_and_si256(_mm256_slli_epi16(hp_, 4), b4_));   \
        (q)[1] = _mm256_or_si256((q)[1], _mm256_and_si256(_mm256_slli_epi16(hp_, 3), b4_));   \
        (q)[2] = _mm256_or_si256((q)[2], _mm256_and_si256(_mm256_slli_epi16(hp_, 2), b4_));   \
        (q)[3] = _mm256_or_si256((q)[3], _mm256_and_si256(_mm256_slli_epi16(hp_, 1), b4_));   \
        (q)[4] = _mm256_or_si256((q)[4], _mm256_and_si256(hp_, b4_));                         \
        (q)[5] = _mm256_or_si256((q)[5], _mm256_and_si256(_mm256_srli_epi16(hp_, 1), b4_));   \
        (q)[6] = _mm256_or_si256((q)[6], _mm256_and_si256(_mm256_srli_epi16(hp_, 2), b4_));   \
        (q)[7] = _mm256_or_si256((q)[7], _mm256_and_si256(_mm256_srli_epi16(hp_, 3), b4_));   \
    } while (0)

/* 8 scales of bytes: unsigned (Q4_K) or signed (Q6_K), as fp32 */
static inline __attribute__((always_inline, target(TAVX2))) __m256 u8_scales(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline __attribute__((always_inline, target(TAVX2))) __m256 i8_scales(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline __attribute__((always_inline, target(TAVX2))) const uint8_t *
tile_kmin(const uint8_t *gp, int64_t b, int h, int bytes, __m256 *wd, __m256 *wm) {
    const uint8_t *hdr = gp + (size_t)(b / QT_SB_BLOCKS) * (size_t)(QT_Q4K_HDR + QT_SB_BLOCKS * bytes);
    const uint8_t *tile = hdr + QT_Q4K_HDR + (size_t)(b % QT_SB_BLOCKS) * bytes;
    PREFETCH_TILE(tile, bytes);
    PREFETCH_TILE(hdr, QT_Q4K_HDR);
    *wd = _mm256_mul_ps(_mm256_loadu_ps((const float *)hdr + 8 * h), u8_scales(tile + 8 * h));
    *wm = _mm256_mul_ps(_mm256_loadu_ps((const float *)(hdr + 64) + 8 * h),
                        u8_scales(tile + 16 + 8 * h));
    return tile + 32;
}
static inline __attribute__((always_inline, target(TAVX2))) const uint8_t *
tile_q4k(const uint8_t *gp, int64_t b, int h, __m256 *wd, __m256 *wm) {
    return tile_kmin(gp, b, h, QT_Q4K_BYTES, wd, wm);
}
/* Q5K: Q4K's header and scales; the tile 64 bytes longer (the fifth bits) */
static inline __attribute__((always_inline, target(TAVX2))) const uint8_t *
tile_q5k(const uint8_t *gp, int64_t b, int h, __m256 *wd, __m256 *wm) {
    return tile_kmin(gp, b, h, QT_Q5K_BYTES, wd, wm);
}

#define DEF_Q4(NAME, TARGET, ISUM, TILE, HI)                                                   \
    static inline __attribute__((always_inline, target(TARGET))) void NAME##_pass(           \
        const cpu_qmm_args *a, int64_t g, int h, int t0, const int nt) {                      \
        const cpu_qweight *W = a->w;                                                          \
        const __m256i lo4 = _mm256_set1_epi8(0x0F);                                           \
        const __m256i ones = _mm256_set1_epi16(1);                                            \
        (void)ones;                                                                           \
        __m256 acc[NT];                                                                       \
        for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();                            \
        const uint8_t *gp = W->data + (size_t)g * W->group_bytes;                             \
        for (int64_t b = 0; b < W->nb; b++) {                                                 \
            __m256 wd, wm;                                                                    \
            const uint8_t *qs = TILE(gp, b, h, &wd, &wm);                                     \
            __m256i q[8];                                                                     \
            for (int v = 0; v < 4; v++) {                                                     \
                __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 64 * v + 32 * h));    \
                q[v] = _mm256_and_si256(raw, lo4);                                            \
                q[v + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);                  \
            }                                                                                 \
            HI(q, qs, h);                                                                     \
            for (int t = 0; t < nt; t++) {                                                    \
                const size_t xb = (size_t)(t0 + t) * W->nb + b;                               \
                const int8_t *xq = a->a.q + (size_t)(t0 + t) * W->cols + b * QT_COLS;         \
                __m256i is;                                                                   \
                ISUM(is, q, xq);                                                              \
                const __m256 f = _mm256_cvtepi32_ps(is);                                      \
                acc[t] = _mm256_fmadd_ps(f, _mm256_mul_ps(wd, _mm256_set1_ps(a->a.d[xb])),    \
                                         acc[t]);                                             \
                acc[t] = _mm256_fmadd_ps(wm, _mm256_set1_ps(a->a.s[xb]), acc[t]);             \
            }                                                                                 \
        }                                                                                     \
        STORE_PASS(a, g, h, t0, nt, acc);                                                     \
    }                                                                                         \
    DEF_DRIVER(NAME, TARGET)

/* Half h (8 rows) of a Q8 tile's scales (fp16) and int8 weights, or of an
 * IQ4 tile's scales (fp32) and its nibbles' levels (vpshufb from
 * k_iq4nl, qmatmul_avx512.c's LOADW_IQ4). */
#define WD_F16(t, h) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((t) + 16 * (h))))
#define WD_F32(t, h) _mm256_loadu_ps((const float *)(const void *)((t) + 32 * (h)))
#define LOADW_Q8(w, t, h)                                                                     \
    for (int c_ = 0; c_ < 8; c_++)                                                            \
    (w)[c_] = _mm256_loadu_si256((const __m256i *)((t) + 32 + 64 * c_ + 32 * (h)))
#define LOADW_IQ4(w, t, h)                                                                    \
    do {                                                                                      \
        const __m256i lut_ = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k_iq4nl)); \
        const __m256i lo4_ = _mm256_set1_epi8(0x0F);                                          \
        for (int v_ = 0; v_ < 4; v_++) {                                                      \
            const __m256i raw_ = _mm256_loadu_si256((const __m256i *)((t) + 64 + 64 * v_ + 32 * (h))); \
            (w)[v_] = _mm256_shuffle_epi8(lut_, _mm256_and_si256(raw_, lo4_));                \
            (w)[v_ + 4] = _mm256_shuffle_epi8(lut_, _mm256_and_si256(_mm256_srli_epi16(raw_, 4), lo4_)); \
        }                                                                                     \
    } while (0)

#define DEF_Q8(NAME, TARGET, DOT, VNNI, BYTES, WD, LOADW)                                      \
    static inline __attribute__((always_inline, target(TARGET))) void NAME##_pass(           \
        const cpu_qmm_args *a, int64_t g, int h, int t0, const int nt) {                      \
        const cpu_qweight *W = a->w;                                                          \
        const __m256i sign80 = _mm256_set1_epi8((char)0x80);                                  \
        const __m256i ones = _mm256_set1_epi16(1);                                            \
        (void)ones, (void)sign80;                                                             \
        __m256 acc[NT];                                                                       \
        for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();                            \
        const uint8_t *tile = W->data + (size_t)g * W->nb * (BYTES);                          \
        for (int64_t b = 0; b < W->nb; b++, tile += (BYTES)) {                                \
            PREFETCH_TILE(tile, (BYTES));                                                     \
            const __m256 wd = WD(tile, h);                                                    \
            /* raw signed weights (for vpsignb) and the dot's unsigned operand */             \
            __m256i wr[8], wu[8];                                                             \
            LOADW(wr, tile, h);                                                               \
            for (int c = 0; c < 8; c++)                                                       \
                wu[c] = VNNI ? _mm256_xor_si256(wr[c], sign80) : _mm256_abs_epi8(wr[c]);      \
            for (int t = 0; t < nt; t++) {                                                    \
                const size_t xb = (size_t)(t0 + t) * W->nb + b;                               \
                const int8_t *xq = a->a.q + (size_t)(t0 + t) * W->cols + b * QT_COLS;         \
                __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();             \
                for (int c = 0; c < 8; c += 2) {                                              \
                    __m256i x0 = _mm256_set1_epi32(ld32(xq + 4 * c));                         \
                    __m256i x1 = _mm256_set1_epi32(ld32(xq + 4 * c + 4));                     \
                    if (!VNNI) {                                                              \
                        x0 = _mm256_sign_epi8(x0, wr[c]);                                     \
                        x1 = _mm256_sign_epi8(x1, wr[c + 1]);                                 \
                    }                                                                         \
                    s0 = DOT(s0, wu[c], x0);                                                  \
                    s1 = DOT(s1, wu[c + 1], x1);                                              \
                }                                                                             \
                __m256i is = _mm256_add_epi32(s0, s1);                                        \
                if (VNNI) is = _mm256_sub_epi32(is, _mm256_set1_epi32(a->a.sq[xb] * 128));    \
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is),                              \
                                         _mm256_mul_ps(wd, _mm256_set1_ps(a->a.d[xb])),       \
                                         acc[t]);                                             \
            }                                                                                 \
        }                                                                                     \
        STORE_PASS(a, g, h, t0, nt, acc);                                                     \
    }                                                                                         \
    DEF_DRIVER(NAME, TARGET)

/* Tiles with 16-column halves: Q6_K, Q3_K, Q2_K (qmatmul_avx512.c's
 * DEF_KHALF, 8 rows a half h). Q6K's top two bits of chunk 4k + e shifted
 * from bits 2e, 2e+1 of hi[k] to bits 4, 5; a 2-bit plane's chunk shifted
 * down; Q3K's third bit of chunk c moved from bit c to bit 2. */
#define Q6_HI(hv, e)                                                                  \
    _mm256_and_si256((e) == 0   ? _mm256_slli_epi16((hv), 4)                          \
                     : (e) == 1 ? _mm256_slli_epi16((hv), 2)                          \
                     : (e) == 2 ? (hv)                                                \
                                : _mm256_srli_epi16((hv), 2),                         \
                     m30)
#define Q2_CHUNK(hv, e) _mm256_and_si256(_mm256_srli_epi16((hv), 2 * (e)), m3)
#define Q3_HI(hm, c)                                                                          \
    _mm256_and_si256((c) < 2    ? _mm256_slli_epi16((hm), 2 - (c))                            \
                     : (c) == 2 ? (hm)                                                        \
                                : _mm256_srli_epi16((hm), (c) - 2),                           \
                     m4_)
/* A half's sums from chunk c0 for one token (see ISUM6_BW there: two
 * chunks' pair sums, at most 2 * 16002, add in int16). */
#define ISUM6_VNNI(s, q, c0, xq)                                                      \
    for (int c_ = 0; c_ < 4; c_++)                                                    \
    (s) = DOT_VNNI((s), (q)[(c0) + c_], _mm256_set1_epi32(ld32((xq) + 4 * c_)))
#define ISUM6_AVX2(s, q, c0, xq)                                                              \
    for (int c_ = 0; c_ < 4; c_ += 2)                                                         \
    (s) = _mm256_add_epi32(                                                                   \
        (s), _mm256_madd_epi16(                                                               \
                 _mm256_add_epi16(                                                            \
                     _mm256_maddubs_epi16((q)[(c0) + c_], _mm256_set1_epi32(ld32((xq) + 4 * c_))), \
                     _mm256_maddubs_epi16((q)[(c0) + c_ + 1],                                 \
                                          _mm256_set1_epi32(ld32((xq) + 4 * c_ + 4)))),      \
                 ones))

/* Weights of at most 3 bits: a half's four chunks add in int16 (see
 * ISUM3_BW there). */
#define ISUM3_AVX2(s, q, c0, xq)                                                              \
    do {                                                                                      \
        __m256i p_ = _mm256_maddubs_epi16((q)[c0], _mm256_set1_epi32(ld32(xq)));              \
        for (int c_ = 1; c_ < 4; c_++)                                                        \
            p_ = _mm256_add_epi16(p_, _mm256_maddubs_epi16((q)[(c0) + c_],                    \
                                                           _mm256_set1_epi32(ld32((xq) + 4 * c_)))); \
        (s) = _mm256_add_epi32((s), _mm256_madd_epi16(p_, ones));                             \
    } while (0)

/* Half h of a tile's 8 chunks of quants: Q6K 0..63, Q3K 0..7, Q2K 0..3. */
#define UNPACK_Q6K(q, tile, h)                                                                \
    do {                                                                                      \
        const __m256i lo4_ = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);            \
        const __m256i h0_ = _mm256_loadu_si256((const __m256i *)((tile) + 288 + 32 * (h)));   \
        const __m256i h1_ = _mm256_loadu_si256((const __m256i *)((tile) + 352 + 32 * (h)));   \
        for (int v_ = 0; v_ < 4; v_++) {                                                      \
            const __m256i raw_ = _mm256_loadu_si256((const __m256i *)((tile) + 32 + 64 * v_ + 32 * (h))); \
            (q)[v_] = _mm256_or_si256(_mm256_and_si256(raw_, lo4_), Q6_HI(h0_, v_));          \
            (q)[v_ + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw_, 4), lo4_), \
                                          Q6_HI(h1_, v_));                                    \
        }                                                                                     \
    } while (0)
#define UNPACK_Q2K(q, tile, h)                                                                \
    do {                                                                                      \
        const __m256i m3 = _mm256_set1_epi8(3);                                               \
        const __m256i l0_ = _mm256_loadu_si256((const __m256i *)((tile) + 32 + 32 * (h)));    \
        const __m256i l1_ = _mm256_loadu_si256((const __m256i *)((tile) + 96 + 32 * (h)));    \
        for (int e_ = 0; e_ < 4; e_++) {                                                      \
            (q)[e_] = Q2_CHUNK(l0_, e_);                                                      \
            (q)[e_ + 4] = Q2_CHUNK(l1_, e_);                                                  \
        }                                                                                     \
    } while (0)
/* Q3K: Q2K's 2-bit plane with each chunk's third bit or-ed in. */
#define UNPACK_Q3K(q, tile, h)                                                                \
    do {                                                                                      \
        UNPACK_Q2K(q, tile, h);                                                               \
        const __m256i m4_ = _mm256_set1_epi8(4);                                              \
        const __m256i hm_ = _mm256_loadu_si256((const __m256i *)((tile) + 160 + 32 * (h)));   \
        for (int c_ = 0; c_ < 8; c_++) (q)[c_] = _mm256_or_si256((q)[c_], Q3_HI(hm_, c_));    \
    } while (0)

/* Half h's scales and mins (qmatmul_avx512.c's SCALES_I8, SCALES_Q2K). */
#define SCALES_I8(hdr, tile, h, wd, wm)                                                       \
    do {                                                                                      \
        const __m256 dv_ = _mm256_loadu_ps((const float *)(hdr) + 8 * (h));                   \
        (wd)[0] = _mm256_mul_ps(dv_, i8_scales((tile) + 8 * (h)));                            \
        (wd)[1] = _mm256_mul_ps(dv_, i8_scales((tile) + 16 + 8 * (h)));                       \
        (wm)[0] = (wm)[1] = _mm256_setzero_ps();                                              \
    } while (0)
#define SCALES_Q2K(hdr, tile, h, wd, wm)                                                      \
    do {                                                                                      \
        const __m256 dv_ = _mm256_loadu_ps((const float *)(hdr) + 8 * (h));                   \
        const __m256 mv_ = _mm256_loadu_ps((const float *)((hdr) + 64) + 8 * (h));            \
        for (int k_ = 0; k_ < 2; k_++) {                                                      \
            const __m256i sm_ = _mm256_cvtepu8_epi32(                                         \
                _mm_loadl_epi64((const __m128i *)((tile) + 16 * k_ + 8 * (h))));              \
            (wd)[k_] = _mm256_mul_ps(                                                         \
                dv_, _mm256_cvtepi32_ps(_mm256_and_si256(sm_, _mm256_set1_epi32(15))));       \
            (wm)[k_] = _mm256_mul_ps(mv_, _mm256_cvtepi32_ps(_mm256_srli_epi32(sm_, 4)));     \
        }                                                                                     \
    } while (0)

#define DEF_KHALF(NAME, TARGET, ISUM6, BYTES, HDR, SB, SCALES, UNPACK, OFF, MINS)              \
    static inline __attribute__((always_inline, target(TARGET))) void NAME##_pass(           \
        const cpu_qmm_args *a, int64_t g, int h, int t0, const int nt) {                      \
        const cpu_qweight *W = a->w;                                                          \
        const __m256i ones = _mm256_set1_epi16(1);                                            \
        (void)ones;                                                                           \
        __m256 acc[NT];                                                                       \
        for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();                            \
        const uint8_t *gp = W->data + (size_t)g * W->group_bytes;                             \
        for (int64_t b = 0; b < W->nb; b++) {                                                 \
            const uint8_t *hdr = gp + (size_t)(b / QT_SB_BLOCKS) * (SB);                      \
            const uint8_t *tile = hdr + (HDR) + (size_t)(b % QT_SB_BLOCKS) * (BYTES);         \
            PREFETCH_TILE(tile, (BYTES));                                                     \
            PREFETCH_TILE(hdr, (HDR));                                                        \
            __m256 wd[2], wm[2];                                                              \
            SCALES(hdr, tile, h, wd, wm);                                                     \
            __m256i q[8];                                                                     \
            UNPACK(q, tile, h);                                                               \
            for (int t = 0; t < nt; t++) {                                                    \
                const size_t xb = (size_t)(t0 + t) * W->nb + b;                               \
                const int8_t *xq = a->a.q + (size_t)(t0 + t) * W->cols + b * QT_COLS;         \
                const int32_t sh = a->a.sh[xb], sh1 = a->a.sq[xb] - sh;                       \
                const float xdf = a->a.d[xb];                                                 \
                __m256i s0 = _mm256_set1_epi32(-(OFF) * sh);                                  \
                __m256i s1 = _mm256_set1_epi32(-(OFF) * sh1);                                 \
                ISUM6(s0, q, 0, xq);                                                          \
                ISUM6(s1, q, 4, xq + 16);                                                     \
                const __m256 xd = _mm256_set1_ps(xdf);                                        \
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(wd[0], xd), acc[t]); \
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(wd[1], xd), acc[t]); \
                if (MINS) {                                                                   \
                    acc[t] = _mm256_fmadd_ps(wm[0], _mm256_set1_ps(xdf * (float)sh), acc[t]); \
                    acc[t] = _mm256_fmadd_ps(wm[1], _mm256_set1_ps(xdf * (float)sh1), acc[t]); \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        STORE_PASS(a, g, h, t0, nt, acc);                                                     \
    }                                                                                         \
    DEF_DRIVER(NAME, TARGET)

/* Row groups [g0, g1): each half of each group, tokens NT at a time. A half
 * past the last row (rows <= 8 in the last group) is skipped. */
#define DEF_DRIVER(NAME, TARGET)                                                               \
    static __attribute__((target(TARGET))) void NAME(const cpu_qmm_args *a, int64_t g0,       \
                                                     int64_t g1) {                            \
        for (int64_t g = g0; g < g1; g++) {                                                   \
            for (int h = 0; h < 2; h++) {                                                     \
                if (g * QT_ROWS + 8 * h >= a->w->rows) break;                                 \
                int t0 = 0;                                                                   \
                for (; t0 + NT <= a->a.n_tok; t0 += NT) NAME##_pass(a, g, h, t0, NT);         \
                switch (a->a.n_tok - t0) {                                                    \
                case 1: NAME##_pass(a, g, h, t0, 1); break;                                   \
                case 2: NAME##_pass(a, g, h, t0, 2); break;                                   \
                case 3: NAME##_pass(a, g, h, t0, 3); break;                                   \
                default: break;                                                               \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }

/* The activation quantizer (cpu_quantize_act's twin, bit for bit): the
 * same operations per element (|x|, max, x * (1/d), round to nearest even,
 * clamp), eight lanes at a time. The block max is an exact operation, so
 * the lane tree finds the scalar loop's value. */
static __attribute__((target(TAVX2))) void quantize_avx2(const float *x, int n_tok, int64_t cols,
                                                         int8_t *q, float *d, float *s,
                                                         int32_t *sq) {
    const int64_t nb = cols / QT_COLS;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (int t = 0; t < n_tok; t++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + (size_t)t * cols + b * QT_COLS;
            __m256 v[4], m = _mm256_setzero_ps();
            for (int k = 0; k < 4; k++) {
                v[k] = _mm256_loadu_ps(xb + 8 * k);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
            const float amax = _mm_cvtss_f32(m4);
            const float db = amax / 127.0f;
            const float id = db != 0.0f ? 1.0f / db : 0.0f;
            const __m256 idv = _mm256_set1_ps(id);
            __m256i qi[4];
            for (int k = 0; k < 4; k++) {
                __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], idv),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
                qi[k] = _mm256_cvtps_epi32(r);
            }
            /* int32 -> int8 in element order: packs work within 128-bit lanes,
             * so the permute puts the quarters back in sequence */
            __m256i p01 = _mm256_packs_epi32(qi[0], qi[1]), p23 = _mm256_packs_epi32(qi[2], qi[3]);
            __m256i p = _mm256_packs_epi16(p01, p23);
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(q + (size_t)t * cols + b * QT_COLS), p);
            __m256i sum = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]),
                                           _mm256_add_epi32(qi[2], qi[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
            const int32_t total = _mm_cvtsi128_si32(s4);
            d[(size_t)t * nb + b] = db;
            sq[(size_t)t * nb + b] = total;
            s[(size_t)t * nb + b] = db * (float)total;
        }
    }
}

DEF_Q4(q4_avx2, TAVX2, ISUM4_AVX2, tile_q4, HI_NONE)
DEF_Q4(q4_avxvnni, TAVX2 ",avxvnni", ISUM4_VNNI, tile_q4, HI_NONE)
DEF_Q4(q4k_avx2, TAVX2, ISUM4_AVX2, tile_q4k, HI_NONE)
DEF_Q4(q4k_avxvnni, TAVX2 ",avxvnni", ISUM4_VNNI, tile_q4k, HI_NONE)
DEF_Q4(q5_avx2, TAVX2, ISUM5_AVX2, tile_q5, HI_Q5)
DEF_Q4(q5_avxvnni, TAVX2 ",avxvnni", ISUM4_VNNI, tile_q5, HI_Q5)
DEF_Q4(q5k_avx2, TAVX2, ISUM5_AVX2, tile_q5k, HI_Q5)
DEF_Q4(q5k_avxvnni, TAVX2 ",avxvnni", ISUM4_VNNI, tile_q5k, HI_Q5)
DEF_Q8(q8_avx2, TAVX2, DOT_AVX2, 0, QT_Q8_BYTES, WD_F16, LOADW_Q8)
DEF_Q8(q8_avxvnni, TAVX2 ",avxvnni", DOT_VNNI, 1, QT_Q8_BYTES, WD_F16, LOADW_Q8)
DEF_Q8(iq4_avx2, TAVX2, DOT_AVX2, 0, QT_IQ4_BYTES, WD_F32, LOADW_IQ4)
DEF_Q8(iq4_avxvnni, TAVX2 ",avxvnni", DOT_VNNI, 1, QT_IQ4_BYTES, WD_F32, LOADW_IQ4)
DEF_KH(q6k_avx2, TAVX2, ISUM6_AVX2, KH_Q6K)
DEF_KH(q6k_avxvnni, TAVX2 ",avxvnni", ISUM6_VNNI, KH_Q6K)
DEF_KH(q3k_avx2, TAVX2, ISUM3_AVX2, KH_Q3K)
DEF_KH(q3k_avxvnni, TAVX2 ",avxvnni", ISUM6_VNNI, KH_Q3K)
DEF_KH(q2k_avx2, TAVX2, ISUM3_AVX2, KH_Q2K)
DEF_KH(q2k_avxvnni, TAVX2 ",avxvnni", ISUM6_VNNI, KH_Q2K)

int cpu_qkernels_avx2(cpu_kernel_set *ks, int vnni) {
    ks->qrows[CPU_Q4] = vnni ? q4_avxvnni : q4_avx2;
    ks->qrows[CPU_Q8] = vnni ? q8_avxvnni : q8_avx2;
    ks->qrows[CPU_IQ4] = vnni ? iq4_avxvnni : iq4_avx2;
    ks->qrows[CPU_Q4K] = vnni ? q4k_avxvnni : q4k_avx2;
    ks->qrows[CPU_Q5] = vnni ? q5_avxvnni : q5_avx2;
    ks->qrows[CPU_Q5K] = vnni ? q5k_avxvnni : q5k_avx2;
    ks->qrows[CPU_Q6K] = vnni ? q6k_avxvnni : q6k_avx2;
    ks->qrows[CPU_Q2K] = vnni ? q2k_avxvnni : q2k_avx2;
    ks->qrows[CPU_Q3K] = vnni ? q3k_avxvnni : q3k_avx2;
    ks->quantize = quantize_avx2;
    return 1;
}

#else
int cpu_qkernels_avx2(cpu_kernel_set *ks, int vnni) {
    (void)ks, (void)vnni;
    return 0;
}
#endif
