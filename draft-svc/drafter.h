/* drafter.h - the one interface every drafter implements.
 *
 * A drafter guesses how the text goes on, as a tree of candidate tokens that
 * target-svc then verifies. Four live behind this interface:
 *
 *   mlp       IBM's MLP speculator (draft-svc/mlp_speculator.h): conditions
 *             on the target's final hidden state and the newest token; one
 *             stage per draft position. Needs hidden states from the target.
 *   draft_lm  a small Llama-family model with the target's tokenizer, run by
 *             the same transformer code, with its own KV cache per session.
 *   ngram     prompt lookup / suffix decoding: what followed the text's
 *             last tokens before, in this request's prompt and output and
 *             (when the operator shares it) in recent requests' outputs,
 *             weighted by how often. No model.
 *
 *   mlp_ngram both of the above in one tree: the mlp drafter's drafts and
 *             suffix decoding's, merged, each node scored and calibrated
 *             by its source (drafter_hybrid.c). Needs hidden states.
 *
 * Batching: propose() takes every session that is ready at once (the session
 * driver's batcher gathers them), so N concurrent streams cost one
 * speculator call per round, not N.
 *
 * Losslessness does not depend on the drafter: the target accepts only what
 * its own rule allows. What a drafter must get right in sampling mode is to
 * draw each node's children i.i.d. from the q it reports (tree_builder.h),
 * and to apply the request's sampling settings (penalties, bias, temperature,
 * filters) along each path the same way the target does, so q is close to p.
 * Its random draws use its own address space (SPECD_DRAFT_RNG_SALT), so they
 * are independent of the target's acceptance tests. */
#ifndef SPECD_DRAFTER_H
#define SPECD_DRAFTER_H

#include <stdint.h>

#include "common/util/error.h"
#include "common/spec/sampling.h"
#include "draft-svc/tree_builder.h"

/* Drafters draw with seed ^ SPECD_DRAFT_RNG_SALT, stream = output index of
 * the node being drawn, counter = a per-drafter purpose; the target draws
 * with the plain seed (target-svc/verify.h), so the two never share an
 * address. */
#define SPECD_DRAFT_RNG_SALT 0x9e3779b97f4a7c15ull

typedef struct specd_drafter specd_drafter;

typedef struct specd_draft_job {
    /* ---- input, set by the session driver ---- */
    void *state;              /* from session_open (NULL for stateless drafters) */
    const int32_t *history;   /* prompt then every emitted token; the last one is
                               * the pending token, the root of the tree */
    int n_history;
    int n_prompt;             /* history[0..n_prompt) is the prompt */
    const float *hidden;      /* [hidden_size] target's final-norm hidden state of the
                               * position that produced the pending token; NULL if
                               * the target sent none */
    const specd_sampling *sampling;      /* temperature 0 = greedy mode */
    const specd_token_counts *counts;    /* history as penalty counts (prompt: not
                                          * generated; the rest: generated) */
    uint64_t position;        /* output index of the root's children (rng streams) */
    int candidates;           /* paths wanted, >= 1 */
    int depth;                /* longest path, >= 1 */
    /* The shape a part that costs no time per level may take: the hybrid
     * drafter's prompt lookup (drafter_hybrid.c) drafts up to
     * lookup_candidates x lookup_depth whatever candidates x depth asks of
     * its model, since a lookup's nodes cost only the rows of them that the
     * price keeps (tree_choice.h). 0 = candidates x depth. Other drafters
     * ignore it. */
    int lookup_candidates, lookup_depth;
    /* SpecDec++ adaptive length, for drafters with an acceptance head:
     * a path stops growing once 1 - prod(p_accept) along it exceeds
     * stop_threshold, but never before min_depth (<= depth). 0 = off:
     * every path is drafted to `depth`. Drafters without a head ignore it. */
    float stop_threshold;
    int min_depth;
    /* ---- output ---- */
    specd_tree_buf *out;      /* reset by the caller; capacity = the target's
                               * max_tree_tokens. Leaving it empty is allowed
                               * (nothing to propose: the step decodes plainly). */
} specd_draft_job;

typedef struct specd_drafter_ops {
    const char *name; /* "mlp", "draft_lm", "ngram", "mlp_ngram" */
    /* Per-session state (KV slot, scratch). NULL ops = stateless. -1 + err
     * when out of capacity (the session then runs without drafting). */
    int (*session_open)(specd_drafter *d, void **state, specd_error *err);
    void (*session_close)(specd_drafter *d, void *state);
    /* Fills jobs[i].out for all n jobs (n <= max_batch). -1 + err fails the
     * whole batch (the driver then decodes those steps plainly). */
    int (*propose)(specd_drafter *d, specd_draft_job *jobs, int n, specd_error *err);
    /* Optional: drafts one job on the calling thread, when the job involves
     * no model (the ngram lookup; of mlp_ngram, a job of depth 0, the
     * lookup alone), and returns 1 without touching it otherwise. Safe to
     * call from several threads at once, and beside propose, for
     * different sessions. The driver tries it before the batcher: a
     * lookup takes about 15 us, and a turn in the batcher (then with a
     * worker thread's two hand-offs) took 110-220 us a step at 4 and 16
     * streams on 2 vCPUs, where mlp_ngram drafts the lookup alone on
     * nearly every step. */
    int (*propose_inline)(specd_drafter *d, specd_draft_job *job, specd_error *err);
    void (*destroy)(specd_drafter *d);
} specd_drafter_ops;

struct specd_drafter {
    const specd_drafter_ops *ops;
    int vocab;        /* must equal the target's vocab_size */
    int hidden_size;  /* > 0: needs the target's hidden states of this width */
    int max_batch;    /* most jobs per propose() */
    int max_depth;    /* longest path it can draft (n_predict for mlp) */
    /* 1 when it computes on CUDA device cuda_device: the driver then offers
     * the target co-location (hidden states through GPU memory,
     * common/ipc_caps.h). 0 (calloc's) = on the host. */
    int on_cuda, cuda_device;
    /* 1 when part of its tree is a lookup that costs no drafting time
     * (mlp_ngram): the driver drafts that part on every priced step, with
     * the job's lookup_* shape, and runs the rest (candidates x depth,
     * 0 x 0 = not this step) only when it could pay. */
    int has_lookup;
    /* 1 when the driver may draft ahead (pipelined drafting, driver_draft.c):
     * drafting takes time worth hiding behind the target's pass, it needs
     * no hidden state from the target, its session state follows whatever
     * history a job brings (a guess that turns out wrong is rolled back by
     * the next job), and the tree it drafts under a node does not depend
     * on what it drafted above that node, so a deeper job's subtree is the
     * tree a job rooted there would have drafted: draft_lm. */
    int draft_ahead;
    void *impl;
};

/* Convenience wrappers (NULL-safe where it makes sense). */
int specd_drafter_session_open(specd_drafter *d, void **state, specd_error *err);
void specd_drafter_session_close(specd_drafter *d, void *state);
int specd_drafter_propose(specd_drafter *d, specd_draft_job *jobs, int n, specd_error *err);
/* ops->propose_inline, or 1 (not drafted: use propose) when there is none. */
int specd_drafter_propose_inline(specd_drafter *d, specd_draft_job *job, specd_error *err);
void specd_drafter_free(specd_drafter *d);

/* ---- the three drafters ---------------------------------------------------- */

typedef struct specd_mlp_drafter_opts {
    const char *path;       /* MLPSpeculator directory (config.json + safetensors) */
    int n_threads;          /* CPU threads, 0 = one per core */
    const char *backend;    /* "cpu" (NULL = cpu) or "cuda" */
    int device;             /* CUDA device id */
    int max_batch;          /* jobs per call, default 64 */
    int top_k_per_stage[8]; /* 0s = the checkpoint's top_k_tokens_per_head */
    /* SpecDec++ acceptance head directory (accept_head.h) for this
     * speculator; NULL = none, and jobs' stop_threshold is ignored. */
    const char *accept_head;
    /* how the speculator's matrices are stored on the CPU: a
     * specd_mlp_quant (common/model/mlp_speculator.h; 0 = as stored) */
    int quant;
} specd_mlp_drafter_opts;
specd_drafter *specd_mlp_drafter_create(const specd_mlp_drafter_opts *o, specd_error *err);

typedef struct specd_lm_drafter_opts {
    const char *path;   /* .gguf file or Hugging Face directory */
    int n_threads;
    int max_sessions;   /* KV slots */
    int max_ctx;        /* rows per slot; 0 = the model's context. Sessions longer
                         * than this simply get no drafts (never an error). */
    int max_batch;      /* jobs per call, default 32 */
} specd_lm_drafter_opts;
specd_drafter *specd_lm_drafter_create(const specd_lm_drafter_opts *o, specd_error *err);

typedef struct specd_ngram_drafter_opts {
    int vocab;
    int min_n, max_n;   /* n-gram lengths tried, longest first; default 1..4 */
    int max_scan;       /* history tokens searched backwards; default 8192 */
    /* Suffix decoding (greedy requests with a session; drafter_ngram.c):
     * min_prob: smallest path probability a drafted node may have (0 = the
     * default, 0.02). shared: finished requests' outputs go into one
     * deployment-wide suffix cache that every request drafts from (off: a
     * request drafts from its own prompt and output only). cache_max_tokens:
     * that cache's cap in tokens, oldest requests evicted first (0 = the
     * default, 65536). depth: longest string the suffix trees hold (0 = 32). */
    float min_prob;
    int shared;
    int64_t cache_max_tokens;
    int depth;
} specd_ngram_drafter_opts;
specd_drafter *specd_ngram_drafter_create(const specd_ngram_drafter_opts *o, specd_error *err);

typedef struct specd_hybrid_drafter_opts {
    /* The model drafter (mlp) and the lookup (ngram), both borrowed: they
     * must outlive this one and take calls from two batchers, theirs and
     * this one's (both serialize their own calls). Sessions of this
     * drafter are sessions of each, so the lookup's suffix cache, when
     * shared, is one for both drafters. */
    specd_drafter *model, *lookup;
} specd_hybrid_drafter_opts;
specd_drafter *specd_hybrid_drafter_create(const specd_hybrid_drafter_opts *o, specd_error *err);

#endif
