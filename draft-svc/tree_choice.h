/* tree_choice.h - which drafted tokens are worth verifying: acceptance
 * estimates, and the tree that maximizes expected tokens per unit of target
 * time (the empty tree, plain decoding, included).
 *
 * Greedy verification accepts a node exactly when every node on its path
 * matches the target's argmax. So with p(v) the chance that node v's path
 * is accepted, a tree T gives 1 + sum_{v in T} p(v) tokens in expectation
 * (the 1 is the target's own next token, which every step yields), and
 * costs one forward pass with |T| more rows. p is a product along the path
 * of conditional chances, each at most 1, so a child never beats its
 * parent: the best tree of n nodes is simply the n nodes of highest p (ties
 * to the shallower node, then the lower index), which is closed under
 * parents. The choice is the n that maximizes
 *
 *         (L + sum of the top n p)  /  (overhead + cost(R + 1 + n) + D * stage)
 *
 * (n = 0, a plain step, without the overhead where the target runs plain
 * steps by itself: specd_tree_price.plain_runs)
 * where cost is the target's measured forward-pass curve (common/
 * step_cost.h), L the sessions in the pass (the other L - 1 each yield at
 * least one token), R the rows the other sessions bring, and overhead the
 * step's time outside the forward pass, D the depth of the n nodes and
 * stage the drafter's time per level (with it the n best by p are a
 * close, not an exact, optimum: a shallower node of slightly lower p can be
 * worth more). That is the pass's tokens per microsecond: at one session
 * it is this stream's speed, under load the whole target's, so a tree that
 * slows everyone else down for a small gain here is not sent. n = 0 is a
 * plain step, so a step is never priced worse than plain decoding.
 *
 * The driver chooses twice from each drafted tree: the shape to draft
 * again, with stage counted (a tree drafted every step costs its levels
 * every step), and the nodes to send, with stage 0 (this draft's time is
 * spent already, so a node goes out when it pays for its row).
 *
 * Where p comes from. A drafter scores each node with its conditional
 * chance of acceptance given its parent was accepted: the draft's own
 * conditional probability, or the drafter's score where it sets one (the
 * merged tree's lookup nodes, tree_builder.h). Scores are biased (a draft
 * model is overconfident, a prompt-lookup match says little), so a calibrator maps
 * (depth, rank among siblings, score bin) to the acceptance rate actually
 * observed there, over every step of every session of the drafter, with
 * the score itself as the prior; each session then scales that by how its
 * own recent steps did against their predictions (a code prompt accepts
 * more than a poem).
 *
 * Seed-exact sampling (the default method) verifies by exact match like
 * greedy (the race's winner at each row), so its trees are priced the same
 * way, with p the chance that the draft's race and the target's agree.
 * Rejection sampling does not prune: a node's children must be drawn i.i.d.
 * in a number fixed before the draw (tree_builder.h), and a seed must
 * reproduce whatever the timing, so those requests keep a fixed shape
 * (policy.h). */
#ifndef SPECD_TREE_CHOICE_H
#define SPECD_TREE_CHOICE_H

#include <pthread.h>
#include <stdint.h>

#include "common/spec/step_cost.h"
#include "draft-svc/tree_builder.h"

#define SPECD_CALIB_DEPTHS 8 /* deeper nodes share the last row */
#define SPECD_CALIB_RANKS 3  /* first, second, any later sibling */
/* Score bins: width 0.1 up to 0.9, then [0.9, 0.95), [0.95, 0.98),
 * [0.98, 0.99) and [0.99, 1]. A third of the speculator's drafted tokens
 * score 0.9 or more, and their acceptance still climbs there, from 0.78 to
 * 0.96 at depth 1 on the held-out prompts; one bin averaged them, so a
 * 0.995 chain of four was priced as 0.88^4 instead of about 0.96^4
 * (docs/BENCHMARKS.md, thirty-sixth session). */
#define SPECD_CALIB_BINS 13
/* The bin of a score in [0, 1] (NaN and below 0: bin 0), and bin b's
 * range [*lo, *hi) (the last one holds 1 too). */
int specd_calib_bin(float score);
void specd_calib_bin_range(int b, float *lo, float *hi);
/* No node is ever certain: a calibrated chance stops here, so a long
 * confident chain still costs something per node. */
#define SPECD_P_MAX 0.99f

/* Observed acceptance by (source, depth, rank, score bin), one per drafter, shared by
 * its sessions (internally locked). Counts are halved once a cell holds
 * SPECD_CALIB_WINDOW tries, so the table follows drift. */
#define SPECD_CALIB_WINDOW 4096
/* Load buckets of the drafter-wide gain: 1, 2-3, 4-7, 8-15, 16+ sessions. */
#define SPECD_CALIB_LOADS 5
typedef struct specd_accept_calib {
    pthread_mutex_t mu;
    /* by node source (tree_builder.h: SPECD_SRC_*), depth, rank, score bin */
    float tried[SPECD_N_SRC][SPECD_CALIB_DEPTHS][SPECD_CALIB_RANKS][SPECD_CALIB_BINS];
    float accepted[SPECD_N_SRC][SPECD_CALIB_DEPTHS][SPECD_CALIB_RANKS][SPECD_CALIB_BINS];
    /* The drafter's recent gain over plain steps, smoothed over every
     * session's drafted steps (the driver's): a new session starts out
     * decoding plainly for a few steps when drafting has not been paying,
     * instead of paying a draft to find that out again. 1 = no verdict.
     * One per load bucket: whether a tree pays depends on the batch it
     * rides in, and one shared verdict learned under 16 streams kept a
     * lone stream that came later from drafting (tau 1.03 where the same
     * stream alone drafted at tau 1.39). */
    double gain[SPECD_CALIB_LOADS];
    /* The trees sent, per load bucket: their predicted accepted tokens (the
     * calibration times the sessions' scales) and what was accepted, sums
     * that fade (SPECD_CALIB_SENT_KEEP per tree). A tree is sent because
     * its estimate came out high, so the sent trees' estimates run high
     * even where each cell is right (25-28% on the held-out prompts, at 1
     * and at 4 streams): their ratio, specd_accept_calib_bias, scales
     * every estimate back. Where a tree barely pays, as under load on a
     * CPU, that was the difference between a loss and none. */
    double sent_pred[SPECD_CALIB_LOADS], sent_acc[SPECD_CALIB_LOADS];
    /* ... and their nodes (fading the same way): sent_acc / sent_nodes is
     * what a sent node earns at that load, specd_accept_calib_yield */
    double sent_nodes[SPECD_CALIB_LOADS];
    /* The drafter's time per tree level in microseconds, smoothed over
     * every session's drafts (0 = none yet): what a new session prices its
     * first trees with, before it has timed drafts of its own. */
    double stage_us;
} specd_accept_calib;

/* Reads / folds in the drafter-wide time per level (thread-safe), with
 * specd_draft_time_smooth. */
double specd_accept_calib_stage(specd_accept_calib *c);
void specd_accept_calib_note_stage(specd_accept_calib *c, double us);

/* A draft time counts as at most this many times the estimate. */
#define SPECD_DRAFT_OUTLIER_X 4.0

/* A smoothed draft time with one more sample: the sample itself when there
 * is no estimate yet (est <= 0), else the moving average with weight
 * alpha, the sample capped at SPECD_DRAFT_OUTLIER_X times the estimate (a
 * draft preempted on a busy core must not price every tree out). */
double specd_draft_time_smooth(double est, double sample, double alpha);

/* Weight kept by the sent-tree sums per tree folded in (about the last
 * 50 trees count), and the pseudo-tokens on both sides of their ratio. */
#define SPECD_CALIB_SENT_KEEP 0.98
#define SPECD_CALIB_SENT_PRIOR 2.0

/* The factor that brings sent trees' estimates to what they earn at a
 * load of `sessions`: (accepted + prior) / (predicted + prior), in
 * [0.25, 2]; 1 before anything was sent. Thread-safe. */
float specd_accept_calib_bias(specd_accept_calib *c, int sessions);
/* Folds in a sent tree: its prediction (without the bias), its nodes and
 * the tokens accepted. Thread-safe. */
void specd_accept_calib_note_sent(specd_accept_calib *c, int sessions, double predicted,
                                  int nodes, int accepted);
/* Accepted tokens per sent node at a load of `sessions`: accepted /
 * (nodes + prior), so 0 before anything was sent (the others' trees then
 * count for nothing, as before the target reported them). Thread-safe. */
double specd_accept_calib_yield(specd_accept_calib *c, int sessions);

/* Reads / folds in the drafter-wide gain at a target load of `sessions`
 * (thread-safe). */
double specd_accept_calib_gain(specd_accept_calib *c, int sessions);
void specd_accept_calib_note_gain(specd_accept_calib *c, int sessions, double gain);

void specd_accept_calib_init(specd_accept_calib *c);
void specd_accept_calib_destroy(specd_accept_calib *c);

/* Per node of a drafted tree: its score (conditional acceptance chance as
 * the drafter sees it, in [0, 1]) and its rank among its siblings (0 = the
 * drafter's favourite). From the tree's pcond where the drafter set it,
 * else from logq: exp(logq(node) - logq(parent)). */
void specd_tree_scores(const specd_tree_buf *t, float *score, uint8_t *rank);

/* p(v) for every node: the calibrated conditional chances, times `scale`
 * (capped at 0.99), multiplied along the path. Parents precede children in
 * the tree (tree_builder.h), so one pass does it. */
void specd_accept_estimate(specd_accept_calib *c, const specd_tree_buf *t, const float *score,
                           const uint8_t *rank, float scale, float *p_path);

/* After a step: every node whose parent was accepted (the root's children,
 * and the children of each accepted node) was tried; the accepted ones are
 * accepted_nodes[0..n_acc). */
void specd_accept_calib_update(specd_accept_calib *c, const specd_tree_buf *t,
                               const float *score, const uint8_t *rank,
                               const int32_t *accepted_nodes, int n_acc);

/* What a first-level node (depth 1, rank 0) has been accepted at, over
 * every score bin (the trees sent, so after pruning); of a drafter with a
 * lookup part (tree_builder.h), the better of its model's sources, MODEL
 * and BOTH: the check it serves is whether drafting, which costs the
 * model's time, pays (the lookup's part is drafted anyway). Times `scale`,
 * capped like every estimate; 0.5 before anything was tried. Before
 * drafting, it says what a tree is likely to earn (specd_tree_could_pay).
 * Not the best bin: a node lands there only now and then, and drafting
 * every step in the hope of one cost more than it earned under load. */
float specd_accept_calib_first(specd_accept_calib *c, float scale);

typedef struct specd_tree_price {
    specd_step_cost cost;  /* the target's forward-pass curve */
    int sessions;          /* L: sessions in the pass, this one included (>= 1) */
    int other_tokens;      /* R: rows the other sessions bring */
    /* E: tokens the other sessions' tree nodes in the pass are expected to
     * add (their draft rows times the accepted share of sent nodes,
     * specd_accept_calib_yield). The pass's time buys them too, so every
     * rate counts them: (L + E + e) / time. Counting only L, a session
     * saw a pass already swollen by the others' trees as a low bar and
     * added rows of its own, and every session did: at 16 streams on a
     * repetitive text tau 3.19 at 0.95x plain, the pass 4 times the rows. */
    double other_expected;
    double overhead_us;    /* per-step time outside the forward pass */
    /* 1 when a plain step need not pay overhead_us: this target runs plain
     * steps by itself (a plain run, VerifyTree.plain_steps), which is what
     * declining to draft leads to, so a plain step saves the round trip as
     * well as the rows. A tree step still pays it, under load too: the
     * pass waits for the trees it carries while the others' plain steps
     * are already queued. 0 = plain and tree steps pay it alike. */
    int plain_runs;
    /* draft time per tree level: a kept tree of depth D is drafted again
     * next step (the driver drafts the kept shape), so its D levels are
     * charged D * stage_us. 0 = drafting is free (tests, nothing seen) */
    double stage_us;
} specd_tree_price;

typedef struct specd_tree_pick {
    int n_keep;       /* nodes chosen (0 = a plain step) */
    double expected;  /* sum of p over them: expected accepted tokens */
    double rate;      /* (L + E + expected) / time of the chosen step, tokens/us */
    double plain_rate;/* (L + E) / time of a plain step */
} specd_tree_pick;

/* R of a price: the rows the other sessions bring to our next pass, read
 * off the last one (batch_tokens rows, our_rows of them ours, prompt_rows
 * of them prefill chunks, StepTimings). Not its prompt rows: a chunk rides
 * in a pass or a few while a session starts, not in the steady passes a
 * tree is priced for, and a pass swollen by it yields no more tokens, so
 * its rate (L + E) / time looked low and a row beside it cheap. Under load
 * in a benchmark whose requests start every few passes, trees accepted at
 * 50-65% went out in such passes, where on a CPU a row must be accepted
 * at about 85% to pay (docs/BENCHMARKS.md, twenty-eighth session). Never
 * below 0. */
int specd_tree_other_rows(int batch_tokens, int our_rows, int prompt_rows);

/* Whether a one-node tree accepted with chance p, drafted in one stage
 * (pr->stage_us), could beat a plain step at this price. Path chances only fall with depth
 * and the curve's extra rows cost about the same each, so when the likely
 * first node does not pay, a tree is unlikely to, and the session skips the
 * drafter for the step instead of drafting a tree only to discard it. On a
 * CPU under load a row costs nearly what a plain one does (at 4 sessions
 * one more row adds 19% to a pass of 4), and drafting there to find that
 * out again cost 10-20% of throughput. The draft time counts as target
 * time: on shared cores it is. Nothing measured yet: 1. */
int specd_tree_could_pay(float p, const specd_tree_price *pr);

/* Whether the drafter's time alone leaves a sure node (SPECD_P_MAX) worth
 * drafting: the same rate as specd_tree_could_pay with the node's row
 * costing the target nothing. Only the drafter's stage time and a plain
 * step (the most measured point of the curve) enter it, so a curve point
 * measured high during a burst on shared cores cannot make it say no; a
 * draft model about as slow per token as the target can. */
int specd_tree_drafting_could_pay(const specd_tree_price *pr);

/* Whether a session alone does better in a plain run than drafting on,
 * judged by what its drafting has actually won (the tree choice above
 * judges by predictions). A drafted step pays a round trip
 * (rt_overhead_us beyond the pass) where a run's step pays run_overhead_us,
 * plus extra_us of its own (drafting, and the rows it sends: the mean over
 * its drafted steps); it has won look_tokens accepted draft tokens in
 * look_steps drafted steps, each token worth a run's step (pass_us +
 * run_overhead_us). 1 when the step's extra cost exceeds that yield. The
 * yield starts as one token on one step, so a session drafts on until its
 * own steps say otherwise. Nothing measured (pass_us <= 0): 0. */
int specd_tree_run_pays(double rt_overhead_us, double run_overhead_us, double extra_us,
                        double pass_us, int look_steps, int look_tokens);

/* L + E of a price: the tokens its pass yields besides this session's
 * accepted nodes (the numerator's fixed part in every rate above). */
double specd_tree_base_tokens(const specd_tree_price *pr);

/* Marks the chosen nodes in keep[0..n). levels[i]: the drafting stages
 * node i took, what D counts (NULL = its depth; 0 for a lookup's node,
 * which costs no stage). With no cost curve yet (nothing measured) every
 * node is kept: the first steps cannot be priced. */
void specd_tree_choose(const float *p_path, const int32_t *depth, const int32_t *levels, int n,
                       const specd_tree_price *pr, uint8_t *keep, specd_tree_pick *out);

/* The chance of acceptance one more node must have to pay for itself on
 * top of the chosen tree `pick`: its row in the pass plus `levels` more
 * drafter stages, at the pick's rate ((L + E + e + p) / (T + dT) beats
 * (L + E + e) / T exactly when p > rate * dT). The driver grows the shape
 * it drafts next only where the next node is likely to clear this: a
 * drafted node that is then priced out cost its stage for nothing. 0 when
 * nothing is measured yet (every node pays then). */
double specd_tree_break_even(const specd_tree_price *pr, const specd_tree_pick *pick, int levels);

#endif
