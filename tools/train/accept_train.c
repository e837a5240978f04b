/* accept_train.c - the acceptance head's trainer (accept_train.h): model
 * init, held-out split, the training loop (forward and backward through
 * tools/train/nn.h) and evaluation through the production head. */
#include "tools/train/accept_train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util/dtype.h"
#include "common/util/rng.h"
#include "tools/train/nn.h"
#include "common/util/clock.h"

#define EVAL_CHUNK 1024 /* rows per forward call in evaluation */

/* ---- the model ---------------------------------------------------------------- */

/* One tensor of the flat buffer, for init and the optimizer. */
typedef struct model_tensor {
    float *p;
    size_t n;
    int decay;    /* weight decay applies (matrices, not biases or the stage vectors) */
    float std;    /* init: N(0, std); 0 = zeros */
} model_tensor;

/* The tensors in the file's order (accept_head.h); returns their count. */
static int model_tensors(const accept_model *m, model_tensor *t) {
    int n = 0, H = m->cfg.hidden_dim, D = m->cfg.input_dim;
    size_t HH = (size_t)H * H;
    t[n++] = (model_tensor){m->in_w, (size_t)H * D, 1, 1.0f / sqrtf((float)D)};
    t[n++] = (model_tensor){m->in_b, (size_t)H, 0, 0};
    t[n++] = (model_tensor){m->stage_emb, (size_t)m->cfg.n_stages * H, 0, 0};
    if (m->draft_w) t[n++] = (model_tensor){m->draft_w, (size_t)H * m->cfg.n_draft_features, 1, 0};
    for (int l = 0; l < m->cfg.n_layers; l++) {
        t[n++] = (model_tensor){m->fc1_w[l], HH, 1, 1.0f / sqrtf((float)H)};
        t[n++] = (model_tensor){m->fc1_b[l], (size_t)H, 0, 0};
        t[n++] = (model_tensor){m->fc2_w[l], HH, 1, 0}; /* the block starts as identity */
        t[n++] = (model_tensor){m->fc2_b[l], (size_t)H, 0, 0};
    }
    /* small: the first steps should move the bias, not chase random features */
    t[n++] = (model_tensor){m->out_w, (size_t)H, 1, 0.01f / sqrtf((float)H)};
    t[n++] = (model_tensor){m->out_b, 1, 0, 0};
    return n;
}

#define MAX_MODEL_TENSORS (4 + 4 * SPECD_ACCEPT_HEAD_MAX_LAYERS + 2)

/* A standard normal from two counter-based uniforms (Box-Muller). */
static float normal(uint64_t seed, uint64_t stream, uint64_t i) {
    double u1 = specd_rng_uniform(seed, stream, 2 * i), u2 = specd_rng_uniform(seed, stream, 2 * i + 1);
    return (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2));
}

int accept_model_init(accept_model *m, const specd_accept_head_config *cfg, float base_rate,
                      uint64_t seed, specd_error *err) {
    memset(m, 0, sizeof *m);
    if (cfg->input_dim < 1 || cfg->hidden_dim < 1 || cfg->n_layers < 0 ||
        cfg->n_layers > SPECD_ACCEPT_HEAD_MAX_LAYERS || cfg->n_stages < 1 ||
        cfg->n_stages > SPECD_ACCEPT_HEAD_MAX_STAGES || cfg->input_dim > SPECD_ACCEPT_HEAD_MAX_INPUT ||
        cfg->hidden_dim > SPECD_ACCEPT_HEAD_MAX_HIDDEN ||
        (cfg->n_draft_features != 0 && cfg->n_draft_features != SPECD_ACCEPT_HEAD_DRAFT_FEATURES))
        return specd_seterr(err, "accept head: config outside the limits");
    m->cfg = *cfg;
    size_t H = (size_t)cfg->hidden_dim, D = (size_t)cfg->input_dim;
    size_t F = (size_t)cfg->n_draft_features;
    m->n_params = H * D + H + (size_t)cfg->n_stages * H + H * F +
                  (size_t)cfg->n_layers * (2 * H * H + 2 * H) + H + 1;
    m->params = calloc(m->n_params, sizeof(float));
    if (!m->params) return specd_seterr(err, "out of memory for %zu parameters", m->n_params);
    float *p = m->params;
    m->in_w = p, p += H * D;
    m->in_b = p, p += H;
    m->stage_emb = p, p += (size_t)cfg->n_stages * H;
    if (F) m->draft_w = p, p += H * F;
    for (int l = 0; l < cfg->n_layers; l++) {
        m->fc1_w[l] = p, p += H * H;
        m->fc1_b[l] = p, p += H;
        m->fc2_w[l] = p, p += H * H;
        m->fc2_b[l] = p, p += H;
    }
    m->out_w = p, p += H;
    m->out_b = p;
    model_tensor t[MAX_MODEL_TENSORS];
    int n = model_tensors(m, t);
    for (int i = 0; i < n; i++)
        for (size_t j = 0; t[i].std > 0 && j < t[i].n; j++)
            t[i].p[j] = t[i].std * normal(seed, (uint64_t)i, j);
    float r = base_rate < 1e-4f ? 1e-4f : base_rate > 1 - 1e-4f ? 1 - 1e-4f : base_rate;
    *m->out_b = logf(r / (1 - r));
    return 0;
}

void accept_model_free(accept_model *m) {
    if (!m) return;
    free(m->params);
    memset(m, 0, sizeof *m);
}

void accept_model_weights(const accept_model *m, specd_accept_head_weights *w) {
    memset(w, 0, sizeof *w);
    w->in_w = m->in_w;
    w->in_b = m->in_b;
    w->stage_emb = m->stage_emb;
    w->draft_w = m->draft_w;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        w->fc1_w[l] = m->fc1_w[l];
        w->fc1_b[l] = m->fc1_b[l];
        w->fc2_w[l] = m->fc2_w[l];
        w->fc2_b[l] = m->fc2_b[l];
    }
    w->out_w = m->out_w;
    w->out_b = *m->out_b;
}

/* ---- split -------------------------------------------------------------------- */

int accept_split(const accept_examples *e, int n_sources, long **train, long *n_train, long **val,
                 long *n_val, specd_error *err) {
    *train = malloc(sizeof(long) * (size_t)(e->n > 0 ? e->n : 1));
    *val = malloc(sizeof(long) * (size_t)(e->n > 0 ? e->n : 1));
    if (!*train || !*val) {
        free(*train);
        free(*val);
        *train = *val = NULL;
        return specd_seterr(err, "out of memory");
    }
    *n_train = *n_val = 0;
    for (long i = 0; i < e->n; i++) {
        int held = n_sources >= 10 ? e->source[i] % 10 == 9 : i % 10 == 9;
        if (held) (*val)[(*n_val)++] = i;
        else (*train)[(*n_train)++] = i;
    }
    return 0;
}

/* ---- training ----------------------------------------------------------------- */

/* Activations of one batch, kept for the backward. */
typedef struct work {
    int B, L, H, D, F;
    float *s;            /* [B][D] */
    float *f;            /* [B][F] the draft features */
    int32_t *stage;      /* [B] */
    float *x;            /* [L+1][B][H]: the residual stream before each block, and after */
    float *a, *t;        /* [L][B][H]: fc1 output, and its SiLU */
    float *z, *dz, *y, *w; /* [B] */
    float *dx, *dt, *dxa;  /* [B][H] */
} work;

static void work_free(work *k) {
    free(k->s);
    free(k->f);
    free(k->stage);
    free(k->x);
    free(k->a);
    free(k->t);
    free(k->z);
    free(k->dz);
    free(k->y);
    free(k->w);
    free(k->dx);
    free(k->dt);
    free(k->dxa);
}

static int work_init(work *k, const accept_model *m, int B) {
    memset(k, 0, sizeof *k);
    k->B = B;
    k->L = m->cfg.n_layers;
    k->H = m->cfg.hidden_dim;
    k->D = m->cfg.input_dim;
    k->F = m->cfg.n_draft_features;
    size_t BH = (size_t)B * k->H, L = (size_t)k->L;
    k->s = malloc(sizeof(float) * (size_t)B * k->D);
    k->f = malloc(sizeof(float) * (size_t)B * (size_t)(k->F ? k->F : 1));
    k->stage = malloc(sizeof(int32_t) * (size_t)B);
    k->x = malloc(sizeof(float) * (L + 1) * BH);
    k->a = malloc(sizeof(float) * (L ? L : 1) * BH);
    k->t = malloc(sizeof(float) * (L ? L : 1) * BH);
    k->z = malloc(sizeof(float) * (size_t)B);
    k->dz = malloc(sizeof(float) * (size_t)B);
    k->y = malloc(sizeof(float) * (size_t)B);
    k->w = malloc(sizeof(float) * (size_t)B);
    k->dx = malloc(sizeof(float) * BH);
    k->dt = malloc(sizeof(float) * BH);
    k->dxa = malloc(sizeof(float) * BH);
    return k->s && k->f && k->stage && k->x && k->a && k->t && k->z && k->dz && k->y && k->w && k->dx &&
                   k->dt && k->dxa
               ? 0
               : -1;
}

/* Forward + backward of batch rows[0..B): adds the gradient into g and
 * returns the weighted BCE (mean over the batch's weight). */
static double train_step(const accept_model *m, work *k, const accept_examples *e,
                         const long *rows, int B, float w_rej, float *g) {
    int H = k->H, D = k->D, L = k->L, F = k->F;
    size_t BH = (size_t)B * H;
    double wsum = 0;
    for (int r = 0; r < B; r++) {
        long i = rows[r];
        const uint16_t *src = e->states + (size_t)i * D;
        for (int c = 0; c < D; c++) k->s[(size_t)r * D + c] = specd_fp16_to_f32(src[c]);
        if (F) specd_accept_head_draft_features(e->qtop2[2 * i], e->qtop2[2 * i + 1],
                                                k->f + (size_t)r * F);
        k->stage[r] = e->stage[i];
        /* -(y log p + w_rej (1-y) log(1-p)) as nn_bce's one weight per term:
         * W = y + w_rej (1-y), target y / W. The same loss and gradient
         * (accept_train.h), for soft labels too. */
        float y = e->label[i], W = y + w_rej * (1 - y);
        k->w[r] = W;
        k->y[r] = W > 0 ? y / W : 0;
        wsum += W;
    }
    /* forward */
    nn_linear_fwd(k->s, B, D, m->in_w, m->in_b, H, k->x);
    for (int r = 0; r < B; r++) {
        const float *emb = m->stage_emb + (size_t)k->stage[r] * H;
        float *x = k->x + (size_t)r * H;
        for (int c = 0; c < H; c++) x[c] += emb[c];
    }
    for (int r = 0; F && r < B; r++) { /* x += W_d f */
        const float *f = k->f + (size_t)r * F;
        float *x = k->x + (size_t)r * H;
        for (int o = 0; o < H; o++)
            for (int j = 0; j < F; j++) x[o] += m->draft_w[(size_t)o * F + j] * f[j];
    }
    for (int l = 0; l < L; l++) {
        const float *xl = k->x + (size_t)l * BH;
        float *a = k->a + (size_t)l * BH, *t = k->t + (size_t)l * BH, *xn = k->x + (size_t)(l + 1) * BH;
        nn_linear_fwd(xl, B, H, m->fc1_w[l], m->fc1_b[l], H, a);
        nn_silu_fwd(a, BH, t);
        nn_linear_fwd(t, B, H, m->fc2_w[l], m->fc2_b[l], H, xn);
        for (size_t j = 0; j < BH; j++) xn[j] += xl[j];
    }
    const float *xL = k->x + (size_t)L * BH;
    nn_linear_fwd(xL, B, H, m->out_w, m->out_b, 1, k->z);
    float scale = wsum > 0 ? (float)(1.0 / wsum) : 0;
    double loss = nn_bce(k->z, B, k->y, k->w, scale, k->dz);

    /* backward: g is laid out like m->params */
    size_t off_in_b = (size_t)(m->in_b - m->params), off_emb = (size_t)(m->stage_emb - m->params);
    memset(k->dx, 0, sizeof(float) * BH);
    nn_linear_bwd(xL, B, H, m->out_w, 1, k->dz, k->dx, g + (m->out_w - m->params),
                  g + (m->out_b - m->params));
    for (int l = L - 1; l >= 0; l--) {
        const float *xl = k->x + (size_t)l * BH, *a = k->a + (size_t)l * BH, *t = k->t + (size_t)l * BH;
        nn_linear_bwd(t, B, H, m->fc2_w[l], H, k->dx, k->dt, g + (m->fc2_w[l] - m->params),
                      g + (m->fc2_b[l] - m->params));
        nn_silu_bwd(a, BH, k->dt, k->dt);
        nn_linear_bwd(xl, B, H, m->fc1_w[l], H, k->dt, k->dxa, g + (m->fc1_w[l] - m->params),
                      g + (m->fc1_b[l] - m->params));
        for (size_t j = 0; j < BH; j++) k->dx[j] += k->dxa[j]; /* the residual path */
    }
    for (int r = 0; r < B; r++) {
        float *ge = g + off_emb + (size_t)k->stage[r] * H;
        const float *d = k->dx + (size_t)r * H;
        for (int c = 0; c < H; c++) ge[c] += d[c];
    }
    if (F) /* dW_d += dx^T f */
        nn_linear_bwd(k->f, B, F, m->draft_w, H, k->dx, NULL, g + (m->draft_w - m->params), NULL);
    nn_linear_bwd(k->s, B, D, m->in_w, H, k->dx, NULL, g + (m->in_w - m->params),
                  g + off_in_b);
    return wsum > 0 ? loss / wsum : 0;
}

int accept_train(accept_model *m, const accept_examples *e, const long *idx, long n,
                 const accept_train_opts *o, accept_train_log log, void *ctx, specd_error *err) {
    if (n < 1) return specd_seterr(err, "accept head: no training examples");
    if (o->steps < 1 || o->batch < 1 || !(o->lr > 0) || !(o->w_rej > 0) || o->warmup < 0)
        return specd_seterr(err, "accept head: steps, batch, lr and w_rej must be positive");
    if (e->dim != m->cfg.input_dim)
        return specd_seterr(err, "accept head: examples are %d wide, the head reads %d", e->dim,
                            m->cfg.input_dim);
    for (long i = 0; i < n; i++)
        if (e->stage[idx[i]] >= m->cfg.n_stages)
            return specd_seterr(err, "accept head: an example of stage %d, the head has %d",
                                e->stage[idx[i]], m->cfg.n_stages);
    int B = o->batch < n ? o->batch : (int)n;
    work k;
    float *g = calloc(m->n_params, sizeof(float)), *am = calloc(m->n_params, sizeof(float)),
          *av = calloc(m->n_params, sizeof(float));
    long *order = malloc(sizeof(long) * (size_t)n);
    int rc = 0;
    if (work_init(&k, m, B) || !g || !am || !av || !order) {
        rc = specd_seterr(err, "accept head: out of memory for training");
        goto out;
    }
    model_tensor t[MAX_MODEL_TENSORS];
    int n_t = model_tensors(m, t);
    nn_adamw opt = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    long cursor = n, epoch = 0; /* cursor == n: shuffle before the first batch */
    double t0 = specd_now_s(), loss_acc = 0;
    int loss_n = 0;
    for (long step = 0; step < o->steps; step++) {
        if (cursor + B > n) {
            /* a fresh permutation per epoch (Fisher-Yates on counter-based
             * draws: the order is a function of the seed and the epoch) */
            for (long i = 0; i < n; i++) order[i] = idx[i];
            for (long i = n - 1; i > 0; i--) {
                long j = (long)(specd_rng_uniform(o->seed, (uint64_t)epoch, (uint64_t)i) * (i + 1));
                if (j > i) j = i;
                long tmp = order[i];
                order[i] = order[j];
                order[j] = tmp;
            }
            cursor = 0;
            epoch++;
        }
        memset(g, 0, sizeof(float) * m->n_params);
        loss_acc += train_step(m, &k, e, order + cursor, B, o->w_rej, g);
        loss_n++;
        cursor += B;
        double sq = 0;
        for (size_t j = 0; j < m->n_params; j++) sq += (double)g[j] * g[j];
        double norm = sqrt(sq);
        if (o->clip > 0 && norm > o->clip) {
            float s = (float)(o->clip / norm);
            for (size_t j = 0; j < m->n_params; j++) g[j] *= s;
        }
        float lr = nn_lr_at(step, o->warmup, o->steps, o->lr, o->min_lr_ratio);
        for (int i = 0; i < n_t; i++) {
            size_t off = (size_t)(t[i].p - m->params);
            nn_adamw_update(&opt, step + 1, lr, t[i].decay ? o->weight_decay : 0.0f, t[i].p,
                            g + off, am + off, av + off, t[i].n);
        }
        if (log && o->log_every > 0 && ((step + 1) % o->log_every == 0 || step + 1 == o->steps)) {
            double dt = specd_now_s() - t0;
            log(ctx, step + 1, o->steps, loss_acc / loss_n, dt > 0 ? (step + 1) * (double)B / dt : 0);
            loss_acc = 0;
            loss_n = 0;
        }
    }
out:
    work_free(&k);
    free(g);
    free(am);
    free(av);
    free(order);
    return rc;
}

/* ---- evaluation ---------------------------------------------------------------- */

/* -(y log sigmoid(z) + (1-y) log(1 - sigmoid(z))), stably. */
static double bce_logit(double z, double y) {
    return (z > 0 ? z : 0) - y * z + log1p(exp(-fabs(z)));
}

typedef struct scored {
    float score, label;
} scored;

static int by_score(const void *a, const void *b) {
    float x = ((const scored *)a)->score, y = ((const scored *)b)->score;
    return (x > y) - (x < y);
}

double accept_auc(const float *score, const float *label, long n) {
    scored *v = malloc(sizeof *v * (size_t)(n > 0 ? n : 1));
    if (!v) return -1;
    for (long i = 0; i < n; i++) v[i] = (scored){score[i], label[i]};
    qsort(v, (size_t)n, sizeof *v, by_score);
    /* walk groups of equal scores upwards: each accepted mass beats the
     * rejected mass below its group and ties half of its group's */
    double neg_below = 0, pos_all = 0, win = 0;
    for (long i = 0; i < n;) {
        long j = i;
        double pos = 0, neg = 0;
        for (; j < n && v[j].score == v[i].score; j++) {
            pos += v[j].label;
            neg += 1.0 - v[j].label;
        }
        win += pos * (neg_below + 0.5 * neg);
        neg_below += neg;
        pos_all += pos;
        i = j;
    }
    free(v);
    return pos_all > 0 && neg_below > 0 ? win / (pos_all * neg_below) : -1;
}

/* The AUCs of accept_eval over examples idx[0..n) of `stage` (-1 = all):
 * the head's p (p_of[example]) and the draft's probability. */
static int eval_aucs(const accept_examples *e, const long *idx, long n, int stage,
                     const float *p_of, double *auc_head, double *auc_draft) {
    float *sh = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    float *sd = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    float *y = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!sh || !sd || !y) {
        free(sh), free(sd), free(y);
        return -1;
    }
    long m = 0;
    for (long i = 0; i < n; i++) {
        long ex = idx[i];
        if (stage >= 0 && e->stage[ex] != stage) continue;
        sh[m] = p_of[ex];
        sd[m] = e->qdraft[ex];
        y[m++] = e->label[ex];
    }
    *auc_head = accept_auc(sh, y, m);
    *auc_draft = accept_auc(sd, y, m);
    free(sh), free(sd), free(y);
    return 0;
}

int accept_evaluate(specd_accept_head *h, const accept_examples *e, const long *idx, long n,
                    accept_eval *out, specd_error *err) {
    memset(out, 0, sizeof *out);
    const specd_accept_head_config *c = specd_accept_head_config_of(h);
    if (e->dim != c->input_dim)
        return specd_seterr(err, "accept head: examples are %d wide, the head reads %d", e->dim,
                            c->input_dim);
    out->n_stages = c->n_stages;
    float *s = malloc(sizeof(float) * EVAL_CHUNK * (size_t)e->dim);
    float *top2 = malloc(sizeof(float) * 2 * EVAL_CHUNK);
    float *p = malloc(sizeof(float) * EVAL_CHUNK), *z = malloc(sizeof(float) * EVAL_CHUNK);
    long *rows = malloc(sizeof(long) * EVAL_CHUNK);
    float *p_of = malloc(sizeof(float) * (size_t)(e->n > 0 ? e->n : 1)); /* by example */
    int rc = 0;
    if (!s || !top2 || !p || !z || !rows || !p_of) {
        rc = specd_seterr(err, "out of memory");
        goto done;
    }
    long correct = 0;
    /* stage by stage: the forward takes one stage per call */
    for (int st = 0; st < c->n_stages && !rc; st++) {
        long i = 0;
        while (i < n && !rc) {
            int nr = 0;
            for (; i < n && nr < EVAL_CHUNK; i++) {
                long ex = idx[i];
                if (e->stage[ex] != st) continue;
                const uint16_t *src = e->states + (size_t)ex * e->dim;
                for (int d = 0; d < e->dim; d++) s[(size_t)nr * e->dim + d] = specd_fp16_to_f32(src[d]);
                top2[2 * nr] = e->qtop2[2 * ex];
                top2[2 * nr + 1] = e->qtop2[2 * ex + 1];
                rows[nr++] = ex;
            }
            if (nr == 0) break;
            if (specd_accept_head_forward(h, st, nr, s, top2, p, z, err)) {
                rc = -1;
                break;
            }
            for (int r = 0; r < nr; r++) {
                double y = e->label[rows[r]];
                out->bce += bce_logit(z[r], y);
                correct += (p[r] > 0.5f) == (y > 0.5);
                out->stage_n[st]++;
                out->stage_p[st] += p[r];
                out->stage_y[st] += y;
                out->n++;
                p_of[rows[r]] = p[r];
            }
        }
    }
    for (long i = 0; i < n && !rc; i++)
        if (e->stage[idx[i]] >= c->n_stages)
            rc = specd_seterr(err, "accept head: an example of stage %d, the head has %d",
                              e->stage[idx[i]], c->n_stages);
    if (!rc && out->n) {
        out->bce /= (double)out->n;
        out->accuracy = (double)correct / (double)out->n;
        for (int st = 0; st < c->n_stages; st++)
            if (out->stage_n[st]) {
                out->stage_p[st] /= (double)out->stage_n[st];
                out->stage_y[st] /= (double)out->stage_n[st];
            }
        if (eval_aucs(e, idx, n, -1, p_of, &out->auc_head, &out->auc_draft))
            rc = specd_seterr(err, "out of memory");
        for (long i = 0; i < n; i++) {
            int b = specd_calib_bin(e->qdraft[idx[i]]);
            out->qbin_n[b]++;
            out->qbin_y[b] += e->label[idx[i]];
        }
        for (int b = 0; b < SPECD_CALIB_BINS; b++)
            if (out->qbin_n[b]) out->qbin_y[b] /= (double)out->qbin_n[b];
        for (int st = 0; st < c->n_stages && !rc; st++)
            if (eval_aucs(e, idx, n, st, p_of, &out->stage_auc_head[st],
                          &out->stage_auc_draft[st]))
                rc = specd_seterr(err, "out of memory");
    }
done:
    free(p_of);
    free(s);
    free(top2);
    free(p);
    free(z);
    free(rows);
    return rc;
}
