/* test_suffix_tree.c - the suffix trie of suffix decoding (draft-svc/
 * suffix_tree.c) and the ngram drafter's use of it (drafter_ngram.c):
 *   - every count equals a brute-force count of the pattern's occurrences
 *     in the documents held, and the trie has exactly one node per distinct
 *     string of length 1..depth (inserted whole or grown token by token);
 *   - the longest-suffix match and the draft's shape, probabilities
 *     (smoothed counts, summed in log space along the path), min_prob,
 *     node and depth budgets;
 *   - the memory cap: tokens held never exceed it, whole documents are
 *     evicted oldest first, counts stay exact, nodes are freed;
 *   - many threads inserting and drafting through the shared cache at once;
 *   - through the drafter: tenant isolation (sharing off: nothing of one
 *     request reaches another; on: outputs are shared, prompts are not). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "draft-svc/drafter.h"
#include "common/spec/suffix_tree.h"

enum { VOCAB = 16 };

static specd_suffix_tree *make(int depth, int64_t cap) {
    specd_error err = {{0}};
    specd_suffix_tree *t = specd_suffix_tree_create(VOCAB, depth, cap, &err);
    if (!t) fail_msg("create: %s", err.msg);
    return t;
}

static uint64_t rng_state = 0x12345678;
static int rnd(int n) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((rng_state >> 33) % (uint64_t)n);
}

/* Occurrences of p[0..L) in the documents held, by brute force. */
static int64_t brute_count(const specd_suffix_tree *t, const int32_t *p, int L) {
    int64_t c = 0;
    int n;
    const int32_t *d;
    for (int k = 0; (d = specd_suffix_tree_doc(t, k, &n)); k++)
        for (int j = 0; j + L <= n; j++)
            if (!memcmp(d + j, p, sizeof(int32_t) * (size_t)L)) c++;
    return c;
}

/* Every count is exact and the trie holds one node per distinct string of
 * length 1..depth (so nothing leaked and nothing stale remains). Returns
 * the number of distinct strings. */
static int64_t check_counts(const specd_suffix_tree *t) {
    int depth = specd_suffix_tree_depth(t);
    int64_t distinct = 0, held = 0;
    int n, n2;
    const int32_t *d, *d2;
    for (int k = 0; (d = specd_suffix_tree_doc(t, k, &n)); k++) {
        held += n;
        for (int i = 0; i < n; i++)
            for (int L = 1; L <= depth && i + L <= n; L++) {
                int64_t want = brute_count(t, d + i, L);
                int64_t got = specd_suffix_tree_count(t, d + i, L);
                if (got != want)
                    fail_msg("doc %d pos %d len %d: count %lld, brute force %lld", k, i, L,
                             (long long)got, (long long)want);
                /* first occurrence in (doc, position) order? */
                int first = 1;
                for (int k2 = 0; first && k2 <= k && (d2 = specd_suffix_tree_doc(t, k2, &n2));
                     k2++)
                    for (int j = 0; j + L <= n2 && (k2 < k || j < i); j++)
                        if (!memcmp(d2 + j, d + i, sizeof(int32_t) * (size_t)L)) {
                            first = 0;
                            break;
                        }
                distinct += first;
            }
    }
    assert_int_equal(specd_suffix_tree_tokens(t), held);
    assert_int_equal(specd_suffix_tree_count(t, NULL, 0), held); /* the root */
    assert_int_equal(specd_suffix_tree_nodes(t), distinct);
    return distinct;
}

static void test_counts_insert_and_append(void **state) {
    (void)state;
    specd_suffix_tree *a = make(5, 0), *b = make(5, 0);
    int32_t doc[3][40];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 40; i++) doc[k][i] = rnd(4); /* small alphabet: many repeats */
        assert_int_equal(specd_suffix_tree_insert(a, doc[k], 40), 0);
    }
    check_counts(a);
    /* the same documents grown one token at a time: identical counts; a
     * whole-document insert in between closes the growing one */
    for (int i = 0; i < 40; i++) assert_int_equal(specd_suffix_tree_append(b, doc[0][i]), 0);
    assert_int_equal(specd_suffix_tree_insert(b, doc[1], 40), 0);
    for (int i = 0; i < 40; i++) assert_int_equal(specd_suffix_tree_append(b, doc[2][i]), 0);
    assert_int_equal(specd_suffix_tree_docs(b), 3);
    assert_int_equal(check_counts(b), specd_suffix_tree_nodes(a));
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 40; i++)
            for (int L = 1; L <= 5 && i + L <= 40; L++)
                assert_int_equal(specd_suffix_tree_count(a, doc[k] + i, L),
                                 specd_suffix_tree_count(b, doc[k] + i, L));
    /* hand-checked: "1 2 1 2 1" has "1 2" twice, "2 1" twice, "1" 3 times */
    specd_suffix_tree *c = make(3, 0);
    const int32_t s[] = {1, 2, 1, 2, 1};
    assert_int_equal(specd_suffix_tree_insert(c, s, 5), 0);
    assert_int_equal(specd_suffix_tree_count(c, s, 1), 3);
    assert_int_equal(specd_suffix_tree_count(c, s, 2), 2);
    assert_int_equal(specd_suffix_tree_count(c, s + 1, 2), 2);
    assert_int_equal(specd_suffix_tree_count(c, s, 3), 2);
    assert_int_equal(specd_suffix_tree_count(c, s, 4), 0); /* deeper than depth 3 */
    const int32_t absent[] = {2, 2};
    assert_int_equal(specd_suffix_tree_count(c, absent, 2), 0);
    /* out-of-vocabulary tokens end a document: only "3 4" is held */
    const int32_t bad[] = {3, 4, VOCAB, 5, 6};
    specd_suffix_tree_clear(c);
    assert_int_equal(specd_suffix_tree_nodes(c), 0);
    assert_int_equal(specd_suffix_tree_insert(c, bad, 5), 0);
    assert_int_equal(specd_suffix_tree_tokens(c), 2);
    assert_int_equal(specd_suffix_tree_count(c, bad + 3, 1), 0);
    specd_suffix_tree_free(a);
    specd_suffix_tree_free(b);
    specd_suffix_tree_free(c);
}

static void test_match(void **state) {
    (void)state;
    specd_suffix_tree *t = make(8, 0);
    const int32_t doc[] = {1, 2, 3, 4, 5, 9, 2, 3, 4, 6};
    assert_int_equal(specd_suffix_tree_insert(t, doc, 10), 0);
    /* "... 7 2 3 4": "2 3 4" occurs (twice, followed by 5 and 6), "7 2 3 4" not */
    const int32_t ctx[] = {8, 7, 2, 3, 4};
    assert_int_equal(specd_suffix_tree_match(t, ctx, 5, 1, 7), 3);
    assert_int_equal(specd_suffix_tree_match(t, ctx, 5, 1, 2), 2); /* capped */
    assert_int_equal(specd_suffix_tree_match(t, ctx, 5, 4, 7), 0); /* min_len unmet */
    /* "1 2 3 4 5 9 2 3 4 6" ends in 6: it occurs, but nothing follows it */
    const int32_t end[] = {4, 6};
    assert_int_equal(specd_suffix_tree_match(t, end, 2, 1, 7), 0);
    const int32_t none[] = {11};
    assert_int_equal(specd_suffix_tree_match(t, none, 1, 1, 7), 0);
    specd_suffix_tree_free(t);
}

static void test_draft_probabilities(void **state) {
    (void)state;
    specd_suffix_tree *t = make(8, 0);
    /* after "1 2": 3 three times (then 4, 4, 5), 7 once */
    const int32_t doc[] = {1, 2, 3, 4, 0, 1, 2, 3, 4, 6, 1, 2, 3, 5, 0, 1, 2, 7, 0};
    assert_int_equal(specd_suffix_tree_insert(t, doc, (int)(sizeof doc / sizeof doc[0])), 0);
    const int32_t ctx[] = {9, 1, 2};
    int32_t tok[16], par[16];
    float lq[16];
    /* paths of up to 8 tokens in a trie 8 deep: the match gets 1 token */
    specd_suffix_draft d = specd_suffix_tree_draft(t, ctx, 3, 1, 8, 16, 0.0f, tok, par, lq);
    assert_int_equal(d.match_len, 1);
    d = specd_suffix_tree_draft(t, ctx, 3, 1, 6, 16, 0.0f, tok, par, lq);
    /* "1 2" is the longest match ("9 1 2" never occurs) */
    assert_int_equal(d.match_len, 2);
    /* p(child) = count / (siblings' counts + 1/L), L = the parent's length:
     * best first: 3 (3/4.5), then under it 4 (2/3 * 2/(3 + 1/3) = 0.4),
     * then 7 (1/4.5), then 5 (2/3 * 1/(3 + 1/3) = 0.2), ... */
    assert_true(d.n >= 4);
    assert_int_equal(tok[0], 3);
    assert_int_equal(par[0], -1);
    assert_float_equal(lq[0], logf(3.0f / 4.5f), 1e-5);
    assert_int_equal(tok[1], 4);
    assert_int_equal(par[1], 0);
    assert_float_equal(lq[1], logf(3.0f / 4.5f * 2.0f / (3.0f + 1.0f / 3.0f)), 1e-5);
    assert_int_equal(tok[2], 7);
    assert_int_equal(par[2], -1);
    assert_float_equal(lq[2], logf(1.0f / 4.5f), 1e-5);
    float score = 0;
    for (int i = 0; i < d.n; i++) {
        /* parents first, path probabilities never grow along a path */
        assert_true(par[i] < i);
        if (par[i] >= 0) assert_true(lq[i] <= lq[par[i]]);
        for (int j = 0; j < i; j++) /* no duplicate siblings */
            assert_false(par[j] == par[i] && tok[j] == tok[i]);
        score += expf(lq[i]);
    }
    assert_float_equal(d.score, score, 1e-4);
    /* min_prob 0.25 keeps 3 (0.67) and 3 4 (0.4) only */
    d = specd_suffix_tree_draft(t, ctx, 3, 1, 6, 16, 0.25f, tok, par, lq);
    assert_int_equal(d.n, 2);
    /* budgets: 1 node; depth 1 (3 and 7, then 5? no: 5 is at depth 2) */
    d = specd_suffix_tree_draft(t, ctx, 3, 1, 6, 1, 0.0f, tok, par, lq);
    assert_int_equal(d.n, 1);
    d = specd_suffix_tree_draft(t, ctx, 3, 1, 1, 16, 0.0f, tok, par, lq);
    assert_int_equal(d.n, 2);
    assert_int_equal(par[0], -1);
    assert_int_equal(par[1], -1);
    /* a pattern seen more often is trusted more: nine agreeing sightings */
    specd_suffix_tree *u = make(8, 0);
    for (int k = 0; k < 9; k++) {
        const int32_t rep[] = {1, 2, 3};
        assert_int_equal(specd_suffix_tree_insert(u, rep, 3), 0);
    }
    d = specd_suffix_tree_draft(u, ctx, 3, 1, 6, 16, 0.0f, tok, par, lq);
    assert_int_equal(d.n, 1);
    assert_float_equal(lq[0], logf(9.0f / 9.5f), 1e-5);
    /* a run of seven 5s in its own tree, paths of 2 (matches up to 6): the
     * longest match, six 5s, was seen once before, followed by one 5 and
     * then the text's end (a 1-node tree, 0.86); after three 5s a 5 came
     * four times, after four three times (0.92, then 0.85: 1.78 in all):
     * that tree scores higher, and wins */
    specd_suffix_tree *r = make(8, 0);
    int32_t run[7];
    for (int i = 0; i < 7; i++) {
        run[i] = 5;
        assert_int_equal(specd_suffix_tree_append(r, 5), 0);
    }
    d = specd_suffix_tree_draft(r, run, 7, 1, 2, 16, 0.0f, tok, par, lq);
    assert_true(d.match_len < 6);
    assert_int_equal(d.n, 2);
    assert_int_equal(par[1], 0);
    specd_suffix_tree_free(r);
    specd_suffix_tree_free(u);
    specd_suffix_tree_free(t);
}

static void test_eviction_cap(void **state) {
    (void)state;
    enum { CAP = 100, DEPTH = 6 };
    specd_suffix_tree *t = make(DEPTH, CAP);
    int32_t doc[30];
    int lens[200];
    for (int k = 0; k < 200; k++) {
        lens[k] = 1 + rnd(30);
        for (int i = 0; i < lens[k]; i++) doc[i] = rnd(6);
        assert_int_equal(specd_suffix_tree_insert(t, doc, lens[k]), 0);
        assert_true(specd_suffix_tree_tokens(t) <= CAP);
        assert_true(specd_suffix_tree_nodes(t) <= (int64_t)CAP * DEPTH);
        /* FIFO: the documents held are exactly the newest ones that fit */
        int64_t sum = 0;
        int held = 0;
        for (int j = k; j >= 0 && sum + lens[j] <= CAP; j--) sum += lens[j], held++;
        assert_int_equal(specd_suffix_tree_docs(t), held);
        assert_int_equal(specd_suffix_tree_tokens(t), sum);
        assert_int_equal(specd_suffix_tree_evicted(t), k + 1 - held);
        if (k % 20 == 19) check_counts(t);
    }
    check_counts(t);
    /* a document longer than the cap keeps its first CAP tokens, alone */
    int32_t big[150];
    for (int i = 0; i < 150; i++) big[i] = i % VOCAB;
    assert_int_equal(specd_suffix_tree_insert(t, big, 150), 0);
    assert_int_equal(specd_suffix_tree_docs(t), 1);
    assert_int_equal(specd_suffix_tree_tokens(t), CAP);
    check_counts(t);
    /* growing documents are capped the same way: older ones go first */
    for (int i = 0; i < 30; i++) assert_int_equal(specd_suffix_tree_append(t, 7), 0);
    assert_int_equal(specd_suffix_tree_docs(t), 1); /* the big one went */
    assert_int_equal(specd_suffix_tree_tokens(t), 30);
    check_counts(t);
    specd_suffix_tree_clear(t);
    assert_int_equal(specd_suffix_tree_nodes(t), 0);
    assert_int_equal(specd_suffix_tree_tokens(t), 0);
    specd_suffix_tree_free(t);
}

/* ---- threads ------------------------------------------------------------- */

typedef struct worker {
    specd_suffix_cache *c;
    int id, drafts, bad;
} worker;

static void *writer_main(void *arg) {
    worker *w = arg;
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(w->id + 1);
    int32_t doc[64];
    for (int k = 0; k < 300; k++) {
        int n = 8 + (int)(s >> 60);
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            doc[i] = (int32_t)((s >> 33) % 5);
        }
        if (specd_suffix_cache_insert(w->c, doc, n)) w->bad++;
    }
    return NULL;
}

static void *reader_main(void *arg) {
    worker *w = arg;
    int32_t tok[32], par[32];
    float lq[32];
    const int32_t ctx[] = {1, 2, 3, 1, 2};
    for (int k = 0; k < 3000; k++) {
        specd_suffix_draft d = specd_suffix_cache_draft(w->c, ctx + k % 3, 5 - k % 3, 1, 6, 32,
                                                        0.01f, tok, par, lq);
        w->drafts += d.n > 0;
        for (int i = 0; i < d.n; i++)
            if (par[i] >= i || tok[i] < 0 || tok[i] >= 5 || !(lq[i] <= 0.0f)) w->bad++;
    }
    return NULL;
}

static void check_cb(const specd_suffix_tree *t, void *arg) {
    (void)arg;
    assert_true(specd_suffix_tree_tokens(t) <= 500);
    check_counts(t);
}

static void test_cache_threads(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_suffix_cache *c = specd_suffix_cache_create(VOCAB, 6, 500, &err);
    if (!c) fail_msg("%s", err.msg);
    enum { W = 3, R = 3 };
    pthread_t th[W + R];
    worker ws[W + R];
    for (int i = 0; i < W + R; i++) {
        ws[i] = (worker){.c = c, .id = i};
        /* readers start once a writer has inserted something: otherwise a
         * slow writer (the sanitizer build, a loaded machine) can leave
         * every read on an empty cache, and "drafted > 0" below fails
         * without anything being wrong */
        for (int waited = 0; i == W && waited < 10000; waited++) {
            int64_t tokens, nodes, evicted;
            int docs;
            specd_suffix_cache_stats(c, &tokens, &docs, &nodes, &evicted);
            if (docs + evicted > 0) break;
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        }
        assert_int_equal(pthread_create(&th[i], NULL, i < W ? writer_main : reader_main, &ws[i]),
                         0);
    }
    int drafted = 0;
    for (int i = 0; i < W + R; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(ws[i].bad, 0);
        drafted += ws[i].drafts;
    }
    assert_true(drafted > 0); /* the readers really read a populated cache */
    int64_t tokens, nodes, evicted;
    int docs;
    specd_suffix_cache_stats(c, &tokens, &docs, &nodes, &evicted);
    assert_true(tokens <= 500);
    assert_true(evicted > 0);
    assert_int_equal(docs + evicted, W * 300);
    specd_suffix_cache_read(c, check_cb, NULL);
    specd_suffix_cache_free(c);
}

/* ---- through the drafter --------------------------------------------------- */

typedef struct req {
    specd_drafter *d;
    void *state;
    int32_t hist[256];
    int n, n_prompt;
} req;

static void req_open(req *r, specd_drafter *d, const int32_t *prompt, int n) {
    specd_error err = {{0}};
    r->d = d;
    assert_int_equal(specd_drafter_session_open(d, &r->state, &err), 0);
    memcpy(r->hist, prompt, sizeof(int32_t) * (size_t)n);
    r->n = r->n_prompt = n;
}

/* One greedy draft step over the request's history so far. */
static void req_draft(req *r, specd_tree_buf *out, int candidates, int depth) {
    specd_sampling greedy;
    specd_sampling_init(&greedy);
    greedy.temperature = 0.0f;
    specd_tree_buf_reset(out);
    specd_draft_job job = {.state = r->state, .history = r->hist, .n_history = r->n,
                           .n_prompt = r->n_prompt, .sampling = &greedy,
                           .candidates = candidates, .depth = depth, .out = out};
    specd_error err = {{0}};
    assert_int_equal(specd_drafter_propose(r->d, &job, 1, &err), 0);
    specd_tree view;
    specd_tree_buf_view(out, 0, &view);
    if (out->n_nodes && specd_tree_validate(&view, VOCAB, out->cap, 0, &err))
        fail_msg("invalid tree: %s", err.msg);
}

static void req_emit(req *r, const int32_t *toks, int n) {
    memcpy(r->hist + r->n, toks, sizeof(int32_t) * (size_t)n);
    r->n += n;
}

static specd_drafter *ngram(int shared) {
    specd_error err = {{0}};
    specd_ngram_drafter_opts o = {.vocab = VOCAB, .shared = shared, .cache_max_tokens = 1000};
    specd_drafter *d = specd_ngram_drafter_create(&o, &err);
    if (!d) fail_msg("%s", err.msg);
    return d;
}

/* Tenant A's prompt holds a secret (12 13 14 15) and its output a
 * templated answer (1 2 3 4 5 6); B's context then ends in A's words. */
static void isolation(int shared, specd_tree_buf *out) {
    specd_drafter *d = ngram(shared);
    req a, b;
    const int32_t pa[] = {9, 12, 13, 14, 15, 9};
    const int32_t outa[] = {1, 2, 3, 4, 5, 6};
    req_open(&a, d, pa, 6);
    req_draft(&a, out, 1, 5);
    req_emit(&a, outa, 6);
    req_draft(&a, out, 1, 5);
    specd_drafter_session_close(d, a.state);

    const int32_t pb[] = {8, 8, 1, 2};
    req_open(&b, d, pb, 4);
    req_draft(&b, out, 2, 5);
    if (shared) {
        /* "1 2" -> A's "3 4 5 6", one sighting each: 1 / (1 + 1/L) after a
         * context of L = 2, 3, 4, 5 tokens */
        assert_int_equal(out->n_nodes, 4);
        const int32_t want[] = {3, 4, 5, 6};
        float lp = 0.0f;
        for (int i = 0; i < 4; i++) {
            lp += logf(1.0f / (1.0f + 1.0f / (float)(2 + i)));
            assert_int_equal(out->tokens[i], want[i]);
            assert_float_equal(out->logq[i], lp, 1e-5);
        }
    } else {
        assert_int_equal(out->n_nodes, 0); /* nothing of A's */
    }
    specd_drafter_session_close(d, b.state);
    /* A's prompt is never shared */
    const int32_t pc[] = {7, 12, 13};
    req c;
    req_open(&c, d, pc, 3);
    req_draft(&c, out, 2, 5);
    assert_int_equal(out->n_nodes, 0);
    specd_drafter_session_close(d, c.state);
    if (shared) {
        /* own text and the cache both know "1 2": one tree holds both
         * continuations (own: 9, the cache: 3), each at its probability */
        const int32_t pd[] = {1, 2, 9, 0, 1, 2};
        req e;
        req_open(&e, d, pd, 6);
        req_draft(&e, out, 2, 5);
        int saw9 = 0, saw3 = 0;
        for (int i = 0; i < out->n_nodes; i++)
            if (out->parents[i] == -1) {
                saw9 += out->tokens[i] == 9;
                saw3 += out->tokens[i] == 3;
                assert_float_equal(out->logq[i], logf(1.0f / 1.5f), 1e-5);
            }
        assert_int_equal(saw9, 1);
        assert_int_equal(saw3, 1);
        specd_drafter_session_close(d, e.state);
    }
    specd_drafter_free(d);
}

static void test_drafter_isolation(void **state) {
    (void)state;
    specd_tree_buf out;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&out, 32, 0, &err), 0);
    isolation(0, &out);
    isolation(1, &out);
    specd_tree_buf_free(&out);
}

/* Within one request the drafter learns from the request's own text, a
 * step at a time, and its logq are the smoothed path probabilities. */
static void test_drafter_own_request(void **state) {
    (void)state;
    specd_tree_buf out;
    specd_error err = {{0}};
    assert_int_equal(specd_tree_buf_init(&out, 32, 0, &err), 0);
    specd_drafter *d = ngram(0);
    req r;
    const int32_t p[] = {1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 0, 1, 2};
    req_open(&r, d, p, 15);
    req_draft(&r, &out, 4, 3);
    /* "1 2" was followed by 3 three times: 3 at 3/3.5; then "1 2 3" by 4
     * twice and 5 once: 4 at 2/(3 + 1/3) */
    assert_true(out.n_nodes >= 3);
    assert_int_equal(out.tokens[0], 3);
    assert_float_equal(out.logq[0], logf(3.0f / 3.5f), 1e-5);
    assert_int_equal(out.tokens[1], 4);
    assert_int_equal(out.parents[1], 0);
    assert_float_equal(out.logq[1], logf(3.0f / 3.5f * 0.6f), 1e-5);
    /* candidates x depth caps the nodes */
    req_draft(&r, &out, 1, 2);
    assert_true(out.n_nodes <= 2);
    /* the output counts as soon as it is in the history */
    const int32_t o1[] = {3, 9, 9, 9};
    req_emit(&r, o1, 4);
    const int32_t o2[] = {1, 2, 3};
    req_emit(&r, o2, 3);
    req_draft(&r, &out, 1, 3); /* "1 2 3" -> 4 twice, 5 once, 9 once */
    assert_true(out.n_nodes >= 1);
    assert_int_equal(out.tokens[0], 4);
    /* a history that is not an extension (a reused session) is rebuilt */
    r.n = r.n_prompt = 3;
    req_draft(&r, &out, 1, 3);
    assert_int_equal(out.n_nodes, 0);
    /* ...also when it is longer and ends like the old one: "1 2 3 1 2"
     * held, then "7 8 9 1 2 5 1 2" (the same token at the old end): only
     * the new text counts, "1 2" -> 5 alone (not 3 and 5) */
    const int32_t held[] = {1, 2, 3, 1, 2}, now[] = {7, 8, 9, 1, 2, 5, 1, 2};
    memcpy(r.hist, held, sizeof held);
    r.n = r.n_prompt = 5;
    req_draft(&r, &out, 1, 3);
    memcpy(r.hist, now, sizeof now);
    r.n = 8;
    req_draft(&r, &out, 2, 1);
    assert_int_equal(out.n_nodes, 1);
    assert_int_equal(out.tokens[0], 5);
    assert_float_equal(out.logq[0], logf(1.0f / 1.5f), 1e-5);
    specd_drafter_session_close(d, r.state);
    specd_drafter_free(d);
    specd_tree_buf_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_insert_and_append),
        cmocka_unit_test(test_match),
        cmocka_unit_test(test_draft_probabilities),
        cmocka_unit_test(test_eviction_cap),
        cmocka_unit_test(test_cache_threads),
        cmocka_unit_test(test_drafter_isolation),
        cmocka_unit_test(test_drafter_own_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
