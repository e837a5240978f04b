/* quant_avx512.c - AVX-512 dequantization and matmul kernels.
 *
 * Everything is built around one step: "expand a group of 32 weights into two
 * registers of 16 floats" (ex_* below, one per weight type). Then
 *
 *   - dequant stores the two registers (the expanders reproduce the reference
 *     arithmetic exactly, so results are bit-identical to quant_ref.c);
 *   - the matmul multiplies them with up to 8 token vectors at once, so a
 *     weight group read from memory and decoded once serves 8 tokens
 *     (decode is n_tok = 1; verifying a tree of 8 drafted tokens costs one
 *     decode of the weights plus 16 extra FMAs per group instead of 8 decodes).
 *
 * The weights stay in their file format; nothing is repacked or copied. The
 * matmul expanders may use FMA where the reference does a multiply then an
 * add (Q4_1, Q4_K); that moves each weight by at most half an ulp, well
 * inside the 1e-5 relative tolerance the tests use.
 *
 * Compiled with per-function target attributes (no -march), and only called
 * after matmul.c checked __builtin_cpu_supports. */
#include "quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define INL static inline __attribute__((always_inline)) T512

/* Tokens handled together per weight group: 8 tokens x 2 accumulators = 16
 * of the 32 zmm registers, leaving room for the weights and constants. */
#define NT_MAX 8

INL float h2f(uint16_t h) { return _cvtsh_ss(h); }

INL __m512 cvt_u8x16(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* ---- expanders: group g (weights 32g..32g+31) of a row ----------------- */
/* `exact` (a compile-time constant after inlining) selects the reference
 * operation order instead of FMA where the two differ. */

INL void ex_f32(const uint8_t *row, int64_t g, __m512 *w0, __m512 *w1, int exact) {
    (void)exact;
    const float *p = (const float *)(const void *)row + 32 * g;
    *w0 = _mm512_loadu_ps(p);
    *w1 = _mm512_loadu_ps(p + 16);
}

INL void ex_f16(const uint8_t *row, int64_t g, __m512 *w0, __m512 *w1, int exact) {
    (void)exact;
    const uint8_t *p = row + 64 * g;
    *w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    *w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
}

INL void ex_bf16(const uint8_t *row, int64_t g, __m512 *w0, __m512 *w1, int exact) {
    (void)exact;
    /* bf16 is the top half of an fp32: widen and shift left 16. */
    const uint8_t *p = row + 64 * g;
    __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 32)));
    *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
    *w1 = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
}

INL void ex_q8_0(const uint8_t *row, int64_t g, __m512 *w0, __m512 *w1, int exact) {
    (void)exact;
    const uint8_t *b = row + 34 * g;
    const __m512 d = _mm512_set1_ps(h2f(rd_u16(b)));
    __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
    __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)));
    *w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q0));
    *w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q1));
}

INL void ex_q4_0(const uint8_t *row, int64_t g, __m512 *w0, __m512 *w1, int exact) {
    (void)exact;
    const uint8_t *b = row + 18 * g;
    const float df = h2f(rd_u16(b));
    const __m512 d = _mm512_set1_ps(df);
    /* fma(q, d, -8d) rounds (q-8)*d once, exactly like the reference:
     * -8d is exact (a power-of-two multiple of an fp16 value). */
    const __m512 off = _mm512_set1_ps(-8.0f * df);
    __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
    __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(raw, _mm512_set1_epi32(0x0F)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(raw, 4));
    *w0 = _mm512_fmadd_ps(lo, d, off);
    *w1 = _mm512_fmadd_ps(hi, d, off);
}

INL void ex_q4_1(const uint8_t *row, int64_t g, __m512 *w0, __m512 *w1, int exact) {
    const uint8_t *b = row + 20 * g;
    const __m512 d = _mm512_set1_ps(h2f(rd_u16(b)));
    const __m512 m = _mm512_set1_ps(h2f(rd_u16(b + 2)));
    __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 4)));
    __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(raw, _mm512_set1_epi32(0x0F)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(raw, 4));
    if (exact) {
        *w0 = _mm512_add_ps(_mm512_mul_ps(lo, d), m);
        *w1 = _mm512_add_ps(_mm512_mul_ps(hi, d), m);
    } else {
        *w0 = _mm512_fmadd_ps(lo, d, m);
        *w1 = _mm512_fmadd_ps(hi, d, m);
    }
}

INL void ex_q4_k(const uint8_t *row, int64_t g, __m512 *w0, __m512 *w1, int exact) {
    const uint8_t *b = row + 144 * (g >> 3);
    const int j = (int)(g & 7);
    uint8_t sc, mn;
    q4k_scale_min(j, b + Q4K_SCALES, &sc, &mn);
    const __m512 ds = _mm512_set1_ps(h2f(rd_u16(b + Q4K_D)) * (float)sc);
    const __m512 ms = _mm512_set1_ps(h2f(rd_u16(b + Q4K_DMIN)) * (float)mn);
    /* Sub-blocks 2i and 2i+1 share bytes 32i..32i+31 (low/high nibbles). */
    const uint8_t *q = b + Q4K_QS + 32 * (j >> 1);
    const __m128i shift = _mm_cvtsi32_si128(4 * (j & 1));
    const __m512i mask = _mm512_set1_epi32(0x0F);
    __m512i r0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    __m512i r1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)));
    __m512 q0 = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srl_epi32(r0, shift), mask));
    __m512 q1 = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srl_epi32(r1, shift), mask));
    if (exact) {
        *w0 = _mm512_sub_ps(_mm512_mul_ps(ds, q0), ms);
        *w1 = _mm512_sub_ps(_mm512_mul_ps(ds, q1), ms);
    } else {
        *w0 = _mm512_fmsub_ps(ds, q0, ms);
        *w1 = _mm512_fmsub_ps(ds, q1, ms);
    }
}

/* 16 Q6_K quants (signed, q - 32) as bytes: 4 bits from ql (nibble chosen by
 * `sl`), 2 bits from qh (bits sh, sh+1). Byte-wise work in 128-bit lanes is
 * four times denser than working on widened 32-bit lanes. */
INL __m128i q6k_bytes(const uint8_t *ql, const uint8_t *qh, __m128i sl, __m128i sh) {
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(0x30);
    __m128i l = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)ql), sl), m4);
    __m128i h = _mm_srl_epi16(_mm_loadu_si128((const __m128i *)qh), sh);
    h = _mm_and_si128(_mm_slli_epi16(h, 4), m2);
    return _mm_sub_epi8(_mm_or_si128(l, h), _mm_set1_epi8(32));
}

INL void ex_q6_k(const uint8_t *row, int64_t g, __m512 *w0, __m512 *w1, int exact) {
    (void)exact;
    const uint8_t *b = row + 210 * (g >> 3);
    const int j = (int)(g & 7), h = j >> 2, k = j & 3;
    const float d = h2f(rd_u16(b + Q6K_D));
    const uint8_t *ql = b + Q6K_QL + 64 * h + 32 * (k & 1);
    const uint8_t *qh = b + Q6K_QH + 32 * h;
    const int8_t *sc = (const int8_t *)(b + Q6K_SCALES) + 8 * h + 2 * k;
    const __m128i sl = _mm_cvtsi32_si128(4 * (k >> 1)), sh = _mm_cvtsi32_si128(2 * k);
    /* The reference computes (d*sc) * q; so do we. */
    const __m512 s0 = _mm512_set1_ps(d * (float)sc[0]);
    const __m512 s1 = _mm512_set1_ps(d * (float)sc[1]);
    __m128i q0 = q6k_bytes(ql, qh, sl, sh);
    __m128i q1 = q6k_bytes(ql + 16, qh + 16, sl, sh);
    *w0 = _mm512_mul_ps(s0, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)));
    *w1 = _mm512_mul_ps(s1, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)));
}

/* ---- kernels generated per type ----------------------------------------- */

/* out[t] = row . x_t for nt tokens (x_t = x + t*ldx), over ng groups of 32.
 * nt is a constant at every call site, so the loops over t unroll and the
 * accumulators live in registers. Two accumulators per token keep two
 * independent FMA chains per group. */
#define DEF_TILE(TY)                                                                          \
    INL void tile_##TY(const uint8_t *row, int64_t ng, const float *x, int64_t ldx, int nt,   \
                       float *out) {                                                          \
        __m512 acc[NT_MAX][2];                                                                \
        for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();             \
        for (int64_t g = 0; g < ng; g++) {                                                    \
            __m512 w0, w1;                                                                    \
            ex_##TY(row, g, &w0, &w1, 0);                                                     \
            const float *xg = x + 32 * g;                                                     \
            for (int t = 0; t < nt; t++) {                                                    \
                acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xg + t * ldx), acc[t][0]);    \
                acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xg + t * ldx + 16), acc[t][1]); \
            }                                                                                 \
        }                                                                                     \
        for (int t = 0; t < nt; t++)                                                          \
            out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));               \
    }

/* Rows [r0, r1) for all tokens. Tokens go in groups of up to NT_MAX in the
 * outer loop so that a group's activations (8 x cols floats) stay in L1 while
 * the rows of this task (a few KB of quantized weights) stream past them.
 * `tail` handles row lengths that are not a multiple of 32 (plain types
 * only; quantized rows are whole blocks). */
#define DEF_ROWS(TY, TYPE)                                                                    \
    DEF_TILE(TY)                                                                              \
    static T512 void rows_##TY(const uint8_t *w, size_t row_bytes, int64_t cols,              \
                               const float *x, int n_tok, float *y, int64_t ldy, int64_t r0,  \
                               int64_t r1) {                                                  \
        const int64_t ng = cols / 32, done = ng * 32;                                         \
        for (int t0 = 0; t0 < n_tok; t0 += NT_MAX) {                                          \
            const int nt = n_tok - t0 < NT_MAX ? n_tok - t0 : NT_MAX;                         \
            const float *xt = x + (int64_t)t0 * cols;                                         \
            for (int64_t r = r0; r < r1; r++) {                                               \
                const uint8_t *row = w + r * row_bytes;                                       \
                float out[NT_MAX] = {0};                                                      \
                switch (nt) {                                                                 \
                case 1: tile_##TY(row, ng, xt, cols, 1, out); break;                          \
                case 2: tile_##TY(row, ng, xt, cols, 2, out); break;                          \
                case 3: tile_##TY(row, ng, xt, cols, 3, out); break;                          \
                case 4: tile_##TY(row, ng, xt, cols, 4, out); break;                          \
                case 5: tile_##TY(row, ng, xt, cols, 5, out); break;                          \
                case 6: tile_##TY(row, ng, xt, cols, 6, out); break;                          \
                case 7: tile_##TY(row, ng, xt, cols, 7, out); break;                          \
                default: tile_##TY(row, ng, xt, cols, 8, out); break;                         \
                }                                                                             \
                if (done < cols) plain_tail(TYPE, row, done, cols, xt, nt, out);              \
                for (int t = 0; t < nt; t++) y[(int64_t)(t0 + t) * ldy + r] = out[t];         \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static T512 void deq_##TY(const void *src, float *dst, int64_t n) {                       \
        const uint8_t *s = src;                                                               \
        const int64_t ng = n / 32;                                                            \
        for (int64_t g = 0; g < ng; g++) {                                                    \
            __m512 w0, w1;                                                                    \
            ex_##TY(s, g, &w0, &w1, 1);                                                       \
            _mm512_storeu_ps(dst + 32 * g, w0);                                               \
            _mm512_storeu_ps(dst + 32 * g + 16, w1);                                          \
        }                                                                                     \
        if (ng * 32 < n) plain_tail_deq(TYPE, s, ng * 32, n, dst);                            \
    }

/* The last cols % 32 elements of a plain-typed (F32/F16/BF16) row. */
static void plain_tail(specd_dtype type, const uint8_t *row, int64_t from, int64_t cols,
                       const float *x, int nt, float *out) {
    const int64_t esz = type == SPECD_F32 ? 4 : 2;
    float w[32];
    cpu_dequant_ref_fn(type)(row + from * esz, w, cols - from);
    for (int t = 0; t < nt; t++)
        for (int64_t c = from; c < cols; c++) out[t] += w[c - from] * x[t * cols + c];
}

static void plain_tail_deq(specd_dtype type, const uint8_t *src, int64_t from, int64_t n,
                           float *dst) {
    const int64_t esz = type == SPECD_F32 ? 4 : 2;
    cpu_dequant_ref_fn(type)(src + from * esz, dst + from, n - from);
}

DEF_ROWS(f32, SPECD_F32)
DEF_ROWS(f16, SPECD_F16)
DEF_ROWS(bf16, SPECD_BF16)
DEF_ROWS(q8_0, SPECD_Q8_0)
DEF_ROWS(q4_0, SPECD_Q4_0)
DEF_ROWS(q4_1, SPECD_Q4_1)
DEF_ROWS(q4_k, SPECD_Q4_K)
DEF_ROWS(q6_k, SPECD_Q6_K)

int cpu_kernels_avx512(cpu_kernel_set *ks) {
    memset(ks, 0, sizeof *ks);
    ks->name = "avx512";
#define SET(TY, TYPE)                  \
    ks->dequant[TYPE] = deq_##TY;      \
    ks->rows[TYPE] = rows_##TY;
    SET(f32, SPECD_F32)
    SET(f16, SPECD_F16)
    SET(bf16, SPECD_BF16)
    SET(q8_0, SPECD_Q8_0)
    SET(q4_0, SPECD_Q4_0)
    SET(q4_1, SPECD_Q4_1)
    SET(q4_k, SPECD_Q4_K)
    SET(q6_k, SPECD_Q6_K)
#undef SET
    return 1;
}

#else /* not x86 */

int cpu_kernels_avx512(cpu_kernel_set *ks) {
    (void)ks;
    return 0;
}

#endif
