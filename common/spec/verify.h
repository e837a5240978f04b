/* verify.h - checking a tree of draft tokens against the target, losslessly.
 *
 * A verification step for one session works on:
 *   - the session's cache, holding n_past committed tokens,
 *   - its pending token: the last token the target chose (correction or bonus
 *     of the previous step), not yet in the cache,
 *   - a candidate tree: node i has a token and a parent (-1 = the pending
 *     token, else an earlier node), i.e. several guessed continuations that
 *     share prefixes.
 *
 * One forward pass runs [pending, node 0, node 1, ...] with a mask where each
 * row sees the cache, the pending token and its own ancestors, at RoPE
 * position n_past + depth. Row r's logits are the target's distribution for
 * the children of r. Then the acceptance walk starts at the pending token:
 *
 *   greedy   : move to the child whose token equals the target's argmax; stop
 *              when none does. The argmax at the stopping row is the next
 *              token (a correction, or the bonus token after a leaf). The
 *              output is token-identical to plain greedy decoding.
 *   seed-exact sampling (the default method, sampling.h): like greedy, with
 *              the row's token the winner of the race over the target's p
 *              with the noise of (seed, that row's output position). The
 *              output equals plain sampling with the same seed, token for
 *              token, whatever the tree; the tree carries no q.
 *   rejection sampling (method REJECTION): recursive rejection sampling
 *              over siblings (SpecInfer/EAGLE):
 *              with p the target distribution at the row and q the draft
 *              distribution the children were drawn from (i.i.d.), try the
 *              children in order: accept child x with probability
 *              min(1, p(x)/q(x)); on rejection p <- norm(max(0, p - q)) and
 *              try the next; if all are rejected, draw the next token from
 *              the final p. The emitted sequence is distributed exactly as
 *              plain sampling from the target.
 *
 * The accepted path's KV rows are then moved in place to follow the cache
 * (specd_transformer_kv_compact); nothing is recomputed. This file holds the
 * pure parts (validation, mask and positions, the walk) so that the batching
 * scheduler can run many sessions' trees in one forward pass. */
#ifndef SPECD_VERIFY_H
#define SPECD_VERIFY_H

#include <stdint.h>

#include "common/util/error.h"
#include "common/spec/sampling.h"
#include "common/spec/tree.h"

typedef struct specd_verify_result {
    int n_accepted;        /* accepted draft tokens along the chosen path */
    int32_t *accepted;     /* caller's buffer [n_nodes]: their tokens */
    int32_t *kept_rows;    /* caller's buffer [n_nodes + 1]: rows to keep in the
                            * step's batch (0 = pending, then 1 + node index);
                            * kept_rows[i] is also the row whose logits produced
                            * the i-th emitted token (accepted..., next_token) */
    int32_t next_token;    /* the target's own token after the path */
    int next_row;          /* batch row whose logits produced next_token */
} specd_verify_result;

/* Fills the (n_nodes+1)^2 mask and n_nodes+1 positions for the forward pass
 * over [pending, nodes...]: row 0 is the pending token at n_past. */
void specd_tree_mask(const specd_tree *tree, int n_past, uint8_t *mask, int32_t *pos);

/* The acceptance walk over logits [(n_nodes+1)][vocab] (row 0 = pending).
 * `position` is the output index of the pending token's first child: draws at
 * output index k use rng stream k (counter 0 for the emitted token, 1 + j for
 * the test of sibling j), so a seed gives reproducible output.
 *
 * Penalties and logit bias (specd_logits_adjust) apply to each row the walk
 * visits before its argmax or specd_sampling_probs: counts is the history up
 * to and including the pending token (NULL = none), and the path is the
 * tokens accepted so far in this walk, so every row sees exactly the history
 * plain decoding would have there. The adjustment works on a copy; `logits`
 * is never written. With specd_sampling_adjusts_logits(s) == 0 nothing is
 * copied.
 * scratch: specd_verify_scratch_size(vocab, tree->n_nodes) bytes. */
int specd_verify_walk(const specd_tree *tree, const float *logits, int vocab,
                      const specd_sampling *s, const specd_token_counts *counts,
                      uint64_t position, void *scratch, specd_verify_result *res,
                      specd_error *err);
/* The greedy walk when only each row's argmax is known (computed on the
 * device; valid when no penalty or bias applies): row_argmax[r] is the
 * argmax of row r's logits. Chooses the same path and next token as
 * specd_verify_walk would from the full rows. */
int specd_verify_walk_greedy(const specd_tree *tree, const int32_t *row_argmax,
                             specd_verify_result *res, specd_error *err);

/* Enough scratch for the walk over trees of up to max_nodes nodes, and for
 * specd_decode_token (max_nodes may be 0 for that alone). */
size_t specd_verify_scratch_size(int vocab, int max_nodes);

/* Plain decoding's token from one row of logits, by the same rules as the
 * walk at a row without children: adjust (history = counts), then argmax or a
 * draw with rng stream `position`, counter 0. Keeping it beside the walk is
 * what makes Target.Generate and Verify agree token for token.
 * scratch: specd_verify_scratch_size(vocab, 0) bytes. */
int32_t specd_decode_token(const float *logits, int vocab, const specd_sampling *s,
                           const specd_token_counts *counts, uint64_t position, void *scratch);

/* One emitted token's log-probabilities (specd_logprobs on the RAW logits of
 * the row that produced it, so they do not depend on penalties, filters or
 * whether the token was drafted). */
typedef struct specd_token_logprob {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[SPECD_MAX_TOP_LOGPROBS];
    float top_lps[SPECD_MAX_TOP_LOGPROBS];
} specd_token_logprob;

void specd_token_logprob_fill(specd_token_logprob *out, const float *raw_logits, int vocab,
                              int32_t token, int top_n);

#endif
