/* spec_data.c - builds the speculator's training sequences by running the
 * frozen target: prefill over text windows (stage 1) and sampled decoding
 * from prompts (stage 2). See spec_data.h for the alignment of tokens and
 * hidden states. */
#include "tools/train/spec_data.h"

#include <stdlib.h>
#include <string.h>

#include "common/text/chat.h"
#include "common/util/dtype.h"
#include "common/util/rng.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_write.h"
#include "common/spec/sampling.h"
#include "common/model/mlp_speculator.h"

void spec_seqs_free(spec_seqs *s) {
    if (!s) return;
    free(s->tokens);
    free(s->len);
    free(s->hidden);
    memset(s, 0, sizeof(*s));
}

long spec_seqs_n_examples(const spec_seqs *s, int n_predict) {
    long n = 0;
    for (int i = 0; i < s->n_seqs; i++)
        if (s->len[i] > n_predict + 1) n += s->len[i] - (n_predict + 1);
    return n;
}

static int seqs_alloc(spec_seqs *s, int n_seqs, int seq_len, int dim, specd_error *err) {
    memset(s, 0, sizeof(*s));
    s->n_seqs = n_seqs;
    s->seq_len = seq_len;
    s->dim = dim;
    s->tokens = calloc((size_t)n_seqs * seq_len, sizeof(int32_t));
    s->len = calloc((size_t)n_seqs, sizeof(int32_t));
    s->hidden = calloc((size_t)n_seqs * seq_len * dim, sizeof(uint16_t));
    if (!s->tokens || !s->len || !s->hidden) {
        spec_seqs_free(s);
        return specd_seterr(err, "out of memory for %d sequences of %d tokens", n_seqs, seq_len);
    }
    return 0;
}

static void store_hidden(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = specd_f32_to_fp16(src[i]);
}

/* ---- stage 1: text windows ------------------------------------------------ */

/* The documents as one token stream, each followed by EOS so the speculator
 * also learns where texts end. Stops at max_tokens. */
int spec_data_text_stream(const specd_tokenizer *tok, const corpus *c, long max_tokens,
                          int32_t **out, long *n_out, specd_error *err) {
    long cap = 1 << 16, n = 0;
    int32_t *all = malloc(sizeof(int32_t) * cap);
    if (!all) return specd_seterr(err, "out of memory");
    int32_t eos = specd_tokenizer_eos(tok);
    for (size_t d = 0; d < c->n_docs && n < max_tokens; d++) {
        if (c->docs[d].is_prompt) continue;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (specd_tokenize(tok, c->docs[d].text, c->docs[d].len, 0, &ids, &n_ids, err) != 0) {
            free(all);
            return -1;
        }
        if (n + (long)n_ids + 1 > cap) {
            while (n + (long)n_ids + 1 > cap) cap *= 2;
            int32_t *grown = realloc(all, sizeof(int32_t) * cap);
            if (!grown) {
                free(ids);
                free(all);
                return specd_seterr(err, "out of memory");
            }
            all = grown;
        }
        if (n_ids) memcpy(all + n, ids, sizeof(int32_t) * n_ids);
        n += (long)n_ids;
        if (eos >= 0) all[n++] = eos;
        free(ids);
    }
    *out = all;
    *n_out = n < max_tokens ? n : max_tokens;
    return 0;
}

int spec_data_encode_windows(specd_transformer *t, const int32_t *stream, int seq_len, int batch,
                             long first, int count, spec_seqs *out, spec_data_progress progress,
                             void *ctx, specd_error *err) {
    const specd_llama_hparams *hp = specd_transformer_hparams(t);
    int dim = hp->dim;
    if (count < 1 || batch < 1) return specd_seterr(err, "no windows to encode");
    if (seqs_alloc(out, count, seq_len, dim, err) != 0) return -1;
    int rows = batch * seq_len;
    float *hidden = malloc(sizeof(float) * (size_t)rows * dim);
    int32_t *out_rows = malloc(sizeof(int32_t) * rows);
    specd_seq_input *seqs = calloc((size_t)batch, sizeof(*seqs));
    int rc = 0;
    if (!hidden || !out_rows || !seqs) {
        rc = specd_seterr(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < rows; i++) out_rows[i] = i;
    for (int w0 = 0; w0 < count; w0 += batch) {
        int nb = count - w0 < batch ? count - w0 : batch;
        for (int b = 0; b < nb; b++)
            seqs[b] = (specd_seq_input){.slot = b, .n_past = 0, .n_new = seq_len};
        const int32_t *toks = stream + (first + w0) * (long)seq_len;
        specd_batch fb = {.n_tokens = nb * seq_len, .tokens = toks, .n_seqs = nb, .seqs = seqs,
                          .n_out = nb * seq_len, .out_rows = out_rows, .hidden = hidden};
        if (specd_transformer_forward(t, &fb, err) != 0) {
            rc = -1;
            goto done;
        }
        memcpy(out->tokens + (size_t)w0 * seq_len, toks, sizeof(int32_t) * nb * seq_len);
        for (int b = 0; b < nb; b++) out->len[w0 + b] = seq_len;
        store_hidden(out->hidden + (size_t)w0 * seq_len * dim, hidden, (size_t)nb * seq_len * dim);
        if (progress) progress(ctx, (long)(w0 + nb) * seq_len, (long)count * seq_len);
    }
done:
    free(hidden);
    free(out_rows);
    free(seqs);
    if (rc != 0) spec_seqs_free(out);
    return rc;
}

int spec_data_encode_text(specd_transformer *t, const specd_tokenizer *tok, const corpus *c,
                          int seq_len, int batch, long max_tokens, spec_seqs *out,
                          spec_data_progress progress, void *ctx, specd_error *err) {
    int32_t *stream = NULL;
    long n_stream = 0;
    if (spec_data_text_stream(tok, c, max_tokens, &stream, &n_stream, err) != 0) return -1;
    long n_windows = n_stream / seq_len;
    int rc;
    if (n_windows < 1)
        rc = specd_seterr(err, "the text has %ld tokens, fewer than one window of %d", n_stream,
                          seq_len);
    else
        rc = spec_data_encode_windows(t, stream, seq_len, batch, 0, (int)n_windows, out, progress,
                                      ctx, err);
    free(stream);
    return rc;
}

/* A prompt doc as ids: chat-rendered for "prompt" docs, raw for "text" docs;
 * the last max_prompt tokens. */
static int prompt_ids(const specd_tokenizer *tok, const corpus_doc *doc, int max_prompt,
                      int32_t **ids, size_t *n_ids, specd_error *err) {
    int rc;
    if (doc->is_prompt) {
        specd_chat_msg msg = {"user", doc->text};
        rc = specd_chat_tokenize(tok, &msg, 1, ids, n_ids, err);
    } else {
        rc = specd_tokenize(tok, doc->text, doc->len, 0, ids, n_ids, err);
    }
    if (rc != 0) return -1;
    if ((int)*n_ids > max_prompt) {
        memmove(*ids, *ids + (*n_ids - max_prompt), sizeof(int32_t) * max_prompt);
        *n_ids = (size_t)max_prompt;
    }
    return 0;
}

typedef struct gen_lane {
    int row;      /* output row, -1 = idle */
    int n_past;   /* KV rows filled */
    int32_t next; /* token to feed next */
    int done;
} gen_lane;

int spec_gen_is_sampled(const spec_gen_opts *o, long i) {
    return o->sampled_frac > 0 && o->temperature > 0 &&
           specd_rng_uniform(o->seed, SPEC_GEN_SAMPLED_STREAM, (uint64_t)i) < o->sampled_frac;
}

int spec_data_generate(specd_transformer *t, const specd_tokenizer *tok, const corpus *prompts,
                       const spec_gen_opts *o, spec_seqs *out, spec_data_progress progress,
                       void *ctx, specd_error *err) {
    const specd_llama_hparams *hp = specd_transformer_hparams(t);
    int dim = hp->dim, vocab = hp->vocab_size, L = o->gen_len + 1, P = o->n_parallel;
    long first = o->first_prompt > 0 ? o->first_prompt : 0;
    long n_prompts = (long)prompts->n_docs - first;
    if (o->max_prompts > 0 && o->max_prompts < n_prompts) n_prompts = o->max_prompts;
    if (n_prompts < 1) return specd_seterr(err, "no prompts to generate from");
    if (seqs_alloc(out, (int)n_prompts, L, dim, err) != 0) return -1;
    /* Logits come back only when some prompt is sampled; greedy lanes use
     * the forward's argmax. */
    int any_sampled = o->sampled_frac > 0 && o->temperature > 0;

    specd_sampling samp;
    specd_sampling_init(&samp);
    samp.temperature = o->temperature;
    samp.top_k = o->top_k;
    samp.seed = o->seed;
    gen_lane *lanes = calloc((size_t)P, sizeof(*lanes));
    specd_seq_input *seqs = calloc((size_t)P, sizeof(*seqs));
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(P > o->max_prompt ? P : o->max_prompt));
    int32_t *out_rows = malloc(sizeof(int32_t) * P);
    int32_t *lane_of = malloc(sizeof(int32_t) * P);
    float *logits = any_sampled ? malloc(sizeof(float) * (size_t)P * vocab) : NULL;
    int32_t *argmax = malloc(sizeof(int32_t) * P);
    int *sampled = malloc(sizeof(int) * P);
    float *hidden = malloc(sizeof(float) * (size_t)P * dim);
    void *scratch = malloc(specd_sampling_scratch_size(vocab));
    int rc = 0;
    long next_prompt = 0, finished = 0;
    if (!lanes || !seqs || !toks || !out_rows || !lane_of || (any_sampled && !logits) ||
        !argmax || !sampled || !hidden || !scratch) {
        rc = specd_seterr(err, "out of memory");
        goto done;
    }
    for (int l = 0; l < P; l++) lanes[l].row = -1;

    while (finished < n_prompts) {
        /* Fill idle lanes: prefill the prompt, which also yields the state
         * and logits of its last token, the first row of the sequence. */
        for (int l = 0; l < P && next_prompt < n_prompts; l++) {
            if (lanes[l].row >= 0) continue;
            int32_t *ids = NULL;
            size_t n_ids = 0;
            if (prompt_ids(tok, &prompts->docs[first + next_prompt], o->max_prompt, &ids, &n_ids,
                           err) != 0) {
                rc = -1;
                goto done;
            }
            if (n_ids == 0) { /* nothing to continue: an empty row */
                free(ids);
                next_prompt++;
                finished++;
                continue;
            }
            int32_t last = (int32_t)(n_ids - 1);
            specd_seq_input s = {.slot = l, .n_past = 0, .n_new = (int)n_ids};
            specd_batch fb = {.n_tokens = (int)n_ids, .tokens = ids, .n_seqs = 1, .seqs = &s,
                              .n_out = 1, .out_rows = &last, .logits = logits, .hidden = hidden,
                              .argmax = argmax};
            int frc = specd_transformer_forward(t, &fb, err);
            int row = (int)next_prompt;
            out->tokens[(size_t)row * L] = ids[n_ids - 1];
            free(ids);
            if (frc != 0) {
                rc = -1;
                goto done;
            }
            store_hidden(out->hidden + (size_t)row * L * dim, hidden, dim);
            out->len[row] = 1;
            lanes[l] = (gen_lane){.row = row, .n_past = (int)n_ids};
            sampled[l] = spec_gen_is_sampled(o, first + row);
            /* The draw at this output position (stream), addressed by the
             * global prompt index. */
            lanes[l].next = sampled[l] ? specd_sample(&samp, logits, vocab,
                                                      (uint64_t)(first + row) * L, 0, scratch)
                                       : argmax[0];
            next_prompt++;
        }
        /* One decode step for every busy lane. */
        int n = 0;
        for (int l = 0; l < P; l++) {
            if (lanes[l].row < 0) continue;
            seqs[n] = (specd_seq_input){.slot = l, .n_past = lanes[l].n_past, .n_new = 1};
            toks[n] = lanes[l].next;
            out_rows[n] = n;
            lane_of[n] = l;
            n++;
        }
        if (n == 0) continue;
        specd_batch fb = {.n_tokens = n, .tokens = toks, .n_seqs = n, .seqs = seqs, .n_out = n,
                          .out_rows = out_rows, .logits = logits, .hidden = hidden,
                          .argmax = argmax};
        if (specd_transformer_forward(t, &fb, err) != 0) {
            rc = -1;
            goto done;
        }
        for (int i = 0; i < n; i++) {
            gen_lane *g = &lanes[lane_of[i]];
            int row = g->row, j = out->len[row];
            out->tokens[(size_t)row * L + j] = g->next;
            store_hidden(out->hidden + ((size_t)row * L + j) * dim, hidden + (size_t)i * dim, dim);
            out->len[row] = j + 1;
            g->n_past++;
            int ended = specd_tokenizer_is_end(tok, g->next) || j + 1 >= L ||
                        g->n_past >= specd_transformer_max_ctx(t);
            if (ended) {
                g->row = -1;
                finished++;
                if (progress) progress(ctx, finished, n_prompts);
            } else {
                g->next = sampled[lane_of[i]]
                              ? specd_sample(&samp, logits + (size_t)i * vocab, vocab,
                                             (uint64_t)(first + row) * L + j, 0, scratch)
                              : argmax[i];
            }
        }
    }
done:
    free(lanes);
    free(seqs);
    free(toks);
    free(out_rows);
    free(lane_of);
    free(logits);
    free(argmax);
    free(sampled);
    free(hidden);
    free(scratch);
    if (rc != 0) spec_seqs_free(out);
    return rc;
}

/* ---- shards ------------------------------------------------------------------- */

int spec_data_sharded(const char *dir, const char *name, const char *meta, long n_rows,
                      int shard_rows, spec_shard_build_fn build, void *ctx, spec_seqs *out,
                      int *n_built, FILE *log, specd_error *err) {
    memset(out, 0, sizeof(*out));
    if (n_built) *n_built = 0;
    if (n_rows < 1 || shard_rows < 1) return specd_seterr(err, "%s: no rows to build", name);
    if (n_rows > INT32_MAX) return specd_seterr(err, "%s: too many rows (%ld)", name, n_rows);
    long n_shards = (n_rows + shard_rows - 1) / shard_rows;
    for (long k = 0; k < n_shards; k++) {
        long first = k * shard_rows;
        int count = (int)(n_rows - first < shard_rows ? n_rows - first : shard_rows);
        char path[4096], tmp[4200], *shard_meta = NULL;
        snprintf(path, sizeof path, "%s/%s-%05ld.safetensors", dir, name, k);
        size_t mlen = strlen(meta) + 96;
        shard_meta = malloc(mlen);
        if (!shard_meta) {
            spec_seqs_free(out);
            return specd_seterr(err, "out of memory");
        }
        snprintf(shard_meta, mlen, "%s rows=%ld+%d", meta, first, count);
        spec_seqs part = {0};
        int have = 0;
        char *got = NULL;
        specd_error lerr = {0};
        FILE *probe = fopen(path, "rb");
        if (probe) {
            fclose(probe);
            if (spec_seqs_load(&part, &got, path, &lerr) == 0) {
                have = got && !strcmp(got, shard_meta) && part.n_seqs == count;
                if (!have) {
                    spec_seqs_free(&part);
                    if (log) fprintf(log, "data: %s was made with other settings; rebuilding\n", path);
                }
            } else if (log) {
                fprintf(log, "data: cannot use %s (%s); rebuilding\n", path, lerr.msg);
            }
            free(got);
        }
        if (!have) {
            if (build(ctx, first, count, &part, err) != 0) goto fail;
            if (part.n_seqs != count) {
                spec_seqs_free(&part);
                specd_seterr(err, "%s: shard %ld built %d rows, not %d", name, k, part.n_seqs, count);
                goto fail;
            }
            snprintf(tmp, sizeof tmp, "%s.tmp", path);
            if (spec_seqs_save(&part, shard_meta, tmp, err) != 0) {
                spec_seqs_free(&part);
                goto fail;
            }
            if (rename(tmp, path) != 0) {
                specd_seterr(err, "cannot rename %s to %s", tmp, path);
                spec_seqs_free(&part);
                goto fail;
            }
            if (n_built) (*n_built)++;
            if (log) fprintf(log, "data: wrote %s (shard %ld/%ld, %d rows)\n", path, k + 1, n_shards, count);
        }
        if (k == 0 && seqs_alloc(out, (int)n_rows, part.seq_len, part.dim, err) != 0) {
            spec_seqs_free(&part);
            goto fail;
        }
        if (part.seq_len != out->seq_len || part.dim != out->dim) {
            spec_seqs_free(&part);
            specd_seterr(err, "%s: shard %ld has rows of %d x %d, the first %d x %d", path, k,
                         part.seq_len, part.dim, out->seq_len, out->dim);
            goto fail;
        }
        size_t L = (size_t)out->seq_len, D = (size_t)out->dim;
        memcpy(out->tokens + first * L, part.tokens, sizeof(int32_t) * count * L);
        memcpy(out->len + first, part.len, sizeof(int32_t) * count);
        memcpy(out->hidden + first * L * D, part.hidden, sizeof(uint16_t) * count * L * D);
        spec_seqs_free(&part);
        free(shard_meta);
        continue;
    fail:
        free(shard_meta);
        spec_seqs_free(out);
        return -1;
    }
    if (log) fprintf(log, "data: %s: %ld rows in %ld shards under %s\n", name, n_rows, n_shards, dir);
    return 0;
}

/* ---- cache files ------------------------------------------------------------ */

int spec_seqs_save(const spec_seqs *s, const char *meta, const char *path, specd_error *err) {
    safetensors_out t[3] = {
        {.name = "tokens", .type = SPECD_I32, .n_dims = 2,
         .shape = {(uint64_t)s->n_seqs, (uint64_t)s->seq_len}, .data = s->tokens},
        {.name = "len", .type = SPECD_I32, .n_dims = 1, .shape = {(uint64_t)s->n_seqs},
         .data = s->len},
        /* Already fp16: written as is, not through a float copy (the hidden
         * states are most of the file). */
        {.name = "hidden", .type = SPECD_F16, .n_dims = 3,
         .shape = {(uint64_t)s->n_seqs, (uint64_t)s->seq_len, (uint64_t)s->dim},
         .data = s->hidden, .raw = 1},
    };
    const char *keys[1] = {"specd.data"}, *vals[1] = {meta};
    return safetensors_write(path, t, 3, keys, vals, 1, err);
}

int spec_seqs_load(spec_seqs *s, char **meta, const char *path, specd_error *err) {
    safetensors_file *f = safetensors_open(path, err);
    if (!f) return -1;
    const safetensors_tensor *tk = safetensors_find(f, "tokens");
    const safetensors_tensor *ln = safetensors_find(f, "len");
    const safetensors_tensor *hd = safetensors_find(f, "hidden");
    int rc = -1;
    if (!tk || !ln || !hd || tk->type != SPECD_I32 || ln->type != SPECD_I32 ||
        hd->type != SPECD_F16 || tk->n_dims != 2 || ln->n_dims != 1 || hd->n_dims != 3) {
        specd_seterr(err, "%s: not a specd training-data cache (tokens I32 [n][L], len I32 [n], "
                          "hidden F16 [n][L][dim])", path);
        goto out;
    }
    uint64_t n = tk->shape[0], L = tk->shape[1], dim = hd->shape[2];
    if (ln->shape[0] != n || hd->shape[0] != n || hd->shape[1] != L || n == 0 || n > INT32_MAX ||
        L == 0 || L > 65536 || dim == 0 || dim > SPECD_MLP_SPEC_MAX_DIM) {
        specd_seterr(err, "%s: inconsistent shapes", path);
        goto out;
    }
    if (seqs_alloc(s, (int)n, (int)L, (int)dim, err) != 0) goto out;
    memcpy(s->tokens, tk->data, sizeof(int32_t) * n * L);
    memcpy(s->len, ln->data, sizeof(int32_t) * n);
    memcpy(s->hidden, hd->data, sizeof(uint16_t) * n * L * dim);
    for (uint64_t i = 0; i < n; i++)
        if (s->len[i] < 0 || (uint64_t)s->len[i] > L) {
            spec_seqs_free(s);
            specd_seterr(err, "%s: len[%llu] = %d outside 0..%llu", path, (unsigned long long)i,
                         s->len[i], (unsigned long long)L);
            goto out;
        }
    const char *m = safetensors_metadata(f, "specd.data");
    *meta = strdup(m ? m : "");
    rc = *meta ? 0 : specd_seterr(err, "out of memory");
out:
    safetensors_close(f);
    return rc;
}
