/* test_spec_data.c - the speculator trainer's data pipeline
 * (tools/train/spec_data.c) on the tiny test model.
 *
 * Target: tests/golden/data/tiny-gqa/hf (vocab 512, hidden 64), default
 * (fast) precision as `specd train speculator` runs it; tokenizer: the tiny
 * Llama-3 tokenizer.json of the tokenizer tests, on prompts whose ids all
 * fall inside the tiny model's vocabulary. Checks:
 *   - sharded stage-1 data equals one uninterrupted encode; a build that
 *     fails part-way leaves only complete shards, and the next call builds
 *     only the missing ones and ends with the same data; other settings or
 *     a damaged shard file are rebuilt;
 *   - greedy stage-2 rows equal a plain one-sequence greedy decode (tokens
 *     and hidden states), several prompts decoded side by side;
 *   - a shard of prompts (first_prompt) gives the same rows as the whole
 *     set, with a sampled mix; a sampled fraction of 1 changes the rows; the
 *     sampled fraction picks about that share of prompts.
 * About a second. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/util/dtype.h"
#include "common/model/model_file.h"
#include "common/text/tokenizer.h"
#include "common/model/transformer.h"
#include "tests/harness/test_util.h"
#include "tools/train/corpus.h"
#include "tools/train/spec_data.h"

#define MODEL "tests/golden/data/tiny-gqa/hf"
#define TOKENIZER "tests/golden/tokenizer/tiny_llama3_tokenizer.json"
#define V 512
#define SEQ 24
#define N_WIN 7
#define BATCH 2
#define GEN 12
#define MAX_PROMPT 32
#define LANES 3

typedef struct fixture {
    specd_model_file *mf;
    specd_transformer *t;
    specd_tokenizer *tok;
    int32_t stream[N_WIN * SEQ];
    char dir[256];
} fixture;

static fixture F;

static int setup(void **state) {
    (void)state;
    specd_error err = {0};
    if (!(F.mf = specd_model_open(test_path(MODEL), &err))) fail_msg("%s", err.msg);
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 1}, .n_slots = LANES,
                                .max_ctx = MAX_PROMPT + GEN + 1, .max_batch = BATCH * SEQ};
    if (!(F.t = specd_transformer_create(F.mf, &o, &err))) fail_msg("%s", err.msg);
    if (!(F.tok = specd_tokenizer_from_json(test_path(TOKENIZER), &err))) fail_msg("%s", err.msg);
    for (int i = 0; i < N_WIN * SEQ; i++) F.stream[i] = (int32_t)((i * 131 + 7) % V);
    snprintf(F.dir, sizeof F.dir, "/tmp/specd_specdata_%d", (int)getpid());
    mkdir(F.dir, 0755);
    return 0;
}

static void clear_dir(void) {
    char path[512];
    for (int k = 0; k < 16; k++) {
        snprintf(path, sizeof path, "%s/s1-%05d.safetensors", F.dir, k);
        unlink(path);
        snprintf(path, sizeof path, "%s/s1-%05d.safetensors.tmp", F.dir, k);
        unlink(path);
    }
}

static int teardown(void **state) {
    (void)state;
    clear_dir();
    rmdir(F.dir);
    specd_tokenizer_free(F.tok);
    specd_transformer_free(F.t);
    specd_model_close(F.mf);
    return 0;
}

static void assert_seqs_equal(const spec_seqs *a, const spec_seqs *b) {
    assert_int_equal(a->n_seqs, b->n_seqs);
    assert_int_equal(a->seq_len, b->seq_len);
    assert_int_equal(a->dim, b->dim);
    size_t n = (size_t)a->n_seqs * a->seq_len;
    assert_memory_equal(a->len, b->len, sizeof(int32_t) * a->n_seqs);
    assert_memory_equal(a->tokens, b->tokens, sizeof(int32_t) * n);
    assert_memory_equal(a->hidden, b->hidden, sizeof(uint16_t) * n * a->dim);
}

/* ---- stage 1 shards ---------------------------------------------------------- */

typedef struct shard_ctx {
    long fail_at; /* first row of the shard whose build fails; -1 = none */
    int calls;
} shard_ctx;

static int build_windows(void *vctx, long first, int count, spec_seqs *out, specd_error *err) {
    shard_ctx *c = vctx;
    c->calls++;
    if (first == c->fail_at) return specd_seterr(err, "interrupted at row %ld", first);
    return spec_data_encode_windows(F.t, F.stream, SEQ, BATCH, first, count, out, NULL, NULL, err);
}

static void test_shards_resume(void **state) {
    (void)state;
    specd_error err = {0};
    clear_dir();
    spec_seqs ref = {0}, got = {0};
    /* The uninterrupted, unsharded reference. */
    assert_int_equal(spec_data_encode_windows(F.t, F.stream, SEQ, BATCH, 0, N_WIN, &ref, NULL,
                                              NULL, &err), 0);
    assert_int_equal(ref.n_seqs, N_WIN);
    for (int r = 0; r < N_WIN; r++) assert_int_equal(ref.len[r], SEQ);
    assert_memory_equal(ref.tokens, F.stream, sizeof(F.stream));

    /* 7 rows in shards of 2: 4 shards; the third fails. */
    shard_ctx c = {.fail_at = 4};
    int built = -1;
    assert_int_equal(spec_data_sharded(F.dir, "s1", "m1", N_WIN, 2, build_windows, &c, &got,
                                       &built, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "interrupted at row 4"));
    assert_null(got.tokens);
    char path[512];
    for (int k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "%s/s1-%05d.safetensors", F.dir, k);
        assert_int_equal(test_file_exists(path), k < 2);
        snprintf(path, sizeof path, "%s/s1-%05d.safetensors.tmp", F.dir, k);
        assert_false(test_file_exists(path));
    }

    /* Resumed: only shards 2 and 3 are built, and the data is the same. */
    c = (shard_ctx){.fail_at = -1};
    assert_int_equal(spec_data_sharded(F.dir, "s1", "m1", N_WIN, 2, build_windows, &c, &got,
                                       &built, NULL, &err), 0);
    assert_int_equal(built, 2);
    assert_int_equal(c.calls, 2);
    assert_seqs_equal(&ref, &got);
    spec_seqs_free(&got);

    /* Complete: nothing is built. */
    c = (shard_ctx){.fail_at = -1};
    assert_int_equal(spec_data_sharded(F.dir, "s1", "m1", N_WIN, 2, build_windows, &c, &got,
                                       &built, NULL, &err), 0);
    assert_int_equal(built, 0);
    assert_int_equal(c.calls, 0);
    assert_seqs_equal(&ref, &got);
    spec_seqs_free(&got);

    /* A damaged shard (cut short) is rebuilt, and only it. */
    snprintf(path, sizeof path, "%s/s1-%05d.safetensors", F.dir, 1);
    assert_int_equal(truncate(path, 100), 0);
    c = (shard_ctx){.fail_at = -1};
    assert_int_equal(spec_data_sharded(F.dir, "s1", "m1", N_WIN, 2, build_windows, &c, &got,
                                       &built, NULL, &err), 0);
    assert_int_equal(built, 1);
    assert_seqs_equal(&ref, &got);
    spec_seqs_free(&got);

    /* Other settings: every shard is rebuilt. */
    c = (shard_ctx){.fail_at = -1};
    assert_int_equal(spec_data_sharded(F.dir, "s1", "m2", N_WIN, 2, build_windows, &c, &got,
                                       &built, NULL, &err), 0);
    assert_int_equal(built, 4);
    assert_seqs_equal(&ref, &got);
    spec_seqs_free(&got);

    /* Other shard sizes: the row ranges differ, so shards are rebuilt too;
     * the data is the same. */
    c = (shard_ctx){.fail_at = -1};
    assert_int_equal(spec_data_sharded(F.dir, "s1", "m2", N_WIN, 3, build_windows, &c, &got,
                                       &built, NULL, &err), 0);
    assert_int_equal(built, 3);
    assert_seqs_equal(&ref, &got);
    spec_seqs_free(&got);
    spec_seqs_free(&ref);
}

/* ---- stage 2 ------------------------------------------------------------------- */

static const char *const PROMPTS[] = {
    "zq 17 kx 5", "vw 9 jz 3 q", "x 2 v 4 z 6 k", "kk 8 zz 1", "q 7 w 3 v", "jx 4 4 zq 0 0",
};
#define N_PROMPTS ((int)(sizeof PROMPTS / sizeof PROMPTS[0]))

static void make_prompts(corpus *c) {
    char buf[1024];
    size_t n = 0;
    for (int i = 0; i < N_PROMPTS; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", i ? "\n\f\n" : "", PROMPTS[i]);
    specd_error err = {0};
    memset(c, 0, sizeof(*c));
    if (corpus_read_buffer(c, "prompts.txt", buf, n, 0, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal((int)c->n_docs, N_PROMPTS);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Plain greedy decode of one prompt in slot 0: the row spec_data_generate
 * should make for it. Returns its length. */
static int reference_row(const corpus_doc *doc, int32_t *tokens, uint16_t *hidden) {
    specd_error err = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(specd_tokenize(F.tok, doc->text, doc->len, 0, &ids, &n_ids, &err), 0);
    assert_true(n_ids > 0 && n_ids <= MAX_PROMPT);
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] >= V) fail_msg("prompt '%s' has id %d outside the tiny vocabulary", doc->text, ids[i]);
    float logits[V], h[64];
    int dim = specd_transformer_hparams(F.t)->dim;
    assert_int_equal(dim, 64);
    int32_t last = (int32_t)n_ids - 1;
    specd_seq_input s = {.slot = 0, .n_past = 0, .n_new = (int)n_ids};
    specd_batch b = {.n_tokens = (int)n_ids, .tokens = ids, .n_seqs = 1, .seqs = &s, .n_out = 1,
                     .out_rows = &last, .logits = logits, .hidden = h};
    assert_int_equal(specd_transformer_forward(F.t, &b, &err), 0);
    tokens[0] = ids[n_ids - 1];
    for (int k = 0; k < dim; k++) hidden[k] = specd_f32_to_fp16(h[k]);
    int n_past = (int)n_ids, len = 1;
    free(ids);
    for (;;) {
        int32_t next = argmax(logits, V), row0 = 0;
        s = (specd_seq_input){.slot = 0, .n_past = n_past, .n_new = 1};
        b = (specd_batch){.n_tokens = 1, .tokens = &next, .n_seqs = 1, .seqs = &s, .n_out = 1,
                          .out_rows = &row0, .logits = logits, .hidden = h};
        assert_int_equal(specd_transformer_forward(F.t, &b, &err), 0);
        tokens[len] = next;
        for (int k = 0; k < dim; k++) hidden[(size_t)len * dim + k] = specd_f32_to_fp16(h[k]);
        len++, n_past++;
        if (specd_tokenizer_is_end(F.tok, next) || len >= GEN + 1) break;
    }
    specd_transformer_release_slot(F.t, 0);
    return len;
}

static spec_gen_opts gen_opts(float frac, long first, long max) {
    return (spec_gen_opts){.gen_len = GEN, .max_prompt = MAX_PROMPT, .n_parallel = LANES,
                           .sampled_frac = frac, .temperature = 1.0f, .top_k = 0, .seed = 42,
                           .first_prompt = first, .max_prompts = max};
}

static void test_greedy_equals_decode(void **state) {
    (void)state;
    specd_error err = {0};
    corpus c;
    make_prompts(&c);
    spec_gen_opts o = gen_opts(0, 0, 0);
    spec_seqs got = {0};
    if (spec_data_generate(F.t, F.tok, &c, &o, &got, NULL, NULL, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(got.n_seqs, N_PROMPTS);
    assert_int_equal(got.seq_len, GEN + 1);
    int32_t tokens[GEN + 1];
    uint16_t hidden[(GEN + 1) * 64];
    int total = 0;
    for (int r = 0; r < N_PROMPTS; r++) {
        int len = reference_row(&c.docs[r], tokens, hidden);
        total += len;
        assert_int_equal(got.len[r], len);
        assert_memory_equal(got.tokens + (size_t)r * (GEN + 1), tokens, sizeof(int32_t) * len);
        assert_memory_equal(got.hidden + (size_t)r * (GEN + 1) * 64, hidden,
                            sizeof(uint16_t) * len * 64);
    }
    assert_true(total > 2 * N_PROMPTS); /* rows of more than the prompt's last token */
    spec_seqs_free(&got);
    corpus_free(&c);
}

static void test_prompt_shards_and_sampling(void **state) {
    (void)state;
    specd_error err = {0};
    corpus c;
    make_prompts(&c);
    size_t L = GEN + 1;
    /* A mixed set: some prompts sampled, some greedy. */
    spec_gen_opts all = gen_opts(0.5f, 0, 0);
    int n_sampled = 0;
    for (int i = 0; i < N_PROMPTS; i++) n_sampled += spec_gen_is_sampled(&all, i);
    spec_seqs whole = {0}, part = {0}, greedy = {0};
    assert_int_equal(spec_data_generate(F.t, F.tok, &c, &all, &whole, NULL, NULL, &err), 0);
    /* Prompts 2..4 alone give rows 2..4 of the whole set. */
    spec_gen_opts sh = gen_opts(0.5f, 2, 3);
    assert_int_equal(spec_data_generate(F.t, F.tok, &c, &sh, &part, NULL, NULL, &err), 0);
    assert_int_equal(part.n_seqs, 3);
    assert_memory_equal(part.len, whole.len + 2, sizeof(int32_t) * 3);
    assert_memory_equal(part.tokens, whole.tokens + 2 * L, sizeof(int32_t) * 3 * L);
    assert_memory_equal(part.hidden, whole.hidden + 2 * L * 64, sizeof(uint16_t) * 3 * L * 64);
    spec_seqs_free(&part);

    /* Greedy rows equal the whole set's greedy prompts; all sampled differs
     * somewhere from all greedy. */
    spec_gen_opts g = gen_opts(0, 0, 0);
    assert_int_equal(spec_data_generate(F.t, F.tok, &c, &g, &greedy, NULL, NULL, &err), 0);
    for (int r = 0; r < N_PROMPTS; r++)
        if (!spec_gen_is_sampled(&all, r)) {
            assert_int_equal(greedy.len[r], whole.len[r]);
            assert_memory_equal(greedy.tokens + r * L, whole.tokens + r * L,
                                sizeof(int32_t) * whole.len[r]);
        }
    spec_gen_opts s = gen_opts(1.0f, 0, 0);
    assert_int_equal(spec_data_generate(F.t, F.tok, &c, &s, &part, NULL, NULL, &err), 0);
    assert_memory_not_equal(part.tokens, greedy.tokens, sizeof(int32_t) * N_PROMPTS * L);
    spec_seqs_free(&part);
    spec_seqs_free(&greedy);
    spec_seqs_free(&whole);
    corpus_free(&c);

    /* The fraction: about that share of prompts; none at 0 or at T 0. */
    spec_gen_opts f = gen_opts(0.25f, 0, 0);
    int n = 0;
    for (int i = 0; i < 4000; i++) n += spec_gen_is_sampled(&f, i);
    assert_in_range(n, 900, 1100);
    f.sampled_frac = 0;
    for (int i = 0; i < 100; i++) assert_false(spec_gen_is_sampled(&f, i));
    f.sampled_frac = 1, f.temperature = 0;
    for (int i = 0; i < 100; i++) assert_false(spec_gen_is_sampled(&f, i));
    assert_in_range(n_sampled, 1, N_PROMPTS - 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shards_resume),
        cmocka_unit_test(test_greedy_equals_decode),
        cmocka_unit_test(test_prompt_shards_and_sampling),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
