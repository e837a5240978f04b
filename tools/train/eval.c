/* eval.c - greedy speculative decoding of whole prompts in process, checked
 * against plain greedy decoding (see eval.h). */
#include "tools/train/eval.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util/dtype.h"
#include "target-svc/scheduler.h"
#include "target-svc/session.h"
#include "common/model/transformer.h"
#include "common/util/clock.h"

/* The scheduler waits up to this long for every session holding a slot to
 * queue its item before it runs a pass. Each round, every lane holding a
 * slot queues exactly one item, so the wait ends as soon as the last
 * submitting thread is up, with all of them in one pass; the bound only
 * matters when a lane has nothing queued (an error path, or the rest of a
 * split prompt). */
#define EVAL_MAX_WAIT_MS 100
/* Tokens per pass beyond which prompts are prefilled in several passes. */
#define EVAL_MAX_PASS 4096

struct eval_target {
    specd_transformer *tr;
    specd_sched *sched;
    specd_session_limits lim;
    eval_target_opts o;
    int32_t *stop_ids; /* owned copy of o.stop_ids */
    int dim;
};

eval_target *eval_target_create(const specd_model_file *m, const eval_target_opts *o,
                                specd_error *err) {
    if (o->lanes < 1 || o->max_new_tokens < 1 || o->max_prompt < 1 || o->max_tree_tokens < 1 ||
        o->n_stop_ids < 0) {
        specd_seterr(err, "eval: lanes, max_new_tokens, max_prompt and max_tree_tokens must be "
                          ">= 1");
        return NULL;
    }
    /* A slot holds the prompt, every new token and, at the last step, a
     * whole tree past them (its pending token is one of the new tokens). A
     * context shorter than that would end some sessions early with CONTEXT,
     * and a speculative session can overshoot that limit by a tree where
     * plain decoding cannot: the outputs could then differ in length
     * without any bug. So the context must hold it all. */
    long ctx = (long)o->max_prompt + o->max_new_tokens + o->max_tree_tokens + 1;
    if (ctx > m->hp.max_seq_len) {
        specd_seterr(err, "eval: the longest prompt (%d tokens) + %d new tokens + a %d-node tree "
                          "exceed the model context %d",
                     o->max_prompt, o->max_new_tokens, o->max_tree_tokens, m->hp.max_seq_len);
        return NULL;
    }
    /* One pass should hold a round's items without splitting any: every
     * lane may be prefilling its prompt, or sending its pending token and a
     * tree. A split prompt leaves its rest alone in the queue, and the
     * scheduler then waits EVAL_MAX_WAIT_MS for the other lanes first. Trees
     * always fit (they cannot be split); prefills up to EVAL_MAX_PASS tokens
     * in all, beyond which the scheduler's pass buffers (a byte per pair of
     * tokens for the tree masks) grow too large to be worth it. */
    long trees = (long)o->lanes * (1 + o->max_tree_tokens);
    long prefills = (long)o->lanes * o->max_prompt;
    long batch = prefills < EVAL_MAX_PASS ? prefills : EVAL_MAX_PASS;
    if (trees > batch) batch = trees;
    if (batch > EVAL_MAX_PASS * 4) {
        specd_seterr(err, "eval: %d lanes with %d-node trees do not fit one pass of %d tokens",
                     o->lanes, o->max_tree_tokens, EVAL_MAX_PASS * 4);
        return NULL;
    }
    eval_target *t = calloc(1, sizeof *t);
    if (!t || !(t->stop_ids = malloc(sizeof(int32_t) * (size_t)(o->n_stop_ids + 1)))) {
        free(t);
        specd_seterr(err, "eval: out of memory");
        return NULL;
    }
    if (o->n_stop_ids) memcpy(t->stop_ids, o->stop_ids, sizeof(int32_t) * (size_t)o->n_stop_ids);
    t->o = *o;
    t->o.stop_ids = t->stop_ids;
    t->dim = m->hp.dim;
    specd_transformer_opts to = {.backend = o->backend, .n_slots = o->lanes, .max_ctx = (int)ctx,
                                 .max_batch = (int)batch};
    t->tr = specd_transformer_create(m, &to, err);
    if (!t->tr) goto fail;
    specd_sched_opts so = {.n_slots = o->lanes, .max_batch_tokens = (int)batch,
                           .max_wait_ms = EVAL_MAX_WAIT_MS};
    t->sched = specd_sched_create(t->tr, &so, err);
    if (!t->sched) goto fail;
    t->lim = (specd_session_limits){.vocab = m->hp.vocab_size,
                                    .context = specd_transformer_max_ctx(t->tr),
                                    .max_prompt_tokens = o->max_prompt,
                                    .max_tree_tokens = o->max_tree_tokens,
                                    .eos_id = o->eos_id};
    return t;
fail:
    eval_target_free(t);
    return NULL;
}

void eval_target_free(eval_target *t) {
    if (!t) return;
    specd_sched_free(t->sched); /* before the transformer its worker uses */
    specd_transformer_free(t->tr);
    free(t->stop_ids);
    free(t);
}

void eval_output_free(eval_output *o) {
    if (!o) return;
    free(o->ids);
    o->ids = NULL;
    o->n = 0;
}

/* ---- one prompt in flight ---------------------------------------------------- */

typedef struct lane {
    int prompt; /* index of the prompt it decodes; -1 = idle */
    int slot;
    specd_session s;
    specd_work w;
    int32_t *hist; /* the prompt, then every emitted token (the drafter's history) */
    int n_hist;
    float *hidden;      /* the scheduler writes the target's final-norm hidden state */
    float *hidden_wire; /* the same after the fp16 round trip the wire makes */
    int have_hidden;
    int queued; /* w holds an item not yet run (its prefill, or its next step) */
    specd_tree_buf tb;
    void *dstate;
    int has_dstate;
    specd_session_tree_req msg; /* the tree, as the session's core takes it */
    int32_t *toks, *acc, *acc_nodes, *emitted;
} lane;

/* What one run shares with its helpers. */
typedef struct run {
    eval_target *t;
    specd_drafter *d; /* NULL = plain greedy decoding */
    const eval_config *c;
    const eval_prompt *prompts;
    const eval_output *ref; /* NULL = nothing to check against */
    eval_output *out;       /* NULL = outputs not kept */
    eval_stats *st;
    int hist_cap;
} run;

static void lane_free(lane *l) {
    free(l->hist);
    free(l->hidden);
    free(l->hidden_wire);
    specd_tree_buf_free(&l->tb);
    free(l->toks);
    free(l->acc);
    free(l->acc_nodes);
    free(l->emitted);
}

static int lane_alloc(const run *r, lane *l, specd_error *err) {
    int T = r->t->o.max_tree_tokens;
    memset(l, 0, sizeof *l);
    l->prompt = l->slot = -1;
    l->hist = malloc(sizeof(int32_t) * (size_t)r->hist_cap);
    l->hidden = malloc(sizeof(float) * (size_t)r->t->dim);
    l->hidden_wire = malloc(sizeof(float) * (size_t)r->t->dim);
    l->toks = malloc(sizeof(int32_t) * (size_t)(T + 1));
    l->acc = malloc(sizeof(int32_t) * (size_t)T);
    l->acc_nodes = malloc(sizeof(int32_t) * (size_t)T);
    l->emitted = malloc(sizeof(int32_t) * (size_t)(T + 1));
    if (!l->hist || !l->hidden || !l->hidden_wire || !l->toks || !l->acc || !l->acc_nodes ||
        !l->emitted)
        return specd_seterr(err, "eval: out of memory");
    /* greedy trees only: no q pool */
    return r->d ? specd_tree_buf_init(&l->tb, T, 0, err) : 0;
}

/* Ends the lane's prompt: gives back its slot and drafter session. */
static void lane_stop(run *r, lane *l) {
    if (l->prompt < 0) return;
    specd_sched_release_slot(r->t->sched, l->slot);
    if (l->has_dstate) specd_drafter_session_close(r->d, l->dstate);
    specd_session_free(&l->s);
    l->prompt = l->slot = -1;
    l->has_dstate = 0;
}

/* Opens prompt p on an idle lane, as a Verify stream's Open would, and
 * queues its prefill. */
static int lane_start(run *r, lane *l, int p, specd_error *err) {
    eval_target *t = r->t;
    const eval_prompt *pr = &r->prompts[p];
    if (pr->n > t->o.max_prompt)
        return specd_seterr(err, "eval: prompt %d has %d tokens, more than max_prompt %d", p,
                            pr->n, t->o.max_prompt);
    specd_session_init(&l->s, &t->lim);
    /* the session's core directly, greedy */
    specd_session_open_req open = {.prompt_ids = pr->ids,
                                   .n_prompt_ids = (size_t)pr->n,
                                   .max_new_tokens = t->o.max_new_tokens,
                                   .stop_ids = t->stop_ids,
                                   .n_stop_ids = (size_t)t->o.n_stop_ids,
                                   .return_hidden = r->d && r->d->hidden_size > 0};
    specd_sampling_init(&open.sampling);
    open.sampling.temperature = 0.0f;
    if (specd_session_open_plain(&l->s, &open, "open", err)) {
        specd_session_free(&l->s);
        return specd_preferr(err, "eval: prompt %d", p);
    }
    l->slot = specd_sched_acquire_slot(t->sched);
    if (l->slot < 0) { /* cannot happen: one slot per lane */
        specd_session_free(&l->s);
        return specd_seterr(err, "eval: no free KV slot");
    }
    l->prompt = p;
    if (r->d) {
        specd_error derr = {{0}};
        if (specd_drafter_session_open(r->d, &l->dstate, &derr)) {
            lane_stop(r, l);
            /* Serving would decode without drafts; an evaluation that did
             * so would report the wrong speculator. */
            return specd_seterr(err, "eval: %s drafter has no session for prompt %d: %s",
                                r->d->ops->name, p, derr.msg);
        }
        l->has_dstate = 1;
    }
    memcpy(l->hist, pr->ids, sizeof(int32_t) * (size_t)pr->n);
    l->n_hist = pr->n;
    l->have_hidden = 0;
    if (r->out) r->out[p].n = 0;
    memset(&l->w, 0, sizeof l->w);
    l->w.kind = SPECD_WORK_PREFILL;
    l->w.slot = l->slot;
    l->w.tokens = l->s.prompt;
    l->w.n_tokens = l->s.n_prompt;
    l->w.sampling = &l->s.sampling;
    l->w.counts = specd_session_counts(&l->s);
    l->w.position = specd_session_position(&l->s);
    l->w.hidden = open.return_hidden ? l->hidden : NULL;
    l->queued = 1;
    return 0;
}

/* Hands a step's tokens to the session (its stop rules decide how many
 * count), checks them against the reference and keeps them. 1 = the prompt
 * is finished, 0 = it goes on, -1 / EVAL_MISMATCH + err. */
static int lane_take(run *r, lane *l, const int32_t *toks, int n, int n_past_after,
                     specd_error *err) {
    int p = l->prompt, before = l->s.n_out;
    specd_finish fr;
    int kept = specd_session_emit(&l->s, toks, n, n_past_after, &fr);
    const eval_output *ref = r->ref ? &r->ref[p] : NULL;
    for (int i = 0; i < kept; i++) {
        int pos = before + i;
        if (ref && (pos >= ref->n || ref->ids[pos] != toks[i])) {
            if (pos >= ref->n)
                specd_seterr(err, "prompt %d: speculative decoding emitted token %d at output "
                                  "position %d, but plain greedy decoding stopped after %d tokens",
                             p, toks[i], pos, ref->n);
            else
                specd_seterr(err, "prompt %d: output position %d is token %d with speculative "
                                  "decoding but %d with plain greedy decoding",
                             p, pos, toks[i], ref->ids[pos]);
            return EVAL_MISMATCH;
        }
        if (r->out) r->out[p].ids[r->out[p].n++] = toks[i];
        l->hist[l->n_hist++] = toks[i];
    }
    r->st[p].generated += kept;
    if (!fr) return 0;
    if (ref && l->s.n_out != ref->n) {
        specd_seterr(err, "prompt %d: speculative decoding stopped after %d tokens, plain greedy "
                          "decoding after %d", p, l->s.n_out, ref->n);
        return EVAL_MISMATCH;
    }
    return 1;
}

/* The drafter's job for a lane, with the fields draft-svc's driver sets. */
static void lane_job(run *r, lane *l, specd_draft_job *job) {
    const eval_config *c = r->c;
    specd_tree_buf_reset(&l->tb);
    /* Room the session will accept: the pending token and every node need
     * a cache row (specd_session_tree's rule). */
    int room = r->t->lim.context - l->s.n_past - 1;
    if (room < l->tb.cap) l->tb.cap = room > 0 ? room : 0;
    int depth = c->depth < r->d->max_depth ? c->depth : r->d->max_depth;
    *job = (specd_draft_job){
        .state = l->dstate,
        .history = l->hist,
        .n_history = l->n_hist,
        .n_prompt = r->prompts[l->prompt].n,
        .hidden = l->have_hidden ? l->hidden_wire : NULL,
        .sampling = &l->s.sampling,
        .counts = specd_session_counts(&l->s),
        .position = specd_session_position(&l->s),
        .candidates = c->candidates,
        .depth = depth,
        .stop_threshold = c->stop_threshold,
        .min_depth = c->min_depth < depth ? c->min_depth : depth,
        .lookup_candidates = c->lookup_candidates,
        .lookup_depth = c->lookup_depth,
        .out = &l->tb,
    };
}

/* Drafts a tree for every lane past its prefill, in as few drafter calls
 * as its max_batch allows. */
static int draft_all(run *r, lane *lanes, int n_lanes, specd_draft_job *jobs, lane **owners,
                     specd_error *err) {
    int n = 0;
    for (int i = 0; i < n_lanes; i++) {
        lane *l = &lanes[i];
        if (l->prompt < 0 || l->queued) continue;
        l->tb.cap = r->t->o.max_tree_tokens; /* lane_job may lower it for this step */
        lane_job(r, l, &jobs[n]);
        owners[n++] = l;
    }
    int mb = r->d->max_batch > 0 ? r->d->max_batch : 1;
    for (int a = 0; a < n; a += mb) {
        int m = n - a < mb ? n - a : mb;
        if (specd_drafter_propose(r->d, jobs + a, m, err))
            /* serving would decode plainly; a measurement must not */
            return specd_preferr(err, "eval: %s drafter", r->d->ops->name);
    }
    for (int i = 0; i < n; i++) owners[i]->tb.cap = r->t->o.max_tree_tokens;
    return 0;
}

/* Sets up the lane's next item after a finished one: its tree (speculative,
 * once drafted) or its decode step (plain), through the session's checks. */
static int lane_next_item(run *r, lane *l, specd_error *err) {
    specd_session *s = &l->s;
    specd_work *w = &l->w;
    memset(w, 0, sizeof *w);
    w->slot = l->slot;
    w->n_past = s->n_past;
    w->sampling = &s->sampling;
    w->counts = specd_session_counts(s);
    w->position = specd_session_position(s); /* output index of the pending token's child */
    if (!r->d) {
        w->kind = SPECD_WORK_DECODE;
        w->tokens = &s->pending;
        w->n_tokens = 1;
        l->queued = 1;
        return 0;
    }
    l->msg = (specd_session_tree_req){.step = s->step + 1,
                                      .n_tokens = (size_t)l->tb.n_nodes,
                                      .n_parents = (size_t)l->tb.n_nodes,
                                      .tokens = l->tb.tokens,
                                      .parents = l->tb.parents,
                                      .bad_q = -1};
    if (specd_session_tree(s, &l->msg, err))
        return specd_preferr(err, "eval: prompt %d: the target refused the drafted tree",
                             l->prompt);
    int n = s->tree.n_nodes;
    l->toks[0] = s->pending;
    if (n) memcpy(l->toks + 1, s->tree.tokens, sizeof(int32_t) * (size_t)n);
    w->kind = SPECD_WORK_TREE;
    w->tokens = l->toks;
    w->n_tokens = 1 + n;
    w->tree = &s->tree;
    w->accepted = l->acc;
    w->accepted_nodes = l->acc_nodes;
    w->hidden = r->d->hidden_size > 0 ? l->hidden : NULL;
    l->queued = 1;
    return 0;
}

/* Takes a lane's finished item. 1 = its prompt is done, 0 = it goes on
 * (its next item is set up in the next round, after drafting). */
static int lane_done_item(run *r, lane *l, specd_error *err) {
    specd_session *s = &l->s;
    specd_work *w = &l->w;
    eval_stats *st = &r->st[l->prompt];
    int rc, full = 1;
    l->queued = 0;
    st->steps++;
    if (w->kind == SPECD_WORK_PREFILL) {
        rc = lane_take(r, l, &w->next_token, 1, s->n_prompt, err);
    } else if (w->kind == SPECD_WORK_DECODE) {
        rc = lane_take(r, l, &w->next_token, 1, s->n_past + 1, err);
    } else {
        int n_acc = w->n_accepted;
        st->drafted += s->tree.n_nodes;
        st->accepted += n_acc;
        memcpy(l->emitted, l->acc, sizeof(int32_t) * (size_t)n_acc);
        l->emitted[n_acc] = w->next_token;
        s->step = l->msg.step;
        int before = s->n_out;
        rc = lane_take(r, l, l->emitted, n_acc + 1, s->n_past + 1 + n_acc, err);
        full = s->n_out - before == n_acc + 1;
    }
    if (rc) return rc;
    /* The hidden state belongs to the row of the last token only when the
     * step was not cut short (then the prompt is over anyway). */
    l->have_hidden = w->hidden && full;
    if (l->have_hidden)
        for (int i = 0; i < r->t->dim; i++)
            l->hidden_wire[i] = specd_fp16_to_f32(specd_f32_to_fp16(l->hidden[i]));
    return 0;
}

/* ---- one round's items, concurrently -------------------------------------------- */

typedef struct item_run {
    specd_sched *sched;
    specd_work *w;
    int rc;
} item_run;

static void *item_thread(void *arg) {
    item_run *ir = arg;
    ir->rc = specd_sched_run(ir->sched, ir->w);
    return NULL;
}

/* specd_sched_run blocks until its item is done, so each item is submitted
 * from its own thread (the first from this one); the scheduler gathers them
 * into one pass, as it does for concurrent Verify streams. */
static int run_items(item_run *items, pthread_t *th, int n, specd_error *err) {
    int started = 1;
    while (started < n && !pthread_create(&th[started], NULL, item_thread, &items[started]))
        started++;
    if (started == n) item_thread(&items[0]);
    else items[0].rc = SPECD_WORK_FAILED; /* not submitted: the others still finish */
    for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
    if (started < n) return specd_seterr(err, "eval: cannot start a thread");
    for (int i = 0; i < n; i++)
        if (items[i].rc != SPECD_WORK_OK)
            return specd_seterr(err, "eval: target step failed: %s", items[i].w->err.msg);
    return 0;
}

/* ---- the run --------------------------------------------------------------------- */

static int run_all(run *r, int n, double *wall_s, specd_error *err) {
    eval_target *t = r->t;
    int L = t->o.lanes;
    double t0 = specd_now_s();
    memset(r->st, 0, sizeof *r->st * (size_t)n);
    r->hist_cap = t->o.max_prompt + t->o.max_new_tokens + t->o.max_tree_tokens + 1;
    lane *lanes = calloc((size_t)L, sizeof *lanes);
    item_run *items = calloc((size_t)L, sizeof *items);
    pthread_t *th = calloc((size_t)L, sizeof *th);
    specd_draft_job *jobs = calloc((size_t)L, sizeof *jobs);
    lane **owners = calloc((size_t)L, sizeof *owners);
    lane **running = calloc((size_t)L, sizeof *running);
    int rc = -1, n_lanes = 0;
    if (!lanes || !items || !th || !jobs || !owners || !running) {
        specd_seterr(err, "eval: out of memory");
        goto out;
    }
    for (; n_lanes < L; n_lanes++)
        if (lane_alloc(r, &lanes[n_lanes], err)) {
            n_lanes++; /* partly allocated: freed below */
            goto out;
        }
    if (r->out)
        for (int p = 0; p < n; p++) {
            r->out[p].n = 0;
            if (!(r->out[p].ids = malloc(sizeof(int32_t) * (size_t)t->o.max_new_tokens))) {
                specd_seterr(err, "eval: out of memory");
                goto out;
            }
        }
    int next = 0;
    for (;;) {
        for (int i = 0; i < L && next < n; i++)
            if (lanes[i].prompt < 0 && lane_start(r, &lanes[i], next++, err)) goto out;
        if (r->d && draft_all(r, lanes, L, jobs, owners, err)) goto out;
        /* trees are drafted: now the session checks and builds each item */
        int n_run = 0;
        for (int i = 0; i < L; i++) {
            lane *l = &lanes[i];
            if (l->prompt < 0) continue;
            if (!l->queued && lane_next_item(r, l, err)) goto out;
            items[n_run] = (item_run){t->sched, &l->w, 0};
            running[n_run++] = l;
        }
        if (n_run == 0) break;
        if (run_items(items, th, n_run, err)) goto out;
        for (int i = 0; i < n_run; i++) {
            int done = lane_done_item(r, running[i], err);
            if (done < 0) {
                rc = done;
                goto out;
            }
            if (done) lane_stop(r, running[i]);
        }
    }
    rc = 0;
out:
    for (int i = 0; i < n_lanes; i++) {
        lane_stop(r, &lanes[i]);
        lane_free(&lanes[i]);
    }
    if (rc && r->out)
        for (int p = 0; p < n; p++) eval_output_free(&r->out[p]);
    free(lanes);
    free(items);
    free(th);
    free(jobs);
    free(owners);
    free(running);
    if (wall_s) *wall_s = specd_now_s() - t0;
    return rc;
}

int eval_greedy(eval_target *t, const eval_prompt *prompts, int n, eval_output *out,
                eval_stats *st, double *wall_s, specd_error *err) {
    eval_stats *own = st ? NULL : calloc((size_t)(n > 0 ? n : 1), sizeof *own);
    if (!st && !own) return specd_seterr(err, "eval: out of memory");
    static const eval_config plain = {.candidates = 1, .depth = 1};
    run r = {.t = t, .d = NULL, .c = &plain, .prompts = prompts, .out = out,
             .st = st ? st : own};
    int rc = run_all(&r, n, wall_s, err);
    free(own);
    return rc;
}

int eval_spec(eval_target *t, specd_drafter *d, const eval_config *c,
              const eval_prompt *prompts, int n, const eval_output *ref, eval_stats *st,
              double *wall_s, specd_error *err) {
    if (!d || !c || c->candidates < 1 || c->depth < 1 || c->stop_threshold < 0 ||
        c->stop_threshold >= 1 || c->min_depth < 0)
        return specd_seterr(err, "eval: need a drafter, candidates and depth >= 1, and a stop "
                                 "threshold in [0, 1)");
    if (d->vocab != t->lim.vocab)
        return specd_seterr(err, "eval: the %s drafter's vocabulary (%d) is not the target's (%d)",
                            d->ops->name, d->vocab, t->lim.vocab);
    if (d->hidden_size > 0 && d->hidden_size != t->dim)
        return specd_seterr(err, "eval: the %s drafter reads hidden states of %d, the target's "
                                 "are %d", d->ops->name, d->hidden_size, t->dim);
    run r = {.t = t, .d = d, .c = c, .prompts = prompts, .ref = ref, .st = st};
    return run_all(&r, n, wall_s, err);
}
