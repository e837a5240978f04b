/* accept_data.h - labeled examples for the acceptance head (draft-svc/
 * accept_head.h): at each position of a sequence the frozen target runs
 * over, the speculator drafts its chain as it would in serving, and every
 * stage's output state gets a label saying whether the target would accept
 * that stage's token.
 *
 * Alignment (as at inference, drafter_mlp.c): row j of a sequence is the
 * target's forward on token x_j, giving its final-norm hidden state h_j
 * (rounded through fp16, as the wire carries it) and logits z_j, the
 * target's distribution for x_{j+1}. The chain that starts at position t
 * runs stage 0 on (h_t, x_{t+1}) and stage i on (stage i-1's state,
 * x_{t+i+1}); stage i drafts a token d for position t+i+2, which the target
 * judges with z_{t+i+1}. So every stage computed at row j reads x_j and is
 * judged by z_j, and the data is built in one pass over the rows: a chain
 * in flight keeps only its state between rows.
 *
 * Labels, conditional on the chain's earlier stages being accepted (how the
 * head is used: p_i multiplies along the path):
 *   greedy (temperature 0): d = the stage's argmax; label 1 if d equals
 *     argmax z_j, else 0. The chain goes on only if d was accepted AND the
 *     sequence's next token x_{j+1} is d, so every later example's prefix is
 *     exactly "earlier drafts accepted". On the target's own greedy text
 *     (prompt sources) x_{j+1} is that argmax, so nothing is lost; on
 *     ground-truth text chains also end where the text leaves the target's
 *     greedy path. Stage 0 examples are taken at every position.
 *   sampling (temperature T > 0): d is drawn from q = softmax(stage
 *     logits / T) and the label is the acceptance probability
 *     min(1, p(d) / q(d)) with p = softmax(z_j / T): the expected value of
 *     the verifier's coin, a lower-variance target than the coin itself.
 *     Later stages read the sequence's own tokens, which the target sampled
 *     at T, standing in for the accepted draft tokens (exact where the draft
 *     equals the sample; the best the one-pass data can do otherwise, and
 *     what SpecDec++ trains on: the target's own responses).
 *
 * Sources: token sequences with a prefix that gets no examples (a prompt
 * but its last token) and an optional continuation the target generates
 * itself (greedy, or sampled at T), stopping at an end token. Many sources
 * run side by side ("lanes"), one token per lane per forward pass, and the
 * speculator's stage calls take every lane's row at once. */
#ifndef SPECD_TRAIN_ACCEPT_DATA_H
#define SPECD_TRAIN_ACCEPT_DATA_H

#include <stdint.h>

#include "common/util/error.h"
#include "common/text/tokenizer.h"
#include "common/model/mlp_speculator.h"
#include "common/model/transformer.h"
#include "tools/train/corpus.h"

/* One sequence to run. Examples start at position n_prefix (whose row is
 * the first a chain starts from). */
typedef struct accept_source {
    int32_t *ids;  /* the given tokens (owned by the source set) */
    int n_ids;     /* >= 1 */
    int n_prefix;  /* 0 .. n_ids-1 */
    int generate;  /* tokens the target appends after ids (0 = teacher-forced only) */
} accept_source;

typedef struct accept_sources {
    accept_source *v;
    int n;
} accept_sources;

void accept_sources_free(accept_sources *s);

/* From a corpus: a "prompt" doc becomes its chat rendering (the model's
 * template, generation prompt added), cut to its last max_prompt tokens,
 * with n_prefix = all but its last token and `generate` = gen_len; a text
 * doc is tokenized and cut into windows of window_len tokens (a shorter
 * tail of >= 2 tokens is kept), each a source with no prefix and no
 * generation. */
int accept_sources_from_corpus(const specd_tokenizer *tok, const corpus *c, int max_prompt,
                               int gen_len, int window_len, accept_sources *out,
                               specd_error *err);

typedef struct accept_examples {
    long n, cap;
    int dim;           /* the speculator's inner_dim */
    uint16_t *states;  /* [n][dim] fp16: the stage's output state */
    uint8_t *stage;    /* [n] */
    float *label;      /* [n] in [0, 1] */
    /* [n] the speculator's own probability of the token it drafted: greedy,
     * its softmax (T = 1) at the argmax; sampling, q(d) at T. The score
     * draft-svc prices mlp nodes by (draft-svc/tree_builder.h), which
     * accept_evaluate ranks beside the head's. */
    float *qdraft;
    /* [n][2] the two largest probabilities of the stage's distribution at
     * temperature 1 (greedy: qtop2[0] == qdraft): the draft features'
     * input (accept_head.h), as draft-svc computes it for a row */
    float *qtop2;
    int32_t *source;   /* [n] index of the source it came from */
} accept_examples;

void accept_examples_free(accept_examples *e);

typedef struct accept_data_opts {
    float temperature;       /* 0 = greedy labels (and greedy continuations) */
    int lanes;               /* sources run side by side (<= the transformer's slots) */
    long max_examples;       /* stop once this many are made (0 = no limit) */
    uint64_t seed;           /* draws of sampled continuations and draft tokens */
    const int32_t *end_ids;  /* a generated one of these ends the continuation */
    int n_end_ids;
} accept_data_opts;

/* Called now and then with sources finished / total and examples so far. */
typedef void (*accept_data_progress)(void *ctx, int done, int total, long examples);

/* Runs every source through t (>= o->lanes KV slots, each with room for the
 * longest source plus its continuation) and sp, appending to *out (zero-
 * initialize it first). Fixed seed, fixed order: the same inputs give the
 * same examples. -1 + err on a model error. */
int accept_data_build(specd_transformer *t, specd_mlp_speculator *sp, const accept_sources *src,
                      const accept_data_opts *o, accept_examples *out,
                      accept_data_progress progress, void *ctx, specd_error *err);

#endif
