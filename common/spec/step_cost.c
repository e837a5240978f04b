/* step_cost.c - the forward-pass cost curve (step_cost.h). */
#include "common/spec/step_cost.h"

#include <math.h>
#include <string.h>

void specd_step_cost_init(specd_step_cost *c, int max_tokens) {
    memset(c, 0, sizeof *c);
    if (max_tokens < 1) max_tokens = 1;
    /* every size to 16 (where trees live), then steps growing with the size */
    int t = 1;
    while (t <= max_tokens && c->n < SPECD_STEP_COST_MAX_POINTS) {
        c->tokens[c->n++] = t;
        t += t < 16 ? 1 : t < 32 ? 4 : t < 64 ? 8 : t < 128 ? 16 : t < 256 ? 32 : t < 512 ? 64
             : t < 1024 ? 128 : 256;
    }
    if (c->tokens[c->n - 1] < max_tokens) {
        if (c->n == SPECD_STEP_COST_MAX_POINTS) c->n--; /* the cap is the last point */
        c->tokens[c->n++] = max_tokens;
    }
}

int specd_step_cost_point(const specd_step_cost *c, int tokens) {
    int lo = 0, hi = c->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c->tokens[mid] == tokens) return mid;
        if (c->tokens[mid] < tokens) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* The last grid point at or below tokens (0 below the grid). */
static int floor_point(const specd_step_cost *c, int tokens) {
    int i = 0;
    while (i + 1 < c->n && c->tokens[i + 1] <= tokens) i++;
    return i;
}

/* The value at grid point i: measured, else interpolated between the
 * nearest measured points on either side, else extended along the slope of
 * the two nearest measured points on one side (flat with only one). */
static double point_value(const specd_step_cost *c, int i) {
    if (c->us[i] > 0) return c->us[i];
    int lo = -1, hi = -1;
    for (int j = i - 1; j >= 0; j--)
        if (c->us[j] > 0) {
            lo = j;
            break;
        }
    for (int j = i + 1; j < c->n; j++)
        if (c->us[j] > 0) {
            hi = j;
            break;
        }
    if (lo >= 0 && hi >= 0) {
        double f = (double)(c->tokens[i] - c->tokens[lo]) / (c->tokens[hi] - c->tokens[lo]);
        return c->us[lo] + f * (c->us[hi] - c->us[lo]);
    }
    int a = lo >= 0 ? lo : hi; /* the one side that has a measurement */
    if (a < 0) return 0;
    int b = -1;
    int step = lo >= 0 ? -1 : 1;
    for (int j = a + step; j >= 0 && j < c->n; j += step)
        if (c->us[j] > 0) {
            b = j;
            break;
        }
    if (b < 0) return c->us[a];
    double slope = (c->us[a] - c->us[b]) / (c->tokens[a] - c->tokens[b]);
    if (slope < 0) slope = 0;
    double v = c->us[a] + slope * (c->tokens[i] - c->tokens[a]);
    return v > 0 ? v : c->us[a];
}

double specd_step_cost_at(const specd_step_cost *c, int tokens) {
    if (c->n < 1) return 0;
    if (tokens < 1) tokens = 1;
    /* the last grid point at or below tokens, and the one above */
    int i = floor_point(c, tokens);
    /* the running maximum: measurements are noisy, the estimate is not
     * allowed to fall with the size */
    double v = 0;
    for (int j = 0; j <= i; j++) {
        double pv = point_value(c, j);
        if (pv > v) v = pv;
    }
    if (v <= 0) return 0;
    if (c->tokens[i] == tokens) return v;
    if (i + 1 < c->n) {
        double w = point_value(c, i + 1);
        double f = (double)(tokens - c->tokens[i]) / (c->tokens[i + 1] - c->tokens[i]);
        return w > v ? v + f * (w - v) : v;
    }
    /* past the grid: along the last slope */
    if (i > 0) {
        double u = point_value(c, i - 1);
        double slope = (v - u) / (c->tokens[i] - c->tokens[i - 1]);
        if (slope > 0) return v + slope * (tokens - c->tokens[i]);
    }
    return v;
}

double specd_step_cost_raw_at(const specd_step_cost *c, int tokens) {
    if (c->n < 1) return 0;
    if (tokens < 1) tokens = 1;
    int i = floor_point(c, tokens);
    const double v = point_value(c, i);
    if (c->tokens[i] == tokens || i + 1 >= c->n || v <= 0) return v;
    const double w = point_value(c, i + 1);
    if (w <= 0) return v;
    const double f = (double)(tokens - c->tokens[i]) / (c->tokens[i + 1] - c->tokens[i]);
    return v + f * (w - v);
}

static void fold(specd_step_cost *c, int i, double us, double alpha) {
    c->us[i] = c->us[i] > 0 ? (1 - alpha) * c->us[i] + alpha * us : us;
}

/* Scales every measured point by f. */
static void scale_all(specd_step_cost *c, double f) {
    for (int j = 0; j < c->n; j++)
        if (c->us[j] > 0) c->us[j] *= f;
}

void specd_step_cost_observe(specd_step_cost *c, int tokens, double us, double alpha) {
    if (c->n < 1 || tokens < 1 || !(us > 0) || !(alpha > 0)) return;
    if (alpha > 1) alpha = 1;
    int i = floor_point(c, tokens);
    const int on = c->tokens[i] == tokens, past = !on && i + 1 >= c->n;
    /* The level, where the curve has measured this size (on a measured
     * point or between two): a surprise against an interpolated or
     * extrapolated guess says where the guess was wrong, not that the host
     * changed. In log space, the surprise capped: one pass preempted for
     * ten times its length must not multiply every estimate by ten. */
    if (!past && c->us[i] > 0 && (on || c->us[i + 1] > 0)) {
        double r = us / specd_step_cost_raw_at(c, tokens);
        r = r < 1.0 / SPECD_STEP_COST_LEVEL_CAP ? 1.0 / SPECD_STEP_COST_LEVEL_CAP
            : r > SPECD_STEP_COST_LEVEL_CAP    ? SPECD_STEP_COST_LEVEL_CAP
                                               : r;
        scale_all(c, pow(r, alpha * SPECD_STEP_COST_LEVEL_SHARE));
        alpha *= 1 - SPECD_STEP_COST_LEVEL_SHARE; /* the shape's share */
    }
    if (on) {
        fold(c, i, us, alpha);
        return;
    }
    if (past) {
        /* past the last point: scale back to it along the curve */
        double here = specd_step_cost_at(c, tokens), at = point_value(c, i);
        fold(c, i, here > 0 && at > 0 ? us * at / here : us, alpha);
        return;
    }
    /* between points i and i+1: each moves by the measurement scaled by the
     * curve's ratio, so a curve with the right shape but the wrong level is
     * corrected without bending it */
    double here = specd_step_cost_at(c, tokens);
    double lo = point_value(c, i), hi = point_value(c, i + 1);
    if (here > 0 && lo > 0 && hi > 0) {
        fold(c, i, us * lo / here, alpha);
        fold(c, i + 1, us * hi / here, alpha);
    } else {
        fold(c, tokens - c->tokens[i] <= c->tokens[i + 1] - tokens ? i : i + 1, us, alpha);
    }
}

int specd_step_cost_load(specd_step_cost *c, const int *tokens, const double *us, int n) {
    int taken = 0;
    for (int k = 0; k < n; k++) {
        if (tokens[k] < 1 || !(us[k] > 0)) continue;
        int i = specd_step_cost_point(c, tokens[k]);
        if (i >= 0) c->us[i] = us[k];
        else specd_step_cost_observe(c, tokens[k], us[k], 1.0);
        taken++;
    }
    return taken;
}
