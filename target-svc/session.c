/* session.c - Verify session checks and stop rules (see session.h). */
#include "target-svc/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc/admission.h"

void specd_session_init(specd_session *s, const specd_session_limits *lim) {
    memset(s, 0, sizeof *s);
    s->lim = *lim;
    s->state = SPECD_SESSION_NEW;
    /* Greedy until an Open says otherwise. */
    specd_sampling_init(&s->sampling);
    s->sampling.temperature = 0.0f;
}

void specd_session_free(specd_session *s) {
    free(s->prompt);
    free(s->stop_ids);
    free(s->q);
    free(s->bias_ids);
    free(s->bias_values);
    specd_token_counts_free(&s->counts);
    s->prompt = s->stop_ids = s->bias_ids = NULL;
    s->bias_values = NULL;
    s->q = NULL;
    s->sampling.n_logit_bias = 0;
    s->sampling.bias_ids = NULL;
    s->sampling.bias_values = NULL;
}

uint64_t specd_session_position(const specd_session *s) {
    return (uint64_t)s->resumed + (uint64_t)s->n_out;
}

const specd_token_counts *specd_session_counts(const specd_session *s) {
    return s->counts.vocab > 0 ? &s->counts : NULL;
}

grpc_status_code specd_session_check_open(const specd_session *s,
                                          const specd_session_open_req *o, const char *field,
                                          specd_error *err) {
    /* s->prompt set while still NEW: an Open was taken but its first token
     * not yet emitted; a second one would leak the first's settings. */
    if (s->state != SPECD_SESSION_NEW || s->prompt)
        return specd_seterr(err, "%s: the session is already open (send Open once)", field),
               GRPC_STATUS_FAILED_PRECONDITION;
    const specd_session_limits *L = &s->lim;
    if (o->n_prompt_ids == 0)
        return specd_seterr(err, "%s.prompt_ids is empty", field), GRPC_STATUS_INVALID_ARGUMENT;
    /* Resumed tokens are part of the prompt, so at least one real prompt id
     * must precede them. */
    if (o->resumed_tokens < 0 || (size_t)o->resumed_tokens >= o->n_prompt_ids)
        return specd_seterr(err, "%s.resumed_tokens = %d must be in 0..%zu (fewer than the %zu "
                                 "prompt_ids)", field, o->resumed_tokens, o->n_prompt_ids - 1,
                            o->n_prompt_ids),
               GRPC_STATUS_INVALID_ARGUMENT;
    /* max_prompt_tokens bounds the prefill a client may ask for; tokens it
     * already paid for on a lost target do not count against it. The prompt
     * plus the pending token must fit the context. One rule for both
     * services (common/rpc/admission.h). */
    char pfield[64];
    snprintf(pfield, sizeof pfield, "%s.prompt_ids", field);
    specd_admission_limits adm = {.context = L->context, .max_prompt_tokens = L->max_prompt_tokens};
    grpc_status_code pcode =
        specd_admit_prompt(&adm, pfield, o->n_prompt_ids, (size_t)o->resumed_tokens, err);
    if (pcode) return pcode;
    for (size_t i = 0; i < o->n_prompt_ids; i++)
        if (o->prompt_ids[i] < 0 || o->prompt_ids[i] >= L->vocab)
            return specd_seterr(err, "%s.prompt_ids[%zu] = %d is outside 0..%d", field, i,
                                o->prompt_ids[i], L->vocab - 1),
                   GRPC_STATUS_INVALID_ARGUMENT;
    if (o->max_new_tokens <= 0)
        return specd_seterr(err, "%s.max_new_tokens = %d must be > 0", field, o->max_new_tokens),
               GRPC_STATUS_INVALID_ARGUMENT;
    /* stop ids and logprobs options: draft-svc's words (common/rpc/admission.h) */
    return specd_admit_outputs(field, o->stop_ids, o->n_stop_ids, o->logprobs, o->top_logprobs,
                               L->vocab, err);
}

grpc_status_code specd_session_open_plain(specd_session *s, specd_session_open_req *o,
                                          const char *field, specd_error *err) {
    int32_t *bias_ids = o->bias_ids;
    float *bias_values = o->bias_values;
    o->bias_ids = NULL;
    o->bias_values = NULL;
    grpc_status_code code = specd_session_check_open(s, o, field, err);
    if (code) {
        free(bias_ids);
        free(bias_values);
        return code;
    }
    const specd_session_limits *L = &s->lim;
    size_t n_new_prompt = o->n_prompt_ids - (size_t)o->resumed_tokens;
    specd_sampling sp = o->sampling;
    specd_error e2 = {{0}};
    /* Counts only when something reads them: a vocabulary-sized table per
     * session is memory (and an O(prompt) pass) that plain sampling does not
     * need. */
    specd_token_counts counts;
    memset(&counts, 0, sizeof counts);
    if (specd_sampling_adjusts_logits(&sp) && specd_token_counts_init(&counts, L->vocab, &e2)) {
        free(bias_ids);
        free(bias_values);
        return specd_seterr(err, "%s", e2.msg), GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    int32_t *prompt = malloc(sizeof(int32_t) * o->n_prompt_ids);
    int32_t *stop_ids = malloc(sizeof(int32_t) * (o->n_stop_ids + 1));
    if (!prompt || !stop_ids) {
        free(prompt);
        free(stop_ids);
        free(bias_ids);
        free(bias_values);
        specd_token_counts_free(&counts);
        return specd_seterr(err, "out of memory"), GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    memcpy(prompt, o->prompt_ids, sizeof(int32_t) * o->n_prompt_ids);
    if (o->n_stop_ids) memcpy(stop_ids, o->stop_ids, sizeof(int32_t) * o->n_stop_ids);
    /* The history the penalties see: the prompt proper, then the resumed
     * tokens as generated ones, exactly as the lost session had counted. */
    if (counts.vocab > 0)
        for (size_t i = 0; i < o->n_prompt_ids; i++)
            specd_token_counts_add(&counts, prompt[i], i >= n_new_prompt);
    /* Only now is the session changed, so a refused Open leaves it as it was
     * (a later Open may still succeed). */
    s->prompt = prompt;
    s->stop_ids = stop_ids;
    s->bias_ids = bias_ids;
    s->bias_values = bias_values;
    s->counts = counts;
    s->n_prompt = (int)o->n_prompt_ids;
    s->n_stop = (int)o->n_stop_ids;
    s->sampling = sp;
    s->max_new_tokens = o->max_new_tokens;
    s->ignore_eos = o->ignore_eos;
    s->return_hidden = o->return_hidden;
    s->resumed = o->resumed_tokens;
    s->logprobs = o->logprobs;
    s->top_logprobs = o->top_logprobs;
    return GRPC_STATUS_OK;
}

grpc_status_code specd_session_tree(specd_session *s, const specd_session_tree_req *t,
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
    if (t->n_tokens > (size_t)s->lim.max_tree_tokens)
        return specd_seterr(err, "tree.tokens has %zu nodes, over the limit of %d", t->n_tokens,
                            s->lim.max_tree_tokens),
               GRPC_STATUS_INVALID_ARGUMENT;
    if (t->n_parents != t->n_tokens)
        return specd_seterr(err, "tree.parents has %zu entries, tree.tokens %zu", t->n_parents,
                            t->n_tokens),
               GRPC_STATUS_INVALID_ARGUMENT;
    if (t->plain_steps > (uint32_t)s->max_new_tokens)
        return specd_seterr(err, "tree.plain_steps = %u, over this session's max_new_tokens %d",
                            t->plain_steps, s->max_new_tokens),
               GRPC_STATUS_INVALID_ARGUMENT;
    if (t->hidden_via_ipc && !s->ipc_granted)
        return specd_seterr(err, "tree.hidden_via_ipc is set, but this session has no CUDA IPC "
                                 "grant (step 0 carried none)"),
               GRPC_STATUS_INVALID_ARGUMENT;
    /* Rows needed: the cache, the pending token and every node. */
    int room = s->lim.context - s->n_past - 1;
    if ((int)t->n_tokens > room)
        return specd_seterr(err, "tree.tokens has %zu nodes, but only %d fit in the context",
                            t->n_tokens, room),
               GRPC_STATUS_INVALID_ARGUMENT;
    /* Only rejection sampling reads the draft's q. Seed-exact sampling
     * accepts by exact match, like greedy, so a q sent anyway is ignored. */
    int sampling = specd_sampling_is(&s->sampling, SPECD_SAMPLING_REJECTION);
    s->tree = (specd_tree){.n_nodes = (int)t->n_tokens, .tokens = t->tokens,
                           .parents = t->parents, .q = NULL};
    /* An empty tree (a plain step) has no draws, so it needs no q. */
    if (sampling && t->n_tokens > 0) {
        if (t->n_q != t->n_tokens + 1)
            return specd_seterr(err, "tree.q has %zu entries, sampling needs %zu (1 + nodes)",
                                t->n_q, t->n_tokens + 1),
                   GRPC_STATUS_INVALID_ARGUMENT;
        if (t->bad_q >= 0)
            return specd_seterr(err, "tree.q[%ld] has %zu ids but %zu probs", t->bad_q,
                                t->bad_q_ids, t->bad_q_probs),
                   GRPC_STATUS_INVALID_ARGUMENT;
        s->tree.q = t->q;
    }
    specd_error e2 = {{0}};
    if (specd_tree_validate(&s->tree, s->lim.vocab, s->lim.max_tree_tokens, sampling, &e2))
        return specd_seterr(err, "%s", e2.msg), GRPC_STATUS_INVALID_ARGUMENT;
    return GRPC_STATUS_OK;
}

/* EOS or one of the model's other end-of-generation tokens. */
static int session_is_end(const specd_session_limits *lim, int32_t tok) {
    if (tok == lim->eos_id) return 1;
    for (int i = 0; i < lim->n_end_ids; i++)
        if (lim->end_ids[i] == tok) return 1;
    return 0;
}

int specd_session_emit(specd_session *s, const int32_t *toks, int n, int n_past_after,
                       specd_finish *finish) {
    *finish = SPECD_FINISH_NONE;
    int kept = 0;
    for (int i = 0; i < n && !*finish; i++) {
        int32_t tok = toks[i];
        kept++;
        s->n_out++;
        /* Emitted tokens are history for the next position's penalties; a
         * no-op when the session keeps no counts (vocab 0). */
        specd_token_counts_add(&s->counts, tok, 1);
        if (session_is_end(&s->lim, tok) && !s->ignore_eos) {
            *finish = SPECD_FINISH_EOS;
            break;
        }
        for (int j = 0; j < s->n_stop; j++)
            if (s->stop_ids[j] == tok) *finish = SPECD_FINISH_STOP;
        if (!*finish && s->n_out >= s->max_new_tokens)
            *finish = SPECD_FINISH_LENGTH;
    }
    s->n_past = n_past_after;
    if (kept) s->pending = toks[kept - 1];
    /* The next tree needs the pending token's row plus at least one node. */
    if (!*finish && s->n_past + 2 > s->lim.context)
        *finish = SPECD_FINISH_CONTEXT;
    s->state = *finish ? SPECD_SESSION_DONE : SPECD_SESSION_OPEN;
    return kept;
}
