/* client.h - how the specd tool calls a specd service: one Generate call
 * over common/rpc/rpc_client.h with the client-side clock around it, the TLS
 * flags, and names for status codes and finish reasons. Shared by
 * `specd generate --server` and `specd bench --e2e`, so both measure the
 * same thing the same way. */
#ifndef SPECD_CLI_CLIENT_H
#define SPECD_CLI_CLIENT_H

#include <stdio.h>

#include <grpc/status.h>

#include "common/util/error.h"
#include "common/rpc/rpc_client.h"
#include "specd.pb-c.h"

#define CLI_DRAFT_GENERATE "/specd.v1.Draft/Generate"
#define CLI_TARGET_GENERATE "/specd.v1.Target/Generate"
#define CLI_DRAFT_INFO "/specd.v1.Draft/GetInfo"
/* Longest acceptance-by-position list kept (the server's SPECD_MAX_DRAFT_DEPTH). */
#define CLI_MAX_POSITIONS 64

/* What one Generate call produced: the server's final stats plus the
 * client's own clock (cli_now() seconds). */
typedef struct cli_gen_result {
    Specd__V1__FinishReason finish;
    int n_messages, n_tokens; /* response messages, token ids received */
    int have_stats;           /* the last message carried stats */
    int prompt_tokens, generated_tokens, target_steps, drafted_tokens, accepted_tokens;
    int failovers;
    float tau; /* mean_accepted_length: tokens per target step */
    float acceptance_by_position[CLI_MAX_POSITIONS];
    int n_positions;
    float server_ttft_ms, server_tpot_ms;
    /* the decode steps' time by part (GenerateStats): ms summed */
    float draft_ms, target_wait_ms, target_forward_ms;
    int pipelined_drafts, pipelined_hits; /* trees drafted ahead, and used */
    int round_trips;                      /* Verify messages the target answered */
    char drafter[32];
    double t_start; /* the call started */
    double t_first; /* the first message with tokens arrived (0 = none) */
    double t_last;  /* the latest message with tokens arrived */
    double max_gap; /* longest wait between two messages with tokens after the
                     * first (seconds): the stream's worst stall, e.g. while
                     * the target prefills someone else's long prompt */
    double t_end;   /* the status arrived */
} cli_gen_result;

/* Called for every response message, in order; nonzero stops the call
 * (cancelled: the result is CANCELLED). */
typedef int (*cli_gen_on_msg)(void *arg, const Specd__V1__GenerateResponse *r);

/* Calls `method` (CLI_DRAFT_GENERATE or CLI_TARGET_GENERATE) with req and
 * reads the stream to its end. timeout_ms <= 0 = no deadline. Returns the
 * call's status: OK with *res filled, or the code with err holding
 * "METHOD on ADDR: CODE: server message". on_msg may be NULL. */
grpc_status_code cli_generate_call(specd_rpc_channel *ch, const char *method,
                                   const Specd__V1__GenerateRequest *req, int timeout_ms,
                                   cli_gen_on_msg on_msg, void *arg, cli_gen_result *res,
                                   specd_error *err);

/* If argv[*i] is a TLS flag (--insecure, --ca FILE, --cert FILE, --key FILE,
 * --server-name NAME), applies it to o, advancing *i, and returns 1. */
int cli_tls_option(int argc, char **argv, int *i, specd_rpc_channel_opts *o);
void cli_tls_usage(FILE *f);

/* "eos", "stop", "length", ... (status codes: specd_rpc_status_name) */
const char *cli_finish_name(Specd__V1__FinishReason f);

#endif
