/* bpe.c - byte-pair merges: the rank table and the merge loop.
 *
 * A piece starts as one token per byte. Repeatedly, the adjacent pair with
 * the lowest merge rank (leftmost on ties) is replaced by the merged token,
 * until no adjacent pair has a merge. This is the algorithm of Hugging Face's
 * BPE model (Word::merge_all), including how it skips stale queue entries, so
 * ids match it exactly. A binary heap of candidate pairs over a linked list of
 * symbols makes it O(n log n) in the piece length. */
#include <stdlib.h>
#include <string.h>

#include "common/text/tokenizer_internal.h"

static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

int tok_add_merge(specd_tokenizer *t, const char *left, size_t left_len, const char *right,
                  size_t right_len, uint32_t rank, specd_error *err) {
    int32_t a = tok_strmap_get(&t->model_vocab, left, left_len);
    int32_t b = tok_strmap_get(&t->model_vocab, right, right_len);
    if (a < 0 || b < 0)
        return specd_seterr(err, "merge %u ('%.*s' '%.*s'): '%.*s' is not in the vocabulary",
                            rank, (int)left_len, left, (int)right_len, right,
                            (int)(a < 0 ? left_len : right_len), a < 0 ? left : right);
    if (left_len + right_len > TOK_MAX_TOKEN_LEN)
        return specd_seterr(err, "merge %u: merged token is too long", rank);
    char joined[TOK_MAX_TOKEN_LEN];
    memcpy(joined, left, left_len);
    memcpy(joined + left_len, right, right_len);
    int32_t merged = tok_strmap_get(&t->model_vocab, joined, left_len + right_len);
    if (merged < 0)
        return specd_seterr(err, "merge %u ('%.*s' '%.*s'): merged token '%.*s' is not in the "
                            "vocabulary", rank, (int)left_len, left, (int)right_len, right,
                            (int)(left_len + right_len), joined);
    /* A repeated pair keeps its last rank, as Hugging Face's map does. */
    if (tok_u64map_put(&t->merges, pair_key(a, b), (uint64_t)rank << 32 | (uint32_t)merged) != 0)
        return specd_seterr(err, "out of memory reading merges");
    return 0;
}

/* ---- candidate heap ------------------------------------------------------ */

/* A candidate is (rank << 32 | position of its left symbol): one integer
 * compare orders by rank, then leftmost, and 8-byte entries keep the heap
 * cache-friendly on long pieces. The merged token is not stored: when a
 * candidate is popped, the pair now at that position must still have the
 * same rank. That is equivalent to Hugging Face's "same merged id" check,
 * because symbols only grow rightwards, so the pair at a position can
 * produce the same merged string only if it is the same pair. */
typedef uint64_t merge_cand;

static int heap_push(tok_bpe_work *w, merge_cand c) {
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        merge_cand *v = realloc(w->heap, cap * sizeof *v);
        if (!v) return -1;
        w->heap = v;
        w->heap_cap = cap;
    }
    merge_cand *v = w->heap;
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (v[parent] <= c) break;
        v[i] = v[parent];
        i = parent;
    }
    v[i] = c;
    return 0;
}

/* Bottom-up deletion: walk the hole down along smaller children without
 * comparing against the moved element, then sift that element up (it
 * usually belongs near the bottom); about half the comparisons. */
static merge_cand heap_pop(tok_bpe_work *w) {
    merge_cand *v = w->heap;
    merge_cand top = v[0], last = v[--w->heap_n];
    size_t n = w->heap_n, i = 0;
    if (n == 0) return top;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && v[child + 1] < v[child]) child++;
        v[i] = v[child];
        i = child;
    }
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (v[parent] <= last) break;
        v[i] = v[parent];
        i = parent;
    }
    v[i] = last;
    return top;
}

/* ---- the merge loop ------------------------------------------------------ */

static int work_reserve(tok_bpe_work *w, size_t n) {
    if (n <= w->cap) return 0;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *sym = realloc(w->sym, cap * sizeof *sym);
    if (sym) w->sym = sym;
    int32_t *prev = realloc(w->prev, cap * sizeof *prev);
    if (prev) w->prev = prev;
    int32_t *next = realloc(w->next, cap * sizeof *next);
    if (next) w->next = next;
    uint8_t *dead = realloc(w->dead, cap);
    if (dead) w->dead = dead;
    if (!sym || !prev || !next || !dead) return -1;
    w->cap = cap;
    return 0;
}

/* Queues the pair that starts at symbol `left`, if it has a merge. */
static int push_pair(const specd_tokenizer *t, tok_bpe_work *w, int32_t left) {
    if (left < 0 || w->next[left] < 0) return 0;
    uint64_t m;
    if (!tok_u64map_get(&t->merges, pair_key(w->sym[left], w->sym[w->next[left]]), &m))
        return 0;
    return heap_push(w, (m & 0xFFFFFFFF00000000ull) | (uint32_t)left);
}

/* One symbol per byte. A byte the vocabulary lacks becomes the unknown
 * token, or (no unk token) is dropped, as Hugging Face does; SmolLM2's
 * vocabulary really lacks 21 of the 256 bytes. Returns the symbol count. */
static size_t initial_symbols(const specd_tokenizer *t, tok_bpe_work *w, const uint8_t *piece,
                              size_t len) {
    size_t n = 0;
    int last_was_unk = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = t->byte_token[piece[i]];
        if (id < 0) {
            if (t->unk < 0 || (t->fuse_unk && last_was_unk)) continue;
            id = t->unk;
            last_was_unk = 1;
        } else {
            last_was_unk = 0;
        }
        w->sym[n] = id;
        w->prev[n] = (int32_t)n - 1;
        w->next[n] = (int32_t)n + 1;
        w->dead[n] = 0;
        n++;
    }
    if (n > 0) w->next[n - 1] = -1;
    return n;
}

/* Applies the best merge repeatedly. Stale candidates (a symbol that died,
 * or a pair that changed since it was queued) are skipped on pop. */
static int merge_all(const specd_tokenizer *t, tok_bpe_work *w, size_t n) {
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (push_pair(t, w, (int32_t)i) != 0) return -1;
    while (w->heap_n > 0) {
        merge_cand c = heap_pop(w);
        int32_t left = (int32_t)(uint32_t)c, right = w->next[left];
        if (w->dead[left] || right < 0) continue;
        uint64_t m;
        if (!tok_u64map_get(&t->merges, pair_key(w->sym[left], w->sym[right]), &m) ||
            (m >> 32) != (c >> 32))
            continue;
        w->sym[left] = (int32_t)(uint32_t)m;
        w->dead[right] = 1;
        w->next[left] = w->next[right];
        if (w->next[right] >= 0) w->prev[w->next[right]] = left;
        if (push_pair(t, w, w->prev[left]) != 0 || push_pair(t, w, left) != 0) return -1;
    }
    return 0;
}

/* ignore_merges (Llama 3): a piece that is itself a vocabulary token is
 * emitted whole. Returns 1 if it was, 0 if not, -1 on no memory. */
static int whole_piece_token(const specd_tokenizer *t, tok_bpe_work *w, const uint8_t *piece,
                             size_t len, tok_ids *out) {
    if (len > TOK_MAX_TOKEN_LEN) return 0;
    if (w->text_cap < 2 * len) {
        char *text = realloc(w->text, 2 * len);
        if (!text) return -1;
        w->text = text;
        w->text_cap = 2 * len;
    }
    size_t text_len = tok_bytes_to_text(piece, len, w->text);
    int32_t id = tok_strmap_get(&t->model_vocab, w->text, text_len);
    if (id < 0) return 0;
    return tok_ids_push(out, id) == 0 ? 1 : -1;
}

int tok_bpe_piece(const specd_tokenizer *t, tok_bpe_work *w, const uint8_t *piece, size_t len,
                  tok_ids *out) {
    if (t->ignore_merges) {
        int whole = whole_piece_token(t, w, piece, len, out);
        if (whole != 0) return whole < 0 ? -1 : 0;
    }
    if (len > INT32_MAX) return -1;
    if (work_reserve(w, len) != 0) return -1;
    size_t n = initial_symbols(t, w, piece, len);
    if (n == 0) return 0;
    if (merge_all(t, w, n) != 0) return -1;
    for (int32_t i = 0; i >= 0; i = w->next[i])
        if (tok_ids_push(out, w->sym[i]) != 0) return -1;
    return 0;
}

void tok_bpe_work_free(tok_bpe_work *w) {
    free(w->sym);
    free(w->prev);
    free(w->next);
    free(w->dead);
    free(w->heap);
    free(w->text);
    memset(w, 0, sizeof *w);
}
