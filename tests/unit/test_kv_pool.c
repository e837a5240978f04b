/* test_kv_pool.c - the shared KV page pool and its prefix cache.
 *
 *   - the pool alone: random alloc / release / publish / lookup / unpublish
 *     against a shadow model of each page's references, every invariant
 *     checked after every operation; LRU eviction order; hits need the same
 *     parent key and tokens;
 *   - copy on write: a slot that writes into a page it shares gets a copy,
 *     and the other slot's rows and logits stay as they were; the same for
 *     kv_compact (a verify step keeping its accepted rows) moving rows into
 *     a partly filled page of a shared prefix, and a published page it holds
 *     alone loses its key, so no later session attaches rows that changed;
 *   - the scheduler under churn: sessions of random lengths with shared
 *     prefixes join, grow, get cancelled and get preempted when a small pool
 *     runs dry (re-opened from their tokens, as draft-svc does); the page
 *     accounting is checked after every step, and every finished session's
 *     greedy tokens equal its tokens when run alone;
 *   - the admission queue: new prompts start first come, first served and
 *     wait up to queue_wait (not kv_wait), then get NO_PAGES saying so; a
 *     started prompt's remaining pages are promised to it, so two prompts
 *     that do not fit side by side run one after the other, unpreempted;
 *   - the start-up error for a pool smaller than one whole context.
 *
 * Model: the tiny golden Llama (tests/golden/data/tiny-gqa). */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/util/rng.h"
#include "common/model/kv_pool.h"
#include "target-svc/scheduler.h"
#include "tests/harness/test_util.h"

#define R SPECD_KV_PAGE_ROWS

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* --- the pool alone ---------------------------------------------------------- */

static void check_pool(const specd_kv_pool *p, const int *refs) {
    specd_error err = {{0}};
    if (specd_kv_pool_check(p, refs, &err)) fail_msg("%s", err.msg);
}

static void test_pool_random_ops(void **state) {
    (void)state;
    enum { N = 12, OPS = 20000 };
    specd_error err = {{0}};
    specd_kv_pool *p = specd_kv_pool_create(N, &err);
    assert_non_null(p);
    int refs[N] = {0};
    /* four possible page contents; a page may carry one of them */
    int32_t toks[4][R];
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < R; i++) toks[c][i] = c * 100 + i;
    uint64_t seed = 7;
    for (int op = 0; op < OPS; op++) {
        int c = (int)(lcg(&seed) % 4);
        uint64_t key = specd_kv_page_key(0, toks[c]);
        switch (lcg(&seed) % 5) {
        case 0:
        case 1: { /* allocate */
            int32_t pg = specd_kv_pool_alloc(p);
            if (pg >= 0) {
                assert_int_equal(refs[pg], 0);
                refs[pg] = 1;
            } else {
                assert_int_equal(specd_kv_pool_available(p), 0);
            }
            break;
        }
        case 2: { /* release a random held page */
            int32_t pg = (int32_t)(lcg(&seed) % N);
            if (refs[pg] > 0) {
                specd_kv_pool_release(p, pg);
                refs[pg]--;
            }
            break;
        }
        case 3: { /* publish a held page */
            int32_t pg = (int32_t)(lcg(&seed) % N);
            if (refs[pg] > 0) specd_kv_pool_publish(p, pg, key, 0, toks[c]);
            break;
        }
        default: { /* look a content up */
            int32_t pg = specd_kv_pool_lookup(p, key, 0, toks[c]);
            if (pg >= 0) {
                assert_true(specd_kv_pool_is_keyed(p, pg));
                refs[pg]++;
            }
            break;
        }
        }
        check_pool(p, refs);
    }
    specd_kv_pool_stats st;
    specd_kv_pool_get_stats(p, &st);
    assert_true(st.hit_pages > 0 && st.hit_pages < st.lookup_pages);
    assert_true(st.evictions > 0);
    specd_kv_pool_free(p);
}

static void test_pool_lru_and_keys(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_kv_pool *p = specd_kv_pool_create(3, &err);
    int32_t t[3][R];
    uint64_t k[3];
    for (int c = 0; c < 3; c++) {
        for (int i = 0; i < R; i++) t[c][i] = c * 7 + i;
        k[c] = specd_kv_page_key(c ? k[c - 1] : 0, t[c]);
    }
    int32_t pg[3];
    for (int c = 0; c < 3; c++) {
        pg[c] = specd_kv_pool_alloc(p);
        assert_int_equal(pg[c], c); /* low ids first */
        specd_kv_pool_publish(p, pg[c], k[c], c ? k[c - 1] : 0, t[c]);
    }
    /* released in the order 1, 0, 2: page 1 is the least recently used */
    specd_kv_pool_release(p, pg[1]);
    specd_kv_pool_release(p, pg[0]);
    specd_kv_pool_release(p, pg[2]);
    assert_int_equal(specd_kv_pool_available(p), 3);
    /* a hit needs the same parent: page 1's tokens under parent 0 miss */
    assert_int_equal(specd_kv_pool_lookup(p, k[1], 0, t[1]), -1);
    int32_t tweaked[R];
    memcpy(tweaked, t[0], sizeof tweaked);
    tweaked[5]++;
    assert_int_equal(specd_kv_pool_lookup(p, k[0], 0, tweaked), -1);
    assert_int_equal(specd_kv_pool_lookup(p, k[0], 0, t[0]), pg[0]); /* reused: leaves the LRU */
    assert_int_equal(specd_kv_pool_alloc(p), pg[1]);                 /* evicts the oldest */
    assert_int_equal(specd_kv_pool_alloc(p), pg[2]);
    assert_int_equal(specd_kv_pool_alloc(p), -1);
    int refs[3] = {1, 1, 1};
    check_pool(p, refs);
    specd_kv_pool_free(p);
}

/* --- the model ---------------------------------------------------------------- */

#define CTX 160
#define MAX_BATCH 64

static specd_model_file *open_model(void) {
    specd_error err = {{0}};
    specd_model_file *m = specd_model_open(test_path("tests/golden/data/tiny-gqa/hf"), &err);
    if (!m) fail_msg("%s", err.msg);
    return m;
}

static specd_transformer *make_t(specd_model_file *m, int slots, int pages, int cache) {
    specd_error err = {{0}};
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 2}, .n_slots = slots,
                                .max_ctx = CTX, .max_batch = MAX_BATCH, .kv_pages = pages,
                                .prefix_cache = cache};
    specd_transformer *t = specd_transformer_create(m, &o, &err);
    if (!t) fail_msg("%s", err.msg);
    return t;
}

/* Runs tokens[0..n) into the slot from row n_past in chunks, returning the
 * logits of the last row. */
static void run_rows(specd_transformer *t, int slot, int n_past, const int32_t *tokens, int n,
                     float *logits) {
    specd_error err = {{0}};
    for (int done = 0; done < n;) {
        int take = n - done < MAX_BATCH ? n - done : MAX_BATCH;
        int32_t last = take - 1;
        specd_seq_input in = {.slot = slot, .n_past = n_past + done, .n_new = take};
        specd_batch b = {.n_tokens = take, .tokens = tokens + done, .n_seqs = 1, .seqs = &in,
                         .n_out = 1, .out_rows = &last, .logits = logits};
        if (specd_transformer_forward(t, &b, &err)) fail_msg("%s", err.msg);
        done += take;
    }
}

/* Greedy tokens of a prompt, run alone in a fresh cache. */
static void greedy_alone(specd_model_file *m, const int32_t *prompt, int n, int n_gen,
                         int32_t *out) {
    specd_transformer *t = make_t(m, 1, 0, 0);
    int vocab = m->hp.vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    run_rows(t, 0, 0, prompt, n, logits);
    for (int g = 0; g < n_gen; g++) {
        out[g] = specd_argmax(logits, vocab);
        if (g + 1 < n_gen) run_rows(t, 0, n + g, &out[g], 1, logits);
    }
    free(logits);
    specd_transformer_free(t);
}

static double max_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) {
        double e = a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
        if (e > d) d = e;
    }
    return d;
}

static void check_t(const specd_transformer *t) {
    specd_error err = {{0}};
    if (specd_transformer_check_pages(t, &err)) fail_msg("%s", err.msg);
}

static void test_copy_on_write(void **state) {
    (void)state;
    specd_model_file *m = open_model();
    specd_transformer *t = make_t(m, 2, 0, 1);
    int vocab = m->hp.vocab_size;
    float *a = malloc(sizeof(float) * (size_t)vocab), *b = malloc(sizeof(float) * (size_t)vocab);
    int32_t prompt[3 * R + 1];
    for (int i = 0; i < 3 * R + 1; i++) prompt[i] = (i * 37 + 11) % vocab;
    /* slot 0 computes the prompt and publishes its three full pages */
    run_rows(t, 0, 0, prompt, 3 * R + 1, a);
    specd_transformer_prefix_publish(t, 0, prompt, 3 * R + 1);
    /* slot 1 shares them, computes the last token alone: the same logits */
    assert_int_equal(specd_transformer_prefix_attach(t, 1, prompt, 3 * R + 1), 3 * R);
    check_t(t);
    run_rows(t, 1, 3 * R, prompt + 3 * R, 1, b);
    assert_memory_equal(a, b, sizeof(float) * (size_t)vocab);
    /* slot 1 now rewrites from row 2R + 3 on with other tokens: page 2 is
     * shared, so slot 1 gets a copy and slot 0 keeps its rows */
    int32_t other[5] = {1, 2, 3, 4, 5};
    int free_before;
    specd_transformer_kv_pages(t, &free_before, NULL);
    assert_int_equal(specd_transformer_pages_needed(t, 1, 2 * R + 3, 5), 1);
    run_rows(t, 1, 2 * R + 3, other, 5, b);
    check_t(t);
    int32_t pending = specd_argmax(a, vocab);
    float *a2 = malloc(sizeof(float) * (size_t)vocab), *ref = malloc(sizeof(float) * (size_t)vocab);
    run_rows(t, 0, 3 * R + 1, &pending, 1, a2);
    /* the reference: the same two tokens of slot 0's history in a fresh cache */
    specd_transformer *alone = make_t(m, 1, 0, 0);
    int32_t hist[3 * R + 2];
    memcpy(hist, prompt, sizeof prompt);
    hist[3 * R + 1] = pending;
    run_rows(alone, 0, 0, hist, 3 * R + 2, ref);
    /* to rounding: the reference ran the row inside a bigger batch (a
     * clobbered page would move the logits by far more) */
    assert_true(max_diff(a2, ref, vocab) < 1e-4);
    assert_int_equal(specd_argmax(a2, vocab), specd_argmax(ref, vocab));
    specd_transformer_release_slot(t, 0);
    specd_transformer_release_slot(t, 1);
    check_t(t);
    specd_kv_pool_stats st;
    specd_transformer_kv_stats(t, &st);
    assert_int_equal(st.n_held, 0);
    assert_int_equal(st.n_cached, 3); /* the published pages stay reusable */
    free(a);
    free(b);
    free(a2);
    free(ref);
    specd_transformer_free(alone);
    specd_transformer_free(t);
    specd_model_close(m);
}

/* kv_compact writes rows too: into a shared page only through a copy, into
 * a cached prefix page only after taking its key off. */
static void test_compact_copy_on_write(void **state) {
    (void)state;
    specd_model_file *m = open_model();
    specd_transformer *t = make_t(m, 3, 0, 1);
    specd_error err = {{0}};
    int vocab = m->hp.vocab_size;
    enum { N = 2 * R + 5 };
    float *a = malloc(sizeof(float) * (size_t)vocab), *b = malloc(sizeof(float) * (size_t)vocab);
    int32_t prompt[N];
    for (int i = 0; i < N; i++) prompt[i] = (i * 53 + 7) % vocab;
    /* rows R+3.. of the prompt read as a verified tree: keep new rows 0, 2
     * and 5, so rows R+4 and R+5 (page 1) are overwritten */
    const int32_t keep[3] = {0, 2, 5};

    /* (1) shared: slot 0 computes and publishes pages 0 and 1, slot 1
     * shares them; slot 0 compacts into page 1, which must be copied */
    run_rows(t, 0, 0, prompt, N, a);
    specd_transformer_prefix_publish(t, 0, prompt, N);
    assert_int_equal(specd_transformer_prefix_attach(t, 1, prompt, N), 2 * R);
    int free_before;
    specd_transformer_kv_pages(t, &free_before, NULL);
    if (specd_transformer_kv_compact(t, 0, R + 3, keep, 3, &err)) fail_msg("%s", err.msg);
    check_t(t);
    int free_after;
    specd_transformer_kv_pages(t, &free_after, NULL);
    /* one page taken for the copy, one given back (page 2: rows past R+6) */
    assert_int_equal(free_after, free_before);
    /* slot 1's shared rows are the prompt's still: its last rows give the
     * logits slot 0 had */
    run_rows(t, 1, 2 * R, prompt + 2 * R, N - 2 * R, b);
    assert_memory_equal(a, b, sizeof(float) * (size_t)vocab);
    specd_transformer_release_slot(t, 0);
    specd_transformer_release_slot(t, 1);
    check_t(t);

    /* (2) alone: slot 2 computes another prompt and publishes its pages,
     * then compacts into page 1, which it holds alone: the page must lose
     * its key, so a later attach finds page 0 only and computes the rest
     * (with the key kept it would attach the changed rows). */
    int32_t other[N];
    for (int i = 0; i < N; i++) other[i] = (i * 29 + 3) % vocab;
    run_rows(t, 2, 0, other, N, a);
    specd_transformer_prefix_publish(t, 2, other, N);
    if (specd_transformer_kv_compact(t, 2, R + 3, keep, 3, &err)) fail_msg("%s", err.msg);
    check_t(t);
    specd_transformer_release_slot(t, 2);
    int rows = specd_transformer_prefix_attach(t, 0, other, N);
    assert_int_equal(rows, R);
    run_rows(t, 0, rows, other + rows, N - rows, b);
    assert_memory_equal(a, b, sizeof(float) * (size_t)vocab);
    specd_transformer_release_slot(t, 0);
    check_t(t);
    free(a);
    free(b);
    specd_transformer_free(t);
    specd_model_close(m);
}

static void test_pool_too_small(void **state) {
    (void)state;
    specd_model_file *m = open_model();
    specd_error err = {{0}};
    /* 2 layers x 2 kv heads x 16 x 4 bytes x K,V = 512 bytes a row, 8 KiB a
     * page: 4 pages cannot hold a 160-token context (10 pages) */
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 1}, .n_slots = 4,
                                .max_ctx = CTX, .max_batch = MAX_BATCH, .kv_memory = 4 * 8192};
    assert_null(specd_transformer_create(m, &o, &err));
    assert_non_null(strstr(err.msg, "limits.kv_memory"));
    assert_non_null(strstr(err.msg, "160"));
    o.kv_memory = 10 * 8192;
    specd_transformer *t = specd_transformer_create(m, &o, &err);
    assert_non_null(t);
    int total;
    specd_transformer_kv_pages(t, NULL, &total);
    assert_int_equal(total, 10);
    specd_transformer_free(t);
    specd_model_close(m);
}

/* --- the scheduler under churn ---------------------------------------------------- */

#define N_THREADS 6
#define SESSIONS_PER_THREAD 6
#define MAX_GEN 40

typedef struct sess {
    int32_t hist[CTX];
    int n_prompt, n_gen, n_out, cancel_at, steps, preempted, cancelled;
} sess;

typedef struct churn {
    specd_sched *sched;
    sess *sessions;
    int first, n;
} churn;

/* cmocka's failures longjmp, which only the main thread may do: the session
 * threads record the first failure here and stop; the main thread fails. */
static pthread_mutex_t g_fail_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_fail[640];

static void churn_fail(const char *what, const char *msg) {
    pthread_mutex_lock(&g_fail_mu);
    if (!g_fail[0]) snprintf(g_fail, sizeof g_fail, "%.100s: %.500s", what, msg);
    pthread_mutex_unlock(&g_fail_mu);
}

static int probe(void *arg) {
    const sess *s = arg;
    return s->cancel_at > 0 && s->steps >= s->cancel_at;
}

static int check_sched(specd_sched *sched) {
    specd_error err = {{0}};
    if (!specd_sched_check_pages(sched, &err)) return 0;
    churn_fail("page accounting after a step", err.msg);
    return -1;
}

static void *churn_main(void *arg) {
    churn *c = arg;
    specd_sampling greedy;
    memset(&greedy, 0, sizeof greedy);
    for (int k = 0; k < c->n; k++) {
        sess *s = &c->sessions[c->first + k];
        /* open (again after a preemption) with the whole history as prompt */
        while (!s->cancelled && s->n_out < s->n_gen) {
            int slot;
            while ((slot = specd_sched_acquire_slot(c->sched)) < 0) {
                struct timespec ts = {0, 2000000};
                nanosleep(&ts, NULL);
            }
            specd_work w;
            memset(&w, 0, sizeof w);
            w.kind = SPECD_WORK_PREFILL;
            w.slot = slot;
            w.tokens = s->hist;
            w.n_tokens = s->n_prompt + s->n_out;
            int n_past = w.n_tokens;
            for (;;) {
                w.sampling = &greedy;
                w.is_cancelled = probe;
                w.cancel_arg = s;
                int rc = specd_sched_run(c->sched, &w);
                s->steps++;
                if (check_sched(c->sched)) return NULL;
                if (rc == SPECD_WORK_CANCELLED) {
                    s->cancelled = 1;
                    break;
                }
                if (rc == SPECD_WORK_NO_PAGES && strstr(w.err.msg, "KV pool full")) {
                    s->preempted++;
                    break;
                }
                if (rc != SPECD_WORK_OK) {
                    churn_fail("session step", w.err.msg);
                    specd_sched_release_slot(c->sched, slot);
                    return NULL;
                }
                s->hist[s->n_prompt + s->n_out++] = w.next_token;
                if (s->n_out == s->n_gen) break;
                memset(&w, 0, sizeof w);
                w.kind = SPECD_WORK_DECODE;
                w.slot = slot;
                w.n_past = n_past;
                w.tokens = &s->hist[s->n_prompt + s->n_out - 1];
                w.n_tokens = 1;
                n_past++;
            }
            specd_sched_release_slot(c->sched, slot);
        }
    }
    return NULL;
}

static void churn_run(int cache, int *preempted_total, int *hits) {
    specd_model_file *m = open_model();
    /* 5 sessions of up to 140 rows each would want 45 pages: 14 run dry */
    specd_transformer *t = make_t(m, 5, 14, cache);
    specd_error err = {{0}};
    specd_sched_opts so = {.n_slots = 5, .max_batch_tokens = MAX_BATCH, .max_wait_ms = 0,
                           .prefill_chunk = 24, .kv_wait_ms = 300};
    specd_sched *sched = specd_sched_create(t, &so, &err);
    assert_non_null(sched);
    int vocab = m->hp.vocab_size;
    enum { N = N_THREADS * SESSIONS_PER_THREAD };
    sess *ss = calloc(N, sizeof(sess));
    int32_t bases[3][64];
    for (int b = 0; b < 3; b++)
        for (int i = 0; i < 64; i++) bases[b][i] = (b * 131 + i * 17 + 5) % vocab;
    uint64_t seed = 12345;
    for (int i = 0; i < N; i++) {
        sess *s = &ss[i];
        /* a shared prefix of 20..64 tokens from one of three bases, then
         * 1..35 tokens of its own */
        int b = (int)(lcg(&seed) % 3), pre = 20 + (int)(lcg(&seed) % 45);
        int own = 1 + (int)(lcg(&seed) % 35);
        memcpy(s->hist, bases[b], sizeof(int32_t) * (size_t)pre);
        for (int j = 0; j < own; j++) s->hist[pre + j] = (int32_t)(lcg(&seed) % vocab);
        s->n_prompt = pre + own;
        s->n_gen = 1 + (int)(lcg(&seed) % MAX_GEN);
        s->cancel_at = lcg(&seed) % 6 == 0 ? 1 + (int)(lcg(&seed) % 8) : 0;
    }
    pthread_t th[N_THREADS];
    churn cs[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        cs[i] = (churn){sched, ss, i * SESSIONS_PER_THREAD, SESSIONS_PER_THREAD};
        pthread_create(&th[i], NULL, churn_main, &cs[i]);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    if (g_fail[0]) fail_msg("%s", g_fail);
    if (check_sched(sched)) fail_msg("%s", g_fail);
    int finished = 0;
    *preempted_total = 0;
    for (int i = 0; i < N; i++) {
        sess *s = &ss[i];
        *preempted_total += s->preempted;
        if (s->cancelled) continue;
        int32_t ref[MAX_GEN];
        greedy_alone(m, s->hist, s->n_prompt, s->n_gen, ref);
        assert_memory_equal(ref, s->hist + s->n_prompt, sizeof(int32_t) * (size_t)s->n_gen);
        finished++;
    }
    assert_true(finished > N / 2);
    specd_kv_pool_stats st;
    specd_sched_kv_stats(sched, &st);
    *hits = (int)st.hit_pages;
    specd_sched_free(sched);
    /* every slot was released: nothing is held once the worker has run */
    for (int s = 0; s < 5; s++) specd_transformer_release_slot(t, s);
    check_t(t);
    specd_transformer_kv_stats(t, &st);
    assert_int_equal(st.n_held, 0);
    free(ss);
    specd_transformer_free(t);
    specd_model_close(m);
}

static void test_sched_churn(void **state) {
    (void)state;
    int preempted, hits;
    churn_run(1, &preempted, &hits);
    printf("churn with the prefix cache: %d preemptions, %d cached pages reused\n", preempted,
           hits);
    assert_true(hits > 0);
    churn_run(0, &preempted, &hits);
    printf("churn without it: %d preemptions\n", preempted);
    assert_int_equal(hits, 0);
}

/* --- the admission queue ---------------------------------------------------------- */

typedef struct queued {
    specd_sched *sched;
    int32_t tokens[CTX];
    int n, slot, rc;
    _Atomic int done;
    char err[sizeof(((specd_error *)0)->msg)];
    /* The submitting thread, and every thread that called the item's
     * cancellation probe: the runner's gather calls it for each queued
     * item it looks at, so it tells which thread ran the passes. Written
     * under the scheduler's mutex (the probe is only called holding it). */
    pthread_t self;
    pthread_t probed_by[8];
    int n_probed_by;
} queued;

static int probe_records_thread(void *arg) {
    queued *q = arg;
    pthread_t me = pthread_self();
    for (int i = 0; i < q->n_probed_by; i++)
        if (pthread_equal(q->probed_by[i], me)) return 0;
    if (q->n_probed_by < 8) q->probed_by[q->n_probed_by++] = me;
    return 0; /* never cancelled */
}

static int probed_by(const queued *q, pthread_t t) {
    for (int i = 0; i < q->n_probed_by; i++)
        if (pthread_equal(q->probed_by[i], t)) return 1;
    return 0;
}

static void *queued_main(void *arg) {
    queued *q = arg;
    specd_sampling greedy;
    memset(&greedy, 0, sizeof greedy);
    specd_work w;
    memset(&w, 0, sizeof w);
    w.kind = SPECD_WORK_PREFILL;
    w.slot = q->slot;
    w.tokens = q->tokens;
    w.n_tokens = q->n;
    w.sampling = &greedy;
    w.is_cancelled = probe_records_thread;
    w.cancel_arg = q;
    q->self = pthread_self();
    q->rc = specd_sched_run(q->sched, &w);
    snprintf(q->err, sizeof q->err, "%s", w.err.msg);
    atomic_store(&q->done, 1);
    return NULL;
}

/* A prompt of n tokens (base + j * step, mod vocab) with its own slot. */
static queued *queued_new(specd_sched *s, int n, int base, int step, int vocab) {
    queued *q = calloc(1, sizeof *q);
    assert_non_null(q);
    q->sched = s;
    q->n = n;
    for (int j = 0; j < n; j++) q->tokens[j] = (base + j * step) % vocab;
    q->slot = specd_sched_acquire_slot(s);
    assert_true(q->slot >= 0);
    return q;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (up to 10 s) until n work items are queued: the order of arrival
 * these tests depend on, without trusting a sleep on a loaded machine. */
static void wait_queued(specd_sched *s, int n) {
    for (int i = 0; i < 10000; i++) {
        int items, tokens;
        specd_sched_queue(s, &items, &tokens);
        if (items >= n) return;
        sleep_ms(1);
    }
    fail_msg("fewer than %d items queued after 10 s", n);
}

/* A holder keeps 8 of 12 pages. Prompt A (7 pages) waits; prompt B (2
 * pages) would fit but arrived later, so it waits behind A (first come,
 * first served), both well past kv_wait (a running session's bound, not a
 * new prompt's); once the holder leaves both start. With a short
 * queue_wait, A instead gets NO_PAGES naming limits.queue_wait (and B too,
 * or it starts). */
static void test_sched_admission_queue(void **state) {
    (void)state;
    specd_model_file *m = open_model();
    int vocab = m->hp.vocab_size;
    for (int round = 0; round < 2; round++) {
        specd_transformer *t = make_t(m, 3, 12, 0);
        specd_error err = {{0}};
        specd_sched_opts so = {.n_slots = 3, .max_batch_tokens = MAX_BATCH, .max_wait_ms = 0,
                               .kv_wait_ms = 50, .queue_wait_ms = round ? 150 : 0};
        specd_sched *sched = specd_sched_create(t, &so, &err);
        assert_non_null(sched);
        assert_int_equal(specd_sched_queue_wait_ms(sched), round ? 150 : 600000);
        const int lens[3] = {120, 100, 20};
        queued *qs[3];
        for (int i = 0; i < 3; i++) qs[i] = queued_new(sched, lens[i], i * 37 + 3, 11, vocab);
        queued *h = qs[0], *a = qs[1], *b = qs[2];
        queued_main(h); /* the holder's prompt: 8 pages, kept (its slot stays) */
        assert_int_equal(h->rc, SPECD_WORK_OK);
        pthread_t ta, tb;
        pthread_create(&ta, NULL, queued_main, a);
        wait_queued(sched, 1);
        pthread_create(&tb, NULL, queued_main, b);
        wait_queued(sched, 2);
        if (round == 0) {
            sleep_ms(300); /* 6 x kv_wait */
            assert_int_equal(atomic_load(&a->done), 0);
            assert_int_equal(atomic_load(&b->done), 0); /* it fits, but A came first */
            specd_sched_release_slot(sched, h->slot);
            pthread_join(ta, NULL);
            pthread_join(tb, NULL);
            if (a->rc != SPECD_WORK_OK) fail_msg("A: %s", a->err);
            if (b->rc != SPECD_WORK_OK) fail_msg("B: %s", b->err);
            /* Who ran the passes (scheduler.h): the holder, alone, ran its
             * own; A found nobody running and held the role while it
             * waited for pages, so its thread looked at B's item, which
             * rode A's passes instead of waking the worker. */
            assert_true(probed_by(h, h->self));
            assert_true(probed_by(a, a->self));
            assert_true(probed_by(b, a->self));
        } else {
            pthread_join(ta, NULL);
            assert_int_equal(a->rc, SPECD_WORK_NO_PAGES);
            assert_non_null(strstr(a->err, "limits.queue_wait"));
            assert_non_null(strstr(a->err, "100 tokens"));
            specd_sched_release_slot(sched, a->slot);
            /* B waited behind A as long (so its own queue wait may have run
             * out too); if it has not, it fits beside the holder now */
            pthread_join(tb, NULL);
            if (b->rc != SPECD_WORK_OK && !strstr(b->err, "limits.queue_wait"))
                fail_msg("B: %s", b->err);
            specd_sched_release_slot(sched, h->slot);
            a->slot = -1;
        }
        if (check_sched(sched)) fail_msg("%s", g_fail);
        if (a->slot >= 0) specd_sched_release_slot(sched, a->slot);
        specd_sched_release_slot(sched, b->slot);
        specd_sched_free(sched);
        for (int i = 0; i < 3; i++) free(qs[i]);
        specd_transformer_free(t);
    }
    specd_model_close(m);
}

/* Two prompts waiting together that fit the pool one after the other but
 * not side by side (7 + 6 pages of 12), freed at once when a holder leaves:
 * the second starts only once the first's whole prompt is accounted for
 * (started prompts' outstanding pages are promised to them), so neither is
 * preempted halfway. */
static void test_sched_prompts_promised(void **state) {
    (void)state;
    specd_model_file *m = open_model();
    int vocab = m->hp.vocab_size;
    specd_transformer *t = make_t(m, 3, 12, 0);
    specd_error err = {{0}};
    specd_sched_opts so = {.n_slots = 3, .max_batch_tokens = MAX_BATCH, .max_wait_ms = 0,
                           .prefill_chunk = 16, .kv_wait_ms = 50};
    specd_sched *sched = specd_sched_create(t, &so, &err);
    assert_non_null(sched);
    const int lens[3] = {120, 100, 96};
    queued *qs[3];
    for (int i = 0; i < 3; i++) qs[i] = queued_new(sched, lens[i], i * 53 + 1, 7, vocab);
    queued *h = qs[0], *a = qs[1], *b = qs[2];
    queued_main(h); /* 8 pages held: neither A nor B can start */
    assert_int_equal(h->rc, SPECD_WORK_OK);
    pthread_t ta, tb;
    pthread_create(&ta, NULL, queued_main, a);
    wait_queued(sched, 1);
    pthread_create(&tb, NULL, queued_main, b);
    wait_queued(sched, 2);
    specd_sched_release_slot(sched, h->slot); /* both could start now, one at a time fit */
    pthread_join(ta, NULL);
    if (a->rc != SPECD_WORK_OK) fail_msg("A: %s", a->err);
    specd_sched_release_slot(sched, a->slot); /* A's session ends: B's pages are there */
    pthread_join(tb, NULL);
    if (b->rc != SPECD_WORK_OK) fail_msg("B: %s", b->err);
    if (check_sched(sched)) fail_msg("%s", g_fail);
    specd_sched_release_slot(sched, b->slot);
    specd_sched_free(sched);
    for (int i = 0; i < 3; i++) free(qs[i]);
    specd_transformer_free(t);
    specd_model_close(m);
}

/* A pool of exactly one whole context (10 pages): a holder keeps one page,
 * a full-context prompt waits for it, and three more sessions queue behind
 * that prompt. When the holder leaves, the queued ones hold no pages, so
 * they need no reserve, and the long prompt starts at once (counting them
 * as growing sessions kept it out until its queue wait ran out). */
static void test_sched_queued_need_no_reserve(void **state) {
    (void)state;
    specd_model_file *m = open_model();
    int vocab = m->hp.vocab_size;
    specd_transformer *t = make_t(m, 5, 10, 0);
    specd_error err = {{0}};
    specd_sched_opts so = {.n_slots = 5, .max_batch_tokens = MAX_BATCH, .max_wait_ms = 0,
                           .kv_wait_ms = 50, .queue_wait_ms = 2000};
    specd_sched *sched = specd_sched_create(t, &so, &err);
    assert_non_null(sched);
    queued *qs[5];
    pthread_t th[5];
    for (int i = 0; i < 5; i++) /* [0] the holder, [1] the long prompt */
        qs[i] = queued_new(sched, i == 1 ? 150 : 16, i * 29 + 2, 13, vocab);
    queued_main(qs[0]); /* one page held: the long prompt cannot start */
    assert_int_equal(qs[0]->rc, SPECD_WORK_OK);
    pthread_create(&th[1], NULL, queued_main, qs[1]);
    wait_queued(sched, 1);
    for (int i = 2; i < 5; i++) {
        pthread_create(&th[i], NULL, queued_main, qs[i]);
        wait_queued(sched, i);
    }
    specd_sched_release_slot(sched, qs[0]->slot);
    pthread_join(th[1], NULL);
    if (qs[1]->rc != SPECD_WORK_OK) fail_msg("the full-context prompt: %s", qs[1]->err);
    specd_sched_release_slot(sched, qs[1]->slot);
    for (int i = 2; i < 5; i++) {
        pthread_join(th[i], NULL);
        if (qs[i]->rc != SPECD_WORK_OK) fail_msg("prompt %d: %s", i, qs[i]->err);
    }
    if (check_sched(sched)) fail_msg("%s", g_fail);
    for (int i = 2; i < 5; i++) specd_sched_release_slot(sched, qs[i]->slot);
    specd_sched_free(sched);
    for (int i = 0; i < 5; i++) free(qs[i]);
    specd_transformer_free(t);
    specd_model_close(m);
}

/* Cancelled once in a pass: an item's call is cancelled while the worker
 * runs the pass that holds it (the probe answers "cancelled" exactly while
 * the item is in flight). The pass's result stands: the item completes OK
 * with its token. gather() used to walk the queue a second time for
 * prompts and complete such an item as CANCELLED mid-pass; its owner then
 * returned and freed it while the worker still wrote its outputs (a
 * sanitizer CI run caught a logprob written through a stale pointer). */
static int cancelled_in_flight(void *arg) {
    const specd_work *w = arg;
    return w->in_flight > 0; /* called under the scheduler's lock */
}

static void test_sched_cancel_in_pass(void **state) {
    (void)state;
    specd_model_file *m = open_model();
    int vocab = m->hp.vocab_size;
    specd_transformer *t = make_t(m, 2, 0, 0);
    specd_error err = {{0}};
    specd_sched_opts so = {.n_slots = 2, .max_batch_tokens = MAX_BATCH, .max_wait_ms = 0};
    specd_sched *sched = specd_sched_create(t, &so, &err);
    assert_non_null(sched);
    queued *q = queued_new(sched, 20, 11, 7, vocab);
    queued_main(q);
    assert_int_equal(q->rc, SPECD_WORK_OK);
    int32_t want[2];
    greedy_alone(m, q->tokens, q->n, 2, want);
    specd_sampling greedy;
    memset(&greedy, 0, sizeof greedy);
    /* one decode step: gather() takes it in its first round (steps), and
     * its second round (prompts) walks the queue again */
    int32_t tok = want[0];
    specd_work w;
    memset(&w, 0, sizeof w);
    w.kind = SPECD_WORK_DECODE;
    w.slot = q->slot;
    w.n_past = q->n;
    w.tokens = &tok;
    w.n_tokens = 1;
    w.sampling = &greedy;
    w.is_cancelled = cancelled_in_flight;
    w.cancel_arg = &w;
    int rc = specd_sched_run(sched, &w);
    if (rc != SPECD_WORK_OK) fail_msg("rc %d (%s): completed while in a pass", rc, w.err.msg);
    assert_int_equal(w.next_token, want[1]);
    if (check_sched(sched)) fail_msg("%s", g_fail);
    specd_sched_release_slot(sched, q->slot);
    specd_sched_free(sched);
    free(q);
    specd_transformer_free(t);
    specd_model_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_random_ops),
        cmocka_unit_test(test_pool_lru_and_keys),
        cmocka_unit_test(test_copy_on_write),
        cmocka_unit_test(test_compact_copy_on_write),
        cmocka_unit_test(test_sched_admission_queue),
        cmocka_unit_test(test_sched_prompts_promised),
        cmocka_unit_test(test_sched_queued_need_no_reserve),
        cmocka_unit_test(test_sched_cancel_in_pass),
        cmocka_unit_test(test_pool_too_small),
        cmocka_unit_test(test_sched_churn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
