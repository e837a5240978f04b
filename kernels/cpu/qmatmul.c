/* qmatmul.c - the integer-activation path's portable parts: repacking
 * weights into tiles, quantizing activations, and the scalar twin of the
 * SIMD kernels (see qmatmul.h for the layouts and the operation order every
 * path follows). The dispatcher that runs the SIMD kernels over the thread
 * pool is cpu_qmatmul in matmul.c, beside the fp32 one. */
#include "qmatmul.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/dtype.h"
#include "common/spec/sampling.h"
#include "quant_impl.h"

/* ---- repacking ------------------------------------------------------------ */

/* Copies row i's block into tile slot i. Q4_0/Q4_1 keep their nibble order:
 * byte k (k < 16) of a GGML block holds weight k in its low nibble and
 * weight k + 16 in its high nibble, which is exactly what tile byte
 * qs[v][4i + j] (k = 4v + j) needs, so the 16 bytes move as 4 runs of 4. */
static void tile_put_q4(uint8_t *tile, int i, uint16_t d, uint16_t m, const uint8_t *qs16) {
    memcpy(tile + 2 * i, &d, 2);
    memcpy(tile + 32 + 2 * i, &m, 2);
    for (int v = 0; v < 4; v++) memcpy(tile + 64 + 64 * v + 4 * i, qs16 + 4 * v, 4);
}

/* A Q5 tile: Q4's part, then element c's fifth bit (bit c of the block's
 * little-endian qh) at bit c / 4 of hi byte 4i + c % 4. */
static void tile_put_q5(uint8_t *tile, int i, uint16_t d, uint16_t m, const uint8_t *qh4,
                        const uint8_t *qs16) {
    tile_put_q4(tile, i, d, m, qs16);
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    for (int c = 0; c < QT_COLS; c++)
        tile[QT_Q4_BYTES + 4 * i + c % 4] |= (uint8_t)(((qh >> c) & 1) << (c / 4));
}

/* m = -k d for Q4_0 (k 8) and Q5_0 (k 16) as fp16, or 0 where that is not
 * exact (d so large that it overflows): such a matrix keeps the fp32 path. */
static int offset_fp16(uint16_t d, float k, uint16_t *mh) {
    const float m = -k * specd_fp16_to_f32(d);
    *mh = specd_f32_to_fp16(m);
    return specd_fp16_to_f32(*mh) == m;
}

static void tile_put_q8(uint8_t *tile, int i, uint16_t d, const uint8_t *qs32) {
    memcpy(tile + 2 * i, &d, 2);
    for (int v = 0; v < 8; v++) memcpy(tile + 32 + 64 * v + 4 * i, qs32 + 4 * v, 4);
}

/* An IQ4 tile: fp32 scales, then the nibbles as a Q4 tile holds them
 * (IQ4_NL's and IQ4_XS's blocks have Q4_0's nibble order). */
static void tile_put_iq4(uint8_t *tile, int i, float d, const uint8_t *qs16) {
    memcpy(tile + 4 * i, &d, 4);
    for (int v = 0; v < 4; v++) memcpy(tile + 64 + 64 * v + 4 * i, qs16 + 4 * v, 4);
}

static void put_f32(uint8_t *p, float v) { memcpy(p, &v, 4); }

/* A 2-bit value of column c (0..31) of row i into the plane at p (two
 * 64-byte registers: chunk c / 4 = 4k + e at bits 2e, 2e+1 of byte 4i + j
 * of register k), the layout of Q6K's top bits and of Q2K's and Q3K's
 * low bits. */
static void put_2bit(uint8_t *p, int i, int c, int v) {
    const int chunk = c / 4;
    p[64 * (chunk / 4) + 4 * i + c % 4] |= (uint8_t)((v & 3) << (2 * (chunk % 4)));
}

/* Row i of a Q4_K (or, with qh, Q5_K) super-block into its row group's
 * header and 8 tiles (qmatmul.h): sub-block s's nibbles sit in bytes
 * 32 * (s / 2) .. + 31, low nibbles for even s, high for odd; a Q4 tile
 * wants byte k to hold weights k and k + 16 of the block. Q5_K's fifth bit
 * of element l of sub-block s is bit s of qh[l]. */
static void sb_put_q4k(uint8_t *sb, int i, const uint8_t *blk, const uint8_t *qs,
                       const uint8_t *qh) {
    const size_t tile_bytes = qh ? QT_Q5K_BYTES : QT_Q4K_BYTES;
    put_f32(sb + 4 * i, specd_fp16_to_f32(rd_u16(blk + Q4K_D)));
    put_f32(sb + 64 + 4 * i, -specd_fp16_to_f32(rd_u16(blk + Q4K_DMIN)));
    for (int s = 0; s < QT_SB_BLOCKS; s++) {
        uint8_t *tile = sb + QT_Q4K_HDR + s * tile_bytes;
        uint8_t sc, mn, qs16[16];
        q4k_scale_min(s, blk + Q4K_SCALES, &sc, &mn);
        tile[i] = sc;
        tile[16 + i] = mn;
        const uint8_t *src = qs + 32 * (s / 2);
        const int shift = (s & 1) ? 4 : 0;
        for (int k = 0; k < 16; k++)
            qs16[k] = (uint8_t)(((src[k] >> shift) & 15) | (((src[k + 16] >> shift) & 15) << 4));
        for (int v = 0; v < 4; v++) memcpy(tile + 32 + 64 * v + 4 * i, qs16 + 4 * v, 4);
        if (qh) /* as tile_put_q5: column c's bit at bit c / 4 of hi byte 4i + c % 4 */
            for (int c = 0; c < QT_COLS; c++)
                tile[QT_Q4K_BYTES + 4 * i + c % 4] |= (uint8_t)(((qh[c] >> s) & 1) << (c / 4));
    }
}

/* Row i of a Q6_K super-block likewise. Weight e (0..255) of the block:
 * half h = e / 128, quarter k = e % 128 / 32, l = e % 32: its low 4 bits
 * in ql[64h + l + 32(k & 1)] (nibble k >> 1), its top 2 in qh[32h + l]
 * (bits 2k, 2k+1), its scale scales[e / 16] (quant_ref.c's deq_q6_k). */
/* Column c (0..31) of row i of a Q6K tile holds q (0..63): its low 4 bits
 * in Q4's nibble order, its top 2 at bits 2(chunk % 4) of hi[chunk / 4]. */
static void q6k_tile_put(uint8_t *tile, int i, int c, int q) {
    const int chunk = c / 4, j = c % 4;
    tile[32 + 64 * (chunk % 4) + 4 * i + j] |= (uint8_t)(chunk < 4 ? q & 15 : (q & 15) << 4);
    put_2bit(tile + 288, i, c, q >> 4);
}

static void sb_put_q6k(uint8_t *sb, int i, const uint8_t *blk) {
    put_f32(sb + 4 * i, specd_fp16_to_f32(rd_u16(blk + Q6K_D)));
    for (int s = 0; s < QT_SB_BLOCKS; s++) {
        uint8_t *tile = sb + QT_Q6K_HDR + s * QT_Q6K_BYTES;
        tile[i] = (uint8_t)blk[Q6K_SCALES + 2 * s];
        tile[16 + i] = (uint8_t)blk[Q6K_SCALES + 2 * s + 1];
        for (int c = 0; c < 32; c++) {
            const int e = 32 * s + c, h = e / 128, k = e % 128 / 32, l = e % 32;
            const int lo = (blk[Q6K_QL + 64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
            const int hi = (blk[Q6K_QH + 32 * h + l] >> (2 * k)) & 3;
            q6k_tile_put(tile, i, c, lo | hi << 4);
        }
    }
}

/* Row i of a Q3_K super-block into Q3K tiles: w = (d * sc) * v with v =
 * -4..3 (q3k_quant) and sc = q3k_scale (-32..31, an int8) is (d * sc) *
 * (q - 4) with q = v + 4: its low 2 bits in the 2-bit plane, its third
 * bit where a Q5 tile keeps its fifth (bit c / 4 of hi byte 4i + c % 4). */
static void sb_put_q3k(uint8_t *sb, int i, const uint8_t *blk) {
    put_f32(sb + 4 * i, specd_fp16_to_f32(rd_u16(blk + Q3K_D)));
    for (int s = 0; s < QT_SB_BLOCKS; s++) {
        uint8_t *tile = sb + QT_Q6K_HDR + s * QT_Q3K_BYTES;
        tile[i] = (uint8_t)(int8_t)q3k_scale(blk + Q3K_SCALES, 2 * s);
        tile[16 + i] = (uint8_t)(int8_t)q3k_scale(blk + Q3K_SCALES, 2 * s + 1);
        for (int c = 0; c < 32; c++) {
            const int q = q3k_quant(blk, s, c) + 4;
            put_2bit(tile + 32, i, c, q);
            tile[160 + 4 * i + c % 4] |= (uint8_t)((q >> 2) << (c / 4));
        }
    }
}

/* Row i of a Q2_K super-block: Q4K's header (d, -dmin), and per group s
 * (32 columns, sub-blocks 2s and 2s + 1) the two scale bytes as they are
 * and each column's 2-bit q in the 2-bit plane. */
static void sb_put_q2k(uint8_t *sb, int i, const uint8_t *blk) {
    put_f32(sb + 4 * i, specd_fp16_to_f32(rd_u16(blk + Q2K_D)));
    put_f32(sb + 64 + 4 * i, -specd_fp16_to_f32(rd_u16(blk + Q2K_DMIN)));
    for (int s = 0; s < QT_SB_BLOCKS; s++) {
        uint8_t *tile = sb + QT_Q4K_HDR + s * QT_Q2K_BYTES;
        tile[i] = blk[Q2K_SCALES + 2 * s];
        tile[16 + i] = blk[Q2K_SCALES + 2 * s + 1];
        int shift;
        const uint8_t *q = k2_group(blk + Q2K_QS, s, &shift);
        for (int c = 0; c < 32; c++) put_2bit(tile + 32, i, c, q[c] >> shift);
    }
}

int cpu_qweight_make(const specd_tensor *t, cpu_qweight *out, cpu_arena *arena) {
    memset(out, 0, sizeof *out);
    cpu_qkind kind;
    switch (t->type) {
    case SPECD_Q4_0:
    case SPECD_Q4_1: kind = CPU_Q4; break;
    case SPECD_Q8_0: kind = CPU_Q8; break;
    case SPECD_IQ4_NL:
    case SPECD_IQ4_XS: kind = CPU_IQ4; break;
    case SPECD_Q5_0:
    case SPECD_Q5_1: kind = CPU_Q5; break;
    case SPECD_Q4_K: kind = CPU_Q4K; break;
    case SPECD_Q5_K: kind = CPU_Q5K; break;
    case SPECD_Q6_K: kind = CPU_Q6K; break;
    case SPECD_Q3_K: kind = CPU_Q3K; break;
    case SPECD_Q2_K: kind = CPU_Q2K; break;
    default: return 0;
    }
    /* super-blocks of 256 */
    const int ksb = kind == CPU_Q4K || kind == CPU_Q5K || kind == CPU_Q6K || kind == CPU_Q3K ||
                    kind == CPU_Q2K;
    const int sb_rows = ksb || t->type == SPECD_IQ4_XS; /* rows of whole 256-blocks */
    const int64_t cols = (int64_t)t->ne[0], rows = t->n_dims > 1 ? (int64_t)t->ne[1] : 1;
    if (cols <= 0 || cols % (sb_rows ? QT_COLS * QT_SB_BLOCKS : QT_COLS) != 0 || rows <= 0 ||
        !t->data)
        return -1;
    const specd_dtype_info *in = specd_dtype_get(t->type);
    const size_t row_bytes = (size_t)(cols / in->block_elems) * in->block_bytes;
    out->kind = kind;
    out->rows = rows;
    out->cols = cols;
    out->nb = cols / QT_COLS;
    out->n_groups = (rows + QT_ROWS - 1) / QT_ROWS;
    static const size_t tile_bytes[CPU_QKINDS] = {QT_Q4_BYTES,  QT_Q8_BYTES,  QT_Q4K_BYTES,
                                                  QT_Q6K_BYTES, QT_Q5_BYTES,  QT_Q5K_BYTES,
                                                  QT_IQ4_BYTES, QT_Q2K_BYTES, QT_Q3K_BYTES};
    static const size_t sb_bytes[CPU_QKINDS] = {0, 0, QT_Q4K_SB, QT_Q6K_SB, 0,
                                                QT_Q5K_SB, 0, QT_Q2K_SB, QT_Q3K_SB};
    out->tile_bytes = tile_bytes[kind];
    const int64_t n_sb = out->nb / QT_SB_BLOCKS;
    out->group_bytes = ksb ? (size_t)n_sb * sb_bytes[kind] : (size_t)out->nb * out->tile_bytes;
    size_t bytes = cpu_qweight_bytes(out);
    /* zeroed: padding rows must be zero (an arena's memory is fresh) */
    if (arena) {
        out->data = cpu_arena_alloc(arena, bytes);
        if (!out->data) return -1;
    } else {
        out->data = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!out->data) return -1;
        memset(out->data, 0, bytes);
        out->owned = 1;
    }
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *src = (const uint8_t *)t->data + (size_t)r * row_bytes;
        const int64_t g = r / QT_ROWS;
        const int i = (int)(r % QT_ROWS);
        if (ksb) {
            for (int64_t k = 0; k < n_sb; k++) {
                uint8_t *sb = out->data + (size_t)g * out->group_bytes + (size_t)k * sb_bytes[kind];
                const uint8_t *blk = src + (size_t)k * in->block_bytes;
                if (kind == CPU_Q4K) sb_put_q4k(sb, i, blk, blk + Q4K_QS, NULL);
                else if (kind == CPU_Q5K) sb_put_q4k(sb, i, blk, blk + Q5K_QS, blk + Q5K_QH);
                else if (kind == CPU_Q2K) sb_put_q2k(sb, i, blk);
                else if (kind == CPU_Q3K) sb_put_q3k(sb, i, blk);
                else sb_put_q6k(sb, i, blk);
            }
            continue;
        }
        for (int64_t b = 0; b < out->nb; b++) {
            uint8_t *tile = out->data + (size_t)(g * out->nb + b) * out->tile_bytes;
            const uint8_t *blk = src + (size_t)b * in->block_bytes;
            if (t->type == SPECD_Q8_0) {
                tile_put_q8(tile, i, rd_u16(blk), blk + 2);
            } else if (t->type == SPECD_IQ4_NL) {
                tile_put_iq4(tile, i, specd_fp16_to_f32(rd_u16(blk)), blk + 2);
            } else if (t->type == SPECD_IQ4_XS) { /* block b % 8 of super-block b / 8 */
                const uint8_t *sb = src + (size_t)(b / QT_SB_BLOCKS) * in->block_bytes;
                const int j = (int)(b % QT_SB_BLOCKS);
                /* d * (sc - 32) as the reference computes it */
                tile_put_iq4(tile, i, specd_fp16_to_f32(rd_u16(sb)) * (float)iq4xs_scale(sb, j),
                             sb + IQ4XS_QS + 16 * j);
            } else if (t->type == SPECD_Q4_1) {
                tile_put_q4(tile, i, rd_u16(blk), rd_u16(blk + 2), blk + 4);
            } else if (t->type == SPECD_Q5_1) {
                tile_put_q5(tile, i, rd_u16(blk), rd_u16(blk + 2), blk + 4, blk + 8);
            } else { /* Q4_0, Q5_0: w = d * (q - k) = d * q + (-k d) */
                const int q5 = t->type == SPECD_Q5_0;
                uint16_t mh;
                if (!offset_fp16(rd_u16(blk), q5 ? 16.0f : 8.0f, &mh)) {
                    cpu_qweight_free(out);
                    return 0;
                }
                if (q5) tile_put_q5(tile, i, rd_u16(blk), mh, blk + 2, blk + 6);
                else tile_put_q4(tile, i, rd_u16(blk), mh, blk + 2);
            }
        }
    }
    return 1;
}

void cpu_qweight_free(cpu_qweight *w) {
    if (w->owned) free(w->data);
    memset(w, 0, sizeof *w);
}

size_t cpu_qweight_bytes(const cpu_qweight *w) { return (size_t)w->n_groups * w->group_bytes; }

/* ---- activations ------------------------------------------------------------ */

void cpu_quantize_act(const float *x, int n_tok, int64_t cols, int8_t *q, float *d, float *s,
                      int32_t *sq) {
    const int64_t nb = cols / QT_COLS;
    for (int t = 0; t < n_tok; t++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + (size_t)t * cols + b * QT_COLS;
            int8_t *qb = q + (size_t)t * cols + b * QT_COLS;
            /* max as vmaxps computes it (second operand on NaN), so the
             * SIMD quantizers give the same bits */
            float amax = 0.0f;
            for (int j = 0; j < QT_COLS; j++) {
                float a = fabsf(xb[j]);
                amax = amax > a ? amax : a;
            }
            const float db = amax / 127.0f;
            const float id = db != 0.0f ? 1.0f / db : 0.0f;
            int32_t sum = 0;
            for (int j = 0; j < QT_COLS; j++) {
                float v = rintf(xb[j] * id);
                v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                qb[j] = (int8_t)v;
                sum += qb[j];
            }
            d[(size_t)t * nb + b] = db;
            sq[(size_t)t * nb + b] = sum;
            s[(size_t)t * nb + b] = db * (float)sum;
        }
    }
}

void cpu_act_half_sums(const int8_t *q, int n_tok, int64_t cols, int32_t *sh) {
    const int64_t nb = cols / QT_COLS;
    for (int t = 0; t < n_tok; t++)
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *qb = q + (size_t)t * cols + b * QT_COLS;
            int32_t sum = 0;
            for (int j = 0; j < QT_COLS / 2; j++) sum += qb[j];
            sh[(size_t)t * nb + b] = sum;
        }
}

/* ---- the scalar twin -------------------------------------------------------- */

/* sum of w * x over a block for row i of a 4-bit tile's nibbles (Q4, Q4K,
 * and with hi, Q5's fifth bits; with lv, IQ4's levels lv[nibble]): byte
 * 4i + j of chunk v holds column 4v + j in its low nibble and 16 + 4v + j in
 * its high nibble. */
static int32_t isum_q4(const uint8_t *qs, const uint8_t *hi, const int8_t *lv, int i,
                       const int8_t *xq) {
    int32_t sum = 0;
    for (int v = 0; v < 4; v++)
        for (int j = 0; j < 4; j++) {
            const uint8_t byte = qs[64 * v + 4 * i + j], h = hi ? hi[4 * i + j] : 0;
            const int q0 = (byte & 15) | ((h >> v) & 1) << 4;
            const int q1 = (byte >> 4) | ((h >> (v + 4)) & 1) << 4;
            sum += (int32_t)(lv ? lv[q0] : q0) * xq[4 * v + j];
            sum += (int32_t)(lv ? lv[q1] : q1) * xq[16 + 4 * v + j];
        }
    return sum;
}

/* The 2-bit value of column c of row i in the plane at p (put_2bit). */
static int get_2bit(const uint8_t *p, int i, int c) {
    const int chunk = c / 4;
    return (p[64 * (chunk / 4) + 4 * i + c % 4] >> (2 * (chunk % 4))) & 3;
}

/* Column c's quant of row i of a Q6K, Q3K or Q2K tile. */
static int khalf_quant(cpu_qkind kind, const uint8_t *tile, int i, int c) {
    const int chunk = c / 4, j = c % 4;
    if (kind == CPU_Q2K) return get_2bit(tile + 32, i, c);
    if (kind == CPU_Q3K)
        return get_2bit(tile + 32, i, c) | ((tile[160 + 4 * i + j] >> chunk) & 1) << 2;
    const uint8_t lo = tile[32 + 64 * (chunk % 4) + 4 * i + j];
    return ((chunk < 4 ? lo : lo >> 4) & 15) | get_2bit(tile + 288, i, c) << 4;
}

/* Sum over half h (columns 16h .. 16h + 15) of (q - off) * x. */
static int32_t isum_khalf(cpu_qkind kind, const uint8_t *tile, int i, int h, int off,
                          const int8_t *xq) {
    int32_t sum = 0;
    for (int c = 16 * h; c < 16 * h + 16; c++) sum += (khalf_quant(kind, tile, i, c) - off) * xq[c];
    return sum;
}

static float tile_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* Output (row g * 16 + i, token t): qmatmul.h's operations in its order. */
static float qdot_scalar(const cpu_qmm_args *a, int64_t g, int i, int t) {
    const cpu_qweight *W = a->w;
    const uint8_t *gp = W->data + (size_t)g * W->group_bytes;
    float acc = 0.0f;
    for (int64_t b = 0; b < W->nb; b++) {
        const size_t xb = (size_t)t * W->nb + b;
        const int8_t *xq = a->a.q + (size_t)t * W->cols + b * QT_COLS;
        const float xd = a->a.d[xb];
        if (W->kind == CPU_IQ4) {
            const uint8_t *tile = gp + (size_t)b * W->tile_bytes;
            const int32_t isum = isum_q4(tile + 64, NULL, k_iq4nl, i, xq);
            acc = fmaf((float)isum, tile_f32(tile + 4 * i) * xd, acc);
        } else if (W->kind == CPU_Q4 || W->kind == CPU_Q5 || W->kind == CPU_Q8) {
            const uint8_t *tile = gp + (size_t)b * W->tile_bytes;
            const float wd = specd_fp16_to_f32(rd_u16(tile + 2 * i));
            if (W->kind != CPU_Q8) {
                const uint8_t *hi = W->kind == CPU_Q5 ? tile + QT_Q4_BYTES : NULL;
                acc = fmaf((float)isum_q4(tile + 64, hi, NULL, i, xq), wd * xd, acc);
                acc = fmaf(specd_fp16_to_f32(rd_u16(tile + 32 + 2 * i)), a->a.s[xb], acc);
            } else {
                int32_t isum = 0;
                for (int v = 0; v < 8; v++)
                    for (int j = 0; j < 4; j++)
                        isum += (int32_t)(int8_t)tile[32 + 64 * v + 4 * i + j] * xq[4 * v + j];
                acc = fmaf((float)isum, wd * xd, acc);
            }
        } else if (W->kind == CPU_Q4K || W->kind == CPU_Q5K) {
            const int q5 = W->kind == CPU_Q5K;
            const uint8_t *hdr = gp + (size_t)(b / QT_SB_BLOCKS) * (q5 ? QT_Q5K_SB : QT_Q4K_SB);
            const uint8_t *tile = hdr + QT_Q4K_HDR + (b % QT_SB_BLOCKS) * W->tile_bytes;
            const float wd = tile_f32(hdr + 4 * i) * (float)tile[i];
            const float wm = tile_f32(hdr + 64 + 4 * i) * (float)tile[16 + i];
            const uint8_t *hi = q5 ? tile + QT_Q4K_BYTES : NULL;
            acc = fmaf((float)isum_q4(tile + 32, hi, NULL, i, xq), wd * xd, acc);
            acc = fmaf(wm, a->a.s[xb], acc);
        } else if (W->kind == CPU_Q2K) {
            const uint8_t *hdr = gp + (size_t)(b / QT_SB_BLOCKS) * QT_Q2K_SB;
            const uint8_t *tile = hdr + QT_Q4K_HDR + (b % QT_SB_BLOCKS) * QT_Q2K_BYTES;
            const float d = tile_f32(hdr + 4 * i), mneg = tile_f32(hdr + 64 + 4 * i);
            for (int h = 0; h < 2; h++)
                acc = fmaf((float)isum_khalf(CPU_Q2K, tile, i, h, 0, xq),
                           d * (float)(tile[16 * h + i] & 15) * xd, acc);
            const int32_t sh = a->a.sh[xb];
            acc = fmaf(mneg * (float)(tile[i] >> 4), xd * (float)sh, acc);
            acc = fmaf(mneg * (float)(tile[16 + i] >> 4), xd * (float)(a->a.sq[xb] - sh), acc);
        } else { /* CPU_Q6K, CPU_Q3K */
            const int q3 = W->kind == CPU_Q3K;
            const uint8_t *hdr = gp + (size_t)(b / QT_SB_BLOCKS) * (q3 ? QT_Q3K_SB : QT_Q6K_SB);
            const uint8_t *tile = hdr + QT_Q6K_HDR + (b % QT_SB_BLOCKS) * W->tile_bytes;
            const float d = tile_f32(hdr + 4 * i);
            for (int h = 0; h < 2; h++) {
                const float wd = d * (float)(int8_t)tile[16 * h + i];
                acc = fmaf((float)isum_khalf(W->kind, tile, i, h, q3 ? 4 : 32, xq), wd * xd, acc);
            }
        }
    }
    return acc;
}

static void qrows_scalar(const cpu_qmm_args *a, int64_t g0, int64_t g1) {
    const cpu_qweight *W = a->w;
    for (int64_t g = g0; g < g1; g++)
        for (int i = 0; i < QT_ROWS && g * QT_ROWS + i < W->rows; i++)
            for (int t = 0; t < a->a.n_tok; t++)
                a->y[(size_t)t * a->ldy + g * QT_ROWS + i] = qdot_scalar(a, g, i, t);
}

void cpu_swiglu_scalar(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = cpu_swiglu_scalar_one(gate[i], up[i]);
}

int cpu_qkernels_scalar(cpu_kernel_set *ks) {
    ks->swiglu = cpu_swiglu_scalar;
    ks->argmax = specd_argmax;
    ks->kv_dot = cpu_kv_dot_scalar;
    ks->softmax_exp = cpu_softmax_exp_scalar;
    ks->kv_axpy = cpu_kv_axpy_scalar;
    ks->f32_to_f16_row = cpu_f32_to_f16_row_scalar;
    for (int k = 0; k < CPU_QKINDS; k++) ks->qrows[k] = qrows_scalar;
    ks->quantize = cpu_quantize_act;
    ks->rmsnorm_row = cpu_rmsnorm_row_scalar;
    ks->rope_heads = cpu_rope_heads_scalar;
    ks->axpy = cpu_axpy_scalar;
    return 1;
}

void cpu_qmatmul_ref(float *y, const cpu_qweight *W, const float *x, int n_tok) {
    if (n_tok <= 0) return;
    size_t nq = (size_t)n_tok * (size_t)W->cols, nbt = (size_t)n_tok * (size_t)W->nb;
    int8_t *q = malloc(nq);
    float *d = malloc(sizeof(float) * nbt), *s = malloc(sizeof(float) * nbt);
    int32_t *sq = malloc(sizeof(int32_t) * nbt), *sh = malloc(sizeof(int32_t) * nbt);
    if (!q || !d || !s || !sq || !sh) abort();
    cpu_quantize_act(x, n_tok, W->cols, q, d, s, sq);
    cpu_act_half_sums(q, n_tok, W->cols, sh);
    cpu_qmm_args a = {.w = W,
                      .a = {.n_tok = n_tok, .cols = W->cols, .nb = W->nb, .q = q, .d = d, .s = s,
                            .sq = sq, .sh = sh},
                      .y = y,
                      .ldy = W->rows};
    qrows_scalar(&a, 0, W->n_groups);
    free(q);
    free(d);
    free(s);
    free(sq);
    free(sh);
}
