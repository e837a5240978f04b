/* mlp_speculator.h - IBM's MLP speculator ("Accelerating Production LLMs with
 * Combined Token/Embedding Speculators"), the pure model.
 *
 * A speculator has n_predict stages. Stage i takes a state vector s (stage
 * 0: the target's final-norm hidden state, emb_dim wide; later stages: the
 * previous stage's output, inner_dim wide) and one token (stage 0: the
 * target's newest token; stage i: the token chosen from stage i-1's logits)
 * and computes, exactly as the reference (fms-extras / vLLM MLPSpeculator):
 *
 *     s0  = rmsnorm(s) / sqrt(2)                       stage 0, scale_input only
 *     u   = proj_i(s) + (emb_weight / state_weight) * emb_i(token)
 *     s'  = gelu_erf(ln_i(u))      ln_i(x) = x * rsqrt(mean(x^2) + 1e-6) * w + b
 *     logits_i = head_i(s')
 *
 * with state_weight = 0.5^(0.5 / n_predict) and
 * emb_weight = sqrt((1 - state_weight^2) * inner_dim / 2).
 *
 * Files: a Hugging Face "MLPSpeculator" directory as IBM publishes them
 * (e.g. ibm-fms/llama-13b-accelerator): config.json plus model.safetensors
 * or model.safetensors.index.json with shards. Tensors are
 * speculator.{emb,proj,head}.{i}.weight and speculator.ln.{i}.{weight,bias}
 * (the "speculator." prefix is optional), F32, F16 or BF16. With
 * tie_weights, emb/head/ln are shared by every stage and proj by stages >= 1;
 * such a checkpoint may hold only one copy of each shared tensor.
 *
 * Reduced vocabulary (a specd extension, written by `specd train
 * speculator`): a head over a 49k-token vocabulary would outweigh a small
 * target, so a checkpoint may predict only vocab_size draft ids. config.json
 * then holds "target_vocab_size" and model.safetensors the I32 tensor
 * speculator.vocab_map [vocab_size]: the target id of each draft id, or -1
 * for the one "other" bucket every unmapped target token falls into. The
 * stage API stays in target token space: input tokens are target ids
 * (mapped internally; unmapped ones read the other bucket's embedding), and
 * logits come out target_vocab_size wide, -inf for every target token
 * outside the map (the other bucket itself is never a candidate).
 *
 * No tree logic here: draft-svc/drafter_mlp.c builds trees out of stages.
 * One stage call takes a batch of rows (many draft sessions, many tree
 * nodes), so the big head matmul reads its weights once for all of them. */
#ifndef SPECD_MLP_SPECULATOR_H
#define SPECD_MLP_SPECULATOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"
#include "kernels/backend.h"

/* Limits on what config.json may claim. Real speculators are far inside
 * them (Llama-3-70B's: vocab 128256, emb 8192, inner 3072, n_predict 4);
 * anything beyond is a corrupt or hostile file, rejected before any
 * allocation is sized from it. */
#define SPECD_MLP_SPEC_MAX_VOCAB (1 << 22)
#define SPECD_MLP_SPEC_MAX_DIM 65536
#define SPECD_MLP_SPEC_MAX_PREDICT 16
#define SPECD_MLP_SPEC_MAX_TOPK 1024
#define SPECD_MLP_SPEC_MAX_CANDIDATES 4096
/* Rows per stage call: a sanity bound on the caller, not a model limit. */
#define SPECD_MLP_SPEC_MAX_ROWS (1 << 20)

typedef struct specd_mlp_spec_config {
    int vocab_size;  /* rows of emb/head: the speculator's own (draft) vocabulary */
    /* The token ids the stage API speaks (inputs and logit columns): the
     * target's vocabulary. Equal to vocab_size unless the checkpoint maps a
     * reduced draft vocabulary (vocab_mapped; see "Reduced vocabulary"). */
    int target_vocab_size;
    int vocab_mapped; /* config.json has "target_vocab_size" */
    int emb_dim;     /* width of the target's hidden state (stage 0 input) */
    int inner_dim;   /* width of the speculator's state; config 0 resolved to emb_dim */
    int n_predict;   /* stages = tokens drafted per path */
    int top_k[SPECD_MLP_SPEC_MAX_PREDICT]; /* top_k_tokens_per_head, one per stage */
    int n_candidates; /* paths kept after pruning the top-k tree */
    int tie_weights;
    int scale_input;
} specd_mlp_spec_config;

/* Parses and validates config.json from a buffer (need not be NUL-
 * terminated). Required: vocab_size, emb_dim, n_predict. Optional
 * target_vocab_size (specd's reduced vocabulary; vocab_size may then be at
 * most target_vocab_size + 1). Defaults as the
 * reference's MLPSpeculatorConfig: inner_dim 0 (= emb_dim),
 * top_k_tokens_per_head [5, 4, 3] (its length must equal n_predict),
 * n_candidates 5, tie_weights false, scale_input false. model_type, when
 * present, must be "mlp_speculator". Errors name the key:
 * "config.json: 'n_predict' = 0 must be in 1..16". */
int specd_mlp_spec_parse_config(const char *json, size_t len, specd_mlp_spec_config *cfg,
                                specd_error *err);

typedef struct specd_mlp_speculator specd_mlp_speculator;

/* Loads a speculator directory; n_threads for the matmuls (0 = one per
 * core). NULL + a message naming the file, key or tensor on any problem. */
specd_mlp_speculator *specd_mlp_speculator_load(const char *dir, int n_threads,
                                                specd_error *err);
/* The same on a chosen compute backend (kernels/backend.h): "cuda" keeps the
 * weights on the GPU (fp16) and each stage copies its inputs there and its
 * outputs back, so the stage API below is the same host arrays either way. */
specd_mlp_speculator *specd_mlp_speculator_load_on(const char *dir,
                                                   const specd_backend_opts *backend,
                                                   specd_error *err);
/* How specd_mlp_speculator_load_ex stores the matrices on the CPU backend
 * (a GPU keeps fp16). Quantized at load, in blocks of 32 weights with
 * llama.cpp's rounding, they run on the integer kernels (precision fast).
 * Drafts change a little, never the output: the target verifies every
 * token. */
typedef enum specd_mlp_quant {
    SPECD_MLP_AS_STORED = 0, /* the checkpoint's own dtype */
    /* every matrix (embedding, projections, head) Q8_0: a stage reads half
     * the bytes of fp16, about twice as fast a draft */
    SPECD_MLP_Q8_0 = 1,
    /* the output heads Q4_1 (one fp16 scale and minimum per block), the
     * rest Q8_0: the head, vocab x inner, is most of what a draft level
     * reads. On the 2-vCPU VM of docs/BENCHMARKS.md a one-node draft took
     * 192-196 against 216-232 us and a four-level chain 561-585 against
     * 718-787 us, with the same tau (specd eval, 12 held-out prompts,
     * every shape within 0.01) */
    SPECD_MLP_Q4_HEAD = 2,
} specd_mlp_quant;
specd_mlp_speculator *specd_mlp_speculator_load_ex(const char *dir,
                                                   const specd_backend_opts *backend,
                                                   specd_mlp_quant quant, specd_error *err);
void specd_mlp_speculator_free(specd_mlp_speculator *sp);

const specd_mlp_spec_config *specd_mlp_speculator_config(const specd_mlp_speculator *sp);
/* Bytes of the weights as the backend holds them (matrices as prepared:
 * repacked, quantized or on the GPU; the norms' vectors). Each tied tensor
 * counts once: its stages share one prepared copy. */
size_t specd_mlp_speculator_weight_bytes(const specd_mlp_speculator *sp);
/* Width of the state a stage reads: emb_dim for stage 0, inner_dim after. */
int specd_mlp_speculator_state_in_dim(const specd_mlp_speculator *sp, int stage);

/* Runs stage `stage` (0 .. n_predict-1) for n_rows rows:
 *   state_in  [n_rows][state_in_dim(stage)]  (stage 0: the target's hidden
 *             states; scale_input is applied here, the input is not changed)
 *   tokens    [n_rows] target ids in [0, target_vocab_size)
 *   state_out [n_rows][inner_dim]   the new state, input of the next stage;
 *             must not overlap state_in
 *   logits    [n_rows][target_vocab_size]  or NULL when not needed
 * Returns 0, or -1 + message for a bad stage, row count or token id.
 * One call at a time per speculator (it keeps scratch buffers). */
int specd_mlp_speculator_stage(specd_mlp_speculator *sp, int stage, int n_rows,
                               const float *state_in, const int32_t *tokens, float *state_out,
                               float *logits, specd_error *err);

/* The same, but with a reduced vocabulary the logits stay in draft ids:
 * [n_rows][cfg.vocab_size], no scatter (a greedy drafter ranks 8k entries
 * instead of 49k); *map = draft id -> target id (-1: the "other" bucket,
 * never to be proposed). Without a reduced vocabulary *map = NULL and the
 * logits are target-width, as specd_mlp_speculator_stage. */
int specd_mlp_speculator_stage_draft_ids(specd_mlp_speculator *sp, int stage, int n_rows,
                                         const float *state_in, const int32_t *tokens,
                                         float *state_out, float *logits,
                                         const int32_t **map, specd_error *err);

#endif
