/* kv_pool.c - the shared KV page pool and its prefix cache (see kv_pool.h).
 *
 * Everything is an index array over page ids, allocated once: reference
 * counts, keys, the tokens each keyed page holds, a chained hash table
 * (bucket heads + a next link per page), the LRU list of cached pages
 * (doubly linked: a reused page leaves it from the middle) and the free
 * stack. Every operation is O(1) except lookup's short chain walk. */
#include "common/model/kv_pool.h"

#include <stdlib.h>
#include <string.h>

#define ROWS SPECD_KV_PAGE_ROWS

struct specd_kv_pool {
    int n;
    int *refs;
    uint8_t *keyed;
    uint64_t *key, *parent;
    int32_t *tokens; /* [n][ROWS], valid while keyed */
    int32_t *bucket; /* [n_buckets] first page of the chain, -1 = none */
    int32_t *hnext;  /* next page in the same bucket */
    uint32_t bucket_mask;
    int32_t *lprev, *lnext; /* LRU of cached pages: head = least recent */
    int32_t lru_head, lru_tail;
    int n_cached;
    int32_t *fstack; /* free pages, top at n_free - 1 */
    int n_free;
    uint64_t lookup_pages, hit_pages, evictions;
};

/* splitmix64's finalizer: every input bit reaches every output bit. */
static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t specd_kv_page_key(uint64_t parent, const int32_t *tokens) {
    uint64_t h = mix(parent ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < ROWS; i++) h = mix(h ^ (uint32_t)tokens[i]) + (uint64_t)i;
    /* 0 is the "no parent" value: never a page's own key */
    return h ? h : 1;
}

specd_kv_pool *specd_kv_pool_create(int n_pages, specd_error *err) {
    if (n_pages < 1) {
        specd_seterr(err, "kv pool: %d pages", n_pages);
        return NULL;
    }
    specd_kv_pool *p = calloc(1, sizeof *p);
    uint32_t nb = 1;
    while (nb < 2u * (uint32_t)n_pages) nb <<= 1;
    size_t n = (size_t)n_pages;
    if (p) {
        p->n = n_pages;
        p->refs = calloc(n, sizeof(int));
        p->keyed = calloc(n, 1);
        p->key = calloc(n, sizeof(uint64_t));
        p->parent = calloc(n, sizeof(uint64_t));
        p->tokens = malloc(n * ROWS * sizeof(int32_t));
        p->bucket = malloc(nb * sizeof(int32_t));
        p->hnext = malloc(n * sizeof(int32_t));
        p->lprev = malloc(n * sizeof(int32_t));
        p->lnext = malloc(n * sizeof(int32_t));
        p->fstack = malloc(n * sizeof(int32_t));
    }
    if (!p || !p->refs || !p->keyed || !p->key || !p->parent || !p->tokens || !p->bucket ||
        !p->hnext || !p->lprev || !p->lnext || !p->fstack) {
        specd_kv_pool_free(p);
        specd_seterr(err, "kv pool: out of memory for the tables of %d pages", n_pages);
        return NULL;
    }
    p->bucket_mask = nb - 1;
    for (uint32_t i = 0; i < nb; i++) p->bucket[i] = -1;
    p->lru_head = p->lru_tail = -1;
    /* popping from the end hands out page 0 first */
    for (int i = 0; i < n_pages; i++) p->fstack[i] = n_pages - 1 - i;
    p->n_free = n_pages;
    return p;
}

void specd_kv_pool_free(specd_kv_pool *p) {
    if (!p) return;
    free(p->refs);
    free(p->keyed);
    free(p->key);
    free(p->parent);
    free(p->tokens);
    free(p->bucket);
    free(p->hnext);
    free(p->lprev);
    free(p->lnext);
    free(p->fstack);
    free(p);
}

/* --- the LRU list and the hash table ----------------------------------------- */

static void lru_remove(specd_kv_pool *p, int32_t pg) {
    if (p->lprev[pg] >= 0) p->lnext[p->lprev[pg]] = p->lnext[pg];
    else p->lru_head = p->lnext[pg];
    if (p->lnext[pg] >= 0) p->lprev[p->lnext[pg]] = p->lprev[pg];
    else p->lru_tail = p->lprev[pg];
    p->n_cached--;
}

static void lru_append(specd_kv_pool *p, int32_t pg) {
    p->lprev[pg] = p->lru_tail;
    p->lnext[pg] = -1;
    if (p->lru_tail >= 0) p->lnext[p->lru_tail] = pg;
    else p->lru_head = pg;
    p->lru_tail = pg;
    p->n_cached++;
}

static int32_t *chain_of(specd_kv_pool *p, uint64_t key) {
    return &p->bucket[(uint32_t)(key ^ (key >> 32)) & p->bucket_mask];
}

static void unhash(specd_kv_pool *p, int32_t pg) {
    int32_t *pp = chain_of(p, p->key[pg]);
    while (*pp >= 0 && *pp != pg) pp = &p->hnext[*pp];
    if (*pp == pg) *pp = p->hnext[pg];
    p->keyed[pg] = 0;
}

static int32_t find(const specd_kv_pool *p, uint64_t key, uint64_t parent,
                    const int32_t *tokens) {
    int32_t pg = p->bucket[(uint32_t)(key ^ (key >> 32)) & p->bucket_mask];
    for (; pg >= 0; pg = p->hnext[pg])
        if (p->key[pg] == key && p->parent[pg] == parent &&
            !memcmp(p->tokens + (size_t)pg * ROWS, tokens, ROWS * sizeof(int32_t)))
            return pg;
    return -1;
}

/* --- the page life cycle ------------------------------------------------------- */

int32_t specd_kv_pool_alloc(specd_kv_pool *p) {
    int32_t pg;
    if (p->n_free > 0) {
        pg = p->fstack[--p->n_free];
    } else if (p->lru_head >= 0) {
        pg = p->lru_head; /* the least recently used prefix page goes */
        lru_remove(p, pg);
        unhash(p, pg);
        p->evictions++;
    } else {
        return -1;
    }
    p->refs[pg] = 1;
    return pg;
}

void specd_kv_pool_release(specd_kv_pool *p, int32_t pg) {
    if (pg < 0 || pg >= p->n || p->refs[pg] <= 0) return;
    if (--p->refs[pg] > 0) return;
    if (p->keyed[pg]) lru_append(p, pg);
    else p->fstack[p->n_free++] = pg;
}

int specd_kv_pool_available(const specd_kv_pool *p) { return p->n_free + p->n_cached; }
int specd_kv_pool_refs(const specd_kv_pool *p, int32_t pg) { return p->refs[pg]; }
int specd_kv_pool_is_keyed(const specd_kv_pool *p, int32_t pg) { return p->keyed[pg]; }

int32_t specd_kv_pool_lookup(specd_kv_pool *p, uint64_t key, uint64_t parent,
                             const int32_t *tokens) {
    p->lookup_pages++;
    int32_t pg = find(p, key, parent, tokens);
    if (pg < 0) return -1;
    p->hit_pages++;
    if (p->refs[pg] == 0) lru_remove(p, pg);
    p->refs[pg]++;
    return pg;
}

void specd_kv_pool_publish(specd_kv_pool *p, int32_t pg, uint64_t key, uint64_t parent,
                           const int32_t *tokens) {
    if (pg < 0 || pg >= p->n || p->refs[pg] <= 0 || p->keyed[pg]) return;
    if (find(p, key, parent, tokens) >= 0) return;
    p->key[pg] = key;
    p->parent[pg] = parent;
    memcpy(p->tokens + (size_t)pg * ROWS, tokens, ROWS * sizeof(int32_t));
    int32_t *head = chain_of(p, key);
    p->hnext[pg] = *head;
    *head = pg;
    p->keyed[pg] = 1;
}

void specd_kv_pool_unpublish(specd_kv_pool *p, int32_t pg) {
    if (pg < 0 || pg >= p->n || !p->keyed[pg]) return;
    unhash(p, pg);
    if (p->refs[pg] == 0) { /* cached: it becomes free */
        lru_remove(p, pg);
        p->fstack[p->n_free++] = pg;
    }
}

void specd_kv_pool_drop_cached(specd_kv_pool *p) {
    while (p->lru_head >= 0) specd_kv_pool_unpublish(p, p->lru_head);
}

void specd_kv_pool_get_stats(const specd_kv_pool *p, specd_kv_pool_stats *st) {
    st->n_pages = p->n;
    st->n_free = p->n_free;
    st->n_cached = p->n_cached;
    st->n_held = p->n - p->n_free - p->n_cached;
    st->lookup_pages = p->lookup_pages;
    st->hit_pages = p->hit_pages;
    st->evictions = p->evictions;
}

/* --- invariants (tests) -------------------------------------------------------- */

int specd_kv_pool_check(const specd_kv_pool *p, const int *refs_expected, specd_error *err) {
    uint8_t *seen = calloc((size_t)p->n, 1); /* 1 free, 2 cached */
    if (!seen) return specd_seterr(err, "kv pool check: out of memory");
    int rc = 0;
    for (int i = 0; i < p->n_free && !rc; i++) {
        int32_t pg = p->fstack[i];
        if (pg < 0 || pg >= p->n || seen[pg] || p->refs[pg] || p->keyed[pg])
            rc = specd_seterr(err, "free stack[%d] = page %d is out of range, twice, held or "
                                   "keyed",
                              i, pg);
        else
            seen[pg] = 1;
    }
    int n_lru = 0;
    for (int32_t pg = p->lru_head, prev = -1; pg >= 0 && !rc; prev = pg, pg = p->lnext[pg]) {
        if (seen[pg] || p->refs[pg] || !p->keyed[pg] || p->lprev[pg] != prev)
            rc = specd_seterr(err, "LRU page %d is listed twice, held, unkeyed or mislinked", pg);
        else
            seen[pg] = 2;
        if (++n_lru > p->n) rc = specd_seterr(err, "LRU list has a cycle");
    }
    if (!rc && n_lru != p->n_cached)
        rc = specd_seterr(err, "LRU list holds %d pages, n_cached says %d", n_lru, p->n_cached);
    for (int pg = 0; pg < p->n && !rc; pg++) {
        if (!seen[pg] && p->refs[pg] <= 0)
            rc = specd_seterr(err, "page %d is neither held, cached nor free", pg);
        else if (refs_expected && p->refs[pg] != refs_expected[pg])
            rc = specd_seterr(err, "page %d has %d references, the page tables hold %d", pg,
                              p->refs[pg], refs_expected[pg]);
        else if (p->keyed[pg] && find(p, p->key[pg], p->parent[pg],
                                      p->tokens + (size_t)pg * ROWS) != pg)
            rc = specd_seterr(err, "keyed page %d is not found under its key", pg);
    }
    free(seen);
    return rc;
}
