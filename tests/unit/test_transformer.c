/* test_transformer.c - the forward pass agrees with itself however the work
 * is cut: N positions in one call equal N one-position calls, a batch of
 * sequences equals each sequence alone, a tree with a mask equals each of
 * its paths run causally, and KV compaction keeps exactly the accepted
 * path. The paged KV cache is checked through the public API: a pool
 * smaller than every slot's full context fails a batch cleanly ("KV cache
 * full", nothing changed), releasing a slot and compacting return pages,
 * slots whose pages interleave in the pool compute what each computes
 * alone, and the device-side argmax equals specd_argmax of the logits.
 * The model is synthetic (random F32 weights built in memory), so
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

#include "common/spec/sampling.h"
#include "common/model/transformer.h"
#include "tests/harness/test_util.h"

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

/* --- the paged KV cache, through the public API ------------------------------- */

/* Deterministic tokens for longer sequences than k_prompt. */
static void make_tokens(int32_t *t, int n, int seed) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)((seed * 31 + i * 37 + 5) % VOCAB);
}

static specd_transformer *make_paged(synth_model *s, int slots, int kv_pages) {
    specd_error err = {{0}};
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 2}, .n_slots = slots,
                                .max_ctx = CTX, .max_batch = 64, .kv_pages = kv_pages};
    specd_transformer *t = specd_transformer_create(&s->m, &o, &err);
    if (!t) fail_msg("create: %s", err.msg);
    return t;
}

static int free_pages(const specd_transformer *t) {
    int n_free = -1, n_total = -1;
    specd_transformer_kv_pages(t, &n_free, &n_total);
    return n_free;
}

/* Runs a batch of up to 3 causal sequences; logits for every row. */
typedef struct seq_part {
    int slot, n_past, n_new;
    const int32_t *toks;
} seq_part;

static int run_parts(specd_transformer *t, const seq_part *p, int n_parts, float *logits,
                     specd_error *err) {
    int32_t toks[64], rows[64];
    specd_seq_input in[3];
    int n = 0;
    for (int q = 0; q < n_parts; q++) {
        in[q] = (specd_seq_input){.slot = p[q].slot, .n_past = p[q].n_past, .n_new = p[q].n_new};
        for (int i = 0; i < p[q].n_new; i++, n++) {
            toks[n] = p[q].toks[i];
            rows[n] = n;
        }
    }
    specd_batch b = {.n_tokens = n, .tokens = toks, .n_seqs = n_parts, .seqs = in, .n_out = n,
                     .out_rows = rows, .logits = logits};
    return specd_transformer_forward(t, &b, err);
}

static void run_parts_ok(specd_transformer *t, const seq_part *p, int n_parts, float *logits) {
    specd_error err = {{0}};
    if (run_parts(t, p, n_parts, logits, &err)) fail_msg("forward: %s", err.msg);
}

/* A pool of 5 pages for 2 slots of 4 pages each: a batch needing more than
 * the free pages fails with "KV cache full", takes no page and changes no
 * cache, so the next valid batch computes what it computes without the
 * failed one. Pages a sequence gives back in the same batch count. */
static void test_kv_full_fails_cleanly(void **state) {
    (void)state;
    synth_model *s = synth_create(0);
    specd_transformer *t = make_paged(s, 2, 5), *ref = make_paged(s, 2, 0);
    int total = -1;
    specd_transformer_kv_pages(t, NULL, &total);
    assert_int_equal(total, 5);
    int32_t a[64], b[64];
    make_tokens(a, 64, 1);
    make_tokens(b, 64, 2);
    float *l1 = malloc(sizeof(float) * 64 * VOCAB), *l2 = malloc(sizeof(float) * 64 * VOCAB);
    for (int k = 0; k < 2; k++) {
        specd_transformer *x = k ? ref : t;
        seq_part pre[2] = {{0, 0, 12, a}, {1, 0, 40, b}};
        run_parts_ok(x, pre, 2, l1);
    }
    assert_int_equal(free_pages(t), 1); /* 1 + 3 pages held */

    specd_error err = {{0}};
    /* each sequence needs one more page; only one is free */
    seq_part both[2] = {{0, 12, 8, a + 12}, {1, 40, 10, b + 40}};
    assert_int_equal(run_parts(t, both, 2, l1, &err), -1);
    if (!strstr(err.msg, "KV cache full")) fail_msg("unexpected error: %s", err.msg);
    assert_int_equal(free_pages(t), 1);
    /* one sequence needing two more */
    memset(&err, 0, sizeof err);
    seq_part one[1] = {{0, 12, 30, a + 12}};
    assert_int_equal(run_parts(t, one, 1, l1, &err), -1);
    if (!strstr(err.msg, "KV cache full")) fail_msg("unexpected error: %s", err.msg);
    assert_int_equal(free_pages(t), 1);

    /* the next valid batch: as if the failed ones never ran */
    seq_part dec[2] = {{0, 12, 1, a + 12}, {1, 40, 1, b + 40}};
    run_parts_ok(t, dec, 2, l1);
    run_parts_ok(ref, dec, 2, l2);
    assert_close(l1, l2, 2 * VOCAB, 1e-6f);
    assert_int_equal(free_pages(t), 1);

    /* slot 1 shrinks to 9 rows (gives back 2 pages) in the batch where slot
     * 0 grows to 42 rows (takes 2): fits, though only 1 page was free */
    seq_part swap[2] = {{0, 12, 30, a + 12}, {1, 8, 1, b + 8}};
    run_parts_ok(t, swap, 2, l1);
    run_parts_ok(ref, swap, 2, l2);
    assert_close(l1, l2, 31 * VOCAB, 1e-6f);
    assert_int_equal(free_pages(t), 1); /* 3 + 1 held */
    seq_part dec2[2] = {{1, 9, 1, b + 9}, {0, 42, 1, a + 42}};
    run_parts_ok(t, dec2, 2, l1);
    run_parts_ok(ref, dec2, 2, l2);
    assert_close(l1, l2, 2 * VOCAB, 1e-6f);
    free(l1);
    free(l2);
    specd_transformer_free(t);
    specd_transformer_free(ref);
    synth_free(s);
}

/* release_slot gives every page of the slot back; a slot reusing those
 * pages (stale rows in them) computes what a fresh model computes. */
static void test_release_slot_returns_pages(void **state) {
    (void)state;
    synth_model *s = synth_create(1);
    specd_transformer *t = make_paged(s, 2, 5), *ref = make_paged(s, 1, 0);
    int32_t a[64], b[64];
    make_tokens(a, 64, 3);
    make_tokens(b, 64, 4);
    float *l1 = malloc(sizeof(float) * 64 * VOCAB), *l2 = malloc(sizeof(float) * 64 * VOCAB);
    assert_int_equal(free_pages(t), 5);
    specd_transformer_release_slot(t, 1); /* an empty slot: nothing to give */
    assert_int_equal(free_pages(t), 5);
    seq_part pa = {0, 0, 40, a};
    run_parts_ok(t, &pa, 1, l1);
    assert_int_equal(free_pages(t), 2);
    specd_transformer_release_slot(t, -1); /* out of range: ignored */
    specd_transformer_release_slot(t, 2);
    assert_int_equal(free_pages(t), 2);
    specd_transformer_release_slot(t, 0);
    assert_int_equal(free_pages(t), 5);
    /* slot 1 now takes the pages slot 0 wrote */
    seq_part pb = {1, 0, 64, b};
    run_parts_ok(t, &pb, 1, l1);
    assert_int_equal(free_pages(t), 1);
    seq_part pr = {0, 0, 64, b};
    run_parts_ok(ref, &pr, 1, l2);
    assert_close(l1, l2, 64 * VOCAB, 1e-6f);
    /* and slot 0 can run again in what is left after slot 1 lets go */
    specd_transformer_release_slot(t, 1);
    assert_int_equal(free_pages(t), 5);
    run_parts_ok(t, &pa, 1, l1);
    seq_part pr2 = {0, 0, 40, a};
    run_parts_ok(ref, &pr2, 1, l2);
    assert_close(l1, l2, 40 * VOCAB, 1e-6f);
    free(l1);
    free(l2);
    specd_transformer_free(t);
    specd_transformer_free(ref);
    synth_free(s);
}

/* A 30-node tree whose path {0, 5, 29} is kept: 12 + 30 rows hold 3 pages,
 * the compacted 12 + 3 rows hold 1, and decoding after the compaction (row
 * 29 moved across pages) equals decoding after the plain path. */
static void test_kv_compact_returns_pages(void **state) {
    (void)state;
    synth_model *s = synth_create(0);
    specd_transformer *t = make_paged(s, 1, 0), *ref = make_paged(s, 1, 0);
    int total = -1;
    specd_transformer_kv_pages(t, NULL, &total);
    const int P = 12, N = 30;
    int32_t prompt[12], tree[30];
    make_tokens(prompt, P, 5);
    make_tokens(tree, N, 6);
    int parent[30];
    for (int i = 0; i < N; i++) parent[i] = i - 1;
    parent[5] = 0;
    parent[29] = 5;
    uint8_t mask[30 * 30] = {0};
    int32_t pos[30];
    for (int i = 0; i < N; i++) {
        int depth = 0;
        for (int j = i; j >= 0; j = parent[j], depth++) mask[i * N + j] = 1;
        pos[i] = P + depth - 1;
    }
    float *scratch = malloc(sizeof(float) * 64 * VOCAB);
    run_seq(t, 0, 0, prompt, P, scratch);
    assert_int_equal(free_pages(t), total - 1);
    specd_seq_input in = {.slot = 0, .n_past = P, .n_new = N, .mask = mask, .pos = pos};
    int32_t row0 = 0;
    specd_batch b = {.n_tokens = N, .tokens = tree, .n_seqs = 1, .seqs = &in, .n_out = 1,
                     .out_rows = &row0, .logits = scratch};
    specd_error err = {{0}};
    assert_int_equal(specd_transformer_forward(t, &b, &err), 0);
    assert_int_equal(free_pages(t), total - 3);
    const int32_t keep[3] = {0, 5, 29};
    assert_int_equal(specd_transformer_kv_compact(t, 0, P, keep, 3, &err), 0);
    assert_int_equal(free_pages(t), total - 1);

    int32_t path[3] = {tree[0], tree[5], tree[29]};
    run_seq(ref, 0, 0, prompt, P, scratch);
    run_seq(ref, 0, P, path, 3, scratch);
    int32_t next = 55;
    float x[VOCAB], y[VOCAB];
    run_seq(t, 0, P + 3, &next, 1, x);
    run_seq(ref, 0, P + 3, &next, 1, y);
    assert_close(x, y, VOCAB, 1e-5f);
    /* 16 rows now; 20 causal rows more hold 3 pages, and keeping none of
     * them gives back the 2 past the committed rows */
    run_seq(t, 0, P + 4, tree, 20, scratch);
    assert_int_equal(free_pages(t), total - 3);
    assert_int_equal(specd_transformer_kv_compact(t, 0, P + 4, NULL, 0, &err), 0);
    assert_int_equal(free_pages(t), total - 1);
    free(scratch);
    specd_transformer_free(t);
    specd_transformer_free(ref);
    synth_free(s);
}

/* Two slots in a pool of exactly the pages their final lengths need (3 + 2),
 * interleaving prefill chunks and decode steps, alone and in shared
 * batches, so their page tables interleave in the pool: every row's logits
 * equal those of the same sequence prefilled alone in a full-size cache. */
static void test_interleaved_slots_small_pool(void **state) {
    (void)state;
    synth_model *s = synth_create(1);
    specd_transformer *t = make_paged(s, 2, 5);
    int32_t a[40], b[25];
    make_tokens(a, 40, 7);
    make_tokens(b, 25, 8);
    float *ref_a = malloc(sizeof(float) * 40 * VOCAB), *ref_b = malloc(sizeof(float) * 25 * VOCAB);
    {
        specd_transformer *r = make_paged(s, 1, 0);
        run_seq(r, 0, 0, a, 40, ref_a);
        run_seq(r, 0, 0, b, 25, ref_b);
        specd_transformer_free(r);
    }
    /* (slot, n_past, n_new) parts per step; slot 0 = a, slot 1 = b */
    const int steps[][2][3] = {
        {{0, 0, 10}, {-1, 0, 0}},  {{1, 0, 12}, {-1, 0, 0}}, {{0, 10, 8}, {1, 12, 1}},
        {{1, 13, 5}, {0, 18, 1}},  {{0, 19, 13}, {-1, 0, 0}}, {{0, 32, 1}, {1, 18, 7}},
        {{0, 33, 7}, {-1, 0, 0}},
    };
    float *l = malloc(sizeof(float) * 64 * VOCAB);
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        seq_part p[2];
        int n_parts = 0;
        for (int q = 0; q < 2; q++) {
            if (steps[k][q][0] < 0) continue;
            int slot = steps[k][q][0];
            p[n_parts++] = (seq_part){slot, steps[k][q][1], steps[k][q][2],
                                      (slot ? b : a) + steps[k][q][1]};
        }
        run_parts_ok(t, p, n_parts, l);
        int row = 0;
        for (int q = 0; q < n_parts; q++) {
            const float *want = (p[q].slot ? ref_b : ref_a) + (size_t)p[q].n_past * VOCAB;
            assert_close(l + (size_t)row * VOCAB, want, (size_t)p[q].n_new * VOCAB, 1e-5f);
            row += p[q].n_new;
        }
    }
    assert_int_equal(free_pages(t), 0);
    free(l);
    free(ref_a);
    free(ref_b);
    specd_transformer_free(t);
    synth_free(s);
}

/* A batch that asks for `argmax` (logits NULL) gets specd_argmax of the
 * logits the same batch returns when asked for logits; with hidden too,
 * the hidden state is unchanged; with both, both agree. */
/* kv_cache_dtype q8_0 stores blocks of 32 values of one head's row: a model
 * with narrower heads (8 here) is refused at creation, naming the setting,
 * the width and the way out. */
static void test_kv_q8_0_needs_wide_heads(void **state) {
    (void)state;
    synth_model *s = synth_create(0);
    specd_error err = {{0}};
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 1, .kv_dtype = SPECD_KV_Q8_0},
                                .n_slots = 1, .max_ctx = CTX, .max_batch = 64};
    specd_transformer *t = specd_transformer_create(&s->m, &o, &err);
    assert_null(t);
    assert_non_null(strstr(err.msg, "'q8_0'"));
    assert_non_null(strstr(err.msg, "are 8"));
    assert_non_null(strstr(err.msg, "'f16'"));
    synth_free(s);
}

static void test_argmax_batch(void **state) {
    (void)state;
    synth_model *s = synth_create(0);
    specd_transformer *t = make(s, 3);
    int32_t a[20], b[20], c[20];
    make_tokens(a, 20, 9);
    make_tokens(b, 20, 10);
    make_tokens(c, 20, 11);
    float *scratch = malloc(sizeof(float) * 64 * VOCAB);
    run_seq(t, 0, 0, a, 9, scratch);
    run_seq(t, 1, 0, b, 3, scratch);
    int32_t toks[12];
    memcpy(toks, a + 9, 4 * sizeof(int32_t));
    memcpy(toks + 4, b + 3, 1 * sizeof(int32_t));
    memcpy(toks + 5, c, 7 * sizeof(int32_t));
    uint8_t tree[16] = {1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1};
    specd_seq_input in[3] = {{.slot = 0, .n_past = 9, .n_new = 4, .mask = tree},
                             {.slot = 1, .n_past = 3, .n_new = 1},
                             {.slot = 2, .n_past = 0, .n_new = 7}};
    const int32_t rows[6] = {0, 3, 2, 4, 11, 8};
    enum { NO = 6 };
    float logits[NO * VOCAB], logits2[NO * VOCAB], hidden[NO * DIM], hidden2[NO * DIM];
    int32_t ids[NO], ids2[NO];
    specd_batch bt = {.n_tokens = 12, .tokens = toks, .n_seqs = 3, .seqs = in, .n_out = NO,
                      .out_rows = rows, .logits = logits, .hidden = hidden};
    specd_error err = {{0}};
    assert_int_equal(specd_transformer_forward(t, &bt, &err), 0);
    /* the same batch again (same rows rewritten), argmax only */
    bt.logits = NULL;
    bt.hidden = NULL;
    memset(ids, 0xff, sizeof ids);
    bt.argmax = ids;
    assert_int_equal(specd_transformer_forward(t, &bt, &err), 0);
    for (int o = 0; o < NO; o++)
        if (ids[o] != specd_argmax(logits + (size_t)o * VOCAB, VOCAB))
            fail_msg("out %d: argmax %d, specd_argmax of the logits %d", o, ids[o],
                     specd_argmax(logits + (size_t)o * VOCAB, VOCAB));
    /* argmax + hidden, then argmax + logits */
    bt.hidden = hidden2;
    memset(ids2, 0xff, sizeof ids2);
    bt.argmax = ids2;
    assert_int_equal(specd_transformer_forward(t, &bt, &err), 0);
    assert_memory_equal(ids2, ids, sizeof ids);
    assert_close(hidden2, hidden, NO * DIM, 1e-6f);
    bt.hidden = NULL;
    bt.logits = logits2;
    memset(ids2, 0xff, sizeof ids2);
    assert_int_equal(specd_transformer_forward(t, &bt, &err), 0);
    assert_memory_equal(ids2, ids, sizeof ids);
    assert_close(logits2, logits, NO * VOCAB, 1e-6f);
    free(scratch);
    specd_transformer_free(t);
    synth_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_n_positions_equal_n_calls),
        cmocka_unit_test(test_batch_equals_alone),
        cmocka_unit_test(test_tree_mask_and_compaction),
        cmocka_unit_test(test_bad_batches),
        cmocka_unit_test(test_kv_full_fails_cleanly),
        cmocka_unit_test(test_release_slot_returns_pages),
        cmocka_unit_test(test_kv_compact_returns_pages),
        cmocka_unit_test(test_interleaved_slots_small_pool),
        cmocka_unit_test(test_argmax_batch),
        cmocka_unit_test(test_kv_q8_0_needs_wide_heads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
