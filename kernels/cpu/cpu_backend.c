/* cpu_backend.c - the CPU implementation of kernels/backend.h.
 *
 * Device buffers are plain host memory. Weight matrices are used where they
 * lie in the mmapped model file (no copy); matmul and embedding lookups go
 * to matmul.c, which computes on the quantized blocks directly. Everything
 * else (norms, RoPE, attention) is simple fp32 code here, split across the
 * thread pool where the work is large enough to pay for the hand-off. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "matmul.h"
#include "threadpool.h"

typedef struct cpu_backend {
    specd_backend base;
    specd_pool *pool;
    /* per-thread attention score buffers, grown on demand */
    float **scores;
    size_t scores_cap;
} cpu_backend;

static cpu_backend *cpu(specd_backend *be) { return (cpu_backend *)be; }

static void cpu_destroy(specd_backend *be) {
    cpu_backend *c = cpu(be);
    int n = specd_pool_size(c->pool);
    for (int i = 0; i < n && c->scores; i++) free(c->scores[i]);
    free(c->scores);
    specd_pool_destroy(c->pool);
    free(c);
}

static void *cpu_alloc(specd_backend *be, size_t bytes) {
    (void)be;
    /* calloc: large blocks come straight from mmap as untouched zero pages,
     * so a KV cache sized for the full context costs memory only as it
     * fills. */
    return calloc(1, bytes ? bytes : 1);
}

static void cpu_free(specd_backend *be, void *buf) {
    (void)be;
    free(buf);
}

static void cpu_memcpy(specd_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
}

static int cpu_prepare_weight(specd_backend *be, specd_bweight *w, const specd_tensor *t,
                              specd_error *err) {
    (void)be;
    (void)err;
    w->src = t;
    w->cols = (int64_t)t->ne[0];
    w->rows = t->n_dims > 1 ? (int64_t)t->ne[1] : 1;
    w->impl = NULL;
    return 0;
}

static void cpu_release_weight(specd_backend *be, specd_bweight *w) {
    (void)be;
    memset(w, 0, sizeof *w);
}

static void cpu_embed(specd_backend *be, float *out, const specd_bweight *E, const int32_t *ids,
                      int n_tok) {
    (void)be;
    for (int i = 0; i < n_tok; i++) cpu_tensor_row(E->src, ids[i], out + (size_t)i * E->cols);
}

/* Norm weights are tiny vectors; they may be F32, F16 or BF16 on disk. */
static float weight_at(const specd_tensor *t, int i) {
    switch (t->type) {
    case SPECD_F16: return specd_fp16_to_f32(((const uint16_t *)t->data)[i]);
    case SPECD_BF16: return specd_bf16_to_f32(((const uint16_t *)t->data)[i]);
    default: return ((const float *)t->data)[i];
    }
}

static void cpu_rmsnorm(specd_backend *be, float *out, const float *x, const specd_bweight *w,
                        int n_tok, int dim, float eps) {
    (void)be;
    for (int t = 0; t < n_tok; t++) {
        const float *xr = x + (size_t)t * dim;
        float *o = out + (size_t)t * dim;
        /* double accumulation: the reference computes mean(x^2) in fp32 over a
         * pairwise tree; a double sum keeps us well inside its rounding. */
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float scale = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) o[i] = (xr[i] * scale) * weight_at(w->src, i);
    }
}

static void cpu_matmul_op(specd_backend *be, float *y, const specd_bweight *W, const float *x,
                          int n_tok) {
    cpu_matmul(cpu(be)->pool, y, W->src, x, n_tok);
}

/* Rotates pairs of one head vector. Interleaved pairs are (2i, 2i+1) (GGUF
 * weights), otherwise (i, i + rot/2) (Hugging Face weights). */
static void rope_head(float *v, const float *cos_sin, const specd_rope_cfg *cfg) {
    int half = cfg->rot_dim / 2;
    for (int i = 0; i < half; i++) {
        float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
        int a = cfg->interleaved ? 2 * i : i;
        int b = cfg->interleaved ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

static void cpu_rope(specd_backend *be, float *q, float *k, const float *cos_sin, int n_tok,
                     int n_heads, int n_kv_heads, const specd_rope_cfg *cfg) {
    (void)be;
    int hd = cfg->head_dim;
    for (int t = 0; t < n_tok; t++) {
        const float *cs = cos_sin + (size_t)t * cfg->rot_dim;
        for (int h = 0; h < n_heads; h++) rope_head(q + ((size_t)t * n_heads + h) * hd, cs, cfg);
        for (int h = 0; h < n_kv_heads; h++) rope_head(k + ((size_t)t * n_kv_heads + h) * hd, cs, cfg);
    }
}

typedef struct attn_job {
    cpu_backend *c;
    float *out;
    const float *q;
    const specd_attn_seq *seqs;
    int n_seqs;
    int n_heads, n_kv_heads, head_dim;
    const int *tok_seq; /* batch row -> index into seqs */
} attn_job;

/* One task = one (token, head): softmax(q.K^T/sqrt(d)) . V over the visible
 * rows: the n_past committed rows plus the new rows the mask allows. */
static void attn_task(void *ctx, int task, int thread) {
    attn_job *j = ctx;
    int t = task / j->n_heads, h = task % j->n_heads;
    const specd_attn_seq *s = &j->seqs[j->tok_seq[t]];
    int i = t - s->tok_start; /* index among the sequence's new tokens */
    int hd = j->head_dim, kvw = j->n_kv_heads * hd;
    int kvh = h / (j->n_heads / j->n_kv_heads);
    const float *qv = j->q + ((size_t)t * j->n_heads + h) * hd;
    float *scores = j->c->scores[thread];
    float scale = 1.0f / sqrtf((float)hd);
    int n_rows = s->n_past + i + 1;
    float maxs = -INFINITY;
    for (int r = 0; r < n_rows; r++) {
        int visible = r < s->n_past || !s->mask ||
                      s->mask[(size_t)i * s->n_new + (r - s->n_past)];
        if (!visible) {
            scores[r] = -INFINITY;
            continue;
        }
        const float *kr = s->k_cache + (size_t)r * kvw + kvh * hd;
        float dot = 0;
        for (int d = 0; d < hd; d++) dot += qv[d] * kr[d];
        scores[r] = dot * scale;
        if (scores[r] > maxs) maxs = scores[r];
    }
    double sum = 0;
    for (int r = 0; r < n_rows; r++) {
        float e = scores[r] == -INFINITY ? 0.0f : expf(scores[r] - maxs);
        scores[r] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    float *o = j->out + ((size_t)t * j->n_heads + h) * hd;
    memset(o, 0, sizeof(float) * hd);
    for (int r = 0; r < n_rows; r++) {
        if (scores[r] == 0.0f) continue;
        float w = scores[r] * inv;
        const float *vr = s->v_cache + (size_t)r * kvw + kvh * hd;
        for (int d = 0; d < hd; d++) o[d] += w * vr[d];
    }
}

static void cpu_attention(specd_backend *be, float *out, const float *q, const float *k,
                          const float *v, const specd_attn_seq *seqs, int n_seqs, int n_heads,
                          int n_kv_heads, int head_dim) {
    cpu_backend *c = cpu(be);
    int kvw = n_kv_heads * head_dim;
    int n_tok = 0;
    size_t longest = 0;
    for (int s = 0; s < n_seqs; s++) {
        /* the new rows go into the cache first, so a token's own K/V and its
         * visible siblings are read from one place */
        memcpy(seqs[s].k_cache + (size_t)seqs[s].n_past * kvw, k + (size_t)seqs[s].tok_start * kvw,
               sizeof(float) * kvw * seqs[s].n_new);
        memcpy(seqs[s].v_cache + (size_t)seqs[s].n_past * kvw, v + (size_t)seqs[s].tok_start * kvw,
               sizeof(float) * kvw * seqs[s].n_new);
        if (seqs[s].tok_start + seqs[s].n_new > n_tok) n_tok = seqs[s].tok_start + seqs[s].n_new;
        size_t len = (size_t)seqs[s].n_past + seqs[s].n_new;
        if (len > longest) longest = len;
    }
    if (longest > c->scores_cap) {
        int nt = specd_pool_size(c->pool);
        for (int i = 0; i < nt; i++) {
            free(c->scores[i]);
            c->scores[i] = malloc(sizeof(float) * longest);
        }
        c->scores_cap = longest;
    }
    int *tok_seq = malloc(sizeof(int) * (n_tok ? n_tok : 1));
    for (int s = 0; s < n_seqs; s++)
        for (int i = 0; i < seqs[s].n_new; i++) tok_seq[seqs[s].tok_start + i] = s;
    attn_job j = {c, out, q, seqs, n_seqs, n_heads, n_kv_heads, head_dim, tok_seq};
    specd_pool_run(c->pool, n_tok * n_heads, attn_task, &j);
    free(tok_seq);
}

static void cpu_swiglu(specd_backend *be, float *out, const float *gate, const float *up,
                       size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void cpu_add(specd_backend *be, float *x, const float *y, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static void cpu_gather_rows(specd_backend *be, float *dst, const float *src, const int32_t *rows,
                            int n_rows, int width) {
    (void)be;
    for (int i = 0; i < n_rows; i++)
        memcpy(dst + (size_t)i * width, src + (size_t)rows[i] * width, sizeof(float) * width);
}

static const specd_backend_ops k_cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_memcpy,
    .from_host = cpu_memcpy,
    .copy = cpu_memcpy,
    .prepare_weight = cpu_prepare_weight,
    .release_weight = cpu_release_weight,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul_op,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .gather_rows = cpu_gather_rows,
};

specd_backend *specd_cpu_backend_create(int n_threads, specd_error *err) {
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) {
        specd_seterr(err, "cpu backend: out of memory");
        return NULL;
    }
    c->base.ops = &k_cpu_ops;
    c->pool = specd_pool_create(n_threads);
    if (!c->pool) {
        free(c);
        specd_seterr(err, "cpu backend: cannot start %d threads", n_threads);
        return NULL;
    }
    c->scores = calloc((size_t)specd_pool_size(c->pool), sizeof(float *));
    return &c->base;
}
