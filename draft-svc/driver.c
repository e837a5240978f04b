/* driver.c - one request through a target's Verify stream, with failover
 * (driver.h; the tree of each step: driver_draft.c, driver_price.c). */
#include "draft-svc/driver_internal.h"

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
    driver_price_timings(g, r, t_recv);
    g->price.t_recv = t_recv;
    if (r->step > 0) {
        driver_price_learn(g, r);
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
    driver_check_ahead(g, r);
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
    } else if (driver_q_priced(g) && g->member && g->price.skip > 0) {
        n = g->price.skip;
        /* alone only: under load a lookup's tree rarely pays for the
         * rows it adds to everyone's pass, while each run cut short is a
         * step sent (run_session) */
        if (q->drafter->has_lookup && g->target_load <= 1 && n > g->plain_streak)
            n = g->plain_streak;
        g->run_priced = 1;
    } else if (driver_q_priced(g) && g->member && g->price.empty_draft && g->target_load <= 1 &&
               driver_price_run_pays(g)) {
        /* The drafter found nothing, or nothing it found paid for its row,
         * and no skip says how long to decode plainly (the skip rules
         * judge drafting time, which a lookup hardly takes), so each such
         * step alone is a round trip. Where that costs more than the
         * session's drafting has been winning (driver_price_run_pays), it
         * runs as long as its streak of plain steps, up to
         * DRIVER_MAX_SKIP: the 1st, 2nd, 4th ... plain step looks again. */
        n = g->plain_streak < DRIVER_MAX_SKIP ? g->plain_streak : DRIVER_MAX_SKIP;
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
    if (g->n_gen == 0 && driver_q_priced(g) && specd_accept_calib_gain(g->req->calib, load) < 1.0) {
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
    if (g->ahead.on) driver_draft_ahead(g, info, 1);
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
            driver_draft(g, info);
            g->st->draft_ms += specd_now_ms() - t_draft;
        }
        g->plain_streak = g->tb.n_nodes ? 0 : g->plain_streak + 1;
        uint32_t run = g->tb.n_nodes ? 0 : plain_run(g);
        if ((rc = send_tree(g, s, step + 1, run, code, err)) != STEP_DONE) break;
        g->run_left = run;
        if (g->ahead.on && !run) driver_draft_ahead(g, info, 0);
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
            driver_price_init(&g.price, env->max_tree_tokens, env->policy)) {
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
    driver_price_free(&g.price);
    specd_ipc_import_free(g.ipc);
    free(g.hidden);
    free(g.hist);
    return code;
}
