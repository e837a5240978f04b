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
 *   sampling : recursive rejection sampling over siblings (SpecInfer/EAGLE):
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

#include "common/error.h"
#include "common/sampling.h"
#include "common/tree.h"

typedef struct specd_verify_result {
    int n_accepted;        /* accepted draft tokens along the chosen path */
    int32_t *accepted;     /* caller's buffer [n_nodes]: their tokens */
    int32_t *kept_rows;    /* caller's buffer [n_nodes + 1]: rows to keep in the
                            * step's batch (0 = pending, then 1 + node index) */
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
 * scratch: specd_verify_scratch_size(vocab) bytes. */
int specd_verify_walk(const specd_tree *tree, const float *logits, int vocab,
                      const specd_sampling *s, uint64_t position, void *scratch,
                      specd_verify_result *res, specd_error *err);
size_t specd_verify_scratch_size(int vocab);

#endif
