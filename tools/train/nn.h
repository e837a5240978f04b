/* nn.h - the few fp32 layers the trainers need, each with its backward.
 *
 * Everything is row-major fp32. A forward writes its output (=); a backward
 * writes the input gradient (=) and ADDS into parameter gradients (+=), so a
 * weight shared by several stages (tied speculators) collects every use.
 * GEMMs go to OpenBLAS (cblas_sgemm); the rest is plain loops that the
 * compiler vectorizes. Every backward here has a finite-difference test in
 * tests/unit/test_train_nn.c. */
#ifndef SPECD_TRAIN_NN_H
#define SPECD_TRAIN_NN_H

#include <stddef.h>
#include <stdint.h>

/* y[n][out] = x[n][in] . w[out][in]^T (+ bias[out] if bias != NULL). */
void nn_linear_fwd(const float *x, int n, int in, const float *w, const float *bias, int out,
                   float *y);
/* dx[n][in] = dy . w (skipped when dx == NULL); dw[out][in] += dy^T . x;
 * dbias[out] += sum_rows dy (skipped when dbias == NULL). */
void nn_linear_bwd(const float *x, int n, int in, const float *w, int out, const float *dy,
                   float *dx, float *dw, float *dbias);

/* y[i] = table[ids[i]] (rows of dim); dtable[ids[i]] += dy[i]. */
void nn_embed_fwd(const float *table, int dim, const int32_t *ids, int n, float *y);
void nn_embed_bwd(const int32_t *ids, int n, int dim, const float *dy, float *dtable);

/* The MLP speculator's norm (no mean subtraction):
 *   y = x * rstd * w + b,  rstd = 1 / sqrt(mean(x^2) + eps)
 * rstd[n] is saved by the forward for the backward. */
void nn_rmsln_fwd(const float *x, int n, int d, const float *w, const float *b, float eps,
                  float *y, float *rstd);
void nn_rmsln_bwd(const float *x, int n, int d, const float *w, const float *rstd,
                  const float *dy, float *dx, float *dw, float *db);

/* GELU (erf form, as torch.nn.GELU()) and SiLU. The backward reads the
 * forward's input; dx may alias dy. */
void nn_gelu_fwd(const float *x, size_t n, float *y);
void nn_gelu_bwd(const float *x, size_t n, const float *dy, float *dx);
void nn_silu_fwd(const float *x, size_t n, float *y);
void nn_silu_bwd(const float *x, size_t n, const float *dy, float *dx);

/* Softmax cross-entropy over rows of v logits. labels[i] < 0 = row ignored
 * (so is a label >= v, which would be a caller bug, rather than a bad read).
 * Returns the SUM of -log softmax(logits[i])[labels[i]] over counted rows;
 * *n_counted (if non-NULL) gets their number. If dlogits != NULL it gets
 * scale * (softmax - onehot) for counted rows and 0 for ignored ones
 * (dlogits may alias logits). If correct != NULL, *correct += rows whose
 * argmax equals the label. */
double nn_xent(const float *logits, int n, int v, const int32_t *labels, float scale,
               float *dlogits, int *n_counted, int *correct);

/* Weighted binary cross-entropy on logits z with soft targets y in [0,1]:
 *   sum_i w_i * -(y_i log sigmoid(z_i) + (1 - y_i) log(1 - sigmoid(z_i)))
 * computed stably. w == NULL weighs every term 1. dz (if non-NULL) =
 * scale * w_i * (sigmoid(z_i) - y_i). */
double nn_bce(const float *z, int n, const float *y, const float *w, float scale, float *dz);

/* AdamW (decoupled weight decay, bias-corrected moments) on one tensor;
 * step is 1-based. Callers pass each tensor with its own weight_decay
 * (0 for norms and biases). */
typedef struct nn_adamw {
    float beta1, beta2, eps;
} nn_adamw;
void nn_adamw_update(const nn_adamw *opt, long step, float lr, float weight_decay, float *p,
                     const float *g, float *m, float *v, size_t n);

/* sum g^2 over n values (double accumulation): the squared L2 norm, so
 * sums over several buffers combine before the one sqrt. */
double nn_sumsq(const float *g, size_t n);

/* Learning rate at 0-based step: linear warm-up from 0 to peak over
 * warmup steps, then cosine decay to peak * min_ratio at step total. */
float nn_lr_at(long step, long warmup, long total, float peak, float min_ratio);

#endif
