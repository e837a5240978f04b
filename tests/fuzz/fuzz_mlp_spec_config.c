/* fuzz_mlp_spec_config.c - libFuzzer target for the MLP speculator's
 * config.json parser (specd_mlp_spec_parse_config): any input must give a
 * configuration inside the documented limits or an error message naming its
 * source, never a crash. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/mlp_speculator.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    specd_error err;
    specd_mlp_spec_config c;
    if (specd_mlp_spec_parse_config((const char *)data, size, &c, &err)) {
        if (!strchr(err.msg, ':')) abort(); /* every message names its source */
        return 0;
    }
    /* an accepted config is one the loader may size allocations from */
    if (c.vocab_size < 1 || c.vocab_size > SPECD_MLP_SPEC_MAX_VOCAB) abort();
    if (c.emb_dim < 1 || c.emb_dim > SPECD_MLP_SPEC_MAX_DIM) abort();
    if (c.inner_dim < 1 || c.inner_dim > SPECD_MLP_SPEC_MAX_DIM) abort();
    if (c.n_predict < 1 || c.n_predict > SPECD_MLP_SPEC_MAX_PREDICT) abort();
    if (c.n_candidates < 1 || c.n_candidates > SPECD_MLP_SPEC_MAX_CANDIDATES) abort();
    if (c.tie_weights && c.n_predict < 2) abort();
    /* a reduced vocabulary: draft rows fit the target ids plus one "other" */
    if (c.target_vocab_size < 1 || c.target_vocab_size > SPECD_MLP_SPEC_MAX_VOCAB) abort();
    if (!c.vocab_mapped && c.target_vocab_size != c.vocab_size) abort();
    if (c.vocab_mapped && c.vocab_size > c.target_vocab_size + 1) abort();
    for (int i = 0; i < c.n_predict; i++)
        if (c.top_k[i] < 1 || c.top_k[i] > c.vocab_size || c.top_k[i] > SPECD_MLP_SPEC_MAX_TOPK)
            abort();
    return 0;
}
