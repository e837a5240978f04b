/* accept_head.h - the SpecDec++ acceptance head ("SpecDec++: Boosting
 * Speculative Decoding via Adaptive Candidate Lengths", Huang et al. 2024):
 * a small network on the MLP speculator's state that predicts the
 * probability that the token a stage drafts will be accepted by the target,
 * given that the stages before it were.
 *
 * Input: the speculator's stage OUTPUT state s_{i+1} (inner_dim wide: the
 * state that stage i's logits are computed from, mlp_speculator.h), the
 * stage index i and, in a head with draft features, what the stage's own
 * distribution says of its draft (below). The network, a residual MLP with
 * SiLU:
 *
 *     x     = W_in s + b_in + E[i] (+ W_d f)            hidden_dim
 *     x     = x + W2_l silu(W1_l x + b1_l) + b2_l       l = 0 .. n_layers-1
 *     logit = w_out . x + b_out
 *     p     = sigmoid(logit)
 *
 * E is a learned per-stage vector. It is exactly W_in applied to a one-hot
 * of the stage concatenated to s, stored as its own tensor so input_dim
 * stays the speculator's inner_dim: the same state means different things
 * at different depths (the acceptance rate falls with depth), and the head
 * needs to know which.
 *
 * Draft features (n_draft_features = 3; 0 in a head without them). The
 * stage's logits are one linear map and a softmax from s, yet a head on s
 * alone ranked the shipped speculator's drafts worse than the draft's own
 * probability did (AUC 0.69 against 0.83 on the held-out prompts,
 * docs/BENCHMARKS.md, thirty-sixth session): a small network does not
 * rebuild a 49k-way softmax. So such a head is also given that
 * probability, as f = specd_accept_head_draft_features(q1, q2):
 *     f = [ln(q1 / (1 - q1)), ln(q1 / q2), q1]      (logs clamped to +-16)
 * where q1 >= q2 are the two largest probabilities of the stage's
 * distribution over the next token at temperature 1, after the request's
 * adjustments (the draft's own token's and its runner-up's, greedy). The
 * residual stream carries W_d f unchanged to the output. The first feature
 * is the draft's probability as a logit because acceptance is close to
 * linear in it there (held-out, by calibration bin: logit(acceptance) ~
 * 0.8 logit(q1) - 0.7), so a head learns the calibration with weights near
 * 1 and spends its state on what the probability misses.
 *
 * Files: a directory holding
 *   config.json        {"model_type": "specd_accept_head", "input_dim": D,
 *                       "hidden_dim": H, "n_layers": L, "n_stages": S,
 *                       "n_draft_features": F (optional: 0 or 3, default 0),
 *                       ...} (other keys, e.g. how it was trained, are
 *                      ignored)
 *   model.safetensors  F32, F16 or BF16 tensors, exactly these:
 *       in_proj.weight [H, D]      in_proj.bias [H]
 *       stage_emb.weight [S, H]
 *       draft_proj.weight [H, F]   (only when F > 0)
 *       blocks.{l}.fc1.weight [H, H]  blocks.{l}.fc1.bias [H]
 *       blocks.{l}.fc2.weight [H, H]  blocks.{l}.fc2.bias [H]
 *       out.weight [1, H]          out.bias [1]
 * `specd train accept-head` writes them (tools/train/accept_train.h). */
#ifndef SPECD_ACCEPT_HEAD_H
#define SPECD_ACCEPT_HEAD_H

#include <stddef.h>

#include "common/util/error.h"

/* Limits on what config.json may claim, checked before any allocation is
 * sized from it. A head is a few hundred KB; input_dim is a speculator's
 * inner_dim (mlp_speculator.h's limit), stages its n_predict. */
#define SPECD_ACCEPT_HEAD_MAX_INPUT 65536
#define SPECD_ACCEPT_HEAD_MAX_HIDDEN 8192
#define SPECD_ACCEPT_HEAD_MAX_LAYERS 16
#define SPECD_ACCEPT_HEAD_MAX_STAGES 16
/* Rows per forward call: a sanity bound on the caller. */
#define SPECD_ACCEPT_HEAD_MAX_ROWS (1 << 20)
/* The draft features' count (above): a head has all of them or none. */
#define SPECD_ACCEPT_HEAD_DRAFT_FEATURES 3

typedef struct specd_accept_head_config {
    int input_dim;  /* D: the speculator's inner_dim */
    int hidden_dim; /* H */
    int n_layers;   /* L residual blocks, may be 0 */
    int n_stages;   /* S: stage indices 0 .. S-1 have an embedding */
    int n_draft_features; /* F: 0, or SPECD_ACCEPT_HEAD_DRAFT_FEATURES */
} specd_accept_head_config;

/* Parses and validates config.json from a buffer (need not be NUL-
 * terminated). The four dimensions are required, n_draft_features is not
 * (0 or 3); model_type must be
 * "specd_accept_head". Errors name the key:
 * "config.json: 'n_layers' = 99 must be an integer in 0..16". */
int specd_accept_head_parse_config(const char *json, size_t len, specd_accept_head_config *cfg,
                                   specd_error *err);

/* The parameters as fp32 arrays, row-major ([out][in]), in the order of the
 * formula above. Used to save a head and to build one in memory. */
typedef struct specd_accept_head_weights {
    const float *in_w;      /* [H][D] */
    const float *in_b;      /* [H] */
    const float *stage_emb; /* [S][H] */
    const float *draft_w;   /* [H][F]; unused when F = 0 */
    const float *fc1_w[SPECD_ACCEPT_HEAD_MAX_LAYERS]; /* [H][H] */
    const float *fc1_b[SPECD_ACCEPT_HEAD_MAX_LAYERS]; /* [H] */
    const float *fc2_w[SPECD_ACCEPT_HEAD_MAX_LAYERS]; /* [H][H] */
    const float *fc2_b[SPECD_ACCEPT_HEAD_MAX_LAYERS]; /* [H] */
    const float *out_w;     /* [H] */
    float out_b;
} specd_accept_head_weights;

typedef struct specd_accept_head specd_accept_head;

/* Loads a head directory. NULL + a message naming the file, key or tensor
 * on any problem: a missing, misshapen, unexpected or non-finite tensor. */
specd_accept_head *specd_accept_head_load(const char *dir, specd_error *err);
/* A head from weights in memory (copied). Same checks as a file's. */
specd_accept_head *specd_accept_head_create(const specd_accept_head_config *cfg,
                                            const specd_accept_head_weights *w, specd_error *err);
void specd_accept_head_free(specd_accept_head *h);

const specd_accept_head_config *specd_accept_head_config_of(const specd_accept_head *h);

/* Writes a head directory: config.json (cfg, plus `extra_json` members if
 * not NULL: a JSON object whose members are copied in, e.g. how the head
 * was trained) and model.safetensors in dtype "F32", "F16" or "BF16".
 * Both files are written whole under a temporary name and renamed. */
int specd_accept_head_save(const char *dir, const specd_accept_head_config *cfg,
                           const specd_accept_head_weights *w, const char *dtype,
                           const char *extra_json, specd_error *err);

/* The draft features of a row whose distribution's two largest
 * probabilities are q1 >= q2 (above): f[0..SPECD_ACCEPT_HEAD_DRAFT_FEATURES).
 * The trainer and draft-svc both make them here, so they cannot drift. */
void specd_accept_head_draft_features(float q1, float q2, float *f);

/* The acceptance probability of n_rows rows of stage `stage`:
 *   states [n_rows][input_dim]  the speculator's stage output states
 *   top2   [n_rows][2]          q1, q2 of each row (above); read only by a
 *                               head with draft features, may be NULL
 *                               for one without
 *   p      [n_rows]             sigmoid(logit), in [0, 1]
 * logits (may be NULL) gets the pre-sigmoid values. Plain single-threaded C:
 * the head is a few hundred KB, far below the speculator stage it follows.
 * One call at a time per head (it keeps scratch buffers). -1 + err for a
 * stage outside 0..n_stages-1, a bad row count, or no top2 for a head
 * with draft features. */
int specd_accept_head_forward(specd_accept_head *h, int stage, int n_rows, const float *states,
                              const float *top2, float *p, float *logits, specd_error *err);

/* Whether the head reads draft features (its callers then compute top2). */
int specd_accept_head_wants_top2(const specd_accept_head *h);

/* From now on the forward multiplies W_in and the blocks' matrices on the
 * integer path: weights as Q8_0 (about half the fp16 bytes, which a draft
 * stage streams in right after the target's pass has flushed the caches),
 * activations quantized to int8 per 32 (kernels/cpu/qmatmul.h), as the
 * mlp drafter's own matrices are by default. p moves by the rounding
 * (|dp| at most 0.0022 on the shipped head, test_int8_path); it only
 * guides how far to draft and what to send, never what is accepted. A
 * no-op where input_dim or hidden_dim is not a multiple of 32. -1 + err
 * when out of memory (the head is unchanged then). */
int specd_accept_head_use_int8(specd_accept_head *h, specd_error *err);

#endif
