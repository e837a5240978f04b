/* transformer.c - the Llama forward pass, read top to bottom.
 *
 *   x = embed(tokens)
 *   for each layer:
 *       h = rmsnorm(x) ; q,k,v = h.Wq, h.Wk, h.Wv ; rope(q, k)
 *       x += attention(q, K-cache, V-cache, mask) . Wo
 *       h = rmsnorm(x) ; x += (silu(h.Wgate) * h.Wup) . Wdown
 *   out = rmsnorm(x[requested rows]) ; logits = out . Wlm
 *
 * All arithmetic goes through the backend interface (kernels/backend.h), so
 * the same code drives the CPU and GPU backends. The batch is ragged: many
 * sequences, each with its own cached prefix and its own new tokens, and an
 * explicit mask among the new tokens so a tree of candidates can be checked
 * in one pass. Only the rows the caller asks for pay for the final norm and
 * the LM head (with a 49k vocabulary that head is the largest matmul). */
#include "common/model/transformer.h"

#include "common/model/kv_pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer_weights {
    specd_bweight attn_norm, wq, wk, wv, wo;
    specd_bweight ffn_norm, w_gate, w_up, w_down;
} layer_weights;

struct specd_transformer {
    specd_backend *be;
    specd_llama_hparams hp;
    int n_slots, max_ctx, max_batch;
    int q_dim, kv_dim; /* n_heads*head_dim, n_kv_heads*head_dim */

    specd_bweight tok_embd, output_norm, lm_head;
    layer_weights *layers;
    float *inv_freq; /* host, [head_dim/2], rope scaling applied */
    specd_rope_cfg rope;

    /* Paged KV cache: one device allocation holds every layer's K and V
     * pools (kernels/backend.h, specd_kv_layout). Slot s holds the pages
     * slot_pages[s][0..slot_n_pages[s]) in logical order, references into
     * one pool shared by every slot (kv_pool.h: free pages come low ids
     * first, so a lightly used cache touches little memory; on the CPU the
     * untouched rest is never even mapped). Any slot may grow to max_ctx. */
    specd_kv_layout kv;
    int n_pages, pages_per_slot;
    int32_t *slot_pages; /* [n_slots][pages_per_slot] */
    int *slot_n_pages;   /* [n_slots] */
    specd_kv_pool *pool;
    int prefix_cache;    /* share full prompt pages between slots */

    /* activations (device buffers) for up to max_batch tokens */
    float *x, *xb, *xb2, *q, *k, *v, *att, *hb, *hb2;
    float *out_hidden;   /* [max_batch][dim] rows the caller asked for */
    float *out_logits;   /* [logit_rows][vocab] */
    int32_t *out_argmax; /* [max_batch] */
    int logit_rows;

    /* host scratch for building a step */
    float *cos_sin;      /* [max_batch][head_dim/2][2] */
    int32_t *pos;
    specd_step_seq *step_seqs;
    int32_t *move_src, *move_dst; /* kv_compact's physical rows */
};

/* --- rope frequencies ------------------------------------------------------ */

/* inv_freq[i] = theta^(-2i/d), then the checkpoint's context-extension rule.
 * Llama-3.1 ("llama3") scaling leaves high frequencies alone, divides low
 * ones by `factor`, and blends in between (as Hugging Face computes it). A
 * GGUF file may instead carry the per-frequency divisors as a tensor
 * (rope_freqs.weight), which then takes precedence. */
static void compute_inv_freq(float *inv_freq, const specd_llama_hparams *hp,
                             const specd_tensor *rope_freqs) {
    int half = hp->head_dim / 2;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow((double)hp->rope_theta, (2.0 * i) / hp->head_dim);
        if (rope_freqs) {
            f /= ((const float *)rope_freqs->data)[i];
        } else if (hp->rope_scaling == SPECD_ROPE_SCALING_LINEAR) {
            f /= hp->rope_factor;
        } else if (hp->rope_scaling == SPECD_ROPE_SCALING_LLAMA3) {
            double old_ctx = hp->rope_original_max_pos;
            double low_wavelen = old_ctx / hp->rope_low_freq_factor;
            double high_wavelen = old_ctx / hp->rope_high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f /= hp->rope_factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (old_ctx / wavelen - hp->rope_low_freq_factor) /
                                (hp->rope_high_freq_factor - hp->rope_low_freq_factor);
                f = (1.0 - smooth) * f / hp->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

/* --- construction ------------------------------------------------------------ */

static int prep(specd_transformer *t, specd_bweight *w, const specd_model_file *m,
                const char *name, specd_error *err) {
    const specd_tensor *ten = specd_model_tensor(m, name);
    if (!ten) return specd_seterr(err, "transformer: model has no tensor '%s'", name);
    return t->be->ops->prepare_weight(t->be, w, ten, err);
}

static int prep_layer(specd_transformer *t, layer_weights *L, const specd_model_file *m, int l,
                      specd_error *err) {
    static const char *names[] = {"attn_norm", "attn_q", "attn_k",  "attn_v", "attn_output",
                                  "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down"};
    specd_bweight *slots[] = {&L->attn_norm, &L->wq,     &L->wk,   &L->wv,    &L->wo,
                              &L->ffn_norm,  &L->w_gate, &L->w_up, &L->w_down};
    for (int i = 0; i < 9; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[i]);
        if (prep(t, slots[i], m, name, err)) return -1;
    }
    return 0;
}

static void *dev_alloc(specd_transformer *t, size_t bytes, int *failed) {
    void *p = t->be->ops->alloc(t->be, bytes);
    if (!p) *failed = 1;
    return p;
}

static int alloc_kv(specd_transformer *t, int kv_pages, specd_error *err) {
    t->pages_per_slot = (t->max_ctx + SPECD_KV_PAGE_ROWS - 1) / SPECD_KV_PAGE_ROWS;
    int64_t full = (int64_t)t->n_slots * t->pages_per_slot;
    t->n_pages = kv_pages > 0 && kv_pages < full ? kv_pages : (int)full;
    t->slot_pages = malloc(sizeof(int32_t) * (size_t)full);
    t->slot_n_pages = calloc((size_t)t->n_slots, sizeof(int));
    if (!t->slot_pages || !t->slot_n_pages)
        return specd_seterr(err, "transformer: out of memory for the KV page tables");
    if (!(t->pool = specd_kv_pool_create(t->n_pages, err))) return -1;

    t->kv = (specd_kv_layout){NULL, t->hp.n_layers, t->kv_dim,
                              (int64_t)t->n_pages * SPECD_KV_PAGE_ROWS};
    size_t bytes = 2 * (size_t)t->hp.n_layers * (size_t)t->kv.n_rows *
                   specd_kv_row_bytes(t->be->kv_type, t->kv_dim);
    t->kv.base = t->be->ops->alloc(t->be, bytes);
    if (!t->kv.base)
        return specd_seterr(err, "transformer: out of memory for the KV cache (%zu bytes: %d pages "
                                 "of %d rows, %d layers)",
                            bytes, t->n_pages, SPECD_KV_PAGE_ROWS, t->hp.n_layers);
    return 0;
}

static int alloc_buffers(specd_transformer *t, specd_error *err) {
    const specd_llama_hparams *hp = &t->hp;
    size_t B = (size_t)t->max_batch;
    int failed = 0;
    t->x = dev_alloc(t, B * hp->dim * sizeof(float), &failed);
    t->xb = dev_alloc(t, B * hp->dim * sizeof(float), &failed);
    t->xb2 = dev_alloc(t, B * hp->dim * sizeof(float), &failed);
    t->q = dev_alloc(t, B * t->q_dim * sizeof(float), &failed);
    t->att = dev_alloc(t, B * t->q_dim * sizeof(float), &failed);
    t->k = dev_alloc(t, B * t->kv_dim * sizeof(float), &failed);
    t->v = dev_alloc(t, B * t->kv_dim * sizeof(float), &failed);
    t->hb = dev_alloc(t, B * hp->hidden_dim * sizeof(float), &failed);
    t->hb2 = dev_alloc(t, B * hp->hidden_dim * sizeof(float), &failed);
    t->out_hidden = dev_alloc(t, B * hp->dim * sizeof(float), &failed);
    t->out_argmax = dev_alloc(t, B * sizeof(int32_t), &failed);
    /* logits for every batch row would be max_batch x vocab floats (100 MB at
     * 512 x 49k); callers ask for a few rows per sequence, so start small
     * and grow on demand. */
    t->logit_rows = 0;
    t->cos_sin = malloc(B * hp->head_dim * sizeof(float));
    t->pos = malloc(B * sizeof(int32_t));
    t->step_seqs = malloc(B * sizeof(specd_step_seq));
    /* kv_compact moves up to max_batch rows; a copy on write one page */
    size_t moves = B > SPECD_KV_PAGE_ROWS ? B : SPECD_KV_PAGE_ROWS;
    t->move_src = malloc(moves * sizeof(int32_t));
    t->move_dst = malloc(moves * sizeof(int32_t));
    if (failed || !t->pos || !t->step_seqs || !t->cos_sin || !t->move_src || !t->move_dst)
        return specd_seterr(err, "transformer: out of memory allocating activations for %d batch "
                                 "tokens",
                            t->max_batch);
    return 0;
}

/* Models stored in fp32 (the small reference models of the golden tests)
 * keep fp32 all the way on the GPU too, so their logits stay comparable
 * with the reference at 1e-4; everything else runs fp16/bf16 there. */
static int model_is_f32(const specd_model_file *m) {
    const specd_tensor *q = specd_model_tensor(m, "blk.0.attn_q.weight");
    return q && q->type == SPECD_F32;
}

specd_transformer *specd_transformer_create(const specd_model_file *m,
                                            const specd_transformer_opts *opts,
                                            specd_error *err) {
    specd_transformer *t = calloc(1, sizeof *t);
    if (!t) {
        specd_seterr(err, "transformer: out of memory");
        return NULL;
    }
    t->hp = m->hp;
    t->n_slots = opts && opts->n_slots > 0 ? opts->n_slots : 1;
    t->max_ctx = opts && opts->max_ctx > 0 ? opts->max_ctx : m->hp.max_seq_len;
    t->max_batch = opts && opts->max_batch > 0 ? opts->max_batch : 512;
    t->q_dim = m->hp.n_heads * m->hp.head_dim;
    t->kv_dim = m->hp.n_kv_heads * m->hp.head_dim;

    specd_backend_opts bo = {0};
    if (opts) bo = opts->backend;
    /* a model stored in F32 (the golden tests' reference models) runs in
     * fp32 throughout unless a KV type was asked for */
    if (model_is_f32(m) && bo.kv_dtype == SPECD_KV_AUTO) bo.kv_dtype = SPECD_KV_F32;
    t->be = specd_backend_create(&bo, err);
    if (!t->be) {
        free(t);
        return NULL;
    }
    if (t->be->kv_type == SPECD_Q8_0 && m->hp.head_dim % 32) {
        /* a Q8_0 block is 32 values of one head's row */
        specd_seterr(err, "transformer: kv_cache_dtype 'q8_0' needs heads a multiple of 32 wide; "
                          "this model's are %d (use 'f16')",
                     m->hp.head_dim);
        goto fail;
    }
    t->layers = calloc((size_t)m->hp.n_layers, sizeof(layer_weights));
    t->inv_freq = calloc((size_t)m->hp.head_dim / 2, sizeof(float));
    if (!t->layers || !t->inv_freq) {
        specd_seterr(err, "transformer: out of memory");
        goto fail;
    }
    if (prep(t, &t->tok_embd, m, "token_embd.weight", err) ||
        prep(t, &t->output_norm, m, "output_norm.weight", err))
        goto fail;
    /* tied: the LM head is the embedding table, prepared once (a GPU would
     * otherwise hold two copies); released once, as tok_embd */
    if (m->hp.tied_embeddings) t->lm_head = t->tok_embd;
    else if (prep(t, &t->lm_head, m, "output.weight", err)) goto fail;
    for (int l = 0; l < m->hp.n_layers; l++)
        if (prep_layer(t, &t->layers[l], m, l, err)) goto fail;

    const specd_tensor *rope_freqs = specd_model_tensor(m, "rope_freqs.weight");
    if (rope_freqs && (rope_freqs->type != SPECD_F32 ||
                       rope_freqs->ne[0] != (uint64_t)m->hp.head_dim / 2)) {
        specd_seterr(err, "transformer: tensor 'rope_freqs.weight' must be F32 [%d]",
                     m->hp.head_dim / 2);
        goto fail;
    }
    compute_inv_freq(t->inv_freq, &m->hp, rope_freqs);
    t->rope = (specd_rope_cfg){m->hp.head_dim, m->hp.head_dim, m->hp.rope_interleaved};
    int kv_pages = opts ? opts->kv_pages : 0;
    if (opts && opts->kv_memory && !kv_pages) {
        /* One pool for every session: kv_memory buys pages, and any session
         * may grow to the whole context, so the pool must hold at least one
         * whole context. */
        uint64_t page_bytes = 2ull * (uint64_t)m->hp.n_layers *
                              specd_kv_row_bytes(t->be->kv_type, t->kv_dim) * SPECD_KV_PAGE_ROWS;
        uint64_t pages = opts->kv_memory / page_bytes;
        uint64_t need = (uint64_t)(t->max_ctx + SPECD_KV_PAGE_ROWS - 1) / SPECD_KV_PAGE_ROWS;
        if (pages < need) {
            specd_seterr(err, "limits.kv_memory = %llu bytes holds %llu KV pages of %d rows "
                              "(%llu bytes a page); one session at the full context of %d "
                              "tokens needs %llu: raise limits.kv_memory or lower "
                              "limits.max_context",
                         (unsigned long long)opts->kv_memory, (unsigned long long)pages,
                         SPECD_KV_PAGE_ROWS, (unsigned long long)page_bytes, t->max_ctx,
                         (unsigned long long)need);
            goto fail;
        }
        kv_pages = pages > (uint64_t)INT32_MAX / SPECD_KV_PAGE_ROWS
                       ? INT32_MAX / SPECD_KV_PAGE_ROWS
                       : (int)pages;
    }
    t->prefix_cache = opts ? opts->prefix_cache : 0;
    if (alloc_buffers(t, err) || alloc_kv(t, kv_pages, err)) goto fail;
    return t;
fail:
    specd_transformer_free(t);
    return NULL;
}

void specd_transformer_free(specd_transformer *t) {
    if (!t) return;
    specd_backend *be = t->be;
    if (be) {
        void *bufs[] = {t->x,   t->xb,  t->xb2, t->q,          t->k,           t->v,
                        t->att, t->hb,  t->hb2, t->out_hidden, t->out_logits, t->out_argmax,
                        t->kv.base};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) be->ops->free(be, bufs[i]);
        if (t->layers) {
            for (int l = 0; l < t->hp.n_layers; l++) {
                specd_bweight *w = &t->layers[l].attn_norm;
                for (int i = 0; i < 9; i++)
                    if (w[i].src) be->ops->release_weight(be, &w[i]);
            }
        }
        specd_bweight *top[] = {&t->tok_embd, &t->output_norm,
                                t->hp.tied_embeddings ? NULL : &t->lm_head};
        for (int i = 0; i < 3; i++)
            if (top[i] && top[i]->src) be->ops->release_weight(be, top[i]);
        be->ops->destroy(be);
    }
    free(t->slot_pages);
    free(t->slot_n_pages);
    specd_kv_pool_free(t->pool);
    free(t->layers);
    free(t->inv_freq);
    free(t->pos);
    free(t->cos_sin);
    free(t->step_seqs);
    free(t->move_src);
    free(t->move_dst);
    free(t);
}

const specd_llama_hparams *specd_transformer_hparams(const specd_transformer *t) { return &t->hp; }
int specd_transformer_max_ctx(const specd_transformer *t) { return t->max_ctx; }
const char *specd_transformer_backend_name(const specd_transformer *t) {
    return t->be->ops->name;
}
specd_backend *specd_transformer_backend(const specd_transformer *t) { return t->be; }
specd_dtype specd_transformer_kv_dtype(const specd_transformer *t) { return t->be->kv_type; }
size_t specd_transformer_kv_bytes_per_token(const specd_transformer *t) {
    return 2 * (size_t)t->hp.n_layers * specd_kv_row_bytes(t->be->kv_type, t->kv_dim);
}

double specd_transformer_decode_weight_bytes(const specd_transformer *t) {
    double total = (double)t->output_norm.bytes + (double)t->lm_head.bytes;
    for (int l = 0; l < t->hp.n_layers; l++) {
        const specd_bweight *w = &t->layers[l].attn_norm;
        for (int i = 0; i < 9; i++) total += (double)w[i].bytes;
    }
    return total;
}

/* --- KV pages ------------------------------------------------------------- */

static int pages_for(int rows) { return (rows + SPECD_KV_PAGE_ROWS - 1) / SPECD_KV_PAGE_ROWS; }

/* Gives the slot exactly `want` pages: takes fresh ones from the pool or
 * drops its last ones (rows past the slot's live rows hold nothing anyone
 * reads; a dropped page that others share, or that is a cached prefix,
 * lives on in the pool). Callers check beforehand that enough pages are
 * available. */
static void slot_resize(specd_transformer *t, int slot, int want) {
    int32_t *pages = t->slot_pages + (size_t)slot * t->pages_per_slot;
    int *held = &t->slot_n_pages[slot];
    while (*held > want) specd_kv_pool_release(t->pool, pages[--*held]);
    while (*held < want) pages[(*held)++] = specd_kv_pool_alloc(t->pool);
}

void specd_transformer_release_slot(specd_transformer *t, int slot) {
    if (slot >= 0 && slot < t->n_slots) slot_resize(t, slot, 0);
}

void specd_transformer_kv_pages(const specd_transformer *t, int *n_free, int *n_total) {
    if (n_free) *n_free = specd_kv_pool_available(t->pool);
    if (n_total) *n_total = t->n_pages;
}

void specd_transformer_kv_stats(const specd_transformer *t, specd_kv_pool_stats *st) {
    specd_kv_pool_get_stats(t->pool, st);
}

int specd_transformer_slot_pages(const specd_transformer *t, int slot) {
    return slot >= 0 && slot < t->n_slots ? t->slot_n_pages[slot] : 0;
}

/* Pages a slot must take from the pool to write rows [n_past, n_past +
 * n_new): new pages past what it holds, plus a private copy of each held
 * page in that range that other slots share (copy on write). */
static int pages_to_take(const specd_transformer *t, int slot, int n_past, int n_new) {
    int want = pages_for(n_past + n_new), held = t->slot_n_pages[slot];
    const int32_t *pages = t->slot_pages + (size_t)slot * t->pages_per_slot;
    int take = want > held ? want - held : 0;
    int top = want < held ? want : held;
    for (int i = n_past / SPECD_KV_PAGE_ROWS; i < top; i++)
        if (specd_kv_pool_refs(t->pool, pages[i]) > 1) take++;
    return take;
}

int specd_transformer_pages_needed(const specd_transformer *t, int slot, int n_past, int n_new) {
    if (slot < 0 || slot >= t->n_slots || n_past < 0 || n_new < 0) return 0;
    return pages_to_take(t, slot, n_past, n_new);
}

/* Makes every page holding rows [from, to) of the slot its own to write:
 * a page shared with other slots is copied to a fresh page (all layers, one
 * kv_move), a cached prefix page it holds alone loses its key (its rows are
 * about to change). check_pages made sure the copies' pages are there. */
static void own_pages(specd_transformer *t, int slot, int from, int to) {
    int32_t *pages = t->slot_pages + (size_t)slot * t->pages_per_slot;
    int top = pages_for(to) < t->slot_n_pages[slot] ? pages_for(to) : t->slot_n_pages[slot];
    for (int i = from / SPECD_KV_PAGE_ROWS; i < top; i++) {
        int32_t pg = pages[i];
        if (specd_kv_pool_refs(t->pool, pg) > 1) {
            int32_t copy = specd_kv_pool_alloc(t->pool);
            for (int r = 0; r < SPECD_KV_PAGE_ROWS; r++) {
                t->move_src[r] = pg * SPECD_KV_PAGE_ROWS + r;
                t->move_dst[r] = copy * SPECD_KV_PAGE_ROWS + r;
            }
            t->be->ops->kv_move(t->be, &t->kv, t->move_src, t->move_dst, SPECD_KV_PAGE_ROWS);
            specd_kv_pool_release(t->pool, pg);
            pages[i] = copy;
        } else {
            specd_kv_pool_unpublish(t->pool, pg);
        }
    }
}

/* --- prefix caching ------------------------------------------------------- */

int specd_transformer_prefix_attach(specd_transformer *t, int slot, const int32_t *tokens,
                                    int n) {
    if (!t->prefix_cache || slot < 0 || slot >= t->n_slots || t->slot_n_pages[slot] || n < 2)
        return 0;
    /* The last token is always computed: its row gives the first output. */
    int max_pages = (n - 1) / SPECD_KV_PAGE_ROWS;
    if (max_pages > t->pages_per_slot) max_pages = t->pages_per_slot;
    int32_t *pages = t->slot_pages + (size_t)slot * t->pages_per_slot;
    uint64_t parent = 0;
    for (int i = 0; i < max_pages; i++) {
        const int32_t *tok = tokens + (size_t)i * SPECD_KV_PAGE_ROWS;
        uint64_t key = specd_kv_page_key(parent, tok);
        int32_t pg = specd_kv_pool_lookup(t->pool, key, parent, tok);
        if (pg < 0) break;
        pages[t->slot_n_pages[slot]++] = pg;
        parent = key;
    }
    return t->slot_n_pages[slot] * SPECD_KV_PAGE_ROWS;
}

void specd_transformer_prefix_publish(specd_transformer *t, int slot, const int32_t *tokens,
                                      int n_rows) {
    if (!t->prefix_cache || slot < 0 || slot >= t->n_slots) return;
    int full = n_rows / SPECD_KV_PAGE_ROWS;
    if (full > t->slot_n_pages[slot]) full = t->slot_n_pages[slot];
    const int32_t *pages = t->slot_pages + (size_t)slot * t->pages_per_slot;
    uint64_t parent = 0;
    for (int i = 0; i < full; i++) {
        const int32_t *tok = tokens + (size_t)i * SPECD_KV_PAGE_ROWS;
        uint64_t key = specd_kv_page_key(parent, tok);
        specd_kv_pool_publish(t->pool, pages[i], key, parent, tok);
        parent = key;
    }
}

int specd_transformer_check_pages(const specd_transformer *t, specd_error *err) {
    int *refs = calloc((size_t)t->n_pages, sizeof(int));
    if (!refs) return specd_seterr(err, "check: out of memory");
    int rc = 0;
    for (int s = 0; s < t->n_slots && !rc; s++) {
        const int32_t *pages = t->slot_pages + (size_t)s * t->pages_per_slot;
        if (t->slot_n_pages[s] < 0 || t->slot_n_pages[s] > t->pages_per_slot)
            rc = specd_seterr(err, "slot %d holds %d pages, at most %d", s, t->slot_n_pages[s],
                              t->pages_per_slot);
        for (int i = 0; i < t->slot_n_pages[s] && !rc; i++) {
            if (pages[i] < 0 || pages[i] >= t->n_pages)
                rc = specd_seterr(err, "slot %d page %d is %d", s, i, pages[i]);
            else
                refs[pages[i]]++;
        }
    }
    if (!rc) rc = specd_kv_pool_check(t->pool, refs, err);
    free(refs);
    return rc;
}

/* The physical cache row of a slot's logical row. */
static int32_t phys_row(const specd_transformer *t, int slot, int row) {
    const int32_t *pages = t->slot_pages + (size_t)slot * t->pages_per_slot;
    return pages[row / SPECD_KV_PAGE_ROWS] * SPECD_KV_PAGE_ROWS + row % SPECD_KV_PAGE_ROWS;
}

/* --- the forward pass ----------------------------------------------------- */

/* Everything about a batch that could be wrong is checked before any cache
 * row is written, so a rejected batch leaves every sequence as it was. */
static int validate_batch(const specd_transformer *t, const specd_batch *b, specd_error *err) {
    if (b->n_tokens <= 0 || b->n_tokens > t->max_batch)
        return specd_seterr(err, "batch: n_tokens %d outside 1..%d", b->n_tokens, t->max_batch);
    if (b->n_seqs <= 0) return specd_seterr(err, "batch: n_seqs must be positive");
    int covered = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const specd_seq_input *in = &b->seqs[s];
        if (in->slot < 0 || in->slot >= t->n_slots)
            return specd_seterr(err, "batch: seqs[%d].slot %d outside 0..%d", s, in->slot,
                                t->n_slots - 1);
        for (int r = 0; r < s; r++)
            if (b->seqs[r].slot == in->slot)
                return specd_seterr(err, "batch: slot %d appears twice", in->slot);
        if (in->n_new <= 0) return specd_seterr(err, "batch: seqs[%d].n_new must be positive", s);
        if (in->n_past < 0 || in->n_past + in->n_new > t->max_ctx)
            return specd_seterr(err, "batch: seqs[%d] needs %d cache rows, context holds %d", s,
                                in->n_past + in->n_new, t->max_ctx);
        if (in->mask) {
            for (int i = 0; i < in->n_new; i++) {
                if (!in->mask[(size_t)i * in->n_new + i])
                    return specd_seterr(err, "batch: seqs[%d].mask: token %d must see itself", s, i);
                for (int j = i + 1; j < in->n_new; j++)
                    if (in->mask[(size_t)i * in->n_new + j])
                        return specd_seterr(err,
                                            "batch: seqs[%d].mask: token %d sees later token %d",
                                            s, i, j);
            }
        }
        covered += in->n_new;
    }
    if (covered != b->n_tokens)
        return specd_seterr(err, "batch: sequences hold %d tokens, n_tokens is %d", covered,
                            b->n_tokens);
    for (int i = 0; i < b->n_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= t->hp.vocab_size)
            return specd_seterr(err, "batch: tokens[%d] = %d outside vocabulary 0..%d", i,
                                b->tokens[i], t->hp.vocab_size - 1);
    if (b->n_out < 0 || b->n_out > b->n_tokens)
        return specd_seterr(err, "batch: n_out %d outside 0..%d", b->n_out, b->n_tokens);
    for (int i = 0; i < b->n_out; i++)
        if (b->out_rows[i] < 0 || b->out_rows[i] >= b->n_tokens)
            return specd_seterr(err, "batch: out_rows[%d] = %d outside 0..%d", i, b->out_rows[i],
                                b->n_tokens - 1);
    return 0;
}

static int ensure_logit_rows(specd_transformer *t, int rows, specd_error *err) {
    if (rows <= t->logit_rows) return 0;
    /* recorded GPU graphs write to the old buffer */
    if (t->be->ops->graph_reset) t->be->ops->graph_reset(t->be);
    if (t->out_logits) t->be->ops->free(t->be, t->out_logits);
    t->out_logits = t->be->ops->alloc(t->be, (size_t)rows * t->hp.vocab_size * sizeof(float));
    t->logit_rows = t->out_logits ? rows : 0;
    if (!t->out_logits) return specd_seterr(err, "transformer: out of memory for %d logit rows", rows);
    return 0;
}

/* Pages the batch needs beyond what its slots hold (copies on write
 * included); -1 when they are not available. Pages a slot drops count as
 * available only when it held them alone (a shared page stays held).
 * Nothing changes here, so a refused batch leaves the cache as it was. */
static int check_pages(const specd_transformer *t, const specd_batch *b, specd_error *err) {
    int extra = 0, returned = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const specd_seq_input *in = &b->seqs[s];
        extra += pages_to_take(t, in->slot, in->n_past, in->n_new);
        const int32_t *pages = t->slot_pages + (size_t)in->slot * t->pages_per_slot;
        for (int i = pages_for(in->n_past + in->n_new); i < t->slot_n_pages[in->slot]; i++)
            if (specd_kv_pool_refs(t->pool, pages[i]) == 1) returned++;
    }
    int avail = specd_kv_pool_available(t->pool) + returned;
    if (extra > avail)
        return specd_seterr(err, "KV cache full: the batch needs %d more pages of %d rows, %d are "
                                 "free (limits.kv_memory)",
                            extra, SPECD_KV_PAGE_ROWS, avail);
    return 0;
}

/* What the backend needs to know of the batch, built on the host: RoPE
 * angles, each sequence's rows, mask and page table. */
static void build_step(specd_transformer *t, const specd_batch *b, specd_step *st) {
    const specd_llama_hparams *hp = &t->hp;
    int start = 0;
    /* shrink first so pages returned by one sequence can serve another */
    for (int s = 0; s < b->n_seqs; s++) {
        int want = pages_for(b->seqs[s].n_past + b->seqs[s].n_new);
        if (want < t->slot_n_pages[b->seqs[s].slot]) slot_resize(t, b->seqs[s].slot, want);
    }
    for (int s = 0; s < b->n_seqs; s++) {
        const specd_seq_input *in = &b->seqs[s];
        own_pages(t, in->slot, in->n_past, in->n_past + in->n_new);
        slot_resize(t, in->slot, pages_for(in->n_past + in->n_new));
        for (int i = 0; i < in->n_new; i++)
            t->pos[start + i] = in->pos ? in->pos[i] : in->n_past + i;
        t->step_seqs[s] = (specd_step_seq){in->n_past, start, in->n_new, in->mask,
                                           t->slot_pages + (size_t)in->slot * t->pages_per_slot};
        start += in->n_new;
    }
    /* RoPE rotation for every token, shared by all layers. The angle is
     * computed in double: position x frequency loses too many bits in fp32 at
     * long contexts for the 1e-4 logit tolerance. */
    int half = hp->head_dim / 2;
    for (int i = 0; i < b->n_tokens; i++) {
        for (int f = 0; f < half; f++) {
            double angle = (double)t->pos[i] * t->inv_freq[f];
            t->cos_sin[((size_t)i * half + f) * 2] = (float)cos(angle);
            t->cos_sin[((size_t)i * half + f) * 2 + 1] = (float)sin(angle);
        }
    }
    *st = (specd_step){.n_tokens = b->n_tokens, .tokens = b->tokens, .cos_sin = t->cos_sin,
                       .rot_dim = t->rope.rot_dim, .n_seqs = b->n_seqs, .seqs = t->step_seqs,
                       .n_out = b->n_out, .out_rows = b->out_rows};
}

/* The layers, the final norm and the LM head: the part of a step that the
 * GPU backend records once per shape and replays. */
static void run_layers(specd_transformer *t, const specd_batch *b, int head) {
    specd_backend *be = t->be;
    const specd_backend_ops *op = be->ops;
    const specd_llama_hparams *hp = &t->hp;
    int n = b->n_tokens, dim = hp->dim;

    op->embed(be, t->x, &t->tok_embd);
    for (int l = 0; l < hp->n_layers; l++) {
        const layer_weights *L = &t->layers[l];
        /* attention block */
        op->rmsnorm(be, t->xb, t->x, &L->attn_norm, n, dim, hp->norm_eps);
        op->matmuls(be, 3, (float *const[]){t->q, t->k, t->v},
                    (const specd_bweight *const[]){&L->wq, &L->wk, &L->wv}, t->xb, n);
        op->rope(be, t->q, t->k, hp->n_heads, hp->n_kv_heads, &t->rope);
        op->attention(be, t->att, t->q, t->k, t->v, &t->kv, l, hp->n_heads, hp->n_kv_heads,
                      hp->head_dim);
        op->matmul(be, t->xb2, &L->wo, t->att, n);
        op->axpy(be, t->x, 1.0f, t->xb2, (size_t)n * dim);
        /* feed-forward block */
        op->rmsnorm(be, t->xb, t->x, &L->ffn_norm, n, dim, hp->norm_eps);
        op->matmuls(be, 2, (float *const[]){t->hb, t->hb2},
                    (const specd_bweight *const[]){&L->w_gate, &L->w_up}, t->xb, n);
        op->swiglu(be, t->hb, t->hb, t->hb2, (size_t)n * hp->hidden_dim);
        op->matmul(be, t->xb, &L->w_down, t->hb, n);
        op->axpy(be, t->x, 1.0f, t->xb, (size_t)n * dim);
    }
    if (b->n_out == 0) return;
    op->gather_out(be, t->xb, t->x, dim);
    op->rmsnorm(be, t->out_hidden, t->xb, &t->output_norm, b->n_out, dim, hp->norm_eps);
    if (!head) return;
    op->matmul(be, t->out_logits, &t->lm_head, t->out_hidden, b->n_out);
    if (b->argmax) op->argmax(be, t->out_argmax, t->out_logits, b->n_out, hp->vocab_size);
}

int specd_transformer_forward(specd_transformer *t, const specd_batch *b, specd_error *err) {
    if (validate_batch(t, b, err) || check_pages(t, b, err)) return -1;
    int head = b->logits || b->argmax;
    if (head && ensure_logit_rows(t, b->n_out, err)) return -1;

    specd_backend *be = t->be;
    const specd_backend_ops *op = be->ops;
    const specd_llama_hparams *hp = &t->hp;
    specd_step st;
    build_step(t, b, &st);
    if (op->begin_step(be, &st, err)) return -1;

    /* a recorded graph fits every step with the same token/sequence/output
     * counts and the same outputs asked for */
    uint32_t key = (uint32_t)(b->logits != NULL) | (uint32_t)(b->argmax != NULL) << 1;
    int replayed = op->graph_begin ? op->graph_begin(be, key) : 0;
    if (!replayed) run_layers(t, b, head);
    if (op->graph_end) op->graph_end(be);

    size_t n_out = (size_t)b->n_out;
    if (n_out && b->hidden)
        op->to_host(be, b->hidden, t->out_hidden, n_out * hp->dim * sizeof(float));
    if (n_out && b->argmax) op->to_host(be, b->argmax, t->out_argmax, n_out * sizeof(int32_t));
    if (n_out && b->logits)
        op->to_host(be, b->logits, t->out_logits, n_out * hp->vocab_size * sizeof(float));
    return op->finish(be, err);
}

int specd_transformer_kv_compact(specd_transformer *t, int slot, int n_past,
                                 const int32_t *rows, int n_keep, specd_error *err) {
    if (slot < 0 || slot >= t->n_slots)
        return specd_seterr(err, "kv_compact: slot %d outside 0..%d", slot, t->n_slots - 1);
    if (n_keep < 0 || n_keep > t->max_batch)
        return specd_seterr(err, "kv_compact: n_keep %d outside 0..%d", n_keep, t->max_batch);
    int held_rows = t->slot_n_pages[slot] * SPECD_KV_PAGE_ROWS;
    for (int i = 0; i < n_keep; i++) {
        /* strictly increasing rows mean each move goes to a row at or before
         * its source, so moving in order never overwrites a row still needed */
        if (rows[i] < i || (i > 0 && rows[i] <= rows[i - 1]) || n_past < 0 ||
            n_past + rows[i] >= held_rows)
            return specd_seterr(err, "kv_compact: rows[%d] = %d is not strictly increasing "
                                     "inside the slot's rows",
                                i, rows[i]);
    }
    /* The moves write rows n_past + i from the first kept row that moves on:
     * those pages must be the slot's own, as in a forward pass (kv_pool.h):
     * a page another slot shares gets a private copy (the tail page a verify
     * step compacts into may be one of a shared prefix), a cached prefix page
     * held alone loses its key. Checked first, so a refusal changes nothing. */
    int first = 0;
    while (first < n_keep && rows[first] == first) first++;
    if (first < n_keep) {
        int copies = pages_to_take(t, slot, n_past + first, n_keep - first);
        int avail = specd_kv_pool_available(t->pool);
        if (copies > avail)
            return specd_seterr(err, "KV cache full: kv_compact needs %d pages to copy shared "
                                     "rows, %d are free (limits.kv_memory)",
                                copies, avail);
        own_pages(t, slot, n_past + first, n_past + n_keep);
    }
    int n_moves = 0;
    for (int i = 0; i < n_keep; i++) {
        if (rows[i] == i) continue;
        t->move_src[n_moves] = phys_row(t, slot, n_past + rows[i]);
        t->move_dst[n_moves] = phys_row(t, slot, n_past + i);
        n_moves++;
    }
    if (n_moves) t->be->ops->kv_move(t->be, &t->kv, t->move_src, t->move_dst, n_moves);
    slot_resize(t, slot, pages_for(n_past + n_keep));
    return t->be->ops->finish(t->be, err);
}
