/* tree.c - checking a candidate tree from outside (see tree.h). */
#include "common/spec/tree.h"

#include <math.h>

int specd_tree_validate(const specd_tree *tree, int vocab, int max_nodes, int sampling,
                        specd_error *err) {
    /* Zero nodes is a plain decode step: a session whose drafter has
     * nothing to propose still advances by one token. */
    if (tree->n_nodes < 0 || tree->n_nodes > max_nodes)
        return specd_seterr(err, "tree.tokens: %d nodes, expected 0..%d", tree->n_nodes, max_nodes);
    for (int i = 0; i < tree->n_nodes; i++) {
        if (tree->tokens[i] < 0 || tree->tokens[i] >= vocab)
            return specd_seterr(err, "tree.tokens[%d] = %d outside vocabulary 0..%d", i,
                                tree->tokens[i], vocab - 1);
        if (tree->parents[i] < -1 || tree->parents[i] >= i)
            return specd_seterr(err, "tree.parents[%d] = %d is not -1 or an earlier node", i,
                                tree->parents[i]);
    }
    if (!sampling || tree->n_nodes == 0) return 0; /* nothing was drawn */
    if (!tree->q) return specd_seterr(err, "tree.q: draft distributions are required when sampling");
    for (int k = 0; k <= tree->n_nodes; k++) {
        int has_children = 0;
        for (int i = 0; i < tree->n_nodes && !has_children; i++)
            has_children = tree->parents[i] == k - 1;
        if (!has_children) continue;
        const specd_sparse_dist *q = &tree->q[k];
        if (q->n < 1 || q->n > vocab)
            return specd_seterr(err, "tree.q[%d]: %d entries, expected 1..%d", k, q->n, vocab);
        double sum = 0;
        for (int j = 0; j < q->n; j++) {
            if (q->ids[j] < 0 || q->ids[j] >= vocab)
                return specd_seterr(err, "tree.q[%d].ids[%d] = %d outside vocabulary", k, j,
                                    q->ids[j]);
            if (!(q->probs[j] >= 0.0f) || !isfinite(q->probs[j]))
                return specd_seterr(err, "tree.q[%d].probs[%d] is not a probability", k, j);
            sum += q->probs[j];
        }
        if (fabs(sum - 1.0) > 1e-3)
            return specd_seterr(err, "tree.q[%d]: probabilities sum to %.6f, not 1", k, sum);
        for (int i = 0; i < tree->n_nodes; i++) {
            if (tree->parents[i] != k - 1) continue;
            float qx = 0;
            for (int j = 0; j < q->n; j++)
                if (q->ids[j] == tree->tokens[i]) qx += q->probs[j];
            if (qx <= 0.0f)
                return specd_seterr(err, "tree.q[%d] gives token %d (node %d) probability 0, so "
                                         "the draft cannot have drawn it", k, tree->tokens[i], i);
        }
    }
    return 0;
}
