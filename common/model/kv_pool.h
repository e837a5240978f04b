/* kv_pool.h - the KV page pool shared by every session, with prefix caching.
 *
 * The KV cache is one pool of pages (SPECD_KV_PAGE_ROWS rows each, every
 * layer's K and V: kernels/backend.h). This file is the host-side page
 * accounting, the same for the CPU and the CUDA backend (the backend only
 * ever sees page ids in a step's page tables):
 *
 *   - Every page is in exactly one of three states:
 *       held     refs > 0: in the page table of that many sessions
 *       cached   refs == 0 but keyed: its rows are a known prefix block,
 *                kept on an LRU list until someone reuses or evicts it
 *       free     refs == 0, no key: on the free stack (low ids first, so a
 *                lightly used cache touches little memory)
 *   - Prefix caching (vLLM's automatic prefix caching, SGLang's radix cache
 *     on whole pages): a full page of prompt rows gets the key
 *         key = H(key of the page before it (0 for the first), its 16 tokens)
 *     so a key names the whole prefix up to the page's end, not just the page.
 *     A new session looks its prompt's pages up in order and shares every hit
 *     read-only (refs++); only the rest of the prompt is computed.
 *   - A page is written only by a session that holds it alone and unkeyed:
 *     a writer of a keyed page it holds alone takes the key off (unpublish);
 *     one shared with others gets a private copy first (copy on write, done
 *     by the transformer, which can copy rows).
 *   - Allocation takes a free page, else evicts the least recently used
 *     cached page. "Available" pages are free + cached.
 *
 * The keys are 64-bit hashes; a lookup also compares the page's 16 tokens
 * and its parent key, so a false hit needs a 64-bit collision of the parent
 * chain with the same 16 tokens.
 *
 * Not thread-safe: the transformer's owner (the scheduler's worker) is the
 * only user. */
#ifndef SPECD_KV_POOL_H
#define SPECD_KV_POOL_H

#include <stdint.h>

#include "common/util/error.h"
#include "kernels/backend.h"

typedef struct specd_kv_pool specd_kv_pool;

typedef struct specd_kv_pool_stats {
    int n_pages;      /* in all */
    int n_held;       /* referenced by at least one session */
    int n_cached;     /* unreferenced but reusable prefix pages */
    int n_free;       /* neither */
    uint64_t lookup_pages, hit_pages; /* prefix lookups: pages asked for, found */
    uint64_t evictions;
} specd_kv_pool_stats;

specd_kv_pool *specd_kv_pool_create(int n_pages, specd_error *err);
void specd_kv_pool_free(specd_kv_pool *p);

/* A page for writing (refs = 1, no key): a free one, else the LRU cached one
 * (its key is dropped). -1 when every page is held. */
int32_t specd_kv_pool_alloc(specd_kv_pool *p);

/* Drops one reference; at zero the page becomes cached (keyed) or free. */
void specd_kv_pool_release(specd_kv_pool *p, int32_t page);

/* free + cached: how many pages specd_kv_pool_alloc can still hand out. */
int specd_kv_pool_available(const specd_kv_pool *p);

int specd_kv_pool_refs(const specd_kv_pool *p, int32_t page);
int specd_kv_pool_is_keyed(const specd_kv_pool *p, int32_t page);

/* The key of a full page of `tokens` (SPECD_KV_PAGE_ROWS of them) after the
 * page whose key is parent (0 for the first page of a sequence). */
uint64_t specd_kv_page_key(uint64_t parent, const int32_t *tokens);

/* The cached or held page with this key, parent and tokens, with one more
 * reference taken; -1 when there is none. Counts in the hit statistics. */
int32_t specd_kv_pool_lookup(specd_kv_pool *p, uint64_t key, uint64_t parent,
                             const int32_t *tokens);

/* Gives a held page (whose rows hold exactly these tokens after the prefix
 * `parent`) its key so later sessions can find it. No-op when another page
 * already has the key (the first stays the one shared) or this one is keyed. */
void specd_kv_pool_publish(specd_kv_pool *p, int32_t page, uint64_t key, uint64_t parent,
                           const int32_t *tokens);

/* Takes the key off a page (its owner is about to write into it). */
void specd_kv_pool_unpublish(specd_kv_pool *p, int32_t page);

/* Evicts every cached page (e.g. the prefix cache was switched off). */
void specd_kv_pool_drop_cached(specd_kv_pool *p);

void specd_kv_pool_get_stats(const specd_kv_pool *p, specd_kv_pool_stats *st);

/* Checks the pool's own invariants (every page in exactly one state, the
 * lists and the hash table consistent) and, when refs_expected is not NULL,
 * that each page's reference count equals refs_expected[page] (what the page
 * tables hold). 0, or -1 with err naming the first broken rule. For tests. */
int specd_kv_pool_check(const specd_kv_pool *p, const int *refs_expected, specd_error *err);

#endif
