/* service.c - specd.v1.Target over the common gRPC server (see service.h).
 *
 * Each handler owns its call's thread: it decodes a message, checks it with
 * the session logic (session.c), hands the model work to the scheduler and
 * blocks until the worker has run it in a shared batch, then answers. A bad
 * message ends only its own call, with a status naming the field; the KV slot
 * a session holds is returned the moment its handler ends (also on cancel). */
#include "target-svc/service.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rpc/admission.h"
#include "common/rpc/sampling_proto.h"
#include "common/util/dtype.h"
#include "common/rpc/ipc_caps.h"
#include "common/rpc/prompt.h"
#include "common/text/chat.h"
#include "common/text/text_stream.h"
#include "kernels/cpu/matmul.h" /* cpu_simd_name */
#include "kernels/ipc.h"
#include "specd.pb-c.h"
#include "target-svc/scheduler.h"
#include "target-svc/session.h"
#include "common/rpc/request_ctx.h"
#include "target-svc/target_metrics.h"
#include "common/util/clock.h"

struct specd_target_service {
    const specd_model_file *m;
    specd_transformer *t;
    const specd_tokenizer *tok;
    specd_target_opts o;
    specd_sched *sched;
    specd_target_watch *watch; /* the metrics' scrape hook on sched */
    specd_session_limits lim;
    specd_admission_limits adm; /* Generate's, as draft-svc's (common/rpc/admission.h) */
    int dim;
    char tok_sha256[65]; /* "" without a tokenizer */
    char model_id[1024];
    const char *chat_format; /* GetInfo's: the template's family, "" = no chat input */
};

/* The scheduler's cancellation probe: a call that is gone needs no work. */
static int call_cancelled(void *arg) { return specd_rpc_call_is_cancelled(arg); }

/* ---- protobuf -> session --------------------------------------------------- */

/* The one conversion of an Open into the session's plain form: the fields
 * as they are, the sampling parameters converted (and validated) only
 * after the checks that come before them, so the first fault is the one
 * reported. */
static grpc_status_code session_open(specd_session *s, specd_session_open_req *r,
                                     const Specd__V1__SamplingParams *sampling,
                                     const char *field, specd_error *err) {
    grpc_status_code code = specd_session_check_open(s, r, field, err);
    if (code) return code;
    char sfield[64];
    snprintf(sfield, sizeof sfield, "%s.sampling", field);
    specd_sampling_owned own;
    if (specd_sampling_from_proto(sampling, s->lim.vocab, sfield, &own, err))
        return GRPC_STATUS_INVALID_ARGUMENT;
    r->sampling = own.s;
    r->bias_ids = own.bias_ids;
    r->bias_values = own.bias_values;
    return specd_session_open_plain(s, r, field, err);
}

int specd_session_tree_from_pb(specd_session *s, const Specd__V1__VerifyTree *pb,
                               specd_session_tree_req *out, specd_error *err) {
    *out = (specd_session_tree_req){.step = pb->step, .n_tokens = pb->n_tokens,
                                    .n_parents = pb->n_parents, .tokens = pb->tokens,
                                    .parents = pb->parents,
                                    .hidden_via_ipc = pb->hidden_via_ipc,
                                    .plain_steps = pb->plain_steps, .n_q = pb->n_q,
                                    .bad_q = -1};
    if (pb->n_q == 0) return 0;
    if (pb->n_q > (size_t)s->lim.max_tree_tokens + 1) {
        out->n_q = pb->n_q; /* refused by its count before any entry is read */
        return 0;
    }
    if (s->q_cap < (int)pb->n_q) {
        specd_sparse_dist *q = realloc(s->q, sizeof *q * pb->n_q);
        if (!q) return specd_seterr(err, "out of memory");
        s->q = q;
        s->q_cap = (int)pb->n_q;
    }
    for (size_t i = 0; i < pb->n_q; i++) {
        const Specd__V1__DraftDistribution *d = pb->q[i];
        if (d->n_ids != d->n_probs && out->bad_q < 0) {
            out->bad_q = (long)i;
            out->bad_q_ids = d->n_ids;
            out->bad_q_probs = d->n_probs;
        }
        s->q[i] = (specd_sparse_dist){(int)d->n_ids, d->ids, d->probs};
    }
    out->q = s->q;
    return 0;
}

grpc_status_code specd_session_open(specd_session *s, const Specd__V1__VerifyOpen *o,
                                    const char *field, specd_error *err) {
    specd_session_open_req r = {.prompt_ids = o->prompt_ids,
                                .n_prompt_ids = o->n_prompt_ids,
                                .resumed_tokens = o->resumed_tokens,
                                .max_new_tokens = o->max_new_tokens,
                                .stop_ids = o->stop_ids,
                                .n_stop_ids = o->n_stop_ids,
                                .ignore_eos = o->ignore_eos,
                                .return_hidden = o->return_hidden,
                                .logprobs = o->logprobs,
                                .top_logprobs = o->top_logprobs};
    return session_open(s, &r, o->sampling, field, err);
}

/* ---- Verify ---------------------------------------------------------------- */

/* ---- log-probabilities on the wire ------------------------------------------ */

/* The scheduler's log-probabilities and their protobuf-c form for up to `cap`
 * tokens, allocated once per call (only when the call asked for them), so a
 * step builds its response without allocating. */
typedef struct lp_bufs {
    int cap;
    specd_token_logprob *lp;        /* [cap] filled by the scheduler */
    Specd__V1__TokenLogprob *msgs;  /* [cap] */
    Specd__V1__TokenLogprob **ptrs; /* [cap] */
    Specd__V1__TopLogprob *tops;    /* [cap * SPECD_MAX_TOP_LOGPROBS] */
    Specd__V1__TopLogprob **top_ptrs;
} lp_bufs;

static void lp_bufs_free(lp_bufs *b) {
    free(b->lp);
    free(b->msgs);
    free(b->ptrs);
    free(b->tops);
    free(b->top_ptrs);
    memset(b, 0, sizeof *b);
}

static int lp_bufs_alloc(lp_bufs *b, int cap) {
    size_t n_top = (size_t)cap * SPECD_MAX_TOP_LOGPROBS;
    b->cap = cap;
    b->lp = malloc(sizeof *b->lp * (size_t)cap);
    b->msgs = malloc(sizeof *b->msgs * (size_t)cap);
    b->ptrs = malloc(sizeof *b->ptrs * (size_t)cap);
    b->tops = malloc(sizeof *b->tops * n_top);
    b->top_ptrs = malloc(sizeof *b->top_ptrs * n_top);
    if (!b->lp || !b->msgs || !b->ptrs || !b->tops || !b->top_ptrs) {
        lp_bufs_free(b);
        return -1;
    }
    return 0;
}

/* Wire messages for b->lp[0..n) (n <= cap); returns the pointer array that a
 * response's repeated TokenLogprob field takes. */
static Specd__V1__TokenLogprob **lp_bufs_wire(lp_bufs *b, int n) {
    for (int i = 0; i < n; i++) {
        const specd_token_logprob *in = &b->lp[i];
        Specd__V1__TokenLogprob *m = &b->msgs[i];
        specd__v1__token_logprob__init(m);
        m->token_id = in->token;
        m->logprob = in->logprob;
        m->n_top = (size_t)in->n_top;
        m->top = b->top_ptrs + (size_t)i * SPECD_MAX_TOP_LOGPROBS;
        for (int j = 0; j < in->n_top; j++) {
            Specd__V1__TopLogprob *t = &b->tops[(size_t)i * SPECD_MAX_TOP_LOGPROBS + j];
            specd__v1__top_logprob__init(t);
            t->token_id = in->top_ids[j];
            t->logprob = in->top_lps[j];
            m->top[j] = t;
        }
        b->ptrs[i] = m;
    }
    return b->ptrs;
}

/* Per-call buffers, sized once from the limits. */
typedef struct verify_bufs {
    int32_t *toks;     /* [pending, nodes...] */
    int32_t *acc, *acc_nodes, *emitted;
    float *hidden;
    uint16_t *hidden16;
    lp_bufs lp;        /* [max_tree_tokens + 1], only with Open.logprobs */
    specd_ipc_export *ipc; /* co-location grant (ipc_caps.h); NULL = bytes only */
} verify_bufs;

/* Open.cuda_ipc: grants it when ipc_caps.h finds no reason not to and the
 * buffer can be made; any failure leaves the session on the bytes path. */
static void ipc_grant(specd_target_service *svc, specd_session *s,
                      const Specd__V1__VerifyOpen *o, verify_bufs *b) {
    char node[SPECD_IPC_NODE_MAX];
    specd_error err = {{0}};
    int have_node = o->cuda_ipc && !specd_ipc_node_id(node, &err);
    if (specd_ipc_grant_refusal(o->cuda_ipc, s->return_hidden,
                                specd_transformer_backend_name(svc->t), have_node ? node : NULL))
        return;
    if ((b->ipc = specd_ipc_export_create(svc->o.device, svc->dim, &err)))
        s->ipc_granted = 1;
    else
        fprintf(stderr, "target-svc: CUDA IPC not granted: %s\n", err.msg);
}

/* Sends one VerifyResponse. `hidden` NULL = no hidden state in it; `lp` NULL =
 * no log-probabilities, else lp->lp holds one per emitted token (n_acc + 1);
 * max_plain: the answer to Open's max_plain_steps (0 on later steps). */
static int send_verify(specd_rpc_call *c, specd_target_service *svc, uint32_t step,
                       const int32_t *acc, const int32_t *acc_nodes, int n_acc, int32_t next,
                       const float *hidden, uint16_t *h16, lp_bufs *lp,
                       Specd__V1__FinishReason fr, const specd_work *w,
                       specd_ipc_export *ipc, int via_ipc, uint32_t max_plain) {
    Specd__V1__VerifyResponse r = SPECD__V1__VERIFY_RESPONSE__INIT;
    Specd__V1__StepTimings tm = SPECD__V1__STEP_TIMINGS__INIT;
    Specd__V1__CudaIpcGrant grant = SPECD__V1__CUDA_IPC_GRANT__INIT;
    r.step = step;
    /* Co-location: step 0 carries the grant (and the bytes, as always); a
     * Tree that asked gets its hidden state in the buffer, or the bytes
     * when writing it failed (hidden_in_ipc stays false: the fallback). */
    if (ipc && step == 0) {
        specd_ipc_export_grant(ipc, &grant);
        r.cuda_ipc = &grant;
    }
    specd_error ipc_err = {{0}};
    if (hidden && ipc && via_ipc && !specd_ipc_export_put(ipc, hidden, &ipc_err)) {
        r.hidden_in_ipc = 1;
        hidden = NULL;
    }
    r.n_accepted = r.n_accepted_nodes = (size_t)n_acc;
    r.accepted = (int32_t *)acc;
    r.accepted_nodes = (int32_t *)acc_nodes;
    r.next_token = next;
    r.max_plain_steps = max_plain;
    if (hidden) {
        /* fp16 halves the bytes on the wire; the speculator works in low
         * precision anyway. Little-endian as the proto says (the host is). */
        for (int i = 0; i < svc->dim; i++) h16[i] = specd_f32_to_fp16(hidden[i]);
        r.hidden_fp16.data = (uint8_t *)h16;
        r.hidden_fp16.len = sizeof(uint16_t) * (size_t)svc->dim;
    }
    r.finish_reason = fr;
    tm.queue_us = w->queue_us;
    tm.forward_us = w->forward_us;
    tm.batch_tokens = w->batch_tokens;
    tm.active_sessions = w->active_sessions;
    tm.cached_tokens = w->cached_tokens;
    tm.estimated_forward_us = w->est_forward_us;
    tm.draft_tokens = w->draft_tokens;
    tm.prompt_tokens = w->prompt_tokens;
    r.timings = &tm;
    if (lp) {
        /* When a stop truncated the step, the stop token is `next` and its
         * log-probability is entry n_acc, as the scheduler wrote them in
         * emission order. */
        r.n_logprobs = (size_t)n_acc + 1;
        r.logprobs = lp_bufs_wire(lp, n_acc + 1);
    }
    return specd_rpc_call_send_msg(c, &r.base) == SPECD_RPC_IO_OK ? 0 : -1;
}

/* Runs one scheduler item; on failure ends the call. 0 = done OK. */
static int run_work(specd_target_service *svc, specd_rpc_call *c, specd_work *w) {
    w->is_cancelled = call_cancelled;
    w->cancel_arg = c;
    int rc = specd_sched_run(svc->sched, w);
    if (rc == SPECD_WORK_FAILED) specd_rpc_call_finish(c, GRPC_STATUS_INTERNAL, w->err.msg);
    /* the KV pool stayed full: draft-svc re-opens the session later */
    if (rc == SPECD_WORK_NO_PAGES)
        specd_rpc_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, w->err.msg);
    return rc;
}

/* Verifies the tree s->tree describes (specd_session_tree checked it) as
 * Tree `step` and sends the answer, with the hidden state when `hidden`
 * (through the IPC buffer when via_ipc). 1 when the call is over (the step
 * failed or the client is gone), else 0. */
static int tree_step(specd_target_service *svc, specd_rpc_call *c, specd_session *s, int slot,
                     uint32_t step, int hidden, int via_ipc, verify_bufs *b) {
    specd_finish fr;
    specd_work w;
    memset(&w, 0, sizeof w);
    w.sampling = &s->sampling;
    int n = s->tree.n_nodes;
    b->toks[0] = s->pending;
    if (n) /* an empty tree (a plain step) may come with no tokens array */
        memcpy(b->toks + 1, s->tree.tokens, sizeof(int32_t) * (size_t)n);
    w.kind = SPECD_WORK_TREE;
    w.slot = slot;
    w.n_past = s->n_past;
    w.tokens = b->toks;
    w.n_tokens = 1 + n;
    w.tree = &s->tree;
    w.position = specd_session_position(s); /* output index of the pending token's child */
    w.counts = specd_session_counts(s);
    w.accepted = b->acc;
    w.accepted_nodes = b->acc_nodes;
    w.hidden = s->return_hidden && hidden ? b->hidden : NULL;
    w.logprobs = s->logprobs ? b->lp.lp : NULL;
    w.top_logprobs = s->top_logprobs;
    if (run_work(svc, c, &w)) return 1;
    int n_acc = w.n_accepted;
    memcpy(b->emitted, b->acc, sizeof(int32_t) * (size_t)n_acc);
    b->emitted[n_acc] = w.next_token;
    s->step = step;
    int kept = specd_session_emit(s, b->emitted, n_acc + 1, s->n_past + 1 + n_acc, &fr);
    specd_target_metrics_verify(kept - 1, kept); /* what was sent (EOS may cut) */
    /* Truncated inside the accepted path: the stop token becomes the
     * last token (next_token) and the hidden state is left out, since it
     * belonged to a later row and the session is over anyway. */
    int full = kept == n_acc + 1;
    return send_verify(c, svc, s->step, b->acc, b->acc_nodes, kept - 1, b->emitted[kept - 1],
                       full ? w.hidden : NULL, b->hidden16, s->logprobs ? &b->lp : NULL,
                       (Specd__V1__FinishReason)fr, &w, b->ipc, via_ipc, 0) != 0;
}

/* Handles one decoded request. Returns 1 when the call is over. */
static int verify_step(specd_target_service *svc, specd_rpc_call *c, specd_session *s,
                       int *slot, const Specd__V1__VerifyRequest *req, verify_bufs *b) {
    specd_error err = {{0}};
    grpc_status_code code;
    specd_finish fr;
    specd_work w;
    memset(&w, 0, sizeof w);
    w.sampling = &s->sampling;
    switch (req->msg_case) {
    case SPECD__V1__VERIFY_REQUEST__MSG_OPEN:
        if ((code = specd_session_open(s, req->open, "open", &err))) {
            specd_rpc_call_finish(c, code, err.msg);
            return 1;
        }
        ipc_grant(svc, s, req->open, b);
        if (s->logprobs && lp_bufs_alloc(&b->lp, svc->o.max_tree_tokens + 1)) {
            specd_rpc_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            return 1;
        }
        if ((*slot = specd_sched_acquire_slot(svc->sched)) < 0) {
            /* KV pages come from the shared pool as sessions grow; a slot
             * is only a session's page table, so this is max_sessions. */
            char msg[160];
            snprintf(msg, sizeof msg, "all %d sessions are in use (limits.max_sessions)",
                     svc->o.max_sessions);
            specd_rpc_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
            return 1;
        }
        w.kind = SPECD_WORK_PREFILL;
        w.slot = *slot;
        w.tokens = s->prompt;
        w.n_tokens = s->n_prompt;
        /* the first token is output index 0, or resumed_tokens on failover */
        w.position = specd_session_position(s);
        w.counts = specd_session_counts(s);
        w.hidden = s->return_hidden ? b->hidden : NULL;
        w.logprobs = s->logprobs ? b->lp.lp : NULL;
        w.top_logprobs = s->top_logprobs;
        if (run_work(svc, c, &w)) return 1;
        specd_session_emit(s, &w.next_token, 1, s->n_prompt, &fr);
        if (send_verify(c, svc, 0, NULL, NULL, 0, w.next_token, w.hidden, b->hidden16,
                        s->logprobs ? &b->lp : NULL, (Specd__V1__FinishReason)fr, &w, b->ipc, 0,
                        (uint32_t)s->max_new_tokens))
            return 1;
        break;
    case SPECD__V1__VERIFY_REQUEST__MSG_TREE: {
        specd_session_tree_req tr;
        if (specd_session_tree_from_pb(s, req->tree, &tr, &err)) {
            specd_rpc_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, err.msg);
            return 1;
        }
        if ((code = specd_session_tree(s, &tr, &err))) {
            specd_rpc_call_finish(c, code, err.msg);
            return 1;
        }
        uint32_t run = tr.plain_steps;
        int via_ipc = req->tree->hidden_via_ipc;
        if (tree_step(svc, c, s, *slot, tr.step, run == 0, via_ipc, b)) return 1;
        /* A plain run (the proto's VerifyTree.plain_steps): the next steps
         * go to the scheduler as soon as each answer is out, with nothing
         * to wait for from the client; only the last carries the hidden
         * state the client drafts from. A client that goes away ends it
         * (the scheduler sees the cancelled call, or the send fails). */
        for (uint32_t k = 1; k <= run && s->state != SPECD_SESSION_DONE; k++) {
            specd_session_tree_req plain = {.step = s->step + 1, .hidden_via_ipc = via_ipc,
                                            .bad_q = -1};
            if ((code = specd_session_tree(s, &plain, &err))) {
                specd_rpc_call_finish(c, code, err.msg);
                return 1;
            }
            specd_target_metrics_plain_run();
            if (tree_step(svc, c, s, *slot, plain.step, k == run, via_ipc, b)) return 1;
        }
        break;
    }
    case SPECD__V1__VERIFY_REQUEST__MSG_CLOSE:
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
        return 1;
    default:
        specd_rpc_call_finish(c, GRPC_STATUS_INVALID_ARGUMENT,
                              "VerifyRequest has none of open, tree, close");
        return 1;
    }
    if (s->state == SPECD_SESSION_DONE) { /* the final response went out */
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
        return 1;
    }
    return 0;
}

static void h_verify(specd_rpc_call *c, void *user) {
    specd_target_service *svc = user;
    specd_session s;
    specd_session_init(&s, &svc->lim);
    int slot = -1, T = svc->o.max_tree_tokens;
    verify_bufs b = {
        .lp = {0},
        .toks = malloc(sizeof(int32_t) * (size_t)(T + 1)),
        .acc = malloc(sizeof(int32_t) * (size_t)T),
        .acc_nodes = malloc(sizeof(int32_t) * (size_t)T),
        .emitted = malloc(sizeof(int32_t) * (size_t)(T + 1)),
        .hidden = malloc(sizeof(float) * (size_t)svc->dim),
        .hidden16 = malloc(sizeof(uint16_t) * (size_t)svc->dim),
    };
    if (!b.toks || !b.acc || !b.acc_nodes || !b.emitted || !b.hidden || !b.hidden16) {
        specd_rpc_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (;;) {
        Specd__V1__VerifyRequest *req = NULL;
        specd_error err = {{0}};
        specd_rpc_io io = specd_rpc_call_recv_msg(c, &specd__v1__verify_request__descriptor,
                                                  (ProtobufCMessage **)&req, -1, &err);
        if (io == SPECD_RPC_IO_END) { /* the client half-closed: same as Close */
            specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
            break;
        }
        if (io == SPECD_RPC_IO_CANCELLED) break; /* nobody to answer */
        if (io != SPECD_RPC_IO_OK) {
            specd_rpc_call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, err.msg);
            break;
        }
        int over = verify_step(svc, c, &s, &slot, req, &b);
        protobuf_c_message_free_unpacked(&req->base, NULL);
        if (over) break;
    }
out:
    specd_sched_release_slot(svc->sched, slot);
    specd_session_free(&s);
    specd_ipc_export_free(b.ipc);
    free(b.toks);
    free(b.acc);
    free(b.acc_nodes);
    free(b.emitted);
    free(b.hidden);
    free(b.hidden16);
    lp_bufs_free(&b.lp);
}

/* ---- Generate ------------------------------------------------------------------ */

/* One Generate call: a plain decode, i.e. a session whose every step
 * verifies an empty tree, with the same checks and stop rules as a Verify
 * session. h_generate runs it in four steps: gen_admit (the request, its
 * prompt and limits), gen_open (the session and a slot), gen_decode (one
 * scheduler step per token) with gen_respond (each token to the client),
 * and gen_free. */
typedef struct gen_call {
    specd_target_service *svc;
    specd_rpc_call *c;
    Specd__V1__GenerateRequest *req;
    specd_session s;
    int slot; /* -1 until acquired */
    int32_t *ids;
    size_t n_ids;
    int max_new;
    specd_text_stream ts;
    int have_ts;
    lp_bufs lp;
    double t_start, t_first;
    int steps;
} gen_call;

/* Finishes the call with `code` and `msg`; -1 for the caller to return. */
static int gen_fail(gen_call *g, grpc_status_code code, const char *msg) {
    specd_rpc_call_finish(g->c, code, msg);
    return -1;
}

/* The request: its strings, stop strings (a text stream), prompt ids and
 * size limits. Emptiness and ids here, the size limits in
 * specd_admit_generate, both with draft-svc's words; the rest by the
 * session (gen_open). */
static int gen_admit(gen_call *g) {
    specd_target_service *svc = g->svc;
    specd_error err = {{0}};
    grpc_status_code code;
    if (specd_rpc_call_request_msg(g->c, &specd__v1__generate_request__descriptor,
                                   (ProtobufCMessage **)&g->req, &err))
        return gen_fail(g, GRPC_STATUS_INVALID_ARGUMENT, err.msg);
    if ((code = specd_admit_strings(g->req, &err))) return gen_fail(g, code, err.msg);
    if (specd_text_stream_init(&g->ts, svc->tok, g->req->stop, g->req->n_stop, "request.stop",
                               &err))
        return gen_fail(g, svc->tok ? GRPC_STATUS_INVALID_ARGUMENT
                                    : GRPC_STATUS_FAILED_PRECONDITION,
                        err.msg);
    g->have_ts = 1;
    if ((code = specd_prompt_from_request(svc->tok, g->req, svc->lim.vocab, 0, &g->ids,
                                          &g->n_ids, &err)) ||
        (code = specd_admit_generate(&svc->adm, g->n_ids, g->req->max_new_tokens, &g->max_new,
                                     &err)))
        return gen_fail(g, code, err.msg);
    return 0;
}

/* The session (the same checks as a Verify Open), logprob buffers, and a
 * scheduler slot. */
static int gen_open(gen_call *g) {
    const Specd__V1__GenerateRequest *req = g->req;
    specd_error err = {{0}};
    grpc_status_code code;
    specd_session_open_req open = {.prompt_ids = g->ids,
                                   .n_prompt_ids = g->n_ids,
                                   .max_new_tokens = g->max_new,
                                   .stop_ids = req->stop_ids,
                                   .n_stop_ids = req->n_stop_ids,
                                   .ignore_eos = req->ignore_eos,
                                   .logprobs = req->logprobs,
                                   .top_logprobs = req->top_logprobs};
    if ((code = session_open(&g->s, &open, req->sampling, "request", &err)))
        return gen_fail(g, code, err.msg);
    if (g->s.logprobs && lp_bufs_alloc(&g->lp, 1))
        return gen_fail(g, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    if ((g->slot = specd_sched_acquire_slot(g->svc->sched)) < 0)
        return gen_fail(g, GRPC_STATUS_RESOURCE_EXHAUSTED,
                        "all sessions are in use (limits.max_sessions)");
    return 0;
}

/* The scheduler work of the next step: the prompt first (prefill), then
 * the pending token into the cache, one token out (decode). */
static void gen_work(gen_call *g, specd_work *w, int prefill) {
    memset(w, 0, sizeof *w);
    w->kind = prefill ? SPECD_WORK_PREFILL : SPECD_WORK_DECODE;
    w->slot = g->slot;
    if (prefill) {
        w->tokens = g->s.prompt;
        w->n_tokens = g->s.n_prompt;
    } else {
        w->n_past = g->s.n_past;
        w->tokens = &g->s.pending;
        w->n_tokens = 1;
    }
    w->sampling = &g->s.sampling;
    w->counts = specd_session_counts(&g->s);
    w->position = specd_session_position(&g->s);
    w->logprobs = g->s.logprobs ? g->lp.lp : NULL;
    w->top_logprobs = g->s.top_logprobs;
}

/* Sends one token (its text, logprobs, and with the last one the finish
 * reason and stats). 0: go on; 1: that was the last; -1: the call ended. */
static int gen_respond(gen_call *g, int32_t *tok, Specd__V1__FinishReason fr) {
    specd_error err = {{0}};
    Specd__V1__GenerateResponse r = SPECD__V1__GENERATE_RESPONSE__INIT;
    Specd__V1__GenerateStats st = SPECD__V1__GENERATE_STATS__INIT;
    /* The token that ends the generation at EOS or a stop id is returned by
     * id, not as text (as a stop string is not part of the text); a stop
     * string ends it right before the match. */
    int terminal = fr == SPECD__V1__FINISH_REASON__FINISH_REASON_EOS ||
                   fr == SPECD__V1__FINISH_REASON__FINISH_REASON_STOP;
    int rc = terminal ? 0 : specd_text_stream_push(&g->ts, *tok, &err);
    if (rc < 0) return gen_fail(g, GRPC_STATUS_INTERNAL, err.msg);
    /* A stop string that completes on the last allowed token still says
     * STOP: the text was cut, which is what the client must know (draft-svc
     * reports it the same way). */
    if (rc == 1) fr = SPECD__V1__FINISH_REASON__FINISH_REASON_STOP;
    if (fr && !g->ts.stopped && specd_text_stream_finish(&g->ts))
        return gen_fail(g, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    size_t text_len;
    if (g->have_ts && g->svc->tok) r.text = (char *)specd_text_stream_take(&g->ts, &text_len);
    r.n_token_ids = 1;
    r.token_ids = tok;
    if (g->s.logprobs) {
        r.n_logprobs = 1;
        r.logprobs = lp_bufs_wire(&g->lp, 1);
    }
    if (fr) {
        const specd_session *s = &g->s;
        double end = specd_now_ms();
        r.finish_reason = fr;
        st.prompt_tokens = s->n_prompt;
        st.generated_tokens = s->n_out;
        st.target_steps = g->steps;
        st.mean_accepted_length = 1.0f; /* plain decoding: one token per step */
        st.time_to_first_token_ms = (float)(g->t_first - g->t_start);
        st.time_per_output_token_ms =
            s->n_out > 1 ? (float)((end - g->t_first) / (s->n_out - 1)) : 0.0f;
        r.stats = &st;
    }
    if (specd_rpc_call_send_msg(g->c, &r.base) != SPECD_RPC_IO_OK) return -1;
    return fr ? 1 : 0;
}

/* One scheduler step per token until the session finishes; then OK. */
static void gen_decode(gen_call *g) {
    g->t_start = specd_now_ms();
    specd_work w;
    gen_work(g, &w, 1);
    int n_past_after = g->s.n_prompt;
    for (;;) {
        if (run_work(g->svc, g->c, &w)) return;
        g->steps++;
        specd_finish fr;
        int32_t tok = w.next_token;
        specd_session_emit(&g->s, &tok, 1, n_past_after, &fr);
        if (g->steps == 1) g->t_first = specd_now_ms();
        int rc = gen_respond(g, &tok, (Specd__V1__FinishReason)fr);
        if (rc < 0) return;
        if (rc > 0) break;
        gen_work(g, &w, 0);
        n_past_after = g->s.n_past + 1;
    }
    specd_rpc_call_finish(g->c, GRPC_STATUS_OK, NULL);
}

static void gen_free(gen_call *g) {
    if (g->have_ts) specd_text_stream_free(&g->ts);
    lp_bufs_free(&g->lp);
    specd_sched_release_slot(g->svc->sched, g->slot);
    specd_session_free(&g->s);
    free(g->ids);
    if (g->req) protobuf_c_message_free_unpacked(&g->req->base, NULL);
}

static void h_generate(specd_rpc_call *c, void *user) {
    gen_call g = {.svc = user, .c = c, .slot = -1};
    specd_session_init(&g.s, &g.svc->lim);
    if (gen_admit(&g) == 0 && gen_open(&g) == 0) gen_decode(&g);
    gen_free(&g);
}

/* ---- GetInfo ---------------------------------------------------------------------- */

/* The ids that end a session with finish EOS (session.c): the EOS, then
 * the other end ids, each once. */
static int end_token_ids(const specd_session_limits *lim, int32_t out[SPECD_SESSION_MAX_END + 1]) {
    int n = 0;
    if (lim->eos_id >= 0) out[n++] = lim->eos_id;
    for (int i = 0; i < lim->n_end_ids; i++) {
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= out[j] == lim->end_ids[i];
        if (!dup) out[n++] = lim->end_ids[i];
    }
    return n;
}

static void h_info(specd_rpc_call *c, void *user) {
    specd_target_service *svc = user;
    const specd_llama_hparams *hp = &svc->m->hp;
    Specd__V1__Info r = SPECD__V1__INFO__INIT;
    r.service = "specd.v1.Target";
    r.version = SPECD_VERSION;
    r.model_id = svc->model_id;
    r.vocab_size = hp->vocab_size;
    r.hidden_size = hp->dim;
    r.context_length = svc->lim.context;
    r.tokenizer_sha256 = svc->tok_sha256;
    r.bos_token_id = svc->tok ? specd_tokenizer_bos(svc->tok) : hp->bos_id;
    r.eos_token_id = svc->lim.eos_id;
    r.backend = (char *)specd_transformer_backend_name(svc->t);
    r.max_tree_tokens = svc->o.max_tree_tokens;
    r.max_sessions = svc->o.max_sessions;
    r.queue_wait_ms = (uint32_t)specd_sched_queue_wait_ms(svc->sched);
    r.chat_format = (char *)svc->chat_format;
    int32_t ends[SPECD_SESSION_MAX_END + 1];
    r.n_end_token_ids = (size_t)end_token_ids(&svc->lim, ends);
    r.end_token_ids = ends;
    Specd__V1__KvPoolInfo kv = SPECD__V1__KV_POOL_INFO__INIT;
    specd_kv_pool_stats st;
    specd_sched_kv_stats(svc->sched, &st);
    kv.page_tokens = SPECD_KV_PAGE_ROWS;
    kv.pages_total = st.n_pages;
    kv.pages_held = st.n_held;
    kv.pages_cached = st.n_cached;
    kv.pages_free = st.n_free;
    kv.prefix_cache = svc->o.prefix_cache != 0;
    kv.prefix_lookup_pages = st.lookup_pages;
    kv.prefix_hit_pages = st.hit_pages;
    kv.prefix_hit_rate = st.lookup_pages ? (float)st.hit_pages / (float)st.lookup_pages : 0.0f;
    kv.evictions = st.evictions;
    kv.dtype = (char *)specd_kv_type_name(specd_transformer_kv_dtype(svc->t));
    kv.bytes_per_token = specd_transformer_kv_bytes_per_token(svc->t);
    r.kv_pool = &kv;
    /* the measured points of the cost curve (unmeasured ones are left out) */
    specd_step_cost cost;
    specd_sched_step_cost(svc->sched, &cost);
    uint32_t cost_tokens[SPECD_STEP_COST_MAX_POINTS];
    float cost_us[SPECD_STEP_COST_MAX_POINTS];
    Specd__V1__StepCost sc = SPECD__V1__STEP_COST__INIT;
    for (int i = 0; i < cost.n; i++)
        if (cost.us[i] > 0) {
            cost_tokens[sc.n_batch_tokens++] = (uint32_t)cost.tokens[i];
            cost_us[sc.n_forward_us++] = (float)cost.us[i];
        }
    sc.batch_tokens = cost_tokens;
    sc.forward_us = cost_us;
    r.step_cost = &sc;
    if (specd_rpc_call_send_msg(c, &r.base) == SPECD_RPC_IO_OK)
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
}

/* ---- lifecycle -------------------------------------------------------------------- */

specd_target_service *specd_target_service_create(const specd_model_file *m,
                                                  specd_transformer *t,
                                                  const specd_tokenizer *tok,
                                                  const specd_target_opts *o, specd_error *err) {
    if (o->max_sessions < 1 || o->max_prompt_tokens < 1 || o->max_tree_tokens < 1 ||
        o->max_tree_tokens + 1 > o->max_batch_tokens) {
        /* A tree rides in one pass with its pending token, so it must fit. */
        specd_seterr(err, "target: need max_sessions, max_prompt_tokens, max_tree_tokens >= 1 "
                          "and max_tree_tokens + 1 <= max_batch_tokens");
        return NULL;
    }
    specd_target_service *svc = calloc(1, sizeof *svc);
    if (!svc) {
        specd_seterr(err, "out of memory");
        return NULL;
    }
    svc->m = m;
    svc->t = t;
    svc->tok = tok;
    svc->o = *o;
    svc->dim = m->hp.dim;
    svc->lim = (specd_session_limits){
        .vocab = m->hp.vocab_size,
        .context = specd_transformer_max_ctx(t),
        .max_prompt_tokens = o->max_prompt_tokens,
        .max_tree_tokens = o->max_tree_tokens,
        .eos_id = tok && specd_tokenizer_eos(tok) >= 0 ? specd_tokenizer_eos(tok) : m->hp.eos_id,
    };
    svc->chat_format = specd_chat_format(tok);
    if (tok) {
        _Static_assert(SPECD_TOKENIZER_MAX_END <= SPECD_SESSION_MAX_END, "end ids fit");
        svc->lim.n_end_ids = specd_tokenizer_end_ids(tok, svc->lim.end_ids);
    }
    svc->adm = (specd_admission_limits){
        .context = svc->lim.context,
        .max_prompt_tokens = o->max_prompt_tokens,
        .max_new_tokens = o->max_new_tokens > 0 ? o->max_new_tokens : 4096,
        .default_max_new_tokens = o->default_max_new_tokens > 0 ? o->default_max_new_tokens : 256,
    };
    if (svc->adm.default_max_new_tokens > svc->adm.max_new_tokens)
        svc->adm.default_max_new_tokens = svc->adm.max_new_tokens;
    /* model_id: the file or directory name, the most recognizable thing a
     * model file carries. */
    const char *base = strrchr(m->path, '/');
    base = base && base[1] ? base + 1 : m->path;
    snprintf(svc->model_id, sizeof svc->model_id, "%s", base);
    if (tok) {
        /* Fingerprint of the vocabulary (see specd_tokenizer_sha256_hex):
         * draft-svc refuses a target whose tokenizer differs from its own. */
        specd_tokenizer_sha256_hex(tok, svc->tok_sha256);
    }
    specd_sched_opts so = {.n_slots = o->max_sessions, .max_batch_tokens = o->max_batch_tokens,
                           .max_wait_ms = o->max_wait_ms, .prefill_chunk = o->prefill_chunk,
                           .prefill_chunk_ms = o->prefill_chunk_ms,
                           .kv_wait_ms = o->kv_wait_ms, .queue_wait_ms = o->queue_wait_ms,
                           .calibrate_tokens = o->calibrate_tokens};
    svc->sched = specd_sched_create(t, &so, err);
    if (!svc->sched) {
        free(svc);
        return NULL;
    }
    if (!(svc->watch = specd_target_metrics_watch(svc->sched, o->max_sessions))) {
        specd_seterr(err, "target: out of memory");
        specd_target_service_free(svc);
        return NULL;
    }
    specd_target_metrics_backend(specd_transformer_backend_name(t),
                                 specd_target_service_kernels(svc));
    return svc;
}

const char *specd_target_service_kernels(const specd_target_service *svc) {
    const char *be = specd_transformer_backend_name(svc->t);
    return !strcmp(be, "cpu") ? cpu_simd_name() : be;
}

/* Verify and Generate with their request log line (common/rpc/request_ctx.h). */
static void h_verify_logged(specd_rpc_call *c, void *user) {
    specd_request_run(h_verify, c, user, "target-svc", 0);
}

static void h_generate_logged(specd_rpc_call *c, void *user) {
    specd_request_run(h_generate, c, user, "target-svc", 0);
}

int specd_target_service_register(specd_target_service *svc, specd_rpc_server *srv,
                                  specd_error *err) {
    if (specd_rpc_register(srv, "/specd.v1.Target/Verify", SPECD_RPC_BIDI_STREAMING,
                           h_verify_logged, svc) ||
        specd_rpc_register(srv, "/specd.v1.Target/Generate", SPECD_RPC_SERVER_STREAMING,
                           h_generate_logged, svc) ||
        specd_rpc_register(srv, "/specd.v1.Target/GetInfo", SPECD_RPC_UNARY, h_info, svc))
        return specd_seterr(err, "target: cannot register the Target methods");
    specd_rpc_set_health(srv, "specd.v1.Target", 1);
    specd_rpc_set_health(srv, "", 1);
    return 0;
}

void specd_target_service_step_cost(specd_target_service *svc, specd_step_cost *out) {
    specd_sched_step_cost(svc->sched, out);
}

void specd_target_service_free(specd_target_service *svc) {
    if (!svc) return;
    specd_target_metrics_unwatch(svc->watch);
    specd_sched_free(svc->sched);
    free(svc);
}
