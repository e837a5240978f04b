/* test_sampling.c - exact behaviour of common/rng and common/sampling:
 * Philox known answers, the (seed, stream, counter) addressing, parameter
 * validation, argmax ties and NaNs, the exact sets that temperature / top-k /
 * top-p / min-p keep on hand-made logits, agreement with a brute-force
 * full-sort reference at vocab 49152, determinism of specd_sample, the
 * speculative accept / residual rules on hand-checked numbers, penalties and
 * logit bias (hand-checked, and a path giving bit-identical logits to the
 * same tokens counted), log-probabilities, and the whole chain against
 * Hugging Face transformers' logits processors
 * (tests/golden/data/sampling, made by tests/golden/make_sampling_golden.py).
 * Distribution tests (chi-square) are in tests/statistical/test_sampling_stats.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/util/rng.h"
#include "common/util/simd.h"
#include "common/spec/sampling.h"
#include "common/spec/sampling_vec.h"
#include "tests/harness/test_util.h"
#include "common/util/clock.h"

#define VOCAB 49152

/* --- helpers -------------------------------------------------------------- */

static specd_sampling params(float t, int k, float p, float minp) {
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = t;
    s.top_k = k;
    s.top_p = p;
    s.min_p = minp;
    s.seed = 1234;
    return s;
}

/* Runs specd_sampling_probs with a scratch block of exactly the advertised
 * size, so the sanitizer build catches any overrun. */
static void probs_of(const specd_sampling *s, const float *logits, int n, float *probs) {
    void *scratch = malloc(specd_sampling_scratch_size(n));
    specd_sampling_probs(s, logits, n, probs, scratch);
    free(scratch);
}

/* |a - b| <= tol, in double (cmocka's float version rounds its inputs). */
#define assert_near(a, b, tol) assert_near_((double)(a), (double)(b), (tol), __LINE__)
static void assert_near_(double a, double b, double tol, int line) {
    if (!(fabs(a - b) <= tol)) fail_msg("line %d: %.12g != %.12g (tolerance %g)", line, a, b, tol);
}

static double sum_of(const float *p, int n) {
    double t = 0;
    for (int i = 0; i < n; i++) t += p[i];
    return t;
}

/* Asserts that exactly the listed ids have nonzero probability. */
static void assert_kept(const float *p, int n, const int *ids, int n_ids) {
    int want[64] = {0};
    assert_true(n <= 64);
    for (int j = 0; j < n_ids; j++) want[ids[j]] = 1;
    for (int i = 0; i < n; i++) {
        if (want[i] != (p[i] > 0.0f))
            fail_msg("token %d: probability %g, expected %s", i, (double)p[i],
                     want[i] ? "kept" : "dropped");
    }
    assert_true(fabs(sum_of(p, n) - 1.0) < 1e-6);
}

/* Logits whose softmax (T = 1) is the given distribution. */
static void logits_from(const double *probs, int n, float *logits) {
    for (int i = 0; i < n; i++) logits[i] = probs[i] > 0 ? (float)log(probs[i]) : -INFINITY;
}

/* Gaussian logits (std 3) from the project RNG: peaked like a real LM head. */
static void gaussian_logits(float *x, int n, uint64_t seed, float std) {
    for (int i = 0; i < n; i++) {
        double u1 = specd_rng_uniform(seed, (uint64_t)i, 0), u2 = specd_rng_uniform(seed, i, 1);
        x[i] = (float)(std * sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
    }
}

/* --- rng ------------------------------------------------------------------ */

static void test_philox_kat(void **state) {
    (void)state;
    /* Random123 kat_vectors, philox4x32 with 10 rounds. */
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                       {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
    static const uint32_t key[3][2] = {
        {0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
    static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                        {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        specd_philox4x32_10(ctr[t], key[t], out);
        for (int j = 0; j < 4; j++) assert_int_equal(out[j], want[t][j]);
    }
}

static void test_rng_addressing(void **state) {
    (void)state;
    /* The documented mapping of (seed, stream, counter) onto key / counter. */
    uint64_t seed = 0x0123456789abcdefULL, stream = 0x1111222233334444ULL,
             counter = 0x5555666677778888ULL;
    uint32_t a[4], b[4];
    specd_rng_u32x4(seed, stream, counter, a);
    const uint32_t key[2] = {0x89abcdefu, 0x01234567u};
    const uint32_t ctr[4] = {0x77778888u, 0x55556666u, 0x33334444u, 0x11112222u};
    specd_philox4x32_10(ctr, key, b);
    assert_memory_equal(a, b, sizeof a);

    /* Pinned values: the reproducibility contract of seeded requests. If this
     * changes, every seeded output changes. */
    uint32_t z[4];
    specd_rng_u32x4(0, 0, 0, z);
    assert_int_equal(z[0], 0x6627e8d5u);
    double u0 = specd_rng_uniform(0, 0, 0);
    assert_true(u0 == (double)((((uint64_t)0x6627e8d5u << 32) | 0xe169c58du) >> 11) * 0x1p-53);

    /* Same address, same number; any coordinate changed, a different one. */
    double u = specd_rng_uniform(42, 7, 3);
    assert_true(u == specd_rng_uniform(42, 7, 3));
    assert_true(u != specd_rng_uniform(43, 7, 3));
    assert_true(u != specd_rng_uniform(42, 8, 3));
    assert_true(u != specd_rng_uniform(42, 7, 4));
    assert_true(specd_rng_uniform(42, 7, 3) != specd_rng_uniform(42, 3, 7)); /* no aliasing */

    /* Range and 53-bit granularity. */
    int odd = 0;
    for (uint64_t i = 0; i < 10000; i++) {
        double v = specd_rng_uniform(99, i >> 3, i);
        assert_true(v >= 0.0 && v < 1.0);
        double k = v * 0x1p53;
        assert_true(k == floor(k));
        odd += (int)fmod(k, 2.0);
    }
    /* The lowest of the 53 bits is really random (not always 0). */
    assert_true(odd > 4500 && odd < 5500);
}

/* --- validation ----------------------------------------------------------- */

static void expect_invalid(specd_sampling s, const char *field) {
    specd_error err = {{0}};
    assert_int_equal(specd_sampling_validate(&s, 0, &err), -1);
    if (!strstr(err.msg, field)) fail_msg("message '%s' does not name '%s'", err.msg, field);
}

static void test_validate(void **state) {
    (void)state;
    specd_sampling s;
    specd_sampling_init(&s);
    specd_error err = {{0}};
    assert_int_equal(specd_sampling_validate(&s, 0, &err), 0);
    assert_int_equal(specd_sampling_validate(&s, 0, NULL), 0);
    assert_int_equal(specd_sampling_validate(NULL, 0, &err), -1);
    assert_int_equal(specd_sampling_validate(NULL, 0, NULL), -1);

    s = params(0.0f, 0, 1.0f, 0.0f); /* greedy */
    assert_int_equal(specd_sampling_validate(&s, 0, &err), 0);
    s = params(0.7f, 50, 0.95f, 0.05f);
    assert_int_equal(specd_sampling_validate(&s, 0, &err), 0);
    s = params(1.0f, 0, 1.0f, 1.0f); /* min_p = 1: only ties with the best */
    assert_int_equal(specd_sampling_validate(&s, 0, &err), 0);

    expect_invalid(params(-0.1f, 0, 1.0f, 0.0f), "temperature");
    expect_invalid(params(NAN, 0, 1.0f, 0.0f), "temperature");
    expect_invalid(params(INFINITY, 0, 1.0f, 0.0f), "temperature");
    expect_invalid(params(1.0f, -1, 1.0f, 0.0f), "top_k");
    expect_invalid(params(1.0f, 0, 0.0f, 0.0f), "top_p");
    expect_invalid(params(1.0f, 0, -0.5f, 0.0f), "top_p");
    expect_invalid(params(1.0f, 0, 1.5f, 0.0f), "top_p");
    expect_invalid(params(1.0f, 0, NAN, 0.0f), "top_p");
    expect_invalid(params(1.0f, 0, 1.0f, -0.01f), "min_p");
    expect_invalid(params(1.0f, 0, 1.0f, 1.01f), "min_p");
    expect_invalid(params(1.0f, 0, 1.0f, NAN), "min_p");

    specd_sampling_validate(&(specd_sampling){.temperature = 1, .top_p = 2}, 0, &err);
    assert_string_equal(err.msg, "top_p must be in (0, 1] (1 disables it), got 2");
}

/* Penalties and logit bias: ranges, "off" values, and the bias list. */
static void test_validate_penalties(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_sampling s = params(1.0f, 0, 1.0f, 0.0f);
    /* In range, including both "off" spellings of repetition_penalty. */
    static const float reps[] = {0.0f, 1.0f, 0.01f, 0.5f, 10.0f};
    for (size_t i = 0; i < sizeof reps / sizeof reps[0]; i++) {
        s.repetition_penalty = reps[i];
        assert_int_equal(specd_sampling_validate(&s, 0, &err), 0);
    }
    s.repetition_penalty = 1.0f;
    s.frequency_penalty = -2.0f;
    s.presence_penalty = 2.0f;
    assert_int_equal(specd_sampling_validate(&s, 0, &err), 0);

    static const float bad_reps[] = {-0.5f, 10.5f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_reps / sizeof bad_reps[0]; i++) {
        specd_sampling b = params(1.0f, 0, 1.0f, 0.0f);
        b.repetition_penalty = bad_reps[i];
        expect_invalid(b, "repetition_penalty");
    }
    static const float bad_pen[] = {-2.01f, 3.0f, NAN, -INFINITY};
    for (size_t i = 0; i < sizeof bad_pen / sizeof bad_pen[0]; i++) {
        specd_sampling b = params(1.0f, 0, 1.0f, 0.0f);
        b.frequency_penalty = bad_pen[i];
        expect_invalid(b, "frequency_penalty");
        b.frequency_penalty = 0.0f;
        b.presence_penalty = bad_pen[i];
        expect_invalid(b, "presence_penalty");
    }
    specd_sampling b = params(1.0f, 0, 1.0f, 0.0f);
    b.frequency_penalty = 3.0f;
    specd_sampling_validate(&b, 0, &err);
    assert_string_equal(err.msg, "frequency_penalty must be in [-2, 2], got 3");

    /* logit bias */
    int32_t ids[4] = {5, 9, 2, 9};
    float vals[4] = {-100.0f, 100.0f, 0.5f, 1.0f};
    b = params(0.0f, 0, 1.0f, 0.0f);
    b.bias_ids = ids;
    b.bias_values = vals;
    b.n_logit_bias = 3;
    assert_int_equal(specd_sampling_validate(&b, 10, &err), 0);
    assert_int_equal(specd_sampling_validate(&b, 0, &err), 0);
    assert_int_equal(specd_sampling_validate(&b, 9, &err), -1); /* id 9 outside 0..8 */
    assert_string_equal(err.msg, "logit_bias[1].token_id = 9 is outside 0..8");
    b.n_logit_bias = 4; /* id 9 twice */
    assert_int_equal(specd_sampling_validate(&b, 10, &err), -1);
    assert_string_equal(err.msg,
                        "logit_bias[3].token_id = 9 repeats logit_bias[1] (each token at most once)");
    assert_int_equal(specd_sampling_validate(&b, 0, &err), 0); /* ids unchecked without a vocab */
    b.n_logit_bias = 3;
    vals[2] = 100.5f;
    assert_int_equal(specd_sampling_validate(&b, 10, &err), -1);
    assert_string_equal(err.msg, "logit_bias[2].bias must be in [-100, 100], got 100.5");
    vals[2] = NAN;
    expect_invalid(b, "logit_bias[2].bias");
    vals[2] = 0.5f;
    b.n_logit_bias = SPECD_MAX_LOGIT_BIAS + 1;
    expect_invalid(b, "logit_bias");
    b.n_logit_bias = -1;
    expect_invalid(b, "logit_bias");
    b.n_logit_bias = 2;
    b.bias_ids = NULL;
    expect_invalid(b, "logit_bias");

    /* The most entries allowed, all distinct, and a duplicate found among
     * them in O(n log n). */
    int32_t *many = malloc(sizeof(int32_t) * SPECD_MAX_LOGIT_BIAS);
    float *mv = calloc(SPECD_MAX_LOGIT_BIAS, sizeof(float));
    for (int i = 0; i < SPECD_MAX_LOGIT_BIAS; i++) many[i] = (i * 7919) % 49152;
    b.bias_ids = many;
    b.bias_values = mv;
    b.n_logit_bias = SPECD_MAX_LOGIT_BIAS;
    assert_int_equal(specd_sampling_validate(&b, 49152, &err), 0);
    many[1000] = many[17];
    assert_int_equal(specd_sampling_validate(&b, 49152, &err), -1);
    assert_non_null(strstr(err.msg, "logit_bias[1000].token_id"));
    assert_non_null(strstr(err.msg, "repeats logit_bias[17]"));
    free(many);
    free(mv);
}

/* --- argmax ---------------------------------------------------------------- */

static void test_argmax(void **state) {
    (void)state;
    assert_int_equal(specd_argmax((float[]){1, 3, 2, 3}, 4), 1);
    assert_int_equal(specd_argmax((float[]){NAN, 1, NAN, 5, 5}, 5), 3);
    assert_int_equal(specd_argmax((float[]){NAN, NAN}, 2), 0);
    assert_int_equal(specd_argmax((float[]){-INFINITY, -INFINITY}, 2), 0);
    assert_int_equal(specd_argmax((float[]){-INFINITY, -1e30f, NAN}, 3), 1);
    assert_int_equal(specd_argmax((float[]){0, INFINITY, INFINITY}, 3), 1);
    assert_int_equal(specd_argmax((float[]){-0.0f, 0.0f}, 2), 0); /* -0 == +0: a tie */
    assert_int_equal(specd_argmax((float[]){7}, 1), 0);
    assert_int_equal(specd_argmax(NULL, 0), -1);
}

/* --- the processing pipeline on hand-made logits --------------------------- */

static void test_greedy_and_softmax(void **state) {
    (void)state;
    float l[5] = {0.5f, 2.0f, -1.0f, 2.0f, NAN}, p[5];
    specd_sampling s = params(0.0f, 3, 0.5f, 0.5f); /* filters ignored when greedy */
    probs_of(&s, l, 5, p);
    assert_kept(p, 5, (int[]){1}, 1);
    assert_true(p[1] == 1.0f);

    /* T = 1, no filters: the plain softmax; NaN gets 0. */
    s = params(1.0f, 0, 1.0f, 0.0f);
    probs_of(&s, l, 5, p);
    double z = exp(0.5) + 2 * exp(2.0) + exp(-1.0);
    assert_near(p[0], exp(0.5) / z, 1e-7);
    assert_near(p[1], exp(2.0) / z, 1e-7);
    assert_near(p[2], exp(-1.0) / z, 1e-7);
    assert_true(p[1] == p[3]);
    assert_true(p[4] == 0.0f);

    /* T = 2 takes the square root of the ratios. */
    double d[4] = {0.5, 0.25, 0.125, 0.125};
    float l4[4], p4[4];
    logits_from(d, 4, l4);
    s = params(2.0f, 0, 1.0f, 0.0f);
    probs_of(&s, l4, 4, p4);
    double zz = sqrt(0.5) + sqrt(0.25) + 2 * sqrt(0.125);
    for (int i = 0; i < 4; i++) assert_near(p4[i], sqrt(d[i]) / zz, 1e-6);
}

static void test_top_k(void **state) {
    (void)state;
    float l[6] = {1, 3, 3, 2, 3, 0}, p[6];
    specd_sampling s = params(1.0f, 2, 1.0f, 0.0f);
    probs_of(&s, l, 6, p);
    assert_kept(p, 6, (int[]){1, 2}, 2); /* three-way tie at 3: lowest ids win */
    assert_near(p[1], 0.5, 1e-7);

    s.top_k = 1;
    probs_of(&s, l, 6, p);
    assert_kept(p, 6, (int[]){1}, 1);

    s.top_k = 4;
    probs_of(&s, l, 6, p);
    assert_kept(p, 6, (int[]){1, 2, 3, 4}, 4);
    double z = 3 * exp(3.0) + exp(2.0);
    assert_near(p[3], exp(2.0) / z, 1e-7);

    s.top_k = 6; /* = n: off */
    probs_of(&s, l, 6, p);
    assert_kept(p, 6, (int[]){0, 1, 2, 3, 4, 5}, 6);
    s.top_k = 100;
    probs_of(&s, l, 6, p);
    assert_kept(p, 6, (int[]){0, 1, 2, 3, 4, 5}, 6);

    /* Temperature does not change the top-k set, only the shape inside it. */
    s = params(0.25f, 3, 1.0f, 0.0f);
    probs_of(&s, l, 6, p);
    assert_kept(p, 6, (int[]){1, 2, 4}, 3);
}

static void test_top_p(void **state) {
    (void)state;
    /* Token probabilities 0.125, 0.5, 0.125, 0.25: rank order 1, 3, 0, 2. */
    double d[4] = {0.125, 0.5, 0.125, 0.25};
    float l[4], p[4];
    logits_from(d, 4, l);
    specd_sampling s = params(1.0f, 0, 0.4f, 0.0f);
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){1}, 1);
    assert_true(p[1] == 1.0f);

    s.top_p = 0.7f; /* 0.5 < 0.7 <= 0.75 */
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){1, 3}, 2);
    assert_near(p[1], 2.0 / 3.0, 1e-6);

    s.top_p = 0.8f; /* 0.75 < 0.8 <= 0.875: one of the tied 0.125s, the lower id */
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){1, 3, 0}, 3);

    s.top_p = 0.9f;
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){0, 1, 2, 3}, 4);

    s.top_p = 1e-6f; /* always at least one token */
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){1}, 1);
}

static void test_order_top_k_then_top_p(void **state) {
    (void)state;
    /* top-p renormalizes over what top-k kept: with top_k = 3 the mass is
     * 0.875 and 0.5 + 0.25 = 0.75 >= 0.8 * 0.875 = 0.7 stops at two tokens;
     * top-p alone needs three to reach 0.8. */
    double d[4] = {0.5, 0.25, 0.125, 0.125};
    float l[4], p[4];
    logits_from(d, 4, l);
    specd_sampling s = params(1.0f, 0, 0.8f, 0.0f);
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){0, 1, 2}, 3);
    s.top_k = 3;
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){0, 1}, 2);
    assert_near(p[0], 2.0 / 3.0, 1e-6);
}

static void test_min_p(void **state) {
    (void)state;
    /* Weights relative to the best: 1, 0.5, 0.25, 0.25. */
    double d[4] = {0.5, 0.25, 0.125, 0.125};
    float l[4], p[4];
    logits_from(d, 4, l);
    specd_sampling s = params(1.0f, 0, 1.0f, 0.3f);
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){0, 1}, 2);
    assert_near(p[0], 2.0 / 3.0, 1e-6);
    s.min_p = 0.6f;
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){0}, 1);
    s.min_p = 0.2f;
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){0, 1, 2, 3}, 4);
    s.min_p = 1.0f; /* only the best (and exact ties with it) */
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){0}, 1);

    /* min-p comes after temperature: at T = 0.5 the ratios square to
     * 1, 0.25, 0.0625, 0.0625, so min_p = 0.2 keeps two tokens, not four. */
    s = params(0.5f, 0, 1.0f, 0.2f);
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){0, 1}, 2);
    assert_near(p[0], 0.8, 1e-6);

    /* ... and after top-p / top-k, relative to the same best token. */
    s = params(1.0f, 2, 0.99f, 0.3f);
    probs_of(&s, l, 4, p);
    assert_kept(p, 4, (int[]){0, 1}, 2);
}

static void test_degenerate_logits(void **state) {
    (void)state;
    float p[4];
    specd_sampling s = params(1.0f, 0, 1.0f, 0.0f);
    probs_of(&s, (float[]){NAN, NAN, NAN, NAN}, 4, p);
    assert_kept(p, 4, (int[]){0}, 1);
    probs_of(&s, (float[]){-INFINITY, -INFINITY, NAN, -INFINITY}, 4, p);
    assert_kept(p, 4, (int[]){0}, 1);
    probs_of(&s, (float[]){NAN, -INFINITY, 2, NAN}, 4, p);
    assert_kept(p, 4, (int[]){2}, 1);
    /* +inf logits share the mass (softmax limit); top-k picks the lower id. */
    probs_of(&s, (float[]){1, INFINITY, NAN, INFINITY}, 4, p);
    assert_kept(p, 4, (int[]){1, 3}, 2);
    assert_true(p[1] == 0.5f);
    s.top_k = 1;
    probs_of(&s, (float[]){1, INFINITY, NAN, INFINITY}, 4, p);
    assert_kept(p, 4, (int[]){1}, 1);
    /* Huge spread: the far tail underflows to exactly 0, never NaN. */
    s = params(0.01f, 0, 0.999f, 0.0f);
    probs_of(&s, (float[]){1e30f, -1e30f, 0, 1e30f}, 4, p);
    assert_kept(p, 4, (int[]){0, 3}, 2);
    /* Invalid parameters still give a valid distribution. */
    s = params(NAN, -5, NAN, NAN);
    probs_of(&s, (float[]){0, 1, 2, 3}, 4, p);
    assert_kept(p, 4, (int[]){3}, 1);
    s = params(1.0f, -5, -1.0f, 7.0f);
    probs_of(&s, (float[]){0, 1, 2, 3}, 4, p);
    assert_kept(p, 4, (int[]){3}, 1);
}

/* --- large vocabulary against a brute-force reference ---------------------- */

static const float *g_ref_logits; /* qsort has no context argument */

static int rank_cmp(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    float x = g_ref_logits[i], y = g_ref_logits[j];
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}

/* The definition in sampling.h, written the obvious way: sort everything,
 * double precision throughout. */
static void ref_probs(const specd_sampling *s, const float *l, int n, double *out) {
    memset(out, 0, sizeof(double) * n);
    int *idx = malloc(sizeof(int) * n);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(l[i]) && l[i] > -INFINITY) idx[m++] = i;
    g_ref_logits = l;
    qsort(idx, m, sizeof(int), rank_cmp);
    double lmax = l[idx[0]];
    double *w = malloc(sizeof(double) * n);
    for (int j = 0; j < m; j++) w[j] = exp((l[idx[j]] - lmax) / s->temperature);
    int kept = m;
    if (s->top_k > 0 && s->top_k < kept) kept = s->top_k;
    if (s->top_p < 1.0f) {
        double tot = 0, cum = 0;
        for (int j = 0; j < kept; j++) tot += w[j];
        int j = 0;
        while (j < kept) {
            cum += w[j++];
            if (cum >= s->top_p * tot) break;
        }
        kept = j;
    }
    double z = 0;
    for (int j = 0; j < kept; j++)
        if (w[j] >= s->min_p * w[0]) z += w[j];
    for (int j = 0; j < kept; j++)
        if (w[j] >= s->min_p * w[0]) out[idx[j]] = w[j] / z;
    free(w);
    free(idx);
}

static void compare_with_reference(const char *what, const specd_sampling *s, const float *l,
                                   int n) {
    float *p = malloc(sizeof(float) * n);
    double *r = malloc(sizeof(double) * n);
    probs_of(s, l, n, p);
    ref_probs(s, l, n, r);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        /* Tokens the reference gives < 1e-40 underflow to 0 in float: fine. */
        if ((p[i] > 0) != (r[i] > 1e-40) || fabs(p[i] - r[i]) > 1e-7 + 1e-5 * r[i])
            fail_msg("%s (T=%g k=%d p=%g min_p=%g): token %d got %.9g, reference %.9g", what,
                     (double)s->temperature, s->top_k, (double)s->top_p, (double)s->min_p, i,
                     (double)p[i], r[i]);
        kept += p[i] > 0;
    }
    assert_true(fabs(sum_of(p, n) - 1.0) < 1e-5);
    if (s->top_k > 0) assert_true(kept <= s->top_k);
    free(p);
    free(r);
}

static const float CONFIGS[][4] = {
    /* temperature, top_k, top_p, min_p */
    {1.0f, 0, 1.0f, 0.0f},     {0.7f, 50, 1.0f, 0.0f},    {1.0f, 0, 0.9f, 0.0f},
    {0.8f, 40, 0.95f, 0.05f},  {1.2f, 0, 0.95f, 0.02f},   {1.0f, 1000, 1.0f, 0.0f},
    {1.0f, 0, 1.0f, 0.1f},     {1.0f, 20000, 0.5f, 0.0f}, {3.0f, 0, 0.99f, 0.0f},
    {0.3f, 5, 0.3f, 0.0f},     {1.0f, 1, 1.0f, 0.0f},     {2.0f, 49151, 0.999f, 0.0f},
};
#define N_CONFIGS (int)(sizeof CONFIGS / sizeof CONFIGS[0])

static void test_large_vocab_matches_reference(void **state) {
    (void)state;
    float *l = malloc(sizeof(float) * VOCAB);
    for (int set = 0; set < 4; set++) {
        const char *what;
        if (set == 0) {
            what = "gaussian logits";
            gaussian_logits(l, VOCAB, 7, 3.0f);
        } else if (set == 1) {
            /* Rounded to 0.5: thousands of ties, checks tie-breaking by id. */
            what = "tied logits";
            gaussian_logits(l, VOCAB, 8, 2.0f);
            for (int i = 0; i < VOCAB; i++) l[i] = roundf(l[i] * 2.0f) / 2.0f;
        } else if (set == 2) {
            what = "flat logits"; /* everything in one bucket, all tied */
            for (int i = 0; i < VOCAB; i++) l[i] = 0.25f;
        } else {
            /* A peaked head over a long flat tail, with NaN / -inf holes. */
            what = "peaked logits";
            test_fill_random(l, VOCAB, 9, 4.0f);
            for (int i = 0; i < 20; i++) l[i * 997] += 12.0f - (float)i * 0.5f;
            for (int i = 5; i < VOCAB; i += 1009) l[i] = (i & 1) ? NAN : -INFINITY;
        }
        for (int c = 0; c < N_CONFIGS; c++) {
            specd_sampling s = params(CONFIGS[c][0], (int)CONFIGS[c][1], CONFIGS[c][2],
                                      CONFIGS[c][3]);
            compare_with_reference(what, &s, l, VOCAB);
        }
    }
    free(l);
}

/* Prints the cost at vocab 49152 and fails only on something pathological
 * (the sanitizer build is several times slower than release). */
static void test_probs_timing(void **state) {
    (void)state;
    float *l = malloc(sizeof(float) * VOCAB), *p = malloc(sizeof(float) * VOCAB);
    void *scratch = malloc(specd_sampling_scratch_size(VOCAB));
    static const float timed[][4] = {{1.0f, 0, 1.0f, 0.0f},   {0.7f, 50, 1.0f, 0.0f},
                                     {1.0f, 0, 0.9f, 0.0f},   {0.8f, 40, 0.95f, 0.05f},
                                     {1.0f, 0, 0.95f, 0.0f},  {1.0f, 0, 1.0f, 0.05f},
                                     {1.0f, 1000, 0.99f, 0.0f}};
    for (int flat = 0; flat < 2; flat++) {
        if (flat) for (int i = 0; i < VOCAB; i++) l[i] = 0.0f;
        else gaussian_logits(l, VOCAB, 11, 3.0f);
        for (size_t c = 0; c < sizeof timed / sizeof timed[0]; c++) {
            specd_sampling s = params(timed[c][0], (int)timed[c][1], timed[c][2], timed[c][3]);
            int reps = 20;
            double t0 = specd_now_s();
            for (int r = 0; r < reps; r++) specd_sampling_probs(&s, l, VOCAB, p, scratch);
            double us = (specd_now_s() - t0) / reps * 1e6;
            print_message("probs vocab %d %s T=%.1f top_k=%d top_p=%.2f min_p=%.2f: %.0f us\n",
                          VOCAB, flat ? "flat    " : "gaussian", (double)s.temperature, s.top_k,
                          (double)s.top_p, (double)s.min_p, us);
            assert_true(us < 50000);
        }
    }
    free(scratch);
    free(p);
    free(l);
}

/* --- the SIMD paths (simd.h) ------------------------------------------------ */

static const char *const k_paths[] = {"scalar", "avx2", "avx512"};
#define N_PATHS 3

/* specd_rng_u32x4_run is the per-block function at consecutive counters, on
 * every path: whole vector groups, a partial tail, and a run whose counter's
 * low word wraps (the carry into the high word) inside a group. */
static void test_rng_run_matches_blocks(void **state) {
    (void)state;
    static const struct {
        uint64_t seed, stream, counter;
        size_t n;
    } runs[] = {
        {0, 0, 0, 64},
        {0xdeadbeefcafef00dull, 7, 1ull << 40, 37},
        {42, 0x123456789abcdefull, 0xfffffffbull, 40}, /* low word wraps at +5 */
        {42, 3, 0x1fffffff0ull, 33},                   /* and at +16 */
        {1, 2, 3, 1},
        {1, 2, 3, 0},
    };
    uint32_t *got = malloc(sizeof(uint32_t) * 4 * 65), want[4];
    int paths = 0;
    for (int p = 0; p < N_PATHS; p++) {
        if (!specd_simd_force(k_paths[p])) continue;
        paths++;
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            memset(got, 0xa5, sizeof(uint32_t) * 4 * 65);
            specd_rng_u32x4_run(runs[r].seed, runs[r].stream, runs[r].counter, runs[r].n, got);
            for (size_t i = 0; i < runs[r].n; i++) {
                specd_rng_u32x4(runs[r].seed, runs[r].stream, runs[r].counter + i, want);
                if (memcmp(got + 4 * i, want, sizeof want) != 0)
                    fail_msg("path %s run %zu block %zu differs", k_paths[p], r, i);
            }
            /* nothing written past the last block */
            assert_int_equal(got[4 * runs[r].n], 0xa5a5a5a5u);
        }
    }
    specd_simd_force("auto");
    assert_true(paths >= 1);
    free(got);
}

/* The weight's exp against libm's exp in double, rounded once: at most one
 * float ulp apart anywhere, and equal nearly everywhere. */
static void test_exp_neg_accuracy(void **state) {
    (void)state;
    int total = 0, equal = 0;
    for (double g = 0.0; g < 104.0; g += 0.000731) {
        float got = sampling_exp_neg(g), want = (float)exp(-g);
        total++;
        if (got == want) {
            equal++;
            continue;
        }
        if (fabsf(got - want) > fabsf(nextafterf(want, INFINITY) - want))
            fail_msg("exp(-%.9g): %a, libm %a", g, (double)got, (double)want);
    }
    print_message("exp_neg: %d of %d equal to libm's exp rounded to float\n", equal, total);
    assert_true(equal >= total - total / 10000);
    /* the log-probabilities' exp, in double */
    double worst = 0.0;
    for (double x = 0.0; x > -700.0; x -= 0.00731) {
        double got = sampling_exp_d(x), want = exp(x), rel = fabs(got - want) / want;
        if (rel > worst) worst = rel;
    }
    print_message("exp_d: worst relative error %.3g against libm's exp\n", worst);
    assert_true(worst < 1e-12);
    assert_true(sampling_exp_d(0.0) == 1.0);
    assert_true(sampling_exp_d(-701.0) == 0.0 && sampling_exp_d(-INFINITY) == 0.0);
    assert_true(sampling_exp_d(NAN) == 0.0);
    assert_true(sampling_exp_neg(0.0) == 1.0f);
    assert_true(sampling_exp_neg(SAMPLING_MAX_GAP) == 0.0f);
    assert_true(sampling_exp_neg(INFINITY) == 0.0f);
    assert_true(sampling_exp_neg(NAN) == 0.0f);
}

/* specd_log_sum_exp against a double reference, the same bits on every
 * path, and its edge rows; and it is specd_logprobs' normalizer. */
static void test_log_sum_exp(void **state) {
    (void)state;
    enum { N = 3001 };
    float *x = malloc(sizeof(float) * N);
    gaussian_logits(x, N, 11, 8.0f);
    for (int i = 0; i < N; i += 7) x[i] = -INFINITY;
    x[5] = NAN;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < N; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < N; i++)
        if (x[i] > -INFINITY) sum += exp((double)x[i] - mx);
    double want = mx + log(sum);
    assert_true(specd_simd_force("scalar"));
    double ref = specd_log_sum_exp(x, N);
    assert_true(fabs(ref - want) < 1e-12 * fabs(want) + 1e-12);
    float lp;
    specd_logprobs(x, N, 1, 0, &lp, NULL, NULL);
    assert_true(lp == (float)((double)x[1] - ref));
    for (int p = 1; p < N_PATHS; p++) {
        if (!specd_simd_force(k_paths[p])) continue;
        double got = specd_log_sum_exp(x, N);
        assert_memory_equal(&got, &ref, sizeof got);
    }
    specd_simd_force("auto");
    assert_true(specd_log_sum_exp(x + 1, 1) == (double)x[1]);
    float none[3] = {-INFINITY, -INFINITY, -INFINITY}, nans[2] = {NAN, NAN};
    float inf[3] = {1.0f, INFINITY, 2.0f};
    assert_true(specd_log_sum_exp(none, 3) == -INFINITY);
    assert_true(specd_log_sum_exp(none, 0) == -INFINITY);
    assert_true(specd_log_sum_exp(inf, 3) == INFINITY);
    assert_true(isnan(specd_log_sum_exp(nans, 2)));
    free(x);
}

/* Every path gives the scalar twin's bits: the probabilities of every
 * filter setting (odd sizes, NaN and -inf holes, +inf logits), the race's
 * picks and top-k, the log-probabilities with their top 8, and argmax's
 * ties, NaN and signed zeros. */
static void test_simd_paths_bitwise(void **state) {
    (void)state;
    const int sizes[2] = {VOCAB, 1003};
    float *l = malloc(sizeof(float) * VOCAB), *ref = malloc(sizeof(float) * VOCAB),
          *got = malloc(sizeof(float) * VOCAB);
    void *scratch = malloc(specd_sampling_scratch_size(VOCAB));
    int compared = 0;
    for (int z = 0; z < 2; z++)
        for (int set = 0; set < 4; set++) {
            int n = sizes[z];
            gaussian_logits(l, n, (uint64_t)(300 + set), set == 1 ? 8.0f : 3.0f);
            if (set == 2)
                for (int i = 3; i < n; i += 101) l[i] = (i & 1) ? NAN : -INFINITY;
            if (set == 3) l[n / 2] = l[n - 1] = INFINITY;
            for (int c = 0; c < N_CONFIGS; c++) {
                specd_sampling s = params(CONFIGS[c][0], (int)CONFIGS[c][1], CONFIGS[c][2],
                                          CONFIGS[c][3]);
                assert_true(specd_simd_force("scalar"));
                specd_sampling_probs(&s, l, n, ref, scratch);
                int32_t ref_ids[SPECD_RACE_MAX_K], got_ids[SPECD_RACE_MAX_K];
                specd_race_addr a = {77 + (uint64_t)c, (uint64_t)set, (uint64_t)z};
                int ref_pick = specd_race_pick(ref, n, a);
                int ref_k = specd_race_topk(ref, n, a, 5, ref_ids);
                int ref_max = specd_argmax(l, n);
                float ref_lp, got_lp, ref_tl[8], got_tl[8];
                int32_t ref_ti[8], got_ti[8];
                specd_logprobs(l, n, c, 8, &ref_lp, ref_ti, ref_tl);
                for (int p = 1; p < N_PATHS; p++) {
                    if (!specd_simd_force(k_paths[p])) continue;
                    specd_sampling_probs(&s, l, n, got, scratch);
                    if (memcmp(got, ref, sizeof(float) * (size_t)n) != 0)
                        fail_msg("probs differ: path %s, n %d, set %d, config %d", k_paths[p], n,
                                 set, c);
                    assert_int_equal(specd_race_pick(got, n, a), ref_pick);
                    assert_int_equal(specd_race_pick_ref(got, n, a), ref_pick);
                    assert_int_equal(specd_race_topk(got, n, a, 5, got_ids), ref_k);
                    assert_memory_equal(got_ids, ref_ids, sizeof(int32_t) * (size_t)ref_k);
                    assert_int_equal(specd_argmax(l, n), ref_max);
                    specd_logprobs(l, n, c, 8, &got_lp, got_ti, got_tl);
                    assert_memory_equal(&got_lp, &ref_lp, sizeof got_lp);
                    assert_memory_equal(got_ti, ref_ti, sizeof got_ti);
                    assert_memory_equal(got_tl, ref_tl, sizeof got_tl);
                    compared++;
                }
            }
        }
    /* argmax edge cases, each at several offsets within a vector */
    float x[70];
    for (int p = 0; p < N_PATHS; p++) {
        if (!specd_simd_force(k_paths[p])) continue;
        for (int at = 0; at < 70; at += 7) {
            for (int i = 0; i < 70; i++) x[i] = NAN;
            assert_int_equal(specd_argmax(x, 70), 0); /* all NaN */
            x[at] = -INFINITY;
            assert_int_equal(specd_argmax(x, 70), at); /* the only non-NaN */
            for (int i = 0; i < 70; i++) x[i] = i == at ? 0.0f : -0.0f;
            assert_int_equal(specd_argmax(x, 70), 0); /* +0 and -0 tie: the first */
            for (int i = 0; i < 70; i++) x[i] = (float)(i % 5);
            x[at] = 9.0f;
            if (at + 20 < 70) x[at + 20] = 9.0f;
            assert_int_equal(specd_argmax(x, 70), at); /* ties: the lowest id */
            assert_int_equal(specd_argmax(x, at + 1), at);
        }
    }
    specd_simd_force("auto");
    print_message("%d (config, input) pairs compared across SIMD paths\n", compared);
    assert_true(compared > 0 || !specd_simd_force("avx2"));
    specd_simd_force("auto");
    free(scratch);
    free(got);
    free(ref);
    free(l);
}

/* --- drawing tokens --------------------------------------------------------- */

static void test_sample_from_probs(void **state) {
    (void)state;
    float p[5] = {0.0f, 0.25f, 0.0f, 0.75f, 0.0f};
    assert_int_equal(specd_sample_from_probs(p, 5, 0.0), 1);
    assert_int_equal(specd_sample_from_probs(p, 5, 0.2499), 1);
    assert_int_equal(specd_sample_from_probs(p, 5, 0.25), 3);
    assert_int_equal(specd_sample_from_probs(p, 5, 0x1.fffffffffffffp-1), 3);
    assert_int_equal(specd_sample_from_probs(p, 5, 7.0), 3);   /* clamped */
    assert_int_equal(specd_sample_from_probs(p, 5, -1.0), 1);  /* clamped */
    assert_int_equal(specd_sample_from_probs(p, 5, NAN), 1);   /* clamped */
    /* Unnormalized, negative and NaN entries. */
    float q[5] = {-1.0f, 2.0f, NAN, 6.0f, 0.0f};
    assert_int_equal(specd_sample_from_probs(q, 5, 0.2), 1);
    assert_int_equal(specd_sample_from_probs(q, 5, 0.3), 3);
    /* Nothing positive: argmax, never out of range. */
    assert_int_equal(specd_sample_from_probs((float[]){0, 0, 0}, 3, 0.5), 0);
    assert_int_equal(specd_sample_from_probs((float[]){-1, NAN, -0.5f}, 3, 0.5), 2);
    assert_int_equal(specd_sample_from_probs(NULL, 0, 0.5), -1);
}

static void test_sample_determinism(void **state) {
    (void)state;
    float *l = malloc(sizeof(float) * VOCAB), *p = malloc(sizeof(float) * VOCAB);
    void *scratch = malloc(specd_sampling_scratch_size(VOCAB));
    gaussian_logits(l, VOCAB, 21, 1.0f); /* flat enough that draws differ */
    specd_sampling s = params(1.0f, 0, 0.95f, 0.0f);
    s.seed = 0xfeedULL;
    s.method = SPECD_SAMPLING_REJECTION;

    /* With REJECTION, specd_sample is exactly probs + addressed uniform +
     * inverse CDF. */
    specd_sampling_probs(&s, l, VOCAB, p, scratch);
    int distinct = 0, prev = -1;
    for (uint64_t c = 0; c < 64; c++) {
        int t = specd_sample(&s, l, VOCAB, 5, c, scratch);
        assert_int_equal(t, specd_sample(&s, l, VOCAB, 5, c, scratch));
        assert_int_equal(t, specd_sample_from_probs(p, VOCAB, specd_rng_uniform(s.seed, 5, c)));
        assert_true(p[t] > 0.0f);
        distinct += t != prev;
        prev = t;
    }
    assert_true(distinct > 50); /* different counters, different draws */

    /* Another seed gives another sequence. */
    specd_sampling s2 = s;
    s2.seed++;
    int same = 0;
    for (uint64_t c = 0; c < 64; c++)
        same += specd_sample(&s, l, VOCAB, 5, c, scratch) == specd_sample(&s2, l, VOCAB, 5, c, scratch);
    assert_true(same < 8);

    /* Greedy ignores the address. */
    s.temperature = 0.0f;
    int am = specd_argmax(l, VOCAB);
    for (uint64_t c = 0; c < 8; c++) assert_int_equal(specd_sample(&s, l, VOCAB, c, c, scratch), am);
    free(scratch);
    free(p);
    free(l);
}

/* --- seed-exact sampling: the race -------------------------------------------- */

/* specd_race_pick (the fast race: one Philox block per 4 ids, logs only for
 * tokens that can still win) against its definition, specd_race_pick_ref,
 * and specd_race_topk against a full sort of the keys, on distributions
 * from flat to peaked, with zeros, NaN and filtered tails. */
static void test_race_matches_reference(void **state) {
    (void)state;
    const int n = 5003; /* not a multiple of 4: a partial last block */
    float *l = malloc(sizeof(float) * n), *p = malloc(sizeof(float) * n);
    double *key = malloc(sizeof(double) * n);
    void *scratch = malloc(specd_sampling_scratch_size(n));
    static const float temps[] = {0.3f, 1.0f, 3.0f};
    static const float spreads[] = {0.5f, 2.0f, 6.0f};
    int checked = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < 3; si++)
            for (int filt = 0; filt < 2; filt++) {
                gaussian_logits(l, n, (uint32_t)(100 + ti * 10 + si), spreads[si]);
                specd_sampling s = params(temps[ti], filt ? 50 : 0, filt ? 0.9f : 1.0f, 0.0f);
                specd_sampling_probs(&s, l, n, p, scratch);
                if (filt) p[7] = NAN; /* never wins */
                for (uint64_t pos = 0; pos < 40; pos++) {
                    specd_race_addr a = {0xabcdefULL + (uint64_t)ti, pos, pos % 3};
                    int w = specd_race_pick(p, n, a);
                    assert_int_equal(w, specd_race_pick_ref(p, n, a));
                    assert_true(p[w] > 0.0f);
                    /* top-k: the k smallest keys, ascending, by brute force */
                    int32_t ids[SPECD_RACE_MAX_K];
                    int k = 1 + (int)(pos % 8);
                    int got = specd_race_topk(p, n, a, k, ids);
                    int positive = 0;
                    for (int i = 0; i < n; i++) {
                        key[i] = p[i] > 0.0f ? specd_race_exp(a, i) / (double)p[i] : INFINITY;
                        positive += p[i] > 0.0f;
                    }
                    assert_int_equal(got, k < positive ? k : positive);
                    assert_int_equal(ids[0], w);
                    for (int j = 0; j < got; j++) {
                        int below = 0;
                        for (int i = 0; i < n; i++) below += key[i] < key[ids[j]];
                        assert_int_equal(below, j); /* ids[j] is the (j+1)-th smallest */
                    }
                    checked++;
                }
            }
    assert_int_equal(checked, 3 * 3 * 2 * 40);

    /* Degenerate: nothing positive -> argmax; one positive -> it. */
    for (int i = 0; i < n; i++) p[i] = 0.0f;
    assert_int_equal(specd_race_pick(p, n, (specd_race_addr){1, 2, 0}), 0);
    p[4321] = 1e-30f;
    assert_int_equal(specd_race_pick(p, n, (specd_race_addr){1, 2, 0}), 4321);
    int32_t one[4];
    assert_int_equal(specd_race_topk(p, n, (specd_race_addr){1, 2, 0}, 4, one), 1);
    free(scratch);
    free(key);
    free(p);
    free(l);
}

/* The promise of seed-exact sampling in one place: the token is a function
 * of (seed, position) and the distribution alone, so specd_sample at a
 * position is the race at (seed, position, counter) over the same probs; a
 * different counter, seed or position is an independent draw. */
static void test_seed_exact_addressing(void **state) {
    (void)state;
    float *l = malloc(sizeof(float) * VOCAB), *p = malloc(sizeof(float) * VOCAB);
    void *scratch = malloc(specd_sampling_scratch_size(VOCAB));
    gaussian_logits(l, VOCAB, 22, 1.0f);
    specd_sampling s = params(1.0f, 0, 1.0f, 0.0f);
    assert_int_equal(s.method, SPECD_SAMPLING_SEED_EXACT); /* the default */
    s.seed = 77;
    specd_sampling_probs(&s, l, VOCAB, p, scratch);
    int by_pos = 0, by_ctr = 0, by_seed = 0;
    for (uint64_t pos = 0; pos < 64; pos++) {
        int t = specd_sample(&s, l, VOCAB, pos, 0, scratch);
        assert_int_equal(t, specd_race_pick(p, VOCAB, (specd_race_addr){77, pos, 0}));
        by_pos += t != specd_sample(&s, l, VOCAB, pos + 1, 0, scratch);
        by_ctr += t != specd_sample(&s, l, VOCAB, pos, 1, scratch);
        specd_sampling s2 = s;
        s2.seed = 78;
        by_seed += t != specd_sample(&s2, l, VOCAB, pos, 0, scratch);
    }
    assert_true(by_pos > 50 && by_ctr > 50 && by_seed > 50);
    /* the method is validated */
    specd_error err = {{0}};
    s.method = (specd_sampling_method)2;
    assert_int_equal(specd_sampling_validate(&s, VOCAB, &err), -1);
    assert_non_null(strstr(err.msg, "method"));
    free(scratch);
    free(p);
    free(l);
}

/* --- penalties and logit bias ------------------------------------------------ */

static void test_token_counts(void **state) {
    (void)state;
    specd_token_counts c;
    specd_error err = {{0}};
    assert_int_equal(specd_token_counts_init(&c, 0, &err), -1);
    assert_non_null(strstr(err.msg, "vocabulary"));
    assert_int_equal(specd_token_counts_init(&c, 8, &err), 0);
    specd_token_counts_add(&c, 3, 0); /* prompt */
    specd_token_counts_add(&c, 5, 1);
    specd_token_counts_add(&c, 3, 1);
    specd_token_counts_add(&c, 5, 1);
    specd_token_counts_add(&c, 8, 1);  /* outside: ignored */
    specd_token_counts_add(&c, -1, 1); /* outside: ignored */
    assert_int_equal(c.n_seen, 2);
    assert_int_equal(c.seen_list[0], 3); /* first-seen order */
    assert_int_equal(c.seen_list[1], 5);
    assert_int_equal(c.out_count[3], 1);
    assert_int_equal(c.out_count[5], 2);
    assert_int_equal(c.seen[3] + c.seen[5], 2);
    specd_token_counts_reset(&c);
    assert_int_equal(c.n_seen, 0);
    for (int i = 0; i < 8; i++) assert_int_equal(c.out_count[i] + c.seen[i], 0);
    specd_token_counts_free(&c);
    specd_token_counts_free(&c); /* idempotent */
    specd_token_counts_add(NULL, 1, 1);
    specd_token_counts_reset(NULL);
}

static void test_adjusts_logits(void **state) {
    (void)state;
    specd_sampling s = params(1.0f, 0, 1.0f, 0.0f);
    assert_int_equal(specd_sampling_adjusts_logits(&s), 0);
    s.repetition_penalty = 1.0f;
    assert_int_equal(specd_sampling_adjusts_logits(&s), 0); /* 1 = off as well as 0 */
    s.repetition_penalty = 1.1f;
    assert_int_equal(specd_sampling_adjusts_logits(&s), 1);
    s = params(1.0f, 0, 1.0f, 0.0f);
    s.presence_penalty = -0.5f;
    assert_int_equal(specd_sampling_adjusts_logits(&s), 1);
    s = params(1.0f, 0, 1.0f, 0.0f);
    s.frequency_penalty = 0.1f;
    assert_int_equal(specd_sampling_adjusts_logits(&s), 1);
    s = params(1.0f, 0, 1.0f, 0.0f);
    s.n_logit_bias = 1;
    assert_int_equal(specd_sampling_adjusts_logits(&s), 1);

    /* Off: a no-op, whatever the history. */
    specd_token_counts c;
    assert_int_equal(specd_token_counts_init(&c, 4, NULL), 0);
    specd_token_counts_add(&c, 1, 1);
    float l[4] = {1, -2, 3, 4}, want[4] = {1, -2, 3, 4};
    s = params(1.0f, 0, 1.0f, 0.0f);
    specd_logits_adjust(&s, &c, NULL, 0, l, 4, NULL);
    assert_memory_equal(l, want, sizeof l);
    specd_token_counts_free(&c);
}

/* Each stage on hand-checked numbers, then all together in the documented
 * order: bias, repetition, frequency / presence. */
static void test_logits_adjust(void **state) {
    (void)state;
    specd_token_counts c;
    assert_int_equal(specd_token_counts_init(&c, 6, NULL), 0);
    specd_token_counts_add(&c, 0, 0); /* prompt: 0, 1 */
    specd_token_counts_add(&c, 1, 0);
    specd_token_counts_add(&c, 2, 1); /* generated: 2 twice, 0 once */
    specd_token_counts_add(&c, 2, 1);
    specd_token_counts_add(&c, 0, 1);
    const float base[6] = {2.0f, -1.0f, 4.0f, -3.0f, 1.0f, 0.0f};
    float l[6];

    /* repetition: every seen token (prompt or generated) once */
    specd_sampling s = params(1.0f, 0, 1.0f, 0.0f);
    s.repetition_penalty = 2.0f;
    memcpy(l, base, sizeof l);
    specd_logits_adjust(&s, &c, NULL, 0, l, 6, NULL);
    const float want_rep[6] = {1.0f, -2.0f, 2.0f, -3.0f, 1.0f, 0.0f};
    assert_memory_equal(l, want_rep, sizeof l);

    /* frequency / presence: generated tokens only (the prompt's 1 is not) */
    s = params(1.0f, 0, 1.0f, 0.0f);
    s.frequency_penalty = 0.5f;
    s.presence_penalty = 0.25f;
    memcpy(l, base, sizeof l);
    specd_logits_adjust(&s, &c, NULL, 0, l, 6, NULL);
    const float want_fp[6] = {2.0f - 0.75f, -1.0f, 4.0f - 1.25f, -3.0f, 1.0f, 0.0f};
    assert_memory_equal(l, want_fp, sizeof l);

    /* bias, with an id outside this vocabulary skipped */
    int32_t ids[3] = {3, 5, 6};
    float vals[3] = {1.5f, -100.0f, 7.0f};
    s = params(1.0f, 0, 1.0f, 0.0f);
    s.n_logit_bias = 3;
    s.bias_ids = ids;
    s.bias_values = vals;
    memcpy(l, base, sizeof l);
    specd_logits_adjust(&s, NULL, NULL, 0, l, 6, NULL); /* no history needed */
    const float want_b[6] = {2.0f, -1.0f, 4.0f, -1.5f, 1.0f, -100.0f};
    assert_memory_equal(l, want_b, sizeof l);

    /* all together: bias first, so a biased seen token is penalized after
     * the bias (token 0: (2 - 3) * 2 - 0.75 = -2.75; token 2: (4 + 1) / 2 -
     * 1.25 = 1.25) */
    int32_t ids2[2] = {0, 2};
    float vals2[2] = {-3.0f, 1.0f};
    s.n_logit_bias = 2;
    s.bias_ids = ids2;
    s.bias_values = vals2;
    s.repetition_penalty = 2.0f;
    s.frequency_penalty = 0.5f;
    s.presence_penalty = 0.25f;
    memcpy(l, base, sizeof l);
    specd_logits_adjust(&s, &c, NULL, 0, l, 6, NULL);
    const float want_all[6] = {-2.75f, -2.0f, 1.25f, -3.0f, 1.0f, 0.0f};
    assert_memory_equal(l, want_all, sizeof l);

    /* A path counts as generated on top of the history: path {4, 2, 4}
     * adds 4 twice (new: repetition once, count 2) and 2 once more (count
     * 3, repetition still once). */
    int32_t path[3] = {4, 2, 4};
    void *scratch = malloc(specd_logits_adjust_scratch_size(3));
    s.n_logit_bias = 0;
    memcpy(l, base, sizeof l);
    specd_logits_adjust(&s, &c, path, 3, l, 6, scratch);
    const float want_path[6] = {1.0f - 0.75f, -2.0f, 2.0f - 1.75f, -3.0f, 0.5f - 1.25f, 0.0f};
    assert_memory_equal(l, want_path, sizeof l);
    /* the path array itself is left alone */
    assert_int_equal(path[0], 4);
    assert_int_equal(path[1], 2);
    assert_int_equal(path[2], 4);
    free(scratch);
    specd_token_counts_free(&c);
}

/* The property speculation rests on: adjusting with (history, path) gives
 * bit-identical logits to adjusting with the path's tokens counted into the
 * history, for random histories, paths, parameters and a real-size vocab. */
static void test_adjust_path_equals_counted(void **state) {
    (void)state;
    const int V = 4096;
    float *raw = malloc(sizeof(float) * V), *a = malloc(sizeof(float) * V),
          *b = malloc(sizeof(float) * V);
    int32_t path[40], bias_ids[64];
    float bias_vals[64];
    void *scratch = malloc(specd_logits_adjust_scratch_size(40));
    specd_token_counts hist, full;
    assert_int_equal(specd_token_counts_init(&hist, V, NULL), 0);
    assert_int_equal(specd_token_counts_init(&full, V, NULL), 0);
    uint64_t st = 99;
    for (int trial = 0; trial < 200; trial++) {
        gaussian_logits(raw, V, 1000 + (uint64_t)trial, 3.0f);
        specd_token_counts_reset(&hist);
        specd_token_counts_reset(&full);
        /* Histories and paths over a narrow id range so tokens repeat and
         * overlap between history and path. */
        int range = 16 + trial % 200;
        int n_prompt = (int)(specd_rng_uniform(st, (uint64_t)trial, 0) * 50);
        int n_gen = (int)(specd_rng_uniform(st, (uint64_t)trial, 1) * 50);
        int n_path = (int)(specd_rng_uniform(st, (uint64_t)trial, 2) * 40);
        for (int i = 0; i < n_prompt + n_gen; i++) {
            int32_t t = (int32_t)(specd_rng_uniform(st, (uint64_t)trial, 10 + (uint64_t)i) * range);
            specd_token_counts_add(&hist, t, i >= n_prompt);
            specd_token_counts_add(&full, t, i >= n_prompt);
        }
        for (int i = 0; i < n_path; i++) {
            path[i] = (int32_t)(specd_rng_uniform(st, (uint64_t)trial, 200 + (uint64_t)i) * range);
            specd_token_counts_add(&full, path[i], 1);
        }
        specd_sampling s = params(1.0f, 0, 1.0f, 0.0f);
        s.repetition_penalty = trial % 3 == 0 ? 0.0f : 0.5f + (float)(trial % 7) * 0.3f;
        s.frequency_penalty = (float)(trial % 9) * 0.37f - 1.5f;
        s.presence_penalty = (float)(trial % 5) * 0.6f - 1.2f;
        s.n_logit_bias = trial % 4 == 0 ? 0 : 1 + trial % 64;
        for (int i = 0; i < s.n_logit_bias; i++) {
            bias_ids[i] = i; /* distinct, and overlapping the history's ids */
            bias_vals[i] = (float)((i * 13 + trial) % 21) - 10.0f;
        }
        s.bias_ids = bias_ids;
        s.bias_values = bias_vals;
        memcpy(a, raw, sizeof(float) * V);
        memcpy(b, raw, sizeof(float) * V);
        specd_logits_adjust(&s, &hist, path, n_path, a, V, scratch);
        specd_logits_adjust(&s, &full, NULL, 0, b, V, NULL);
        if (memcmp(a, b, sizeof(float) * V) != 0) {
            for (int i = 0; i < V; i++)
                if (memcmp(&a[i], &b[i], sizeof(float)))
                    fail_msg("trial %d: token %d: path gives %.9g, counted gives %.9g", trial, i,
                             (double)a[i], (double)b[i]);
        }
    }
    specd_token_counts_free(&hist);
    specd_token_counts_free(&full);
    free(scratch);
    free(raw);
    free(a);
    free(b);
}

/* --- log-probabilities --------------------------------------------------------- */

static void test_logprobs(void **state) {
    (void)state;
    /* log-softmax of {ln 1, ln 2, ln 3, ln 2} = ln {1/8, 2/8, 3/8, 2/8} */
    float l[4] = {0.0f, (float)log(2.0), (float)log(3.0), (float)log(2.0)};
    float lp, top_lps[3];
    int32_t top_ids[3];
    specd_logprobs(l, 4, 1, 3, &lp, top_ids, top_lps);
    assert_near(lp, log(0.25), 1e-6);
    assert_int_equal(top_ids[0], 2);
    assert_int_equal(top_ids[1], 1); /* tie with 3: lower id first */
    assert_int_equal(top_ids[2], 3);
    assert_near(top_lps[0], log(0.375), 1e-6);
    assert_near(top_lps[1], log(0.25), 1e-6);
    assert_near(top_lps[2], log(0.25), 1e-6);
    /* the log-probability of the token equals its entry in the top list */
    specd_logprobs(l, 4, 2, 0, &lp, NULL, NULL);
    assert_true(lp == top_lps[0]);

    /* more alternatives than usable tokens: the rest is empty */
    float ln[3] = {1.0f, NAN, 0.0f};
    int32_t ids5[5];
    float lps5[5];
    specd_logprobs(ln, 3, 1, 5, &lp, ids5, lps5);
    assert_true(lp == -INFINITY); /* NaN logit */
    assert_int_equal(ids5[0], 0);
    assert_int_equal(ids5[1], 2);
    assert_int_equal(ids5[2], -1);
    assert_true(lps5[4] == -INFINITY);
    assert_near(lps5[0], -log1p(exp(-1.0)), 1e-6);

    /* +inf logits share the mass; all -inf: nothing is possible */
    float li[3] = {INFINITY, 1.0f, INFINITY};
    specd_logprobs(li, 3, 0, 0, &lp, NULL, NULL);
    assert_near(lp, -log(2.0), 1e-7);
    specd_logprobs(li, 3, 1, 0, &lp, NULL, NULL);
    assert_true(lp == -INFINITY);
    float lm[2] = {-INFINITY, -INFINITY};
    specd_logprobs(lm, 2, 0, 0, &lp, NULL, NULL);
    assert_true(lp == -INFINITY);
    /* a token outside the vocabulary */
    specd_logprobs(l, 4, 7, 0, &lp, NULL, NULL);
    assert_true(lp == -INFINITY);

    /* large vocabulary: against a straightforward double computation, the
     * top list against a full sort, and stable under a huge shift */
    float *g = malloc(sizeof(float) * VOCAB);
    gaussian_logits(g, VOCAB, 77, 3.0f);
    double m = -INFINITY, z = 0;
    for (int i = 0; i < VOCAB; i++) m = g[i] > m ? g[i] : m;
    for (int i = 0; i < VOCAB; i++) z += exp(g[i] - m);
    int32_t ids[SPECD_MAX_TOP_LOGPROBS];
    float lps[SPECD_MAX_TOP_LOGPROBS];
    specd_logprobs(g, VOCAB, 123, SPECD_MAX_TOP_LOGPROBS, &lp, ids, lps);
    assert_near(lp, g[123] - m - log(z), 1e-5);
    int best = specd_argmax(g, VOCAB);
    assert_int_equal(ids[0], best);
    for (int j = 1; j < SPECD_MAX_TOP_LOGPROBS; j++) {
        assert_true(g[ids[j]] < g[ids[j - 1]] ||
                    (g[ids[j]] == g[ids[j - 1]] && ids[j] > ids[j - 1]));
        assert_true(lps[j] <= lps[j - 1]);
        /* nothing outside the list beats its last entry */
    }
    for (int i = 0; i < VOCAB; i++) {
        int in = 0;
        for (int j = 0; j < SPECD_MAX_TOP_LOGPROBS; j++) in |= ids[j] == i;
        if (!in) assert_true(g[i] <= g[ids[SPECD_MAX_TOP_LOGPROBS - 1]]);
    }
    for (int i = 0; i < VOCAB; i++) g[i] += 1000.0f;
    float lp2;
    specd_logprobs(g, VOCAB, 123, 0, &lp2, NULL, NULL);
    assert_near(lp2, lp, 1e-3); /* the shift itself rounds the logits by ~6e-5 */
    free(g);
}

/* --- reference: Hugging Face transformers -------------------------------------- */

static void json_floats(const cJSON *arr, float *out, int n, const char *what) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != n)
        fail_msg("golden: '%s' is not an array of %d numbers", what, n);
    for (int i = 0; i < n; i++) out[i] = (float)cJSON_GetArrayItem(arr, i)->valuedouble;
}

static double json_num(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v)) fail_msg("golden: '%s' missing", key);
    return v->valuedouble;
}

/* Every case of tests/golden/data/sampling/reference.json: the adjusted
 * logits (bias: SequenceBiasLogitsProcessor; repetition:
 * RepetitionPenaltyLogitsProcessor; frequency / presence: the OpenAI
 * formula), the final distribution (transformers' Temperature, TopK, TopP,
 * MinP warpers + softmax) and the raw log-probabilities. */
static void test_hf_golden(void **state) {
    (void)state;
    size_t len;
    char *text = test_read_file(test_path("tests/golden/data/sampling/reference.json"), &len);
    if (!text) fail_msg("cannot read tests/golden/data/sampling/reference.json");
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) fail_msg("golden: reference.json does not parse");
    const int V = (int)json_num(root, "vocab"), NT = (int)json_num(root, "n_top");
    assert_true(V > 0 && V <= 64 && NT <= SPECD_MAX_TOP_LOGPROBS);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    float logits[64], want_adj[64], want_p[64], want_lp[64], adj[64], p[64];
    int32_t bias_ids[64], top_ids[SPECD_MAX_TOP_LOGPROBS];
    float bias_vals[64], top_lps[SPECD_MAX_TOP_LOGPROBS];
    void *scratch = malloc(specd_sampling_scratch_size(V));
    int n_cases = 0, exact_adj = 0;
    double worst_adj = 0, worst_p = 0, worst_lp = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(c, "params");
        specd_sampling s = params((float)json_num(pr, "temperature"), (int)json_num(pr, "top_k"),
                                  (float)json_num(pr, "top_p"), (float)json_num(pr, "min_p"));
        s.repetition_penalty = (float)json_num(pr, "repetition_penalty");
        s.frequency_penalty = (float)json_num(pr, "frequency_penalty");
        s.presence_penalty = (float)json_num(pr, "presence_penalty");
        const cJSON *bl = cJSON_GetObjectItemCaseSensitive(pr, "logit_bias"), *be;
        s.n_logit_bias = 0;
        cJSON_ArrayForEach(be, bl) {
            bias_ids[s.n_logit_bias] = (int32_t)json_num(be, "token_id");
            bias_vals[s.n_logit_bias++] = (float)json_num(be, "bias");
        }
        s.bias_ids = bias_ids;
        s.bias_values = bias_vals;
        specd_error err = {{0}};
        if (specd_sampling_validate(&s, V, &err)) fail_msg("%s: %s", name, err.msg);

        specd_token_counts counts;
        assert_int_equal(specd_token_counts_init(&counts, V, NULL), 0);
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(c, "prompt"))
            specd_token_counts_add(&counts, (int32_t)t->valueint, 0);
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(c, "generated"))
            specd_token_counts_add(&counts, (int32_t)t->valueint, 1);
        json_floats(cJSON_GetObjectItemCaseSensitive(c, "logits"), logits, V, "logits");
        json_floats(cJSON_GetObjectItemCaseSensitive(c, "adjusted"), want_adj, V, "adjusted");
        json_floats(cJSON_GetObjectItemCaseSensitive(c, "probs"), want_p, V, "probs");
        json_floats(cJSON_GetObjectItemCaseSensitive(c, "logprobs"), want_lp, V, "logprobs");

        /* Adjusted logits: the same float operations as the reference (one
         * add, one multiply or divide, one multiply-add then subtract), so
         * they agree to rounding; 1e-6 relative allows a different but
         * still correctly rounded evaluation order. */
        memcpy(adj, logits, sizeof(float) * V);
        specd_logits_adjust(&s, &counts, NULL, 0, adj, V, NULL);
        int exact = 1;
        for (int i = 0; i < V; i++) {
            double d = fabs((double)adj[i] - want_adj[i]);
            exact &= adj[i] == want_adj[i];
            if (d > worst_adj) worst_adj = d;
            if (d > 1e-6 * fmax(1.0, fabs(want_adj[i])))
                fail_msg("%s: adjusted logit %d is %.9g, transformers %.9g", name, i,
                         (double)adj[i], (double)want_adj[i]);
        }
        exact_adj += exact;

        /* Final distribution: the same kept set, values to float rounding
         * (torch divides by the temperature and sums in float, specd
         * multiplies and sums in double). A reference value below 1e-30 is
         * a token biased to -100 (a float denormal) that either side may
         * round to 0; filtered tokens are exactly 0 on both. */
        specd_sampling_probs(&s, adj, V, p, scratch);
        for (int i = 0; i < V; i++) {
            double d = fabs((double)p[i] - want_p[i]);
            if (d > worst_p) worst_p = d;
            int kept_ok = want_p[i] == 0.0f ? p[i] == 0.0f
                          : want_p[i] > 1e-30f  ? p[i] > 0.0f
                                                : 1;
            if (!kept_ok || d > 1e-7 + 1e-5 * want_p[i])
                fail_msg("%s: probability of %d is %.9g, transformers %.9g", name, i,
                         (double)p[i], (double)want_p[i]);
        }

        /* Log-probabilities of the raw logits, each token and the top list. */
        for (int i = 0; i < V; i++) {
            float lp;
            specd_logprobs(logits, V, i, i == 0 ? NT : 0, &lp, top_ids, top_lps);
            double d = fabs((double)lp - want_lp[i]);
            if (d > worst_lp) worst_lp = d;
            if (d > 1e-6 * fmax(1.0, fabs(want_lp[i])))
                fail_msg("%s: logprob of %d is %.9g, reference %.9g", name, i, (double)lp,
                         (double)want_lp[i]);
            if (i == 0) {
                const cJSON *want_top = cJSON_GetObjectItemCaseSensitive(c, "top_ids");
                for (int j = 0; j < NT; j++)
                    assert_int_equal(top_ids[j], cJSON_GetArrayItem(want_top, j)->valueint);
            }
        }
        specd_token_counts_free(&counts);
        n_cases++;
    }
    print_message("transformers reference: %d cases; adjusted logits bit-exact in %d, max |diff| "
                  "%.3g; probs max |diff| %.3g; logprobs max |diff| %.3g\n",
                  n_cases, exact_adj, worst_adj, worst_p, worst_lp);
    assert_true(n_cases >= 30);
    free(scratch);
    cJSON_Delete(root);
}

/* --- speculative rules ------------------------------------------------------- */

static void test_accept_draft(void **state) {
    (void)state;
    assert_int_equal(specd_accept_draft(0.5f, 0.0f, 0.0), 0);  /* q = 0: reject */
    assert_int_equal(specd_accept_draft(0.5f, -0.1f, 0.0), 0);
    assert_int_equal(specd_accept_draft(0.5f, NAN, 0.0), 0);
    assert_int_equal(specd_accept_draft(0.0f, 0.3f, 0.0), 0);  /* p = 0: reject */
    assert_int_equal(specd_accept_draft(NAN, 0.3f, 0.0), 0);
    assert_int_equal(specd_accept_draft(0.4f, 0.4f, 0x1.fffffffffffffp-1), 1);
    assert_int_equal(specd_accept_draft(0.9f, 0.1f, 0.999), 1);
    assert_int_equal(specd_accept_draft(1.0f, 1.0f, 0.0), 1);
    assert_int_equal(specd_accept_draft(0.3f, 0.6f, 0.49), 1); /* ratio 0.5 */
    assert_int_equal(specd_accept_draft(0.3f, 0.6f, 0.51), 0);
}

static void test_residual(void **state) {
    (void)state;
    float out[4], scratch[4];
    /* max(0, p - q) = (0.3, 0, 0) -> all mass on token 0. */
    float p[3] = {0.5f, 0.3f, 0.2f}, q[3] = {0.2f, 0.5f, 0.3f};
    assert_int_equal(specd_residual_probs(p, q, 3, out), 0);
    assert_true(out[0] == 1.0f && out[1] == 0.0f && out[2] == 0.0f);
    assert_int_equal(specd_residual_sample(p, q, 3, 0.99, scratch), 0);

    /* q has zeros where p does not: residual is p there. */
    float p2[4] = {0.25f, 0.25f, 0.5f, 0.0f}, q2[4] = {0.5f, 0.25f, 0.0f, 0.25f};
    assert_int_equal(specd_residual_probs(p2, q2, 4, out), 0);
    assert_true(out[2] == 1.0f && out[0] == 0.0f && out[1] == 0.0f && out[3] == 0.0f);

    /* Two residual tokens: (0.2, 0.1) -> (2/3, 1/3). */
    float p3[3] = {0.5f, 0.4f, 0.1f}, q3[3] = {0.3f, 0.3f, 0.4f};
    assert_int_equal(specd_residual_probs(p3, q3, 3, out), 0);
    assert_near(out[0], 2.0 / 3.0, 1e-6);
    assert_near(out[1], 1.0 / 3.0, 1e-6);
    assert_int_equal(specd_residual_sample(p3, q3, 3, 0.6, scratch), 0);
    assert_int_equal(specd_residual_sample(p3, q3, 3, 0.7, scratch), 1);

    /* p == q: residual is empty, fall back to p. */
    assert_int_equal(specd_residual_probs(p, p, 3, out), 1);
    for (int i = 0; i < 3; i++) assert_near(out[i], p[i], 1e-7);
    assert_int_equal(specd_residual_sample(p, p, 3, 0.6, scratch), 1);
    /* Greedy target (p one-hot) vs a one-hot draft on another token. */
    float g[3] = {0, 1, 0}, h[3] = {1, 0, 0};
    assert_int_equal(specd_residual_sample(g, h, 3, 0.0, scratch), 1);
    assert_int_equal(specd_residual_sample(g, h, 3, 0.999, scratch), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_kat),
        cmocka_unit_test(test_rng_addressing),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_validate_penalties),
        cmocka_unit_test(test_token_counts),
        cmocka_unit_test(test_adjusts_logits),
        cmocka_unit_test(test_logits_adjust),
        cmocka_unit_test(test_adjust_path_equals_counted),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_hf_golden),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_greedy_and_softmax),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_order_top_k_then_top_p),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_degenerate_logits),
        cmocka_unit_test(test_large_vocab_matches_reference),
        cmocka_unit_test(test_probs_timing),
        cmocka_unit_test(test_rng_run_matches_blocks),
        cmocka_unit_test(test_exp_neg_accuracy),
        cmocka_unit_test(test_simd_paths_bitwise),
        cmocka_unit_test(test_log_sum_exp),
        cmocka_unit_test(test_sample_from_probs),
        cmocka_unit_test(test_sample_determinism),
        cmocka_unit_test(test_race_matches_reference),
        cmocka_unit_test(test_seed_exact_addressing),
        cmocka_unit_test(test_accept_draft),
        cmocka_unit_test(test_residual),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
