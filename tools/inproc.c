/* inproc.c - target-svc + draft-svc in this process (inproc.h).
 *
 * Mirrors target-svc/main.c and draft-svc/main.c step by step, starting
 * from the services' own configuration defaults (specd_config_defaults on
 * their schema tables) so that what is measured here is what a deployment
 * with the example configuration runs; only what the caller sizes (threads,
 * sessions, context) and the loopback addresses differ. */
#include "tools/inproc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/config.h"
#include "common/model/model_file.h"
#include "common/rpc/rpc_server.h"
#include "common/util/small_file.h"
#include "draft-svc/draft_config.h"
#include "draft-svc/draft_opts.h"
#include "draft-svc/drafter.h"
#include "draft-svc/service.h"
#include "draft-svc/target_pool.h"
#include "draft-svc/target_watch.h"
#include "target-svc/service.h"
#include "target-svc/target_config.h"
#include "target-svc/target_opts.h"
#include "common/model/transformer.h"

struct cli_inproc {
    specd_target_cfg tcfg;
    specd_draft_cfg dcfg;
    int have_tcfg, have_dcfg;
    specd_model_file *m;
    specd_tokenizer *tok;
    /* target-svc (absent with an external target) */
    specd_transformer *t;
    specd_target_service *tsvc;
    specd_rpc_server *tsrv;
    /* draft-svc */
    specd_drafter *drafters[SPECD_N_DRAFTERS];
    specd_tpool *pool;
    specd_draft_service *dsvc;
    specd_rpc_server *dsrv;
    specd_target_watch *watch; /* target health: readiness and liveness, as in main.c */
    char target_addr[256], draft_addr[64];
};

static int start_target(cli_inproc *p, const cli_inproc_opts *o, int ctx, specd_error *err) {
    /* The configuration's options (target_opts.h), sized by the caller:
     * its backend, sessions and context, and a KV pool that holds every
     * session's whole context (kv_memory 0), as the CLI always had. */
    specd_transformer_opts to;
    specd_transformer_opts_from_config(&p->tcfg, ctx, &to);
    to.backend = (specd_backend_opts){.name = o->backend ? o->backend : "cpu",
                                      .n_threads = o->threads, .device = o->device,
                                      .precision = (specd_precision)o->precision,
                                      .kv_dtype = (specd_kv_dtype)o->kv_dtype};
    to.n_slots = o->max_sessions;
    to.max_ctx = ctx;
    to.kv_memory = 0;
    if (o->no_prefix_cache) to.prefix_cache = 0;
    if (!(p->t = specd_transformer_create(p->m, &to, err))) return -1;
    specd_target_opts so;
    specd_target_opts_from_config(&p->tcfg, &so);
    if (o->no_prefix_cache) so.prefix_cache = 0; /* what GetInfo reports */
    so.max_sessions = o->max_sessions;
    /* a prompt must leave room for at least one token in the context */
    if (so.max_prompt_tokens > ctx - 1) so.max_prompt_tokens = ctx - 1;
    so.device = o->device;
    if (!(p->tsvc = specd_target_service_create(p->m, p->t, p->tok, &so, err))) return -1;
    specd_rpc_server_opts ro = {.listen_addr = "127.0.0.1:0", .insecure = 1,
                                /* as target-svc/main.c: sessions plus a few other calls */
                                .max_calls = o->max_sessions + 64};
    if (!(p->tsrv = specd_rpc_server_create(&ro, err)) ||
        specd_target_service_register(p->tsvc, p->tsrv, err) ||
        specd_rpc_server_start(p->tsrv, err))
        return -1;
    snprintf(p->target_addr, sizeof p->target_addr, "127.0.0.1:%d",
             specd_rpc_server_port(p->tsrv));
    return 0;
}

static int start_draft(cli_inproc *p, const cli_inproc_opts *o, int ctx, specd_error *err) {
    const specd_draft_cfg *c = &p->dcfg;
    char tok_sha[65] = "";
    /* The vocabulary every drafter and target must share: the tokenizer's,
     * else the model's own (a model without a tokenizer still has one). */
    int vocab = p->tok ? specd_tokenizer_n_vocab(p->tok) : p->m->hp.vocab_size, hidden = 0;
    if (p->tok) specd_tokenizer_sha256_hex(p->tok, tok_sha);
    if (o->speculator) {
        char head_dir[2048];
        const char *head = o->accept_head;
        if (!head && (size_t)snprintf(head_dir, sizeof head_dir, "%s/accept_head/config.json",
                                      o->speculator) < sizeof head_dir &&
            specd_is_regular_file(head_dir)) {
            head_dir[strlen(head_dir) - strlen("/config.json")] = 0;
            head = head_dir;
        }
        specd_mlp_drafter_opts mo = {.path = o->speculator, .n_threads = o->threads,
                                     .backend = o->backend, .device = o->device,
                                     .accept_head = head,
                                     .quant = p->dcfg.drafter.mlp.quantize};
        if (!(p->drafters[SPECD_DRAFTER_MLP] = specd_mlp_drafter_create(&mo, err)))
            return specd_preferr(err, "--speculator");
        hidden = p->drafters[SPECD_DRAFTER_MLP]->hidden_size;
    }
    if (o->draft_model) {
        specd_lm_drafter_opts lo = {.path = o->draft_model, .n_threads = o->threads,
                                    .max_sessions = o->max_sessions, .max_ctx = ctx};
        if (!(p->drafters[SPECD_DRAFTER_LM] = specd_lm_drafter_create(&lo, err)))
            return specd_preferr(err, "--draft-model");
    }
    if (o->ngram && specd_lookup_drafters_create(c, vocab, p->drafters, err)) return -1;
    const char *targets[1] = {p->target_addr};
    specd_tpool_opts po;
    specd_tpool_opts_from_config(c, &po);
    po.targets = targets;
    po.n_targets = 1;
    /* loopback to our own target is plaintext; an external one gets the
     * caller's TLS settings */
    po.channel = o->target_addr ? o->target_tls : (specd_rpc_channel_opts){.insecure = 1};
    po.expect_vocab = vocab;
    po.expect_hidden = hidden;
    po.expect_tokenizer_sha256 = tok_sha;
    if (!(p->pool = specd_tpool_create(&po, err))) return -1;
    specd_draft_opts dop;
    if (specd_draft_opts_from_config(c, &dop, err)) return -1;
    dop.pipeline = o->pipeline;
    dop.tok = p->tok;
    dop.pool = p->pool;
    for (int i = 0; i < SPECD_N_DRAFTERS; i++) dop.drafters[i] = p->drafters[i];
    /* The configured default drafter when offered ("auto": the best offered,
     * resolved by the service), else none. */
    if (dop.default_drafter < SPECD_N_DRAFTERS && !p->drafters[dop.default_drafter])
        dop.default_drafter = SPECD_N_DRAFTERS;
    if (!(p->dsvc = specd_draft_service_create(&dop, err))) return -1;
    specd_rpc_server_opts ro = {.listen_addr = "127.0.0.1:0", .insecure = 1,
                                .max_calls = (int)c->limits.max_calls};
    if (!(p->dsrv = specd_rpc_server_create(&ro, err)) ||
        specd_draft_service_register(p->dsvc, p->dsrv, err) ||
        specd_rpc_server_start(p->dsrv, err) ||
        !(p->watch = specd_target_watch_start(p->pool, p->dsrv, &(specd_target_watch_opts){.trim_interval_ms = 10000},
                                              err)))
        return -1;
    snprintf(p->draft_addr, sizeof p->draft_addr, "127.0.0.1:%d", specd_rpc_server_port(p->dsrv));
    return 0;
}

cli_inproc *cli_inproc_start(const cli_inproc_opts *o, specd_error *err) {
    if (!o->model || o->max_sessions < 1) {
        specd_seterr(err, "in-process services: need a model and max_sessions >= 1");
        return NULL;
    }
    cli_inproc *p = calloc(1, sizeof *p);
    if (!p) {
        specd_seterr(err, "out of memory");
        return NULL;
    }
    if (specd_config_defaults(specd_target_cfg_fields, specd_target_cfg_n_fields, &p->tcfg, err))
        goto fail;
    p->have_tcfg = 1;
    if (specd_config_defaults(specd_draft_cfg_fields, specd_draft_cfg_n_fields, &p->dcfg, err))
        goto fail;
    p->have_dcfg = 1;
    if (o->max_shape) {
        char *shape = strdup(o->max_shape);
        if (!shape) {
            specd_seterr(err, "out of memory");
            goto fail;
        }
        free(p->dcfg.speculation.max_shape);
        p->dcfg.speculation.max_shape = shape;
    }
    if (!(p->m = specd_model_open(o->model, err))) goto fail;
    /* A model without a tokenizer still serves token-id requests (the
     * tiny test models), as in both services' mains. */
    specd_error tok_err = {{0}};
    p->tok = specd_tokenizer_from_model(p->m, &tok_err);
    int ctx = o->ctx > 0 && o->ctx < p->m->hp.max_seq_len ? o->ctx : p->m->hp.max_seq_len;
    if (o->target_addr) {
        snprintf(p->target_addr, sizeof p->target_addr, "%s", o->target_addr);
    } else if (start_target(p, o, ctx, err)) {
        specd_preferr(err, "in-process target-svc");
        goto fail;
    }
    if (start_draft(p, o, ctx, err)) {
        specd_preferr(err, "in-process draft-svc");
        goto fail;
    }
    return p;
fail:
    cli_inproc_stop(p);
    return NULL;
}

const char *cli_inproc_target_addr(const cli_inproc *p) { return p->target_addr; }
const char *cli_inproc_draft_addr(const cli_inproc *p) { return p->draft_addr; }
const specd_tokenizer *cli_inproc_tokenizer(const cli_inproc *p) { return p->tok; }

void cli_inproc_stop(cli_inproc *p) {
    if (!p) return;
    /* Front door first: draft-svc's handlers hold sessions on the target,
     * and each service may go only after its server (no handler running). */
    specd_target_watch_stop(p->watch); /* sets dsrv's health: before dsrv goes */
    specd_rpc_server_destroy(p->dsrv);
    specd_draft_service_free(p->dsvc);
    specd_tpool_free(p->pool);
    for (int i = 0; i < SPECD_N_DRAFTERS; i++) specd_drafter_free(p->drafters[i]);
    specd_rpc_server_destroy(p->tsrv);
    specd_target_service_free(p->tsvc);
    specd_transformer_free(p->t);
    specd_tokenizer_free(p->tok);
    specd_model_close(p->m);
    if (p->have_dcfg) specd_config_free(specd_draft_cfg_fields, specd_draft_cfg_n_fields, &p->dcfg);
    if (p->have_tcfg)
        specd_config_free(specd_target_cfg_fields, specd_target_cfg_n_fields, &p->tcfg);
    free(p);
}
