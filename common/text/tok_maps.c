/* tok_maps.c - the two open-addressing hash maps the tokenizer needs:
 * token string -> id (vocabulary lookups) and uint64 -> uint64 (merge pairs,
 * trie edges). Linear probing, grown at 50% load so probes stay short. */
#include <stdlib.h>
#include <string.h>

#include "common/text/tokenizer_internal.h"

static uint64_t hash_bytes(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- string -> int32 ----------------------------------------------------- */

static size_t strmap_slot(const tok_strmap *m, const char *key, size_t len) {
    size_t mask = m->cap - 1;
    size_t i = (size_t)hash_bytes(key, len) & mask;
    while (m->keys[i] &&
           (m->key_lens[i] != len || memcmp(m->keys[i], key, len) != 0))
        i = (i + 1) & mask;
    return i;
}

static int strmap_grow(tok_strmap *m) {
    tok_strmap bigger = {0};
    bigger.cap = m->cap ? m->cap * 2 : 64;
    bigger.keys = calloc(bigger.cap, sizeof *bigger.keys);
    bigger.key_lens = malloc(bigger.cap * sizeof *bigger.key_lens);
    bigger.vals = malloc(bigger.cap * sizeof *bigger.vals);
    if (!bigger.keys || !bigger.key_lens || !bigger.vals) {
        tok_strmap_free(&bigger);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = strmap_slot(&bigger, m->keys[i], m->key_lens[i]);
        bigger.keys[j] = m->keys[i];
        bigger.key_lens[j] = m->key_lens[i];
        bigger.vals[j] = m->vals[i];
    }
    bigger.n = m->n;
    tok_strmap_free(m);
    *m = bigger;
    return 0;
}

int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m) != 0) return -1;
    size_t i = strmap_slot(m, key, len);
    if (!m->keys[i]) {
        m->keys[i] = key;
        m->key_lens[i] = (uint32_t)len;
        m->n++;
    }
    m->vals[i] = val;
    return 0;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
    if (m->cap == 0) return -1;
    size_t i = strmap_slot(m, key, len);
    return m->keys[i] ? m->vals[i] : -1;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->keys);
    free(m->key_lens);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- uint64 -> uint64 ---------------------------------------------------- */

#define EMPTY_KEY UINT64_MAX

static size_t u64map_slot(const tok_u64map *m, uint64_t key) {
    size_t mask = m->cap - 1;
    size_t i = (size_t)hash_u64(key) & mask;
    while (m->keys[i] != EMPTY_KEY && m->keys[i] != key) i = (i + 1) & mask;
    return i;
}

static int u64map_grow(tok_u64map *m) {
    tok_u64map bigger = {0};
    bigger.cap = m->cap ? m->cap * 2 : 64;
    bigger.keys = malloc(bigger.cap * sizeof *bigger.keys);
    bigger.vals = malloc(bigger.cap * sizeof *bigger.vals);
    if (!bigger.keys || !bigger.vals) {
        tok_u64map_free(&bigger);
        return -1;
    }
    memset(bigger.keys, 0xFF, bigger.cap * sizeof *bigger.keys); /* all EMPTY_KEY */
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == EMPTY_KEY) continue;
        size_t j = u64map_slot(&bigger, m->keys[i]);
        bigger.keys[j] = m->keys[i];
        bigger.vals[j] = m->vals[i];
    }
    bigger.n = m->n;
    tok_u64map_free(m);
    *m = bigger;
    return 0;
}

int tok_u64map_put(tok_u64map *m, uint64_t key, uint64_t val) {
    if ((m->n + 1) * 2 > m->cap && u64map_grow(m) != 0) return -1;
    size_t i = u64map_slot(m, key);
    if (m->keys[i] == EMPTY_KEY) {
        m->keys[i] = key;
        m->n++;
    }
    m->vals[i] = val;
    return 0;
}

int tok_u64map_get(const tok_u64map *m, uint64_t key, uint64_t *val) {
    if (m->cap == 0) return 0;
    size_t i = u64map_slot(m, key);
    if (m->keys[i] == EMPTY_KEY) return 0;
    *val = m->vals[i];
    return 1;
}

void tok_u64map_free(tok_u64map *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}
