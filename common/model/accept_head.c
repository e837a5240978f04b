/* accept_head.c - the acceptance head: config.json, its tensors, the
 * forward pass, and writing a head directory (accept_head.h).
 *
 * Layout of this file: config.json parsing (on a buffer, so the fuzz
 * target can drive it), the tensor layout both the loader and the writer
 * follow, loading with checks, saving, and the forward pass. All
 * parameters live in one fp32 buffer; the per-tensor pointers point into
 * it. */
#include "common/model/accept_head.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/model/hf_dir.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_write.h"
#include "common/util/dtype.h"
#include "common/util/json.h"
#include "common/util/small_file.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/qmatmul.h"

#define CONFIG SPECD_HF_CONFIG
#define WEIGHTS SPECD_HF_SINGLE_WEIGHTS
#define MODEL_TYPE "specd_accept_head"
#define MAX_JSON_FILE (1u << 20) /* a config is a few hundred bytes */
/* in_proj weight + bias, stage_emb, draft_proj, 4 per block, out weight + bias */
#define MAX_TENSORS (4 + 4 * SPECD_ACCEPT_HEAD_MAX_LAYERS + 2)

/* ---- config.json ------------------------------------------------------------- */

/* A required integral member in [lo, hi] (common/util/json.h). */
static int get_int(const cJSON *root, const char *key, int lo, int hi, int *out,
                   specd_error *err) {
    return specd_json_int(root, CONFIG, key, 1, 0, lo, hi, out, err);
}

static int parse_config_object(const cJSON *root, specd_accept_head_config *c, specd_error *err) {
    if (!cJSON_IsObject(root)) return specd_seterr(err, CONFIG ": not a JSON object");
    /* Required, unlike a Hugging Face config's: pointing drafter.mlp.accept_head
     * at the speculator's own directory is an easy mistake, and this names it. */
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(type))
        return specd_seterr(err, CONFIG ": 'model_type' must be the string '" MODEL_TYPE
                                 "', got %s", specd_json_type_name(type));
    if (strcmp(type->valuestring, MODEL_TYPE) != 0)
        return specd_seterr(err, CONFIG ": model_type is '%.64s', not '" MODEL_TYPE "'",
                            type->valuestring);
    if (get_int(root, "input_dim", 1, SPECD_ACCEPT_HEAD_MAX_INPUT, &c->input_dim, err) ||
        get_int(root, "hidden_dim", 1, SPECD_ACCEPT_HEAD_MAX_HIDDEN, &c->hidden_dim, err) ||
        get_int(root, "n_layers", 0, SPECD_ACCEPT_HEAD_MAX_LAYERS, &c->n_layers, err) ||
        get_int(root, "n_stages", 1, SPECD_ACCEPT_HEAD_MAX_STAGES, &c->n_stages, err) ||
        /* optional: the heads written before draft features had none */
        specd_json_int(root, CONFIG, "n_draft_features", 0, 0, 0,
                       SPECD_ACCEPT_HEAD_DRAFT_FEATURES, &c->n_draft_features, err))
        return -1;
    if (c->n_draft_features != 0 && c->n_draft_features != SPECD_ACCEPT_HEAD_DRAFT_FEATURES)
        return specd_seterr(err, CONFIG ": 'n_draft_features' = %d must be 0 or %d",
                            c->n_draft_features, SPECD_ACCEPT_HEAD_DRAFT_FEATURES);
    return 0;
}

int specd_accept_head_parse_config(const char *json, size_t len, specd_accept_head_config *cfg,
                                   specd_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = specd_json_parse(json, len, CONFIG, err);
    if (!root) return -1;
    int rc = parse_config_object(root, cfg, err);
    cJSON_Delete(root);
    return rc;
}

/* A config built in memory gets the same limits as a parsed one. */
static int check_config(const specd_accept_head_config *c, specd_error *err) {
    if (c->input_dim < 1 || c->input_dim > SPECD_ACCEPT_HEAD_MAX_INPUT ||
        c->hidden_dim < 1 || c->hidden_dim > SPECD_ACCEPT_HEAD_MAX_HIDDEN ||
        c->n_layers < 0 || c->n_layers > SPECD_ACCEPT_HEAD_MAX_LAYERS || c->n_stages < 1 ||
        c->n_stages > SPECD_ACCEPT_HEAD_MAX_STAGES ||
        (c->n_draft_features != 0 && c->n_draft_features != SPECD_ACCEPT_HEAD_DRAFT_FEATURES))
        return specd_seterr(err, "accept head: config (input %d, hidden %d, layers %d, stages "
                                 "%d, draft features %d) is outside the limits", c->input_dim,
                            c->hidden_dim, c->n_layers, c->n_stages, c->n_draft_features);
    return 0;
}

/* ---- tensor layout ------------------------------------------------------------ */

/* What a tensor is, for matching it to a specd_accept_head_weights field. */
typedef enum {
    T_IN_W, T_IN_B, T_STAGE_EMB, T_DRAFT_W, T_FC1_W, T_FC1_B, T_FC2_W, T_FC2_B, T_OUT_W, T_OUT_B
} tensor_kind;

/* One tensor of the head: its file name, shape (cols 0 = a vector), kind
 * (and block) and place in the flat parameter buffer. The order is the
 * file's and the formula's: in_proj, stage_emb, draft_proj, blocks, out. */
typedef struct head_tensor {
    char name[40];
    int rows, cols;
    tensor_kind kind;
    int layer;
    size_t offset;
} head_tensor;

static size_t tensor_numel(const head_tensor *t) {
    return (size_t)t->rows * (size_t)(t->cols ? t->cols : 1);
}

/* Fills t[] for cfg; returns the tensor count, *total = floats in all. */
static int head_layout(const specd_accept_head_config *c, head_tensor *t, size_t *total) {
    int n = 0, H = c->hidden_dim;
    size_t off = 0;
#define ADD(kind_, layer_, rows_, cols_, ...)                            \
    do {                                                                \
        snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);             \
        t[n].rows = (rows_);                                            \
        t[n].cols = (cols_);                                            \
        t[n].kind = (kind_);                                            \
        t[n].layer = (layer_);                                          \
        t[n].offset = off;                                              \
        off += tensor_numel(&t[n]);                                     \
        n++;                                                            \
    } while (0)
    ADD(T_IN_W, 0, H, c->input_dim, "in_proj.weight");
    ADD(T_IN_B, 0, H, 0, "in_proj.bias");
    ADD(T_STAGE_EMB, 0, c->n_stages, H, "stage_emb.weight");
    if (c->n_draft_features) ADD(T_DRAFT_W, 0, H, c->n_draft_features, "draft_proj.weight");
    for (int l = 0; l < c->n_layers; l++) {
        ADD(T_FC1_W, l, H, H, "blocks.%d.fc1.weight", l);
        ADD(T_FC1_B, l, H, 0, "blocks.%d.fc1.bias", l);
        ADD(T_FC2_W, l, H, H, "blocks.%d.fc2.weight", l);
        ADD(T_FC2_B, l, H, 0, "blocks.%d.fc2.bias", l);
    }
    ADD(T_OUT_W, 0, 1, H, "out.weight");
    ADD(T_OUT_B, 0, 1, 0, "out.bias");
#undef ADD
    *total = off;
    return n;
}

/* The caller's array for a layout entry. */
static const float *weight_src(const specd_accept_head_weights *w, const head_tensor *t) {
    switch (t->kind) {
    case T_IN_W: return w->in_w;
    case T_IN_B: return w->in_b;
    case T_STAGE_EMB: return w->stage_emb;
    case T_DRAFT_W: return w->draft_w;
    case T_FC1_W: return w->fc1_w[t->layer];
    case T_FC1_B: return w->fc1_b[t->layer];
    case T_FC2_W: return w->fc2_w[t->layer];
    case T_FC2_B: return w->fc2_b[t->layer];
    case T_OUT_W: return w->out_w;
    case T_OUT_B: return &w->out_b;
    }
    return NULL;
}

/* ---- the model ---------------------------------------------------------------- */

struct specd_accept_head {
    specd_accept_head_config cfg;
    float *params; /* every tensor, in layout order */
    const float *in_w, *in_b, *stage_emb, *out_w;
    const float *draft_w; /* [H][F]; NULL without draft features */
    const float *fc1_w[SPECD_ACCEPT_HEAD_MAX_LAYERS], *fc1_b[SPECD_ACCEPT_HEAD_MAX_LAYERS];
    const float *fc2_w[SPECD_ACCEPT_HEAD_MAX_LAYERS], *fc2_b[SPECD_ACCEPT_HEAD_MAX_LAYERS];
    float out_b;
    /* The matrices again as fp16, which the forward pass reads: a draft
     * step runs the head once per stage, right after the target's pass has
     * flushed the caches, so its time is the time to stream the weights in
     * (fp32: 1.5 MB for the shipped head, ~0.14 ms a stage on the Cascade
     * Lake VM, about a quarter of the drafter's time per level). */
    uint16_t *w16;
    const uint16_t *in_w16, *out_w16;
    const uint16_t *fc1_w16[SPECD_ACCEPT_HEAD_MAX_LAYERS], *fc2_w16[SPECD_ACCEPT_HEAD_MAX_LAYERS];
    /* With specd_accept_head_use_int8: W_in, then fc1 and fc2 of each
     * block, as Q8_0 tiles for the integer matmul (34 bytes a 32 weights:
     * about half of fp16's); n_q 0 = the fp16 matrices above. */
    cpu_qweight q[1 + 2 * SPECD_ACCEPT_HEAD_MAX_LAYERS];
    int n_q;
    float *bias0;  /* [H] scratch: b_in + E[stage] of the call */
    /* forward scratch, grown on demand: the residual stream, the block's
     * inner activation and a matmul's product, [rows][H] each */
    float *x, *t, *u;
    size_t rows_cap;
};

/* Allocates the parameter buffer for cfg and points the tensors into it. */
static specd_accept_head *head_alloc(const specd_accept_head_config *cfg, head_tensor *layout,
                                     int *n_tensors, specd_error *err) {
    size_t total;
    *n_tensors = head_layout(cfg, layout, &total);
    specd_accept_head *h = calloc(1, sizeof *h);
    if (h) {
        h->params = malloc(sizeof(float) * total);
        h->bias0 = malloc(sizeof(float) * (size_t)cfg->hidden_dim);
    }
    if (!h || !h->params || !h->bias0) {
        if (h) {
            free(h->params);
            free(h->bias0);
        }
        free(h);
        specd_seterr(err, "accept head: out of memory for %zu parameters", total);
        return NULL;
    }
    h->cfg = *cfg;
    for (int i = 0; i < *n_tensors; i++) {
        const float *at = h->params + layout[i].offset;
        int l = layout[i].layer;
        switch (layout[i].kind) {
        case T_IN_W: h->in_w = at; break;
        case T_IN_B: h->in_b = at; break;
        case T_STAGE_EMB: h->stage_emb = at; break;
        case T_DRAFT_W: h->draft_w = at; break;
        case T_FC1_W: h->fc1_w[l] = at; break;
        case T_FC1_B: h->fc1_b[l] = at; break;
        case T_FC2_W: h->fc2_w[l] = at; break;
        case T_FC2_B: h->fc2_b[l] = at; break;
        case T_OUT_W: h->out_w = at; break;
        case T_OUT_B: break; /* copied into out_b once filled */
        }
    }
    return h;
}

/* A NaN or infinite weight would make every p NaN, and a NaN never
 * compares above a threshold: the head would silently do nothing. */
static int check_finite(const specd_accept_head *h, const head_tensor *layout, int n,
                        specd_error *err) {
    for (int i = 0; i < n; i++) {
        const float *v = h->params + layout[i].offset;
        for (size_t j = 0; j < tensor_numel(&layout[i]); j++)
            if (!isfinite(v[j]))
                return specd_seterr(err, "tensor '%s': element %zu is not finite", layout[i].name,
                                    j);
    }
    return 0;
}

/* Takes out_b and makes the fp16 matrices. -1 + err on out of memory. */
static int head_finish(specd_accept_head *h, const head_tensor *layout, int n,
                       specd_error *err) {
    h->out_b = h->params[layout[n - 1].offset];
    const specd_accept_head_config *c = &h->cfg;
    size_t H = (size_t)c->hidden_dim;
    size_t total = H * (size_t)c->input_dim + 2 * (size_t)c->n_layers * H * H + H;
    if (!(h->w16 = malloc(sizeof(uint16_t) * total)))
        return specd_seterr(err, "accept head: out of memory for its fp16 matrices");
    uint16_t *dst = h->w16;
    const uint16_t **slot[2 + 2 * SPECD_ACCEPT_HEAD_MAX_LAYERS];
    const float *from[2 + 2 * SPECD_ACCEPT_HEAD_MAX_LAYERS];
    size_t len[2 + 2 * SPECD_ACCEPT_HEAD_MAX_LAYERS];
    int m = 0;
    slot[m] = &h->in_w16, from[m] = h->in_w, len[m++] = H * (size_t)c->input_dim;
    for (int l = 0; l < c->n_layers; l++) {
        slot[m] = &h->fc1_w16[l], from[m] = h->fc1_w[l], len[m++] = H * H;
        slot[m] = &h->fc2_w16[l], from[m] = h->fc2_w[l], len[m++] = H * H;
    }
    slot[m] = &h->out_w16, from[m] = h->out_w, len[m++] = H;
    for (int i = 0; i < m; i++) {
        *slot[i] = dst;
        for (size_t j = 0; j < len[i]; j++) dst[j] = specd_f32_to_fp16(from[i][j]);
        dst += len[i];
    }
    return 0;
}

void specd_accept_head_free(specd_accept_head *h) {
    if (!h) return;
    for (int i = 0; i < h->n_q; i++) cpu_qweight_free(&h->q[i]);
    free(h->params);
    free(h->w16);
    free(h->bias0);
    free(h->x);
    free(h->t);
    free(h->u);
    free(h);
}

const specd_accept_head_config *specd_accept_head_config_of(const specd_accept_head *h) {
    return &h->cfg;
}

specd_accept_head *specd_accept_head_create(const specd_accept_head_config *cfg,
                                            const specd_accept_head_weights *w, specd_error *err) {
    if (check_config(cfg, err)) return NULL;
    head_tensor layout[MAX_TENSORS];
    int n;
    specd_accept_head *h = head_alloc(cfg, layout, &n, err);
    if (!h) return NULL;
    for (int i = 0; i < n; i++) {
        const float *src = weight_src(w, &layout[i]);
        if (!src) {
            specd_seterr(err, "accept head: no data for tensor '%s'", layout[i].name);
            specd_accept_head_free(h);
            return NULL;
        }
        memcpy(h->params + layout[i].offset, src, sizeof(float) * tensor_numel(&layout[i]));
    }
    if (check_finite(h, layout, n, err)) {
        specd_accept_head_free(h);
        return NULL;
    }
    if (head_finish(h, layout, n, err)) {
        specd_accept_head_free(h);
        return NULL;
    }
    return h;
}

/* ---- loading ------------------------------------------------------------------ */

/* The stored tensor for layout entry `want`, checked for dtype and shape. */
static const safetensors_tensor *find_checked(const safetensors_file *f, const head_tensor *want,
                                              specd_error *err) {
    const safetensors_tensor *t = safetensors_find(f, want->name);
    if (!t) {
        specd_seterr(err, "tensor '%s' is missing", want->name);
        return NULL;
    }
    if (t->type != SPECD_F32 && t->type != SPECD_F16 && t->type != SPECD_BF16) {
        const specd_dtype_info *in = specd_dtype_get(t->type);
        specd_seterr(err, "tensor '%s' has dtype %s; accept head weights must be F32, F16 or "
                          "BF16", want->name, in && in->name ? in->name : "?");
        return NULL;
    }
    int dims = want->cols ? 2 : 1;
    if ((int)t->n_dims != dims || t->shape[0] != (uint64_t)want->rows ||
        (dims == 2 && t->shape[1] != (uint64_t)want->cols)) {
        char got[96] = "[";
        for (uint32_t i = 0; i < t->n_dims; i++) {
            size_t len = strlen(got);
            snprintf(got + len, sizeof got - len, "%s%llu", i ? ", " : "",
                     (unsigned long long)t->shape[i]);
        }
        strncat(got, "]", sizeof got - strlen(got) - 1);
        if (dims == 2)
            specd_seterr(err, "tensor '%s': shape %s does not match config [%d, %d]", want->name,
                         got, want->rows, want->cols);
        else
            specd_seterr(err, "tensor '%s': shape %s does not match config [%d]", want->name,
                         got, want->rows);
        return NULL;
    }
    return t;
}

/* Every stored tensor must be one the config implies: a block beyond
 * n_layers, say, means config and weights disagree. */
static int check_no_extra(const safetensors_file *f, const head_tensor *layout, int n,
                          specd_error *err) {
    for (size_t i = 0; i < safetensors_n_tensors(f); i++) {
        const char *name = safetensors_tensor_at(f, i)->name;
        int known = 0;
        for (int j = 0; j < n && !known; j++) known = !strcmp(name, layout[j].name);
        if (!known)
            return specd_seterr(err, "tensor '%.64s' is not part of an accept head with this "
                                     "config", name);
    }
    return 0;
}

static specd_accept_head *load_from(const char *dir, safetensors_file **fp, specd_error *err) {
    char path[2048];
    cJSON *root = specd_hf_read_json(dir, CONFIG, MAX_JSON_FILE, err);
    if (!root) return NULL;
    specd_accept_head_config cfg = {0};
    int rc = parse_config_object(root, &cfg, err);
    cJSON_Delete(root);
    if (rc || specd_path_join(path, sizeof path, dir, WEIGHTS, err)) return NULL;
    if (!(*fp = safetensors_open(path, err))) {
        specd_preferr(err, WEIGHTS);
        return NULL;
    }
    /* Shapes are checked against the config before the buffer is sized, so
     * the allocation is bounded by what the file really holds. */
    head_tensor layout[MAX_TENSORS];
    size_t total;
    int n = head_layout(&cfg, layout, &total);
    const safetensors_tensor *src[MAX_TENSORS];
    for (int i = 0; i < n; i++)
        if (!(src[i] = find_checked(*fp, &layout[i], err))) return NULL;
    if (check_no_extra(*fp, layout, n, err)) return NULL;
    specd_accept_head *h = head_alloc(&cfg, layout, &n, err);
    if (!h) return NULL;
    for (int i = 0; i < n; i++) {
        float *dst = h->params + layout[i].offset;
        for (size_t j = 0; j < tensor_numel(&layout[i]); j++)
            dst[j] = safetensors_elem_f32(src[i], j);
    }
    if (check_finite(h, layout, n, err)) {
        specd_accept_head_free(h);
        return NULL;
    }
    if (head_finish(h, layout, n, err)) {
        specd_accept_head_free(h);
        return NULL;
    }
    return h;
}

specd_accept_head *specd_accept_head_load(const char *dir, specd_error *err) {
    safetensors_file *f = NULL;
    specd_accept_head *h = load_from(dir, &f, err);
    safetensors_close(f); /* the weights were copied out */
    if (!h) specd_preferr(err, "accept head %s", dir);
    return h;
}

/* ---- saving ------------------------------------------------------------------- */

static char *config_text(const specd_accept_head_config *c, const char *dtype,
                         const char *extra_json, specd_error *err) {
    cJSON *root = cJSON_CreateObject();
    int ok = root && cJSON_AddStringToObject(root, "model_type", MODEL_TYPE) &&
             cJSON_AddNumberToObject(root, "input_dim", c->input_dim) &&
             cJSON_AddNumberToObject(root, "hidden_dim", c->hidden_dim) &&
             cJSON_AddNumberToObject(root, "n_layers", c->n_layers) &&
             cJSON_AddNumberToObject(root, "n_stages", c->n_stages) &&
             (!c->n_draft_features ||
              cJSON_AddNumberToObject(root, "n_draft_features", c->n_draft_features)) &&
             cJSON_AddStringToObject(root, "dtype", dtype);
    if (ok && extra_json) {
        cJSON *extra = cJSON_Parse(extra_json);
        if (!cJSON_IsObject(extra)) {
            cJSON_Delete(extra);
            cJSON_Delete(root);
            specd_seterr(err, "accept head: extra config is not a JSON object");
            return NULL;
        }
        /* the head's own keys win: extra describes, it does not reshape */
        cJSON *item = extra->child;
        while (item) {
            cJSON *next = item->next;
            if (!cJSON_HasObjectItem(root, item->string)) {
                cJSON_DetachItemViaPointer(extra, item);
                cJSON_AddItemToObject(root, item->string, item);
            }
            item = next;
        }
        cJSON_Delete(extra);
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) specd_seterr(err, "accept head: out of memory");
    return text;
}

int specd_accept_head_save(const char *dir, const specd_accept_head_config *cfg,
                           const specd_accept_head_weights *w, const char *dtype,
                           const char *extra_json, specd_error *err) {
    specd_dtype type;
    if (!strcmp(dtype, "F32")) type = SPECD_F32;
    else if (!strcmp(dtype, "F16")) type = SPECD_F16;
    else if (!strcmp(dtype, "BF16")) type = SPECD_BF16;
    else return specd_seterr(err, "accept head: dtype '%s' is not F32, F16 or BF16", dtype);
    if (check_config(cfg, err)) return -1;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return specd_seterr(err, "accept head: cannot create %s: %s", dir, strerror(errno));
    head_tensor layout[MAX_TENSORS];
    safetensors_out outs[MAX_TENSORS];
    size_t total;
    int n = head_layout(cfg, layout, &total);
    for (int i = 0; i < n; i++) {
        const float *src = weight_src(w, &layout[i]);
        if (!src) return specd_seterr(err, "accept head: no data for tensor '%s'", layout[i].name);
        outs[i] = (safetensors_out){.name = layout[i].name, .type = type,
                                    .n_dims = layout[i].cols ? 2 : 1, .data = src};
        outs[i].shape[0] = (uint64_t)layout[i].rows;
        outs[i].shape[1] = (uint64_t)layout[i].cols;
    }
    char path[2048];
    /* weights first, config last: a directory with a config is complete */
    if (specd_path_join(path, sizeof path, dir, WEIGHTS, err) ||
        safetensors_write(path, outs, n, NULL, NULL, 0, err))
        return specd_preferr(err, "accept head");
    char *text = config_text(cfg, dtype, extra_json, err);
    if (!text) return -1;
    int rc = specd_path_join(path, sizeof path, dir, CONFIG, err) ||
             specd_write_small_file(path, text, strlen(text), err);
    free(text);
    return rc ? specd_preferr(err, "accept head") : 0;
}

/* ---- the integer path ----------------------------------------------------------- */

/* One [out][in] fp32 matrix as GGML Q8_0 blocks (a scale per 32 weights),
 * repacked into tiles for the integer matmul. */
static int make_q8(const float *w, int out, int in, cpu_qweight *q, specd_error *err) {
    const size_t row_bytes = (size_t)in / 32 * 34; /* fp16 scale + 32 int8 */
    uint8_t *blocks = malloc(row_bytes * (size_t)out);
    if (!blocks) return specd_seterr(err, "accept head: out of memory for its Q8_0 matrices");
    for (int o = 0; o < out; o++)
        cpu_quantize_row_q8_0(w + (size_t)o * in, blocks + (size_t)o * row_bytes, in);
    specd_tensor t = {.type = SPECD_Q8_0, .n_dims = 2, .ne = {(uint64_t)in, (uint64_t)out, 1, 1},
                      .data = blocks, .nbytes = row_bytes * (size_t)out};
    int r = cpu_qweight_make(&t, q, NULL);
    free(blocks);
    return r == 1 ? 0 : specd_seterr(err, "accept head: cannot repack a %dx%d matrix", out, in);
}

int specd_accept_head_use_int8(specd_accept_head *h, specd_error *err) {
    const specd_accept_head_config *c = &h->cfg;
    if (h->n_q || c->input_dim % 32 || c->hidden_dim % 32) return 0;
    const int H = c->hidden_dim;
    int n = 0, rc = make_q8(h->in_w, H, c->input_dim, &h->q[n++], err);
    for (int l = 0; !rc && l < c->n_layers; l++) {
        rc = make_q8(h->fc1_w[l], H, H, &h->q[n++], err);
        if (!rc) rc = make_q8(h->fc2_w[l], H, H, &h->q[n++], err);
    }
    if (rc) {
        for (int i = 0; i < n; i++) cpu_qweight_free(&h->q[i]);
        return -1;
    }
    h->n_q = n;
    return 0;
}

/* ---- forward ------------------------------------------------------------------ */

/* y[r][o] = (add ? y[r][o] : 0) + (b[o] + w[o] . x[r]), w the fp16
 * matrix, row-major [out][in], or its Q8_0 tiles q when not NULL. The
 * products come from the CPU kernels' matmul (fp32 arithmetic on the
 * widened weights, or int8 dot products on int8 activations; the SIMD
 * path of the machine, SPECD_SIMD to force one), which reads each weight
 * row once for all rows and is bitwise the same for a row alone as in any
 * batch. It runs on the calling thread: a stage is ~0.4 M multiply-adds.
 * `tmp` holds the products when adding. */
static void linear(const float *x, int n, int in, const uint16_t *w, const cpu_qweight *q,
                   const float *b, int out, int add, float *y, float *tmp) {
    float *prod = add ? tmp : y;
    if (q) {
        cpu_qmatmul(NULL, prod, q, x, n);
    } else {
        specd_tensor W = {.type = SPECD_F16, .n_dims = 2,
                          .ne = {(uint64_t)in, (uint64_t)out, 1, 1}, .data = w,
                          .nbytes = sizeof(uint16_t) * (uint64_t)in * (uint64_t)out};
        cpu_matmul(NULL, prod, &W, x, n);
    }
    for (int r = 0; r < n; r++) {
        float *yr = y + (size_t)r * out;
        const float *pr = prod + (size_t)r * out;
        for (int o = 0; o < out; o++) yr[o] = add ? yr[o] + (b[o] + pr[o]) : b[o] + pr[o];
    }
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

static float sigmoid(float z) {
    /* both branches keep exp's argument <= 0, so nothing overflows */
    if (z >= 0) return 1.0f / (1.0f + expf(-z));
    float e = expf(z);
    return e / (1.0f + e);
}

static int grow_scratch(specd_accept_head *h, size_t rows, specd_error *err) {
    if (rows <= h->rows_cap) return 0;
    size_t n = rows * (size_t)h->cfg.hidden_dim;
    float *x = realloc(h->x, sizeof(float) * n);
    if (x) h->x = x;
    float *t = realloc(h->t, sizeof(float) * n);
    if (t) h->t = t;
    float *u = realloc(h->u, sizeof(float) * n);
    if (u) h->u = u;
    if (!x || !t || !u) return specd_seterr(err, "accept head: out of memory for %zu rows", rows);
    h->rows_cap = rows;
    return 0;
}

static float clamp16(double v) { return (float)(v < -16 ? -16 : v > 16 ? 16 : v); }

void specd_accept_head_draft_features(float q1, float q2, float *f) {
    /* the floors only keep a zero finite (q1 >= 1/vocab in a real row; q2
     * is 0 where one token has all the mass): the clamp bounds the rest */
    double a = q1 > 1e-30f ? q1 : 1e-30, b = q2 > 1e-30f ? q2 : 1e-30;
    f[0] = clamp16(log(a) - log1p(-(a < 1 ? a : 1 - 1e-16)));
    f[1] = clamp16(log(a) - log(b));
    f[2] = q1;
}

int specd_accept_head_wants_top2(const specd_accept_head *h) {
    return h->cfg.n_draft_features > 0;
}

int specd_accept_head_forward(specd_accept_head *h, int stage, int n_rows, const float *states,
                              const float *top2, float *p, float *logits, specd_error *err) {
    const specd_accept_head_config *c = &h->cfg;
    if (stage < 0 || stage >= c->n_stages)
        return specd_seterr(err, "accept head: stage %d outside 0..%d", stage, c->n_stages - 1);
    if (n_rows < 0 || n_rows > SPECD_ACCEPT_HEAD_MAX_ROWS)
        return specd_seterr(err, "accept head: %d rows, at most %d", n_rows,
                            SPECD_ACCEPT_HEAD_MAX_ROWS);
    if (c->n_draft_features && !top2)
        return specd_seterr(err, "accept head: reads draft features, and the caller gave none");
    if (n_rows == 0) return 0;
    if (grow_scratch(h, (size_t)n_rows, err)) return -1;
    int H = c->hidden_dim;
    size_t nH = (size_t)n_rows * H;
    /* x = W_in s + b_in + E[stage]: the bias and the stage vector are one
     * per-stage bias */
    const float *e = h->stage_emb + (size_t)stage * H;
    for (int o = 0; o < H; o++) h->bias0[o] = h->in_b[o] + e[o];
    const cpu_qweight *q = h->n_q ? h->q : NULL; /* q[0] W_in, q[1 + 2l] fc1, q[2 + 2l] fc2 */
    linear(states, n_rows, c->input_dim, h->in_w16, q, h->bias0, H, 0, h->x, NULL);
    if (c->n_draft_features) {
        /* x += W_d f: three columns, plain fp32 */
        for (int r = 0; r < n_rows; r++) {
            float f[SPECD_ACCEPT_HEAD_DRAFT_FEATURES];
            specd_accept_head_draft_features(top2[2 * r], top2[2 * r + 1], f);
            float *xr = h->x + (size_t)r * H;
            for (int o = 0; o < H; o++) {
                const float *wd = h->draft_w + (size_t)o * SPECD_ACCEPT_HEAD_DRAFT_FEATURES;
                float acc = 0;
                for (int j = 0; j < SPECD_ACCEPT_HEAD_DRAFT_FEATURES; j++) acc += wd[j] * f[j];
                xr[o] += acc;
            }
        }
    }
    for (int l = 0; l < c->n_layers; l++) {
        linear(h->x, n_rows, H, h->fc1_w16[l], q ? q + 1 + 2 * l : NULL, h->fc1_b[l], H, 0, h->t,
               NULL);
        for (size_t j = 0; j < nH; j++) h->t[j] = silu(h->t[j]);
        linear(h->t, n_rows, H, h->fc2_w16[l], q ? q + 2 + 2 * l : NULL, h->fc2_b[l], H, 1, h->x,
               h->u); /* x += block(x) */
    }
    const float zero = 0.0f;
    /* the output row stays fp16: one row, nothing to save */
    linear(h->x, n_rows, H, h->out_w16, NULL, &zero, 1, 0, h->t, NULL); /* [rows][1] */
    for (int r = 0; r < n_rows; r++) {
        float z = h->out_b + h->t[r];
        if (logits) logits[r] = z;
        p[r] = sigmoid(z);
    }
    return 0;
}
