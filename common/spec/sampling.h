/* sampling.h - turning logits into tokens, and the lossless speculative rules.
 *
 * Two jobs live here because they must agree exactly:
 *
 *  1. The sampling distribution. specd_sampling_probs() maps logits and a
 *     specd_sampling to the final probability vector the token is drawn from.
 *     Plain decoding samples from it; speculative decoding computes it for the
 *     target (p) and for the draft (q) and feeds both to the acceptance rule.
 *     "Lossless" means the output is distributed as the target's p, so p here
 *     must be precisely the distribution plain decoding would use.
 *
 *  2. The speculative rules (DESIGN.md, "Draft-verify, lossless"): accept a
 *     drafted token x with probability min(1, p(x)/q(x)); on rejection sample
 *     from norm(max(0, p - q)). Together they make the emitted token exactly
 *     p-distributed whatever q is, provided q is the distribution the draft
 *     token was really drawn from.
 *
 * Processing order (the order Hugging Face transformers' generate() builds its
 * LogitsProcessor list in: Temperature -> TopK -> TopP -> MinP):
 *
 *   temperature  0 means greedy: the distribution is one-hot at the argmax
 *                (lowest token id on ties) and the other fields are ignored.
 *                Otherwise logits are divided by it (HF divides the scores).
 *   top_k        keep the k highest logits; ties at the boundary are broken by
 *                lower token id, so exactly k tokens stay. (HF keeps every
 *                token tied with the k-th value; exact-k keeps the set a
 *                function of the logits alone and its size bounded.) 0 = off.
 *   top_p        nucleus: renormalize over the tokens top-k kept, walk them in
 *                descending probability (ties: lower id first) and keep the
 *                shortest prefix whose cumulative probability is >= top_p;
 *                at least one token always stays. Same set as HF's TopP, which
 *                drops a token when the mass strictly above it is >= top_p.
 *                1 = off.
 *   min_p        drop tokens whose probability is < min_p times the largest
 *                probability (of what is left; the most likely token always
 *                survives every stage, so this is relative to the overall
 *                maximum). 0 = off.
 *
 * The result is renormalized over the kept set; every other entry is exactly 0.
 * Tokens whose logit is NaN or -inf, and tokens whose weight underflows float
 * (more than ~103 nats below the best after temperature), get probability 0.
 *
 * All functions are deterministic: same inputs, same outputs, bit for bit, on
 * a given build (single-threaded, fixed summation order). */
#ifndef SPECD_SAMPLING_H
#define SPECD_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"

/* How a sampled request (temperature > 0) draws its tokens and how its
 * drafts are verified; see "seed-exact sampling" below. Greedy requests
 * ignore it. The numbering is the wire's (SamplingParams.method). */
typedef enum specd_sampling_method {
    SPECD_SAMPLING_SEED_EXACT = 0, /* Gumbel-max with addressed noise: the default */
    SPECD_SAMPLING_REJECTION = 1,  /* inverse-CDF draws, rejection-sampling verify */
} specd_sampling_method;

typedef struct specd_sampling {
    float temperature; /* >= 0, finite; 0 = greedy */
    int top_k;         /* >= 0; 0 = off */
    float top_p;       /* in (0, 1]; 1 = off */
    float min_p;       /* in [0, 1]; 0 = off */
    uint64_t seed;     /* address of this request's draws, see rng.h */
    specd_sampling_method method; /* SEED_EXACT or REJECTION */
    /* Logit adjustments, applied by specd_logits_adjust() before everything
     * above (see there). Unlike the filters they depend on the tokens so far,
     * so they need a specd_token_counts. */
    float repetition_penalty; /* in (0, 10]; 1 or 0 = off */
    float frequency_penalty;  /* in [-2, 2]; 0 = off */
    float presence_penalty;   /* in [-2, 2]; 0 = off */
    int n_logit_bias;         /* 0..SPECD_MAX_LOGIT_BIAS entries */
    const int32_t *bias_ids;  /* [n_logit_bias] distinct token ids (not owned) */
    const float *bias_values; /* [n_logit_bias] in [-100, 100] (not owned) */
} specd_sampling;

#define SPECD_MAX_LOGIT_BIAS 1024
#define SPECD_MAX_TOP_LOGPROBS 20

/* Plain sampling from the model's distribution: temperature 1, every filter
 * off, seed 0. (A zeroed struct is not neutral: top_p = 0 is invalid.) */
void specd_sampling_init(specd_sampling *s);

/* 0 if every field is in range; else -1 with a message naming the field, e.g.
 * "top_p must be in (0, 1] (1 disables it), got 1.5" or
 * "logit_bias[3].token_id = 7 repeats logit_bias[1] (each token at most
 * once)"; callers prefix where the parameters came from ("open.sampling.").
 * vocab > 0 also checks the logit-bias ids (in range, no duplicates); vocab
 * <= 0 skips that. */
int specd_sampling_validate(const specd_sampling *s, int vocab, specd_error *err);

/* --- penalties and logit bias ---------------------------------------------
 *
 * The logits of a position depend on the tokens before it: the prompt and
 * the tokens generated so far. specd_token_counts keeps what the penalties
 * need in O(1) per token; a speculative tree adds each path's own tokens on
 * top without copying it (`path` below), so every node of a tree sees exactly
 * the history plain decoding would have at that position.
 *
 * Order (documented in proto/specd.proto, SamplingParams):
 *   1. logit_bias:          l[t] += bias[t]
 *   2. repetition_penalty:  for t seen in prompt or output (each t once):
 *                           l = l > 0 ? l / r : l * r   (CTRL; HF's processor)
 *   3. frequency/presence:  for t generated c > 0 times:
 *                           l -= c * frequency + presence   (OpenAI)
 * then temperature and the filters of specd_sampling_probs(). */
typedef struct specd_token_counts {
    int vocab;
    int32_t *out_count; /* [vocab] times generated */
    uint8_t *seen;      /* [vocab] 1 if in the prompt or generated */
    int32_t *seen_list; /* distinct seen tokens, in first-seen order */
    int n_seen;
} specd_token_counts;

int specd_token_counts_init(specd_token_counts *c, int vocab, specd_error *err);
void specd_token_counts_free(specd_token_counts *c);
/* generated = 0 for a prompt token, 1 for an output token. Ids outside the
 * vocabulary are ignored. */
void specd_token_counts_add(specd_token_counts *c, int32_t tok, int generated);
void specd_token_counts_reset(specd_token_counts *c);

/* 1 if any of bias / repetition / frequency / presence is on. */
int specd_sampling_adjusts_logits(const specd_sampling *s);

/* Applies steps 1-3 above to logits[0..vocab) in place, for the position
 * after the counted history followed by path[0..n_path) (generated tokens not
 * yet in c, e.g. a tree node's ancestors). counts may be NULL (= empty
 * history). A no-op when specd_sampling_adjusts_logits() is 0. Cost:
 * O(n_seen + n_path + n_logit_bias); with a path the scratch is
 * specd_logits_adjust_scratch_size(n_path) bytes (NULL is fine for n_path 0). */
void specd_logits_adjust(const specd_sampling *s, const specd_token_counts *c,
                         const int32_t *path, int n_path, float *logits, int vocab,
                         void *scratch);
size_t specd_logits_adjust_scratch_size(int n_path);

/* --- log-probabilities ------------------------------------------------------ */

/* Log-softmax of raw logits at token `tok` into *lp, and the top_n most
 * likely tokens (descending, ties: lower id first) into top_ids/top_lps
 * (top_n <= SPECD_MAX_TOP_LOGPROBS; may be 0). Computed in double for the
 * normalizer, so it is a pure function of the logits. Degenerate rows follow
 * specd_sampling_probs: NaN logits get -inf and take no part; if some logit
 * is +inf, those tokens get -log(their count) and the rest -inf; with no
 * usable logit everything is -inf. If fewer than top_n logits are not NaN,
 * the missing entries are id -1, -inf. lp, top_ids, top_lps may be NULL. */
void specd_logprobs(const float *logits, int vocab, int32_t tok, int top_n, float *lp,
                    int32_t *top_ids, float *top_lps);

/* log(sum_i exp(x[i])) of a row of logits: m + log(sum exp(x[i] - m)) with
 * m the largest, each exp and the sum in double (sampling_vec.h's exp in
 * eight lanes by index mod 8, on every SIMD path the same bits): the
 * normalizer of specd_logprobs, and the one the drafters score paths with.
 * -inf entries count 0; NaN entries take no part. -inf for an empty or
 * all -inf row, +inf when some entry is +inf, NaN when every entry is. */
double specd_log_sum_exp(const float *x, int n);

/* Index of the largest value, lowest index on ties. NaNs are skipped; if all
 * values are NaN the answer is 0. -1 only when n <= 0. */
int specd_argmax(const float *logits, int n);

/* Bytes of scratch that specd_sampling_probs() and specd_sample() need for a
 * vocabulary of n (25 bytes per token). Any malloc'd block of this size works
 * (4-byte alignment suffices). */
size_t specd_sampling_scratch_size(int n);

/* Writes the final distribution (see the order above) into probs[0..n).
 * `s` should have passed specd_sampling_validate(); other values give some
 * valid distribution, never a crash. If no token has a usable logit (all NaN
 * or -inf), the result is one-hot at specd_argmax(logits). If the largest
 * logit is +inf, the +inf tokens share the mass equally (the limit of the
 * softmax). Cost: one pass with an exp per token, then top-k / top-p order
 * only the tokens near the cut (tokens are bucketed by powers of two of their
 * weight, and only the bucket holding the cut is sorted, in linear time), so
 * it stays O(n) even for a flat distribution with top_p = 0.99. */
void specd_sampling_probs(const specd_sampling *s, const float *logits, int n, float *probs,
                          void *scratch);

/* Inverse-CDF draw: the first i (in index order) whose cumulative probability
 * exceeds u * sum(probs), u in [0, 1). Never returns an entry with probability
 * <= 0. probs need not be normalized (negative and NaN entries count as 0); if
 * no entry is positive the answer is specd_argmax(probs, n). u outside [0, 1)
 * is clamped into it. */
int specd_sample_from_probs(const float *probs, int n, double u);

/* One token: argmax when s->temperature == 0, else a draw from
 * specd_sampling_probs(): with method SEED_EXACT, the race at (s->seed,
 * stream, counter); with REJECTION, the inverse-CDF draw at
 * u = specd_rng_uniform(s->seed, stream, counter).
 * scratch: specd_sampling_scratch_size(n) bytes.
 *
 * Addressing: each draw of a request needs its own (stream, counter), e.g.
 * stream = output position, counter = purpose of the draw at that position.
 * Never use one address for two purposes: the uniform that tests a draft
 * token must be independent of the uniform that drew it, or the speculative
 * rule stops being lossless. */
int specd_sample(const specd_sampling *s, const float *logits, int n, uint64_t stream,
                 uint64_t counter, void *scratch);

/* 1 if s samples (temperature > 0) with the given method. */
static inline int specd_sampling_is(const specd_sampling *s, specd_sampling_method m) {
    return s && s->temperature > 0.0f && s->method == m;
}

/* --- seed-exact sampling (Gumbel-max with addressed noise) -----------------
 *
 * The token at output position k is the winner of an exponential race over
 * the final distribution p (everything specd_sampling_probs keeps):
 *
 *     token = argmin_{i : p_i > 0}  E_i / p_i,    E_i = -log(u_i),
 *     u_i   = noise of (seed, stream = k, token i)
 *
 * which is the Gumbel-max trick (argmax log p_i + g_i with g_i = -log E_i
 * standard Gumbel), so the token is distributed exactly as p. What makes it
 * worth its cost is that the noise belongs to the position, not to a draw:
 *
 *   - plain sampling with a seed yields one fixed sequence;
 *   - a drafter that races its own q with the same noise proposes the token
 *     the target will pick whenever the two races agree (they do more often
 *     the closer q is to p; for q == p, always);
 *   - verification is then exact match, as for greedy: the target races its
 *     p at each tree row and walks to the child holding the winner.
 * So the output equals plain sampling with the same seed whatever the
 * drafter, the tree or the load (the promise a seed makes; issue 20), and
 * no draft distribution q has to travel with the tree.
 *
 * Noise address: u_i is word i % 4 of specd_rng_u32x4(seed, stream,
 * SPECD_RACE_COUNTER + counter * 2^30 + i / 4) as (w + 0.5) * 2^-32: one
 * Philox block per four tokens, never 0 or 1. Decoding uses counter 0 (the
 * position alone names the draw, which is the point); a caller that needs
 * several independent races at one stream (a test, a training sampler)
 * numbers them by counter (< 2^33). Its 32-bit resolution truncates E at 22.2 (e^-22 ~
 * 2^-32), which moves a token's win probability by at most ~2^-32. The
 * counter range starts at 2^40, far above the counters REJECTION uses (0 and
 * 1 + sibling), so the two methods never share a draw.
 *
 * The race is exact and cheap: every u_i is generated (one Philox block per
 * four tokens), but -log(u_i) is computed only when token i can still win:
 * u_i > 1 - v p_i (slightly widened), where v is the best key so far, since
 * E_i >= 1 - u_i. The threshold starts at the most likely tokens' keys, so
 * only ~1/max(p) logs are taken. specd_race_pick_ref is the plain
 * definition it is tested against. */
#define SPECD_RACE_COUNTER (1ull << 40)

/* Where a race draws its noise: specd_rng's (seed, stream) and a counter. */
typedef struct specd_race_addr {
    uint64_t seed, stream, counter;
} specd_race_addr;

/* E_i = -log(u_i) for token `id` at address a: the race's noise. */
double specd_race_exp(specd_race_addr a, int32_t id);

/* The race winner over probs[0..n) (entries <= 0 or NaN never win; ties:
 * lower id). If no entry is positive: specd_argmax(probs, n). */
int specd_race_pick(const float *probs, int n, specd_race_addr a);

/* The same by the definition: E_i / p_i for every positive entry. */
int specd_race_pick_ref(const float *probs, int n, specd_race_addr a);

/* The k best of the race (smallest E_i / p_i first; k <= SPECD_RACE_MAX_K)
 * into ids; returns how many (fewer when fewer entries are positive). ids[0]
 * is specd_race_pick's winner. A drafter proposes these as siblings: the
 * first is its guess of the target's token, the rest the runners-up. */
#define SPECD_RACE_MAX_K 16
int specd_race_topk(const float *probs, int n, specd_race_addr a, int k, int32_t *ids);

/* --- lossless speculative decoding by rejection (method REJECTION) --------
 *
 * For one drafted token x drawn from q (the draft's specd_sampling_probs) and
 * checked against p (the target's), with independent uniforms u1, u2:
 *
 *     if specd_accept_draft(p[x], q[x], u1): emit x
 *     else: emit specd_residual_sample(p, q, n, u2, scratch)
 *
 * The emitted token is distributed exactly as p. A deterministic drafter
 * (greedy draft, n-gram lookup) has q one-hot at x, i.e. q[x] = 1. */

/* 1 if u < min(1, p_x / q_x), else 0; u in [0, 1). q_x <= 0 (or NaN) means
 * the draft could not have drawn x from q, so the premise of the rule is
 * broken (a bug or a rounding artifact); rejecting is the safe answer because
 * it never raises the probability of x above what the residual gives it.
 * p_x <= 0 always rejects: the target would never emit x. */
int specd_accept_draft(float p_x, float q_x, double u);

/* Writes norm(max(0, p - q)) into out[0..n) and returns 0. If that is all
 * zero (p == q wherever p > q, i.e. p == q for normalized inputs) it writes
 * p (normalized) instead and returns 1. That fallback is correct: rejection
 * happens with probability sum(max(0, q - p)), which equals sum(max(0, p - q)),
 * so a zero residual means rejection has probability zero and only rounding
 * can get here; p is then the distribution the target itself would sample.
 * The returned distribution is also the new target for recursive rejection
 * sampling over a tree's sibling drafts (SpecInfer). */
int specd_residual_probs(const float *p, const float *q, int n, float *out);

/* A draw from specd_residual_probs(p, q) with uniform u; scratch: n floats. */
int specd_residual_sample(const float *p, const float *q, int n, double u, float *scratch);

#endif
