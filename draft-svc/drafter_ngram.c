/* drafter_ngram.c - prompt lookup decoding (drafter.h, "ngram").
 *
 * The text often repeats itself: code quotes identifiers, summaries quote
 * the document, a chat answer quotes the question. So the best cheap guess
 * of what follows the last few tokens is what followed them the last time
 * they occurred. For every position e in the searched window this drafter
 * measures how many tokens before e agree with the tokens that end the
 * history (the suffix that ends in the pending token); a position where at
 * least min_n agree is a match, its n-gram length L = that agreement capped
 * at max_n, and the tokens from e onwards are its proposed continuation.
 *
 * Ranking: longer L first (a longer context agreeing is stronger evidence),
 * then the more recent match (the text's current topic). That is exactly
 * "for n = max_n down to min_n, the most recent occurrences first", computed
 * in a single pass over the window instead of one pass per n.
 *
 * Greedy mode: the ranked continuations are merged into a trie under the
 * pending token until `candidates` distinct paths (leaves) exist, each at
 * most `depth` tokens; continuations that differ early become sibling
 * branches, shared prefixes are merged, and a continuation that repeats or
 * merely extends a kept one adds no new path.
 *
 * Sampling mode: a lookup is deterministic, i.e. a draw from a one-hot q.
 * The verifier's recursive rejection is only lossless when siblings are
 * i.i.d. draws from the q sent with them (tree_builder.h), and i.i.d. draws
 * from a one-hot q are all the same token, so extra chains would only be
 * duplicates that can never be accepted after the first is rejected
 * (the residual of a one-hot q has zero mass at that token). So sampling
 * mode proposes one chain, the best-ranked continuation, with q = {x: 1} at
 * the pending token and at every drafted node that has a child.
 *
 * Cost per job: O(W * max_n) to score the window (W = min(max_scan,
 * n_history) positions, at most max_n comparisons each), O(W * (max_n -
 * min_n + 1)) to visit matches in rank order, plus the trie walks of the
 * visited matches, each O(depth * candidates) (a walk compares at most the
 * siblings at each level, and there are at most `candidates` leaves); the
 * history before the window is never read. No model, no per-session state. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "draft-svc/drafter.h"

#define NGRAM_DEFAULT_MIN_N 1
#define NGRAM_DEFAULT_MAX_N 4
#define NGRAM_DEFAULT_MAX_SCAN 8192
/* Longer n-grams add nothing in practice (a 64-token agreement is already
 * as strong as evidence gets), and the bound lets a match length live in a
 * byte of scratch per window position. */
#define NGRAM_MAX_N_LIMIT 64

typedef struct ngram_impl {
    int vocab;
    int min_n, max_n, max_scan;
    /* Per-call scratch, grown on demand: the match length of every window
     * position, and the trie links of the output tree. propose() is not
     * reentrant, like every drafter (the session driver's batcher is the
     * one caller). */
    uint8_t *match_len; /* [max_scan] */
    int32_t *first_child, *next_sibling; /* [tree capacity] */
    int links_cap;
} ngram_impl;

/* L(e) for e in [lo, N): how many tokens before e agree with the tokens
 * before N (the history's end), capped at max_n and at e itself so nothing
 * before h[0] is read. 0 when h[e-1] already differs. */
static int suffix_agreement(const int32_t *h, int n_hist, int e, int max_n) {
    int cap = max_n < e ? max_n : e;
    int l = 0;
    while (l < cap && h[e - 1 - l] == h[n_hist - 1 - l]) l++;
    return l;
}

/* Child of `parent` (-1 = root) holding `token`, or -1. first_child[0] is
 * the root's list; first_child[1 + i] node i's. */
static int find_child(const ngram_impl *g, const specd_tree_buf *out, int parent, int32_t token) {
    for (int c = g->first_child[parent + 1]; c >= 0; c = g->next_sibling[c])
        if (out->tokens[c] == token) return c;
    return -1;
}

/* Merges the continuation h[e .. e+len) into the trie. Returns the number of
 * new leaves it created (0 or 1): a new leaf only when it leaves the
 * existing trie at a node that already had children or at the root; when it
 * only extends an existing leaf the path count is unchanged. Stops quietly
 * when the tree buffer is full (the truncated path is still a valid
 * proposal). */
static int insert_path(ngram_impl *g, specd_tree_buf *out, const int32_t *h, int e, int len) {
    int node = -1, k = 0;
    for (; k < len; k++) {
        int c = find_child(g, out, node, h[e + k]);
        if (c < 0) break;
        node = c;
    }
    if (k == len) return 0; /* a duplicate (or prefix) of a kept path */
    /* branching off a node that has children (or off the root) makes a new
     * path; extending a leaf only lengthens that path */
    int new_leaf = node < 0 || g->first_child[node + 1] >= 0;
    int added = 0;
    for (; k < len; k++) {
        /* 0 = log 1: a lookup has no probabilities of its own; the tree's
         * shape (rank order) carries its preference. */
        int c = specd_tree_buf_add(out, node, h[e + k], 0.0f);
        if (c < 0) break;
        g->first_child[c + 1] = -1;
        /* prepend to the parent's list; order of siblings does not matter
         * for lookup, and node indices already record rank order */
        g->next_sibling[c] = g->first_child[node + 1];
        g->first_child[node + 1] = c;
        node = c;
        added++;
    }
    return added > 0 ? new_leaf : 0;
}

/* Length of the continuation at e: stops at the history's end, at `depth`,
 * and before any token outside the vocabulary (the target would reject the
 * whole tree). */
static int continuation_len(const ngram_impl *g, const int32_t *h, int n_hist, int e, int depth) {
    int len = n_hist - e < depth ? n_hist - e : depth;
    for (int k = 0; k < len; k++)
        if (h[e + k] < 0 || h[e + k] >= g->vocab) return k;
    return len;
}

static int grow_scratch(ngram_impl *g, int cap, specd_error *err) {
    if (cap <= g->links_cap) return 0;
    int32_t *fc = realloc(g->first_child, sizeof(int32_t) * ((size_t)cap + 1));
    if (fc) g->first_child = fc;
    int32_t *ns = realloc(g->next_sibling, sizeof(int32_t) * (size_t)cap);
    if (ns) g->next_sibling = ns;
    if (!fc || !ns) return specd_seterr(err, "ngram drafter: out of memory");
    g->links_cap = cap;
    return 0;
}

static void propose_one(ngram_impl *g, specd_draft_job *job) {
    specd_tree_buf *out = job->out;
    const int32_t *h = job->history;
    int n_hist = job->n_history;
    int depth = job->depth;
    if (!h || n_hist < 2 || depth < 1 || out->cap < 1) return;
    int sampling = job->sampling && job->sampling->temperature > 0.0f;
    int candidates = sampling ? 1 : (job->candidates < 1 ? 1 : job->candidates);

    /* Window of continuation starts: e in [lo, N-1]. e = N-1 is allowed: the
     * continuation then starts at the pending token itself (periodic text,
     * e.g. "a b a b" proposes "a b" after the pending "b"). */
    int lo = n_hist - g->max_scan;
    if (lo < 1) lo = 1;
    int best = 0;
    for (int e = lo; e < n_hist; e++) {
        int l = suffix_agreement(h, n_hist, e, g->max_n);
        g->match_len[e - lo] = (uint8_t)l;
        if (l > best) best = l;
    }
    if (best < g->min_n) return;

    for (int i = 0; i <= out->cap; i++) g->first_child[i] = -1;
    int paths = 0;
    for (int n = best; n >= g->min_n && paths < candidates; n--) {
        for (int e = n_hist - 1; e >= lo && paths < candidates; e--) {
            if (g->match_len[e - lo] != n) continue;
            int len = continuation_len(g, h, n_hist, e, depth);
            if (len < 1) continue;
            if (!sampling) {
                paths += insert_path(g, out, h, e, len);
                if (out->n_nodes >= out->cap) return;
                continue;
            }
            /* Sampling: the single chain with one-hot q. Each q is set on the
             * parent right before its child is added, so a full tree buffer
             * or q pool just ends the chain, never leaves a child without
             * the q it was "drawn" from. */
            static const float one = 1.0f;
            int parent = -1;
            for (int k = 0; k < len && out->n_nodes < out->cap; k++) {
                if (specd_tree_buf_set_q(out, parent, &h[e + k], &one, 1)) break;
                parent = specd_tree_buf_add(out, parent, h[e + k], 0.0f);
            }
            return;
        }
    }
}

static int ngram_propose(specd_drafter *d, specd_draft_job *jobs, int n, specd_error *err) {
    ngram_impl *g = d->impl;
    int max_cap = 0;
    for (int i = 0; i < n; i++)
        if (jobs[i].out->cap > max_cap) max_cap = jobs[i].out->cap;
    if (grow_scratch(g, max_cap, err)) return -1;
    for (int i = 0; i < n; i++) propose_one(g, &jobs[i]);
    return 0;
}

static void ngram_destroy(specd_drafter *d) {
    ngram_impl *g = d->impl;
    if (g) {
        free(g->match_len);
        free(g->first_child);
        free(g->next_sibling);
        free(g);
    }
    free(d);
}

static const specd_drafter_ops ngram_ops = {
    .name = "ngram",
    .session_open = NULL, /* stateless: everything it needs is in the history */
    .session_close = NULL,
    .propose = ngram_propose,
    .destroy = ngram_destroy,
};

specd_drafter *specd_ngram_drafter_create(const specd_ngram_drafter_opts *o, specd_error *err) {
    if (!o || o->vocab < 1) {
        specd_seterr(err, "ngram drafter: vocab must be positive, got %d", o ? o->vocab : 0);
        return NULL;
    }
    int min_n = o->min_n ? o->min_n : NGRAM_DEFAULT_MIN_N;
    int max_n = o->max_n ? o->max_n : NGRAM_DEFAULT_MAX_N;
    int max_scan = o->max_scan ? o->max_scan : NGRAM_DEFAULT_MAX_SCAN;
    /* a max_n left at its default but a min_n above it: the user asked for
     * exactly that min_n */
    if (!o->max_n && max_n < min_n) max_n = min_n;
    if (min_n < 1 || max_n < min_n || max_n > NGRAM_MAX_N_LIMIT) {
        specd_seterr(err, "ngram drafter: need 1 <= min_n <= max_n <= %d, got min_n %d, max_n %d",
                     NGRAM_MAX_N_LIMIT, min_n, max_n);
        return NULL;
    }
    if (max_scan < 1) {
        specd_seterr(err, "ngram drafter: max_scan must be positive, got %d", max_scan);
        return NULL;
    }
    specd_drafter *d = calloc(1, sizeof *d);
    ngram_impl *g = calloc(1, sizeof *g);
    uint8_t *ml = malloc((size_t)max_scan);
    if (!d || !g || !ml) {
        free(d);
        free(g);
        free(ml);
        specd_seterr(err, "ngram drafter: out of memory");
        return NULL;
    }
    *g = (ngram_impl){.vocab = o->vocab, .min_n = min_n, .max_n = max_n, .max_scan = max_scan,
                      .match_len = ml};
    d->ops = &ngram_ops;
    d->vocab = o->vocab;
    d->hidden_size = 0;
    /* no model: a job costs microseconds, so any batch the driver gathers
     * is fine */
    d->max_batch = INT_MAX;
    /* a continuation lies inside the searched window */
    d->max_depth = max_scan;
    d->impl = g;
    return d;
}
