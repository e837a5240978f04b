/* draft_opts.c - see draft_opts.h. */
#include "draft-svc/draft_opts.h"

#include <stddef.h>

int specd_draft_opts_from_config(const specd_draft_cfg *c, specd_draft_opts *o,
                                 specd_error *err) {
    *o = (specd_draft_opts){
        .default_drafter = c->drafter.def,
        .max_prompt_tokens = (int)c->limits.max_prompt_tokens,
        .max_new_tokens = (int)c->limits.max_new_tokens,
        .default_max_new_tokens = (int)c->limits.default_max_new_tokens,
        .max_tree_tokens = (int)c->limits.max_tree_tokens,
        .step_timeout_ms = (int)c->target.step_timeout,
        .open_timeout_ms = (int)c->target.open_timeout,
        .max_failovers = (int)c->target.max_failovers,
        .stop_threshold = (float)c->speculation.adaptive.threshold,
        .min_depth = (int)c->speculation.adaptive.min_depth,
        .pipeline = c->speculation.pipeline,
    };
    specd_policy *p = &o->policy;
    p->off_above = (int)c->speculation.off_above;
    p->sampled_load_aware = c->speculation.sampled_load_aware;
    p->min_acceptance = c->speculation.min_acceptance;
    p->ewma_alpha = c->speculation.ewma_alpha;
    p->warmup_steps = (int)c->speculation.warmup_steps;
    p->cooldown_steps = (int)c->speculation.cooldown_steps;
    p->cost_aware = c->speculation.tree == 0;
    if (specd_policy_parse_shape(p, c->speculation.max_shape, "speculation.max_shape", err))
        return -1;
    return specd_policy_parse_table(p, c->speculation.load_table.items,
                                    (int)c->speculation.load_table.n, "speculation.load_table",
                                    err);
}

void specd_tpool_opts_from_config(const specd_draft_cfg *c, specd_tpool_opts *po) {
    int tls_off = c->target.tls.insecure;
    *po = (specd_tpool_opts){
        .targets = (const char *const *)c->targets.items,
        .n_targets = (int)c->targets.n,
        .channel = {.tls_ca_path = tls_off ? NULL : c->target.tls.ca,
                    .tls_cert_path = tls_off ? NULL : c->target.tls.cert,
                    .tls_key_path = tls_off ? NULL : c->target.tls.key,
                    .tls_server_name = tls_off ? NULL : c->target.tls.server_name,
                    .insecure = tls_off},
        .resolve_interval_ms = (int)c->target.resolve_interval,
    };
}

void specd_ngram_opts_from_config(const specd_draft_cfg *c, int vocab,
                                  specd_ngram_drafter_opts *no) {
    *no = (specd_ngram_drafter_opts){.vocab = vocab,
                                     .min_n = (int)c->drafter.ngram.min_n,
                                     .max_n = (int)c->drafter.ngram.max_n,
                                     .max_scan = (int)c->drafter.ngram.max_scan,
                                     .min_prob = (float)c->drafter.ngram.min_prob,
                                     .shared = c->speculation.suffix_cache.shared,
                                     .cache_max_tokens = c->speculation.suffix_cache.max_tokens};
}

int specd_lookup_drafters_create(const specd_draft_cfg *c, int vocab,
                                 specd_drafter *drafters[SPECD_N_DRAFTERS], specd_error *err) {
    specd_ngram_drafter_opts no;
    specd_ngram_opts_from_config(c, vocab, &no);
    if (!(drafters[SPECD_DRAFTER_NGRAM] = specd_ngram_drafter_create(&no, err))) return -1;
    if (!drafters[SPECD_DRAFTER_MLP]) return 0;
    specd_hybrid_drafter_opts ho = {.model = drafters[SPECD_DRAFTER_MLP],
                                    .lookup = drafters[SPECD_DRAFTER_NGRAM]};
    return (drafters[SPECD_DRAFTER_MLP_NGRAM] = specd_hybrid_drafter_create(&ho, err)) ? 0 : -1;
}

void specd_draft_server_opts_from_config(const specd_draft_cfg *c, specd_rpc_server_opts *ro) {
    *ro = (specd_rpc_server_opts){
        .listen_addr = c->listen,
        .tls_cert_path = c->tls.insecure ? NULL : c->tls.cert,
        .tls_key_path = c->tls.insecure ? NULL : c->tls.key,
        .tls_client_ca_path = c->tls.insecure ? NULL : c->tls.client_ca,
        .insecure = c->tls.insecure,
        .max_calls = (int)c->limits.max_calls,
    };
}
