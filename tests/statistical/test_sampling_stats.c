/* test_sampling_stats.c - the distributions are right, checked by counting.
 *
 *  (a) specd_sample draws each token as often as specd_sampling_probs says,
 *      for several temperature / top-k / top-p / min-p combinations;
 *  (b) the speculative rule is lossless: draw x ~ q, keep it if
 *      specd_accept_draft, else take specd_residual_sample; the output is
 *      distributed as p for very different (p, q), including q = 0 where
 *      p > 0, p = 0 where q > 0, one-hot drafts and one-hot (greedy) targets;
 *  (c) specd_rng_uniform is uniform along both address axes, and adjacent
 *      addresses are uncorrelated.
 *
 * Every comparison is a Pearson chi-square test whose p-value comes from the
 * regularized upper incomplete gamma function, computed here and itself
 * checked against closed forms. A test passes when p > ALPHA. Seeds are
 * fixed, so the outcome is reproducible, and each family has a negative
 * control (a wrong distribution, a classic implementation bug, a biased or
 * correlated generator) that must be rejected at the same ALPHA, so the
 * tests are known to be able to fail. Runs in about a second. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/util/rng.h"
#include "common/spec/sampling.h"
#include "tests/harness/stats.h"

#define ALPHA 1e-4     /* significance: reject when p-value < ALPHA */
#define DRAWS 200000   /* per token-distribution test */
#define MAXN 16        /* largest toy vocabulary */

/* chi-square machinery: tests/harness/stats.h */

static void test_chi2_machinery(void **state) {
    (void)state;
    /* Closed forms: dof 2 -> exp(-x/2); dof 1 -> erfc(sqrt(x/2));
     * dof 4 -> exp(-x/2)(1 + x/2); even dof 2k -> exp(-x/2) sum_j<k (x/2)^j/j!. */
    const double xs[] = {0.01, 0.5, 1.0, 3.841458820694124, 10.0, 25.0, 60.0, 150.0};
    for (size_t t = 0; t < sizeof xs / sizeof xs[0]; t++) {
        double x = xs[t];
        assert_true(fabs(chi2_pvalue(x, 2) - exp(-x / 2)) <= 1e-12 * (1 + exp(-x / 2)));
        assert_true(fabs(chi2_pvalue(x, 1) - erfc(sqrt(x / 2))) <= 1e-10 * erfc(sqrt(x / 2)) + 1e-300);
        assert_true(fabs(chi2_pvalue(x, 4) - exp(-x / 2) * (1 + x / 2)) <= 1e-10 * exp(-x / 2) * (1 + x / 2) + 1e-300);
        for (int k = 5; k <= 60; k += 11) {
            double term = 1.0, sum = 0.0;
            for (int j = 0; j < k; j++) {
                sum += term;
                term *= (x / 2) / (j + 1);
            }
            double want = exp(-x / 2) * sum;
            assert_true(fabs(chi2_pvalue(x, 2 * k) - want) <= 1e-9 * want + 1e-300);
        }
    }
    /* Textbook critical values: 5% at dof 1 and 10, 0.1% at dof 99. */
    assert_true(fabs(chi2_pvalue(3.841459, 1) - 0.05) < 1e-6);
    assert_true(fabs(chi2_pvalue(18.307038, 10) - 0.05) < 1e-6);
    assert_true(fabs(chi2_pvalue(148.2304, 99) - 0.001) < 2e-5);

    /* And the whole test on a known answer: perfect fit vs gross misfit. */
    long c[3] = {500, 300, 200};
    double p[3] = {0.5, 0.3, 0.2}, wrong[3] = {0.4, 0.4, 0.2};
    assert_true(chi2_fit(c, p, 3, 1000) > 0.99);
    assert_true(chi2_fit(c, wrong, 3, 1000) < ALPHA);
    long z[3] = {999, 0, 1};
    double p0[3] = {0.5, 0.5, 0.0};
    assert_true(chi2_fit(z, p0, 3, 1000) == 0.0); /* count on a zero-probability token */
}

/* --- (a) specd_sample follows specd_sampling_probs ------------------------- */

/* 14 logits with a tie (ids 3 and 4) so top-k's tie rule is exercised too. */
static const float LOGITS[14] = {2.0f, 1.5f, 1.4f,  1.0f,  1.0f,  0.7f,  0.5f,
                                 0.3f, 0.0f, -0.2f, -0.5f, -0.8f, -1.0f, -1.5f};

static void sample_counts(const specd_sampling *s, const float *logits, int n, int by_counter,
                          long *counts) {
    void *scratch = malloc(specd_sampling_scratch_size(n));
    memset(counts, 0, sizeof(long) * n);
    for (long t = 0; t < DRAWS; t++) {
        /* Draws indexed either by stream (output position) or by counter. */
        int tok = by_counter ? specd_sample(s, logits, n, 3, (uint64_t)t, scratch)
                             : specd_sample(s, logits, n, (uint64_t)t, 0, scratch);
        counts[tok]++;
    }
    free(scratch);
}

static void test_sample_matches_probs(void **state) {
    (void)state;
    static const float configs[][4] = {
        /* temperature, top_k, top_p, min_p */
        {1.0f, 0, 1.0f, 0.0f}, {0.7f, 5, 1.0f, 0.0f},   {1.3f, 0, 0.8f, 0.0f},
        {1.0f, 10, 0.9f, 0.05f}, {2.0f, 0, 1.0f, 0.2f}, {0.5f, 4, 1.0f, 0.0f},
    };
    const int n = 14;
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        specd_sampling s;
        specd_sampling_init(&s);
        s.temperature = configs[c][0];
        s.top_k = (int)configs[c][1];
        s.top_p = configs[c][2];
        s.min_p = configs[c][3];
        s.seed = 1000 + c;
        float p[MAXN];
        void *scratch = malloc(specd_sampling_scratch_size(n));
        specd_sampling_probs(&s, LOGITS, n, p, scratch);
        free(scratch);
        double pd[MAXN];
        for (int i = 0; i < n; i++) pd[i] = p[i];
        /* both methods: the race (seed-exact) and the inverse CDF */
        for (int axis = 0; axis < 4; axis++) {
            s.method = axis / 2 ? SPECD_SAMPLING_REJECTION : SPECD_SAMPLING_SEED_EXACT;
            long counts[MAXN];
            sample_counts(&s, LOGITS, n, axis % 2, counts);
            double pv = chi2_fit(counts, pd, n, DRAWS);
            print_message("(a) %s T=%.1f top_k=%d top_p=%.2f min_p=%.2f by %s: p-value %.4f\n",
                          axis / 2 ? "rejection " : "seed-exact", (double)s.temperature, s.top_k,
                          (double)s.top_p, (double)s.min_p, axis % 2 ? "counter" : "stream ", pv);
            assert_true(pv > ALPHA);
        }
    }

    /* Negative control: the same draws judged against the unfiltered softmax
     * (as if top-k had been forgotten) must fail. */
    specd_sampling s;
    specd_sampling_init(&s);
    s.top_k = 5;
    s.seed = 77;
    specd_sampling plain;
    specd_sampling_init(&plain);
    float pf[MAXN];
    void *scratch = malloc(specd_sampling_scratch_size(n));
    specd_sampling_probs(&plain, LOGITS, n, pf, scratch);
    free(scratch);
    double pd[MAXN];
    for (int i = 0; i < n; i++) pd[i] = pf[i];
    long counts[MAXN];
    sample_counts(&plain, LOGITS, n, 0, counts);
    assert_true(chi2_fit(counts, pd, n, DRAWS) > ALPHA); /* sanity: plain vs plain */
    sample_counts(&s, LOGITS, n, 0, counts);
    assert_true(chi2_fit(counts, pd, n, DRAWS) < ALPHA);
    /* A subtler one: T = 1.05 judged against T = 1. */
    plain.temperature = 1.05f;
    sample_counts(&plain, LOGITS, n, 0, counts);
    double pv = chi2_fit(counts, pd, n, DRAWS);
    print_message("(a) control T=1.05 vs T=1: p-value %.3g (must be < %g)\n", pv, ALPHA);
    assert_true(pv < ALPHA);
}

/* --- (b) the speculative rule is lossless ----------------------------------- */

typedef enum { RULE_CORRECT, RULE_DRAFT_ONLY, RULE_RESAMPLE_P, RULE_SHARED_UNIFORM } rule;

/* One verify step per trial with independent uniforms at distinct addresses
 * (trial, 0..2); returns the acceptance count. The wrong rules are the
 * negative controls:
 *   DRAFT_ONLY       emit x ~ q (no verification at all);
 *   RESAMPLE_P       on rejection draw from p instead of the residual;
 *   SHARED_UNIFORM   test x with the same uniform that drew it (one address
 *                    used for two purposes, which sampling.h forbids). */
static long speculate(const float *p, const float *q, int n, rule r, uint64_t seed,
                      long *counts) {
    float scratch[MAXN];
    long accepted = 0;
    memset(counts, 0, sizeof(long) * n);
    for (long t = 0; t < DRAWS; t++) {
        double u_draw = specd_rng_uniform(seed, (uint64_t)t, 0);
        double u_test = r == RULE_SHARED_UNIFORM ? u_draw : specd_rng_uniform(seed, (uint64_t)t, 1);
        double u_resid = specd_rng_uniform(seed, (uint64_t)t, 2);
        int x = specd_sample_from_probs(q, n, u_draw);
        int out;
        if (r == RULE_DRAFT_ONLY) {
            out = x;
        } else if (specd_accept_draft(p[x], q[x], u_test)) {
            out = x;
            accepted++;
        } else if (r == RULE_RESAMPLE_P) {
            out = specd_sample_from_probs(p, n, u_resid);
        } else {
            out = specd_residual_sample(p, q, n, u_resid, scratch);
        }
        counts[out]++;
    }
    return accepted;
}

static void normalize(const double *w, int n, float *out) {
    double t = 0.0;
    for (int i = 0; i < n; i++) t += w[i];
    for (int i = 0; i < n; i++) out[i] = (float)(w[i] / t);
}

typedef struct pq_case {
    const char *name;
    float p[MAXN], q[MAXN];
} pq_case;

static void test_speculative_lossless(void **state) {
    (void)state;
    enum { N = 12 };
    pq_case cases[7];
    memset(cases, 0, sizeof cases);

    /* 1. Two unrelated distributions. */
    cases[0].name = "generic p vs q";
    normalize((double[N]){9, 1, 4, 6, 2, 8, 3, 5, 7, 2, 6, 4}, N, cases[0].p);
    normalize((double[N]){2, 8, 5, 1, 9, 3, 6, 2, 4, 7, 3, 5}, N, cases[0].q);
    /* 2. The draft cannot propose tokens 8..11 (q = 0 where p > 0): they can
     *    only come from the residual, which must supply all their mass. */
    cases[1].name = "q zero where p > 0";
    normalize((double[N]){5, 4, 3, 6, 2, 5, 4, 3, 6, 5, 4, 3}, N, cases[1].p);
    normalize((double[N]){9, 2, 6, 4, 7, 3, 8, 5, 0, 0, 0, 0}, N, cases[1].q);
    /* 3. The target rules out tokens 0..2 (p = 0 where q > 0, e.g. its
     *    top-k is tighter than the draft's): they must never be emitted. */
    cases[2].name = "p zero where q > 0";
    normalize((double[N]){0, 0, 0, 6, 2, 5, 4, 3, 6, 5, 4, 3}, N, cases[2].p);
    normalize((double[N]){9, 7, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1}, N, cases[2].q);
    /* 4. A deterministic drafter (greedy draft or n-gram): q one-hot. */
    cases[3].name = "one-hot draft";
    normalize((double[N]){3, 9, 4, 6, 2, 5, 4, 3, 6, 5, 4, 3}, N, cases[3].p);
    normalize((double[N]){0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}, N, cases[3].q);
    /* 5. A greedy target (p one-hot) against a sampling draft. */
    cases[4].name = "one-hot target";
    normalize((double[N]){0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, N, cases[4].p);
    normalize((double[N]){2, 8, 5, 1, 9, 3, 6, 2, 4, 7, 3, 5}, N, cases[4].q);
    /* 6. Draft equals target: every draft is accepted. */
    cases[5].name = "p == q";
    normalize((double[N]){9, 1, 4, 6, 2, 8, 3, 5, 7, 2, 6, 4}, N, cases[5].p);
    memcpy(cases[5].q, cases[5].p, sizeof cases[5].p);
    /* 7. Real use: both from specd_sampling_probs, different logits and
     *    settings (draft T=1 top-k 8; target T=0.8 top-p 0.9 min-p 0.05). */
    cases[6].name = "sampling_probs draft vs target";
    {
        float lt[N] = {2.1f, 1.9f, 0.3f, 1.2f, -0.4f, 0.8f, 1.5f, -1.0f, 0.1f, 0.6f, -0.2f, 1.0f};
        float ld[N] = {1.8f, 2.2f, 0.9f, 0.4f, 0.2f, 1.1f, 1.2f, -0.5f, 0.7f, 0.0f, 0.5f, 1.3f};
        void *scratch = malloc(specd_sampling_scratch_size(N));
        specd_sampling st, sd;
        specd_sampling_init(&st);
        specd_sampling_init(&sd);
        st.temperature = 0.8f;
        st.top_p = 0.9f;
        st.min_p = 0.05f;
        sd.top_k = 8;
        specd_sampling_probs(&st, lt, N, cases[6].p, scratch);
        specd_sampling_probs(&sd, ld, N, cases[6].q, scratch);
        free(scratch);
    }

    for (int c = 0; c < 7; c++) {
        const pq_case *k = &cases[c];
        double pd[N], alpha = 0.0; /* alpha: acceptance probability sum min(p, q) */
        for (int i = 0; i < N; i++) {
            pd[i] = k->p[i];
            alpha += fmin(k->p[i], k->q[i]);
        }
        long counts[N];
        long acc = speculate(k->p, k->q, N, RULE_CORRECT, 500 + c, counts);
        double pv = chi2_fit(counts, pd, N, DRAWS);
        /* Acceptances are Binomial(DRAWS, alpha); |z| < 4.5 is p ~ 7e-6. */
        double z = alpha > 0 && alpha < 1
                       ? (acc - DRAWS * alpha) / sqrt(DRAWS * alpha * (1 - alpha))
                       : (acc == (long)llround(DRAWS * alpha) ? 0.0 : INFINITY);
        print_message("(b) %-30s p-value %.4f, acceptance %.4f (expected %.4f, z %.2f)\n",
                      k->name, pv, (double)acc / DRAWS, alpha, z);
        assert_true(pv > ALPHA);
        assert_true(fabs(z) < 4.5);
    }

    /* Negative controls: each broken rule must be caught. */
    static const struct { rule r; int c; const char *what; } controls[] = {
        {RULE_DRAFT_ONLY, 0, "draft only (x ~ q), generic"},
        {RULE_DRAFT_ONLY, 6, "draft only (x ~ q), sampling_probs"},
        {RULE_RESAMPLE_P, 0, "resample from p on reject"},
        {RULE_RESAMPLE_P, 1, "resample from p, q zeros"},
        {RULE_SHARED_UNIFORM, 0, "one uniform for draw and test"},
    };
    for (size_t i = 0; i < sizeof controls / sizeof controls[0]; i++) {
        const pq_case *k = &cases[controls[i].c];
        double pd[N];
        for (int j = 0; j < N; j++) pd[j] = k->p[j];
        long counts[N];
        speculate(k->p, k->q, N, controls[i].r, 900 + i, counts);
        double pv = chi2_fit(counts, pd, N, DRAWS);
        print_message("(b) control %-34s p-value %.3g (must be < %g)\n", controls[i].what, pv,
                      ALPHA);
        assert_true(pv < ALPHA);
    }
}

/* --- (c) the generator ---------------------------------------------------- */

#define RNG_DRAWS 1000000
#define BINS 100

static double uniform_pvalue(const double *u, long n) {
    long counts[BINS] = {0};
    double probs[BINS];
    for (int b = 0; b < BINS; b++) probs[b] = 1.0;
    for (long i = 0; i < n; i++) counts[(int)(u[i] * BINS)]++;
    return chi2_fit(counts, probs, BINS, n);
}

/* Pearson correlation of (u[i], u[i+1]) scaled to a z-score: under
 * independence r * sqrt(n) is approximately standard normal. */
static double lag1_z(const double *u, long n) {
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
    long m = n - 1;
    for (long i = 0; i < m; i++) {
        double x = u[i], y = u[i + 1];
        sx += x;
        sy += y;
        sxx += x * x;
        syy += y * y;
        sxy += x * y;
    }
    double cov = sxy / m - (sx / m) * (sy / m);
    double r = cov / sqrt((sxx / m - (sx / m) * (sx / m)) * (syy / m - (sy / m) * (sy / m)));
    return r * sqrt((double)m);
}

/* Joint uniformity of disjoint pairs (u[2i], u[2i+1]) on a 10x10 grid: catches
 * dependence that a correlation coefficient misses. */
static double pairs_pvalue(const double *u, long n) {
    long counts[100] = {0};
    double probs[100];
    for (int b = 0; b < 100; b++) probs[b] = 1.0;
    for (long i = 0; i + 1 < n; i += 2) counts[(int)(u[i] * 10) * 10 + (int)(u[i + 1] * 10)]++;
    return chi2_fit(counts, probs, 100, n / 2);
}

static void test_rng_uniformity(void **state) {
    (void)state;
    double *u = malloc(sizeof(double) * RNG_DRAWS);
    for (int axis = 0; axis < 3; axis++) {
        const char *what = axis == 0 ? "counter axis" : axis == 1 ? "stream axis " : "seed axis   ";
        for (long i = 0; i < RNG_DRAWS; i++) {
            if (axis == 0) u[i] = specd_rng_uniform(2024, 17, (uint64_t)i);
            else if (axis == 1) u[i] = specd_rng_uniform(2024, (uint64_t)i, 1);
            else u[i] = specd_rng_uniform((uint64_t)i, 5, 2);
        }
        double pv = uniform_pvalue(u, RNG_DRAWS), z = lag1_z(u, RNG_DRAWS);
        double pp = pairs_pvalue(u, RNG_DRAWS);
        print_message("(c) %s: 100-bin p-value %.4f, lag-1 z %.2f, pairs p-value %.4f\n", what,
                      pv, z, pp);
        assert_true(pv > ALPHA);
        assert_true(fabs(z) < 4.5);
        assert_true(pp > ALPHA);
    }

    /* Negative controls. A 2% power bias ... */
    for (long i = 0; i < RNG_DRAWS; i++) u[i] = pow(specd_rng_uniform(7, 0, (uint64_t)i), 1.02);
    double pv = uniform_pvalue(u, RNG_DRAWS);
    print_message("(c) control u^1.02: p-value %.3g (must be < %g)\n", pv, ALPHA);
    assert_true(pv < ALPHA);
    /* ... and a generator that repeats its previous value 1% of the time
     * (uniform marginals, so only the dependence tests can see it). */
    u[0] = specd_rng_uniform(8, 0, 0);
    for (long i = 1; i < RNG_DRAWS; i++)
        u[i] = specd_rng_uniform(8, 1, (uint64_t)i) < 0.01 ? u[i - 1] : specd_rng_uniform(8, 0, (uint64_t)i);
    double z = lag1_z(u, RNG_DRAWS);
    print_message("(c) control 1%% repeats: lag-1 z %.2f (must be > 4.5)\n", z);
    assert_true(uniform_pvalue(u, RNG_DRAWS) > ALPHA);
    assert_true(fabs(z) > 4.5);
    free(u);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chi2_machinery),
        cmocka_unit_test(test_sample_matches_probs),
        cmocka_unit_test(test_speculative_lossless),
        cmocka_unit_test(test_rng_uniformity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
