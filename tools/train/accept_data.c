/* accept_data.c - the acceptance head's labeled examples (accept_data.h):
 * sources from a corpus, then one pass of target + speculator over them. */
#include "tools/train/accept_data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/text/chat.h"
#include "common/util/dtype.h"
#include "common/util/rng.h"
#include "common/spec/sampling.h"
#include "draft-svc/drafter.h"

#define MAXP SPECD_MLP_SPEC_MAX_PREDICT

/* ---- sources ------------------------------------------------------------------ */

void accept_sources_free(accept_sources *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->v[i].ids);
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* Appends a source holding a copy of ids[0..n). */
static int add_source(accept_sources *s, int *cap, const int32_t *ids, int n, int n_prefix,
                      int generate, specd_error *err) {
    if (s->n == *cap) {
        int c = *cap ? 2 * *cap : 64;
        accept_source *v = realloc(s->v, sizeof *v * (size_t)c);
        if (!v) return specd_seterr(err, "out of memory");
        s->v = v;
        *cap = c;
    }
    int32_t *copy = malloc(sizeof(int32_t) * (size_t)n);
    if (!copy) return specd_seterr(err, "out of memory");
    memcpy(copy, ids, sizeof(int32_t) * (size_t)n);
    s->v[s->n++] = (accept_source){copy, n, n_prefix, generate};
    return 0;
}

int accept_sources_from_corpus(const specd_tokenizer *tok, const corpus *c, int max_prompt,
                               int gen_len, int window_len, accept_sources *out,
                               specd_error *err) {
    memset(out, 0, sizeof *out);
    int cap = 0;
    size_t d = 0;
    for (; d < c->n_docs; d++) {
        const corpus_doc *doc = &c->docs[d];
        int32_t *ids = NULL;
        size_t n_ids = 0;
        int rc;
        if (doc->is_prompt) {
            specd_chat_msg msg = {"user", doc->text};
            rc = specd_chat_tokenize(tok, &msg, 1, &ids, &n_ids, err);
        } else {
            rc = specd_tokenize(tok, doc->text, doc->len, 0, &ids, &n_ids, err);
        }
        if (rc) goto fail;
        if (doc->is_prompt && n_ids > 0) {
            /* the end of a prompt is what the continuation depends on most */
            size_t keep = n_ids < (size_t)max_prompt ? n_ids : (size_t)max_prompt;
            rc = add_source(out, &cap, ids + (n_ids - keep), (int)keep, (int)keep - 1, gen_len,
                            err);
        } else {
            rc = 0;
            /* a window needs two tokens: one row to start a chain, one to feed it */
            for (size_t w = 0; !rc && w + 2 <= n_ids; w += (size_t)window_len) {
                size_t len = n_ids - w < (size_t)window_len ? n_ids - w : (size_t)window_len;
                if (len >= 2) rc = add_source(out, &cap, ids + w, (int)len, 0, 0, err);
            }
        }
        free(ids);
        if (rc) goto fail;
    }
    if (out->n == 0) {
        accept_sources_free(out);
        return specd_seterr(err, "the data holds no usable document or prompt");
    }
    return 0;
fail:
    specd_preferr(err, "document %zu of the data", d + 1);
    accept_sources_free(out);
    return -1;
}

/* ---- examples ----------------------------------------------------------------- */

void accept_examples_free(accept_examples *e) {
    if (!e) return;
    free(e->states);
    free(e->stage);
    free(e->label);
    free(e->qdraft);
    free(e->qtop2);
    free(e->source);
    memset(e, 0, sizeof *e);
}

static int add_example(accept_examples *e, const float *state, int stage, float label,
                       float qdraft, const float *qtop2, int src, specd_error *err) {
    if (e->n == e->cap) {
        long c = e->cap ? 2 * e->cap : 4096;
        uint16_t *s = realloc(e->states, sizeof(uint16_t) * (size_t)c * (size_t)e->dim);
        if (s) e->states = s;
        uint8_t *st = realloc(e->stage, (size_t)c);
        if (st) e->stage = st;
        float *l = realloc(e->label, sizeof(float) * (size_t)c);
        if (l) e->label = l;
        float *qd = realloc(e->qdraft, sizeof(float) * (size_t)c);
        if (qd) e->qdraft = qd;
        float *q2 = realloc(e->qtop2, sizeof(float) * 2 * (size_t)c);
        if (q2) e->qtop2 = q2;
        int32_t *so = realloc(e->source, sizeof(int32_t) * (size_t)c);
        if (so) e->source = so;
        if (!s || !st || !l || !qd || !q2 || !so)
            return specd_seterr(err, "out of memory for %ld examples", c);
        e->cap = c;
    }
    /* fp16 halves the set's memory; the head reads states of a GELU'd
     * LayerNorm, well inside fp16's range and precision needs */
    uint16_t *dst = e->states + (size_t)e->n * e->dim;
    for (int i = 0; i < e->dim; i++) dst[i] = specd_f32_to_fp16(state[i]);
    e->stage[e->n] = (uint8_t)stage;
    e->label[e->n] = label;
    e->qdraft[e->n] = qdraft;
    e->qtop2[2 * e->n] = qtop2[0];
    e->qtop2[2 * e->n + 1] = qtop2[1];
    e->source[e->n] = src;
    e->n++;
    return 0;
}

/* ---- the pass ----------------------------------------------------------------- */

typedef struct lane {
    int src;           /* source index, -1 = idle */
    int32_t *ids;      /* the sequence: given tokens, then generated ones */
    int n_ids;         /* tokens in ids */
    int j;             /* the row just computed (its token is ids[j]) */
    int n_past;        /* KV rows filled */
    int gen_left;      /* tokens the target may still append */
    int32_t next;      /* x_{j+1}; -1 = the lane ends with this row */
    int ends;          /* next is known but will not be run */
    int fresh;         /* filled this round: its row came from the prefill */
    float *h_prev;     /* [emb_dim] h_{j-1} */
    int have_prev;
    float *chain;      /* [MAXP][inner]: the state the chain at stage k reads */
    uint8_t alive[MAXP];
} lane;

typedef struct pass {
    specd_transformer *t;
    specd_mlp_speculator *sp;
    const accept_sources *src;
    const accept_data_opts *o;
    accept_examples *out;
    int V, dim, inner, n_predict, lanes, max_ctx;
    lane *ln;
    float *logits, *hidden; /* the target's rows [lanes][V], [lanes][dim] */
    float *st_in, *st_out, *st_logits; /* one stage call: [lanes][max(dim, inner)], [lanes][inner], [lanes][V] */
    int32_t *st_tok, *st_lane;
    float *p, *q;           /* [V] distributions at T */
    void *scratch;
    specd_sampling samp;    /* temperature T, nothing else */
    int32_t *batch_tok, *out_rows;
    specd_seq_input *seqs;
} pass;

static int is_end(const accept_data_opts *o, int32_t id) {
    for (int i = 0; i < o->n_end_ids; i++)
        if (o->end_ids[i] == id) return 1;
    return 0;
}

/* Starts source s on idle lane l: prefills its prefix and first example
 * row, which becomes the lane's row for this round. */
static int lane_start(pass *P, int l, int s, specd_error *err) {
    const accept_source *a = &P->src->v[s];
    lane *L = &P->ln[l];
    int cap = a->n_ids + (a->generate > 0 ? a->generate : 0) + 1;
    int32_t *ids = realloc(L->ids, sizeof(int32_t) * (size_t)cap);
    if (!ids) return specd_seterr(err, "out of memory");
    L->ids = ids;
    memcpy(ids, a->ids, sizeof(int32_t) * (size_t)a->n_ids);
    int n_new = a->n_prefix + 1;
    if (n_new > P->max_ctx)
        return specd_seterr(err, "source %d: prefix of %d tokens exceeds the context of %d", s,
                            a->n_prefix, P->max_ctx);
    specd_seq_input q = {.slot = l, .n_past = 0, .n_new = n_new};
    int32_t last = n_new - 1;
    specd_batch b = {.n_tokens = n_new, .tokens = ids, .n_seqs = 1, .seqs = &q, .n_out = 1,
                     .out_rows = &last, .logits = P->logits + (size_t)l * P->V,
                     .hidden = P->hidden + (size_t)l * P->dim};
    if (specd_transformer_forward(P->t, &b, err)) return specd_preferr(err, "source %d", s);
    L->src = s;
    L->n_ids = a->n_ids;
    L->j = a->n_prefix;
    L->n_past = n_new;
    L->gen_left = a->generate;
    L->have_prev = 0;
    L->fresh = 1;
    memset(L->alive, 0, sizeof L->alive);
    return 0;
}

/* One forward for every lane that continues: its token x_{j+1}. */
static int decode_round(pass *P, specd_error *err) {
    int n = 0;
    for (int l = 0; l < P->lanes; l++) {
        lane *L = &P->ln[l];
        if (L->src < 0 || L->fresh) continue;
        P->seqs[n] = (specd_seq_input){.slot = l, .n_past = L->n_past, .n_new = 1};
        P->batch_tok[n] = L->next;
        P->out_rows[n] = n;
        P->st_lane[n++] = l;
    }
    if (n == 0) return 0;
    /* rows come back in batch order; scatter them to their lanes below */
    specd_batch b = {.n_tokens = n, .tokens = P->batch_tok, .n_seqs = n, .seqs = P->seqs,
                     .n_out = n, .out_rows = P->out_rows, .logits = P->st_logits,
                     .hidden = P->st_out};
    if (specd_transformer_forward(P->t, &b, err)) return -1;
    for (int i = 0; i < n; i++) {
        int l = P->st_lane[i];
        lane *L = &P->ln[l];
        memcpy(P->logits + (size_t)l * P->V, P->st_logits + (size_t)i * P->V,
               sizeof(float) * (size_t)P->V);
        memcpy(P->hidden + (size_t)l * P->dim, P->st_out + (size_t)i * P->dim,
               sizeof(float) * (size_t)P->dim);
        L->j++;
        L->n_past++;
    }
    return 0;
}

/* x_{j+1} for lane l from its row: the next given token, else the target's
 * own (argmax, or a draw at T), else none. */
static void choose_next(pass *P, int l) {
    lane *L = &P->ln[l];
    const float *z = P->logits + (size_t)l * P->V;
    L->ends = 0;
    L->next = -1;
    if (L->j + 1 < L->n_ids) {
        L->next = L->ids[L->j + 1];
    } else if (L->gen_left > 0) {
        uint64_t stream = ((uint64_t)L->src << 24) + (uint64_t)L->j;
        L->next = P->samp.temperature > 0
                      ? specd_sample(&P->samp, z, P->V, stream, 0, P->scratch)
                      : specd_argmax(z, P->V);
        L->ids[L->n_ids++] = L->next;
        L->gen_left--;
        if (is_end(P->o, L->next)) L->ends = 1; /* judged as a label, never run */
    }
    if (L->next >= 0 && L->n_past + 1 > P->max_ctx) L->ends = 1;
}

/* The two largest probabilities of softmax(y) (T = 1) into q[0] >= q[1],
 * summed in a fixed order (-inf entries, outside a reduced vocabulary,
 * count 0). */
static void top2_probs(const float *y, int V, float *q) {
    float a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (y[i] > a) b = a, a = y[i];
        else if (y[i] > b) b = y[i];
    }
    double lse = specd_log_sum_exp(y, V);
    q[0] = (float)exp((double)a - lse);
    q[1] = b == -INFINITY ? 0.0f : (float)exp((double)b - lse);
}

/* The label of draft row r of a stage call judged by lane l's z_j, the
 * draft token itself, the speculator's probability of it (*qdraft) and its
 * row's two largest probabilities at T = 1 (qtop2[2]). */
static float label_row(pass *P, int l, int r, int stage, int32_t *draft, float *qdraft,
                       float *qtop2) {
    const lane *L = &P->ln[l];
    const float *z = P->logits + (size_t)l * P->V, *y = P->st_logits + (size_t)r * P->V;
    top2_probs(y, P->V, qtop2);
    if (P->samp.temperature <= 0) {
        *draft = specd_argmax(y, P->V);
        /* the softmax at the argmax is the row's largest probability */
        *qdraft = qtop2[0];
        return *draft == specd_argmax(z, P->V) ? 1.0f : 0.0f;
    }
    specd_sampling_probs(&P->samp, y, P->V, P->q, P->scratch);
    /* the drafter's address space (drafter.h), apart from the target's draws */
    uint64_t stream = ((uint64_t)L->src << 24) + (uint64_t)L->j;
    double u = specd_rng_uniform(P->o->seed ^ SPECD_DRAFT_RNG_SALT, stream, (uint64_t)stage);
    *draft = specd_sample_from_probs(P->q, P->V, u);
    float qd = P->q[*draft];
    *qdraft = qd;
    specd_sampling_probs(&P->samp, z, P->V, P->p, P->scratch);
    float pd = P->p[*draft];
    return qd > 0 && pd < qd ? pd / qd : 1.0f;
}

/* Every stage that reads row j of some lane, deepest first: stage k's
 * output goes to slot k+1, which stage k+1 has already read this round. */
static int stage_round(pass *P, specd_error *err) {
    for (int k = P->n_predict - 1; k >= 0; k--) {
        int n = 0, in_dim = specd_mlp_speculator_state_in_dim(P->sp, k);
        for (int l = 0; l < P->lanes; l++) {
            lane *L = &P->ln[l];
            if (L->src < 0) continue;
            int runs = k == 0 ? L->have_prev : L->alive[k];
            L->alive[k] = 0; /* consumed; stage k-1 may refill it */
            if (!runs) continue;
            const float *in = k == 0 ? L->h_prev : L->chain + (size_t)k * P->inner;
            memcpy(P->st_in + (size_t)n * in_dim, in, sizeof(float) * (size_t)in_dim);
            P->st_tok[n] = L->ids[L->j];
            P->st_lane[n++] = l;
        }
        if (n == 0) continue;
        if (specd_mlp_speculator_stage(P->sp, k, n, P->st_in, P->st_tok, P->st_out,
                                       P->st_logits, err))
            return -1;
        for (int r = 0; r < n; r++) {
            int l = P->st_lane[r];
            lane *L = &P->ln[l];
            const float *state = P->st_out + (size_t)r * P->inner;
            int32_t draft;
            float qdraft, qtop2[2];
            float y = label_row(P, l, r, k, &draft, &qdraft, qtop2);
            if (add_example(P->out, state, k, y, qdraft, qtop2, L->src, err)) return -1;
            /* greedy: only an accepted draft that the sequence also follows
             * leaves a prefix of accepted drafts (accept_data.h) */
            int cont = L->next >= 0 && !L->ends && k + 1 < P->n_predict &&
                       (P->samp.temperature > 0 || (y == 1.0f && draft == L->next));
            if (cont) {
                memcpy(L->chain + (size_t)(k + 1) * P->inner, state,
                       sizeof(float) * (size_t)P->inner);
                L->alive[k + 1] = 1;
            }
        }
    }
    return 0;
}

static void pass_free(pass *P) {
    if (P->ln)
        for (int l = 0; l < P->lanes; l++) {
            free(P->ln[l].ids);
            free(P->ln[l].h_prev);
            free(P->ln[l].chain);
        }
    free(P->ln);
    free(P->logits);
    free(P->hidden);
    free(P->st_in);
    free(P->st_out);
    free(P->st_logits);
    free(P->st_tok);
    free(P->st_lane);
    free(P->p);
    free(P->q);
    free(P->scratch);
    free(P->batch_tok);
    free(P->out_rows);
    free(P->seqs);
}

static int pass_init(pass *P, specd_error *err) {
    const specd_llama_hparams *hp = specd_transformer_hparams(P->t);
    const specd_mlp_spec_config *c = specd_mlp_speculator_config(P->sp);
    if (c->target_vocab_size != hp->vocab_size || c->emb_dim != hp->dim)
        return specd_seterr(err, "the speculator (vocabulary %d, emb_dim %d) does not fit the "
                                 "target (vocabulary %d, hidden %d)", c->target_vocab_size,
                            c->emb_dim, hp->vocab_size, hp->dim);
    P->V = hp->vocab_size;
    P->dim = hp->dim;
    P->inner = c->inner_dim;
    P->n_predict = c->n_predict;
    P->max_ctx = specd_transformer_max_ctx(P->t);
    size_t L = (size_t)P->lanes, V = (size_t)P->V, wide = (size_t)(P->dim > P->inner ? P->dim : P->inner);
    P->ln = calloc(L, sizeof *P->ln);
    P->logits = malloc(sizeof(float) * L * V);
    P->hidden = malloc(sizeof(float) * L * (size_t)P->dim);
    P->st_in = malloc(sizeof(float) * L * wide);
    P->st_out = malloc(sizeof(float) * L * wide); /* also the decode's hidden rows */
    P->st_logits = malloc(sizeof(float) * L * V);
    P->st_tok = malloc(sizeof(int32_t) * L);
    P->st_lane = malloc(sizeof(int32_t) * L);
    P->p = malloc(sizeof(float) * V);
    P->q = malloc(sizeof(float) * V);
    P->scratch = malloc(specd_sampling_scratch_size(P->V));
    P->batch_tok = malloc(sizeof(int32_t) * L);
    P->out_rows = malloc(sizeof(int32_t) * L);
    P->seqs = calloc(L, sizeof *P->seqs);
    int ok = P->ln && P->logits && P->hidden && P->st_in && P->st_out && P->st_logits &&
             P->st_tok && P->st_lane && P->p && P->q && P->scratch && P->batch_tok &&
             P->out_rows && P->seqs;
    for (size_t l = 0; ok && l < L; l++) {
        P->ln[l].src = -1;
        P->ln[l].h_prev = malloc(sizeof(float) * (size_t)P->dim);
        P->ln[l].chain = malloc(sizeof(float) * (size_t)MAXP * (size_t)P->inner);
        ok = P->ln[l].h_prev && P->ln[l].chain;
    }
    if (!ok) return specd_seterr(err, "out of memory");
    specd_sampling_init(&P->samp);
    P->samp.temperature = P->o->temperature;
    P->samp.seed = P->o->seed;
    return 0;
}

int accept_data_build(specd_transformer *t, specd_mlp_speculator *sp, const accept_sources *src,
                      const accept_data_opts *o, accept_examples *out,
                      accept_data_progress progress, void *ctx, specd_error *err) {
    if (o->lanes < 1) return specd_seterr(err, "accept data: lanes must be >= 1");
    pass P = {.t = t, .sp = sp, .src = src, .o = o, .out = out, .lanes = o->lanes};
    int rc = pass_init(&P, err);
    if (!rc) {
        out->dim = P.inner;
        if (out->n && out->dim != P.inner) rc = specd_seterr(err, "examples of another width");
    }
    int next_src = 0, done = 0;
    while (!rc && (o->max_examples <= 0 || out->n < o->max_examples)) {
        int busy = 0;
        for (int l = 0; l < P.lanes && !rc; l++) {
            P.ln[l].fresh = 0;
            if (P.ln[l].src < 0 && next_src < src->n) rc = lane_start(&P, l, next_src++, err);
            busy |= P.ln[l].src >= 0;
        }
        if (rc || !busy) break;
        if ((rc = decode_round(&P, err))) break;
        for (int l = 0; l < P.lanes; l++) {
            lane *L = &P.ln[l];
            if (L->src < 0) continue;
            /* the speculator sees the hidden state as the wire carries it */
            float *h = P.hidden + (size_t)l * P.dim;
            for (int i = 0; i < P.dim; i++) h[i] = specd_fp16_to_f32(specd_f32_to_fp16(h[i]));
            choose_next(&P, l);
        }
        if ((rc = stage_round(&P, err))) break;
        for (int l = 0; l < P.lanes; l++) {
            lane *L = &P.ln[l];
            if (L->src < 0) continue;
            memcpy(L->h_prev, P.hidden + (size_t)l * P.dim, sizeof(float) * (size_t)P.dim);
            L->have_prev = 1; /* row j >= n_prefix: a chain may start from it */
            if (L->next < 0 || L->ends) {
                L->src = -1;
                done++;
                if (progress) progress(ctx, done, src->n, out->n);
            }
        }
    }
    if (!rc && o->max_examples > 0 && out->n > o->max_examples)
        out->n = o->max_examples; /* the last round may overshoot by a few */
    pass_free(&P);
    return rc;
}
