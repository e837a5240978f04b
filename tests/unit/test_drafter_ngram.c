/* test_drafter_ngram.c - prompt lookup decoding (draft-svc/drafter_ngram.c)
 * without a session (its suffix-decoding mode: test_suffix_tree.c):
 * what it finds, how it ranks and merges matches into a tree, how it stays
 * inside the tree buffer, the sampling-mode chain with one-hot q, and that
 * it never looks further back than max_scan or before the history's start. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "draft-svc/drafter.h"

enum { VOCAB = 100 };

typedef struct fixture {
    specd_drafter *d;
    specd_tree_buf out;
    specd_sampling greedy, sampled;
} fixture;

static specd_drafter *make_drafter(int min_n, int max_n, int max_scan) {
    specd_error err = {{0}};
    specd_ngram_drafter_opts o = {.vocab = VOCAB, .min_n = min_n, .max_n = max_n,
                                  .max_scan = max_scan};
    specd_drafter *d = specd_ngram_drafter_create(&o, &err);
    if (!d) fail_msg("create: %s", err.msg);
    return d;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->d = make_drafter(1, 4, 8192);
    specd_error err = {{0}};
    if (specd_tree_buf_init(&f->out, 64, 64, &err)) fail_msg("%s", err.msg);
    specd_sampling_init(&f->greedy);
    f->greedy.temperature = 0.0f;
    specd_sampling_init(&f->sampled);
    f->sampled.temperature = 0.7f;
    f->sampled.method = SPECD_SAMPLING_REJECTION; /* q-carrying trees */
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    specd_drafter_free(f->d);
    specd_tree_buf_free(&f->out);
    free(f);
    return 0;
}

/* One job on drafter d; leaves the tree in out and checks it is a valid
 * wire tree whenever it is non-empty. */
static void run(specd_drafter *d, specd_tree_buf *out, const specd_sampling *s,
                const int32_t *h, int n, int candidates, int depth) {
    specd_tree_buf_reset(out);
    specd_draft_job job = {.history = h, .n_history = n, .n_prompt = n, .sampling = s,
                           .candidates = candidates, .depth = depth, .out = out};
    specd_error err = {{0}};
    assert_int_equal(specd_drafter_propose(d, &job, 1, &err), 0);
    if (out->n_nodes > 0) {
        specd_tree view;
        int sampling = s->temperature > 0.0f;
        specd_tree_buf_view(out, sampling, &view);
        if (specd_tree_validate(&view, VOCAB, out->cap, sampling, &err))
            fail_msg("invalid tree: %s", err.msg);
    }
    for (int i = 0; i < out->n_nodes; i++) assert_true(out->depth[i] <= depth);
}

/* Nodes with parent p, in index order, into kids[]; returns their count. */
static int children(const specd_tree_buf *b, int p, int *kids) {
    int n = 0;
    for (int i = 0; i < b->n_nodes; i++)
        if (b->parents[i] == p) kids[n++] = i;
    return n;
}

static int n_leaves(const specd_tree_buf *b) {
    int kids[64], leaves = 0;
    for (int i = 0; i < b->n_nodes; i++)
        if (children(b, i, kids) == 0) leaves++;
    return leaves;
}

static void assert_chain(const specd_tree_buf *b, const int32_t *want, int n) {
    assert_int_equal(b->n_nodes, n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(b->tokens[i], want[i]);
        assert_int_equal(b->parents[i], i - 1);
    }
}

static void test_match_found(void **state) {
    fixture *f = *state;
    /* "1 2 3" occurred before; what followed was "4 5 9" */
    const int32_t h[] = {1, 2, 3, 4, 5, 9, 9, 1, 2, 3};
    run(f->d, &f->out, &f->greedy, h, 10, 1, 3);
    const int32_t want[] = {4, 5, 9};
    assert_chain(&f->out, want, 3);
    /* the continuation runs on to the end of the history if depth allows */
    run(f->d, &f->out, &f->greedy, h, 10, 1, 20);
    const int32_t all[] = {4, 5, 9, 9, 1, 2, 3};
    assert_chain(&f->out, all, 7);
}

static void test_no_match(void **state) {
    fixture *f = *state;
    const int32_t h[] = {1, 2, 3, 4, 5, 6, 7, 8};
    run(f->d, &f->out, &f->greedy, h, 8, 3, 4);
    assert_int_equal(f->out.n_nodes, 0);
    /* min_n 2: a single-token match is not enough */
    specd_drafter *d2 = make_drafter(2, 4, 8192);
    const int32_t h2[] = {7, 1, 2, 8, 3, 1};
    run(d2, &f->out, &f->greedy, h2, 6, 3, 4);
    assert_int_equal(f->out.n_nodes, 0);
    /* ...but "1" alone is enough at min_n 1 */
    run(f->d, &f->out, &f->greedy, h2, 6, 1, 1);
    assert_int_equal(f->out.n_nodes, 1);
    assert_int_equal(f->out.tokens[0], 2);
    specd_drafter_free(d2);
}

static void test_longest_n_preferred(void **state) {
    fixture *f = *state;
    /* suffix "7 3": "7 3" -> 40 (n = 2, older), "8 3" -> 50 (n = 1, newer) */
    const int32_t h[] = {7, 3, 40, 41, 8, 3, 50, 51, 7, 3};
    run(f->d, &f->out, &f->greedy, h, 10, 1, 2);
    const int32_t want[] = {40, 41};
    assert_chain(&f->out, want, 2);
    /* two candidates: the longer match still first (node 0), the other a
     * sibling */
    run(f->d, &f->out, &f->greedy, h, 10, 2, 2);
    int kids[64];
    assert_int_equal(children(&f->out, -1, kids), 2);
    assert_int_equal(f->out.tokens[kids[0]], 40);
    assert_int_equal(f->out.tokens[kids[1]], 50);
    assert_int_equal(n_leaves(&f->out), 2);
    /* max_n 1: only single tokens count, so recency decides: 50 */
    specd_drafter *d1 = make_drafter(1, 1, 8192);
    run(d1, &f->out, &f->greedy, h, 10, 1, 1);
    assert_int_equal(f->out.n_nodes, 1);
    assert_int_equal(f->out.tokens[0], 50);
    specd_drafter_free(d1);
}

static void test_siblings_by_recency(void **state) {
    fixture *f = *state;
    /* "9" was followed by 11, 12, 13 (oldest to newest) */
    const int32_t h[] = {9, 11, 1, 9, 12, 2, 9, 13, 3, 9};
    run(f->d, &f->out, &f->greedy, h, 10, 3, 2);
    int kids[64];
    assert_int_equal(children(&f->out, -1, kids), 3);
    assert_int_equal(f->out.tokens[kids[0]], 13);
    assert_int_equal(f->out.tokens[kids[1]], 12);
    assert_int_equal(f->out.tokens[kids[2]], 11);
    assert_int_equal(n_leaves(&f->out), 3);
    assert_int_equal(f->out.n_nodes, 6);
    /* candidates caps the paths: the two most recent */
    run(f->d, &f->out, &f->greedy, h, 10, 2, 2);
    assert_int_equal(children(&f->out, -1, kids), 2);
    assert_int_equal(f->out.tokens[kids[0]], 13);
    assert_int_equal(f->out.tokens[kids[1]], 12);
}

static void test_shared_prefix_merged(void **state) {
    fixture *f = *state;
    /* "5" -> "20 21" and "5" -> "20 22": one node 20 with two children */
    const int32_t h[] = {5, 20, 21, 0, 5, 20, 22, 0, 5};
    run(f->d, &f->out, &f->greedy, h, 9, 3, 2);
    int kids[64];
    assert_int_equal(children(&f->out, -1, kids), 1);
    int n20 = kids[0];
    assert_int_equal(f->out.tokens[n20], 20);
    assert_int_equal(children(&f->out, n20, kids), 2);
    assert_int_equal(f->out.tokens[kids[0]], 22); /* newer first */
    assert_int_equal(f->out.tokens[kids[1]], 21);
    assert_int_equal(f->out.n_nodes, 3);
    assert_int_equal(n_leaves(&f->out), 2);
}

static void test_duplicates_and_extensions_add_no_path(void **state) {
    fixture *f = *state;
    /* the same continuation "20 21" twice: one path, then the third match
     * ("30 0") is the second candidate */
    const int32_t h[] = {5, 30, 0, 5, 20, 21, 5, 20, 21, 5};
    run(f->d, &f->out, &f->greedy, h, 10, 2, 2);
    assert_int_equal(n_leaves(&f->out), 2);
    assert_int_equal(f->out.n_nodes, 4);
    assert_int_equal(f->out.tokens[0], 20);
    assert_int_equal(f->out.tokens[2], 30);
    /* periodic text: the newest match's continuation is cut by the end of
     * the history ("1 2"); the older one extends it ("1 2 1 2"), which is
     * the same path made longer, not a second candidate */
    const int32_t p[] = {1, 2, 1, 2, 1, 2};
    run(f->d, &f->out, &f->greedy, p, 6, 2, 4);
    const int32_t want[] = {1, 2, 1, 2};
    assert_chain(&f->out, want, 4);
}

static void test_depth_cap(void **state) {
    fixture *f = *state;
    const int32_t h[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1};
    for (int depth = 1; depth <= 12; depth++) {
        run(f->d, &f->out, &f->greedy, h, 11, 1, depth);
        int want = depth < 10 ? depth : 10; /* 2..10 then the pending 1 */
        assert_int_equal(f->out.n_nodes, want);
        assert_int_equal(f->out.tokens[0], 2);
    }
}

static void test_tree_capacity(void **state) {
    fixture *f = *state;
    const int32_t h[] = {9, 11, 1, 9, 12, 2, 9, 13, 3, 9};
    for (int cap = 1; cap <= 7; cap++) {
        specd_tree_buf small;
        specd_error err = {{0}};
        assert_int_equal(specd_tree_buf_init(&small, cap, 8, &err), 0);
        run(f->d, &small, &f->greedy, h, 10, 3, 2);
        assert_int_equal(small.n_nodes, cap < 6 ? cap : 6);
        assert_int_equal(small.tokens[0], 13); /* the best path comes first */
        run(f->d, &small, &f->sampled, h, 10, 3, 3);
        assert_int_equal(small.n_nodes, cap < 3 ? cap : 3);
        specd_tree_buf_free(&small);
    }
    /* a q pool too small for the chain shortens it; every non-leaf keeps
     * its q */
    specd_tree_buf tiny_pool;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&tiny_pool, 16, 2, &err), 0);
    run(f->d, &tiny_pool, &f->sampled, h, 10, 1, 3);
    assert_int_equal(tiny_pool.n_nodes, 2);
    specd_tree_buf_free(&tiny_pool);
}

static void test_sampling_chain_one_hot(void **state) {
    fixture *f = *state;
    const int32_t h[] = {9, 11, 1, 9, 12, 2, 9, 13, 3, 9};
    run(f->d, &f->out, &f->sampled, h, 10, 3, 3);
    /* one chain (candidates ignored), the best-ranked continuation */
    const int32_t want[] = {13, 3, 9};
    assert_chain(&f->out, want, 3);
    /* q[0] (the pending token's) and every non-leaf's: {child: 1} */
    for (int i = -1; i < 2; i++) {
        const specd_sparse_dist *q = &f->out.q[i + 1];
        assert_int_equal(q->n, 1);
        assert_int_equal(q->ids[0], f->out.tokens[i + 1]);
        assert_true(q->probs[0] == 1.0f);
    }
    assert_int_equal(f->out.q[3].n, 0); /* the leaf has none */
    for (int i = 0; i < 3; i++) assert_true(f->out.logq[i] == 0.0f);
    /* no match: empty tree, no q */
    const int32_t none[] = {1, 2, 3};
    run(f->d, &f->out, &f->sampled, none, 3, 3, 3);
    assert_int_equal(f->out.n_nodes, 0);
    assert_int_equal(f->out.q[0].n, 0);
}

static void test_short_histories(void **state) {
    fixture *f = *state;
    /* exact-size heap copies, so a read past either end is caught by ASan */
    for (int n = 0; n <= 3; n++) {
        int32_t *h = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
        for (int i = 0; i < n; i++) h[i] = 7;
        run(f->d, &f->out, &f->greedy, n ? h : NULL, n, 3, 4);
        /* n tokens of "7": the newest match starts at the pending token */
        assert_int_equal(f->out.n_nodes, n < 2 ? 0 : n - 1);
        free(h);
    }
    /* a match that starts at h[0]: the n-gram is cut at the history's
     * start, not read before it */
    int32_t *h = malloc(sizeof(int32_t) * 3);
    h[0] = 4;
    h[1] = 6;
    h[2] = 4;
    run(f->d, &f->out, &f->greedy, h, 3, 1, 2);
    const int32_t want[] = {6, 4};
    assert_chain(&f->out, want, 2);
    free(h);
}

static void test_max_scan_bound(void **state) {
    fixture *f = *state;
    /* the only earlier "42" sits 100 tokens back */
    int n = 120;
    int32_t *h = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) h[i] = i % 40 + 50; /* 50..89, no 42 */
    h[n - 101] = 42;
    h[n - 100] = 43;
    h[n - 1] = 42;
    specd_drafter *near = make_drafter(1, 4, 99), *far = make_drafter(1, 4, 100);
    run(near, &f->out, &f->greedy, h, n, 1, 1);
    assert_int_equal(f->out.n_nodes, 0);
    run(far, &f->out, &f->greedy, h, n, 1, 1);
    assert_int_equal(f->out.n_nodes, 1);
    assert_int_equal(f->out.tokens[0], 43);
    specd_drafter_free(near);
    specd_drafter_free(far);
    free(h);
}

static void test_out_of_vocab_truncates(void **state) {
    fixture *f = *state;
    const int32_t h[] = {3, 4, 5000, 6, 3};
    run(f->d, &f->out, &f->greedy, h, 5, 1, 3);
    assert_int_equal(f->out.n_nodes, 1);
    assert_int_equal(f->out.tokens[0], 4);
}

static void test_batch_and_defaults(void **state) {
    fixture *f = *state;
    assert_string_equal(f->d->ops->name, "ngram");
    assert_int_equal(f->d->vocab, VOCAB);
    assert_int_equal(f->d->hidden_size, 0);
    /* a session holds the request's suffix tree (test_suffix_tree.c);
     * the jobs below run without one: the stateless lookup */
    void *st = NULL;
    specd_error err = {{0}};
    assert_int_equal(specd_drafter_session_open(f->d, &st, &err), 0);
    assert_non_null(st);
    specd_drafter_session_close(f->d, st);
    /* several jobs in one call, each its own tree */
    const int32_t a[] = {1, 2, 3, 1}, b[] = {5, 6, 5};
    specd_tree_buf o2;
    assert_int_equal(specd_tree_buf_init(&o2, 8, 0, &err), 0);
    specd_tree_buf_reset(&f->out);
    specd_draft_job jobs[2] = {
        {.history = a, .n_history = 4, .sampling = &f->greedy, .candidates = 1, .depth = 2,
         .out = &f->out},
        {.history = b, .n_history = 3, .sampling = &f->greedy, .candidates = 1, .depth = 2,
         .out = &o2}};
    assert_int_equal(specd_drafter_propose(f->d, jobs, 2, &err), 0);
    assert_int_equal(f->out.n_nodes, 2);
    assert_int_equal(f->out.tokens[0], 2);
    assert_int_equal(o2.n_nodes, 2);
    assert_int_equal(o2.tokens[0], 6);
    specd_tree_buf_free(&o2);
    /* option checks */
    specd_ngram_drafter_opts bad = {.vocab = 0};
    assert_null(specd_ngram_drafter_create(&bad, &err));
    assert_non_null(strstr(err.msg, "vocab"));
    bad = (specd_ngram_drafter_opts){.vocab = 10, .min_n = 3, .max_n = 2};
    assert_null(specd_ngram_drafter_create(&bad, &err));
    assert_non_null(strstr(err.msg, "min_n"));
    bad = (specd_ngram_drafter_opts){.vocab = 10, .max_scan = -1};
    assert_null(specd_ngram_drafter_create(&bad, &err));
    /* min_n above the default max_n lifts max_n with it */
    specd_ngram_drafter_opts lifted = {.vocab = 10, .min_n = 6};
    specd_drafter *d = specd_ngram_drafter_create(&lifted, &err);
    assert_non_null(d);
    specd_drafter_free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_match_found, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_match, setup, teardown),
        cmocka_unit_test_setup_teardown(test_longest_n_preferred, setup, teardown),
        cmocka_unit_test_setup_teardown(test_siblings_by_recency, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_prefix_merged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicates_and_extensions_add_no_path, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_depth_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tree_capacity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sampling_chain_one_hot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short_histories, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_scan_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_vocab_truncates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_and_defaults, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
