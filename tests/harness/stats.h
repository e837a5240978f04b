/* stats.h - chi-square goodness of fit for the statistical tests. */
#ifndef SPECD_STATS_UTIL_H
#define SPECD_STATS_UTIL_H

/* Regularized upper incomplete gamma Q(a, x). */
double gamma_q(double a, double x);
/* P(chi2 with `dof` degrees of freedom >= stat). */
double chi2_pvalue(double stat, int dof);
/* p-value of counts[0..n) (total N) against probs (normalized here); 0 when
 * a zero-probability cell was hit; fails the running cmocka test when an
 * expected count is below 5 (a mis-designed test). */
double chi2_fit(const long *counts, const double *probs, int n, long N);

#endif
