/* policy.h - how much to speculate: load-aware tree sizes and a per-session
 * fallback when acceptance collapses.
 *
 * Two modes (speculation.tree). "cost", the default: greedy requests draft
 * up to max_shape and keep the part of the tree that maximizes expected
 * tokens per unit of target time, possibly nothing (tree_choice.h; the
 * driver runs it). "table": the hand-written load table below decides the
 * shape, and the collapse rule the fallback. Sampled requests and requests
 * that name their own shape always get a fixed shape (below).
 *
 * Load. Verifying a tree costs the target more as the batch grows: at batch
 * 1 the step is bound by reading the weights and extra tree tokens are
 * nearly free, at large batch it is bound by compute and every drafted token
 * that is rejected is pure waste. IBM (and vLLM's measurements) found the
 * best number of candidates falls as batch size grows, and that above some
 * batch speculation should be off so speculative serving is never slower
 * than plain. So the tree shape is a table lookup on the number of sessions
 * active on the target (the target reports it with every step):
 *
 *     load_table: ["1:4x5", "4:2x4", "16:1x3"]   sessions <= 1: 4 paths of 5,
 *                                                <= 4: 2 of 4, <= 16: 1 of 3
 *     off_above: 16                              more sessions: no drafts
 *
 * Collapse. A session whose text the drafter cannot predict (a random
 * string, a language the speculator never saw) pays for trees that are
 * rejected. Each session keeps an exponential moving average of accepted /
 * drafted tokens; when it falls below min_acceptance (after warmup steps),
 * the session decodes plainly for cooldown_steps target steps and then tries
 * again, with the average reset. */
#ifndef SPECD_POLICY_H
#define SPECD_POLICY_H

#include "common/util/error.h"

#define SPECD_POLICY_MAX_RULES 16

typedef struct specd_policy_rule {
    int max_sessions; /* applies while active sessions <= this */
    int candidates, depth;
} specd_policy_rule;

typedef struct specd_policy {
    specd_policy_rule rules[SPECD_POLICY_MAX_RULES]; /* ascending max_sessions */
    int n_rules;
    int off_above;        /* sessions above which speculation is off; 0 = never off */
    double min_acceptance;/* collapse threshold on accepted/drafted; 0 = never */
    double ewma_alpha;    /* weight of the newest step, (0, 1] */
    int warmup_steps;     /* steps before the collapse rule may fire */
    int cooldown_steps;   /* plain steps after a collapse */
    /* Sampled requests: 0 (the default) = the table's first shape at any
     * load, so a seed reproduces whatever else runs; 1 = the load table. */
    int sampled_load_aware;
    /* speculation.tree = cost: greedy trees priced by tree_choice.h, drafted
     * at most max_candidates x max_depth; 0 = the load table */
    int cost_aware;
    int max_candidates, max_depth;
} specd_policy;

/* Parses "CANDIDATESxDEPTH" (speculation.max_shape) into p->max_*. -1 + err
 * naming the field. */
int specd_policy_parse_shape(specd_policy *p, const char *shape, const char *field,
                             specd_error *err);

/* Parses "SESSIONS:CANDIDATESxDEPTH" entries. -1 + err naming the entry
 * ("speculation.load_table[1] = '4:2y4': expected SESSIONS:CANDIDATESxDEPTH"). */
int specd_policy_parse_table(specd_policy *p, char *const *entries, int n, const char *field,
                             specd_error *err);

/* Tree shape for a target with `sessions` active sessions: 1 and *cand,
 * *depth set, or 0 = no speculation at this load. Loads above the last rule
 * (but not above off_above) use the last rule. */
int specd_policy_shape(const specd_policy *p, int sessions, int *cand, int *depth);

/* Tree shape for a request sampled with method REJECTION (seed-exact ones
 * take specd_policy_shape like greedy: their output does not depend on the
 * tree, sampling.h). With rejection
 * sampling the drafts change which random draws the verifier makes, so the
 * output of a seeded request depends on the tree shape: a shape that
 * followed the load would make the seed's output depend on other traffic.
 * So unless sampled_load_aware, it is the shape the request gets on an idle
 * target (the first rule), at any load, and off_above does not apply: the
 * same seed and inputs give what they give on an idle server. 0 = none
 * (no rules). */
int specd_policy_sampled_shape(const specd_policy *p, int sessions, int *cand, int *depth);

typedef struct specd_accept_state {
    double ewma;    /* accepted / drafted, smoothed */
    int steps;      /* drafted steps since the last reset */
    int cooldown;   /* plain steps left */
    int collapses;  /* times the rule fired (stats) */
} specd_accept_state;

void specd_accept_state_init(specd_accept_state *s);
/* 1 if this session may draft on this step (counts a cooldown step down). */
int specd_accept_allows(const specd_policy *p, specd_accept_state *s);
/* After a drafted step: `drafted` tokens on the longest path, `accepted` of them. */
void specd_accept_update(const specd_policy *p, specd_accept_state *s, int drafted,
                         int accepted);

#endif
