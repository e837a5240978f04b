/* test_tree_builder.c - the candidate tree buffer, beam selection, the
 * sampling-mode shape, top-k, and the draft-q truncation. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/spec/sampling.h"
#include "draft-svc/tree_builder.h"

static void test_buf_add_view_reset(void **state) {
    (void)state;
    specd_tree_buf b;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&b, 3, 5, &err), 0);
    assert_int_equal(specd_tree_buf_add(&b, -1, 5, -0.1f), 0);
    assert_int_equal(specd_tree_buf_add(&b, 0, 6, -0.3f), 1);
    assert_int_equal(specd_tree_buf_add(&b, 2, 7, -0.3f), -1); /* parent not yet a node */
    assert_int_equal(specd_tree_buf_add(&b, -1, 8, -0.2f), 2);
    assert_int_equal(specd_tree_buf_add(&b, -1, 9, -0.2f), -1); /* full */
    assert_int_equal(b.depth[1], 2);
    int32_t ids[2] = {5, 8};
    float pr[2] = {0.5f, 0.5f};
    assert_int_equal(specd_tree_buf_set_q(&b, -1, ids, pr, 2), 0);
    int32_t ids0[2] = {6, 7}; /* node 0's child is token 6 */
    assert_int_equal(specd_tree_buf_set_q(&b, 0, ids0, pr, 2), 0);
    assert_int_equal(specd_tree_buf_set_q(&b, 1, ids, pr, 2), -1); /* 2 + 2 + 2 > pool of 5 */
    assert_int_equal(specd_tree_buf_set_q(&b, 1, ids, pr, 1), 0);
    assert_int_equal(specd_tree_buf_set_q(&b, 1, ids, pr, 1), -1); /* pool exhausted */
    specd_tree t;
    specd_tree_buf_view(&b, 1, &t);
    assert_int_equal(t.n_nodes, 3);
    assert_int_equal(t.q[0].n, 2);
    assert_int_equal(t.q[1].n, 2);
    assert_int_equal(t.q[2].n, 1);
    assert_int_equal(specd_tree_validate(&t, 10, 3, 1, &err), 0);
    specd_tree_buf_view(&b, 0, &t);
    assert_null(t.q);
    specd_tree_buf_reset(&b);
    assert_int_equal(b.n_nodes, 0);
    assert_int_equal(b.q[0].n, 0);
    assert_int_equal(b.q_pool_used, 0);
    specd_tree_buf_free(&b);
}

static void test_beam_select(void **state) {
    (void)state;
    float v[6] = {-1.0f, -0.5f, -2.0f, -0.5f, -3.0f, -0.1f};
    uint8_t keep[6];
    assert_int_equal(specd_tree_beam_select(v, 6, 3, keep), 3);
    uint8_t want[6] = {0, 1, 0, 1, 0, 1};
    assert_memory_equal(keep, want, 6);
    /* ties at the boundary go to the lower index */
    assert_int_equal(specd_tree_beam_select(v, 6, 2, keep), 2);
    uint8_t want2[6] = {0, 1, 0, 0, 0, 1};
    assert_memory_equal(keep, want2, 6);
    assert_int_equal(specd_tree_beam_select(v, 6, 10, keep), 6);
}

static void test_sampling_branching(void **state) {
    (void)state;
    int br[64];
    assert_int_equal(specd_tree_sampling_branching(4, 5, 64, br), 5);
    assert_int_equal(br[0], 4);
    for (int d = 1; d < 5; d++) assert_int_equal(br[d], 1);
    /* 4 chains of 5 do not fit 12 nodes: 2 chains of 5 */
    assert_int_equal(specd_tree_sampling_branching(4, 5, 12, br), 5);
    assert_int_equal(br[0], 2);
    /* not even one chain fits: a shorter single chain */
    assert_int_equal(specd_tree_sampling_branching(3, 8, 5, br), 5);
    assert_int_equal(br[0], 1);
    assert_int_equal(specd_tree_sampling_branching(3, 8, 0, br), 0);
}

static void test_topk(void **state) {
    (void)state;
    float x[8] = {0.1f, 0.7f, NAN, 0.7f, 0.2f, -1.0f, 0.9f, 0.2f};
    int32_t ids[8];
    float vals[8];
    assert_int_equal(specd_topk(x, 8, 4, ids, vals), 4);
    int32_t want[4] = {6, 1, 3, 4};
    assert_memory_equal(ids, want, sizeof want);
    assert_int_equal(specd_topk(x, 8, 100, ids, vals), 7); /* NaN never ranks */
    assert_int_equal(ids[6], 5);
    assert_int_equal(specd_topk(x, 8, 0, ids, vals), 0);
}

/* q cut to its SPECD_DRAFT_Q_MAX most likely tokens, renormalized, in id
 * order; and a draw from the sparse q is the draw from the dense one. */
static void test_q_sparse(void **state) {
    (void)state;
    enum { V = 1000 };
    float p[V], orig[V];
    int32_t ids[SPECD_DRAFT_Q_MAX];
    float sp[SPECD_DRAFT_Q_MAX];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += (orig[i] = 1.0f / (float)(1 + (i * 7919) % V));
    for (int i = 0; i < V; i++) p[i] = orig[i] = (float)(orig[i] / sum);
    int n = specd_draft_q_sparse(p, V, NULL, ids, sp);
    assert_int_equal(n, SPECD_DRAFT_Q_MAX);
    assert_memory_equal(p, orig, sizeof p); /* the input stays as it was */
    double s = 0, kept_min = 1, dropped_max = 0;
    uint8_t kept[V] = {0};
    for (int j = 0; j < n; j++) {
        s += sp[j];
        if (j) assert_true(ids[j - 1] < ids[j]);
        kept[ids[j]] = 1;
        if (orig[ids[j]] < kept_min) kept_min = orig[ids[j]];
    }
    assert_true(fabs(s - 1.0) < 1e-5);
    for (int i = 0; i < V; i++)
        if (!kept[i] && orig[i] > dropped_max) dropped_max = orig[i];
    assert_true(dropped_max <= kept_min);

    /* The dense truncated q, target-width, and the sparse one draw the same
     * token for every u (the walk's sums are the same). */
    float dense[V] = {0};
    for (int j = 0; j < n; j++) dense[ids[j]] = sp[j];
    for (int k = 0; k < 20000; k++) {
        double u = (k + 0.5) / 20000.0;
        int j = specd_sample_from_probs(sp, n, u);
        assert_int_equal(ids[j], specd_sample_from_probs(dense, V, u));
    }
    assert_int_equal(ids[specd_sample_from_probs(sp, n, 0.0)], specd_sample_from_probs(dense, V, 0.0));
    assert_int_equal(ids[specd_sample_from_probs(sp, n, 1.0)], specd_sample_from_probs(dense, V, 1.0));

    /* a small support passes through, ids ascending */
    float small[6] = {0, 0.25f, 0, 0.5f, 0.25f, 0};
    n = specd_draft_q_sparse(small, 6, NULL, ids, sp);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[2], 4);
    assert_true(sp[1] == 0.5f);
    /* through a draft-id map (reversing the order), still ascending by
     * target id; the unmapped entry has probability 0 and is left out */
    const int32_t map[6] = {50, 40, -1, 30, 20, 10};
    float mapped[6] = {0.125f, 0.25f, 0, 0.5f, 0.125f, 0};
    n = specd_draft_q_sparse(mapped, 6, map, ids, sp);
    assert_int_equal(n, 4);
    const int32_t want_ids[4] = {20, 30, 40, 50};
    const float want_p[4] = {0.125f, 0.5f, 0.25f, 0.125f};
    for (int j = 0; j < 4; j++) {
        assert_int_equal(ids[j], want_ids[j]);
        assert_true(sp[j] == want_p[j]);
    }
    float zero[3] = {0, 0, 0};
    assert_int_equal(specd_draft_q_sparse(zero, 3, NULL, ids, sp), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buf_add_view_reset), cmocka_unit_test(test_beam_select),
        cmocka_unit_test(test_sampling_branching), cmocka_unit_test(test_topk),
        cmocka_unit_test(test_q_sparse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
