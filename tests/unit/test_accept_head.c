/* test_accept_head.c - the SpecDec++ acceptance head (draft-svc/
 * accept_head.c) and the adaptive length it gives the MLP drafter
 * (draft-svc/drafter_mlp.c).
 *
 * The head: config.json parsing and its errors, save/load round trips,
 * every kind of bad file naming its tensor or key, and the forward pass
 * against a hand-computed example. The drafter: heads whose output the test
 * controls (all weights 0 and out.bias b give p = sigmoid(b) everywhere; a
 * one-unit head reading one state coordinate gives a p that varies by
 * node) must stop paths exactly where 1 - prod p > threshold says, never
 * before min_depth nor past depth, leave the tree unchanged at threshold 0,
 * rank greedy branches by log q + log P, and in sampling mode only cut
 * chains short, never change their draws. A head with draft features
 * (the row's two largest probabilities beside the state) must add W_d f as
 * the formula says, refuse a call without them, and stop a drafter's chain
 * exactly where a feature head says the row is too unsure. Speculators: the
 * tiny fixtures of
 * tests/golden/data/mlp-spec-*. */
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

#include "common/model/safetensors_write.h"
#include "common/spec/sampling.h"
#include "common/spec/tree.h"
#include "common/model/accept_head.h"
#include "draft-svc/drafter.h"
#include "common/model/mlp_speculator.h"
#include "tests/harness/test_util.h"

#define UNTIED "tests/golden/data/mlp-spec-untied"   /* vocab 100, emb 32, inner 48, top_k [4,3,2] */
#define SHARDED "tests/golden/data/mlp-spec-sharded" /* vocab 80, inner 48, n_predict 4 */
#define INNER 48
#define CAP 256

/* ---- helpers ---------------------------------------------------------------------- */

/* Weights of a config, all zero, owned in one buffer. */
typedef struct head_buf {
    specd_accept_head_config cfg;
    float *buf;
    float *in_w, *in_b, *emb, *out_w, *draft_w;
    float *fc1_w[SPECD_ACCEPT_HEAD_MAX_LAYERS], *fc1_b[SPECD_ACCEPT_HEAD_MAX_LAYERS];
    float *fc2_w[SPECD_ACCEPT_HEAD_MAX_LAYERS], *fc2_b[SPECD_ACCEPT_HEAD_MAX_LAYERS];
    specd_accept_head_weights w;
} head_buf;

/* F: draft features, 0 or SPECD_ACCEPT_HEAD_DRAFT_FEATURES */
static void hb_init_f(head_buf *h, int D, int H, int L, int S, int F) {
    memset(h, 0, sizeof *h);
    h->cfg = (specd_accept_head_config){D, H, L, S, F};
    size_t n = (size_t)H * D + H + (size_t)S * H + (size_t)H * F +
               (size_t)L * (2 * H * H + 2 * H) + H;
    h->buf = calloc(n, sizeof(float));
    assert_non_null(h->buf);
    float *p = h->buf;
    h->w.in_w = h->in_w = p, p += (size_t)H * D;
    h->w.in_b = h->in_b = p, p += H;
    h->w.stage_emb = h->emb = p, p += (size_t)S * H;
    if (F) h->w.draft_w = h->draft_w = p, p += (size_t)H * F;
    for (int l = 0; l < L; l++) {
        h->w.fc1_w[l] = h->fc1_w[l] = p, p += (size_t)H * H;
        h->w.fc1_b[l] = h->fc1_b[l] = p, p += H;
        h->w.fc2_w[l] = h->fc2_w[l] = p, p += (size_t)H * H;
        h->w.fc2_b[l] = h->fc2_b[l] = p, p += H;
    }
    h->w.out_w = h->out_w = p;
}

static void hb_init(head_buf *h, int D, int H, int L, int S) { hb_init_f(h, D, H, L, S, 0); }

static void hb_free(head_buf *h) { free(h->buf); }

static int n_dirs; /* fresh_dir's count, for the cleanup */

static const char *fresh_dir(void) {
    static char dir[256];
    snprintf(dir, sizeof dir, "/tmp/specd_ahead_%d_%d", (int)getpid(), n_dirs++);
    mkdir(dir, 0755);
    return dir;
}

/* Removes every directory fresh_dir made (and the two files a head has). */
static int cleanup(void **state) {
    (void)state;
    for (int i = 0; i < n_dirs; i++) {
        char dir[256], path[300];
        snprintf(dir, sizeof dir, "/tmp/specd_ahead_%d_%d", (int)getpid(), i);
        snprintf(path, sizeof path, "%s/config.json", dir);
        unlink(path);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        unlink(path);
        rmdir(dir);
    }
    return 0;
}

/* Saves h into a fresh directory and returns it (static). */
static const char *save_head(const head_buf *h, const char *dtype) {
    const char *dir = fresh_dir();
    specd_error err = {{0}};
    if (specd_accept_head_save(dir, &h->cfg, &h->w, dtype, NULL, &err)) fail_msg("%s", err.msg);
    return dir;
}

static float logit(float p) { return logf(p / (1 - p)); }

/* A head that says p everywhere: only out.bias is set. */
static const char *const_head_dir(int stages, float p) {
    head_buf h;
    hb_init(&h, INNER, 4, 1, stages);
    h.w.out_b = logit(p);
    const char *dir = save_head(&h, "F32");
    hb_free(&h);
    return dir;
}

/* A head whose logit is alpha * state[k]: p varies from node to node. */
static const char *coord_head_dir(int stages, int k, float alpha) {
    head_buf h;
    hb_init(&h, INNER, 1, 0, stages);
    h.in_w[k] = alpha;
    h.out_w[0] = 1.0f;
    const char *dir = save_head(&h, "F32");
    hb_free(&h);
    return dir;
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void expect_load_error(const char *dir, const char *needle) {
    specd_error err = {{0}};
    specd_accept_head *h = specd_accept_head_load(dir, &err);
    if (h) fail_msg("loaded a bad head (expected '%s')", needle);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' lacks '%s'", err.msg, needle);
}

/* ---- config.json ------------------------------------------------------------------ */

static void expect_parse_error(const char *json, const char *needle) {
    specd_accept_head_config c;
    specd_error err = {{0}};
    assert_int_equal(specd_accept_head_parse_config(json, strlen(json), &c, &err), -1);
    if (!strstr(err.msg, needle)) fail_msg("'%s': error '%s' lacks '%s'", json, err.msg, needle);
}

static void test_parse_config(void **state) {
    (void)state;
    const char *ok = "{\"model_type\": \"specd_accept_head\", \"input_dim\": 48, \"hidden_dim\": "
                     "16, \"n_layers\": 2, \"n_stages\": 3, \"training\": {\"w_rej\": 2}}";
    specd_accept_head_config c;
    specd_error err = {{0}};
    assert_int_equal(specd_accept_head_parse_config(ok, strlen(ok), &c, &err), 0);
    assert_int_equal(c.input_dim, 48);
    assert_int_equal(c.hidden_dim, 16);
    assert_int_equal(c.n_layers, 2);
    assert_int_equal(c.n_stages, 3);
    assert_int_equal(c.n_draft_features, 0); /* optional, absent = none */
#define HEAD "{\"model_type\": \"specd_accept_head\", "
    expect_parse_error(HEAD "\"hidden_dim\": 16, \"n_layers\": 2, \"n_stages\": 3}",
                       "'input_dim' is missing");
    expect_parse_error(HEAD "\"input_dim\": \"48\", \"hidden_dim\": 16, \"n_layers\": 2, "
                            "\"n_stages\": 3}", "'input_dim' must be an integer");
    expect_parse_error(HEAD "\"input_dim\": 48, \"hidden_dim\": 16.5, \"n_layers\": 2, "
                            "\"n_stages\": 3}", "'hidden_dim' = 16.5");
    expect_parse_error(HEAD "\"input_dim\": 48, \"hidden_dim\": 16, \"n_layers\": 17, "
                            "\"n_stages\": 3}", "'n_layers' = 17 must be an integer in 0..16");
    expect_parse_error(HEAD "\"input_dim\": 48, \"hidden_dim\": 16, \"n_layers\": 1, "
                            "\"n_stages\": 0}", "'n_stages' = 0");
    expect_parse_error(HEAD "\"input_dim\": 1e12, \"hidden_dim\": 16, \"n_layers\": 1, "
                            "\"n_stages\": 2}", "'input_dim'");
    expect_parse_error(HEAD "\"input_dim\": 48, \"hidden_dim\": null, \"n_layers\": 1, "
                            "\"n_stages\": 2}", "'hidden_dim' is missing");
    const char *feat = HEAD "\"input_dim\": 48, \"hidden_dim\": 16, \"n_layers\": 2, "
                            "\"n_stages\": 3, \"n_draft_features\": 3}";
    assert_int_equal(specd_accept_head_parse_config(feat, strlen(feat), &c, &err), 0);
    assert_int_equal(c.n_draft_features, 3);
    expect_parse_error(HEAD "\"input_dim\": 48, \"hidden_dim\": 16, \"n_layers\": 2, "
                            "\"n_stages\": 3, \"n_draft_features\": 2}",
                       "'n_draft_features' = 2 must be 0 or 3");
    expect_parse_error(HEAD "\"input_dim\": 48, \"hidden_dim\": 16, \"n_layers\": 2, "
                            "\"n_stages\": 3, \"n_draft_features\": 4}",
                       "'n_draft_features' = 4");
    expect_parse_error(HEAD "\"input_dim\": 48, \"hidden_dim\": 16, \"n_layers\": 2, "
                            "\"n_stages\": 3, \"n_draft_features\": \"3\"}",
                       "'n_draft_features' must be an integer");
#undef HEAD
    expect_parse_error("{\"model_type\": \"mlp_speculator\", \"vocab_size\": 100}",
                       "model_type is 'mlp_speculator'");
    expect_parse_error("{\"input_dim\": 4}", "'model_type' must be");
    expect_parse_error("[1, 2]", "not a JSON object");
    expect_parse_error("{\"model_type\": ", "not valid JSON");
}

/* ---- files ------------------------------------------------------------------------ */

static void fill_random(head_buf *h, uint64_t seed) {
    const specd_accept_head_config *c = &h->cfg;
    size_t n = (size_t)c->hidden_dim * c->input_dim + c->hidden_dim +
               (size_t)c->n_stages * c->hidden_dim + (size_t)c->hidden_dim * c->n_draft_features +
               (size_t)c->n_layers * (2 * c->hidden_dim * c->hidden_dim + 2 * c->hidden_dim) +
               c->hidden_dim;
    test_fill_random(h->buf, n, seed, 0.5f);
    h->w.out_b = 0.25f;
}

static void test_save_load_roundtrip(void **state) {
    (void)state;
    head_buf h;
    hb_init(&h, 12, 8, 2, 3);
    fill_random(&h, 7);
    specd_error err = {{0}};
    specd_accept_head *mem = specd_accept_head_create(&h.cfg, &h.w, &err);
    assert_non_null(mem);
    float s[5 * 12], p_mem[5], p_f32[5], p_f16[5], z[5];
    test_fill_random(s, sizeof s / sizeof s[0], 3, 2.0f);

    const char *dir = fresh_dir();
    assert_int_equal(specd_accept_head_save(dir, &h.cfg, &h.w, "F32",
                                            "{\"training\": {\"w_rej\": 2}, \"input_dim\": 99}",
                                            &err), 0);
    specd_accept_head *f32 = specd_accept_head_load(dir, &err);
    if (!f32) fail_msg("%s", err.msg);
    /* the extra member is kept, but never over the head's own keys */
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *cfg_text = test_read_file(path, NULL);
    assert_non_null(cfg_text);
    assert_non_null(strstr(cfg_text, "\"w_rej\""));
    specd_accept_head_config back;
    assert_int_equal(specd_accept_head_parse_config(cfg_text, strlen(cfg_text), &back, &err), 0);
    assert_int_equal(back.input_dim, 12);
    free(cfg_text);

    dir = save_head(&h, "F16");
    specd_accept_head *f16 = specd_accept_head_load(dir, &err);
    if (!f16) fail_msg("%s", err.msg);
    for (int stage = 0; stage < 3; stage++) {
        assert_int_equal(specd_accept_head_forward(mem, stage, 5, s, NULL, p_mem, z, &err), 0);
        assert_int_equal(specd_accept_head_forward(f32, stage, 5, s, NULL, p_f32, NULL, &err), 0);
        assert_int_equal(specd_accept_head_forward(f16, stage, 5, s, NULL, p_f16, NULL, &err), 0);
        for (int r = 0; r < 5; r++) {
            assert_true(p_mem[r] == p_f32[r]); /* F32 files are exact */
            assert_float_equal(p_f16[r], p_mem[r], 2e-2);
            assert_float_equal(p_mem[r], 1.0f / (1.0f + expf(-z[r])), 1e-6);
        }
    }
    /* one row at a time gives the same as the batch (no order dependence) */
    for (int r = 0; r < 5; r++) {
        float one;
        assert_int_equal(specd_accept_head_forward(mem, 1, 1, s + 12 * r, NULL, &one, NULL, &err), 0);
        assert_int_equal(specd_accept_head_forward(mem, 1, 5, s, NULL, p_mem, NULL, &err), 0);
        assert_true(one == p_mem[r]);
    }
    /* stage outside the head, bad row count */
    assert_int_equal(specd_accept_head_forward(mem, 3, 1, s, NULL, p_mem, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "stage 3"));
    assert_int_equal(specd_accept_head_forward(mem, 0, -1, s, NULL, p_mem, NULL, &err), -1);
    assert_int_equal(specd_accept_head_config_of(f16)->n_layers, 2);
    specd_accept_head_free(mem);
    specd_accept_head_free(f32);
    specd_accept_head_free(f16);
    /* saving refuses a dtype it cannot write */
    assert_int_equal(specd_accept_head_save(fresh_dir(), &h.cfg, &h.w, "Q8_0", NULL, &err), -1);
    assert_non_null(strstr(err.msg, "Q8_0"));
    hb_free(&h);
}

/* A directory with a good config for (D 2, H 2, L 1, S 2) and the tensors
 * given. */
static const char *craft(const safetensors_out *t, int n, const char *config) {
    const char *dir = fresh_dir();
    static char keep[256];
    snprintf(keep, sizeof keep, "%s", dir);
    write_text(keep, "config.json", config);
    if (n >= 0) {
        char path[512];
        snprintf(path, sizeof path, "%s/model.safetensors", keep);
        specd_error err = {{0}};
        if (safetensors_write(path, t, n, NULL, NULL, 0, &err)) fail_msg("%s", err.msg);
    }
    return keep;
}

#define SMALL_CONFIG                                                                           \
    "{\"model_type\": \"specd_accept_head\", \"input_dim\": 2, \"hidden_dim\": 2, "            \
    "\"n_layers\": 1, \"n_stages\": 2}"

static void test_load_errors(void **state) {
    (void)state;
    static const float zeros[16] = {0};
    float bad[4] = {0, NAN, 0, 0};
    static const int32_t ints[4] = {0};
    /* the full, valid tensor set of SMALL_CONFIG */
#define TS(nm, d, r, c) {.name = nm, .type = SPECD_F32, .n_dims = d, .shape = {r, c}, .data = zeros}
    safetensors_out good[] = {
        TS("in_proj.weight", 2, 2, 2),      TS("in_proj.bias", 1, 2, 0),
        TS("stage_emb.weight", 2, 2, 2),    TS("blocks.0.fc1.weight", 2, 2, 2),
        TS("blocks.0.fc1.bias", 1, 2, 0),   TS("blocks.0.fc2.weight", 2, 2, 2),
        TS("blocks.0.fc2.bias", 1, 2, 0),   TS("out.weight", 2, 1, 2),
        TS("out.bias", 1, 1, 0),
    };
    int n_good = (int)(sizeof good / sizeof good[0]);
    specd_error err = {{0}};
    specd_accept_head *h = specd_accept_head_load(craft(good, n_good, SMALL_CONFIG), &err);
    if (!h) fail_msg("%s", err.msg);
    float s[2] = {1, 2}, p;
    assert_int_equal(specd_accept_head_forward(h, 1, 1, s, NULL, &p, NULL, &err), 0);
    assert_float_equal(p, 0.5f, 1e-7); /* all zero: logit 0 */
    specd_accept_head_free(h);

    expect_load_error("/nonexistent/accept_head", "config.json");
    expect_load_error(craft(good, -1, SMALL_CONFIG), "model.safetensors");
    expect_load_error(craft(good, n_good, "{\"model_type\": \"mlp_speculator\"}"),
                      "not 'specd_accept_head'");
    /* each tensor missing in turn names that tensor */
    for (int skip = 0; skip < n_good; skip++) {
        safetensors_out t[16];
        int n = 0;
        for (int i = 0; i < n_good; i++)
            if (i != skip) t[n++] = good[i];
        char want[96];
        snprintf(want, sizeof want, "tensor '%s' is missing", good[skip].name);
        expect_load_error(craft(t, n, SMALL_CONFIG), want);
    }
    safetensors_out t[16];
    memcpy(t, good, sizeof good);
    t[0].shape[1] = 3;
    expect_load_error(craft(t, n_good, SMALL_CONFIG),
                      "tensor 'in_proj.weight': shape [2, 3] does not match config [2, 2]");
    memcpy(t, good, sizeof good);
    t[8].n_dims = 2;
    t[8].shape[1] = 1;
    expect_load_error(craft(t, n_good, SMALL_CONFIG), "tensor 'out.bias': shape [1, 1]");
    memcpy(t, good, sizeof good);
    t[5].type = SPECD_I32;
    t[5].data = ints;
    expect_load_error(craft(t, n_good, SMALL_CONFIG), "tensor 'blocks.0.fc2.weight' has dtype");
    memcpy(t, good, sizeof good);
    t[3].data = bad;
    expect_load_error(craft(t, n_good, SMALL_CONFIG),
                      "tensor 'blocks.0.fc1.weight': element 1 is not finite");
    /* a block the config does not have: config and weights disagree */
    memcpy(t, good, sizeof good);
    t[n_good] = (safetensors_out)TS("blocks.1.fc1.weight", 2, 2, 2);
#undef TS
    expect_load_error(craft(t, n_good + 1, SMALL_CONFIG), "'blocks.1.fc1.weight' is not part");
    /* F16 and BF16 files load */
    for (int k = 0; k < 2; k++) {
        memcpy(t, good, sizeof good);
        for (int i = 0; i < n_good; i++) t[i].type = k ? SPECD_BF16 : SPECD_F16;
        h = specd_accept_head_load(craft(t, n_good, SMALL_CONFIG), &err);
        if (!h) fail_msg("%s", err.msg);
        specd_accept_head_free(h);
    }
    /* create() checks as load does */
    head_buf hb;
    hb_init(&hb, 2, 2, 1, 2);
    hb.fc2_b[0][1] = INFINITY;
    assert_null(specd_accept_head_create(&hb.cfg, &hb.w, &err));
    assert_non_null(strstr(err.msg, "blocks.0.fc2.bias"));
    hb.cfg.n_stages = 0;
    assert_null(specd_accept_head_create(&hb.cfg, &hb.w, &err));
    hb_free(&hb);
}

/* ---- the forward, by hand --------------------------------------------------------- */

static double silu_d(double v) { return v / (1 + exp(-v)); }

static void test_forward_hand(void **state) {
    (void)state;
    /* D 2, H 2, one block, 2 stages */
    head_buf h;
    hb_init(&h, 2, 2, 1, 2);
    const float in_w[4] = {0.5f, -1.0f, 2.0f, 0.25f}, in_b[2] = {0.1f, -0.2f};
    const float emb[4] = {0.0f, 0.0f, 0.3f, -0.4f}; /* stage 1's vector */
    const float fc1_w[4] = {1.0f, 0.5f, -0.5f, 1.5f}, fc1_b[2] = {0.05f, -0.1f};
    /* the forward pass reads its matrices as fp16: every weight here is
     * exact in fp16, so the sums below are the head's to float rounding */
    const float fc2_w[4] = {0.25f, -0.375f, 0.375f, 0.125f}, fc2_b[2] = {0.01f, 0.02f};
    const float out_w[2] = {1.25f, -0.75f};
    memcpy(h.in_w, in_w, sizeof in_w);
    memcpy(h.in_b, in_b, sizeof in_b);
    memcpy(h.emb, emb, sizeof emb);
    memcpy(h.fc1_w[0], fc1_w, sizeof fc1_w);
    memcpy(h.fc1_b[0], fc1_b, sizeof fc1_b);
    memcpy(h.fc2_w[0], fc2_w, sizeof fc2_w);
    memcpy(h.fc2_b[0], fc2_b, sizeof fc2_b);
    memcpy(h.out_w, out_w, sizeof out_w);
    h.w.out_b = -0.5f;
    specd_error err = {{0}};
    specd_accept_head *hd = specd_accept_head_create(&h.cfg, &h.w, &err);
    assert_non_null(hd);
    const float s[2] = {1.0f, -2.0f};
    float p, z;
    assert_int_equal(specd_accept_head_forward(hd, 1, 1, s, NULL, &p, &z, &err), 0);
    /* x = W_in s + b_in + E[1]:
     *   x0 = 0.5*1 + -1*-2 + 0.1 + 0.3  = 2.9
     *   x1 = 2*1 + 0.25*-2 - 0.2 - 0.4  = 0.9
     * a = W1 x + b1: a0 = 2.9 + 0.45 + 0.05 = 3.4; a1 = -1.45 + 1.35 - 0.1 = -0.2
     * x += W2 silu(a) + b2; logit = out_w . x + b_out */
    double x0 = 2.9, x1 = 0.9;
    double a0 = 1.0 * x0 + 0.5 * x1 + 0.05, a1 = -0.5 * x0 + 1.5 * x1 - 0.1;
    assert_float_equal(a0, 3.4, 1e-12);
    assert_float_equal(a1, -0.2, 1e-12);
    double t0 = silu_d(a0), t1 = silu_d(a1);
    double y0 = x0 + 0.25 * t0 - 0.375 * t1 + 0.01, y1 = x1 + 0.375 * t0 + 0.125 * t1 + 0.02;
    double want_z = 1.25 * y0 - 0.75 * y1 - 0.5;
    assert_float_equal(z, want_z, 1e-5);
    assert_float_equal(p, 1 / (1 + exp(-want_z)), 1e-6);
    /* stage 0 has a zero stage vector: only the input differs */
    assert_int_equal(specd_accept_head_forward(hd, 0, 1, s, NULL, &p, &z, &err), 0);
    x0 = 2.6, x1 = 1.3;
    a0 = x0 + 0.5 * x1 + 0.05, a1 = -0.5 * x0 + 1.5 * x1 - 0.1;
    t0 = silu_d(a0), t1 = silu_d(a1);
    y0 = x0 + 0.25 * t0 - 0.375 * t1 + 0.01, y1 = x1 + 0.375 * t0 + 0.125 * t1 + 0.02;
    assert_float_equal(z, 1.25 * y0 - 0.75 * y1 - 0.5, 1e-5);
    /* extreme logits saturate without NaN */
    h.w.out_b = 1e4f;
    specd_accept_head *big = specd_accept_head_create(&h.cfg, &h.w, &err);
    assert_int_equal(specd_accept_head_forward(big, 0, 1, s, NULL, &p, NULL, &err), 0);
    assert_true(p == 1.0f);
    specd_accept_head_free(big);
    h.w.out_b = -1e4f;
    big = specd_accept_head_create(&h.cfg, &h.w, &err);
    assert_int_equal(specd_accept_head_forward(big, 0, 1, s, NULL, &p, NULL, &err), 0);
    assert_true(p == 0.0f);
    specd_accept_head_free(big);
    specd_accept_head_free(hd);
    hb_free(&h);
}

/* A head with draft features: x gains W_d f, f = [logit q1, ln(q1/q2), q1],
 * worked by hand; it refuses a call without top2; F32 files are exact and
 * name draft_proj; a config that disagrees with the tensors names it. */
static void test_forward_draft_features(void **state) {
    (void)state;
    head_buf h;
    hb_init_f(&h, 2, 2, 0, 1, SPECD_ACCEPT_HEAD_DRAFT_FEATURES);
    const float in_w[4] = {0.5f, -1.0f, 2.0f, 0.25f}, in_b[2] = {0.1f, -0.2f};
    const float draft_w[6] = {2.0f, -1.0f, 0.5f, /* row 0 */ -3.0f, 0.0f, 4.0f /* row 1 */};
    const float out_w[2] = {1.25f, -0.75f};
    memcpy(h.in_w, in_w, sizeof in_w);
    memcpy(h.in_b, in_b, sizeof in_b);
    memcpy(h.draft_w, draft_w, sizeof draft_w);
    memcpy(h.out_w, out_w, sizeof out_w);
    h.w.out_b = -0.5f;
    specd_error err = {{0}};
    specd_accept_head *hd = specd_accept_head_create(&h.cfg, &h.w, &err);
    if (!hd) fail_msg("%s", err.msg);
    assert_true(specd_accept_head_wants_top2(hd));
    const float s[4] = {1.0f, -2.0f, 0.5f, 0.5f}, top2[4] = {0.8f, 0.15f, 0.3f, 0.25f};
    float p[2], z[2];
    assert_int_equal(specd_accept_head_forward(hd, 0, 2, s, top2, p, z, &err), 0);
    for (int r = 0; r < 2; r++) {
        double q1 = top2[2 * r], q2 = top2[2 * r + 1];
        double f0 = log(q1 / (1 - q1)), f1 = log(q1 / q2), f2 = q1;
        double x0 = 0.5 * s[2 * r] - 1.0 * s[2 * r + 1] + 0.1 + 2.0 * f0 - 1.0 * f1 + 0.5 * f2;
        double x1 = 2.0 * s[2 * r] + 0.25 * s[2 * r + 1] - 0.2 - 3.0 * f0 + 4.0 * f2;
        double want = 1.25 * x0 - 0.75 * x1 - 0.5;
        assert_float_equal(z[r], want, 1e-5);
        assert_float_equal(p[r], 1 / (1 + exp(-want)), 1e-6);
    }
    float f[SPECD_ACCEPT_HEAD_DRAFT_FEATURES];
    specd_accept_head_draft_features(0.25f, 0.125f, f);
    assert_float_equal(f[0], log(0.25 / 0.75), 1e-6);
    assert_float_equal(f[1], log(2.0), 1e-6);
    assert_float_equal(f[2], 0.25, 0);
    /* the edges stay finite: all the mass on one token, none on the next */
    specd_accept_head_draft_features(1.0f, 0.0f, f);
    assert_float_equal(f[0], 16, 0);
    assert_float_equal(f[1], 16, 0);
    specd_accept_head_draft_features(0.0f, 0.0f, f);
    assert_float_equal(f[0], -16, 0);
    assert_float_equal(f[1], 0, 0);
    /* without the features it asks for: an error, not a guess */
    assert_int_equal(specd_accept_head_forward(hd, 0, 2, s, NULL, p, z, &err), -1);
    assert_non_null(strstr(err.msg, "draft features"));
    /* a file round trip keeps them, bit for bit */
    const char *dir = save_head(&h, "F32");
    specd_accept_head *back = specd_accept_head_load(dir, &err);
    if (!back) fail_msg("%s", err.msg);
    assert_int_equal(specd_accept_head_config_of(back)->n_draft_features, 3);
    float p2[2];
    assert_int_equal(specd_accept_head_forward(back, 0, 2, s, top2, p2, NULL, &err), 0);
    assert_memory_equal(p, p2, sizeof p);
    specd_accept_head_free(back);
    /* a head without features ignores top2 */
    head_buf plain;
    hb_init(&plain, 2, 2, 0, 1);
    plain.w.out_b = 0.3f;
    specd_accept_head *ph = specd_accept_head_create(&plain.cfg, &plain.w, &err);
    assert_false(specd_accept_head_wants_top2(ph));
    assert_int_equal(specd_accept_head_forward(ph, 0, 2, s, top2, p, NULL, &err), 0);
    assert_float_equal(p[1], 1 / (1 + exp(-0.3)), 1e-6);
    specd_accept_head_free(ph);
    /* config and tensors must agree on the features */
    write_text(dir, "config.json",
               "{\"model_type\": \"specd_accept_head\", \"input_dim\": 2, \"hidden_dim\": 2, "
               "\"n_layers\": 0, \"n_stages\": 1}");
    expect_load_error(dir, "'draft_proj.weight' is not part");
    dir = save_head(&plain, "F32");
    write_text(dir, "config.json",
               "{\"model_type\": \"specd_accept_head\", \"input_dim\": 2, \"hidden_dim\": 2, "
               "\"n_layers\": 0, \"n_stages\": 1, \"n_draft_features\": 3}");
    expect_load_error(dir, "tensor 'draft_proj.weight' is missing");
    hb_free(&plain);
    specd_accept_head_free(hd);
    hb_free(&h);
}

/* ---- the drafter ------------------------------------------------------------------ */

typedef struct fx {
    specd_drafter *d;
    float hidden[64];
    int32_t history[8];
    specd_token_counts counts;
    specd_tree_buf out;
} fx;

static specd_drafter *drafter_with(const char *spec, const char *head) {
    specd_mlp_drafter_opts o = {.path = test_path(spec), .n_threads = 1, .accept_head = head};
    specd_error err = {{0}};
    specd_drafter *d = specd_mlp_drafter_create(&o, &err);
    if (!d) fail_msg("%s", err.msg);
    return d;
}

static void fx_init(fx *f, const char *spec, const char *head, uint64_t seed) {
    memset(f, 0, sizeof *f);
    f->d = drafter_with(spec, head);
    test_fill_random(f->hidden, (size_t)f->d->hidden_size, seed, 2.0f);
    for (int i = 0; i < 8; i++) f->history[i] = (int32_t)((i * 13 + (int)seed * 7 + 3) % f->d->vocab);
    specd_error err = {{0}};
    assert_int_equal(specd_token_counts_init(&f->counts, f->d->vocab, &err), 0);
    for (int i = 0; i < 8; i++) specd_token_counts_add(&f->counts, f->history[i], i >= 5);
    assert_int_equal(specd_tree_buf_init(&f->out, CAP, (size_t)CAP * 128, &err), 0);
}

static void fx_free(fx *f) {
    specd_token_counts_free(&f->counts);
    specd_tree_buf_free(&f->out);
    specd_drafter_free(f->d);
}

/* Drafts into f->out; returns its largest depth after checking the tree. */
static int draft(fx *f, const specd_sampling *s, int cand, int depth, float thr, int min_depth) {
    specd_tree_buf_reset(&f->out);
    specd_draft_job job = {.history = f->history, .n_history = 8, .n_prompt = 5,
                           .hidden = f->hidden, .sampling = s, .counts = &f->counts,
                           .position = 3, .candidates = cand, .depth = depth,
                           .stop_threshold = thr, .min_depth = min_depth, .out = &f->out};
    specd_error err = {{0}};
    if (specd_drafter_propose(f->d, &job, 1, &err)) fail_msg("propose: %s", err.msg);
    int sampling = s->temperature > 0;
    specd_tree t;
    specd_tree_buf_view(&f->out, sampling, &t);
    if (f->out.n_nodes && specd_tree_validate(&t, f->d->vocab, CAP, sampling, &err))
        fail_msg("invalid tree: %s", err.msg);
    int maxd = 0;
    for (int i = 0; i < f->out.n_nodes; i++) {
        assert_true(f->out.parents[i] < i);
        if (f->out.depth[i] > maxd) maxd = f->out.depth[i];
        /* the head shapes the tree only; the price scores every node by
         * the draft's own probability given its parent (tree_builder.h:
         * no pcond), which predicts acceptance better than the head */
        assert_true(f->out.pcond[i] == -1.0f);
    }
    return maxd;
}

static int count_at(const specd_tree_buf *b, int d) {
    int n = 0;
    for (int i = 0; i < b->n_nodes; i++) n += b->depth[i] == d;
    return n;
}

/* A copy of a tree's nodes, to compare two drafts. */
typedef struct snap {
    int n;
    int32_t tokens[CAP], parents[CAP], depth[CAP];
    float logq[CAP];
} snap;

static void take(snap *s, const specd_tree_buf *b) {
    s->n = b->n_nodes;
    memcpy(s->tokens, b->tokens, sizeof(int32_t) * (size_t)b->n_nodes);
    memcpy(s->parents, b->parents, sizeof(int32_t) * (size_t)b->n_nodes);
    memcpy(s->depth, b->depth, sizeof(int32_t) * (size_t)b->n_nodes);
    memcpy(s->logq, b->logq, sizeof(float) * (size_t)b->n_nodes);
}

static int same(const snap *s, const specd_tree_buf *b) {
    if (s->n != b->n_nodes) return 0;
    for (int i = 0; i < s->n; i++)
        if (s->tokens[i] != b->tokens[i] || s->parents[i] != b->parents[i] ||
            s->logq[i] != b->logq[i])
            return 0;
    return 1;
}

static specd_sampling greedy(void) {
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 0.0f;
    return s;
}

static specd_sampling sampled(uint64_t seed) {
    specd_sampling s;
    specd_sampling_init(&s);
    s.temperature = 1.2f;
    s.method = SPECD_SAMPLING_REJECTION; /* q-carrying trees */
    s.seed = seed;
    return s;
}

/* p = 0.9 everywhere: P = 0.9, 0.81, 0.729 at depths 1, 2, 3, so 1 - P is
 * 0.1, 0.19, 0.271. Every threshold between them moves the stop by one. */
static void test_stop_rule_greedy(void **state) {
    (void)state;
    specd_sampling s = greedy();
    fx f;
    fx_init(&f, UNTIED, const_head_dir(3, 0.9f), 1);
    /* chains: candidates 1 */
    assert_int_equal(draft(&f, &s, 1, 3, 0.05f, 1), 1);  /* 0.1 > 0.05 at depth 1 */
    assert_int_equal(f.out.n_nodes, 1);
    assert_int_equal(draft(&f, &s, 1, 3, 0.15f, 1), 2);  /* 0.19 > 0.15 at depth 2 */
    assert_int_equal(draft(&f, &s, 1, 3, 0.25f, 1), 3);  /* 0.271 > 0.25, but depth 3 is the end anyway */
    assert_int_equal(draft(&f, &s, 1, 3, 0.3f, 1), 3);
    assert_int_equal(draft(&f, &s, 1, 2, 0.3f, 1), 2);   /* never past depth */
    /* min_depth holds a path back from stopping, never pushes it past depth */
    assert_int_equal(draft(&f, &s, 1, 3, 0.05f, 2), 2);
    assert_int_equal(draft(&f, &s, 1, 3, 0.05f, 3), 3);
    assert_int_equal(draft(&f, &s, 1, 2, 0.05f, 9), 2);
    /* the stopped chain is the prefix of the full one */
    snap full;
    draft(&f, &s, 1, 3, 0.0f, 1);
    take(&full, &f.out);
    draft(&f, &s, 1, 3, 0.15f, 1);
    for (int i = 0; i < f.out.n_nodes; i++) assert_int_equal(f.out.tokens[i], full.tokens[i]);
    /* a tree: candidates 4 keeps 4 per depth and stops them all at depth 2 */
    assert_int_equal(draft(&f, &s, 4, 3, 0.15f, 1), 2);
    assert_int_equal(count_at(&f.out, 1), 4);
    assert_int_equal(count_at(&f.out, 2), 4);
    fx_free(&f);
}

/* p near 0: every path stops exactly at min_depth (clamped to depth). */
static void test_min_depth_and_depth(void **state) {
    (void)state;
    specd_sampling g = greedy(), smp = sampled(5);
    fx f;
    fx_init(&f, SHARDED, const_head_dir(4, 1e-6f), 2);
    for (int md = 1; md <= 4; md++) {
        assert_int_equal(draft(&f, &g, 3, 4, 0.5f, md), md);
        assert_int_equal(draft(&f, &smp, 3, 4, 0.5f, md), md);
        assert_int_equal(f.out.n_nodes, 3 * md); /* 3 chains of md */
    }
    assert_int_equal(draft(&f, &g, 3, 2, 0.5f, 3), 2);
    assert_int_equal(draft(&f, &smp, 3, 2, 0.5f, 3), 2);
    /* min_depth 0 counts as 1 */
    assert_int_equal(draft(&f, &g, 1, 4, 0.5f, 0), 1);
    fx_free(&f);
}

/* Threshold 0, or no head at all, or a head p = 1: the fixed-shape tree,
 * node for node. */
static void test_threshold_zero_unchanged(void **state) {
    (void)state;
    specd_sampling g = greedy(), smp = sampled(11);
    fx plain, ah, one;
    fx_init(&plain, UNTIED, NULL, 3);
    fx_init(&ah, UNTIED, coord_head_dir(3, 5, 6.0f), 3);
    fx_init(&one, UNTIED, const_head_dir(3, 1.0f - 1e-7f), 3);
    const specd_sampling *modes[2] = {&g, &smp};
    int shapes[3][2] = {{1, 3}, {4, 3}, {100, 3}};
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 3; k++) {
            snap ref;
            draft(&plain, modes[m], shapes[k][0], shapes[k][1], 0.0f, 1);
            take(&ref, &plain.out);
            draft(&ah, modes[m], shapes[k][0], shapes[k][1], 0.0f, 1);
            assert_true(same(&ref, &ah.out));
            /* a head-less drafter ignores the threshold */
            draft(&plain, modes[m], shapes[k][0], shapes[k][1], 0.5f, 1);
            assert_true(same(&ref, &plain.out));
            /* a head that is sure of everything changes nothing either:
             * equal P does not reorder, and nothing stops */
            draft(&one, modes[m], shapes[k][0], shapes[k][1], 0.5f, 1);
            assert_true(same(&ref, &one.out));
        }
    fx_free(&plain);
    fx_free(&ah);
    fx_free(&one);
}

/* Greedy shaping: with candidates 4 and depth 2 the root's 4 children all
 * stay, and of their 4 x 3 children the 4 with the best log q + log P do,
 * P = p(root's state) * p(parent's state). Recomputed here from the
 * speculator and the head directly. */
static void test_greedy_ranks_by_expected_length(void **state) {
    (void)state;
    specd_sampling g = greedy();
    specd_error err = {{0}};
    specd_mlp_speculator *sp = specd_mlp_speculator_load(test_path(UNTIED), 1, &err);
    assert_non_null(sp);
    int found = 0;
    for (int k = 0; k < INNER && !found; k++) {
        const char *dir = coord_head_dir(3, k, 8.0f);
        specd_accept_head *head = specd_accept_head_load(dir, &err);
        assert_non_null(head);
        fx f;
        fx_init(&f, UNTIED, dir, 4);
        /* the reference: stage 0 on the root, stage 1 on each child */
        int V = f.d->vocab;
        float s1[INNER], s1x4[4 * INNER], s2[4 * INNER], *lg = malloc(sizeof(float) * 4 * (size_t)V);
        int32_t tok = f.history[7];
        assert_int_equal(specd_mlp_speculator_stage(sp, 0, 1, f.hidden, &tok, s1, lg, &err), 0);
        float p_root;
        assert_int_equal(specd_accept_head_forward(head, 0, 1, s1, NULL, &p_root, NULL, &err), 0);
        int32_t kids[4];
        float kid_lq[4], vals[4];
        int nk = specd_topk(lg, V, 4, kids, vals);
        assert_int_equal(nk, 4);
        double lse = 0, mx = vals[0];
        for (int i = 0; i < V; i++) lse += exp((double)lg[i] - mx);
        lse = mx + log(lse);
        for (int i = 0; i < 4; i++) kid_lq[i] = (float)(vals[i] - lse);
        /* stage 1 on the four children in one call, in the drafter's
         * frontier order (so the matmul sums exactly as the drafter's) */
        for (int i = 0; i < 4; i++) memcpy(s1x4 + i * INNER, s1, sizeof s1);
        assert_int_equal(specd_mlp_speculator_stage(sp, 1, 4, s1x4, kids, s2, lg, &err), 0);
        float p_kid[4];
        assert_int_equal(specd_accept_head_forward(head, 1, 4, s2, NULL, p_kid, NULL, &err), 0);
        float score[12], by_q[12];
        int32_t cand_tok[12], cand_par[12];
        for (int i = 0; i < 4; i++) {
            const float *row = lg + (size_t)i * V;
            int32_t gk[3];
            float gv[3];
            specd_topk(row, V, 3, gk, gv);
            double l2 = 0, m2 = gv[0];
            for (int v = 0; v < V; v++) l2 += exp((double)row[v] - m2);
            l2 = m2 + log(l2);
            for (int c = 0; c < 3; c++) {
                by_q[3 * i + c] = kid_lq[i] + (float)(gv[c] - l2);
                score[3 * i + c] = by_q[3 * i + c] + logf(p_root * p_kid[i]);
                cand_tok[3 * i + c] = gk[c];
                cand_par[3 * i + c] = kids[i];
            }
        }
        uint8_t keep_s[12], keep_q[12];
        specd_tree_beam_select(score, 12, 4, keep_s);
        specd_tree_beam_select(by_q, 12, 4, keep_q);
        if (memcmp(keep_s, keep_q, sizeof keep_s) != 0) {
            /* this head reorders: the drafter must follow it */
            found = 1;
            draft(&f, &g, 4, 2, 0.99f, 1); /* nothing stops: 1 - P <= 0.99 needs P >= 0.01 */
            assert_int_equal(count_at(&f.out, 1), 4);
            assert_int_equal(count_at(&f.out, 2), 4);
            for (int c = 0; c < 12; c++) {
                int in_tree = 0;
                for (int i = 0; i < f.out.n_nodes; i++)
                    if (f.out.depth[i] == 2 && f.out.tokens[i] == cand_tok[c] &&
                        f.out.tokens[f.out.parents[i]] == cand_par[c])
                        in_tree = 1;
                if (in_tree != keep_s[c])
                    fail_msg("head on coordinate %d: candidate %d (token %d under %d, score %g) "
                             "%s", k, c, cand_tok[c], cand_par[c], (double)score[c],
                             in_tree ? "kept but should not be" : "dropped but should be kept");
            }
            /* the tree's logq is still the draft's own */
            for (int i = 0; i < f.out.n_nodes; i++)
                if (f.out.depth[i] == 1) {
                    int which = -1;
                    for (int j = 0; j < 4; j++)
                        if (kids[j] == f.out.tokens[i]) which = j;
                    assert_true(which >= 0);
                    assert_float_equal(f.out.logq[i], kid_lq[which], 1e-4);
                }
        }
        free(lg);
        specd_accept_head_free(head);
        fx_free(&f);
    }
    if (!found) fail_msg("no coordinate head reorders the tree: the test cannot tell");
    specd_mlp_speculator_free(sp);
}

/* Sampling: the rule only ends chains early. Each chain of the adaptive
 * tree is a prefix of the same chain in the fixed tree (its draws keep
 * their addresses), and every node with children still carries its q. */
static void test_sampling_chains_are_prefixes(void **state) {
    (void)state;
    int cut = 0, differ = 0, overtaken = 0;
    for (uint64_t seed = 1; seed <= 12; seed++) {
        specd_sampling s = sampled(seed);
        fx plain, ah;
        fx_init(&plain, SHARDED, NULL, seed);
        fx_init(&ah, SHARDED, coord_head_dir(4, (int)seed * 7 % INNER, 3.0f), seed);
        snap ref;
        assert_int_equal(draft(&plain, &s, 3, 4, 0.0f, 1), 4);
        take(&ref, &plain.out);
        draft(&ah, &s, 3, 4, 0.5f, 1);
        /* the fixed tree: chain c is nodes c, 3 + c, 6 + c, 9 + c */
        int len[3] = {0, 0, 0};
        for (int i = 0; i < ah.out.n_nodes; i++) {
            int root_child = i, d = ah.out.depth[i];
            while (ah.out.parents[root_child] >= 0) root_child = ah.out.parents[root_child];
            int chain = -1;
            for (int j = 0, c = 0; j < ah.out.n_nodes; j++)
                if (ah.out.parents[j] == -1) {
                    if (j == root_child) chain = c;
                    c++;
                }
            assert_true(chain >= 0 && chain < 3);
            int ref_node = 3 * (d - 1) + chain;
            assert_int_equal(ah.out.tokens[i], ref.tokens[ref_node]);
            /* fewer rows per stage call may sum in another order: rounding only */
            assert_float_equal(ah.out.logq[i], ref.logq[ref_node], 1e-4);
            if (d > len[chain]) len[chain] = d;
        }
        /* all chains at the root share P: they start alike... */
        assert_int_equal(count_at(&ah.out, 1), 3);
        /* ...but may end apart; any node with children has q over them */
        for (int p = -1; p < ah.out.n_nodes; p++) {
            int kids = 0;
            for (int i = 0; i < ah.out.n_nodes; i++) kids += ah.out.parents[i] == p;
            if (kids) assert_true(ah.out.q[p + 1].n >= 1);
            if (p >= 0) assert_true(kids <= 1);
        }
        cut |= len[0] < 4 || len[1] < 4 || len[2] < 4;
        differ |= len[0] != len[1] || len[1] != len[2];
        /* a chain that outgrows an earlier, stopped one is where the draw
         * addresses would shift if they were counted per depth */
        overtaken |= len[0] < len[1] || len[0] < len[2] || len[1] < len[2];
        fx_free(&plain);
        fx_free(&ah);
    }
    /* the rule did cut chains short, and not all alike (P depends on each
     * chain's own tokens), or the test says nothing */
    assert_true(cut);
    assert_true(differ);
    assert_true(overtaken);
}

/* A constant head in sampling mode: chains stop at the depth the rule says,
 * all together. */
static void test_stop_rule_sampling(void **state) {
    (void)state;
    specd_sampling s = sampled(9);
    fx f;
    fx_init(&f, SHARDED, const_head_dir(4, 0.9f), 5);
    assert_int_equal(draft(&f, &s, 3, 4, 0.15f, 1), 2); /* 0.19 > 0.15 at depth 2 */
    assert_int_equal(f.out.n_nodes, 6);
    assert_int_equal(draft(&f, &s, 3, 4, 0.25f, 1), 3); /* 0.271 > 0.25 at depth 3 */
    assert_int_equal(f.out.n_nodes, 9);
    assert_int_equal(draft(&f, &s, 3, 4, 0.4f, 1), 4);  /* 0.3439 at depth 4 */
    fx_free(&f);
}

/* A head with draft features in the drafter: logit = K (q1 - c), so with a
 * steep K a row whose top probability q1 is below c ends its path, one
 * above lets it grow. The greedy chain (candidates 1) with no head gives
 * each node's probability given its parent, which is q1 of the row it was
 * drafted from; c between the first two decides the depth. */
static void test_feature_head_stops_unsure_rows(void **state) {
    (void)state;
    specd_sampling g = greedy();
    fx plain;
    fx_init(&plain, UNTIED, NULL, 4);
    assert_int_equal(draft(&plain, &g, 1, 3, 0.0f, 1), 3);
    float q[3];
    for (int i = 0; i < 3; i++)
        q[i] = expf(plain.out.logq[i] - (i ? plain.out.logq[i - 1] : 0.0f));
    print_message("chain's conditional q: %.4f %.4f %.4f\n", q[0], q[1], q[2]);
    assert_true(fabsf(q[0] - q[1]) > 0.01f); /* room for a steep step between */
    const float c = 0.5f * (q[0] + q[1]), K = 2000.0f;
    head_buf h;
    hb_init_f(&h, INNER, 1, 0, 3, SPECD_ACCEPT_HEAD_DRAFT_FEATURES);
    h.draft_w[2] = K; /* the third feature is q1 itself */
    h.out_w[0] = 1.0f;
    h.w.out_b = -K * c;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", save_head(&h, "F32"));
    hb_free(&h);
    fx f;
    fx_init(&f, UNTIED, dir, 4);
    /* q[0] > c: the first node grows, the second stops; else the first stops */
    int want = q[0] > c ? 2 : 1;
    assert_int_equal(draft(&f, &g, 1, 3, 0.5f, 1), want);
    for (int i = 0; i < f.out.n_nodes; i++) assert_int_equal(f.out.tokens[i], plain.out.tokens[i]);
    /* threshold 0: the head decides nothing */
    assert_int_equal(draft(&f, &g, 1, 3, 0.0f, 1), 3);
    /* min_depth holds the stop back */
    assert_int_equal(draft(&f, &g, 1, 3, 0.5f, 3), 3);
    /* a sampled chain reads the features too and stops no later than depth 3 */
    specd_sampling smp = sampled(9);
    assert_true(draft(&f, &smp, 1, 3, 0.5f, 1) >= 1);
    fx_free(&f);
    fx_free(&plain);
}

static void test_drafter_head_checks(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_mlp_drafter_opts o = {.path = test_path(UNTIED), .n_threads = 1};
    char path[256];
    head_buf h;
    hb_init(&h, 32, 4, 0, 3); /* input 32, but the speculator's state is 48 wide */
    snprintf(path, sizeof path, "%s", save_head(&h, "F32"));
    hb_free(&h);
    o.accept_head = path;
    o.path = test_path(UNTIED);
    assert_null(specd_mlp_drafter_create(&o, &err));
    assert_non_null(strstr(err.msg, "input_dim 32"));
    hb_init(&h, INNER, 4, 0, 2); /* 2 stages for a 3-stage speculator */
    snprintf(path, sizeof path, "%s", save_head(&h, "F32"));
    hb_free(&h);
    o.path = test_path(UNTIED);
    assert_null(specd_mlp_drafter_create(&o, &err));
    assert_non_null(strstr(err.msg, "n_stages 2"));
    o.accept_head = "/nonexistent/head";
    o.path = test_path(UNTIED);
    assert_null(specd_mlp_drafter_create(&o, &err));
    assert_non_null(strstr(err.msg, "config.json"));
}

/* specd_accept_head_use_int8: the Q8_0 matrices move p by rounding only
 * (random heads, and the shipped head on states of a stage's scale), keep
 * a row's result independent of its batch, and change nothing where a
 * width is not a multiple of 32. */
static void test_int8_path(void **state) {
    (void)state;
    specd_error err = {{0}};
    head_buf h;
    hb_init(&h, 64, 32, 2, 3);
    fill_random(&h, 11);
    specd_accept_head *a = specd_accept_head_create(&h.cfg, &h.w, &err);
    specd_accept_head *b = specd_accept_head_create(&h.cfg, &h.w, &err);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(specd_accept_head_use_int8(b, &err), 0);
    enum { R = 6 };
    float s[R * 64], p16[R], p8[R], one;
    test_fill_random(s, sizeof s / sizeof s[0], 5, 2.0f);
    double worst = 0;
    for (int stage = 0; stage < 3; stage++) {
        assert_int_equal(specd_accept_head_forward(a, stage, R, s, NULL, p16, NULL, &err), 0);
        assert_int_equal(specd_accept_head_forward(b, stage, R, s, NULL, p8, NULL, &err), 0);
        for (int r = 0; r < R; r++) {
            double d = fabs((double)p8[r] - p16[r]);
            if (d > worst) worst = d;
            assert_int_equal(specd_accept_head_forward(b, stage, 1, s + 64 * r, NULL, &one, NULL, &err), 0);
            assert_true(one == p8[r]); /* alone as in the batch, bit for bit */
        }
    }
    /* a random head's logits are large (weights up to 0.5, states up to 2),
     * so its p is far more sensitive than a trained head's (below) */
    print_message("int8 accept head, random 64x32 head: max |dp| %.4f\n", worst);
    assert_true(worst < 0.05);
    assert_true(worst > 0); /* the int8 path is really taken */
    assert_int_equal(specd_accept_head_use_int8(b, &err), 0); /* twice: a no-op */
    specd_accept_head_free(a);
    specd_accept_head_free(b);
    hb_free(&h);

    /* widths that are not multiples of 32 keep the fp16 path, bit for bit */
    hb_init(&h, 12, 8, 1, 2);
    fill_random(&h, 12);
    a = specd_accept_head_create(&h.cfg, &h.w, &err);
    float t[2 * 12], q0[2], q1[2];
    test_fill_random(t, 24, 6, 2.0f);
    assert_int_equal(specd_accept_head_forward(a, 1, 2, t, NULL, q0, NULL, &err), 0);
    assert_int_equal(specd_accept_head_use_int8(a, &err), 0);
    assert_int_equal(specd_accept_head_forward(a, 1, 2, t, NULL, q1, NULL, &err), 0);
    assert_memory_equal(q0, q1, sizeof q0);
    specd_accept_head_free(a);
    hb_free(&h);

    /* the shipped head (models/, committed), on states with the spread of
     * a speculator stage's output (LayerNorm'd and GELU'd: about 0..2) */
    const char *dir = test_path("models/SmolLM2-135M-Instruct.speculator/accept_head");
    specd_accept_head *f = specd_accept_head_load(dir, &err);
    if (!f) fail_msg("%s", err.msg);
    specd_accept_head *g = specd_accept_head_load(dir, &err);
    assert_int_equal(specd_accept_head_use_int8(g, &err), 0);
    const int D = specd_accept_head_config_of(f)->input_dim;
    float *st = malloc(sizeof(float) * (size_t)D * 16), pf[16], pg[16], top2[32];
    test_fill_random(st, (size_t)D * 16, 9, 1.0f);
    for (int i = 0; i < D * 16; i++) st[i] = fabsf(st[i]) * 2.0f - 0.2f;
    for (int r = 0; r < 16; r++) { /* q1 from 0.2 to 0.99, q2 below the rest */
        top2[2 * r] = 0.2f + 0.79f * (float)r / 15;
        top2[2 * r + 1] = 0.5f * (1 - top2[2 * r]);
    }
    worst = 0;
    for (int stage = 0; stage < specd_accept_head_config_of(f)->n_stages; stage++) {
        assert_int_equal(specd_accept_head_forward(f, stage, 16, st, top2, pf, NULL, &err), 0);
        assert_int_equal(specd_accept_head_forward(g, stage, 16, st, top2, pg, NULL, &err), 0);
        for (int r = 0; r < 16; r++)
            if (fabs((double)pf[r] - pg[r]) > worst) worst = fabs((double)pf[r] - pg[r]);
    }
    print_message("int8 accept head, shipped head: max |dp| %.4f\n", worst);
    assert_true(worst < 0.01);
    free(st);
    specd_accept_head_free(f);
    specd_accept_head_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_config),
        cmocka_unit_test(test_save_load_roundtrip),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_forward_hand),
        cmocka_unit_test(test_forward_draft_features),
        cmocka_unit_test(test_stop_rule_greedy),
        cmocka_unit_test(test_min_depth_and_depth),
        cmocka_unit_test(test_threshold_zero_unchanged),
        cmocka_unit_test(test_greedy_ranks_by_expected_length),
        cmocka_unit_test(test_sampling_chains_are_prefixes),
        cmocka_unit_test(test_stop_rule_sampling),
        cmocka_unit_test(test_feature_head_stops_unsure_rows),
        cmocka_unit_test(test_drafter_head_checks),
        cmocka_unit_test(test_int8_path),
    };
    return cmocka_run_group_tests(tests, NULL, cleanup);
}
