/* test_mlp_speculator.c - the MLP speculator against its PyTorch reference,
 * and its loader against bad files.
 *
 * Fixtures: tests/golden/data/mlp-spec-{untied,tied,sharded}/, made offline by
 * tests/golden/make_speculator_golden.py (README.md there): real
 * MLPSpeculator directories (F32 / F16 tied with only the shared tensors
 * stored / BF16 sharded; scale_input off and on) plus the reference's
 * per-stage logits and states for 6 rows, teacher-forced (stage i gets
 * tokens[row][i]). Rule, per stage and array:
 *
 *     max |c - ref| <= 1e-4 * max(1, max |ref|)
 *
 * Both sides compute in fp32 on identical weights, so they differ only in
 * summation order; the reference's own distance from fp64 is < 1e-6 here.
 *
 * Bad inputs: config.json and safetensors files written by the test into a
 * temp directory, one defect each; every one must give an error naming the
 * key or tensor, never a crash. */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model/mlp_speculator.h"
#include "kernels/cpu/matmul.h"
#include "tests/harness/golden.h"
#include "tests/harness/test_util.h"

#define REL 1e-4

/* ---- fixtures --------------------------------------------------------------------- */

static double g_worst_rel; /* worst max|diff| / max(1, max|ref|) over every fixture array */

static const cJSON *need(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) fail_msg("reference.json: '%s' missing", key);
    return v;
}

static int need_int(const cJSON *obj, const char *key) {
    const cJSON *v = need(obj, key);
    assert_true(cJSON_IsNumber(v));
    return v->valueint;
}

/* Reads <dir>/<array.path> holding array.rows x array.cols floats. */
static float *load_array(const char *dir, const cJSON *array, int rows, int cols) {
    assert_int_equal(need_int(array, "rows"), rows);
    assert_int_equal(need_int(array, "cols"), cols);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, need(array, "path")->valuestring);
    specd_error err = {{0}};
    float *a = golden_read_f32(path, (size_t)rows * cols, &err);
    if (!a) fail_msg("%s", err.msg);
    return a;
}

static void compare(const char *what, const float *got, const float *ref, int rows, int cols) {
    golden_diff d = golden_compare(got, ref, rows, cols);
    double rel = d.max_abs / (d.max_ref > 1 ? d.max_ref : 1);
    if (rel > g_worst_rel) g_worst_rel = rel;
    printf("  %-34s max|diff| %.3g  max|ref| %.3g  argmax mismatches %d\n", what, d.max_abs,
           d.max_ref, d.argmax_mismatches);
    if (!golden_within(&d, REL))
        fail_msg("%s: max|diff| %g > %g * max(1, %g)", what, d.max_abs, REL, d.max_ref);
}

static void check_fixture(const char *name) {
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s", test_path("tests/golden/data"));
    strncat(dir, "/", sizeof dir - strlen(dir) - 1);
    strncat(dir, name, sizeof dir - strlen(dir) - 1);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    char *text = test_read_file(path, NULL);
    if (!text) fail_msg("cannot read %s", path);
    cJSON *ref = cJSON_Parse(text);
    free(text);
    assert_non_null(ref);
    assert_string_equal(need(ref, "schema")->valuestring, "specd-mlp-spec-golden/1");

    specd_error err = {{0}};
    specd_mlp_speculator *sp = specd_mlp_speculator_load(dir, 2, &err);
    if (!sp) fail_msg("%s: %s", name, err.msg);
    const specd_mlp_spec_config *c = specd_mlp_speculator_config(sp);
    const cJSON *rc = need(ref, "config");
    assert_int_equal(c->vocab_size, need_int(rc, "vocab_size"));
    assert_int_equal(c->emb_dim, need_int(rc, "emb_dim"));
    int inner = need_int(rc, "inner_dim");
    assert_int_equal(c->inner_dim, inner ? inner : c->emb_dim);
    assert_int_equal(c->n_predict, need_int(rc, "n_predict"));
    assert_int_equal(c->tie_weights, cJSON_IsTrue(need(rc, "tie_weights")));
    assert_int_equal(c->scale_input, cJSON_IsTrue(need(rc, "scale_input")));
    const cJSON *tk = need(rc, "top_k_tokens_per_head");
    for (int i = 0; i < c->n_predict; i++)
        assert_int_equal(c->top_k[i], cJSON_GetArrayItem(tk, i)->valueint);
    assert_int_equal(c->n_candidates, need_int(rc, "n_candidates"));
    printf("%s (%s): vocab %d, emb %d, inner %d, n_predict %d, tied %d, scale_input %d\n", name,
           need(need(ref, "weights"), "dtype")->valuestring, c->vocab_size, c->emb_dim,
           c->inner_dim, c->n_predict, c->tie_weights, c->scale_input);

    int rows = need_int(ref, "rows"), V = c->vocab_size, D = c->inner_dim;
    float *state = load_array(dir, need(ref, "state_in"), rows, c->emb_dim);
    const cJSON *tokens = need(ref, "tokens");
    assert_int_equal(cJSON_GetArraySize(tokens), rows);
    float *next = malloc(sizeof(float) * rows * D), *logits = malloc(sizeof(float) * rows * V);
    float *one_state = malloc(sizeof(float) * D), *one_logits = malloc(sizeof(float) * V);
    int32_t *tok = malloc(sizeof(int32_t) * rows);
    const cJSON *stages = need(ref, "stages");
    assert_int_equal(cJSON_GetArraySize(stages), c->n_predict);
    int in_dim = c->emb_dim;
    for (int s = 0; s < c->n_predict; s++) {
        for (int r = 0; r < rows; r++)
            tok[r] = cJSON_GetArrayItem(cJSON_GetArrayItem(tokens, r), s)->valueint;
        if (specd_mlp_speculator_stage(sp, s, rows, state, tok, next, logits, &err))
            fail_msg("%s stage %d: %s", name, s, err.msg);
        const cJSON *st = cJSON_GetArrayItem(stages, s);
        float *ref_logits = load_array(dir, need(st, "logits"), rows, V);
        float *ref_state = load_array(dir, need(st, "state"), rows, D);
        char what[96];
        snprintf(what, sizeof what, "%s stage %d logits", name, s);
        compare(what, logits, ref_logits, rows, V);
        snprintf(what, sizeof what, "%s stage %d state", name, s);
        compare(what, next, ref_state, rows, D);

        /* One row at a time (the single-token matmul path) and without
         * logits: the same numbers up to summation order. */
        for (int r = 0; r < rows; r++) {
            if (specd_mlp_speculator_stage(sp, s, 1, state + (size_t)r * in_dim, tok + r,
                                           one_state, r % 2 ? NULL : one_logits, &err))
                fail_msg("%s stage %d row %d: %s", name, s, r, err.msg);
            golden_diff d = golden_compare(one_state, ref_state + (size_t)r * D, 1, D);
            assert_true(golden_within(&d, REL));
            if (r % 2 == 0) {
                d = golden_compare(one_logits, ref_logits + (size_t)r * V, 1, V);
                assert_true(golden_within(&d, REL));
            }
        }
        free(ref_logits);
        free(ref_state);
        /* the next stage reads our state, as the drafter will */
        float *t = realloc(state, sizeof(float) * rows * D);
        assert_non_null(t);
        state = t;
        memcpy(state, next, sizeof(float) * rows * D);
        in_dim = D;
    }
    free(state);
    free(next);
    free(logits);
    free(one_state);
    free(one_logits);
    free(tok);
    specd_mlp_speculator_free(sp);
    cJSON_Delete(ref);
}

static void test_untied_f32(void **s) {
    (void)s;
    check_fixture("mlp-spec-untied");
}

static void test_tied_f16_scale_input(void **s) {
    (void)s;
    check_fixture("mlp-spec-tied");
}

static void test_sharded_bf16_scale_input(void **s) {
    (void)s;
    check_fixture("mlp-spec-sharded");
}

/* ---- synthetic directories ----------------------------------------------------- */

/* A tensor for write_safetensors: dtype as safetensors spells it. */
typedef struct tspec {
    char name[64];
    const char *dtype;
    int n_dims;
    int shape[2];
} tspec;

static size_t dtype_size(const char *dt) {
    if (!strcmp(dt, "F32") || !strcmp(dt, "I32")) return 4;
    if (!strcmp(dt, "F64")) return 8;
    return 2;
}

/* Writes a valid safetensors file with small random values. */
static void write_safetensors(const char *path, const tspec *t, int n) {
    char *header = malloc(1 << 16);
    size_t off = 0, hl = 0;
    hl += (size_t)sprintf(header + hl, "{");
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)t[i].shape[0] * (t[i].n_dims > 1 ? (size_t)t[i].shape[1] : 1);
        size_t bytes = numel * dtype_size(t[i].dtype);
        hl += (size_t)sprintf(header + hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%d", i ? "," : "",
                              t[i].name, t[i].dtype, t[i].shape[0]);
        if (t[i].n_dims > 1) hl += (size_t)sprintf(header + hl, ",%d", t[i].shape[1]);
        hl += (size_t)sprintf(header + hl, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
        off += bytes;
    }
    hl += (size_t)sprintf(header + hl, "}");
    while (hl % 8) header[hl++] = ' ';
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n64 = hl;
    fwrite(&n64, 8, 1, f);
    fwrite(header, 1, hl, f);
    /* F32 data: small random floats; other types: bytes that decode to small
     * finite values (0x3c00 = fp16 1.0, 0x3f80 = bf16 1.0 with noise) */
    float *buf = malloc(off / 4 * sizeof(float) + 4);
    test_fill_random(buf, off / 4 + 1, 7, 0.5f);
    size_t w = 0;
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)t[i].shape[0] * (t[i].n_dims > 1 ? (size_t)t[i].shape[1] : 1);
        for (size_t j = 0; j < numel; j++) {
            if (!strcmp(t[i].dtype, "F32")) {
                fwrite(&buf[(w++) % (off / 4 + 1)], 4, 1, f);
            } else if (!strcmp(t[i].dtype, "F16") || !strcmp(t[i].dtype, "BF16")) {
                uint16_t h = !strcmp(t[i].dtype, "F16") ? 0x3800 : 0x3f00; /* 0.5 */
                fwrite(&h, 2, 1, f);
            } else {
                uint8_t z[8] = {0};
                fwrite(z, dtype_size(t[i].dtype), 1, f);
            }
        }
    }
    fclose(f);
    free(buf);
    free(header);
}

/* The tensors of a small valid untied speculator (vocab 8, emb 4, inner 6,
 * 2 stages), with or without the "speculator." prefix. */
static int valid_tensors(tspec *t, int n_predict, int tied, int prefix) {
    int n = 0;
    const char *p = prefix ? "speculator." : "";
    for (int i = 0; i < n_predict; i++) {
        int own = !tied || i == 0;
        if (own) {
            t[n] = (tspec){"", "F32", 2, {8, 6}};
            snprintf(t[n++].name, 64, "%semb.%d.weight", p, i);
        }
        if (!tied || i < 2) {
            t[n] = (tspec){"", "F32", 2, {6, i == 0 ? 4 : 6}};
            snprintf(t[n++].name, 64, "%sproj.%d.weight", p, i);
        }
        if (own) {
            t[n] = (tspec){"", "F32", 2, {8, 6}};
            snprintf(t[n++].name, 64, "%shead.%d.weight", p, i);
            t[n] = (tspec){"", "F32", 1, {6, 0}};
            snprintf(t[n++].name, 64, "%sln.%d.weight", p, i);
            t[n] = (tspec){"", "F32", 1, {6, 0}};
            snprintf(t[n++].name, 64, "%sln.%d.bias", p, i);
        }
    }
    return n;
}

static const char k_valid_config[] =
    "{\"model_type\": \"mlp_speculator\", \"vocab_size\": 8, \"emb_dim\": 4, \"inner_dim\": 6, "
    "\"n_predict\": 2, \"top_k_tokens_per_head\": [3, 2], \"n_candidates\": 4, "
    "\"tie_weights\": %s, \"scale_input\": false}";

/* A fresh temp directory holding config.json (printf-formatted) and, when
 * n_tensors >= 0, model.safetensors. Returns the directory (static). */
static const char *make_dir(const tspec *t, int n_tensors, const char *config_fmt, ...) {
    static char dir[256];
    static int counter;
    snprintf(dir, sizeof dir, "/tmp/specd_mlpspec_%d_%d", (int)getpid(), counter++);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    assert_int_equal(system(cmd), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    va_list ap;
    va_start(ap, config_fmt);
    vfprintf(f, config_fmt, ap);
    va_end(ap);
    fclose(f);
    if (n_tensors >= 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        write_safetensors(path, t, n_tensors);
    }
    return dir;
}

static void remove_dir(const char *dir) {
    if (strncmp(dir, "/tmp/specd_mlpspec_", 19) != 0) return; /* only what make_dir made */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Loading must fail with a message containing `want`. */
static void expect_load_error(const char *dir, const char *want) {
    specd_error err = {{0}};
    specd_mlp_speculator *sp = specd_mlp_speculator_load(dir, 1, &err);
    if (sp) {
        specd_mlp_speculator_free(sp);
        fail_msg("loaded, expected an error containing \"%s\"", want);
    }
    printf("  error: %s\n", err.msg);
    if (!strstr(err.msg, want)) fail_msg("error \"%s\" does not contain \"%s\"", err.msg, want);
    remove_dir(dir);
}

/* Weight bytes of the synthetic speculator (valid_tensors, all F32, kept
 * as stored) with n_predict stages, tied or not. */
static size_t synthetic_weight_bytes(int n_predict, int tied) {
    static const char config[] =
        "{\"model_type\": \"mlp_speculator\", \"vocab_size\": 8, \"emb_dim\": 4, "
        "\"inner_dim\": 6, \"n_predict\": %d, \"top_k_tokens_per_head\": [3, 2%s], "
        "\"n_candidates\": 4, \"tie_weights\": %s, \"scale_input\": false}";
    tspec t[32];
    int n = valid_tensors(t, n_predict, tied, 1);
    const char *dir =
        make_dir(t, n, config, n_predict, n_predict > 2 ? ", 2" : "", tied ? "true" : "false");
    specd_error err = {{0}};
    specd_mlp_speculator *sp = specd_mlp_speculator_load(dir, 1, &err);
    if (!sp) fail_msg("n_predict %d tied %d: %s", n_predict, tied, err.msg);
    size_t bytes = specd_mlp_speculator_weight_bytes(sp);
    specd_mlp_speculator_free(sp);
    remove_dir(dir);
    return bytes;
}

/* A tied tensor is held once, however many stages read it: a third tied
 * stage adds no bytes, a third untied one adds its emb, proj, head and
 * norm. (Sizes in F32: emb and head 8 x 6, proj 6 x 4 for stage 0 and
 * 6 x 6 after, ln weight and bias 6 each.) */
static void test_tied_weights_held_once(void **s) {
    (void)s;
    const size_t emb = 8 * 6 * 4, head = 8 * 6 * 4, proj0 = 6 * 4 * 4, proj = 6 * 6 * 4,
                 ln = 2 * 6 * 4;
    assert_int_equal(synthetic_weight_bytes(2, 1), emb + proj0 + proj + head + ln);
    assert_int_equal(synthetic_weight_bytes(3, 1), emb + proj0 + proj + head + ln);
    assert_int_equal(synthetic_weight_bytes(2, 0), 2 * (emb + head + ln) + proj0 + proj);
    assert_int_equal(synthetic_weight_bytes(3, 0), 3 * (emb + head + ln) + proj0 + 2 * proj);
}

static void test_valid_synthetic(void **s) {
    (void)s;
    tspec t[32];
    for (int prefix = 0; prefix < 2; prefix++) {
        for (int tied = 0; tied < 2; tied++) {
            int n = valid_tensors(t, 2, tied, prefix);
            const char *dir = make_dir(t, n, k_valid_config, tied ? "true" : "false");
            specd_error err = {{0}};
            specd_mlp_speculator *sp = specd_mlp_speculator_load(dir, 1, &err);
            if (!sp) fail_msg("prefix %d tied %d: %s", prefix, tied, err.msg);
            const specd_mlp_spec_config *c = specd_mlp_speculator_config(sp);
            assert_int_equal(c->inner_dim, 6);
            assert_int_equal(specd_mlp_speculator_state_in_dim(sp, 0), 4);
            assert_int_equal(specd_mlp_speculator_state_in_dim(sp, 1), 6);
            /* stage API misuse: clean errors */
            float in[2 * 6] = {0}, out[2 * 6], logits[2 * 8];
            int32_t tok[2] = {1, 7};
            assert_int_equal(specd_mlp_speculator_stage(sp, 0, 2, in, tok, out, logits, &err), 0);
            assert_int_equal(specd_mlp_speculator_stage(sp, 1, 2, out, tok, in, NULL, &err), 0);
            assert_int_equal(specd_mlp_speculator_stage(sp, 0, 0, in, tok, out, logits, &err), 0);
            assert_int_equal(specd_mlp_speculator_stage(sp, 2, 1, in, tok, out, logits, &err), -1);
            assert_non_null(strstr(err.msg, "stage 2"));
            assert_int_equal(specd_mlp_speculator_stage(sp, -1, 1, in, tok, out, logits, &err),
                             -1);
            assert_int_equal(specd_mlp_speculator_stage(sp, 0, -1, in, tok, out, logits, &err),
                             -1);
            int32_t bad[2] = {1, 8};
            assert_int_equal(specd_mlp_speculator_stage(sp, 0, 2, in, bad, out, logits, &err), -1);
            assert_non_null(strstr(err.msg, "tokens[1] = 8"));
            bad[1] = -3;
            assert_int_equal(specd_mlp_speculator_stage(sp, 0, 2, in, bad, out, logits, &err), -1);
            /* every SIMD path agrees on rows narrower than one 32-column
             * group (emb_dim 4, inner_dim 6: all tail, several tokens) */
            static const char *paths[] = {"scalar", "avx2", "avx512"};
            float want[3 * 8], got[3 * 8], st[3 * 6];
            float in3[3 * 4];
            int32_t tok3[3] = {0, 3, 7};
            test_fill_random(in3, 12, 3, 1.0f);
            for (int p = 0; p < 3; p++) {
                if (!cpu_simd_force(paths[p])) continue;
                float *dst = p == 0 ? want : got;
                assert_int_equal(specd_mlp_speculator_stage(sp, 0, 3, in3, tok3, st, dst, &err), 0);
                if (p > 0)
                    for (int j = 0; j < 3 * 8; j++) assert_float_equal(got[j], want[j], 1e-5);
            }
            cpu_simd_force("auto");
            specd_mlp_speculator_free(sp);
            remove_dir(dir);
        }
    }
}

static void test_bad_tensors(void **s) {
    (void)s;
    tspec t[32];
    int n;

    /* wrong shape: head.1 one column short */
    n = valid_tensors(t, 2, 0, 1);
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, "speculator.head.1.weight")) t[i].shape[1] = 5;
    expect_load_error(make_dir(t, n, k_valid_config, "false"),
                      "tensor 'speculator.head.1.weight': shape [8, 5] does not match config "
                      "[8, 6]");

    /* wrong shape: proj.0 must read emb_dim (4), not inner_dim */
    n = valid_tensors(t, 2, 0, 0);
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, "proj.0.weight")) t[i].shape[1] = 6;
    expect_load_error(make_dir(t, n, k_valid_config, "false"), "'proj.0.weight': shape [6, 6]");

    /* wrong rank: ln bias as a matrix */
    n = valid_tensors(t, 2, 0, 1);
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, "speculator.ln.0.bias")) t[i] = (tspec){"speculator.ln.0.bias",
                                                                        "F32", 2, {6, 1}};
    expect_load_error(make_dir(t, n, k_valid_config, "false"), "speculator.ln.0.bias");

    /* wrong dtype: integer and double weights */
    n = valid_tensors(t, 2, 0, 1);
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, "speculator.emb.1.weight")) t[i].dtype = "I32";
    expect_load_error(make_dir(t, n, k_valid_config, "false"),
                      "tensor 'speculator.emb.1.weight' has dtype I32");
    n = valid_tensors(t, 2, 0, 1);
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, "speculator.ln.1.weight")) t[i].dtype = "F64";
    expect_load_error(make_dir(t, n, k_valid_config, "false"),
                      "tensor 'speculator.ln.1.weight' has dtype F64");

    /* F16 and BF16 are fine */
    n = valid_tensors(t, 2, 0, 1);
    for (int i = 0; i < n; i++) t[i].dtype = i % 2 ? "F16" : "BF16";
    const char *dir = make_dir(t, n, k_valid_config, "false");
    specd_error err = {{0}};
    specd_mlp_speculator *sp = specd_mlp_speculator_load(dir, 1, &err);
    if (!sp) fail_msg("%s", err.msg);
    specd_mlp_speculator_free(sp);
    remove_dir(dir);

    /* missing tensor: untied needs every stage's own */
    n = valid_tensors(t, 2, 0, 1);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, "speculator.head.1.weight")) t[k++] = t[i];
    expect_load_error(make_dir(t, k, k_valid_config, "false"),
                      "tensor 'speculator.head.1.weight' is missing");

    /* tied: proj.1 is not shared with proj.0, so it must be stored */
    n = valid_tensors(t, 2, 1, 1);
    k = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, "speculator.proj.1.weight")) t[k++] = t[i];
    expect_load_error(make_dir(t, k, k_valid_config, "true"),
                      "tensor 'speculator.proj.1.weight' is missing");

    /* untied checkpoint declared tied is fine (shared copies are just used) */
    n = valid_tensors(t, 2, 0, 1);
    dir = make_dir(t, n, k_valid_config, "true");
    sp = specd_mlp_speculator_load(dir, 1, &err);
    if (!sp) fail_msg("%s", err.msg);
    specd_mlp_speculator_free(sp);
    remove_dir(dir);

    /* no weights at all; weights not safetensors */
    expect_load_error(make_dir(t, -1, k_valid_config, "false"), "no model.safetensors");
    dir = make_dir(t, -1, k_valid_config, "false");
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    fputs("not a safetensors file", f);
    fclose(f);
    expect_load_error(dir, "model.safetensors");

    /* sharded: a shard name that escapes the directory */
    dir = make_dir(t, -1, k_valid_config, "false");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    f = fopen(path, "w");
    fputs("{\"weight_map\": {\"speculator.emb.0.weight\": \"../evil.safetensors\"}}", f);
    fclose(f);
    expect_load_error(dir, "not a plain file name");

    /* no directory */
    expect_load_error("/nonexistent/specd-mlp-spec", "config.json");
}

static void test_bad_configs(void **s) {
    (void)s;
    tspec t[32];
    int n = valid_tensors(t, 2, 0, 1);
    /* through the loader: a missing key and n_predict 0 */
    expect_load_error(make_dir(t, n, "{\"emb_dim\": 4, \"n_predict\": 2, "
                                     "\"top_k_tokens_per_head\": [1, 1]}"),
                      "config.json: 'vocab_size' is missing");
    expect_load_error(make_dir(t, n, "{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 0}"),
                      "'n_predict' = 0 must be an integer in 1..16");

    /* the parser on its own, one defect per line */
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"", "not valid JSON"},
        {"[1, 2]", "not a JSON object"},
        {"{\"vocab_size\": 8, \"n_predict\": 3}", "'emb_dim' is missing"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4}", "'n_predict' is missing"},
        {"{\"vocab_size\": 8388608, \"emb_dim\": 4, \"n_predict\": 3}", "'vocab_size' = 8.38861e+06"},
        {"{\"vocab_size\": 0, \"emb_dim\": 4, \"n_predict\": 3}", "'vocab_size' = 0"},
        {"{\"vocab_size\": 8, \"emb_dim\": 65537, \"n_predict\": 3}", "'emb_dim' = 65537"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"inner_dim\": 1e12, \"n_predict\": 3}",
         "'inner_dim' = 1e+12"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"inner_dim\": -1, \"n_predict\": 3}",
         "'inner_dim' = -1"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 17}", "'n_predict' = 17"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4.5, \"n_predict\": 3}", "'emb_dim' = 4.5"},
        {"{\"vocab_size\": \"8\", \"emb_dim\": 4, \"n_predict\": 3}",
         "'vocab_size' must be an integer, got a string"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 2}",
         "'top_k_tokens_per_head' is missing"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 2, \"top_k_tokens_per_head\": [2]}",
         "'top_k_tokens_per_head' has 1 entries; n_predict is 2"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 2, \"top_k_tokens_per_head\": 2}",
         "'top_k_tokens_per_head' must be an array"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 2, \"top_k_tokens_per_head\": [2, 0]}",
         "'top_k_tokens_per_head[1]' = 0"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 2, \"top_k_tokens_per_head\": [2, 9]}",
         "'top_k_tokens_per_head[1]' = 9 must be an integer in 1..8"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 2, \"top_k_tokens_per_head\": [2, "
         "\"x\"]}",
         "'top_k_tokens_per_head[1]' must be an integer"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 3, \"n_candidates\": 0}",
         "'n_candidates' = 0"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 3, \"tie_weights\": 1}",
         "'tie_weights' must be true or false"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 3, \"scale_input\": \"yes\"}",
         "'scale_input' must be true or false"},
        {"{\"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 1, \"top_k_tokens_per_head\": [1], "
         "\"tie_weights\": true}",
         "'tie_weights' needs n_predict >= 2"},
        {"{\"model_type\": \"llama\", \"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 3}",
         "model_type is 'llama'"},
        {"{\"model_type\": 3, \"vocab_size\": 8, \"emb_dim\": 4, \"n_predict\": 3}",
         "'model_type' must be a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        specd_mlp_spec_config c;
        specd_error err = {{0}};
        int rc = specd_mlp_spec_parse_config(cases[i].json, strlen(cases[i].json), &c, &err);
        if (rc != -1) fail_msg("case %zu (%s) parsed", i, cases[i].json);
        if (!strstr(err.msg, cases[i].want))
            fail_msg("case %zu: \"%s\" does not contain \"%s\"", i, err.msg, cases[i].want);
    }

    /* defaults: MLPSpeculatorConfig's, inner_dim 0 = emb_dim, nulls = absent */
    specd_mlp_spec_config c;
    specd_error err = {{0}};
    const char *json = "{\"vocab_size\": 32000, \"emb_dim\": 5120, \"n_predict\": 3, "
                       "\"inner_dim\": null, \"tie_weights\": null}";
    assert_int_equal(specd_mlp_spec_parse_config(json, strlen(json), &c, &err), 0);
    assert_int_equal(c.inner_dim, 5120);
    assert_int_equal(c.top_k[0], 5);
    assert_int_equal(c.top_k[1], 4);
    assert_int_equal(c.top_k[2], 3);
    assert_int_equal(c.n_candidates, 5);
    assert_int_equal(c.tie_weights, 0);
    assert_int_equal(c.scale_input, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_untied_f32),
        cmocka_unit_test(test_tied_f16_scale_input),
        cmocka_unit_test(test_tied_weights_held_once),
        cmocka_unit_test(test_sharded_bf16_scale_input),
        cmocka_unit_test(test_valid_synthetic),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_bad_configs),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    printf("worst fixture error: %.3g of max(1, max|ref|) (rule: <= %g)\n", g_worst_rel, REL);
    return rc;
}
