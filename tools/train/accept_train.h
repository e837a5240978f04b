/* accept_train.h - training the SpecDec++ acceptance head (draft-svc/
 * accept_head.h) on the labeled examples of accept_data.h.
 *
 * The model is the head's formula with fp32 parameters in one flat buffer,
 * in the file's tensor order, so saving is a matter of pointing
 * specd_accept_head_weights into it. Loss: weighted binary cross-entropy,
 * as in the paper,
 *
 *     -( y log p + w_rej (1 - y) log(1 - p) )      averaged with weights
 *
 * where w_rej weighs the rejection term (w_rej > 1 makes the head more
 * pessimistic, i.e. paths stop earlier at a given threshold; 1 keeps p a
 * calibrated probability, so the stop threshold means what it says). AdamW,
 * linear warm-up then cosine decay, gradient clipping by global norm, a
 * fixed seed for initialization and batch order.
 *
 * Evaluation runs the production forward (specd_accept_head_forward) on a
 * head built from the parameters, so what is measured is what draft-svc
 * computes. */
#ifndef SPECD_TRAIN_ACCEPT_TRAIN_H
#define SPECD_TRAIN_ACCEPT_TRAIN_H

#include <stdint.h>

#include "common/util/error.h"
#include "common/model/accept_head.h"
#include "draft-svc/tree_choice.h"
#include "tools/train/accept_data.h"

typedef struct accept_model {
    specd_accept_head_config cfg;
    float *params;   /* every tensor, in the file's order */
    size_t n_params;
    /* into params */
    float *in_w, *in_b, *stage_emb, *out_w, *out_b;
    float *draft_w; /* [H][F]; NULL when cfg.n_draft_features is 0 */
    float *fc1_w[SPECD_ACCEPT_HEAD_MAX_LAYERS], *fc1_b[SPECD_ACCEPT_HEAD_MAX_LAYERS];
    float *fc2_w[SPECD_ACCEPT_HEAD_MAX_LAYERS], *fc2_b[SPECD_ACCEPT_HEAD_MAX_LAYERS];
} accept_model;

/* Initializes (fixed seed): in_proj and fc1 ~ N(0, 1/fan_in), fc2, the
 * stage embedding and draft_proj 0 (each block starts as the identity, and
 * the draft features' weights grow from the gradient), out.weight ~
 * N(0, 0.01/sqrt(H)), out.bias = logit(base_rate) so training starts from
 * the examples' mean acceptance rather than from 0.5. */
int accept_model_init(accept_model *m, const specd_accept_head_config *cfg, float base_rate,
                      uint64_t seed, specd_error *err);
void accept_model_free(accept_model *m);
/* Pointers into m's parameters, for specd_accept_head_save/create. */
void accept_model_weights(const accept_model *m, specd_accept_head_weights *w);

/* Held-out split: 10% of the examples, whole sources at a time (examples
 * of one sequence are correlated, so splitting inside one would flatter the
 * validation numbers): sources with index % 10 == 9. With fewer than 10
 * sources, every 10th example instead. *train / *val are malloc'd index
 * lists. */
int accept_split(const accept_examples *e, int n_sources, long **train, long *n_train, long **val,
                 long *n_val, specd_error *err);

typedef struct accept_train_opts {
    long steps;
    int batch;
    float lr, min_lr_ratio, weight_decay, clip;
    long warmup;
    float w_rej;    /* weight of the rejection term, > 0 */
    uint64_t seed;  /* batch order */
    int log_every;  /* steps between log calls (0 = never) */
} accept_train_opts;

/* Called every log_every steps: the mean weighted BCE of the steps since
 * the last call, and training examples per second so far. */
typedef void (*accept_train_log)(void *ctx, long step, long total, double loss, double ex_per_s);

/* Trains m on examples idx[0..n). -1 + err on bad options or no memory. */
int accept_train(accept_model *m, const accept_examples *e, const long *idx, long n,
                 const accept_train_opts *o, accept_train_log log, void *ctx, specd_error *err);

typedef struct accept_eval {
    long n;
    double bce;       /* mean unweighted BCE */
    double accuracy;  /* (p > 0.5) == (label > 0.5) */
    int n_stages;
    long stage_n[SPECD_ACCEPT_HEAD_MAX_STAGES];
    double stage_p[SPECD_ACCEPT_HEAD_MAX_STAGES]; /* mean predicted acceptance */
    double stage_y[SPECD_ACCEPT_HEAD_MAX_STAGES]; /* mean actual (label) */
    /* How well each score ranks accepted tokens above rejected ones
     * (accept_auc; -1 where a set holds only one class): the head's p, and
     * the speculator's own probability of its draft (accept_examples.
     * qdraft), the score draft-svc prices trees with. A head that does not
     * rank better than the draft adds nothing but its adaptive length. */
    double auc_head, auc_draft;
    double stage_auc_head[SPECD_ACCEPT_HEAD_MAX_STAGES];
    double stage_auc_draft[SPECD_ACCEPT_HEAD_MAX_STAGES];
    /* Acceptance by the draft's probability, in the score bins draft-svc
     * calibrates trees with (draft-svc/tree_choice.h): examples and mean
     * label per bin, all stages together. */
    long qbin_n[SPECD_CALIB_BINS];
    double qbin_y[SPECD_CALIB_BINS];
} accept_eval;

/* The area under the ROC curve of `score` for labels in [0, 1]: the chance
 * that an accepted example scores above a rejected one (ties count half).
 * Each example counts as `label` of accepted mass and 1 - label of
 * rejected mass, so sampling mode's soft labels weigh as their expected
 * coin (an example's own two masses tie; 0/1 labels have none). 0.5 = no
 * better than chance, 1 = a perfect ranking; -1 when the set has no
 * accepted or no rejected mass. O(n log n). */
double accept_auc(const float *score, const float *label, long n);

/* Runs h over examples idx[0..n) (stage by stage) and scores it. */
int accept_evaluate(specd_accept_head *h, const accept_examples *e, const long *idx, long n,
                    accept_eval *out, specd_error *err);

#endif
