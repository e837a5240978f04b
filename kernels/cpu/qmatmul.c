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

static void tile_put_q8(uint8_t *tile, int i, uint16_t d, const uint8_t *qs32) {
    memcpy(tile + 2 * i, &d, 2);
    for (int v = 0; v < 8; v++) memcpy(tile + 32 + 64 * v + 4 * i, qs32 + 4 * v, 4);
}

int cpu_qweight_make(const specd_tensor *t, cpu_qweight *out, cpu_arena *arena) {
    memset(out, 0, sizeof *out);
    cpu_qkind kind;
    switch (t->type) {
    case SPECD_Q4_0:
    case SPECD_Q4_1: kind = CPU_Q4; break;
    case SPECD_Q8_0: kind = CPU_Q8; break;
    default: return 0;
    }
    const int64_t cols = (int64_t)t->ne[0], rows = t->n_dims > 1 ? (int64_t)t->ne[1] : 1;
    if (cols <= 0 || cols % QT_COLS != 0 || rows <= 0 || !t->data) return -1;
    const specd_dtype_info *in = specd_dtype_get(t->type);
    const size_t row_bytes = (size_t)(cols / in->block_elems) * in->block_bytes;
    out->kind = kind;
    out->rows = rows;
    out->cols = cols;
    out->nb = cols / QT_COLS;
    out->n_groups = (rows + QT_ROWS - 1) / QT_ROWS;
    out->tile_bytes = kind == CPU_Q4 ? QT_Q4_BYTES : QT_Q8_BYTES;
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
        for (int64_t b = 0; b < out->nb; b++) {
            uint8_t *tile = out->data + (size_t)(g * out->nb + b) * out->tile_bytes;
            const uint8_t *blk = src + (size_t)b * in->block_bytes;
            if (t->type == SPECD_Q8_0) {
                tile_put_q8(tile, i, rd_u16(blk), blk + 2);
            } else if (t->type == SPECD_Q4_1) {
                tile_put_q4(tile, i, rd_u16(blk), rd_u16(blk + 2), blk + 4);
            } else { /* Q4_0: w = d * (q - 8) = d * q + (-8 d) */
                uint16_t d = rd_u16(blk);
                float m = -8.0f * specd_fp16_to_f32(d);
                uint16_t mh = specd_f32_to_fp16(m);
                if (specd_fp16_to_f32(mh) != m) { /* overflow: keep the fp32 path */
                    cpu_qweight_free(out);
                    return 0;
                }
                tile_put_q4(tile, i, d, mh, blk + 2);
            }
        }
    }
    return 1;
}

void cpu_qweight_free(cpu_qweight *w) {
    if (w->owned) free(w->data);
    memset(w, 0, sizeof *w);
}

size_t cpu_qweight_bytes(const cpu_qweight *w) {
    return (size_t)w->n_groups * (size_t)w->nb * w->tile_bytes;
}

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

/* ---- the scalar twin -------------------------------------------------------- */

/* isum of row i of a tile with one token's 32 int8 activations. */
static int32_t tile_isum(const cpu_qweight *W, const uint8_t *tile, int i, const int8_t *xq) {
    int32_t sum = 0;
    if (W->kind == CPU_Q4) {
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 4; j++) {
                uint8_t byte = tile[64 + 64 * v + 4 * i + j];
                sum += (int32_t)(byte & 15) * xq[4 * v + j];
                sum += (int32_t)(byte >> 4) * xq[16 + 4 * v + j];
            }
    } else {
        for (int v = 0; v < 8; v++)
            for (int j = 0; j < 4; j++)
                sum += (int32_t)(int8_t)tile[32 + 64 * v + 4 * i + j] * xq[4 * v + j];
    }
    return sum;
}

static uint16_t tile_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static void qrows_scalar(const cpu_qmm_args *a, int64_t g0, int64_t g1) {
    const cpu_qweight *W = a->w;
    for (int64_t g = g0; g < g1; g++) {
        for (int i = 0; i < QT_ROWS && g * QT_ROWS + i < W->rows; i++) {
            for (int t = 0; t < a->a.n_tok; t++) {
                float acc = 0.0f;
                for (int64_t b = 0; b < W->nb; b++) {
                    const uint8_t *tile = W->data + (size_t)(g * W->nb + b) * W->tile_bytes;
                    const size_t xb = (size_t)t * W->nb + b;
                    int32_t isum = tile_isum(W, tile, i, a->a.q + (size_t)t * W->cols + b * QT_COLS);
                    float wd = specd_fp16_to_f32(tile_u16(tile + 2 * i));
                    acc = fmaf((float)isum, wd * a->a.d[xb], acc);
                    if (W->kind == CPU_Q4)
                        acc = fmaf(specd_fp16_to_f32(tile_u16(tile + 32 + 2 * i)), a->a.s[xb], acc);
                }
                a->y[(size_t)t * a->ldy + g * QT_ROWS + i] = acc;
            }
        }
    }
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
    ks->qrows[CPU_Q4] = qrows_scalar;
    ks->qrows[CPU_Q8] = qrows_scalar;
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
    int32_t *sq = malloc(sizeof(int32_t) * nbt);
    if (!q || !d || !s || !sq) abort();
    cpu_quantize_act(x, n_tok, W->cols, q, d, s, sq);
    cpu_qmm_args a = {.w = W,
                      .a = {.n_tok = n_tok, .cols = W->cols, .nb = W->nb, .q = q, .d = d, .s = s,
                            .sq = sq},
                      .y = y,
                      .ldy = W->rows};
    qrows_scalar(&a, 0, W->n_groups);
    free(q);
    free(d);
    free(s);
    free(sq);
}
