/* tokenizer.c - the vocabulary, the tokenize pipeline and the accessors.
 *
 * Loaders (tokenizer_gguf.c, tokenizer_json.c) fill a specd_tokenizer through
 * the tok_* builder functions below; specd_tokenize then runs
 *   special-token split -> pre-tokenizer pipeline -> BPE per piece. */
#include <stdlib.h>
#include <string.h>

#include "common/model/gguf.h"
#include "common/util/sha256.h"
#include "common/model/model_file.h"
#include "common/text/tokenizer_internal.h"

/* ---- building -------------------------------------------------------------- */

specd_tokenizer *tok_new(int64_t n_vocab, specd_error *err) {
    if (n_vocab <= 0 || n_vocab > TOK_MAX_VOCAB) {
        specd_seterr(err, "vocabulary size %lld is out of range (1..%d)", (long long)n_vocab,
                     TOK_MAX_VOCAB);
        return NULL;
    }
    specd_tokenizer *t = calloc(1, sizeof *t);
    if (t) t->tokens = calloc((size_t)n_vocab, sizeof *t->tokens);
    if (!t || !t->tokens) {
        free(t);
        specd_seterr(err, "out of memory for a vocabulary of %lld tokens", (long long)n_vocab);
        return NULL;
    }
    t->n_vocab = (int32_t)n_vocab;
    t->bos = t->eos = t->unk = -1;
    t->max_input = SPECD_TOKENIZE_MAX_INPUT;
    for (int b = 0; b < 256; b++) t->byte_token[b] = -1;
    return t;
}

/* The raw bytes of a token: byte-level spelling reversed for ordinary
 * tokens (falling back to the text itself when it is not in the alphabet,
 * like the Hugging Face ByteLevel decoder); added tokens are their text. */
static int set_token_bytes(tok_entry *e) {
    if (e->kind == TOK_NORMAL) {
        uint8_t *bytes = malloc(e->text_len ? e->text_len : 1);
        if (!bytes) return -1;
        long n = tok_text_to_bytes(e->text, e->text_len, bytes);
        if (n >= 0) {
            e->bytes = bytes;
            e->n_bytes = (uint32_t)n;
            return 0;
        }
        free(bytes);
    }
    e->bytes = (uint8_t *)e->text;
    e->n_bytes = e->text_len;
    return 0;
}

static void clear_token_bytes(tok_entry *e) {
    if (e->bytes != (uint8_t *)e->text) free(e->bytes);
    e->bytes = NULL;
    e->n_bytes = 0;
}

int tok_set_token(specd_tokenizer *t, int64_t id, const char *text, size_t len, tok_kind kind,
                  int in_model, specd_error *err) {
    if (id < 0 || id >= t->n_vocab)
        return specd_seterr(err, "token id %lld is outside the vocabulary (size %d)",
                            (long long)id, t->n_vocab);
    if (len > TOK_MAX_TOKEN_LEN)
        return specd_seterr(err, "token %lld is %zu bytes long (limit %d)", (long long)id, len,
                            TOK_MAX_TOKEN_LEN);
    tok_entry *e = &t->tokens[id];
    if (e->text) {
        /* An added token that is also in the model vocabulary (SmolLM2's
         * specials are) only changes how the token is treated. */
        if (e->text_len != len || memcmp(e->text, text, len) != 0)
            return specd_seterr(err, "token id %lld is both '%.*s' and '%.*s'", (long long)id,
                                (int)e->text_len, e->text, (int)len, text);
        clear_token_bytes(e);
        e->kind = (uint8_t)kind;
        e->in_model |= (uint8_t)(in_model != 0);
        return set_token_bytes(e) == 0 ? 0 : specd_seterr(err, "out of memory");
    }
    e->text = malloc(len + 1);
    if (!e->text) return specd_seterr(err, "out of memory reading the vocabulary");
    memcpy(e->text, text, len);
    e->text[len] = '\0';
    e->text_len = (uint32_t)len;
    e->kind = (uint8_t)kind;
    e->in_model = (uint8_t)(in_model != 0);
    if (set_token_bytes(e) != 0) return specd_seterr(err, "out of memory reading the vocabulary");
    return 0;
}

int tok_index_vocab(specd_tokenizer *t, specd_error *err) {
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const tok_entry *e = &t->tokens[id];
        if (!e->text) continue;
        if ((e->in_model && tok_strmap_put(&t->model_vocab, e->text, e->text_len, id) != 0) ||
            tok_strmap_put(&t->all_tokens, e->text, e->text_len, id) != 0)
            return specd_seterr(err, "out of memory indexing the vocabulary");
    }
    for (int b = 0; b < 256; b++) {
        char spelled[2];
        uint8_t byte = (uint8_t)b;
        size_t n = tok_bytes_to_text(&byte, 1, spelled);
        t->byte_token[b] = tok_strmap_get(&t->model_vocab, spelled, n);
    }
    return 0;
}

int tok_add_pretok_step(specd_tokenizer *t, tok_pretok_step step, specd_error *err) {
    if (t->n_steps == TOK_MAX_PRETOK_STEPS) {
        tok_pretok_free(&step);
        return specd_seterr(err, "more than %d pre-tokenizer steps", TOK_MAX_PRETOK_STEPS);
    }
    t->steps[t->n_steps++] = step;
    return 0;
}

int tok_index_specials(specd_tokenizer *t, specd_error *err) {
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const tok_entry *e = &t->tokens[id];
        if (!e->text || e->kind == TOK_NORMAL) continue;
        if (tok_trie_add(&t->specials, (const uint8_t *)e->text, e->text_len, id,
                         e->kind == TOK_ADDED) != 0)
            return specd_seterr(err, "out of memory indexing special tokens");
    }
    return 0;
}

void specd_tokenizer_set_max_input(specd_tokenizer *t, size_t max_bytes) {
    t->max_input = max_bytes;
}

void specd_tokenizer_free(specd_tokenizer *t) {
    if (!t) return;
    free(t->chat_template);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        clear_token_bytes(&t->tokens[id]);
        free(t->tokens[id].text);
    }
    free(t->tokens);
    tok_strmap_free(&t->model_vocab);
    tok_strmap_free(&t->all_tokens);
    tok_u64map_free(&t->merges);
    tok_trie_free(&t->specials);
    for (size_t k = 0; k < t->n_steps; k++) tok_pretok_free(&t->steps[k]);
    free(t);
}

/* ---- tokenizing ------------------------------------------------------------ */

int tok_ids_push(tok_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) return -1;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

typedef struct tokenize_ctx {
    const specd_tokenizer *t;
    tok_bpe_work work;
    tok_ids out;
    specd_error *err;
} tokenize_ctx;

static int bpe_piece(void *ctx, const uint8_t *piece, size_t len) {
    tokenize_ctx *c = ctx;
    if (tok_bpe_piece(c->t, &c->work, piece, len, &c->out) != 0)
        return specd_seterr(c->err, "out of memory in BPE (piece of %zu bytes)", len);
    return 0;
}

static int tokenize_plain(tokenize_ctx *c, const uint8_t *text, size_t len) {
    return tok_pretokenize(c->t->steps, c->t->n_steps, text, len, bpe_piece, c, c->err);
}

/* Splits out added tokens, tokenizing the text between them. */
static int tokenize_all(tokenize_ctx *c, const uint8_t *text, size_t len, int allow_special) {
    size_t plain_start = 0, i = 0;
    while (i < len) {
        int32_t id;
        size_t m = tok_trie_match(&c->t->specials, text + i, len - i, allow_special, &id);
        if (m == 0) {
            i++;
            continue;
        }
        if (tokenize_plain(c, text + plain_start, i - plain_start) != 0) return -1;
        if (tok_ids_push(&c->out, id) != 0) return specd_seterr(c->err, "out of memory");
        i += m;
        plain_start = i;
    }
    return tokenize_plain(c, text + plain_start, len - plain_start);
}

int specd_tokenize(const specd_tokenizer *t, const char *text, size_t len, int allow_special,
                   int32_t **ids, size_t *n_ids, specd_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len > 0) return specd_seterr(err, "tokenize: text is NULL");
    if (len > t->max_input)
        return specd_seterr(err, "tokenize: input of %zu bytes exceeds the limit of %zu bytes",
                            len, t->max_input);
    tokenize_ctx c = {.t = t, .err = err};
    int rc = tokenize_all(&c, (const uint8_t *)text, len, allow_special);
    tok_bpe_work_free(&c.work);
    if (rc != 0) {
        free(c.out.v);
        return -1;
    }
    *ids = c.out.v;
    *n_ids = c.out.n;
    return 0;
}

/* ---- accessors ------------------------------------------------------------- */

int32_t specd_tokenizer_n_vocab(const specd_tokenizer *t) { return t->n_vocab; }
int32_t specd_tokenizer_bos(const specd_tokenizer *t) { return t->bos; }
int32_t specd_tokenizer_eos(const specd_tokenizer *t) { return t->eos; }

int specd_tokenizer_end_ids(const specd_tokenizer *t, int32_t out[SPECD_TOKENIZER_MAX_END]) {
    int32_t cand[SPECD_TOKENIZER_MAX_END] = {
        t->eos,
        specd_tokenizer_token_id(t, "<|im_end|>"),
        specd_tokenizer_token_id(t, "<|endoftext|>"),
        specd_tokenizer_token_id(t, "<|eot_id|>"),
        specd_tokenizer_token_id(t, "<|eom_id|>"),
        specd_tokenizer_token_id(t, "<|end_of_text|>"),
    };
    int n = 0;
    for (int i = 0; i < SPECD_TOKENIZER_MAX_END; i++) {
        int dup = cand[i] < 0;
        for (int j = 0; j < n && !dup; j++) dup = out[j] == cand[i];
        if (!dup) out[n++] = cand[i];
    }
    return n;
}

int specd_tokenizer_add_bos(const specd_tokenizer *t, int32_t **ids, size_t *n_ids) {
    int32_t bos = specd_tokenizer_bos(t);
    if (!specd_tokenizer_wants_bos(t) || bos < 0 || (*n_ids > 0 && (*ids)[0] == bos)) return 0;
    int32_t *with_bos = realloc(*ids, sizeof(int32_t) * (*n_ids + 1));
    if (!with_bos) return -1;
    memmove(with_bos + 1, with_bos, sizeof(int32_t) * *n_ids);
    with_bos[0] = bos;
    *ids = with_bos;
    (*n_ids)++;
    return 0;
}

int specd_tokenizer_is_end(const specd_tokenizer *t, int32_t id) {
    int32_t ends[SPECD_TOKENIZER_MAX_END];
    int n = specd_tokenizer_end_ids(t, ends);
    for (int i = 0; i < n; i++)
        if (ends[i] == id) return 1;
    return 0;
}
int specd_tokenizer_wants_bos(const specd_tokenizer *t) { return t->wants_bos && t->bos >= 0; }

int specd_tokenizer_is_special(const specd_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->tokens[id].kind == TOK_CONTROL;
}

int32_t specd_tokenizer_token_id(const specd_tokenizer *t, const char *text) {
    return tok_strmap_get(&t->all_tokens, text, strlen(text));
}

const uint8_t *specd_token_bytes(const specd_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    const tok_entry *e = &t->tokens[id];
    *len = e->n_bytes;
    /* An id no token uses (a hole in a sparse vocabulary) decodes to "". */
    return e->bytes ? e->bytes : (const uint8_t *)"";
}

/* ---- from a model ---------------------------------------------------------- */

specd_tokenizer *specd_tokenizer_from_model(const specd_model_file *m, specd_error *err) {
    if (m->format == SPECD_FORMAT_GGUF) {
        if (!m->gguf) {
            specd_seterr(err, "%s: GGUF metadata is not open", m->path);
            return NULL;
        }
        specd_tokenizer *t = specd_tokenizer_from_gguf(m->gguf, err);
        if (!t) {
            specd_preferr(err, "%s", m->path);
            return NULL;
        }
        /* The template travels with the tokenizer so every service renders
         * chat input as the model expects (SmolLM2's injects its default
         * system prompt); absent = generic ChatML. */
        t->chat_template = gguf_get_str(m->gguf, "tokenizer.chat_template", NULL);
        return t;
    }
    if (m->tokenizer_json[0] == '\0') {
        specd_seterr(err, "%s: the model directory has no tokenizer.json", m->path);
        return NULL;
    }
    specd_tokenizer *t = specd_tokenizer_from_json(m->tokenizer_json, err);
    if (!t) return NULL;
    /* config.json's ids win over tokenizer_config.json's strings. */
    if (m->hp.bos_id >= 0 && m->hp.bos_id < t->n_vocab) t->bos = m->hp.bos_id;
    if (m->hp.eos_id >= 0 && m->hp.eos_id < t->n_vocab) t->eos = m->hp.eos_id;
    return t;
}

void specd_tokenizer_sha256_hex(const specd_tokenizer *t, char hex[65]) {
    specd_sha256 h;
    uint8_t d[32];
    specd_sha256_init(&h);
    for (int32_t id = 0; id < specd_tokenizer_n_vocab(t); id++) {
        size_t len = 0;
        const uint8_t *p = specd_token_bytes(t, id, &len);
        if (p) specd_sha256_update(&h, p, len);
    }
    specd_sha256_final(&h, d);
    specd_sha256_to_hex(d, hex);
}

const char *specd_tokenizer_chat_template(const specd_tokenizer *t) { return t->chat_template; }
