/* driver_draft.c - drafting one step's tree: the job a drafter gets, the
 * shape (priced or fixed), and pipelined drafting ahead of the target's
 * answer (driver_internal.h). */
#include "draft-svc/driver_internal.h"

#include <stdio.h>
#include <string.h>

#include "common/util/clock.h"
#include "draft-svc/draft_metrics.h"

/* Whether this request's trees are priced (cost mode, no shape of its
 * own): greedy and seed-exact sampled ones, whose output does not depend on
 * the tree. Rejection-sampled requests keep a fixed shape (policy.h). */
int driver_q_priced(const gen *g) {
    const specd_gen_request *q = g->req;
    return q->drafter && !q->candidates && !q->depth &&
           !specd_sampling_is(&q->sampling, SPECD_SAMPLING_REJECTION) &&
           g->env->policy->cost_aware && q->calib;
}

/* The request's stop threshold for SpecDec++ adaptive length. */
static float job_stop(const gen *g) {
    float t = g->req->stop_threshold;
    return t > 0 ? t : t < 0 ? 0.0f : g->env->stop_threshold;
}

/* A drafted depth within what the drafter and the stats can hold. */
static int clamp_depth(const gen *g, int depth) {
    if (depth > g->req->drafter->max_depth) depth = g->req->drafter->max_depth;
    return depth > SPECD_MAX_DRAFT_DEPTH ? SPECD_MAX_DRAFT_DEPTH : depth;
}

/* The most nodes a tree after n_hist tokens may have: what this target
 * takes, and the context it has left (the pending token and every node
 * need a cache row). */
static int tree_cap(const gen *g, const specd_target_info *info, int n_hist) {
    int cap = g->env->max_tree_tokens;
    if (info->max_tree_tokens < cap) cap = info->max_tree_tokens;
    int room = info->context_length - n_hist - 1;
    return room < cap ? room : cap;
}

/* A job drafting after history[0 .. n_history) (its last token the root,
 * whose children are output index `position`) into out; the caller adds
 * what is particular to it (the hidden state, a lookup's shape). */
static specd_draft_job make_job(const gen *g, const int32_t *history, int n_history,
                                uint64_t position, int cand, int depth, specd_tree_buf *out) {
    return (specd_draft_job){
        .state = g->draft_state,
        .history = history,
        .n_history = n_history,
        .n_prompt = g->req->n_prompt,
        .sampling = &g->req->sampling,
        .counts = &g->counts,
        .position = position,
        .candidates = cand,
        .depth = depth,
        .stop_threshold = job_stop(g),
        .min_depth = g->env->min_depth,
        .out = out,
    };
}

/* ---- pipelined drafting (ahead_state: driver_internal.h) ---------------------- */

/* The shape driver_draft() will ask the drafter for next, without its side
 * effects; 0 when it will not call the drafter (a skip, the load table, a
 * collapse's cooldown). The cost rules may still decline after the answer:
 * the tree drafted ahead is then simply not used. */
static int next_shape(const gen *g, int *cand, int *depth) {
    const specd_gen_request *q = g->req;
    int c = q->candidates, d = q->depth;
    if (driver_q_priced(g) && g->member) {
        if (g->price.skip > 0) return 0;
        c = g->price.want_cand;
        d = g->price.want_depth;
    } else {
        if (!c || !d) {
            int pc = 1, pd = 1;
            if (!specd_policy_shape(g->env->policy, g->target_load, &pc, &pd)) return 0;
            if (!c) c = pc;
            if (!d) d = pd;
        }
        if (g->acc.cooldown > 0) return 0;
    }
    *cand = c;
    *depth = d;
    return c >= 1 && d >= 1;
}

/* The tree's most likely path from the root (at each level the child with
 * the highest path log-probability, ties to the lower index) into path[];
 * its length. */
static int likely_path(const specd_tree_buf *tb, int32_t *path) {
    int n = 0, parent = -1;
    while (n < SPECD_MAX_DRAFT_DEPTH) {
        int best = -1;
        for (int i = 0; i < tb->n_nodes; i++)
            if (tb->parents[i] == parent && (best < 0 || tb->logq[i] > tb->logq[best])) best = i;
        if (best < 0) break;
        path[n++] = best;
        parent = best;
    }
    return n;
}

/* While the tree just sent is verified: drafts the step after it on the
 * guess that its most likely path is accepted whole. While Open is
 * answered (opening: no tree in flight, the guess is only the first
 * token), the draft model's prefill of the prompt overlaps the target's. */
void driver_draft_ahead(gen *g, const specd_target_info *info, int opening) {
    ahead_state *a = &g->ahead;
    const specd_gen_request *q = g->req;
    a->valid = a->hit = 0;
    int cand = 1, depth = 1;
    if (!a->on || !g->drafting) return;
    /* Opening, the draft is worth its time even when the first steps will
     * not draft (a session that starts with a skip): it is the draft
     * model's prefill of the prompt, which the next draft would otherwise
     * do on the step's path. */
    if (!next_shape(g, &cand, &depth) && !opening) return;
    a->n_path = opening ? 0 : likely_path(&g->tb, a->path);
    int n_guess = g->n_hist + a->n_path;  /* its last token is the new root */
    depth = clamp_depth(g, depth + 1);    /* + the level that guesses the next token */
    /* the next tree's limits (driver_draft()), plus the next-token level */
    int cap = tree_cap(g, info, n_guess) + cand;
    int room = info->context_length - n_guess - 1;
    if (room < cap) cap = room;
    if (cap > a->tb.cap) cap = a->tb.cap;
    if (depth < 2 || cap < 2) return; /* nothing would be left under the next token */
    memcpy(a->hist + a->n_synced, g->hist + a->n_synced,
           sizeof(int32_t) * (size_t)(g->n_hist - a->n_synced));
    a->n_synced = g->n_hist;
    for (int i = 0; i < a->n_path; i++) a->hist[g->n_hist + i] = g->tb.tokens[a->path[i]];
    specd_tree_buf_reset(&a->tb);
    int alloc_cap = a->tb.cap;
    a->tb.cap = cap;
    specd_draft_job job =
        make_job(g, a->hist, n_guess, (uint64_t)(g->n_gen + a->n_path), cand, depth, &a->tb);
    specd_error err = {{0}};
    int rc = specd_batcher_run(q->batcher, &job, &err);
    a->tb.cap = alloc_cap;
    if (rc || a->tb.n_nodes == 0) return; /* a failure shows again in the next driver_draft() */
    a->base_hist = g->n_hist;
    a->cand = cand;
    a->depth = depth;
    a->stop = job.stop_threshold;
    a->valid = 1;
    g->st->pipelined_drafts++;
}

/* On the answer to the tree in flight: whether it confirmed the guess. */
void driver_check_ahead(gen *g, const Specd__V1__VerifyResponse *r) {
    ahead_state *a = &g->ahead;
    a->hit = 0;
    if (!a->valid || (int)r->n_accepted != a->n_path) return;
    for (int i = 0; i < a->n_path; i++)
        if (r->accepted_nodes[i] != a->path[i]) return;
    for (int i = 0; i < a->tb.n_nodes; i++)
        if (a->tb.parents[i] < 0 && a->tb.tokens[i] == r->next_token) {
            a->hit = 1;
            a->hit_node = i;
            return;
        }
}

/* Fills job->out with the subtree of the tree drafted ahead that the answer
 * confirmed, when that is the tree the job asks for (its shape, within the
 * job's depth and capacity). 1 = adopted. */
static int adopt_ahead(gen *g, int hit, const specd_draft_job *job) {
    ahead_state *a = &g->ahead;
    if (!hit || g->n_hist != a->base_hist + a->n_path + 1 || job->candidates != a->cand ||
        job->depth > a->depth - 1 || job->stop_threshold != a->stop)
        return 0;
    specd_tree_buf *tb = &a->tb, *out = job->out;
    for (int i = 0; i < tb->n_nodes; i++) a->map[i] = -2; /* not adopted */
    a->map[a->hit_node] = -1;                             /* the new root */
    float base = tb->logq[a->hit_node];
    /* parents come before their children (tree_builder.h) */
    for (int i = a->hit_node + 1; i < tb->n_nodes; i++) {
        int par = tb->parents[i];
        if (par < 0 || a->map[par] == -2 || tb->depth[i] - 1 > job->depth) continue;
        int k = specd_tree_buf_add(out, a->map[par], tb->tokens[i], tb->logq[i] - base);
        if (k < 0) break; /* full: the rest is cut, as a drafter's own tree would be */
        out->pcond[k] = tb->pcond[i];
        out->src[k] = tb->src[i];
        a->map[i] = k;
    }
    if (out->n_nodes == 0) return 0;
    g->st->pipelined_hits++;
    return 1;
}

/* Drafts the next tree into g->tb (left empty for a plain step). */
void driver_draft(gen *g, const specd_target_info *info) {
    const specd_gen_request *q = g->req;
    if (!q->drafter) return; /* g->tb was never allocated: it stays empty */
    specd_tree_buf_reset(&g->tb);
    g->price.empty_draft = 0;
    /* a tree drafted ahead serves this step or none */
    int ahead_hit = g->ahead.valid && g->ahead.hit;
    g->ahead.valid = g->ahead.hit = 0;
    if (!g->drafting) return;
    int cand = q->candidates, depth = q->depth;
    int look_cand = 0, look_depth = 0; /* a lookup's shape: the job's lookup_* */
    /* Greedy requests without a shape of their own, in cost mode, are
     * priced (tree_choice.h); everything else gets a fixed shape. */
    int priced = driver_q_priced(g) && g->member;
    /* A drafter with a lookup part (mlp_ngram) drafts that part on every
     * priced step: it costs microseconds, and only the rows of it that the
     * price keeps cost the target anything. The skip and could-pay rules
     * below are about the model's part, which costs drafting time: when
     * they say no, the step drafts the lookup alone (model_off). Running
     * the model anyway cost 13-16% of throughput at 4 and 16 streams,
     * where the price kept almost nothing of its trees. */
    int model_off = 0;
    if (priced) {
        int look = 0;
        if (g->price.skip > 0) {
            g->price.skip--;
            model_off = 1;
        } else {
            /* a look after a skip drafts whatever the estimate says (only
             * a tree sent shows how this session's text accepts now),
             * unless even a sure node would not pay */
            look = g->price.look;
            g->price.look = 0;
        }
        g->price.looking = 0;
        specd_tree_price pr;
        driver_price_of_step(g, &pr);
        float p1 = g->price.p1 >= 0 ? g->price.p1
                                    : specd_accept_calib_first(
                                          g->req->calib,
                                          g->price.scale * specd_accept_calib_bias(
                                                               g->req->calib, pr.sessions));
        /* a look too, if not even a sure node could pay at this load;
         * but a look of a session alone in the pass always drafts (and
         * sends a node, driver_price_tree): the price itself may be what is
         * wrong, a cost point measured high during a burst on shared
         * cores, and only a pass of that size measures it again (a CI run
         * under parallel tests drafted nothing on a text that drafts at
         * tau 4.8). Looks come after 1, 2, 4 ... 64 plain steps (64 at
         * once where the load says no: driver_skip_drafting). */
        if (!model_off && !(look && pr.sessions == 1) &&
            !specd_tree_could_pay(look ? SPECD_P_MAX : p1, &pr)) {
            /* the load's verdict when not even a sure node could pay */
            driver_skip_drafting(&g->price, pr.sessions > 1 &&
                                                (look || !specd_tree_could_pay(SPECD_P_MAX, &pr)));
            model_off = 1;
        }
        if (model_off && !q->drafter->has_lookup) {
            g->st->plain_by_cost++;
            specd_draft_metrics_spec_off(SPECD_SPEC_OFF_COST);
            return;
        }
        g->price.looking = model_off ? 0 : look;
        cand = g->price.want_cand;
        depth = g->price.want_depth;
        /* a lookup costs nothing per level: the largest shape, and the
         * price keeps what pays */
        look_cand = g->env->policy->max_candidates;
        look_depth = g->env->policy->max_depth;
    } else if (!cand || !depth) {
        int pc = 1, pd = 1;
        /* A rejection-sampled request's shape must not follow the load, or
         * its seed would not reproduce (policy.h). Seed-exact output does
         * not depend on the tree, so it follows the load like greedy. */
        int shaped = specd_sampling_is(&q->sampling, SPECD_SAMPLING_REJECTION)
                         ? specd_policy_sampled_shape(g->env->policy, g->target_load, &pc, &pd)
                         : specd_policy_shape(g->env->policy, g->target_load, &pc, &pd);
        if (!shaped) {
            specd_draft_metrics_spec_off(SPECD_SPEC_OFF_LOAD);
            return;
        }
        if (!cand) cand = pc;
        if (!depth) depth = pd;
    }
    if (!priced && !specd_accept_allows(g->env->policy, &g->acc)) {
        specd_draft_metrics_spec_off(SPECD_SPEC_OFF_COLLAPSE);
        return;
    }
    if (q->drafter->hidden_size > 0 && !g->have_hidden) return;
    depth = clamp_depth(g, depth);
    if (look_cand < cand) look_cand = cand;
    look_depth = clamp_depth(g, look_depth < depth ? depth : look_depth);
    int cap = tree_cap(g, info, g->n_hist);
    if (model_off) cand = depth = 0; /* the lookup's part only */
    if (cap < 1 || (depth < 1 && !(q->drafter->has_lookup && look_depth >= 1))) return;
    int alloc_cap = g->tb.cap;
    g->tb.cap = cap < alloc_cap ? cap : alloc_cap;
    specd_draft_job job = make_job(g, g->hist, g->n_hist, (uint64_t)g->n_gen, cand, depth, &g->tb);
    job.hidden = g->have_hidden ? g->hidden : NULL;
    job.lookup_candidates = look_cand;
    job.lookup_depth = look_depth;
    specd_error err = {{0}};
    double draft_us = 0; /* a tree drafted ahead took none of this step's time */
    if (!adopt_ahead(g, ahead_hit, &job)) {
        double t0 = specd_now_ms();
        /* a lookup on this thread; a model's draft in the next batch */
        int rc = specd_drafter_propose_inline(q->drafter, &job, &err);
        if (rc == 1) rc = specd_batcher_run(q->batcher, &job, &err);
        if (rc) {
            /* A drafter failure costs speed, not correctness: decode plainly. */
            fprintf(stderr, "draft-svc: %s drafter: %s\n", q->drafter->ops->name, err.msg);
            specd_tree_buf_reset(&g->tb);
        }
        draft_us = (specd_now_ms() - t0) * 1e3;
    }
    g->tb.cap = alloc_cap;
    if (priced && g->tb.n_nodes > 0) {
        driver_price_tree(g, draft_us);
    } else if (model_off) { /* the lookup found nothing either */
        g->st->plain_by_cost++;
        specd_draft_metrics_spec_off(SPECD_SPEC_OFF_COST);
    }
    /* drafted, and nothing goes out: nothing found, or nothing paid */
    g->price.empty_draft = priced && !model_off && g->tb.n_nodes == 0;
    if (g->price.empty_draft) driver_price_note_empty(g, draft_us);
}

