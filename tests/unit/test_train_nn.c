/* test_train_nn.c - the trainers' layers (tools/train/nn.c).
 *
 * Every backward is checked against central finite differences of its own
 * forward. The scalar probed is L = sum(y * R) for a fixed random R (so the
 * backward is fed dy = R), evaluated in fp32 with the sum in double. With
 * step h = 1e-2 on O(1) inputs the difference quotient's truncation error
 * (h^2 f''' / 6) and rounding error (~1e-7 |L| / h) stay below ~3e-5 here
 * (the run prints the worst), so an element passes when
 * |analytic - numeric| <= 2e-4 + 2e-3 |numeric|; a wrong backward misses by
 * O(1). AdamW is checked against a two-step example
 * worked by hand, the learning-rate schedule at its endpoints. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/harness/test_util.h"
#include "tools/train/nn.h"

#define FD_H 1e-2f
#define FD_ATOL 2e-4
#define FD_RTOL 2e-3

/* A loss over the current contents of the probed buffers. */
typedef double (*loss_fn)(void *ctx);

/* Perturbs each x[i] by +-h, compares the central difference of loss()
 * with analytic[i]. */
static void check_grad(const char *what, loss_fn loss, void *ctx, float *x, size_t n,
                       const float *analytic) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + FD_H;
        double lp = loss(ctx);
        x[i] = x0 - FD_H;
        double lm = loss(ctx);
        x[i] = x0;
        double num = (lp - lm) / (2.0 * (double)FD_H), diff = fabs(num - analytic[i]);
        if (diff > FD_ATOL + FD_RTOL * fabs(num))
            fail_msg("%s[%zu]: analytic %.6g, numeric %.6g", what, i, analytic[i], num);
        if (diff > worst) worst = diff;
    }
    printf("  %-16s %3zu values, worst |diff| %.2e\n", what, n, worst);
}

static double dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* ---- linear ------------------------------------------------------------------- */

enum { LN_N = 3, LN_IN = 4, LN_OUT = 5 };
typedef struct lin_ctx {
    float x[LN_N * LN_IN], w[LN_OUT * LN_IN], b[LN_OUT], y[LN_N * LN_OUT], r[LN_N * LN_OUT];
    int use_bias;
} lin_ctx;

static double lin_loss(void *p) {
    lin_ctx *c = p;
    nn_linear_fwd(c->x, LN_N, LN_IN, c->w, c->use_bias ? c->b : NULL, LN_OUT, c->y);
    return dot(c->y, c->r, LN_N * LN_OUT);
}

static void test_linear(void **state) {
    (void)state;
    lin_ctx c = {.use_bias = 1};
    test_fill_random(c.x, LN_N * LN_IN, 1, 1.0f);
    test_fill_random(c.w, LN_OUT * LN_IN, 2, 1.0f);
    test_fill_random(c.b, LN_OUT, 3, 1.0f);
    test_fill_random(c.r, LN_N * LN_OUT, 4, 1.0f);

    /* the forward against a plain triple loop */
    lin_loss(&c);
    for (int r = 0; r < LN_N; r++)
        for (int o = 0; o < LN_OUT; o++) {
            double s = c.b[o];
            for (int i = 0; i < LN_IN; i++) s += (double)c.x[r * LN_IN + i] * c.w[o * LN_IN + i];
            assert_true(fabs(c.y[r * LN_OUT + o] - s) < 1e-5);
        }

    float dx[LN_N * LN_IN], dw[LN_OUT * LN_IN] = {0}, db[LN_OUT] = {0};
    nn_linear_bwd(c.x, LN_N, LN_IN, c.w, LN_OUT, c.r, dx, dw, db);
    check_grad("linear dx", lin_loss, &c, c.x, LN_N * LN_IN, dx);
    check_grad("linear dw", lin_loss, &c, c.w, LN_OUT * LN_IN, dw);
    check_grad("linear dbias", lin_loss, &c, c.b, LN_OUT, db);

    /* parameter gradients accumulate (+=), dx == NULL and dbias == NULL are
     * skipped: a second call on top of the first doubles dw only */
    float dw2[LN_OUT * LN_IN], db2[LN_OUT];
    memcpy(dw2, dw, sizeof dw);
    memcpy(db2, db, sizeof db);
    nn_linear_bwd(c.x, LN_N, LN_IN, c.w, LN_OUT, c.r, NULL, dw2, NULL);
    for (int i = 0; i < LN_OUT * LN_IN; i++) assert_true(fabs(dw2[i] - 2 * dw[i]) < 1e-5);
    assert_memory_equal(db2, db, sizeof db);

    /* no bias: y is x.w^T alone */
    c.use_bias = 0;
    memset(dw, 0, sizeof dw);
    nn_linear_bwd(c.x, LN_N, LN_IN, c.w, LN_OUT, c.r, dx, dw, NULL);
    check_grad("linear dx nobias", lin_loss, &c, c.x, LN_N * LN_IN, dx);
}

/* ---- embedding ---------------------------------------------------------------- */

enum { EM_V = 5, EM_D = 3, EM_N = 5 };
typedef struct emb_ctx {
    float table[EM_V * EM_D], y[EM_N * EM_D], r[EM_N * EM_D];
    int32_t ids[EM_N];
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    nn_embed_fwd(c->table, EM_D, c->ids, EM_N, c->y);
    return dot(c->y, c->r, EM_N * EM_D);
}

static void test_embed(void **state) {
    (void)state;
    emb_ctx c = {.ids = {1, 3, 1, 0, 1}}; /* id 1 three times, 2 and 4 never */
    test_fill_random(c.table, EM_V * EM_D, 5, 1.0f);
    test_fill_random(c.r, EM_N * EM_D, 6, 1.0f);
    emb_loss(&c);
    assert_memory_equal(c.y + 3 * EM_D, c.table, sizeof(float) * EM_D);
    float dt[EM_V * EM_D] = {0};
    nn_embed_bwd(c.ids, EM_N, EM_D, c.r, dt);
    check_grad("embed dtable", emb_loss, &c, c.table, EM_V * EM_D, dt);
    for (int j = 0; j < EM_D; j++) assert_true(dt[2 * EM_D + j] == 0 && dt[4 * EM_D + j] == 0);
}

/* ---- rms norm ------------------------------------------------------------------ */

enum { RN_N = 3, RN_D = 6 };
typedef struct rms_ctx {
    float x[RN_N * RN_D], w[RN_D], b[RN_D], y[RN_N * RN_D], r[RN_N * RN_D], rstd[RN_N];
} rms_ctx;

static double rms_loss(void *p) {
    rms_ctx *c = p;
    nn_rmsln_fwd(c->x, RN_N, RN_D, c->w, c->b, 1e-6f, c->y, c->rstd);
    return dot(c->y, c->r, RN_N * RN_D);
}

static void test_rmsln(void **state) {
    (void)state;
    rms_ctx c;
    test_fill_random(c.x, RN_N * RN_D, 7, 1.5f);
    test_fill_random(c.w, RN_D, 8, 1.0f);
    test_fill_random(c.b, RN_D, 9, 1.0f);
    test_fill_random(c.r, RN_N * RN_D, 10, 1.0f);
    rms_loss(&c);
    /* forward: row 0 by hand */
    double ss = 0;
    for (int j = 0; j < RN_D; j++) ss += (double)c.x[j] * c.x[j];
    double k = 1.0 / sqrt(ss / RN_D + 1e-6);
    assert_true(fabs(c.rstd[0] - k) < 1e-6 * k);
    for (int j = 0; j < RN_D; j++)
        assert_true(fabs(c.y[j] - (c.x[j] * k * c.w[j] + c.b[j])) < 1e-5);

    float dx[RN_N * RN_D], dw[RN_D] = {0}, db[RN_D] = {0};
    nn_rmsln_bwd(c.x, RN_N, RN_D, c.w, c.rstd, c.r, dx, dw, db);
    check_grad("rmsln dx", rms_loss, &c, c.x, RN_N * RN_D, dx);
    check_grad("rmsln dw", rms_loss, &c, c.w, RN_D, dw);
    check_grad("rmsln db", rms_loss, &c, c.b, RN_D, db);
}

/* ---- activations ----------------------------------------------------------------- */

enum { ACT_N = 16 };
typedef struct act_ctx {
    float x[ACT_N], y[ACT_N], r[ACT_N];
    void (*fwd)(const float *, size_t, float *);
} act_ctx;

static double act_loss(void *p) {
    act_ctx *c = p;
    c->fwd(c->x, ACT_N, c->y);
    return dot(c->y, c->r, ACT_N);
}

static void check_activation(const char *name, void (*fwd)(const float *, size_t, float *),
                             void (*bwd)(const float *, size_t, const float *, float *)) {
    act_ctx c = {.fwd = fwd};
    test_fill_random(c.x, ACT_N, 11, 3.0f);
    test_fill_random(c.r, ACT_N, 12, 1.0f);
    float dx[ACT_N], inplace[ACT_N];
    bwd(c.x, ACT_N, c.r, dx);
    check_grad(name, act_loss, &c, c.x, ACT_N, dx);
    memcpy(inplace, c.r, sizeof inplace); /* dx may alias dy */
    bwd(c.x, ACT_N, inplace, inplace);
    assert_memory_equal(inplace, dx, sizeof dx);
}

static void test_activations(void **state) {
    (void)state;
    check_activation("gelu dx", nn_gelu_fwd, nn_gelu_bwd);
    check_activation("silu dx", nn_silu_fwd, nn_silu_bwd);
    /* forward values: gelu(1) = Phi(1) = 0.8413447, silu(1) = 1/(1+e^-1) */
    float one = 1.0f, y;
    nn_gelu_fwd(&one, 1, &y);
    assert_true(fabs(y - 0.8413447f) < 1e-6);
    nn_silu_fwd(&one, 1, &y);
    assert_true(fabs(y - 0.7310586f) < 1e-6);
}

/* ---- losses ------------------------------------------------------------------------ */

enum { XE_N = 4, XE_V = 7 };
typedef struct xent_ctx {
    float logits[XE_N * XE_V];
    int32_t labels[XE_N];
    float scale;
} xent_ctx;

static double xent_loss(void *p) {
    xent_ctx *c = p;
    return c->scale * nn_xent(c->logits, XE_N, XE_V, c->labels, 1.0f, NULL, NULL, NULL);
}

static void test_xent(void **state) {
    (void)state;
    xent_ctx c = {.labels = {2, -1, 6, 0}, .scale = 0.5f};
    test_fill_random(c.logits, XE_N * XE_V, 13, 3.0f);
    c.logits[0 * XE_V + 2] = 5.0f; /* row 0: argmax is the label */
    float d[XE_N * XE_V];
    int counted = -1, correct = 0;
    double loss = nn_xent(c.logits, XE_N, XE_V, c.labels, c.scale, d, &counted, &correct);
    assert_int_equal(counted, 3);
    assert_true(correct >= 1);
    /* the loss by the textbook formula, in double */
    double want = 0;
    for (int r = 0; r < XE_N; r++) {
        if (c.labels[r] < 0) continue;
        double z = 0;
        for (int j = 0; j < XE_V; j++) z += exp((double)c.logits[r * XE_V + j]);
        want += log(z) - c.logits[r * XE_V + c.labels[r]];
    }
    assert_true(fabs(loss - want) < 1e-5 * want);
    check_grad("xent dlogits", xent_loss, &c, c.logits, XE_N * XE_V, d);
    for (int j = 0; j < XE_V; j++) assert_true(d[1 * XE_V + j] == 0.0f); /* ignored row */

    /* dlogits may alias logits */
    float inplace[XE_N * XE_V];
    memcpy(inplace, c.logits, sizeof inplace);
    double loss2 = nn_xent(inplace, XE_N, XE_V, c.labels, c.scale, inplace, NULL, NULL);
    assert_true(loss2 == loss);
    assert_memory_equal(inplace, d, sizeof d);

    /* stable for huge logits: log(1 + e) for [1000, 1001] with label 0 */
    float big[2] = {1000.0f, 1001.0f};
    int32_t lab = 0;
    double l = nn_xent(big, 1, 2, &lab, 1.0f, big, NULL, NULL);
    assert_true(fabs(l - log1p(exp(1.0))) < 1e-6);
    assert_true(isfinite(big[0]) && isfinite(big[1]));
}

enum { BCE_N = 8 };
typedef struct bce_ctx {
    float z[BCE_N], y[BCE_N], w[BCE_N];
    float scale;
} bce_ctx;

static double bce_loss(void *p) {
    bce_ctx *c = p;
    return c->scale * nn_bce(c->z, BCE_N, c->y, c->w, 1.0f, NULL);
}

static void test_bce(void **state) {
    (void)state;
    bce_ctx c = {.scale = 0.7f};
    test_fill_random(c.z, BCE_N, 14, 4.0f);
    for (int i = 0; i < BCE_N; i++) {
        c.y[i] = (float)i / (BCE_N - 1); /* soft labels 0 .. 1 */
        c.w[i] = 0.25f + 0.5f * (float)(i % 3);
    }
    float dz[BCE_N];
    double loss = nn_bce(c.z, BCE_N, c.y, c.w, c.scale, dz);
    double want = 0;
    for (int i = 0; i < BCE_N; i++) {
        double s = 1 / (1 + exp(-(double)c.z[i]));
        want += c.w[i] * -(c.y[i] * log(s) + (1 - c.y[i]) * log(1 - s));
    }
    assert_true(fabs(loss - want) < 1e-6 * want);
    check_grad("bce dz", bce_loss, &c, c.z, BCE_N, dz);

    /* w == NULL weighs 1; |z| = 100 stays finite */
    float z[2] = {100.0f, -100.0f}, y[2] = {0.0f, 1.0f};
    double l = nn_bce(z, 2, y, NULL, 1.0f, NULL);
    assert_true(fabs(l - 200.0) < 1e-9);
}

/* ---- optimizer and schedule -------------------------------------------------------- */

/* beta1 0.9, beta2 0.999, eps 1e-8, lr 0.1.
 * Tensor A (wd 0.01), p = 1, grads 0.5 then -0.25:
 *   step 1: m = 0.05, v = 2.5e-4, mhat = 0.5, vhat = 0.25,
 *           p = 1 * (1 - 0.001) - 0.1 * 0.5 / 0.5 = 0.899
 *   step 2: m = 0.045 - 0.025 = 0.02, v = 2.49750e-4 + 6.25e-5 = 3.1225e-4,
 *           mhat = 0.02 / 0.19 = 0.1052632, vhat = 3.1225e-4 / 0.001999 = 0.1562031,
 *           p = 0.899 * 0.999 - 0.1 * 0.1052632 / 0.3952254 = 0.8714673
 * Tensor B (wd 0), p = -2, grads -1 then 3:
 *   step 1: m = -0.1, v = 1e-3, mhat = -1, vhat = 1, p = -2 + 0.1 = -1.9
 *   step 2: m = 0.21, v = 0.009999, mhat = 1.1052632, vhat = 5.0020010,
 *           p = -1.9 - 0.1 * 1.1052632 / 2.2365153 = -1.9494190 */
static void test_adamw(void **state) {
    (void)state;
    nn_adamw opt = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    float a = 1.0f, am = 0, av = 0, b = -2.0f, bm = 0, bv = 0;
    const float ga[2] = {0.5f, -0.25f}, gb[2] = {-1.0f, 3.0f};
    const float want_a[2] = {0.899f, 0.8714673f}, want_b[2] = {-1.9f, -1.9494190f};
    for (int t = 0; t < 2; t++) {
        nn_adamw_update(&opt, t + 1, 0.1f, 0.01f, &a, &ga[t], &am, &av, 1);
        nn_adamw_update(&opt, t + 1, 0.1f, 0.0f, &b, &gb[t], &bm, &bv, 1);
        assert_true(fabs(a - want_a[t]) < 2e-6);
        assert_true(fabs(b - want_b[t]) < 2e-6);
    }
    /* the moments, to float rounding of 1 - beta (0.001f is 0.0010000467) */
    assert_true(fabs(am - 0.02f) < 1e-7 && fabs(av - 3.1225e-4f) < 1e-4 * 3.1225e-4f);
}

static void test_lr_schedule_and_norm(void **state) {
    (void)state;
    const float peak = 3e-3f, min_ratio = 0.1f;
    assert_true(nn_lr_at(0, 100, 1000, peak, min_ratio) == 0.0f);
    assert_true(fabs(nn_lr_at(50, 100, 1000, peak, min_ratio) - peak / 2) < 1e-9);
    assert_true(fabs(nn_lr_at(100, 100, 1000, peak, min_ratio) - peak) < 1e-9);
    /* half-way through the decay the cosine is at its middle */
    assert_true(fabs(nn_lr_at(550, 100, 1000, peak, min_ratio) - peak * 0.55f) < 1e-8);
    assert_true(fabs(nn_lr_at(1000, 100, 1000, peak, min_ratio) - peak * min_ratio) < 1e-9);
    assert_true(fabs(nn_lr_at(5000, 100, 1000, peak, min_ratio) - peak * min_ratio) < 1e-9);
    float prev = peak;
    for (long s = 101; s <= 1000; s++) { /* non-increasing after warm-up */
        float lr = nn_lr_at(s, 100, 1000, peak, min_ratio);
        assert_true(lr <= prev);
        prev = lr;
    }
    const float g[3] = {3.0f, 0.0f, -4.0f};
    assert_true(nn_sumsq(g, 3) == 25.0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),     cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsln),      cmocka_unit_test(test_activations),
        cmocka_unit_test(test_xent),       cmocka_unit_test(test_bce),
        cmocka_unit_test(test_adamw),      cmocka_unit_test(test_lr_schedule_and_norm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
