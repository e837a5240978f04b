/* tree_choice.c - acceptance calibration and expected-throughput tree
 * choice (tree_choice.h). */
#include "draft-svc/tree_choice.h"

#include <stdlib.h>
#include <string.h>

/* Pseudo-tries of the prior (the score itself) in every cell: a cell needs
 * a few dozen observations before its own rate dominates. */
#define CALIB_PRIOR_WEIGHT 8.0f

void specd_accept_calib_init(specd_accept_calib *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < SPECD_CALIB_LOADS; i++) c->gain[i] = 1.0;
    pthread_mutex_init(&c->mu, NULL);
}

/* 1 -> 0, 2-3 -> 1, 4-7 -> 2, 8-15 -> 3, 16+ -> 4 */
static int load_bucket(int sessions) {
    int b = 0;
    while (b < SPECD_CALIB_LOADS - 1 && sessions >= 2 << b) b++;
    return b;
}

double specd_accept_calib_gain(specd_accept_calib *c, int sessions) {
    pthread_mutex_lock(&c->mu);
    double g = c->gain[load_bucket(sessions)];
    pthread_mutex_unlock(&c->mu);
    return g;
}

void specd_accept_calib_note_gain(specd_accept_calib *c, int sessions, double gain) {
    if (!(gain >= 0)) return;
    pthread_mutex_lock(&c->mu);
    double *g = &c->gain[load_bucket(sessions)];
    *g = 0.95 * *g + 0.05 * gain;
    pthread_mutex_unlock(&c->mu);
}

float specd_accept_calib_bias(specd_accept_calib *c, int sessions) {
    pthread_mutex_lock(&c->mu);
    int b = load_bucket(sessions);
    double f = (c->sent_acc[b] + SPECD_CALIB_SENT_PRIOR) /
               (c->sent_pred[b] + SPECD_CALIB_SENT_PRIOR);
    pthread_mutex_unlock(&c->mu);
    return (float)(f < 0.25 ? 0.25 : f > 2.0 ? 2.0 : f);
}

void specd_accept_calib_note_sent(specd_accept_calib *c, int sessions, double predicted,
                                  int nodes, int accepted) {
    if (!(predicted >= 0) || accepted < 0 || nodes < accepted) return;
    pthread_mutex_lock(&c->mu);
    int b = load_bucket(sessions);
    c->sent_pred[b] = SPECD_CALIB_SENT_KEEP * c->sent_pred[b] + predicted;
    c->sent_acc[b] = SPECD_CALIB_SENT_KEEP * c->sent_acc[b] + accepted;
    c->sent_nodes[b] = SPECD_CALIB_SENT_KEEP * c->sent_nodes[b] + nodes;
    pthread_mutex_unlock(&c->mu);
}

double specd_accept_calib_yield(specd_accept_calib *c, int sessions) {
    pthread_mutex_lock(&c->mu);
    int b = load_bucket(sessions);
    double y = c->sent_acc[b] / (c->sent_nodes[b] + SPECD_CALIB_SENT_PRIOR);
    pthread_mutex_unlock(&c->mu);
    return y;
}

double specd_accept_calib_stage(specd_accept_calib *c) {
    pthread_mutex_lock(&c->mu);
    double us = c->stage_us;
    pthread_mutex_unlock(&c->mu);
    return us;
}

double specd_draft_time_smooth(double est, double sample, double alpha) {
    if (est <= 0) return sample;
    if (sample > SPECD_DRAFT_OUTLIER_X * est) sample = SPECD_DRAFT_OUTLIER_X * est;
    return (1 - alpha) * est + alpha * sample;
}

void specd_accept_calib_note_stage(specd_accept_calib *c, double us) {
    if (!(us >= 0)) return;
    pthread_mutex_lock(&c->mu);
    c->stage_us = specd_draft_time_smooth(c->stage_us, us, 0.05);
    pthread_mutex_unlock(&c->mu);
}

void specd_accept_calib_destroy(specd_accept_calib *c) { pthread_mutex_destroy(&c->mu); }

static int depth_row(int depth) {
    int d = depth - 1;
    return d < 0 ? 0 : d >= SPECD_CALIB_DEPTHS ? SPECD_CALIB_DEPTHS - 1 : d;
}

static int src_of(const specd_tree_buf *t, int i) {
    return t->src && t->src[i] < SPECD_N_SRC ? t->src[i] : SPECD_SRC_MODEL;
}

/* Tenths, then four above 0.9 (tree_choice.h). */
static const float k_bin_lo[SPECD_CALIB_BINS + 1] = {0.0f, 0.1f,  0.2f,  0.3f,  0.4f,
                                                     0.5f, 0.6f,  0.7f,  0.8f,  0.9f,
                                                     0.95f, 0.98f, 0.99f, 1.0f};

int specd_calib_bin(float score) {
    if (!(score > 0)) return 0; /* and NaN */
    if (score < k_bin_lo[9]) return (int)(score * 10);
    int b = 9; /* the finer bins: walk the table's edges */
    while (b < SPECD_CALIB_BINS - 1 && score >= k_bin_lo[b + 1]) b++;
    return b;
}

void specd_calib_bin_range(int b, float *lo, float *hi) {
    b = b < 0 ? 0 : b >= SPECD_CALIB_BINS ? SPECD_CALIB_BINS - 1 : b;
    *lo = k_bin_lo[b];
    *hi = k_bin_lo[b + 1];
}

void specd_tree_scores(const specd_tree_buf *t, float *score, uint8_t *rank) {
    for (int i = 0; i < t->n_nodes; i++) {
        score[i] = specd_tree_node_score(t, i);
        /* rank: siblings before i with a higher draft probability (ties: the
         * earlier one), i.e. the drafter's order among them; among the
         * siblings from the same part of a hybrid's tree (the lookup's, or
         * the model's), so each part's favourite is its rank 0 as it would
         * be alone, whatever the other part proposed beside it */
        int r = 0, lookup = src_of(t, i) == SPECD_SRC_LOOKUP;
        for (int j = 0; j < t->n_nodes && r < SPECD_CALIB_RANKS - 1; j++)
            if (j != i && t->parents[j] == t->parents[i] &&
                (src_of(t, j) == SPECD_SRC_LOOKUP) == lookup &&
                (t->logq[j] > t->logq[i] || (t->logq[j] == t->logq[i] && j < i)))
                r++;
        rank[i] = (uint8_t)r;
    }
}

void specd_accept_estimate(specd_accept_calib *c, const specd_tree_buf *t, const float *score,
                           const uint8_t *rank, float scale, float *p_path) {
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < t->n_nodes; i++) {
        int o = src_of(t, i), d = depth_row(t->depth[i]), r = rank[i];
        int b = specd_calib_bin(score[i]);
        float pc = (c->accepted[o][d][r][b] + CALIB_PRIOR_WEIGHT * score[i]) /
                   (c->tried[o][d][r][b] + CALIB_PRIOR_WEIGHT);
        pc *= scale;
        if (pc > SPECD_P_MAX) pc = SPECD_P_MAX;
        if (pc < 0) pc = 0;
        p_path[i] = (t->parents[i] >= 0 ? p_path[t->parents[i]] : 1.0f) * pc;
    }
    pthread_mutex_unlock(&c->mu);
}

float specd_accept_calib_first(specd_accept_calib *c, float scale) {
    float best = 0;
    pthread_mutex_lock(&c->mu);
    static const int costed[] = {SPECD_SRC_MODEL, SPECD_SRC_BOTH};
    for (int k = 0; k < 2; k++) {
        int o = costed[k];
        float acc = 0, tried = 0;
        for (int b = 0; b < SPECD_CALIB_BINS; b++) {
            acc += c->accepted[o][0][0][b];
            tried += c->tried[o][0][0][b];
        }
        /* BOTH never tried says nothing (its prior would be 0.5 for every
         * drafter, even one with a single source): only MODEL stands in for
         * "nothing tried yet" */
        if (tried <= 0 && o != SPECD_SRC_MODEL) continue;
        float p = (acc + CALIB_PRIOR_WEIGHT * 0.5f) / (tried + CALIB_PRIOR_WEIGHT);
        if (p > best) best = p;
    }
    pthread_mutex_unlock(&c->mu);
    float p = best * scale;
    return p > SPECD_P_MAX ? SPECD_P_MAX : p;
}

void specd_accept_calib_update(specd_accept_calib *c, const specd_tree_buf *t,
                               const float *score, const uint8_t *rank,
                               const int32_t *accepted_nodes, int n_acc) {
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < t->n_nodes; i++) {
        int par = t->parents[i];
        /* tried: the parent is the root or on the accepted path */
        int tried = par < 0, accepted = 0;
        for (int k = 0; k < n_acc; k++) {
            if (accepted_nodes[k] == par) tried = 1;
            if (accepted_nodes[k] == i) accepted = 1;
        }
        if (!tried) continue;
        int o = src_of(t, i), d = depth_row(t->depth[i]), r = rank[i];
        int b = specd_calib_bin(score[i]);
        c->tried[o][d][r][b] += 1;
        c->accepted[o][d][r][b] += (float)accepted;
        if (c->tried[o][d][r][b] >= SPECD_CALIB_WINDOW) {
            c->tried[o][d][r][b] *= 0.5f;
            c->accepted[o][d][r][b] *= 0.5f;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* The cost of a pass of `tokens` tokens where the others bring base - 1
 * rows: the curve, but never less than the curve at base plus the curve's
 * average slope from 1 to base for each extra row. The curve is kept on a
 * coarse grid above 16 tokens, and noisy passes can leave it flat there
 * (at 16 sessions it read 44.2 ms for 16, 17 and 18 tokens): every extra
 * row then looked free, and trees were sent where each row costs what a
 * plain one does. A GPU's flat curve has a slope near 0, so nothing
 * changes there. Nor less than the curve's own points say (below). */
static double pass_cost(const specd_tree_price *pr, int base, int tokens) {
    double t = specd_step_cost_at(&pr->cost, tokens);
    if (tokens <= base) return t;
    const double tb = specd_step_cost_at(&pr->cost, base);
    if (base > 1) {
        double t1 = specd_step_cost_at(&pr->cost, 1);
        double slope = (tb - t1) / (base - 1);
        if (slope > 0 && t < tb + slope * (tokens - base)) t = tb + slope * (tokens - base);
    }
    /* Nor less than what the curve's own points say the extra rows cost
     * here. The running maximum behind specd_step_cost_at lets a
     * high point at a smaller size flatten everything above it: under
     * load the shared curve's 1- and 2-token points are rarely refreshed
     * (passes that small are rare there), and at 4 sessions they held
     * 3.9-4.1 ms where 4 tokens measured 3.4 and 5 tokens 3.8, so rows 5
     * and 6 looked free and every drafter sent trees that slowed the
     * target (0.83-0.92x of plain at 4 streams, 2-vCPU VM). */
    double raw_b = specd_step_cost_raw_at(&pr->cost, base);
    double raw_t = specd_step_cost_raw_at(&pr->cost, tokens);
    if (raw_b > 0 && raw_t > raw_b && t < tb + (raw_t - raw_b)) t = tb + (raw_t - raw_b);
    return t;
}

int specd_tree_other_rows(int batch_tokens, int our_rows, int prompt_rows) {
    int r = batch_tokens - (our_rows > 0 ? our_rows : 0) - (prompt_rows > 0 ? prompt_rows : 0);
    return r > 0 ? r : 0;
}

/* Drafting `levels` levels of a tree (the drafter runs one stage per level). */
static double stage_cost(const specd_tree_price *pr, int levels) {
    return pr->stage_us > 0 ? levels * pr->stage_us : 0;
}

/* The tokens a pass yields besides this session's accepted nodes: one per
 * session, plus what the others' nodes are expected to add. */
double specd_tree_base_tokens(const specd_tree_price *pr) {
    return (pr->sessions > 0 ? pr->sessions : 1) + (pr->other_expected > 0 ? pr->other_expected : 0);
}

/* The time outside the forward pass that a plain step pays
 * (specd_tree_price.plain_runs). */
static double plain_overhead(const specd_tree_price *pr) {
    return pr->plain_runs ? 0 : pr->overhead_us;
}

int specd_tree_could_pay(float p, const specd_tree_price *pr) {
    double L = specd_tree_base_tokens(pr);
    int base = pr->other_tokens + 1;
    double plain = specd_step_cost_at(&pr->cost, base), one = pass_cost(pr, base, base + 1);
    if (plain <= 0 || one <= 0) return 1;
    one += pr->overhead_us + stage_cost(pr, 1);
    plain += plain_overhead(pr);
    return (L + p) / one > L / plain;
}

int specd_tree_drafting_could_pay(const specd_tree_price *pr) {
    double L = specd_tree_base_tokens(pr);
    double plain = specd_step_cost_at(&pr->cost, pr->other_tokens + 1);
    if (plain <= 0) return 1;
    double tree = plain + pr->overhead_us + stage_cost(pr, 1);
    plain += plain_overhead(pr);
    return (L + SPECD_P_MAX) / tree > L / plain;
}

int specd_tree_run_pays(double rt_overhead_us, double run_overhead_us, double extra_us,
                        double pass_us, int look_steps, int look_tokens) {
    if (pass_us <= 0) return 0;
    if (rt_overhead_us < 0) rt_overhead_us = 0;
    if (run_overhead_us < 0) run_overhead_us = 0;
    if (extra_us < 0) extra_us = 0;
    double yield = (look_tokens + 1.0) / (look_steps + 1.0);
    return rt_overhead_us - run_overhead_us + extra_us > yield * (pass_us + run_overhead_us);
}

/* Node order for the choice: higher p, then shallower, then lower index. */
typedef struct ranked {
    float p;
    int depth, index;
} ranked;

static int by_p_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    if (x->depth != y->depth) return x->depth < y->depth ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

void specd_tree_choose(const float *p_path, const int32_t *depth, const int32_t *levels, int n,
                       const specd_tree_price *pr, uint8_t *keep, specd_tree_pick *out) {
    memset(out, 0, sizeof *out);
    double L = specd_tree_base_tokens(pr);
    int base = pr->other_tokens + 1;
    double plain = plain_overhead(pr) + specd_step_cost_at(&pr->cost, base);
    if (n <= 0) {
        out->plain_rate = out->rate = plain > 0 ? L / plain : 0;
        return;
    }
    if (specd_step_cost_at(&pr->cost, 1) <= 0) { /* nothing measured: no prices */
        memset(keep, 1, (size_t)n);
        out->n_keep = n;
        for (int i = 0; i < n; i++) out->expected += p_path[i];
        return;
    }
    ranked stack_buf[64];
    ranked *r = n <= 64 ? stack_buf : malloc(sizeof(ranked) * (size_t)n);
    if (!r) { /* cannot rank: a plain step is always safe */
        memset(keep, 0, (size_t)n);
        out->plain_rate = out->rate = L / plain;
        return;
    }
    for (int i = 0; i < n; i++) r[i] = (ranked){p_path[i], depth[i], i};
    qsort(r, (size_t)n, sizeof *r, by_p_desc);
    int best_n = 0, deepest = 0;
    double best_rate = L / plain, best_e = 0, e = 0;
    for (int k = 1; k <= n; k++) {
        e += r[k - 1].p;
        int lv = levels ? levels[r[k - 1].index] : r[k - 1].depth;
        if (lv > deepest) deepest = lv;
        double rate =
            (L + e) / (pr->overhead_us + pass_cost(pr, base, base + k) + stage_cost(pr, deepest));
        if (rate > best_rate) {
            best_rate = rate;
            best_n = k;
            best_e = e;
        }
    }
    memset(keep, 0, (size_t)n);
    for (int k = 0; k < best_n; k++) keep[r[k].index] = 1;
    out->n_keep = best_n;
    out->expected = best_e;
    out->rate = best_rate;
    out->plain_rate = L / plain;
    if (r != stack_buf) free(r);
}

double specd_tree_break_even(const specd_tree_price *pr, const specd_tree_pick *pick, int levels) {
    if (specd_step_cost_at(&pr->cost, 1) <= 0) return 0;
    const int base = pr->other_tokens + 1, k = pick->n_keep;
    const double row = pass_cost(pr, base, base + k + 1) - pass_cost(pr, base, base + k);
    const double rate = pick->rate > 0 ? pick->rate : pick->plain_rate;
    const double dt = (row > 0 ? row : 0) + stage_cost(pr, levels);
    return rate > 0 ? rate * dt : 0;
}
