/* generate.h - the options of `specd generate`, shared by its two modes:
 * local decoding on a model file (cmd_generate.c) and the client of a
 * running service (--server, cmd_generate_remote.c). One parser fills this
 * struct for both, so a flag means the same thing in either mode. */
#ifndef SPECD_CLI_GENERATE_H
#define SPECD_CLI_GENERATE_H

#include <stdint.h>

#include "cli.h"
#include "common/util/error.h"
#include "common/rpc/rpc_client.h"

#define GEN_MAX_STOPS 64

typedef struct gen_opts {
    /* ---- both modes ---- */
    const char *prompt;      /* -p/--prompt or the positional argument; NULL = unset */
    const char *prompt_file; /* -f/--file; "-" = stdin */
    const char *system;
    int chat;
    int max_tokens; /* -n/--max-tokens/--max-new-tokens; -1 = unset */
    int ignore_eos;
    int print_ids;  /* --ids: also print the generated token ids */
    cli_sampling samp;
    /* ---- local mode ---- */
    const char *model;
    int threads;
    const char *backend; /* --backend cpu|cuda (NULL = cpu) */
    int device;          /* --device N: CUDA device id */
    int precision;       /* --precision fast|exact (specd_precision) */
    int kv_dtype;        /* --kv-cache-dtype auto|f32|f16|q8_0 (specd_kv_dtype) */
    /* --speculator DIR: speculative decoding on the local model, through
     * target-svc and draft-svc started in this process (tools/inproc.h);
     * the server-mode flags then apply to them. */
    const char *speculator;
    /* ---- server mode ---- */
    const char *server;  /* --server ADDR: server mode */
    int service_target;  /* --service target: /specd.v1.Target/Generate */
    const char *stops[GEN_MAX_STOPS];
    int n_stops;
    int32_t stop_ids[GEN_MAX_STOPS];
    int n_stop_ids;
    const char *drafter;
    int candidates, depth, no_spec;
    float stop_threshold; /* --stop-threshold: 0 = the server's, negative = off */
    int logprobs, top_logprobs;
    int32_t *prompt_ids; /* --prompt-ids (malloc'd) */
    int n_prompt_ids;
    specd_rpc_channel_opts tls; /* target filled from server */
    double timeout_s;
    int json;
    /* The first flag seen that only one mode understands, to refuse it in
     * the other rather than silently ignore it. */
    const char *server_only_flag, *local_only_flag;
} gen_opts;

/* `specd generate --server ...`. Returns the exit code. */
int cmd_generate_remote(gen_opts *o);

/* The prompt text: the -f file ("-" = stdin), else -p / the positional
 * argument ("-" = stdin), else stdin when want_stdin (server mode), else
 * NULL. *owned is what to free. -1 + err when it cannot be read. */
int gen_prompt_text(const gen_opts *o, int want_stdin, const char **text, char **owned,
                    specd_error *err);

#endif
