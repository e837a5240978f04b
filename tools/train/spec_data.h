/* spec_data.h - the speculator's training examples: token sequences with
 * the frozen target's final-norm hidden state at every position.
 *
 * Alignment: hidden[s][j] is the target's state after reading tokens[s][j],
 * the state from which the target predicted tokens[s][j+1]. A training
 * example at (s, j) is hidden[s][j] with the tokens j+1 .. j+n_predict+1,
 * which needs j + n_predict + 1 < len[s].
 *
 * Two sources, one per training stage (DESIGN.md, "Two-stage speculator
 * training"):
 *   stage 1  ground-truth text: documents tokenized, joined with EOS, cut
 *            into windows of seq_len tokens, each run through the target in
 *            one prefill;
 *   stage 2  the target's own continuations of prompts (greedy, as the
 *            server decodes by default, with an optional sampled fraction;
 *            many sequences decoded side by side), from the last prompt
 *            token on.
 *
 * The target forward is the expensive part (the speculator's step is a
 * fraction of it), so both sets are cached in shards of safetensors files
 * (tensors "tokens" I32 [n][L], "len" I32 [n], "hidden" F16 [n][L][dim],
 * metadata describing how they were made) and reused by later runs; an
 * interrupted preparation continues from the last complete shard
 * (spec_data_sharded). */
#ifndef SPECD_TRAIN_SPEC_DATA_H
#define SPECD_TRAIN_SPEC_DATA_H

#include <stdint.h>
#include <stdio.h>

#include "common/util/error.h"
#include "common/text/tokenizer.h"
#include "common/model/transformer.h"
#include "tools/train/corpus.h"

typedef struct spec_seqs {
    int n_seqs, seq_len, dim;
    int32_t *tokens;  /* [n_seqs][seq_len] target ids (zero past len) */
    int32_t *len;     /* [n_seqs] valid tokens of each row */
    uint16_t *hidden; /* [n_seqs][seq_len][dim] fp16 */
} spec_seqs;

void spec_seqs_free(spec_seqs *s);

/* Called now and then with work done / total (tokens). */
typedef void (*spec_data_progress)(void *ctx, long done, long total);

/* Stage 1: up to max_tokens tokens of the documents (in order), windows of
 * seq_len, `batch` windows per forward. t needs >= batch slots of seq_len
 * context and max_batch >= batch * seq_len. */
int spec_data_encode_text(specd_transformer *t, const specd_tokenizer *tok, const corpus *c,
                          int seq_len, int batch, long max_tokens, spec_seqs *out,
                          spec_data_progress progress, void *ctx, specd_error *err);

/* The text documents (not prompts) of c as one token stream, each followed
 * by EOS, cut at max_tokens (malloc'd into *out). */
int spec_data_text_stream(const specd_tokenizer *tok, const corpus *c, long max_tokens,
                          int32_t **out, long *n_out, specd_error *err);

/* Stage 1 over part of a stream: windows [first, first + count) of seq_len
 * tokens (window w = stream[w * seq_len ..]), `batch` per forward. The rows
 * equal those spec_data_encode_text makes for the same windows. */
int spec_data_encode_windows(specd_transformer *t, const int32_t *stream, int seq_len, int batch,
                             long first, int count, spec_seqs *out, spec_data_progress progress,
                             void *ctx, specd_error *err);

typedef struct spec_gen_opts {
    int gen_len;        /* tokens generated per prompt */
    int max_prompt;     /* prompts are cut to their last max_prompt tokens */
    int n_parallel;     /* sequences decoded side by side (<= t's slots) */
    /* Prompt i is continued sampled (temperature, top_k) when
     * specd_rng_uniform(seed, i, SPEC_GEN_SAMPLED_STREAM) < sampled_frac, and
     * greedily otherwise (0, the default: all greedy). */
    float sampled_frac;
    float temperature;  /* the sampled prompts' temperature; 0 makes them greedy too */
    int top_k;
    uint64_t seed;
    long first_prompt;  /* start at this prompt (a shard of a larger set) */
    long max_prompts;   /* use at most this many prompts from there (0 = all) */
} spec_gen_opts;

#define SPEC_GEN_SAMPLED_STREAM 0x53414d50ULL

/* Whether prompt i (global index) is continued sampled under o. */
int spec_gen_is_sampled(const spec_gen_opts *o, long i);

/* Stage 2: renders each prompt doc through the chat template (docs from a
 * "text" key are used raw, cut to max_prompt tokens), lets the target
 * continue it, and keeps [last prompt token, generated tokens...] with their
 * hidden states (len = 1 + tokens generated before the end-of-turn token,
 * which is kept). Rows have seq_len = gen_len + 1; row r is prompt
 * first_prompt + r, and the sampled draws are addressed by the global
 * prompt index, so a shard's rows do not depend on how the set was cut. */
int spec_data_generate(specd_transformer *t, const specd_tokenizer *tok, const corpus *prompts,
                       const spec_gen_opts *o, spec_seqs *out, spec_data_progress progress,
                       void *ctx, specd_error *err);

/* Cache files. meta is a short description (what made the data) stored in
 * the file and returned by load (malloc'd; caller frees) so a caller can
 * refuse a cache made differently. */
int spec_seqs_save(const spec_seqs *s, const char *meta, const char *path, specd_error *err);
int spec_seqs_load(spec_seqs *s, char **meta, const char *path, specd_error *err);

/* Builds rows [first, first + count) of a data set into out. */
typedef int (*spec_shard_build_fn)(void *ctx, long first, int count, spec_seqs *out,
                                   specd_error *err);

/* A data set of n_rows rows kept as shards of shard_rows rows:
 * DIR/NAME-00000.safetensors, ... Each shard whose file exists and was made
 * with the same `meta` (and the same row range) is loaded; the others are
 * built with `build` and written (to a temporary name, then renamed, so a
 * file that exists is complete). All rows end up in out, in order. If
 * n_built is not NULL it receives the number of shards built this call.
 * Messages about each shard go to `log` when not NULL. */
int spec_data_sharded(const char *dir, const char *name, const char *meta, long n_rows,
                      int shard_rows, spec_shard_build_fn build, void *ctx, spec_seqs *out,
                      int *n_built, FILE *log, specd_error *err);

/* Tokens of s that can start an example with n_predict heads. */
long spec_seqs_n_examples(const spec_seqs *s, int n_predict);

#endif
