/* tokenizer.h - byte-level BPE tokenizer (GPT-2 / Llama-3 / SmolLM family).
 *
 * A tokenizer loads from GGUF metadata (tokenizer.ggml.*) or from a Hugging
 * Face tokenizer.json and produces exactly the ids the Hugging Face
 * `tokenizers` library produces for the same configuration:
 *
 *   text -> split out special tokens -> pre-tokenize (regex / digit splits)
 *        -> map each piece's bytes to initial tokens -> apply BPE merges.
 *
 * Everything works on bytes, so any input (including invalid UTF-8) is
 * tokenized; no BOS/EOS is ever added automatically. Decoding reverses the
 * GPT-2 byte-to-unicode mapping; the streaming decoder (specd_detok) only
 * ever hands out complete UTF-8 characters.
 *
 * A loaded tokenizer is read-only: one instance can serve many threads. */
#ifndef SPECD_TOKENIZER_H
#define SPECD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"

struct gguf_file;
struct specd_model_file;

typedef struct specd_tokenizer specd_tokenizer;

/* Inputs longer than this are rejected by specd_tokenize. */
#define SPECD_TOKENIZE_MAX_INPUT ((size_t)64 << 20)

/* From GGUF metadata: tokenizer.ggml.model must be "gpt2"; the pre-tokenizer
 * is chosen from tokenizer.ggml.pre as llama.cpp does. */
specd_tokenizer *specd_tokenizer_from_gguf(const struct gguf_file *f, specd_error *err);
/* From a Hugging Face tokenizer.json. BOS comes from its post-processor
 * template; BOS/EOS and add_bos_token from a tokenizer_config.json in the
 * same directory when there is one (else -1). */
specd_tokenizer *specd_tokenizer_from_json(const char *path, specd_error *err);
/* Same, from a buffer (used by the fuzz target); no tokenizer_config.json. */
specd_tokenizer *specd_tokenizer_from_json_mem(const char *json, size_t len, specd_error *err);
/* GGUF model -> its metadata; Hugging Face directory -> its tokenizer.json,
 * with BOS/EOS taken from config.json when it names them. */
specd_tokenizer *specd_tokenizer_from_model(const struct specd_model_file *m, specd_error *err);
void specd_tokenizer_free(specd_tokenizer *t);
/* Changes the input limit (default SPECD_TOKENIZE_MAX_INPUT). Call before
 * sharing the tokenizer between threads. */
void specd_tokenizer_set_max_input(specd_tokenizer *t, size_t max_bytes);

/* Tokenizes len bytes of text into a malloc'd array (*ids, caller frees;
 * NULL when *n_ids == 0). With allow_special, the text of special (control)
 * tokens such as "<|im_end|>" becomes that token; without it, it is tokenized
 * as ordinary text. Returns 0, or -1 with a message. */
int specd_tokenize(const specd_tokenizer *t, const char *text, size_t len, int allow_special,
                   int32_t **ids, size_t *n_ids, specd_error *err);

int32_t specd_tokenizer_n_vocab(const specd_tokenizer *t);
int32_t specd_tokenizer_bos(const specd_tokenizer *t); /* -1 if none */
int32_t specd_tokenizer_eos(const specd_tokenizer *t); /* -1 if none */
/* The tokens that end a generation: EOS and, where the vocabulary has them,
 * the chat families' end-of-turn and end-of-text markers (ChatML's
 * <|im_end|> and <|endoftext|>; Llama 3's <|eot_id|>, <|eom_id|> and
 * <|end_of_text|>, the three its generation_config.json lists), since a GGUF
 * file names only one of them as EOS. Writes up to SPECD_TOKENIZER_MAX_END
 * distinct ids and returns how many. */
#define SPECD_TOKENIZER_MAX_END 6
int specd_tokenizer_end_ids(const specd_tokenizer *t, int32_t out[SPECD_TOKENIZER_MAX_END]);
/* 1 if id is one of specd_tokenizer_end_ids(). */
int specd_tokenizer_is_end(const specd_tokenizer *t, int32_t id);
/* 1 if the model expects prompts to start with BOS (Llama 3 does, SmolLM2
 * does not): GGUF tokenizer.ggml.add_bos_token, or a tokenizer.json
 * post-processor / tokenizer_config.json that adds it. specd_tokenize never
 * adds it; callers prepend specd_tokenizer_bos() when this says so. */
int specd_tokenizer_wants_bos(const specd_tokenizer *t);
/* Puts BOS before *ids (realloc'd) where the model wants one and the ids do
 * not already start with it: a chat template that writes BOS itself (Llama
 * 3's) or a prompt that spells it must not get a second one. 0, or -1 when
 * out of memory (*ids unchanged). */
int specd_tokenizer_add_bos(const specd_tokenizer *t, int32_t **ids, size_t *n_ids);
/* 1 for control / special tokens (GGUF token_type 3, tokenizer.json added
 * tokens with "special": true). */
int specd_tokenizer_is_special(const specd_tokenizer *t, int32_t id);
/* The id of the token whose vocabulary string is exactly `text` (for special
 * tokens that is their text, e.g. "<|im_end|>"; ordinary tokens are spelled
 * in the byte-level alphabet, e.g. "Ġthe"); -1 if there is none. */
int32_t specd_tokenizer_token_id(const specd_tokenizer *t, const char *text);

/* The raw bytes a token stands for (special tokens: their text); NULL for an
 * id outside the vocabulary. Not NUL-terminated; owned by the tokenizer. */
const uint8_t *specd_token_bytes(const specd_tokenizer *t, int32_t id, size_t *len);

/* The model's chat template (a Jinja string from GGUF
 * tokenizer.chat_template) for specd_chat_render, or NULL (generic ChatML). */
const char *specd_tokenizer_chat_template(const specd_tokenizer *t);

/* Fingerprint of the vocabulary (Info.tokenizer_sha256): hex SHA-256 over
 * every token's byte string, concatenated in id order, into hex[65]. Two
 * tokenizers with the same fingerprint map ids to the same bytes, which is
 * what draft-svc and target-svc must agree on. */
void specd_tokenizer_sha256_hex(const specd_tokenizer *t, char hex[65]);

/* Decodes a whole sequence into a malloc'd, NUL-terminated UTF-8 string,
 * replacing invalid sequences with U+FFFD (as Hugging Face decode() does).
 * NULL with a message for an id outside the vocabulary. */
char *specd_detokenize(const specd_tokenizer *t, const int32_t *ids, size_t n, size_t *len,
                       specd_error *err);

/* Streaming decoder: push ids one at a time, get back the text that became
 * complete. Bytes of an unfinished UTF-8 character are held until the next
 * token completes it (or proves it invalid: then U+FFFD, like decode()). */
typedef struct specd_detok {
    const specd_tokenizer *tok;
    uint8_t pending[4]; /* a valid but unfinished UTF-8 prefix */
    size_t n_pending;
    char *out;          /* returned text; reused by every call */
    size_t out_cap;
    char tail[4];       /* what flush returns: U+FFFD or "" */
} specd_detok;

void specd_detok_init(specd_detok *d, const specd_tokenizer *t);
/* Returns NUL-terminated valid UTF-8 (possibly ""), owned by d and valid until
 * the next call; *len gets its length. NULL with a message for an id outside
 * the vocabulary or when out of memory. */
const char *specd_detok_push(specd_detok *d, int32_t id, size_t *len, specd_error *err);
/* Ends the stream: a held unfinished character comes out as U+FFFD. */
const char *specd_detok_flush(specd_detok *d, size_t *len);
void specd_detok_free(specd_detok *d);

#endif
