/* tokenizer_internal.h - the pieces of the tokenizer, shared by its files.
 *
 *   tok_maps.c       hash maps (token string -> id, token pair -> merge)
 *   tok_bytelevel.c  GPT-2's byte <-> printable-unicode alphabet
 *   tok_special.c    finding special tokens inside text (a byte trie)
 *   pretokenize.c    pre-tokenizer steps (regex splits) built on PCRE2
 *   bpe.c            merge ranks and the BPE merge loop
 *   tokenizer.c      vocabulary building, the tokenize pipeline, accessors
 *   tokenizer_gguf.c / tokenizer_json.c   the two loaders
 *   detok.c          decoding, whole and streaming
 * Not part of the public API. */
#ifndef SPECD_TOKENIZER_INTERNAL_H
#define SPECD_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"
#include "common/text/tokenizer.h"

/* Vocabulary ids above this are treated as corruption (real vocabularies
 * are < 300k; this keeps a hostile file from making us allocate gigabytes). */
#define TOK_MAX_VOCAB (1 << 22)
/* Unused ids a tokenizer.json may leave below its largest id, beyond one per
 * defined token (see count_vocab in tokenizer_json.c): real files leave a
 * handful, a hostile one could otherwise size the vocabulary by one id. */
#define TOK_MAX_VOCAB_HOLES 1024
/* Bytes in one token string. */
#define TOK_MAX_TOKEN_LEN 4096
/* Pre-tokenizer steps in one pipeline. */
#define TOK_MAX_PRETOK_STEPS 8

/* ---- hash maps (tok_maps.c) ---------------------------------------------- */

/* Byte string -> int32. Keys are not copied: they must outlive the map. */
typedef struct tok_strmap {
    const char **keys;
    uint32_t *key_lens;
    int32_t *vals;
    size_t cap; /* power of two; 0 when empty */
    size_t n;
} tok_strmap;

int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val); /* -1: no memory */
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len);   /* -1: absent */
void tok_strmap_free(tok_strmap *m);

/* uint64 -> uint64; the key UINT64_MAX is reserved. */
typedef struct tok_u64map {
    uint64_t *keys;
    uint64_t *vals;
    size_t cap;
    size_t n;
} tok_u64map;

int tok_u64map_put(tok_u64map *m, uint64_t key, uint64_t val); /* overwrites; -1: no memory */
int tok_u64map_get(const tok_u64map *m, uint64_t key, uint64_t *val); /* 1 found, 0 absent */
void tok_u64map_free(tok_u64map *m);

/* ---- byte-level alphabet (tok_bytelevel.c) -------------------------------- */

/* GPT-2 spells every byte as a printable code point so that vocabularies
 * are text: printable Latin-1 bytes stand for themselves, the other 68
 * bytes map to U+0100.. in order (space -> U+0120 'Ġ', '\n' -> U+010A 'Ċ'). */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 if cp is not in the alphabet */
/* Byte-level spelling of raw bytes into out (needs 2*n bytes); returns the
 * length written. */
size_t tok_bytes_to_text(const uint8_t *bytes, size_t n, char *out);
/* Reverses the spelling as the Hugging Face ByteLevel decoder does: if every
 * character is in the alphabet, writes the bytes and returns their count;
 * otherwise returns -1 (the caller then uses the text as it is). out needs
 * len bytes. */
long tok_text_to_bytes(const char *text, size_t len, uint8_t *out);

/* ---- special tokens (tok_special.c) -------------------------------------- */

/* A byte trie over the strings of added tokens; finds the leftmost-longest
 * match like the Aho-Corasick matcher Hugging Face uses. */
typedef struct tok_trie {
    tok_u64map edges;   /* (node << 8 | byte) -> child node */
    int32_t *node_token; /* token ending at node, or -1 */
    uint8_t *node_always; /* 1 if that token matches even without allow_special */
    size_t n_nodes, cap_nodes;
    uint8_t first[256];   /* 1 if some token starts with this byte (fast skip) */
} tok_trie;

int tok_trie_add(tok_trie *tr, const uint8_t *s, size_t len, int32_t id, int always);
/* Longest token starting at s (allowed by allow_special); returns its length
 * (0 if none) and sets *id. */
size_t tok_trie_match(const tok_trie *tr, const uint8_t *s, size_t n, int allow_special,
                      int32_t *id);
void tok_trie_free(tok_trie *tr);

/* ---- pre-tokenizer (pretokenize.c) --------------------------------------- */

typedef enum tok_pretok_kind {
    TOK_PRETOK_REGEX = 1,        /* split into matches and the gaps between them */
    TOK_PRETOK_PREFIX_SPACE = 2, /* prepend ' ' to a piece not starting with one */
} tok_pretok_kind;

typedef struct tok_pretok_step {
    tok_pretok_kind kind;
    void *code; /* pcre2_code * (REGEX) */
} tok_pretok_step;

/* Well-known patterns, written in Hugging Face (Oniguruma) syntax. */
extern const char TOK_REGEX_GPT2[];
extern const char TOK_REGEX_LLAMA3[];
extern const char TOK_REGEX_DIGIT[];  /* one digit */
extern const char TOK_REGEX_DIGITS[]; /* a run of digits */

/* Compiles an Oniguruma-syntax pattern with PCRE2 into a step. */
int tok_pretok_regex(tok_pretok_step *step, const char *pattern, size_t len, specd_error *err);
void tok_pretok_free(tok_pretok_step *step);

/* Called with each final piece. Returns 0 to go on, -1 to stop. */
typedef int (*tok_piece_fn)(void *ctx, const uint8_t *piece, size_t len);

/* Runs steps [0, n_steps) over text, depth first, calling fn for each final
 * non-empty piece in order. -1 with a message on failure. */
int tok_pretokenize(const tok_pretok_step *steps, size_t n_steps, const uint8_t *text,
                    size_t len, tok_piece_fn fn, void *ctx, specd_error *err);

/* ---- the tokenizer -------------------------------------------------------- */

typedef enum tok_kind {
    TOK_NORMAL = 0,  /* spelled in the byte-level alphabet */
    TOK_CONTROL = 1, /* special: its text, matched only with allow_special */
    TOK_ADDED = 2,   /* user-defined / non-special added: its text, always matched */
} tok_kind;

typedef struct tok_entry {
    char *text;     /* vocabulary string, NUL-terminated; NULL for an unused id */
    uint32_t text_len;
    uint8_t *bytes; /* raw bytes it decodes to (may alias text) */
    uint32_t n_bytes;
    uint8_t kind;
    uint8_t in_model; /* takes part in BPE (is in the model vocabulary) */
} tok_entry;

struct specd_tokenizer {
    /* the model's chat template, or NULL: GGUF tokenizer.chat_template, or
     * tokenizer_config.json's / chat_template.jinja beside a tokenizer.json */
    char *chat_template;
    tok_entry *tokens;
    int32_t n_vocab;
    tok_strmap model_vocab;   /* BPE vocabulary: string -> id */
    tok_strmap all_tokens;    /* every token string -> id (token_id lookup) */
    tok_u64map merges;        /* (left << 32 | right) -> (rank << 32 | merged) */
    int32_t byte_token[256];  /* initial token of each byte; -1 if the vocab lacks it */
    tok_trie specials;
    tok_pretok_step steps[TOK_MAX_PRETOK_STEPS];
    size_t n_steps;
    int ignore_merges;        /* a piece that is itself a token skips merging */
    int fuse_unk;             /* consecutive unknown bytes give one unk token */
    int has_byte_level;       /* a ByteLevel pre-tokenizer was configured */
    int32_t bos, eos, unk;
    int wants_bos;            /* prompts should start with bos (not added by us) */
    size_t max_input;         /* longest text specd_tokenize accepts */
};

/* Building (tokenizer.c), in this order: tok_new, tok_set_token for each
 * id, tok_index_vocab, tok_add_merge for each merge, pre-tokenizer steps,
 * tok_index_specials. */
specd_tokenizer *tok_new(int64_t n_vocab, specd_error *err);
int tok_set_token(specd_tokenizer *t, int64_t id, const char *text, size_t len, tok_kind kind,
                  int in_model, specd_error *err);
int tok_index_vocab(specd_tokenizer *t, specd_error *err);
int tok_add_pretok_step(specd_tokenizer *t, tok_pretok_step step, specd_error *err);
int tok_index_specials(specd_tokenizer *t, specd_error *err);

/* bpe.c */
int tok_add_merge(specd_tokenizer *t, const char *left, size_t left_len, const char *right,
                  size_t right_len, uint32_t rank, specd_error *err);

/* Growable id list used while tokenizing. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

int tok_ids_push(tok_ids *ids, int32_t id);

/* Scratch space for the merge loop, reused across pieces. */
typedef struct tok_bpe_work {
    int32_t *sym;      /* token id of each live symbol */
    int32_t *prev, *next;
    uint8_t *dead;
    size_t cap;
    uint64_t *heap;    /* merge candidates (a binary heap, see bpe.c) */
    size_t heap_n, heap_cap;
    char *text;        /* byte-level spelling of a piece (ignore_merges) */
    size_t text_cap;
} tok_bpe_work;

/* Appends the BPE tokens of one pre-tokenized piece. -1: out of memory. */
int tok_bpe_piece(const specd_tokenizer *t, tok_bpe_work *w, const uint8_t *piece, size_t len,
                  tok_ids *out);
void tok_bpe_work_free(tok_bpe_work *w);

#endif
