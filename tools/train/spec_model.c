/* spec_model.c - the trainable MLP speculator (see spec_model.h).
 *
 * Layout, top to bottom: parameter layout and initialization, the vocabulary
 * map, the teacher-forced forward + backward (spec_model_step), and the two
 * files (the MLPSpeculator export and the training state).
 *
 * The forward mirrors draft-svc/mlp_speculator.c operation by operation
 * (same emb_scale constant, same norm and GELU code paths in nn.c), so a
 * model exported in F32 gives the runtime's logits to within the matmul
 * summation order. */
#include "tools/train/spec_model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util/dtype.h"
#include "common/util/rng.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_write.h"
#include "common/util/small_file.h"
#include "tools/train/nn.h"

#define NORM_EPS 1e-6f /* as draft-svc/mlp_speculator.c (the reference's default) */
#define STATE_FORMAT "specd-spec-train-state/1"
#define STATE_META_KEY "trainer" /* the caller's JSON blob */

/* ---- parameters ------------------------------------------------------------------- */

/* emb_weight / state_weight, computed exactly as the runtime's loader does
 * (double, rounded once). */
static float emb_scale(const specd_mlp_spec_config *c) {
    double n = c->n_predict, inner = c->inner_dim;
    double state_weight = pow(0.5, 0.5 / n);
    double emb_weight = sqrt((1.0 - state_weight * state_weight) * (inner / 2.0));
    return (float)(emb_weight / state_weight);
}

static float *add_tensor(spec_model *m, size_t *off, const char *group, int idx,
                         const char *suffix, int rows, int cols, int decay) {
    struct spec_tensor *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "speculator.%s.%d.%s", group, idx, suffix);
    t->rows = rows;
    t->cols = cols;
    t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    t->decay = decay;
    t->data = m->params ? m->params + *off : NULL;
    *off += t->numel;
    return t->data;
}

/* Lays the tensors out in the flat buffer (params NULL: just counts) and
 * points every stage at its (possibly shared) tensors. Tied: one emb, head
 * and ln for all stages; proj.0 reads emb_dim, proj.1 serves stages >= 1. */
static size_t layout(spec_model *m) {
    const specd_mlp_spec_config *c = &m->cfg;
    int V = c->vocab_size, E = c->emb_dim, D = c->inner_dim, P = c->n_predict;
    size_t off = 0;
    m->n_tensors = 0;
    for (int i = 0; i < P; i++) {
        int own = !c->tie_weights || i == 0;
        int own_proj = !c->tie_weights || i <= 1;
        m->emb[i] = own ? add_tensor(m, &off, "emb", i, "weight", V, D, 1) : m->emb[0];
        m->proj[i] = own_proj ? add_tensor(m, &off, "proj", i, "weight", D, i ? D : E, 1)
                              : m->proj[1];
        m->head[i] = own ? add_tensor(m, &off, "head", i, "weight", V, D, 1) : m->head[0];
        m->ln_w[i] = own ? add_tensor(m, &off, "ln", i, "weight", D, 0, 0) : m->ln_w[0];
        m->ln_b[i] = own ? add_tensor(m, &off, "ln", i, "bias", D, 0, 0) : m->ln_b[0];
    }
    return off;
}

/* Two standard normals per Philox block (Box-Muller), addressed by
 * (seed, tensor, pair index) so each tensor's values do not depend on the
 * others' sizes. */
static void fill_normal(float *x, size_t n, float std, uint64_t seed, uint64_t stream) {
    for (size_t i = 0; i < n; i += 2) {
        uint32_t w[4];
        specd_rng_u32x4(seed, stream, i / 2, w);
        double u1 = ((double)w[0] + 1.0) / 4294967296.0; /* (0, 1]: log is finite */
        double u2 = (double)w[1] / 4294967296.0;
        double r = sqrt(-2.0 * log(u1)), a = 2.0 * M_PI * u2;
        x[i] = (float)(std * r * cos(a));
        if (i + 1 < n) x[i + 1] = (float)(std * r * sin(a));
    }
}

static int check_cfg(const specd_mlp_spec_config *c, int target_vocab, specd_error *err) {
    if (c->vocab_size < 1 || c->vocab_size > SPECD_MLP_SPEC_MAX_VOCAB || c->emb_dim < 1 ||
        c->emb_dim > SPECD_MLP_SPEC_MAX_DIM || c->inner_dim < 0 ||
        c->inner_dim > SPECD_MLP_SPEC_MAX_DIM || c->n_predict < 1 ||
        c->n_predict > SPECD_MLP_SPEC_MAX_PREDICT)
        return specd_seterr(err, "spec model: vocab %d, emb %d, inner %d, n_predict %d out of "
                                 "range", c->vocab_size, c->emb_dim, c->inner_dim, c->n_predict);
    if (c->tie_weights && c->n_predict < 2)
        return specd_seterr(err, "spec model: tie_weights needs n_predict >= 2");
    if (target_vocab < 1 || target_vocab > SPECD_MLP_SPEC_MAX_VOCAB)
        return specd_seterr(err, "spec model: target vocab %d out of range", target_vocab);
    for (int i = 0; i < c->n_predict; i++)
        if (c->top_k[i] < 1 || c->top_k[i] > c->vocab_size)
            return specd_seterr(err, "spec model: top_k[%d] = %d not in 1..%d", i, c->top_k[i],
                                c->vocab_size);
    if (c->n_candidates < 1 || c->n_candidates > SPECD_MLP_SPEC_MAX_CANDIDATES)
        return specd_seterr(err, "spec model: n_candidates %d out of range", c->n_candidates);
    return 0;
}

/* The same rules as the runtime's loader (draft-svc/mlp_speculator.c). */
static int set_vocab_map(spec_model *m, const int32_t *map, specd_error *err) {
    int V = m->cfg.vocab_size, T = m->target_vocab;
    m->vocab_map = malloc(sizeof(int32_t) * (size_t)V);
    m->target_to_draft = malloc(sizeof(int32_t) * (size_t)T);
    if (!m->vocab_map || !m->target_to_draft) return specd_seterr(err, "out of memory");
    memcpy(m->vocab_map, map, sizeof(int32_t) * (size_t)V);
    for (int t = 0; t < T; t++) m->target_to_draft[t] = -1;
    int other = -1, mapped = 0;
    for (int d = 0; d < V; d++) {
        int32_t id = map[d];
        if (id == -1 && other < 0) {
            other = d;
        } else if (id < 0 || id >= T || m->target_to_draft[id] >= 0) {
            return specd_seterr(err, "spec model: vocab_map[%d] = %d is a second -1, out of "
                                     "0..%d, or a repeat", d, id, T - 1);
        } else {
            m->target_to_draft[id] = d;
            mapped++;
        }
    }
    if (mapped < T && other < 0)
        return specd_seterr(err, "spec model: vocab_map covers %d of %d target ids and has no "
                                 "-1 'other' entry", mapped, T);
    for (int t = 0; t < T; t++)
        if (m->target_to_draft[t] < 0) m->target_to_draft[t] = other;
    return 0;
}

int spec_model_init(spec_model *m, const specd_mlp_spec_config *cfg, int target_vocab,
                    const int32_t *vocab_map, uint64_t seed, specd_error *err) {
    memset(m, 0, sizeof *m);
    if (check_cfg(cfg, target_vocab, err)) return -1;
    m->cfg = *cfg;
    if (!m->cfg.inner_dim) m->cfg.inner_dim = m->cfg.emb_dim; /* config.json's 0 = emb_dim */
    m->target_vocab = target_vocab;
    m->cfg.target_vocab_size = target_vocab;
    m->cfg.vocab_mapped = vocab_map != NULL;
    if (!vocab_map && cfg->vocab_size != target_vocab)
        return specd_seterr(err, "spec model: vocab %d without a vocab_map must equal the "
                                 "target's %d", cfg->vocab_size, target_vocab);
    if (vocab_map && set_vocab_map(m, vocab_map, err)) {
        spec_model_free(m);
        return -1;
    }
    m->n_params = layout(m);
    m->params = malloc(sizeof(float) * m->n_params);
    if (!m->params) {
        spec_model_free(m);
        return specd_seterr(err, "spec model: out of memory for %zu parameters", m->n_params);
    }
    layout(m);
    for (int i = 0; i < m->n_tensors; i++) {
        struct spec_tensor *t = &m->tensors[i];
        if (!t->cols) { /* ln: weight 1, bias 0 */
            float v = strstr(t->name, ".weight") ? 1.0f : 0.0f;
            for (size_t j = 0; j < t->numel; j++) t->data[j] = v;
            continue;
        }
        /* emb: 1/sqrt(inner) (its rows are the inner width); proj/head: 1/sqrt(fan_in) */
        fill_normal(t->data, t->numel, 1.0f / sqrtf((float)t->cols), seed, (uint64_t)i);
    }
    return 0;
}

void spec_model_free(spec_model *m) {
    free(m->params);
    free(m->vocab_map);
    free(m->target_to_draft);
    memset(m, 0, sizeof *m);
}

int32_t spec_model_draft_id(const spec_model *m, int32_t target_token) {
    if (target_token < 0 || target_token >= m->target_vocab) return -1;
    return m->target_to_draft ? m->target_to_draft[target_token] : target_token;
}

/* ---- forward + backward ------------------------------------------------------------ */

struct spec_work {
    int max_rows;
    float *s0;                                /* [rows][emb] scaled stage-0 input */
    float *s[SPECD_MLP_SPEC_MAX_PREDICT + 1]; /* s[i+1] [rows][inner]: stage i's output */
    float *u[SPECD_MLP_SPEC_MAX_PREDICT];     /* [rows][inner] before the norm */
    float *v[SPECD_MLP_SPEC_MAX_PREDICT];     /* [rows][inner] after it, before GELU */
    float *rstd[SPECD_MLP_SPEC_MAX_PREDICT];  /* [rows] */
    float *ds[SPECD_MLP_SPEC_MAX_PREDICT];    /* [rows][inner] loss gradient w.r.t. s[i+1] */
    int32_t *tok[SPECD_MLP_SPEC_MAX_PREDICT + 1]; /* [rows] column i of the batch's tokens */
    float *logits;                            /* [rows][vocab], then its gradient */
    float *g, *du;                            /* [rows][inner] backward scratch */
};

spec_work *spec_work_create(const spec_model *m, int max_rows) {
    const specd_mlp_spec_config *c = &m->cfg;
    spec_work *w = calloc(1, sizeof *w);
    if (!w || max_rows < 1) {
        free(w);
        return NULL;
    }
    w->max_rows = max_rows;
    size_t R = (size_t)max_rows, D = (size_t)c->inner_dim;
    int ok = (w->s0 = malloc(sizeof(float) * R * c->emb_dim)) &&
             (w->logits = malloc(sizeof(float) * R * c->vocab_size)) &&
             (w->g = malloc(sizeof(float) * R * D)) && (w->du = malloc(sizeof(float) * R * D));
    for (int i = 0; ok && i <= c->n_predict; i++) {
        ok = (w->tok[i] = malloc(sizeof(int32_t) * R)) != NULL;
        if (ok && i < c->n_predict)
            ok = (w->s[i + 1] = malloc(sizeof(float) * R * D)) &&
                 (w->u[i] = malloc(sizeof(float) * R * D)) &&
                 (w->v[i] = malloc(sizeof(float) * R * D)) &&
                 (w->rstd[i] = malloc(sizeof(float) * R)) &&
                 (w->ds[i] = malloc(sizeof(float) * R * D));
    }
    if (!ok) {
        spec_work_free(w);
        return NULL;
    }
    return w;
}

void spec_work_free(spec_work *w) {
    if (!w) return;
    for (int i = 0; i <= SPECD_MLP_SPEC_MAX_PREDICT; i++) {
        free(w->s[i]);
        free(w->tok[i]);
        if (i < SPECD_MLP_SPEC_MAX_PREDICT) {
            free(w->u[i]);
            free(w->v[i]);
            free(w->rstd[i]);
            free(w->ds[i]);
        }
    }
    free(w->s0);
    free(w->logits);
    free(w->g);
    free(w->du);
    free(w);
}

/* The gradient slot of a parameter pointer: same offset in grads. */
static float *grad_of(const spec_model *m, float *grads, const float *p) {
    return grads + (p - m->params);
}

/* x * rsqrt(mean(x^2) + eps) / sqrt(2), the runtime's scale_input step
 * (the same double sum and float rounding). */
static void scale_input(const float *x, int n, int d, float *y) {
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * d;
        float *yr = y + (size_t)r * d;
        double ss = 0;
        for (int j = 0; j < d; j++) ss += (double)xr[j] * xr[j];
        float k = (float)(1.0 / sqrt(ss / d + NORM_EPS));
        for (int j = 0; j < d; j++) yr[j] = xr[j] * k / (float)M_SQRT2;
    }
}

/* Copies the batch's token columns and the (scaled) stage-0 input into w;
 * returns the stage-0 input. */
static const float *load_batch(const spec_model *m, spec_work *w, const spec_batch *b) {
    const specd_mlp_spec_config *c = &m->cfg;
    int P = c->n_predict;
    for (int i = 0; i <= P; i++)
        for (int r = 0; r < b->n; r++) w->tok[i][r] = b->tokens[(size_t)r * (P + 1) + i];
    if (!c->scale_input) return b->hidden;
    scale_input(b->hidden, b->n, c->emb_dim, w->s0);
    return w->s0;
}

/* Stage i up to its new state s[i+1] (u[i], v[i], rstd[i] kept for the
 * backward). u = proj(s) + k * emb(tok): the runtime's order of operations. */
static void stage_fwd(const spec_model *m, spec_work *w, int i, int n, const float *s0) {
    const specd_mlp_spec_config *c = &m->cfg;
    int D = c->inner_dim;
    size_t nD = (size_t)n * D;
    float k_emb = emb_scale(c);
    nn_linear_fwd(i ? w->s[i] : s0, n, i ? D : c->emb_dim, m->proj[i], NULL, D, w->u[i]);
    nn_embed_fwd(m->emb[i], D, w->tok[i], n, w->g);
    for (size_t j = 0; j < nD; j++) w->u[i][j] += k_emb * w->g[j];
    nn_rmsln_fwd(w->u[i], n, D, m->ln_w[i], m->ln_b[i], NORM_EPS, w->v[i], w->rstd[i]);
    nn_gelu_fwd(w->v[i], nD, w->s[i + 1]);
}

int spec_model_logits(const spec_model *m, spec_work *w, const spec_batch *b, int stage,
                      float *logits) {
    const specd_mlp_spec_config *c = &m->cfg;
    if (b->n < 1 || b->n > w->max_rows || stage < 0 || stage >= c->n_predict) return -1;
    const float *s0 = load_batch(m, w, b);
    for (int i = 0; i <= stage; i++) stage_fwd(m, w, i, b->n, s0);
    nn_linear_fwd(w->s[stage + 1], b->n, c->inner_dim, m->head[stage], NULL, c->vocab_size,
                  logits);
    return 0;
}

/* Gradients flow back stage by stage. Each stage's head gradient is taken
 * in the forward loop, right after its cross-entropy, so one logits buffer
 * serves every stage; the backward loop then only carries inner-width
 * gradients: ds[i] (from head i, plus proj i+1's input gradient). */
double spec_model_step(const spec_model *m, spec_work *w, const spec_batch *b, float *grads,
                       float *stage_loss, float *stage_acc) {
    const specd_mlp_spec_config *c = &m->cfg;
    int n = b->n, P = c->n_predict, E = c->emb_dim, D = c->inner_dim, V = c->vocab_size;
    if (n < 1 || n > w->max_rows) return NAN;
    size_t nD = (size_t)n * D;
    float k_emb = emb_scale(c), inv_n = 1.0f / (float)n;
    const float *s0 = load_batch(m, w, b);

    double loss = 0;
    for (int i = 0; i < P; i++) {
        stage_fwd(m, w, i, n, s0);
        nn_linear_fwd(w->s[i + 1], n, D, m->head[i], NULL, V, w->logits);
        int right = 0;
        double li = nn_xent(w->logits, n, V, w->tok[i + 1], inv_n, grads ? w->logits : NULL,
                            NULL, &right) / n;
        loss += li;
        if (stage_loss) stage_loss[i] = (float)li;
        if (stage_acc) stage_acc[i] = (float)right / (float)n;
        if (grads)
            nn_linear_bwd(w->s[i + 1], n, D, m->head[i], V, w->logits, w->ds[i],
                          grad_of(m, grads, m->head[i]), NULL);
    }
    if (!grads) return loss;

    for (int i = P - 1; i >= 0; i--) {
        float *g = w->ds[i]; /* complete: stage i+1 has added its part */
        nn_gelu_bwd(w->v[i], nD, g, g);
        nn_rmsln_bwd(w->u[i], n, D, m->ln_w[i], w->rstd[i], g, w->du,
                     grad_of(m, grads, m->ln_w[i]), grad_of(m, grads, m->ln_b[i]));
        for (size_t j = 0; j < nD; j++) w->g[j] = k_emb * w->du[j];
        nn_embed_bwd(w->tok[i], n, D, w->g, grad_of(m, grads, m->emb[i]));
        const float *in = i ? w->s[i] : s0;
        nn_linear_bwd(in, n, i ? D : E, m->proj[i], D, w->du, i ? w->g : NULL,
                      grad_of(m, grads, m->proj[i]), NULL);
        if (i) /* the state this stage read is also what head i-1 scored */
            for (size_t j = 0; j < nD; j++) w->ds[i - 1][j] += w->g[j];
    }
    return loss;
}

/* ---- files ------------------------------------------------------------------------- */

static char *config_json(const spec_model *m, const char *dtype) {
    const specd_mlp_spec_config *c = &m->cfg;
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    const char *arch = "MLPSpeculatorPreTrainedModel";
    int topk[SPECD_MLP_SPEC_MAX_PREDICT];
    memcpy(topk, c->top_k, sizeof topk);
    const char *torch_dtype = !strcmp(dtype, "F16")    ? "float16"
                              : !strcmp(dtype, "BF16") ? "bfloat16"
                                                       : "float32";
    int ok = cJSON_AddItemToObject(root, "architectures", cJSON_CreateStringArray(&arch, 1)) &&
             cJSON_AddStringToObject(root, "model_type", "mlp_speculator") &&
             cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size) &&
             cJSON_AddNumberToObject(root, "emb_dim", c->emb_dim) &&
             cJSON_AddNumberToObject(root, "inner_dim", c->inner_dim) &&
             cJSON_AddNumberToObject(root, "n_predict", c->n_predict) &&
             cJSON_AddItemToObject(root, "top_k_tokens_per_head",
                                   cJSON_CreateIntArray(topk, c->n_predict)) &&
             cJSON_AddNumberToObject(root, "n_candidates", c->n_candidates) &&
             cJSON_AddBoolToObject(root, "tie_weights", c->tie_weights) &&
             cJSON_AddBoolToObject(root, "scale_input", c->scale_input) &&
             cJSON_AddStringToObject(root, "torch_dtype", torch_dtype);
    if (ok && m->vocab_map)
        ok = cJSON_AddNumberToObject(root, "target_vocab_size", m->target_vocab) != NULL;
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    return text;
}

static safetensors_out tensor_out(const struct spec_tensor *t, const char *name,
                                  specd_dtype type) {
    safetensors_out o = {.name = name, .type = type, .n_dims = t->cols ? 2 : 1,
                         .data = t->data};
    o.shape[0] = (uint64_t)t->rows;
    o.shape[1] = (uint64_t)t->cols;
    return o;
}

static safetensors_out map_out(const spec_model *m, const char *name) {
    safetensors_out o = {.name = name, .type = SPECD_I32, .n_dims = 1, .data = m->vocab_map};
    o.shape[0] = (uint64_t)m->cfg.vocab_size;
    return o;
}

int spec_model_export(const spec_model *m, const char *dir, const char *dtype, specd_error *err) {
    specd_dtype type;
    if (!strcmp(dtype, "F32")) type = SPECD_F32;
    else if (!strcmp(dtype, "F16")) type = SPECD_F16;
    else if (!strcmp(dtype, "BF16")) type = SPECD_BF16;
    else return specd_seterr(err, "export: dtype '%s' is not F32, F16 or BF16", dtype);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return specd_seterr(err, "export: cannot create %s: %s", dir, strerror(errno));

    safetensors_out outs[5 * SPECD_MLP_SPEC_MAX_PREDICT + 1];
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++)
        outs[n++] = tensor_out(&m->tensors[i], m->tensors[i].name, type);
    if (m->vocab_map) outs[n++] = map_out(m, "speculator.vocab_map");
    char path[2048];
    /* weights first, config last: a directory with a config is complete */
    if (specd_path_join(path, sizeof path, dir, "model.safetensors", err) ||
        safetensors_write(path, outs, n, NULL, NULL, 0, err))
        return specd_preferr(err, "export");
    char *cfg = config_json(m, dtype);
    if (!cfg) return specd_seterr(err, "export: out of memory");
    int rc = specd_path_join(path, sizeof path, dir, "config.json", err) ||
             specd_write_small_file(path, cfg, strlen(cfg), err);
    free(cfg);
    return rc ? specd_preferr(err, "export") : 0;
}

/* State tensor names: "<kind>/<tensor name>" for kind param, adam_m, adam_v,
 * plus "vocab_map" so a resume cannot silently pair weights with another
 * vocabulary. */
int spec_model_save_state(const spec_model *m, const float *adam_m, const float *adam_v,
                          const char *json_meta, const char *path, specd_error *err) {
    enum { MAXT = 3 * 5 * SPECD_MLP_SPEC_MAX_PREDICT + 1 };
    static const char *kinds[3] = {"param", "adam_m", "adam_v"};
    safetensors_out outs[MAXT];
    char names[MAXT][80];
    const float *bases[3] = {m->params, adam_m, adam_v};
    int n = 0;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < m->n_tensors; i++) {
            const struct spec_tensor *t = &m->tensors[i];
            snprintf(names[n], sizeof names[n], "%s/%s", kinds[k], t->name);
            outs[n] = tensor_out(t, names[n], SPECD_F32);
            outs[n].data = bases[k] + (t->data - m->params);
            n++;
        }
    if (m->vocab_map) outs[n++] = map_out(m, "vocab_map");
    const char *keys[2] = {"format", STATE_META_KEY};
    const char *vals[2] = {STATE_FORMAT, json_meta ? json_meta : "{}"};
    return safetensors_write(path, outs, n, keys, vals, 2, err);
}

static int load_f32(const safetensors_file *f, const char *name, const struct spec_tensor *t,
                    float *dst, specd_error *err) {
    const safetensors_tensor *st = safetensors_find(f, name);
    if (!st) return specd_seterr(err, "tensor '%s' is missing", name);
    int ok = st->type == SPECD_F32 && st->n_dims == (t->cols ? 2u : 1u) &&
             st->shape[0] == (uint64_t)t->rows && (!t->cols || st->shape[1] == (uint64_t)t->cols);
    if (!ok)
        return specd_seterr(err, "tensor '%s' is not F32 [%d%s%d] as the model", name, t->rows,
                            t->cols ? ", " : "", t->cols);
    memcpy(dst, st->data, sizeof(float) * t->numel);
    return 0;
}

static int load_state_file(const safetensors_file *f, spec_model *m, float *adam_m,
                           float *adam_v, char **json_meta, specd_error *err) {
    static const char *kinds[3] = {"param", "adam_m", "adam_v"};
    const char *format = safetensors_metadata(f, "format");
    if (!format || strcmp(format, STATE_FORMAT))
        return specd_seterr(err, "not a speculator training state (metadata 'format' is '%s')",
                            format ? format : "absent");
    size_t want = 3 * (size_t)m->n_tensors + (m->vocab_map ? 1 : 0);
    if (safetensors_n_tensors(f) != want)
        return specd_seterr(err, "%zu tensors; this model's state has %zu",
                            safetensors_n_tensors(f), want);
    const safetensors_tensor *map = safetensors_find(f, "vocab_map");
    if (m->vocab_map) {
        int same = map && map->type == SPECD_I32 && map->n_dims == 1 &&
                   map->shape[0] == (uint64_t)m->cfg.vocab_size &&
                   !memcmp(map->data, m->vocab_map, sizeof(int32_t) * m->cfg.vocab_size);
        if (!same) return specd_seterr(err, "tensor 'vocab_map' differs from the model's");
    } else if (map) {
        return specd_seterr(err, "has a vocab_map; the model has none");
    }
    float *bases[3] = {m->params, adam_m, adam_v};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < m->n_tensors; i++) {
            const struct spec_tensor *t = &m->tensors[i];
            char name[80];
            snprintf(name, sizeof name, "%s/%s", kinds[k], t->name);
            if (load_f32(f, name, t, bases[k] + (t->data - m->params), err)) return -1;
        }
    const char *meta = safetensors_metadata(f, STATE_META_KEY);
    *json_meta = strdup(meta ? meta : "{}");
    return *json_meta ? 0 : specd_seterr(err, "out of memory");
}

int spec_model_load_state(spec_model *m, float *adam_m, float *adam_v, char **json_meta,
                          const char *path, specd_error *err) {
    *json_meta = NULL;
    safetensors_file *f = safetensors_open(path, err);
    if (!f) return -1;
    int rc = load_state_file(f, m, adam_m, adam_v, json_meta, err);
    safetensors_close(f);
    return rc ? specd_preferr(err, "%s", path) : 0;
}

int spec_model_read_vocab_map(const char *dir, int32_t **map, int *n, specd_error *err) {
    *map = NULL, *n = 0;
    char path[2048];
    if (specd_path_join(path, sizeof path, dir, "model.safetensors", err)) return -1;
    safetensors_file *f = safetensors_open(path, err);
    if (!f) return -1;
    const safetensors_tensor *t = safetensors_find(f, "speculator.vocab_map");
    int rc = 0;
    if (t) {
        if (t->type != SPECD_I32 || t->n_dims != 1 || t->shape[0] == 0 || t->shape[0] > INT32_MAX) {
            rc = specd_seterr(err, "%s: speculator.vocab_map is not I32 [n]", path);
        } else if (!(*map = malloc(sizeof(int32_t) * t->shape[0]))) {
            rc = specd_seterr(err, "out of memory");
        } else {
            memcpy(*map, t->data, sizeof(int32_t) * t->shape[0]);
            *n = (int)t->shape[0];
        }
    }
    safetensors_close(f);
    return rc;
}

int spec_model_load_export(spec_model *m, const char *dir, specd_error *err) {
    char path[2048];
    if (specd_path_join(path, sizeof path, dir, "model.safetensors", err)) return -1;
    safetensors_file *f = safetensors_open(path, err);
    if (!f) return -1;
    int rc = 0;
    const safetensors_tensor *map = safetensors_find(f, "speculator.vocab_map");
    if (m->vocab_map ? !map || map->type != SPECD_I32 || map->n_dims != 1 ||
                           map->shape[0] != (uint64_t)m->cfg.vocab_size ||
                           memcmp(map->data, m->vocab_map, sizeof(int32_t) * m->cfg.vocab_size)
                     : map != NULL) {
        rc = specd_seterr(err, "%s: speculator.vocab_map differs from the model's", path);
        goto out;
    }
    if (safetensors_n_tensors(f) != (size_t)m->n_tensors + (map ? 1 : 0)) {
        rc = specd_seterr(err, "%s: %zu tensors; this model has %d (other heads or tying?)", path,
                          safetensors_n_tensors(f), m->n_tensors + (map ? 1 : 0));
        goto out;
    }
    for (int i = 0; i < m->n_tensors && rc == 0; i++) {
        const struct spec_tensor *t = &m->tensors[i];
        const safetensors_tensor *st = safetensors_find(f, t->name);
        if (!st || st->n_dims != (t->cols ? 2u : 1u) || st->shape[0] != (uint64_t)t->rows ||
            (t->cols && st->shape[1] != (uint64_t)t->cols)) {
            rc = specd_seterr(err, "%s: tensor '%s' is missing or not [%d%s%d]", path, t->name,
                              t->rows, t->cols ? ", " : "", t->cols);
        } else if (st->type == SPECD_F32) {
            memcpy(t->data, st->data, sizeof(float) * t->numel);
        } else if (st->type == SPECD_F16 || st->type == SPECD_BF16) {
            const uint16_t *src = st->data;
            for (size_t k = 0; k < t->numel; k++)
                t->data[k] = st->type == SPECD_F16 ? specd_fp16_to_f32(src[k])
                                                   : specd_bf16_to_f32(src[k]);
        } else {
            rc = specd_seterr(err, "%s: tensor '%s' is not F32, F16 or BF16", path, t->name);
        }
    }
out:
    safetensors_close(f);
    return rc;
}
