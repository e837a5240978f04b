/* main.c - the draft-svc executable.
 *
 *     draft-svc --config deploy/config/draft-svc.example.yaml [--flag=value ...]
 *
 * Loads the configuration (defaults -> --config file -> flags), the
 * tokenizer, the configured drafters, builds the pool of targets, starts the
 * gRPC server with the Draft service and runs until SIGTERM/SIGINT, then
 * drains: health turns NOT_SERVING, new calls are refused and requests in
 * flight get DRAIN_GRACE_MS to finish before they are cancelled. */
#include <stdio.h>
#include <stdlib.h>

#include "common/util/config.h"
#include "common/util/version.h"
#include "common/rpc/metrics_http.h"
#include "common/model/model_file.h"
#include "common/rpc/request_log.h"
#include "common/rpc/rpc_server.h"
#include "common/text/chat.h"
#include "common/text/tokenizer.h"
#include "draft-svc/draft_config.h"
#include "draft-svc/draft_opts.h"
#include "draft-svc/drafter.h"
#include "draft-svc/service.h"
#include "draft-svc/target_pool.h"
#include "draft-svc/target_watch.h"

/* As target-svc: shorter than Kubernetes' default 30 s termination grace. */
#define DRAIN_GRACE_MS 20000

int main(int argc, char **argv) {
    specd_draft_cfg cfg;
    specd_error err = {{0}};
    if (specd_print_version_if_asked(argc, argv, "draft-svc")) return 0;
    int rc = specd_config_load(specd_draft_cfg_fields, specd_draft_cfg_n_fields, argc, argv, &cfg,
                               &err);
    if (rc == 1) {
        printf("usage: draft-svc [--config FILE] [--key=value ...]\n");
        specd_config_print_help(specd_draft_cfg_fields, specd_draft_cfg_n_fields, stdout);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "draft-svc: %s\n", err.msg);
        return 2;
    }
    int status = 1;
    specd_model_file *tok_model = NULL;
    specd_tokenizer *tok = NULL;
    specd_drafter *drafters[SPECD_N_DRAFTERS] = {0};
    specd_tpool *pool = NULL;
    specd_draft_service *svc = NULL;
    specd_rpc_server *srv = NULL;
    specd_target_watch *watch = NULL;
    specd_metrics_http *mh = NULL;
    char tok_sha[65] = "";
    int vocab = 0, hidden = 0;

    if (cfg.tokenizer) {
        if (!(tok_model = specd_model_open(cfg.tokenizer, &err)) ||
            !(tok = specd_tokenizer_from_model(tok_model, &err))) {
            specd_preferr(&err, "tokenizer");
            goto fail;
        }
        specd_tokenizer_sha256_hex(tok, tok_sha);
        vocab = specd_tokenizer_n_vocab(tok);
    } else {
        fprintf(stderr, "draft-svc: no tokenizer configured; text input and stop strings are off\n");
    }
    if (cfg.drafter.mlp.accept_head && !cfg.drafter.mlp.path) {
        /* a head belongs to a speculator; alone it would silently do nothing */
        specd_seterr(&err, "drafter.mlp.accept_head is set but drafter.mlp.path is not");
        goto fail;
    }
    if (cfg.drafter.mlp.path) {
        specd_mlp_drafter_opts o = {.path = cfg.drafter.mlp.path,
                                    .n_threads = (int)cfg.threads,
                                    .backend = specd_draft_backends[cfg.drafter.mlp.backend],
                                    .device = (int)cfg.drafter.mlp.device,
                                    .accept_head = cfg.drafter.mlp.accept_head,
                                    .quant = cfg.drafter.mlp.quantize};
        if (!(drafters[SPECD_DRAFTER_MLP] = specd_mlp_drafter_create(&o, &err))) goto fail;
        hidden = drafters[SPECD_DRAFTER_MLP]->hidden_size;
    }
    if (cfg.drafter.draft_lm.path) {
        specd_lm_drafter_opts o = {.path = cfg.drafter.draft_lm.path,
                                   .n_threads = (int)cfg.threads,
                                   .max_sessions = (int)cfg.drafter.draft_lm.max_sessions,
                                   .max_ctx = (int)cfg.drafter.draft_lm.max_ctx};
        if (!(drafters[SPECD_DRAFTER_LM] = specd_lm_drafter_create(&o, &err))) goto fail;
    }
    for (int i = 0; i < SPECD_N_DRAFTERS && !vocab; i++)
        if (drafters[i]) vocab = drafters[i]->vocab;
    if (cfg.drafter.ngram.enabled) {
        if (!vocab) {
            /* n-gram lookup has no model: it learns nothing about the
             * vocabulary by itself, and the service needs it for checks. */
            fprintf(stderr, "draft-svc: the ngram drafter needs a tokenizer (or another drafter) "
                            "to know the vocabulary; it is off\n");
        } else if (specd_lookup_drafters_create(&cfg, vocab, drafters, &err)) {
            goto fail;
        }
    }

    /* Every option from the configuration (draft_opts.h); what only this
     * process knows (the vocabulary, tokenizer and drafters) is set here. */
    specd_tpool_opts po;
    specd_tpool_opts_from_config(&cfg, &po);
    po.expect_vocab = vocab;
    po.expect_hidden = hidden;
    po.expect_tokenizer_sha256 = tok_sha;
    if (!(pool = specd_tpool_create(&po, &err))) goto fail;

    specd_draft_opts dop;
    if (specd_draft_opts_from_config(&cfg, &dop, &err)) goto fail;
    dop.tok = tok;
    dop.pool = pool;
    for (int i = 0; i < SPECD_N_DRAFTERS; i++) dop.drafters[i] = drafters[i];
    if (!(svc = specd_draft_service_create(&dop, &err))) goto fail;
    specd_rpc_server_opts ro;
    specd_draft_server_opts_from_config(&cfg, &ro);
    if (!(srv = specd_rpc_server_create(&ro, &err))) goto fail;
    if (specd_draft_service_register(svc, srv, &err)) goto fail;
    if (specd_rpc_server_start(srv, &err)) goto fail;
    /* Readiness from the targets' health, and the liveness the driver judges
     * slow steps by (target_watch.h). */
    specd_target_watch_opts wo = {.trim_interval_ms = 10000};
    if (!(watch = specd_target_watch_start(pool, srv, &wo, &err))) goto fail;
    specd_request_log_set_format((specd_log_format)cfg.log.format);
    /* Metrics come up with the service: a scrape before the first request
     * already sees every metric, and a bad address fails startup. */
    if (specd_metrics_http_serve(cfg.metrics.listen, "draft-svc", &mh, &err)) goto fail;
    fprintf(stderr, "draft-svc: serving on port %d, %zu target entr%s, default drafter %s\n",
            specd_rpc_server_port(srv), cfg.targets.n, cfg.targets.n == 1 ? "y" : "ies",
            specd_drafter_names[specd_draft_default_drafter(&dop)]);
    if (tok) {
        /* chat input is refused per request when specd cannot render the
         * model's template; say so once, up front */
        specd_error cerr = {{0}};
        const char *fam = specd_chat_family(specd_tokenizer_chat_template(tok), &cerr);
        fprintf(stderr, "draft-svc: chat input %s%s\n", fam ? "as " : "off: ", fam ? fam : cerr.msg);
    }
    int sig = specd_rpc_server_run_until_signal(srv, DRAIN_GRACE_MS);
    if (sig < 0) {
        fprintf(stderr, "draft-svc: cannot install signal handlers\n");
        goto out;
    }
    fprintf(stderr, "draft-svc: signal %d, drained, exiting\n", sig);
    status = 0;
    goto out;
fail:
    fprintf(stderr, "draft-svc: %s\n", err.msg);
out:
    specd_target_watch_stop(watch); /* it sets the server's health: before the server goes */
    specd_metrics_http_stop(mh);
    specd_rpc_server_destroy(srv);
    specd_draft_service_free(svc);
    specd_tpool_free(pool);
    for (int i = 0; i < SPECD_N_DRAFTERS; i++) specd_drafter_free(drafters[i]);
    specd_tokenizer_free(tok);
    specd_model_close(tok_model);
    specd_config_free(specd_draft_cfg_fields, specd_draft_cfg_n_fields, &cfg);
    return status;
}
