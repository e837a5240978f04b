/* policy.c - load table and acceptance-collapse rule (policy.h). */
#include "draft-svc/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int specd_policy_parse_table(specd_policy *p, char *const *entries, int n, const char *field,
                             specd_error *err) {
    if (n > SPECD_POLICY_MAX_RULES)
        return specd_seterr(err, "%s: %d entries, at most %d", field, n, SPECD_POLICY_MAX_RULES);
    p->n_rules = 0;
    for (int i = 0; i < n; i++) {
        int s, c, d, used = 0;
        if (sscanf(entries[i], "%d:%dx%d%n", &s, &c, &d, &used) != 3 ||
            entries[i][used] != 0)
            return specd_seterr(err, "%s[%d] = '%s': expected SESSIONS:CANDIDATESxDEPTH, e.g. 4:2x4",
                                field, i, entries[i]);
        if (s < 1 || c < 1 || c > 64 || d < 1 || d > 64)
            return specd_seterr(err,
                                "%s[%d] = '%s': need sessions >= 1, candidates and depth in 1..64",
                                field, i, entries[i]);
        if (i && s <= p->rules[i - 1].max_sessions)
            return specd_seterr(err, "%s[%d] = '%s': session counts must increase", field, i,
                                entries[i]);
        p->rules[p->n_rules++] = (specd_policy_rule){s, c, d};
    }
    return 0;
}

int specd_policy_parse_shape(specd_policy *p, const char *shape, const char *field,
                             specd_error *err) {
    int c, d, used = 0;
    if (!shape || sscanf(shape, "%dx%d%n", &c, &d, &used) != 2 || shape[used] != 0)
        return specd_seterr(err, "%s = '%s': expected CANDIDATESxDEPTH, e.g. 4x6", field,
                            shape ? shape : "");
    if (c < 1 || c > 64 || d < 1 || d > 64)
        return specd_seterr(err, "%s = '%s': candidates and depth must be in 1..64", field, shape);
    p->max_candidates = c;
    p->max_depth = d;
    return 0;
}

int specd_policy_shape(const specd_policy *p, int sessions, int *cand, int *depth) {
    if (p->n_rules == 0) return 0;
    if (p->off_above > 0 && sessions > p->off_above) return 0;
    const specd_policy_rule *r = &p->rules[p->n_rules - 1];
    for (int i = 0; i < p->n_rules; i++)
        if (sessions <= p->rules[i].max_sessions) {
            r = &p->rules[i];
            break;
        }
    *cand = r->candidates;
    *depth = r->depth;
    return 1;
}

int specd_policy_sampled_shape(const specd_policy *p, int sessions, int *cand, int *depth) {
    if (p->sampled_load_aware) return specd_policy_shape(p, sessions, cand, depth);
    if (p->n_rules == 0) return 0;
    *cand = p->rules[0].candidates;
    *depth = p->rules[0].depth;
    return 1;
}

void specd_accept_state_init(specd_accept_state *s) {
    memset(s, 0, sizeof *s);
    s->ewma = 1.0; /* optimistic: every session starts out speculating */
}

int specd_accept_allows(const specd_policy *p, specd_accept_state *s) {
    (void)p;
    if (s->cooldown > 0) {
        s->cooldown--;
        if (s->cooldown == 0) { /* try again from a clean slate */
            s->ewma = 1.0;
            s->steps = 0;
        }
        return 0;
    }
    return 1;
}

void specd_accept_update(const specd_policy *p, specd_accept_state *s, int drafted,
                         int accepted) {
    if (drafted <= 0) return;
    double rate = (double)accepted / drafted;
    double a = p->ewma_alpha > 0 && p->ewma_alpha <= 1 ? p->ewma_alpha : 0.2;
    s->ewma = (1 - a) * s->ewma + a * rate;
    s->steps++;
    if (p->min_acceptance > 0 && s->steps >= p->warmup_steps && s->ewma < p->min_acceptance &&
        p->cooldown_steps > 0) {
        s->cooldown = p->cooldown_steps;
        s->collapses++;
    }
}
