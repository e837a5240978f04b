/* golden.c - loader for tests/golden/data/<set>/reference.json (see golden.h). */
#include "tests/harness/golden.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "common/model/model_file.h"
#include "common/model/transformer.h"
#include "common/spec/sampling.h"

#define GOLDEN_SCHEMA "specd-golden/1"
#define GOLDEN_MAX_JSON (64u << 20)

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static char *join_path(const char *dir, const char *rel) {
    size_t a = strlen(dir), b = strlen(rel);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t n = a;
    if (rel[0] != '/') {
        if (a > 0 && dir[a - 1] != '/') p[n++] = '/';
        memcpy(p + n, rel, b + 1);
    } else {
        memcpy(p, rel, b + 1); /* absolute path: use as is */
    }
    return p;
}

static char *slurp(const char *path, specd_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        specd_seterr(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0) goto io;
    long len = ftell(f);
    if (len < 0 || (unsigned long)len > GOLDEN_MAX_JSON) goto io;
    if (fseek(f, 0, SEEK_SET) != 0) goto io;
    buf = malloc((size_t)len + 1);
    if (!buf) goto io;
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) goto io;
    buf[len] = '\0';
    fclose(f);
    return buf;
io:
    free(buf);
    fclose(f);
    specd_seterr(err, "%s: cannot read (too large or I/O error)", path);
    return NULL;
}

/* ---- typed JSON access; every error names the field ---------------------------------------- */

static const cJSON *get(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

static int get_int(const cJSON *obj, const char *key, int *out, const char *ctx, specd_error *err) {
    const cJSON *v = get(obj, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        fabs(v->valuedouble) > 2147483647.0)
        return specd_seterr(err, "%s: '%s' must be an integer", ctx, key);
    *out = (int)v->valuedouble;
    return 0;
}

static int opt_int(const cJSON *obj, const char *key, int dflt, int *out, const char *ctx,
                   specd_error *err) {
    const cJSON *v = get(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    return get_int(obj, key, out, ctx, err);
}

static int get_num(const cJSON *obj, const char *key, double *out, const char *ctx, specd_error *err) {
    const cJSON *v = get(obj, key);
    if (!cJSON_IsNumber(v)) return specd_seterr(err, "%s: '%s' must be a number", ctx, key);
    *out = v->valuedouble;
    return 0;
}

static int get_float(const cJSON *obj, const char *key, float *out, const char *ctx,
                     specd_error *err) {
    double d = 0.0;
    if (get_num(obj, key, &d, ctx, err)) return -1;
    *out = (float)d;
    return 0;
}

static const char *get_str(const cJSON *obj, const char *key, const char *ctx, specd_error *err) {
    const cJSON *v = get(obj, key);
    if (!cJSON_IsString(v) || !v->valuestring) {
        specd_seterr(err, "%s: '%s' must be a string", ctx, key);
        return NULL;
    }
    return v->valuestring;
}

/* Integer array -> malloc'd int32 (n may be 0; then *out is a 1-element
 * allocation so that callers never see NULL on success). */
static int get_i32_array(const cJSON *arr, const char *key, int32_t **out, int *n, const char *ctx,
                         specd_error *err) {
    if (!cJSON_IsArray(arr)) return specd_seterr(err, "%s: '%s' must be an array", ctx, key);
    int len = cJSON_GetArraySize(arr);
    int32_t *a = malloc(sizeof *a * (size_t)(len > 0 ? len : 1));
    if (!a) return specd_seterr(err, "%s: out of memory", ctx);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
            fabs(v->valuedouble) > 2147483647.0) {
            free(a);
            return specd_seterr(err, "%s: '%s'[%d] must be an integer", ctx, key, i);
        }
        a[i++] = (int32_t)v->valuedouble;
    }
    *out = a;
    *n = len;
    return 0;
}

static int get_f32_array(const cJSON *arr, const char *key, float **out, int *n, const char *ctx,
                         specd_error *err) {
    if (!cJSON_IsArray(arr)) return specd_seterr(err, "%s: '%s' must be an array", ctx, key);
    int len = cJSON_GetArraySize(arr);
    float *a = malloc(sizeof *a * (size_t)(len > 0 ? len : 1));
    if (!a) return specd_seterr(err, "%s: out of memory", ctx);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        if (!cJSON_IsNumber(v)) {
            free(a);
            return specd_seterr(err, "%s: '%s'[%d] must be a number", ctx, key, i);
        }
        a[i++] = (float)v->valuedouble;
    }
    *out = a;
    *n = len;
    return 0;
}

/* [[...k ids...] x rows] -> rows*k flat array */
static int get_matrix_i32(const cJSON *m, const char *key, int rows, int k, int32_t **out,
                          const char *ctx, specd_error *err) {
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != rows)
        return specd_seterr(err, "%s: '%s' must be an array of %d rows", ctx, key, rows);
    int32_t *a = malloc(sizeof *a * (size_t)rows * (size_t)k + 1);
    if (!a) return specd_seterr(err, "%s: out of memory", ctx);
    int r = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, m) {
        int32_t *tmp;
        int n;
        if (get_i32_array(row, key, &tmp, &n, ctx, err)) {
            free(a);
            return -1;
        }
        if (n != k) {
            free(tmp);
            free(a);
            return specd_seterr(err, "%s: '%s' row %d has %d entries, expected %d", ctx, key, r,
                                n, k);
        }
        memcpy(a + (size_t)r * (size_t)k, tmp, sizeof *a * (size_t)k);
        free(tmp);
        r++;
    }
    *out = a;
    return 0;
}

static int get_matrix_f32(const cJSON *m, const char *key, int rows, int k, float **out,
                          const char *ctx, specd_error *err) {
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != rows)
        return specd_seterr(err, "%s: '%s' must be an array of %d rows", ctx, key, rows);
    float *a = malloc(sizeof *a * (size_t)rows * (size_t)k + 1);
    if (!a) return specd_seterr(err, "%s: out of memory", ctx);
    int r = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, m) {
        float *tmp;
        int n;
        if (get_f32_array(row, key, &tmp, &n, ctx, err)) {
            free(a);
            return -1;
        }
        if (n != k) {
            free(tmp);
            free(a);
            return specd_seterr(err, "%s: '%s' row %d has %d entries, expected %d", ctx, key, r,
                                n, k);
        }
        memcpy(a + (size_t)r * (size_t)k, tmp, sizeof *a * (size_t)k);
        free(tmp);
        r++;
    }
    *out = a;
    return 0;
}

/* ---- pieces of reference.json -------------------------------------------------------------- */

static int parse_config(const cJSON *c, golden_config *cfg, specd_error *err) {
    const char *ctx = "reference.json: config";
    if (!cJSON_IsObject(c)) return specd_seterr(err, "%s: missing or not an object", ctx);
    double theta = 0, eps = 0;
    if (get_int(c, "vocab_size", &cfg->vocab_size, ctx, err) ||
        get_int(c, "hidden_size", &cfg->hidden_size, ctx, err) ||
        get_int(c, "intermediate_size", &cfg->intermediate_size, ctx, err) ||
        get_int(c, "num_hidden_layers", &cfg->num_hidden_layers, ctx, err) ||
        get_int(c, "num_attention_heads", &cfg->num_attention_heads, ctx, err) ||
        get_int(c, "num_key_value_heads", &cfg->num_key_value_heads, ctx, err) ||
        get_int(c, "head_dim", &cfg->head_dim, ctx, err) ||
        get_int(c, "max_position_embeddings", &cfg->max_position_embeddings, ctx, err) ||
        get_num(c, "rms_norm_eps", &eps, ctx, err) || get_num(c, "rope_theta", &theta, ctx, err) ||
        opt_int(c, "bos_token_id", -1, &cfg->bos_token_id, ctx, err) ||
        opt_int(c, "eos_token_id", -1, &cfg->eos_token_id, ctx, err))
        return -1;
    cfg->rms_norm_eps = (float)eps;
    cfg->rope_theta = (float)theta;
    if (cfg->vocab_size <= 0 || cfg->hidden_size <= 0)
        return specd_seterr(err, "%s: sizes must be positive", ctx);
    cfg->tie_word_embeddings = cJSON_IsTrue(get(c, "tie_word_embeddings"));
    const cJSON *rs = get(c, "rope_scaling");
    snprintf(cfg->rope_type, sizeof cfg->rope_type, "default");
    cfg->rope_factor = 1.0f;
    if (rs && !cJSON_IsNull(rs)) {
        const char *rctx = "reference.json: config.rope_scaling";
        const char *t = get_str(rs, "rope_type", rctx, err);
        if (!t) return -1;
        snprintf(cfg->rope_type, sizeof cfg->rope_type, "%s", t);
        if (get_float(rs, "factor", &cfg->rope_factor, rctx, err)) return -1;
        if (strcmp(t, "llama3") == 0 &&
            (get_float(rs, "low_freq_factor", &cfg->rope_low_freq_factor, rctx, err) ||
             get_float(rs, "high_freq_factor", &cfg->rope_high_freq_factor, rctx, err) ||
             get_int(rs, "original_max_position_embeddings",
                     &cfg->rope_original_max_position_embeddings, rctx, err)))
            return -1;
    }
    return 0;
}

static int parse_array_ref(const cJSON *o, const char *key, const char *dir, int n_prompt, int cols,
                           golden_array *a, const char *ctx, specd_error *err) {
    const cJSON *v = get(o, key);
    if (!v || cJSON_IsNull(v)) return 0; /* optional */
    if (!cJSON_IsObject(v)) return specd_seterr(err, "%s: '%s' must be an object", ctx, key);
    const char *path = get_str(v, "path", ctx, err);
    const char *pos = get_str(v, "positions", ctx, err);
    if (!path || !pos || get_int(v, "rows", &a->rows, ctx, err) ||
        get_int(v, "cols", &a->cols, ctx, err))
        return -1;
    if (strcmp(pos, "all") == 0)
        a->positions = GOLDEN_POS_ALL;
    else if (strcmp(pos, "last") == 0)
        a->positions = GOLDEN_POS_LAST;
    else
        return specd_seterr(err, "%s: %s.positions '%.16s' is neither 'all' nor 'last'", ctx, key,
                            pos);
    int want_rows = a->positions == GOLDEN_POS_ALL ? n_prompt : 1;
    if (a->rows != want_rows || a->cols != cols)
        return specd_seterr(err, "%s: %s is %dx%d, expected %dx%d", ctx, key, a->rows, a->cols,
                            want_rows, cols);
    a->path = join_path(dir, path);
    if (!a->path) return specd_seterr(err, "%s: out of memory", ctx);
    a->present = 1;
    return 0;
}

static int parse_case(const cJSON *o, int idx, const golden_set *g, golden_case *c,
                      specd_error *err) {
    char ctx[96];
    snprintf(ctx, sizeof ctx, "reference.json: cases[%d]", idx);
    if (!cJSON_IsObject(o)) return specd_seterr(err, "%s: not an object", ctx);
    const char *name = get_str(o, "name", ctx, err);
    const char *file = name ? get_str(o, "file", ctx, err) : NULL;
    if (!file) return -1;
    snprintf(ctx, sizeof ctx, "reference.json: case '%.60s'", name);
    c->name = dup_str(name);
    c->file_key = dup_str(file);
    if (!c->name || !c->file_key) return specd_seterr(err, "%s: out of memory", ctx);
    c->model_path = golden_format_path(g, file);
    if (!c->model_path)
        return specd_seterr(err, "%s: file '%.32s' is not a key of format_files", ctx, file);
    const cJSON *text = get(o, "text");
    if (cJSON_IsString(text) && !(c->text = dup_str(text->valuestring)))
        return specd_seterr(err, "%s: out of memory", ctx);

    const int vocab = g->config.vocab_size;
    if (get_i32_array(get(o, "prompt"), "prompt", &c->prompt, &c->n_prompt, ctx, err)) return -1;
    if (c->n_prompt < 1) return specd_seterr(err, "%s: empty prompt", ctx);
    for (int i = 0; i < c->n_prompt; i++)
        if (c->prompt[i] < 0 || c->prompt[i] >= vocab)
            return specd_seterr(err, "%s: prompt[%d] = %d is outside the vocabulary (%d)", ctx, i,
                                (int)c->prompt[i], vocab);
    if (parse_array_ref(o, "logits", g->dir, c->n_prompt, vocab, &c->logits, ctx, err) ||
        parse_array_ref(o, "hidden", g->dir, c->n_prompt, g->config.hidden_size, &c->hidden, ctx,
                        err))
        return -1;
    if (!c->logits.present) return specd_seterr(err, "%s: no 'logits'", ctx);

    int n_margins = 0;
    if (get_i32_array(get(o, "greedy"), "greedy", &c->greedy, &c->n_greedy, ctx, err) ||
        get_f32_array(get(o, "greedy_margins"), "greedy_margins", &c->greedy_margins, &n_margins,
                      ctx, err) ||
        get_float(o, "greedy_min_margin", &c->greedy_min_margin, ctx, err))
        return -1;
    if (n_margins != c->n_greedy)
        return specd_seterr(err, "%s: %d greedy tokens but %d margins", ctx, c->n_greedy,
                            n_margins);
    for (int i = 0; i < c->n_greedy; i++)
        if (c->greedy[i] < 0 || c->greedy[i] >= vocab)
            return specd_seterr(err, "%s: greedy[%d] = %d is outside the vocabulary", ctx, i,
                                (int)c->greedy[i]);

    const cJSON *topk = get(o, "topk");
    if (topk && !cJSON_IsNull(topk)) {
        if (get_int(topk, "k", &c->topk, ctx, err)) return -1;
        if (c->topk < 1 || c->topk > vocab) return specd_seterr(err, "%s: bad topk.k", ctx);
        if (get_matrix_i32(get(topk, "ids"), "topk.ids", c->n_prompt, c->topk, &c->topk_ids, ctx,
                           err) ||
            get_matrix_f32(get(topk, "logits"), "topk.logits", c->n_prompt, c->topk,
                           &c->topk_logits, ctx, err))
            return -1;
    }
    const cJSON *eos = get(o, "greedy_eos_steps");
    if (eos && get_i32_array(eos, "greedy_eos_steps", &c->eos_steps, &c->n_eos_steps, ctx, err))
        return -1;
    const cJSON *chk = get(o, "fp64_check");
    c->fp64_logits_err = -1.0;
    if (cJSON_IsObject(chk)) {
        const cJSON *e = get(chk, "logits_max_abs_err");
        if (cJSON_IsNumber(e)) c->fp64_logits_err = e->valuedouble;
        c->greedy_fp64_agrees = cJSON_IsTrue(get(chk, "greedy_fp64_agrees"));
    }
    return 0;
}

static int parse_formats(const cJSON *ff, golden_set *g, specd_error *err) {
    const char *ctx = "reference.json: format_files";
    if (!cJSON_IsObject(ff)) return specd_seterr(err, "%s: missing or not an object", ctx);
    int n = cJSON_GetArraySize(ff);
    g->format_keys = calloc((size_t)(n > 0 ? n : 1), sizeof *g->format_keys);
    g->format_paths = calloc((size_t)(n > 0 ? n : 1), sizeof *g->format_paths);
    if (!g->format_keys || !g->format_paths) return specd_seterr(err, "%s: out of memory", ctx);
    const cJSON *v;
    cJSON_ArrayForEach(v, ff) {
        if (!cJSON_IsString(v) || !v->string)
            return specd_seterr(err, "%s: values must be strings", ctx);
        g->format_keys[g->n_formats] = dup_str(v->string);
        g->format_paths[g->n_formats] = join_path(g->dir, v->valuestring);
        g->n_formats++;
        if (!g->format_keys[g->n_formats - 1] || !g->format_paths[g->n_formats - 1])
            return specd_seterr(err, "%s: out of memory", ctx);
    }
    return 0;
}

static int parse_set(const cJSON *root, golden_set *g, specd_error *err) {
    const char *ctx = "reference.json";
    if (!cJSON_IsObject(root)) return specd_seterr(err, "%s: not a JSON object", ctx);
    const char *schema = get_str(root, "schema", ctx, err);
    if (!schema) return -1;
    if (strcmp(schema, GOLDEN_SCHEMA) != 0)
        return specd_seterr(err, "%s: schema '%.32s', expected '" GOLDEN_SCHEMA "'", ctx, schema);
    const char *model = get_str(root, "model", ctx, err);
    if (!model || !(g->model = dup_str(model))) return -1;
    if (parse_config(get(root, "config"), &g->config, err) ||
        parse_formats(get(root, "format_files"), g, err) ||
        opt_int(root, "n_new", 0, &g->n_new, ctx, err))
        return -1;
    const cJSON *tol = get(root, "tolerance");
    if (!cJSON_IsObject(tol) || get_float(tol, "logits_rel", &g->logits_rel, "tolerance", err) ||
        get_float(tol, "hidden_rel", &g->hidden_rel, "tolerance", err))
        return specd_preferr(err, "%s", ctx);
    const cJSON *cases = get(root, "cases");
    if (!cJSON_IsArray(cases) || cJSON_GetArraySize(cases) < 1)
        return specd_seterr(err, "%s: 'cases' must be a non-empty array", ctx);
    int n = cJSON_GetArraySize(cases);
    g->cases = calloc((size_t)n, sizeof *g->cases);
    if (!g->cases) return specd_seterr(err, "%s: out of memory", ctx);
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        if (parse_case(c, g->n_cases, g, &g->cases[g->n_cases], err)) {
            g->n_cases++; /* so that golden_free releases the partial case */
            return -1;
        }
        g->n_cases++;
    }
    return 0;
}

golden_set *golden_load(const char *dir, specd_error *err) {
    golden_set *g = calloc(1, sizeof *g);
    char *json_path = NULL, *text = NULL;
    cJSON *root = NULL;
    if (!g || !(g->dir = dup_str(dir)) || !(json_path = join_path(dir, "reference.json"))) {
        specd_seterr(err, "golden: out of memory");
        goto fail;
    }
    if (!(text = slurp(json_path, err))) goto fail;
    root = cJSON_Parse(text);
    if (!root) {
        specd_seterr(err, "%s: invalid JSON near byte %ld", json_path,
                     cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - text) : -1L);
        goto fail;
    }
    if (parse_set(root, g, err)) {
        specd_preferr(err, "%s", dir);
        goto fail;
    }
    cJSON_Delete(root);
    free(text);
    free(json_path);
    return g;
fail:
    cJSON_Delete(root);
    free(text);
    free(json_path);
    golden_free(g);
    return NULL;
}

static void free_case(golden_case *c) {
    free(c->name);
    free(c->file_key);
    free(c->text);
    free(c->prompt);
    free(c->logits.path);
    free(c->hidden.path);
    free(c->greedy);
    free(c->greedy_margins);
    free(c->topk_ids);
    free(c->topk_logits);
    free(c->eos_steps);
}

void golden_free(golden_set *g) {
    if (!g) return;
    for (int i = 0; i < g->n_cases; i++) free_case(&g->cases[i]);
    free(g->cases);
    for (int i = 0; i < g->n_formats; i++) {
        free(g->format_keys[i]);
        free(g->format_paths[i]);
    }
    free(g->format_keys);
    free(g->format_paths);
    free(g->model);
    free(g->dir);
    free(g);
}

const char *golden_format_path(const golden_set *g, const char *key) {
    for (int i = 0; i < g->n_formats; i++)
        if (strcmp(g->format_keys[i], key) == 0) return g->format_paths[i];
    return NULL;
}

/* ---- raw arrays ------------------------------------------------------------------------------ */

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

float *golden_read_f32(const char *path, size_t expected_count, specd_error *err) {
    if (expected_count == 0 || expected_count > ((size_t)1 << 32)) {
        specd_seterr(err, "%s: bad expected element count %zu", path, expected_count);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        specd_seterr(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    float *a = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
        specd_seterr(err, "%s: cannot determine the file size", path);
        goto done;
    }
    if ((unsigned long)len != expected_count * sizeof(float)) {
        specd_seterr(err, "%s: %ld bytes, expected %zu floats (%zu bytes)", path, len,
                     expected_count, expected_count * sizeof(float));
        goto done;
    }
    a = malloc(expected_count * sizeof(float));
    if (!a) {
        specd_seterr(err, "%s: out of memory", path);
        goto done;
    }
    if (fread(a, sizeof(float), expected_count, f) != expected_count) {
        specd_seterr(err, "%s: short read", path);
        free(a);
        a = NULL;
        goto done;
    }
    if (!host_is_little_endian()) {
        for (size_t i = 0; i < expected_count; i++) {
            uint32_t u;
            memcpy(&u, &a[i], 4);
            u = (u >> 24) | ((u >> 8) & 0xff00u) | ((u << 8) & 0xff0000u) | (u << 24);
            memcpy(&a[i], &u, 4);
        }
    }
done:
    fclose(f);
    return a;
}

float *golden_load_array(const golden_array *a, specd_error *err) {
    if (!a->present) {
        specd_seterr(err, "golden: the case has no such array");
        return NULL;
    }
    return golden_read_f32(a->path, (size_t)a->rows * (size_t)a->cols, err);
}

/* ---- comparison -------------------------------------------------------------------------------- */

golden_diff golden_compare(const float *got, const float *ref, int rows, int cols) {
    golden_diff d = {0};
    for (int r = 0; r < rows; r++) {
        const float *g = got + (size_t)r * (size_t)cols, *x = ref + (size_t)r * (size_t)cols;
        int ag = 0, ar = 0;
        for (int c = 0; c < cols; c++) {
            if (!isfinite(g[c])) {
                d.nonfinite++;
                continue;
            }
            double diff = fabs((double)g[c] - (double)x[c]);
            if (diff > d.max_abs) {
                d.max_abs = diff;
                d.worst = (size_t)r * (size_t)cols + (size_t)c;
            }
            if (fabs((double)x[c]) > d.max_ref) d.max_ref = fabs((double)x[c]);
            if (g[c] > g[ag]) ag = c;
            if (x[c] > x[ar]) ar = c;
        }
        if (ag != ar) d.argmax_mismatches++;
    }
    return d;
}

int golden_within(const golden_diff *d, double rel) {
    double scale = d->max_ref > 1.0 ? d->max_ref : 1.0;
    return d->nonfinite == 0 && d->max_abs <= rel * scale;
}

int golden_greedy_first_diff(const golden_case *c, const int32_t *got, int n) {
    int m = n < c->n_greedy ? n : c->n_greedy;
    for (int i = 0; i < m; i++)
        if (got[i] != c->greedy[i]) return i;
    return -1;
}

void golden_plain_greedy(const char *model, int ctx, const int32_t *prompt, int n_prompt,
                         int n_gen, int32_t *out) {
    golden_plain_greedy_kv(model, ctx, prompt, n_prompt, n_gen, SPECD_KV_AUTO, out);
}

void golden_plain_greedy_kv(const char *model, int ctx, const int32_t *prompt, int n_prompt,
                            int n_gen, specd_kv_dtype kv, int32_t *out) {
    specd_error err = {{0}};
    specd_model_file *m = specd_model_open(model, &err);
    if (!m) fail_msg("%s", err.msg);
    specd_transformer_opts to = {.backend = {.name = "cpu", .n_threads = 1, .kv_dtype = kv},
                                 .n_slots = 1, .max_ctx = ctx, .max_batch = 64};
    specd_transformer *t = specd_transformer_create(m, &to, &err);
    if (!t) fail_msg("%s", err.msg);
    int vocab = m->hp.vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    int32_t last = n_prompt - 1, zero = 0;
    specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = n_prompt};
    specd_batch b = {.n_tokens = n_prompt, .tokens = (int32_t *)prompt, .n_seqs = 1, .seqs = &in,
                     .n_out = 1, .out_rows = &last, .logits = logits};
    assert_int_equal(specd_transformer_forward(t, &b, &err), 0);
    for (int g = 0; g < n_gen; g++) {
        out[g] = specd_argmax(logits, vocab);
        in = (specd_seq_input){.slot = 0, .n_past = n_prompt + g, .n_new = 1};
        b = (specd_batch){.n_tokens = 1, .tokens = &out[g], .n_seqs = 1, .seqs = &in,
                          .n_out = 1, .out_rows = &zero, .logits = logits};
        assert_int_equal(specd_transformer_forward(t, &b, &err), 0);
    }
    free(logits);
    specd_transformer_free(t);
    specd_model_close(m);
}
