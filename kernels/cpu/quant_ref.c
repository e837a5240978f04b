/* quant_ref.c - plain-C reference dequantization and matmul.
 *
 * These functions define what the fast kernels must compute. They are written
 * for clarity, one loop per block layout, following GGML's definitions:
 *
 *   Q8_0  32 weights: fp16 d, 32 x int8 q            w = d * q
 *   Q4_0  32 weights: fp16 d, 16 bytes of nibbles    w = (q - 8) * d
 *   Q4_1  32 weights: fp16 d, fp16 m, 16 bytes       w = q * d + m
 *         (byte j holds element j in its low nibble, element j+16 in its high)
 *   Q5_0  32 weights: fp16 d, 4 bytes qh, 16 bytes    w = (q - 16) * d
 *   Q5_1  32 weights: fp16 d, fp16 m, qh, 16 bytes    w = q * d + m
 *         (Q4's nibbles, and element j's fifth bit at bit j of qh)
 *   Q4_K  256 weights: fp16 d, fp16 dmin, 12 bytes of 6-bit sub-block scales
 *         and mins, 128 bytes of nibbles; sub-block s (32 weights) has
 *         w = d*sc[s] * q - dmin*mn[s]; bytes 32*i..32*i+31 hold sub-block 2i
 *         in low nibbles and 2i+1 in high nibbles
 *   Q5_K  256 weights: Q4_K's fields and 32 bytes qh between scales and qs:
 *         element l of sub-block s gets bit s of qh[l] as its fifth bit
 *   Q6_K  256 weights: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits),
 *         16 int8 sub-block scales (16 weights each), fp16 d;
 *         w = d*sc[s] * (q - 32)
 *   Q2_K  256 weights: 16 bytes of 4-bit sub-block scales and mins (16
 *         weights each), 64 bytes of 2-bit quants, fp16 d, fp16 dmin;
 *         w = d*sc[s] * q - dmin*mn[s]
 *   IQ4_NL 32 weights: fp16 d, 16 bytes of nibbles (Q4_0's order)
 *         w = d * k_iq4nl[q] (GGML's 16 non-linear int8 levels)
 *   IQ4_XS 256 weights: fp16 d, 6-bit block scales (2 high bits each in a
 *         uint16, 4 low bits in 4 bytes), 128 bytes of nibbles;
 *         block j: w = d*(sc[j] - 32) * k_iq4nl[q]
 *   Q3_K  256 weights: 32 bytes hmask (the third bit), 64 bytes of 2-bit
 *         quants (Q2_K's order), 12 bytes of 6-bit scales, fp16 d;
 *         w = d*(sc[s] - 32) * q, q = low bits - (high bit ? 0 : 4)
 *
 * The order of float operations (e.g. (d*sc)*q, q*d + m as a multiply then an
 * add) is part of the definition: the SIMD dequantizers reproduce it exactly,
 * so dequantized rows compare bit for bit. The reference matmul accumulates
 * in double so that it is a trustworthy yardstick for the float kernels. */
#include <stdio.h>
#include <stdlib.h>

#include "matmul.h"
#include "quant_impl.h"

static void deq_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void deq_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = specd_fp16_to_f32(rd_u16(p + 2 * i));
}

static void deq_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = specd_bf16_to_f32(rd_u16(p + 2 * i));
}

static void deq_q8_0(const void *src, float *dst, int64_t n) {
    const blk_q8_0 *b = src;
    for (int64_t i = 0; i < n / 32; i++, dst += 32) {
        const float d = specd_fp16_to_f32(b[i].d);
        for (int j = 0; j < 32; j++) dst[j] = d * (float)b[i].qs[j];
    }
}

static void deq_q4_0(const void *src, float *dst, int64_t n) {
    const blk_q4_0 *b = src;
    for (int64_t i = 0; i < n / 32; i++, dst += 32) {
        const float d = specd_fp16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            dst[j] = (float)((b[i].qs[j] & 0x0F) - 8) * d;
            dst[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const void *src, float *dst, int64_t n) {
    const blk_q4_1 *b = src;
    for (int64_t i = 0; i < n / 32; i++, dst += 32) {
        const float d = specd_fp16_to_f32(b[i].d);
        const float m = specd_fp16_to_f32(b[i].m);
        for (int j = 0; j < 16; j++) {
            /* Separate statements: a compiler allowed to contract `q*d + m`
             * into an FMA would round differently from the SIMD twins. */
            float lo = (float)(b[i].qs[j] & 0x0F) * d;
            float hi = (float)(b[i].qs[j] >> 4) * d;
            dst[j] = lo + m;
            dst[j + 16] = hi + m;
        }
    }
}

/* One Q4_K or Q5_K super-block (qh NULL for Q4_K): sub-block s takes
 * nibbles from bytes 32 * (s / 2) .. + 31 (low for even s, high for odd)
 * and, for Q5_K, element l's fifth bit from bit s of qh[l]. */
static void deq_kmin_block(uint16_t dh, uint16_t dminh, const uint8_t *scales,
                           const uint8_t *qs, const uint8_t *qh, float *dst) {
    const float d = specd_fp16_to_f32(dh);
    const float dmin = specd_fp16_to_f32(dminh);
    for (int s = 0; s < 8; s++) {
        uint8_t sc, mn;
        q4k_scale_min(s, scales, &sc, &mn);
        const float ds = d * (float)sc;
        const float ms = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (s / 2);
        const int shift = (s & 1) ? 4 : 0;
        for (int l = 0; l < 32; l++) {
            const int v = ((q[l] >> shift) & 0x0F) | (qh ? ((qh[l] >> s) & 1) << 4 : 0);
            float w = ds * (float)v; /* then - ms: no FMA */
            *dst++ = w - ms;
        }
    }
}

static void deq_q4_k(const void *src, float *dst, int64_t n) {
    const blk_q4_k *b = src;
    for (int64_t i = 0; i < n / 256; i++, dst += 256)
        deq_kmin_block(b[i].d, b[i].dmin, b[i].scales, b[i].qs, NULL, dst);
}

static void deq_q5_k(const void *src, float *dst, int64_t n) {
    const blk_q5_k *b = src;
    for (int64_t i = 0; i < n / 256; i++, dst += 256)
        deq_kmin_block(b[i].d, b[i].dmin, b[i].scales, b[i].qs, b[i].qh, dst);
}

static void deq_q6_k(const void *src, float *dst, int64_t n) {
    const blk_q6_k *b = src;
    for (int64_t i = 0; i < n / 256; i++) {
        const float d = specd_fp16_to_f32(b[i].d);
        /* Two halves of 128 weights; in each, element l of quarter k
         * (l < 32, k < 4) takes 4 bits from ql (byte l or l+32, low or high
         * nibble) and 2 bits from qh[l] (bits 2k, 2k+1). */
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b[i].ql + 64 * h;
            const uint8_t *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            for (int k = 0; k < 4; k++) {
                for (int l = 0; l < 32; l++) {
                    int lo = (ql[l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0x0F;
                    int hi = (qh[l] >> (2 * k)) & 3;
                    int q = (lo | (hi << 4)) - 32;
                    const float s = d * (float)sc[2 * k + l / 16];
                    dst[128 * h + 32 * k + l] = s * (float)q;
                }
            }
        }
        dst += 256;
    }
}

/* Q2_K and Q3_K: group g (32 weights) takes bits 2(g % 4).. of the 32
 * bytes at qs + 32 (g / 4), sub-blocks 2g and 2g + 1 (quant_impl.h). */
static void deq_q2_k(const void *src, float *dst, int64_t n) {
    const blk_q2_k *b = src;
    for (int64_t i = 0; i < n / 256; i++) {
        const float d = specd_fp16_to_f32(b[i].d), dmin = specd_fp16_to_f32(b[i].dmin);
        for (int g = 0; g < 8; g++) {
            int shift;
            const uint8_t *q = k2_group(b[i].qs, g, &shift);
            for (int l = 0; l < 32; l++) {
                const uint8_t sc = b[i].scales[2 * g + l / 16];
                const float dl = d * (float)(sc & 0x0F), ml = dmin * (float)(sc >> 4);
                const float v = dl * (float)((q[l] >> shift) & 3); /* then - ml: no FMA */
                dst[32 * g + l] = v - ml;
            }
        }
        dst += 256;
    }
}

static void deq_q3_k(const void *src, float *dst, int64_t n) {
    const blk_q3_k *b = src;
    for (int64_t i = 0; i < n / 256; i++) {
        const float d = specd_fp16_to_f32(b[i].d);
        for (int g = 0; g < 8; g++)
            for (int l = 0; l < 32; l++) {
                const float dl = d * (float)q3k_scale(b[i].scales, 2 * g + l / 16);
                dst[32 * g + l] = dl * (float)q3k_quant((const uint8_t *)&b[i], g, l);
            }
        dst += 256;
    }
}

static void deq_iq4_nl(const void *src, float *dst, int64_t n) {
    const blk_iq4_nl *b = src;
    for (int64_t i = 0; i < n / 32; i++, dst += 32) {
        const float d = specd_fp16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)k_iq4nl[b[i].qs[j] & 0x0F];
            dst[j + 16] = d * (float)k_iq4nl[b[i].qs[j] >> 4];
        }
    }
}

static void deq_iq4_xs(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / 256; i++, p += sizeof(blk_iq4_xs)) {
        const float d = specd_fp16_to_f32(rd_u16(p));
        for (int j = 0; j < 8; j++, dst += 32) {
            const float dl = d * (float)iq4xs_scale(p, j);
            const uint8_t *qs = p + IQ4XS_QS + 16 * j;
            for (int k = 0; k < 16; k++) {
                dst[k] = dl * (float)k_iq4nl[qs[k] & 0x0F];
                dst[k + 16] = dl * (float)k_iq4nl[qs[k] >> 4];
            }
        }
    }
}

void cpu_quantize_row_q8_0(const float *x, void *dst, int64_t n) {
    uint8_t *out = dst; /* blocks by byte offset: dst may sit at any even address */
    for (int64_t b = 0; b < n / 32; b++, x += 32, out += sizeof(blk_q8_0)) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
        const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        const uint16_t dh = specd_f32_to_fp16(d);
        memcpy(out + offsetof(blk_q8_0, d), &dh, 2);
        for (int j = 0; j < 32; j++) {
            const float r = roundf(x[j] * id); /* within [-127, 127] unless NaN */
            out[offsetof(blk_q8_0, qs) + (size_t)j] = (uint8_t)(int8_t)(r == r ? r : 0.0f);
        }
    }
}

/* A 5-bit block's q of element j: Q4's nibble, the fifth bit from qh. */
static int q5_value(const uint8_t *qs, uint32_t qh, int j) {
    const int nib = j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
    return nib | (int)((qh >> j) & 1) << 4;
}

static void deq_q5_0(const void *src, float *dst, int64_t n) {
    const blk_q5_0 *b = src;
    for (int64_t i = 0; i < n / 32; i++, dst += 32) {
        const float d = specd_fp16_to_f32(b[i].d);
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        for (int j = 0; j < 32; j++) dst[j] = (float)(q5_value(b[i].qs, qh, j) - 16) * d;
    }
}

static void deq_q5_1(const void *src, float *dst, int64_t n) {
    const blk_q5_1 *b = src;
    for (int64_t i = 0; i < n / 32; i++, dst += 32) {
        const float d = specd_fp16_to_f32(b[i].d);
        const float m = specd_fp16_to_f32(b[i].m);
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        for (int j = 0; j < 32; j++) {
            float v = (float)q5_value(b[i].qs, qh, j) * d; /* then + m: no FMA (deq_q4_1) */
            dst[j] = v + m;
        }
    }
}

cpu_dequant_fn cpu_dequant_ref_fn(specd_dtype type) {
    switch (type) {
    case SPECD_F32: return deq_f32;
    case SPECD_F16: return deq_f16;
    case SPECD_BF16: return deq_bf16;
    case SPECD_Q8_0: return deq_q8_0;
    case SPECD_Q4_0: return deq_q4_0;
    case SPECD_Q4_1: return deq_q4_1;
    case SPECD_Q5_0: return deq_q5_0;
    case SPECD_Q5_1: return deq_q5_1;
    case SPECD_Q4_K: return deq_q4_k;
    case SPECD_Q5_K: return deq_q5_k;
    case SPECD_Q6_K: return deq_q6_k;
    case SPECD_Q2_K: return deq_q2_k;
    case SPECD_Q3_K: return deq_q3_k;
    case SPECD_IQ4_NL: return deq_iq4_nl;
    case SPECD_IQ4_XS: return deq_iq4_xs;
    default: return NULL;
    }
}

void cpu_dequant_row_ref(specd_dtype type, const void *src, float *dst, int64_t n) {
    cpu_dequant_fn f = cpu_dequant_ref_fn(type);
    if (!f) {
        /* Model validation rejects unsupported types long before this. */
        fprintf(stderr, "cpu_dequant_row_ref: unsupported type %d\n", (int)type);
        abort();
    }
    f(src, dst, n);
}

void cpu_matmul_ref(float *y, const specd_tensor *W, const float *x, int n_tok) {
    const int64_t cols = (int64_t)W->ne[0], rows = (int64_t)W->ne[1];
    const specd_dtype_info *info = specd_dtype_get(W->type);
    const size_t row_bytes = (size_t)(cols / info->block_elems) * info->block_bytes;
    float *w = malloc((size_t)cols * sizeof(float));
    if (!w) abort();
    for (int64_t r = 0; r < rows; r++) {
        cpu_dequant_row_ref(W->type, (const uint8_t *)W->data + r * row_bytes, w, cols);
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (int64_t)t * cols;
            double acc = 0.0;
            for (int64_t c = 0; c < cols; c++) acc += (double)w[c] * (double)xt[c];
            y[(int64_t)t * rows + r] = (float)acc;
        }
    }
    free(w);
}
