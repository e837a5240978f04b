/* test_tokenizer.c - the byte-level BPE tokenizer against Hugging Face.
 *
 * Reference data (tests/golden/tokenizer/, made by make_tokenizer_fixtures.py
 * with the `tokenizers` library): every corpus string must give exactly the
 * reference ids, both from the committed SmolLM2 tokenizer.json and from the
 * GGUF's metadata (skipped when models/ has no GGUF), and decoding the ids
 * must give the reference text. A small Llama-3-configured tokenizer covers
 * the Split-regex / ignore_merges / "a b" merges path. Also: the streaming
 * decoder never emits half a character, invalid UTF-8 and special-token
 * handling, limits, speed, and clear errors for bad tokenizer.json files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/model/gguf.h"
#include "common/text/tokenizer.h"
#include "common/util/utf8.h"
#include "tests/harness/test_util.h"
#include "common/util/clock.h"

#define GGUF_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define SMOLLM2_JSON "tests/golden/tokenizer/smollm2_tokenizer.json"
#define SMOLLM2_REFS "tests/golden/tokenizer/reference_ids.json"
#define TINY_JSON "tests/golden/tokenizer/tiny_llama3_tokenizer.json"
#define TINY_REFS "tests/golden/tokenizer/tiny_llama3_reference.json"
#define TINY_GGUF "tests/golden/tokenizer/tiny_llama3.gguf"

/* --- shared state, loaded once -------------------------------------------- */

static specd_tokenizer *json_tok; /* from the committed tokenizer.json */
static specd_tokenizer *gguf_tok; /* from the GGUF; NULL when it is absent */
static gguf_file *gguf;
static cJSON *refs;

static cJSON *load_json(const char *rel) {
    char *text = test_read_file(test_path(rel), NULL);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", rel);
        return NULL;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    return root;
}

static int setup(void **state) {
    (void)state;
    specd_error err = {{0}};
    json_tok = specd_tokenizer_from_json(test_path(SMOLLM2_JSON), &err);
    if (!json_tok) fprintf(stderr, "tokenizer.json: %s\n", err.msg);
    refs = load_json(SMOLLM2_REFS);
    if (test_file_exists(test_path(GGUF_PATH))) {
        gguf = gguf_open(test_path(GGUF_PATH), &err);
        if (gguf) gguf_tok = specd_tokenizer_from_gguf(gguf, &err);
        if (!gguf_tok) fprintf(stderr, "gguf tokenizer: %s\n", err.msg);
    }
    return json_tok && refs && (gguf_tok || !gguf) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    specd_tokenizer_free(json_tok);
    specd_tokenizer_free(gguf_tok);
    gguf_close(gguf);
    cJSON_Delete(refs);
    return 0;
}

/* --- helpers -------------------------------------------------------------- */

static size_t json_ids(const cJSON *arr, int32_t **out) {
    size_t n = (size_t)cJSON_GetArraySize(arr);
    *out = malloc((n ? n : 1) * sizeof **out);
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) (*out)[i++] = (int32_t)v->valuedouble;
    return n;
}

/* The exact bytes of a "*_hex" field (JSON strings cannot carry U+0000
 * through cJSON). Malloc'd and NUL-terminated. */
static char *hex_field(const cJSON *e, const char *key, size_t *len) {
    const char *hex = cJSON_GetObjectItem(e, key)->valuestring;
    size_t n = strlen(hex) / 2;
    char *out = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned byte;
        sscanf(hex + 2 * i, "%2x", &byte);
        out[i] = (char)byte;
    }
    out[n] = '\0';
    *len = n;
    return out;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* Tokenizes every reference text and compares; returns the match count. */
static int check_corpus(const specd_tokenizer *t, const cJSON *entries, const char *label) {
    int matched = 0, total = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, entries) {
        size_t text_len;
        char *text = hex_field(e, "text_hex", &text_len);
        int32_t *want, *got;
        size_t n_want = json_ids(cJSON_GetObjectItem(e, "ids"), &want), n_got;
        specd_error err = {{0}};
        int rc = specd_tokenize(t, text, text_len, 1, &got, &n_got, &err);
        total++;
        if (rc == 0 && n_got == n_want && (n_want == 0 || !memcmp(got, want, n_want * 4))) {
            matched++;
        } else {
            char *shown = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "text"));
            fprintf(stderr, "  [%s] mismatch for %s\n", label, shown);
            free(shown);
            print_ids("want", want, n_want);
            print_ids("got ", got, n_got);
        }
        free(want);
        free(got);
        free(text);
    }
    printf("  %s: %d/%d corpus strings match the reference ids\n", label, matched, total);
    return matched == total;
}

/* Decoding the reference ids gives the reference text. */
static int check_decode(const specd_tokenizer *t, const cJSON *entries) {
    int ok = 1;
    const cJSON *e;
    cJSON_ArrayForEach(e, entries) {
        int32_t *ids;
        size_t n = json_ids(cJSON_GetObjectItem(e, "ids"), &ids), len;
        size_t want_len;
        char *want = hex_field(e, "decoded_hex", &want_len);
        specd_error err = {{0}};
        char *got = specd_detokenize(t, ids, n, &len, &err);
        if (!got || len != want_len || memcmp(got, want, len) != 0) {
            char *shown = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "decoded"));
            fprintf(stderr, "  decode mismatch: want %s\n", shown);
            free(shown);
            ok = 0;
        }
        free(got);
        free(want);
        free(ids);
    }
    return ok;
}

/* --- reference ids -------------------------------------------------------- */

static void test_json_matches_reference(void **state) {
    (void)state;
    assert_true(check_corpus(json_tok, refs, "tokenizer.json"));
}

static void test_gguf_matches_reference(void **state) {
    (void)state;
    if (!gguf_tok) {
        printf("  skipped: %s not present (run scripts/setup to fetch it)\n", GGUF_PATH);
        skip();
    }
    assert_true(check_corpus(gguf_tok, refs, "gguf"));
}

static void test_decode_matches_reference(void **state) {
    (void)state;
    assert_true(check_decode(json_tok, refs));
    if (gguf_tok) assert_true(check_decode(gguf_tok, refs));
}

static void test_llama3_config_matches_reference(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_tokenizer *t = specd_tokenizer_from_json(test_path(TINY_JSON), &err);
    if (!t) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(t);
    cJSON *tiny_refs = load_json(TINY_REFS);
    assert_non_null(tiny_refs);
    assert_true(check_corpus(t, tiny_refs, "llama3-style tokenizer.json"));
    assert_true(check_decode(t, tiny_refs));
    /* A non-special added token is matched even without allow_special. */
    int32_t *ids;
    size_t n;
    assert_int_equal(specd_tokenize(t, "plain_added", 11, 0, &ids, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], specd_tokenizer_token_id(t, "plain_added"));
    assert_false(specd_tokenizer_is_special(t, ids[0]));
    free(ids);
    cJSON_Delete(tiny_refs);
    specd_tokenizer_free(t);
}

/* The same tokenizer as GGUF metadata with tokenizer.ggml.pre "llama-bpe":
 * the Llama 3 regex and ignore_merges must be chosen from the name alone. */
static void test_llama3_gguf_matches_reference(void **state) {
    (void)state;
    specd_error err = {{0}};
    gguf_file *g = gguf_open(test_path(TINY_GGUF), &err);
    if (!g) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(g);
    specd_tokenizer *t = specd_tokenizer_from_gguf(g, &err);
    if (!t) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(t);
    cJSON *tiny_refs = load_json(TINY_REFS);
    assert_true(check_corpus(t, tiny_refs, "llama-bpe gguf"));
    assert_true(check_decode(t, tiny_refs));
    assert_int_equal(specd_tokenizer_bos(t), specd_tokenizer_token_id(t, "<|begin_of_text|>"));
    assert_int_equal(specd_tokenizer_eos(t), specd_tokenizer_token_id(t, "<|eot_id|>"));
    assert_true(specd_tokenizer_wants_bos(t)); /* llama.cpp's default for llama-bpe */
    assert_true(specd_tokenizer_is_special(t, specd_tokenizer_bos(t)));
    assert_false(specd_tokenizer_is_special(t, specd_tokenizer_token_id(t, "plain_added")));
    cJSON_Delete(tiny_refs);
    specd_tokenizer_free(t);
    gguf_close(g);
}

/* --- accessors and special tokens ------------------------------------------ */

static void check_accessors(const specd_tokenizer *t, int has_bos_eos) {
    assert_int_equal(specd_tokenizer_n_vocab(t), 49152);
    if (has_bos_eos) {
        assert_int_equal(specd_tokenizer_bos(t), 1);
        assert_int_equal(specd_tokenizer_eos(t), 2);
    }
    assert_int_equal(specd_tokenizer_token_id(t, "<|im_end|>"), 2);
    assert_int_equal(specd_tokenizer_token_id(t, "<|im_start|>"), 1);
    assert_int_equal(specd_tokenizer_token_id(t, "no such token"), -1);
    assert_true(specd_tokenizer_is_special(t, 0));
    assert_true(specd_tokenizer_is_special(t, 16));
    assert_false(specd_tokenizer_is_special(t, 17));
    assert_false(specd_tokenizer_is_special(t, -1));
    assert_false(specd_tokenizer_is_special(t, 49152));
    size_t len;
    const uint8_t *b = specd_token_bytes(t, 2, &len);
    assert_int_equal(len, 10);
    assert_memory_equal(b, "<|im_end|>", 10);
    int32_t space_the = specd_tokenizer_token_id(t, "\xC4\xA0the"); /* "Ġthe" */
    assert_true(space_the > 0);
    b = specd_token_bytes(t, space_the, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(b, " the", 4);
    assert_null(specd_token_bytes(t, -1, &len));
    assert_null(specd_token_bytes(t, 49152, &len));
}

static void test_accessors(void **state) {
    (void)state;
    check_accessors(json_tok, 0);
    if (gguf_tok) check_accessors(gguf_tok, 1);
}

static void test_special_tokens_only_when_allowed(void **state) {
    (void)state;
    const char *text = "a<|im_end|>b";
    int32_t *ids;
    size_t n;
    specd_error err = {{0}};
    assert_int_equal(specd_tokenize(json_tok, text, strlen(text), 1, &ids, &n, &err), 0);
    int found = 0;
    for (size_t i = 0; i < n; i++) found |= ids[i] == 2;
    assert_true(found);
    free(ids);
    assert_int_equal(specd_tokenize(json_tok, text, strlen(text), 0, &ids, &n, &err), 0);
    assert_true(n > 3);
    char joined[64] = "";
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *b = specd_token_bytes(json_tok, ids[i], &len);
        assert_false(specd_tokenizer_is_special(json_tok, ids[i]));
        memcpy(joined + used, b, len);
        used += len;
    }
    assert_int_equal(used, strlen(text));
    assert_memory_equal(joined, text, used);
    free(ids);
}

static void test_empty_input(void **state) {
    (void)state;
    int32_t *ids = (int32_t *)1;
    size_t n = 7;
    specd_error err = {{0}};
    assert_int_equal(specd_tokenize(json_tok, "", 0, 1, &ids, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_null(ids);
    assert_int_equal(specd_tokenize(json_tok, NULL, 0, 1, &ids, &n, &err), 0);
    assert_int_equal(n, 0);
}

/* --- invalid UTF-8 and the byte-level property ------------------------------ */

/* Bytes that SmolLM2's vocabulary has no token for are dropped (as in HF). */
static int byte_has_token(const specd_tokenizer *t, uint8_t b) {
    static const uint8_t missing[] = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1, 0xf2,
                                      0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe,
                                      0xff};
    (void)t;
    return memchr(missing, b, sizeof missing) == NULL;
}

static void test_invalid_utf8(void **state) {
    (void)state;
    static const char *inputs[] = {
        "\xff", "\xfe\xff", "\xc3", "abc\xc3", "\xe2\x82", "\xf0\x9f\x98", "\x80\x80\x80",
        "\xed\xa0\x80 surrogate", "\xc0\xaf overlong", "\xf4\x90\x80\x80 too big",
        "ok \xe6\x97\xa5\xff\xe6\x9c\xac mixed", "  \xa0\xa0  ", "1\xff" "2\xfe" "3",
        "\xf0\x9f\x98\x80\xf0\x9f\x98", "<|im_end\xff|>", "it'\xffs",
    };
    for (size_t k = 0; k < sizeof inputs / sizeof *inputs; k++) {
        const char *in = inputs[k];
        size_t len = strlen(in), n;
        int32_t *ids;
        specd_error err = {{0}};
        assert_int_equal(specd_tokenize(json_tok, in, len, 1, &ids, &n, &err), 0);
        /* Concatenated token bytes = the input minus bytes with no token. */
        char expect[128], got[128];
        size_t ne = 0, ng = 0;
        for (size_t i = 0; i < len; i++)
            if (byte_has_token(json_tok, (uint8_t)in[i])) expect[ne++] = in[i];
        for (size_t i = 0; i < n; i++) {
            size_t blen;
            const uint8_t *b = specd_token_bytes(json_tok, ids[i], &blen);
            memcpy(got + ng, b, blen);
            ng += blen;
        }
        assert_int_equal(ng, ne);
        assert_memory_equal(got, expect, ne);
        size_t dlen;
        char *text = specd_detokenize(json_tok, ids, n, &dlen, &err);
        assert_non_null(text);
        assert_true(specd_utf8_valid((const uint8_t *)text, dlen));
        free(text);
        free(ids);
    }
}

/* --- streaming decoder ------------------------------------------------------ */

/* Streams ids one by one; every chunk must be valid UTF-8 and the chunks
 * together must equal the whole-sequence decode. */
static void check_stream(const specd_tokenizer *t, const int32_t *ids, size_t n) {
    specd_error err = {{0}};
    size_t whole_len;
    char *whole = specd_detokenize(t, ids, n, &whole_len, &err);
    assert_non_null(whole);
    char *joined = malloc(whole_len + 1);
    size_t used = 0;
    specd_detok d;
    specd_detok_init(&d, t);
    for (size_t i = 0; i <= n; i++) {
        size_t len;
        const char *chunk = i < n ? specd_detok_push(&d, ids[i], &len, &err)
                                  : specd_detok_flush(&d, &len);
        assert_non_null(chunk);
        assert_int_equal(chunk[len], '\0');
        assert_true(specd_utf8_valid((const uint8_t *)chunk, len));
        assert_true(used + len <= whole_len);
        memcpy(joined + used, chunk, len);
        used += len;
    }
    specd_detok_free(&d);
    assert_int_equal(used, whole_len);
    assert_memory_equal(joined, whole, whole_len);
    free(joined);
    free(whole);
}

static void test_streaming_never_splits_characters(void **state) {
    (void)state;
    int split_seen = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, refs) {
        int32_t *ids;
        size_t n = json_ids(cJSON_GetObjectItem(e, "ids"), &ids);
        check_stream(json_tok, ids, n);
        /* Count the strings where some token ends inside a character. */
        for (size_t i = 0; i < n; i++) {
            size_t len;
            const uint8_t *b = specd_token_bytes(json_tok, ids[i], &len);
            if (len && !specd_utf8_valid(b, len)) split_seen = 1;
        }
        free(ids);
    }
    assert_true(split_seen); /* the corpus really exercises the hold-back */
    /* Emoji-heavy text tokenized by us, and raw byte tokens in odd orders. */
    static const char *emoji = "👨‍👩‍👧‍👦🏳️‍🌈🇺🇸👍🏽 😀😃🫠 🏴󠁧󠁢󠁳󠁣󠁴󠁿";
    int32_t *ids;
    size_t n;
    specd_error err = {{0}};
    assert_int_equal(specd_tokenize(json_tok, emoji, strlen(emoji), 0, &ids, &n, &err), 0);
    check_stream(json_tok, ids, n);
    free(ids);
    int32_t odd[] = {
        specd_tokenizer_token_id(json_tok, "\xC3\xB0"), /* 'ð' = byte 0xF0 */
        specd_tokenizer_token_id(json_tok, "a"),       /* breaks the sequence */
        specd_tokenizer_token_id(json_tok, "\xC3\xA2"), /* 'â' = byte 0xE2 */
        specd_tokenizer_token_id(json_tok, "\xC4\xA4"), /* 'Ĥ' = byte 0x82 */
    };
    for (size_t i = 0; i < 4; i++) assert_true(odd[i] >= 0);
    check_stream(json_tok, odd, 4);
    size_t len;
    char *text = specd_detokenize(json_tok, odd, 4, &len, &err);
    assert_string_equal(text, "\xEF\xBF\xBD" "a\xEF\xBF\xBD"); /* U+FFFD a U+FFFD */
    free(text);
}

static void test_detok_rejects_bad_id(void **state) {
    (void)state;
    specd_detok d;
    specd_detok_init(&d, json_tok);
    size_t len;
    specd_error err = {{0}};
    assert_null(specd_detok_push(&d, 49152, &len, &err));
    assert_non_null(strstr(err.msg, "49152"));
    assert_null(specd_detok_push(&d, -5, &len, &err));
    specd_detok_free(&d);
    int32_t bad[] = {5, 1 << 30};
    assert_null(specd_detokenize(json_tok, bad, 2, &len, &err));
}

/* --- limits and speed ------------------------------------------------------- */

static void test_input_limit(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_tokenizer *t = specd_tokenizer_from_json(test_path(TINY_JSON), &err);
    assert_non_null(t);
    specd_tokenizer_set_max_input(t, 16);
    int32_t *ids;
    size_t n;
    assert_int_equal(specd_tokenize(t, "0123456789abcdef", 16, 0, &ids, &n, &err), 0);
    free(ids);
    assert_int_equal(specd_tokenize(t, "0123456789abcdefg", 17, 0, &ids, &n, &err), -1);
    assert_non_null(strstr(err.msg, "exceeds the limit"));
    specd_tokenizer_free(t);
}

static void test_speed(void **state) {
    (void)state;
    /* ~200 KB: the corpus repeated, plus one long unbroken word (one piece,
     * the worst case for the merge loop). */
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap);
    while (len < 150000) {
        const cJSON *e;
        cJSON_ArrayForEach(e, refs) {
            size_t l;
            char *s = hex_field(e, "text_hex", &l);
            memcpy(text + len, s, l);
            len += l;
            free(s);
        }
    }
    for (int i = 0; i < 50000; i++) text[len++] = "abcdefghij"[(i * 7) % 10];
    int32_t *ids;
    size_t n;
    specd_error err = {{0}};
    double t0 = specd_now_s();
    assert_int_equal(specd_tokenize(json_tok, text, len, 1, &ids, &n, &err), 0);
    double dt = specd_now_s() - t0;
    printf("  tokenized %zu bytes into %zu tokens in %.1f ms (%.1f MB/s)\n", len, n, dt * 1e3,
           len / dt / 1e6);
    assert_true(dt < 1.0);
    free(ids);
    free(text);
}

/* --- bad tokenizer.json ----------------------------------------------------- */

typedef struct bad_case {
    const char *json;
    const char *expect; /* substring of the error message */
} bad_case;

#define VOCAB "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}"
#define BL_DEC "\"decoder\":{\"type\":\"ByteLevel\"}"
#define BL_PRE "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}"
#define BL_PRE_NOSPACE "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false}"

static void test_bad_json_errors(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {"", "invalid JSON"},
        {"{\"model\":", "invalid JSON"},
        {"[]", "not an object"},
        {"{}", "no model object"},
        {"{\"model\":{}," BL_PRE "," BL_DEC "}", "no model.vocab"},
        {"{\"model\":{\"type\":\"Unigram\"," VOCAB "}," BL_PRE "," BL_DEC "}", "Unigram"},
        {"{\"model\":{\"type\":\"WordPiece\"," VOCAB "}," BL_PRE "," BL_DEC "}", "WordPiece"},
        {"{\"model\":{\"type\":\"BPE\"," VOCAB ",\"byte_fallback\":true}," BL_PRE "," BL_DEC "}",
         "byte_fallback"},
        {"{\"model\":{" VOCAB ",\"continuing_subword_prefix\":\"##\"}," BL_PRE "," BL_DEC "}",
         "continuing_subword_prefix"},
        {"{\"model\":{" VOCAB ",\"merges\":[\"a c\"]}," BL_PRE "," BL_DEC "}", "'c'"},
        {"{\"model\":{" VOCAB ",\"merges\":[\"b a\"]}," BL_PRE "," BL_DEC "}", "'ba'"},
        {"{\"model\":{" VOCAB ",\"merges\":[\"a  b\"]}," BL_PRE "," BL_DEC "}", "merges[0]"},
        {"{\"model\":{" VOCAB ",\"merges\":[[\"a\"]]}," BL_PRE "," BL_DEC "}", "merges[0]"},
        {"{\"model\":{" VOCAB ",\"merges\":7}," BL_PRE "," BL_DEC "}", "must be an array"},
        {"{\"model\":{\"vocab\":{\"a\":-1}}," BL_PRE "," BL_DEC "}", "not a valid id"},
        {"{\"model\":{\"vocab\":{\"a\":1e12}}," BL_PRE "," BL_DEC "}", "not a valid id"},
        {"{\"model\":{\"vocab\":{\"a\":0.5}}," BL_PRE "," BL_DEC "}", "not a valid id"},
        {"{\"model\":{\"vocab\":{}}," BL_PRE "," BL_DEC "}", "empty"},
        {"{\"model\":{" VOCAB "},\"normalizer\":{\"type\":\"NFC\"}," BL_PRE "," BL_DEC "}",
         "normalizer 'NFC'"},
        {"{\"model\":{" VOCAB "}," BL_PRE ",\"decoder\":{\"type\":\"Metaspace\"}}", "decoder"},
        {"{\"model\":{" VOCAB "}," BL_PRE "}", "decoder"},
        {"{\"model\":{" VOCAB "},\"pre_tokenizer\":{\"type\":\"Metaspace\"}," BL_DEC "}",
         "pre_tokenizer type 'Metaspace'"},
        {"{\"model\":{" VOCAB "},\"pre_tokenizer\":{\"type\":\"Whitespace\"}," BL_DEC "}",
         "Whitespace"},
        {"{\"model\":{" VOCAB "},\"pre_tokenizer\":null," BL_DEC "}", "no ByteLevel"},
        {"{\"model\":{" VOCAB "},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":"
         "\"(\"},\"behavior\":\"Isolated\"}," BL_DEC "}",
         "regex"},
        {"{\"model\":{" VOCAB "},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":"
         "\"a\"},\"behavior\":\"Removed\"}," BL_DEC "}",
         "behavior 'Removed'"},
        {"{\"model\":{" VOCAB "},\"added_tokens\":[{\"id\":5,\"content\":\"x\",\"lstrip\":true}],"
         BL_PRE "," BL_DEC "}",
         "lstrip"},
        {"{\"model\":{" VOCAB "},\"added_tokens\":[{\"id\":0,\"content\":\"zz\"}]," BL_PRE ","
         BL_DEC "}",
         "token id 0"},
        {"{\"model\":{" VOCAB "},\"added_tokens\":[{\"content\":\"zz\"}]," BL_PRE "," BL_DEC "}",
         "valid id"},
        {"{\"model\":{" VOCAB ",\"unk_token\":\"<unk>\"}," BL_PRE "," BL_DEC "}", "unk_token"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        specd_error err = {{0}};
        specd_tokenizer *t = specd_tokenizer_from_json_mem(cases[i].json, strlen(cases[i].json),
                                                           &err);
        if (t || !strstr(err.msg, cases[i].expect))
            fprintf(stderr, "case %zu: got '%s', want '%s'\n", i, err.msg, cases[i].expect);
        assert_null(t);
        assert_non_null(strstr(err.msg, cases[i].expect));
    }
    specd_error err = {{0}};
    assert_null(specd_tokenizer_from_json("/nonexistent/tokenizer.json", &err));
    assert_non_null(strstr(err.msg, "/nonexistent/tokenizer.json"));
}

/* A minimal valid file: merges as "a b" strings, a String split, digits. */
static void test_minimal_json(void **state) {
    (void)state;
    const char *json =
        "{\"model\":{\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"-\":3,\"1\":4,\"\xC4\xA0\":5},"
        "\"merges\":[\"a b\"]},"
        "\"added_tokens\":[{\"id\":6,\"content\":\"<s>\",\"special\":true}],"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
        "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Isolated\"},"
        "{\"type\":\"Digits\",\"individual_digits\":false},"
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
        BL_DEC "}";
    specd_error err = {{0}};
    specd_tokenizer *t = specd_tokenizer_from_json_mem(json, strlen(json), &err);
    if (!t) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(t);
    assert_int_equal(specd_tokenizer_n_vocab(t), 7);
    assert_int_equal(specd_tokenizer_bos(t), -1);
    int32_t *ids;
    size_t n;
    const char *text = "ab-a<s>b1 ";
    assert_int_equal(specd_tokenize(t, text, strlen(text), 1, &ids, &n, &err), 0);
    int32_t want[] = {2, 3, 0, 6, 1, 4, 5};
    assert_int_equal(n, 7);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    specd_tokenizer_free(t);
}

/* Unused ids are allowed (they decode to ""), but only a bounded number:
 * TOK_MAX_VOCAB_HOLES (1024) plus one per defined token. Before the bound, a
 * 100-byte file naming one id near TOK_MAX_VOCAB sized the vocabulary at 4M
 * entries (128 MiB to allocate, clear and walk). */
static void test_sparse_vocab(void **state) {
    (void)state;
    /* 4 tokens (3 in the vocab, 1 added): ids up to 4 + 1024 + 4 - 1 = 1031 */
    static const char fmt[] = "{\"model\":{" VOCAB "},\"added_tokens\":[{\"id\":%d,"
                              "\"content\":\"<x>\",\"special\":true}]," BL_PRE "," BL_DEC "}";
    char json[512];
    specd_error err = {{0}};
    snprintf(json, sizeof json, fmt, 1031);
    specd_tokenizer *t = specd_tokenizer_from_json_mem(json, strlen(json), &err);
    if (!t) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(t);
    assert_int_equal(specd_tokenizer_n_vocab(t), 1032);
    /* a hole decodes to nothing; the added token past the holes still works */
    int32_t ids[] = {0, 500, 1031};
    size_t len;
    char *text = specd_detokenize(t, ids, 3, &len, &err);
    assert_non_null(text);
    assert_string_equal(text, "a<x>");
    free(text);
    specd_tokenizer_free(t);
    static const int too_far[] = {1032, 300000, (1 << 22) - 1};
    for (size_t i = 0; i < sizeof too_far / sizeof *too_far; i++) {
        snprintf(json, sizeof json, fmt, too_far[i]);
        err.msg[0] = '\0';
        assert_null(specd_tokenizer_from_json_mem(json, strlen(json), &err));
        assert_non_null(strstr(err.msg, "too sparse"));
    }
    /* the same through the vocabulary itself */
    const char *sparse_vocab = "{\"model\":{\"vocab\":{\"a\":0,\"b\":4000000}}," BL_PRE
                               "," BL_DEC "}";
    assert_null(specd_tokenizer_from_json_mem(sparse_vocab, strlen(sparse_vocab), &err));
    assert_non_null(strstr(err.msg, "too sparse"));
}

/* ignore_merges: a piece that is a vocabulary token is taken whole even
 * when no merge path leads to it (Hugging Face semantics, Llama 3). */
static void test_ignore_merges(void **state) {
    (void)state;
    static const char *const json[2] = {
        "{\"model\":{\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4},"
        "\"merges\":[\"a b\"],\"ignore_merges\":false}," BL_PRE_NOSPACE "," BL_DEC "}",
        "{\"model\":{\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4},"
        "\"merges\":[\"a b\"],\"ignore_merges\":true}," BL_PRE_NOSPACE "," BL_DEC "}",
    };
    for (int ignore = 0; ignore < 2; ignore++) {
        specd_error err = {{0}};
        specd_tokenizer *t = specd_tokenizer_from_json_mem(json[ignore], strlen(json[ignore]), &err);
        assert_non_null(t);
        int32_t *ids;
        size_t n;
        assert_int_equal(specd_tokenize(t, "abc", 3, 0, &ids, &n, &err), 0);
        if (ignore) {
            assert_int_equal(n, 1);
            assert_int_equal(ids[0], 4);
        } else {
            assert_int_equal(n, 2);
            assert_int_equal(ids[0], 3);
            assert_int_equal(ids[1], 2);
        }
        free(ids);
        specd_tokenizer_free(t);
    }
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Whether prompts need a BOS, and which: GGUF add_bos_token, a
 * TemplateProcessing post-processor, or tokenizer_config.json. */
static void test_bos_hints(void **state) {
    (void)state;
    assert_false(specd_tokenizer_wants_bos(json_tok));
    if (gguf_tok) assert_false(specd_tokenizer_wants_bos(gguf_tok)); /* add_bos_token false */
    const char *with_template =
        "{\"model\":{\"vocab\":{\"a\":0,\"<s>\":1,\"</s>\":2}},"
        "\"added_tokens\":[{\"id\":1,\"content\":\"<s>\",\"special\":true},"
        "{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
        "\"post_processor\":{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\"},"
        "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\","
        "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]}]},"
        BL_PRE "," BL_DEC "}";
    specd_error err = {{0}};
    specd_tokenizer *t = specd_tokenizer_from_json_mem(with_template, strlen(with_template), &err);
    assert_non_null(t);
    assert_true(specd_tokenizer_wants_bos(t));
    assert_int_equal(specd_tokenizer_bos(t), 1);
    assert_int_equal(specd_tokenizer_eos(t), -1);
    specd_tokenizer_free(t);
    /* tokenizer_config.json beside tokenizer.json names eos and turns BOS off. */
    char dir[] = "/tmp/specd_tok_XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_file(dir, "tokenizer.json", with_template);
    write_file(dir, "tokenizer_config.json",
               "{\"add_bos_token\": false, \"eos_token\": {\"content\": \"</s>\"}}");
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    t = specd_tokenizer_from_json(path, &err);
    assert_non_null(t);
    assert_false(specd_tokenizer_wants_bos(t));
    assert_int_equal(specd_tokenizer_bos(t), 1);
    assert_int_equal(specd_tokenizer_eos(t), 2);
    specd_tokenizer_free(t);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    remove(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_matches_reference),
        cmocka_unit_test(test_gguf_matches_reference),
        cmocka_unit_test(test_decode_matches_reference),
        cmocka_unit_test(test_llama3_config_matches_reference),
        cmocka_unit_test(test_llama3_gguf_matches_reference),
        cmocka_unit_test(test_accessors),
        cmocka_unit_test(test_special_tokens_only_when_allowed),
        cmocka_unit_test(test_empty_input),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_streaming_never_splits_characters),
        cmocka_unit_test(test_detok_rejects_bad_id),
        cmocka_unit_test(test_input_limit),
        cmocka_unit_test(test_speed),
        cmocka_unit_test(test_bad_json_errors),
        cmocka_unit_test(test_minimal_json),
        cmocka_unit_test(test_sparse_vocab),
        cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_bos_hints),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
