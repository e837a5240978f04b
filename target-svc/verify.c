/* verify.c - tree validation, the tree mask, and the lossless acceptance
 * walk. See verify.h for the rules and why they are lossless. */
#include "verify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"

int specd_tree_validate(const specd_tree *tree, int vocab, int max_nodes, int sampling,
                        specd_error *err) {
    if (tree->n_nodes < 1 || tree->n_nodes > max_nodes)
        return specd_seterr(err, "tree.tokens: %d nodes, expected 1..%d", tree->n_nodes, max_nodes);
    for (int i = 0; i < tree->n_nodes; i++) {
        if (tree->tokens[i] < 0 || tree->tokens[i] >= vocab)
            return specd_seterr(err, "tree.tokens[%d] = %d outside vocabulary 0..%d", i,
                                tree->tokens[i], vocab - 1);
        if (tree->parents[i] < -1 || tree->parents[i] >= i)
            return specd_seterr(err, "tree.parents[%d] = %d is not -1 or an earlier node", i,
                                tree->parents[i]);
    }
    if (!sampling) return 0;
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

void specd_tree_mask(const specd_tree *tree, int n_past, uint8_t *mask, int32_t *pos) {
    int n = tree->n_nodes + 1;
    memset(mask, 0, (size_t)n * n);
    mask[0] = 1;
    pos[0] = n_past;
    for (int i = 0; i < tree->n_nodes; i++) {
        int row = i + 1, depth = 1;
        mask[(size_t)row * n + row] = 1;
        mask[(size_t)row * n + 0] = 1; /* every node descends from the pending token */
        for (int a = tree->parents[i]; a >= 0; a = tree->parents[a], depth++)
            mask[(size_t)row * n + a + 1] = 1;
        pos[row] = n_past + depth;
    }
}

size_t specd_verify_scratch_size(int vocab) {
    return 3 * sizeof(float) * (size_t)vocab + specd_sampling_scratch_size(vocab);
}

/* q as a dense vector over the vocabulary. */
static void densify(const specd_sparse_dist *q, float *dense, int vocab) {
    memset(dense, 0, sizeof(float) * vocab);
    for (int j = 0; j < q->n; j++) dense[q->ids[j]] += q->probs[j];
}

int specd_verify_walk(const specd_tree *tree, const float *logits, int vocab,
                      const specd_sampling *s, uint64_t position, void *scratch,
                      specd_verify_result *res, specd_error *err) {
    int sampling = s->temperature > 0.0f;
    float *p = scratch, *q = p + vocab, *tmp = q + vocab;
    void *sample_scratch = tmp + vocab;
    int cur = -1; /* node index; -1 = the pending token (batch row 0) */
    res->n_accepted = 0;
    res->kept_rows[0] = 0;
    for (int depth = 0;; depth++) {
        const float *row_logits = logits + (size_t)(cur + 1) * vocab;
        uint64_t stream = position + (uint64_t)depth;
        int chosen = -1;
        int32_t next;
        if (!sampling) {
            next = specd_argmax(row_logits, vocab);
            for (int i = cur + 1; i < tree->n_nodes && chosen < 0; i++)
                if (tree->parents[i] == cur && tree->tokens[i] == next) chosen = i;
        } else {
            specd_sampling_probs(s, row_logits, vocab, p, sample_scratch);
            int tried = 0;
            for (int i = cur + 1; i < tree->n_nodes && chosen < 0; i++) {
                if (tree->parents[i] != cur) continue;
                if (tried == 0) densify(&tree->q[cur + 1], q, vocab);
                int32_t x = tree->tokens[i];
                double u = specd_rng_uniform(s->seed, stream, 1 + (uint64_t)tried++);
                if (specd_accept_draft(p[x], q[x], u)) {
                    chosen = i;
                } else {
                    /* the next sibling is judged against what rejection
                     * leaves: norm(max(0, p - q)) */
                    specd_residual_probs(p, q, vocab, tmp);
                    memcpy(p, tmp, sizeof(float) * vocab);
                }
            }
            next = chosen >= 0 ? tree->tokens[chosen]
                               : specd_sample_from_probs(p, vocab,
                                                         specd_rng_uniform(s->seed, stream, 0));
        }
        if (chosen < 0) {
            res->next_token = next;
            res->next_row = cur + 1;
            return 0;
        }
        res->accepted[res->n_accepted++] = tree->tokens[chosen];
        res->kept_rows[res->n_accepted] = chosen + 1;
        cur = chosen;
        if (res->n_accepted > tree->n_nodes)
            return specd_seterr(err, "verify: walk longer than the tree (corrupt parents)");
    }
}
