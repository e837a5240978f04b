/* cmd_generate_remote.c - `specd generate --server ADDR`: the command-line
 * client of draft-svc (or of target-svc with --service target; both serve
 * the same Generate message).
 *
 * The request is built from the same flags as local decoding (generate.h),
 * sent once, and the response stream is printed as it arrives: text to
 * stdout, flushed per message so a pipe sees each step at once, and the
 * stats to stderr at the end. With --json every response message becomes
 * one JSON object per line on stdout, followed by one with the finish
 * reason and every stat, for scripts. A failed call exits 1 with the
 * server's status code and message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "tools/client.h"
#include "tools/generate.h"

/* What the response callback needs. */
typedef struct out_state {
    const gen_opts *o;
    int32_t *ids; /* every token id received, for --ids */
    int n_ids, cap_ids;
    int printed_text; /* some text went to stdout (so end the line) */
    int failed;       /* out of memory */
} out_state;

static void print_json(cJSON *obj) {
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }
    free(s);
    cJSON_Delete(obj);
}

static cJSON *logprobs_json(Specd__V1__TokenLogprob *const *lps, size_t n) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t k = 0; k < n; k++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "token_id", lps[k]->token_id);
        cJSON_AddNumberToObject(e, "logprob", lps[k]->logprob);
        cJSON *top = cJSON_AddArrayToObject(e, "top");
        for (size_t j = 0; j < lps[k]->n_top; j++) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddNumberToObject(t, "token_id", lps[k]->top[j]->token_id);
            cJSON_AddNumberToObject(t, "logprob", lps[k]->top[j]->logprob);
            cJSON_AddItemToArray(top, t);
        }
        cJSON_AddItemToArray(arr, e);
    }
    return arr;
}

static int on_msg(void *arg, const Specd__V1__GenerateResponse *r) {
    out_state *os = arg;
    if (os->n_ids + (int)r->n_token_ids > os->cap_ids) {
        int cap = (os->cap_ids ? os->cap_ids * 2 : 256) + (int)r->n_token_ids;
        int32_t *bigger = realloc(os->ids, sizeof(int32_t) * (size_t)cap);
        if (!bigger) {
            os->failed = 1;
            return 1;
        }
        os->ids = bigger;
        os->cap_ids = cap;
    }
    if (r->n_token_ids) /* the final message carries no ids (and a NULL array) */
        memcpy(os->ids + os->n_ids, r->token_ids, sizeof(int32_t) * r->n_token_ids);
    os->n_ids += (int)r->n_token_ids;
    if (os->o->json) {
        cJSON *obj = cJSON_CreateObject();
        cJSON_AddStringToObject(obj, "text", r->text ? r->text : "");
        cJSON *ids = cJSON_AddArrayToObject(obj, "token_ids");
        for (size_t k = 0; k < r->n_token_ids; k++)
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->token_ids[k]));
        if (os->o->logprobs || os->o->top_logprobs)
            cJSON_AddItemToObject(obj, "logprobs", logprobs_json(r->logprobs, r->n_logprobs));
        print_json(obj);
    } else if (r->text && r->text[0]) {
        fputs(r->text, stdout);
        fflush(stdout); /* stream: the reader sees each step as it lands */
        os->printed_text = 1;
    }
    return 0;
}

static cJSON *stats_json(const cli_gen_result *res) {
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "drafter", res->drafter);
    cJSON_AddNumberToObject(st, "prompt_tokens", res->prompt_tokens);
    cJSON_AddNumberToObject(st, "generated_tokens", res->generated_tokens);
    cJSON_AddNumberToObject(st, "target_steps", res->target_steps);
    cJSON_AddNumberToObject(st, "round_trips", res->round_trips);
    cJSON_AddNumberToObject(st, "drafted_tokens", res->drafted_tokens);
    cJSON_AddNumberToObject(st, "accepted_tokens", res->accepted_tokens);
    cJSON_AddNumberToObject(st, "mean_accepted_length", res->tau);
    cJSON *acc = cJSON_AddArrayToObject(st, "acceptance_by_position");
    for (int k = 0; k < res->n_positions; k++)
        cJSON_AddItemToArray(acc, cJSON_CreateNumber(res->acceptance_by_position[k]));
    cJSON_AddNumberToObject(st, "time_to_first_token_ms", res->server_ttft_ms);
    cJSON_AddNumberToObject(st, "time_per_output_token_ms", res->server_tpot_ms);
    cJSON_AddNumberToObject(st, "failovers", res->failovers);
    cJSON_AddNumberToObject(st, "draft_ms", res->draft_ms);
    cJSON_AddNumberToObject(st, "target_wait_ms", res->target_wait_ms);
    cJSON_AddNumberToObject(st, "target_forward_ms", res->target_forward_ms);
    return st;
}

/* Client-side timing: what the user saw, network and queueing included. */
static void client_times(const cli_gen_result *res, double *ttft_ms, double *elapsed_s,
                         double *tok_s) {
    *ttft_ms = res->t_first ? (res->t_first - res->t_start) * 1e3 : 0;
    *elapsed_s = res->t_end - res->t_start;
    *tok_s = *elapsed_s > 0 ? res->n_tokens / *elapsed_s : 0;
}

static void print_stats(const cli_gen_result *res) {
    double ttft, elapsed, tok_s;
    client_times(res, &ttft, &elapsed, &tok_s);
    fprintf(stderr,
            "\n[specd] drafter %s: %d tokens (%s) in %d target steps, tau %.2f, "
            "accepted %d of %d drafted\n",
            /* target-svc names no drafter: it always decodes plainly */
            res->drafter[0] ? res->drafter : "none", res->generated_tokens,
            cli_finish_name(res->finish), res->target_steps, res->tau, res->accepted_tokens,
            res->drafted_tokens);
    if (res->n_positions) {
        fprintf(stderr, "[specd] acceptance by position:");
        for (int k = 0; k < res->n_positions; k++)
            fprintf(stderr, " %.2f", res->acceptance_by_position[k]);
        fprintf(stderr, "\n");
    }
    fprintf(stderr,
            "[specd] TTFT %.1f ms (server %.1f), TPOT %.2f ms, longest gap %.1f ms, %.1f "
            "tokens/s over %.2f s, prompt %d tokens, failovers %d\n",
            ttft, res->server_ttft_ms, res->server_tpot_ms, res->max_gap * 1e3, tok_s, elapsed,
            res->prompt_tokens, res->failovers);
}

int cmd_generate_remote(gen_opts *o) {
    if (o->service_target &&
        (o->drafter || o->candidates || o->depth || o->no_spec || o->stop_threshold)) {
        fprintf(stderr, "specd generate: --drafter, --candidates, --depth, --stop-threshold and "
                        "--no-spec are draft-svc settings; target-svc decodes plainly\n");
        return 2;
    }
    if (o->n_prompt_ids && (o->chat || o->prompt || o->prompt_file)) {
        fprintf(stderr, "specd generate: --prompt-ids replaces the text prompt; give one\n");
        return 2;
    }
    specd_error err = {{0}};
    const char *text = NULL;
    char *owned = NULL;
    if (!o->n_prompt_ids && gen_prompt_text(o, 1, &text, &owned, &err)) {
        fprintf(stderr, "specd generate: %s\n", err.msg);
        return 1;
    }

    /* ---- the request: every pointer below lives until the call is over */
    Specd__V1__GenerateRequest req = SPECD__V1__GENERATE_REQUEST__INIT;
    Specd__V1__TokenIds tids = SPECD__V1__TOKEN_IDS__INIT;
    Specd__V1__ChatMessages chat = SPECD__V1__CHAT_MESSAGES__INIT;
    Specd__V1__ChatMessage msgs[2] = {SPECD__V1__CHAT_MESSAGE__INIT, SPECD__V1__CHAT_MESSAGE__INIT};
    Specd__V1__ChatMessage *msg_ptrs[2] = {&msgs[0], &msgs[1]};
    Specd__V1__SamplingParams sp;
    static Specd__V1__LogitBias bias_msgs[SPECD_MAX_LOGIT_BIAS];
    static Specd__V1__LogitBias *bias_ptrs[SPECD_MAX_LOGIT_BIAS];
    Specd__V1__Speculation spec = SPECD__V1__SPECULATION__INIT;
    if (o->n_prompt_ids) {
        tids.n_ids = (size_t)o->n_prompt_ids;
        tids.ids = o->prompt_ids;
        req.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS;
        req.token_ids = &tids;
    } else if (o->chat) {
        size_t n = 0;
        if (o->system) {
            msgs[n].role = "system";
            msgs[n++].content = (char *)o->system;
        }
        msgs[n].role = "user";
        msgs[n++].content = (char *)text;
        chat.n_messages = n;
        chat.messages = msg_ptrs;
        req.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_CHAT;
        req.chat = &chat;
    } else {
        req.input_case = SPECD__V1__GENERATE_REQUEST__INPUT_TEXT;
        req.text = (char *)text;
    }
    /* unset = 0 = the server's default_max_new_tokens */
    req.max_new_tokens = o->max_tokens < 0 ? 0 : o->max_tokens;
    cli_sampling_to_proto(&o->samp, &sp, bias_msgs, bias_ptrs);
    req.sampling = &sp;
    req.n_stop = (size_t)o->n_stops;
    req.stop = (char **)o->stops;
    req.n_stop_ids = (size_t)o->n_stop_ids;
    req.stop_ids = o->stop_ids;
    req.ignore_eos = o->ignore_eos;
    req.drafter = (char *)(o->drafter ? o->drafter : "");
    if (o->candidates || o->depth || o->no_spec || o->stop_threshold) {
        spec.candidates = o->candidates;
        spec.depth = o->depth;
        spec.off = o->no_spec;
        spec.stop_threshold = o->stop_threshold;
        req.speculation = &spec;
    }
    /* alternatives come with the chosen token's own logprob */
    req.logprobs = o->logprobs || o->top_logprobs > 0;
    req.top_logprobs = o->top_logprobs;

    /* ---- the call */
    specd_rpc_channel_opts co = o->tls;
    co.target = o->server;
    specd_rpc_channel *ch = specd_rpc_channel_create(&co, &err);
    if (!ch) {
        fprintf(stderr, "specd generate: %s\n", err.msg);
        free(owned);
        return 1;
    }
    out_state os = {.o = o};
    cli_gen_result res;
    grpc_status_code code =
        cli_generate_call(ch, o->service_target ? CLI_TARGET_GENERATE : CLI_DRAFT_GENERATE, &req,
                          o->timeout_s > 0 ? (int)(o->timeout_s * 1e3 + 0.5) : 0, on_msg, &os,
                          &res, &err);
    specd_rpc_channel_free(ch);
    free(owned);
    if (os.failed) {
        code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        specd_seterr(&err, "out of memory for the token ids");
    }
    if (code != GRPC_STATUS_OK) {
        if (os.printed_text) fputc('\n', stdout);
        fflush(stdout);
        if (o->json) {
            cJSON *obj = cJSON_CreateObject();
            cJSON *e = cJSON_AddObjectToObject(obj, "error");
            cJSON_AddStringToObject(e, "code", specd_rpc_status_name(code));
            cJSON_AddNumberToObject(e, "code_number", code);
            cJSON_AddStringToObject(e, "message", err.msg);
            print_json(obj);
        }
        /* err reads "METHOD on ADDR: CODE: the server's message" */
        fprintf(stderr, "specd generate: %s\n", err.msg);
        free(os.ids);
        return 1;
    }
    if (o->json) {
        double ttft, elapsed, tok_s;
        client_times(&res, &ttft, &elapsed, &tok_s);
        cJSON *obj = cJSON_CreateObject();
        cJSON_AddStringToObject(obj, "finish_reason", cli_finish_name(res.finish));
        cJSON_AddItemToObject(obj, "stats", stats_json(&res));
        cJSON *cl = cJSON_AddObjectToObject(obj, "client");
        cJSON_AddNumberToObject(cl, "time_to_first_token_ms", ttft);
        cJSON_AddNumberToObject(cl, "elapsed_ms", elapsed * 1e3);
        cJSON_AddNumberToObject(cl, "longest_gap_ms", res.max_gap * 1e3);
        cJSON_AddNumberToObject(cl, "tokens", res.n_tokens);
        cJSON_AddNumberToObject(cl, "tokens_per_s", tok_s);
        print_json(obj);
    } else {
        if (os.printed_text) fputc('\n', stdout);
        if (o->print_ids) {
            printf("ids:");
            for (int k = 0; k < os.n_ids; k++) printf(" %d", os.ids[k]);
            printf("\n");
        }
        fflush(stdout);
        print_stats(&res);
    }
    free(os.ids);
    return 0;
}
