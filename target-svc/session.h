/* session.h - the Verify session state machine, without the model.
 *
 * A Verify stream is one session:
 *
 *     NEW --Open--> (prefill) --step 0--> OPEN --Tree k--> (verify) --> OPEN ...
 *                                          \__ a finish reason --> DONE
 *
 * This file holds everything about a session that does not need the model:
 * checking Open and Tree messages against the limits (so the fuzz target can
 * drive it with arbitrary bytes), and deciding where generation stops. The
 * service (service.c) couples it to the scheduler. Every check answers with a
 * gRPC status code and a message naming the offending field, e.g.
 * "tree.parents[3] = 5 is not -1 or an earlier node". */
#ifndef SPECD_SESSION_H
#define SPECD_SESSION_H

#include <stdint.h>

#include <grpc/status.h>

#include "common/util/error.h"
#include "common/spec/sampling.h"
#include "common/spec/verify.h"

#define SPECD_SESSION_MAX_END 8

typedef struct specd_session_limits {
    int vocab;             /* token ids are 0..vocab-1 */
    int context;           /* cache rows per session (the slot size) */
    int max_prompt_tokens;
    int max_tree_tokens;
    int eos_id;            /* -1 if the model has none */
    /* More tokens that end a generation as EOS does (finish EOS): the chat
     * families' end-of-turn markers that the GGUF's single EOS id misses,
     * e.g. Llama 3's <|eot_id|> where EOS is <|end_of_text|>
     * (specd_tokenizer_end_ids). */
    int32_t end_ids[SPECD_SESSION_MAX_END];
    int n_end_ids;
} specd_session_limits;

typedef enum specd_session_state {
    SPECD_SESSION_NEW,  /* waiting for Open */
    SPECD_SESSION_OPEN, /* has a pending token, waiting for a Tree */
    SPECD_SESSION_DONE, /* a finish reason was sent */
} specd_session_state;

typedef struct specd_session {
    specd_session_limits lim;
    specd_session_state state;
    /* From Open (owned copies). */
    int32_t *prompt;
    int n_prompt;
    specd_sampling sampling;
    int max_new_tokens;
    int32_t *stop_ids;
    int n_stop;
    int ignore_eos, return_hidden;
    int32_t *bias_ids;  /* sampling.bias_ids / bias_values point here */
    float *bias_values;
    /* Failover resume: the last `resumed` prompt ids were generated on
     * another target. They count as generated for the penalties, and output
     * indices (rng streams) continue after them. */
    int resumed;
    int logprobs, top_logprobs; /* Open.logprobs (0/1), Open.top_logprobs */
    /* Prompt + every emitted token (pending included) for the penalties;
     * allocated only when specd_sampling_adjusts_logits(&sampling), else
     * zeroed (vocab 0) and the session passes NULL to the model work. */
    specd_token_counts counts;
    /* Progress. */
    uint32_t step;   /* last answered step (0 after Open) */
    int n_past;      /* cache rows */
    int32_t pending; /* last emitted token, not yet in the cache */
    int n_out;       /* tokens emitted by this session (pending included); not
                      * the resumed ones, so max_new_tokens counts new tokens */
    /* The current Tree, pointing into the request message (valid while it
     * lives), plus the q table converted to the verifier's form. */
    specd_tree tree;
    specd_sparse_dist *q;
    int q_cap;
    /* Co-location (common/rpc/ipc_caps.h): 1 once step 0 carried a CUDA IPC
     * grant; only then may a Tree set hidden_via_ipc. Set by the service. */
    int ipc_granted;
} specd_session;

void specd_session_init(specd_session *s, const specd_session_limits *lim);
void specd_session_free(specd_session *s);


/* Output index of the next token this session emits after its pending one
 * (resumed + n_out): the `position` of the session's model work. */
uint64_t specd_session_position(const specd_session *s);

/* The penalty history to hand to the model work: &s->counts, or NULL when
 * no penalty or bias is on. */
const specd_token_counts *specd_session_counts(const specd_session *s);

/* An Open as plain C: what a Verify Open (or a Generate request, which is
 * a session whose every tree is empty) asks of a session. The services
 * convert their messages into this once (target-svc/service.c). The arrays
 * are the caller's and are copied, except the sampling's logit-bias arrays
 * (sampling.bias_ids/bias_values point into bias_ids/bias_values), which
 * specd_session_open_plain takes over, success or not. */
typedef struct specd_session_open_req {
    const int32_t *prompt_ids;
    size_t n_prompt_ids;
    int resumed_tokens;   /* the last ones of prompt_ids were generated elsewhere */
    int max_new_tokens;
    const int32_t *stop_ids;
    size_t n_stop_ids;
    int ignore_eos, return_hidden, logprobs, top_logprobs;
    specd_sampling sampling; /* converted and validated by the caller */
    int32_t *bias_ids;
    float *bias_values;
} specd_session_open_req;

/* The checks of an Open that come before its sampling parameters (the
 * session's state, the prompt, resumed tokens, max_new_tokens, stop ids and
 * logprobs options): what a caller runs before converting the sampling, so
 * a request with several faults is told about the first. field names the
 * message in errors ("open", "request"). */
grpc_status_code specd_session_check_open(const specd_session *s,
                                          const specd_session_open_req *o, const char *field,
                                          specd_error *err);
/* Checks an Open and takes its settings: GRPC_STATUS_OK, or
 * FAILED_PRECONDITION (not the first message) / INVALID_ARGUMENT /
 * RESOURCE_EXHAUSTED (no memory) + err. On OK the caller prefills s->prompt
 * and then calls specd_session_emit with the first token, drawn at output
 * index s->resumed. field names the message in errors ("open" ->
 * "open.prompt_ids[2] = ..."). Limits: max_prompt_tokens applies to the new
 * prompt (n_prompt - resumed), the context to the whole prompt. A refused
 * Open leaves the session as it was (a later Open may still succeed). The
 * protobuf form, specd_session_open (target-svc/service.h), converts a
 * Verify Open into this. */
grpc_status_code specd_session_open_plain(specd_session *s, specd_session_open_req *o,
                                          const char *field, specd_error *err);

/* Why generation ended; the values are the wire's FinishReason's, so the
 * service converts with a cast. */
typedef enum specd_finish {
    SPECD_FINISH_NONE = 0, /* going on */
    SPECD_FINISH_EOS = 1,
    SPECD_FINISH_STOP = 2,
    SPECD_FINISH_LENGTH = 3,
    SPECD_FINISH_CONTEXT = 4,
} specd_finish;

/* One Tree message as plain C (the service converts the protobuf once,
 * specd_session_tree_from_pb in service.h; specd eval builds it directly).
 * q: the draft distributions, n_q of them (sampling: 1 + nodes); bad_q is
 * the first entry whose ids and probs differed in length on the wire (-1:
 * none), reported in the order of the checks below. */
typedef struct specd_session_tree_req {
    uint32_t step;
    size_t n_tokens, n_parents;
    const int32_t *tokens, *parents;
    int hidden_via_ipc;
    /* plain steps the target then runs by itself (the proto's plain run),
     * at most the session's max_new_tokens */
    uint32_t plain_steps;
    size_t n_q;
    const specd_sparse_dist *q;
    long bad_q;
    size_t bad_q_ids, bad_q_probs;
} specd_session_tree_req;

/* Checks a Tree (state, step number, size, ids, parents, q, context room) and
 * makes s->tree describe it (pointing into t's arrays, which must live until
 * the step is done). GRPC_STATUS_OK or an error code + err. */
grpc_status_code specd_session_tree(specd_session *s, const specd_session_tree_req *t,
                                    specd_error *err);

/* Takes the tokens one step produced, in order (a tree step: the accepted
 * tokens then next_token; step 0: the first token), with n_past_after the
 * cache rows after the step. Returns how many of them are emitted: generation
 * stops at the first EOS (unless ignore_eos), stop id, or the max_new_tokens-th
 * token, and nothing past it is emitted. *finish gets the reason (UNSPECIFIED
 * while the session goes on); a session whose context cannot hold one more
 * tree node ends with CONTEXT. Updates pending, n_past, n_out, the penalty
 * counts (every emitted token) and the state. */
int specd_session_emit(specd_session *s, const int32_t *toks, int n, int n_past_after,
                       specd_finish *finish);

#endif
