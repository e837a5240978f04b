/* tree_builder.h - building a candidate tree, the drafters' common output.
 *
 * Every drafter turns its guesses into a specd_tree_buf: nodes with a token,
 * a parent, the draft's log-probability of the path so far, and (sampling
 * mode) the distribution q each node's children were drawn from. The buffer
 * owns all its memory; specd_tree_buf_view() gives the specd_tree (common/
 * tree.h) that goes on the wire.
 *
 * Shapes. A request asks for `candidates` paths of at most `depth` tokens.
 *
 *   greedy mode: a drafter proposes, at each node, its top few children with
 *     their log-probabilities; specd_tree_beam_select() keeps the
 *     `candidates` most likely frontier nodes per depth (by cumulative
 *     log-probability) and the final tree is the union of the surviving
 *     paths, shared prefixes merged (they are merged by construction: a
 *     child is added under its one parent node).
 *
 *   sampling mode: the verifier's recursive rejection rule is only lossless
 *     if the children of a node are drawn i.i.d. from the q sent with it, and
 *     their number is fixed before they are drawn. So the shape is decided
 *     from (candidates, depth) alone: specd_tree_sampling_branching() gives
 *     the number of children per depth (the root gets `candidates`, deeper
 *     nodes one each: `candidates` independent chains), never from the drawn
 *     values. Duplicates among siblings are kept (that is what i.i.d. means).
 */
#ifndef SPECD_TREE_BUILDER_H
#define SPECD_TREE_BUILDER_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"
#include "common/spec/tree.h"

/* A node's source. A drafter has one (MODEL, whatever it is); the
 * hybrid drafter merges a model's tree with a prompt lookup's, and the two
 * are told apart because they differ in what they cost and how far their
 * scores can be trusted: a model node costs a drafting stage per level, a
 * lookup node nothing, and each source's scores are calibrated on their own
 * (tree_choice.h). BOTH: a node both proposed (agreement is evidence of its
 * own, so it gets a calibration of its own too). */
enum { SPECD_SRC_MODEL = 0, SPECD_SRC_LOOKUP = 1, SPECD_SRC_BOTH = 2, SPECD_N_SRC = 3 };

typedef struct specd_tree_buf {
    int cap;        /* most nodes */
    int n_nodes;
    int32_t *tokens;  /* [cap] */
    int32_t *parents; /* [cap] */
    int32_t *depth;   /* [cap] 1 for a child of the root */
    float *logq;      /* [cap] draft log-probability of the path root..node */
    /* [cap] the drafter's own estimate that the node is accepted given its
     * parent was, or -1: none, and tree_choice.h uses exp(logq - parent's
     * logq) instead. Set where a node's logq is not a draft probability:
     * the merged tree's lookup nodes and nodes both sources proposed
     * (drafter_hybrid.c). The mlp drafter leaves it unset: its draft
     * probability ranks accepted tokens better than its acceptance head
     * does (docs/SPECULATION.md). */
    float *pcond;
    /* [cap] where the node came from (SPECD_SRC_*): SPECD_SRC_MODEL unless
     * a drafter that merges a model's tree with a lookup's says otherwise
     * (drafter_hybrid.c) */
    uint8_t *src;
    /* Sampling mode: q[0] the root's children's distribution, q[1 + i] node
     * i's; n = 0 where unset. Entries live in one pool. */
    specd_sparse_dist *q; /* [cap + 1] */
    int32_t *q_ids;
    float *q_probs;
    size_t q_pool_cap, q_pool_used;
} specd_tree_buf;

/* cap nodes; q_pool entries for the sampling distributions (0 = greedy only). */
int specd_tree_buf_init(specd_tree_buf *b, int cap, size_t q_pool, specd_error *err);
void specd_tree_buf_free(specd_tree_buf *b);
void specd_tree_buf_reset(specd_tree_buf *b); /* no nodes, empty q pool */

/* Adds a node under parent (-1 = root) with its path log-probability; the
 * new index, or -1 when the buffer is full. */
int specd_tree_buf_add(specd_tree_buf *b, int parent, int32_t token, float logq);

/* Node i's chance of acceptance given its parent was accepted, as its
 * drafter scores it: pcond where the drafter set one, else
 * exp(logq - parent's logq); in [0, 1], 0 for a non-finite value. */
float specd_tree_node_score(const specd_tree_buf *b, int i);

/* Keeps only the nodes with keep[i] != 0 (a set closed under parents),
 * renumbered in their order, parents remapped. Greedy mode only: q entries
 * are dropped. Returns the new node count. */
int specd_tree_buf_prune(specd_tree_buf *b, const uint8_t *keep);

/* Copies q for the children of `node` (-1 = root) into the pool. -1 if the
 * pool is full. */
int specd_tree_buf_set_q(specd_tree_buf *b, int node, const int32_t *ids, const float *probs,
                         int n);

/* The wire view (q = NULL in greedy mode). Valid while b is unchanged. */
void specd_tree_buf_view(const specd_tree_buf *b, int sampling, specd_tree *out);

/* Greedy-mode pruning: of the n frontier candidates (each a parent node, a
 * token and the cumulative log-probability it would have), marks the `keep`
 * best in keep_mask (ties: lower index first) and returns how many were
 * kept. */
int specd_tree_beam_select(const float *cand_logq, int n, int keep, uint8_t *keep_mask);

/* Sampling-mode shape: children per node at depth d (0 = root) for d in
 * 0..depth-1 into branching[], so the tree has candidates * depth nodes;
 * capped so it fits max_nodes (fewer chains, then shorter ones). Returns
 * the resulting depth (>= 1 when max_nodes >= 1). */
int specd_tree_sampling_branching(int candidates, int depth, int max_nodes, int *branching);

/* Sampling-mode drafters draw each node's children from a q with at most
 * this many tokens. The verifier is lossless for ANY q as long as the q sent
 * is the one drawn from, so a drafter may truncate its distribution; without
 * this a dense q over a 49k vocabulary would make each Tree megabytes (past
 * gRPC's message limit for a few dozen nodes) for mass the draft almost never
 * samples. */
#define SPECD_DRAFT_Q_MAX 256

/* The q a sampling-mode node sends and draws from: the dense distribution
 * probs[0..n) cut to its SPECD_DRAFT_Q_MAX most likely entries (all of its
 * positive entries when there are no more; ties: lower index), each index
 * mapped through id_map (NULL: the index is the token id; a reduced draft
 * vocabulary's draft id -> target id map, whose unmapped entries must have
 * probability 0), sorted by token id ascending and renormalized (a double
 * sum in that order). probs is not modified. Writes ids/sparse (capacity
 * SPECD_DRAFT_Q_MAX) and returns the count (>= 1 for a distribution with
 * any positive entry, else 0).
 *
 * Drawing from it: specd_sample_from_probs(sparse, n, u) gives an index j,
 * the token ids[j]. That is the token the same u draws from the dense
 * target-width q (the walk visits the positive entries in id order with the
 * same sums), without two passes over 49k entries per draw. */
int specd_draft_q_sparse(const float *probs, int n, const int32_t *id_map, int32_t *ids,
                         float *sparse);

/* Top-k of a log-probability (or logit) row: the k largest, descending, ties
 * broken by lower id; k is clamped to n. Returns the count written. O(n log k). */
int specd_topk(const float *x, int n, int k, int32_t *ids, float *vals);

#endif
