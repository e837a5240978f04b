/* sampling.c - see sampling.h for the semantics; this file is about doing it
 * exactly and fast.
 *
 * specd_sampling_probs() in outline:
 *
 *   1. One pass computes each token's weight w = exp((l - lmax) / T), so the
 *      best token weighs exactly 1, and files it in bucket
 *      b = floor(-log2 w) (clipped to 63), keeping per-bucket counts and sums.
 *   2. No top-k / top-p: apply min-p (w >= min_p) and normalize. Done.
 *   3. Otherwise the candidates are grouped by bucket (a counting sort whose
 *      slices are filled only as far as the walk below reaches). Buckets are
 *      ordered by rank (a bucket's tokens all outrank the next bucket's), so
 *      the walk that takes tokens in rank order can take whole buckets without
 *      ordering them, and only sorts the one bucket where the top-k count or
 *      the top-p mass is reached (insertion sort when small, a stable radix
 *      sort on the float bits otherwise: linear, so even one bucket holding
 *      the whole vocabulary is cheap). The cost is dominated by the first pass.
 *   4. min-p filters what the walk kept; the kept weights are renormalized.
 *
 * Buckets come from the logit gap, not from w, so that they are monotone in
 * the logit by construction (no reliance on the exp being monotone). Rank is
 * (logit descending, token id ascending), a strict total order, so the kept
 * set is unique and does not depend on which sort ran. */
#include "common/spec/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/spec/sampling_vec.h"
#include "common/util/rng.h"

#define NBUCKETS SAMPLING_NBUCKETS

#define MAX_GAP SAMPLING_MAX_GAP

/* A token competing for a place in top-k / top-p. The logit travels with the
 * id so that sorting reads contiguous memory. */
typedef struct cand {
    float logit;
    int32_t id;
} cand;

void specd_sampling_init(specd_sampling *s) {
    s->temperature = 1.0f;
    s->top_k = 0;
    s->top_p = 1.0f;
    s->min_p = 0.0f;
    s->seed = 0;
    s->method = SPECD_SAMPLING_SEED_EXACT;
    s->repetition_penalty = 0.0f;
    s->frequency_penalty = 0.0f;
    s->presence_penalty = 0.0f;
    s->n_logit_bias = 0;
    s->bias_ids = NULL;
    s->bias_values = NULL;
}

/* One logit-bias entry and where it came from, for the duplicate check. */
typedef struct bias_ref {
    int32_t id;
    int index;
} bias_ref;

/* Orders by id, then by position in the request, so equal ids end up
 * adjacent with the earlier entry first. */
static int bias_ref_cmp(const void *a, const void *b) {
    const bias_ref *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* The logit-bias list: size, values, and (vocab > 0) ids. */
static int validate_bias(const specd_sampling *s, int vocab, specd_error *err) {
    if (s->n_logit_bias < 0 || s->n_logit_bias > SPECD_MAX_LOGIT_BIAS)
        return specd_seterr(err, "logit_bias has %d entries, at most %d are allowed",
                            s->n_logit_bias, SPECD_MAX_LOGIT_BIAS);
    if (s->n_logit_bias == 0) return 0;
    if (!s->bias_ids || !s->bias_values)
        return specd_seterr(err, "logit_bias: %d entries but no ids or values", s->n_logit_bias);
    for (int i = 0; i < s->n_logit_bias; i++) {
        float b = s->bias_values[i];
        if (!(b >= -100.0f && b <= 100.0f))
            return specd_seterr(err, "logit_bias[%d].bias must be in [-100, 100], got %g", i,
                                (double)b);
    }
    if (vocab <= 0) return 0; /* ids are checked by whoever knows the vocabulary */
    for (int i = 0; i < s->n_logit_bias; i++)
        if (s->bias_ids[i] < 0 || s->bias_ids[i] >= vocab)
            return specd_seterr(err, "logit_bias[%d].token_id = %d is outside 0..%d", i,
                                s->bias_ids[i], vocab - 1);
    /* Duplicates: sorting a copy is O(n log n) for the 1024-entry worst case,
     * where comparing all pairs would be half a million comparisons; the
     * bounded size lets the copy live on the stack. Of all repeated pairs the
     * one whose second entry comes first in the request is reported, so the
     * message does not depend on the sort. */
    bias_ref refs[SPECD_MAX_LOGIT_BIAS];
    for (int i = 0; i < s->n_logit_bias; i++) refs[i] = (bias_ref){s->bias_ids[i], i};
    qsort(refs, (size_t)s->n_logit_bias, sizeof refs[0], bias_ref_cmp);
    int first = -1, second = -1;
    for (int i = 1; i < s->n_logit_bias; i++) {
        if (refs[i].id != refs[i - 1].id) continue;
        if (second < 0 || refs[i].index < second) {
            first = refs[i - 1].index;
            second = refs[i].index;
        }
    }
    if (second >= 0)
        return specd_seterr(err, "logit_bias[%d].token_id = %d repeats logit_bias[%d] (each token "
                                 "at most once)", second, s->bias_ids[second], first);
    return 0;
}

int specd_sampling_validate(const specd_sampling *s, int vocab, specd_error *err) {
    if (!s) return specd_seterr(err, "sampling parameters missing");
    /* Written as !(x >= 0) so that NaN fails too. */
    if (!(s->temperature >= 0.0f) || !isfinite(s->temperature))
        return specd_seterr(err, "temperature must be >= 0 and finite (0 means greedy), got %g",
                            (double)s->temperature);
    if (s->top_k < 0)
        return specd_seterr(err, "top_k must be >= 0 (0 disables it), got %d", s->top_k);
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return specd_seterr(err, "top_p must be in (0, 1] (1 disables it), got %g",
                            (double)s->top_p);
    if (!(s->min_p >= 0.0f && s->min_p <= 1.0f))
        return specd_seterr(err, "min_p must be in [0, 1] (0 disables it), got %g",
                            (double)s->min_p);
    if (s->method != SPECD_SAMPLING_SEED_EXACT && s->method != SPECD_SAMPLING_REJECTION)
        return specd_seterr(err, "method must be SEED_EXACT (0) or REJECTION (1), got %d",
                            (int)s->method);
    /* 0 is accepted as "off" besides 1 because it is what an unset proto3
     * float reads as; any other value <= 0 would flip or zero the logits. */
    if (!(s->repetition_penalty >= 0.0f && s->repetition_penalty <= 10.0f))
        return specd_seterr(err, "repetition_penalty must be in (0, 10] (0 or 1 disables it), got %g",
                            (double)s->repetition_penalty);
    if (!(s->frequency_penalty >= -2.0f && s->frequency_penalty <= 2.0f))
        return specd_seterr(err, "frequency_penalty must be in [-2, 2], got %g",
                            (double)s->frequency_penalty);
    if (!(s->presence_penalty >= -2.0f && s->presence_penalty <= 2.0f))
        return specd_seterr(err, "presence_penalty must be in [-2, 2], got %g",
                            (double)s->presence_penalty);
    return validate_bias(s, vocab, err);
}

/* --- penalties and logit bias ---------------------------------------------- */

int specd_token_counts_init(specd_token_counts *c, int vocab, specd_error *err) {
    memset(c, 0, sizeof *c);
    if (vocab <= 0) return specd_seterr(err, "token counts: vocabulary size %d must be > 0", vocab);
    c->out_count = calloc((size_t)vocab, sizeof *c->out_count);
    c->seen = calloc((size_t)vocab, sizeof *c->seen);
    c->seen_list = malloc((size_t)vocab * sizeof *c->seen_list);
    if (!c->out_count || !c->seen || !c->seen_list) {
        specd_token_counts_free(c);
        return specd_seterr(err, "out of memory (penalty counts for %d tokens)", vocab);
    }
    c->vocab = vocab;
    return 0;
}

void specd_token_counts_free(specd_token_counts *c) {
    if (!c) return;
    free(c->out_count);
    free(c->seen);
    free(c->seen_list);
    memset(c, 0, sizeof *c);
}

void specd_token_counts_add(specd_token_counts *c, int32_t tok, int generated) {
    if (!c || tok < 0 || tok >= c->vocab) return;
    if (!c->seen[tok]) {
        c->seen[tok] = 1;
        c->seen_list[c->n_seen++] = tok;
    }
    if (generated) c->out_count[tok]++;
}

void specd_token_counts_reset(specd_token_counts *c) {
    if (!c) return;
    /* Only the seen tokens can be nonzero: O(distinct tokens), not O(vocab). */
    for (int i = 0; i < c->n_seen; i++) {
        c->seen[c->seen_list[i]] = 0;
        c->out_count[c->seen_list[i]] = 0;
    }
    c->n_seen = 0;
}

/* Repetition penalty on, i.e. neither 0 nor 1 (NaN or negative values, which
 * validation refuses, also count as off so they cannot corrupt logits). */
static int repetition_on(const specd_sampling *s) {
    return s->repetition_penalty > 0.0f && s->repetition_penalty != 1.0f;
}

int specd_sampling_adjusts_logits(const specd_sampling *s) {
    return s->n_logit_bias > 0 || repetition_on(s) || s->frequency_penalty != 0.0f ||
           s->presence_penalty != 0.0f;
}

size_t specd_logits_adjust_scratch_size(int n_path) {
    return n_path > 0 ? (size_t)n_path * sizeof(int32_t) : 0;
}

/* CTRL's rule as Hugging Face writes it (score < 0 ? score * r : score / r);
 * for 0 both branches give 0, so it equals the header's l > 0 form. */
static inline float repeat_penalized(float l, float r) { return l < 0.0f ? l * r : l / r; }

/* OpenAI's subtraction for a token generated cnt > 0 times. The whole amount
 * is formed first and subtracted once, from the total count: subtracting the
 * history's part and then the path's part would round differently, and tree
 * nodes must get bit-identical logits to plain decoding, whose counts already
 * include the path. */
static inline float count_penalized(float l, int32_t cnt, const specd_sampling *s) {
    return l - ((float)cnt * s->frequency_penalty + s->presence_penalty);
}

static int int32_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* 1 if x occurs in the ascending array a[0..n). */
static int sorted_contains(const int32_t *a, int n, int32_t x) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (a[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && a[lo] == x;
}

void specd_logits_adjust(const specd_sampling *s, const specd_token_counts *c,
                         const int32_t *path, int n_path, float *logits, int vocab,
                         void *scratch) {
    if (!specd_sampling_adjusts_logits(s) || vocab <= 0) return;
    /* Counts for another vocabulary size are read only where both have ids. */
    int cv = c ? (c->vocab < vocab ? c->vocab : vocab) : 0;
    int n_seen = c ? c->n_seen : 0;

    /* 1. logit bias. Out-of-range ids are skipped: validation with vocab <= 0
     * does not check them. */
    for (int i = 0; i < s->n_logit_bias; i++) {
        int32_t t = s->bias_ids[i];
        if (t >= 0 && t < vocab) logits[t] += s->bias_values[i];
    }

    /* The path's tokens in ascending order: equal tokens form runs (a run's
     * length is how often the path generated it) and membership is a binary
     * search. Ids outside the vocabulary are dropped, as counts_add does. */
    int32_t *ps = scratch;
    int np = 0;
    for (int i = 0; i < n_path; i++)
        if (path[i] >= 0 && path[i] < vocab) ps[np++] = path[i];
    if (np > 1) qsort(ps, (size_t)np, sizeof *ps, int32_cmp);

    /* 2. repetition penalty, once per distinct token of history + path. A
     * path token already in the history was handled by the first loop. */
    if (repetition_on(s)) {
        float r = s->repetition_penalty;
        for (int j = 0; j < n_seen; j++) {
            int32_t t = c->seen_list[j];
            if (t < vocab) logits[t] = repeat_penalized(logits[t], r);
        }
        for (int i = 0; i < np; i++) {
            int32_t t = ps[i];
            if (i > 0 && ps[i - 1] == t) continue; /* once per token */
            if (t < cv && c->seen[t]) continue;
            logits[t] = repeat_penalized(logits[t], r);
        }
    }

    /* 3. frequency and presence, with the generated count of history + path
     * taken together (see count_penalized). */
    if (s->frequency_penalty != 0.0f || s->presence_penalty != 0.0f) {
        for (int j = 0; j < n_seen; j++) {
            int32_t t = c->seen_list[j];
            if (t >= cv || c->out_count[t] <= 0) continue;
            if (np && sorted_contains(ps, np, t)) continue; /* the path loop does it */
            logits[t] = count_penalized(logits[t], c->out_count[t], s);
        }
        for (int i = 0; i < np;) {
            int32_t t = ps[i];
            int run = 1;
            while (i + run < np && ps[i + run] == t) run++;
            int32_t cnt = run + (t < cv ? c->out_count[t] : 0);
            logits[t] = count_penalized(logits[t], cnt, s);
            i += run;
        }
    }
}

/* --- log-probabilities ------------------------------------------------------ */

/* The eight lane sums in one fixed order. */
static double lane_sum(const double a[8]) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}


/* 1 if logit a (token ia) ranks before b (token ib): larger first, lower id
 * on ties. */
static inline int ranks_before(float a, int32_t ia, float b, int32_t ib) {
    return a > b || (a == b && ia < ib);
}

/* How the log-probabilities of one row are formed (see specd_logprobs). */
typedef struct lp_norm {
    int mode;    /* 0: l - lse; 1: some logit is +inf; 2: no usable logit */
    double lse;  /* mode 0: log(sum exp(l)) */
    double linf; /* mode 1: log-probability of each +inf token */
} lp_norm;

static float logprob_of(float l, const lp_norm *z) {
    if (isnan(l) || z->mode == 2) return -INFINITY;
    if (z->mode == 1) return l == INFINITY ? (float)z->linf : -INFINITY;
    return (float)((double)l - z->lse);
}

/* The normalizer m + log(sum exp(x - m)) for a finite row maximum m. */
static double lse_at(const float *x, int n, float m) {
    double acc[8] = {0};
    sampling_vec_active()->exp_sum(x, n, m, acc);
    return (double)m + log(lane_sum(acc));
}

double specd_log_sum_exp(const float *x, int n) {
    if (n <= 0) return -INFINITY;
    float m = x[specd_argmax(x, n)];
    if (!isfinite(m)) return m; /* -inf, +inf, or NaN when every entry is */
    return lse_at(x, n, m);
}

void specd_logprobs(const float *logits, int vocab, int32_t tok, int top_n, float *lp,
                    int32_t *top_ids, float *top_lps) {
    if (top_n < 0) top_n = 0;
    if (top_n > SPECD_MAX_TOP_LOGPROBS) top_n = SPECD_MAX_TOP_LOGPROBS;
    /* The normalizer: log(sum exp(l)) = m + log(sum exp(l - m)) in double
     * (sampling_vec.h's exp, summed in eight lanes by id mod 8 on every
     * SIMD path), so it is one fixed function of the logits. NaN logits
     * take no part (as in sampling: probability 0, log-prob -inf). */
    int top = vocab > 0 ? specd_argmax(logits, vocab) : -1;
    float m = top >= 0 ? logits[top] : NAN;
    lp_norm z = {0, 0.0, 0.0};
    if (isnan(m) || m == -INFINITY) {
        z.mode = 2;
    } else if (m == INFINITY) {
        /* The softmax limit, as in specd_sampling_probs: the +inf tokens
         * share the mass equally. */
        int n_inf = 0;
        for (int i = 0; i < vocab; i++) n_inf += logits[i] == INFINITY;
        z.mode = 1;
        z.linf = -log((double)n_inf);
    } else {
        z.lse = lse_at(logits, vocab, m);
    }
    if (lp) *lp = logprob_of(tok >= 0 && tok < vocab ? logits[tok] : NAN, &z);

    /* Top-n by insertion into a sorted array of at most 20: most tokens fail
     * the comparison against the current n-th, so this is one pass, and a
     * vector compare per 64 tokens (>= the n-th, ties decided below) finds
     * the few that do not. The n-th only rises, so a chunk's mask holds
     * every token that can still enter. */
    const sampling_vec *vec = sampling_vec_active();
    int n = 0;
    int32_t ids[SPECD_MAX_TOP_LOGPROBS];
    for (int32_t b = 0; b < vocab && top_n > 0; b += 64) {
        int len = vocab - b < 64 ? vocab - b : 64;
        uint64_t m = len == 64 ? ~0ull : (1ull << len) - 1;
        float bar = n == top_n ? logits[ids[n - 1]] : -INFINITY;
        if (bar > -INFINITY) m = vec->above(logits + b, len, nextafterf(bar, -INFINITY));
        for (; m; m &= m - 1) {
            int32_t i = b + __builtin_ctzll(m);
            float x = logits[i];
            if (isnan(x)) continue;
            if (n == top_n && !ranks_before(x, i, logits[ids[n - 1]], ids[n - 1])) continue;
            int j = n < top_n ? n++ : n - 1;
            for (; j > 0 && ranks_before(x, i, logits[ids[j - 1]], ids[j - 1]); j--)
                ids[j] = ids[j - 1];
            ids[j] = i;
        }
    }
    for (int j = 0; j < top_n; j++) {
        /* Fewer usable tokens than asked: the rest is marked empty. */
        if (top_ids) top_ids[j] = j < n ? ids[j] : -1;
        if (top_lps) top_lps[j] = j < n ? logprob_of(logits[ids[j]], &z) : -INFINITY;
    }
}

int specd_argmax(const float *x, int n) {
    if (n <= 0) return -1;
    return sampling_vec_active()->argmax(x, n);
}

size_t specd_sampling_scratch_size(int n) {
    if (n <= 0) return 0;
    /* probs for specd_sample (4) + candidates and their radix buffer (2 x 8)
     * + rank order (4) + bucket number (1). */
    return (size_t)n * (sizeof(float) + 2 * sizeof(cand) + sizeof(int32_t) + 1);
}

/* --- ranking helpers ------------------------------------------------------ */

/* 1 if a ranks strictly before b. Candidates never hold NaN logits. */
static int better(cand a, cand b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

/* Slices up to this long are ordered by insertion sort, longer ones by radix
 * sort; both give the one rank order, so the choice never changes a result. */
#define SMALL_SLICE 48

static void insertion_sort(cand *a, size_t len) {
    for (size_t i = 1; i < len; i++) {
        cand x = a[i];
        size_t j = i;
        for (; j > 0 && better(x, a[j - 1]); j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

/* Unsigned key whose ascending order is the logit's descending order (the
 * usual sign-flip trick makes float bits sort as unsigned; ~ reverses it). */
static uint32_t desc_key(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

/* Stable LSD radix sort, 8 bits per pass, by desc_key; tmp holds len items.
 * Stability is what orders ties by id: a slice fresh from the counting sort
 * is in ascending id order. Passes where every item has the same digit are
 * skipped, which within a bucket (a narrow logit range) is usually two. */
static void radix_sort(cand *a, cand *tmp, size_t len) {
    size_t hist[4][256];
    memset(hist, 0, sizeof hist);
    for (size_t i = 0; i < len; i++) {
        uint32_t k = desc_key(a[i].logit);
        for (int d = 0; d < 4; d++) hist[d][(k >> (8 * d)) & 255]++;
    }
    cand *src = a, *dst = tmp;
    for (int d = 0; d < 4; d++) {
        size_t *h = hist[d];
        int trivial = 0;
        for (int v = 0; v < 256; v++)
            if (h[v] == len) trivial = 1;
        if (trivial) continue;
        size_t pos = 0;
        for (int v = 0; v < 256; v++) {
            size_t c = h[v];
            h[v] = pos;
            pos += c;
        }
        for (size_t i = 0; i < len; i++) dst[h[(desc_key(src[i].logit) >> (8 * d)) & 255]++] = src[i];
        cand *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, len * sizeof *a);
}

/* Where the buckets of one specd_sampling_probs() call live. */
typedef struct bucketed {
    cand *cands;            /* candidates grouped by bucket */
    cand *tmp;              /* radix sort buffer */
    size_t start[NBUCKETS]; /* first index of each bucket in cands */
    size_t count[NBUCKETS]; /* tokens per bucket */
    double sum[NBUCKETS];   /* weight per bucket */
    uint8_t sorted[NBUCKETS]; /* 1 once the bucket's slice is in rank order */
    /* The slices are filled lazily, a run of buckets per scan of the
     * bucket numbers, only as far as the walk reaches: top-k and top-p
     * stop within the first few buckets, and the far ones hold most of
     * the vocabulary. */
    const uint8_t *bucket; /* [n] each token's bucket, 0xFF = weight 0 */
    const float *logits;
    int n;
    int filled; /* buckets 0..filled-1 have their slices */
    const sampling_vec *vec;
} bucketed;

/* Fill the slices of buckets filled..b and a few more (twice as many
 * each time, so a walk through all 64 scans a handful of times), in id
 * order within each bucket. */
static void fill_to(bucketed *bk, int b) {
    int hi = 2 * b + 4 < NBUCKETS - 1 ? 2 * b + 4 : NBUCKETS - 1;
    int lo = bk->filled;
    size_t fill[NBUCKETS];
    for (int j = lo; j <= hi; j++) fill[j] = bk->start[j];
    for (int c = 0; c < bk->n; c += 64) {
        int len = bk->n - c < 64 ? bk->n - c : 64;
        for (uint64_t m = bk->vec->in_range(bk->bucket + c, len, (uint8_t)lo, (uint8_t)hi); m;
             m &= m - 1) {
            int i = c + __builtin_ctzll(m);
            bk->cands[fill[bk->bucket[i]]++] = (cand){bk->logits[i], (int32_t)i};
        }
    }
    bk->filled = hi + 1;
}

/* Appends token ids to order[] in rank order until `k` tokens are taken or
 * their weight reaches `thr` (pass SIZE_MAX / INFINITY to disable either).
 * Returns how many were taken; *cum_out gets their weight. A bucket that can
 * be taken whole without crossing either limit is taken in storage order;
 * only a bucket where a limit is crossed gets sorted (once: a second walk
 * reuses the order). If rounding lets a sorted bucket run out before `thr`
 * is reached, the walk simply goes on to the next bucket. */
static size_t walk(bucketed *bk, const float *w, size_t k, double thr, int32_t *order,
                   double *cum_out) {
    size_t kept = 0;
    double cum = 0.0;
    for (int b = 0; b < NBUCKETS; b++) {
        size_t len = bk->count[b];
        if (len == 0) continue;
        if (b >= bk->filled) fill_to(bk, b);
        cand *sl = bk->cands + bk->start[b];
        if (kept + len <= k && cum + bk->sum[b] < thr) {
            for (size_t j = 0; j < len; j++) order[kept++] = sl[j].id;
            cum += bk->sum[b];
            if (kept == k) break;
            continue;
        }
        if (!bk->sorted[b]) {
            if (len <= SMALL_SLICE) insertion_sort(sl, len);
            else radix_sort(sl, bk->tmp, len);
            bk->sorted[b] = 1;
        }
        for (size_t j = 0; j < len; j++) {
            order[kept++] = sl[j].id;
            cum += w[sl[j].id];
            if (kept >= k || cum >= thr) {
                *cum_out = cum;
                return kept;
            }
        }
    }
    *cum_out = cum;
    return kept;
}

static void one_hot(float *probs, int n, int at) {
    memset(probs, 0, (size_t)n * sizeof *probs);
    probs[at] = 1.0f;
}

/* Scaled gap below the best logit, (lmax - l) / T, in nats; MAX_GAP or more
 * means "weight 0" (NaN, -inf, underflow, or finite next to +inf logits). */
static inline double gap_of(float l, float lmax, double inv_t, int inf_mode) {
    if (isnan(l)) return MAX_GAP;
    if (inf_mode) return l == INFINITY ? 0.0 : MAX_GAP;
    return ((double)lmax - (double)l) * inv_t;
}

/* probs[i] = token i's weight exp(-gap) (sampling_vec.h's, so every SIMD
 * path gives the same bits), 0 where it is below wmin; acc[i % 8] gathers
 * the sum in the order every path keeps. */
static void weigh(const sampling_vec *vec, const float *logits, int n, float lmax, double inv_t,
                  int inf_mode, float wmin, float *probs, double acc[8]) {
    if (!inf_mode) {
        vec->weights(logits, n, lmax, inv_t, wmin, probs, acc);
        return;
    }
    for (int i = 0; i < n; i++) { /* weight 1 for each +inf logit, else 0 */
        float w = sampling_exp_neg(gap_of(logits[i], lmax, inv_t, 1));
        if (!(w >= wmin)) w = 0.0f;
        probs[i] = w;
        acc[i & 7] += w;
    }
}

void specd_sampling_probs(const specd_sampling *s, const float *logits, int n, float *probs,
                          void *scratch) {
    if (n <= 0) return;
    double T = s->temperature;
    if (!(T > 0.0) || !isfinite(T)) {
        one_hot(probs, n, specd_argmax(logits, n));
        return;
    }

    /* The best usable logit anchors the weights (softmax's max shift). */
    int top = specd_argmax(logits, n);
    float lmax = logits[top];
    if (isnan(lmax) || lmax == -INFINITY) {
        one_hot(probs, n, top);
        return;
    }
    /* With +inf logits the softmax limit is uniform over the +inf tokens. */
    int inf_mode = lmax == INFINITY;
    double inv_t = 1.0 / T;

    /* The best token has gap 0, so weight exactly 1, and it survives top-k
     * and top-p; min-p's "min_p times the largest probability" is therefore
     * simply weight >= min_p. Out-of-range min_p is clamped (see header). */
    const float wmin = s->min_p > 0.0f ? (s->min_p < 1.0f ? s->min_p : 1.0f) : 0.0f;
    int want_k = s->top_k > 0 && s->top_k < n;
    int use_p = s->top_p < 1.0f; /* NaN compares false: off */

    const sampling_vec *vec = sampling_vec_active();
    if (!want_k && !use_p) {
        /* No ranking needed: weights, min-p and the sum in one pass. */
        double acc[8] = {0};
        weigh(vec, logits, n, lmax, inv_t, inf_mode, wmin, probs, acc);
        double scale = 1.0 / lane_sum(acc); /* sum >= 1: the best token weighs 1 */
        vec->scale(probs, n, scale);
        return;
    }

    cand *cands = (cand *)scratch;
    cand *tmp = cands + n;
    int32_t *order = (int32_t *)(tmp + n);
    uint8_t *bucket = (uint8_t *)(order + n);
    bucketed bk;
    memset(&bk, 0, sizeof bk);
    bk.cands = cands;
    bk.tmp = tmp;
    bk.bucket = bucket;
    bk.logits = logits;
    bk.n = n;
    bk.vec = vec;

    /* Pass 1: weights into probs[] and each positive one's bucket,
     * floor(-log2(weight)) up to rounding, from the gap; then the buckets'
     * counts and sums, in id order. */
    size_t m = 0; /* tokens with positive weight */
    double acc[8] = {0}; /* unused: the walk sums bucket by bucket */
    weigh(vec, logits, n, lmax, inv_t, inf_mode, 0.0f, probs, acc);
    if (inf_mode)
        for (int i = 0; i < n; i++) bucket[i] = probs[i] > 0.0f ? 0 : 0xFF; /* gap 0 */
    else
        vec->buckets(logits, probs, n, lmax, inv_t, bucket);
    for (int i = 0; i < n; i++) {
        int b = bucket[i];
        if (b == 0xFF) continue;
        bk.count[b]++;
        bk.sum[b] += probs[i];
        m++;
    }
    int use_k = want_k && (size_t)s->top_k < m;

    /* Each bucket's slice of cands (within a bucket: id order, filled as the
     * walk needs it). */
    size_t pos = 0;
    double total = 0.0; /* summed bucket by bucket, as walk() does */
    for (int b = 0; b < NBUCKETS; b++) {
        bk.start[b] = pos;
        pos += bk.count[b];
        total += bk.sum[b];
    }

    size_t k = use_k ? (size_t)s->top_k : SIZE_MAX;
    double cum;
    size_t kept;
    if (use_k && use_p) {
        /* top-p renormalizes over the top-k set, so its mass is needed first. */
        walk(&bk, probs, k, INFINITY, order, &cum);
        kept = walk(&bk, probs, k, (double)s->top_p * cum, order, &cum);
    } else if (use_p) {
        kept = walk(&bk, probs, SIZE_MAX, (double)s->top_p * total, order, &cum);
    } else if (use_k) {
        kept = walk(&bk, probs, k, INFINITY, order, &cum);
    } else {
        kept = walk(&bk, probs, SIZE_MAX, INFINITY, order, &cum); /* k >= tokens */
    }

    /* min-p over the kept tokens; survivors are marked by a negative sign
     * (weights are > 0) so one last pass can zero everything else. */
    double sum = 0.0;
    for (size_t j = 0; j < kept; j++) {
        int32_t id = order[j];
        if (probs[id] >= wmin) {
            sum += probs[id];
            probs[id] = -probs[id];
        }
    }
    vec->finish(probs, n, -1.0 / sum);
}

int specd_sample_from_probs(const float *probs, int n, double u) {
    if (n <= 0) return -1;
    double total = 0.0;
    for (int i = 0; i < n; i++)
        if (probs[i] > 0.0f) total += probs[i];
    if (!(total > 0.0) || !isfinite(total)) return specd_argmax(probs, n);
    if (!(u >= 0.0)) u = 0.0;
    if (u >= 1.0) u = 0x1.fffffffffffffp-1; /* largest double below 1 */
    double target = u * total;
    /* The walk sums in the same order as `total`, so the last positive entry
     * ends at exactly `total` > target: the loop returns unless u * total
     * rounded up to total, which the `last` fallback covers. */
    double cum = 0.0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        if (!(probs[i] > 0.0f)) continue;
        cum += probs[i];
        last = i;
        if (target < cum) return i;
    }
    return last;
}

int specd_sample(const specd_sampling *s, const float *logits, int n, uint64_t stream,
                 uint64_t counter, void *scratch) {
    if (n <= 0) return -1;
    if (!(s->temperature > 0.0f)) return specd_argmax(logits, n);
    float *probs = (float *)scratch;
    specd_sampling_probs(s, logits, n, probs, probs + n);
    if (s->method == SPECD_SAMPLING_SEED_EXACT)
        return specd_race_pick(probs, n, (specd_race_addr){s->seed, stream, counter});
    return specd_sample_from_probs(probs, n, specd_rng_uniform(s->seed, stream, counter));
}

/* --- seed-exact sampling: the exponential race ------------------------------ */

/* The Philox block holding the noise of ids 4j..4j+3. */
static void race_block(specd_race_addr a, uint64_t j, uint32_t w[4]) {
    specd_rng_u32x4(a.seed, a.stream, SPECD_RACE_COUNTER + (a.counter << 30) + j, w);
}

double specd_race_exp(specd_race_addr a, int32_t id) {
    uint32_t w[4];
    race_block(a, (uint64_t)id / 4, w);
    return -log(race_u(w[id % 4]));
}

int specd_race_pick_ref(const float *probs, int n, specd_race_addr a) {
    int best = -1;
    double best_key = 0.0;
    for (int i = 0; i < n; i++) {
        if (!(probs[i] > 0.0f)) continue;
        double key = specd_race_exp(a, i) / (double)probs[i];
        if (best < 0 || key < best_key) best = i, best_key = key;
    }
    return best >= 0 ? best : specd_argmax(probs, n);
}

/* The race keeps the k best (key, id) pairs sorted ascending by key, then id.
 * `cut` is the k-th key once k are held (+inf before): a token whose key is
 * not below it cannot enter. */
typedef struct race {
    int k, n;
    double key[SPECD_RACE_MAX_K];
    int32_t id[SPECD_RACE_MAX_K];
} race;

static double race_cut(const race *r) { return r->n < r->k ? INFINITY : r->key[r->n - 1]; }

static void race_offer(race *r, double key, int32_t id) {
    int pos = r->n;
    while (pos > 0 && (key < r->key[pos - 1] || (key == r->key[pos - 1] && id < r->id[pos - 1])))
        pos--;
    if (pos >= r->k) return;
    int last = r->n < r->k ? r->n : r->k - 1;
    for (int j = last; j > pos; j--) r->key[j] = r->key[j - 1], r->id[j] = r->id[j - 1];
    r->key[pos] = key;
    r->id[pos] = id;
    if (r->n < r->k) r->n++;
}

/* Ids per chunk of the race: 16 Philox blocks, one 64-bit mask. */
#define RACE_CHUNK 64

static int race_run(const float *probs, int n, specd_race_addr a, int k, int32_t *ids) {
    if (k > SPECD_RACE_MAX_K) k = SPECD_RACE_MAX_K;
    if (k < 1 || n <= 0) return 0;
    const sampling_vec *vec = sampling_vec_active();
    race r = {.k = k, .n = 0};
    /* Seed the race with the k most likely tokens, so that the cut is tight
     * from the first chunk on. A chunk's mask holds the ids above the k-th
     * best so far; each is checked again, as the bar rises inside a chunk. */
    int32_t top[SPECD_RACE_MAX_K];
    float top_p[SPECD_RACE_MAX_K];
    int n_top = 0;
    for (int b = 0; b < n; b += RACE_CHUNK) {
        int len = n - b < RACE_CHUNK ? n - b : RACE_CHUNK;
        for (uint64_t m = vec->above(probs + b, len, n_top < k ? 0.0f : top_p[k - 1]); m;
             m &= m - 1) {
            int i = b + __builtin_ctzll(m);
            float p = probs[i];
            if (n_top == k && !(p > top_p[n_top - 1])) continue;
            int pos = n_top < k ? n_top++ : k - 1;
            while (pos > 0 && p > top_p[pos - 1])
                top_p[pos] = top_p[pos - 1], top[pos] = top[pos - 1], pos--;
            top_p[pos] = p;
            top[pos] = i;
        }
    }
    for (int j = 0; j < n_top; j++)
        race_offer(&r, specd_race_exp(a, top[j]) / (double)top_p[j], top[j]);
    /* Then every other positive entry. A chunk with a few positive ids
     * (top-k, top-p) draws their blocks one by one; a dense one draws all
     * 16 blocks at once (rng.h's vector run) and lets the vector filter
     * drop the tokens that certainly lose, which is nearly all of them.
     * Each id left is decided exactly, against the current cut. */
    uint32_t w[RACE_CHUNK];
    for (int b = 0; b < n; b += RACE_CHUNK) {
        int len = n - b < RACE_CHUNK ? n - b : RACE_CHUNK;
        uint64_t m = vec->above(probs + b, len, 0.0f);
        if (!m) continue;
        if (__builtin_popcountll(m) <= 2) {
            for (uint64_t t = m; t; t &= t - 1) {
                int i = __builtin_ctzll(t);
                race_block(a, (uint64_t)(b + i) / 4, w + (i & ~3));
            }
        } else {
            specd_rng_u32x4_run(a.seed, a.stream, SPECD_RACE_COUNTER + (a.counter << 30) + b / 4,
                                (size_t)(len + 3) / 4, w);
            m = vec->contenders(w, probs + b, len, race_cut(&r));
        }
        for (; m; m &= m - 1) {
            int i = b + __builtin_ctzll(m);
            float p = probs[i];
            double u = race_u(w[i - b]), cut = race_cut(&r);
            if (race_hopeless(u, p, cut)) continue;
            int seeded = 0;
            for (int j = 0; j < n_top && !seeded; j++) seeded = top[j] == i;
            if (!seeded) race_offer(&r, -log(u) / (double)p, i);
        }
    }
    memcpy(ids, r.id, sizeof(int32_t) * (size_t)r.n);
    return r.n;
}

int specd_race_pick(const float *probs, int n, specd_race_addr a) {
    int32_t id;
    return race_run(probs, n, a, 1, &id) ? id : specd_argmax(probs, n);
}

int specd_race_topk(const float *probs, int n, specd_race_addr a, int k, int32_t *ids) {
    return race_run(probs, n, a, k, ids);
}

/* --- speculative rules ---------------------------------------------------- */

int specd_accept_draft(float p_x, float q_x, double u) {
    /* See the header for why q = 0 rejects; `!(x > 0)` also catches NaN. */
    if (!(q_x > 0.0f)) return 0;
    if (!(p_x > 0.0f)) return 0;
    /* For u in [0, 1), u < p/q is u < min(1, p/q): when p >= q the ratio is
     * >= 1 > u and x is always kept. Division in double so that p/q does not
     * round in float. */
    return u < (double)p_x / (double)q_x;
}

int specd_residual_probs(const float *p, const float *q, int n, float *out) {
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        float r = p[i] - q[i];
        out[i] = r > 0.0f ? r : 0.0f; /* NaN on either side gives 0 too */
        total += out[i];
    }
    int fell_back = 0;
    if (!(total > 0.0)) {
        fell_back = 1;
        total = 0.0;
        for (int i = 0; i < n; i++) {
            out[i] = p[i] > 0.0f ? p[i] : 0.0f;
            total += out[i];
        }
        /* p itself is empty: leave zeros; a sampler then takes argmax (0). */
        if (!(total > 0.0)) return fell_back;
    }
    for (int i = 0; i < n; i++) out[i] = (float)(out[i] / total);
    return fell_back;
}

int specd_residual_sample(const float *p, const float *q, int n, double u, float *scratch) {
    if (n <= 0) return -1;
    specd_residual_probs(p, q, n, scratch);
    return specd_sample_from_probs(scratch, n, u);
}
