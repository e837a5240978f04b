/* tokenizer_gguf.c - builds a tokenizer from GGUF tokenizer.ggml.* metadata.
 *
 * Keys read: model (must be "gpt2", i.e. byte-level BPE), pre (selects the
 * pre-tokenizer, as llama.cpp does), tokens, token_type, merges, and the
 * bos/eos token ids. Control tokens (type 3) are special; user-defined ones
 * (type 4) are always matched as whole strings, as in llama.cpp. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/gguf.h"
#include "common/text/tokenizer_internal.h"

#define TOKEN_TYPE_CONTROL 3
#define TOKEN_TYPE_USER_DEFINED 4

typedef struct pre_config {
    const char *names; /* tokenizer.ggml.pre values, '|'-separated */
    const char *regexes[3];
    int ignore_merges;
    int add_bos;       /* llama.cpp's default when add_bos_token is absent */
} pre_config;

/* Which split patterns each pre-tokenizer name means (llama.cpp's
 * llm_tokenizer_bpe table). "smollm" is also what SmolLM2's tokenizer.json
 * says: Digits(individual_digits) then the GPT-2 ByteLevel regex. */
static const pre_config PRE_CONFIGS[] = {
    {"|smollm|starcoder|refact|command-r|codeshell|exaone|minerva|",
     {TOK_REGEX_DIGIT, TOK_REGEX_GPT2, NULL}, 0, 0},
    {"|gpt2|default|mpt|olmo|", {TOK_REGEX_GPT2, NULL, NULL}, 0, 0},
    {"|llama3|llama-v3|llama-bpe|falcon3|pixtral|", {TOK_REGEX_LLAMA3, NULL, NULL}, 1, 1},
};

static const pre_config *find_pre_config(const char *pre) {
    char key[80];
    if (strlen(pre) + 3 > sizeof key) return NULL;
    snprintf(key, sizeof key, "|%s|", pre);
    for (size_t i = 0; i < sizeof PRE_CONFIGS / sizeof PRE_CONFIGS[0]; i++)
        if (strstr(PRE_CONFIGS[i].names, key)) return &PRE_CONFIGS[i];
    return NULL;
}

static int configure_pre(specd_tokenizer *t, const struct gguf_file *f, specd_error *err) {
    /* No key: llama.cpp's "default"; GPT-2's own regex is the safe reading. */
    char *pre = gguf_find_kv(f, "tokenizer.ggml.pre") ? gguf_get_str(f, "tokenizer.ggml.pre", err)
                                                      : strdup("default");
    if (!pre) return -1;
    const pre_config *cfg = find_pre_config(pre);
    if (!cfg) {
        specd_seterr(err, "unsupported tokenizer.ggml.pre '%s' (supported: smollm, starcoder, "
                     "gpt2, llama3, llama-bpe and their aliases)", pre);
        free(pre);
        return -1;
    }
    free(pre);
    for (int i = 0; i < 3 && cfg->regexes[i]; i++) {
        tok_pretok_step step;
        if (tok_pretok_regex(&step, cfg->regexes[i], strlen(cfg->regexes[i]), err) != 0 ||
            tok_add_pretok_step(t, step, err) != 0)
            return -1;
    }
    t->ignore_merges = cfg->ignore_merges;
    t->has_byte_level = 1;
    t->wants_bos = cfg->add_bos;
    if (gguf_find_kv(f, "tokenizer.ggml.add_bos_token") &&
        gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &t->wants_bos, err) != 0)
        return -1;
    return 0;
}

static const gguf_kv *find_array(const struct gguf_file *f, const char *key, gguf_type elem,
                                 int required, specd_error *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) {
        if (required) specd_seterr(err, "gguf: missing %s", key);
        return NULL;
    }
    if (kv->type != GGUF_ARRAY || kv->arr_type != elem) {
        specd_seterr(err, "gguf: %s must be an array of %s", key, gguf_type_name(elem));
        return NULL;
    }
    return kv;
}

static int read_tokens(specd_tokenizer *t, const struct gguf_file *f, const gguf_kv *tokens,
                       specd_error *err) {
    const gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    if (types && (types->type != GGUF_ARRAY ||
                  (types->arr_type != GGUF_INT32 && types->arr_type != GGUF_UINT32) ||
                  types->arr_len != tokens->arr_len))
        return specd_seterr(err, "gguf: tokenizer.ggml.token_type must be an int32 array with "
                            "one entry per token");
    for (uint64_t i = 0; i < tokens->arr_len; i++) {
        int32_t type = 1;
        if (types) memcpy(&type, types->arr_data + 4 * i, 4); /* may be unaligned */
        tok_kind kind = type == TOKEN_TYPE_CONTROL        ? TOK_CONTROL
                        : type == TOKEN_TYPE_USER_DEFINED ? TOK_ADDED
                                                          : TOK_NORMAL;
        const gguf_str *s = &tokens->arr_strs[i];
        if (tok_set_token(t, (int64_t)i, s->ptr, s->len, kind, 1, err) != 0) return -1;
    }
    return 0;
}

static int read_merges(specd_tokenizer *t, const gguf_kv *merges, specd_error *err) {
    for (uint64_t i = 0; merges && i < merges->arr_len; i++) {
        const gguf_str *s = &merges->arr_strs[i];
        const char *space = memchr(s->ptr, ' ', s->len);
        if (!space || memchr(space + 1, ' ', s->len - (size_t)(space + 1 - s->ptr)))
            return specd_seterr(err, "gguf: tokenizer.ggml.merges[%llu] '%.*s' is not \"a b\"",
                                (unsigned long long)i, (int)(s->len > 80 ? 80 : s->len), s->ptr);
        size_t left_len = (size_t)(space - s->ptr);
        if (tok_add_merge(t, s->ptr, left_len, space + 1, s->len - left_len - 1, (uint32_t)i,
                          err) != 0)
            return specd_preferr(err, "gguf: tokenizer.ggml.merges");
    }
    return 0;
}

/* Optional token id key: absent -> -1; present but out of range -> error. */
static int read_special_id(const struct gguf_file *f, const char *key, int32_t n_vocab,
                           int32_t *out, specd_error *err) {
    *out = -1;
    if (!gguf_find_kv(f, key)) return 0;
    uint32_t id;
    if (gguf_get_u32(f, key, &id, err) != 0) return -1;
    if (id >= (uint32_t)n_vocab)
        return specd_seterr(err, "gguf: %s = %u is outside the vocabulary (%d tokens)", key, id,
                            n_vocab);
    *out = (int32_t)id;
    return 0;
}

static int check_model(const struct gguf_file *f, specd_error *err) {
    char *model = gguf_get_str(f, "tokenizer.ggml.model", err);
    if (!model) return -1;
    int ok = strcmp(model, "gpt2") == 0;
    if (!ok)
        specd_seterr(err, "unsupported tokenizer.ggml.model '%s' (specd supports byte-level BPE, "
                     "'gpt2')", model);
    free(model);
    return ok ? 0 : -1;
}

specd_tokenizer *specd_tokenizer_from_gguf(const struct gguf_file *f, specd_error *err) {
    if (check_model(f, err) != 0) return NULL;
    const gguf_kv *tokens = find_array(f, "tokenizer.ggml.tokens", GGUF_STRING, 1, err);
    if (!tokens) return NULL;
    const gguf_kv *merges = find_array(f, "tokenizer.ggml.merges", GGUF_STRING, 0, err);
    if (!merges && gguf_find_kv(f, "tokenizer.ggml.merges")) return NULL;
    if (tokens->arr_len > TOK_MAX_VOCAB) {
        specd_seterr(err, "gguf: %llu tokens is more than the limit of %d",
                     (unsigned long long)tokens->arr_len, TOK_MAX_VOCAB);
        return NULL;
    }
    specd_tokenizer *t = tok_new((int64_t)tokens->arr_len, err);
    if (!t) return NULL;
    /* The unknown token id is deliberately not used for BPE: like llama.cpp
     * and Hugging Face (SmolLM2's unk_token is null), bytes missing from a
     * byte-level vocabulary are dropped rather than turned into <unk>. */
    if (read_tokens(t, f, tokens, err) != 0 || tok_index_vocab(t, err) != 0 ||
        read_merges(t, merges, err) != 0 || configure_pre(t, f, err) != 0 ||
        tok_index_specials(t, err) != 0 ||
        read_special_id(f, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err) != 0 ||
        read_special_id(f, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err) != 0) {
        specd_tokenizer_free(t);
        return NULL;
    }
    return t;
}
