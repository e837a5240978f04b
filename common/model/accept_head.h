/* accept_head.h - the SpecDec++ acceptance head ("SpecDec++: Boosting
 * Speculative Decoding via Adaptive Candidate Lengths", Huang et al. 2024):
 * a small network on the MLP speculator's state that predicts the
 * probability that the token a stage drafts will be accepted by the target,
 * given that the stages before it were.
 *
 * Input: the speculator's stage OUTPUT state s_{i+1} (inner_dim wide: the
 * state that stage i's logits are computed from, mlp_speculator.h) and the
 * stage index i. The network, a residual MLP with SiLU:
 *
 *     x     = W_in s + b_in + E[i]                      hidden_dim
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
 * Files: a directory holding
 *   config.json        {"model_type": "specd_accept_head", "input_dim": D,
 *                       "hidden_dim": H, "n_layers": L, "n_stages": S, ...}
 *                      (other keys, e.g. how it was trained, are ignored)
 *   model.safetensors  F32, F16 or BF16 tensors, exactly these:
 *       in_proj.weight [H, D]      in_proj.bias [H]
 *       stage_emb.weight [S, H]
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

typedef struct specd_accept_head_config {
    int input_dim;  /* D: the speculator's inner_dim */
    int hidden_dim; /* H */
    int n_layers;   /* L residual blocks, may be 0 */
    int n_stages;   /* S: stage indices 0 .. S-1 have an embedding */
} specd_accept_head_config;

/* Parses and validates config.json from a buffer (need not be NUL-
 * terminated). All four keys are required; model_type must be
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

/* The acceptance probability of n_rows rows of stage `stage`:
 *   states [n_rows][input_dim]  the speculator's stage output states
 *   p      [n_rows]             sigmoid(logit), in [0, 1]
 * logits (may be NULL) gets the pre-sigmoid values. Plain single-threaded C:
 * the head is a few hundred KB, far below the speculator stage it follows.
 * One call at a time per head (it keeps scratch buffers). -1 + err for a
 * stage outside 0..n_stages-1 or a bad row count. */
int specd_accept_head_forward(specd_accept_head *h, int stage, int n_rows, const float *states,
                              float *p, float *logits, specd_error *err);

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
