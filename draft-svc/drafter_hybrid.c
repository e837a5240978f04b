/* drafter_hybrid.c - a model's drafts and a prompt lookup's in one tree
 * (drafter.h, "mlp_ngram").
 *
 * Why. The two drafters are good at different text. On the two repetitive
 * prompts of bench/prompts-repeat.jsonl (copy a list, rename a variable in
 * a function) suffix decoding drafts at tau 2.93 and the MLP speculator at
 * 1.21; on the held-out chat, code and math prompts of bench/eval-prompts
 * .jsonl it is the other way round (about 1.1 against 1.5). A request does
 * not say which kind it is, and one answer often holds both (an explanation
 * around quoted code). Snowflake's Arctic Inference serves suffix decoding
 * beside its speculator for the same reason.
 *
 * How. Each job is drafted twice, then merged into job->out:
 *   model   the borrowed model drafter (the mlp drafter), with the job's
 *           priced shape, candidates x depth;
 *   lookup  the borrowed ngram drafter (suffix decoding over the request's
 *           prompt and output, and the deployment's suffix cache when it
 *           is shared: one cache for both drafters), with the largest shape
 *           the policy allows, lookup_candidates x lookup_depth: a lookup
 *           costs microseconds whatever its size, and the price keeps only
 *           the rows that pay.
 * Both serialize their own calls (a mutex each), since their own batchers
 * call them too; a session of this drafter is a session of each.
 * The model's nodes go in first, in their order (parents before children);
 * then the lookup's, each under its parent's place in the merged tree:
 *   - a node the model proposed too becomes that node, source BOTH, scored
 *     with the higher of the two conditional chances (each source's score
 *     is calibrated apart, BOTH too: agreement is evidence of its own);
 *   - any other is added, source LOOKUP, scored with the lookup's
 *     conditional probability (its smoothed counts), its log q its
 *     parent's plus the log of that;
 * until the tree buffer is full (then the lookup's deepest nodes are the
 * ones left out). The driver's price (tree_choice.h) then keeps the nodes
 * worth a row of the target's pass, charging drafting time per level for
 * the model's levels only.
 *
 * A job of depth 0 (the driver's price found the model's drafting not
 * worth its time this step, drafter.h has_lookup) gets the lookup's tree
 * alone, and the driver drafts it on its own thread (propose_inline) with
 * the session's own scratch, not through the batcher: under load nearly
 * every step is such a job.
 *
 * Rejection sampling: the model alone. Its siblings must be i.i.d. draws
 * from the q sent with them (tree_builder.h), and a lookup node is not a
 * draw from anything. Greedy and seed-exact sampling verify by exact match,
 * where any node is fair: both sources.
 *
 * Losslessness does not depend on any of this (the target accepts only what
 * its own rule allows); test_draft_svc checks it like every drafter's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draft-svc/drafter.h"

typedef struct hybrid_impl {
    /* borrowed: both outlive us and serialize their own calls */
    specd_drafter *model, *lookup;
    /* per-call scratch, one pair of trees per job and their merge maps,
     * grown on demand (our batcher is our only caller) */
    specd_tree_buf *mtb, *ltb;
    int n_bufs, buf_cap;
    specd_draft_job *mjobs, *ljobs;
    int32_t *map_m, *map_l;
} hybrid_impl;

/* A session: the model's state and the lookup's (either may be NULL), and
 * the scratch of its lookup-alone drafts (propose_inline), which run on
 * the session's own thread, so they cannot share the batch's. */
typedef struct hybrid_session {
    void *model, *lookup;
    specd_tree_buf ltb;
    int32_t *map_l;
    int cap; /* of ltb and map_l; 0 = none yet */
} hybrid_session;

static int rejection(const specd_draft_job *job) {
    return job->sampling && specd_sampling_is(job->sampling, SPECD_SAMPLING_REJECTION);
}

static void free_bufs(hybrid_impl *h) {
    for (int i = 0; i < h->n_bufs; i++) {
        specd_tree_buf_free(&h->mtb[i]);
        specd_tree_buf_free(&h->ltb[i]);
    }
    free(h->mtb);
    free(h->ltb);
    free(h->mjobs);
    free(h->ljobs);
    free(h->map_m);
    free(h->map_l);
    h->mtb = h->ltb = NULL;
    h->mjobs = h->ljobs = NULL;
    h->map_m = h->map_l = NULL;
    h->n_bufs = h->buf_cap = 0;
}

/* Room for n jobs whose trees hold up to cap nodes. */
static int grow_bufs(hybrid_impl *h, int n, int cap, specd_error *err) {
    if (n <= h->n_bufs && cap <= h->buf_cap) return 0;
    int nn = n > h->n_bufs ? n : h->n_bufs, nc = cap > h->buf_cap ? cap : h->buf_cap;
    free_bufs(h);
    h->mtb = calloc((size_t)nn, sizeof *h->mtb);
    h->ltb = calloc((size_t)nn, sizeof *h->ltb);
    h->mjobs = calloc((size_t)nn, sizeof *h->mjobs);
    h->ljobs = calloc((size_t)nn, sizeof *h->ljobs);
    h->map_m = malloc(sizeof(int32_t) * (size_t)nc);
    h->map_l = malloc(sizeof(int32_t) * (size_t)nc);
    if (!h->mtb || !h->ltb || !h->mjobs || !h->ljobs || !h->map_m || !h->map_l) {
        free_bufs(h);
        return specd_seterr(err, "mlp_ngram drafter: out of memory");
    }
    for (int i = 0; i < nn; i++, h->n_bufs++)
        if (specd_tree_buf_init(&h->mtb[i], nc, 0, err) ||
            specd_tree_buf_init(&h->ltb[i], nc, 0, err)) {
            specd_tree_buf_free(&h->mtb[i]); /* one of the pair may be set */
            free_bufs(h);
            return -1;
        }
    h->buf_cap = nc;
    return 0;
}

/* out's child of `parent` (-1 = the root) holding `token`, or -1. */
static int child_of(const specd_tree_buf *out, int parent, int32_t token) {
    for (int c = 0; c < out->n_nodes; c++)
        if (out->parents[c] == parent && out->tokens[c] == token) return c;
    return -1;
}

/* Merges the model's tree m (NULL: none) and the lookup's tree l into out
 * (empty), as the top describes; map_m and map_l hold each node's place in
 * out (room for m's and l's nodes). */
static void merge(const specd_tree_buf *m, int32_t *map_m, const specd_tree_buf *l,
                  int32_t *map_l, specd_tree_buf *out) {
    for (int i = 0; m && i < m->n_nodes; i++) {
        int par = m->parents[i] >= 0 ? map_m[m->parents[i]] : -1;
        int c = m->parents[i] >= 0 && par < 0 ? -1 : specd_tree_buf_add(out, par, m->tokens[i], m->logq[i]);
        map_m[i] = c;
        if (c < 0) continue;
        out->pcond[c] = m->pcond[i];
        out->src[c] = SPECD_SRC_MODEL;
    }
    for (int j = 0; j < l->n_nodes; j++) {
        map_l[j] = -1;
        int lp = l->parents[j];
        int par = lp >= 0 ? map_l[lp] : -1;
        if (lp >= 0 && par < 0) continue; /* its parent did not fit */
        float s = specd_tree_node_score(l, j);
        int c = child_of(out, par, l->tokens[j]);
        if (c >= 0) {
            if (out->src[c] == SPECD_SRC_MODEL) {
                float sm = specd_tree_node_score(out, c);
                out->pcond[c] = s > sm ? s : sm;
                out->src[c] = SPECD_SRC_BOTH;
            }
        } else {
            float logq = (par >= 0 ? out->logq[par] : 0.0f) + logf(s > 0 ? s : 1e-30f);
            if ((c = specd_tree_buf_add(out, par, l->tokens[j], logq)) < 0) continue;
            out->pcond[c] = s;
            out->src[c] = SPECD_SRC_LOOKUP;
        }
        map_l[j] = c;
    }
}

/* The lookup's job for `job`: its own shape (lookup_*), its session state,
 * into l. */
static specd_draft_job lookup_job(const specd_draft_job *job, void *lookup_state,
                                  specd_tree_buf *l) {
    specd_draft_job lj = *job;
    lj.state = lookup_state;
    if (job->lookup_candidates > 0) lj.candidates = job->lookup_candidates;
    if (job->lookup_depth > 0) lj.depth = job->lookup_depth;
    specd_tree_buf_reset(l);
    l->cap = job->out->cap;
    lj.out = l;
    return lj;
}

static int hybrid_propose(specd_drafter *d, specd_draft_job *jobs, int n, specd_error *err) {
    hybrid_impl *h = d->impl;
    int cap = 1;
    for (int i = 0; i < n; i++)
        if (jobs[i].out->cap > cap) cap = jobs[i].out->cap;
    if (grow_bufs(h, n, cap, err)) return -1;
    /* The model drafts each job's priced shape into its own tree (straight
     * into the job's for rejection sampling, which keeps it whole); the
     * lookup the largest shape into another. */
    int nm = 0, nl = 0;
    for (int i = 0; i < n; i++) {
        hybrid_session *s = jobs[i].state;
        int rej = rejection(&jobs[i]);
        if (!rej) {
            specd_tree_buf_reset(&h->mtb[i]);
            h->mtb[i].cap = jobs[i].out->cap;
        }
        /* depth 0: the driver wants the lookup alone this step (drafter.h,
         * has_lookup) */
        if (jobs[i].depth >= 1 && jobs[i].candidates >= 1) {
            specd_draft_job *mj = &h->mjobs[nm++];
            *mj = jobs[i];
            mj->state = s ? s->model : NULL;
            if (!rej) mj->out = &h->mtb[i];
        }
        if (rej) continue;
        h->ljobs[nl++] = lookup_job(&jobs[i], s ? s->lookup : NULL, &h->ltb[i]);
    }
    if (nm > 0 && specd_drafter_propose(h->model, h->mjobs, nm, err)) return -1;
    if (nl > 0 && specd_drafter_propose(h->lookup, h->ljobs, nl, err)) return -1;
    for (int i = 0; i < n; i++)
        if (!rejection(&jobs[i]))
            merge(&h->mtb[i], h->map_m, &h->ltb[i], h->map_l, jobs[i].out);
    return 0;
}

/* Room in the session's scratch for trees of cap nodes. */
static int grow_session(hybrid_session *s, int cap, specd_error *err) {
    if (cap <= s->cap) return 0;
    specd_tree_buf_free(&s->ltb);
    free(s->map_l);
    s->map_l = NULL;
    s->cap = 0;
    if (specd_tree_buf_init(&s->ltb, cap, 0, err)) return -1;
    if (!(s->map_l = malloc(sizeof(int32_t) * (size_t)cap))) {
        specd_tree_buf_free(&s->ltb);
        return specd_seterr(err, "mlp_ngram drafter: out of memory");
    }
    s->cap = cap;
    return 0;
}

/* A job of depth 0 (the lookup alone) on the caller's thread; any other
 * goes through propose (1). The lookup drafter serializes its own calls. */
static int hybrid_propose_inline(specd_drafter *d, specd_draft_job *job, specd_error *err) {
    hybrid_impl *h = d->impl;
    hybrid_session *s = job->state;
    if ((job->depth >= 1 && job->candidates >= 1) || !s) return 1;
    if (rejection(job)) return 0; /* the lookup has nothing for it (see the top) */
    if (grow_session(s, job->out->cap, err)) return -1;
    specd_draft_job lj = lookup_job(job, s->lookup, &s->ltb);
    if (specd_drafter_propose(h->lookup, &lj, 1, err)) return -1;
    merge(NULL, NULL, &s->ltb, s->map_l, job->out);
    return 0;
}

static int hybrid_session_open(specd_drafter *d, void **state, specd_error *err) {
    hybrid_impl *h = d->impl;
    hybrid_session *s = calloc(1, sizeof *s);
    if (!s) return specd_seterr(err, "mlp_ngram drafter: out of memory");
    if (specd_drafter_session_open(h->model, &s->model, err)) {
        free(s);
        return -1;
    }
    if (specd_drafter_session_open(h->lookup, &s->lookup, err)) {
        specd_drafter_session_close(h->model, s->model);
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static void hybrid_session_close(specd_drafter *d, void *state) {
    hybrid_impl *h = d->impl;
    hybrid_session *s = state;
    if (!s) return;
    specd_drafter_session_close(h->model, s->model);
    specd_drafter_session_close(h->lookup, s->lookup);
    specd_tree_buf_free(&s->ltb);
    free(s->map_l);
    free(s);
}

static void hybrid_destroy(specd_drafter *d) {
    hybrid_impl *h = d->impl;
    if (h) {
        free_bufs(h);
        free(h);
    }
    free(d);
}

static const specd_drafter_ops hybrid_ops = {
    .name = "mlp_ngram",
    .session_open = hybrid_session_open,
    .session_close = hybrid_session_close,
    .propose = hybrid_propose,
    .propose_inline = hybrid_propose_inline,
    .destroy = hybrid_destroy,
};

specd_drafter *specd_hybrid_drafter_create(const specd_hybrid_drafter_opts *o, specd_error *err) {
    if (!o || !o->model || !o->lookup) {
        specd_seterr(err, "mlp_ngram drafter: needs a model drafter and a lookup drafter");
        return NULL;
    }
    specd_drafter *lookup = o->lookup;
    if (lookup->vocab != o->model->vocab) {
        specd_seterr(err, "mlp_ngram drafter: lookup vocab %d, but the model's is %d",
                     lookup->vocab, o->model->vocab);
        return NULL;
    }
    specd_drafter *d = calloc(1, sizeof *d);
    hybrid_impl *h = calloc(1, sizeof *h);
    if (!d || !h) {
        free(d);
        free(h);
        specd_seterr(err, "mlp_ngram drafter: out of memory");
        return NULL;
    }
    h->model = o->model;
    h->lookup = lookup;
    d->ops = &hybrid_ops;
    d->vocab = o->model->vocab;
    d->hidden_size = o->model->hidden_size;
    d->max_batch = o->model->max_batch; /* the lookup takes any batch */
    /* the lookup's reach; the model clamps the depth it is given to its own */
    d->max_depth = lookup->max_depth > o->model->max_depth ? lookup->max_depth
                                                           : o->model->max_depth;
    d->has_lookup = 1;
    d->on_cuda = o->model->on_cuda;
    d->cuda_device = o->model->cuda_device;
    d->impl = h;
    return d;
}
