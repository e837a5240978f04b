/* session.c - Verify session checks and stop rules (see session.h). */
#include "target-svc/session.h"

#include <stdlib.h>
#include <string.h>

void specd_session_init(specd_session *s, const specd_session_limits *lim) {
    memset(s, 0, sizeof *s);
    s->lim = *lim;
    s->state = SPECD_SESSION_NEW;
    specd_session_sampling_from_proto(NULL, &s->sampling);
}

void specd_session_free(specd_session *s) {
    free(s->prompt);
    free(s->stop_ids);
    free(s->q);
    s->prompt = s->stop_ids = NULL;
    s->q = NULL;
}

void specd_session_sampling_from_proto(const Specd__V1__SamplingParams *p, specd_sampling *out) {
    /* A missing message means greedy, the deterministic default; a zeroed
     * specd_sampling would not be valid (top_p 0), hence the explicit 1. */
    out->temperature = p ? p->temperature : 0.0f;
    out->top_k = p ? p->top_k : 0;
    out->top_p = p && p->top_p != 0.0f ? p->top_p : 1.0f;
    out->min_p = p ? p->min_p : 0.0f;
    out->seed = p ? p->seed : 0;
}

grpc_status_code specd_session_open(specd_session *s, const Specd__V1__VerifyOpen *o,
                                    const char *field, specd_error *err) {
    if (s->state != SPECD_SESSION_NEW)
        return specd_seterr(err, "%s: the session is already open (send Open once)", field),
               GRPC_STATUS_FAILED_PRECONDITION;
    const specd_session_limits *L = &s->lim;
    if (o->n_prompt_ids == 0)
        return specd_seterr(err, "%s.prompt_ids is empty", field), GRPC_STATUS_INVALID_ARGUMENT;
    if (o->n_prompt_ids > (size_t)L->max_prompt_tokens)
        return specd_seterr(err, "%s.prompt_ids has %zu tokens, over the limit of %d", field,
                            o->n_prompt_ids, L->max_prompt_tokens),
               GRPC_STATUS_INVALID_ARGUMENT;
    /* The prompt plus the pending token must fit: prompt < context. */
    if (o->n_prompt_ids >= (size_t)L->context)
        return specd_seterr(err, "%s.prompt_ids has %zu tokens, but the context holds %d", field,
                            o->n_prompt_ids, L->context),
               GRPC_STATUS_INVALID_ARGUMENT;
    for (size_t i = 0; i < o->n_prompt_ids; i++)
        if (o->prompt_ids[i] < 0 || o->prompt_ids[i] >= L->vocab)
            return specd_seterr(err, "%s.prompt_ids[%zu] = %d is outside 0..%d", field, i,
                                o->prompt_ids[i], L->vocab - 1),
                   GRPC_STATUS_INVALID_ARGUMENT;
    specd_sampling sp;
    specd_session_sampling_from_proto(o->sampling, &sp);
    specd_error e2 = {{0}};
    if (specd_sampling_validate(&sp, 0, &e2))
        return specd_seterr(err, "%s.sampling: %s", field, e2.msg), GRPC_STATUS_INVALID_ARGUMENT;
    if (o->max_new_tokens <= 0)
        return specd_seterr(err, "%s.max_new_tokens = %d must be > 0", field, o->max_new_tokens),
               GRPC_STATUS_INVALID_ARGUMENT;
    for (size_t i = 0; i < o->n_stop_ids; i++)
        if (o->stop_ids[i] < 0 || o->stop_ids[i] >= L->vocab)
            return specd_seterr(err, "%s.stop_ids[%zu] = %d is outside 0..%d", field, i,
                                o->stop_ids[i], L->vocab - 1),
                   GRPC_STATUS_INVALID_ARGUMENT;
    s->prompt = malloc(sizeof(int32_t) * o->n_prompt_ids);
    s->stop_ids = malloc(sizeof(int32_t) * (o->n_stop_ids + 1));
    if (!s->prompt || !s->stop_ids)
        return specd_seterr(err, "out of memory"), GRPC_STATUS_RESOURCE_EXHAUSTED;
    memcpy(s->prompt, o->prompt_ids, sizeof(int32_t) * o->n_prompt_ids);
    if (o->n_stop_ids) memcpy(s->stop_ids, o->stop_ids, sizeof(int32_t) * o->n_stop_ids);
    s->n_prompt = (int)o->n_prompt_ids;
    s->n_stop = (int)o->n_stop_ids;
    s->sampling = sp;
    s->max_new_tokens = o->max_new_tokens;
    s->ignore_eos = o->ignore_eos;
    s->return_hidden = o->return_hidden;
    return GRPC_STATUS_OK;
}

grpc_status_code specd_session_tree(specd_session *s, const Specd__V1__VerifyTree *t,
                                    specd_error *err) {
    if (s->state == SPECD_SESSION_NEW)
        return specd_seterr(err, "tree: the session is not open (send Open first)"),
               GRPC_STATUS_FAILED_PRECONDITION;
    if (s->state == SPECD_SESSION_DONE)
        return specd_seterr(err, "tree: the session has finished"),
               GRPC_STATUS_FAILED_PRECONDITION;
    if (t->step != s->step + 1)
        return specd_seterr(err, "tree.step = %u, expected %u (the previous step + 1)", t->step,
                            s->step + 1),
               GRPC_STATUS_INVALID_ARGUMENT;
    if (t->n_tokens == 0)
        return specd_seterr(err, "tree.tokens is empty"), GRPC_STATUS_INVALID_ARGUMENT;
    if (t->n_tokens > (size_t)s->lim.max_tree_tokens)
        return specd_seterr(err, "tree.tokens has %zu nodes, over the limit of %d", t->n_tokens,
                            s->lim.max_tree_tokens),
               GRPC_STATUS_INVALID_ARGUMENT;
    if (t->n_parents != t->n_tokens)
        return specd_seterr(err, "tree.parents has %zu entries, tree.tokens %zu", t->n_parents,
                            t->n_tokens),
               GRPC_STATUS_INVALID_ARGUMENT;
    /* Rows needed: the cache, the pending token and every node. */
    int room = s->lim.context - s->n_past - 1;
    if ((int)t->n_tokens > room)
        return specd_seterr(err, "tree.tokens has %zu nodes, but only %d fit in the context",
                            t->n_tokens, room),
               GRPC_STATUS_INVALID_ARGUMENT;
    int sampling = s->sampling.temperature > 0.0f;
    s->tree = (specd_tree){.n_nodes = (int)t->n_tokens, .tokens = t->tokens,
                           .parents = t->parents, .q = NULL};
    if (sampling) {
        if (t->n_q != t->n_tokens + 1)
            return specd_seterr(err, "tree.q has %zu entries, sampling needs %zu (1 + nodes)",
                                t->n_q, t->n_tokens + 1),
                   GRPC_STATUS_INVALID_ARGUMENT;
        if (s->q_cap < (int)t->n_q) {
            specd_sparse_dist *q = realloc(s->q, sizeof *q * t->n_q);
            if (!q) return specd_seterr(err, "out of memory"), GRPC_STATUS_RESOURCE_EXHAUSTED;
            s->q = q;
            s->q_cap = (int)t->n_q;
        }
        for (size_t i = 0; i < t->n_q; i++) {
            const Specd__V1__DraftDistribution *d = t->q[i];
            if (d->n_ids != d->n_probs)
                return specd_seterr(err, "tree.q[%zu] has %zu ids but %zu probs", i, d->n_ids,
                                    d->n_probs),
                       GRPC_STATUS_INVALID_ARGUMENT;
            s->q[i] = (specd_sparse_dist){(int)d->n_ids, d->ids, d->probs};
        }
        s->tree.q = s->q;
    }
    specd_error e2 = {{0}};
    if (specd_tree_validate(&s->tree, s->lim.vocab, s->lim.max_tree_tokens, sampling, &e2))
        return specd_seterr(err, "%s", e2.msg), GRPC_STATUS_INVALID_ARGUMENT;
    return GRPC_STATUS_OK;
}

int specd_session_emit(specd_session *s, const int32_t *toks, int n, int n_past_after,
                       Specd__V1__FinishReason *finish) {
    *finish = SPECD__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED;
    int kept = 0;
    for (int i = 0; i < n && !*finish; i++) {
        int32_t tok = toks[i];
        kept++;
        s->n_out++;
        if (tok == s->lim.eos_id && !s->ignore_eos) {
            *finish = SPECD__V1__FINISH_REASON__FINISH_REASON_EOS;
            break;
        }
        for (int j = 0; j < s->n_stop; j++)
            if (s->stop_ids[j] == tok) *finish = SPECD__V1__FINISH_REASON__FINISH_REASON_STOP;
        if (!*finish && s->n_out >= s->max_new_tokens)
            *finish = SPECD__V1__FINISH_REASON__FINISH_REASON_LENGTH;
    }
    s->n_past = n_past_after;
    if (kept) s->pending = toks[kept - 1];
    /* The next tree needs the pending token's row plus at least one node. */
    if (!*finish && s->n_past + 2 > s->lim.context)
        *finish = SPECD__V1__FINISH_REASON__FINISH_REASON_CONTEXT;
    s->state = *finish ? SPECD_SESSION_DONE : SPECD_SESSION_OPEN;
    return kept;
}
