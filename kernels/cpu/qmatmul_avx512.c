/* qmatmul_avx512.c - AVX-512 kernels of the integer-activation matmul, with
 * and without VNNI (read qmatmul.h first: tile layout and operation order).
 *
 * One zmm register holds 4 consecutive weights of each of a tile's 16 rows,
 * so a tile's 32 columns are 8 registers ("chunks"), decoded once per block
 * and shared by up to NT tokens. For each token a chunk meets 4 activation
 * bytes broadcast to all lanes (a load-port broadcast, no shuffle):
 *
 *   VNNI:     isum = vpdpbusd(isum, w_u8, x_s8)               (1 instruction)
 *   AVX-512BW: isum += vpmaddwd(vpmaddubsw(w_u8, x_s8), 1)      (3 instructions;
 *              4-bit weights: the int16 pair sums of a block's 8 chunks
 *              added first, one vpmaddwd a block, ISUM4_BW)
 *
 * vpdpbusd and vpmaddubsw take unsigned weights. 4-bit weights (Q4_0,
 * Q4_1, Q4_K) are unsigned already, and so are Q6_K's 6-bit ones, whose
 * "- 32" starts each half's chain at -32 * (the half's activation sum), as
 * Q3_K's "- 4" does; Q2_K's 2-bit ones need no offset (its mins multiply
 * the half sums after the chain).
 * Signed Q8_0 weights: VNNI adds 128 (xor 0x80) and subtracts
 * 128 * sum(x) afterwards, exactly; without VNNI the sign moves onto the
 * activation (|w| times x negated where w < 0), whose pair sums stay within
 * int16 (2 * 128 * 127). 4-bit pairs reach at most 2 * 15 * 127.
 *
 * Two independent isum chains per token (even and odd chunks) halve the
 * vpdpbusd latency chain; integer addition is exact, so this changes no bit.
 *
 * Compiled with per-function target attributes (no -march), and only called
 * after matmul.c checked the CPU (common/util/simd.h). */
#include "qmatmul.h"
#include "quant_impl.h"


#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define TBW "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
/* Tokens per pass: a pass holds one fp32 accumulator per token, the tile's
 * 8 decoded chunks and a few temporaries in the 32 zmm registers. VNNI
 * passes and AVX-512BW 2-, 3- and 4-bit ones take up to 16 tokens;
 * AVX-512BW Q8_0 passes up to 8, as their dot needs two more temporaries
 * and the sign masks, and spilled at 16 (AVX-512BW Q6_K passes take 8 as
 * well). (4-bit BW passes of 16 against 8: 9 tokens
 * 0.91-0.93x the time, 12 tokens 0.95-0.99x, other counts even.) */
#define NT 16 /* the most of any kernel: the accumulator array's size */

/* The two dot flavours, as macros so each kernel below is compiled for its
 * own target. `ones` is 16-bit 1s (vpmaddwd's partner). */
#define DOT_VNNI(acc, w, x) _mm512_dpbusd_epi32((acc), (w), (x))
#define DOT_BW(acc, w, x) \
    _mm512_add_epi32((acc), _mm512_madd_epi16(_mm512_maddubs_epi16((w), (x)), ones))

/* A 4-bit block's int32 sums for one token (qmatmul_avx2.c's ISUM4_*, 16
 * rows wide): `q` the 8 decoded chunks, `xq` the token's 32 activation
 * bytes. With VNNI, two vpdpbusd chains (one chain was 4-9% slower at 4-64
 * tokens: bench/kernel_ab.sh). Without it, vpmaddubsw's int16 pair sums of
 * 4-bit weights are at most 2 * 15 * 127 = 3810 in magnitude (the
 * quantizer never makes -128), so all eight chunks add up in int16 (at
 * most 30480 < 32767) and ONE vpmaddwd widens them instead of one per
 * chunk. Integer sums are exact either way: no bit changes. */
#define ISUM4_VNNI(is, q, xq)                                                                 \
    do {                                                                                      \
        __m512i s0_ = _mm512_setzero_si512(), s1_ = _mm512_setzero_si512();                   \
        for (int c_ = 0; c_ < 8; c_ += 2) {                                                   \
            s0_ = DOT_VNNI(s0_, (q)[c_], _mm512_set1_epi32(ld32((xq) + 4 * c_)));             \
            s1_ = DOT_VNNI(s1_, (q)[c_ + 1], _mm512_set1_epi32(ld32((xq) + 4 * c_ + 4)));     \
        }                                                                                     \
        (is) = _mm512_add_epi32(s0_, s1_);                                                    \
    } while (0)
/* Without VNNI: p0, p1 the int16 pair sums of the even and of the odd
 * chunks (4 each), then widened. 4-bit weights: at most 30,480, so one
 * vpmaddwd widens p0 + p1. 5-bit weights (Q5): pair sums reach
 * 2 * 31 * 127 = 7874, p0 and p1 each 31,496, so each is widened alone. */
#define PAIRS_BW(p0, p1, q, xq)                                                               \
    __m512i p0 = _mm512_maddubs_epi16((q)[0], _mm512_set1_epi32(ld32(xq)));                  \
    __m512i p1 = _mm512_maddubs_epi16((q)[1], _mm512_set1_epi32(ld32((xq) + 4)));            \
    for (int c_ = 2; c_ < 8; c_ += 2) {                                                       \
        p0 = _mm512_add_epi16(p0,                                                             \
                              _mm512_maddubs_epi16((q)[c_], _mm512_set1_epi32(ld32((xq) + 4 * c_)))); \
        p1 = _mm512_add_epi16(                                                                \
            p1, _mm512_maddubs_epi16((q)[c_ + 1], _mm512_set1_epi32(ld32((xq) + 4 * c_ + 4)))); \
    }
#define ISUM4_BW(is, q, xq)                                                                   \
    do {                                                                                      \
        PAIRS_BW(p0_, p1_, q, xq)                                                             \
        (is) = _mm512_madd_epi16(_mm512_add_epi16(p0_, p1_), ones);                           \
    } while (0)
#define ISUM5_BW(is, q, xq)                                                                   \
    do {                                                                                      \
        PAIRS_BW(p0_, p1_, q, xq)                                                             \
        (is) = _mm512_add_epi32(_mm512_madd_epi16(p0_, ones), _mm512_madd_epi16(p1_, ones));  \
    } while (0)

/* Stores 16 outputs, or the first n of them (the last, partial row group). */
#define STORE_ROWS(p, v, n)                                                   \
    do {                                                                      \
        if ((n) >= 16) _mm512_storeu_ps((p), (v));                            \
        else _mm512_mask_storeu_ps((p), (__mmask16)((1u << (n)) - 1), (v));   \
    } while (0)

/* A pass's nt tokens' 16 outputs of row group g (fewer where the matrix
 * ends). */
#define STORE_PASS(a, g, t0, nt, acc)                                                         \
    do {                                                                                      \
        const int64_t n_ = (a)->w->rows - (g) * QT_ROWS;                                      \
        UNROLL_TOKENS for (int t_ = 0; t_ < (nt); t_++)                                       \
            STORE_ROWS((a)->y + (size_t)((t0) + t_) * (a)->ldy + (g) * QT_ROWS, (acc)[t_], n_); \
    } while (0)

/* Row groups [g0, g1) for all tokens, in passes of at most NTP tokens, as
 * equal as they go (cpu_split_passes in qmatmul.h). Each pass's count
 * is a constant in its call, so its loops unroll (the pragmas: GCC's own
 * limit stops short of 16 tokens, and an accumulator array it keeps in
 * memory costs a third). On the Zen 5 VM, against
 * 8 a pass with the remainder last, a 9-token Q4_1 or Q8_0 matmul takes
 * 0.93x the time and a 12-token one 0.92-0.94x (bench/kernel_ab.sh). */
#define PASS_CASE(NAME, n) \
    case n: NAME##_pass(a, g, t0, n); break;
#define PASS_CASES_8(NAME)                                                           \
    PASS_CASE(NAME, 1) PASS_CASE(NAME, 2) PASS_CASE(NAME, 3) PASS_CASE(NAME, 4)      \
    PASS_CASE(NAME, 5) PASS_CASE(NAME, 6) PASS_CASE(NAME, 7) PASS_CASE(NAME, 8)
#define PASS_CASES_16(NAME)                                                          \
    PASS_CASES_8(NAME)                                                               \
    PASS_CASE(NAME, 9) PASS_CASE(NAME, 10) PASS_CASE(NAME, 11) PASS_CASE(NAME, 12)   \
    PASS_CASE(NAME, 13) PASS_CASE(NAME, 14) PASS_CASE(NAME, 15) PASS_CASE(NAME, 16)
#define DEF_DRIVER(NAME, TARGET, NTP)                                                          \
    static __attribute__((target(TARGET))) void NAME(const cpu_qmm_args *a, int64_t g0,       \
                                                     int64_t g1) {                            \
        const int n_tok = a->a.n_tok;                                                         \
        if (n_tok <= 0) return;                                                               \
        if (n_tok == 1) { /* decode: through the pass loop, 1.06x the time when hot */         \
            for (int64_t g = g0; g < g1; g++) NAME##_pass(a, g, 0, 1);                        \
            return;                                                                           \
        }                                                                                     \
        const cpu_pass_split sp = cpu_split_passes(n_tok, NTP);                               \
        for (int64_t g = g0; g < g1; g++) {                                                   \
            for (int p = 0, t0 = 0; p < sp.passes; p++) {                                     \
                const int nt = sp.base + (p < sp.longer);                                     \
                switch (nt) {                                                                 \
                    PASS_CASES_##NTP(NAME)                                                    \
                default: break;                                                               \
                }                                                                             \
                t0 += nt;                                                                     \
            }                                                                                 \
        }                                                                                     \
    }
#define UNROLL_TOKENS _Pragma("GCC unroll 16")

/* ---- 4-bit tiles (Q4_0, Q4_1 and Q4_K) ------------------------------------ */

/* Block b of the row group at gp: its 16 rows' scales wd and mins wm, and
 * where its nibbles start. Q4 and Q5 tiles (`bytes` long) hold them as
 * fp16; a Q4K or Q5K tile as 6-bit integers beside the super-block header's
 * fp32 d and -dmin, multiplied here (exact in fp32, as the scalar twin
 * computes them). The header's two lines are prefetched with every tile,
 * as they are not inside any. `bytes` is a constant in every call. */
static inline __attribute__((always_inline, target(TBW))) const uint8_t *
tile_fp16(const uint8_t *gp, int64_t b, int bytes, __m512 *wd, __m512 *wm) {
    const uint8_t *tile = gp + (size_t)b * bytes;
    PREFETCH_TILE(tile, bytes);
    *wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
    *wm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32)));
    return tile + 64;
}
static inline __attribute__((always_inline, target(TBW))) const uint8_t *
tile_q4(const uint8_t *gp, int64_t b, __m512 *wd, __m512 *wm) {
    return tile_fp16(gp, b, QT_Q4_BYTES, wd, wm);
}
static inline __attribute__((always_inline, target(TBW))) const uint8_t *
tile_q5(const uint8_t *gp, int64_t b, __m512 *wd, __m512 *wm) {
    return tile_fp16(gp, b, QT_Q5_BYTES, wd, wm);
}

/* Q5's fifth bits, 256 bytes after the nibbles: chunk c's at bit c of each
 * byte, moved to bit 4 and or-ed into the chunk (the 16-bit shifts carry
 * bits across bytes only into bits the mask drops). Q4 tiles have none. */
#define HI_NONE(q, qs) ((void)0)
#define HI_Q5(q, qs)                                                                          \
    do {                                                                                      \
        const __m512i hp_ = _mm512_loadu_si512((const void *)((qs) + 256));                  \
        const __m512i b4_ = _mm512_set1_epi8(0x10);                                           \
        (q)[0] = _mm512_or_si512((q)[0], _mm512_and_si512(_mm512_slli_epi16(hp_, 4), b4_));   \
        (q)[1] = _mm512_or_si512((q)[1], _mm512_and_si512(_mm512_slli_epi16(hp_, 3), b4_));   \
        (q)[2] = _mm512_or_si512((q)[2], _mm512_and_si512(_mm512_slli_epi16(hp_, 2), b4_));   \
        (q)[3] = _mm512_or_si512((q)[3], _mm512_and_si512(_mm512_slli_epi16(hp_, 1), b4_));   \
        (q)[4] = _mm512_or_si512((q)[4], _mm512_and_si512(hp_, b4_));                         \
        (q)[5] = _mm512_or_si512((q)[5], _mm512_and_si512(_mm512_srli_epi16(hp_, 1), b4_));   \
        (q)[6] = _mm512_or_si512((q)[6], _mm512_and_si512(_mm512_srli_epi16(hp_, 2), b4_));   \
        (q)[7] = _mm512_or_si512((q)[7], _mm512_and_si512(_mm512_srli_epi16(hp_, 3), b4_));   \
    } while (0)

static inline __attribute__((always_inline, target(TBW))) __m512 u8_scales(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline __attribute__((always_inline, target(TBW))) const uint8_t *
tile_kmin(const uint8_t *gp, int64_t b, int bytes, __m512 *wd, __m512 *wm) {
    const uint8_t *hdr = gp + (size_t)(b / QT_SB_BLOCKS) * (size_t)(QT_Q4K_HDR + QT_SB_BLOCKS * bytes);
    const uint8_t *tile = hdr + QT_Q4K_HDR + (size_t)(b % QT_SB_BLOCKS) * bytes;
    PREFETCH_TILE(tile, bytes);
    PREFETCH_TILE(hdr, QT_Q4K_HDR);
    *wd = _mm512_mul_ps(_mm512_loadu_ps((const float *)hdr), u8_scales(tile));
    *wm = _mm512_mul_ps(_mm512_loadu_ps((const float *)(hdr + 64)), u8_scales(tile + 16));
    return tile + 32;
}
static inline __attribute__((always_inline, target(TBW))) const uint8_t *
tile_q4k(const uint8_t *gp, int64_t b, __m512 *wd, __m512 *wm) {
    return tile_kmin(gp, b, QT_Q4K_BYTES, wd, wm);
}
/* Q5K: Q4K's header and scales; the tile 64 bytes longer (the fifth bits) */
static inline __attribute__((always_inline, target(TBW))) const uint8_t *
tile_q5k(const uint8_t *gp, int64_t b, __m512 *wd, __m512 *wm) {
    return tile_kmin(gp, b, QT_Q5K_BYTES, wd, wm);
}

#define DEF_Q4(NAME, TARGET, ISUM, NTP, TILE, HI)                                                 \
    static inline __attribute__((always_inline, target(TARGET))) void NAME##_pass(           \
        const cpu_qmm_args *a, int64_t g, int t0, const int nt) {                             \
        const cpu_qweight *W = a->w;                                                          \
        const __m512i lo4 = _mm512_set1_epi8(0x0F);                                           \
        const __m512i ones = _mm512_set1_epi16(1);                                            \
        (void)ones;                                                                           \
        __m512 acc[NT];                                                                       \
        UNROLL_TOKENS for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();              \
        const uint8_t *gp = W->data + (size_t)g * W->group_bytes;                             \
        for (int64_t b = 0; b < W->nb; b++) {                                                 \
            __m512 wd, wm;                                                                    \
            const uint8_t *qs = TILE(gp, b, &wd, &wm);                                        \
            __m512i q[8];                                                                     \
            for (int v = 0; v < 4; v++) {                                                     \
                __m512i raw = _mm512_loadu_si512((const void *)(qs + 64 * v));                \
                q[v] = _mm512_and_si512(raw, lo4);                                            \
                q[v + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo4);                  \
            }                                                                                 \
            HI(q, qs);                                                                        \
            UNROLL_TOKENS for (int t = 0; t < nt; t++) {                                      \
                const size_t xb = (size_t)(t0 + t) * W->nb + b;                               \
                const int8_t *xq = a->a.q + (size_t)(t0 + t) * W->cols + b * QT_COLS;         \
                __m512i is;                                                                   \
                ISUM(is, q, xq);                                                              \
                const __m512 f = _mm512_cvtepi32_ps(is);                                      \
                acc[t] = _mm512_fmadd_ps(f, _mm512_mul_ps(wd, _mm512_set1_ps(a->a.d[xb])),    \
                                         acc[t]);                                             \
                acc[t] = _mm512_fmadd_ps(wm, _mm512_set1_ps(a->a.s[xb]), acc[t]);             \
            }                                                                                 \
        }                                                                                     \
        STORE_PASS(a, g, t0, nt, acc);                                                        \
    }                                                                                         \
    DEF_DRIVER(NAME, TARGET, NTP)

/* ---- 8-bit tiles (Q8_0) --------------------------------------------------- */

/* VNNI: weights + 128 as unsigned bytes, which adds 128 * sum(x) to the
 * dot; the even chunks' chain starts at -128 * sum(x) instead of zero, so
 * no subtraction follows it (integer sums are exact in any order: the
 * same bits). Q8_0's epilogue per token and block was a shift and a
 * subtraction beside the convert and the FMA; without them
 * (bench/kernel_ab.sh 894455f~1 kernels/cpu/qmatmul_avx512.c q8, Zen 5 VM)
 * 0.94-0.96x the time at 4-64 tokens, hot and cold. The AVX-VNNI twin in
 * qmatmul_avx2.c measured 1.02-1.05x with the same change and keeps its
 * subtraction. */
#define Q8_PREP_VNNI(w, c) (w)[c] = _mm512_xor_si512((w)[c], sign80)
#define Q8_DOT_VNNI(s, w, neg, c, xv) _mm512_dpbusd_epi32((s), (w)[c], (xv))
#define Q8_INIT_VNNI(sq) _mm512_set1_epi32(-128 * (sq))
/* BW: |w| times x with w's sign (x negated where w < 0). */
#define Q8_PREP_BW(w, c)                          \
    do {                                          \
        neg[c] = _mm512_movepi8_mask((w)[c]);     \
        (w)[c] = _mm512_abs_epi8((w)[c]);         \
    } while (0)
#define Q8_DOT_BW(s, w, neg, c, xv)                                                          \
    _mm512_add_epi32((s), _mm512_madd_epi16(                                                 \
                              _mm512_maddubs_epi16(                                          \
                                  (w)[c], _mm512_mask_sub_epi8((xv), (neg)[c],              \
                                                               _mm512_setzero_si512(), (xv))), \
                              ones))
#define Q8_INIT_BW(sq) ((void)(sq), _mm512_setzero_si512())

/* A Q8 tile's 16 scales (fp16) and int8 weights (8 chunks), or an IQ4
 * tile's scales (fp32) and its nibbles' levels: vpshufb looks each nibble
 * up in k_iq4nl's 16 bytes (in every 128-bit lane), giving exactly the
 * int8 weights a Q8 tile would hold. */
#define WD_F16(t) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t)))
#define WD_F32(t) _mm512_loadu_ps((const float *)(const void *)(t))
#define LOADW_Q8(w, t)                                                                        \
    for (int c_ = 0; c_ < 8; c_++) (w)[c_] = _mm512_loadu_si512((const void *)((t) + 32 + 64 * c_))
#define LOADW_IQ4(w, t)                                                                       \
    do {                                                                                      \
        const __m512i lut_ = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)k_iq4nl)); \
        const __m512i lo4_ = _mm512_set1_epi8(0x0F);                                          \
        for (int v_ = 0; v_ < 4; v_++) {                                                      \
            const __m512i raw_ = _mm512_loadu_si512((const void *)((t) + 64 + 64 * v_));      \
            (w)[v_] = _mm512_shuffle_epi8(lut_, _mm512_and_si512(raw_, lo4_));                \
            (w)[v_ + 4] = _mm512_shuffle_epi8(lut_, _mm512_and_si512(_mm512_srli_epi16(raw_, 4), lo4_)); \
        }                                                                                     \
    } while (0)

#define DEF_Q8(NAME, TARGET, PREP, DOT, INIT, NTP, BYTES, WD, LOADW)                               \
    static inline __attribute__((always_inline, target(TARGET))) void NAME##_pass(           \
        const cpu_qmm_args *a, int64_t g, int t0, const int nt) {                             \
        const cpu_qweight *W = a->w;                                                          \
        const __m512i sign80 = _mm512_set1_epi8((char)0x80);                                  \
        const __m512i ones = _mm512_set1_epi16(1);                                            \
        (void)sign80, (void)ones;                                                             \
        __m512 acc[NT];                                                                       \
        UNROLL_TOKENS for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();              \
        const uint8_t *tile = W->data + (size_t)g * W->nb * (BYTES);                          \
        for (int64_t b = 0; b < W->nb; b++, tile += (BYTES)) {                                \
            PREFETCH_TILE(tile, (BYTES));                                                     \
            const __m512 wd = WD(tile);                                                       \
            __m512i w[8];                                                                     \
            __mmask64 neg[8];                                                                 \
            (void)neg;                                                                        \
            LOADW(w, tile);                                                                   \
            for (int c = 0; c < 8; c++) PREP(w, c);                                           \
            UNROLL_TOKENS for (int t = 0; t < nt; t++) {                                      \
                const size_t xb = (size_t)(t0 + t) * W->nb + b;                               \
                const int8_t *xq = a->a.q + (size_t)(t0 + t) * W->cols + b * QT_COLS;         \
                __m512i s0 = INIT(a->a.sq[xb]), s1 = _mm512_setzero_si512();                  \
                for (int c = 0; c < 8; c += 2) {                                              \
                    s0 = DOT(s0, w, neg, c, _mm512_set1_epi32(ld32(xq + 4 * c)));             \
                    s1 = DOT(s1, w, neg, c + 1, _mm512_set1_epi32(ld32(xq + 4 * c + 4)));     \
                }                                                                             \
                __m512i is = _mm512_add_epi32(s0, s1);                                        \
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is),                              \
                                         _mm512_mul_ps(wd, _mm512_set1_ps(a->a.d[xb])),       \
                                         acc[t]);                                             \
            }                                                                                 \
        }                                                                                     \
        STORE_PASS(a, g, t0, nt, acc);                                                        \
    }                                                                                         \
    DEF_DRIVER(NAME, TARGET, NTP)

/* ---- tiles with 16-column halves (Q6_K, Q3_K, Q2_K) ----------------------- */

/* q = low nibble | top two bits << 4, a chunk's 64 bytes at once: chunk
 * 4k + e's top bits sit at bits 2e, 2e+1 of hi[k] (qmatmul.h), shifted to
 * bits 4, 5 here. The 16-bit shifts carry bits across bytes only into bits
 * that the mask drops. */
#define Q6_HI(h, e)                                                                   \
    _mm512_and_si512((e) == 0   ? _mm512_slli_epi16((h), 4)                           \
                     : (e) == 1 ? _mm512_slli_epi16((h), 2)                           \
                     : (e) == 2 ? (h)                                                 \
                                : _mm512_srli_epi16((h), 2),                          \
                     m30)
/* Chunk 4k + e of a 2-bit plane (Q2K's quants, Q3K's low bits), shifted
 * down and masked. */
#define Q2_CHUNK(h, e) _mm512_and_si512(_mm512_srli_epi16((h), 2 * (e)), m3)
/* Q3K's third bit of chunk c, moved from bit c of the hi byte to bit 2. */
#define Q3_HI(hm, c)                                                                          \
    _mm512_and_si512((c) < 2    ? _mm512_slli_epi16((hm), 2 - (c))                            \
                     : (c) == 2 ? (hm)                                                        \
                                : _mm512_srli_epi16((hm), (c) - 2),                           \
                     m4_)

/* A half's int32 sums (4 chunks from c0) for one token, onto the chain's
 * start (-32 or -4 times the half's activation sum, or 0). VNNI: one chain
 * per half, the two halves interleaved. BW: vpmaddubsw's pair sums of 6-bit
 * weights reach 2 * 63 * 127 = 16002, so two chunks add in int16 before
 * each vpmaddwd. */
#define ISUM6_VNNI(s, q, c0, xq)                                                      \
    for (int c_ = 0; c_ < 4; c_++)                                                    \
    (s) = _mm512_dpbusd_epi32((s), (q)[(c0) + c_], _mm512_set1_epi32(ld32((xq) + 4 * c_)))
#define ISUM6_BW(s, q, c0, xq)                                                                \
    for (int c_ = 0; c_ < 4; c_ += 2)                                                         \
    (s) = _mm512_add_epi32(                                                                   \
        (s), _mm512_madd_epi16(                                                               \
                 _mm512_add_epi16(                                                            \
                     _mm512_maddubs_epi16((q)[(c0) + c_], _mm512_set1_epi32(ld32((xq) + 4 * c_))), \
                     _mm512_maddubs_epi16((q)[(c0) + c_ + 1],                                 \
                                          _mm512_set1_epi32(ld32((xq) + 4 * c_ + 4)))),      \
                 ones))

/* BW, weights of at most 3 bits (Q3K, Q2K): pair sums reach 2 * 7 * 127 =
 * 1,778, so a half's four chunks add in int16 (7,112) before one
 * vpmaddwd (two pairs widened apart measured 1.03-1.18x the time at 4-64
 * tokens for Q2_K, bench/kernel_ab.sh). */
#define ISUM3_BW(s, q, c0, xq)                                                                \
    do {                                                                                      \
        __m512i p_ = _mm512_maddubs_epi16((q)[c0], _mm512_set1_epi32(ld32(xq)));              \
        for (int c_ = 1; c_ < 4; c_++)                                                        \
            p_ = _mm512_add_epi16(p_, _mm512_maddubs_epi16((q)[(c0) + c_],                    \
                                                           _mm512_set1_epi32(ld32((xq) + 4 * c_)))); \
        (s) = _mm512_add_epi32((s), _mm512_madd_epi16(p_, ones));                             \
    } while (0)

/* A tile's 8 chunks of quants: Q6K 0..63, Q3K 0..7, Q2K 0..3. */
#define UNPACK_Q6K(q, tile)                                                                   \
    do {                                                                                      \
        const __m512i lo4_ = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);            \
        const __m512i h0_ = _mm512_loadu_si512((const void *)((tile) + 288));                \
        const __m512i h1_ = _mm512_loadu_si512((const void *)((tile) + 352));                \
        for (int v_ = 0; v_ < 4; v_++) {                                                      \
            const __m512i raw_ = _mm512_loadu_si512((const void *)((tile) + 32 + 64 * v_));  \
            (q)[v_] = _mm512_or_si512(_mm512_and_si512(raw_, lo4_), Q6_HI(h0_, v_));          \
            (q)[v_ + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(raw_, 4), lo4_), \
                                          Q6_HI(h1_, v_));                                    \
        }                                                                                     \
    } while (0)
#define UNPACK_Q2K(q, tile)                                                                   \
    do {                                                                                      \
        const __m512i m3 = _mm512_set1_epi8(3);                                               \
        const __m512i l0_ = _mm512_loadu_si512((const void *)((tile) + 32));                 \
        const __m512i l1_ = _mm512_loadu_si512((const void *)((tile) + 96));                 \
        for (int e_ = 0; e_ < 4; e_++) {                                                      \
            (q)[e_] = Q2_CHUNK(l0_, e_);                                                      \
            (q)[e_ + 4] = Q2_CHUNK(l1_, e_);                                                  \
        }                                                                                     \
    } while (0)
/* Q3K: Q2K's 2-bit plane with each chunk's third bit or-ed in. */
#define UNPACK_Q3K(q, tile)                                                                   \
    do {                                                                                      \
        UNPACK_Q2K(q, tile);                                                                  \
        const __m512i m4_ = _mm512_set1_epi8(4);                                              \
        const __m512i hm_ = _mm512_loadu_si512((const void *)((tile) + 160));                 \
        for (int c_ = 0; c_ < 8; c_++) (q)[c_] = _mm512_or_si512((q)[c_], Q3_HI(hm_, c_));    \
    } while (0)

/* The halves' scales wd[h] and mins wm[h]: Q6_K's and Q3_K's int8 scales
 * times the header's d (no mins); Q2_K's scale bytes, the low nibble times
 * d and the high one times -dmin. Exact in fp32, as the scalar twin
 * computes them. */
#define SCALES_I8(hdr, tile, wd, wm)                                                          \
    do {                                                                                      \
        const __m512 dv_ = _mm512_loadu_ps((const float *)(hdr));                             \
        for (int h_ = 0; h_ < 2; h_++)                                                        \
            (wd)[h_] = _mm512_mul_ps(dv_, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(            \
                                              _mm_loadu_si128((const __m128i *)((tile) + 16 * h_))))); \
        (wm)[0] = (wm)[1] = _mm512_setzero_ps();                                              \
    } while (0)
#define SCALES_Q2K(hdr, tile, wd, wm)                                                         \
    do {                                                                                      \
        const __m512 dv_ = _mm512_loadu_ps((const float *)(hdr));                             \
        const __m512 mv_ = _mm512_loadu_ps((const float *)((hdr) + 64));                      \
        for (int h_ = 0; h_ < 2; h_++) {                                                      \
            const __m512i sm_ =                                                               \
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((tile) + 16 * h_)));   \
            (wd)[h_] = _mm512_mul_ps(                                                         \
                dv_, _mm512_cvtepi32_ps(_mm512_and_si512(sm_, _mm512_set1_epi32(15))));       \
            (wm)[h_] = _mm512_mul_ps(mv_, _mm512_cvtepi32_ps(_mm512_srli_epi32(sm_, 4)));     \
        }                                                                                     \
    } while (0)

/* Tiles of BYTES behind a header of HDR bytes per super-block of SB: each
 * half's sum starts at -OFF times its activation sum (Q6_K 32, Q3_K 4,
 * Q2_K 0) and takes its own scale; with MINS (Q2_K) each half's min then
 * multiplies the half's activation sum (qmatmul.h's operation order). */
#define DEF_KHALF(NAME, TARGET, ISUM6, NTP, BYTES, HDR, SB, SCALES, UNPACK, OFF, MINS)            \
    static inline __attribute__((always_inline, target(TARGET))) void NAME##_pass(           \
        const cpu_qmm_args *a, int64_t g, int t0, const int nt) {                             \
        const cpu_qweight *W = a->w;                                                          \
        const __m512i ones = _mm512_set1_epi16(1);                                            \
        (void)ones;                                                                           \
        __m512 acc[NT];                                                                       \
        UNROLL_TOKENS for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();              \
        const uint8_t *gp = W->data + (size_t)g * W->group_bytes;                             \
        for (int64_t b = 0; b < W->nb; b++) {                                                 \
            const uint8_t *hdr = gp + (size_t)(b / QT_SB_BLOCKS) * (SB);                      \
            const uint8_t *tile = hdr + (HDR) + (size_t)(b % QT_SB_BLOCKS) * (BYTES);         \
            PREFETCH_TILE(tile, (BYTES));                                                     \
            PREFETCH_TILE(hdr, (HDR));                                                        \
            __m512 wd[2], wm[2];                                                              \
            SCALES(hdr, tile, wd, wm);                                                        \
            __m512i q[8];                                                                     \
            UNPACK(q, tile);                                                                  \
            UNROLL_TOKENS for (int t = 0; t < nt; t++) {                                      \
                const size_t xb = (size_t)(t0 + t) * W->nb + b;                               \
                const int8_t *xq = a->a.q + (size_t)(t0 + t) * W->cols + b * QT_COLS;         \
                const int32_t sh = a->a.sh[xb], sh1 = a->a.sq[xb] - sh;                       \
                const float xdf = a->a.d[xb];                                                 \
                __m512i s0 = _mm512_set1_epi32(-(OFF) * sh);                                  \
                __m512i s1 = _mm512_set1_epi32(-(OFF) * sh1);                                 \
                ISUM6(s0, q, 0, xq);                                                          \
                ISUM6(s1, q, 4, xq + 16);                                                     \
                const __m512 xd = _mm512_set1_ps(xdf);                                        \
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(wd[0], xd), acc[t]); \
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(wd[1], xd), acc[t]); \
                if (MINS) {                                                                   \
                    acc[t] = _mm512_fmadd_ps(wm[0], _mm512_set1_ps(xdf * (float)sh), acc[t]); \
                    acc[t] = _mm512_fmadd_ps(wm[1], _mm512_set1_ps(xdf * (float)sh1), acc[t]); \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        STORE_PASS(a, g, t0, nt, acc);                                                        \
    }                                                                                         \
    DEF_DRIVER(NAME, TARGET, NTP)

DEF_Q4(q4_bw, TBW, ISUM4_BW, 16, tile_q4, HI_NONE)
DEF_Q4(q4_vnni, TBW ",avx512vnni", ISUM4_VNNI, 16, tile_q4, HI_NONE)
DEF_Q4(q4k_bw, TBW, ISUM4_BW, 16, tile_q4k, HI_NONE)
DEF_Q4(q4k_vnni, TBW ",avx512vnni", ISUM4_VNNI, 16, tile_q4k, HI_NONE)
DEF_Q4(q5_bw, TBW, ISUM5_BW, 16, tile_q5, HI_Q5)
DEF_Q4(q5_vnni, TBW ",avx512vnni", ISUM4_VNNI, 16, tile_q5, HI_Q5)
DEF_Q4(q5k_bw, TBW, ISUM5_BW, 16, tile_q5k, HI_Q5)
DEF_Q4(q5k_vnni, TBW ",avx512vnni", ISUM4_VNNI, 16, tile_q5k, HI_Q5)
DEF_Q8(q8_bw, TBW, Q8_PREP_BW, Q8_DOT_BW, Q8_INIT_BW, 8, QT_Q8_BYTES, WD_F16, LOADW_Q8)
DEF_Q8(q8_vnni, TBW ",avx512vnni", Q8_PREP_VNNI, Q8_DOT_VNNI, Q8_INIT_VNNI, 16, QT_Q8_BYTES, WD_F16,
       LOADW_Q8)
DEF_Q8(iq4_bw, TBW, Q8_PREP_BW, Q8_DOT_BW, Q8_INIT_BW, 8, QT_IQ4_BYTES, WD_F32, LOADW_IQ4)
DEF_Q8(iq4_vnni, TBW ",avx512vnni", Q8_PREP_VNNI, Q8_DOT_VNNI, Q8_INIT_VNNI, 16, QT_IQ4_BYTES,
       WD_F32, LOADW_IQ4)
DEF_KH(q6k_bw, TBW, ISUM6_BW, 8, KH_Q6K)
DEF_KH(q6k_vnni, TBW ",avx512vnni", ISUM6_VNNI, 16, KH_Q6K)
DEF_KH(q3k_bw, TBW, ISUM3_BW, 16, KH_Q3K)
DEF_KH(q3k_vnni, TBW ",avx512vnni", ISUM6_VNNI, 16, KH_Q3K)
DEF_KH(q2k_bw, TBW, ISUM3_BW, 16, KH_Q2K)
DEF_KH(q2k_vnni, TBW ",avx512vnni", ISUM6_VNNI, 16, KH_Q2K)

/* The activation quantizer (qmatmul.c's cpu_quantize_act, read it first),
 * a block of 32 in two zmm: the same operations per element (|x|, max,
 * x * (1/d), round to nearest even, clamp), so the same bits on finite
 * input (the block max and the int32 sum are exact in any order). vpmovsdb
 * narrows int32 to int8 in element order, where AVX2 needs two packs and a
 * permute. It matters on a tree or batch step: the calling thread
 * quantizes every matmul's input alone while the pool waits (on the AMD
 * EPYC Zen 5 VM, a 9-row verify step spent 5% of its time there). */
static __attribute__((target(TBW))) void quantize_avx512(const float *x, int n_tok, int64_t cols,
                                                         int8_t *q, float *d, float *s,
                                                         int32_t *sq) {
    const int64_t nb = cols / QT_COLS;
    const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    for (int t = 0; t < n_tok; t++) {
        for (int64_t b = 0; b < nb; b++) {
            const size_t at = (size_t)t * cols + b * QT_COLS;
            const __m512 v0 = _mm512_loadu_ps(x + at), v1 = _mm512_loadu_ps(x + at + 16);
            const float amax = _mm512_reduce_max_ps(
                _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const float db = amax / 127.0f;
            const float id = db != 0.0f ? 1.0f / db : 0.0f;
            const __m512 idv = _mm512_set1_ps(id);
            __m512 r0 = _mm512_roundscale_ps(_mm512_mul_ps(v0, idv),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512 r1 = _mm512_roundscale_ps(_mm512_mul_ps(v1, idv),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r0, lo), hi));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r1, lo), hi));
            _mm_storeu_si128((__m128i *)(q + at), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(q + at + 16), _mm512_cvtsepi32_epi8(q1));
            const int32_t total = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            d[(size_t)t * nb + b] = db;
            sq[(size_t)t * nb + b] = total;
            s[(size_t)t * nb + b] = db * (float)total;
        }
    }
}

int cpu_qkernels_avx512(cpu_kernel_set *ks, int vnni) {
    ks->qrows[CPU_Q4] = vnni ? q4_vnni : q4_bw;
    ks->qrows[CPU_Q8] = vnni ? q8_vnni : q8_bw;
    ks->qrows[CPU_IQ4] = vnni ? iq4_vnni : iq4_bw;
    ks->qrows[CPU_Q4K] = vnni ? q4k_vnni : q4k_bw;
    ks->qrows[CPU_Q5] = vnni ? q5_vnni : q5_bw;
    ks->qrows[CPU_Q5K] = vnni ? q5k_vnni : q5k_bw;
    ks->qrows[CPU_Q6K] = vnni ? q6k_vnni : q6k_bw;
    ks->qrows[CPU_Q2K] = vnni ? q2k_vnni : q2k_bw;
    ks->qrows[CPU_Q3K] = vnni ? q3k_vnni : q3k_bw;
    ks->quantize = quantize_avx512;
    return 1;
}

#else
int cpu_qkernels_avx512(cpu_kernel_set *ks, int vnni) {
    (void)ks, (void)vnni;
    return 0;
}
#endif
