/* inproc.h - target-svc and draft-svc running inside this process, on
 * loopback (127.0.0.1, ephemeral ports, plaintext), assembled the way
 * target-svc/main.c and draft-svc/main.c assemble them and with their
 * configuration defaults (the same schema tables), so `specd bench --e2e`
 * and the CLI tests measure the real services without deploying anything.
 *
 * The target can also be an external one (target_addr): then only
 * draft-svc runs here, and the model file is opened for its tokenizer. */
#ifndef SPECD_CLI_INPROC_H
#define SPECD_CLI_INPROC_H

#include "common/util/error.h"
#include "common/rpc/rpc_client.h"
#include "common/text/tokenizer.h"

typedef struct cli_inproc_opts {
    const char *model;       /* the target model (and the tokenizer); required */
    const char *target_addr; /* external target-svc instead of an in-process one */
    /* TLS towards the external target (target is ignored: target_addr
     * is used); unused for the in-process target, which is plaintext. */
    specd_rpc_channel_opts target_tls;
    int threads;             /* CPU threads for the target and each drafter; 0 = all */
    const char *backend;     /* the target's and the speculator's backend; NULL = cpu */
    int device;              /* CUDA device id */
    int precision;           /* the target's CPU matmul precision (specd_precision) */
    int kv_dtype;            /* the target's KV cache type (specd_kv_dtype) */
    int max_sessions;        /* concurrent sessions on the target and the draft LM */
    int ctx;                 /* context rows per session; 0 = the model's */
    int ngram;               /* offer the n-gram drafter */
    /* the in-process target without automatic prefix caching
     * (limits.prefix_cache=false; `specd bench --e2e --no-prefix-cache`) */
    int no_prefix_cache;
    /* pipelined drafting in the in-process draft-svc (speculation.pipeline;
     * `specd bench --e2e --pipeline`). Off unless asked, unlike the
     * configuration's default: in one process the drafting ahead runs on
     * the target's own cores and slows its passes (draft_lm with the
     * target's own model, 2 threads, Sapphire Rapids VM: 0.44-0.66x of
     * plain pipelined, 0.56-0.82x serial). */
    int pipeline;
    /* the in-process draft-svc's speculation.max_shape ("CxD"); NULL = the
     * configuration's default */
    const char *max_shape;
    const char *draft_model; /* offer draft_lm with this model; NULL = not offered */
    const char *speculator;  /* offer mlp with this MLPSpeculator dir; NULL = not offered */
    /* Its SpecDec++ acceptance head; NULL = <speculator>/accept_head when
     * that holds one (where `specd train accept-head` writes it), else none.
     * Adaptive length stays off unless a request sets stop_threshold (the
     * configuration's default threshold is 0). */
    const char *accept_head;
} cli_inproc_opts;

typedef struct cli_inproc cli_inproc;

/* Loads everything and starts serving. NULL + err on failure. */
cli_inproc *cli_inproc_start(const cli_inproc_opts *o, specd_error *err);
/* "127.0.0.1:PORT" of each service (the target's is target_addr if external). */
const char *cli_inproc_target_addr(const cli_inproc *p);
const char *cli_inproc_draft_addr(const cli_inproc *p);
/* The model's tokenizer, or NULL if it has none. */
const specd_tokenizer *cli_inproc_tokenizer(const cli_inproc *p);
/* Stops both servers (cancelling what is in flight) and frees everything.
 * NULL is a no-op. */
void cli_inproc_stop(cli_inproc *p);

#endif
