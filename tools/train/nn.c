/* nn.c - the trainers' fp32 layers and their backwards (see nn.h).
 *
 * GEMMs go to OpenBLAS; everything else is a plain loop over contiguous
 * rows so that -O3 vectorizes it. Reductions that decide a value used
 * everywhere in a row (the norm's mean square, the softmax normalizer, the
 * loss) are accumulated in double: they are O(n) next to the O(n^2) GEMMs,
 * and the extra precision keeps finite-difference checks meaningful. */
#include "tools/train/nn.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* ---- linear ------------------------------------------------------------------- */

void nn_linear_fwd(const float *x, int n, int in, const float *w, const float *bias, int out,
                   float *y) {
    if (n <= 0 || out <= 0) return;
    float beta = 0.0f;
    if (bias) { /* seed every row with the bias and let the GEMM add onto it */
        for (int r = 0; r < n; r++) memcpy(y + (size_t)r * out, bias, sizeof(float) * out);
        beta = 1.0f;
    }
    if (in <= 0) {
        if (!bias) memset(y, 0, sizeof(float) * (size_t)n * out);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, beta, y,
                out);
}

void nn_linear_bwd(const float *x, int n, int in, const float *w, int out, const float *dy,
                   float *dx, float *dw, float *dbias) {
    if (n <= 0) return;
    if (dx) {
        if (out > 0 && in > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy, out, w,
                        in, 0.0f, dx, in);
        else if (in > 0)
            memset(dx, 0, sizeof(float) * (size_t)n * in);
    }
    if (dw && out > 0 && in > 0)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy, out, x, in,
                    1.0f, dw, in);
    if (dbias)
        for (int r = 0; r < n; r++) {
            const float *g = dy + (size_t)r * out;
            for (int j = 0; j < out; j++) dbias[j] += g[j];
        }
}

/* ---- embedding ---------------------------------------------------------------- */

void nn_embed_fwd(const float *table, int dim, const int32_t *ids, int n, float *y) {
    for (int r = 0; r < n; r++)
        memcpy(y + (size_t)r * dim, table + (size_t)ids[r] * dim, sizeof(float) * dim);
}

void nn_embed_bwd(const int32_t *ids, int n, int dim, const float *dy, float *dtable) {
    for (int r = 0; r < n; r++) {
        float *t = dtable + (size_t)ids[r] * dim;
        const float *g = dy + (size_t)r * dim;
        for (int j = 0; j < dim; j++) t[j] += g[j];
    }
}

/* ---- the speculator's norm ------------------------------------------------------ */

/* rstd exactly as draft-svc/mlp_speculator.c computes it (double sum of
 * squares, one rounding to float), so a trained model and the runtime agree
 * to the last bit on this step. */
static float row_rstd(const float *x, int d, float eps) {
    double ss = 0;
    for (int j = 0; j < d; j++) ss += (double)x[j] * x[j];
    return (float)(1.0 / sqrt(ss / d + eps));
}

void nn_rmsln_fwd(const float *x, int n, int d, const float *w, const float *b, float eps,
                  float *y, float *rstd) {
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * d;
        float *yr = y + (size_t)r * d;
        float k = row_rstd(xr, d, eps);
        rstd[r] = k;
        /* same operation order as the runtime: w * (x * k) + b */
        for (int j = 0; j < d; j++) yr[j] = w[j] * (xr[j] * k) + b[j];
    }
}

/* y_j = w_j x_j r + b_j with r = (mean(x^2) + eps)^-1/2 and dr/dx_k =
 * -r^3 x_k / d, so
 *   dx_k = r (w_k dy_k - x_k r^2 / d * sum_j w_j dy_j x_j). */
void nn_rmsln_bwd(const float *x, int n, int d, const float *w, const float *rstd,
                  const float *dy, float *dx, float *dw, float *db) {
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * d, *g = dy + (size_t)r * d;
        float *dxr = dx + (size_t)r * d;
        float k = rstd[r];
        double dot = 0;
        for (int j = 0; j < d; j++) dot += (double)w[j] * g[j] * xr[j];
        float c = (float)(dot * k * k / d);
        for (int j = 0; j < d; j++) {
            dw[j] += g[j] * xr[j] * k;
            db[j] += g[j];
        }
        for (int j = 0; j < d; j++) dxr[j] = k * (w[j] * g[j] - xr[j] * c);
    }
}

/* ---- activations ---------------------------------------------------------------- */

void nn_gelu_fwd(const float *x, size_t n, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
}

/* d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density. */
void nn_gelu_bwd(const float *x, size_t n, const float *dy, float *dx) {
    const float inv_sqrt_2pi = 0.3989422804014327f;
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float cdf = 0.5f * (1.0f + erff(v * (float)M_SQRT1_2));
        float pdf = inv_sqrt_2pi * expf(-0.5f * v * v);
        dx[i] = dy[i] * (cdf + v * pdf);
    }
}

void nn_silu_fwd(const float *x, size_t n, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

/* d/dx [x s(x)] = s (1 + x (1 - s)). */
void nn_silu_bwd(const float *x, size_t n, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-x[i]));
        dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
    }
}

/* ---- losses --------------------------------------------------------------------- */

double nn_xent(const float *logits, int n, int v, const int32_t *labels, float scale,
               float *dlogits, int *n_counted, int *correct) {
    double loss = 0;
    int counted = 0, right = 0;
    for (int r = 0; r < n; r++) {
        const float *l = logits + (size_t)r * v;
        float *d = dlogits ? dlogits + (size_t)r * v : NULL;
        int32_t y = labels[r];
        if (y < 0 || y >= v) { /* ignored row: no loss, no gradient */
            if (d) memset(d, 0, sizeof(float) * v);
            continue;
        }
        /* everything read from l happens before d (which may be l) is written */
        float mx = l[0];
        int arg = 0;
        for (int j = 1; j < v; j++)
            if (l[j] > mx) {
                mx = l[j];
                arg = j;
            }
        float ly = l[y];
        double sum = 0;
        if (d) {
            for (int j = 0; j < v; j++) {
                float e = expf(l[j] - mx); /* <= 1: no overflow */
                d[j] = e;
                sum += e;
            }
            float k = (float)(scale / sum);
            for (int j = 0; j < v; j++) d[j] *= k;
            d[y] -= scale;
        } else {
            for (int j = 0; j < v; j++) sum += expf(l[j] - mx);
        }
        loss += log(sum) + (double)mx - (double)ly;
        counted++;
        right += arg == y;
    }
    if (n_counted) *n_counted = counted;
    if (correct) *correct += right;
    return loss;
}

/* -(y log s + (1-y) log(1-s)) with s = sigmoid(z) equals
 * max(z, 0) - z y + log(1 + exp(-|z|)), which never overflows. */
double nn_bce(const float *z, int n, const float *y, const float *w, float scale, float *dz) {
    double loss = 0;
    for (int i = 0; i < n; i++) {
        double zi = z[i], wi = w ? w[i] : 1.0;
        loss += wi * ((zi > 0 ? zi : 0) - zi * y[i] + log1p(exp(-fabs(zi))));
        if (dz) {
            float s = 1.0f / (1.0f + expf(-z[i]));
            dz[i] = scale * (float)wi * (s - y[i]);
        }
    }
    return loss;
}

/* ---- optimizer ------------------------------------------------------------------ */

/* As torch.optim.AdamW: p *= 1 - lr wd, then p -= lr mhat / (sqrt(vhat) + eps). */
void nn_adamw_update(const nn_adamw *opt, long step, float lr, float weight_decay, float *p,
                     const float *g, float *m, float *v, size_t n) {
    float b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
    float bc1 = (float)(1.0 - pow(b1, (double)step));
    float bc2 = (float)(1.0 - pow(b2, (double)step));
    float decay = 1.0f - lr * weight_decay;
    float step_size = lr / bc1, inv_sqrt_bc2 = 1.0f / sqrtf(bc2);
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        p[i] = p[i] * decay - step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
    }
}

double nn_sumsq(const float *g, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

float nn_lr_at(long step, long warmup, long total, float peak, float min_ratio) {
    if (step < 0) step = 0;
    if (warmup > 0 && step < warmup) return peak * (float)step / (float)warmup;
    if (step >= total) return peak * min_ratio;
    double t = (double)(step - warmup) / (double)(total - warmup); /* total > step >= warmup */
    double cosine = 0.5 * (1.0 + cos(M_PI * t));
    return (float)(peak * (min_ratio + (1.0 - min_ratio) * cosine));
}
