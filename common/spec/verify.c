/* verify.c - tree validation, the tree mask, and the lossless acceptance
 * walk. See verify.h for the rules and why they are lossless. */
#include "common/spec/verify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/rng.h"

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

/* Scratch layout: p, q, tmp (vocab floats each), the adjustment's sorted
 * path (max_nodes int32), then specd_sampling's scratch. Everything before
 * the sampling block is a multiple of 4 bytes, which is all it needs. */
size_t specd_verify_scratch_size(int vocab, int max_nodes) {
    return 3 * sizeof(float) * (size_t)vocab + specd_logits_adjust_scratch_size(max_nodes) +
           specd_sampling_scratch_size(vocab);
}

/* q as a dense vector over the vocabulary. */
static void densify(const specd_sparse_dist *q, float *dense, int vocab) {
    memset(dense, 0, sizeof(float) * vocab);
    for (int j = 0; j < q->n; j++) dense[q->ids[j]] += q->probs[j];
}

/* The row the rules look at: the raw logits, or with penalties / bias on, a
 * copy in `buf` adjusted for history + path. The raw rows stay untouched so
 * that log-probabilities (and the other rows of the batch) see the model's
 * own output. */
static const float *rule_row(const specd_sampling *s, int adjust, const specd_token_counts *c,
                             const int32_t *path, int n_path, const float *raw, float *buf,
                             int vocab, void *adj_scratch) {
    if (!adjust) return raw;
    memcpy(buf, raw, sizeof(float) * (size_t)vocab);
    specd_logits_adjust(s, c, path, n_path, buf, vocab, adj_scratch);
    return buf;
}

int32_t specd_decode_token(const float *logits, int vocab, const specd_sampling *s,
                           const specd_token_counts *counts, uint64_t position, void *scratch) {
    /* Same layout as the walk's scratch, with an empty path. */
    float *tmp = (float *)scratch + 2 * (size_t)vocab;
    void *sample_scratch = tmp + vocab;
    const float *row = rule_row(s, specd_sampling_adjusts_logits(s), counts, NULL, 0, logits,
                                tmp, vocab, NULL);
    return specd_sample(s, row, vocab, position, 0, sample_scratch);
}

int specd_verify_walk(const specd_tree *tree, const float *logits, int vocab,
                      const specd_sampling *s, const specd_token_counts *counts,
                      uint64_t position, void *scratch, specd_verify_result *res,
                      specd_error *err) {
    /* Seed-exact sampling walks like greedy: the row's token is fixed by
     * the race (sampling.h), and a child is accepted iff it holds it. */
    int sampling = specd_sampling_is(s, SPECD_SAMPLING_REJECTION);
    int raced = specd_sampling_is(s, SPECD_SAMPLING_SEED_EXACT);
    int adjust = specd_sampling_adjusts_logits(s);
    float *p = scratch, *q = p + vocab, *tmp = q + vocab;
    int32_t *adj_scratch = (int32_t *)(tmp + vocab);
    void *sample_scratch = (char *)adj_scratch + specd_logits_adjust_scratch_size(tree->n_nodes);
    int cur = -1; /* node index; -1 = the pending token (batch row 0) */
    res->n_accepted = 0;
    res->kept_rows[0] = 0;
    for (int depth = 0;; depth++) {
        /* The adjusted row lives in tmp: in sampling mode it is only read by
         * specd_sampling_probs, before tmp is reused for residuals. */
        const float *row_logits =
            rule_row(s, adjust, counts, res->accepted, res->n_accepted,
                     logits + (size_t)(cur + 1) * vocab, tmp, vocab, adj_scratch);
        uint64_t stream = position + (uint64_t)depth;
        int chosen = -1;
        int32_t next;
        if (!sampling) {
            next = raced ? specd_sample(s, row_logits, vocab, stream, 0, sample_scratch)
                         : specd_argmax(row_logits, vocab);
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

int specd_verify_walk_greedy(const specd_tree *tree, const int32_t *row_argmax,
                             specd_verify_result *res, specd_error *err) {
    int cur = -1; /* node index; -1 = the pending token (batch row 0) */
    res->n_accepted = 0;
    res->kept_rows[0] = 0;
    for (;;) {
        int32_t next = row_argmax[cur + 1];
        int chosen = -1;
        for (int i = cur + 1; i < tree->n_nodes && chosen < 0; i++)
            if (tree->parents[i] == cur && tree->tokens[i] == next) chosen = i;
        if (chosen < 0) {
            res->next_token = next;
            res->next_row = cur + 1;
            return 0;
        }
        res->accepted[res->n_accepted++] = next;
        res->kept_rows[res->n_accepted] = chosen + 1;
        cur = chosen;
        if (res->n_accepted > tree->n_nodes)
            return specd_seterr(err, "verify: walk longer than the tree (corrupt parents)");
    }
}

void specd_token_logprob_fill(specd_token_logprob *out, const float *raw_logits, int vocab,
                              int32_t token, int top_n) {
    if (top_n < 0) top_n = 0;
    if (top_n > SPECD_MAX_TOP_LOGPROBS) top_n = SPECD_MAX_TOP_LOGPROBS;
    out->token = token;
    out->n_top = top_n;
    specd_logprobs(raw_logits, vocab, token, top_n, &out->logprob, out->top_ids, out->top_lps);
}
