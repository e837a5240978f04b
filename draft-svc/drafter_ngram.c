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
 * Seed-exact sampling (the default method, sampling.h) verifies by exact
 * match like greedy, so it gets greedy mode, suffix trie included: a lookup
 * is a guess at the token the target's race will pick.
 *
 * Rejection sampling: a lookup is deterministic, i.e. a draw from a one-hot q.
 * The verifier's recursive rejection is only lossless when siblings are
 * i.i.d. draws from the q sent with them (tree_builder.h), and i.i.d. draws
 * from a one-hot q are all the same token, so extra chains would only be
 * duplicates that can never be accepted after the first is rejected
 * (the residual of a one-hot q has zero mass at that token). So sampling
 * mode proposes one chain, the best-ranked continuation, with q = {x: 1} at
 * the pending token and at every drafted node that has a child.
 *
 * Suffix decoding (greedy mode, sessions opened through session_open, as
 * the session driver does). The drafter above forgets everything between
 * steps and counts nothing; with a session it instead keeps a suffix trie
 * (suffix_tree.h) of the request's prompt and output, grown by the tokens
 * each step adds, and drafts the best-first tree of what followed the
 * longest matching suffix (at least min_n tokens), weighted by how often
 * each continuation was seen: paths whose probability (counts, smoothed)
 * falls below min_prob are not drafted, and at most candidates x depth
 * nodes are. So where the text is certain the tree is one long chain,
 * where the counts split it branches, and where the match is weak it is
 * short or empty; each node's logq is its smoothed log path probability, an
 * acceptance estimate a cost-aware tree chooser can use.
 *
 * Sharing across requests (opts.shared, off by default): when a greedy
 * request's session closes, its output tokens (not its prompt: prompts carry the tenant's
 * documents; outputs are where templated answers, JSON and scaffolds
 * repeat) go into one deployment-wide cache (a suffix tree capped at
 * cache_max_tokens tokens; the oldest whole requests are evicted first).
 * Each step then also drafts from the cache, and the two trees are merged
 * into one: their nodes in order of path probability, a path both propose
 * once, until the node budget is spent. With
 * sharing off nothing outlives its request: the per-request tree is freed
 * when the session closes, and no request reads another's text. The cache
 * is read under a read lock (one lookup, microseconds) and written under
 * the write lock (one insert per finished request).
 *
 * Stateless callers (no session) and sampling mode use the lookup above,
 * unchanged.
 *
 * Cost per job: O(W * max_n) to score the window (W = min(max_scan,
 * n_history) positions, at most max_n comparisons each), O(W * (max_n -
 * min_n + 1)) to visit matches in rank order, plus the trie walks of the
 * visited matches, each O(depth * candidates) (a walk compares at most the
 * siblings at each level, and there are at most `candidates` leaves); the
 * history before the window is never read. No model, no per-session state. */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "draft-svc/drafter.h"
#include "common/spec/suffix_tree.h"

#define NGRAM_DEFAULT_MIN_N 1
#define NGRAM_DEFAULT_MAX_N 4
#define NGRAM_DEFAULT_MAX_SCAN 8192
/* Longer n-grams add nothing in practice (a 64-token agreement is already
 * as strong as evidence gets), and the bound lets a match length live in a
 * byte of scratch per window position. */
#define NGRAM_MAX_N_LIMIT 64
#define SUFFIX_DEFAULT_MIN_PROB 0.02f
#define SUFFIX_DEFAULT_CACHE_TOKENS 65536
#define SUFFIX_DEFAULT_DEPTH 32

typedef struct ngram_impl {
    int vocab;
    int min_n, max_n, max_scan;
    /* One propose() at a time, over the scratch below: the session driver
     * has a batcher per drafter, and the hybrid drafter (drafter_hybrid.c)
     * borrows this one, so two batchers may call it. */
    pthread_mutex_t mu;
    /* Per-call scratch, grown on demand: the match length of every window
     * position, and the trie links of the output tree. */
    uint8_t *match_len; /* [max_scan] */
    int32_t *first_child, *next_sibling; /* [tree capacity] */
    int links_cap;
    /* Suffix decoding: settings, the shared cache (NULL = not shared), and
     * two candidate trees per call (the request's own, the cache's). */
    float min_prob;
    int depth;
    specd_suffix_cache *cache;
    int32_t *sx_tok[2], *sx_par[2], *sx_map[2];
    float *sx_logq[2];
    int sx_cap;
} ngram_impl;

/* Per request: the suffix trie of its prompt and output so far. */
typedef struct ngram_session {
    specd_suffix_tree *tree;
    int32_t *hist; /* the history the tree holds (its copy: for the cache) */
    int n_hist, cap_hist, n_prompt;
    int broken;    /* out of memory once: no suffix drafts for this request */
} ngram_session;

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
    if (cap > g->sx_cap) {
        for (int k = 0; k < 2; k++) {
            int32_t *t = realloc(g->sx_tok[k], sizeof(int32_t) * (size_t)cap);
            if (t) g->sx_tok[k] = t;
            int32_t *p = realloc(g->sx_par[k], sizeof(int32_t) * (size_t)cap);
            if (p) g->sx_par[k] = p;
            float *l = realloc(g->sx_logq[k], sizeof(float) * (size_t)cap);
            if (l) g->sx_logq[k] = l;
            int32_t *m = realloc(g->sx_map[k], sizeof(int32_t) * (size_t)cap);
            if (m) g->sx_map[k] = m;
            if (!t || !p || !l || !m) return specd_seterr(err, "ngram drafter: out of memory");
        }
        g->sx_cap = cap;
    }
    if (cap <= g->links_cap) return 0;
    int32_t *fc = realloc(g->first_child, sizeof(int32_t) * ((size_t)cap + 1));
    if (fc) g->first_child = fc;
    int32_t *ns = realloc(g->next_sibling, sizeof(int32_t) * (size_t)cap);
    if (ns) g->next_sibling = ns;
    if (!fc || !ns) return specd_seterr(err, "ngram drafter: out of memory");
    g->links_cap = cap;
    return 0;
}

/* Brings the session's tree up to the job's history: normally it only
 * appends the tokens the last step added; a history that is not an
 * extension of what the tree holds (checked in full: a memcmp of a few
 * kilobytes, cheaper than any doubt) is taken in again from scratch.
 * 0, or -1 out of memory. */
static int session_sync(ngram_session *s, const specd_draft_job *job) {
    const int32_t *h = job->history;
    int n = job->n_history;
    int extends = n >= s->n_hist && s->n_prompt == job->n_prompt &&
                  (s->n_hist == 0 || !memcmp(h, s->hist, sizeof(int32_t) * (size_t)s->n_hist));
    if (!extends) {
        specd_suffix_tree_clear(s->tree);
        s->n_hist = 0;
    }
    s->n_prompt = job->n_prompt;
    if (n > s->cap_hist) {
        int cap = s->cap_hist ? s->cap_hist : 256;
        while (cap < n) cap *= 2;
        int32_t *nh = realloc(s->hist, sizeof(int32_t) * (size_t)cap);
        if (!nh) return -1;
        s->hist = nh;
        s->cap_hist = cap;
    }
    for (; s->n_hist < n; s->n_hist++) {
        if (specd_suffix_tree_append(s->tree, h[s->n_hist])) return -1;
        s->hist[s->n_hist] = h[s->n_hist];
    }
    return 0;
}

/* Greedy mode with a session: the suffix-decoding tree (see the top). */
static void propose_suffix(ngram_impl *g, ngram_session *s, specd_draft_job *job) {
    specd_tree_buf *out = job->out;
    if (s->broken || !job->history || job->n_history < 1 || job->depth < 1 || out->cap < 1)
        return;
    if (session_sync(s, job)) {
        s->broken = 1; /* the tree may be partial: stop using it */
        return;
    }
    int candidates = job->candidates < 1 ? 1 : job->candidates;
    int budget = out->cap;
    if ((int64_t)candidates * job->depth < budget) budget = candidates * job->depth;
    specd_suffix_draft d[2];
    d[0] = specd_suffix_tree_draft(s->tree, job->history, job->n_history, g->min_n, job->depth,
                                   budget, g->min_prob, g->sx_tok[0], g->sx_par[0], g->sx_logq[0]);
    d[1] = (specd_suffix_draft){0};
    if (g->cache)
        d[1] = specd_suffix_cache_draft(g->cache, job->history, job->n_history, g->min_n,
                                        job->depth, budget, g->min_prob, g->sx_tok[1],
                                        g->sx_par[1], g->sx_logq[1]);
    /* One tree from both: their nodes in order of path probability (each
     * list is in that order, parents first), a path both propose once
     * (at the higher probability), until the budget is spent. */
    int next[2] = {0, 0};
    while (out->n_nodes < budget) {
        int k;
        if (next[0] < d[0].n &&
            (next[1] >= d[1].n || g->sx_logq[0][next[0]] >= g->sx_logq[1][next[1]]))
            k = 0;
        else if (next[1] < d[1].n)
            k = 1;
        else
            break;
        int j = next[k]++;
        int src_parent = g->sx_par[k][j];
        int parent = src_parent < 0 ? -1 : g->sx_map[k][src_parent];
        g->sx_map[k][j] = -1;
        if (src_parent >= 0 && parent < 0) continue; /* its parent was not placed */
        int32_t tok = g->sx_tok[k][j];
        int c = -1;
        for (int x = 0; x < out->n_nodes && c < 0; x++)
            if (out->parents[x] == parent && out->tokens[x] == tok) c = x;
        if (c < 0 && (c = specd_tree_buf_add(out, parent, tok, g->sx_logq[k][j])) < 0) break;
        g->sx_map[k][j] = c;
    }
}

static void propose_one(ngram_impl *g, specd_draft_job *job) {
    specd_tree_buf *out = job->out;
    const int32_t *h = job->history;
    int n_hist = job->n_history;
    int depth = job->depth;
    if (!h || n_hist < 2 || depth < 1 || out->cap < 1) return;
    int sampling = specd_sampling_is(job->sampling, SPECD_SAMPLING_REJECTION);
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
    pthread_mutex_lock(&g->mu);
    if (grow_scratch(g, max_cap, err)) {
        pthread_mutex_unlock(&g->mu);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int sampling = specd_sampling_is(jobs[i].sampling, SPECD_SAMPLING_REJECTION);
        if (jobs[i].state && !sampling)
            propose_suffix(g, jobs[i].state, &jobs[i]);
        else
            propose_one(g, &jobs[i]);
    }
    pthread_mutex_unlock(&g->mu);
    return 0;
}

/* A lookup is microseconds of work under the drafter's own mutex: every job
 * runs on the caller's thread (drafter.h, propose_inline). */
static int ngram_propose_inline(specd_drafter *d, specd_draft_job *job, specd_error *err) {
    return ngram_propose(d, job, 1, err);
}

static int ngram_session_open(specd_drafter *d, void **state, specd_error *err) {
    ngram_impl *g = d->impl;
    ngram_session *s = calloc(1, sizeof *s);
    if (!s) return specd_seterr(err, "ngram drafter: out of memory");
    /* no cap: a request's own tree is bounded by its length (limits.*) */
    if (!(s->tree = specd_suffix_tree_create(g->vocab, g->depth, 0, err))) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static void ngram_session_close(specd_drafter *d, void *state) {
    ngram_impl *g = d->impl;
    ngram_session *s = state;
    /* Shared: this request's output joins the cache (tokens the final step
     * emitted after the last draft are not seen here). An insert that runs
     * out of memory just leaves a shorter document. */
    if (g->cache && !s->broken && s->n_hist > s->n_prompt)
        (void)specd_suffix_cache_insert(g->cache, s->hist + s->n_prompt, s->n_hist - s->n_prompt);
    specd_suffix_tree_free(s->tree);
    free(s->hist);
    free(s);
}

static void ngram_destroy(specd_drafter *d) {
    ngram_impl *g = d->impl;
    if (g) {
        free(g->match_len);
        free(g->first_child);
        free(g->next_sibling);
        for (int k = 0; k < 2; k++) {
            free(g->sx_tok[k]);
            free(g->sx_par[k]);
            free(g->sx_logq[k]);
            free(g->sx_map[k]);
        }
        specd_suffix_cache_free(g->cache);
        pthread_mutex_destroy(&g->mu);
        free(g);
    }
    free(d);
}

static const specd_drafter_ops ngram_ops = {
    .name = "ngram",
    .session_open = ngram_session_open, /* the request's suffix tree */
    .session_close = ngram_session_close,
    .propose = ngram_propose,
    .propose_inline = ngram_propose_inline,
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
    float min_prob = o->min_prob > 0.0f ? o->min_prob : SUFFIX_DEFAULT_MIN_PROB;
    int depth = o->depth ? o->depth : SUFFIX_DEFAULT_DEPTH;
    int64_t cache_tokens = o->cache_max_tokens ? o->cache_max_tokens : SUFFIX_DEFAULT_CACHE_TOKENS;
    if (!(min_prob <= 1.0f) || depth < 2 || depth > 256 || cache_tokens < 1) {
        specd_seterr(err, "ngram drafter: need 0 <= min_prob <= 1, 2 <= depth <= 256, "
                          "cache_max_tokens >= 1; got %g, %d, %lld",
                     (double)min_prob, depth, (long long)cache_tokens);
        return NULL;
    }
    specd_suffix_cache *cache = NULL;
    if (o->shared && !(cache = specd_suffix_cache_create(o->vocab, depth, cache_tokens, err)))
        return NULL;
    specd_drafter *d = calloc(1, sizeof *d);
    ngram_impl *g = calloc(1, sizeof *g);
    uint8_t *ml = malloc((size_t)max_scan);
    if (!d || !g || !ml) {
        free(d);
        free(g);
        free(ml);
        specd_suffix_cache_free(cache);
        specd_seterr(err, "ngram drafter: out of memory");
        return NULL;
    }
    *g = (ngram_impl){.vocab = o->vocab, .min_n = min_n, .max_n = max_n, .max_scan = max_scan,
                      .match_len = ml, .min_prob = min_prob, .depth = depth, .cache = cache};
    pthread_mutex_init(&g->mu, NULL);
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
