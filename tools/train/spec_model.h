/* spec_model.h - the MLP speculator as a trainable model: fp32 parameters,
 * the forward pass with teacher forcing, its backward, and the files it
 * writes (the MLPSpeculator checkpoint draft-svc loads, and the training
 * state a run resumes from).
 *
 * The forward is the one in draft-svc/mlp_speculator.h, stage by stage:
 *     s0  = hidden (emb_dim; rmsnorm(s)/sqrt(2) first when scale_input)
 *     u_i = proj_i(s_i) + (emb_weight/state_weight) * emb_i(tok_i)
 *     s_{i+1} = gelu(ln_i(u_i));  logits_i = head_i(s_{i+1})
 * Training uses teacher forcing: stage i reads the TRUE token tok_i (stage 0
 * reads token t+1, the one the target produced from hidden state t), and
 * its label is token t+i+2. The loss is the sum over stages of the mean
 * cross-entropy (IBM's recipe).
 *
 * Draft vocabulary. A head over SmolLM2's 49152 tokens would make a
 * speculator far bigger than the model it serves, so the speculator may
 * work over a reduced vocabulary of vocab_size ids: vocab_map[d] is the
 * target token of draft id d, and -1 marks the one "other" bucket that
 * every target token outside the map falls into (as input and as label).
 * With vocab_map == NULL the draft vocabulary IS the target vocabulary and
 * the checkpoint is the plain public format. Otherwise config.json carries
 * "target_vocab_size" and model.safetensors the I32 tensor
 * "speculator.vocab_map" (draft-svc/mlp_speculator.c reads both). */
#ifndef SPECD_TRAIN_SPEC_MODEL_H
#define SPECD_TRAIN_SPEC_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/error.h"
#include "common/model/mlp_speculator.h"

typedef struct spec_model {
    specd_mlp_spec_config cfg;   /* vocab_size = draft vocabulary rows; init sets
                                  * target_vocab_size and vocab_mapped */
    int target_vocab;            /* the target's vocab_size */
    int32_t *vocab_map;          /* [cfg.vocab_size] draft id -> target id, -1 = other; NULL = identity */
    int32_t *target_to_draft;    /* [target_vocab] the inverse (other bucket for unmapped); NULL = identity */

    /* All parameters in one flat buffer, so optimizer, clipping and the
     * training state treat them as one vector. With tie_weights there is
     * one emb / head / ln and proj[1] == proj[2] == ...; the per-stage
     * pointers below then alias. */
    float *params;
    size_t n_params;
    float *emb[SPECD_MLP_SPEC_MAX_PREDICT];   /* [vocab_size][inner_dim] */
    float *proj[SPECD_MLP_SPEC_MAX_PREDICT];  /* [inner_dim][stage 0: emb_dim, else inner_dim] */
    float *head[SPECD_MLP_SPEC_MAX_PREDICT];  /* [vocab_size][inner_dim] */
    float *ln_w[SPECD_MLP_SPEC_MAX_PREDICT];  /* [inner_dim] */
    float *ln_b[SPECD_MLP_SPEC_MAX_PREDICT];  /* [inner_dim] */

    /* The distinct tensors (n_tensors of them) in file order, for the
     * optimizer (norm weights and biases get no weight decay) and files. */
    int n_tensors;
    struct spec_tensor {
        char name[64];           /* "speculator.emb.0.weight", ... */
        float *data;             /* points into params */
        size_t numel;
        int rows, cols;          /* cols = 0 for vectors */
        int decay;               /* weight decay applies */
    } tensors[5 * SPECD_MLP_SPEC_MAX_PREDICT];
} spec_model;

/* Allocates and initializes (fixed seed): emb ~ N(0, 1/sqrt(inner)),
 * proj/head ~ N(0, 1/sqrt(fan_in)), ln weight 1, bias 0. vocab_map (copied)
 * may be NULL (identity; then cfg->vocab_size must equal target_vocab). */
int spec_model_init(spec_model *m, const specd_mlp_spec_config *cfg, int target_vocab,
                    const int32_t *vocab_map, uint64_t seed, specd_error *err);
void spec_model_free(spec_model *m);

/* Maps a target token to its draft id (identity without a map); -1 for a
 * token outside [0, target_vocab). */
int32_t spec_model_draft_id(const spec_model *m, int32_t target_token);

/* One training batch of n positions:
 *   hidden [n][emb_dim]           the target's final-norm state at t
 *   tokens [n][n_predict + 1]     DRAFT ids of tokens t+1 .. t+n_predict+1
 * Stage i reads tokens[r][i] and is scored on tokens[r][i+1]. Every id must
 * be in [0, vocab_size) (spec_model_draft_id gives such ids); they are not
 * checked here, in the inner loop. */
typedef struct spec_batch {
    int n;
    const float *hidden;
    const int32_t *tokens;
} spec_batch;

/* Scratch for a batch of up to max_rows positions (activations kept for
 * the backward). */
typedef struct spec_work spec_work;
spec_work *spec_work_create(const spec_model *m, int max_rows);
void spec_work_free(spec_work *w);

/* Forward + backward. grads [n_params] is ADDED to (callers zero it);
 * grads == NULL runs the forward only. Returns the loss (sum over stages of
 * the mean cross-entropy; NaN if b->n is not in 1..max_rows); stage_loss[i] /
 * stage_acc[i] (if non-NULL) get each stage's mean cross-entropy and top-1
 * accuracy. */
double spec_model_step(const spec_model *m, spec_work *w, const spec_batch *b, float *grads,
                       float *stage_loss, float *stage_acc);

/* Forward only, for evaluation and tests: stage `stage`'s logits
 * [b->n][vocab_size] over DRAFT ids, teacher-forced as in spec_model_step.
 * -1 for a bad stage or row count. */
int spec_model_logits(const spec_model *m, spec_work *w, const spec_batch *b, int stage,
                      float *logits);

/* Writes an MLPSpeculator directory: config.json (model_type
 * "mlp_speculator", architectures ["MLPSpeculatorPreTrainedModel"], the
 * cfg fields, plus target_vocab_size when a vocab_map is used) and
 * model.safetensors in dtype "F16", "BF16" or "F32" (written to a temp
 * name and renamed, so a crash never leaves a half file). */
int spec_model_export(const spec_model *m, const char *dir, const char *dtype, specd_error *err);

/* Training state for resuming: the fp32 parameters, both Adam moments,
 * and a small JSON blob the trainer owns (step, stage, data cursor, RNG),
 * in one safetensors file (metadata holds the blob). Atomic like export.
 * load checks that the tensors match m's shapes. */
int spec_model_save_state(const spec_model *m, const float *adam_m, const float *adam_v,
                          const char *json_meta, const char *path, specd_error *err);
/* On success *json_meta is malloc'd (caller frees; "{}" if the file had
 * none). On failure params and moments may be partly overwritten. */
int spec_model_load_state(spec_model *m, float *adam_m, float *adam_v, char **json_meta,
                          const char *path, specd_error *err);

/* Reads the weights of an exported checkpoint (DIR/model.safetensors, F32,
 * F16 or BF16) into a model initialized with the same shapes: every tensor
 * of m by name, and speculator.vocab_map, which must equal m's (init m
 * with the file's map: spec_model_read_vocab_map). */
int spec_model_load_export(spec_model *m, const char *dir, specd_error *err);

/* The draft vocabulary of an exported checkpoint: *map (malloc'd) and its
 * length; *map = NULL, *n = 0 when the file has none. */
int spec_model_read_vocab_map(const char *dir, int32_t **map, int *n, specd_error *err);
#endif
