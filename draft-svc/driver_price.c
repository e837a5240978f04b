/* driver_price.c - cost-aware trees: what a step costs this session, which
 * nodes of a drafted tree pay for their rows, and when drafting pays at all
 * (driver_internal.h; the arithmetic is tree_choice.h's). */
#include "draft-svc/driver_internal.h"

#include <stdlib.h>
#include <string.h>

#include "draft-svc/draft_metrics.h"

/* ---- cost-aware trees (tree_choice.h) ----------------------------------------- */


/* Weights of the newest step in the smoothed times and the gain. */
#define PRICE_ALPHA 0.2
/* Drafted steps a session needs behind it before what they won judges
 * drafting (driver_price_learn). */
#define RUN_PAYS_MIN_STEPS 8
/* Every this many priced steps the draft goes one level and one column
 * past what was kept (driver_price_tree). */
#define EXPLORE_EVERY 4

int driver_price_init(price_state *ps, int cap, const specd_policy *pol) {
    memset(ps, 0, sizeof *ps);
    ps->score = malloc(sizeof(float) * (size_t)cap);
    ps->p_path = malloc(sizeof(float) * (size_t)cap);
    ps->rank = malloc((size_t)cap);
    ps->keep = malloc((size_t)cap);
    ps->levels = malloc(sizeof(int32_t) * (size_t)cap);
    ps->p_alt = malloc(sizeof(float) * (size_t)cap);
    ps->keep_alt = malloc((size_t)cap);
    ps->keep_shape = malloc((size_t)cap);
    ps->scale = 1.0f;
    ps->p1 = -1.0f;
    ps->gain = 1.0;
    ps->backoff = 1;
    /* start small: the shape grows by exploring (driver_price_tree) */
    ps->want_cand = pol->max_candidates > 2 ? 2 : pol->max_candidates > 0 ? pol->max_candidates : 1;
    ps->want_depth = pol->max_depth > 2 ? 2 : pol->max_depth > 0 ? pol->max_depth : 1;
    return ps->score && ps->p_path && ps->rank && ps->keep && ps->levels && ps->p_alt &&
                   ps->keep_alt && ps->keep_shape
               ? 0
               : -1;
}

void driver_price_free(price_state *ps) {
    free(ps->score);
    free(ps->p_path);
    free(ps->rank);
    free(ps->keep);
    free(ps->levels);
    free(ps->p_alt);
    free(ps->keep_alt);
    free(ps->keep_shape);
}

/* What the next pass will cost us: the target's curve as this draft-svc
 * keeps it, the load and the others' rows from the last step, and our own
 * overhead. */
void driver_price_of_step(const gen *g, specd_tree_price *pr) {
    const price_state *ps = &g->price;
    pr->sessions = g->target_load > 0 ? g->target_load : 1;
    specd_tpool_member_cost(g->member, pr->sessions > 1, &pr->cost);
    pr->other_tokens = pr->sessions > 1 ? specd_tree_other_rows(ps->batch_tokens, ps->sent_rows,
                                                                ps->prompt_tokens)
                                        : 0;
    /* the others' draft nodes in the last pass, and what they will add */
    int own_nodes = ps->sent_rows > 1 ? ps->sent_rows - 1 : 0;
    int other_drafts = pr->sessions > 1 ? ps->draft_tokens - own_nodes : 0;
    pr->other_expected =
        other_drafts > 0 ? other_drafts * specd_accept_calib_yield(g->req->calib, pr->sessions)
                         : 0;
    /* A lone session's step time outside the pass (the round trip, the
     * draft side's work) leaves the target idle, so a bigger tree spreads
     * it over more tokens; alone, a declined tree is mostly a single plain
     * step that pays it too. With others in the pass, the target without
     * plain runs spends that time on their passes, and our overhead was
     * mostly waiting for one of them: counting it for both kinds of step
     * priced trees as cheap under load (at 4 and 16 sessions tau rose to
     * 1.1-1.2 while throughput fell 20%). A target with plain runs has the
     * others' plain steps queued at once, so under load the pass waits for
     * our tree (batching.max_wait) and a declining session goes on in runs
     * with no round trip: the overhead is what a tree step costs beyond a
     * plain one. Counted as 0 there, trees that paid for their rows on
     * paper ran at 0.89-1.04x of plain at 4 streams (docs/BENCHMARKS.md,
     * twenty-seventh session). */
    pr->plain_runs = g->max_plain > 0 && pr->sessions > 1;
    pr->overhead_us = pr->sessions > 1 && !pr->plain_runs ? 0 : ps->overhead_us;
    pr->stage_us = ps->draft_one_us > 0 ? ps->draft_one_us
                                        : specd_accept_calib_stage(g->req->calib);
}

/* Decodes plainly for the next `backoff` steps (1, 2, 4 ... DRIVER_MAX_SKIP while
 * drafting keeps not paying), then drafts once to look. A skip for the
 * load is the longest at once: where not even a sure node pays for its row
 * in a loaded pass, no text would, so doubling from 1 only bought looks
 * that could not send anything, each a round trip that leaves this
 * session out of a pass and makes the others' pass wait for it
 * (batching.max_wait): 5.5-7.5 steps sent per 64-token request at 4 and 16
 * streams against plain decoding's 2, and 2.1-3.8 with this
 * (docs/BENCHMARKS.md, thirty-seventh session). A look after it, or an
 * earlier answer that drafting pays (backoff back to 1), starts over. */
void driver_skip_drafting(price_state *ps, int for_load) {
    if (for_load) ps->backoff = DRIVER_MAX_SKIP;
    ps->skip = ps->backoff;
    ps->backoff = ps->backoff * 2 < DRIVER_MAX_SKIP ? ps->backoff * 2 : DRIVER_MAX_SKIP;
    ps->look = 1;
}

/* The depth (levels, SPECD_MAX_DRAFT_DEPTH at most) and the node count of
 * the widest level of a tree's drafted part, the part a drafter pays for
 * per level: every node but a lookup's (tree_builder.h), whose shape is
 * not priced (a hybrid drafter's lookup always gets the policy's largest
 * shape, driver_draft()). Only the nodes keep marks when keep is given, and then
 * also the highest path chance at the deepest level (*p_deep) and the
 * lowest at the widest level (*p_wide): what one more level or one more
 * sibling there would build on. All 0 when there is none. */
static void tree_shape(const specd_tree_buf *tb, const uint8_t *keep, const float *p_path,
                       int *deepest, int *widest, float *p_deep, float *p_wide) {
    int width[SPECD_MAX_DRAFT_DEPTH + 1] = {0}, wide_at = 0;
    *deepest = *widest = 0;
    for (int i = 0; i < tb->n_nodes; i++) {
        if ((keep && !keep[i]) || tb->src[i] == SPECD_SRC_LOOKUP) continue;
        int d = tb->depth[i] < SPECD_MAX_DRAFT_DEPTH ? tb->depth[i] : SPECD_MAX_DRAFT_DEPTH;
        if (++width[d] > *widest) *widest = width[d], wide_at = d;
        if (d > *deepest) *deepest = d;
    }
    if (!keep) return;
    *p_deep = *p_wide = 0;
    for (int i = 0; i < tb->n_nodes; i++) {
        if (!keep[i] || tb->src[i] == SPECD_SRC_LOOKUP) continue;
        int d = tb->depth[i] < SPECD_MAX_DRAFT_DEPTH ? tb->depth[i] : SPECD_MAX_DRAFT_DEPTH;
        if (d == *deepest && p_path[i] > *p_deep) *p_deep = p_path[i];
        if (d == wide_at && (*p_wide == 0 || p_path[i] < *p_wide)) *p_wide = p_path[i];
    }
}

/* Learns the drafter's time per tree level from a draft of `levels` levels
 * that took draft_us. Not from a session's first draft: that one also
 * builds the drafter's state for the request (a suffix structure over the
 * prompt, the first hidden state) and once took 42 ms where the next ones
 * took 0.05 ms; that single sample priced every tree, and every look,
 * out of the session (tau 1.00 on a text that drafts at tau 4.8). A later
 * draft preempted on a busy core counts as at most SPECD_DRAFT_OUTLIER_X
 * times the estimate. Until its own second draft a session prices with the
 * drafter-wide estimate, every session's drafts smoothed. */
static void note_draft_time(gen *g, double draft_us, int levels) {
    price_state *ps = &g->price;
    if (levels <= 0 || ps->priced_steps == 0) return;
    double one = draft_us / levels;
    ps->draft_one_us = specd_draft_time_smooth(ps->draft_one_us, one, PRICE_ALPHA);
    specd_accept_calib_note_stage(g->req->calib, one);
}

/* Folds a priced step into the session's verdict on drafting: the gain of
 * the step as sent (pick: its rate without draft time) against base_rate
 * (a plain step's, or a lookup part's alone, driver_price_tree), the draft's own
 * time counted once for every level drafted; a smoothed gain below 1 skips
 * the drafter for a while (driver_skip_drafting). */
/* Whether what this session's drafting actually won says plain runs pay
 * better (driver_price_run_pays): alone, with runs offered, once
 * RUN_PAYS_MIN_STEPS drafted steps say something. */
static int drafting_lost(gen *g) {
    return g->target_load <= 1 && g->max_plain > 0 &&
           g->price.look_steps >= RUN_PAYS_MIN_STEPS && driver_price_run_pays(g);
}

static void judge_drafting(gen *g, const specd_tree_price *pr, const specd_tree_pick *pick,
                           double base_rate, int drafted_deep) {
    price_state *ps = &g->price;
    double gain = 1.0;
    if (base_rate > 0 && pick->rate > 0) {
        double tokens = specd_tree_base_tokens(pr) + pick->expected;
        gain = tokens / (tokens / pick->rate + pr->stage_us * drafted_deep) / base_rate;
    }
    ps->gain = (1 - PRICE_ALPHA) * ps->gain + PRICE_ALPHA * gain;
    specd_accept_calib_note_gain(g->req->calib, pr->sessions, gain);
    if (ps->gain < 1.0) {
        driver_skip_drafting(ps, 0);
        ps->gain = 1.0; /* the next look starts without the old verdict */
    } else if (gain >= 1.0 && !drafting_lost(g)) {
        /* (a prediction that pays does not undo the backoff while what
         * drafting actually won says runs pay: driver_price_learn) */
        ps->backoff = 1;
    }
}

/* Cuts g->tb to the tree worth its verification time (maybe nothing) and
 * decides whether the next steps should draft at all: drafting itself takes
 * time, so when the smoothed gain of the best tree, counting the draft
 * time, stays below a plain step's rate, the session decodes plainly for a
 * while (1, 2, 4 ... DRIVER_MAX_SKIP steps) and then drafts again to look. */
void driver_price_tree(gen *g, double draft_us) {
    price_state *ps = &g->price;
    specd_tree_buf *tb = &g->tb;
    int drafted_deep, drafted_wide;
    tree_shape(tb, NULL, NULL, &drafted_deep, &drafted_wide, NULL, NULL);
    note_draft_time(g, draft_us, drafted_deep);
    int n = tb->n_nodes;
    specd_tree_price pr;
    driver_price_of_step(g, &pr);
    /* the drafter's sent-tree bias at this load (tree_choice.h) */
    float bias = specd_accept_calib_bias(g->req->calib, pr.sessions);
    specd_tree_scores(tb, ps->score, ps->rank);
    specd_accept_estimate(g->req->calib, tb, ps->score, ps->rank, ps->scale * bias,
                          ps->p_path);
    /* the session's first-node chance for the next pre-draft check: the
     * favourite child of the root, as estimated here (score, calibration
     * and this session's scale); the model's, since that check is about
     * the drafting that costs time (a lookup's part is drafted anyway) */
    for (int i = 0; i < n; i++)
        if (tb->parents[i] < 0 && ps->rank[i] == 0 && tb->src[i] != SPECD_SRC_LOOKUP)
            ps->p1 = ps->p1 >= 0 ? 0.5f * ps->p1 + 0.5f * ps->p_path[i] : ps->p_path[i];
    /* Two choices. What to send: the drafting of this tree is done, so its
     * time is spent whatever is sent, and a node goes out when it pays for
     * its row in the pass (the price with no stage time). What to draft
     * again: a tree drafted every step costs its levels' stages every
     * step, so the shape to keep drafting is the best tree with them
     * counted (pick). Sending only what paid for its stage as well priced
     * out first nodes of chance 0.13-0.23 at one stream (the bar without
     * and with the stage on a traced curve) whose draft had
     * already been paid (the default ran 1.07-1.17x plain where always
     * sending a fixed 1x1 ran 1.15-1.20x, docs/BENCHMARKS.md). */
    specd_tree_pick pick, send;
    specd_tree_price sunk = pr;
    sunk.stage_us = 0;
    for (int i = 0; i < n; i++) ps->levels[i] = tb->src[i] == SPECD_SRC_LOOKUP ? 0 : tb->depth[i];
    specd_tree_choose(ps->p_path, tb->depth, ps->levels, n, &pr, ps->keep_shape, &pick);
    specd_tree_choose(ps->p_path, tb->depth, ps->levels, n, &sunk, ps->keep, &send);
    /* What drafting is judged against: a plain step, or for a drafter
     * with a lookup part the best tree of that part alone (the nodes the
     * lookup proposed, BOTH included, under parents it proposed too),
     * since the lookup is drafted anyway and what the skip rules decide is
     * whether the model's drafting adds to it. Judged against plain, a
     * model whose trees the price discarded kept drafting whenever the
     * lookup's paid: 7-8% of throughput at 4 streams. */
    double base_rate = send.plain_rate;
    if (g->req->drafter->has_lookup) {
        for (int i = 0; i < n; i++) {
            int par = tb->parents[i];
            int in = tb->src[i] != SPECD_SRC_MODEL && (par < 0 || ps->p_alt[par] > 0);
            ps->p_alt[i] = in ? ps->p_path[i] : 0.0f;
        }
        specd_tree_pick alt;
        specd_tree_choose(ps->p_alt, tb->depth, ps->levels, n, &sunk, ps->keep_alt, &alt);
        if (alt.rate > base_rate) base_rate = alt.rate;
    }
    /* A look that the estimate would prune to nothing still sends the
     * drafter's favourite first node: only a node sent shows how this
     * session's text accepts (the scale learns from answers, and a
     * session whose calibration comes from other text would otherwise
     * never find out that its own text drafts well: a 24-token repetitive
     * text stayed at tau 1.00). One extra row per look, and looks come
     * after 1, 2, 4 ... 64 plain steps. Only while the session is alone in
     * the pass: with others there the row delays every one of them (on
     * this CPU one more row adds ~19% to a pass of 4), and the shared
     * calibration already learns from all their trees. */
    ps->sent_look = 0;
    int alone = pr.sessions == 1;
    if (ps->looking && alone && send.n_keep == 0) {
        for (int i = 0; i < n && !ps->sent_look; i++)
            if (tb->parents[i] < 0 && ps->rank[i] == 0) ps->keep[i] = ps->sent_look = 1;
    }
    ps->looking = 0;
    /* Every EXPLORE_EVERY-th priced step also sends the best node that the
     * price left out. The cost curve and the calibration learn only from
     * steps sent, so a point of either measured high once would never be
     * measured again and would hold the tree at the size below it: with a
     * pass that shared its cores, 3 rows were priced at 1.5x 2 rows, and a
     * chain of 0.98-likely nodes was cut to one node for the rest of the
     * request. The best left-out node has its parent kept (path chances
     * only fall with depth, ties go to the shallower node). Alone only, as
     * above: a shared pass's size varies with the others' trees, so its
     * curve points are measured anyway. It is the step after the one that
     * chose a grown shape to explore (below), the step that drafted it:
     * the node the exploring draft added goes out and is measured. (On the
     * exploring step itself, as first written, the extra node came from
     * the old shape and the explored level the next step drafted was
     * mostly priced out unsent, its stage spent for nothing.) */
    int explore_step = ps->priced_steps > 0 && ps->priced_steps % EXPLORE_EVERY == 0;
    if (explore_step && alone && send.n_keep > 0 && send.n_keep < n) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!ps->keep[i] && (best < 0 || ps->p_path[i] > ps->p_path[best] ||
                                 (ps->p_path[i] == ps->p_path[best] &&
                                  tb->depth[i] < tb->depth[best])))
                best = i;
        if (best >= 0 && (tb->parents[best] < 0 || ps->keep[tb->parents[best]]))
            ps->keep[best] = 1;
    }
    int n_kept = 0;
    for (int i = 0; i < n; i++) n_kept += ps->keep[i] != 0;
    int deepest, widest;
    float p_deep, p_wide;
    tree_shape(tb, ps->keep_shape, ps->p_path, &deepest, &widest, &p_deep, &p_wide);
    if (n_kept < n) specd_tree_buf_prune(tb, ps->keep);
    /* this step's own cost, for driver_price_run_pays (counted with the
     * step in driver_price_learn, or driver_price_note_empty if nothing
     * is sent) */
    ps->step_extra_us = draft_us;
    if (tb->n_nodes > 0) {
        int base = pr.other_tokens + 1;
        double rows = specd_step_cost_at(&pr.cost, base + tb->n_nodes) -
                      specd_step_cost_at(&pr.cost, base);
        if (rows > 0) ps->step_extra_us += rows;
    }
    /* A step where the model did not draft (a lookup's part only) says
     * nothing about it: the skip rules and its shape carry on as they
     * were. */
    int model_drafted = drafted_deep > 0 || !g->req->drafter->has_lookup;
    if (model_drafted) judge_drafting(g, &pr, &send, base_rate, drafted_deep);
    /* draft next time the shape worth drafting (pick), and on every EXPLORE_EVERY-th
     * priced step one deeper or one wider, in turn (within max_shape), so
     * the calibration keeps learning what the next node would earn.
     * Drafting one more level and column every step (what this did first)
     * cost the drafter twice the nodes that were kept: on two shared cores
     * 1.3-1.8 ms of a 7-10 ms step, most of what a kept node earned. */
    const specd_policy *pol = g->env->policy;
    /* A dimension kept whole (every drafted level, or the widest level's
     * every node) grows at once where its next node is likely to pay for
     * its row and stage (specd_tree_break_even): a child's chance taken as
     * its parent's path chance times the session's first-node chance (a
     * conditional acceptance), a sibling's as half its weakest kept
     * sibling's (siblings come in falling order). Growing whenever a
     * dimension was kept whole made the mlp drafter alternate 1x1 and 2x2
     * drafts at one stream, each 2x2 taking 2.5x a 1x1's draft time and
     * mostly cut back to one node (tau 1.46 either way; the default shape
     * 1.14x plain where a fixed 1x1 ran 1.19x, docs/BENCHMARKS.md). */
    int explore = ++ps->priced_steps % EXPLORE_EVERY == 0;
    int explore_deep = explore && ps->priced_steps / EXPLORE_EVERY % 2;
    const float pc = ps->p1 >= 0 ? ps->p1 : 0.5f;
    int grow_deep = deepest >= drafted_deep &&
                    p_deep * pc > specd_tree_break_even(&pr, &pick, 1);
    int grow_wide = widest >= drafted_wide &&
                    0.5f * p_wide > specd_tree_break_even(&pr, &pick, 0);
    int deeper = deepest == 0 || explore_deep || grow_deep;
    int wider = deepest == 0 || (explore && !explore_deep) || grow_wide;
    if (model_drafted) {
        ps->want_cand = widest + wider < pol->max_candidates ? widest + wider : pol->max_candidates;
        ps->want_depth = deepest + deeper < pol->max_depth ? deepest + deeper : pol->max_depth;
        if (ps->want_cand < 1) ps->want_cand = 1;
        if (ps->want_depth < 1) ps->want_depth = 1;
    }
    /* what the answer will be checked against: the kept tree's scores */
    if (tb->n_nodes > 0) {
        specd_tree_scores(tb, ps->score, ps->rank);
        specd_accept_estimate(g->req->calib, tb, ps->score, ps->rank, ps->scale * bias,
                              ps->p_path);
        ps->predicted = 0;
        for (int i = 0; i < tb->n_nodes; i++) ps->predicted += ps->p_path[i];
        specd_accept_estimate(g->req->calib, tb, ps->score, ps->rank, ps->scale, ps->p_path);
        ps->predicted_unbiased = 0;
        for (int i = 0; i < tb->n_nodes; i++) ps->predicted_unbiased += ps->p_path[i];
        ps->sent_sessions = pr.sessions;
        specd_accept_estimate(g->req->calib, tb, ps->score, ps->rank, 1.0f, ps->p_path);
        ps->predicted_raw = 0;
        for (int i = 0; i < tb->n_nodes; i++) ps->predicted_raw += ps->p_path[i];
        ps->active = 1;
    } else {
        g->st->plain_by_cost++;
        specd_draft_metrics_spec_off(SPECD_SPEC_OFF_COST);
    }
}

/* After the answer to a priced tree: the calibration learns which nodes
 * were accepted, and the session's scale follows how its trees do against
 * the calibrated prediction. */
void driver_price_learn(gen *g, const Specd__V1__VerifyResponse *r) {
    price_state *ps = &g->price;
    if (!ps->active) return;
    ps->active = 0;
    specd_accept_calib_update(g->req->calib, &g->tb, ps->score, ps->rank, r->accepted_nodes,
                              (int)r->n_accepted);
    g->st->predicted_tokens += ps->predicted;
    specd_accept_calib_note_sent(g->req->calib, ps->sent_sessions, ps->predicted_unbiased,
                                 g->tb.n_nodes, (int)r->n_accepted);
    ps->look_steps++;
    ps->look_tokens += (int)r->n_accepted;
    ps->look_extra_us += ps->step_extra_us;
    /* +0.5 on both sides: a short tree's 0-or-1 outcome moves it gently */
    double ratio = ((double)r->n_accepted + 0.5) / (ps->predicted_raw + 0.5);
    double sc = (1 - PRICE_ALPHA) * ps->scale + PRICE_ALPHA * ratio;
    ps->scale = (float)(sc < 0.25 ? 0.25 : sc > 2.0 ? 2.0 : sc);
    if (ps->sent_look && r->n_accepted > 0) {
        /* the look's node was accepted although priced as not worth it:
         * this text may draft well now, so price the very next step again
         * (with the raised scale) instead of waiting out the backoff.
         * Unless the drafter's own time leaves even a sure node unpaid
         * (specd_tree_drafting_could_pay): then the skip is about the
         * drafter, not the acceptance, and an accepted look says nothing
         * new. (A draft model whose every look was accepted drafted 30 of
         * 34 steps although each was priced below plain.) Not the whole
         * price: a cost point measured high during a burst is exactly what
         * a look corrects (the n-gram drafter on a repetitive text under
         * CI's parallel tests stayed at tau 1.14 with that rule). */
        specd_tree_price pr;
        driver_price_of_step(g, &pr);
        if (specd_tree_drafting_could_pay(&pr)) {
            ps->skip = 0;
            ps->backoff = 1;
        }
    }
    ps->sent_look = 0;
    /* What the session's drafting has actually won, against what its
     * drafted steps cost beyond a plain run's: the backstop for
     * predictions that oversell (driver_price_run_pays). Alone only, once
     * a few drafted steps say something. */
    if (ps->skip == 0 && drafting_lost(g)) driver_skip_drafting(ps, 0);
}

void driver_price_note_empty(gen *g, double draft_us) {
    g->price.look_steps++;
    g->price.look_extra_us += draft_us > 0 ? draft_us : 0;
}

/* specd_tree_run_pays with this session's measurements: the round trip's
 * overhead, a run step's (0 until one was seen: the run that follows
 * measures it), a one-row pass on the member's curve, and the tokens its
 * drafted steps won. With the services on separate cores a round trip cost
 * about what a run's step did and the n-gram drafter's looks won 0.19
 * tokens each, so it looks on; running after every empty lookup there cut
 * its tau from 1.19 to 1.09. On two shared cores a round trip cost 1.2 ms
 * and a run's step 0.46 ms, and a sampled text with no repeats drafted
 * nothing on 253 of 256 steps (docs/BENCHMARKS.md, thirty-fifth
 * session). */
int driver_price_run_pays(gen *g) {
    const price_state *ps = &g->price;
    if (!g->member) return 0;
    specd_step_cost cost;
    specd_tpool_member_cost(g->member, 0, &cost);
    double extra = ps->look_steps > 0 ? ps->look_extra_us / ps->look_steps : 0;
    return specd_tree_run_pays(ps->overhead_us, ps->run_seen ? ps->run_overhead_us : 0, extra,
                               specd_step_cost_at(&cost, 1), ps->look_steps, ps->look_tokens);
}

/* Folds a step's timings into the member's cost curve and our overhead. */
void driver_price_timings(gen *g, const Specd__V1__VerifyResponse *r, double t_recv) {
    price_state *ps = &g->price;
    const Specd__V1__StepTimings *tm = r->timings;
    if (!tm || !g->member) return;
    ps->batch_tokens = (int)tm->batch_tokens;
    /* a part of the pass (a target that says otherwise is not believed) */
    ps->draft_tokens = tm->draft_tokens < tm->batch_tokens ? (int)tm->draft_tokens : 0;
    ps->prompt_tokens = tm->prompt_tokens <= tm->batch_tokens ? (int)tm->prompt_tokens : 0;
    /* alone in the pass when it held exactly the rows this session sent */
    int shared = ps->sent_rows <= 0 || (int)tm->batch_tokens != ps->sent_rows;
    if (tm->forward_us > 0 && tm->batch_tokens > 0)
        specd_tpool_member_cost_observe(g->member, shared, (int)tm->batch_tokens, tm->forward_us);
    /* a run's step was not sent: its wait is not a round trip, but what a
     * run's step costs beyond its pass (t_send is the previous answer's
     * arrival there, when the target started it) */
    if (r->step > 0 && ps->t_send > 0) {
        double over = (t_recv - ps->t_send) * 1e3 - tm->forward_us;
        if (over < 0) over = 0;
        if (!ps->in_run) {
            ps->overhead_us = ps->overhead_us > 0
                                  ? (1 - PRICE_ALPHA) * ps->overhead_us + PRICE_ALPHA * over
                                  : over;
        } else {
            ps->run_overhead_us = ps->run_seen ? (1 - PRICE_ALPHA) * ps->run_overhead_us +
                                                     PRICE_ALPHA * over
                                               : over;
            ps->run_seen = 1;
        }
    }
}

