/* test_golden.c - our forward pass against Hugging Face transformers.
 *
 * For every fixture set under tests/golden/data/ (made offline by
 * tests/golden/make_golden.py; see tests/golden/README.md) and every case in
 * it: load the case's model file (HF safetensors directory or GGUF in
 * F32/F16/BF16/Q8_0/Q4_1), prefill the prompt in one call, and require
 *   - logits within the set's tolerance (1e-4 relative to the row scale for
 *     fp32 on identical weights; the README explains the rule),
 *   - the post-norm hidden state within tolerance,
 *   - the 64-token greedy continuation identical, token for token.
 * The real model's set (smollm2) needs models/ from scripts/fetch_model.sh;
 * without it those cases are skipped with a message, never silently. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sampling.h"
#include "target-svc/transformer.h"
#include "tests/golden/golden.h"
#include "tests/test_util.h"

static int g_cases_run, g_cases_skipped;

/* Prefills c->prompt, compares logits and hidden state, then decodes greedily
 * and compares the continuation. */
static void check_case(const golden_set *g, const golden_case *c) {
    specd_error err = {{0}};
    if (!test_file_exists(c->model_path)) {
        printf("  SKIP %s/%s: %s not present (run scripts/fetch_model.sh)\n", g->model, c->name,
               c->model_path);
        g_cases_skipped++;
        return;
    }
    specd_model_file *m = specd_model_open(c->model_path, &err);
    if (!m) fail_msg("%s: open %s: %s", c->name, c->model_path, err.msg);
    int vocab = m->hp.vocab_size, dim = m->hp.dim, n = c->n_prompt;
    assert_int_equal(vocab, g->config.vocab_size);
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 2}, .n_slots = 1,
                                .max_ctx = n + c->n_greedy + 1, .max_batch = n};
    specd_transformer *t = specd_transformer_create(m, &o, &err);
    if (!t) fail_msg("%s: %s", c->name, err.msg);

    /* rows the fixture has: every prompt position, or just the last */
    int all = c->logits.present && c->logits.positions == GOLDEN_POS_ALL;
    int n_rows = all ? n : 1;
    int32_t *rows = malloc(sizeof(int32_t) * n_rows);
    for (int i = 0; i < n_rows; i++) rows[i] = all ? i : n - 1;
    float *logits = malloc(sizeof(float) * n_rows * vocab);
    float *hidden = malloc(sizeof(float) * n_rows * dim);
    specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = n};
    specd_batch b = {.n_tokens = n, .tokens = c->prompt, .n_seqs = 1, .seqs = &in,
                     .n_out = n_rows, .out_rows = rows, .logits = logits, .hidden = hidden};
    if (specd_transformer_forward(t, &b, &err)) fail_msg("%s: forward: %s", c->name, err.msg);

    if (c->logits.present) {
        float *ref = golden_load_array(&c->logits, &err);
        if (!ref) fail_msg("%s: %s", c->name, err.msg);
        assert_int_equal(c->logits.rows, n_rows);
        golden_diff d = golden_compare(logits, ref, n_rows, vocab);
        if (!golden_within(&d, g->logits_rel))
            fail_msg("%s: logits differ: max |diff| %.3g at %zu, max |ref| %.3g, tolerance %.1g "
                     "relative; argmax mismatches %d",
                     c->name, d.max_abs, d.worst, d.max_ref, (double)g->logits_rel,
                     d.argmax_mismatches);
        free(ref);
    }
    if (c->hidden.present) {
        float *ref = golden_load_array(&c->hidden, &err);
        if (!ref) fail_msg("%s: %s", c->name, err.msg);
        int hrows = c->hidden.rows;
        /* the hidden fixture may cover all positions or only the last */
        const float *got = hrows == n_rows ? hidden : hidden + (size_t)(n_rows - 1) * dim;
        golden_diff d = golden_compare(got, ref, hrows, dim);
        if (!golden_within(&d, g->hidden_rel))
            fail_msg("%s: hidden state differs: max |diff| %.3g, max |ref| %.3g", c->name,
                     d.max_abs, d.max_ref);
        free(ref);
    }

    /* greedy continuation, one token per step, no EOS stop */
    int32_t *out = malloc(sizeof(int32_t) * (c->n_greedy + 1));
    int32_t next = specd_argmax(logits + (size_t)(n_rows - 1) * vocab, vocab), zero = 0;
    for (int s = 0; s < c->n_greedy; s++) {
        out[s] = next;
        if (s + 1 == c->n_greedy) break;
        in = (specd_seq_input){.slot = 0, .n_past = n + s, .n_new = 1};
        b = (specd_batch){.n_tokens = 1, .tokens = &next, .n_seqs = 1, .seqs = &in, .n_out = 1,
                          .out_rows = &zero, .logits = logits};
        if (specd_transformer_forward(t, &b, &err)) fail_msg("%s: decode: %s", c->name, err.msg);
        next = specd_argmax(logits, vocab);
    }
    int diff = golden_greedy_first_diff(c, out, c->n_greedy);
    if (diff >= 0)
        fail_msg("%s: greedy continuation differs at step %d: got %d, reference %d (reference "
                 "top1-top2 margin there %.3g)",
                 c->name, diff, out[diff], c->greedy[diff],
                 c->greedy_margins ? (double)c->greedy_margins[diff] : -1.0);
    g_cases_run++;
    free(out);
    free(rows);
    free(logits);
    free(hidden);
    specd_transformer_free(t);
    specd_model_close(m);
}

static void run_set(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", test_path("tests/golden/data"));
    size_t len = strlen(dir);
    snprintf(dir + len, sizeof dir - len, "/%s", name);
    specd_error err = {{0}};
    golden_set *g = golden_load(dir, &err);
    if (!g) fail_msg("golden set %s: %s", name, err.msg);
    for (int i = 0; i < g->n_cases; i++) check_case(g, &g->cases[i]);
    golden_free(g);
}

static void test_tiny_gqa(void **state) {
    (void)state;
    run_set("tiny-gqa");
}

static void test_tiny_tied(void **state) {
    (void)state;
    run_set("tiny-tied");
}

static void test_smollm2(void **state) {
    (void)state;
    run_set("smollm2");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_gqa),
        cmocka_unit_test(test_tiny_tied),
        cmocka_unit_test(test_smollm2),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    printf("golden: %d cases compared, %d skipped\n", g_cases_run, g_cases_skipped);
    return rc;
}
