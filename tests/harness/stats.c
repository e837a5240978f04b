/* stats.c - see stats.h. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/harness/stats.h"

/* --- chi-square machinery -------------------------------------------------- */

/* Regularized upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a):
 * the power series for P = 1 - Q when x < a + 1, else the continued fraction
 * for Q (modified Lentz), as in Numerical Recipes 6.2. */
double gamma_q(double a, double x) {
    if (x <= 0.0) return 1.0;
    double front = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1.0) {
        double ap = a, term = 1.0 / a, sum = term;
        for (int i = 0; i < 100000; i++) {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if (fabs(term) < fabs(sum) * 1e-16) break;
        }
        return 1.0 - sum * front;
    }
    const double tiny = 1e-300;
    double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
    for (int i = 1; i < 100000; i++) {
        double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1.0 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1.0) < 1e-16) break;
    }
    return front * h;
}

/* P(chi2 with `dof` degrees of freedom >= stat). */
double chi2_pvalue(double stat, int dof) {
    return gamma_q(0.5 * dof, 0.5 * stat);
}

/* Goodness of fit of counts[0..n) (total N) to the distribution `probs`
 * (normalized here). A count on a zero-probability token is impossible, so
 * the p-value is 0. Returns the p-value; all expected counts must be >= 5
 * (the chi-square approximation's usual condition), which the tests below
 * are built to satisfy and this checks. */
double chi2_fit(const long *counts, const double *probs, int n, long N) {
    double tot = 0.0;
    for (int i = 0; i < n; i++) tot += probs[i];
    double stat = 0.0;
    int cells = 0;
    for (int i = 0; i < n; i++) {
        double e = N * probs[i] / tot;
        if (probs[i] <= 0.0) {
            if (counts[i] > 0) return 0.0;
            continue;
        }
        if (e < 5.0) fail_msg("cell %d: expected count %.2f < 5; test is mis-designed", i, e);
        stat += (counts[i] - e) * (counts[i] - e) / e;
        cells++;
    }
    /* One cell (a one-hot distribution): nothing left to compare. */
    return cells > 1 ? chi2_pvalue(stat, cells - 1) : 1.0;
}
