/* fuzz_tokenizer.c - arbitrary bytes through tokenize and detokenize.
 *
 * Input: one control byte (bit 0: allow special tokens, bit 1: use the
 * Llama-3-style tokenizer instead of SmolLM2's) and then the text. Checks,
 * beyond "no crash": the tokens' bytes concatenate back to the input (minus
 * bytes the vocabulary has no token for), the streaming decoder emits only
 * valid UTF-8 and agrees with whole decoding, and decoded text re-tokenizes.
 * Tokenizers load once from tests/golden/tokenizer/ (relative to
 * SPECD_SOURCE_DIR, or the working directory). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text/tokenizer.h"
#include "common/util/utf8.h"

typedef struct fuzz_tok {
    specd_tokenizer *tok;
    uint8_t has_token[256]; /* 1 if the byte survives tokenization */
} fuzz_tok;

static fuzz_tok toks[2];

static void load(fuzz_tok *ft, const char *rel) {
    const char *root = getenv("SPECD_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root ? root : ".", rel);
    specd_error err = {{0}};
    ft->tok = specd_tokenizer_from_json(path, &err);
    if (!ft->tok) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        abort();
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t *ids;
        size_t n;
        if (specd_tokenize(ft->tok, &c, 1, 0, &ids, &n, &err) != 0) abort();
        ft->has_token[b] = n > 0;
        free(ids);
    }
}

static void init_once(void) {
    if (toks[0].tok) return;
    load(&toks[0], "tests/golden/tokenizer/smollm2_tokenizer.json");
    load(&toks[1], "tests/golden/tokenizer/tiny_llama3_tokenizer.json");
}

static void check_bytes_round_trip(const fuzz_tok *ft, const uint8_t *text, size_t len,
                                   const int32_t *ids, size_t n) {
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t blen;
        const uint8_t *b = specd_token_bytes(ft->tok, ids[i], &blen);
        if (!b) abort();
        for (size_t k = 0; k < blen; k++) {
            while (at < len && !ft->has_token[text[at]]) at++;
            if (at == len || text[at] != b[k]) abort();
            at++;
        }
    }
    while (at < len && !ft->has_token[text[at]]) at++;
    if (at != len) abort();
}

/* Streams the ids and returns the whole-decode text (malloc'd). */
static char *check_stream(const fuzz_tok *ft, const int32_t *ids, size_t n, size_t *out_len) {
    specd_error err = {{0}};
    size_t whole_len;
    char *whole = specd_detokenize(ft->tok, ids, n, &whole_len, &err);
    if (!whole || !specd_utf8_valid((const uint8_t *)whole, whole_len)) abort();
    specd_detok d;
    specd_detok_init(&d, ft->tok);
    size_t used = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t len;
        const char *chunk = i < n ? specd_detok_push(&d, ids[i], &len, &err)
                                  : specd_detok_flush(&d, &len);
        if (!chunk || !specd_utf8_valid((const uint8_t *)chunk, len)) abort();
        if (used + len > whole_len || memcmp(whole + used, chunk, len) != 0) abort();
        used += len;
    }
    if (used != whole_len) abort();
    specd_detok_free(&d);
    *out_len = whole_len;
    return whole;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init_once();
    if (size == 0) return 0;
    int allow_special = data[0] & 1;
    const fuzz_tok *ft = &toks[(data[0] >> 1) & 1];
    const uint8_t *text = data + 1;
    size_t len = size - 1;
    int32_t *ids;
    size_t n;
    specd_error err = {{0}};
    if (specd_tokenize(ft->tok, (const char *)text, len, allow_special, &ids, &n, &err) != 0)
        abort();
    check_bytes_round_trip(ft, text, len, ids, n);
    size_t dlen;
    char *decoded = check_stream(ft, ids, n, &dlen);
    free(ids);
    if (specd_tokenize(ft->tok, decoded, dlen, allow_special, &ids, &n, &err) != 0) abort();
    free(ids);
    free(decoded);
    return 0;
}
