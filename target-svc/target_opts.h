/* target_opts.h - target-svc's configuration (target_config.h) turned into
 * the options of its parts, in one place: target-svc/main.c, the
 * in-process services of the CLI (tools/inproc.c) and the tests start from
 * here, so a default lives only in the schema (target_config.c) and the
 * copies cannot drift. Callers that size things themselves (the CLI's
 * --max-sessions, --ctx) override single fields afterwards. */
#ifndef SPECD_TARGET_OPTS_H
#define SPECD_TARGET_OPTS_H

#include "common/model/transformer.h"
#include "common/rpc/rpc_server.h"
#include "target-svc/service.h"
#include "target-svc/target_config.h"

/* The transformer: backend, slots, context (limits.max_context, capped by
 * the model's model_ctx), the KV pool and prefix cache, the batch. */
void specd_transformer_opts_from_config(const specd_target_cfg *c, int model_ctx,
                                        specd_transformer_opts *to);

/* The Target service: session, prompt, tree and Generate limits, batching,
 * KV waits. */
void specd_target_opts_from_config(const specd_target_cfg *c, specd_target_opts *so);

/* The gRPC server: listen address and TLS (tls.insecure wins over the
 * files, so one flag switches a config to plaintext), sessions plus a few
 * Generate/GetInfo/health calls. */
void specd_target_server_opts_from_config(const specd_target_cfg *c, specd_rpc_server_opts *ro);

#endif
