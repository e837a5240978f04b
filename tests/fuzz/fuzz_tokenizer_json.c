/* fuzz_tokenizer_json.c - arbitrary bytes as a tokenizer.json.
 *
 * Loading must either fail with a message or give a tokenizer that can
 * tokenize and decode without crashing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    specd_error err = {{0}};
    specd_tokenizer *t = specd_tokenizer_from_json_mem((const char *)data, size, &err);
    if (!t) {
        if (err.msg[0] == '\0') abort(); /* failures must say why */
        return 0;
    }
    static const char *const probes[] = {"", "hello world", "a1b2 <s> \xff\xfe 日本 😀",
                                         "<|im_end|>", "  \n\t x"};
    for (size_t i = 0; i < sizeof probes / sizeof *probes; i++) {
        for (int special = 0; special < 2; special++) {
            int32_t *ids;
            size_t n, len;
            /* A hostile Split regex may legitimately fail (match limit). */
            if (specd_tokenize(t, probes[i], strlen(probes[i]), special, &ids, &n, &err) != 0) {
                if (err.msg[0] == '\0') abort();
                continue;
            }
            char *text = specd_detokenize(t, ids, n, &len, &err);
            if (!text) abort();
            free(text);
            free(ids);
        }
    }
    specd_tokenizer_free(t);
    return 0;
}
