/* test_spec_model.c - the trainable MLP speculator (tools/train/spec_model.c)
 * and the reduced-vocabulary checkpoints it writes for draft-svc.
 *
 * - The whole model's gradient against central finite differences of its
 *   loss, on a tiny config (vocab 11, emb 6, inner 5, n_predict 3): untied,
 *   tied + scale_input, and over a vocab_map. fp32 forward, central
 *   differences at h = 3e-3 and 6e-3 combined by Richardson extrapolation
 *   (O(h^4) error); the worst difference seen is printed, the bound is
 *   1e-4 + 1e-3 |numeric|.
 * - Export -> specd_mlp_speculator_load -> stages with the same inputs give
 *   spec_model's logits (F32 export: within 1e-5 + 1e-5 |x|, the matmul
 *   summation order; F16: within 2e-2), and with a vocab_map the runtime's
 *   logits are the draft logits scattered to target ids, -inf elsewhere.
 * - The runtime rejects every malformed vocab_map, naming the tensor/key.
 * - The mlp drafter over a reduced vocabulary proposes only mapped tokens.
 * - save_state / load_state is a bit-exact round trip, and refuses a state
 *   of another shape or map.
 * - A short AdamW run on a learnable synthetic sequence cuts the loss. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model/safetensors_write.h"
#include "common/spec/sampling.h"
#include "common/util/small_file.h"
#include "draft-svc/drafter.h"
#include "common/model/mlp_speculator.h"
#include "tests/harness/test_util.h"
#include "tools/train/nn.h"
#include "tools/train/spec_model.h"

#define V 11 /* draft vocabulary */
#define T 20 /* target vocabulary when mapped */
#define E 6
#define D 5
#define P 3
#define ROWS 4

/* Draft id -> target id; draft id 2 is the "other" bucket. */
static const int32_t k_map[V] = {3, 7, -1, 0, 19, 5, 12, 8, 1, 15, 9};

static specd_mlp_spec_config tiny_cfg(int tied, int scale_input) {
    specd_mlp_spec_config c = {.vocab_size = V, .emb_dim = E, .inner_dim = D, .n_predict = P,
                               .top_k = {3, 2, 2}, .n_candidates = 4, .tie_weights = tied,
                               .scale_input = scale_input};
    return c;
}

/* A model with every parameter random (ln weight/bias too, so their
 * gradients are not probed only at 1 and 0). */
static void init_model(spec_model *m, int tied, int scale_input, int mapped, uint64_t seed) {
    specd_mlp_spec_config c = tiny_cfg(tied, scale_input);
    specd_error err = {{0}};
    if (spec_model_init(m, &c, mapped ? T : V, mapped ? k_map : NULL, seed, &err))
        fail_msg("init: %s", err.msg);
    for (int i = 0; i < m->n_tensors; i++)
        if (!m->tensors[i].cols) {
            float base = strstr(m->tensors[i].name, ".weight") ? 1.0f : 0.0f;
            test_fill_random(m->tensors[i].data, m->tensors[i].numel, seed * 31 + i, 0.5f);
            for (size_t j = 0; j < m->tensors[i].numel; j++) m->tensors[i].data[j] += base;
        }
}

typedef struct batch_buf {
    float hidden[ROWS * E];
    int32_t tokens[ROWS * (P + 1)];
    spec_batch b;
} batch_buf;

static void make_batch(batch_buf *bb, uint64_t seed) {
    test_fill_random(bb->hidden, ROWS * E, seed, 2.0f);
    float r[ROWS * (P + 1)];
    test_fill_random(r, ROWS * (P + 1), seed + 1, 1.0f);
    for (int i = 0; i < ROWS * (P + 1); i++) bb->tokens[i] = (int32_t)((r[i] + 1.0f) * 5.4999f);
    bb->tokens[1] = 2; /* the other bucket as an input and a label */
    bb->tokens[P + 1 + 2] = 2;
    bb->b = (spec_batch){.n = ROWS, .hidden = bb->hidden, .tokens = bb->tokens};
}

/* ---- gradient --------------------------------------------------------------------- */

static void check_model_grad(const char *what, int tied, int scale_input, int mapped) {
    spec_model m;
    init_model(&m, tied, scale_input, mapped, 7);
    batch_buf bb;
    make_batch(&bb, 3);
    spec_work *w = spec_work_create(&m, ROWS);
    assert_non_null(w);
    float *g = calloc(m.n_params, sizeof(float));
    float sl[P], sa[P];
    double loss = spec_model_step(&m, w, &bb.b, g, sl, sa);
    assert_true(isfinite(loss) && loss > 0);
    assert_true(fabs(loss - (sl[0] + sl[1] + sl[2])) < 1e-5 * loss);
    /* the forward-only call gives the same loss */
    assert_true(spec_model_step(&m, w, &bb.b, NULL, NULL, NULL) == loss);

    double worst = 0;
    for (size_t i = 0; i < m.n_params; i++) {
        /* Richardson: (4 D(h/2) - D(h)) / 3 cancels the h^2 error term of
         * the central difference D, which the norm's curvature makes large */
        double dh[2];
        for (int k = 0; k < 2; k++) {
            float p0 = m.params[i], h = k ? 6e-3f : 3e-3f;
            m.params[i] = p0 + h;
            double lp = spec_model_step(&m, w, &bb.b, NULL, NULL, NULL);
            m.params[i] = p0 - h;
            double lm = spec_model_step(&m, w, &bb.b, NULL, NULL, NULL);
            m.params[i] = p0;
            dh[k] = (lp - lm) / (2.0 * h);
        }
        double num = (4 * dh[0] - dh[1]) / 3, diff = fabs(num - g[i]);
        if (diff > 1e-4 + 1e-3 * fabs(num))
            fail_msg("%s: param %zu: analytic %.6g, numeric %.6g", what, i, g[i], num);
        if (diff > worst) worst = diff;
    }
    printf("  %-22s %4zu params, worst |diff| %.2e\n", what, m.n_params, worst);
    free(g);
    spec_work_free(w);
    spec_model_free(&m);
}

static void test_gradient(void **state) {
    (void)state;
    check_model_grad("untied", 0, 0, 0);
    check_model_grad("tied + scale_input", 1, 1, 0);
    check_model_grad("untied + vocab_map", 0, 1, 1);
    check_model_grad("tied + vocab_map", 1, 0, 1);
}

/* ---- export ----------------------------------------------------------------------- */

static char *make_tmpdir(void) {
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/specd_spec_XXXXXX");
    if (!mkdtemp(dir)) fail_msg("mkdtemp failed");
    return dir;
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

/* Runs the exported checkpoint stage by stage on the batch (target ids,
 * state carried between stages) and compares every logit with
 * spec_model_logits. */
static void check_export(const char *what, int tied, int scale_input, int mapped,
                         const char *dtype, double tol) {
    spec_model m;
    init_model(&m, tied, scale_input, mapped, 11);
    batch_buf bb;
    make_batch(&bb, 5);
    char *dir = make_tmpdir();
    specd_error err = {{0}};
    if (spec_model_export(&m, dir, dtype, &err)) fail_msg("export: %s", err.msg);
    specd_mlp_speculator *sp = specd_mlp_speculator_load(dir, 1, &err);
    if (!sp) fail_msg("load: %s", err.msg);
    const specd_mlp_spec_config *c = specd_mlp_speculator_config(sp);
    assert_int_equal(c->vocab_size, V);
    assert_int_equal(c->target_vocab_size, mapped ? T : V);
    assert_int_equal(c->vocab_mapped, mapped);
    assert_int_equal(c->tie_weights, tied);
    assert_int_equal(c->scale_input, scale_input);
    int W = c->target_vocab_size;

    spec_work *w = spec_work_create(&m, ROWS);
    float want[ROWS * V], got[ROWS * T], in[ROWS * E], out[ROWS * D];
    int32_t tok[ROWS];
    memcpy(in, bb.hidden, sizeof in);
    double worst = 0;
    for (int s = 0; s < P; s++) {
        for (int r = 0; r < ROWS; r++) {
            int32_t d = bb.tokens[r * (P + 1) + s];
            /* the runtime reads target ids; an unmapped one (4) means "other" */
            tok[r] = !mapped ? d : k_map[d] >= 0 ? k_map[d] : 4;
        }
        if (specd_mlp_speculator_stage(sp, s, ROWS, in, tok, out, got, &err))
            fail_msg("stage %d: %s", s, err.msg);
        assert_int_equal(spec_model_logits(&m, w, &bb.b, s, want), 0);
        for (int r = 0; r < ROWS; r++) {
            int finite = 0;
            for (int t = 0; t < W; t++) finite += isfinite(got[r * W + t]);
            assert_int_equal(finite, mapped ? V - 1 : V); /* the other bucket is not a column */
            for (int d = 0; d < V; d++) {
                int t = mapped ? k_map[d] : d;
                if (t < 0) continue;
                double a = got[r * W + t], b = want[r * V + d], diff = fabs(a - b);
                if (diff > tol * (1 + fabs(b)))
                    fail_msg("%s stage %d row %d draft %d: runtime %.7g, trainer %.7g", what, s,
                             r, d, a, b);
                if (diff > worst) worst = diff;
            }
            if (mapped)
                for (int t = 0; t < T; t++) {
                    int in_map = 0;
                    for (int d = 0; d < V; d++) in_map |= k_map[d] == t;
                    if (!in_map) assert_true(got[r * W + t] == -INFINITY);
                }
        }
        memcpy(in, out, sizeof(float) * ROWS * D);
    }
    printf("  %-28s worst |diff| %.2e\n", what, worst);
    spec_work_free(w);
    specd_mlp_speculator_free(sp);
    spec_model_free(&m);
    remove_dir(dir);
}

static void test_export_matches_runtime(void **state) {
    (void)state;
    check_export("F32 untied", 0, 0, 0, "F32", 1e-5);
    check_export("F32 tied + scale_input", 1, 1, 0, "F32", 1e-5);
    check_export("F32 untied + vocab_map", 0, 1, 1, "F32", 1e-5);
    check_export("F32 tied + vocab_map", 1, 0, 1, "F32", 1e-5);
    check_export("F16 untied + vocab_map", 0, 0, 1, "F16", 2e-2);
    check_export("BF16 tied", 1, 0, 0, "BF16", 1e-1);

    spec_model m;
    init_model(&m, 0, 0, 0, 1);
    specd_error err = {{0}};
    assert_int_equal(spec_model_export(&m, "/tmp", "Q8_0", &err), -1);
    assert_non_null(strstr(err.msg, "Q8_0"));
    spec_model_free(&m);
}

/* ---- the runtime's vocab_map checks ------------------------------------------------ */

/* Writes model.safetensors with m's tensors plus `map` (F32 when as_f32,
 * omitted when NULL) and a config.json with or without target_vocab_size. */
static void write_checkpoint(const char *dir, const spec_model *m, const int32_t *map,
                             int as_f32, int with_target_vocab) {
    safetensors_out outs[5 * P + 1];
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct spec_tensor *t = &m->tensors[i];
        outs[n] = (safetensors_out){.name = t->name, .type = SPECD_F32,
                                    .n_dims = t->cols ? 2 : 1, .data = t->data};
        outs[n].shape[0] = (uint64_t)t->rows;
        outs[n++].shape[1] = (uint64_t)t->cols;
    }
    float fmap[V];
    for (int i = 0; i < V; i++) fmap[i] = map ? (float)map[i] : 0.0f;
    if (map)
        outs[n++] = (safetensors_out){.name = "speculator.vocab_map",
                                      .type = as_f32 ? SPECD_F32 : SPECD_I32, .n_dims = 1,
                                      .shape = {V}, .data = as_f32 ? (const void *)fmap : map};
    char path[256], cfg[512];
    specd_error err = {{0}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (safetensors_write(path, outs, n, NULL, NULL, 0, &err)) fail_msg("%s", err.msg);
    int len = snprintf(cfg, sizeof cfg,
                       "{\"model_type\": \"mlp_speculator\", \"vocab_size\": %d, \"emb_dim\": %d, "
                       "\"inner_dim\": %d, \"n_predict\": %d, \"top_k_tokens_per_head\": [3, 2, "
                       "2]%s}", V, E, D, P, with_target_vocab ? ", \"target_vocab_size\": 20" : "");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (specd_write_small_file(path, cfg, (size_t)len, &err)) fail_msg("%s", err.msg);
}

static void expect_load_error(const char *dir, const char *needle) {
    specd_error err = {{0}};
    specd_mlp_speculator *sp = specd_mlp_speculator_load(dir, 1, &err);
    if (sp) fail_msg("loaded; expected an error with '%s'", needle);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' lacks '%s'", err.msg, needle);
}

static void test_runtime_rejects_bad_maps(void **state) {
    (void)state;
    spec_model m;
    init_model(&m, 0, 0, 0, 2);
    char *dir = make_tmpdir();
    specd_error err = {{0}};

    write_checkpoint(dir, &m, k_map, 0, 1); /* the good one loads */
    specd_mlp_speculator *sp = specd_mlp_speculator_load(dir, 1, &err);
    if (!sp) fail_msg("%s", err.msg);
    specd_mlp_speculator_free(sp);

    int32_t bad[V];
    memcpy(bad, k_map, sizeof bad);
    bad[5] = 7; /* target 7 twice */
    write_checkpoint(dir, &m, bad, 0, 1);
    expect_load_error(dir, "target id 7 appears");
    memcpy(bad, k_map, sizeof bad);
    bad[0] = -1; /* two other buckets */
    write_checkpoint(dir, &m, bad, 0, 1);
    expect_load_error(dir, "both -1");
    memcpy(bad, k_map, sizeof bad);
    bad[4] = 20; /* past target_vocab_size */
    write_checkpoint(dir, &m, bad, 0, 1);
    expect_load_error(dir, "speculator.vocab_map'[4] = 20");
    memcpy(bad, k_map, sizeof bad);
    bad[2] = 4; /* 11 of 20 mapped, no other bucket */
    write_checkpoint(dir, &m, bad, 0, 1);
    expect_load_error(dir, "no -1 'other'");
    write_checkpoint(dir, &m, k_map, 1, 1);
    expect_load_error(dir, "must be I32");
    write_checkpoint(dir, &m, NULL, 0, 1);
    expect_load_error(dir, "'speculator.vocab_map' is missing");
    write_checkpoint(dir, &m, k_map, 0, 0);
    expect_load_error(dir, "needs 'target_vocab_size'");

    /* the config alone: more draft rows than target ids can take */
    const char *cfg = "{\"vocab_size\": 12, \"emb_dim\": 4, \"n_predict\": 3, "
                      "\"target_vocab_size\": 10}";
    specd_mlp_spec_config c;
    assert_int_equal(specd_mlp_spec_parse_config(cfg, strlen(cfg), &c, &err), -1);
    assert_non_null(strstr(err.msg, "'target_vocab_size' = 10"));
    spec_model_free(&m);
    remove_dir(dir);
}

/* ---- the drafter over a reduced vocabulary ------------------------------------------ */

static int is_mapped(int32_t t) {
    for (int d = 0; d < V; d++)
        if (k_map[d] == t) return 1;
    return 0;
}

static void test_drafter_over_vocab_map(void **state) {
    (void)state;
    spec_model m;
    init_model(&m, 0, 0, 1, 4);
    char *dir = make_tmpdir();
    specd_error err = {{0}};
    if (spec_model_export(&m, dir, "F32", &err)) fail_msg("%s", err.msg);
    /* top-k 16 per stage: more than the 10 mapped tokens, so greedy meets
     * -inf logits in its top-k and must not propose them */
    specd_mlp_drafter_opts o = {.path = dir, .n_threads = 1, .top_k_per_stage = {16, 16, 16}};
    specd_drafter *d = specd_mlp_drafter_create(&o, &err);
    if (!d) fail_msg("%s", err.msg);
    assert_int_equal(d->vocab, T);

    float hidden[E];
    test_fill_random(hidden, E, 9, 1.0f);
    int32_t history[3] = {4, 7, 6}; /* pending token 6: unmapped, read as "other" */
    specd_token_counts counts;
    assert_int_equal(specd_token_counts_init(&counts, T, &err), 0);
    specd_tree_buf out;
    assert_int_equal(specd_tree_buf_init(&out, 256, 256 * 64, &err), 0);
    for (int sampling = 0; sampling < 2; sampling++) {
        specd_sampling s;
        specd_sampling_init(&s);
        s.temperature = sampling ? 1.0f : 0.0f;
        s.seed = 5;
        specd_tree_buf_reset(&out);
        specd_draft_job job = {.history = history, .n_history = 3, .n_prompt = 2,
                               .hidden = hidden, .sampling = &s, .counts = &counts,
                               .position = 3, .candidates = sampling ? 8 : 64, .depth = P,
                               .out = &out};
        if (specd_drafter_propose(d, &job, 1, &err)) fail_msg("%s", err.msg);
        /* greedy with room for all: 10 mapped children of the root, never 16 */
        if (!sampling) {
            int roots = 0;
            for (int i = 0; i < out.n_nodes; i++) roots += out.parents[i] == -1;
            assert_int_equal(roots, V - 1);
        }
        assert_true(out.n_nodes > 0);
        for (int i = 0; i < out.n_nodes; i++) {
            assert_true(is_mapped(out.tokens[i]));
            assert_true(isfinite(out.logq[i]));
        }
        if (sampling)
            for (int p = 0; p <= out.n_nodes; p++)
                for (int k = 0; k < out.q[p].n; k++) assert_true(is_mapped(out.q[p].ids[k]));
    }
    specd_tree_buf_free(&out);
    specd_token_counts_free(&counts);
    specd_drafter_free(d);
    spec_model_free(&m);
    remove_dir(dir);
}

/* ---- training state --------------------------------------------------------------- */

static void test_state_round_trip(void **state) {
    (void)state;
    spec_model a, b;
    init_model(&a, 0, 1, 1, 21);
    init_model(&b, 0, 1, 1, 22);
    float *am = malloc(sizeof(float) * a.n_params), *av = malloc(sizeof(float) * a.n_params);
    float *bm = calloc(a.n_params, sizeof(float)), *bv = calloc(a.n_params, sizeof(float));
    test_fill_random(am, a.n_params, 1, 1e-2f);
    test_fill_random(av, a.n_params, 2, 1e-4f);
    char *dir = make_tmpdir(), path[128];
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    specd_error err = {{0}};
    const char *meta = "{\"step\": 42, \"note\": \"quote \\\" and \\u00e9\"}";
    if (spec_model_save_state(&a, am, av, meta, path, &err)) fail_msg("%s", err.msg);
    char *got = NULL;
    if (spec_model_load_state(&b, bm, bv, &got, path, &err)) fail_msg("%s", err.msg);
    assert_memory_equal(a.params, b.params, sizeof(float) * a.n_params);
    assert_memory_equal(am, bm, sizeof(float) * a.n_params);
    assert_memory_equal(av, bv, sizeof(float) * a.n_params);
    assert_string_equal(got, meta);
    free(got);

    /* another shape (tied) or another map: refused */
    spec_model c;
    init_model(&c, 1, 1, 1, 23);
    assert_int_equal(spec_model_load_state(&c, bm, bv, &got, path, &err), -1);
    assert_non_null(strstr(err.msg, "tensors"));
    spec_model_free(&c);
    init_model(&c, 0, 1, 0, 23); /* no map; vocab 11 = target */
    assert_int_equal(spec_model_load_state(&c, bm, bv, &got, path, &err), -1);
    spec_model_free(&c);
    /* an exported checkpoint is not a training state */
    if (spec_model_export(&a, dir, "F32", &err)) fail_msg("%s", err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(spec_model_load_state(&b, bm, bv, &got, path, &err), -1);
    assert_non_null(strstr(err.msg, "not a speculator training state"));

    free(am);
    free(av);
    free(bm);
    free(bv);
    spec_model_free(&a);
    spec_model_free(&b);
    remove_dir(dir);
}

/* An exported checkpoint read back into a model (specd train speculator
 * --eval, and --init's starting point): F32 exactly, F16 to its rounding; its vocab_map is read; a
 * model of another shape or map is refused. */
static void test_export_load_round_trip(void **state) {
    (void)state;
    spec_model a, b;
    for (int tied = 0; tied < 2; tied++) {
        init_model(&a, tied, 1, 1, 31);
        init_model(&b, tied, 1, 1, 32);
        char *dir = make_tmpdir();
        specd_error err = {{0}};
        int32_t *map = NULL;
        int n_map = -1;
        if (spec_model_export(&a, dir, "F32", &err)) fail_msg("%s", err.msg);
        if (spec_model_read_vocab_map(dir, &map, &n_map, &err)) fail_msg("%s", err.msg);
        assert_int_equal(n_map, V);
        assert_memory_equal(map, k_map, sizeof k_map);
        free(map);
        if (spec_model_load_export(&b, dir, &err)) fail_msg("%s", err.msg);
        assert_memory_equal(a.params, b.params, sizeof(float) * a.n_params);

        if (spec_model_export(&a, dir, "F16", &err)) fail_msg("%s", err.msg);
        test_fill_random(b.params, b.n_params, 5, 1.0f);
        if (spec_model_load_export(&b, dir, &err)) fail_msg("%s", err.msg);
        for (size_t i = 0; i < a.n_params; i++)
            assert_float_equal(b.params[i], specd_fp16_to_f32(specd_f32_to_fp16(a.params[i])), 0);

        spec_model c;
        init_model(&c, !tied, 1, 1, 33); /* other tying: other tensors */
        assert_int_equal(spec_model_load_export(&c, dir, &err), -1);
        spec_model_free(&c);
        init_model(&c, tied, 1, 0, 33); /* no map */
        assert_int_equal(spec_model_load_export(&c, dir, &err), -1);
        assert_non_null(strstr(err.msg, "vocab_map"));
        spec_model_free(&c);
        spec_model_free(&a);
        spec_model_free(&b);
        remove_dir(dir);
    }
}

/* ---- init and the draft-id map ------------------------------------------------------- */

static void test_init_and_draft_ids(void **state) {
    (void)state;
    spec_model m;
    init_model(&m, 1, 0, 1, 3);
    /* tied: emb/head/ln shared, proj.1 serves stages 1 and 2 */
    assert_int_equal(m.n_tensors, 6);
    assert_ptr_equal(m.emb[2], m.emb[0]);
    assert_ptr_equal(m.proj[2], m.proj[1]);
    assert_ptr_not_equal(m.proj[1], m.proj[0]);
    assert_int_equal(m.n_params, (size_t)(2 * V * D + D * E + D * D + 2 * D));
    assert_int_equal(spec_model_draft_id(&m, 7), 1);
    assert_int_equal(spec_model_draft_id(&m, 4), 2); /* unmapped: the other bucket */
    assert_int_equal(spec_model_draft_id(&m, 20), -1);
    spec_model_free(&m);

    specd_mlp_spec_config c = tiny_cfg(0, 0);
    specd_error err = {{0}};
    assert_int_equal(spec_model_init(&m, &c, T, NULL, 1, &err), -1); /* 11 != 20 unmapped */
    int32_t dup[V];
    memcpy(dup, k_map, sizeof dup);
    dup[1] = 3;
    assert_int_equal(spec_model_init(&m, &c, T, dup, 1, &err), -1);
    assert_non_null(strstr(err.msg, "vocab_map[1] = 3"));

    /* initialization follows the header: emb ~ N(0, 1/sqrt(inner)) */
    specd_mlp_spec_config big = {.vocab_size = 512, .emb_dim = 64, .inner_dim = 64,
                                 .n_predict = 2, .top_k = {2, 2}, .n_candidates = 2};
    assert_int_equal(spec_model_init(&m, &big, 512, NULL, 9, &err), 0);
    double s = 0, ss = 0;
    size_t n = m.tensors[0].numel;
    for (size_t i = 0; i < n; i++) {
        s += m.tensors[0].data[i];
        ss += (double)m.tensors[0].data[i] * m.tensors[0].data[i];
    }
    double mean = s / n, sd = sqrt(ss / n - mean * mean);
    assert_true(fabs(mean) < 0.01 && fabs(sd - 0.125) < 0.005);
    spec_model_free(&m);
}

/* ---- learning ----------------------------------------------------------------------- */

/* Token sequences t_{k+1} = (3 t_k + 1) mod 11: each stage can learn its
 * label from its input token alone. 300 AdamW steps on batches of 32 take
 * the loss from ~3 ln 11 = 7.2 to well under a tenth of that. */
static void test_training_lowers_loss(void **state) {
    (void)state;
    specd_mlp_spec_config c = {.vocab_size = V, .emb_dim = 8, .inner_dim = 16, .n_predict = P,
                               .top_k = {3, 2, 2}, .n_candidates = 4};
    spec_model m;
    specd_error err = {{0}};
    assert_int_equal(spec_model_init(&m, &c, V, NULL, 1, &err), 0);
    enum { B = 32, STEPS = 300 };
    spec_work *w = spec_work_create(&m, B);
    float *g = malloc(sizeof(float) * m.n_params), *am = calloc(m.n_params, sizeof(float)),
          *av = calloc(m.n_params, sizeof(float));
    float hidden[B * 8];
    int32_t tokens[B * (P + 1)];
    nn_adamw opt = {.beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f};
    double first = 0, last = 0;
    for (long step = 0; step < STEPS; step++) {
        test_fill_random(hidden, B * 8, 1000 + step, 1.0f); /* noise: no information */
        for (int r = 0; r < B; r++) {
            int32_t t = (int32_t)((r * 7 + step * 3) % V);
            for (int k = 0; k <= P; k++, t = (3 * t + 1) % V) tokens[r * (P + 1) + k] = t;
        }
        spec_batch b = {.n = B, .hidden = hidden, .tokens = tokens};
        memset(g, 0, sizeof(float) * m.n_params);
        double loss = spec_model_step(&m, w, &b, g, NULL, NULL);
        if (step == 0) first = loss;
        last = loss;
        float lr = nn_lr_at(step, 20, STEPS, 2e-2f, 0.1f);
        for (int i = 0; i < m.n_tensors; i++) {
            struct spec_tensor *t = &m.tensors[i];
            size_t off = (size_t)(t->data - m.params);
            nn_adamw_update(&opt, step + 1, lr, t->decay ? 0.01f : 0.0f, t->data, g + off,
                            am + off, av + off, t->numel);
        }
    }
    printf("  loss %.3f -> %.3f\n", first, last);
    assert_true(first > 6.0);
    assert_true(last < 0.1 * first);
    free(g);
    free(am);
    free(av);
    spec_work_free(w);
    spec_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_and_draft_ids),
        cmocka_unit_test(test_gradient),
        cmocka_unit_test(test_export_matches_runtime),
        cmocka_unit_test(test_runtime_rejects_bad_maps),
        cmocka_unit_test(test_drafter_over_vocab_map),
        cmocka_unit_test(test_state_round_trip),
        cmocka_unit_test(test_export_load_round_trip),
        cmocka_unit_test(test_training_lowers_loss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
