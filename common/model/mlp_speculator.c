/* mlp_speculator.c - loads an MLPSpeculator directory and runs its stages.
 *
 * Layout of this file, top to bottom: config.json parsing (on a buffer, so
 * the fuzz target can drive it), weight files (one safetensors file or
 * shards), tensor lookup with shape checks, loading, and the stage forward
 * pass, which is the reference's loop body written out.
 *
 * Every arithmetic step goes through the compute backend (kernels/backend.h):
 * matmuls, embedding lookups, the norm + GELU. The head matmul ([rows x
 * inner] . [inner x vocab]) is nearly all the work and the CPU backend
 * spreads it over its thread pool, reading each weight row once for the
 * whole batch. The stage API takes and returns host arrays: on the CPU
 * backend those are device buffers already; on a GPU backend each stage
 * copies its inputs in and its outputs out (a few KB against the head's
 * megabytes of weights). */
#include "common/model/mlp_speculator.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/hf_dir.h"
#include "common/model/safetensors.h"
#include "common/util/dtype.h"
#include "common/util/json.h"
#include "common/util/small_file.h"
#include "kernels/backend.h"
#include "kernels/cpu/matmul.h"

#define CONFIG SPECD_HF_CONFIG
#define MAX_JSON_FILE (16u << 20) /* config/index files are KBs; larger = wrong file */
#define NORM_EPS 1e-6f            /* the reference's LayerNormParameterized default */

/* ---- config.json ------------------------------------------------------------- */

/* top_k_tokens_per_head: one k per stage. The reference's config class
 * defaults it to [5, 4, 3] and asserts its length equals n_predict, so a
 * missing list is only valid for 3 stages. */
static int get_top_k(const cJSON *root, specd_mlp_spec_config *c, specd_error *err) {
    static const char key[] = "top_k_tokens_per_head";
    const cJSON *list = specd_json_member(root, key);
    if (!list) {
        if (c->n_predict != 3)
            return specd_seterr(err, CONFIG ": '%s' is missing; its default [5, 4, 3] fits only "
                                        "n_predict 3, not %d", key, c->n_predict);
        static const int def[3] = {5, 4, 3};
        for (int i = 0; i < 3; i++) c->top_k[i] = def[i] < c->vocab_size ? def[i] : c->vocab_size;
        return 0;
    }
    if (!cJSON_IsArray(list))
        return specd_seterr(err, CONFIG ": '%s' must be an array, got %s", key,
                            specd_json_type_name(list));
    int n = cJSON_GetArraySize(list);
    if (n != c->n_predict)
        return specd_seterr(err, CONFIG ": '%s' has %d entries; n_predict is %d", key, n,
                            c->n_predict);
    int hi = c->vocab_size < SPECD_MLP_SPEC_MAX_TOPK ? c->vocab_size : SPECD_MLP_SPEC_MAX_TOPK;
    int i = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, list) {
        char name[64];
        snprintf(name, sizeof name, "%s[%d]", key, i);
        if (specd_json_to_int(k, CONFIG, name, 1, hi, &c->top_k[i], err)) return -1;
        i++;
    }
    return 0;
}

static int parse_config_object(const cJSON *root, specd_mlp_spec_config *c, specd_error *err) {
    if (!cJSON_IsObject(root)) return specd_seterr(err, CONFIG ": not a JSON object");
    const cJSON *type = specd_json_member(root, "model_type");
    if (type && !cJSON_IsString(type))
        return specd_seterr(err, CONFIG ": 'model_type' must be a string, got %s",
                            specd_json_type_name(type));
    if (type && strcmp(type->valuestring, "mlp_speculator") != 0)
        return specd_seterr(err, CONFIG ": model_type is '%.64s', not 'mlp_speculator'",
                            type->valuestring);
    int inner = 0;
    if (specd_json_int(root, CONFIG, "vocab_size", 1, 0, 1, SPECD_MLP_SPEC_MAX_VOCAB, &c->vocab_size, err) ||
        specd_json_int(root, CONFIG, "emb_dim", 1, 0, 1, SPECD_MLP_SPEC_MAX_DIM, &c->emb_dim, err) ||
        specd_json_int(root, CONFIG, "inner_dim", 0, 0, 0, SPECD_MLP_SPEC_MAX_DIM, &inner, err) ||
        specd_json_int(root, CONFIG, "n_predict", 1, 0, 1, SPECD_MLP_SPEC_MAX_PREDICT, &c->n_predict, err) ||
        get_top_k(root, c, err) ||
        specd_json_int(root, CONFIG, "n_candidates", 0, 5, 1, SPECD_MLP_SPEC_MAX_CANDIDATES, &c->n_candidates,
                err) ||
        specd_json_bool(root, CONFIG, "tie_weights", 0, &c->tie_weights, err) ||
        specd_json_bool(root, CONFIG, "scale_input", 0, &c->scale_input, err))
        return -1;
    c->inner_dim = inner ? inner : c->emb_dim; /* the reference: 0 means emb_dim */
    c->vocab_mapped = specd_json_member(root, "target_vocab_size") != NULL;
    c->target_vocab_size = c->vocab_size;
    if (c->vocab_mapped) {
        if (specd_json_int(root, CONFIG, "target_vocab_size", 1, 0, 1, SPECD_MLP_SPEC_MAX_VOCAB,
                    &c->target_vocab_size, err))
            return -1;
        /* distinct target ids plus at most one "other" row */
        if (c->vocab_size > c->target_vocab_size + 1)
            return specd_seterr(err, CONFIG ": 'vocab_size' = %d draft rows cannot map into "
                                        "'target_vocab_size' = %d", c->vocab_size,
                                c->target_vocab_size);
    }
    /* Tying shares proj.1 among stages >= 1; with one stage there is none to
     * share and the reference asserts. */
    if (c->tie_weights && c->n_predict < 2)
        return specd_seterr(err, CONFIG ": 'tie_weights' needs n_predict >= 2, got %d",
                            c->n_predict);
    return 0;
}

int specd_mlp_spec_parse_config(const char *json, size_t len, specd_mlp_spec_config *cfg,
                                specd_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = specd_json_parse(json, len, CONFIG, err);
    if (!root) return -1;
    int rc = parse_config_object(root, cfg, err);
    cJSON_Delete(root);
    return rc;
}

/* ---- files -------------------------------------------------------------------- */

/* One weight file (hf_dir.h opens model.safetensors or each shard through
 * this), owned by its handle; errors name the file. */
static safetensors_file *open_owned(void *ctx, const char *path, specd_error *err) {
    (void)ctx;
    safetensors_file *st = safetensors_open(path, err);
    if (!st) {
        const char *slash = strrchr(path, '/');
        specd_preferr(err, "%s", slash ? slash + 1 : path);
    }
    return st;
}

/* IBM's checkpoints name tensors "speculator.emb.0.weight" (the module's
 * attribute path inside fms-extras' wrapper); vLLM strips the prefix, and
 * re-saved checkpoints may lack it. Both spellings are accepted. */
static const safetensors_tensor *find_tensor(const specd_hf_weights *w, const char *short_name) {
    char full[128];
    snprintf(full, sizeof full, "speculator.%s", short_name);
    const safetensors_tensor *t = specd_hf_weights_find(w, full);
    return t ? t : specd_hf_weights_find(w, short_name);
}

/* ---- the model ---------------------------------------------------------------- */

struct specd_mlp_speculator {
    specd_mlp_spec_config cfg;
    specd_backend *be;
    specd_hf_weights files;
    /* Per stage. With tie_weights several stages point at one tensor; the
     * tables below are indexed by stage either way. */
    specd_tensor t_emb[SPECD_MLP_SPEC_MAX_PREDICT], t_proj[SPECD_MLP_SPEC_MAX_PREDICT],
        t_head[SPECD_MLP_SPEC_MAX_PREDICT];
    specd_bweight emb[SPECD_MLP_SPEC_MAX_PREDICT], proj[SPECD_MLP_SPEC_MAX_PREDICT],
        head[SPECD_MLP_SPEC_MAX_PREDICT];
    float *ln_w[SPECD_MLP_SPEC_MAX_PREDICT], *ln_b[SPECD_MLP_SPEC_MAX_PREDICT]; /* fp32 */
    /* the same vectors as backend weights (aligned fp32 copies: safetensors
     * data is only byte-aligned) */
    specd_tensor t_lnw[SPECD_MLP_SPEC_MAX_PREDICT], t_lnb[SPECD_MLP_SPEC_MAX_PREDICT];
    specd_bweight lnw[SPECD_MLP_SPEC_MAX_PREDICT], lnb[SPECD_MLP_SPEC_MAX_PREDICT];
    int ln_owned[SPECD_MLP_SPEC_MAX_PREDICT]; /* 1 where the stage owns its ln arrays */
    /* 1 where the stage's emb / proj / head are its own backend weights, 0
     * where they are an earlier stage's (tie_weights; ln_owned says the same
     * of the norm's vectors). A tied matrix is prepared (repacked, or
     * uploaded to a GPU) once, so every stage reads the same bytes. On the
     * CPU that makes a deeper draft level cheap: the shared head (8192 x
     * 512, 2.6 MB as Q4_1) is still in the cache from the level before,
     * where a copy per stage came from DRAM each time (bench_draft). */
    int emb_owned[SPECD_MLP_SPEC_MAX_PREDICT], proj_owned[SPECD_MLP_SPEC_MAX_PREDICT],
        head_owned[SPECD_MLP_SPEC_MAX_PREDICT];
    float emb_scale; /* emb_weight / state_weight */
    /* Reduced vocabulary (cfg.vocab_mapped), else NULL: draft id -> target id
     * (-1 = other) and target id -> draft id. */
    int32_t *draft_to_target, *target_to_draft;
    /* scratch, grown on demand: the scaled stage-0 input, the embeddings,
     * and with a vocab map the draft ids and the draft-width logits */
    float *x_scaled, *z, *draft_logits;
    int32_t *draft_tokens;
    size_t rows_cap;
    /* GPU backends only: device copies of a stage's inputs and outputs,
     * grown on demand to dev_rows rows */
    int on_device;
    /* quant (specd_mlp_quant; AS_STORED on a GPU): the quantized copies of
     * the matrices (3 per stage at most, shared where the stages share a
     * tensor), keyed by their source tensor, which has one role */
    specd_mlp_quant quant;
    const safetensors_tensor *q_src[3 * SPECD_MLP_SPEC_MAX_PREDICT];
    void *q_data[3 * SPECD_MLP_SPEC_MAX_PREDICT];
    int n_q;
    float *d_in, *d_out, *d_logits, *d_xs, *d_z;
    int32_t *d_ids;
    size_t dev_rows;
};

static int check_shape(const safetensors_tensor *t, int n_dims, int64_t d0, int64_t d1,
                       specd_error *err) {
    if (t->type != SPECD_F32 && t->type != SPECD_F16 && t->type != SPECD_BF16) {
        const specd_dtype_info *in = specd_dtype_get(t->type);
        return specd_seterr(err, "tensor '%s' has dtype %s; speculator weights must be F32, "
                                 "F16 or BF16", t->name, in && in->name ? in->name : "?");
    }
    int ok = (int)t->n_dims == n_dims && t->shape[0] == (uint64_t)d0 &&
             (n_dims == 1 || t->shape[1] == (uint64_t)d1);
    if (!ok) {
        char got[96] = "[", want[64];
        for (uint32_t i = 0; i < t->n_dims; i++) {
            size_t n = strlen(got);
            snprintf(got + n, sizeof got - n, "%s%llu", i ? ", " : "",
                     (unsigned long long)t->shape[i]);
        }
        strncat(got, "]", sizeof got - strlen(got) - 1);
        if (n_dims == 1) snprintf(want, sizeof want, "[%lld]", (long long)d0);
        else snprintf(want, sizeof want, "[%lld, %lld]", (long long)d0, (long long)d1);
        return specd_seterr(err, "tensor '%s': shape %s does not match config %s", t->name, got,
                            want);
    }
    return 0;
}

/* Finds the tensor for stage `stage` of a group ("emb", "proj", "head",
 * "ln" + suffix) and checks its shape. Tied groups share one tensor: the
 * stage's own if stored, else the lowest stored index of the group from
 * `tied_from` on (safetensors' writer keeps one name per shared storage, and
 * which one is its choice). */
static const safetensors_tensor *stage_tensor(const specd_mlp_speculator *sp, const char *group,
                                              const char *suffix, int stage, int tied_from,
                                              int n_dims, int64_t d0, int64_t d1,
                                              specd_error *err) {
    char name[96];
    snprintf(name, sizeof name, "%s.%d.%s", group, stage, suffix);
    const safetensors_tensor *t = find_tensor(&sp->files, name);
    for (int i = tied_from; !t && tied_from >= 0 && i < sp->cfg.n_predict; i++) {
        char alt[96];
        snprintf(alt, sizeof alt, "%s.%d.%s", group, i, suffix);
        t = find_tensor(&sp->files, alt);
    }
    if (!t) {
        specd_seterr(err, "tensor 'speculator.%s' is missing", name);
        return NULL;
    }
    return check_shape(t, n_dims, d0, d1, err) ? NULL : t;
}

/* Reads one byte of every page of [p, p + n): the mapped weights become
 * resident now. The embedding and head rows a step reads depend on the
 * tokens, so without this the file would become resident page by page over
 * hours of traffic, and draft-svc's RSS would creep up to the file's size
 * (bench/soak.sh saw it); resident from the start, RSS is flat. */
static void prefault(const void *p, size_t n) {
    const volatile unsigned char *c = p;
    unsigned sum = 0;
    for (size_t i = 0; i < n; i += 4096) sum += c[i];
    (void)sum;
}

/* One Q4_1 block: fp16 scale and minimum, then 32 nibbles, weight j in
 * the low nibble of byte j and weight j + 16 in its high nibble. */
typedef struct q41_block {
    uint16_t d, m;
    uint8_t qs[16];
} q41_block;
_Static_assert(sizeof(q41_block) == 20, "Q4_1 block");

/* Block b of st (32 weights) in x. */
static void block_f32(const safetensors_tensor *st, size_t b, float *x) {
    for (int j = 0; j < 32; j++) x[j] = safetensors_elem_f32(st, b * 32 + (size_t)j);
}

/* Q4_1: minimum m, scale (max - m) / 15, each weight round((x - m) / scale)
 * in 0..15. */
static void quant_q4_1(const float *x, void *dst) {
    q41_block *out = dst;
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    float d = (mx - mn) / 15.0f, id = d > 0 ? 1.0f / d : 0.0f;
    out->d = specd_f32_to_fp16(d);
    out->m = specd_f32_to_fp16(mn);
    for (int j = 0; j < 16; j++) {
        int lo = (int)roundf((x[j] - mn) * id), hi = (int)roundf((x[j + 16] - mn) * id);
        lo = lo < 0 ? 0 : lo > 15 ? 15 : lo;
        hi = hi < 0 ? 0 : hi > 15 ? 15 : hi;
        out->qs[j] = (uint8_t)(lo | hi << 4);
    }
}

/* st (F16/BF16/F32, rows of a multiple of 32) as `type` (Q8_0 or Q4_1),
 * computed once per source tensor (tied stages share it). NULL + err on
 * out of memory. */
static void *quantized(specd_mlp_speculator *sp, const safetensors_tensor *st, specd_dtype type,
                       specd_error *err) {
    for (int i = 0; i < sp->n_q; i++)
        if (sp->q_src[i] == st) return sp->q_data[i];
    if (sp->n_q >= (int)(sizeof sp->q_data / sizeof sp->q_data[0])) {
        specd_seterr(err, "tensor '%s': too many matrices to quantize", st->name);
        return NULL;
    }
    const specd_dtype_info *di = specd_dtype_get(type);
    const size_t nb = st->numel / 32, bb = di->block_bytes;
    uint8_t *out = malloc(bb * (nb ? nb : 1));
    if (!out) {
        specd_seterr(err, "tensor '%s': out of memory for its %s copy", st->name, di->name);
        return NULL;
    }
    for (size_t b = 0; b < nb; b++) {
        float x[32];
        block_f32(st, b, x);
        if (type == SPECD_Q4_1) quant_q4_1(x, out + b * bb);
        else cpu_quantize_row_q8_0(x, out + b * bb, 32);
    }
    sp->q_src[sp->n_q] = st;
    sp->q_data[sp->n_q++] = out;
    return out;
}

/* A 2-D weight as the backend sees it: GGUF order, ne[0] = input width. */
static int make_weight(specd_mlp_speculator *sp, const safetensors_tensor *st, int is_head,
                       specd_tensor *t, specd_bweight *w, specd_error *err) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", st->name);
    t->type = st->type;
    t->n_dims = 2;
    t->ne[0] = st->shape[1];
    t->ne[1] = st->shape[0];
    t->ne[2] = t->ne[3] = 1;
    t->data = st->data;
    t->nbytes = st->nbytes;
    if (sp->quant != SPECD_MLP_AS_STORED && t->ne[0] % 32 == 0) {
        t->type = is_head && sp->quant == SPECD_MLP_Q4_HEAD ? SPECD_Q4_1 : SPECD_Q8_0;
        if (!(t->data = quantized(sp, st, t->type, err))) return -1;
        t->nbytes = st->numel / 32 * specd_dtype_get(t->type)->block_bytes;
        return sp->be->ops->prepare_weight(sp->be, w, t, err);
    }
    prefault(st->data, st->nbytes);
    return sp->be->ops->prepare_weight(sp->be, w, t, err);
}

/* An fp32 vector the loader converted, as a backend weight. */
static int make_vector(specd_mlp_speculator *sp, const char *name, float *v, int n,
                       specd_tensor *t, specd_bweight *w, specd_error *err) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = SPECD_F32;
    t->n_dims = 1;
    t->ne[0] = (uint64_t)n;
    t->ne[1] = t->ne[2] = t->ne[3] = 1;
    t->data = v;
    t->nbytes = sizeof(float) * (uint64_t)n;
    return sp->be->ops->prepare_weight(sp->be, w, t, err);
}

static float *vector_f32(const safetensors_tensor *t, specd_error *err) {
    float *v = malloc(sizeof(float) * t->numel);
    if (!v) {
        specd_seterr(err, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < t->numel; i++) v[i] = safetensors_elem_f32(t, i);
    return v;
}

/* Stage i's matrix of one role (tables t, w, owned indexed by stage): a
 * tied stage (from != i) takes stage `from`'s prepared weight as it is,
 * whose src points at that stage's tensor, alive as long as the speculator;
 * otherwise the stage prepares its own. */
static int bind_matrix(specd_mlp_speculator *sp, const safetensors_tensor *st, int is_head, int i,
                       int from, specd_tensor *t, specd_bweight *w, int *owned,
                       specd_error *err) {
    if (from != i) {
        w[i] = w[from];
        return 0;
    }
    owned[i] = 1; /* released on free even if preparing fails halfway */
    return make_weight(sp, st, is_head, &t[i], &w[i], err);
}

/* Binds every stage's weights, applying the tying rule of the reference:
 * emb, head and ln shared by all stages (index 0), proj shared by stages
 * >= 1 (index 1; proj.0 reads emb_dim, the others inner_dim). */
static int bind_weights(specd_mlp_speculator *sp, specd_error *err) {
    const specd_mlp_spec_config *c = &sp->cfg;
    int tied = c->tie_weights;
    for (int i = 0; i < c->n_predict; i++) {
        /* tied: every stage resolves to the shared tensor, never its own
         * (a stored own copy would contradict tie_weights; the reference
         * would overwrite it with the shared one) */
        int g = tied ? 0 : i, p = tied && i > 0 ? 1 : i;
        int share = tied ? 0 : -1, pshare = tied && i > 0 ? 1 : -1;
        int64_t in = i == 0 ? c->emb_dim : c->inner_dim;
        const safetensors_tensor *emb, *proj, *head, *lw, *lb;
        if (!(emb = stage_tensor(sp, "emb", "weight", g, share, 2, c->vocab_size, c->inner_dim,
                                 err)) ||
            !(proj = stage_tensor(sp, "proj", "weight", p, pshare, 2, c->inner_dim, in, err)) ||
            !(head = stage_tensor(sp, "head", "weight", g, share, 2, c->vocab_size, c->inner_dim,
                                  err)) ||
            !(lw = stage_tensor(sp, "ln", "weight", g, share, 1, c->inner_dim, 0, err)) ||
            !(lb = stage_tensor(sp, "ln", "bias", g, share, 1, c->inner_dim, 0, err)))
            return -1;
        if (bind_matrix(sp, emb, 0, i, g, sp->t_emb, sp->emb, sp->emb_owned, err) ||
            bind_matrix(sp, proj, 0, i, p, sp->t_proj, sp->proj, sp->proj_owned, err) ||
            bind_matrix(sp, head, 1, i, g, sp->t_head, sp->head, sp->head_owned, err))
            return -1;
        if (tied && i > 0) { /* same tensors as stage 0: share its copies */
            sp->ln_w[i] = sp->ln_w[0];
            sp->ln_b[i] = sp->ln_b[0];
            sp->lnw[i] = sp->lnw[0];
            sp->lnb[i] = sp->lnb[0];
            continue;
        }
        sp->ln_owned[i] = 1;
        if (!(sp->ln_w[i] = vector_f32(lw, err)) || !(sp->ln_b[i] = vector_f32(lb, err)) ||
            make_vector(sp, lw->name, sp->ln_w[i], c->inner_dim, &sp->t_lnw[i], &sp->lnw[i], err) ||
            make_vector(sp, lb->name, sp->ln_b[i], c->inner_dim, &sp->t_lnb[i], &sp->lnb[i], err))
            return -1;
    }
    return 0;
}

/* The reduced vocabulary: speculator.vocab_map [vocab_size] I32, present
 * exactly when config.json has target_vocab_size. Every entry is -1 (at most
 * one: the other bucket) or a distinct id below target_vocab_size; a map
 * that leaves some target id out needs the other bucket for it. */
static int bind_vocab_map(specd_mlp_speculator *sp, specd_error *err) {
    const specd_mlp_spec_config *c = &sp->cfg;
    const safetensors_tensor *t = find_tensor(&sp->files, "vocab_map");
    if (!c->vocab_mapped) {
        if (t)
            return specd_seterr(err, "tensor '%s' needs 'target_vocab_size' in " CONFIG, t->name);
        return 0;
    }
    if (!t)
        return specd_seterr(err, CONFIG " sets 'target_vocab_size' but tensor "
                                        "'speculator.vocab_map' is missing");
    if (t->type != SPECD_I32 || t->n_dims != 1 || t->shape[0] != (uint64_t)c->vocab_size)
        return specd_seterr(err, "tensor '%s' must be I32 of shape [%d] (vocab_size)", t->name,
                            c->vocab_size);
    int V = c->vocab_size, T = c->target_vocab_size;
    sp->draft_to_target = malloc(sizeof(int32_t) * (size_t)V);
    sp->target_to_draft = malloc(sizeof(int32_t) * (size_t)T);
    if (!sp->draft_to_target || !sp->target_to_draft) return specd_seterr(err, "out of memory");
    memcpy(sp->draft_to_target, t->data, sizeof(int32_t) * (size_t)V); /* byte-aligned data */
    for (int i = 0; i < T; i++) sp->target_to_draft[i] = -1;
    int other = -1, mapped = 0;
    for (int d = 0; d < V; d++) {
        int32_t id = sp->draft_to_target[d];
        if (id == -1) {
            if (other >= 0)
                return specd_seterr(err, "tensor '%s': entries %d and %d are both -1 (one "
                                         "'other' bucket at most)", t->name, other, d);
            other = d;
        } else if (id < 0 || id >= T) {
            return specd_seterr(err, "tensor '%s'[%d] = %d is not -1 or in 0..%d "
                                     "(target_vocab_size - 1)", t->name, d, id, T - 1);
        } else if (sp->target_to_draft[id] >= 0) {
            return specd_seterr(err, "tensor '%s': target id %d appears at %d and %d", t->name,
                                id, sp->target_to_draft[id], d);
        } else {
            sp->target_to_draft[id] = d;
            mapped++;
        }
    }
    if (mapped < T && other < 0)
        return specd_seterr(err, "tensor '%s' maps %d of %d target ids and has no -1 'other' "
                                 "entry for the rest", t->name, mapped, T);
    for (int i = 0; i < T; i++)
        if (sp->target_to_draft[i] < 0) sp->target_to_draft[i] = other;
    return 0;
}

static int load_config_file(specd_mlp_speculator *sp, const char *dir, specd_error *err) {
    memset(&sp->cfg, 0, sizeof sp->cfg);
    cJSON *root = specd_hf_read_json(dir, CONFIG, MAX_JSON_FILE, err);
    if (!root) return -1;
    int rc = parse_config_object(root, &sp->cfg, err);
    cJSON_Delete(root);
    return rc;
}

specd_mlp_speculator *specd_mlp_speculator_load(const char *dir, int n_threads,
                                                specd_error *err) {
    specd_backend_opts bo = {.name = "cpu", .n_threads = n_threads};
    return specd_mlp_speculator_load_on(dir, &bo, err);
}

specd_mlp_speculator *specd_mlp_speculator_load_on(const char *dir,
                                                   const specd_backend_opts *backend,
                                                   specd_error *err) {
    return specd_mlp_speculator_load_ex(dir, backend, SPECD_MLP_AS_STORED, err);
}

specd_mlp_speculator *specd_mlp_speculator_load_ex(const char *dir,
                                                   const specd_backend_opts *backend,
                                                   specd_mlp_quant quant, specd_error *err) {
    specd_mlp_speculator *sp = calloc(1, sizeof *sp);
    if (!sp) {
        specd_seterr(err, "mlp speculator: out of memory");
        return NULL;
    }
    /* only the CPU backend has the integer kernels; a GPU keeps fp16 */
    if (quant < SPECD_MLP_AS_STORED || quant > SPECD_MLP_Q4_HEAD) {
        specd_seterr(err, "mlp speculator %s: unknown quantization %d", dir, (int)quant);
        free(sp);
        return NULL;
    }
    sp->quant = !backend || !backend->name || !strcmp(backend->name, "cpu") ? quant
                                                                          : SPECD_MLP_AS_STORED;
    if (load_config_file(sp, dir, err) || specd_hf_weights_open(&sp->files, dir, open_owned, NULL, err) ||
        !(sp->be = specd_backend_create(backend, err)) || bind_weights(sp, err) ||
        bind_vocab_map(sp, err)) {
        specd_preferr(err, "mlp speculator %s", dir);
        specd_mlp_speculator_free(sp);
        return NULL;
    }
    /* The reference adds state_weight * proj(s) and emb_weight * emb(tok),
     * but divides both by state_weight (the LayerNorm after it makes the
     * overall scale irrelevant): u = proj(s) + (emb_weight/state_weight) * z.
     * Computed in double as Python does, rounded once to the float alpha
     * torch.add receives. */
    double n = sp->cfg.n_predict, inner = sp->cfg.inner_dim;
    double state_weight = pow(0.5, 0.5 / n);
    double emb_weight = sqrt((1.0 - state_weight * state_weight) * (inner / 2.0));
    sp->emb_scale = (float)(emb_weight / state_weight);
    sp->on_device = strcmp(sp->be->ops->name, "cpu") != 0;
    return sp;
}

void specd_mlp_speculator_free(specd_mlp_speculator *sp) {
    if (!sp) return;
    /* the backend's weights may point into the Q8_0 copies: freed last */
    for (int i = 0; i < SPECD_MLP_SPEC_MAX_PREDICT; i++) {
        if (sp->be) {
            if (sp->emb_owned[i]) sp->be->ops->release_weight(sp->be, &sp->emb[i]);
            if (sp->proj_owned[i]) sp->be->ops->release_weight(sp->be, &sp->proj[i]);
            if (sp->head_owned[i]) sp->be->ops->release_weight(sp->be, &sp->head[i]);
            if (sp->ln_owned[i] && sp->lnw[i].src) sp->be->ops->release_weight(sp->be, &sp->lnw[i]);
            if (sp->ln_owned[i] && sp->lnb[i].src) sp->be->ops->release_weight(sp->be, &sp->lnb[i]);
        }
        if (sp->ln_owned[i]) {
            free(sp->ln_w[i]);
            free(sp->ln_b[i]);
        }
    }
    if (sp->be) {
        void *dev[] = {sp->d_in, sp->d_out, sp->d_logits, sp->d_xs, sp->d_z, sp->d_ids};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            if (dev[i]) sp->be->ops->free(sp->be, dev[i]);
        sp->be->ops->destroy(sp->be);
    }
    specd_hf_weights_close(&sp->files);
    free(sp->draft_to_target);
    free(sp->target_to_draft);
    free(sp->x_scaled);
    free(sp->z);
    free(sp->draft_logits);
    free(sp->draft_tokens);
    for (int i = 0; i < sp->n_q; i++) free(sp->q_data[i]);
    free(sp);
}

const specd_mlp_spec_config *specd_mlp_speculator_config(const specd_mlp_speculator *sp) {
    return &sp->cfg;
}

size_t specd_mlp_speculator_weight_bytes(const specd_mlp_speculator *sp) {
    size_t n = 0;
    for (int i = 0; i < sp->cfg.n_predict; i++) {
        if (sp->emb_owned[i]) n += sp->emb[i].bytes;
        if (sp->proj_owned[i]) n += sp->proj[i].bytes;
        if (sp->head_owned[i]) n += sp->head[i].bytes;
        if (sp->ln_owned[i]) n += sp->lnw[i].bytes + sp->lnb[i].bytes;
    }
    return n;
}

int specd_mlp_speculator_state_in_dim(const specd_mlp_speculator *sp, int stage) {
    return stage == 0 ? sp->cfg.emb_dim : sp->cfg.inner_dim;
}

/* ---- forward ------------------------------------------------------------------ */

/* x * rsqrt(mean(x^2) + eps), the reference's parameter-free normalization.
 * The mean is accumulated in double: the reference sums in fp32 in a
 * pairwise order we cannot reproduce, and a double sum stays well inside its
 * rounding. */
static int grow_scratch(specd_mlp_speculator *sp, size_t rows, specd_error *err) {
    if (rows <= sp->rows_cap) return 0;
    float *xs = realloc(sp->x_scaled, sizeof(float) * rows * sp->cfg.emb_dim);
    if (xs) sp->x_scaled = xs;
    float *z = realloc(sp->z, sizeof(float) * rows * sp->cfg.inner_dim);
    if (z) sp->z = z;
    int ok = xs && z;
    if (ok && sp->draft_to_target) {
        float *dl = realloc(sp->draft_logits, sizeof(float) * rows * sp->cfg.vocab_size);
        if (dl) sp->draft_logits = dl;
        int32_t *dt = realloc(sp->draft_tokens, sizeof(int32_t) * rows);
        if (dt) sp->draft_tokens = dt;
        ok = dl && dt;
    }
    if (!ok) return specd_seterr(err, "mlp speculator: out of memory for %zu rows", rows);
    sp->rows_cap = rows;
    return 0;
}

/* Device buffers for a GPU backend: the widest state (emb_dim or inner_dim)
 * and the head's width, for `rows` rows. */
static int grow_device(specd_mlp_speculator *sp, size_t rows, specd_error *err) {
    if (rows <= sp->dev_rows) return 0;
    specd_backend *be = sp->be;
    const specd_mlp_spec_config *c = &sp->cfg;
    size_t width = (size_t)(c->emb_dim > c->inner_dim ? c->emb_dim : c->inner_dim);
    float **bufs[] = {&sp->d_in, &sp->d_out, &sp->d_logits, &sp->d_xs, &sp->d_z};
    size_t widths[] = {width, width, (size_t)c->vocab_size, width, width};
    for (int i = 0; i < 5; i++) {
        if (*bufs[i]) be->ops->free(be, *bufs[i]);
        *bufs[i] = be->ops->alloc(be, sizeof(float) * rows * widths[i]);
    }
    if (sp->d_ids) be->ops->free(be, sp->d_ids);
    sp->d_ids = be->ops->alloc(be, sizeof(int32_t) * rows);
    int ok = sp->d_in && sp->d_out && sp->d_logits && sp->d_xs && sp->d_z && sp->d_ids;
    sp->dev_rows = ok ? rows : 0;
    if (!ok) return specd_seterr(err, "mlp speculator: out of device memory for %zu rows", rows);
    return 0;
}

static int run_stage(specd_mlp_speculator *sp, int stage, int n_rows, const float *state_in,
                     const int32_t *tokens, float *state_out, float *logits, int scatter,
                     specd_error *err);

int specd_mlp_speculator_stage(specd_mlp_speculator *sp, int stage, int n_rows,
                               const float *state_in, const int32_t *tokens, float *state_out,
                               float *logits, specd_error *err) {
    return run_stage(sp, stage, n_rows, state_in, tokens, state_out, logits, 1, err);
}

int specd_mlp_speculator_stage_draft_ids(specd_mlp_speculator *sp, int stage, int n_rows,
                                         const float *state_in, const int32_t *tokens,
                                         float *state_out, float *logits,
                                         const int32_t **map, specd_error *err) {
    *map = sp->draft_to_target;
    return run_stage(sp, stage, n_rows, state_in, tokens, state_out, logits, 0, err);
}

static int run_stage(specd_mlp_speculator *sp, int stage, int n_rows, const float *state_in,
                     const int32_t *tokens, float *state_out, float *logits, int scatter,
                     specd_error *err) {
    const specd_mlp_spec_config *c = &sp->cfg;
    specd_backend *be = sp->be;
    if (stage < 0 || stage >= c->n_predict)
        return specd_seterr(err, "mlp speculator: stage %d out of range 0..%d", stage,
                            c->n_predict - 1);
    if (n_rows < 0 || n_rows > SPECD_MLP_SPEC_MAX_ROWS)
        return specd_seterr(err, "mlp speculator: %d rows, at most %d", n_rows,
                            SPECD_MLP_SPEC_MAX_ROWS);
    for (int r = 0; r < n_rows; r++)
        if (tokens[r] < 0 || tokens[r] >= c->target_vocab_size)
            return specd_seterr(err, "mlp speculator: tokens[%d] = %d is not in 0..%d", r,
                                tokens[r], c->target_vocab_size - 1);
    if (n_rows == 0) return 0;
    if (grow_scratch(sp, (size_t)n_rows, err)) return -1;
    /* a reduced vocabulary embeds draft ids; the head writes draft columns */
    const int32_t *ids = tokens;
    float *head_out = logits;
    if (sp->draft_to_target) {
        for (int r = 0; r < n_rows; r++) sp->draft_tokens[r] = sp->target_to_draft[tokens[r]];
        ids = sp->draft_tokens;
        head_out = logits ? (scatter ? sp->draft_logits : logits) : NULL;
    }
    int in_dim = specd_mlp_speculator_state_in_dim(sp, stage), dim = c->inner_dim;

    /* On a GPU the stage runs on device copies; on the CPU the host arrays
     * are the backend's buffers. */
    const float *in = state_in;
    const int32_t *dids = ids;
    float *out = state_out, *lg = head_out, *xs = sp->x_scaled, *z = sp->z;
    if (sp->on_device) {
        if (grow_device(sp, (size_t)n_rows, err)) return -1;
        be->ops->from_host(be, sp->d_in, state_in, sizeof(float) * (size_t)n_rows * in_dim);
        be->ops->from_host(be, sp->d_ids, ids, sizeof(int32_t) * (size_t)n_rows);
        in = sp->d_in, dids = sp->d_ids, out = sp->d_out, xs = sp->d_xs, z = sp->d_z;
        lg = head_out ? sp->d_logits : NULL;
    }

    /* scale_input: the target's hidden state has whatever scale its last
     * norm gives it; the speculator was trained on rmsnorm(s) / sqrt(2). */
    const float *s = in;
    if (stage == 0 && c->scale_input) {
        be->ops->rmsnorm(be, xs, in, NULL, n_rows, in_dim, NORM_EPS);
        be->ops->scale(be, xs, (float)M_SQRT1_2, (size_t)n_rows * in_dim);
        s = xs;
    }

    /* u = proj(s) + (emb_weight / state_weight) * emb(token) */
    be->ops->matmul(be, out, &sp->proj[stage], s, n_rows);
    be->ops->embed_ids(be, z, &sp->emb[stage], dids, n_rows);
    be->ops->axpy(be, out, sp->emb_scale, z, (size_t)n_rows * dim);

    /* s' = gelu(ln(u)): normalize, scale by weight, shift by bias, GELU
     * (exact erf form, torch.nn.GELU's default) */
    be->ops->norm_gelu(be, out, out, &sp->lnw[stage], &sp->lnb[stage], n_rows, dim, NORM_EPS);

    /* logits = head(s') */
    if (lg) be->ops->matmul(be, lg, &sp->head[stage], out, n_rows);
    if (sp->on_device) {
        be->ops->to_host(be, state_out, out, sizeof(float) * (size_t)n_rows * dim);
        if (lg)
            be->ops->to_host(be, head_out, lg,
                             sizeof(float) * (size_t)n_rows * (size_t)sp->head[stage].rows);
    }
    if (be->ops->finish(be, err)) return specd_preferr(err, "mlp speculator stage %d", stage);
    if (!head_out) return 0;
    if (head_out != logits) { /* scatter draft columns to target ids; the rest cannot be drawn */
        int V = c->vocab_size, T = c->target_vocab_size;
        for (int r = 0; r < n_rows; r++) {
            float *row_out = logits + (size_t)r * T;
            const float *row_in = head_out + (size_t)r * V;
            for (int t = 0; t < T; t++) row_out[t] = -INFINITY;
            for (int d = 0; d < V; d++)
                if (sp->draft_to_target[d] >= 0) row_out[sp->draft_to_target[d]] = row_in[d];
        }
    }
    return 0;
}
