/* transformer.h - the Llama forward pass over a ragged batch of sequences.
 *
 * One call processes any number of new tokens from any number of sequences
 * (prefill chunks, single decode tokens, trees of candidate tokens) and
 * returns logits and the final hidden state (after the final RMSNorm) for the
 * batch rows the caller asks for. Each sequence lives in a KV-cache slot; the
 * caller owns the bookkeeping of how many rows of each slot are filled
 * (n_past) and passes it in every call. */
#ifndef SPECD_TRANSFORMER_H
#define SPECD_TRANSFORMER_H

#include <stdint.h>

#include "common/util/error.h"
#include "common/model/model_file.h"
#include "kernels/backend.h"
#include "common/model/kv_pool.h"

typedef struct specd_transformer specd_transformer;

typedef struct specd_transformer_opts {
    specd_backend_opts backend;
    int n_slots;      /* KV-cache slots (concurrent sequences); default 1 */
    int max_ctx;      /* rows per slot; 0 = model's max_seq_len */
    /* KV bytes to spend (0 = no budget): the pool gets as many pages as
     * fit (when kv_pages is 0); fewer than one whole context (max_ctx rows)
     * is an error naming limits.kv_memory. */
    uint64_t kv_memory;
    int max_batch;    /* most tokens per forward call; default 512 */
    /* KV pages of SPECD_KV_PAGE_ROWS rows shared by all slots; 0 = enough
     * for every slot's whole context (a slot then never runs out), or what
     * kv_memory buys. Fewer lets many sessions share memory that few use
     * fully; a forward that needs more pages than are free fails cleanly. */
    int kv_pages;
    /* Prefix caching (kv_pool.h): prefix_publish keys full prompt pages and
     * prefix_attach shares them; 0 turns both into no-ops. */
    int prefix_cache;
} specd_transformer_opts;

typedef struct specd_seq_input {
    int slot;             /* KV slot */
    int n_past;           /* rows already in the slot (all visible) */
    int n_new;            /* new tokens, contiguous in the batch */
    /* n_new*n_new, mask[i*n_new+j] != 0 when new token i sees new token j
     * (j <= i). NULL = causal (plain prefill/decode). A tree passes the
     * ancestor relation: each node sees itself and its ancestors. */
    const uint8_t *mask;
    /* RoPE positions of the new tokens; NULL = n_past, n_past+1, ... (a tree
     * passes n_past + depth). */
    const int32_t *pos;
} specd_seq_input;

typedef struct specd_batch {
    int n_tokens;
    const int32_t *tokens;       /* [n_tokens] */
    int n_seqs;
    const specd_seq_input *seqs; /* tokens of seqs[0] first, then seqs[1], ... */
    int n_out;                   /* rows to return */
    const int32_t *out_rows;     /* batch row indices [n_out] */
    float *logits;               /* host [n_out][vocab] or NULL */
    float *hidden;               /* host [n_out][dim] or NULL */
    /* host [n_out] or NULL: each output row's argmax over its logits,
     * computed on the device, so a greedy step moves ids, not logits */
    int32_t *argmax;
} specd_batch;

specd_transformer *specd_transformer_create(const specd_model_file *m,
                                            const specd_transformer_opts *opts,
                                            specd_error *err);
void specd_transformer_free(specd_transformer *t);

const specd_llama_hparams *specd_transformer_hparams(const specd_transformer *t);
int specd_transformer_max_ctx(const specd_transformer *t);
const char *specd_transformer_backend_name(const specd_transformer *t);
/* What the KV cache stores (SPECD_F32 or SPECD_F16) and the bytes of one
 * token's K and V over every layer. */
specd_dtype specd_transformer_kv_dtype(const specd_transformer *t);
size_t specd_transformer_kv_bytes_per_token(const specd_transformer *t);

/* Runs the batch. Writes the new tokens' K/V at rows n_past.. of each slot
 * (rows past n_past + n_new that the slot held are dropped). Errors (bad
 * slot, token id out of range, context overflow, batch too large, no free
 * KV pages) leave every cache untouched. */
int specd_transformer_forward(specd_transformer *t, const specd_batch *b, specd_error *err);

/* Keeps rows[0..n_keep) of the new rows after n_past (in that order) and
 * moves them to n_past.. (the accepted path of a verified tree); pages past
 * the kept rows go back to the pool. A page the moves write that other slots
 * share is copied first (copy on write, as in a forward pass; fails with
 * nothing changed when no page is free for the copy), and a cached prefix
 * page the slot holds alone loses its key. */
int specd_transformer_kv_compact(specd_transformer *t, int slot, int n_past,
                                 const int32_t *rows, int n_keep, specd_error *err);

/* Returns every KV page of the slot to the pool (its session ended). */
void specd_transformer_release_slot(specd_transformer *t, int slot);

/* KV pages available (free or cached prefix pages, which are evicted on
 * demand) / in all (SPECD_KV_PAGE_ROWS rows each). */
void specd_transformer_kv_pages(const specd_transformer *t, int *n_free, int *n_total);

/* The pool's page states and prefix-cache counters (GetInfo, metrics). */
void specd_transformer_kv_stats(const specd_transformer *t, specd_kv_pool_stats *st);

/* Pages the slot holds now. */
int specd_transformer_slot_pages(const specd_transformer *t, int slot);

/* Pages a forward writing rows [n_past, n_past + n_new) of the slot would
 * take from the pool (growth plus copies of shared pages): what the
 * scheduler admits against specd_transformer_kv_pages' available count. */
int specd_transformer_pages_needed(const specd_transformer *t, int slot, int n_past, int n_new);

/* Prefix caching. attach: for a slot that holds no pages, shares every
 * cached full page that starts tokens[0..n) (never the page holding the
 * last token, whose row must be computed) and returns the rows now filled
 * (a multiple of SPECD_KV_PAGE_ROWS; 0 when off or nothing matched). The
 * caller then runs only tokens[rows..n) with n_past = rows. publish: keys
 * the slot's full pages among its first n_rows rows, which hold tokens[],
 * so later sessions can attach them. */
int specd_transformer_prefix_attach(specd_transformer *t, int slot, const int32_t *tokens, int n);
void specd_transformer_prefix_publish(specd_transformer *t, int slot, const int32_t *tokens,
                                      int n_rows);

/* Checks the page accounting: every slot's pages in range, each page's
 * reference count equal to the page tables holding it, the pool's lists
 * consistent. 0, or -1 + err. For tests. */
int specd_transformer_check_pages(const specd_transformer *t, specd_error *err);

/* Bytes of weights one decode step streams as the backend holds them: every
 * layer's matrices and norms, the final norm and the LM head. */
double specd_transformer_decode_weight_bytes(const specd_transformer *t);

/* The compute backend the transformer runs on (device info, KV type). */
specd_backend *specd_transformer_backend(const specd_transformer *t);

#endif
