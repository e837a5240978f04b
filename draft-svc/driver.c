/* driver.c - one request through a target's Verify stream, with failover
 * (driver.h). */
#include "draft-svc/driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rpc/admission.h"
#include "common/util/dtype.h"
#include "common/rpc/ipc_caps.h"
#include "kernels/ipc.h"
#include "common/rpc/request_log.h"
#include "draft-svc/draft_metrics.h"
#include "common/util/clock.h"

/* ---- cancellation ------------------------------------------------------------ */

void specd_gen_cancel_init(specd_gen_cancel *c) {
    pthread_mutex_init(&c->mu, NULL);
    c->cancelled = 0;
    c->stream = NULL;
}

void specd_gen_cancel_destroy(specd_gen_cancel *c) { pthread_mutex_destroy(&c->mu); }

void specd_gen_cancel_fire(specd_gen_cancel *c) {
    pthread_mutex_lock(&c->mu);
    c->cancelled = 1;
    if (c->stream) specd_rpc_stream_cancel(c->stream);
    pthread_mutex_unlock(&c->mu);
}

static int is_cancelled(specd_gen_cancel *c) {
    pthread_mutex_lock(&c->mu);
    int v = c->cancelled;
    pthread_mutex_unlock(&c->mu);
    return v;
}

/* Publishes the stream for specd_gen_cancel_fire; 0, or -1 if cancelled
 * already (then the stream is left alone: the caller frees it). */
static int set_stream(specd_gen_cancel *c, specd_rpc_stream *st) {
    pthread_mutex_lock(&c->mu);
    int cancelled = c->cancelled;
    c->stream = cancelled ? NULL : st;
    pthread_mutex_unlock(&c->mu);
    return cancelled ? -1 : 0;
}

/* ---- per-request state ------------------------------------------------------- */

/* A session's view of what its steps cost and earn. */
typedef struct price_state {
    int active;          /* this step's tree was priced (greedy, cost mode) */
    float *score, *p_path;  /* [max_tree_tokens] per node of the tree sent */
    uint8_t *rank, *keep;
    int32_t *levels;     /* [max_tree_tokens] drafting stages per node (price_tree) */
    float *p_alt;        /* [max_tree_tokens] scratch: the tree without the model's part */
    uint8_t *keep_alt;
    uint8_t *keep_shape; /* [max_tree_tokens] the tree worth drafting again (price_tree) */
    double predicted;    /* expected accepted tokens of the tree sent, as priced */
    double predicted_raw;/* the same without the session's scale */
    double predicted_unbiased; /* ... with the scale, without the drafter's bias */
    int sent_sessions;   /* the load it was priced at */
    float scale;         /* how this session accepts against the calibration */
    int batch_tokens;    /* the last pass: all its tokens */
    int sent_rows;       /* ... and ours in it (1 + tree nodes) */
    int draft_tokens;    /* ... and its draft nodes, every session's (0: not reported) */
    int prompt_tokens;   /* ... and its prompt rows, every session's (0: not reported) */
    double overhead_us;  /* step time outside the forward pass, smoothed */
    double draft_one_us; /* the drafter's time per tree level, smoothed (note_draft_time) */
    double gain;         /* smoothed priced gain of drafting, draft time included */
    int skip, backoff;   /* plain steps left before drafting again; the next skip */
    int look;            /* the next draft is a look after a skip: checked as a sure node */
    int looking;         /* this step's tree is a look: it sends at least one node */
    int sent_look;       /* the tree in flight is a look's forced node */
    float p1;            /* the first node's estimated chance, smoothed; < 0: none yet */
    int want_cand, want_depth; /* the shape to draft next */
    int priced_steps;    /* trees priced so far (for the exploring ones) */
    double t_send;       /* when the last tree went out (in a run: the last answer came) */
    double t_recv;       /* when the last answer came */
    int in_run;          /* the answer awaited is a plain run's step (plain_run) */
} price_state;


/* Pipelined drafting. While the target verifies the tree in flight, a
 * drafter with draft_ahead (drafter.h) drafts the next step's tree on a
 * guess: that the target accepts the tree's most likely path whole (while
 * it prefills the prompt for Open, that the guess's first level holds the
 * first token; the draft model's own prefill then overlaps the target's). The
 * tree drafted ahead is rooted at that path's last token, one level deeper
 * than the next step asks, so its first level also guesses the target's own
 * next token. When the answer accepts exactly that path and its next token
 * is one of the first level's nodes, that node's subtree is the next tree
 * (draft() adopts it instead of calling the drafter), and the step goes out
 * with no drafting between the answer and the Tree: on a target with cores
 * or a GPU of its own, the drafter's time hides behind the target's pass.
 * Otherwise the next tree is drafted as always; the drafter's session state
 * follows the history each job brings, so the wrong guess leaves nothing
 * behind. Greedy and seed-exact requests only: a rejection-sampled tree
 * carries the q its children were drawn from, and its shape must not follow
 * anything but the request (policy.h). The guess drafts with the history's
 * penalty counts, not counting the guessed path's tokens: a draft a little
 * off, never an output (the target applies the exact penalties). */
typedef struct ahead_state {
    int on;              /* this request may draft ahead (buffers allocated) */
    specd_tree_buf tb;   /* the tree drafted ahead */
    int32_t *hist;       /* [cap_hist] the history + the guessed path */
    int n_synced;        /* hist[0 .. n_synced) mirrors the request's history */
    int32_t *map;        /* [tb.cap] scratch: node -> adopted node */
    int n_path;          /* the guessed path: nodes of the tree in flight */
    int32_t path[SPECD_MAX_DRAFT_DEPTH];
    int base_hist;       /* the history's length when it was drafted */
    int cand, depth;     /* its job's shape; depth counts the next-token level */
    float stop;          /* its job's stop_threshold */
    int valid;           /* tb is the tree drafted ahead of the tree in flight */
    int hit, hit_node;   /* the answer confirmed the guess: hit_node's subtree */
} ahead_state;

typedef struct gen {
    const specd_driver_env *env;
    const specd_gen_request *req;
    const specd_gen_sink *sink;
    specd_gen_cancel *cancel;
    specd_gen_stats *st;
    int32_t *hist; /* prompt then every token handed to the sink */
    int n_hist, cap_hist;
    int n_gen;     /* tokens generated (handed to the sink) */
    specd_token_counts counts;
    float *hidden; /* target hidden state of the newest token, if have_hidden */
    int hidden_size, have_hidden;
    specd_ipc_import *ipc; /* the current target session's co-location grant, mapped */
    void *draft_state;
    int drafting; /* 0 once the drafter has no session for us */
    specd_tree_buf tb;
    specd_accept_state acc;
    int target_load; /* active sessions the target reported last */
    specd_tpool_member *member; /* the target of the current session */
    price_state price;
    ahead_state ahead;
    /* Plain runs (the proto's VerifyTree.plain_steps): the most steps this
     * target session runs by itself (its answer to Open; 0 = none), the
     * run steps still to be answered, whether they stand for priced steps
     * the skip rules declined (counted as such), and the plain steps in a
     * row so far (a lookup drafter's runs grow with it, plain_run). */
    uint32_t max_plain;
    uint32_t run_left;
    int run_priced;
    int plain_streak;
    /* an Open or Tree is out and its answer not yet in: the next answer
     * completes a round trip (stats round_trips); a plain run's later
     * answers complete none */
    int trip_open;
    double t_start, t_first;
    int done;        /* finish reason reached */
    int target_finished; /* the target sent a finish reason: its status follows */
} gen;

/* ---- cost-aware trees (tree_choice.h) ----------------------------------------- */


/* Weights of the newest step in the smoothed times and the gain. */
#define PRICE_ALPHA 0.2
/* Most plain steps in a row before drafting again to see whether a tree
 * pays now (text changes: a table, a quote, code). */
#define MAX_SKIP 64
/* Every this many priced steps the draft goes one level and one column
 * past what was kept (price_tree). */
#define EXPLORE_EVERY 4

static int price_init(price_state *ps, int cap, const specd_policy *pol) {
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
    /* start small: the shape grows by exploring (price_tree) */
    ps->want_cand = pol->max_candidates > 2 ? 2 : pol->max_candidates > 0 ? pol->max_candidates : 1;
    ps->want_depth = pol->max_depth > 2 ? 2 : pol->max_depth > 0 ? pol->max_depth : 1;
    return ps->score && ps->p_path && ps->rank && ps->keep && ps->levels && ps->p_alt &&
                   ps->keep_alt && ps->keep_shape
               ? 0
               : -1;
}

static void price_free(price_state *ps) {
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
static void price_of_step(const gen *g, specd_tree_price *pr) {
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

/* Decodes plainly for the next `backoff` steps (1, 2, 4 ... MAX_SKIP while
 * drafting keeps not paying), then drafts once to look. */
static void skip_drafting(price_state *ps) {
    ps->skip = ps->backoff;
    ps->backoff = ps->backoff * 2 < MAX_SKIP ? ps->backoff * 2 : MAX_SKIP;
    ps->look = 1;
}

/* The depth (levels, SPECD_MAX_DRAFT_DEPTH at most) and the node count of
 * the widest level of a tree's drafted part, the part a drafter pays for
 * per level: every node but a lookup's (tree_builder.h), whose shape is
 * not priced (a hybrid drafter's lookup always gets the policy's largest
 * shape, draft()). Only the nodes keep marks when keep is given, and then
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
 * (a plain step's, or a lookup part's alone, price_tree), the draft's own
 * time counted once for every level drafted; a smoothed gain below 1 skips
 * the drafter for a while (skip_drafting). */
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
        skip_drafting(ps);
        ps->gain = 1.0; /* the next look starts without the old verdict */
    } else if (gain >= 1.0) {
        ps->backoff = 1;
    }
}

/* Cuts g->tb to the tree worth its verification time (maybe nothing) and
 * decides whether the next steps should draft at all: drafting itself takes
 * time, so when the smoothed gain of the best tree, counting the draft
 * time, stays below a plain step's rate, the session decodes plainly for a
 * while (1, 2, 4 ... MAX_SKIP steps) and then drafts again to look. */
static void price_tree(gen *g, double draft_us) {
    price_state *ps = &g->price;
    specd_tree_buf *tb = &g->tb;
    int drafted_deep, drafted_wide;
    tree_shape(tb, NULL, NULL, &drafted_deep, &drafted_wide, NULL, NULL);
    note_draft_time(g, draft_us, drafted_deep);
    int n = tb->n_nodes;
    specd_tree_price pr;
    price_of_step(g, &pr);
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
static void price_learn(gen *g, const Specd__V1__VerifyResponse *r) {
    price_state *ps = &g->price;
    if (!ps->active) return;
    ps->active = 0;
    specd_accept_calib_update(g->req->calib, &g->tb, ps->score, ps->rank, r->accepted_nodes,
                              (int)r->n_accepted);
    g->st->predicted_tokens += ps->predicted;
    specd_accept_calib_note_sent(g->req->calib, ps->sent_sessions, ps->predicted_unbiased,
                                 g->tb.n_nodes, (int)r->n_accepted);
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
        price_of_step(g, &pr);
        if (specd_tree_drafting_could_pay(&pr)) {
            ps->skip = 0;
            ps->backoff = 1;
        }
    }
    ps->sent_look = 0;
}

/* Folds a step's timings into the member's cost curve and our overhead. */
static void price_timings(gen *g, const Specd__V1__VerifyResponse *r, double t_recv) {
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
    /* a run's step was not sent: its wait is not a round trip */
    if (r->step > 0 && ps->t_send > 0 && !ps->in_run) {
        double over = (t_recv - ps->t_send) * 1e3 - tm->forward_us;
        if (over < 0) over = 0;
        ps->overhead_us = ps->overhead_us > 0
                              ? (1 - PRICE_ALPHA) * ps->overhead_us + PRICE_ALPHA * over
                              : over;
    }
}

/* What the step loop tells the failover loop. */
typedef enum step_rc {
    STEP_DONE,     /* finished (st->finish set) */
    STEP_RETRY,    /* the target failed: try another one */
    STEP_FATAL,    /* give up with *code + err */
} step_rc;

/* Codes after which another target may well succeed. INVALID_ARGUMENT,
 * FAILED_PRECONDITION and the like mean the request itself is refused, and
 * would be refused everywhere. */
static int retryable(grpc_status_code c) {
    return c == GRPC_STATUS_UNAVAILABLE || c == GRPC_STATUS_CANCELLED ||
           c == GRPC_STATUS_ABORTED || c == GRPC_STATUS_DEADLINE_EXCEEDED ||
           c == GRPC_STATUS_RESOURCE_EXHAUSTED || c == GRPC_STATUS_INTERNAL ||
           c == GRPC_STATUS_UNKNOWN;
}

/* Hands the step's tokens to the sink and updates the history. Returns 1
 * when the request is over (finish or sink stop), 0 to go on, -1 when the
 * sink aborted. */
static int deliver(gen *g, const int32_t *toks, int n, Specd__V1__TokenLogprob **lps, int n_lps,
                   Specd__V1__FinishReason fr) {
    if (n > 0 && g->n_gen == 0) g->t_first = specd_now_ms();
    int stop = 0;
    int took = g->sink->on_tokens(g->sink->arg, toks, n, lps, n_lps, fr, &stop);
    if (took < 0) return -1;
    if (took > n) took = n;
    for (int i = 0; i < took; i++) {
        g->hist[g->n_hist++] = toks[i];
        specd_token_counts_add(&g->counts, toks[i], 1);
    }
    g->n_gen += took;
    if (stop) {
        g->st->finish = SPECD__V1__FINISH_REASON__FINISH_REASON_STOP;
        return 1;
    }
    if (fr != SPECD__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED) {
        g->st->finish = fr;
        return 1;
    }
    return 0;
}

/* Co-location (common/ipc_caps.h), the client's half: a grant on step 0 is
 * checked and mapped; when either fails the session simply keeps the bytes
 * path (no Tree asks for hidden_via_ipc). */
static void take_grant(gen *g, const Specd__V1__VerifyResponse *r) {
    /* step 0 only, as the proto says; one mapping per target session */
    if (!r->cuda_ipc || r->step != 0 || g->ipc || !g->hidden || !g->req->drafter) return;
    specd_error err = {{0}};
    static volatile int warned; /* once per process: every session would say the same */
    if ((specd_ipc_grant_check(r->cuda_ipc, g->hidden_size, &err) ||
         !(g->ipc = specd_ipc_import_open(r->cuda_ipc, g->req->drafter->cuda_device, &err))) &&
        !warned) {
        warned = 1;
        fprintf(stderr, "draft-svc: CUDA IPC grant not used (bytes instead): %s\n", err.msg);
    }
}

static void take_hidden(gen *g, const Specd__V1__VerifyResponse *r) {
    g->have_hidden = 0;
    take_grant(g, r);
    if (r->hidden_in_ipc) {
        specd_error err = {{0}};
        /* only a Tree that asked gets this, and only one with a mapping asks */
        if (g->hidden && g->ipc && !specd_ipc_import_get(g->ipc, g->hidden, &err))
            g->have_hidden = 1;
        return;
    }
    if (!g->hidden || r->hidden_fp16.len != sizeof(uint16_t) * (size_t)g->hidden_size) return;
    const uint8_t *b = r->hidden_fp16.data;
    for (int i = 0; i < g->hidden_size; i++)
        g->hidden[i] = specd_fp16_to_f32((uint16_t)(b[2 * i] | (b[2 * i + 1] << 8)));
    g->have_hidden = 1;
}

/* Whether this request's trees are priced (cost mode, no shape of its
 * own): greedy and seed-exact sampled ones, whose output does not depend on
 * the tree. Rejection-sampled requests keep a fixed shape (policy.h). */
static int q_priced(const gen *g) {
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

/* ---- pipelined drafting (ahead_state above) ----------------------------------- */

/* The shape draft() will ask the drafter for next, without its side
 * effects; 0 when it will not call the drafter (a skip, the load table, a
 * collapse's cooldown). The cost rules may still decline after the answer:
 * the tree drafted ahead is then simply not used. */
static int next_shape(const gen *g, int *cand, int *depth) {
    const specd_gen_request *q = g->req;
    int c = q->candidates, d = q->depth;
    if (q_priced(g) && g->member) {
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
static void draft_ahead(gen *g, const specd_target_info *info, int opening) {
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
    /* the next tree's limits (draft()), plus the next-token level */
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
    if (rc || a->tb.n_nodes == 0) return; /* a failure shows again in the next draft() */
    a->base_hist = g->n_hist;
    a->cand = cand;
    a->depth = depth;
    a->stop = job.stop_threshold;
    a->valid = 1;
    g->st->pipelined_drafts++;
}

/* On the answer to the tree in flight: whether it confirmed the guess. */
static void check_ahead(gen *g, const Specd__V1__VerifyResponse *r) {
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
static void draft(gen *g, const specd_target_info *info) {
    const specd_gen_request *q = g->req;
    if (!q->drafter) return; /* g->tb was never allocated: it stays empty */
    specd_tree_buf_reset(&g->tb);
    /* a tree drafted ahead serves this step or none */
    int ahead_hit = g->ahead.valid && g->ahead.hit;
    g->ahead.valid = g->ahead.hit = 0;
    if (!g->drafting) return;
    int cand = q->candidates, depth = q->depth;
    int look_cand = 0, look_depth = 0; /* a lookup's shape: the job's lookup_* */
    /* Greedy requests without a shape of their own, in cost mode, are
     * priced (tree_choice.h); everything else gets a fixed shape. */
    int priced = q_priced(g) && g->member;
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
        price_of_step(g, &pr);
        float p1 = g->price.p1 >= 0 ? g->price.p1
                                    : specd_accept_calib_first(
                                          g->req->calib,
                                          g->price.scale * specd_accept_calib_bias(
                                                               g->req->calib, pr.sessions));
        /* a look too, if not even a sure node could pay at this load;
         * but a look of a session alone in the pass always drafts (and
         * sends a node, price_tree): the price itself may be what is
         * wrong, a cost point measured high during a burst on shared
         * cores, and only a pass of that size measures it again (a CI run
         * under parallel tests drafted nothing on a text that drafts at
         * tau 4.8). Looks come after 1, 2, 4 ... 64 plain steps. */
        if (!model_off && !(look && pr.sessions == 1) &&
            !specd_tree_could_pay(look ? SPECD_P_MAX : p1, &pr)) {
            skip_drafting(&g->price);
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
        price_tree(g, draft_us);
    } else if (model_off) { /* the lookup found nothing either */
        g->st->plain_by_cost++;
        specd_draft_metrics_spec_off(SPECD_SPEC_OFF_COST);
    }
}

/* How often a waiting step looks at the target's liveness. */
#define LIVENESS_SLICE_MS 250

/* Reads one response; maps failures to step codes. Busy is not dead: the
 * wait goes on as long as the target answers its health checks
 * (target_watch.c records each answer on the member), and fails over once
 * the target has been silent, answering neither the step nor a health
 * check, for step_timeout (a hung or frozen target; a lost connection ends
 * the stream sooner, through keepalive). live_cap_ms bounds one response
 * even from a live target (a target that is alive but makes no progress:
 * open_timeout, scaled by the prompt for Open). A target never probed (no target_watch running) has no
 * liveness to judge: plain_ms is then a plain deadline for the response
 * (open_timeout for Open, step_timeout for a step). */
static step_rc recv_resp(gen *g, specd_rpc_stream *s, const specd_tpool_member *m, int plain_ms,
                         int live_cap_ms,
                         Specd__V1__VerifyResponse **out, grpc_status_code *code,
                         specd_error *err) {
    *out = NULL;
    double t0 = specd_now_ms();
    specd_rpc_cio io;
    for (;;) {
        io = specd_rpc_stream_recv(s, &specd__v1__verify_response__descriptor,
                                   (ProtobufCMessage **)out, LIVENESS_SLICE_MS, err);
        if (io != SPECD_RPC_CIO_TIMEOUT) break;
        double t = specd_now_ms(), alive = (double)specd_tpool_member_last_alive(m);
        double silent = t - (alive > t0 ? alive : t0);
        int cap_ms = alive > 0 ? live_cap_ms : plain_ms;
        if (alive > 0 && silent >= g->env->step_timeout_ms) {
            specd_seterr(err, "target answered neither the step nor a health check for %.0f ms "
                              "(step_timeout %d ms)", silent, g->env->step_timeout_ms);
            *code = GRPC_STATUS_DEADLINE_EXCEEDED;
            return STEP_RETRY;
        }
        if (t - t0 >= cap_ms) {
            specd_seterr(err, "target step took longer than %d ms", cap_ms);
            *code = GRPC_STATUS_DEADLINE_EXCEEDED;
            return STEP_RETRY;
        }
    }
    if (io == SPECD_RPC_CIO_OK) return STEP_DONE;
    if (io == SPECD_RPC_CIO_INVALID) {
        *code = GRPC_STATUS_INTERNAL;
        return STEP_RETRY;
    }
    /* END before the finish reason, or a dead call: its status says which. */
    *code = specd_rpc_stream_finish(s, err);
    if (is_cancelled(g->cancel)) {
        *code = GRPC_STATUS_CANCELLED;
        specd_seterr(err, "request cancelled");
        return STEP_FATAL;
    }
    if (*code == GRPC_STATUS_OK) {
        *code = GRPC_STATUS_UNAVAILABLE;
        specd_seterr(err, "target ended the session without a finish reason");
    }
    return retryable(*code) ? STEP_RETRY : STEP_FATAL;
}

/* Checks that the target's answer is a path of the tree we sent. A target
 * that answers something else is broken; trusting it could emit garbage. */
static int check_resp(const int32_t *tokens, const int32_t *parents, int n_nodes,
                      const Specd__V1__VerifyResponse *r, int vocab, specd_error *err) {
    if (r->n_accepted != r->n_accepted_nodes)
        return specd_seterr(err, "target answer: accepted and accepted_nodes differ in length");
    int prev = -1;
    for (size_t i = 0; i < r->n_accepted; i++) {
        int node = r->accepted_nodes[i];
        if (node < 0 || node >= n_nodes || parents[node] != prev || tokens[node] != r->accepted[i])
            return specd_seterr(err, "target answer: accepted node %d is not on a tree path",
                                node);
        prev = node;
    }
    if (r->next_token < 0 || r->next_token >= vocab)
        return specd_seterr(err, "target answer: next_token %d outside the vocabulary",
                            r->next_token);
    return 0;
}

/* Handles one response: stats, delivery. 1 = over, 0 = go on, -1 = abort. */
static int on_resp(gen *g, const Specd__V1__VerifyResponse *r) {
    int n_acc = (int)r->n_accepted;
    int32_t *toks = malloc(sizeof(int32_t) * ((size_t)n_acc + 1));
    if (!toks) return -1;
    /* accepted is NULL when empty (protobuf-c), and memcpy from NULL is
     * undefined even for 0 bytes (UBSan aborts on it). */
    if (n_acc) memcpy(toks, r->accepted, sizeof(int32_t) * (size_t)n_acc);
    toks[n_acc] = r->next_token;
    g->st->target_steps++;
    if (r->timings) g->target_load = (int)r->timings->active_sessions;
    double t_recv = specd_now_ms();
    price_timings(g, r, t_recv);
    g->price.t_recv = t_recv;
    if (r->step > 0) {
        price_learn(g, r);
        if (g->price.t_send > 0) g->st->wait_ms += t_recv - g->price.t_send;
        if (r->timings) g->st->forward_ms += r->timings->forward_us / 1e3;
    }
    if (r->step > 0 && g->tb.n_nodes > 0) {
        int maxd = 0;
        for (int i = 0; i < g->tb.n_nodes; i++)
            if (g->tb.depth[i] > maxd) maxd = g->tb.depth[i];
        if (maxd > SPECD_MAX_DRAFT_DEPTH) maxd = SPECD_MAX_DRAFT_DEPTH;
        for (int d = 0; d < maxd; d++) g->st->drafted_at[d]++;
        for (int d = 0; d < n_acc && d < maxd; d++) g->st->accepted_at[d]++;
        if (maxd > g->st->max_depth_seen) g->st->max_depth_seen = maxd;
        g->st->drafted_tokens += g->tb.n_nodes;
        g->st->accepted_tokens += n_acc;
        specd_accept_update(g->env->policy, &g->acc, maxd, n_acc);
    }
    if (r->step == 0) g->max_plain = r->max_plain_steps;
    check_ahead(g, r);
    take_hidden(g, r);
    if (r->finish_reason != SPECD__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED)
        g->target_finished = 1;
    int rc = deliver(g, toks, n_acc + 1, r->n_logprobs ? r->logprobs : NULL, (int)r->n_logprobs,
                     r->finish_reason);
    free(toks);
    return rc;
}

/* The first session checks the prompt against this target's context, with
 * target-svc's rule and words (common/admission.h), so a prompt that cannot
 * fit is refused as Target.Generate refuses it, not answered with 0 tokens.
 * After a failover to a target with a smaller context, nothing more may
 * fit: the request then ends as a full context would. STEP_RETRY = go on. */
static step_rc admit_session(gen *g, const specd_target_info *info, grpc_status_code *code,
                             specd_error *err) {
    if (g->n_gen == 0) {
        specd_admission_limits adm = {.context = info->context_length,
                                      .max_prompt_tokens = g->n_hist};
        if ((*code = specd_admit_prompt(&adm, "request.input", (size_t)g->n_hist, 0, err)))
            return STEP_FATAL;
    }
    if (g->n_hist + 1 > info->context_length) {
        g->st->finish = SPECD__V1__FINISH_REASON__FINISH_REASON_CONTEXT;
        return STEP_DONE;
    }
    return STEP_RETRY;
}

/* Sends VerifyOpen with the whole history; a re-open after a failover
 * carries resumed_tokens, so the target's random draws and penalties go on
 * where they stopped. */
static step_rc send_open(gen *g, specd_rpc_stream *s, grpc_status_code *code, specd_error *err) {
    const specd_gen_request *q = g->req;
    Specd__V1__VerifyOpen open = SPECD__V1__VERIFY_OPEN__INIT;
    open.n_prompt_ids = (size_t)g->n_hist;
    open.prompt_ids = g->hist;
    open.sampling = (Specd__V1__SamplingParams *)q->sampling_pb;
    open.max_new_tokens = q->max_new_tokens - g->n_gen;
    open.n_stop_ids = (size_t)q->n_stop_ids;
    open.stop_ids = (int32_t *)q->stop_ids;
    open.ignore_eos = q->ignore_eos;
    open.return_hidden = q->drafter && q->drafter->hidden_size > 0;
    /* offer co-location when the speculator is on a GPU; a grant belongs to
     * one target session, so a re-open after failover starts without one */
    specd_ipc_import_free(g->ipc);
    g->ipc = NULL;
    Specd__V1__CudaIpcOffer offer = SPECD__V1__CUDA_IPC_OFFER__INIT;
    char node[SPECD_IPC_NODE_MAX], uuid[33];
    specd_error ipc_err = {{0}};
    if (open.return_hidden && q->drafter->on_cuda && !specd_ipc_node_id(node, &ipc_err) &&
        !specd_ipc_device_uuid(q->drafter->cuda_device, uuid, &ipc_err)) {
        offer.node_id = node;
        offer.device_uuid = uuid;
        open.cuda_ipc = &offer;
    }
    open.resumed_tokens = g->n_gen;
    open.logprobs = q->logprobs;
    open.top_logprobs = q->top_logprobs;
    Specd__V1__VerifyRequest vr = SPECD__V1__VERIFY_REQUEST__INIT;
    vr.msg_case = SPECD__V1__VERIFY_REQUEST__MSG_OPEN;
    vr.open = &open;
    if (specd_rpc_stream_send(s, &vr.base, 0, err) != SPECD_RPC_CIO_OK) {
        *code = specd_rpc_stream_finish(s, err);
        return is_cancelled(g->cancel) ? STEP_FATAL : STEP_RETRY;
    }
    g->trip_open = 1;
    g->have_hidden = 0;
    return STEP_DONE;
}

/* Whether r answers `step` as a correct target would: the step number, and
 * a path of the tree last sent (step 0: no path). 0, or -1 + err. */
static int check_answer(const gen *g, const Specd__V1__VerifyResponse *r, uint32_t step,
                        const specd_target_info *info, specd_error *err) {
    if (r->step != step)
        return specd_seterr(err, "target answered step %u, expected %u", r->step, step);
    if (step > 0)
        return check_resp(g->tb.tokens, g->tb.parents, g->tb.n_nodes, r, info->vocab_size, err);
    if (r->n_accepted || r->next_token < 0 || r->next_token >= info->vocab_size)
        return specd_seterr(err, "target answer to Open: accepted tokens or a bad next_token");
    return 0;
}

/* Sends g->tb (empty = a plain decode step) as Tree `step`, with the draft
 * distributions in sampling mode and `run` plain steps after it
 * (plain_run). */
static step_rc send_tree(gen *g, specd_rpc_stream *s, uint32_t step, uint32_t run,
                         grpc_status_code *code, specd_error *err) {
    const specd_gen_request *q = g->req;
    int n = g->tb.n_nodes;
    Specd__V1__VerifyTree tree = SPECD__V1__VERIFY_TREE__INIT;
    Specd__V1__DraftDistribution *qd = NULL, **qp = NULL;
    tree.step = step;
    tree.n_tokens = tree.n_parents = (size_t)n;
    tree.tokens = g->tb.tokens;
    tree.parents = g->tb.parents;
    tree.hidden_via_ipc = g->ipc != NULL;
    tree.plain_steps = run;
    if (specd_sampling_is(&q->sampling, SPECD_SAMPLING_REJECTION) && n > 0) {
        size_t nq = (size_t)n + 1;
        qd = calloc(nq, sizeof *qd);
        qp = calloc(nq, sizeof *qp);
        if (!qd || !qp) {
            free(qd);
            free(qp);
            *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
            specd_seterr(err, "out of memory");
            return STEP_FATAL;
        }
        for (size_t i = 0; i < nq; i++) {
            specd__v1__draft_distribution__init(&qd[i]);
            qd[i].n_ids = qd[i].n_probs = (size_t)g->tb.q[i].n;
            qd[i].ids = (int32_t *)g->tb.q[i].ids;
            qd[i].probs = (float *)g->tb.q[i].probs;
            qp[i] = &qd[i];
        }
        tree.n_q = nq;
        tree.q = qp;
    }
    Specd__V1__VerifyRequest vr = SPECD__V1__VERIFY_REQUEST__INIT;
    vr.msg_case = SPECD__V1__VERIFY_REQUEST__MSG_TREE;
    vr.tree = &tree;
    g->price.sent_rows = 1 + n;
    g->price.t_send = specd_now_ms();
    specd_rpc_cio io = specd_rpc_stream_send(s, &vr.base, 0, err);
    free(qd);
    free(qp);
    if (io == SPECD_RPC_CIO_OK) {
        g->trip_open = 1;
        return STEP_DONE;
    }
    *code = specd_rpc_stream_finish(s, err);
    if (io == SPECD_RPC_CIO_INVALID) *code = GRPC_STATUS_INTERNAL;
    if (!is_cancelled(g->cancel)) return STEP_RETRY;
    *code = GRPC_STATUS_CANCELLED;
    return STEP_FATAL;
}

/* Longest plain run worth asking for after the plain step about to go out
 * (g->tb is empty): the steps this request would decode plainly anyway, so
 * the target may run them without a round trip each (a loopback step's
 * hand-offs cost 0.25 ms of a 2.5 ms step here, a network's more). That is
 * every step of a request without a drafter, and the rest of a priced
 * drafter's skip (the skip rules would decline its model for them). A
 * drafter with a lookup part still looks up on every step it gets, and its
 * lookup may find a match on any of them, so alone its run is at most the
 * plain steps it has seen in a row: it looks at the 1st, 2nd, 4th, 8th ...
 * plain step of a streak. Never past the tokens left, nor past what the target
 * offered at Open (0: it runs none). Takes the run's steps off the skip. */
static uint32_t plain_run(gen *g) {
    const specd_gen_request *q = g->req;
    long left = (long)q->max_new_tokens - g->n_gen - 1; /* after this step's token */
    if (!g->max_plain || left <= 0) return 0;
    long n = 0;
    g->run_priced = 0;
    if (!q->drafter) {
        n = left;
    } else if (q_priced(g) && g->member && g->price.skip > 0) {
        n = g->price.skip;
        /* alone only: under load a lookup's tree rarely pays for the
         * rows it adds to everyone's pass, while each run cut short is a
         * step sent (run_session) */
        if (q->drafter->has_lookup && g->target_load <= 1 && n > g->plain_streak)
            n = g->plain_streak;
        g->run_priced = 1;
    }
    if (n > left) n = left;
    if (n > (long)g->max_plain) n = (long)g->max_plain;
    if (n <= 0) return 0;
    if (g->run_priced) g->price.skip -= (int)n;
    return (uint32_t)n;
}

/* Ends the stream. A session the target ended itself has its OK status on
 * the way behind the last message: reading it ends the call cleanly instead
 * of cancelling it, which the target would count as CANCELLED in its
 * metrics (specd_grpc_server_handled_total). Ending it early cancels it,
 * which the target sees as the session closing: its KV is freed at once. */
static void end_stream(gen *g, specd_rpc_stream *s, step_rc rc) {
    if (rc == STEP_DONE && g->target_finished) {
        Specd__V1__VerifyResponse *r = NULL;
        specd_error ignored = {{0}};
        if (specd_rpc_stream_recv(s, &specd__v1__verify_response__descriptor,
                                  (ProtobufCMessage **)&r, 100, &ignored) == SPECD_RPC_CIO_OK)
            protobuf_c_message_free_unpacked(&r->base, NULL);
    }
    set_stream(g->cancel, NULL);
    specd_rpc_stream_free(s);
}

/* One session on one target, from Open to the end or a failure:
 * Open -> answer 0 -> [deliver, draft, Tree, answer] until a finish. */
static step_rc run_session(gen *g, specd_tpool_member *m, grpc_status_code *code,
                           specd_error *err) {
    const specd_target_info *info = specd_tpool_member_info(m);
    step_rc rc = admit_session(g, info, code, err);
    if (rc != STEP_RETRY) return rc;
    specd_rpc_stream *s =
        specd_rpc_stream_start_md(specd_tpool_member_channel(m), "/specd.v1.Target/Verify", 0,
                                  SPECD_REQUEST_ID_KEY, g->req->request_id, err);
    if (!s) {
        *code = GRPC_STATUS_UNAVAILABLE;
        return STEP_RETRY;
    }
    g->member = m;
    g->price.active = 0; /* nothing priced is in flight on a new session */
    g->price.sent_rows = 0; /* nor any row of ours in its first pass but the prompt's */
    g->max_plain = g->run_left = 0; /* known from this session's Open answer */
    g->price.in_run = 0;
    g->ahead.valid = g->ahead.hit = 0;
    /* The load this session starts into: the target reports it with every
     * answer, and before the first one the sessions this draft-svc has
     * open there (this one included) say it. Taking the last reported
     * load alone, a new session under 16 streams asked the lone-session
     * verdict, which says drafting pays, and drafted its first steps at a
     * load where no tree is sent. */
    int load = specd_tpool_member_sessions(m);
    if (load < g->target_load) load = g->target_load;
    if (g->n_gen == 0 && q_priced(g) && specd_accept_calib_gain(g->req->calib, load) < 1.0) {
        /* Drafting has not been paying for this drafter lately at this
         * load: start plainly and look again after a few steps. Alone,
         * soon: a 24-token request on a repetitive text drafted nothing
         * after 16 (tau 1.00). Under load, later: every look and every run
         * is a step sent, which the others' pass waits for
         * (batching.max_wait) and this process spends CPU on. At 16
         * streams the drafters sent 3.8-7.3 times the steps plain decoding
         * did while sending no tree; at 4 streams this start and runs not
         * cut short under load (plain_run) took a drafter's sends from
         * 5.6-6.3 to 3.4-4.4 a request, plain decoding's being 1
         * (docs/BENCHMARKS.md, thirtieth session). */
        g->price.skip = load > 1 ? 16 : 4;
        g->price.backoff = load > 1 ? 32 : 8;
        g->price.look = 1;
    }
    Specd__V1__VerifyResponse *r = NULL;
    if (set_stream(g->cancel, s)) {
        *code = GRPC_STATUS_CANCELLED;
        specd_seterr(err, "request cancelled");
        rc = STEP_FATAL;
        goto out;
    }
    if ((rc = send_open(g, s, code, err)) != STEP_DONE) goto out;
    if (g->ahead.on) draft_ahead(g, info, 1);
    /* Open's answer comes after the queue and the whole prefill: a live
     * target gets the time it may keep the session queued (its
     * limits.queue_wait, from GetInfo) plus open_timeout per started 2048
     * tokens of history (a CPU prefills an 8k prompt in about a minute,
     * slower under load). A busy target's queue is not a failure. */
    int64_t cap64 = (int64_t)info->queue_wait_ms +
                    (int64_t)g->env->open_timeout_ms * (1 + (g->n_hist - 1) / 2048);
    int open_cap = cap64 > INT32_MAX ? INT32_MAX : (int)cap64;
    rc = recv_resp(g, s, m, g->env->open_timeout_ms, open_cap, &r, code, err);
    for (uint32_t step = 0; rc == STEP_DONE; step++) {
        if (check_answer(g, r, step, info, err)) {
            *code = GRPC_STATUS_INTERNAL;
            rc = STEP_RETRY;
            break;
        }
        g->st->round_trips += g->trip_open;
        g->trip_open = 0;
        int over = on_resp(g, r);
        protobuf_c_message_free_unpacked(&r->base, NULL);
        r = NULL;
        if (over < 0) {
            *code = GRPC_STATUS_CANCELLED;
            specd_seterr(err, "client went away");
            rc = STEP_FATAL;
            break;
        }
        if (over) break; /* rc is STEP_DONE */
        g->price.in_run = g->run_left > 0;
        if (g->run_left > 0) {
            /* a plain run: the target sends the next step by itself */
            g->run_left--;
            g->plain_streak++;
            if (g->run_priced) {
                g->st->plain_by_cost++;
                specd_draft_metrics_spec_off(SPECD_SPEC_OFF_COST);
            }
            /* in flight since the last answer: the target started it then */
            g->price.t_send = g->price.t_recv;
            rc = recv_resp(g, s, m, g->env->step_timeout_ms, g->env->open_timeout_ms, &r, code,
                           err);
            continue;
        }
        /* The next tree; an empty one is a plain decode step (nothing
         * drafted: drafter "none", speculation off at this load, after a
         * collapse, or not worth its price, or nothing to propose), maybe
         * with a plain run behind it. */
        if (g->req->drafter) {
            double t_draft = specd_now_ms();
            draft(g, info);
            g->st->draft_ms += specd_now_ms() - t_draft;
        }
        g->plain_streak = g->tb.n_nodes ? 0 : g->plain_streak + 1;
        uint32_t run = g->tb.n_nodes ? 0 : plain_run(g);
        if ((rc = send_tree(g, s, step + 1, run, code, err)) != STEP_DONE) break;
        g->run_left = run;
        if (g->ahead.on && !run) draft_ahead(g, info, 0);
        rc = recv_resp(g, s, m, g->env->step_timeout_ms, g->env->open_timeout_ms, &r, code, err);
    }
out:
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
    end_stream(g, s, rc);
    return rc;
}

grpc_status_code specd_driver_generate(const specd_driver_env *env, const specd_gen_request *req,
                                       const specd_gen_sink *sink, specd_gen_cancel *cancel,
                                       specd_gen_stats *st, specd_error *err) {
    memset(st, 0, sizeof *st);
    st->prompt_tokens = req->n_prompt;
    gen g;
    memset(&g, 0, sizeof g);
    g.env = env;
    g.req = req;
    g.sink = sink;
    g.cancel = cancel;
    g.st = st;
    g.t_start = specd_now_ms();
    g.target_load = 1;
    specd_accept_state_init(&g.acc);
    grpc_status_code code = GRPC_STATUS_OK;
    specd_tpool_member *m = NULL, *failed = NULL;
    int full_waits = 0;    /* RESOURCE_EXHAUSTED answers so far */
    double full_slept = 0; /* ms slept between them */
    int vocab = 0;
    /* Room for the prompt, every token, and one step's overshoot. */
    g.cap_hist = req->n_prompt + req->max_new_tokens + env->max_tree_tokens + 2;
    g.hist = malloc(sizeof(int32_t) * (size_t)g.cap_hist);
    if (!g.hist) {
        specd_seterr(err, "out of memory");
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    memcpy(g.hist, req->prompt, sizeof(int32_t) * (size_t)req->n_prompt);
    g.n_hist = req->n_prompt;
    if (req->drafter) {
        vocab = req->drafter->vocab;
        g.hidden_size = req->drafter->hidden_size;
        if (g.hidden_size > 0 && !(g.hidden = malloc(sizeof(float) * (size_t)g.hidden_size))) {
            code = GRPC_STATUS_RESOURCE_EXHAUSTED;
            specd_seterr(err, "out of memory");
            goto out;
        }
        if (specd_tree_buf_init(&g.tb, env->max_tree_tokens,
                                specd_sampling_is(&req->sampling, SPECD_SAMPLING_REJECTION)
                                    ? (size_t)SPECD_DRAFT_Q_MAX * ((size_t)env->max_tree_tokens + 1)
                                    : 0, err) ||
            price_init(&g.price, env->max_tree_tokens, env->policy)) {
            code = GRPC_STATUS_RESOURCE_EXHAUSTED;
            specd_seterr(err, "out of memory");
            goto out;
        }
        /* pipelined drafting: a drafter that allows it, a request whose
         * tree may follow the guess (ahead_state) */
        if (env->pipeline && req->drafter->draft_ahead && req->drafter->hidden_size == 0 &&
            !specd_sampling_is(&req->sampling, SPECD_SAMPLING_REJECTION)) {
            int acap = 2 * env->max_tree_tokens;
            g.ahead.hist = malloc(sizeof(int32_t) * (size_t)g.cap_hist);
            g.ahead.map = malloc(sizeof(int32_t) * (size_t)acap);
            if (!g.ahead.hist || !g.ahead.map || specd_tree_buf_init(&g.ahead.tb, acap, 0, err)) {
                code = GRPC_STATUS_RESOURCE_EXHAUSTED;
                specd_seterr(err, "out of memory");
                goto out;
            }
            g.ahead.on = 1;
        }
        specd_error derr = {{0}};
        if (specd_drafter_session_open(req->drafter, &g.draft_state, &derr))
            /* Out of drafter capacity (e.g. draft LM slots): this request
             * still runs, just without speculation. */
            fprintf(stderr, "draft-svc: %s drafter: %s; decoding without drafts\n",
                    req->drafter->ops->name, derr.msg);
        else
            g.drafting = 1;
    }
    if (!vocab) {
        specd_target_info info;
        if (specd_tpool_any_info(env->pool, &info, err)) {
            code = GRPC_STATUS_UNAVAILABLE;
            goto out;
        }
        vocab = info.vocab_size;
    }
    if (specd_token_counts_init(&g.counts, vocab, err)) {
        code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        goto out;
    }
    for (int i = 0; i < req->n_prompt; i++) specd_token_counts_add(&g.counts, req->prompt[i], 0);

    for (;;) {
        if (is_cancelled(cancel)) {
            code = GRPC_STATUS_CANCELLED;
            specd_seterr(err, "request cancelled");
            break;
        }
        specd_error perr = {{0}};
        m = specd_tpool_acquire(env->pool, failed, &perr);
        if (!m) {
            code = GRPC_STATUS_UNAVAILABLE;
            specd_seterr(err, "%s", perr.msg);
            if (st->failovers) specd_preferr(err, "after %d failovers", st->failovers);
            break;
        }
        specd_error serr = {{0}};
        grpc_status_code scode = GRPC_STATUS_OK;
        step_rc rc = run_session(&g, m, &scode, &serr);
        if (rc == STEP_DONE) {
            specd_tpool_release(env->pool, m, 0);
            m = NULL;
            code = GRPC_STATUS_OK;
            break;
        }
        if (rc == STEP_RETRY && scode == GRPC_STATUS_RESOURCE_EXHAUSTED) {
            /* The target is healthy but has no free session slot (it is
             * full, or a session that just ended has not given its slot
             * back yet), or it preempted this session to free KV pages, or
             * its queue wait ran out. Not a failure: wait a little and ask
             * again (the pool may pick a less loaded target; a re-open
             * queues on the target, first come, first served, with the
             * history as its prompt). What bounds it: the time slept here,
             * at most open_timeout in all; the time a target held the
             * session (queued, prefilling, running) is its own business
             * (limits.queue_wait, limits.kv_wait), and every token the
             * session produced is kept. */
            specd_tpool_release(env->pool, m, 0);
            m = NULL;
            if (full_slept >= env->open_timeout_ms) {
                code = GRPC_STATUS_RESOURCE_EXHAUSTED;
                specd_seterr(err, "%s", serr.msg);
                specd_preferr(err, "no target had room after %d tries over %.0f ms of waiting",
                              full_waits, full_slept);
                break;
            }
            full_waits++;
            int ms = full_waits < 5 ? 5 << full_waits : 200; /* 10, 20, 40, 80, then 200 ms */
            full_slept += ms;
            struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        if (rc == STEP_FATAL || st->failovers >= env->max_failovers) {
            specd_tpool_release(env->pool, m, 0);
            m = NULL;
            code = scode ? scode : GRPC_STATUS_INTERNAL;
            specd_seterr(err, "%s", serr.msg);
            if (rc == STEP_RETRY) {
                code = GRPC_STATUS_UNAVAILABLE;
                specd_preferr(err, "gave up after %d failovers", st->failovers);
            }
            break;
        }
        /* Another target gets the whole history; the sink has seen every
         * token in it, and only those. */
        fprintf(stderr, "draft-svc: target %s failed (%s: %s); resuming on another target "
                        "after %d tokens\n",
                specd_tpool_member_addr(m), specd_rpc_status_name(scode), serr.msg,
                g.n_gen);
        st->failovers++;
        /* Only compared by address, to steer the next pick elsewhere. */
        failed = m;
        specd_tpool_release(env->pool, m, 1);
        m = NULL;
    }
out:
    st->generated_tokens = g.n_gen;
    if (g.n_gen > 0) {
        double end = specd_now_ms();
        st->ttft_ms = g.t_first - g.t_start;
        st->tpot_ms = g.n_gen > 1 ? (end - g.t_first) / (g.n_gen - 1) : 0;
    }
    if (req->drafter) specd_drafter_session_close(req->drafter, g.draft_state);
    specd_token_counts_free(&g.counts);
    specd_tree_buf_free(&g.tb);
    specd_tree_buf_free(&g.ahead.tb);
    free(g.ahead.hist);
    free(g.ahead.map);
    price_free(&g.price);
    specd_ipc_import_free(g.ipc);
    free(g.hidden);
    free(g.hist);
    return code;
}
