/* scheduler.h - continuous batching: one pass loop, many sessions.
 *
 * The transformer is not thread-safe and a forward pass is far cheaper per
 * token when it carries many tokens, so exactly one thread at a time owns it
 * (the runner) and every session hands it work items:
 *
 *   PREFILL  the prompt (may be split into chunks across passes when it does
 *            not fit the token budget); the first token is drawn from the
 *            last prompt row.
 *   DECODE   one pending token, then one token drawn from its row (plain
 *            decoding, Target.Generate).
 *   TREE     [pending, node 0, node 1, ...] with the tree mask; then the
 *            acceptance walk and the KV compaction of the accepted path.
 *
 * The runner gathers every queued item it can fit under max_batch_tokens into
 * ONE ragged batch, waiting up to max_wait_ms for more work while the batch
 * is small, runs the forward pass, post-processes each item and wakes its
 * session. Sessions come and go between passes. A submitter that finds no
 * pass loop running becomes the runner itself until its own item is done
 * (no thread hand-off on the way in or out: a lone stream's step costs no
 * wake-ups); otherwise its item waits for the runner's next pass, and a
 * worker thread takes over whenever work is left with nobody running.
 *
 * Chunked prefill: decode and tree items are gathered first (oldest first),
 * then prompts fill what is left, at most prefill_chunk prompt tokens per
 * pass in all. A long prompt therefore delays the running streams by one
 * chunk's compute per step, never by its whole prefill. A chunk's cost grows
 * with the context it attends to (the 12th 256-token chunk of a prompt costs
 * several times the first), so while other sessions are decoding the chunk
 * is also cut to a time budget, prefill_chunk_ms, at the cost per token that
 * the last pass with prompt work measured: the running streams then stall
 * about that long per step at any prompt length, and a prompt alone still
 * runs in full prefill_chunk passes.
 *
 * KV memory: a slot is a session's page table, nothing more; every slot
 * takes its pages from the transformer's one pool as it grows (kv_pool.h).
 * Admission goes by available pages at each pass: an item is gathered only
 * when the pages its rows need are available after the items before it; a
 * new prompt (its first chunk) only when its whole remainder fits beside
 * what the prompts already started still need (promised to them: two
 * prompts started together must not run the pool dry halfway) with one
 * page per other session holding pages left over, so running sessions can
 * keep growing. A new prompt first shares every cached page of its prefix.
 *
 * New prompts (a new session's, or a failover's re-open) are started first
 * come, first served: while the oldest one waits for pages, younger ones
 * wait behind it (a stream of small prompts cannot starve a large one),
 * and steps of running sessions go on. A prompt not started after
 * queue_wait_ms fails with SPECD_WORK_NO_PAGES (RESOURCE_EXHAUSTED saying
 * so); it held nothing, so nothing is lost. A busy target thus queues: 64
 * prompts of 4,000 tokens on a 2-core CPU wait minutes, not a failure.
 *
 * When the pool runs dry mid-generation (policy): the item waits in the
 * queue, other items go on, and pages come back as sessions end. An item
 * that has waited kv_wait_ms, or the youngest waiting one when every
 * session holding pages is waiting (nothing could ever free a page), fails
 * with SPECD_WORK_NO_PAGES: the service ends the call with
 * RESOURCE_EXHAUSTED and frees the slot's pages. For Verify this is a
 * preemption, not a loss: draft-svc holds every token and re-opens the
 * session (here or on another target) with the history as its prompt, whose
 * re-prefill reuses the cached prompt pages.
 *
 * Cancellation: a submitter passes an is_cancelled probe. A queued item of a
 * cancelled call is dropped (by the runner when it gathers, or by the waiting
 * submitter itself, which polls the probe), so the handler returns and frees
 * its slot at once; an item already inside a forward pass finishes that pass
 * (the pass cannot be interrupted) and is then returned. */
#ifndef SPECD_SCHEDULER_H
#define SPECD_SCHEDULER_H

#include <pthread.h>
#include <stdint.h>

#include "common/util/error.h"
#include "common/spec/sampling.h"
#include "common/spec/step_cost.h"
#include "common/model/transformer.h"
#include "common/spec/verify.h"

typedef struct specd_sched specd_sched;

/* The smallest prompt chunk the time budget cuts to: below it a pass is
 * mostly fixed cost (reading every weight once). */
#define SPECD_MIN_PREFILL_CHUNK 32

typedef struct specd_sched_opts {
    int n_slots;          /* KV slots of the transformer = most sessions */
    int max_batch_tokens; /* tokens per forward pass; must be the transformer's max_batch */
    int max_wait_ms;      /* longest wait for more work while the batch is small */
    int prefill_chunk;    /* prompt tokens per pass, all prompts together; 0 = max_batch_tokens */
    int prefill_chunk_ms; /* while other sessions decode, prompt tokens per pass are also cut
                           * to what fits this many ms at the last prompt pass's measured
                           * cost per token (at least SPECD_MIN_PREFILL_CHUNK); 0 = off */
    int kv_wait_ms;       /* longest wait of a started session for KV pages; 0 = 30 s */
    int queue_wait_ms;    /* longest wait of a new prompt to be started; 0 = 10 min */
    /* Start-up timing of passes of 1..calibrate_tokens tokens for the cost
     * curve (common/spec/step_cost.h); 0 = none (the curve then starts empty and
     * fills from real passes). */
    int calibrate_tokens;
} specd_sched_opts;

typedef enum specd_work_kind {
    SPECD_WORK_PREFILL,
    SPECD_WORK_DECODE,
    SPECD_WORK_TREE,
} specd_work_kind;

/* Result codes of specd_sched_run. */
#define SPECD_WORK_OK 0
#define SPECD_WORK_FAILED -1    /* err says why (forward error, shutdown) */
#define SPECD_WORK_CANCELLED -2 /* the probe said the call is gone */
#define SPECD_WORK_NO_PAGES -3  /* the KV pool stayed full (err says how long) */

typedef struct specd_work {
    /* ---- input, set by the session ---- */
    specd_work_kind kind;
    int slot;
    int n_past;              /* cache rows of the slot before this item */
    const int32_t *tokens;   /* PREFILL: prompt; DECODE: [pending]; TREE: [pending, nodes...] */
    int n_tokens;
    const specd_tree *tree;  /* TREE only; n_tokens == 1 + tree->n_nodes */
    const specd_sampling *sampling;
    /* Penalty history up to and including the last token before the one this
     * item draws (PREFILL: the prompt; DECODE / TREE: prompt + emitted tokens,
     * the pending one included); NULL when the sampling adjusts no logits.
     * Read by the runner only while the submitter is in specd_sched_run. */
    const specd_token_counts *counts;
    /* Output index of the token drawn by this item (PREFILL: 0, or the resumed
     * count on failover; DECODE: the next output index; TREE: output index of
     * the pending token's first child); it addresses the random draws (rng
     * stream), so seeds reproduce. */
    uint64_t position;
    float *hidden;           /* NULL or [dim]: final-norm hidden of the row that
                              * produced next_token */
    int32_t *accepted;       /* TREE: [n_nodes] accepted tokens */
    int32_t *accepted_nodes; /* TREE: [n_nodes] their node indices */
    /* NULL, or [n_nodes + 1] (TREE) / [1]: log-probabilities of each emitted
     * token (accepted ones, then next_token) from its row's raw logits, with
     * top_logprobs alternatives. */
    specd_token_logprob *logprobs;
    int top_logprobs;
    int (*is_cancelled)(void *arg);
    void *cancel_arg;

    /* ---- output, set by the runner ---- */
    int32_t next_token;
    int n_accepted;
    uint32_t queue_us, forward_us, batch_tokens;
    uint32_t active_sessions; /* KV slots held when the pass was gathered */
    uint32_t cached_tokens;   /* PREFILL: prompt tokens whose KV came from the prefix cache */
    uint32_t est_forward_us;  /* the cost curve's estimate for the pass, before it ran */
    uint32_t draft_tokens;    /* of batch_tokens, the draft nodes of every TREE item */
    uint32_t prompt_tokens;   /* of batch_tokens, the prompt rows of every PREFILL item */
    specd_error err;

    /* ---- private to the scheduler ---- */
    int rc, done, in_flight, n_done; /* n_done: prompt tokens already prefilled */
    int admitted; /* PREFILL: 0 new, 1 cached prefix attached, 2 first chunk taken */
    int64_t t_submit_us, t_blocked_us; /* t_blocked_us: first pass it lacked pages, 0 = none */
    pthread_cond_t cv;
    struct specd_work *next;
} specd_work;

/* Starts the worker thread. The transformer must outlive the scheduler and
 * must not be used by anyone else meanwhile. */
specd_sched *specd_sched_create(specd_transformer *t, const specd_sched_opts *o,
                                specd_error *err);

/* Stops the worker (queued items fail with "shutting down"), joins it and
 * frees everything. Call after every submitter has returned. NULL is a no-op. */
void specd_sched_free(specd_sched *s);

/* Takes a free KV slot: its index, or -1 when every slot is in use. */
int specd_sched_acquire_slot(specd_sched *s);
void specd_sched_release_slot(specd_sched *s, int slot);
int specd_sched_free_slots(specd_sched *s);
/* Work waiting for a forward pass: items and the tokens they still need
 * (the metrics' queue gauges). */
void specd_sched_queue(specd_sched *s, int *items, int *tokens);

/* Queues the item and blocks until it is done: SPECD_WORK_OK,
 * SPECD_WORK_FAILED (w->err), SPECD_WORK_NO_PAGES (w->err) or
 * SPECD_WORK_CANCELLED. A PREFILL item may find cached rows: w->n_done
 * then counts them as done and the rest is computed. Thread-safe; the item
 * (and what it points to) must stay valid until this returns. The calling
 * thread may run forward passes (its own and other sessions') meanwhile:
 * it must not hold a lock that another submitter's probe takes. */
int specd_sched_run(specd_sched *s, specd_work *w);

/* The pool's state and prefix-cache counters as of the last pass (for
 * GetInfo and metrics; thread-safe). */
void specd_sched_kv_stats(specd_sched *s, specd_kv_pool_stats *st);

/* The forward-pass cost curve: the start-up timings, folded with every
 * pass since (thread-safe copy). */
void specd_sched_step_cost(specd_sched *s, specd_step_cost *out);
/* The admission queue's bound (opts.queue_wait_ms, defaulted). */
int specd_sched_queue_wait_ms(const specd_sched *s);

/* Checks the KV page accounting (specd_transformer_check_pages) between
 * passes. For tests: 0 or -1 + err. */
int specd_sched_check_pages(specd_sched *s, specd_error *err);

#endif
