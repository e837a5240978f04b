/* main.c - the target-svc executable.
 *
 *     target-svc --config deploy/config/target-svc.example.yaml [--flag=value ...]
 *
 * Loads the configuration (defaults -> --config file -> flags, common/util/config.h),
 * opens the model, sizes the KV cache from limits.kv_memory, starts the gRPC
 * server with the Target service and runs until SIGTERM/SIGINT, then drains:
 * health turns NOT_SERVING, new calls are refused and sessions in flight get
 * DRAIN_GRACE_MS to finish before they are cancelled. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/config.h"
#include "common/util/version.h"
#include "common/rpc/metrics_http.h"
#include "common/model/model_file.h"
#include "common/rpc/request_log.h"
#include "common/rpc/rpc_server.h"
#include "common/text/tokenizer.h"
#include "target-svc/service.h"
#include "target-svc/target_config.h"
#include "target-svc/target_opts.h"
#include "common/model/transformer.h"

/* Long enough for a session to finish a few hundred tokens; Kubernetes'
 * default terminationGracePeriodSeconds (30 s) must be longer. */
#define DRAIN_GRACE_MS 20000


int main(int argc, char **argv) {
    specd_target_cfg cfg;
    specd_error err = {{0}};
    if (specd_print_version_if_asked(argc, argv, "target-svc")) return 0;
    int rc = specd_config_load(specd_target_cfg_fields, specd_target_cfg_n_fields, argc, argv, &cfg, &err);
    if (rc == 1) {
        printf("usage: target-svc [--config FILE] [--key=value ...]\n");
        specd_config_print_help(specd_target_cfg_fields, specd_target_cfg_n_fields, stdout);
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
    specd_metrics_http *mh = NULL;
    if (!cfg.model) {
        fprintf(stderr, "target-svc: 'model' is not set (config file or --model)\n");
        goto out;
    }
    if (!(m = specd_model_open(cfg.model, &err))) goto fail;
    /* A model without a tokenizer still serves Verify and token-id Generate. */
    specd_error tok_err = {{0}};
    if (!(tok = specd_tokenizer_from_model(m, &tok_err)))
        fprintf(stderr, "target-svc: no tokenizer (%s); text input is off\n", tok_err.msg);

    /* Every option from the configuration (target_opts.h): the KV pool,
     * the context, the limits, the server. */
    specd_transformer_opts to;
    specd_transformer_opts_from_config(&cfg, m->hp.max_seq_len, &to);
    if (!(t = specd_transformer_create(m, &to, &err))) goto fail;
    int ctx = specd_transformer_max_ctx(t);
    specd_target_opts so;
    specd_target_opts_from_config(&cfg, &so);
    if (!(svc = specd_target_service_create(m, t, tok, &so, &err))) goto fail;
    specd_rpc_server_opts ro;
    specd_target_server_opts_from_config(&cfg, &ro);
    if (!(srv = specd_rpc_server_create(&ro, &err))) goto fail;
    if (specd_target_service_register(svc, srv, &err)) goto fail;
    if (specd_rpc_server_start(srv, &err)) goto fail;
    specd_request_log_set_format((specd_log_format)cfg.log.format);
    /* Metrics come up with the service: a scrape before the first request
     * already sees every metric (at zero), and a bad address fails startup. */
    if (specd_metrics_http_serve(cfg.metrics.listen, "target-svc", &mh, &err)) goto fail;
    int kv_pages;
    specd_transformer_kv_pages(t, NULL, &kv_pages);
    {
        /* what verification costs here: the start-up timing draft-svc's
         * trees are priced with (GetInfo step_cost) */
        specd_step_cost c;
        specd_target_service_step_cost(svc, &c);
        if (specd_step_cost_at(&c, 1) > 0)
            fprintf(stderr, "target-svc: forward pass (64 cached tokens): 1 token %.1f ms, 2: %.1f, "
                            "4: %.1f, 8: %.1f, 16: %.1f, 64: %.1f\n",
                    specd_step_cost_at(&c, 1) / 1e3, specd_step_cost_at(&c, 2) / 1e3,
                    specd_step_cost_at(&c, 4) / 1e3, specd_step_cost_at(&c, 8) / 1e3,
                    specd_step_cost_at(&c, 16) / 1e3, specd_step_cost_at(&c, 64) / 1e3);
    }
    /* the kernel path (docs/KERNELS.md): where AMX or AVX-512 was
     * expected, this line shows what the machine and its kernel granted */
    char backend[64];
    const char *be = specd_target_backends[cfg.backend], *kernels = specd_target_service_kernels(svc);
    if (strcmp(be, kernels)) snprintf(backend, sizeof backend, "%s, %s kernels", be, kernels);
    else snprintf(backend, sizeof backend, "%s", be);
    fprintf(stderr, "target-svc: serving %s on port %d (%s, up to %d sessions, context %d, "
                    "KV pool %d pages of %d tokens, %s at %.1f KB a token, prefix cache %s)\n",
            cfg.model, specd_rpc_server_port(srv), backend,
            (int)cfg.limits.max_sessions, ctx, kv_pages, SPECD_KV_PAGE_ROWS,
            specd_kv_type_name(specd_transformer_kv_dtype(t)),
            (double)specd_transformer_kv_bytes_per_token(t) / 1024.0,
            cfg.limits.prefix_cache ? "on" : "off");
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
    specd_metrics_http_stop(mh);
    specd_rpc_server_destroy(srv); /* handlers are done before the service goes */
    specd_target_service_free(svc);
    specd_transformer_free(t);
    specd_tokenizer_free(tok);
    specd_model_close(m);
    specd_config_free(specd_target_cfg_fields, specd_target_cfg_n_fields, &cfg);
    return status;
}
