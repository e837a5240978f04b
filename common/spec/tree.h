/* tree.h - a tree of candidate tokens: the unit of speculation.
 *
 * draft-svc builds one per step (draft-svc/tree_builder.h), the wire carries
 * it as a VerifyTree, and target-svc checks it in one forward pass
 * (common/spec/verify.h). Node i has a token and a parent: -1 for a child of
 * the pending token (the last token the target chose, the tree's root), else
 * an earlier node, so a parent always comes before its children. In sampling
 * mode each node with children also carries q, the draft distribution its
 * children were drawn from, i.i.d. */
#ifndef SPECD_TREE_H
#define SPECD_TREE_H

#include <stdint.h>

#include "common/util/error.h"

/* A draft distribution in sparse form: the tokens with nonzero probability.
 * Drafters sample from a top-k/top-p-filtered distribution, so this is exact,
 * not an approximation. */
typedef struct specd_sparse_dist {
    int n;
    const int32_t *ids;
    const float *probs;
} specd_sparse_dist;

typedef struct specd_tree {
    int n_nodes;
    const int32_t *tokens;  /* [n_nodes] */
    const int32_t *parents; /* [n_nodes]: -1 = the pending token, else < own index */
    /* Sampling only (NULL for greedy): q[0] is the distribution the pending
     * token's children were drawn from, q[1 + i] that of node i's children
     * (ignored for leaves). */
    const specd_sparse_dist *q;
} specd_tree;

/* Checks tokens (0..vocab-1), parent order, tree size (1..max_nodes), and for
 * sampling that each q is a valid distribution that contains every child
 * drawn from it. The message names the field: "tree.parents[3] = 5 is not an
 * earlier node". */
int specd_tree_validate(const specd_tree *tree, int vocab, int max_nodes, int sampling,
                        specd_error *err);

#endif
