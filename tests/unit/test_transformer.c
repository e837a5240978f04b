/* test_transformer.c - the forward pass agrees with itself however the work
 * is cut: N positions in one call equal N one-position calls, a batch of
 * sequences equals each sequence alone, a tree with a mask equals each of
 * its paths run causally, and KV compaction keeps exactly the accepted
 * path. The model is synthetic (random F32 weights built in memory), so
 * these tests need no files; agreement with Hugging Face is proven by the
 * golden tests. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "target-svc/transformer.h"
#include "tests/test_util.h"

enum { VOCAB = 97, DIM = 48, HIDDEN = 80, LAYERS = 2, HEADS = 6, KV_HEADS = 2, CTX = 64 };

typedef struct synth_model {
    specd_model_file m;
    float *buffers[64];
    int n_buffers;
} synth_model;

static void add_tensor(synth_model *s, const char *name, int ne0, int ne1, float scale,
                       float offset) {
    specd_tensor *t = &s->m.tensors[s->m.n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = SPECD_F32;
    t->n_dims = ne1 > 1 ? 2 : 1;
    t->ne[0] = (uint64_t)ne0;
    t->ne[1] = (uint64_t)ne1;
    t->ne[2] = t->ne[3] = 1;
    float *data = malloc(sizeof(float) * ne0 * ne1);
    test_fill_random(data, (size_t)ne0 * ne1, (uint64_t)s->m.n_tensors * 7919, scale);
    for (int i = 0; i < ne0 * ne1; i++) data[i] += offset;
    s->buffers[s->n_buffers++] = data;
    t->data = data;
    t->nbytes = sizeof(float) * ne0 * ne1;
}

static synth_model *synth_create(int interleaved) {
    synth_model *s = calloc(1, sizeof *s);
    s->m.tensors = calloc(64, sizeof(specd_tensor));
    specd_llama_hparams *hp = &s->m.hp;
    *hp = (specd_llama_hparams){.vocab_size = VOCAB, .dim = DIM, .hidden_dim = HIDDEN,
                                .n_layers = LAYERS, .n_heads = HEADS, .n_kv_heads = KV_HEADS,
                                .head_dim = DIM / HEADS, .max_seq_len = CTX,
                                .rope_theta = 10000.0f, .rope_interleaved = interleaved,
                                .norm_eps = 1e-5f, .tied_embeddings = 0, .bos_id = 1,
                                .eos_id = 2};
    int hd = DIM / HEADS;
    add_tensor(s, "token_embd.weight", DIM, VOCAB, 1.0f, 0);
    add_tensor(s, "output_norm.weight", DIM, 1, 0.1f, 1.0f);
    add_tensor(s, "output.weight", DIM, VOCAB, 0.3f, 0);
    for (int l = 0; l < LAYERS; l++) {
        char name[96];
#define T(suffix, a, b, sc, off)                                                                   \
    snprintf(name, sizeof name, "blk.%d." suffix ".weight", l);                                    \
    add_tensor(s, name, a, b, sc, off)
        T("attn_norm", DIM, 1, 0.1f, 1.0f);
        T("attn_q", DIM, HEADS * hd, 0.4f, 0);
        T("attn_k", DIM, KV_HEADS * hd, 0.4f, 0);
        T("attn_v", DIM, KV_HEADS * hd, 0.3f, 0);
        T("attn_output", HEADS * hd, DIM, 0.2f, 0);
        T("ffn_norm", DIM, 1, 0.1f, 1.0f);
        T("ffn_gate", DIM, HIDDEN, 0.3f, 0);
        T("ffn_up", DIM, HIDDEN, 0.3f, 0);
        T("ffn_down", HIDDEN, DIM, 0.2f, 0);
#undef T
    }
    return s;
}

static void synth_free(synth_model *s) {
    for (int i = 0; i < s->n_buffers; i++) free(s->buffers[i]);
    free(s->m.tensors);
    free(s);
}

static specd_transformer *make(synth_model *s, int slots) {
    specd_error err = {{0}};
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 2}, .n_slots = slots,
                                .max_ctx = CTX, .max_batch = 64};
    specd_transformer *t = specd_transformer_create(&s->m, &o, &err);
    if (!t) fail_msg("create: %s", err.msg);
    return t;
}

/* Runs n tokens of one sequence causally, returning logits for every row. */
static void run_seq(specd_transformer *t, int slot, int n_past, const int32_t *toks, int n,
                    float *logits) {
    specd_seq_input in = {.slot = slot, .n_past = n_past, .n_new = n};
    int32_t rows[64];
    for (int i = 0; i < n; i++) rows[i] = i;
    specd_batch b = {.n_tokens = n, .tokens = toks, .n_seqs = 1, .seqs = &in, .n_out = n,
                     .out_rows = rows, .logits = logits};
    specd_error err = {{0}};
    if (specd_transformer_forward(t, &b, &err)) fail_msg("forward: %s", err.msg);
}

static void assert_close(const float *a, const float *b, size_t n, float tol) {
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]), m = fmaxf(1.0f, fabsf(b[i]));
        if (d > tol * m) fail_msg("element %zu: %g vs %g", i, (double)a[i], (double)b[i]);
    }
}

static const int32_t k_prompt[12] = {5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12, 96};

static void test_n_positions_equal_n_calls(void **state) {
    (void)state;
    for (int inter = 0; inter < 2; inter++) {
        synth_model *s = synth_create(inter);
        specd_transformer *t = make(s, 1);
        float *all = malloc(sizeof(float) * 12 * VOCAB), *one = malloc(sizeof(float) * VOCAB);
        run_seq(t, 0, 0, k_prompt, 12, all);
        for (int i = 0; i < 12; i++) {
            run_seq(t, 0, i, k_prompt + i, 1, one);
            assert_close(one, all + (size_t)i * VOCAB, VOCAB, 1e-5f);
        }
        free(all);
        free(one);
        specd_transformer_free(t);
        synth_free(s);
    }
}

static void test_batch_equals_alone(void **state) {
    (void)state;
    synth_model *s = synth_create(0);
    specd_transformer *t = make(s, 3);
    /* three sequences with different cached prefixes, decoded together */
    int lens[3] = {3, 7, 5}, news[3] = {1, 4, 2};
    float alone[3][4 * VOCAB], prefill[8 * VOCAB];
    for (int q = 0; q < 3; q++) {
        run_seq(t, q, 0, k_prompt, lens[q], prefill);
        run_seq(t, q, lens[q], k_prompt + lens[q], news[q], alone[q]);
    }
    int32_t toks[7], rows[7];
    specd_seq_input in[3];
    int n = 0;
    for (int q = 0; q < 3; q++) {
        in[q] = (specd_seq_input){.slot = q, .n_past = lens[q], .n_new = news[q]};
        for (int i = 0; i < news[q]; i++, n++) {
            toks[n] = k_prompt[lens[q] + i];
            rows[n] = n;
        }
    }
    float *logits = malloc(sizeof(float) * n * VOCAB);
    specd_batch b = {.n_tokens = n, .tokens = toks, .n_seqs = 3, .seqs = in, .n_out = n,
                     .out_rows = rows, .logits = logits};
    specd_error err = {{0}};
    assert_int_equal(specd_transformer_forward(t, &b, &err), 0);
    n = 0;
    for (int q = 0; q < 3; q++)
        for (int i = 0; i < news[q]; i++, n++)
            assert_close(logits + (size_t)n * VOCAB, alone[q] + (size_t)i * VOCAB, VOCAB, 1e-5f);
    free(logits);
    specd_transformer_free(t);
    synth_free(s);
}

/* Tree:      root(40) -> a(7) -> b(8)
 *                     \-> c(9) -> d(10)
 * Rows: 0=root 1=a 2=c 3=b 4=d. Each path run causally must give the same
 * logits as its nodes in the tree pass. Then keep path root,c,d and check
 * that decoding after compaction equals decoding after the plain path. */
static void test_tree_mask_and_compaction(void **state) {
    (void)state;
    synth_model *s = synth_create(1);
    specd_transformer *t = make(s, 2);
    const int P = 6;
    int32_t tree_tok[5] = {40, 7, 9, 8, 10};
    int parent[5] = {-1, 0, 0, 1, 2};
    uint8_t mask[25] = {0};
    int32_t pos[5];
    for (int i = 0; i < 5; i++) {
        int depth = 0;
        for (int j = i; j >= 0; j = parent[j], depth++) mask[i * 5 + j] = 1;
        pos[i] = P + depth - 1;
    }
    float scratch[P * VOCAB];
    run_seq(t, 0, 0, k_prompt, P, scratch);
    specd_seq_input in = {.slot = 0, .n_past = P, .n_new = 5, .mask = mask, .pos = pos};
    int32_t rows[5] = {0, 1, 2, 3, 4};
    float tree_logits[5 * VOCAB];
    specd_batch b = {.n_tokens = 5, .tokens = tree_tok, .n_seqs = 1, .seqs = &in, .n_out = 5,
                     .out_rows = rows, .logits = tree_logits};
    specd_error err = {{0}};
    assert_int_equal(specd_transformer_forward(t, &b, &err), 0);

    int paths[2][3] = {{0, 1, 3}, {0, 2, 4}};
    for (int p = 0; p < 2; p++) {
        int32_t ptok[3];
        float plog[3 * VOCAB];
        for (int i = 0; i < 3; i++) ptok[i] = tree_tok[paths[p][i]];
        run_seq(t, 1, 0, k_prompt, P, scratch);
        run_seq(t, 1, P, ptok, 3, plog);
        for (int i = 0; i < 3; i++)
            assert_close(tree_logits + (size_t)paths[p][i] * VOCAB, plog + (size_t)i * VOCAB, VOCAB,
                         1e-5f);
    }
    /* slot 1 now holds prompt + path 2; compact slot 0 to the same path */
    int32_t keep[3] = {0, 2, 4};
    assert_int_equal(specd_transformer_kv_compact(t, 0, P, keep, 3, &err), 0);
    int32_t next = 55;
    float a[VOCAB], c[VOCAB];
    run_seq(t, 0, P + 3, &next, 1, a);
    run_seq(t, 1, P + 3, &next, 1, c);
    assert_close(a, c, VOCAB, 1e-6f);
    specd_transformer_free(t);
    synth_free(s);
}

static void test_bad_batches(void **state) {
    (void)state;
    synth_model *s = synth_create(0);
    specd_transformer *t = make(s, 2);
    specd_error err = {{0}};
    int32_t toks[2] = {1, 2}, rows[1] = {0};
    specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = 2};
    specd_batch b = {.n_tokens = 2, .tokens = toks, .n_seqs = 1, .seqs = &in};

    toks[1] = VOCAB;
    assert_int_equal(specd_transformer_forward(t, &b, &err), -1);
    assert_non_null(strstr(err.msg, "tokens[1]"));
    toks[1] = 2;

    in.slot = 5;
    assert_int_equal(specd_transformer_forward(t, &b, &err), -1);
    assert_non_null(strstr(err.msg, "slot"));
    in.slot = 0;

    in.n_past = CTX - 1;
    assert_int_equal(specd_transformer_forward(t, &b, &err), -1);
    assert_non_null(strstr(err.msg, "context"));
    in.n_past = 0;

    uint8_t bad_mask[4] = {1, 1, 1, 1}; /* token 0 sees token 1: not allowed */
    in.mask = bad_mask;
    assert_int_equal(specd_transformer_forward(t, &b, &err), -1);
    assert_non_null(strstr(err.msg, "mask"));
    in.mask = NULL;

    b.n_out = 1;
    rows[0] = 7;
    b.out_rows = rows;
    assert_int_equal(specd_transformer_forward(t, &b, &err), -1);
    assert_non_null(strstr(err.msg, "out_rows"));

    int32_t keep[2] = {1, 1};
    assert_int_equal(specd_transformer_kv_compact(t, 0, 0, keep, 2, &err), -1);
    assert_non_null(strstr(err.msg, "increasing"));
    specd_transformer_free(t);
    synth_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_n_positions_equal_n_calls),
        cmocka_unit_test(test_batch_equals_alone),
        cmocka_unit_test(test_tree_mask_and_compaction),
        cmocka_unit_test(test_bad_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
