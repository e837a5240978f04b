/* service.c - specd.v1.Draft over the common gRPC server (service.h). */
#include "draft-svc/service.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc/request_ctx.h"
#include "common/text/chat.h"
#include "draft-svc/batcher.h"
#include "draft-svc/draft_metrics.h"
#include "draft-svc/driver.h"
#include "draft-svc/request_check.h"
#include "specd.pb-c.h"

const char *const specd_drafter_names[SPECD_N_DRAFTERS + 3] = {
    "mlp", "draft_lm", "ngram", "mlp_ngram", "none", "auto", NULL};

struct specd_draft_service {
    specd_draft_opts o;
    specd_batcher *batchers[SPECD_N_DRAFTERS];
    /* Acceptance by drafter (tree_choice.h): greedy requests, and seed-exact
     * sampled ones apart (the same drafts are accepted less often when the
     * target samples; rejection-sampled requests are never priced). */
    specd_accept_calib calib[SPECD_N_DRAFTERS], calib_sampled[SPECD_N_DRAFTERS];
    specd_driver_env env;
    char tok_sha256[65];
    /* GetInfo's: the family of the tokenizer's chat template (chat.h), ""
     * when draft-svc takes no messages (no tokenizer, or a template specd
     * does not render) */
    const char *chat_format;
    int vocab; /* from the tokenizer or a drafter; 0 = unknown (the targets check ids) */
    specd_draft_limits lim; /* what request_check.h checks against */
    int watching; /* the metrics' scrape hook on o.pool is registered */
};

/* ---- Generate ------------------------------------------------------------------ */

/* What the sink needs to turn a step's tokens into one response message. */
typedef struct gen_sink {
    specd_rpc_call *call;
    specd_text_stream *ts; /* the request's (specd_draft_prepared) */
    int logprobs;
    specd_error err;
    int failed; /* send failed or detok error: abort */
} gen_sink;

static int on_tokens(void *arg, const int32_t *toks, int n, Specd__V1__TokenLogprob **lps,
                     int n_lps, Specd__V1__FinishReason finish, int *stop) {
    gen_sink *gs = arg;
    /* The final message is sent by the handler, with the stats. A step the
     * target ended at EOS or a stop id ends with that token: its id is
     * returned, but not its text ("<|im_end|>" is not part of the answer, as
     * a stop string is not; vLLM and OpenAI do the same). */
    int n_text = n;
    if (n > 0 && (finish == SPECD__V1__FINISH_REASON__FINISH_REASON_EOS ||
                  finish == SPECD__V1__FINISH_REASON__FINISH_REASON_STOP))
        n_text = n - 1;
    /* Tokens after the one that completed a stop string are dropped: never
     * sent, never counted. */
    int took = n;
    for (int i = 0; i < n_text; i++) {
        int rc = specd_text_stream_push(gs->ts, toks[i], &gs->err);
        if (rc < 0) {
            gs->failed = 1;
            return -1;
        }
        if (rc == 1) {
            took = i + 1;
            *stop = 1;
            break;
        }
    }
    Specd__V1__GenerateResponse r = SPECD__V1__GENERATE_RESPONSE__INIT;
    size_t len;
    r.text = (char *)specd_text_stream_take(gs->ts, &len);
    r.n_token_ids = (size_t)took;
    r.token_ids = (int32_t *)toks;
    if (gs->logprobs && lps) {
        r.n_logprobs = (size_t)(n_lps < took ? n_lps : took);
        r.logprobs = lps;
    }
    if (specd_rpc_call_send_msg(gs->call, &r.base) != SPECD_RPC_IO_OK) {
        gs->failed = 1;
        return -1;
    }
    return took;
}

static void on_cancel(void *arg) { specd_gen_cancel_fire(arg); }

static void h_generate(specd_rpc_call *c, void *user) {
    specd_draft_service *svc = user;
    Specd__V1__GenerateRequest *req = NULL;
    specd_error err = {{0}};
    grpc_status_code code;
    specd_draft_prepared pr;
    memset(&pr, 0, sizeof pr);
    gen_sink gs = {0};
    specd_gen_cancel cancel;
    specd_gen_cancel_init(&cancel);
    gs.call = c;
    if (specd_rpc_call_request_msg(c, &specd__v1__generate_request__descriptor,
                                   (ProtobufCMessage **)&req, &err)) {
        specd_rpc_call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, err.msg);
        goto out;
    }
    /* Every check that needs no target (request_check.h, fuzzed on its
     * own); the prompt against a target's context is checked by the driver
     * with the same function when it opens the session. */
    if ((code = specd_draft_prepare(&svc->lim, req, &pr, &err))) {
        specd_rpc_call_finish(c, code, err.msg);
        goto out;
    }
    int drafter = pr.drafter;
    const Specd__V1__Speculation *sp = req->speculation;
    int spec_off = drafter == SPECD_N_DRAFTERS || (sp && sp->off);
    specd_gen_request gr = {
        .prompt = pr.ids,
        .n_prompt = (int)pr.n_ids,
        .max_new_tokens = pr.max_new_tokens,
        .sampling_pb = req->sampling,
        .sampling = pr.samp.s,
        .stop_ids = req->stop_ids,
        .n_stop_ids = (int)req->n_stop_ids,
        .ignore_eos = req->ignore_eos,
        .logprobs = req->logprobs,
        .top_logprobs = req->top_logprobs,
        .drafter = spec_off ? NULL : svc->o.drafters[drafter],
        .batcher = spec_off ? NULL : svc->batchers[drafter],
        .calib = spec_off                        ? NULL
                 : pr.samp.s.temperature > 0.0f ? &svc->calib_sampled[drafter]
                                                 : &svc->calib[drafter],
        .candidates = sp ? sp->candidates : 0,
        .depth = sp ? sp->depth : 0,
        .stop_threshold = sp ? sp->stop_threshold : 0.0f,
        .request_id = specd_request_current() ? specd_request_current()->id : NULL,
    };
    gs.logprobs = req->logprobs;
    /* The sink streams through the request's text stream; pr keeps owning it. */
    gs.ts = &pr.ts;
    specd_rpc_call_on_cancel(c, on_cancel, &cancel);
    specd_gen_sink sink = {on_tokens, &gs};
    specd_gen_stats st;
    code = specd_driver_generate(&svc->env, &gr, &sink, &cancel, &st, &err);
    specd_draft_metrics_request(&st, gs.failed ? GRPC_STATUS_INTERNAL : code,
                                gr.drafter ? specd_drafter_names[drafter] : "none");
    /* After this returns the callback is not running and never will. */
    specd_rpc_call_on_cancel(c, NULL, NULL);
    if (gs.failed) {
        /* The client is gone (nothing to say) or the tokens did not decode. */
        if (!specd_rpc_call_is_cancelled(c))
            specd_rpc_call_finish(c, GRPC_STATUS_INTERNAL, gs.err.msg);
        goto out;
    }
    if (code != GRPC_STATUS_OK) {
        specd_rpc_call_finish(c, code, err.msg);
        goto out;
    }
    if (st.finish != SPECD__V1__FINISH_REASON__FINISH_REASON_STOP || !gs.ts->stopped)
        specd_text_stream_finish(gs.ts);
    Specd__V1__GenerateResponse r = SPECD__V1__GENERATE_RESPONSE__INIT;
    Specd__V1__GenerateStats gst = SPECD__V1__GENERATE_STATS__INIT;
    size_t len;
    r.text = (char *)specd_text_stream_take(gs.ts, &len);
    r.finish_reason = st.finish;
    gst.prompt_tokens = st.prompt_tokens;
    gst.generated_tokens = st.generated_tokens;
    gst.target_steps = st.target_steps;
    gst.drafted_tokens = st.drafted_tokens;
    gst.accepted_tokens = st.accepted_tokens;
    gst.mean_accepted_length =
        st.target_steps ? (float)st.generated_tokens / (float)st.target_steps : 0.0f;
    float acc_by_pos[SPECD_MAX_DRAFT_DEPTH];
    for (int d = 0; d < st.max_depth_seen; d++)
        acc_by_pos[d] = st.drafted_at[d] ? (float)st.accepted_at[d] / (float)st.drafted_at[d] : 0;
    gst.n_acceptance_by_position = (size_t)st.max_depth_seen;
    gst.acceptance_by_position = acc_by_pos;
    gst.time_to_first_token_ms = (float)st.ttft_ms;
    gst.time_per_output_token_ms = (float)st.tpot_ms;
    gst.failovers = st.failovers;
    gst.draft_ms = (float)st.draft_ms;
    gst.target_wait_ms = (float)st.wait_ms;
    gst.target_forward_ms = (float)st.forward_ms;
    gst.pipelined_drafts = st.pipelined_drafts;
    gst.pipelined_hits = st.pipelined_hits;
    gst.round_trips = st.round_trips;
    gst.drafter = (char *)(gr.drafter ? specd_drafter_names[drafter] : "none");
    r.stats = &gst;
    if (specd_rpc_call_send_msg(c, &r.base) == SPECD_RPC_IO_OK)
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
out:
    specd_draft_prepared_free(&pr);
    specd_gen_cancel_destroy(&cancel);
    if (req) protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* ---- GetInfo --------------------------------------------------------------------- */

static void h_info(specd_rpc_call *c, void *user) {
    specd_draft_service *svc = user;
    Specd__V1__Info r = SPECD__V1__INFO__INIT;
    specd_target_info ti;
    specd_error err = {{0}};
    /* The model is the targets': without one up there is nothing to describe. */
    if (specd_tpool_any_info(svc->o.pool, &ti, &err)) {
        specd_rpc_call_finish(c, GRPC_STATUS_UNAVAILABLE, err.msg);
        return;
    }
    r.service = "specd.v1.Draft";
    r.version = SPECD_VERSION;
    r.model_id = ti.model_id;
    r.vocab_size = ti.vocab_size;
    r.hidden_size = ti.hidden_size;
    r.context_length = ti.context_length;
    r.tokenizer_sha256 = svc->tok_sha256[0] ? svc->tok_sha256 : ti.tokenizer_sha256;
    r.bos_token_id = ti.bos_token_id;
    r.eos_token_id = ti.eos_token_id;
    r.n_end_token_ids = (size_t)ti.n_end_token_ids;
    r.end_token_ids = ti.end_token_ids;
    r.chat_format = (char *)svc->chat_format;
    r.backend = ti.backend;
    r.max_sessions = ti.max_sessions; /* of one target */
    r.max_tree_tokens = svc->o.max_tree_tokens < ti.max_tree_tokens ? svc->o.max_tree_tokens
                                                                    : ti.max_tree_tokens;
    char *names[SPECD_N_DRAFTERS + 1];
    size_t nn = 0;
    for (int i = 0; i <= SPECD_N_DRAFTERS; i++)
        if (i == SPECD_N_DRAFTERS || svc->o.drafters[i])
            names[nn++] = (char *)specd_drafter_names[i];
    r.n_drafters = nn;
    r.drafters = names;
    r.default_drafter = (char *)specd_drafter_names[svc->o.default_drafter];
    char *targets[64];
    int nt = specd_tpool_list_up(svc->o.pool, targets, 64);
    r.n_targets = (size_t)nt;
    r.targets = targets;
    if (specd_rpc_call_send_msg(c, &r.base) == SPECD_RPC_IO_OK)
        specd_rpc_call_finish(c, GRPC_STATUS_OK, NULL);
    for (int i = 0; i < nt; i++) free(targets[i]);
}

/* ---- lifecycle -------------------------------------------------------------------- */

int specd_draft_default_drafter(const specd_draft_opts *o) {
    if (o->default_drafter != SPECD_DRAFTER_AUTO) return o->default_drafter;
    static const int best_first[] = {SPECD_DRAFTER_MLP_NGRAM, SPECD_DRAFTER_MLP,
                                     SPECD_DRAFTER_NGRAM};
    for (size_t i = 0; i < sizeof best_first / sizeof best_first[0]; i++)
        if (o->drafters[best_first[i]]) return best_first[i];
    return SPECD_N_DRAFTERS;
}

specd_draft_service *specd_draft_service_create(const specd_draft_opts *o, specd_error *err) {
    if (o->max_prompt_tokens < 1 || o->max_new_tokens < 1 || o->default_max_new_tokens < 1 ||
        o->default_max_new_tokens > o->max_new_tokens || o->max_tree_tokens < 1 || !o->pool) {
        specd_seterr(err, "draft: need max_prompt_tokens, max_tree_tokens >= 1, "
                          "1 <= default_max_new_tokens <= max_new_tokens, and targets");
        return NULL;
    }
    int def = specd_draft_default_drafter(o);
    if (def < 0 || def > SPECD_N_DRAFTERS || (def < SPECD_N_DRAFTERS && !o->drafters[def])) {
        specd_seterr(err, "drafter.default: '%s' is not configured",
                     def >= 0 && def <= SPECD_N_DRAFTERS ? specd_drafter_names[def] : "?");
        return NULL;
    }
    specd_draft_service *svc = calloc(1, sizeof *svc);
    if (!svc) {
        specd_seterr(err, "out of memory");
        return NULL;
    }
    svc->o = *o;
    svc->o.default_drafter = def; /* "auto" resolved once, here */
    for (int i = 0; i < SPECD_N_DRAFTERS; i++) {
        specd_accept_calib_init(&svc->calib[i]);
        specd_accept_calib_init(&svc->calib_sampled[i]);
    }
    svc->vocab = o->tok ? specd_tokenizer_n_vocab(o->tok) : 0;
    for (int i = 0; i < SPECD_N_DRAFTERS; i++) {
        specd_drafter *d = o->drafters[i];
        if (!d) continue;
        /* Every drafter must speak the same vocabulary as the tokenizer. */
        if (svc->vocab && d->vocab != svc->vocab) {
            specd_seterr(err, "%s drafter: vocabulary of %d tokens, the tokenizer has %d",
                         specd_drafter_names[i], d->vocab, svc->vocab);
            specd_draft_service_free(svc);
            return NULL;
        }
        if (!svc->vocab) svc->vocab = d->vocab;
        if (!(svc->batchers[i] = specd_batcher_create(d, err))) {
            specd_draft_service_free(svc);
            return NULL;
        }
    }
    if (o->tok) specd_tokenizer_sha256_hex(o->tok, svc->tok_sha256);
    svc->chat_format = specd_chat_format(o->tok);
    svc->lim = (specd_draft_limits){
        .tok = o->tok,
        .vocab = svc->vocab,
        .default_drafter = def,
        .adm = {.max_prompt_tokens = o->max_prompt_tokens,
                .max_new_tokens = o->max_new_tokens,
                .default_max_new_tokens = o->default_max_new_tokens},
    };
    for (int i = 0; i < SPECD_N_DRAFTERS; i++) svc->lim.offered[i] = o->drafters[i] != NULL;
    svc->env = (specd_driver_env){
        .pool = o->pool,
        .policy = &svc->o.policy,
        .max_tree_tokens = o->max_tree_tokens,
        .step_timeout_ms = o->step_timeout_ms > 0 ? o->step_timeout_ms : 30000,
        .open_timeout_ms = o->open_timeout_ms > 0 ? o->open_timeout_ms : 120000,
        .max_failovers = o->max_failovers,
        .stop_threshold = o->stop_threshold,
        .min_depth = o->min_depth > 0 ? o->min_depth : 1,
        .pipeline = o->pipeline,
    };
    if (o->pool) {
        if (specd_draft_metrics_watch(o->pool)) {
            specd_seterr(err, "draft: out of memory");
            specd_draft_service_free(svc);
            return NULL;
        }
        svc->watching = 1;
    }
    return svc;
}

/* Generate with its request log line and request id (common/rpc/request_ctx.h). */
static void h_generate_logged(specd_rpc_call *c, void *user) {
    specd_request_run(h_generate, c, user, "draft-svc", 1);
}

int specd_draft_service_register(specd_draft_service *svc, specd_rpc_server *srv,
                                 specd_error *err) {
    if (specd_rpc_register(srv, "/specd.v1.Draft/Generate", SPECD_RPC_SERVER_STREAMING,
                           h_generate_logged, svc) ||
        specd_rpc_register(srv, "/specd.v1.Draft/GetInfo", SPECD_RPC_UNARY, h_info, svc))
        return specd_seterr(err, "draft: cannot register the Draft methods");
    specd_rpc_set_health(srv, "specd.v1.Draft", 1);
    specd_rpc_set_health(srv, "", 1);
    return 0;
}

void specd_draft_service_free(specd_draft_service *svc) {
    if (!svc) return;
    if (svc->watching) specd_draft_metrics_unwatch(svc->o.pool);
    for (int i = 0; i < SPECD_N_DRAFTERS; i++) {
        specd_batcher_free(svc->batchers[i]);
        specd_accept_calib_destroy(&svc->calib[i]);
        specd_accept_calib_destroy(&svc->calib_sampled[i]);
    }
    free(svc);
}
