/* row_ops.c - a layer's per-row elementwise ops, the scalar twins: RMSNorm,
 * RoPE and the residual add (cpu_backend.c runs them over a step's rows).
 *
 * Each does a few hundred floats of work per token and layer, so at decode
 * and in a verify step of a few rows they run on the calling thread while
 * the pool waits: their time is the step's serial tail, paid once per row
 * (61 norms, 30 RoPEs and 60 adds a token on the default model; together
 * 61 us of a 2.4 ms decode step, and about 45 us more per verified row,
 * before vec_avx2.c's twins). The SIMD twins do the same float operations
 * in the same order per element, so every path gives these functions' bits
 * and a row's result never depends on the path, the batch or the thread:
 *
 *   - RMSNorm's sum of squares runs in eight double partial sums (element i
 *     to sum i % 8, the tail from sum 0 on), added in the fixed tree of
 *     cpu_inv_rms; each square of a float is exact in double, so a SIMD
 *     lane's multiply-then-add is this loop's.
 *   - RoPE's rotation is two products and a sum per output, never fused
 *     (the kernels are built with -std=c11, whose -ffp-contract=off keeps
 *     every multiply rounded on its own; the SIMD twins' tails call the
 *     loops here, see cpu_rope_pairs).
 *   - The add is y + a * x, one rounding each. */
#include <math.h>
#include <stddef.h>

#include "quant_impl.h"

/* 1 / rms(x) over one row. Double accumulation: the reference computes
 * mean(x^2) in fp32 over a pairwise tree; a double sum keeps us well inside
 * its rounding. Eight partial sums (element i goes to sum i % 8), added in
 * a fixed order at the end: one serial chain of dependent double adds took
 * about 1 us for a 576-wide row, and a token has 61 norms. */
float cpu_inv_rms(const float *x, int dim, float eps) {
    double s[8] = {0};
    int i = 0;
    for (; i + 8 <= dim; i += 8)
        for (int k = 0; k < 8; k++) s[k] += (double)x[i + k] * x[i + k];
    for (int k = 0; i < dim; i++, k++) s[k] += (double)x[i] * x[i];
    return cpu_inv_rms_finish(s, dim, eps);
}

float cpu_inv_rms_finish(const double s[8], int dim, float eps) {
    double ss = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    return (float)(1.0 / sqrt(ss / dim + eps));
}

void cpu_rmsnorm_row_scalar(float *out, const float *x, const float *w, int dim, float eps) {
    const float scale = cpu_inv_rms(x, dim, eps);
    if (w)
        for (int i = 0; i < dim; i++) out[i] = (x[i] * scale) * w[i];
    else
        for (int i = 0; i < dim; i++) out[i] = x[i] * scale;
}

/* Pairs i0..half-1 of one head. Also the SIMD twins' tail, called rather
 * than written again there: GCC 12 vectorizes such a loop in an FMA-enabled
 * function into vfmaddsub even under -ffp-contract=off, which fuses the
 * products and changes the last bit (test_matmul's row-op test caught it). */
void cpu_rope_pairs(float *hv, const float *cos_sin, int i0, int half, int interleaved) {
    for (int i = i0; i < half; i++) {
        const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        const float x0 = hv[a], x1 = hv[b];
        hv[a] = x0 * c - x1 * s;
        hv[b] = x0 * s + x1 * c;
    }
}

void cpu_rope_heads_scalar(float *v, int n_heads, int head_dim, const float *cos_sin, int rot_dim,
                           int interleaved) {
    for (int h = 0; h < n_heads; h++)
        cpu_rope_pairs(v + (size_t)h * head_dim, cos_sin, 0, rot_dim / 2, interleaved);
}

void cpu_axpy_scalar(float *y, float a, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}
