/* verify.c - tree validation, the tree mask, and the lossless acceptance
 * walk. See verify.h for the rules and why they are lossless. */
#include "verify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"

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
