/* client.c - one Generate call and the TLS flags (client.h). */
#include "tools/client.h"

#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common/rpc/request_log.h"

const char *cli_finish_name(Specd__V1__FinishReason f) { return specd_finish_reason_name(f); }

static void take_stats(cli_gen_result *res, const Specd__V1__GenerateStats *st) {
    res->have_stats = 1;
    res->prompt_tokens = st->prompt_tokens;
    res->generated_tokens = st->generated_tokens;
    res->target_steps = st->target_steps;
    res->drafted_tokens = st->drafted_tokens;
    res->accepted_tokens = st->accepted_tokens;
    res->failovers = st->failovers;
    res->tau = st->mean_accepted_length;
    size_t n = st->n_acceptance_by_position;
    if (n > CLI_MAX_POSITIONS) n = CLI_MAX_POSITIONS;
    for (size_t k = 0; k < n; k++) res->acceptance_by_position[k] = st->acceptance_by_position[k];
    res->n_positions = (int)n;
    res->server_ttft_ms = st->time_to_first_token_ms;
    res->server_tpot_ms = st->time_per_output_token_ms;
    res->draft_ms = st->draft_ms;
    res->target_wait_ms = st->target_wait_ms;
    res->target_forward_ms = st->target_forward_ms;
    res->pipelined_drafts = st->pipelined_drafts;
    res->pipelined_hits = st->pipelined_hits;
    res->round_trips = st->round_trips;
    snprintf(res->drafter, sizeof res->drafter, "%s", st->drafter ? st->drafter : "");
}

grpc_status_code cli_generate_call(specd_rpc_channel *ch, const char *method,
                                   const Specd__V1__GenerateRequest *req, int timeout_ms,
                                   cli_gen_on_msg on_msg, void *arg, cli_gen_result *res,
                                   specd_error *err) {
    memset(res, 0, sizeof *res);
    res->t_start = cli_now();
    specd_rpc_stream *st = specd_rpc_stream_start(ch, method, timeout_ms, err);
    if (!st) {
        res->t_end = cli_now();
        return GRPC_STATUS_UNKNOWN;
    }
    /* One request, then half-close: Generate is server streaming. */
    specd_rpc_cio cio = specd_rpc_stream_send(st, &req->base, 1, err);
    if (cio == SPECD_RPC_CIO_INVALID) {
        /* Over the message limit: nothing was sent, the call is ours to end. */
        specd_rpc_stream_free(st);
        res->t_end = cli_now();
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    grpc_status_code local = GRPC_STATUS_OK;
    /* A failed send leaves the status to recv/finish, which say why. */
    while (cio == SPECD_RPC_CIO_OK) {
        ProtobufCMessage *m = NULL;
        cio = specd_rpc_stream_recv(st, &specd__v1__generate_response__descriptor, &m, -1, err);
        if (cio == SPECD_RPC_CIO_INVALID) {
            /* A response we cannot decode means the two sides disagree on the
             * contract; going on would print garbage. */
            local = GRPC_STATUS_INTERNAL;
            break;
        }
        if (cio != SPECD_RPC_CIO_OK) break; /* END or FAILED: finish has the status */
        const Specd__V1__GenerateResponse *r = (const Specd__V1__GenerateResponse *)m;
        res->n_messages++;
        if (r->n_token_ids) {
            double t = cli_now();
            if (!res->t_first) res->t_first = t;
            else if (t - res->t_last > res->max_gap) res->max_gap = t - res->t_last;
            res->t_last = t;
        }
        res->n_tokens += (int)r->n_token_ids;
        if (r->finish_reason) res->finish = r->finish_reason;
        if (r->stats) take_stats(res, r->stats);
        int stop = on_msg ? on_msg(arg, r) : 0;
        protobuf_c_message_free_unpacked(m, NULL);
        if (stop) {
            local = GRPC_STATUS_CANCELLED;
            specd_seterr(err, "%s on %s: stopped by the client", method,
                         specd_rpc_channel_target(ch));
            break;
        }
    }
    grpc_status_code code = local;
    if (local == GRPC_STATUS_OK) {
        code = specd_rpc_stream_finish(st, err);
    }
    specd_rpc_stream_free(st); /* cancels the call if we left it early */
    res->t_end = cli_now();
    if (code == GRPC_STATUS_OK && !res->finish) {
        /* A stream that ends OK without a finish reason broke the contract
         * (the last message must carry one). */
        specd_seterr(err, "%s on %s: the stream ended without a finish reason", method,
                     specd_rpc_channel_target(ch));
        return GRPC_STATUS_INTERNAL;
    }
    return code;
}

int cli_tls_option(int argc, char **argv, int *i, specd_rpc_channel_opts *o) {
    const char *a = argv[*i];
    if (!strcmp(a, "--insecure")) o->insecure = 1;
    else if (!strcmp(a, "--ca")) o->tls_ca_path = cli_value(argc, argv, i);
    else if (!strcmp(a, "--cert")) o->tls_cert_path = cli_value(argc, argv, i);
    else if (!strcmp(a, "--key")) o->tls_key_path = cli_value(argc, argv, i);
    else if (!strcmp(a, "--server-name")) o->tls_server_name = cli_value(argc, argv, i);
    else return 0;
    return 1;
}

void cli_tls_usage(FILE *f) {
    fprintf(f, "  --insecure           plaintext (the server must serve plaintext too)\n"
               "  --ca FILE            CA bundle the server's certificate must chain to\n"
               "                       (default: the system roots; TLS is the default)\n"
               "  --cert FILE, --key FILE  client certificate for mutual TLS\n"
               "  --server-name NAME   name to check the server's certificate against\n");
}
