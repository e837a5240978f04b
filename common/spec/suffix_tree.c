/* suffix_tree.c - the depth-bounded suffix trie of suffix_tree.h. */
#include "common/spec/suffix_tree.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* 16 bytes a node. The root (node 0) keeps its children in root_index
 * (one slot per vocabulary entry: the root fans out to every token seen,
 * too many to scan); other nodes in a sibling list, newest first. */
typedef struct st_node {
    int32_t token, count, first_child, next_sibling;
} st_node;

typedef struct st_doc {
    int32_t *toks;
    int n, cap;
} st_doc;

struct specd_suffix_tree {
    int vocab, depth;
    int64_t max_tokens;
    st_node *nodes;   /* pool; [0] is the root */
    int32_t n_pool, cap_pool, free_head;
    int64_t live;     /* nodes in use, root excluded */
    int32_t *root_index; /* [vocab] */
    st_doc *docs;     /* ring of documents, oldest at docs_head */
    int docs_head, n_docs, docs_cap;
    int open;         /* the newest document is still growing (append) */
    int full;         /* ...and has reached max_tokens: it stops growing */
    int32_t *active;  /* [depth] nodes of the open document's suffixes, by length 1.. */
    int32_t *next;    /* [depth] scratch of append */
    int n_active;
    int64_t tokens, evicted;
};

/* ---- nodes -------------------------------------------------------------- */

static int32_t child_of(const specd_suffix_tree *t, int32_t p, int32_t tok) {
    if (p == 0) return t->root_index[tok];
    for (int32_t c = t->nodes[p].first_child; c >= 0; c = t->nodes[c].next_sibling)
        if (t->nodes[c].token == tok) return c;
    return -1;
}

static int32_t alloc_node(specd_suffix_tree *t) {
    int32_t i;
    if (t->free_head >= 0) {
        i = t->free_head;
        t->free_head = t->nodes[i].next_sibling;
    } else {
        if (t->n_pool == t->cap_pool) {
            if (t->cap_pool > INT32_MAX / 2) return -1;
            int32_t cap = t->cap_pool * 2;
            st_node *nn = realloc(t->nodes, sizeof *nn * (size_t)cap);
            if (!nn) return -1;
            t->nodes = nn;
            t->cap_pool = cap;
        }
        i = t->n_pool++;
    }
    t->live++;
    return i;
}

static void release_node(specd_suffix_tree *t, int32_t i) {
    t->nodes[i].next_sibling = t->free_head;
    t->free_head = i;
    t->live--;
}

/* The child of p for tok, created (count 0) if missing; -1 out of memory. */
static int32_t get_child(specd_suffix_tree *t, int32_t p, int32_t tok) {
    int32_t c = child_of(t, p, tok);
    if (c >= 0) return c;
    if ((c = alloc_node(t)) < 0) return -1;
    st_node *n = &t->nodes[c];
    n->token = tok;
    n->count = 0;
    n->first_child = -1;
    if (p == 0) {
        n->next_sibling = -1;
        t->root_index[tok] = c;
    } else {
        n->next_sibling = t->nodes[p].first_child;
        t->nodes[p].first_child = c;
    }
    return c;
}

static void unlink_child(specd_suffix_tree *t, int32_t p, int32_t c) {
    if (p == 0) {
        t->root_index[t->nodes[c].token] = -1;
        return;
    }
    int32_t *link = &t->nodes[p].first_child;
    while (*link != c) link = &t->nodes[*link].next_sibling;
    *link = t->nodes[c].next_sibling;
}

/* Frees c and everything under it (depth-bounded recursion). */
static void free_subtree(specd_suffix_tree *t, int32_t c) {
    int32_t k = t->nodes[c].first_child;
    while (k >= 0) {
        int32_t next = t->nodes[k].next_sibling;
        free_subtree(t, k);
        k = next;
    }
    release_node(t, c);
}

/* ---- documents ---------------------------------------------------------- */

/* Takes the oldest document's occurrences out of the counts and frees it.
 * Never called on the open document. */
static void evict_oldest(specd_suffix_tree *t) {
    st_doc *d = &t->docs[t->docs_head];
    for (int i = 0; i < d->n; i++) {
        int32_t p = 0;
        t->nodes[0].count--;
        int end = i + t->depth < d->n ? i + t->depth : d->n;
        for (int j = i; j < end; j++) {
            int32_t c = child_of(t, p, d->toks[j]);
            if (c < 0) break; /* cannot happen: every counted path exists */
            if (--t->nodes[c].count == 0) {
                /* what hangs below counted at most this occurrence too */
                unlink_child(t, p, c);
                free_subtree(t, c);
                break;
            }
            p = c;
        }
    }
    t->tokens -= d->n;
    free(d->toks);
    *d = (st_doc){0};
    t->docs_head = (t->docs_head + 1) % t->docs_cap;
    t->n_docs--;
    t->evicted++;
}

static int open_doc(specd_suffix_tree *t) {
    if (t->n_docs == t->docs_cap) {
        int cap = t->docs_cap * 2;
        st_doc *nd = malloc(sizeof *nd * (size_t)cap);
        if (!nd) return -1;
        for (int i = 0; i < t->n_docs; i++) nd[i] = t->docs[(t->docs_head + i) % t->docs_cap];
        free(t->docs);
        t->docs = nd;
        t->docs_cap = cap;
        t->docs_head = 0;
    }
    t->docs[(t->docs_head + t->n_docs) % t->docs_cap] = (st_doc){0};
    t->n_docs++;
    t->open = 1;
    t->full = 0;
    t->n_active = 0;
    return 0;
}

static void close_doc(specd_suffix_tree *t) {
    if (t->open && t->n_docs > 0) {
        /* an empty document is no document */
        st_doc *d = &t->docs[(t->docs_head + t->n_docs - 1) % t->docs_cap];
        if (d->n == 0) {
            free(d->toks);
            *d = (st_doc){0};
            t->n_docs--;
        }
    }
    t->open = 0;
    t->n_active = 0;
}

int specd_suffix_tree_append(specd_suffix_tree *t, int32_t tok) {
    if (tok < 0 || tok >= t->vocab) {
        close_doc(t); /* an unproposable token ends the document */
        return 0;
    }
    if (!t->open && open_doc(t)) return -1;
    if (t->full) return 0;
    if (t->max_tokens > 0) {
        /* make room: oldest whole documents first, never the open one */
        while (t->tokens + 1 > t->max_tokens && t->n_docs > 1) evict_oldest(t);
        if (t->tokens + 1 > t->max_tokens) {
            t->full = 1;
            return 0;
        }
    }
    st_doc *d = &t->docs[(t->docs_head + t->n_docs - 1) % t->docs_cap];
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 64;
        int32_t *nt = realloc(d->toks, sizeof *nt * (size_t)cap);
        if (!nt) return -1;
        d->toks = nt;
        d->cap = cap;
    }
    /* Extend every suffix that can still grow: active[k] spells the last
     * k + 1 tokens; it becomes its child for tok (length k + 2), kept while
     * shorter than depth; the new length-1 suffix is the root's child. All
     * children are found or made before any count moves, so running out of
     * memory leaves the counts as they were. */
    int keep = t->n_active < t->depth - 1 ? t->n_active : t->depth - 2;
    int32_t *next = t->next;
    for (int k = 0; k < t->n_active; k++) {
        int32_t c = get_child(t, t->active[k], tok);
        if (c < 0) return -1;
        next[k + 1] = c;
    }
    int32_t r = get_child(t, 0, tok);
    if (r < 0) return -1;
    next[0] = r;
    t->nodes[0].count++;
    for (int k = 0; k <= t->n_active; k++) t->nodes[next[k]].count++;
    /* lengths 1 .. keep + 1 stay extendable (< depth) */
    memcpy(t->active, next, sizeof(int32_t) * (size_t)(keep + 1));
    t->n_active = keep + 1;
    d->toks[d->n++] = tok;
    t->tokens++;
    return 0;
}

int specd_suffix_tree_insert(specd_suffix_tree *t, const int32_t *toks, int n) {
    close_doc(t);
    if (n < 1) return 0;
    if (open_doc(t)) return -1;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (toks[i] < 0 || toks[i] >= t->vocab) break;
        rc = specd_suffix_tree_append(t, toks[i]);
    }
    close_doc(t);
    return rc;
}

void specd_suffix_tree_clear(specd_suffix_tree *t) {
    close_doc(t); /* nothing grows now, so the newest may go too */
    while (t->n_docs > 0) evict_oldest(t);
    t->docs_head = 0;
}

specd_suffix_tree *specd_suffix_tree_create(int vocab, int depth, int64_t max_tokens,
                                            specd_error *err) {
    if (vocab < 1 || depth < 2 || depth > 256 || max_tokens < 0) {
        specd_seterr(err, "suffix tree: need vocab >= 1, 2 <= depth <= 256, max_tokens >= 0; "
                          "got %d, %d, %lld",
                     vocab, depth, (long long)max_tokens);
        return NULL;
    }
    specd_suffix_tree *t = calloc(1, sizeof *t);
    if (t) {
        t->vocab = vocab;
        t->depth = depth;
        t->max_tokens = max_tokens;
        t->cap_pool = 1024;
        t->nodes = malloc(sizeof *t->nodes * (size_t)t->cap_pool);
        t->root_index = malloc(sizeof(int32_t) * (size_t)vocab);
        t->docs_cap = 16;
        t->docs = calloc((size_t)t->docs_cap, sizeof *t->docs);
        t->active = malloc(sizeof(int32_t) * (size_t)depth);
        t->next = malloc(sizeof(int32_t) * (size_t)depth);
    }
    if (!t || !t->nodes || !t->root_index || !t->docs || !t->active || !t->next) {
        specd_suffix_tree_free(t);
        specd_seterr(err, "suffix tree: out of memory");
        return NULL;
    }
    memset(t->root_index, 0xff, sizeof(int32_t) * (size_t)vocab); /* all -1 */
    t->nodes[0] = (st_node){.token = -1, .count = 0, .first_child = -1, .next_sibling = -1};
    t->n_pool = 1;
    t->free_head = -1;
    return t;
}

void specd_suffix_tree_free(specd_suffix_tree *t) {
    if (!t) return;
    if (t->docs)
        for (int i = 0; i < t->n_docs; i++) free(t->docs[(t->docs_head + i) % t->docs_cap].toks);
    free(t->docs);
    free(t->nodes);
    free(t->root_index);
    free(t->active);
    free(t->next);
    free(t);
}

int64_t specd_suffix_tree_tokens(const specd_suffix_tree *t) { return t->tokens; }
int specd_suffix_tree_docs(const specd_suffix_tree *t) { return t->n_docs; }
int64_t specd_suffix_tree_nodes(const specd_suffix_tree *t) { return t->live; }
int64_t specd_suffix_tree_evicted(const specd_suffix_tree *t) { return t->evicted; }
int specd_suffix_tree_depth(const specd_suffix_tree *t) { return t->depth; }

const int32_t *specd_suffix_tree_doc(const specd_suffix_tree *t, int i, int *n) {
    if (i < 0 || i >= t->n_docs) return NULL;
    const st_doc *d = &t->docs[(t->docs_head + i) % t->docs_cap];
    *n = d->n;
    return d->toks;
}

/* ---- lookups -------------------------------------------------------------- */

/* Node spelling p[0..n), or -1. */
static int32_t walk(const specd_suffix_tree *t, const int32_t *p, int n) {
    int32_t node = 0;
    for (int i = 0; i < n && node >= 0; i++) {
        if (p[i] < 0 || p[i] >= t->vocab) return -1;
        node = child_of(t, node, p[i]);
    }
    return node;
}

int64_t specd_suffix_tree_count(const specd_suffix_tree *t, const int32_t *pattern, int n) {
    if (n < 0 || n > t->depth) return 0;
    int32_t node = walk(t, pattern, n);
    return node < 0 ? 0 : t->nodes[node].count;
}

/* The suffix of length len occurs followed by something. */
static int32_t match_node(const specd_suffix_tree *t, const int32_t *ctx, int n, int len) {
    int32_t node = walk(t, ctx + n - len, len);
    return node > 0 && t->nodes[node].first_child >= 0 ? node : -1;
}

int specd_suffix_tree_match(const specd_suffix_tree *t, const int32_t *ctx, int n, int min_len,
                            int max_len) {
    if (min_len < 1) min_len = 1;
    int hi = max_len < n ? max_len : n;
    if (hi > t->depth - 1) hi = t->depth - 1;
    if (hi < min_len || match_node(t, ctx, n, min_len) < 0) return 0;
    /* suffix-closed: "occurs followed by something" holds for every length
     * up to the longest one, so binary search for it */
    int lo = min_len; /* holds */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (match_node(t, ctx, n, mid) >= 0)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Best-first frontier: a binary max-heap on path log-probability. */
typedef struct frontier {
    float logp;
    int32_t node;   /* trie node */
    int32_t parent; /* output index of its parent, -1 = the root */
    int32_t depth;  /* draft depth, 1 for a child of the root */
} frontier;
#define FRONTIER_CAP 1024

static void heap_push(frontier *h, int *n, frontier e) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (h[p].logp >= e.logp) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static frontier heap_pop(frontier *h, int *n) {
    frontier top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].logp > h[c].logp) c++;
        if (h[c].logp <= last.logp) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* Pushes the children of node (which spells `len` tokens) whose path
 * probability stays >= min_logp. */
static void push_children(const specd_suffix_tree *t, frontier *h, int *n, int32_t node, int len,
                          float logp, int32_t out_parent, int32_t depth, float min_logp) {
    int64_t sum = 0;
    for (int32_t c = t->nodes[node].first_child; c >= 0; c = t->nodes[c].next_sibling)
        sum += t->nodes[c].count;
    if (sum == 0) return;
    /* the pseudo-count for "something never seen here": 1 / len */
    float lden = logf((float)sum + 1.0f / (float)len);
    for (int32_t c = t->nodes[node].first_child; c >= 0 && *n < FRONTIER_CAP;
         c = t->nodes[c].next_sibling) {
        float lp = logp + logf((float)t->nodes[c].count) - lden;
        if (lp < min_logp) continue;
        heap_push(h, n, (frontier){lp, c, out_parent, depth});
    }
}

/* Grows the best-first tree under trie node `at` (match length m); writes
 * it when tokens != NULL, else only scores it. */
static specd_suffix_draft expand(const specd_suffix_tree *t, int32_t at, int m, int max_depth,
                                 int max_nodes, float min_logp, int32_t *tokens,
                                 int32_t *parents, float *logq) {
    specd_suffix_draft r = {0};
    /* a path can go no deeper than the trie below the match */
    if (max_depth > t->depth - m) max_depth = t->depth - m;
    frontier heap[FRONTIER_CAP];
    int nh = 0;
    push_children(t, heap, &nh, at, m, 0.0f, -1, 1, min_logp);
    while (nh > 0 && r.n < max_nodes) {
        frontier e = heap_pop(heap, &nh);
        int i = r.n++;
        if (tokens) {
            tokens[i] = t->nodes[e.node].token;
            parents[i] = e.parent;
            logq[i] = e.logp;
        }
        r.score += expf(e.logp);
        if (e.depth < max_depth)
            push_children(t, heap, &nh, e.node, m + e.depth, e.logp, i, e.depth + 1, min_logp);
    }
    r.match_len = r.n > 0 ? m : 0;
    return r;
}

specd_suffix_draft specd_suffix_tree_draft(const specd_suffix_tree *t, const int32_t *ctx, int n,
                                           int min_len, int max_depth, int max_nodes,
                                           float min_prob, int32_t *tokens, int32_t *parents,
                                           float *logq) {
    specd_suffix_draft none = {0};
    if (max_depth < 1 || max_nodes < 1 || n < 1) return none;
    if (min_len < 1) min_len = 1;
    /* the match and the paths below it share the trie's depth: leave the
     * paths max_depth tokens where the match can spare them */
    int max_match = t->depth - max_depth;
    if (max_match < min_len) max_match = min_len;
    int m = specd_suffix_tree_match(t, ctx, n, min_len, max_match);
    if (!m) return none;
    float min_logp = min_prob > 0.0f ? logf(min_prob) : -INFINITY;
    /* The longest match is the most specific context, but not always the
     * best: its few sightings may end right before the text's end (in
     * "x x x x" the longest match's one earlier occurrence is followed by
     * a single token). So also score the tree of every halved match length
     * and keep the best (ties: the longer match). */
    int best_m = 0;
    float best = 0.0f;
    for (int len = m;;) {
        int32_t at = walk(t, ctx + n - len, len);
        specd_suffix_draft r = expand(t, at, len, max_depth, max_nodes, min_logp, NULL, NULL, NULL);
        if (r.n > 0 && r.score > best) {
            best = r.score;
            best_m = len;
        }
        if (len == min_len) break;
        len = len / 2 < min_len ? min_len : len / 2;
    }
    if (!best_m) return none;
    return expand(t, walk(t, ctx + n - best_m, best_m), best_m, max_depth, max_nodes, min_logp,
                  tokens, parents, logq);
}

/* ---- the shared cache ----------------------------------------------------- */

struct specd_suffix_cache {
    pthread_rwlock_t lock;
    specd_suffix_tree *t;
};

specd_suffix_cache *specd_suffix_cache_create(int vocab, int depth, int64_t max_tokens,
                                              specd_error *err) {
    specd_suffix_cache *c = calloc(1, sizeof *c);
    if (!c) {
        specd_seterr(err, "suffix cache: out of memory");
        return NULL;
    }
    if (!(c->t = specd_suffix_tree_create(vocab, depth, max_tokens, err))) {
        free(c);
        return NULL;
    }
    if (pthread_rwlock_init(&c->lock, NULL)) {
        specd_suffix_tree_free(c->t);
        free(c);
        specd_seterr(err, "suffix cache: cannot create its lock");
        return NULL;
    }
    return c;
}

void specd_suffix_cache_free(specd_suffix_cache *c) {
    if (!c) return;
    pthread_rwlock_destroy(&c->lock);
    specd_suffix_tree_free(c->t);
    free(c);
}

int specd_suffix_cache_insert(specd_suffix_cache *c, const int32_t *toks, int n) {
    pthread_rwlock_wrlock(&c->lock);
    int rc = specd_suffix_tree_insert(c->t, toks, n);
    pthread_rwlock_unlock(&c->lock);
    return rc;
}

specd_suffix_draft specd_suffix_cache_draft(specd_suffix_cache *c, const int32_t *ctx, int n,
                                            int min_len, int max_depth, int max_nodes,
                                            float min_prob, int32_t *tokens, int32_t *parents,
                                            float *logq) {
    pthread_rwlock_rdlock(&c->lock);
    specd_suffix_draft r = specd_suffix_tree_draft(c->t, ctx, n, min_len, max_depth, max_nodes,
                                                   min_prob, tokens, parents, logq);
    pthread_rwlock_unlock(&c->lock);
    return r;
}

void specd_suffix_cache_read(specd_suffix_cache *c, void (*fn)(const specd_suffix_tree *, void *),
                             void *arg) {
    pthread_rwlock_rdlock(&c->lock);
    fn(c->t, arg);
    pthread_rwlock_unlock(&c->lock);
}

void specd_suffix_cache_stats(specd_suffix_cache *c, int64_t *tokens, int *docs, int64_t *nodes,
                              int64_t *evicted) {
    pthread_rwlock_rdlock(&c->lock);
    if (tokens) *tokens = c->t->tokens;
    if (docs) *docs = c->t->n_docs;
    if (nodes) *nodes = c->t->live;
    if (evicted) *evicted = c->t->evicted;
    pthread_rwlock_unlock(&c->lock);
}
