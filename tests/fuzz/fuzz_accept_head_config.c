/* fuzz_accept_head_config.c - libFuzzer target for the acceptance head's
 * config.json parser (specd_accept_head_parse_config): any input must give
 * a configuration inside the documented limits or an error message naming
 * its source, never a crash. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/accept_head.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    specd_error err;
    specd_accept_head_config c;
    if (specd_accept_head_parse_config((const char *)data, size, &c, &err)) {
        if (!strchr(err.msg, ':')) abort(); /* every message names its source */
        return 0;
    }
    /* an accepted config is one the loader may size allocations from */
    if (c.input_dim < 1 || c.input_dim > SPECD_ACCEPT_HEAD_MAX_INPUT) abort();
    if (c.hidden_dim < 1 || c.hidden_dim > SPECD_ACCEPT_HEAD_MAX_HIDDEN) abort();
    if (c.n_layers < 0 || c.n_layers > SPECD_ACCEPT_HEAD_MAX_LAYERS) abort();
    if (c.n_stages < 1 || c.n_stages > SPECD_ACCEPT_HEAD_MAX_STAGES) abort();
    if (c.n_draft_features != 0 && c.n_draft_features != SPECD_ACCEPT_HEAD_DRAFT_FEATURES) abort();
    return 0;
}
