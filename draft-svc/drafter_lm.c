/* drafter_lm.c - the classic draft model (drafter.h, "draft_lm").
 *
 * A small Llama-family model that shares the target's tokenizer guesses the
 * next tokens autoregressively; the target verifies them. It runs on the
 * same transformer code as the target (target-svc/transformer.h), on the CPU
 * backend, with one KV-cache slot per session.
 *
 * KV bookkeeping. Each session remembers the token ids whose K/V its slot
 * holds (cached[0..n_cached)). The history a job brings is the truth: the
 * prompt and every token the target emitted, the last one being the pending
 * token. On every call the slot is rolled back to the longest common prefix
 * of cached[] and history[0 .. N-1) (N = n_history), i.e. everything except
 * the pending token, and history[prefix .. N) is fed again. Why stop short
 * of the pending token: its logits are what the first draft token is chosen
 * from, and only a forward pass that feeds it produces them, so it is always
 * fed (one row recomputed at worst). Rolling back is free: n_past = prefix,
 * and the rows after it are simply overwritten by the next writes.
 *
 * The drafted tokens are fed too (all but the last, whose successor is not
 * needed), so the slot ends a call holding history + draft[0 .. depth-1).
 * When the target accepts k of them, the next call's common prefix already
 * covers those k and only the target's own token (and the rest of the draft
 * on a full accept) is fed; what the target rejected is rolled back by the
 * same prefix rule. A brand-new session has cached[] empty, so its first
 * call is a prefill of the whole prompt.
 *
 * Batching. One propose() runs every job together: first the catch-up (each
 * job's missing history, ragged, packed into forwards of at most
 * max_tokens tokens; a long prompt is split across several), then one
 * batched single-token decode step per draft depth over the jobs still
 * drafting.
 *
 * One chain per job. `candidates` is ignored: a slot's KV rows hold a single
 * sequence, so drafting siblings would need a tree mask over drafted rows
 * and a copy of the branch point per sibling (or one slot per branch), and
 * the next call's prefix rule could keep only one branch anyway. A chain of
 * `depth` tokens is what this drafter proposes in both modes.
 *
 * Sampling mode. Each node's child is drawn from q = specd_sampling_probs of
 * the draft's logits after the request's logit adjustments along the path
 * (exactly as the target adjusts its own), with the uniform at (seed ^
 * SPECD_DRAFT_RNG_SALT, stream = output index of the drawn node, counter 0),
 * and q is sent sparse (its nonzero entries; the filters make it exactly
 * sparse). One child per node, so "i.i.d. siblings" holds trivially.
 * That is the REJECTION method; with SEED_EXACT (the default, sampling.h)
 * the child is the winner of the race over q with the request's own noise
 * at that index, and no q is sent.
 *
 * Context. A job whose history plus draft would not fit the slot (max_ctx
 * rows) drafts fewer tokens, and none when even the history does not fit:
 * the target may have a longer context than the draft model, and such a
 * session must still decode (plainly), never fail. */
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/model_file.h"
#include "common/util/rng.h"
#include "draft-svc/drafter.h"
#include "common/model/transformer.h"

#define LM_DEFAULT_MAX_BATCH 32
#define LM_DEFAULT_MAX_SESSIONS 16
/* Tokens per forward: a step's catch-up is a few accepted tokens per job, so
 * 16 per job fits a whole batch in one call; 512 lets a new session's
 * prompt prefill in large chunks (longer ones are split). */
#define LM_MIN_FORWARD_TOKENS 512
#define LM_FORWARD_TOKENS_PER_JOB 16

typedef struct lm_session {
    int slot;
    /* Taken by compare-and-swap: requests open and close sessions on their
     * own threads, at any time (a plain test-then-set let two concurrent
     * opens take one slot: ThreadSanitizer, test_draft_svc). */
    atomic_int in_use;
    int32_t *cached; /* [max_ctx] the tokens whose K/V rows 0..n_cached hold */
    int n_cached;
    unsigned stamp;  /* last propose() call that saw it (duplicate check) */
} lm_session;

/* Per-job progress within one propose() call. */
typedef struct lm_job_state {
    lm_session *s;
    int depth;  /* tokens to draft, after the context and tree-capacity caps */
    int fed;    /* history tokens whose K/V are in the slot (catch-up cursor) */
    int node;   /* last chain node, -1 = the pending token */
    float logq; /* log q of the chain so far */
} lm_job_state;

typedef struct lm_impl {
    specd_model_file *m;
    specd_transformer *t;
    int vocab, max_ctx, n_slots, max_jobs, max_tokens;
    lm_session *sessions;  /* [n_slots] */
    int32_t *cached_pool;  /* [n_slots][max_ctx] */
    unsigned stamp;
    /* scratch for one propose() call (not reentrant: the transformer's own
     * buffers are shared by every call anyway) */
    float *logits;         /* [max_jobs][vocab]: row k = active job k */
    float *probs;          /* [vocab] */
    /* a rejection-sampled node's q as sent (specd_draft_q_sparse) */
    int32_t q_ids[SPECD_DRAFT_Q_MAX];
    float q_probs[SPECD_DRAFT_Q_MAX];
    void *sample_scratch;  /* specd_sampling_scratch_size(vocab) */
    void *adjust_scratch;  /* grown to specd_logits_adjust_scratch_size(depth) */
    size_t adjust_cap;
    int32_t *tokens;       /* [max_tokens] */
    specd_seq_input *seqs; /* [max_tokens] */
    int32_t *out_rows;     /* [max_tokens] */
    lm_job_state *js;      /* [max_jobs] */
    int *active;           /* [max_jobs] job indices, in job order */
} lm_impl;

static int lm_session_open(specd_drafter *d, void **state, specd_error *err) {
    lm_impl *lm = d->impl;
    for (int i = 0; i < lm->n_slots; i++) {
        lm_session *s = &lm->sessions[i];
        int free_slot = 0;
        if (!atomic_compare_exchange_strong(&s->in_use, &free_slot, 1)) continue;
        s->n_cached = 0; /* whatever a previous session left is stale */
        *state = s;
        return 0;
    }
    *state = NULL;
    return specd_seterr(err, "draft_lm drafter: all %d KV slots are in use", lm->n_slots);
}

static void lm_session_close(specd_drafter *d, void *state) {
    (void)d;
    lm_session *s = state;
    s->n_cached = 0;
    atomic_store(&s->in_use, 0); /* last: the next owner sees the reset */
}

static int grow_adjust_scratch(lm_impl *lm, int max_path, specd_error *err) {
    size_t need = specd_logits_adjust_scratch_size(max_path);
    if (need <= lm->adjust_cap) return 0;
    void *p = realloc(lm->adjust_scratch, need);
    if (!p) return specd_seterr(err, "draft_lm drafter: out of memory");
    lm->adjust_scratch = p;
    lm->adjust_cap = need;
    return 0;
}

/* Decides what job i will do this call and rolls its slot back. 0 = skip it
 * (its tree stays empty), 1 = draft. */
static int plan_job(lm_impl *lm, specd_draft_job *job, lm_job_state *js) {
    lm_session *s = job->state;
    int n = job->n_history;
    if (!s || !job->history || n < 1 || job->depth < 1 || job->out->cap < 1) return 0;
    /* history rows plus depth-1 fed draft tokens must fit the slot */
    int depth = job->depth;
    if (depth > lm->max_ctx - n + 1) depth = lm->max_ctx - n + 1;
    if (depth > job->out->cap) depth = job->out->cap;
    if (depth < 1) return 0;
    /* the common prefix, never including the pending token (see the top) */
    int lim = s->n_cached < n - 1 ? s->n_cached : n - 1;
    int p = 0;
    while (p < lim && s->cached[p] == job->history[p]) p++;
    /* tokens the slot never saw must be real ids, or the forward pass would
     * fail the whole batch; the target never sends such a history, so this
     * is only a guard */
    for (int i = p; i < n; i++)
        if (job->history[i] < 0 || job->history[i] >= lm->vocab) return 0;
    /* Roll back now, before any forward: should a forward fail, the
     * bookkeeping then claims fewer valid rows than the slot has, never
     * more. */
    s->n_cached = p;
    *js = (lm_job_state){.s = s, .depth = depth, .fed = p, .node = -1, .logq = 0.0f};
    return 1;
}

/* Feeds every active job's missing history (up to and including the
 * pending token), packing jobs into forwards of at most max_tokens tokens.
 * Leaves each job's pending-token logits in row k of lm->logits (k = its
 * index in the active list). */
static int catch_up(lm_impl *lm, specd_draft_job *jobs, int na, specd_error *err) {
    int first = 0; /* first active job not yet finished */
    while (first < na) {
        int used = 0, n_seq = 0, n_out = 0;
        for (int k = first; k < na && used < lm->max_tokens; k++) {
            specd_draft_job *job = &jobs[lm->active[k]];
            lm_job_state *js = &lm->js[lm->active[k]];
            int remaining = job->n_history - js->fed;
            int take = remaining < lm->max_tokens - used ? remaining : lm->max_tokens - used;
            memcpy(lm->tokens + used, job->history + js->fed, sizeof(int32_t) * (size_t)take);
            lm->seqs[n_seq++] = (specd_seq_input){.slot = js->s->slot, .n_past = js->fed,
                                                  .n_new = take};
            used += take;
            if (take == remaining) lm->out_rows[n_out++] = used - 1;
        }
        /* The jobs that finish in this forward are active[first ..
         * first + n_out): every job after the first one in a batch is
         * either finished or the batch's last (cut) job, and a first job
         * that does not finish fills the batch alone. So their logits rows
         * are contiguous from row `first`. */
        specd_batch b = {.n_tokens = used, .tokens = lm->tokens, .n_seqs = n_seq,
                         .seqs = lm->seqs, .n_out = n_out, .out_rows = lm->out_rows,
                         .logits = n_out ? lm->logits + (size_t)first * lm->vocab : NULL};
        if (specd_transformer_forward(lm->t, &b, err)) return -1;
        for (int k = first, q = 0; q < n_seq; k++, q++) {
            lm_job_state *js = &lm->js[lm->active[k]];
            const specd_seq_input *in = &lm->seqs[q];
            memcpy(js->s->cached + in->n_past, jobs[lm->active[k]].history + in->n_past,
                   sizeof(int32_t) * (size_t)in->n_new);
            js->fed = in->n_past + in->n_new;
            js->s->n_cached = js->fed;
        }
        first += n_out;
    }
    return 0;
}

/* Chooses the child of job's current chain end from its logits row (in
 * place: the row is adjusted) and adds it. 0 = added, -1 = the tree buffer
 * or q pool is full (the chain ends where it is). */
static int draft_one(lm_impl *lm, specd_draft_job *job, lm_job_state *js, float *row,
                     int step) {
    const specd_sampling *s = job->sampling;
    specd_tree_buf *out = job->out;
    /* The chain so far is exactly out->tokens[0..step): one node per step,
     * in order. The target adjusts a node's logits with the history counts
     * plus the node's ancestors; so does the draft, so q tracks p. */
    if (s) specd_logits_adjust(s, job->counts, out->tokens, step, row, lm->vocab,
                               lm->adjust_scratch);
    int32_t tok;
    float lp;
    if (!s || s->temperature <= 0.0f) {
        tok = specd_argmax(row, lm->vocab);
        /* log-softmax of the adjusted logits: how sure the draft is, for
         * whoever ranks or stops on logq */
        specd_logprobs(row, lm->vocab, tok, 0, &lp, NULL, NULL);
    } else if (s->method == SPECD_SAMPLING_SEED_EXACT) {
        /* The race over q with the target's own noise (the request's seed,
         * unsalted, at this node's output index): the token the target
         * picks whenever the two races agree. No q: exact-match verify. */
        specd_sampling_probs(s, row, lm->vocab, lm->probs, lm->sample_scratch);
        tok = specd_race_pick(lm->probs, lm->vocab,
                              (specd_race_addr){s->seed, job->position + (uint64_t)step, 0});
        lp = logf(lm->probs[tok]);
    } else {
        specd_sampling_probs(s, row, lm->vocab, lm->probs, lm->sample_scratch);
        /* Draw from (and send) q cut to its most likely tokens: see
         * SPECD_DRAFT_Q_MAX. */
        int nq = specd_draft_q_sparse(lm->probs, lm->vocab, NULL, lm->q_ids, lm->q_probs);
        double u = specd_rng_uniform(s->seed ^ SPECD_DRAFT_RNG_SALT,
                                     job->position + (uint64_t)step, 0);
        /* q goes on the parent before the child exists, so a full pool
         * never leaves a drawn child without its distribution */
        if (specd_tree_buf_set_q(out, js->node, lm->q_ids, lm->q_probs, nq)) return -1;
        int j = specd_sample_from_probs(lm->q_probs, nq, u);
        tok = lm->q_ids[j];
        lp = logf(lm->q_probs[j]);
    }
    js->logq += lp;
    int node = specd_tree_buf_add(out, js->node, tok, js->logq);
    if (node < 0) return -1;
    js->node = node;
    return 0;
}

static int lm_propose(specd_drafter *d, specd_draft_job *jobs, int n, specd_error *err) {
    lm_impl *lm = d->impl;
    if (++lm->stamp == 0) lm->stamp = 1; /* 0 marks "never seen" */
    int na = 0, max_depth = 0;
    for (int i = 0; i < n; i++) {
        lm_session *s = jobs[i].state;
        if (s) {
            /* one slot appears at most once per forward pass */
            if (s->stamp == lm->stamp)
                return specd_seterr(err, "draft_lm drafter: jobs[%d] repeats a session of this "
                                         "batch", i);
            s->stamp = lm->stamp;
        }
    }
    for (int i = 0; i < n; i++) {
        if (!plan_job(lm, &jobs[i], &lm->js[i])) continue;
        lm->active[na++] = i;
        if (lm->js[i].depth > max_depth) max_depth = lm->js[i].depth;
    }
    if (na == 0) return 0;
    if (grow_adjust_scratch(lm, max_depth, err)) return -1;
    if (catch_up(lm, jobs, na, err)) return -1;

    for (int step = 0; na > 0; step++) {
        /* choose every active job's next token from its row, keeping (in
         * order) those that go on; row k belongs to active[k], and k' <= k
         * for the kept ones, so compacting in place never overwrites a row
         * still to be read */
        int nb = 0;
        for (int k = 0; k < na; k++) {
            int i = lm->active[k];
            float *row = lm->logits + (size_t)k * lm->vocab;
            if (draft_one(lm, &jobs[i], &lm->js[i], row, step)) continue;
            if (step + 1 < lm->js[i].depth) lm->active[nb++] = i;
        }
        na = nb;
        if (na == 0) break;
        /* feed the tokens just drafted: one batched decode step */
        for (int k = 0; k < na; k++) {
            int i = lm->active[k];
            lm_job_state *js = &lm->js[i];
            lm->tokens[k] = jobs[i].out->tokens[js->node];
            lm->seqs[k] = (specd_seq_input){.slot = js->s->slot, .n_past = js->s->n_cached,
                                            .n_new = 1};
            lm->out_rows[k] = k;
        }
        specd_batch b = {.n_tokens = na, .tokens = lm->tokens, .n_seqs = na, .seqs = lm->seqs,
                         .n_out = na, .out_rows = lm->out_rows, .logits = lm->logits};
        if (specd_transformer_forward(lm->t, &b, err)) return -1;
        for (int k = 0; k < na; k++) {
            lm_session *s = lm->js[lm->active[k]].s;
            s->cached[s->n_cached++] = lm->tokens[k];
        }
    }
    return 0;
}

static void lm_free_impl(lm_impl *lm) {
    if (!lm) return;
    specd_transformer_free(lm->t);
    specd_model_close(lm->m);
    free(lm->sessions);
    free(lm->cached_pool);
    free(lm->logits);
    free(lm->probs);
    free(lm->sample_scratch);
    free(lm->adjust_scratch);
    free(lm->tokens);
    free(lm->seqs);
    free(lm->out_rows);
    free(lm->js);
    free(lm->active);
    free(lm);
}

static void lm_destroy(specd_drafter *d) {
    lm_free_impl(d->impl);
    free(d);
}

static const specd_drafter_ops lm_ops = {
    .name = "draft_lm",
    .session_open = lm_session_open,
    .session_close = lm_session_close,
    .propose = lm_propose,
    .destroy = lm_destroy,
};

specd_drafter *specd_lm_drafter_create(const specd_lm_drafter_opts *o, specd_error *err) {
    if (!o || !o->path || !o->path[0]) {
        specd_seterr(err, "draft_lm drafter: no model path");
        return NULL;
    }
    if (o->max_sessions < 0 || o->max_ctx < 0 || o->max_batch < 0 || o->n_threads < 0) {
        specd_seterr(err, "draft_lm drafter: max_sessions, max_ctx, max_batch and n_threads must "
                          "not be negative");
        return NULL;
    }
    lm_impl *lm = calloc(1, sizeof *lm);
    specd_drafter *d = calloc(1, sizeof *d);
    if (!lm || !d) {
        free(lm);
        free(d);
        specd_seterr(err, "draft_lm drafter: out of memory");
        return NULL;
    }
    lm->m = specd_model_open(o->path, err);
    if (!lm->m) goto fail;
    lm->n_slots = o->max_sessions ? o->max_sessions : LM_DEFAULT_MAX_SESSIONS;
    lm->max_jobs = o->max_batch ? o->max_batch : LM_DEFAULT_MAX_BATCH;
    /* more jobs than slots can never be ready at once */
    if (lm->max_jobs > lm->n_slots) lm->max_jobs = lm->n_slots;
    lm->max_tokens = lm->max_jobs * LM_FORWARD_TOKENS_PER_JOB;
    if (lm->max_tokens < LM_MIN_FORWARD_TOKENS) lm->max_tokens = LM_MIN_FORWARD_TOKENS;
    specd_transformer_opts topts = {.backend = {.name = "cpu", .n_threads = o->n_threads},
                                    .n_slots = lm->n_slots, .max_ctx = o->max_ctx,
                                    .max_batch = lm->max_tokens};
    lm->t = specd_transformer_create(lm->m, &topts, err);
    if (!lm->t) goto fail;
    lm->vocab = lm->m->hp.vocab_size;
    lm->max_ctx = specd_transformer_max_ctx(lm->t);
    size_t V = (size_t)lm->vocab;
    lm->sessions = calloc((size_t)lm->n_slots, sizeof *lm->sessions);
    lm->cached_pool = malloc(sizeof(int32_t) * (size_t)lm->n_slots * (size_t)lm->max_ctx);
    lm->logits = malloc(sizeof(float) * V * (size_t)lm->max_jobs);
    lm->probs = malloc(sizeof(float) * V);
    lm->sample_scratch = malloc(specd_sampling_scratch_size(lm->vocab));
    lm->tokens = malloc(sizeof(int32_t) * (size_t)lm->max_tokens);
    /* a catch-up forward can hold at most one sequence per job, but sizing
     * these by tokens too costs nothing and needs no argument */
    lm->seqs = malloc(sizeof(specd_seq_input) * (size_t)lm->max_tokens);
    lm->out_rows = malloc(sizeof(int32_t) * (size_t)lm->max_tokens);
    lm->js = malloc(sizeof(lm_job_state) * (size_t)lm->max_jobs);
    lm->active = malloc(sizeof(int) * (size_t)lm->max_jobs);
    if (!lm->sessions || !lm->cached_pool || !lm->logits || !lm->probs ||
        !lm->sample_scratch || !lm->tokens || !lm->seqs || !lm->out_rows ||
        !lm->js || !lm->active) {
        specd_seterr(err, "draft_lm drafter: out of memory");
        goto fail;
    }
    for (int i = 0; i < lm->n_slots; i++)
        lm->sessions[i] = (lm_session){.slot = i,
                                       .cached = lm->cached_pool + (size_t)i * lm->max_ctx};
    d->ops = &lm_ops;
    d->vocab = lm->vocab;
    d->hidden_size = 0; /* conditions on tokens only, never on the target's state */
    d->max_batch = lm->max_jobs;
    /* the pending token takes a row; every other row can hold a draft */
    d->max_depth = lm->max_ctx - 1 > 0 ? lm->max_ctx - 1 : 1;
    /* a chain whose every token depends only on the history and the chain
     * above it, and a slot that follows any history (the prefix rule): the
     * driver may draft ahead on a guessed history (driver.h) */
    d->draft_ahead = 1;
    d->impl = lm;
    return d;
fail:
    lm_free_impl(lm);
    free(d);
    return NULL;
}
