/* tokenizer_json.c - builds a tokenizer from a Hugging Face tokenizer.json.
 *
 * Supported (what Llama-family byte-level BPE tokenizers use):
 *   model          BPE: vocab, merges ("a b" strings or [a, b] pairs),
 *                  unk_token, fuse_unk, ignore_merges
 *   added_tokens   matched whole before pre-tokenization; "special": true
 *                  ones only when the caller allows special tokens
 *   normalizer     null
 *   pre_tokenizer  ByteLevel, Digits, Split (Regex or String, "Isolated"),
 *                  and Sequences of them; a ByteLevel step is required
 *   decoder        ByteLevel
 *   post_processor only read for whether prompts start with BOS (specd
 *                  never adds BOS/EOS by itself)
 * Anything else is refused with a message naming it, rather than producing
 * ids that silently differ from the reference. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/small_file.h"
#include "common/text/tokenizer_internal.h"

/* Bigger than any real tokenizer.json (Llama 3's is ~9 MB). */
#define TOKENIZER_JSON_MAX_BYTES ((size_t)256 << 20)

static const char *type_of(const cJSON *obj) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(type) ? type->valuestring : NULL;
}

/* A boolean field with a default for when it is absent (HF's serde defaults). */
static int flag(const cJSON *obj, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

static int is_null_or_absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* ---- model ----------------------------------------------------------------- */

static int check_bpe_options(const cJSON *model, specd_error *err) {
    const char *type = type_of(model);
    if (type && strcmp(type, "BPE") != 0)
        return specd_seterr(err, "tokenizer.json: unsupported model type '%s' (only BPE)", type);
    if (flag(model, "byte_fallback", 0))
        return specd_seterr(err, "tokenizer.json: unsupported model option byte_fallback "
                            "(SentencePiece-style BPE)");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (!is_null_or_absent(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return specd_seterr(err, "tokenizer.json: unsupported model option dropout");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, affixes[i]);
        if (!is_null_or_absent(v) && !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
            return specd_seterr(err, "tokenizer.json: unsupported model option %s", affixes[i]);
    }
    return 0;
}

static int read_id(const cJSON *v, int64_t *id) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= TOK_MAX_VOCAB ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return -1;
    *id = (int64_t)v->valuedouble;
    return 0;
}

/* Vocabulary size: one past the largest id of the vocab and added tokens.
 *
 * The id space must be mostly used. The tokenizer keeps one entry per id
 * (and walks them all when indexing and freeing), so without this a file of
 * a few dozen bytes naming the id 4,000,000 made the loader allocate and
 * clear 128 MiB and loop over 4M empty entries: cost set by one number in
 * the file rather than by its size (the tokenizer_json fuzzer kept such
 * inputs in its corpus and ran at a quarter of its speed: 8k inputs/s, 33k
 * with this check). Real vocabularies are dense
 * (holes, where there are any, are a few padding ids between the model
 * vocabulary and the added tokens), so at most TOK_MAX_VOCAB_HOLES holes
 * plus one per defined token are allowed: memory stays proportional to the
 * file. An id defined twice counts twice here, which only loosens the bound
 * (by at most the file's own size); tok_set_token rejects conflicts. */
static int count_vocab(const cJSON *vocab, const cJSON *added, int64_t *n, specd_error *err) {
    int64_t max_id = -1, id, entries = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, vocab) {
        if (read_id(item, &id) != 0)
            return specd_seterr(err, "tokenizer.json: model.vocab['%.80s'] is not a valid id",
                                item->string);
        if (id > max_id) max_id = id;
        entries++;
    }
    cJSON_ArrayForEach(item, added) {
        if (read_id(cJSON_GetObjectItemCaseSensitive(item, "id"), &id) != 0)
            return specd_seterr(err, "tokenizer.json: added_tokens entry without a valid id");
        if (id > max_id) max_id = id;
        entries++;
    }
    if (max_id < 0) return specd_seterr(err, "tokenizer.json: the vocabulary is empty");
    if (max_id + 1 - entries > entries + TOK_MAX_VOCAB_HOLES)
        return specd_seterr(err, "tokenizer.json: the vocabulary is too sparse: ids run up to "
                            "%lld but only %lld tokens are defined (at most %d unused ids plus "
                            "one per token)",
                            (long long)max_id, (long long)entries, TOK_MAX_VOCAB_HOLES);
    *n = max_id + 1;
    return 0;
}

static int read_vocab(specd_tokenizer *t, const cJSON *vocab, specd_error *err) {
    const cJSON *item;
    cJSON_ArrayForEach(item, vocab) {
        int64_t id = 0;
        read_id(item, &id); /* validated by count_vocab */
        if (tok_set_token(t, id, item->string, strlen(item->string), TOK_NORMAL, 1, err) != 0)
            return specd_preferr(err, "tokenizer.json: model.vocab");
    }
    return 0;
}

/* A merge is "left right" or ["left", "right"]. */
static int split_merge(const cJSON *m, const char **l, size_t *ll, const char **r, size_t *rl) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *space = strchr(s, ' ');
        if (!space || strchr(space + 1, ' ')) return -1;
        *l = s;
        *ll = (size_t)(space - s);
        *r = space + 1;
        *rl = strlen(space + 1);
        return 0;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *l = m->child->valuestring;
        *ll = strlen(*l);
        *r = m->child->next->valuestring;
        *rl = strlen(*r);
        return 0;
    }
    return -1;
}

static int read_merges(specd_tokenizer *t, const cJSON *merges, specd_error *err) {
    if (is_null_or_absent(merges)) return 0;
    if (!cJSON_IsArray(merges))
        return specd_seterr(err, "tokenizer.json: model.merges must be an array");
    uint32_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *l, *r;
        size_t ll, rl;
        if (split_merge(m, &l, &ll, &r, &rl) != 0)
            return specd_seterr(err, "tokenizer.json: model.merges[%u] is neither \"a b\" nor "
                                "[\"a\", \"b\"]", rank);
        if (tok_add_merge(t, l, ll, r, rl, rank, err) != 0)
            return specd_preferr(err, "tokenizer.json: model.merges");
        rank++;
    }
    return 0;
}

static int read_unk(specd_tokenizer *t, const cJSON *model, specd_error *err) {
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (is_null_or_absent(unk)) return 0;
    if (!cJSON_IsString(unk))
        return specd_seterr(err, "tokenizer.json: model.unk_token must be a string");
    t->unk = tok_strmap_get(&t->model_vocab, unk->valuestring, strlen(unk->valuestring));
    if (t->unk < 0)
        return specd_seterr(err, "tokenizer.json: unk_token '%.80s' is not in the vocabulary",
                            unk->valuestring);
    t->fuse_unk = flag(model, "fuse_unk", 0);
    return 0;
}

/* ---- added tokens ---------------------------------------------------------- */

static int read_added_token(specd_tokenizer *t, const cJSON *a, specd_error *err) {
    int64_t id = 0;
    read_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &id); /* validated by count_vocab */
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
    if (!cJSON_IsString(content))
        return specd_seterr(err, "tokenizer.json: added token %lld has no content",
                            (long long)id);
    static const char *const unsupported[] = {"single_word", "lstrip", "rstrip"};
    for (int i = 0; i < 3; i++)
        if (flag(a, unsupported[i], 0))
            return specd_seterr(err, "tokenizer.json: added token '%.80s' uses unsupported "
                                "option %s", content->valuestring, unsupported[i]);
    tok_kind kind = flag(a, "special", 0) ? TOK_CONTROL : TOK_ADDED;
    /* Its model-vocabulary status was set by read_vocab (same id, same text). */
    if (tok_set_token(t, id, content->valuestring, strlen(content->valuestring), kind, 0, err) != 0)
        return specd_preferr(err, "tokenizer.json: added_tokens");
    return 0;
}

static int read_added_tokens(specd_tokenizer *t, const cJSON *added, specd_error *err) {
    const cJSON *a;
    cJSON_ArrayForEach(a, added)
        if (read_added_token(t, a, err) != 0) return -1;
    return 0;
}

/* ---- pre-tokenizer ----------------------------------------------------------- */

static int add_regex(specd_tokenizer *t, const char *pattern, size_t len, specd_error *err) {
    tok_pretok_step step;
    if (tok_pretok_regex(&step, pattern, len, err) != 0) return -1;
    return tok_add_pretok_step(t, step, err);
}

static int add_byte_level(specd_tokenizer *t, const cJSON *p, specd_error *err) {
    if (flag(p, "add_prefix_space", 1)) {
        tok_pretok_step step = {.kind = TOK_PRETOK_PREFIX_SPACE};
        if (tok_add_pretok_step(t, step, err) != 0) return -1;
    }
    t->has_byte_level = 1;
    if (!flag(p, "use_regex", 1)) return 0;
    return add_regex(t, TOK_REGEX_GPT2, strlen(TOK_REGEX_GPT2), err);
}

/* A literal split string as a regex: escape ASCII punctuation. */
static int add_string_split(specd_tokenizer *t, const char *s, specd_error *err) {
    size_t len = strlen(s);
    char *pattern = malloc(2 * len + 1);
    if (!pattern) return specd_seterr(err, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (c < 0x80 && !alnum) pattern[k++] = '\\';
        pattern[k++] = s[i];
    }
    int rc = add_regex(t, pattern, k, err);
    free(pattern);
    return rc;
}

static int add_split(specd_tokenizer *t, const cJSON *p, specd_error *err) {
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0)
        return specd_seterr(err, "tokenizer.json: unsupported Split behavior '%.40s' (only "
                            "Isolated)", cJSON_IsString(behavior) ? behavior->valuestring : "?");
    if (flag(p, "invert", 0))
        return specd_seterr(err, "tokenizer.json: unsupported Split option invert");
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    const cJSON *string = cJSON_GetObjectItemCaseSensitive(pattern, "String");
    if (cJSON_IsString(regex))
        return add_regex(t, regex->valuestring, strlen(regex->valuestring), err);
    if (cJSON_IsString(string)) return add_string_split(t, string->valuestring, err);
    return specd_seterr(err, "tokenizer.json: Split needs a pattern {\"Regex\": ...} or "
                        "{\"String\": ...}");
}

static int add_pre_tokenizer(specd_tokenizer *t, const cJSON *p, int depth, specd_error *err) {
    const char *type = type_of(p);
    if (!type) return specd_seterr(err, "tokenizer.json: pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list) || depth > 4)
            return specd_seterr(err, "tokenizer.json: malformed pre_tokenizer Sequence");
        const cJSON *item;
        cJSON_ArrayForEach(item, list)
            if (add_pre_tokenizer(t, item, depth + 1, err) != 0) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return add_byte_level(t, p, err);
    if (!strcmp(type, "Digits")) {
        const char *re = flag(p, "individual_digits", 0) ? TOK_REGEX_DIGIT : TOK_REGEX_DIGITS;
        return add_regex(t, re, strlen(re), err);
    }
    if (!strcmp(type, "Split")) return add_split(t, p, err);
    return specd_seterr(err, "tokenizer.json: unsupported pre_tokenizer type '%.40s'", type);
}

/* ---- post-processor ------------------------------------------------------ */

/* specd never adds special tokens itself, but a TemplateProcessing that
 * starts every sequence with a special token (Llama 3's <|begin_of_text|>)
 * says the model expects a BOS: record it for specd_tokenizer_wants_bos. */
static void read_template_bos(specd_tokenizer *t, const cJSON *proc) {
    const char *type = type_of(proc);
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(proc, "processors"))
            read_template_bos(t, item);
        return;
    }
    if (strcmp(type, "TemplateProcessing") != 0) return;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(proc, "single");
    const cJSON *first = cJSON_IsArray(single) ? single->child : NULL;
    const cJSON *special = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(special, "id");
    if (!cJSON_IsString(id)) return;
    int32_t bos = specd_tokenizer_token_id(t, id->valuestring);
    if (bos < 0) return;
    t->bos = bos;
    t->wants_bos = 1;
}

/* ---- whole file ---------------------------------------------------------- */

static int check_pipeline(const cJSON *root, specd_error *err) {
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!is_null_or_absent(norm))
        return specd_seterr(err, "tokenizer.json: unsupported normalizer '%.40s'",
                            type_of(norm) ? type_of(norm) : "?");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (is_null_or_absent(dec) || !type_of(dec) || strcmp(type_of(dec), "ByteLevel") != 0)
        return specd_seterr(err, "tokenizer.json: unsupported decoder '%.40s' (only ByteLevel)",
                            dec && type_of(dec) ? type_of(dec) : "null");
    return 0;
}

static specd_tokenizer *build(const cJSON *root, specd_error *err) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(model)) {
        specd_seterr(err, "tokenizer.json: no model object");
        return NULL;
    }
    if (check_pipeline(root, err) != 0 || check_bpe_options(model, err) != 0) return NULL;
    if (!cJSON_IsObject(vocab)) {
        specd_seterr(err, "tokenizer.json: no model.vocab object");
        return NULL;
    }
    if (!is_null_or_absent(added) && !cJSON_IsArray(added)) {
        specd_seterr(err, "tokenizer.json: added_tokens must be an array");
        return NULL;
    }
    int64_t n_vocab = 0;
    if (count_vocab(vocab, added, &n_vocab, err) != 0) return NULL;
    specd_tokenizer *t = tok_new(n_vocab, err);
    if (!t) return NULL;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    t->ignore_merges = flag(model, "ignore_merges", 0);
    if (read_vocab(t, vocab, err) != 0 || read_added_tokens(t, added, err) != 0 ||
        tok_index_vocab(t, err) != 0 || read_unk(t, model, err) != 0 ||
        read_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), err) != 0 ||
        (!is_null_or_absent(pre) && add_pre_tokenizer(t, pre, 0, err) != 0) ||
        tok_index_specials(t, err) != 0)
        goto fail;
    read_template_bos(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    if (!t->has_byte_level) {
        specd_seterr(err, "tokenizer.json: pre_tokenizer has no ByteLevel step (only byte-level "
                     "BPE is supported)");
        goto fail;
    }
    return t;
fail:
    specd_tokenizer_free(t);
    return NULL;
}

specd_tokenizer *specd_tokenizer_from_json_mem(const char *json, size_t len, specd_error *err) {
    if (len > TOKENIZER_JSON_MAX_BYTES) {
        specd_seterr(err, "tokenizer.json: %zu bytes is larger than the limit", len);
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= json && at <= json + len ? (size_t)(at - json) : 0;
        specd_seterr(err, "tokenizer.json: invalid JSON near byte %zu", off);
        return NULL;
    }
    specd_tokenizer *t = cJSON_IsObject(root) ? build(root, err) : NULL;
    if (!cJSON_IsObject(root)) specd_seterr(err, "tokenizer.json: top level is not an object");
    cJSON_Delete(root);
    return t;
}

/* bos_token / eos_token in tokenizer_config.json: a string or {"content"}. */
static int32_t config_token(const specd_tokenizer *t, const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return -1;
    return specd_tokenizer_token_id(t, v->valuestring);
}

/* tokenizer_config.json's special tokens, add_bos_token and chat_template
 * (a string, or a list of {name, template} of which "default" is the chat
 * one; the others are tool-use variants). */
static void apply_tokenizer_config(specd_tokenizer *t, const cJSON *cfg) {
    int32_t bos = config_token(t, cfg, "bos_token"), eos = config_token(t, cfg, "eos_token");
    if (bos >= 0) t->bos = bos;
    if (eos >= 0) t->eos = eos;
    const cJSON *add_bos = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    if (cJSON_IsBool(add_bos)) t->wants_bos = cJSON_IsTrue(add_bos);
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *v;
    if (cJSON_IsArray(tmpl)) {
        const cJSON *found = NULL;
        cJSON_ArrayForEach(v, tmpl) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(v, "name");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default"))
                found = cJSON_GetObjectItemCaseSensitive(v, "template");
        }
        tmpl = found;
    }
    if (cJSON_IsString(tmpl)) {
        free(t->chat_template);
        t->chat_template = strdup(tmpl->valuestring);
    }
}

/* Optional: a missing or unreadable tokenizer_config.json changes nothing.
 * Newer model directories keep the chat template in chat_template.jinja
 * beside it instead. */
static void read_sibling_config(specd_tokenizer *t, const char *json_path) {
    char path[4096];
    const char *slash = strrchr(json_path, '/');
    int dir_len = slash ? (int)(slash - json_path + 1) : 0;
    size_t len;
    if (snprintf(path, sizeof path, "%.*stokenizer_config.json", dir_len, json_path) <
        (int)sizeof path) {
        char *buf = specd_read_small_file(path, TOKENIZER_JSON_MAX_BYTES, &len, NULL);
        cJSON *cfg = buf ? cJSON_ParseWithLength(buf, len) : NULL;
        free(buf);
        if (cfg) apply_tokenizer_config(t, cfg);
        cJSON_Delete(cfg);
    }
    if (!t->chat_template &&
        snprintf(path, sizeof path, "%.*schat_template.jinja", dir_len, json_path) <
            (int)sizeof path)
        t->chat_template = specd_read_small_file(path, TOKENIZER_JSON_MAX_BYTES, &len, NULL);
}

specd_tokenizer *specd_tokenizer_from_json(const char *path, specd_error *err) {
    size_t len;
    char *buf = specd_read_small_file(path, TOKENIZER_JSON_MAX_BYTES, &len, err);
    if (!buf) return NULL;
    specd_tokenizer *t = specd_tokenizer_from_json_mem(buf, len, err);
    free(buf);
    if (!t) {
        specd_preferr(err, "%s", path);
        return NULL;
    }
    read_sibling_config(t, path);
    return t;
}
