/* target_opts.c - see target_opts.h. */
#include "target-svc/target_opts.h"

#include <string.h>

void specd_transformer_opts_from_config(const specd_target_cfg *c, int model_ctx,
                                        specd_transformer_opts *to) {
    /* KV budget: limits.kv_memory buys one pool of pages that every
     * session draws from as it grows (rows of kv_cache_dtype: by default
     * fp16, except fp32 for precision exact on the CPU; the transformer does the arithmetic
     * because it knows the KV format). Any session may grow to the model's context, or
     * limits.max_context; a pool smaller than one such context is an error. */
    *to = (specd_transformer_opts){
        .backend = {.name = specd_target_backends[c->backend], .n_threads = (int)c->threads,
                    .device = (int)c->device, .precision = (specd_precision)c->precision,
                    .kv_dtype = (specd_kv_dtype)c->kv_cache_dtype},
        .n_slots = (int)c->limits.max_sessions,
        .max_ctx = c->limits.max_context > 0 && c->limits.max_context < model_ctx
                       ? (int)c->limits.max_context
                       : model_ctx,
        .kv_memory = c->limits.kv_memory,
        .max_batch = (int)c->batching.max_batch_tokens,
        .prefix_cache = c->limits.prefix_cache,
    };
}

void specd_target_opts_from_config(const specd_target_cfg *c, specd_target_opts *so) {
    *so = (specd_target_opts){
        .max_sessions = (int)c->limits.max_sessions,
        .max_prompt_tokens = (int)c->limits.max_prompt_tokens,
        .max_tree_tokens = (int)c->limits.max_tree_tokens,
        .max_new_tokens = (int)c->limits.max_new_tokens,
        .default_max_new_tokens = (int)c->limits.default_max_new_tokens,
        .max_batch_tokens = (int)c->batching.max_batch_tokens,
        .max_wait_ms = (int)c->batching.max_wait,
        .device = (int)c->device,
        .prefill_chunk = (int)c->batching.prefill_chunk,
        .prefill_chunk_ms = (int)c->batching.prefill_chunk_time,
        .kv_wait_ms = (int)c->limits.kv_wait,
        .queue_wait_ms = (int)c->limits.queue_wait,
        .prefix_cache = c->limits.prefix_cache,
        .calibrate_tokens = (int)c->batching.calibrate_tokens,
    };
}

void specd_target_server_opts_from_config(const specd_target_cfg *c, specd_rpc_server_opts *ro) {
    *ro = (specd_rpc_server_opts){
        .listen_addr = c->listen,
        .tls_cert_path = c->tls.insecure ? NULL : c->tls.cert,
        .tls_key_path = c->tls.insecure ? NULL : c->tls.key,
        .tls_client_ca_path = c->tls.insecure ? NULL : c->tls.client_ca,
        .insecure = c->tls.insecure,
        .max_calls = (int)c->limits.max_sessions + 64,
    };
}
