/* test_verify.c - greedy tree verification is lossless (also with
 * repetition / frequency / presence penalties and logit bias, applied along
 * each path), log-probabilities do not depend on speculation, and bad trees
 * are refused with a message naming the field.
 *
 * Losslessness: for a model, plain greedy decoding gives a reference
 * continuation. Then a speculative loop feeds the verifier trees of every
 * kind (all-correct chains, all-wrong, random, correct paths hidden among
 * wrong siblings) and must reproduce the reference token for token, while
 * the KV cache keeps only accepted paths. Runs on the tiny golden models and,
 * when models/ has it, on the default model. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model/transformer.h"
#include "common/spec/verify.h"
#include "tests/harness/test_util.h"

#define MAX_NODES 24
#define TOP_N 5 /* alternatives per token in the logprob comparison */

typedef struct session {
    specd_transformer *t;
    int vocab;
    const specd_sampling *sp; /* greedy, maybe with penalties / bias */
    specd_token_counts counts; /* prompt + emitted (pending included) */
    int n_past;        /* cache rows */
    int32_t pending;   /* target's last token, not yet in the cache */
    int32_t *out;      /* emitted tokens */
    specd_token_logprob *lps; /* their log-probabilities */
    int n_out;
    void *scratch;
    int steps;
} session;

static specd_transformer *open_model(const char *path, specd_model_file **m, int ctx) {
    specd_error err = {{0}};
    *m = specd_model_open(path, &err);
    if (!*m) fail_msg("%s: %s", path, err.msg);
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 2}, .n_slots = 1,
                                .max_ctx = ctx, .max_batch = 64};
    specd_transformer *t = specd_transformer_create(*m, &o, &err);
    if (!t) fail_msg("%s", err.msg);
    return t;
}

/* The prompt as penalty history (all of it prompt, nothing generated). */
static void counts_of_prompt(specd_token_counts *c, int vocab, const int32_t *prompt,
                             int n_prompt) {
    specd_error err = {{0}};
    if (specd_token_counts_init(c, vocab, &err)) fail_msg("%s", err.msg);
    for (int i = 0; i < n_prompt; i++) specd_token_counts_add(c, prompt[i], 0);
}

/* Plain decoding: prefill then one token per step, each drawn the way
 * Target.Generate draws it (specd_decode_token: penalties over prompt +
 * output, then argmax), with the log-probabilities of the raw row. */
static void plain_decode(specd_transformer *t, int vocab, const specd_sampling *sp,
                         const int32_t *prompt, int n_prompt, int n_gen, int32_t *out,
                         specd_token_logprob *lps) {
    specd_error err = {{0}};
    float *logits = malloc(sizeof(float) * vocab);
    void *scratch = malloc(specd_verify_scratch_size(vocab, 0));
    specd_token_counts counts;
    counts_of_prompt(&counts, vocab, prompt, n_prompt);
    int32_t last = n_prompt - 1;
    specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = n_prompt};
    specd_batch b = {.n_tokens = n_prompt, .tokens = prompt, .n_seqs = 1, .seqs = &in,
                     .n_out = 1, .out_rows = &last, .logits = logits};
    assert_int_equal(specd_transformer_forward(t, &b, &err), 0);
    for (int g = 0; g < n_gen; g++) {
        out[g] = specd_decode_token(logits, vocab, sp, &counts, (uint64_t)g, scratch);
        specd_token_logprob_fill(&lps[g], logits, vocab, out[g], TOP_N);
        specd_token_counts_add(&counts, out[g], 1);
        int32_t zero = 0;
        in = (specd_seq_input){.slot = 0, .n_past = n_prompt + g, .n_new = 1};
        b = (specd_batch){.n_tokens = 1, .tokens = &out[g], .n_seqs = 1, .seqs = &in, .n_out = 1,
                          .out_rows = &zero, .logits = logits};
        assert_int_equal(specd_transformer_forward(t, &b, &err), 0);
    }
    specd_token_counts_free(&counts);
    free(scratch);
    free(logits);
}

static void session_start(session *s, const int32_t *prompt, int n_prompt, int n_gen) {
    specd_error err = {{0}};
    float *logits = malloc(sizeof(float) * s->vocab);
    int32_t last = n_prompt - 1;
    specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = n_prompt};
    specd_batch b = {.n_tokens = n_prompt, .tokens = prompt, .n_seqs = 1, .seqs = &in,
                     .n_out = 1, .out_rows = &last, .logits = logits};
    assert_int_equal(specd_transformer_forward(s->t, &b, &err), 0);
    counts_of_prompt(&s->counts, s->vocab, prompt, n_prompt);
    s->scratch = malloc(specd_verify_scratch_size(s->vocab, MAX_NODES));
    s->pending = specd_decode_token(logits, s->vocab, s->sp, &s->counts, 0, s->scratch);
    specd_token_counts_add(&s->counts, s->pending, 1);
    s->n_past = n_prompt;
    s->out = malloc(sizeof(int32_t) * (n_gen + MAX_NODES + 2));
    s->lps = malloc(sizeof(specd_token_logprob) * (n_gen + MAX_NODES + 2));
    s->out[0] = s->pending;
    specd_token_logprob_fill(&s->lps[0], logits, s->vocab, s->pending, TOP_N);
    s->n_out = 1;
    free(logits);
}

static void session_end(session *s) {
    specd_token_counts_free(&s->counts);
    free(s->out);
    free(s->lps);
    free(s->scratch);
}

/* One verification step: forward [pending, tree...], walk, compact; then the
 * log-probabilities of the emitted tokens from their raw rows, as the
 * scheduler computes them. */
static void session_step(session *s, const specd_tree *tree) {
    specd_error err = {{0}};
    int n = tree->n_nodes + 1;
    int32_t toks[MAX_NODES + 1], pos[MAX_NODES + 1], rows[MAX_NODES + 1];
    uint8_t mask[(MAX_NODES + 1) * (MAX_NODES + 1)];
    assert_int_equal(specd_tree_validate(tree, s->vocab, MAX_NODES, 0, &err), 0);
    toks[0] = s->pending;
    memcpy(toks + 1, tree->tokens, sizeof(int32_t) * tree->n_nodes);
    specd_tree_mask(tree, s->n_past, mask, pos);
    for (int i = 0; i < n; i++) rows[i] = i;
    float *logits = malloc(sizeof(float) * n * s->vocab);
    specd_seq_input in = {.slot = 0, .n_past = s->n_past, .n_new = n, .mask = mask, .pos = pos};
    specd_batch b = {.n_tokens = n, .tokens = toks, .n_seqs = 1, .seqs = &in, .n_out = n,
                     .out_rows = rows, .logits = logits};
    if (specd_transformer_forward(s->t, &b, &err)) fail_msg("forward: %s", err.msg);
    /* The walk must leave the raw rows alone (log-probabilities read them). */
    float *copy = malloc(sizeof(float) * n * s->vocab);
    memcpy(copy, logits, sizeof(float) * n * s->vocab);
    int32_t accepted[MAX_NODES], kept[MAX_NODES + 1];
    specd_verify_result res = {.accepted = accepted, .kept_rows = kept};
    assert_int_equal(specd_verify_walk(tree, logits, s->vocab, s->sp, &s->counts,
                                       (uint64_t)s->n_out, s->scratch, &res, &err), 0);
    assert_memory_equal(copy, logits, sizeof(float) * n * s->vocab);
    free(copy);
    assert_int_equal(specd_transformer_kv_compact(s->t, 0, s->n_past, kept, 1 + res.n_accepted,
                                                  &err), 0);
    for (int i = 0; i <= res.n_accepted; i++) {
        int32_t tok = i < res.n_accepted ? accepted[i] : res.next_token;
        specd_token_logprob_fill(&s->lps[s->n_out], logits + (size_t)kept[i] * s->vocab,
                                 s->vocab, tok, TOP_N);
        s->out[s->n_out++] = tok;
        specd_token_counts_add(&s->counts, tok, 1);
    }
    assert_int_equal(kept[res.n_accepted], res.next_row);
    s->n_past += 1 + res.n_accepted;
    s->pending = res.next_token;
    s->steps++;
    free(logits);
}

static uint64_t rnd(uint64_t *st) {
    *st ^= *st << 13;
    *st ^= *st >> 7;
    *st ^= *st << 17;
    return *st;
}

/* Builds a tree of `kind` for the position after s->out[0..n_out), knowing
 * the reference continuation ref[] (so "correct" tokens are known):
 *   0 all-correct chain of length 1..6      1 all-wrong chain and siblings
 *   2 random tree                           3 correct path among wrong siblings */
static void make_tree(int kind, const session *s, const int32_t *ref, int n_ref, uint64_t *st,
                      int32_t *tokens, int32_t *parents, int *n_nodes) {
    int base = s->n_out; /* ref index of the pending token's child */
    int n = 0;
    if (kind == 0 || kind == 3) {
        int len = 1 + (int)(rnd(st) % 6);
        int parent = -1;
        for (int d = 0; d < len && base + d < n_ref; d++) {
            if (kind == 3) { /* a wrong sibling first, sometimes two */
                for (int w = 0; w < 1 + (int)(rnd(st) % 2); w++) {
                    int32_t wrong = (ref[base + d] + 1 + (int32_t)(rnd(st) % 50)) % s->vocab;
                    tokens[n] = wrong;
                    parents[n++] = parent;
                }
            }
            tokens[n] = ref[base + d];
            parents[n] = parent;
            parent = n++;
        }
        if (n == 0) { /* past the reference: any token */
            tokens[n] = 1;
            parents[n++] = -1;
        }
    } else if (kind == 1) {
        int32_t want = base < n_ref ? ref[base] : -1;
        for (int i = 0; i < 4; i++) {
            int32_t tok = (int32_t)(rnd(st) % s->vocab);
            if (tok == want) tok = (tok + 1) % s->vocab;
            tokens[n] = tok;
            parents[n++] = i == 0 ? -1 : (int32_t)(rnd(st) % 2 ? -1 : i - 1);
        }
    } else {
        int count = 1 + (int)(rnd(st) % 12);
        for (int i = 0; i < count; i++) {
            tokens[n] = (int32_t)(rnd(st) % s->vocab);
            parents[n] = i == 0 ? -1 : (int32_t)(rnd(st) % (i + 1)) - 1;
            n++;
        }
    }
    *n_nodes = n;
}

/* |a - b| scaled by max(1, |b|): logits carry relative rounding, so a
 * log-probability far in the tail (-20) moves more than one near 0. */
static double scaled_diff(float a, float b) {
    return fabs((double)a - (double)b) / fmax(1.0, fabs((double)b));
}

/* Largest scaled difference between two log-probability records of the
 * same token (alternatives included; their ids must agree). */
static double logprob_diff(const specd_token_logprob *a, const specd_token_logprob *b) {
    assert_int_equal(a->token, b->token);
    assert_int_equal(a->n_top, b->n_top);
    double d = scaled_diff(a->logprob, b->logprob);
    for (int j = 0; j < a->n_top; j++) {
        if (a->top_ids[j] != b->top_ids[j])
            fail_msg("top_logprobs[%d]: token %d vs %d (logprobs %.9g vs %.9g)", j, a->top_ids[j],
                     b->top_ids[j], (double)a->top_lps[j], (double)b->top_lps[j]);
        double e = scaled_diff(a->top_lps[j], b->top_lps[j]);
        if (e > d) d = e;
    }
    return d;
}

/* Worst log-probability difference between tree verification and plain
 * decoding over every check_lossless run (printed by the tests). */
static double g_worst_lp_diff;

static void check_lossless(const char *path, const specd_sampling *sp, const int32_t *prompt,
                           int n_prompt, int n_gen) {
    specd_model_file *m;
    specd_transformer *t = open_model(path, &m, n_prompt + n_gen + MAX_NODES + 4);
    int vocab = m->hp.vocab_size;
    int n_ref = n_gen + MAX_NODES;
    int32_t *ref = malloc(sizeof(int32_t) * n_ref);
    specd_token_logprob *ref_lp = malloc(sizeof(specd_token_logprob) * n_ref);
    plain_decode(t, vocab, sp, prompt, n_prompt, n_ref, ref, ref_lp);
    for (int kind = 0; kind <= 4; kind++) { /* 4 = mix of all kinds */
        session s = {.t = t, .vocab = vocab, .sp = sp};
        session_start(&s, prompt, n_prompt, n_gen);
        uint64_t st = 0x9e3779b97f4a7c15ULL + (uint64_t)kind;
        while (s.n_out < n_gen) {
            int32_t tokens[MAX_NODES], parents[MAX_NODES];
            int n_nodes;
            make_tree(kind == 4 ? (int)(rnd(&st) % 4) : kind, &s, ref, n_ref, &st, tokens,
                      parents, &n_nodes);
            specd_tree tree = {n_nodes, tokens, parents, NULL};
            session_step(&s, &tree);
        }
        for (int i = 0; i < n_gen; i++) {
            if (s.out[i] != ref[i])
                fail_msg("%s: tree kind %d: token %d is %d, plain decoding gave %d", path, kind,
                         i, s.out[i], ref[i]);
            /* Rows of a tree pass and of a one-token decode are computed
             * with different batch shapes (GEMM vs GEMV blocking, masked
             * attention), so they are not bit-identical; the log-probs may
             * differ by rounding only: 1e-4 x max(1, |logprob|). Seen: ~6e-6
             * on the tiny models, ~3e-5 on SmolLM2 (30 layers). */
            double d = logprob_diff(&s.lps[i], &ref_lp[i]);
            if (d > g_worst_lp_diff) g_worst_lp_diff = d;
            if (d > 1e-4)
                fail_msg("%s: tree kind %d: token %d: logprobs differ by %g", path, kind, i, d);
        }
        if (kind == 0) /* correct chains of up to 6 must cut the step count */
            assert_true(s.steps < n_gen / 2);
        if (kind == 1) assert_int_equal(s.steps, n_gen - 1); /* nothing accepted, ever */
        session_end(&s);
    }
    free(ref);
    free(ref_lp);
    specd_transformer_free(t);
    specd_model_close(m);
}

static specd_sampling greedy_plain(void) {
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 0.0f;
    return s;
}

static void test_lossless_tiny(void **state) {
    (void)state;
    static const int32_t prompt[] = {3, 77, 154, 9, 201, 45, 12};
    specd_sampling g = greedy_plain();
    g_worst_lp_diff = 0;
    check_lossless(test_path("tests/golden/data/tiny-gqa/hf"), &g, prompt, 7, 64);
    check_lossless(test_path("tests/golden/data/tiny-tied/model-f32.gguf"), &g, prompt, 7, 64);
    printf("  logprobs, tree vs plain decode: max |diff| / max(1, |logprob|) = %.3g\n",
           g_worst_lp_diff);
}

/* Penalties and bias change which token is the argmax, and they depend on
 * the path: every tree row must see the history of its own path. */
static void test_lossless_tiny_penalties(void **state) {
    (void)state;
    static const int32_t prompt[] = {3, 77, 154, 9, 201, 45, 12, 77, 9};
    /* token 12 (in the prompt) pushed up, 300 banned, 41 and 5 nudged */
    static const int32_t bias_ids[] = {12, 300, 41, 5};
    static const float bias_values[] = {1.5f, -100.0f, 2.0f, -0.75f};
    specd_sampling p = greedy_plain();
    p.repetition_penalty = 1.3f;
    p.frequency_penalty = 0.4f;
    p.presence_penalty = 0.3f;
    p.n_logit_bias = 4;
    p.bias_ids = bias_ids;
    p.bias_values = bias_values;
    specd_sampling g = greedy_plain();
    /* test_path() reuses one buffer, so each path is copied before use. */
    char tied[4096];
    snprintf(tied, sizeof tied, "%s", test_path("tests/golden/data/tiny-tied/model-f32.gguf"));
    g_worst_lp_diff = 0;
    for (int k = 0; k < 2; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s", k == 0 ? test_path("tests/golden/data/tiny-gqa/hf")
                                                 : tied);
        /* The test has teeth only if the penalties change the output. */
        specd_model_file *m;
        specd_transformer *t = open_model(path, &m, 128);
        int vocab = m->hp.vocab_size, n = 64, differ = 0;
        int32_t a[64], b[64];
        specd_token_logprob la[64], lb[64];
        plain_decode(t, vocab, &g, prompt, 9, n, a, la);
        plain_decode(t, vocab, &p, prompt, 9, n, b, lb);
        for (int i = 0; i < n; i++) {
            differ += a[i] != b[i];
            assert_int_not_equal(b[i], 300); /* banned */
        }
        printf("  %s: penalties change %d of %d greedy tokens\n", path, differ, n);
        assert_true(differ >= 8);
        specd_transformer_free(t);
        specd_model_close(m);
        check_lossless(path, &p, prompt, 9, 64);
    }
    printf("  logprobs with penalties, tree vs plain decode: max |diff| / max(1, |logprob|) = "
           "%.3g\n", g_worst_lp_diff);
}

static void test_lossless_default_model(void **state) {
    (void)state;
    const char *path = test_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!test_file_exists(path)) {
        printf("  SKIP: %s not present (run scripts/fetch_model.sh)\n", path);
        skip();
    }
    /* "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n" */
    static const int32_t prompt[] = {1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198};
    specd_sampling g = greedy_plain();
    g_worst_lp_diff = 0;
    check_lossless(path, &g, prompt, (int)(sizeof prompt / sizeof prompt[0]), 40);
    printf("  logprobs, tree vs plain decode: max |diff| / max(1, |logprob|) = %.3g\n",
           g_worst_lp_diff);
}

static void test_mask_and_positions(void **state) {
    (void)state;
    /* pending -> 0 -> 1 ; pending -> 2 -> 3 -> 4 */
    int32_t tokens[5] = {10, 11, 12, 13, 14}, parents[5] = {-1, 0, -1, 2, 3};
    specd_tree tree = {5, tokens, parents, NULL};
    uint8_t mask[36];
    int32_t pos[6];
    specd_tree_mask(&tree, 100, mask, pos);
    static const uint8_t want[36] = {1, 0, 0, 0, 0, 0,  1, 1, 0, 0, 0, 0,  1, 1, 1, 0, 0, 0,
                                     1, 0, 0, 1, 0, 0,  1, 0, 0, 1, 1, 0,  1, 0, 0, 1, 1, 1};
    assert_memory_equal(mask, want, 36);
    int32_t want_pos[6] = {100, 101, 102, 101, 102, 103};
    assert_memory_equal(pos, want_pos, sizeof want_pos);
}

static void test_bad_trees(void **state) {
    (void)state;
    specd_error err = {{0}};
    int32_t tokens[3] = {1, 2, 3}, parents[3] = {-1, 0, 1};
    specd_tree tree = {3, tokens, parents, NULL};
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 0, &err), 0);

    parents[1] = 1;
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 0, &err), -1);
    assert_non_null(strstr(err.msg, "tree.parents[1]"));
    parents[1] = -2;
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 0, &err), -1);
    parents[1] = 0;

    tokens[2] = 10;
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 0, &err), -1);
    assert_non_null(strstr(err.msg, "tree.tokens[2]"));
    tokens[2] = 3;

    assert_int_equal(specd_tree_validate(&tree, 10, 2, 0, &err), -1);
    assert_non_null(strstr(err.msg, "nodes"));
    /* an empty tree is a plain decode step: valid, even when sampling */
    tree.n_nodes = 0;
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 0, &err), 0);
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 1, &err), 0); /* nothing drawn: no q */
    tree.n_nodes = -1;
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 0, &err), -1);
    tree.n_nodes = 3;

    /* sampling needs q, and q must cover each drawn child */
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 1, &err), -1);
    assert_non_null(strstr(err.msg, "tree.q"));
    int32_t ids[2] = {1, 5};
    float probs[2] = {0.5f, 0.5f};
    int32_t ids2[1] = {2}, ids3[1] = {3};
    float one[1] = {1.0f};
    specd_sparse_dist q[4] = {{2, ids, probs}, {1, ids2, one}, {1, ids3, one}, {0, NULL, NULL}};
    tree.q = q;
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 1, &err), 0);
    q[1].ids = ids3; /* node 0's child (token 2) has q = 0 */
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 1, &err), -1);
    assert_non_null(strstr(err.msg, "tree.q[1]"));
    q[1].ids = ids2;
    probs[1] = 0.7f; /* sums to 1.2 */
    assert_int_equal(specd_tree_validate(&tree, 10, 8, 1, &err), -1);
    assert_non_null(strstr(err.msg, "sum"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_and_positions),
        cmocka_unit_test(test_bad_trees),
        cmocka_unit_test(test_lossless_tiny),
        cmocka_unit_test(test_lossless_tiny_penalties),
        cmocka_unit_test(test_lossless_default_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
