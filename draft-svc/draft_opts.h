/* draft_opts.h - draft-svc's configuration (draft_config.h) turned into the
 * options of its parts, in one place: draft-svc/main.c, the in-process
 * services of the CLI (tools/inproc.c) and the tests start from here, so a
 * default lives only in the schema (draft_config.c) and the copies cannot
 * drift. Callers that choose things themselves (the CLI's drafters, a
 * loopback target) override single fields afterwards. */
#ifndef SPECD_DRAFT_OPTS_H
#define SPECD_DRAFT_OPTS_H

#include "common/rpc/rpc_server.h"
#include "common/util/error.h"
#include "draft-svc/draft_config.h"
#include "draft-svc/drafter.h"
#include "draft-svc/service.h"
#include "draft-svc/target_pool.h"

/* The Draft service: default drafter, request limits, target timeouts and
 * failovers, adaptive drafting, and the speculation policy (load table,
 * off_above, the collapse rule with its ewma_alpha). tok, pool and the
 * drafters stay the caller's to set. -1 + err on a bad load table. */
int specd_draft_opts_from_config(const specd_draft_cfg *c, specd_draft_opts *o,
                                 specd_error *err);

/* The pool of targets: addresses, TLS (target.tls.insecure wins over the
 * files, as tls.insecure does for the server side, so one flag switches a
 * config to plaintext) and re-resolution. The expect_* checks stay the
 * caller's. */
void specd_tpool_opts_from_config(const specd_draft_cfg *c, specd_tpool_opts *po);

/* The n-gram drafter over a vocabulary of `vocab` tokens. */
void specd_ngram_opts_from_config(const specd_draft_cfg *c, int vocab,
                                  specd_ngram_drafter_opts *no);

/* The lookup drafters over a vocabulary of `vocab` tokens: ngram, and where
 * drafters[SPECD_DRAFTER_MLP] is set already, mlp_ngram (the speculator and
 * the lookup in one tree, drafter_hybrid.c) over the two. 0, or -1 + err;
 * what was created stays in drafters[] for the caller to free. */
int specd_lookup_drafters_create(const specd_draft_cfg *c, int vocab,
                                 specd_drafter *drafters[SPECD_N_DRAFTERS], specd_error *err);

/* The gRPC server: listen address, TLS, concurrent calls. */
void specd_draft_server_opts_from_config(const specd_draft_cfg *c, specd_rpc_server_opts *ro);

#endif
