/* main.c - the target-svc executable.
 *
 *     target-svc --config deploy/config/target-svc.example.yaml [--flag=value ...]
 *
 * Loads the configuration (defaults -> --config file -> flags, common/config.h),
 * opens the model, sizes the KV cache from limits.kv_memory, starts the gRPC
 * server with the Target service and runs until SIGTERM/SIGINT, then drains:
 * health turns NOT_SERVING, new calls are refused and sessions in flight get
 * DRAIN_GRACE_MS to finish before they are cancelled. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/config.h"
#include "common/model_file.h"
#include "common/rpc_server.h"
#include "common/tokenizer.h"
#include "target-svc/service.h"
#include "target-svc/transformer.h"

/* Long enough for a session to finish a few hundred tokens; Kubernetes'
 * default terminationGracePeriodSeconds (30 s) must be longer. */
#define DRAIN_GRACE_MS 20000

typedef struct target_cfg {
    char *listen;
    char *model;
    int backend;
    int64_t device;
    int64_t threads;
    struct {
        int64_t max_sessions, max_prompt_tokens, max_tree_tokens;
        uint64_t kv_memory;
    } limits;
    struct {
        int64_t max_batch_tokens, max_wait;
    } batching;
    struct {
        char *cert, *key, *client_ca;
        bool insecure;
    } tls;
} target_cfg;

static const char *const BACKENDS[] = {"cpu", "cuda", NULL};

/* Keep in step with deploy/config/target-svc.example.yaml. */
static const specd_cfg_field FIELDS[] = {
    SPECD_CFG_FIELD("listen", SPECD_CFG_STRING, target_cfg, listen, "0.0.0.0:50052",
                    "address to serve gRPC on (host:port)"),
    SPECD_CFG_FIELD("model", SPECD_CFG_STRING, target_cfg, model, NULL,
                    "target model: a .gguf file or a Hugging Face directory"),
    SPECD_CFG_FIELD("backend", SPECD_CFG_ENUM, target_cfg, backend, "cpu", "compute backend",
                    .choices = BACKENDS),
    SPECD_CFG_FIELD("device", SPECD_CFG_INT64, target_cfg, device, "0", "CUDA device id",
                    .min = 0, .max = 1024),
    SPECD_CFG_FIELD("threads", SPECD_CFG_INT64, target_cfg, threads, "0",
                    "CPU compute threads (0 = one per core)", .min = 0, .max = 1024),
    SPECD_CFG_FIELD("limits.max_sessions", SPECD_CFG_INT64, target_cfg, limits.max_sessions,
                    "64", "concurrent sessions (each holds a KV cache)", .min = 1, .max = 65536),
    SPECD_CFG_FIELD("limits.max_prompt_tokens", SPECD_CFG_INT64, target_cfg,
                    limits.max_prompt_tokens, "4096", "longest prompt, in tokens", .min = 1,
                    .max = 1 << 24),
    SPECD_CFG_FIELD("limits.max_tree_tokens", SPECD_CFG_INT64, target_cfg,
                    limits.max_tree_tokens, "64", "most tokens in one candidate tree", .min = 1,
                    .max = 4096),
    SPECD_CFG_FIELD("limits.kv_memory", SPECD_CFG_SIZE, target_cfg, limits.kv_memory, "2GiB",
                    "memory for all KV caches together", .min = 1, .max = INT64_MAX),
    SPECD_CFG_FIELD("batching.max_batch_tokens", SPECD_CFG_INT64, target_cfg,
                    batching.max_batch_tokens, "2048", "most tokens in one forward pass",
                    .min = 2, .max = 1 << 20),
    SPECD_CFG_FIELD("batching.max_wait", SPECD_CFG_DURATION, target_cfg, batching.max_wait,
                    "2ms", "how long a small batch waits for more work", .min = 0,
                    .max = 10000),
    SPECD_CFG_FIELD("tls.cert", SPECD_CFG_STRING, target_cfg, tls.cert, NULL,
                    "server certificate chain (PEM)"),
    SPECD_CFG_FIELD("tls.key", SPECD_CFG_STRING, target_cfg, tls.key, NULL,
                    "server private key (PEM)", .flags = SPECD_CFG_SECRET),
    SPECD_CFG_FIELD("tls.client_ca", SPECD_CFG_STRING, target_cfg, tls.client_ca, NULL,
                    "CA for client certificates (mutual TLS)"),
    SPECD_CFG_FIELD("tls.insecure", SPECD_CFG_BOOL, target_cfg, tls.insecure, "false",
                    "serve plaintext (development only)"),
};
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

int main(int argc, char **argv) {
    target_cfg cfg;
    specd_error err = {{0}};
    int rc = specd_config_load(FIELDS, N_FIELDS, argc, argv, &cfg, &err);
    if (rc == 1) {
        printf("usage: target-svc [--config FILE] [--key=value ...]\n");
        specd_config_print_help(FIELDS, N_FIELDS, stdout);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "target-svc: %s\n", err.msg);
        return 2;
    }
    int status = 1;
    specd_model_file *m = NULL;
    specd_tokenizer *tok = NULL;
    specd_transformer *t = NULL;
    specd_target_service *svc = NULL;
    specd_rpc_server *srv = NULL;
    if (!cfg.model) {
        fprintf(stderr, "target-svc: 'model' is not set (config file or --model)\n");
        goto out;
    }
    if (!(m = specd_model_open(cfg.model, &err))) goto fail;
    /* A model without a tokenizer still serves Verify and token-id Generate. */
    specd_error tok_err = {{0}};
    if (!(tok = specd_tokenizer_from_model(m, &tok_err)))
        fprintf(stderr, "target-svc: no tokenizer (%s); text input is off\n", tok_err.msg);

    /* KV budget: every session reserves a whole slot up front (K and V,
     * fp32, every layer), so the context per session is what the budget
     * allows, capped by the model's own context. */
    const specd_llama_hparams *hp = &m->hp;
    uint64_t row_bytes = 2ull * (uint64_t)hp->n_layers * (uint64_t)hp->n_kv_heads *
                         (uint64_t)hp->head_dim * sizeof(float);
    uint64_t rows = cfg.limits.kv_memory / ((uint64_t)cfg.limits.max_sessions * row_bytes);
    int ctx = rows < (uint64_t)hp->max_seq_len ? (int)rows : hp->max_seq_len;
    if (ctx < 2) {
        fprintf(stderr,
                "target-svc: limits.kv_memory = %llu bytes gives %d context rows per session "
                "for %lld sessions; raise it or lower limits.max_sessions\n",
                (unsigned long long)cfg.limits.kv_memory, ctx,
                (long long)cfg.limits.max_sessions);
        goto out;
    }
    specd_transformer_opts to = {
        .backend = {.name = BACKENDS[cfg.backend], .n_threads = (int)cfg.threads,
                    .device = (int)cfg.device},
        .n_slots = (int)cfg.limits.max_sessions,
        .max_ctx = ctx,
        .max_batch = (int)cfg.batching.max_batch_tokens,
    };
    if (!(t = specd_transformer_create(m, &to, &err))) goto fail;
    specd_target_opts so = {
        .max_sessions = (int)cfg.limits.max_sessions,
        .max_prompt_tokens = (int)cfg.limits.max_prompt_tokens,
        .max_tree_tokens = (int)cfg.limits.max_tree_tokens,
        .max_batch_tokens = (int)cfg.batching.max_batch_tokens,
        .max_wait_ms = (int)cfg.batching.max_wait,
    };
    if (!(svc = specd_target_service_create(m, t, tok, &so, &err))) goto fail;
    /* tls.insecure wins over the TLS files, as the example config says, so a
     * developer can flip one flag without editing the file paths out. */
    specd_rpc_server_opts ro = {
        .listen_addr = cfg.listen,
        .tls_cert_path = cfg.tls.insecure ? NULL : cfg.tls.cert,
        .tls_key_path = cfg.tls.insecure ? NULL : cfg.tls.key,
        .tls_client_ca_path = cfg.tls.insecure ? NULL : cfg.tls.client_ca,
        .insecure = cfg.tls.insecure,
        /* Sessions plus a few Generate/GetInfo/health calls beyond them. */
        .max_calls = (int)cfg.limits.max_sessions + 64,
    };
    if (!(srv = specd_rpc_server_create(&ro, &err))) goto fail;
    if (specd_target_service_register(svc, srv, &err)) goto fail;
    if (specd_rpc_server_start(srv, &err)) goto fail;
    fprintf(stderr, "target-svc: serving %s on port %d (%s, %d sessions x %d context)\n",
            cfg.model, specd_rpc_server_port(srv), BACKENDS[cfg.backend],
            (int)cfg.limits.max_sessions, ctx);
    int sig = specd_rpc_server_run_until_signal(srv, DRAIN_GRACE_MS);
    if (sig < 0) {
        fprintf(stderr, "target-svc: cannot install signal handlers\n");
        goto out;
    }
    fprintf(stderr, "target-svc: signal %d, drained, exiting\n", sig);
    status = 0;
    goto out;
fail:
    fprintf(stderr, "target-svc: %s\n", err.msg);
out:
    specd_rpc_server_destroy(srv); /* handlers are done before the service goes */
    specd_target_service_free(svc);
    specd_transformer_free(t);
    specd_tokenizer_free(tok);
    specd_model_close(m);
    specd_config_free(FIELDS, N_FIELDS, &cfg);
    return status;
}
