/* target_config.c - see target_config.h. */
#include "target_config.h"

#include "kernels/backend.h"
#include "common/rpc/request_log.h"

const char *const specd_target_backends[] = {"cpu", "cuda", NULL};

/* Keep in step with deploy/config/target-svc.example.yaml. */
const specd_cfg_field specd_target_cfg_fields[] = {
    SPECD_CFG_FIELD("listen", SPECD_CFG_STRING, specd_target_cfg, listen, "0.0.0.0:50052",
                    "address to serve gRPC on (host:port)"),
    SPECD_CFG_FIELD("model", SPECD_CFG_STRING, specd_target_cfg, model, NULL,
                    "target model: a .gguf file or a Hugging Face directory"),
    SPECD_CFG_FIELD("backend", SPECD_CFG_ENUM, specd_target_cfg, backend, "cpu", "compute backend",
                    .choices = specd_target_backends),
    SPECD_CFG_FIELD("device", SPECD_CFG_INT64, specd_target_cfg, device, "0", "CUDA device id",
                    .min = 0, .max = 1024),
    SPECD_CFG_FIELD("threads", SPECD_CFG_INT64, specd_target_cfg, threads, "0",
                    "CPU compute threads (0 = one per core)", .min = 0, .max = 1024),
    SPECD_CFG_FIELD("precision", SPECD_CFG_ENUM, specd_target_cfg, precision, "fast",
                    "CPU matmul: fast (int8 activations, as llama.cpp) or exact (fp32 "
                    "activations)",
                    .choices = specd_precision_names),
    SPECD_CFG_FIELD("kv_cache_dtype", SPECD_CFG_ENUM, specd_target_cfg, kv_cache_dtype, "auto",
                    "what the KV cache stores: auto (f16, but f32 with precision exact on the "
                    "cpu), f32, f16 (half the memory per token; K and V rounded to fp16) or q8_0 "
                    "(cpu only: 53% of f16's memory; int8 blocks of 32, as llama.cpp's "
                    "--cache-type-k/v q8_0)",
                    .choices = specd_kv_dtype_names),
    SPECD_CFG_FIELD("limits.max_sessions", SPECD_CFG_INT64, specd_target_cfg, limits.max_sessions,
                    "64", "concurrent sessions (each holds a KV cache)", .min = 1, .max = 65536),
    SPECD_CFG_FIELD("limits.max_prompt_tokens", SPECD_CFG_INT64, specd_target_cfg,
                    limits.max_prompt_tokens, "32768", "longest prompt, in tokens (a prompt must also fit the context, which for the default model is 8192)", .min = 1,
                    .max = 1 << 24),
    /* The same two limits, defaults and words as draft-svc's (Generate is
     * served by both, common/rpc/admission.h). */
    SPECD_CFG_FIELD("limits.max_new_tokens", SPECD_CFG_INT64, specd_target_cfg,
                    limits.max_new_tokens, "4096", "most tokens a Generate request may ask for",
                    .min = 1, .max = 1 << 24),
    SPECD_CFG_FIELD("limits.default_max_new_tokens", SPECD_CFG_INT64, specd_target_cfg,
                    limits.default_max_new_tokens, "256",
                    "max_new_tokens of a Generate request that sets none", .min = 1,
                    .max = 1 << 24),
    SPECD_CFG_FIELD("limits.max_tree_tokens", SPECD_CFG_INT64, specd_target_cfg,
                    limits.max_tree_tokens, "64", "most tokens in one candidate tree", .min = 1,
                    .max = 4096),
    SPECD_CFG_FIELD("limits.kv_memory", SPECD_CFG_SIZE, specd_target_cfg, limits.kv_memory, "2GiB",
                    "memory of the one KV page pool all sessions share (at least one "
                    "full context)", .min = 1, .max = INT64_MAX),
    SPECD_CFG_FIELD("limits.max_context", SPECD_CFG_INT64, specd_target_cfg, limits.max_context,
                    "0", "most tokens one session may hold (0 = the model's context)", .min = 0,
                    .max = 1 << 24),
    SPECD_CFG_FIELD("limits.prefix_cache", SPECD_CFG_BOOL, specd_target_cfg, limits.prefix_cache,
                    "true", "share the KV pages of common prompt prefixes between sessions"),
    SPECD_CFG_FIELD("limits.kv_wait", SPECD_CFG_DURATION, specd_target_cfg, limits.kv_wait, "30s",
                    "longest a running session's step waits for KV pages before "
                    "RESOURCE_EXHAUSTED (the session is preempted; draft-svc re-opens it)",
                    .min = 1, .max = 3600000),
    SPECD_CFG_FIELD("limits.queue_wait", SPECD_CFG_DURATION, specd_target_cfg, limits.queue_wait,
                    "10m", "longest a new session waits in the queue (first come, first "
                    "served) for KV pages to start its prompt before RESOURCE_EXHAUSTED",
                    .min = 1, .max = 86400000),
    SPECD_CFG_FIELD("batching.max_batch_tokens", SPECD_CFG_INT64, specd_target_cfg,
                    batching.max_batch_tokens, "2048", "most tokens in one forward pass",
                    .min = 2, .max = 1 << 20),
    SPECD_CFG_FIELD("batching.max_wait", SPECD_CFG_DURATION, specd_target_cfg, batching.max_wait,
                    "2ms", "how long a small batch waits for more work", .min = 0,
                    .max = 10000),
    SPECD_CFG_FIELD("batching.prefill_chunk", SPECD_CFG_INT64, specd_target_cfg,
                    batching.prefill_chunk, "256",
                    "prompt tokens per forward pass (a long prompt delays other streams by one "
                    "chunk per step)", .min = 1, .max = 1 << 20),
    SPECD_CFG_FIELD("batching.prefill_chunk_time", SPECD_CFG_DURATION, specd_target_cfg,
                    batching.prefill_chunk_time, "200ms",
                    "while other streams are decoding, a pass carries at most this much prompt "
                    "work: the chunk shrinks as the prompt's attention grows, sized from the "
                    "measured cost of the previous prompt pass (0 = prefill_chunk tokens "
                    "always)", .min = 0, .max = 600000),
    SPECD_CFG_FIELD("batching.calibrate_tokens", SPECD_CFG_INT64, specd_target_cfg,
                    batching.calibrate_tokens, "64",
                    "at start-up, time forward passes of 1..this many tokens for the cost curve "
                    "draft-svc prices its trees with (GetInfo step_cost; real passes refine it); "
                    "0 = learn from real passes only", .min = 0, .max = 4096),
    SPECD_CFG_FIELD("tls.cert", SPECD_CFG_STRING, specd_target_cfg, tls.cert, NULL,
                    "server certificate chain (PEM)"),
    SPECD_CFG_FIELD("tls.key", SPECD_CFG_STRING, specd_target_cfg, tls.key, NULL,
                    "server private key (PEM)", .flags = SPECD_CFG_SECRET),
    SPECD_CFG_FIELD("tls.client_ca", SPECD_CFG_STRING, specd_target_cfg, tls.client_ca, NULL,
                    "CA for client certificates (mutual TLS)"),
    SPECD_CFG_FIELD("tls.insecure", SPECD_CFG_BOOL, specd_target_cfg, tls.insecure, "false",
                    "serve plaintext (development only)"),
    SPECD_CFG_FIELD("metrics.listen", SPECD_CFG_STRING, specd_target_cfg, metrics.listen, NULL,
                    "host:port for the Prometheus GET /metrics listener (empty = off)"),
    SPECD_CFG_FIELD("log.format", SPECD_CFG_ENUM, specd_target_cfg, log.format, "text",
                    "per-request log lines on stderr: text or json",
                    .choices = specd_log_formats),
};
const size_t specd_target_cfg_n_fields =
    sizeof specd_target_cfg_fields / sizeof specd_target_cfg_fields[0];
