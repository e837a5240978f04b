/* fuzz_hf_config.c - libFuzzer target for config.json parsing
 * (specd_hf_parse_config): any input must give hparams or an error message,
 * and accepted hparams go through the validator's sanity checks too. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/model_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    specd_error err;
    specd_llama_hparams hp;
    if (specd_hf_parse_config((const char *)data, size, &hp, &err)) {
        if (!strchr(err.msg, ':')) abort(); /* every message names its source */
        return 0;
    }
    /* an empty tensor table: validation runs the hparam checks, then stops at
     * the first missing tensor */
    specd_model_file m;
    memset(&m, 0, sizeof m);
    m.hp = hp;
    specd_model_validate(&m, &err);
    return 0;
}
