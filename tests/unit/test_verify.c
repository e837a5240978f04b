/* test_verify.c - greedy tree verification is lossless, and bad trees are
 * refused with a message naming the field.
 *
 * Losslessness: for a model, plain greedy decoding gives a reference
 * continuation. Then a speculative loop feeds the verifier trees of every
 * kind (all-correct chains, all-wrong, random, correct paths hidden among
 * wrong siblings) and must reproduce the reference token for token, while
 * the KV cache keeps only accepted paths. Runs on the tiny golden models and,
 * when models/ has it, on the default model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "target-svc/transformer.h"
#include "target-svc/verify.h"
#include "tests/test_util.h"

#define MAX_NODES 24

typedef struct session {
    specd_transformer *t;
    int vocab;
    int n_past;        /* cache rows */
    int32_t pending;   /* target's last token, not yet in the cache */
    int32_t *out;      /* emitted tokens */
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

/* Plain greedy: prefill then one token per step. */
static void plain_greedy(specd_transformer *t, int vocab, const int32_t *prompt, int n_prompt,
                         int n_gen, int32_t *out) {
    specd_error err = {{0}};
    float *logits = malloc(sizeof(float) * vocab);
    int32_t last = n_prompt - 1;
    specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = n_prompt};
    specd_batch b = {.n_tokens = n_prompt, .tokens = prompt, .n_seqs = 1, .seqs = &in,
                     .n_out = 1, .out_rows = &last, .logits = logits};
    assert_int_equal(specd_transformer_forward(t, &b, &err), 0);
    for (int g = 0; g < n_gen; g++) {
        out[g] = specd_argmax(logits, vocab);
        int32_t zero = 0;
        in = (specd_seq_input){.slot = 0, .n_past = n_prompt + g, .n_new = 1};
        b = (specd_batch){.n_tokens = 1, .tokens = &out[g], .n_seqs = 1, .seqs = &in, .n_out = 1,
                          .out_rows = &zero, .logits = logits};
        assert_int_equal(specd_transformer_forward(t, &b, &err), 0);
    }
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
    s->pending = specd_argmax(logits, s->vocab);
    s->n_past = n_prompt;
    s->out = malloc(sizeof(int32_t) * (n_gen + MAX_NODES + 2));
    s->out[0] = s->pending;
    s->n_out = 1;
    s->scratch = malloc(specd_verify_scratch_size(s->vocab));
    free(logits);
}

/* One verification step: forward [pending, tree...], walk, compact. */
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
    int32_t accepted[MAX_NODES], kept[MAX_NODES + 1];
    specd_verify_result res = {.accepted = accepted, .kept_rows = kept};
    specd_sampling greedy = {.temperature = 0, .top_p = 1};
    assert_int_equal(specd_verify_walk(tree, logits, s->vocab, &greedy, (uint64_t)s->n_out,
                                       s->scratch, &res, &err), 0);
    assert_int_equal(specd_transformer_kv_compact(s->t, 0, s->n_past, kept, 1 + res.n_accepted,
                                                  &err), 0);
    for (int i = 0; i < res.n_accepted; i++) s->out[s->n_out++] = accepted[i];
    s->out[s->n_out++] = res.next_token;
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

static void check_lossless(const char *path, const int32_t *prompt, int n_prompt, int n_gen) {
    specd_model_file *m;
    specd_transformer *t = open_model(path, &m, n_prompt + n_gen + MAX_NODES + 4);
    int vocab = m->hp.vocab_size;
    int32_t *ref = malloc(sizeof(int32_t) * (n_gen + MAX_NODES));
    plain_greedy(t, vocab, prompt, n_prompt, n_gen + MAX_NODES, ref);
    for (int kind = 0; kind <= 4; kind++) { /* 4 = mix of all kinds */
        session s = {.t = t, .vocab = vocab};
        session_start(&s, prompt, n_prompt, n_gen);
        uint64_t st = 0x9e3779b97f4a7c15ULL + (uint64_t)kind;
        while (s.n_out < n_gen) {
            int32_t tokens[MAX_NODES], parents[MAX_NODES];
            int n_nodes;
            make_tree(kind == 4 ? (int)(rnd(&st) % 4) : kind, &s, ref, n_gen + MAX_NODES, &st,
                      tokens, parents, &n_nodes);
            specd_tree tree = {n_nodes, tokens, parents, NULL};
            session_step(&s, &tree);
        }
        for (int i = 0; i < n_gen; i++)
            if (s.out[i] != ref[i])
                fail_msg("%s: tree kind %d: token %d is %d, plain greedy gave %d", path, kind, i,
                         s.out[i], ref[i]);
        if (kind == 0) /* correct chains of up to 6 must cut the step count */
            assert_true(s.steps < n_gen / 2);
        if (kind == 1) assert_int_equal(s.steps, n_gen - 1); /* nothing accepted, ever */
        free(s.out);
        free(s.scratch);
    }
    free(ref);
    specd_transformer_free(t);
    specd_model_close(m);
}

static void test_lossless_tiny(void **state) {
    (void)state;
    static const int32_t prompt[] = {3, 77, 154, 9, 201, 45, 12};
    check_lossless(test_path("tests/golden/data/tiny-gqa/hf"), prompt, 7, 64);
    check_lossless(test_path("tests/golden/data/tiny-tied/model-f32.gguf"), prompt, 7, 64);
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
    check_lossless(path, prompt, (int)(sizeof prompt / sizeof prompt[0]), 40);
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
    tree.n_nodes = 0;
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
        cmocka_unit_test(test_lossless_default_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
