/* draft_config.c - see draft_config.h. */
#include "draft-svc/draft_config.h"

#include "common/rpc/request_log.h"
#include "draft-svc/service.h" /* specd_drafter_names: the drafter registry */

const char *const specd_draft_backends[] = {"cpu", "cuda", NULL};
/* drafter.mlp.quantize, in the order of specd_mlp_quant */
const char *const specd_mlp_quant_names[] = {"none", "q8_0", "q4_1_head", NULL};
const char *const specd_speculation_trees[] = {"cost", "table", NULL};

/* The table's struct is always specd_draft_cfg; F saves repeating it. */
#define F(name, type, member, ...) SPECD_CFG_FIELD(name, type, specd_draft_cfg, member, __VA_ARGS__)

/* Keep in step with deploy/config/draft-svc.example.yaml. */
const specd_cfg_field specd_draft_cfg_fields[] = {
    F("listen", SPECD_CFG_STRING, listen, "0.0.0.0:50051", "address to serve gRPC on (host:port)"),
    F("tokenizer", SPECD_CFG_STRING, tokenizer, NULL,
      "model file or directory whose tokenizer to use for text input (usually the target's); "
      "unset = token-id input only"),
    F("threads", SPECD_CFG_INT64, threads, "0", "CPU threads for the drafters (0 = one per core)",
      .min = 0, .max = 1024),
    F("targets", SPECD_CFG_STRLIST, targets, "127.0.0.1:50052",
      "target-svc addresses: host:port, or dns:NAME:PORT for every address of a name"),
    F("drafter.default", SPECD_CFG_ENUM, drafter.def, "auto",
      "drafter for requests that name none; auto = the best one offered: mlp_ngram, else mlp, "
      "else ngram", .choices = specd_drafter_names),
    F("drafter.mlp.path", SPECD_CFG_STRING, drafter.mlp.path, NULL,
      "MLPSpeculator directory (config.json + safetensors); unset = not offered"),
    F("drafter.mlp.accept_head", SPECD_CFG_STRING, drafter.mlp.accept_head, NULL,
      "SpecDec++ acceptance head directory for that speculator (specd train accept-head); "
      "unset = fixed-length drafts"),
    F("drafter.mlp.backend", SPECD_CFG_ENUM, drafter.mlp.backend, "cpu",
      "where the speculator runs: cpu, or cuda (weights on the GPU in fp16)",
      .choices = specd_draft_backends),
    F("drafter.mlp.quantize", SPECD_CFG_ENUM, drafter.mlp.quantize, "q4_1_head",
      "cpu backend: the speculator's matrices as stored (none), as Q8_0 (q8_0: about twice as "
      "fast a draft as fp16), or the output heads as Q4_1 and the rest Q8_0 (q4_1_head: a "
      "further 12-24% off each draft, the same tau on the held-out prompts); quantized at "
      "load; drafts change slightly, the output never does",
      .choices = specd_mlp_quant_names),
    F("drafter.mlp.device", SPECD_CFG_INT64, drafter.mlp.device, "0",
      "CUDA device id for drafter.mlp.backend = cuda", .min = 0, .max = 1024),
    F("drafter.draft_lm.path", SPECD_CFG_STRING, drafter.draft_lm.path, NULL,
      "draft language model (.gguf or HF directory, the target's tokenizer); unset = not offered"),
    F("drafter.draft_lm.max_sessions", SPECD_CFG_INT64, drafter.draft_lm.max_sessions, "64",
      "sessions the draft model keeps a KV cache for", .min = 1, .max = 65536),
    F("drafter.draft_lm.max_ctx", SPECD_CFG_INT64, drafter.draft_lm.max_ctx, "0",
      "draft model context per session (0 = the model's); longer sessions get no drafts",
      .min = 0, .max = 1 << 24),
    F("drafter.ngram.enabled", SPECD_CFG_BOOL, drafter.ngram.enabled, "true",
      "offer prompt-lookup drafting"),
    F("drafter.ngram.min_n", SPECD_CFG_INT64, drafter.ngram.min_n, "1",
      "shortest n-gram matched", .min = 1, .max = 64),
    F("drafter.ngram.max_n", SPECD_CFG_INT64, drafter.ngram.max_n, "4",
      "longest n-gram matched (tried first)", .min = 1, .max = 64),
    F("drafter.ngram.max_scan", SPECD_CFG_INT64, drafter.ngram.max_scan, "8192",
      "history tokens searched for a match", .min = 1, .max = 1 << 24),
    /* suffix decoding (drafter_ngram.c, suffix_tree.h) */
    F("drafter.ngram.min_prob", SPECD_CFG_DOUBLE, drafter.ngram.min_prob, "0.02",
      "greedy requests: smallest estimated probability (smoothed counts along the path) of a "
      "drafted token; lower drafts bigger trees", .fmin = 0.001, .fmax = 1),
    F("speculation.suffix_cache.shared", SPECD_CFG_BOOL, speculation.suffix_cache.shared, "false",
      "ngram: finished requests' outputs (never prompts) go into one cache that every request "
      "drafts from; false = a request drafts from its own prompt and output only"),
    F("speculation.suffix_cache.max_tokens", SPECD_CFG_INT64, speculation.suffix_cache.max_tokens,
      "65536", "tokens the shared cache holds (at most 32 trie nodes of 16 bytes a token); the "
      "oldest requests are evicted first", .min = 1, .max = 1 << 22),
    F("speculation.tree", SPECD_CFG_ENUM, speculation.tree, "cost",
      "how greedy requests size their trees: cost (draft up to max_shape, verify the part "
      "that maximizes expected tokens per unit of target time, measured; nothing when "
      "nothing pays) or table (load_table and the collapse rule)",
      .choices = specd_speculation_trees),
    F("speculation.max_shape", SPECD_CFG_STRING, speculation.max_shape, "4x6",
      "tree = cost: the largest tree drafted, CANDIDATESxDEPTH (the drafter's depth caps it)"),
    F("speculation.load_table", SPECD_CFG_STRLIST, speculation.load_table, "1:1x1",
      "SESSIONS:CANDIDATESxDEPTH entries: tree shape while the target has at most SESSIONS "
      "active sessions"),
    F("speculation.off_above", SPECD_CFG_INT64, speculation.off_above, "32",
      "no speculation while the target has more active sessions (0 = never off)", .min = 0,
      .max = 1 << 20),
    F("speculation.sampled_load_aware", SPECD_CFG_BOOL, speculation.sampled_load_aware, "false",
      "requests sampled with method REJECTION follow the load table too: faster under load, "
      "but their seed then reproduces only at the same load (false = they keep the table's "
      "first shape at any load, so a seed gives the same output whatever else runs). "
      "Seed-exact requests (the default method) always follow the load: their output does not "
      "depend on the tree"),
    F("speculation.min_acceptance", SPECD_CFG_DOUBLE, speculation.min_acceptance, "0.1",
      "a session whose smoothed accepted/drafted ratio falls below this decodes plainly for a "
      "while (0 = never)", .fmin = 0, .fmax = 1),
    F("speculation.warmup_steps", SPECD_CFG_INT64, speculation.warmup_steps, "4",
      "drafted steps before the collapse rule may fire", .min = 0, .max = 1 << 20),
    F("speculation.cooldown_steps", SPECD_CFG_INT64, speculation.cooldown_steps, "16",
      "plain steps after a collapse", .min = 1, .max = 1 << 20),
    F("speculation.ewma_alpha", SPECD_CFG_DOUBLE, speculation.ewma_alpha, "0.2",
      "weight of the newest step in the smoothed accepted/drafted ratio", .fmin = 0.001,
      .fmax = 1),
    F("speculation.adaptive.threshold", SPECD_CFG_DOUBLE, speculation.adaptive.threshold, "0",
      "mlp with an accept_head: a path stops growing once the head's chance that some token "
      "on it is rejected exceeds this (0 = off: every path gets the full depth)", .fmin = 0,
      .fmax = 0.999),
    F("speculation.adaptive.min_depth", SPECD_CFG_INT64, speculation.adaptive.min_depth, "1",
      "paths are never stopped shorter than this", .min = 1, .max = 64),
    F("speculation.pipeline", SPECD_CFG_BOOL, speculation.pipeline, "true",
      "draft_lm: draft the next tree while the target verifies one, guessing that its most "
      "likely path is accepted whole; used when the guess holds (pays when draft-svc has cores "
      "of its own)"),
    F("limits.max_prompt_tokens", SPECD_CFG_INT64, limits.max_prompt_tokens, "32768",
      "longest prompt, in tokens (it must also fit the targets' context: 8192 for the default "
      "model)", .min = 1, .max = 1 << 24),
    F("limits.max_new_tokens", SPECD_CFG_INT64, limits.max_new_tokens, "4096",
      "most tokens one request may generate", .min = 1, .max = 1 << 24),
    F("limits.default_max_new_tokens", SPECD_CFG_INT64, limits.default_max_new_tokens, "256",
      "max_new_tokens of a request that sets none", .min = 1, .max = 1 << 24),
    F("limits.max_tree_tokens", SPECD_CFG_INT64, limits.max_tree_tokens, "64",
      "most tokens in one candidate tree (also capped by each target's limit)", .min = 1,
      .max = 4096),
    F("limits.max_calls", SPECD_CFG_INT64, limits.max_calls, "256",
      "concurrent calls; more are refused with RESOURCE_EXHAUSTED", .min = 1, .max = 65536),
    F("target.step_timeout", SPECD_CFG_DURATION, target.step_timeout, "30s",
      "a target that answers neither a step nor its health checks for this long counts as "
      "failed (a busy target that still answers health checks is waited for)", .min = 1,
      .max = 3600000),
    F("target.open_timeout", SPECD_CFG_DURATION, target.open_timeout, "120s",
      "longest wait for any one answer from a live target (for Open, the prefill: this much per "
      "started 2048 tokens of history, plus the target's queue_wait from GetInfo)", .min = 1,
      .max = 3600000),
    F("target.max_failovers", SPECD_CFG_INT64, target.max_failovers, "3",
      "times one request may move to another target", .min = 0, .max = 1000),
    F("target.resolve_interval", SPECD_CFG_DURATION, target.resolve_interval, "10s",
      "how often dns: targets are resolved again", .min = 100, .max = 3600000),
    F("target.tls.ca", SPECD_CFG_STRING, target.tls.ca, NULL,
      "CA bundle the targets' certificates must chain to (PEM); unset = system roots"),
    F("target.tls.cert", SPECD_CFG_STRING, target.tls.cert, NULL,
      "client certificate for mutual TLS to the targets (PEM)"),
    F("target.tls.key", SPECD_CFG_STRING, target.tls.key, NULL,
      "client private key for mutual TLS (PEM)", .flags = SPECD_CFG_SECRET),
    F("target.tls.server_name", SPECD_CFG_STRING, target.tls.server_name, NULL,
      "name to check the targets' certificates against (default: the address's host)"),
    F("target.tls.insecure", SPECD_CFG_BOOL, target.tls.insecure, "false",
      "talk to the targets in plaintext (development, or a trusted pod network)"),
    F("tls.cert", SPECD_CFG_STRING, tls.cert, NULL, "server certificate chain (PEM)"),
    F("tls.key", SPECD_CFG_STRING, tls.key, NULL, "server private key (PEM)",
      .flags = SPECD_CFG_SECRET),
    F("tls.client_ca", SPECD_CFG_STRING, tls.client_ca, NULL,
      "CA for client certificates (mutual TLS)"),
    F("tls.insecure", SPECD_CFG_BOOL, tls.insecure, "false",
      "serve plaintext (development only)"),
    F("metrics.listen", SPECD_CFG_STRING, metrics.listen, NULL,
      "host:port for the Prometheus GET /metrics listener (empty = off)"),
    F("log.format", SPECD_CFG_ENUM, log.format, "text",
      "per-request log lines on stderr: text or json", .choices = specd_log_formats),
};
const size_t specd_draft_cfg_n_fields = sizeof specd_draft_cfg_fields / sizeof specd_draft_cfg_fields[0];
