/* test_tree_choice.c - the forward-pass cost curve (common/spec/step_cost.h), the
 * acceptance calibration and the expected-throughput tree choice
 * (draft-svc/tree_choice.h), and tree pruning (tree_builder.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/spec/step_cost.h"
#include "draft-svc/policy.h"
#include "draft-svc/tree_choice.h"

/* ---- the cost curve ---------------------------------------------------------- */

static void test_grid(void **state) {
    (void)state;
    specd_step_cost c;
    specd_step_cost_init(&c, 2048);
    /* every size to 16, ascending, ending at the cap */
    for (int i = 0; i < 16; i++) assert_int_equal(c.tokens[i], i + 1);
    for (int i = 1; i < c.n; i++) assert_true(c.tokens[i] > c.tokens[i - 1]);
    assert_int_equal(c.tokens[c.n - 1], 2048);
    assert_true(c.n <= SPECD_STEP_COST_MAX_POINTS);
    /* an odd cap is still the last point */
    specd_step_cost_init(&c, 100);
    assert_int_equal(c.tokens[c.n - 1], 100);
    specd_step_cost_init(&c, 1);
    assert_int_equal(c.n, 1);
    /* nothing measured: no estimate */
    assert_true(specd_step_cost_at(&c, 1) == 0);
}

/* A linear curve a + b*n measured at some points is reproduced between and
 * beyond them, and never falls with the size. */
static void test_interpolation(void **state) {
    (void)state;
    specd_step_cost c;
    specd_step_cost_init(&c, 256);
    int pts[] = {1, 2, 4, 8, 16};
    double us[5];
    for (int i = 0; i < 5; i++) us[i] = 4000 + 700.0 * pts[i];
    assert_int_equal(specd_step_cost_load(&c, pts, us, 5), 5);
    assert_true(fabs(specd_step_cost_at(&c, 3) - (4000 + 2100)) < 1e-6);
    assert_true(fabs(specd_step_cost_at(&c, 12) - (4000 + 8400)) < 1e-6);
    /* beyond the last measurement: along the last slope */
    assert_true(fabs(specd_step_cost_at(&c, 64) - (4000 + 700.0 * 64)) < 1e-6);
    assert_true(fabs(specd_step_cost_at(&c, 100) - (4000 + 70000)) < 1e-6);
    /* below 1: the first point */
    assert_true(fabs(specd_step_cost_at(&c, 0) - 4700) < 1e-6);
    /* noise: a point measured cheaper than its smaller neighbour does not
     * make a bigger pass look cheaper */
    c.us[5] = 1000; /* tokens 6 */
    for (int n = 2; n <= 64; n++)
        assert_true(specd_step_cost_at(&c, n) >= specd_step_cost_at(&c, n - 1));
    /* bad input is ignored */
    int bad_t[] = {0, 5};
    double bad_us[] = {100, -1};
    assert_int_equal(specd_step_cost_load(&c, bad_t, bad_us, 2), 0);
}

/* Observations move the curve towards the truth, at the grid points and
 * between them (scaled by the curve's shape). */
static void test_observe(void **state) {
    (void)state;
    specd_step_cost c;
    specd_step_cost_init(&c, 512);
    /* the start-up guess is half the truth everywhere */
    for (int i = 0; i < c.n && c.tokens[i] <= 64; i++) c.us[i] = 0.5 * (1000 + 100.0 * c.tokens[i]);
    for (int k = 0; k < 3000; k++) {
        int n = 1 + (k * 37) % 64; /* sizes on and between grid points */
        specd_step_cost_observe(&c, n, 1000 + 100.0 * n, 0.1);
    }
    for (int n = 1; n <= 64; n++) {
        double want = 1000 + 100.0 * n, got = specd_step_cost_at(&c, n);
        assert_true(fabs(got - want) / want < 0.02);
    }
    /* a pass past every measured point lands on the nearest point */
    specd_step_cost_observe(&c, 512, 1000 + 100.0 * 512, 1.0);
    assert_true(fabs(specd_step_cost_at(&c, 512) - (1000 + 51200)) < 1);
    /* ignored: nonsense */
    specd_step_cost before = c;
    specd_step_cost_observe(&c, 0, 5, 0.5);
    specd_step_cost_observe(&c, 4, -5, 0.5);
    specd_step_cost_observe(&c, 4, 5, 0);
    assert_memory_equal(&before, &c, sizeof c);
}

/* A point no pass lands on follows the level of the passes that do: a
 * session that sends a tree every step never measures a 1-token pass, and
 * a 1-token point left high by a burst made every tree up to its cost look
 * free (the running maximum). The passes that match the curve move
 * nothing, an outlier moves it by a capped amount, and a pass at a size
 * never measured moves only that size. */
static void test_observe_far_points_follow(void **state) {
    (void)state;
    specd_step_cost c;
    specd_step_cost_init(&c, 64);
    for (int i = 0; i < c.n; i++) c.us[i] = 2500 + 400.0 * (c.tokens[i] - 1);
    /* a burst: the 1-token passes took twice the curve */
    for (int k = 0; k < 40; k++) specd_step_cost_observe(&c, 1, 5000, 0.05);
    assert_true(specd_step_cost_at(&c, 1) > 4000);
    /* the burst is over; only 4-token passes run, at the old truth */
    for (int k = 0; k < 400; k++) specd_step_cost_observe(&c, 4, 2500 + 1200, 0.05);
    double one = specd_step_cost_at(&c, 1), four = specd_step_cost_at(&c, 4);
    assert_true(fabs(four - 3700) / 3700 < 0.02);
    /* the 1-token point is back near the truth, and rows cost again */
    assert_true(one < 2500 * 1.15);
    assert_true(four - one > 0.7 * 1200);
    /* at a steady level nothing drifts: a pass that matches the curve moves
     * no point */
    specd_step_cost before = c;
    specd_step_cost_observe(&c, 4, specd_step_cost_at(&c, 4), 0.05);
    for (int i = 0; i < c.n; i++) assert_true(fabs(c.us[i] - before.us[i]) < 1e-6 * before.us[i]);
    /* one pass preempted for 100 times its length moves the level by the
     * capped surprise only */
    specd_step_cost_observe(&c, 4, 100 * specd_step_cost_at(&c, 4), 0.05);
    const double most = pow(SPECD_STEP_COST_LEVEL_CAP, 0.05 * SPECD_STEP_COST_LEVEL_SHARE);
    assert_true(c.us[0] <= before.us[0] * most * (1 + 1e-9));
    assert_true(c.us[0] > before.us[0]);
    /* a pass where nothing was measured (past the start-up grid's reach)
     * is shape, not level: the measured points keep their level */
    specd_step_cost_init(&c, 512);
    for (int i = 0; i < c.n && c.tokens[i] <= 16; i++) c.us[i] = 2500 + 400.0 * (c.tokens[i] - 1);
    before = c;
    specd_step_cost_observe(&c, 256, 3 * specd_step_cost_at(&c, 256), 0.05);
    for (int i = 0; i < c.n && c.tokens[i] <= 16; i++) assert_true(c.us[i] == before.us[i]);
}

/* ---- choosing the tree ----------------------------------------------------------- */

static specd_tree_price linear_price(double fixed, double per_token, double overhead) {
    specd_tree_price pr;
    memset(&pr, 0, sizeof pr);
    specd_step_cost_init(&pr.cost, 256);
    for (int i = 0; i < pr.cost.n; i++) pr.cost.us[i] = fixed + per_token * pr.cost.tokens[i];
    pr.sessions = 1;
    pr.overhead_us = overhead;
    return pr;
}

/* The chosen n maximizes (L + E_others + E(n)) / t(n) over every n, the
 * empty tree included, checked against brute force on random instances. */
static void test_choose_brute_force(void **state) {
    (void)state;
    srand(7);
    for (int trial = 0; trial < 500; trial++) {
        int n = 1 + rand() % 30;
        float p[32];
        int32_t depth[32];
        for (int i = 0; i < n; i++) {
            p[i] = (float)rand() / RAND_MAX;
            depth[i] = 1 + rand() % 5;
        }
        specd_tree_price pr = linear_price(3000 + rand() % 3000, rand() % 1500, rand() % 500);
        pr.sessions = 1 + rand() % 8;
        pr.other_tokens = pr.sessions > 1 ? rand() % 40 : 0;
        /* the others' nodes' expected tokens: at most one per row they bring */
        pr.other_expected = pr.sessions > 1 ? (rand() % 2) * 0.8 * (rand() % (pr.other_tokens + 1)) : 0;
        uint8_t keep[32];
        specd_tree_pick pick;
        specd_tree_choose(p, depth, NULL, n, &pr, keep, &pick);
        /* brute force over n: the top-n by p */
        float sorted[32];
        memcpy(sorted, p, sizeof(float) * (size_t)n);
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++)
                if (sorted[j] > sorted[i]) {
                    float t = sorted[i];
                    sorted[i] = sorted[j];
                    sorted[j] = t;
                }
        double best = 0, e = 0;
        for (int k = 0; k <= n; k++) {
            if (k) e += sorted[k - 1];
            double t = pr.overhead_us + specd_step_cost_at(&pr.cost, pr.other_tokens + 1 + k);
            double rate = (pr.sessions + pr.other_expected + e) / t;
            if (rate > best) best = rate;
        }
        assert_true(fabs(pick.rate - best) <= 1e-12 * best);
        assert_true(pick.rate >= pick.plain_rate);
        int kept = 0;
        double sum = 0;
        for (int i = 0; i < n; i++)
            if (keep[i]) {
                kept++;
                sum += p[i];
            }
        assert_int_equal(kept, pick.n_keep);
        assert_true(fabs(sum - pick.expected) < 1e-4);
    }
}

/* Cheap verification keeps a likely chain, expensive verification or an
 * unlikely draft gives the empty tree (a plain step), and load shrinks
 * trees: the same tree that pays at one session does not at eight. */
static void test_choose_cases(void **state) {
    (void)state;
    float p[4] = {0.9f, 0.8f, 0.7f, 0.6f}; /* a chain 1-2-3-4 */
    int32_t depth[4] = {1, 2, 3, 4};
    uint8_t keep[4];
    specd_tree_pick pick;
    /* a GPU-like curve: rows nearly free */
    specd_tree_price gpu = linear_price(5000, 10, 200);
    specd_tree_choose(p, depth, NULL, 4, &gpu, keep, &pick);
    assert_int_equal(pick.n_keep, 4);
    /* a CPU-like curve where a row costs as much as the pass itself */
    specd_tree_price cpu = linear_price(100, 4000, 200);
    specd_tree_choose(p, depth, NULL, 4, &cpu, keep, &pick);
    assert_int_equal(pick.n_keep, 0);
    assert_true(pick.rate == pick.plain_rate);
    /* unlikely drafts: nothing, even where rows are cheap-ish */
    float low[4] = {0.05f, 0.02f, 0.01f, 0.005f};
    specd_tree_price mid = linear_price(4000, 700, 200);
    specd_tree_choose(low, depth, NULL, 4, &mid, keep, &pick);
    assert_int_equal(pick.n_keep, 0);
    /* likely drafts on that curve: the chain pays at one session ... */
    specd_tree_choose(p, depth, NULL, 4, &mid, keep, &pick);
    assert_true(pick.n_keep >= 2);
    int alone = pick.n_keep;
    /* ... and less of it under load, with others' rows in the pass and
     * their tokens at stake (the curve is linear: compute-bound) */
    mid.sessions = 8;
    mid.other_tokens = 7;
    specd_tree_choose(p, depth, NULL, 4, &mid, keep, &pick);
    assert_true(pick.n_keep < alone);
    /* the chosen set is closed under parents: a prefix of the chain */
    for (int i = 1; i < 4; i++) assert_true(!keep[i] || keep[i - 1]);
    /* the drafter's time per level counts: on the curve where the whole
     * chain paid, a slow drafter keeps a shorter chain, never a longer */
    mid.sessions = 1;
    mid.other_tokens = 0;
    specd_tree_choose(p, depth, NULL, 4, &mid, keep, &pick);
    int free_draft = pick.n_keep;
    mid.stage_us = 3000;
    specd_tree_choose(p, depth, NULL, 4, &mid, keep, &pick);
    assert_true(pick.n_keep < free_draft);
    mid.stage_us = 0;
    /* nothing measured: the first steps keep the tree (no prices) */
    specd_tree_price none;
    memset(&none, 0, sizeof none);
    specd_step_cost_init(&none.cost, 64);
    none.sessions = 1;
    specd_tree_choose(p, depth, NULL, 4, &none, keep, &pick);
    assert_int_equal(pick.n_keep, 4);
    /* an empty tree */
    specd_tree_choose(p, depth, NULL, 0, &gpu, keep, &pick);
    assert_int_equal(pick.n_keep, 0);
}

/* Where the target runs plain steps by itself (plain_runs), a plain step
 * pays no round trip and a tree step still does: rows at 0.5 ms on a 2 ms
 * base, 0.4 ms of overhead. A node of chance 0.25 pays when both pay the
 * overhead (1.25 / 3.4 ms against 1 / 2.9 ms) and not against a plain run
 * (1 / 2.5 ms); a drafter whose level takes 2.5 ms could pay with a sure
 * node only in the first case. */
static void test_plain_runs(void **state) {
    (void)state;
    specd_tree_price pr = linear_price(2000, 500, 400);
    float p[1] = {0.25f};
    int32_t depth[1] = {1};
    uint8_t keep[1];
    specd_tree_pick pick;
    specd_tree_choose(p, depth, NULL, 1, &pr, keep, &pick);
    assert_int_equal(pick.n_keep, 1);
    assert_true(specd_tree_could_pay(0.25f, &pr));
    assert_true(fabs(pick.plain_rate - 1.0 / 2900) < 1e-12);
    pr.plain_runs = 1;
    specd_tree_choose(p, depth, NULL, 1, &pr, keep, &pick);
    assert_int_equal(pick.n_keep, 0);
    assert_false(specd_tree_could_pay(0.25f, &pr));
    assert_true(fabs(pick.plain_rate - 1.0 / 2500) < 1e-12);
    /* a likely node still goes: 1.9 / 3.4 ms */
    p[0] = 0.9f;
    specd_tree_choose(p, depth, NULL, 1, &pr, keep, &pick);
    assert_int_equal(pick.n_keep, 1);
    assert_true(fabs(pick.rate - 1.9 / 3400) < 1e-6 / 3400);
    pr.stage_us = 2500;
    assert_false(specd_tree_drafting_could_pay(&pr));
    pr.plain_runs = 0;
    assert_true(specd_tree_drafting_could_pay(&pr));
}

/* A plain run, or draft on? By what the session's drafting actually won.
 * The cases measured (docs/BENCHMARKS.md, thirty-fifth session): two pods
 * on their own cores, where a round trip (150 us) costs about what a run's
 * step (120 us) does and the n-gram drafter's looks (20 us each) won 7
 * tokens in 57 steps: draft on. Two shared cores, round trip 1200 us, run
 * step 460 us, a sampled text whose 10 looks won nothing: run. A drafter
 * whose steps cost 1 ms of drafting and rows needs its steps to win about
 * a third of a token each on a 2.7 ms pass. At the start (no look yet, one
 * token a step assumed) only a step dearer than a run's whole step runs.
 * Nothing measured: never. */
static void test_run_pays(void **state) {
    (void)state;
    assert_false(specd_tree_run_pays(150, 120, 20, 2700, 57, 7));
    assert_true(specd_tree_run_pays(1200, 460, 20, 3200, 10, 0));
    /* the same looks winning 1 token in 2 steps: 760 < 0.55 x 3660 */
    assert_false(specd_tree_run_pays(1200, 460, 20, 3200, 10, 5));
    /* a model's steps: 1030 us against 0.3 x 2820 us (run), 0.4 x (draft on) */
    assert_true(specd_tree_run_pays(150, 120, 1000, 2700, 9, 2));
    assert_false(specd_tree_run_pays(150, 120, 1000, 2700, 9, 3));
    assert_false(specd_tree_run_pays(1200, 0, 0, 3200, 0, 0));
    assert_true(specd_tree_run_pays(3300, 0, 0, 3200, 0, 0));
    /* a run step measured dearer than the round trip, a look costing nothing */
    assert_false(specd_tree_run_pays(400, 500, 0, 3200, 100, 0));
    assert_false(specd_tree_run_pays(1200, 460, 20, 0, 10, 0));
}

/* How many nodes specd_tree_choose keeps of a one-node tree at chance p. */
static int one_node_kept(float p, const specd_tree_price *pr) {
    const float ps[1] = {p};
    const int32_t depth[1] = {1};
    uint8_t keep[1];
    specd_tree_pick pick;
    specd_tree_choose(ps, depth, NULL, 1, pr, keep, &pick);
    return pick.n_keep;
}

/* The others' rows leave out the last pass's prompt rows (and ours). A
 * pass of 16 sessions' plain rows that also carried a 20-row prompt chunk
 * looked slow per token, and a node accepted at 60% beside it paid on
 * paper, where on a linear curve (2 ms + 0.7 ms a row) a row must be
 * accepted at 16 * 0.7 / 13.9 = 81% to pay: counted without the chunk, it
 * is declined. */
static void test_other_rows(void **state) {
    (void)state;
    assert_int_equal(specd_tree_other_rows(37, 1, 20), 16);
    assert_int_equal(specd_tree_other_rows(37, 5, 0), 32);
    assert_int_equal(specd_tree_other_rows(20, 0, 20), 0); /* Open's pass: our prompt alone */
    assert_int_equal(specd_tree_other_rows(10, 4, 20), 0); /* never below 0 */
    assert_int_equal(specd_tree_other_rows(10, -1, -3), 10);
    specd_tree_price pr = linear_price(2000, 700, 0);
    pr.sessions = 16;
    pr.plain_runs = 1;
    pr.other_tokens = 37 - 1; /* the chunk counted */
    assert_int_equal(one_node_kept(0.6f, &pr), 1);
    pr.other_tokens = specd_tree_other_rows(37, 1, 20);
    assert_int_equal(one_node_kept(0.6f, &pr), 0);
    assert_false(specd_tree_could_pay(0.6f, &pr));
    assert_int_equal(one_node_kept(0.9f, &pr), 1); /* a likely node still goes */
}

/* specd_tree_break_even is the exact bar for one more node: on top of a
 * chosen node, a child a hair above it is kept by specd_tree_choose and
 * one a hair below is not, alone and under load, with and without a
 * drafter stage for the child's level; nothing measured: no bar. */
static void test_break_even(void **state) {
    (void)state;
    int32_t depth[2] = {1, 2};
    uint8_t keep[2];
    specd_tree_price cases[3] = {linear_price(2300, 350, 250), linear_price(2300, 350, 250),
                                 linear_price(4000, 700, 0)};
    cases[1].stage_us = 250;
    cases[2].sessions = 4, cases[2].other_tokens = 3, cases[2].stage_us = 100;
    for (int c = 0; c < 3; c++) {
        specd_tree_price *pr = &cases[c];
        float p[2] = {0.9f, 0.0f};
        specd_tree_pick one, two;
        specd_tree_choose(p, depth, NULL, 1, pr, keep, &one);
        assert_int_equal(one.n_keep, 1);
        double be = specd_tree_break_even(pr, &one, 1);
        assert_true(be > 0 && be < 0.9);
        p[1] = (float)(be * 1.02);
        specd_tree_choose(p, depth, NULL, 2, pr, keep, &two);
        assert_int_equal(two.n_keep, 2);
        p[1] = (float)(be * 0.98);
        specd_tree_choose(p, depth, NULL, 2, pr, keep, &two);
        assert_int_equal(two.n_keep, 1);
        /* a stage costs something: a child that needs one has a higher bar */
        if (pr->stage_us > 0) assert_true(be > specd_tree_break_even(pr, &one, 0));
    }
    specd_tree_price none;
    memset(&none, 0, sizeof none);
    specd_step_cost_init(&none.cost, 64);
    specd_tree_pick pick = {.n_keep = 1, .rate = 1e-3};
    assert_true(specd_tree_break_even(&none, &pick, 1) == 0);
}

/* ---- calibration ------------------------------------------------------------- */

static void chain_tree(specd_tree_buf *t, const float *q, int n) {
    specd_tree_buf_reset(t);
    float lq = 0;
    for (int i = 0; i < n; i++) {
        lq += logf(q[i]);
        assert_int_equal(specd_tree_buf_add(t, i - 1, 10 + i, lq), i);
    }
}

/* An overconfident drafter (it says 0.95, the target agrees 30% of the
 * time at depth 1 and 60% deeper) is corrected by what verification
 * reports, per depth. */
static void test_calibration(void **state) {
    (void)state;
    specd_accept_calib c;
    specd_accept_calib_init(&c);
    specd_tree_buf t;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&t, 8, 0, &err), 0);
    float q[3] = {0.95f, 0.95f, 0.95f};
    float score[8], p[8];
    uint8_t rank[8];
    chain_tree(&t, q, 3);
    specd_tree_scores(&t, score, rank);
    for (int i = 0; i < 3; i++) {
        assert_true(fabsf(score[i] - 0.95f) < 1e-5f);
        assert_int_equal(rank[i], 0);
    }
    /* the prior is the score itself */
    specd_accept_estimate(&c, &t, score, rank, 1.0f, p);
    assert_true(fabsf(p[0] - 0.95f) < 1e-5f);
    srand(3);
    for (int step = 0; step < 4000; step++) {
        int32_t acc[3];
        int n_acc = 0;
        if (rand() % 10 < 3) {
            acc[n_acc++] = 0;
            for (int d = 1; d < 3 && rand() % 10 < 6; d++) acc[n_acc++] = d;
        }
        specd_accept_calib_update(&c, &t, score, rank, acc, n_acc);
    }
    specd_accept_estimate(&c, &t, score, rank, 1.0f, p);
    assert_true(fabsf(p[0] - 0.3f) < 0.04f);
    assert_true(fabsf(p[1] / p[0] - 0.6f) < 0.06f);
    assert_true(fabsf(p[2] / p[1] - 0.6f) < 0.08f);
    /* a session scale above 1 raises conditional chances, capped below 1 */
    specd_accept_estimate(&c, &t, score, rank, 100.0f, p);
    assert_true(p[0] <= 0.99f && p[0] > 0.98f);
    /* a drafter's own score (pcond) wins over the draft probability */
    t.pcond[0] = 0.2f;
    specd_tree_scores(&t, score, rank);
    assert_true(fabsf(score[0] - 0.2f) < 1e-6f);
    specd_tree_buf_free(&t);
    specd_accept_calib_destroy(&c);
}

/* Above 0.9 the bins are finer: a draft that says 0.92 and one that says
 * 0.995 are accepted at different rates (0.78 and 0.96 at depth 1 on the
 * held-out prompts), and the calibration keeps the two apart instead of
 * pricing both at their average. */
static void test_calibration_top_bins(void **state) {
    (void)state;
    specd_accept_calib c;
    specd_accept_calib_init(&c);
    specd_tree_buf lo, hi;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&lo, 4, 0, &err), 0);
    assert_int_equal(specd_tree_buf_init(&hi, 4, 0, &err), 0);
    const float q_lo[1] = {0.92f}, q_hi[1] = {0.995f};
    chain_tree(&lo, q_lo, 1);
    chain_tree(&hi, q_hi, 1);
    float s_lo[4], s_hi[4], p_lo[4], p_hi[4];
    uint8_t r_lo[4], r_hi[4];
    specd_tree_scores(&lo, s_lo, r_lo);
    specd_tree_scores(&hi, s_hi, r_hi);
    /* 0.92 accepted 7 times in 10, 0.995 19 times in 20 */
    for (int step = 0; step < 2000; step++) {
        int32_t first = 0;
        specd_accept_calib_update(&c, &lo, s_lo, r_lo, &first, step % 10 < 7);
        specd_accept_calib_update(&c, &hi, s_hi, r_hi, &first, step % 20 < 19);
    }
    specd_accept_estimate(&c, &lo, s_lo, r_lo, 1.0f, p_lo);
    specd_accept_estimate(&c, &hi, s_hi, r_hi, 1.0f, p_hi);
    assert_true(fabsf(p_lo[0] - 0.70f) < 0.02f);
    assert_true(fabsf(p_hi[0] - 0.95f) < 0.02f);
    /* every bin's range maps back to it, and the ranges tile [0, 1] */
    float prev_hi = 0.0f;
    for (int b = 0; b < SPECD_CALIB_BINS; b++) {
        float blo, bhi;
        specd_calib_bin_range(b, &blo, &bhi);
        assert_true(blo == prev_hi && bhi > blo);
        assert_int_equal(specd_calib_bin(blo + 1e-6f), b);
        assert_int_equal(specd_calib_bin(nextafterf(bhi, 0.0f)), b);
        prev_hi = bhi;
    }
    assert_true(prev_hi == 1.0f);
    assert_int_equal(specd_calib_bin(1.0f), SPECD_CALIB_BINS - 1);
    assert_int_equal(specd_calib_bin(-0.5f), 0);
    assert_int_equal(specd_calib_bin(NAN), 0);
    /* the bins' edges: tenths below 0.9, then 0.95, 0.98 and 0.99 */
    const float edge_pairs[][2] = {{0.85f, 0.89f}, {0.90f, 0.94f}, {0.95f, 0.97f},
                                   {0.98f, 0.985f}, {0.99f, 1.0f}};
    for (size_t k = 0; k < sizeof edge_pairs / sizeof edge_pairs[0]; k++) {
        /* same bin: teaching one moves the other */
        specd_accept_calib cc;
        specd_accept_calib_init(&cc);
        specd_tree_buf a;
        assert_int_equal(specd_tree_buf_init(&a, 4, 0, &err), 0);
        float sa[4], pa[4];
        uint8_t ra[4];
        chain_tree(&a, &edge_pairs[k][0], 1);
        specd_tree_scores(&a, sa, ra);
        for (int i = 0; i < 100; i++) specd_accept_calib_update(&cc, &a, sa, ra, NULL, 0);
        chain_tree(&a, &edge_pairs[k][1], 1);
        specd_tree_scores(&a, sa, ra);
        specd_accept_estimate(&cc, &a, sa, ra, 1.0f, pa);
        assert_true(pa[0] < 0.2f);
        specd_tree_buf_free(&a);
        specd_accept_calib_destroy(&cc);
    }
    specd_tree_buf_free(&lo);
    specd_tree_buf_free(&hi);
    specd_accept_calib_destroy(&c);
}

/* Siblings are ranked by draft probability; an untried node (its parent was
 * rejected) teaches nothing. */
static void test_ranks_and_tries(void **state) {
    (void)state;
    specd_accept_calib c;
    specd_accept_calib_init(&c);
    specd_tree_buf t;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&t, 8, 0, &err), 0);
    /* root children a (0.6), b (0.3), c (0.1); a's child d */
    assert_int_equal(specd_tree_buf_add(&t, -1, 1, logf(0.3f)), 0); /* b */
    assert_int_equal(specd_tree_buf_add(&t, -1, 2, logf(0.6f)), 1); /* a */
    assert_int_equal(specd_tree_buf_add(&t, -1, 3, logf(0.1f)), 2); /* c */
    assert_int_equal(specd_tree_buf_add(&t, 0, 4, logf(0.3f * 0.5f)), 3); /* under b */
    float score[8];
    uint8_t rank[8];
    specd_tree_scores(&t, score, rank);
    assert_int_equal(rank[1], 0);
    assert_int_equal(rank[0], 1);
    assert_int_equal(rank[2], 2);
    assert_true(fabsf(score[3] - 0.5f) < 1e-5f);
    /* a accepted: b's child was never tried */
    int32_t acc[1] = {1};
    specd_accept_calib_update(&c, &t, score, rank, acc, 1);
    float tried_depth2 = 0;
    for (int r = 0; r < SPECD_CALIB_RANKS; r++)
        for (int b = 0; b < SPECD_CALIB_BINS; b++) tried_depth2 += c.tried[0][1][r][b];
    assert_true(tried_depth2 == 0);
    float tried_depth1 = 0, accepted_depth1 = 0;
    for (int r = 0; r < SPECD_CALIB_RANKS; r++)
        for (int b = 0; b < SPECD_CALIB_BINS; b++) {
            tried_depth1 += c.tried[0][0][r][b];
            accepted_depth1 += c.accepted[0][0][r][b];
        }
    assert_true(tried_depth1 == 3 && accepted_depth1 == 1);
    specd_tree_buf_free(&t);
    specd_accept_calib_destroy(&c);
}

/* Pruning keeps the chosen nodes in order with parents remapped, and drops
 * a chosen node whose parent was not chosen. */
/* The drafter-wide gain is kept per load bucket: a verdict learned under
 * 16 sessions (drafting does not pay) leaves a lone session's bucket alone,
 * and sizes map to 1 | 2-3 | 4-7 | 8-15 | 16+. */
static void test_gain_by_load(void **state) {
    (void)state;
    specd_accept_calib c;
    specd_accept_calib_init(&c);
    for (int s = 0; s <= 64; s++) assert_true(specd_accept_calib_gain(&c, s) == 1.0);
    for (int i = 0; i < 200; i++) specd_accept_calib_note_gain(&c, 16, 0.5);
    assert_true(specd_accept_calib_gain(&c, 16) < 0.6);
    assert_true(specd_accept_calib_gain(&c, 40) < 0.6);
    for (int s = 0; s <= 15; s++) assert_true(specd_accept_calib_gain(&c, s) == 1.0);
    specd_accept_calib_note_gain(&c, 3, 2.0);
    assert_true(specd_accept_calib_gain(&c, 2) > 1.0);
    assert_true(specd_accept_calib_gain(&c, 3) > 1.0);
    assert_true(specd_accept_calib_gain(&c, 1) == 1.0);
    assert_true(specd_accept_calib_gain(&c, 4) == 1.0);
    specd_accept_calib_note_gain(&c, 8, -1.0); /* not a gain: ignored */
    assert_true(specd_accept_calib_gain(&c, 8) == 1.0);
    specd_accept_calib_destroy(&c);
}

/* The drafter-wide time per level: the first sample sets it, later ones
 * are smoothed, and a preempted draft counts as at most 4 times the
 * estimate, so one slow draft cannot price every tree out. */
static void test_stage_time(void **state) {
    (void)state;
    specd_accept_calib c;
    specd_accept_calib_init(&c);
    assert_true(specd_accept_calib_stage(&c) == 0.0);
    specd_accept_calib_note_stage(&c, 50.0);
    assert_true(specd_accept_calib_stage(&c) == 50.0);
    specd_accept_calib_note_stage(&c, 42000.0); /* counts as 200 */
    assert_float_equal(specd_accept_calib_stage(&c), 0.95 * 50.0 + 0.05 * 200.0, 1e-9);
    for (int i = 0; i < 200; i++) specd_accept_calib_note_stage(&c, 40.0);
    assert_float_equal(specd_accept_calib_stage(&c), 40.0, 0.1);
    specd_accept_calib_note_stage(&c, -1.0); /* not a time: ignored */
    assert_float_equal(specd_accept_calib_stage(&c), 40.0, 0.1);
    specd_accept_calib_destroy(&c);
}

/* specd_tree_could_pay with a drafter taking stage_us per level. */
/* The nodes specd_tree_choose keeps of a chain of three at depths 1-3
 * whose path chances are a, b, c. */
static int chain3_kept(float a, float b, float c, const specd_tree_price *pr) {
    const float p[3] = {a, b, c};
    const int32_t depth[3] = {1, 2, 3};
    uint8_t keep[3];
    specd_tree_pick pick;
    specd_tree_choose(p, depth, NULL, 3, pr, keep, &pick);
    return pick.n_keep;
}

static int could_pay(float p, double stage_us, specd_tree_price *pr) {
    pr->stage_us = stage_us;
    return specd_tree_could_pay(p, pr);
}

/* Before drafting: the first-level acceptance seen so far, and whether a
 * one-node tree at that chance, with its draft time, beats a plain step.
 * The numbers are this CPU's (bench --verify, AVX2, 2 threads): alone a
 * node adds ~30% to a ~5.6 ms pass, under 4 sessions ~19% to a pass of 4. */
static void test_could_pay(void **state) {
    (void)state;
    specd_accept_calib c;
    specd_accept_calib_init(&c);
    /* nothing tried: even odds */
    assert_true(fabsf(specd_accept_calib_first(&c, 1.0f) - 0.5f) < 1e-6f);
    specd_tree_buf t;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&t, 8, 0, &err), 0);
    float q[1] = {0.9f}, score[8];
    uint8_t rank[8];
    chain_tree(&t, q, 1);
    specd_tree_scores(&t, score, rank);
    for (int step = 0; step < 1000; step++) {
        int32_t acc[1] = {0};
        specd_accept_calib_update(&c, &t, score, rank, acc, step % 10 < 6); /* 60% */
    }
    float p1 = specd_accept_calib_first(&c, 1.0f);
    assert_true(fabsf(p1 - 0.6f) < 0.01f);
    assert_true(specd_accept_calib_first(&c, 0.5f) < 0.31f); /* the session's scale */
    assert_true(specd_accept_calib_first(&c, 10.0f) <= 0.99f);
    /* alone: 5600 us + 1700 per extra row, 1000 us of round trip, 600 us to
     * draft: a 60% node pays, a 20% one does not */
    specd_tree_price alone = linear_price(3900, 1700, 1000);
    assert_true(could_pay(p1, 600, &alone));
    assert_false(could_pay(0.2f, 600, &alone));
    /* the draft time counts: a slow drafter does not pay even at 60% */
    assert_false(could_pay(p1, 4000, &alone));
    /* 4 sessions, 3 rows of others: the same node does not pay */
    specd_tree_price load = linear_price(5100, 2300, 0);
    load.sessions = 4;
    load.other_tokens = 3;
    assert_false(could_pay(p1, 600, &load));
    /* a curve left flat past 16 tokens (coarse grid, noisy passes): the
     * extra row still costs the curve's average slope, so at 16 sessions
     * a 90% node does not pay, and no tree is kept (a flat curve would
     * keep the whole chain) */
    specd_tree_price flat = linear_price(2600, 2600, 0);
    for (int i = 0; i < flat.cost.n; i++)
        if (flat.cost.tokens[i] > 16) flat.cost.us[i] = flat.cost.us[specd_step_cost_point(&flat.cost, 16)];
    flat.sessions = 16;
    flat.other_tokens = 15;
    assert_true(specd_step_cost_at(&flat.cost, 17) == specd_step_cost_at(&flat.cost, 16));
    assert_false(could_pay(0.9f, 0, &flat));
    assert_int_equal(chain3_kept(0.9f, 0.8f, 0.7f, &flat), 0);
    /* the drafter's time alone (specd_tree_drafting_could_pay): a sure
     * node whose row costs nothing. Alone a plain step is 6600 us with the
     * round trip: a 4000 us stage still leaves it worth drafting, a 7000
     * us one (a draft model as slow as the target) does not */
    alone.stage_us = 4000;
    assert_true(specd_tree_drafting_could_pay(&alone));
    alone.stage_us = 7000;
    assert_false(specd_tree_drafting_could_pay(&alone));
    /* an extra row's cost measured 10x too high (a burst on shared cores)
     * says no to every node, but not to drafting as such */
    specd_tree_price burst = linear_price(3900, 1700, 1000);
    for (int i = 0; i < burst.cost.n; i++)
        if (burst.cost.tokens[i] > 1) burst.cost.us[i] += 15300;
    assert_false(could_pay(SPECD_P_MAX, 600, &burst));
    assert_true(specd_tree_drafting_could_pay(&burst));
    /* nothing measured: no price, so it may */
    specd_tree_price none;
    memset(&none, 0, sizeof none);
    specd_step_cost_init(&none.cost, 64);
    assert_true(could_pay(0.01f, 600, &none));
    assert_true(specd_tree_drafting_could_pay(&none));
    specd_tree_buf_free(&t);
    specd_accept_calib_destroy(&c);
}

/* The shared curve as a 4-stream run on the 2-vCPU VM left it: its 1- and
 * 2-token points stale and high (3.9-4.0 ms; passes that small are rare
 * under load), 3-8 tokens as measured. The running maximum reads 3.95 ms
 * for 4 and 5 tokens alike, so the fifth row looked free; the points
 * themselves say it costs 372 us. At 4 sessions (3 others' rows) a 30%
 * node must not be kept, a 60% one still pays, and the raw value between
 * grid points is their interpolation. */
static void test_stale_small_points(void **state) {
    (void)state;
    specd_tree_price pr;
    memset(&pr, 0, sizeof pr);
    specd_step_cost_init(&pr.cost, 256);
    static const double us[8] = {3912, 3948, 3423, 3422, 3794, 4267, 4718, 5016};
    for (int i = 0; i < 8; i++) pr.cost.us[i] = us[i];
    assert_true(specd_step_cost_at(&pr.cost, 5) == specd_step_cost_at(&pr.cost, 4));
    assert_true(specd_step_cost_raw_at(&pr.cost, 5) == 3794);
    assert_true(specd_step_cost_raw_at(&pr.cost, 4) == 3422);
    /* between points 16 and 20: the interpolation; past the last measured
     * point, the slope of the two before it */
    specd_tree_price lin = linear_price(1000, 100, 0);
    assert_true(fabs(specd_step_cost_raw_at(&lin.cost, 18) - 2800) < 1e-9);
    assert_true(fabs(specd_step_cost_raw_at(&pr.cost, 10) - (5016 + 2 * (5016 - 4718))) < 1e-9);
    pr.sessions = 4;
    pr.other_tokens = 3;
    assert_false(specd_tree_could_pay(0.3f, &pr));
    assert_true(specd_tree_could_pay(0.6f, &pr));
    assert_int_equal(chain3_kept(0.35f, 0.3f, 0.2f, &pr), 0);
    assert_int_equal(chain3_kept(0.9f, 0.8f, 0.3f, &pr), 2);
}

/* A lookup's nodes cost no drafting stage (levels 0) and are calibrated
 * apart from the model's. */
static void test_sources(void **state) {
    (void)state;
    /* a chain of likely nodes, a pass of 5 ms + 0.2 ms a row, a slow
     * drafter at 8 ms a level: charged per level, no node pays; as a
     * lookup's (no stage), all four do */
    specd_tree_price pr = linear_price(5000, 200, 0);
    pr.stage_us = 8000;
    float chain[4] = {0.95f, 0.9f, 0.85f, 0.8f};
    int32_t depth[4] = {1, 2, 3, 4}, free_levels[4] = {0, 0, 0, 0};
    uint8_t keep[4];
    specd_tree_pick model, lookup;
    specd_tree_choose(chain, depth, NULL, 4, &pr, keep, &model);
    specd_tree_choose(chain, depth, free_levels, 4, &pr, keep, &lookup);
    assert_int_equal(model.n_keep, 0);
    assert_int_equal(lookup.n_keep, 4);
    assert_true(lookup.rate > model.rate);
    /* calibration: a lookup node always accepted, a model node always
     * rejected, both scored 0.9 at depth 1 rank 0 */
    specd_accept_calib c;
    specd_accept_calib_init(&c);
    specd_tree_buf t;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&t, 4, 0, &err), 0);
    int a = specd_tree_buf_add(&t, -1, 10, logf(0.9f));
    int b = specd_tree_buf_add(&t, -1, 11, logf(0.9f));
    t.src[b] = SPECD_SRC_LOOKUP;
    float score[4], p[4];
    uint8_t rank[4];
    specd_tree_scores(&t, score, rank);
    rank[b] = 0; /* both favourites of their source */
    for (int i = 0; i < 400; i++) {
        int32_t acc[1] = {b};
        specd_accept_calib_update(&c, &t, score, rank, acc, 1);
    }
    specd_accept_estimate(&c, &t, score, rank, 1.0f, p);
    assert_true(p[b] > 0.95f);
    assert_true(p[a] < 0.05f);
    assert_true(c.tried[SPECD_SRC_MODEL][0][0][9] > 0 && c.tried[SPECD_SRC_LOOKUP][0][0][9] > 0);
    /* the first-node estimate says whether the model's drafting pays: the
     * model's, however well the lookup does */
    assert_true(specd_accept_calib_first(&c, 1.0f) < 0.05f);
    specd_tree_buf_free(&t);
    specd_accept_calib_destroy(&c);
}

/* The sent-tree bias: 1 before anything was sent, then what sent trees
 * earned over what they were predicted to, per load bucket. */
static void test_sent_bias(void **state) {
    (void)state;
    specd_accept_calib c;
    specd_accept_calib_init(&c);
    assert_true(specd_accept_calib_bias(&c, 1) == 1.0f);
    /* trees predicted at 2 tokens that earn 1.5 */
    for (int i = 0; i < 300; i++) specd_accept_calib_note_sent(&c, 1, 2.0, 3, i % 2 ? 2 : 1);
    float b = specd_accept_calib_bias(&c, 1);
    assert_true(fabsf(b - 0.75f) < 0.02f);
    /* another load bucket learns on its own */
    assert_true(specd_accept_calib_bias(&c, 4) == 1.0f);
    assert_true(specd_accept_calib_bias(&c, 3) == 1.0f);
    /* the recent trees count: a text that now accepts all it is predicted */
    for (int i = 0; i < 300; i++) specd_accept_calib_note_sent(&c, 1, 2.0, 3, 2);
    assert_true(fabsf(specd_accept_calib_bias(&c, 1) - 1.0f) < 0.02f);
    /* bounded, and nonsense is ignored */
    for (int i = 0; i < 300; i++) specd_accept_calib_note_sent(&c, 16, 1.0, 2, 0);
    assert_true(specd_accept_calib_bias(&c, 16) == 0.25f);
    specd_accept_calib_note_sent(&c, 1, -1.0, 3, 3);
    specd_accept_calib_note_sent(&c, 1, NAN, 3, 3);
    specd_accept_calib_note_sent(&c, 1, 2.0, 1, 3); /* more accepted than sent */
    assert_true(fabsf(specd_accept_calib_bias(&c, 1) - 1.0f) < 0.02f);
    specd_accept_calib_destroy(&c);
}

/* What a sent node earns, per load bucket: 0 before anything was sent, then
 * accepted tokens over nodes. */
static void test_sent_yield(void **state) {
    (void)state;
    specd_accept_calib c;
    specd_accept_calib_init(&c);
    assert_true(specd_accept_calib_yield(&c, 16) == 0.0);
    /* trees of 4 nodes that get 3 accepted */
    for (int i = 0; i < 400; i++) specd_accept_calib_note_sent(&c, 16, 3.5, 4, 3);
    assert_true(fabs(specd_accept_calib_yield(&c, 16) - 0.75) < 0.01);
    assert_true(specd_accept_calib_yield(&c, 1) == 0.0);
    /* a plain step (no nodes) moves nothing but the fading */
    specd_accept_calib_note_sent(&c, 16, 0.0, 0, 0);
    assert_true(fabs(specd_accept_calib_yield(&c, 16) - 0.75) < 0.01);
    specd_accept_calib_destroy(&c);
}

/* The others' trees raise the bar: on a pass whose rows cost the same each
 * (a CPU under load), a node that pays against the others' pending tokens
 * alone does not once their nodes' expected tokens count, since the pass's
 * time buys those too. */
static void test_others_expected(void **state) {
    (void)state;
    /* 16 sessions, 48 other rows (15 pending + 33 nodes), 1 ms a row */
    specd_tree_price pr = linear_price(2000, 1000, 0);
    pr.sessions = 16;
    pr.other_tokens = 48;
    float p[1] = {0.5f};
    int32_t depth[1] = {1};
    uint8_t keep[1];
    specd_tree_pick pick;
    specd_tree_choose(p, depth, NULL, 1, &pr, keep, &pick);
    /* 16 / 51 ms against 16.5 / 52 ms: the node "pays" */
    assert_int_equal(pick.n_keep, 1);
    assert_true(specd_tree_could_pay(0.5f, &pr));
    pr.other_expected = 33 * 0.75; /* their nodes accept 3 in 4 */
    specd_tree_choose(p, depth, NULL, 1, &pr, keep, &pick);
    assert_int_equal(pick.n_keep, 0); /* 40.75 / 51 ms beats 41.25 / 52 ms */
    assert_int_equal(keep[0], 0);
    assert_false(specd_tree_could_pay(0.5f, &pr));
    assert_true(fabs(specd_tree_base_tokens(&pr) - (16 + 33 * 0.75)) < 1e-12);
    /* a sure node still pays: 41.75 / 52 ms */
    p[0] = 1.0f;
    specd_tree_choose(p, depth, NULL, 1, &pr, keep, &pick);
    assert_int_equal(pick.n_keep, 1);
}

static void test_prune(void **state) {
    (void)state;
    specd_tree_buf t;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&t, 8, 0, &err), 0);
    /*   0 -> 2 -> 4 ; 1 -> 3 -> 5 */
    specd_tree_buf_add(&t, -1, 100, -0.1f);
    specd_tree_buf_add(&t, -1, 101, -0.2f);
    specd_tree_buf_add(&t, 0, 102, -0.3f);
    specd_tree_buf_add(&t, 1, 103, -0.4f);
    specd_tree_buf_add(&t, 2, 104, -0.5f);
    specd_tree_buf_add(&t, 3, 105, -0.6f);
    t.pcond[2] = 0.7f;
    t.src[4] = SPECD_SRC_LOOKUP;
    uint8_t keep[6] = {1, 0, 1, 0, 1, 1}; /* 5 is chosen but 3 is not */
    assert_int_equal(specd_tree_buf_prune(&t, keep), 3);
    int32_t want_tok[] = {100, 102, 104}, want_par[] = {-1, 0, 1}, want_depth[] = {1, 2, 3};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(t.tokens[i], want_tok[i]);
        assert_int_equal(t.parents[i], want_par[i]);
        assert_int_equal(t.depth[i], want_depth[i]);
    }
    assert_true(t.pcond[1] == 0.7f && t.pcond[0] == -1.0f);
    assert_true(t.src[2] == SPECD_SRC_LOOKUP && t.src[0] == SPECD_SRC_MODEL);
    specd_tree_buf_free(&t);
}

static void test_parse_shape(void **state) {
    (void)state;
    specd_policy p;
    memset(&p, 0, sizeof p);
    specd_error err = {{0}};
    assert_int_equal(specd_policy_parse_shape(&p, "4x6", "speculation.max_shape", &err), 0);
    assert_int_equal(p.max_candidates, 4);
    assert_int_equal(p.max_depth, 6);
    assert_int_equal(specd_policy_parse_shape(&p, "4y6", "speculation.max_shape", &err), -1);
    assert_non_null(strstr(err.msg, "speculation.max_shape"));
    assert_int_equal(specd_policy_parse_shape(&p, "0x6", "speculation.max_shape", &err), -1);
    assert_int_equal(specd_policy_parse_shape(&p, "4x6 ", "speculation.max_shape", &err), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid),
        cmocka_unit_test(test_interpolation),
        cmocka_unit_test(test_observe),
        cmocka_unit_test(test_observe_far_points_follow),
        cmocka_unit_test(test_choose_brute_force),
        cmocka_unit_test(test_choose_cases),
        cmocka_unit_test(test_calibration),
        cmocka_unit_test(test_calibration_top_bins),
        cmocka_unit_test(test_ranks_and_tries),
        cmocka_unit_test(test_gain_by_load),
        cmocka_unit_test(test_stage_time),
        cmocka_unit_test(test_could_pay),
        cmocka_unit_test(test_stale_small_points),
        cmocka_unit_test(test_sources),
        cmocka_unit_test(test_sent_bias),
        cmocka_unit_test(test_sent_yield),
        cmocka_unit_test(test_others_expected),
        cmocka_unit_test(test_break_even),
        cmocka_unit_test(test_plain_runs),
        cmocka_unit_test(test_run_pays),
        cmocka_unit_test(test_other_rows),
        cmocka_unit_test(test_prune),
        cmocka_unit_test(test_parse_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
