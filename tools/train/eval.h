/* eval.h - how good a speculator is: greedy speculative decoding of whole
 * prompts, in process, through target-svc's own code.
 *
 * `specd eval` (tools/cmd_eval.c) prints IBM's and SpecDec++'s tables from
 * what this measures. Nothing here re-implements the target: every step goes
 * through the same session checks and stop rules (target-svc/session.h) and
 * the same batching scheduler (target-svc/scheduler.h: tree mask, forward
 * pass, acceptance walk, KV compaction) that a Verify stream uses, and the
 * drafter is called through drafter.h with the fields draft-svc's driver
 * sets. Only the gRPC hop is left out; the target's hidden state is still
 * rounded through fp16, as the wire carries it, so the speculator sees what
 * it would see in serving.
 *
 * Several prompts are decoded together ("lanes"): each round every lane
 * hands the scheduler one item (its prefill, its tree or its decode step),
 * and the scheduler runs them in ONE forward pass; the drafter, too, gets
 * all lanes' jobs in one call. Lanes change only the speed, never a token.
 *
 * Greedy decoding only (temperature 0), so the speculative output must equal
 * plain greedy decoding token for token: eval_spec checks every emitted
 * token against the reference from eval_greedy and stops with
 * EVAL_MISMATCH (a losslessness bug) on the first difference.
 *
 * Counting, as GenerateStats does (tau = mean_accepted_length):
 *   generated  tokens emitted, the prefill's first token included
 *   steps      target forward passes: the prefill + one per tree
 *   tau        generated / steps (plain decoding: exactly 1)
 *   drafted    tree nodes sent; accepted: nodes the walk accepted;
 *              discarded = drafted - accepted */
#ifndef SPECD_TRAIN_EVAL_H
#define SPECD_TRAIN_EVAL_H

#include <stdint.h>

#include "common/util/error.h"
#include "common/model/model_file.h"
#include "draft-svc/drafter.h"
#include "kernels/backend.h"

/* eval_spec's result when the speculative output differs from greedy. */
#define EVAL_MISMATCH (-2)

typedef struct eval_prompt {
    const int32_t *ids;
    int n;
} eval_prompt;

/* A prompt's plain greedy output (eval_greedy fills it; free with
 * eval_output_free). */
typedef struct eval_output {
    int32_t *ids;
    int n;
} eval_output;

typedef struct eval_target_opts {
    specd_backend_opts backend;
    int lanes;           /* prompts decoded together; >= 1 */
    int max_new_tokens;  /* per prompt; >= 1 */
    int max_prompt;      /* longest prompt (sizes the context and the pass) */
    int max_tree_tokens; /* largest tree any run will send */
    int eos_id;          /* -1 = none */
    const int32_t *stop_ids; /* further end-of-generation ids (ChatML's <|im_end|>) */
    int n_stop_ids;
} eval_target_opts;

typedef struct eval_target eval_target;

/* Builds the transformer (lanes KV slots, each holding the longest prompt,
 * the new tokens and one tree) and the scheduler over it. m must outlive
 * the result. */
eval_target *eval_target_create(const specd_model_file *m, const eval_target_opts *o,
                                specd_error *err);
void eval_target_free(eval_target *t);

/* One speculation setting. */
typedef struct eval_config {
    int candidates;       /* draft job's candidates (k) */
    int depth;            /* draft job's depth (heads) */
    float stop_threshold; /* SpecDec++ adaptive stop; 0 = fixed depth */
    int min_depth;        /* with stop_threshold */
    /* a drafter with a lookup part (mlp_ngram): that part's shape, drafted
     * beside the k x depth of the model (drafter.h); 0 = none */
    int lookup_candidates, lookup_depth;
} eval_config;

typedef struct eval_stats {
    long generated, steps, drafted, accepted;
} eval_stats;

/* Plain greedy decoding of every prompt (the scheduler's DECODE items, as
 * Target.Generate runs them): out[i] gets prompt i's tokens, st[i] (NULL =
 * not wanted) its counts. 0, or -1 + err. */
int eval_greedy(eval_target *t, const eval_prompt *prompts, int n, eval_output *out,
                eval_stats *st, double *wall_s, specd_error *err);

/* Speculative decoding of every prompt with drafter d and setting c; each
 * emitted token is checked against ref[i] on the fly. st[i] gets prompt i's
 * counts, *wall_s (NULL = not wanted) the run's wall time. 0, -1 + err, or
 * EVAL_MISMATCH + err naming the prompt, the position and both tokens. */
int eval_spec(eval_target *t, specd_drafter *d, const eval_config *c,
              const eval_prompt *prompts, int n, const eval_output *ref, eval_stats *st,
              double *wall_s, specd_error *err);

void eval_output_free(eval_output *o);

#endif
