/* cuda_step.c - begin_step: everything a step needs from the host, in one
 * upload.
 *
 * The step is packed into a pinned staging buffer and sent with ONE
 * cudaMemcpyAsync to a device buffer of the same layout. Sections sit at
 * offsets computed from capacities, not from this step's sizes, so every
 * step of a given (n_tokens, n_seqs, n_out) hands the kernels the same
 * device addresses - what lets a recorded graph replay it. Layout (each
 * section 256-byte aligned; small, always-used sections first, so the copy,
 * which runs from offset 0 to the end of the last section this step uses,
 * stays short):
 *
 *   tokens   int32 [cap.tokens]   ids for embed
 *   tok_seq  int32 [cap.tokens]   sequence of each batch row, -1 = none
 *   kv_row   int32 [cap.tokens]   physical KV row for the row's K/V
 *                                 (pages[r/16]*16 + r%16, r = n_past + i)
 *   out      int32 [cap.out]      rows gather_out picks
 *   seqs     cuda_seq_meta [cap.seqs]
 *   pages    int32 [cap.pages]    page tables, concatenated
 *   cos_sin  float [cap.cos_sin]  [n_tokens][rot_dim/2][2]
 *   masks    uint8 [cap.masks]    masks, concatenated
 *
 * A step larger than a capacity doubles it; that reallocates both buffers,
 * so recorded graphs (which hold the old addresses) are dropped. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

_Static_assert(CUDA_KV_PAGE_ROWS == SPECD_KV_PAGE_ROWS, "cuda_kernels.h disagrees on page size");
_Static_assert(sizeof(cuda_seq_meta) == 32, "cuda_seq_meta must stay 32 bytes");

#define SECTION_ALIGN 256

static size_t align_up(size_t x) {
    return (x + SECTION_ALIGN - 1) & ~(size_t)(SECTION_ALIGN - 1);
}

static void layout(cuda_backend *cb) {
    const cuda_step_caps *c = &cb->caps;
    size_t o = 0;
    cb->off_tokens = o, o = align_up(o + 4 * (size_t)c->tokens);
    cb->off_tok_seq = o, o = align_up(o + 4 * (size_t)c->tokens);
    cb->off_kv_row = o, o = align_up(o + 4 * (size_t)c->tokens);
    cb->off_out = o, o = align_up(o + 4 * (size_t)c->out);
    cb->off_seqs = o, o = align_up(o + sizeof(cuda_seq_meta) * (size_t)c->seqs);
    cb->off_pages = o, o = align_up(o + 4 * (size_t)c->pages);
    cb->off_cos = o, o = align_up(o + 4 * (size_t)c->cos_sin);
    cb->off_masks = o, o = align_up(o + (size_t)c->masks);
    cb->step_bytes = o;
}

static int step_alloc(cuda_backend *cb) {
    layout(cb);
    if (!cuda_ok(cb, cudaHostAlloc((void **)&cb->step_host, cb->step_bytes, cudaHostAllocDefault),
                 "step staging: cudaHostAlloc")) {
        cb->step_host = NULL;
        return -1;
    }
    if (!cuda_ok(cb, cudaMalloc((void **)&cb->step_dev, cb->step_bytes), "step buffer: cudaMalloc")) {
        cb->step_dev = NULL;
        return -1;
    }
    const unsigned char *d = cb->step_dev;
    cb->dev.tokens = (const int32_t *)(d + cb->off_tokens);
    cb->dev.tok_seq = (const int32_t *)(d + cb->off_tok_seq);
    cb->dev.kv_row = (const int32_t *)(d + cb->off_kv_row);
    cb->dev.out_rows = (const int32_t *)(d + cb->off_out);
    cb->dev.seqs = (const cuda_seq_meta *)(d + cb->off_seqs);
    cb->dev.pages = (const int32_t *)(d + cb->off_pages);
    cb->dev.cos_sin = (const float *)(d + cb->off_cos);
    cb->dev.masks = d + cb->off_masks;
    return 0;
}

static void step_release(cuda_backend *cb) {
    if (cb->step_host) cudaFreeHost(cb->step_host);
    if (cb->step_dev) cudaFree(cb->step_dev);
    cb->step_host = cb->step_dev = NULL;
    memset(&cb->dev, 0, sizeof cb->dev);
}

int cuda_step_init(cuda_backend *cb) {
    /* room for decode and small trees of a model with head_dim <= 128
     * without ever growing */
    cb->caps = (cuda_step_caps){.tokens = 64, .cos_sin = 64 * 128, .seqs = 16, .pages = 1024,
                                .masks = 4096, .out = 64};
    if (!cuda_ok(cb, cudaEventCreateWithFlags(&cb->step_copied, cudaEventDisableTiming),
                 "cudaEventCreate"))
        return -1;
    return step_alloc(cb);
}

void cuda_step_free(cuda_backend *cb) {
    step_release(cb);
    if (cb->step_copied) cudaEventDestroy(cb->step_copied);
    cb->step_copied = NULL;
}

/* Doubles *cap until it holds `need`; returns 1 when it changed. */
static int grow_int(int *cap, int64_t need) {
    if (need <= *cap) return 0;
    int64_t c = *cap > 0 ? *cap : 1;
    while (c < need) c *= 2;
    *cap = c > INT_MAX ? INT_MAX : (int)c;
    return 1;
}

static int grow_i64(int64_t *cap, int64_t need) {
    if (need <= *cap) return 0;
    int64_t c = *cap > 0 ? *cap : 1;
    while (c < need) c *= 2;
    *cap = c;
    return 1;
}

static int bad_step(cuda_backend *cb, specd_error *err, const char *msg) {
    (void)cb;
    return specd_seterr(err, "cuda backend: begin_step: %s", msg);
}

int cuda_begin_step(specd_backend *be, const specd_step *st, specd_error *err) {
    cuda_backend *cb = cuda_of(be);
    cb->have_step = 0;
    cuda_capture_abort(cb, 0); /* a step cannot start inside a recording */
    cuda_enter(cb);
    if (!st || st->n_tokens < 0 || st->n_seqs < 0 || st->n_out < 0)
        return bad_step(cb, err, "negative sizes");
    if ((st->n_seqs && !st->seqs) || (st->n_out && !st->out_rows))
        return bad_step(cb, err, "seqs or out_rows missing");
    if (st->cos_sin && (st->rot_dim <= 0 || st->rot_dim % 2))
        return specd_seterr(err, "cuda backend: begin_step: rot_dim %d must be even and > 0",
                            st->rot_dim);

    /* sizes of the ragged sections; validate before touching anything */
    int64_t mask_bytes = 0, page_entries = 0;
    for (int s = 0; s < st->n_seqs; s++) {
        const specd_step_seq *q = &st->seqs[s];
        if (q->n_past < 0 || q->n_new < 0 || q->tok_start < 0 ||
            (int64_t)q->tok_start + q->n_new > st->n_tokens)
            return specd_seterr(err, "cuda backend: begin_step: sequence %d (tok_start %d, "
                                     "n_new %d, n_past %d) does not fit %d tokens",
                                s, q->tok_start, q->n_new, q->n_past, st->n_tokens);
        if (q->mask) mask_bytes += (int64_t)q->n_new * q->n_new;
        if (q->pages)
            page_entries += ((int64_t)q->n_past + q->n_new + CUDA_KV_PAGE_ROWS - 1) /
                            CUDA_KV_PAGE_ROWS;
    }
    for (int i = 0; i < st->n_out; i++)
        if (st->out_rows[i] < 0 || st->out_rows[i] >= st->n_tokens)
            return specd_seterr(err, "cuda backend: begin_step: out_rows[%d] = %d is not a row "
                                     "of the %d tokens", i, st->out_rows[i], st->n_tokens);
    int64_t cos_floats = st->cos_sin ? (int64_t)st->n_tokens * st->rot_dim : 0;
    /* offsets are int32 in cuda_seq_meta */
    if (mask_bytes > INT_MAX || page_entries > INT_MAX || cos_floats > INT_MAX)
        return bad_step(cb, err, "step too large");

    /* grow what this step exceeds; reallocation invalidates recorded graphs */
    int grew = grow_int(&cb->caps.tokens, st->n_tokens) | grow_int(&cb->caps.out, st->n_out) |
               grow_int(&cb->caps.seqs, st->n_seqs) | grow_int(&cb->caps.pages, page_entries) |
               grow_int(&cb->caps.cos_sin, cos_floats) | grow_i64(&cb->caps.masks, mask_bytes);
    if (grew || !cb->step_host || !cb->step_dev) { /* (or a failed reallocation last time) */
        cuda_graph_reset(be);
        /* the previous upload and the kernels reading the old buffer finish first */
        cuda_ok(cb, cudaStreamSynchronize(cb->stream), "begin_step: cudaStreamSynchronize");
        step_release(cb);
        if (step_alloc(cb)) return specd_seterr(err, "%s", cb->err);
    } else if (!cuda_ok(cb, cudaEventSynchronize(cb->step_copied), "begin_step: cudaEventSynchronize")) {
        /* the staging buffer is still being read by the last upload until then */
        return specd_seterr(err, "%s", cb->err);
    }

    unsigned char *h = cb->step_host;
    int32_t *tokens = (int32_t *)(h + cb->off_tokens), *tok_seq = (int32_t *)(h + cb->off_tok_seq),
            *kv_row = (int32_t *)(h + cb->off_kv_row), *pages = (int32_t *)(h + cb->off_pages);
    cuda_seq_meta *seqs = (cuda_seq_meta *)(h + cb->off_seqs);
    size_t nt = (size_t)st->n_tokens;
    if (st->tokens) memcpy(tokens, st->tokens, 4 * nt);
    else memset(tokens, 0, 4 * nt);
    for (size_t t = 0; t < nt; t++) tok_seq[t] = kv_row[t] = -1;
    int64_t mask_at = 0, page_at = 0;
    for (int s = 0; s < st->n_seqs; s++) {
        const specd_step_seq *q = &st->seqs[s];
        seqs[s] = (cuda_seq_meta){.n_past = q->n_past, .tok_start = q->tok_start,
                                  .n_new = q->n_new, .mask_offset = -1, .pages_offset = -1};
        if (q->mask) {
            seqs[s].mask_offset = (int32_t)mask_at;
            memcpy(h + cb->off_masks + mask_at, q->mask, (size_t)q->n_new * q->n_new);
            mask_at += (int64_t)q->n_new * q->n_new;
        }
        int64_t n_pages = ((int64_t)q->n_past + q->n_new + CUDA_KV_PAGE_ROWS - 1) / CUDA_KV_PAGE_ROWS;
        if (q->pages) {
            seqs[s].pages_offset = (int32_t)page_at;
            memcpy(pages + page_at, q->pages, 4 * (size_t)n_pages);
            page_at += n_pages;
        }
        for (int i = 0; i < q->n_new; i++) {
            int t = q->tok_start + i;
            if (tok_seq[t] != -1)
                return specd_seterr(err, "cuda backend: begin_step: batch row %d belongs to "
                                         "sequences %d and %d", t, tok_seq[t], s);
            tok_seq[t] = s;
            if (!q->pages) continue;
            /* where this token's K/V go: its logical row through the page
             * table; a row outside int32 (a corrupt page id) becomes -1,
             * which the append kernel skips */
            int64_t r = (int64_t)q->n_past + i;
            int64_t phys = (int64_t)q->pages[r / CUDA_KV_PAGE_ROWS] * CUDA_KV_PAGE_ROWS +
                           r % CUDA_KV_PAGE_ROWS;
            kv_row[t] = phys >= 0 && phys <= INT_MAX ? (int32_t)phys : -1;
        }
    }
    if (st->n_out) memcpy(h + cb->off_out, st->out_rows, 4 * (size_t)st->n_out);
    if (cos_floats) memcpy(h + cb->off_cos, st->cos_sin, 4 * (size_t)cos_floats);

    /* one copy, from 0 to the end of the last section in use */
    size_t len = nt ? cb->off_kv_row + 4 * nt : 0;
#define USE(end) \
    if ((end) > len) len = (end)
    if (st->n_out) USE(cb->off_out + 4 * (size_t)st->n_out);
    if (st->n_seqs) USE(cb->off_seqs + sizeof(cuda_seq_meta) * (size_t)st->n_seqs);
    if (page_at) USE(cb->off_pages + 4 * (size_t)page_at);
    if (cos_floats) USE(cb->off_cos + 4 * (size_t)cos_floats);
    if (mask_at) USE(cb->off_masks + (size_t)mask_at);
#undef USE
    if (len) {
        if (!cuda_ok(cb, cudaMemcpyAsync(cb->step_dev, cb->step_host, len, cudaMemcpyHostToDevice,
                                         cb->stream),
                     "begin_step: cudaMemcpyAsync") ||
            !cuda_ok(cb, cudaEventRecord(cb->step_copied, cb->stream), "begin_step: cudaEventRecord"))
            return specd_seterr(err, "%s", cb->err);
    }
    cb->n_tokens = st->n_tokens;
    cb->n_seqs = st->n_seqs;
    cb->n_out = st->n_out;
    cb->rot_dim = st->cos_sin ? st->rot_dim : 0;
    cb->have_step = 1;
    return 0;
}
