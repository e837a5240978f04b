/* test_backend_ops.c - every op of kernels/backend.h, on random inputs with
 * fixed seeds, checked up to three ways:
 *   (a) the CPU backend against a naive reference written here (double
 *       accumulation, no tricks) - always runs; this is the real test on CI;
 *   (b) the CUDA backend against the CPU backend on the same inputs, when
 *       specd_backend_create({.name = "cuda"}) succeeds. Two CUDA backends
 *       are made: the default one (fp16 KV, fp16/bf16 GEMM inputs) and one
 *       with kv_dtype F32 ("kv_f32": fp32 KV, matrices in their own type). Each is
 *       compared with the CPU backend set to the same kv_type (the CPU
 *       implements both KV layouts; see backend.h).
 *   (c) CUDA only: a small two-layer forward pass issued between graph_begin
 *       and graph_end for several steps of two shapes with different
 *       contents, each step's outputs against an eager CPU run.
 * Without a GPU every CUDA part prints one "SKIPPED: ..." line per op group
 * naming the reason (the error of specd_backend_create), so a run on CI says
 * what it did not check.
 *
 * Tolerances ("scale" is what the bound is relative to; u16 = 2^-11 and
 * ubf16 = 2^-8 are the unit roundoffs of fp16 and bf16):
 *
 *   op                      CPU vs naive             CUDA vs CPU
 *   ----------------------  -----------------------  -----------------------------
 *   embed, embed_ids        exact                    exact for F16/BF16 tables and
 *                                                    for F32 on the kv_f32 backend;
 *                                                    F32 on the default backend and
 *                                                    Q8_0: ubf16*|v| (the device may
 *                                                    hold a 16-bit copy)
 *   rmsnorm                 1e-5 relative            same (fp32 math; rsqrtf and the
 *                                                    summation order differ by a few
 *                                                    ulp)
 *   norm_gelu               1e-5 * (1 + |z|), z the  same (erff differs by an ulp or
 *                           GELU input (an fp32      two)
 *                           evaluation errs with
 *                           |z|, not the output)
 *   matmul                  1e-5 * sum_c |w x|       F32 on kv_f32: 3e-5 * sum|w x|
 *                           (as test_matmul: float   (plain fp32 GEMM, two fp32
 *                           accumulation against     summation orders; TF32 would
 *                           double)                  be ~1e-3 and fails on purpose);
 *                                                    F16: 2e-3 * sum|w x| (x rounded
 *                                                    to fp16: u16 = 4.9e-4, x4);
 *                                                    BF16: 8e-3 (ubf16 = 3.9e-3, x2);
 *                                                    F32 on the default backend:
 *                                                    1.6e-2 (both operands may be
 *                                                    rounded to a 16-bit type: bf16
 *                                                    gives 2*ubf16, x2; the current
 *                                                    cuda_weights.c stores fp16,
 *                                                    ~1e-3)
 *   rope                    1e-5 abs (|x| <= 1)      same
 *   attention               3e-5 abs (|v| <= 1, the  3e-5 abs, and the cache bytes
 *                           output is a convex       (new rows, every other row,
 *                           combination of V rows)   every layer) identical
 *   swiglu, axpy            1e-5 rel                 same
 *   scale                   exact (one rounding)     exact
 *   gather_out, argmax,     exact                    exact
 *   kv_move
 *   prepare_weight(NULL)    CPU refuses, naming the  finite, |w| <= (1 + ubf16) /
 *                           tensor                   sqrt(cols), vectors in
 *                                                    [0.9, 1.1], a fresh backend
 *                                                    gives the same values
 *   graph replay (c)        -                        logits and hidden within
 *                                                    1e-4 * max(1, max|cpu|) on the
 *                                                    kv_f32 backend with F32
 *                                                    weights (fp32 throughout),
 *                                                    1e-2 on the default backend
 *                                                    with F16 weights (x rounded to
 *                                                    fp16 before each of 9 dependent
 *                                                    matmuls, fp16 KV: about 9 u16 =
 *                                                    4.4e-3, x2); the KV cache
 *                                                    after all steps within the
 *                                                    same; argmax: the CUDA id's
 *                                                    CPU logit within that
 *                                                    tolerance of the CPU max (a
 *                                                    near-tie may flip, nothing
 *                                                    else may)
 *   begin_step / finish     finish 0 with and        the same ops give the CPU's
 *                           without ops; the latest  results (1e-5 abs) although
 *                           begin_step is the one    every host array of the step
 *                           the ops use              is overwritten right after
 *                                                    begin_step (backend.h: they
 *                                                    need to live only until it
 *                                                    returns), also for a step of
 *                                                    80 tokens (more than the step
 *                                                    buffer's first capacity).
 *                           (The CPU backend keeps the caller's pointers until the
 *                           step's ops are done, so it is not given clobbered
 *                           arrays.)
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/util/dtype.h"
#include "common/model/model_file.h"
#include "kernels/backend.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/qmatmul.h" /* cpu_quantize_act: a Q8_0 cache's queries */
#include "tests/harness/test_util.h"

#define U_BF16 (1.0 / 256.0)

/* --- backends --------------------------------------------------------------- */

enum { N_GPU = 2 };
static specd_backend *g_cpu;
static specd_backend *g_gpu[N_GPU]; /* [0] default (fp16 KV), [1] kv_f32 */
static const char *const k_gpu_name[N_GPU] = {"cuda", "cuda(kv_f32)"};
static char g_no_gpu[sizeof(((specd_error *)0)->msg)];

static int group_setup(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_backend_opts o = {.name = "cpu", .n_threads = 2};
    g_cpu = specd_backend_create(&o, &err);
    if (!g_cpu) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return -1;
    }
    for (int i = 0; i < N_GPU; i++) {
        specd_backend_opts c = {.name = "cuda", .device = 0, .kv_dtype = i ? SPECD_KV_F32 : SPECD_KV_AUTO};
        g_gpu[i] = specd_backend_create(&c, &err);
        if (g_gpu[i]) continue;
        if (i > 0) { /* the default one came up: a kv_f32 failure is a bug */
            fprintf(stderr, "cuda backend with kv_f32: %s\n", err.msg);
            return -1;
        }
        snprintf(g_no_gpu, sizeof g_no_gpu, "%s", err.msg[0] ? err.msg : "unknown reason");
        break;
    }
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    for (int i = 0; i < N_GPU; i++)
        if (g_gpu[i]) g_gpu[i]->ops->destroy(g_gpu[i]);
    if (g_cpu) g_cpu->ops->destroy(g_cpu);
    return 0;
}

/* 1 when the CUDA side of `group` can run; else prints why not. */
static int have_gpu(const char *group) {
    if (g_gpu[0]) return 1;
    printf("SKIPPED: %s on CUDA (vs CPU): %s\n", group, g_no_gpu);
    fflush(stdout);
    return 0;
}

/* The CPU twin of a backend's KV layout: the CPU backend with its kv_type. */
static void cpu_kv(specd_dtype t) { g_cpu->kv_type = t; }

/* --- device buffers ----------------------------------------------------------- */

static void *dput(specd_backend *be, const void *host, size_t bytes) {
    void *d = be->ops->alloc(be, bytes);
    if (!d) fail_msg("%s: alloc of %zu bytes failed", be->ops->name, bytes);
    if (host) be->ops->from_host(be, d, host, bytes);
    return d;
}

static void dget(specd_backend *be, void *host, const void *dev, size_t bytes) {
    be->ops->to_host(be, host, dev, bytes);
}

static void dfree(specd_backend *be, void *dev) { be->ops->free(be, dev); }

static void finish_ok(specd_backend *be, const char *what) {
    specd_error err = {{0}};
    if (be->ops->finish(be, &err)) fail_msg("%s: %s: finish: %s", be->ops->name, what, err.msg);
}

static void begin_ok(specd_backend *be, const specd_step *st) {
    specd_error err = {{0}};
    if (be->ops->begin_step(be, st, &err)) fail_msg("%s: begin_step: %s", be->ops->name, err.msg);
}

/* --- host tensors ----------------------------------------------------------- */

/* A model tensor built in memory: `data` as stored in `type`, `vals` the
 * stored values as fp32 ([rows][cols], what the naive references use). */
typedef struct htensor {
    specd_tensor t;
    void *data;
    float *vals;
    int rows, cols; /* rows 1 for a vector */
} htensor;

static void ht_init(htensor *h, const char *name, specd_dtype type, int cols, int rows,
                    uint64_t seed, float scale, float offset) {
    memset(h, 0, sizeof *h);
    int is_vec = rows <= 0;
    h->rows = is_vec ? 1 : rows;
    h->cols = cols;
    size_t n = (size_t)h->rows * cols;
    h->vals = malloc(sizeof(float) * n);
    assert_non_null(h->vals);
    test_fill_random(h->vals, n, seed, scale);
    for (size_t i = 0; i < n; i++) h->vals[i] += offset;
    size_t bytes = 0;
    switch (type) {
    case SPECD_F32:
        bytes = n * 4;
        h->data = malloc(bytes);
        memcpy(h->data, h->vals, bytes);
        break;
    case SPECD_F16:
    case SPECD_BF16: {
        bytes = n * 2;
        uint16_t *d = malloc(bytes);
        for (size_t i = 0; i < n; i++) {
            d[i] =
                type == SPECD_F16 ? specd_f32_to_fp16(h->vals[i]) : specd_f32_to_bf16(h->vals[i]);
            h->vals[i] = type == SPECD_F16 ? specd_fp16_to_f32(d[i]) : specd_bf16_to_f32(d[i]);
        }
        h->data = d;
        break;
    }
    case SPECD_Q8_0: {
        /* fp16 d + 32 int8 q per block, w = d * q (kernels/cpu/quant_ref.c) */
        const specd_dtype_info *in = specd_dtype_get(SPECD_Q8_0);
        assert_int_equal(in->block_elems, 32);
        assert_int_equal(in->block_bytes, 34);
        assert_int_equal(cols % 32, 0);
        size_t nblk = n / 32;
        bytes = nblk * 34;
        uint8_t *d = malloc(bytes);
        for (size_t b = 0; b < nblk; b++) {
            float *v = h->vals + b * 32;
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
            uint16_t dh = specd_f32_to_fp16(amax / 127.0f);
            float df = specd_fp16_to_f32(dh);
            memcpy(d + b * 34, &dh, 2);
            for (int i = 0; i < 32; i++) {
                long q = df > 0 ? lrintf(v[i] / df) : 0;
                if (q > 127) q = 127;
                if (q < -127) q = -127;
                int8_t qb = (int8_t)q;
                memcpy(d + b * 34 + 2 + i, &qb, 1);
                v[i] = df * (float)qb;
            }
        }
        h->data = d;
        break;
    }
    default: fail_msg("ht_init: no generator for type %d", (int)type);
    }
    assert_non_null(h->data);
    snprintf(h->t.name, sizeof h->t.name, "%s", name);
    h->t.type = type;
    h->t.n_dims = is_vec ? 1 : 2;
    h->t.ne[0] = (uint64_t)cols;
    h->t.ne[1] = (uint64_t)h->rows;
    h->t.ne[2] = h->t.ne[3] = 1;
    h->t.data = h->data;
    h->t.nbytes = bytes;
}

static void ht_free(htensor *h) {
    free(h->data);
    free(h->vals);
}

static void prep_ok(specd_backend *be, specd_bweight *w, const htensor *h) {
    specd_error err = {{0}};
    memset(w, 0, sizeof *w);
    if (be->ops->prepare_weight(be, w, &h->t, &err))
        fail_msg("%s: prepare_weight(%s): %s", be->ops->name, h->t.name, err.msg);
    assert_int_equal(w->rows, h->rows);
    assert_int_equal(w->cols, h->cols);
}

/* --- steps ---------------------------------------------------------------- */

enum { MAX_TOK = 96, MAX_SEQ = 4, MAX_PAGES = 128, MAX_ROT = 128 };

typedef struct seq_spec {
    int n_past, n_new;
    const int *parent;    /* tree: parent[i] < i, -1 = child of the cache; NULL = causal */
    const int32_t *pages; /* at least ceil((n_past + n_new) / PAGE_ROWS) ids */
} seq_spec;

/* A step and the host arrays it points to (the CPU backend reads them
 * until the step's ops are done, so they live as long as this struct). */
typedef struct tstep {
    int32_t tokens[MAX_TOK];
    int32_t pos[MAX_TOK];
    float cos_sin[MAX_TOK * MAX_ROT];
    uint8_t masks[MAX_SEQ][MAX_TOK * MAX_TOK];
    int32_t pages[MAX_SEQ][MAX_PAGES];
    int32_t out_rows[MAX_TOK];
    specd_step_seq seqs[MAX_SEQ];
    specd_step st;
} tstep;

static int pages_for(int rows) { return (rows + SPECD_KV_PAGE_ROWS - 1) / SPECD_KV_PAGE_ROWS; }

/* Builds a step: tokens from `tok_seed` in 0..vocab-1, RoPE positions
 * n_past + depth (theta 10000, rot_dim), masks from the parent lists, no
 * output rows (set st.n_out / out_rows after). */
static void tstep_init(tstep *s, int n_seqs, const seq_spec *spec, int rot_dim, uint64_t tok_seed,
                       int vocab) {
    memset(s, 0, sizeof *s);
    assert_true(n_seqs <= MAX_SEQ && rot_dim <= MAX_ROT && rot_dim % 2 == 0);
    int start = 0;
    for (int q = 0; q < n_seqs; q++) {
        const seq_spec *sp = &spec[q];
        int n = sp->n_new, np = pages_for(sp->n_past + n);
        assert_true(start + n <= MAX_TOK && np <= MAX_PAGES);
        memcpy(s->pages[q], sp->pages, sizeof(int32_t) * (size_t)np);
        for (int i = 0; i < n; i++) {
            int depth = 0;
            if (sp->parent) {
                for (int j = i; j >= 0; j = sp->parent[j]) {
                    s->masks[q][i * n + j] = 1;
                    depth++;
                }
                depth--;
            } else {
                depth = i;
            }
            s->pos[start + i] = sp->n_past + depth;
        }
        s->seqs[q] =
            (specd_step_seq){sp->n_past, start, n, sp->parent ? s->masks[q] : NULL, s->pages[q]};
        start += n;
    }
    uint64_t r = tok_seed * 0x9E3779B97F4A7C15ULL + 12345;
    for (int i = 0; i < start; i++) {
        r ^= r >> 29;
        r *= 0xBF58476D1CE4E5B9ULL;
        r ^= r >> 32;
        s->tokens[i] = (int32_t)(r % (uint64_t)vocab);
    }
    int half = rot_dim / 2;
    for (int i = 0; i < start; i++)
        for (int f = 0; f < half; f++) {
            double angle = s->pos[i] * pow(10000.0, -2.0 * f / rot_dim);
            s->cos_sin[(size_t)i * rot_dim + 2 * f] = (float)cos(angle);
            s->cos_sin[(size_t)i * rot_dim + 2 * f + 1] = (float)sin(angle);
        }
    s->st = (specd_step){.n_tokens = start,
                         .tokens = s->tokens,
                         .cos_sin = s->cos_sin,
                         .rot_dim = rot_dim,
                         .n_seqs = n_seqs,
                         .seqs = s->seqs,
                         .n_out = 0,
                         .out_rows = s->out_rows};
}

static void tstep_out(tstep *s, int n_out, const int32_t *rows) {
    memcpy(s->out_rows, rows, sizeof(int32_t) * (size_t)n_out);
    s->st.n_out = n_out;
}

/* --- comparisons ------------------------------------------------------------ */

/* |got - want| <= abs_tol + rel_tol * |want| everywhere (NaN fails). */
static void expect_close(const char *what, const float *got, const float *want, size_t n,
                         double abs_tol, double rel_tol) {
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= abs_tol + rel_tol * fabs((double)want[i])))
            fail_msg("%s: element %zu: got %.9g, want %.9g (|diff| %.3g > %.3g + %.3g*|want|)",
                     what, i, (double)got[i], (double)want[i], d, abs_tol, rel_tol);
    }
}

/* |got - want| <= tol * scale[i] everywhere. */
static void expect_close_scaled(const char *what, const float *got, const float *want,
                                const double *scale, size_t n, double tol) {
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= tol * scale[i] + 1e-30))
            fail_msg("%s: element %zu: got %.9g, want %.9g (|diff| %.3g > %.3g * scale %.3g)", what,
                     i, (double)got[i], (double)want[i], d, tol, scale[i]);
    }
}

static void expect_equal_f(const char *what, const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s: element %zu: got %.9g, want %.9g (must be identical)", what, i,
                     (double)got[i], (double)want[i]);
}

/* --- embed / embed_ids ---------------------------------------------------- */

enum { EMB_ROWS = 50, EMB_COLS = 64 };

/* embed (the step's tokens) and embed_ids on `be`; out_step [n_tok][cols],
 * out_ids [n_ids][cols] */
static void run_embed(specd_backend *be, const htensor *E, const tstep *s, const int32_t *ids,
                      int n_ids, float *out_step, float *out_ids) {
    specd_bweight w;
    prep_ok(be, &w, E);
    size_t rb = sizeof(float) * (size_t)E->cols;
    float *o1 = dput(be, NULL, rb * (size_t)s->st.n_tokens);
    float *o2 = dput(be, NULL, rb * (size_t)n_ids);
    int32_t *dids = dput(be, ids, sizeof(int32_t) * (size_t)n_ids);
    begin_ok(be, &s->st);
    be->ops->embed(be, o1, &w);
    finish_ok(be, "embed");
    be->ops->embed_ids(be, o2, &w, dids, n_ids);
    dget(be, out_step, o1, rb * (size_t)s->st.n_tokens);
    dget(be, out_ids, o2, rb * (size_t)n_ids);
    finish_ok(be, "embed_ids");
    dfree(be, o1);
    dfree(be, o2);
    dfree(be, dids);
    be->ops->release_weight(be, &w);
}

static void test_embed(void **state) {
    (void)state;
    static const int32_t pg[] = {3};
    seq_spec sp = {.n_past = 0, .n_new = 7, .parent = NULL, .pages = pg};
    tstep *s = malloc(sizeof *s);
    tstep_init(s, 1, &sp, 16, 1, EMB_ROWS);
    const int32_t toks[7] = {0, EMB_ROWS - 1, 7, 7, 23, 1, EMB_ROWS - 2};
    memcpy(s->tokens, toks, sizeof toks);
    const int32_t ids[5] = {EMB_ROWS - 1, 0, 31, 31, 2};
    const specd_dtype types[] = {SPECD_F32, SPECD_F16, SPECD_BF16, SPECD_Q8_0};
    int gpu = have_gpu("embed/embed_ids");
    float want1[7 * EMB_COLS], want2[5 * EMB_COLS], got1[7 * EMB_COLS], got2[5 * EMB_COLS];
    float g1[7 * EMB_COLS], g2[5 * EMB_COLS];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        htensor E;
        ht_init(&E, "token_embd.weight", types[ti], EMB_COLS, EMB_ROWS, 100 + ti, 1.0f, 0);
        for (int i = 0; i < 7; i++)
            memcpy(want1 + i * EMB_COLS, E.vals + (size_t)toks[i] * EMB_COLS,
                   sizeof(float) * EMB_COLS);
        for (int i = 0; i < 5; i++)
            memcpy(want2 + i * EMB_COLS, E.vals + (size_t)ids[i] * EMB_COLS,
                   sizeof(float) * EMB_COLS);
        run_embed(g_cpu, &E, s, ids, 5, got1, got2);
        char what[96];
        snprintf(what, sizeof what, "cpu embed %s", specd_dtype_get(types[ti])->name);
        expect_equal_f(what, got1, want1, 7 * EMB_COLS);
        expect_equal_f(what, got2, want2, 5 * EMB_COLS);
        for (int gi = 0; gpu && gi < N_GPU; gi++) {
            run_embed(g_gpu[gi], &E, s, ids, 5, g1, g2);
            snprintf(what, sizeof what, "%s embed %s vs cpu", k_gpu_name[gi],
                     specd_dtype_get(types[ti])->name);
            int exact = types[ti] == SPECD_F16 || types[ti] == SPECD_BF16 ||
                        (types[ti] == SPECD_F32 && gi == 1);
            if (exact) {
                expect_equal_f(what, g1, got1, 7 * EMB_COLS);
                expect_equal_f(what, g2, got2, 5 * EMB_COLS);
            } else {
                expect_close(what, g1, got1, 7 * EMB_COLS, 0, U_BF16);
                expect_close(what, g2, got2, 5 * EMB_COLS, 0, U_BF16);
            }
        }
        ht_free(&E);
    }
    free(s);
}

/* --- rmsnorm / norm_gelu --------------------------------------------------- */

static void run_rmsnorm(specd_backend *be, const htensor *w, const float *x, int rows, int dim,
                        float eps, int in_place, float *out) {
    specd_bweight bw;
    if (w) prep_ok(be, &bw, w);
    size_t bytes = sizeof(float) * (size_t)rows * dim;
    float *dx = dput(be, x, bytes);
    float *dout = in_place ? dx : dput(be, NULL, bytes);
    be->ops->rmsnorm(be, dout, dx, w ? &bw : NULL, rows, dim, eps);
    dget(be, out, dout, bytes);
    finish_ok(be, "rmsnorm");
    if (!in_place) dfree(be, dout);
    dfree(be, dx);
    if (w) be->ops->release_weight(be, &bw);
}

static void test_rmsnorm(void **state) {
    (void)state;
    const int dims[] = {64, 70, 576};
    const int rows = 5;
    const float eps = 1e-5f;
    int gpu = have_gpu("rmsnorm");
    for (size_t di = 0; di < 3; di++) {
        int dim = dims[di];
        size_t n = (size_t)rows * dim;
        float *x = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
        float *got = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
        test_fill_random(x, n, 200 + di, 3.0f);
        for (int r = 0; r < dim; r++) x[r] = 0.25f * x[r] + 0.5f; /* row 0: nonzero mean */
        htensor wf, wb;
        ht_init(&wf, "blk.0.attn_norm.weight", SPECD_F32, dim, 0, 210 + di, 0.3f, 1.0f);
        ht_init(&wb, "blk.1.attn_norm.weight", SPECD_BF16, dim, 0, 220 + di, 0.3f, 1.0f);
        const htensor *ws[3] = {NULL, &wf, &wb};
        for (int wi = 0; wi < 3; wi++) {
            for (int r = 0; r < rows; r++) {
                double ss = 0;
                for (int i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
                double sc = 1.0 / sqrt(ss / dim + eps);
                for (int i = 0; i < dim; i++)
                    want[r * dim + i] =
                        (float)(x[r * dim + i] * sc * (ws[wi] ? ws[wi]->vals[i] : 1.0));
            }
            for (int in_place = 0; in_place < 2; in_place++) {
                char what[96];
                snprintf(what, sizeof what, "cpu rmsnorm dim %d weight %d in_place %d", dim, wi,
                         in_place);
                run_rmsnorm(g_cpu, ws[wi], x, rows, dim, eps, in_place, got);
                expect_close(what, got, want, n, 1e-11, 1e-5);
                for (int gi = 0; gpu && gi < N_GPU; gi++) {
                    run_rmsnorm(g_gpu[gi], ws[wi], x, rows, dim, eps, in_place, g);
                    snprintf(what, sizeof what, "%s rmsnorm dim %d weight %d in_place %d vs cpu",
                             k_gpu_name[gi], dim, wi, in_place);
                    expect_close(what, g, got, n, 1e-11, 1e-5);
                }
            }
        }
        ht_free(&wf);
        ht_free(&wb);
        free(x);
        free(want);
        free(got);
        free(g);
    }
}

static double gelu_ref(double z) { return 0.5 * z * (1.0 + erf(z / sqrt(2.0))); }

static void run_norm_gelu(specd_backend *be, const htensor *w, const htensor *b, const float *x,
                          int rows, int dim, float eps, float *out) {
    specd_bweight bw, bb;
    prep_ok(be, &bw, w);
    prep_ok(be, &bb, b);
    size_t bytes = sizeof(float) * (size_t)rows * dim;
    float *dx = dput(be, x, bytes), *dout = dput(be, NULL, bytes);
    be->ops->norm_gelu(be, dout, dx, &bw, &bb, rows, dim, eps);
    dget(be, out, dout, bytes);
    finish_ok(be, "norm_gelu");
    dfree(be, dx);
    dfree(be, dout);
    be->ops->release_weight(be, &bw);
    be->ops->release_weight(be, &bb);
}

static void test_norm_gelu(void **state) {
    (void)state;
    const int dims[] = {64, 70};
    const int rows = 4;
    const float eps = 1e-6f;
    int gpu = have_gpu("norm_gelu");
    for (size_t di = 0; di < 2; di++) {
        int dim = dims[di];
        size_t n = (size_t)rows * dim;
        float *x = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
        float *got = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
        double *scale = malloc(sizeof(double) * n);
        test_fill_random(x, n, 300 + di, 2.0f);
        htensor w, b;
        ht_init(&w, "stage.0.ln.weight", SPECD_F32, dim, 0, 310 + di, 0.5f, 1.0f);
        ht_init(&b, "stage.0.ln.bias", SPECD_F32, dim, 0, 320 + di, 0.5f, 0.0f);
        for (int r = 0; r < rows; r++) {
            double ss = 0;
            for (int i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
            double sc = 1.0 / sqrt(ss / dim + eps);
            for (int i = 0; i < dim; i++) {
                double z = w.vals[i] * (x[r * dim + i] * sc) + b.vals[i];
                want[r * dim + i] = (float)gelu_ref(z);
                /* gelu(z) ~ z for z >> 0 and ~ 0 for z << 0: the error of
                 * an fp32 evaluation scales with |z|, not with the output */
                scale[r * dim + i] = 1.0 + fabs(z);
            }
        }
        char what[96];
        snprintf(what, sizeof what, "cpu norm_gelu dim %d", dim);
        run_norm_gelu(g_cpu, &w, &b, x, rows, dim, eps, got);
        expect_close_scaled(what, got, want, scale, n, 1e-5);
        for (int gi = 0; gpu && gi < N_GPU; gi++) {
            run_norm_gelu(g_gpu[gi], &w, &b, x, rows, dim, eps, g);
            snprintf(what, sizeof what, "%s norm_gelu dim %d vs cpu", k_gpu_name[gi], dim);
            expect_close_scaled(what, g, got, scale, n, 1e-5);
        }
        ht_free(&w);
        ht_free(&b);
        free(x);
        free(want);
        free(got);
        free(g);
        free(scale);
    }
}

/* --- matmul ------------------------------------------------------------------- */

static const float k_sentinel = 12345.0f;

/* y [n][rows] on `be`; one extra row of sentinels after y must survive. */
static void run_matmul(specd_backend *be, const htensor *W, const float *x, int n, float *y) {
    specd_bweight w;
    prep_ok(be, &w, W);
    size_t yb = sizeof(float) * (size_t)(n + 1) * W->rows;
    float *init = malloc(yb);
    for (size_t i = 0; i < (size_t)(n + 1) * W->rows; i++) init[i] = k_sentinel;
    float *dx = dput(be, x, sizeof(float) * (size_t)n * W->cols);
    float *dy = dput(be, init, yb);
    be->ops->matmul(be, dy, &w, dx, n);
    dget(be, init, dy, yb);
    finish_ok(be, "matmul");
    for (int r = 0; r < W->rows; r++)
        if (init[(size_t)n * W->rows + r] != k_sentinel)
            fail_msg("%s matmul %s [%d x %d] n %d: wrote past y (row %d of the guard)",
                     be->ops->name, specd_dtype_get(W->t.type)->name, W->rows, W->cols, n, r);
    memcpy(y, init, sizeof(float) * (size_t)n * W->rows);
    free(init);
    dfree(be, dx);
    dfree(be, dy);
    be->ops->release_weight(be, &w);
}

/* CUDA vs CPU tolerance, relative to sum_c |w x| (table at the top). */
static double gpu_matmul_tol(specd_dtype type, int gi) {
    switch (type) {
    case SPECD_F16: return 2e-3;
    case SPECD_BF16: return 8e-3;
    default: return gi == 1 ? 3e-5 : 1.6e-2;
    }
}

static void test_matmul(void **state) {
    (void)state;
    const specd_dtype types[] = {SPECD_F32, SPECD_F16, SPECD_BF16};
    const int shapes[][2] = {{96, 128}, {37, 70}}; /* rows, cols: 70 is no multiple of 8 */
    const int ns[] = {1, 3, 17, 64};
    int gpu = have_gpu("matmul");
    for (size_t si = 0; si < 2; si++) {
        int rows = shapes[si][0], cols = shapes[si][1];
        float *x = malloc(sizeof(float) * 64 * cols);
        test_fill_random(x, (size_t)64 * cols, 400 + si, 1.0f);
        float *want = malloc(sizeof(float) * 64 * rows), *got = malloc(sizeof(float) * 64 * rows);
        float *g = malloc(sizeof(float) * 64 * rows);
        double *mag = malloc(sizeof(double) * 64 * rows);
        for (size_t ti = 0; ti < 3; ti++) {
            htensor W;
            ht_init(&W, "blk.0.attn_q.weight", types[ti], cols, rows, 410 + 10 * si + ti, 0.5f, 0);
            for (int t = 0; t < 64; t++)
                for (int r = 0; r < rows; r++) {
                    double acc = 0, m = 0;
                    for (int c = 0; c < cols; c++) {
                        double p = (double)W.vals[(size_t)r * cols + c] * x[(size_t)t * cols + c];
                        acc += p;
                        m += fabs(p);
                    }
                    want[(size_t)t * rows + r] = (float)acc;
                    mag[(size_t)t * rows + r] = m;
                }
            for (size_t ni = 0; ni < 4; ni++) {
                int n = ns[ni];
                char what[128];
                snprintf(what, sizeof what, "cpu matmul %s [%d x %d] n %d",
                         specd_dtype_get(types[ti])->name, rows, cols, n);
                run_matmul(g_cpu, &W, x, n, got);
                expect_close_scaled(what, got, want, mag, (size_t)n * rows, 1e-5);
                for (int gi = 0; gpu && gi < N_GPU; gi++) {
                    run_matmul(g_gpu[gi], &W, x, n, g);
                    snprintf(what, sizeof what, "%s matmul %s [%d x %d] n %d vs cpu",
                             k_gpu_name[gi], specd_dtype_get(types[ti])->name, rows, cols, n);
                    expect_close_scaled(what, g, got, mag, (size_t)n * rows,
                                        gpu_matmul_tol(types[ti], gi));
                }
            }
            ht_free(&W);
        }
        free(x);
        free(want);
        free(got);
        free(g);
        free(mag);
    }
}

/* --- rope --------------------------------------------------------------------- */

static void run_rope(specd_backend *be, const tstep *s, float *q, float *k, int nh, int nkv,
                     const specd_rope_cfg *cfg) {
    size_t qb = sizeof(float) * (size_t)s->st.n_tokens * nh * cfg->head_dim;
    size_t kb = sizeof(float) * (size_t)s->st.n_tokens * nkv * cfg->head_dim;
    float *dq = dput(be, q, qb), *dk = dput(be, k, kb);
    begin_ok(be, &s->st);
    be->ops->rope(be, dq, dk, nh, nkv, cfg);
    dget(be, q, dq, qb);
    dget(be, k, dk, kb);
    finish_ok(be, "rope");
    dfree(be, dq);
    dfree(be, dk);
}

static void rope_ref(float *v, const float *cs, int hd, int interleaved) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        double c = cs[2 * i], s = cs[2 * i + 1], x0 = v[a], x1 = v[b];
        v[a] = (float)(x0 * c - x1 * s);
        v[b] = (float)(x0 * s + x1 * c);
    }
}

static void test_rope(void **state) {
    (void)state;
    const int hds[] = {16, 64, 128};
    const int nh = 4, nkv = 2;
    static const int32_t pa[] = {6}, pb[] = {1, 4, 0};
    static const int par[] = {-1, 0};
    /* positions 0, 1, 2 and (tree) 40, 41: 5 tokens */
    const seq_spec sp[2] = {{0, 3, NULL, pa}, {40, 2, par, pb}};
    tstep *s = malloc(sizeof *s);
    int gpu = have_gpu("rope");
    for (size_t hi = 0; hi < 3; hi++) {
        int hd = hds[hi];
        tstep_init(s, 2, sp, hd, 5, 100);
        int nt = s->st.n_tokens;
        size_t nq = (size_t)nt * nh * hd, nk = (size_t)nt * nkv * hd;
        float *q0 = malloc(sizeof(float) * nq), *k0 = malloc(sizeof(float) * nk);
        float *qw = malloc(sizeof(float) * nq), *kw = malloc(sizeof(float) * nk);
        float *qc = malloc(sizeof(float) * nq), *kc = malloc(sizeof(float) * nk);
        float *qg = malloc(sizeof(float) * nq), *kg = malloc(sizeof(float) * nk);
        test_fill_random(q0, nq, 500 + hi, 1.0f);
        test_fill_random(k0, nk, 510 + hi, 1.0f);
        for (int inter = 0; inter < 2; inter++) {
            specd_rope_cfg cfg = {hd, hd, inter};
            memcpy(qw, q0, sizeof(float) * nq);
            memcpy(kw, k0, sizeof(float) * nk);
            for (int t = 0; t < nt; t++) {
                const float *cs = s->cos_sin + (size_t)t * hd;
                for (int h = 0; h < nh; h++)
                    rope_ref(qw + ((size_t)t * nh + h) * hd, cs, hd, inter);
                for (int h = 0; h < nkv; h++)
                    rope_ref(kw + ((size_t)t * nkv + h) * hd, cs, hd, inter);
            }
            memcpy(qc, q0, sizeof(float) * nq);
            memcpy(kc, k0, sizeof(float) * nk);
            run_rope(g_cpu, s, qc, kc, nh, nkv, &cfg);
            char what[96];
            snprintf(what, sizeof what, "cpu rope hd %d interleaved %d q", hd, inter);
            expect_close(what, qc, qw, nq, 1e-5, 0);
            snprintf(what, sizeof what, "cpu rope hd %d interleaved %d k", hd, inter);
            expect_close(what, kc, kw, nk, 1e-5, 0);
            for (int gi = 0; gpu && gi < N_GPU; gi++) {
                memcpy(qg, q0, sizeof(float) * nq);
                memcpy(kg, k0, sizeof(float) * nk);
                run_rope(g_gpu[gi], s, qg, kg, nh, nkv, &cfg);
                snprintf(what, sizeof what, "%s rope hd %d interleaved %d q vs cpu", k_gpu_name[gi],
                         hd, inter);
                expect_close(what, qg, qc, nq, 1e-5, 0);
                snprintf(what, sizeof what, "%s rope hd %d interleaved %d k vs cpu", k_gpu_name[gi],
                         hd, inter);
                expect_close(what, kg, kc, nk, 1e-5, 0);
            }
        }
        free(q0);
        free(k0);
        free(qw);
        free(kw);
        free(qc);
        free(kc);
        free(qg);
        free(kg);
    }
    free(s);
}

/* --- attention ------------------------------------------------------------ */

enum { ATT_LAYERS = 2, ATT_LAYER = 1, ATT_PAGES = 24 };

typedef struct kvcache {
    size_t elem, bytes;
    int n_layers, kv_dim;
    int64_t n_rows;
    void *host;
} kvcache;

static void kv_init(kvcache *c, specd_dtype type, int n_layers, int kv_dim, int64_t n_rows,
                    uint64_t seed) {
    c->elem = specd_kv_row_bytes(type, 1); /* F32 or F16 here */
    c->n_layers = n_layers;
    c->kv_dim = kv_dim;
    c->n_rows = n_rows;
    size_t n = 2 * (size_t)n_layers * (size_t)n_rows * kv_dim;
    c->bytes = n * c->elem;
    c->host = malloc(c->bytes);
    float *v = malloc(sizeof(float) * n);
    test_fill_random(v, n, seed, 1.0f);
    for (size_t i = 0; i < n; i++) {
        if (c->elem == 2)
            ((uint16_t *)c->host)[i] = specd_f32_to_fp16(v[i]);
        else
            ((float *)c->host)[i] = v[i];
    }
    free(v);
}

/* element e of physical row `row` of pool p (= 2*layer + 0 for K, 1 for V) */
static size_t kv_index(const kvcache *c, int p, int64_t row, int e) {
    return ((size_t)p * (size_t)c->n_rows + (size_t)row) * c->kv_dim + e;
}

static float kv_get(const kvcache *c, const void *mem, size_t idx) {
    return c->elem == 2 ? specd_fp16_to_f32(((const uint16_t *)mem)[idx])
                        : ((const float *)mem)[idx];
}

static void kv_set(const kvcache *c, void *mem, size_t idx, float v) {
    if (c->elem == 2)
        ((uint16_t *)mem)[idx] = specd_f32_to_fp16(v);
    else
        ((float *)mem)[idx] = v;
}

static int64_t phys_row(const specd_step_seq *s, int r) {
    return (int64_t)s->pages[r / SPECD_KV_PAGE_ROWS] * SPECD_KV_PAGE_ROWS + r % SPECD_KV_PAGE_ROWS;
}

/* Runs attention on layer ATT_LAYER of a cache holding `before`; returns
 * out [n_tok][nh*hd] and the cache bytes after. */
static void run_attention(specd_backend *be, const tstep *s, const kvcache *c, const float *q,
                          const float *k, const float *v, int nh, int nkv, int hd, float *out,
                          void *after) {
    int nt = s->st.n_tokens;
    size_t qb = sizeof(float) * (size_t)nt * nh * hd, kb = sizeof(float) * (size_t)nt * nkv * hd;
    specd_kv_layout kv = {dput(be, c->host, c->bytes), c->n_layers, c->kv_dim, c->n_rows};
    float *dq = dput(be, q, qb), *dk = dput(be, k, kb), *dv = dput(be, v, kb);
    float *dout = dput(be, NULL, qb);
    begin_ok(be, &s->st);
    be->ops->attention(be, dout, dq, dk, dv, &kv, ATT_LAYER, nh, nkv, hd);
    dget(be, out, dout, qb);
    dget(be, after, kv.base, c->bytes);
    finish_ok(be, "attention");
    dfree(be, kv.base);
    dfree(be, dq);
    dfree(be, dk);
    dfree(be, dv);
    dfree(be, dout);
}

/* The cache every backend must leave: `before` with the step's new k/v
 * rows stored (in the cache's type) at each sequence's rows n_past.. of
 * layer ATT_LAYER. */
static void attention_expected_cache(const tstep *s, const kvcache *c, const float *k,
                                     const float *v, void *exp) {
    memcpy(exp, c->host, c->bytes);
    for (int q = 0; q < s->st.n_seqs; q++) {
        const specd_step_seq *sq = &s->seqs[q];
        for (int i = 0; i < sq->n_new; i++) {
            int64_t row = phys_row(sq, sq->n_past + i);
            for (int e = 0; e < c->kv_dim; e++) {
                size_t src = (size_t)(sq->tok_start + i) * c->kv_dim + e;
                kv_set(c, exp, kv_index(c, 2 * ATT_LAYER, row, e), k[src]);
                kv_set(c, exp, kv_index(c, 2 * ATT_LAYER + 1, row, e), v[src]);
            }
        }
    }
}

static void attention_ref(const tstep *s, const kvcache *c, const void *cache, const float *q,
                          int nh, int nkv, int hd, float *out) {
    int group = nh / nkv;
    double *sc = malloc(sizeof(double) * 4096);
    for (int qi = 0; qi < s->st.n_seqs; qi++) {
        const specd_step_seq *sq = &s->seqs[qi];
        for (int i = 0; i < sq->n_new; i++) {
            int t = sq->tok_start + i, n_rows = sq->n_past + i + 1;
            assert_true(n_rows <= 4096);
            for (int h = 0; h < nh; h++) {
                int kvh = h / group;
                const float *qv = q + ((size_t)t * nh + h) * hd;
                double mx = -INFINITY;
                for (int r = 0; r < n_rows; r++) {
                    int vis = r < sq->n_past || !sq->mask ||
                              sq->mask[(size_t)i * sq->n_new + (r - sq->n_past)];
                    if (!vis) {
                        sc[r] = -INFINITY;
                        continue;
                    }
                    int64_t row = phys_row(sq, r);
                    double dot = 0;
                    for (int d = 0; d < hd; d++)
                        dot += (double)qv[d] *
                               kv_get(c, cache, kv_index(c, 2 * ATT_LAYER, row, kvh * hd + d));
                    sc[r] = dot / sqrt((double)hd);
                    if (sc[r] > mx) mx = sc[r];
                }
                double sum = 0;
                for (int r = 0; r < n_rows; r++) {
                    sc[r] = sc[r] == -INFINITY ? 0 : exp(sc[r] - mx);
                    sum += sc[r];
                }
                float *o = out + ((size_t)t * nh + h) * hd;
                for (int d = 0; d < hd; d++) {
                    double acc = 0;
                    for (int r = 0; r < n_rows; r++)
                        if (sc[r] != 0)
                            acc += sc[r] * kv_get(c, cache,
                                                  kv_index(c, 2 * ATT_LAYER + 1, phys_row(sq, r),
                                                           kvh * hd + d));
                    o[d] = (float)(acc / sum);
                }
            }
        }
    }
    free(sc);
}

/* Where the caches differ, as a message: pool, physical row, element. */
static void expect_cache_equal(const char *what, const kvcache *c, const void *got,
                               const void *want) {
    if (!memcmp(got, want, c->bytes)) return;
    size_t n = c->bytes / c->elem;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)got + i * c->elem, (const char *)want + i * c->elem, c->elem)) {
            size_t per_pool = (size_t)c->n_rows * c->kv_dim;
            fail_msg("%s: KV cache differs at pool %zu (layer %zu %s) physical row %zu element "
                     "%zu: got %.9g, want %.9g",
                     what, i / per_pool, i / per_pool / 2, (i / per_pool) % 2 ? "V" : "K",
                     (i % per_pool) / c->kv_dim, i % c->kv_dim, (double)kv_get(c, got, i),
                     (double)kv_get(c, want, i));
        }
}

/* Trees of 4 nodes: 0 root; 1, 2 children of 0; 3 child of 1. */
static const int k_tree4[4] = {-1, 0, 0, 1};

static void test_attention(void **state) {
    (void)state;
    /* step 1: n_past 0/5/37, n_new 1/4 (tree)/7 (causal), pages out of order */
    static const int32_t p10[] = {5}, p11[] = {2}, p12[] = {9, 4, 7};
    const seq_spec step1[3] = {{0, 1, NULL, p10}, {5, 4, k_tree4, p11}, {37, 7, NULL, p12}};
    /* step 2: a long decode (19 shuffled pages, so a GPU splits the rows over
     * several blocks) and a tree whose rows cross a page boundary */
    int32_t p20[19], p21[2];
    for (int i = 0; i < 19; i++) p20[i] = (i * 7 + 3) % ATT_PAGES;
    for (int i = 0; i < 2; i++) p21[i] = ((19 + i) * 7 + 3) % ATT_PAGES;
    const seq_spec step2[2] = {{300, 1, NULL, p20}, {14, 4, k_tree4, p21}};
    const struct {
        int nh, nkv, hd;
    } cfgs[] = {{4, 2, 16}, {4, 4, 16}, {4, 2, 64}, {4, 4, 64}, {4, 2, 128}, {4, 4, 128}};
    const specd_dtype kv_types[] = {SPECD_F32, SPECD_F16};
    int gpu = have_gpu("attention");
    tstep *s = malloc(sizeof *s);
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        int nh = cfgs[ci].nh, nkv = cfgs[ci].nkv, hd = cfgs[ci].hd, kvd = nkv * hd;
        for (int ki = 0; ki < 2; ki++) {
            for (int si = 0; si < 2; si++) {
                if (si == 0)
                    tstep_init(s, 3, step1, 16, 7, 100);
                else
                    tstep_init(s, 2, step2, 16, 8, 100);
                int nt = s->st.n_tokens;
                uint64_t seed = 600 + 100 * ci + 10 * ki + si;
                kvcache c;
                kv_init(&c, kv_types[ki], ATT_LAYERS, kvd, (int64_t)ATT_PAGES * SPECD_KV_PAGE_ROWS,
                        seed);
                size_t nq = (size_t)nt * nh * hd, nk = (size_t)nt * kvd;
                float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk);
                float *v = malloc(sizeof(float) * nk);
                test_fill_random(q, nq, seed + 1, 2.0f); /* scores of order 1: a peaked softmax */
                test_fill_random(k, nk, seed + 2, 1.0f);
                test_fill_random(v, nk, seed + 3, 1.0f);
                void *exp_cache = malloc(c.bytes), *got_cache = malloc(c.bytes);
                void *g_cache = malloc(c.bytes);
                float *want = malloc(sizeof(float) * nq), *got = malloc(sizeof(float) * nq);
                float *g = malloc(sizeof(float) * nq);
                attention_expected_cache(s, &c, k, v, exp_cache);
                attention_ref(s, &c, exp_cache, q, nh, nkv, hd, want);

                char what[160];
                snprintf(what, sizeof what, "cpu attention step %d heads %d/%d hd %d kv %s", si + 1,
                         nh, nkv, hd, kv_types[ki] == SPECD_F16 ? "F16" : "F32");
                cpu_kv(kv_types[ki]);
                run_attention(g_cpu, s, &c, q, k, v, nh, nkv, hd, got, got_cache);
                cpu_kv(SPECD_F32);
                expect_cache_equal(what, &c, got_cache, exp_cache);
                expect_close(what, got, want, nq, 3e-5, 0);
                for (int gi = 0; gpu && gi < N_GPU; gi++) {
                    if (g_gpu[gi]->kv_type != kv_types[ki]) continue;
                    run_attention(g_gpu[gi], s, &c, q, k, v, nh, nkv, hd, g, g_cache);
                    snprintf(what, sizeof what, "%s attention step %d heads %d/%d hd %d vs cpu",
                             k_gpu_name[gi], si + 1, nh, nkv, hd);
                    expect_cache_equal(what, &c, g_cache, got_cache);
                    expect_close(what, g, got, nq, 3e-5, 0);
                }
                free(c.host);
                free(q);
                free(k);
                free(v);
                free(exp_cache);
                free(got_cache);
                free(g_cache);
                free(want);
                free(got);
                free(g);
            }
        }
    }
    if (gpu)
        for (int ki = 0; ki < 2; ki++) {
            int found = 0;
            for (int gi = 0; gi < N_GPU; gi++) found |= g_gpu[gi]->kv_type == kv_types[ki];
            if (!found)
                fail_msg("no CUDA backend has KV type %s (default and kv_f32 should give F16 "
                         "and F32)",
                         kv_types[ki] == SPECD_F16 ? "F16" : "F32");
        }
    free(s);
}

/* Attention's query blocks are bitwise the per-token kernels: every token of
 * a long causal chunk (blocks of 8 queries over hundreds of committed rows,
 * past the V tiles' and the 4-row dot groups' edges) gets the same bits as
 * the same token decoded alone over the same rows, on every SIMD path this
 * CPU has, for head sizes the block kernels take (64, 128) and one they
 * leave to the per-query loop (16), with fp32 and with fp16 KV rows (whose
 * paged kernels widen rows into buffers: a chunk token mixes them with the
 * per-row kernels, a lone token uses them alone). Batch invariance of a
 * whole model (test_batch_invariance) rests on this. */
static void test_attention_blocks_bitwise(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    /* N = 90: 5 blocks of 16 tokens and one of 10, each block with its KV
     * head's 3 query heads in one task (cpu_backend.c's heads_per_task):
     * 48 queries, three sets of 16 lanes on the AVX-512 K side
     * (dots_qlanes), and 30 in the last. N = 85: the last block's 5 tokens
     * are 15 queries whose V pass ends with a group of 3 (vec_avx2.c's
     * axpys_tile_one64). Alone, a token is a decode step, and its KV
     * head's 3 heads are one task too. A chain
     * of 5 of its tokens verified as a tree (masked: its own rows go one by
     * one after the paged ones) must give the chunk's bits as well. 9 heads
     * on 3 KV heads, SmolLM2's shape: 3 tasks for the 2 threads; 9 on 9
     * (MHA), where a token alone is a one-query task; and 16 on 2 (groups
     * of 8), where a 16-token block takes 4 of its group's heads (64
     * queries, four sets of lanes) and a block of up to 8 tokens all 8. */
    enum { P = 230 };
    static const int n_chunk[] = {90, 85};
    int32_t pages[ATT_PAGES];
    for (int i = 0; i < ATT_PAGES; i++) pages[i] = (i * 5 + 2) % ATT_PAGES; /* out of order */
    const int hds[] = {64, 128, 16};
    tstep *big = malloc(sizeof *big), *one = malloc(sizeof *one);
    int tested = 0, cross_checked = 0;
    const specd_dtype kvts[] = {SPECD_F32, SPECD_F16};
    float *avx2_out[8 * sizeof hds / sizeof hds[0]] = {0};
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!cpu_simd_force(paths[pi])) continue;
        tested++;
        for (size_t ci = 0; ci < 8 * sizeof hds / sizeof hds[0]; ci++) {
            size_t hi = ci / 8;
            specd_dtype kvt = kvts[ci % 2];
            const int kind = (int)(ci / 2) % 4;
            const int N = n_chunk[kind == 1 || kind == 2 ? 1 : 0];
            /* the third pair: one KV head per query head (MHA), so a token
             * alone is a one-query task (vec_avx2.c's kv_axpys); the
             * fourth: groups of 8, split in two tasks per 16-token block */
            int mha = kind == 2, wide = kind == 3;
            int nh = wide ? 16 : 9, nkv = mha ? 9 : wide ? 2 : 3;
            int hd = hds[hi], kvd = nkv * hd, qw = nh * hd;
            /* the same inputs on every path: the AVX-512 and AVX-VNNI sets'
             * chunk output is compared with the AVX2 set's below */
            uint64_t seed = 900 + 10 * hi + (uint64_t)N + 100 * (uint64_t)mha + 1000 * (uint64_t)wide;
            kvcache c;
            cpu_kv(kvt);
            kv_init(&c, kvt, ATT_LAYERS, kvd, (int64_t)ATT_PAGES * SPECD_KV_PAGE_ROWS, seed);
            const seq_spec sp = {P, N, NULL, pages};
            tstep_init(big, 1, &sp, 16, 7, 100);
            float *q = malloc(sizeof(float) * N * qw), *k = malloc(sizeof(float) * N * kvd);
            float *v = malloc(sizeof(float) * N * kvd), *out = malloc(sizeof(float) * N * qw);
            float *row = malloc(sizeof(float) * qw);
            void *after = malloc(c.bytes), *after1 = malloc(c.bytes);
            test_fill_random(q, (size_t)N * qw, seed + 1, 2.0f);
            test_fill_random(k, (size_t)N * kvd, seed + 2, 1.0f);
            test_fill_random(v, (size_t)N * kvd, seed + 3, 1.0f);
            run_attention(g_cpu, big, &c, q, k, v, nh, nkv, hd, out, after);
            /* Every SIMD set above AVX2 keeps AVX2's attention arithmetic
             * (qmatmul_avx512.c: its zmm chains hold AVX2's two 8-lane
             * chains), so a chunk gives the AVX2 set's bits there too. */
            if (!strcmp(paths[pi], "avx2")) {
                free(avx2_out[ci]);
                avx2_out[ci] = malloc(sizeof(float) * (size_t)N * qw);
                memcpy(avx2_out[ci], out, sizeof(float) * (size_t)N * qw);
            } else if (avx2_out[ci]) {
                for (size_t e = 0; e < (size_t)N * qw; e++)
                    if (memcmp(&out[e], &avx2_out[ci][e], sizeof(float)))
                        fail_msg("%s hd %d KV %s chunk %d: element %zu is %.9g, the avx2 set "
                                 "gives %.9g",
                                 paths[pi], hd, kvt == SPECD_F16 ? "f16" : "f32", N, e,
                                 (double)out[e], (double)avx2_out[ci][e]);
                cross_checked++;
            }
            /* each token alone, over the cache the chunk left (its own row
             * stored again with the same values) */
            memcpy(c.host, after, c.bytes);
            for (int i = 0; i < N; i++) {
                const seq_spec s1 = {P + i, 1, NULL, pages};
                tstep_init(one, 1, &s1, 16, 7, 100);
                run_attention(g_cpu, one, &c, q + (size_t)i * qw, k + (size_t)i * kvd,
                              v + (size_t)i * kvd, nh, nkv, hd, row, after1);
                for (int e = 0; e < qw; e++)
                    if (memcmp(&row[e], &out[(size_t)i * qw + e], sizeof(float)))
                        fail_msg("%s hd %d KV %s chunk %d: token %d (row %d) element %d: in the "
                                 "chunk %.9g, alone %.9g",
                                 paths[pi], hd, kvt == SPECD_F16 ? "f16" : "f32", N, i, P + i, e,
                                 (double)out[(size_t)i * qw + e], (double)row[e]);
            }
            /* each run of 5 tokens as a verified chain */
            static const int chain[5] = {-1, 0, 1, 2, 3};
            float *out5 = malloc(sizeof(float) * 5 * qw);
            for (int i = 0; i + 5 <= N; i += 5) {
                const seq_spec s5 = {P + i, 5, chain, pages};
                tstep_init(one, 1, &s5, 16, 7, 100);
                run_attention(g_cpu, one, &c, q + (size_t)i * qw, k + (size_t)i * kvd,
                              v + (size_t)i * kvd, nh, nkv, hd, out5, after1);
                for (int e = 0; e < 5 * qw; e++)
                    if (memcmp(&out5[e], &out[(size_t)i * qw + e], sizeof(float)))
                        fail_msg("%s hd %d KV %s chunk %d: chain at token %d, its token %d "
                                 "element %d: in the chunk %.9g, in the chain %.9g",
                                 paths[pi], hd, kvt == SPECD_F16 ? "f16" : "f32", N, i,
                                 e / qw, e % qw, (double)out[(size_t)i * qw + e],
                                 (double)out5[e]);
            }
            free(out5);
            free(c.host);
            free(q);
            free(k);
            free(v);
            free(out);
            free(row);
            free(after);
            free(after1);
        }
    }
    cpu_simd_force("auto");
    cpu_kv(SPECD_F32);
    assert_true(tested >= 1);
    if (cpu_simd_force("avx512")) { /* the cross-path check ran where it can */
        cpu_simd_force("auto");
        assert_true(cross_checked >= 18);
    }
    for (size_t i = 0; i < sizeof avx2_out / sizeof avx2_out[0]; i++) free(avx2_out[i]);
    free(big);
    free(one);
}

/* A CPU backend of its own with n threads (the attention passes cut their
 * tasks by the thread count), or the test fails with the reason. */
static specd_backend *cpu_threads(int n) {
    specd_error err = {{0}};
    specd_backend_opts o = {.name = "cpu", .n_threads = n};
    specd_backend *be = specd_backend_create(&o, &err);
    if (!be) fail_msg("cpu backend with %d threads: %s", n, err.msg);
    return be;
}

/* A decode step over a long context with more threads than KV heads runs
 * as a split decode (cpu_backend.c: row chunks, softmax per head, slices
 * of head elements); its output and cache must be the one-run pass's bits
 * (the same step on a 1-thread backend, which never splits), on every SIMD
 * path, fp32 and fp16 KV, for GQA (3 heads a KV head), multi-query (9),
 * MHA (one: the per-query kernels) and a 128-wide head (4 slices), at
 * widths on and off page and chunk edges. 4 threads, then 2 (on however
 * many cores): below SPLIT_MIN_ROWS (1,024) and with 4 KV heads, which
 * divide evenly among 4 or 2 threads, it must not split; 3 KV heads on 2
 * threads (one thread would read two heads' rows) must. */
static void test_attention_split_decode(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    static const struct { int nh, nkv, hd, split; } shapes[] = {
        {9, 3, 64, 1}, {9, 1, 64, 1}, {3, 3, 64, 1}, {6, 3, 128, 1}, {8, 4, 64, 0}};
    static const int widths[] = {1024, 1039, 1501, 2000, 1023};
    enum { PAGES = 126 };
    int32_t pages[PAGES];
    for (int i = 0; i < PAGES; i++) pages[i] = (i * 7 + 3) % PAGES; /* out of order */
    specd_backend *one = cpu_threads(1), *four = cpu_threads(4), *two = cpu_threads(2);
    tstep *st = malloc(sizeof *st);
    int tested = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!cpu_simd_force(paths[pi])) continue;
        /* the scalar set has no block kernels: nothing splits there */
        const int can_split = strcmp(paths[pi], "scalar") != 0;
        tested++;
        for (int run = 0; run < 4; run++) /* 4 threads, then 2; fp32 then fp16 KV */
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
                    const int bi = run / 2, f16 = run % 2;
                    const int nh = shapes[si].nh, nkv = shapes[si].nkv, hd = shapes[si].hd;
                    const int width = widths[wi], kvd = nkv * hd, qw = nh * hd;
                    const specd_dtype kvt = f16 ? SPECD_F16 : SPECD_F32;
                    const uint64_t seed = 4000 + 100 * si + 10 * wi + (uint64_t)f16;
                    kvcache c;
                    specd_backend *many = bi ? two : four;
                    one->kv_type = many->kv_type = kvt;
                    kv_init(&c, kvt, ATT_LAYERS, kvd, (int64_t)PAGES * SPECD_KV_PAGE_ROWS, seed);
                    const seq_spec sp = {width - 1, 1, NULL, pages};
                    tstep_init(st, 1, &sp, 16, 7, 100);
                    float *q = malloc(sizeof(float) * qw), *k = malloc(sizeof(float) * kvd);
                    float *v = malloc(sizeof(float) * kvd), *o2 = malloc(sizeof(float) * qw);
                    float *o1 = malloc(sizeof(float) * qw);
                    void *after2 = malloc(c.bytes), *after1 = malloc(c.bytes);
                    test_fill_random(q, (size_t)qw, seed + 1, 2.0f);
                    test_fill_random(k, (size_t)kvd, seed + 2, 1.0f);
                    test_fill_random(v, (size_t)kvd, seed + 3, 1.0f);
                    const long before = cpu_split_decodes(many);
                    run_attention(many, st, &c, q, k, v, nh, nkv, hd, o2, after2);
                    const int want = can_split && shapes[si].split && width >= 1024;
                    if (cpu_split_decodes(many) - before != want)
                        fail_msg("%s %s %d threads nh %d nkv %d hd %d width %d: split %ld times, "
                                 "want %d",
                                 paths[pi], f16 ? "f16" : "f32", bi ? 2 : 4, nh, nkv, hd, width,
                                 cpu_split_decodes(many) - before, want);
                    run_attention(one, st, &c, q, k, v, nh, nkv, hd, o1, after1);
                    assert_int_equal(cpu_split_decodes(one), 0);
                    for (int e = 0; e < qw; e++)
                        if (memcmp(&o1[e], &o2[e], sizeof(float)))
                            fail_msg("%s %s nh %d nkv %d hd %d width %d: element %d is %.9g "
                                     "on %d threads, %.9g on 1",
                                     paths[pi], f16 ? "f16" : "f32", nh, nkv, hd, width, e,
                                     (double)o2[e], bi ? 2 : 4, (double)o1[e]);
                    assert_memory_equal(after1, after2, c.bytes);
                    free(c.host), free(q), free(k), free(v), free(o1), free(o2);
                    free(after1), free(after2);
                }
    }
    cpu_simd_force("auto");
    assert_true(tested >= 1);
    free(st);
    one->ops->destroy(one);
    four->ops->destroy(four);
    two->ops->destroy(two);
}

/* In a step of several sequences, one whose new tokens are one query
 * block (a decode token, a tree, a short prompt chunk) runs as one
 * attention task, its KV heads in turn (cpu_backend.c, cpu_attention),
 * where the step's tasks share out evenly among the threads: as many as
 * the threads or at least twice as many (2 or 4 decode sequences on 2
 * threads, 4 on 4; not 3 decode sequences on either; and beside a
 * 20-token chunk, whose two query blocks keep a task per KV head). Each
 * sequence's output must be its bits alone (the same sequence as a step
 * of its own on a 1-thread backend), and the cache after must hold
 * exactly the step's rows, on every SIMD path, fp32 and fp16 KV, GQA (3
 * heads a KV head) and MHA, whichever way the tasks were cut. */
static void test_attention_seq_tasks(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    static const struct { int nh, nkv; } shapes[] = {{9, 3}, {4, 4}};
    enum { HD = 64, PAGES = 300, PER_SEQ = 72 };
    static const int chain3[3] = {-1, 0, 1};
    int32_t pages[PAGES];
    for (int i = 0; i < PAGES; i++) pages[i] = (i * 11 + 5) % PAGES; /* out of order */
    /* sequence specs, each with pages of its own */
    const seq_spec all[6] = {{1100, 1, NULL, pages},
                             {37, 1, NULL, pages + PER_SEQ},
                             {300, 4, k_tree4, pages + 2 * PER_SEQ},
                             {0, 7, NULL, pages + 3 * PER_SEQ},
                             {515, 3, chain3, pages + 3 * PER_SEQ},
                             {60, 20, NULL, pages + 2 * PER_SEQ}};
    static const struct { int idx[4], n; } batches[] = {
        {{0, 1}, 2}, {{0, 1, 2}, 3}, {{0, 1, 2, 3}, 4}, {{1, 2, 4}, 3}, {{0, 2, 1, 4}, 4},
        {{0, 1, 5}, 3}, {{0, 1, 5, 3}, 4}};
    specd_backend *one = cpu_threads(1), *two = cpu_threads(2), *four = cpu_threads(4);
    tstep *st = malloc(sizeof *st), *alone = malloc(sizeof *alone);
    int tested = 0, whole_runs = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!cpu_simd_force(paths[pi])) continue;
        tested++;
        for (int run = 0; run < 4; run++) /* 2 threads, then 4; fp32 then fp16 KV */
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                    const int threads = run < 2 ? 2 : 4, f16 = run % 2;
                    const int nh = shapes[si].nh, nkv = shapes[si].nkv;
                    const int kvd = nkv * HD, qw = nh * HD, n = batches[bi].n;
                    const specd_dtype kvt = f16 ? SPECD_F16 : SPECD_F32;
                    const uint64_t seed = 5000 + 100 * si + 10 * bi + (uint64_t)run;
                    specd_backend *many = threads == 2 ? two : four;
                    one->kv_type = many->kv_type = kvt;
                    seq_spec spec[4];
                    int whole = 0, others = 0; /* cpu_attention's count of its tasks */
                    for (int q = 0; q < n; q++) {
                        spec[q] = all[batches[bi].idx[q]];
                        if (spec[q].n_new <= 16) whole++;
                        else others += nkv * ((spec[q].n_new + 15) / 16);
                    }
                    kvcache c;
                    kv_init(&c, kvt, ATT_LAYERS, kvd, (int64_t)PAGES * SPECD_KV_PAGE_ROWS, seed);
                    tstep_init(st, n, spec, 16, 7, 100);
                    const int nt = st->st.n_tokens;
                    float *q = malloc(sizeof(float) * nt * qw), *k = malloc(sizeof(float) * nt * kvd);
                    float *v = malloc(sizeof(float) * nt * kvd), *o = malloc(sizeof(float) * nt * qw);
                    float *o1 = malloc(sizeof(float) * nt * qw);
                    void *after = malloc(c.bytes), *want_cache = malloc(c.bytes);
                    void *after1 = malloc(c.bytes);
                    test_fill_random(q, (size_t)nt * qw, seed + 1, 2.0f);
                    test_fill_random(k, (size_t)nt * kvd, seed + 2, 1.0f);
                    test_fill_random(v, (size_t)nt * kvd, seed + 3, 1.0f);
                    const long before = cpu_attention_seq_tasks(many);
                    run_attention(many, st, &c, q, k, v, nh, nkv, HD, o, after);
                    const int want = whole > 0 && (whole + others == threads ||
                                                   whole + others >= 2 * threads);
                    if (cpu_attention_seq_tasks(many) - before != want)
                        fail_msg("%s %d threads, batch %zu of %d: %ld passes with a task per "
                                 "sequence, want %d",
                                 paths[pi], threads, bi, n, cpu_attention_seq_tasks(many) - before,
                                 want);
                    whole_runs += want;
                    attention_expected_cache(st, &c, k, v, want_cache);
                    assert_memory_equal(after, want_cache, c.bytes);
                    /* each sequence alone, from the same cache, on one thread */
                    for (int sq = 0; sq < n; sq++) {
                        const int t0 = st->seqs[sq].tok_start, nn = st->seqs[sq].n_new;
                        tstep_init(alone, 1, &spec[sq], 16, 7, 100);
                        run_attention(one, alone, &c, q + (size_t)t0 * qw, k + (size_t)t0 * kvd,
                                      v + (size_t)t0 * kvd, nh, nkv, HD, o1, after1);
                        for (int e = 0; e < nn * qw; e++)
                            if (memcmp(&o1[e], &o[(size_t)t0 * qw + e], sizeof(float)))
                                fail_msg("%s %s %d threads nh %d nkv %d, batch %zu: sequence %d "
                                         "element %d is %.9g in the batch, %.9g alone",
                                         paths[pi], f16 ? "f16" : "f32", threads, nh, nkv, bi, sq,
                                         e, (double)o[(size_t)t0 * qw + e], (double)o1[e]);
                    }
                    free(c.host), free(q), free(k), free(v), free(o), free(o1);
                    free(after), free(want_cache), free(after1);
                }
    }
    cpu_simd_force("auto");
    assert_true(tested >= 1);
    assert_true(whole_runs > 0);
    free(st);
    free(alone);
    one->ops->destroy(one);
    two->ops->destroy(two);
    four->ops->destroy(four);
}

/* An fp16 cache stores each new K/V element exactly as specd_f32_to_fp16
 * rounds it (to nearest, ties to even, subnormals, overflow to inf) on
 * every SIMD path (the AVX2 set stores with F16C): the new row of a
 * 1-token step holding those cases, against the cache built with the
 * scalar rounding. */
static void test_kv_f16_store(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    const float edge[] = {0.0f,          -0.0f,          1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                          -(1.0f + 0x1p-11f), 0x1p-24f,  0x1p-25f,        0x1.8p-25f,
                          3 * 0x1p-25f,  6.1e-5f,        6.2e-5f,         65504.0f,
                          65519.0f,      65520.0f,       -70000.0f,       INFINITY,
                          -INFINITY,     1e-30f,         -3.3333333f,     0.1f};
    const int ne = (int)(sizeof edge / sizeof edge[0]);
    enum { P = 21, NH = 2, NKV = 1, HD = 64 };
    int32_t pages[ATT_PAGES];
    for (int i = 0; i < ATT_PAGES; i++) pages[i] = (i * 5 + 2) % ATT_PAGES;
    tstep *one = malloc(sizeof *one);
    float q[NH * HD], k[NKV * HD], v[NKV * HD], out[NH * HD];
    test_fill_random(q, NH * HD, 41, 1.0f);
    for (int e = 0; e < NKV * HD; e++) {
        k[e] = edge[e % ne] * (e / ne % 2 ? -1.0f : 1.0f);
        v[e] = edge[(e + 7) % ne];
    }
    int tested = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!cpu_simd_force(paths[pi])) continue;
        tested++;
        kvcache c;
        cpu_kv(SPECD_F16);
        kv_init(&c, SPECD_F16, ATT_LAYERS, NKV * HD, (int64_t)ATT_PAGES * SPECD_KV_PAGE_ROWS, 7);
        const seq_spec sp = {P, 1, NULL, pages};
        tstep_init(one, 1, &sp, 16, 7, 100);
        void *after = malloc(c.bytes), *exp = malloc(c.bytes);
        run_attention(g_cpu, one, &c, q, k, v, NH, NKV, HD, out, after);
        attention_expected_cache(one, &c, k, v, exp);
        for (size_t i = 0; i < c.bytes / 2; i++)
            if (((uint16_t *)after)[i] != ((uint16_t *)exp)[i])
                fail_msg("%s: fp16 cache element %zu is 0x%04x, specd_f32_to_fp16 gives 0x%04x",
                         paths[pi], i, ((uint16_t *)after)[i], ((uint16_t *)exp)[i]);
        free(after);
        free(exp);
        free(c.host);
    }
    cpu_simd_force("auto");
    cpu_kv(SPECD_F32);
    assert_true(tested >= 1);
    free(one);
}

/* A Q8_0 cache (backend.h: CPU only; kernels/cpu/kv_q8.c): every query is
 * quantized as the integer matmuls quantize activations and scored by
 * integer dots against the int8 rows, the V side is fp32 over the
 * dequantized rows. Checked for prompt chunks over 300 rows (past the
 * 128- and 256-row V chunks cpu_backend.c dequantizes at a time), a decode
 * step, trees and a batch of sequences, in GQA, MHA and 32- and 128-wide
 * heads:
 *   - against attention_ref in double precision on the dequantized cache
 *     with each query replaced by its quantized values (that is the
 *     arithmetic's definition up to fp32 rounding);
 *   - every SIMD path against AVX2, bit for bit;
 *   - the cache after: the step's rows stored as cpu_quantize_row_q8_0
 *     rounds them, nothing else touched. */
static void test_attention_q8_cache(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    static const struct { int nh, nkv, hd; } shapes[] = {{9, 3, 64}, {9, 9, 64}, {16, 2, 128}, {4, 2, 32}};
    int32_t pages[ATT_PAGES];
    for (int i = 0; i < ATT_PAGES; i++) pages[i] = (i * 5 + 2) % ATT_PAGES; /* out of order */
    static const int chain5[5] = {-1, 0, 1, 2, 3};
    const seq_spec chunk = {300, 40, NULL, pages}, decode = {339, 1, NULL, pages};
    const seq_spec batch[3] = {{300, 1, NULL, pages}, {5, 4, k_tree4, pages + 20}, {0, 7, NULL, pages + 21}};
    const seq_spec tree = {290, 5, chain5, pages};
    const struct { const seq_spec *sp; int n; const char *name; } steps[] = {
        {&chunk, 1, "chunk of 40 after 300"}, {&decode, 1, "decode after 339"},
        {batch, 3, "batch of a decode, a tree and a prompt"}, {&tree, 1, "chain of 5 after 290"}};
    const int64_t n_rows = (int64_t)ATT_PAGES * SPECD_KV_PAGE_ROWS;
    tstep *st = malloc(sizeof *st);
    for (size_t hi = 0; hi < sizeof shapes / sizeof shapes[0]; hi++)
        for (size_t si = 0; si < sizeof steps / sizeof steps[0]; si++) {
            const int nh = shapes[hi].nh, nkv = shapes[hi].nkv, hd = shapes[hi].hd;
            const int kvd = nkv * hd, qw = nh * hd;
            const uint64_t seed = 7000 + 10 * hi + si;
            tstep_init(st, steps[si].n, steps[si].sp, 16, 7, 100);
            const int nt = st->st.n_tokens;
            const size_t rb = specd_kv_row_bytes(SPECD_Q8_0, kvd);
            const size_t n_all = 2 * (size_t)ATT_LAYERS * (size_t)n_rows;
            kvcache q8 = {.bytes = n_all * rb, .n_layers = ATT_LAYERS, .kv_dim = kvd, .n_rows = n_rows};
            kvcache f32 = {.elem = 4, .bytes = n_all * kvd * 4, .n_layers = ATT_LAYERS,
                           .kv_dim = kvd, .n_rows = n_rows};
            q8.host = malloc(q8.bytes);
            float *row = malloc(sizeof(float) * kvd);
            for (size_t r = 0; r < n_all; r++) {
                test_fill_random(row, (size_t)kvd, seed * 1000003 + r, 1.0f);
                cpu_quantize_row_q8_0(row, (char *)q8.host + r * rb, kvd);
            }
            float *q = malloc(sizeof(float) * nt * qw), *k = malloc(sizeof(float) * nt * kvd);
            float *v = malloc(sizeof(float) * nt * kvd);
            test_fill_random(q, (size_t)nt * qw, seed + 1, 2.0f);
            test_fill_random(k, (size_t)nt * kvd, seed + 2, 1.0f);
            test_fill_random(v, (size_t)nt * kvd, seed + 3, 1.0f);
            /* the cache the step must leave: its rows quantized in place */
            char *want_cache = malloc(q8.bytes);
            memcpy(want_cache, q8.host, q8.bytes);
            for (int sq = 0; sq < st->st.n_seqs; sq++) {
                const specd_step_seq *s = &st->seqs[sq];
                for (int i = 0; i < s->n_new; i++) {
                    const size_t row_k = (size_t)(2 * ATT_LAYER) * n_rows + phys_row(s, s->n_past + i);
                    const size_t row_v = row_k + (size_t)n_rows;
                    cpu_quantize_row_q8_0(k + (size_t)(s->tok_start + i) * kvd, want_cache + row_k * rb, kvd);
                    cpu_quantize_row_q8_0(v + (size_t)(s->tok_start + i) * kvd, want_cache + row_v * rb, kvd);
                }
            }
            /* the reference: that cache's values in fp32, and each query's
             * quantized values, in double precision */
            f32.host = malloc(f32.bytes);
            for (size_t r = 0; r < n_all; r++)
                cpu_dequant_row_ref(SPECD_Q8_0, want_cache + r * rb, (float *)f32.host + r * kvd, kvd);
            const int nbq = qw / 32;
            int8_t *qi = malloc((size_t)nt * qw);
            float *qd = malloc(sizeof(float) * nt * nbq), *qs = malloc(sizeof(float) * nt * nbq);
            int32_t *qsum = malloc(sizeof(int32_t) * nt * nbq);
            float *qdq = malloc(sizeof(float) * nt * qw), *want = malloc(sizeof(float) * nt * qw);
            cpu_quantize_act(q, nt, qw, qi, qd, qs, qsum);
            for (size_t e = 0; e < (size_t)nt * qw; e++) qdq[e] = (float)qi[e] * qd[e / 32];
            attention_ref(st, &f32, f32.host, qdq, nh, nkv, hd, want);
            float *o8 = malloc(sizeof(float) * nt * qw), *base = malloc(sizeof(float) * nt * qw);
            void *after8 = malloc(q8.bytes);
            int tested = 0, simd_tested = 0;
            char what[200];
            for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
                if (!cpu_simd_force(paths[pi])) continue;
                cpu_kv(SPECD_Q8_0);
                run_attention(g_cpu, st, &q8, q, k, v, nh, nkv, hd, o8, after8);
                cpu_kv(SPECD_F32);
                snprintf(what, sizeof what, "%s heads %d/%d hd %d, %s", paths[pi], nh, nkv, hd,
                         steps[si].name);
                expect_close(what, o8, want, (size_t)nt * qw, 3e-5, 0);
                tested++;
                /* the SIMD sets share one softmax and V arithmetic (the
                 * scalar set's expf is not theirs) */
                if (strcmp(paths[pi], "scalar") && !simd_tested++)
                    memcpy(base, o8, sizeof(float) * nt * qw);
                for (int e = 0; strcmp(paths[pi], "scalar") && e < nt * qw; e++)
                    if (memcmp(&o8[e], &base[e], sizeof(float)))
                        fail_msg("%s: token %d element %d is %.9g, on avx2 %.9g", what, e / qw,
                                 e % qw, (double)o8[e], (double)base[e]);
                for (size_t r = 0; r < n_all; r++)
                    if (memcmp((char *)after8 + r * rb, want_cache + r * rb, rb))
                        fail_msg("%s: Q8_0 cache row %zu (of all layers' pools) is not the "
                                 "expected blocks",
                                 what, r);
            }
            cpu_simd_force("auto");
            assert_true(tested >= 1);
            free(q8.host), free(f32.host), free(row), free(q), free(k), free(v), free(want_cache);
            free(qi), free(qd), free(qs), free(qsum), free(qdq), free(want), free(o8), free(base);
            free(after8);
        }
    free(st);
}

/* The CUDA backend has no Q8_0 cache: asking for one is a clear error
 * naming the setting, whether or not a GPU or nvcc is here. */
static void test_kv_q8_0_cuda_refused(void **state) {
    (void)state;
    specd_error err = {{0}};
    specd_backend_opts o = {.name = "cuda", .kv_dtype = SPECD_KV_Q8_0};
    assert_null(specd_backend_create(&o, &err));
    if (!strstr(err.msg, "'q8_0' is CPU only")) fail_msg("unexpected error: %s", err.msg);
}

/* cpu_quantize_row_q8_0 is llama.cpp's reference quantizer (ggml-quants.c,
 * quantize_row_q8_0_ref): worked values, an all-zero block (d = 0, every
 * q 0), a half-way value rounded away from zero, and a NaN stored as 0. */
static void test_quantize_q8_0(void **state) {
    (void)state;
    float x[64] = {0};
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16) * 0.25f; /* -4 .. 3.75 */
    x[5] = 0.5f * 4.0f / 127.0f * 3.0f; /* 1.5 steps of d = 4/127: rounds to 2 */
    x[40] = NAN;
    x[41] = -1.0f;
    uint8_t b[68];
    cpu_quantize_row_q8_0(x, b, 64);
    uint16_t d0, d1;
    memcpy(&d0, b, 2);
    memcpy(&d1, b + 34, 2);
    assert_int_equal(d0, specd_f32_to_fp16(4.0f / 127.0f));
    assert_int_equal((int8_t)b[2 + 0], -127);                 /* -4 / d */
    assert_int_equal((int8_t)b[2 + 31], (int)roundf(3.75f * 127.0f / 4.0f)); /* 119 */
    assert_int_equal((int8_t)b[2 + 5], 2);                    /* 1.5 away from zero */
    assert_int_equal((int8_t)b[2 + 16], 0);
    assert_int_equal(d1, specd_f32_to_fp16(1.0f / 127.0f));
    assert_int_equal((int8_t)b[34 + 2 + 8], 0);   /* the NaN */
    assert_int_equal((int8_t)b[34 + 2 + 9], -127); /* -1 / d */
    float z[32] = {0};
    cpu_quantize_row_q8_0(z, b, 32);
    for (int j = 0; j < 34; j++) assert_int_equal(b[j], 0);
}

/* --- swiglu / axpy / scale ------------------------------------------------- */

enum { EW_N = 1001 };

typedef enum { EW_SWIGLU, EW_SWIGLU_INPLACE, EW_AXPY, EW_SCALE } ew_op;

static void run_ew(specd_backend *be, ew_op op, const float *a, const float *b, float alpha,
                   float *out) {
    size_t bytes = sizeof(float) * EW_N;
    float *da = dput(be, a, bytes), *db = dput(be, b, bytes), *dout = NULL;
    switch (op) {
    case EW_SWIGLU:
        dout = dput(be, NULL, bytes);
        be->ops->swiglu(be, dout, da, db, EW_N);
        break;
    case EW_SWIGLU_INPLACE: /* the transformer's call: out == gate */
        be->ops->swiglu(be, da, da, db, EW_N);
        break;
    case EW_AXPY: be->ops->axpy(be, da, alpha, db, EW_N); break;
    case EW_SCALE: be->ops->scale(be, da, alpha, EW_N); break;
    }
    dget(be, out, dout ? dout : da, bytes);
    finish_ok(be, "elementwise");
    if (dout) dfree(be, dout);
    dfree(be, da);
    dfree(be, db);
}

static void test_elementwise(void **state) {
    (void)state;
    float a[EW_N], b[EW_N], want[EW_N], got[EW_N], g[EW_N];
    double scale[EW_N];
    test_fill_random(a, EW_N, 700, 8.0f);
    test_fill_random(b, EW_N, 701, 2.0f);
    const float alpha = 0.37f, beta = -1.75f;
    int gpu = have_gpu("swiglu/axpy/scale");
    static const char *const names[] = {"swiglu", "swiglu in place", "axpy", "scale"};
    for (int op = EW_SWIGLU; op <= EW_SCALE; op++) {
        float al = op == EW_AXPY ? alpha : beta;
        for (int i = 0; i < EW_N; i++) {
            double x = a[i], y = b[i];
            switch (op) {
            case EW_SWIGLU:
            case EW_SWIGLU_INPLACE:
                want[i] = (float)(x / (1.0 + exp(-x)) * y);
                scale[i] = fabs(want[i]);
                break;
            case EW_AXPY: /* y = a + alpha * b (a is the accumulator here) */
                want[i] = (float)(x + (double)al * y);
                scale[i] = fabs(x) + fabs((double)al * y);
                break;
            case EW_SCALE:
                want[i] = (float)(x * al);
                scale[i] = 0;
                break;
            }
        }
        run_ew(g_cpu, (ew_op)op, a, b, al, got);
        char what[64];
        snprintf(what, sizeof what, "cpu %s", names[op]);
        if (op == EW_SCALE)
            expect_equal_f(what, got, want, EW_N);
        else
            expect_close_scaled(what, got, want, scale, EW_N, 1e-5);
        for (int gi = 0; gpu && gi < N_GPU; gi++) {
            run_ew(g_gpu[gi], (ew_op)op, a, b, al, g);
            snprintf(what, sizeof what, "%s %s vs cpu", k_gpu_name[gi], names[op]);
            if (op == EW_SCALE)
                expect_equal_f(what, g, got, EW_N);
            else
                expect_close_scaled(what, g, got, scale, EW_N, 1e-5);
        }
    }
}

/* --- gather_out ------------------------------------------------------------- */

static void run_gather(specd_backend *be, const tstep *s, const float *src, int width, float *out) {
    size_t sb = sizeof(float) * (size_t)s->st.n_tokens * width;
    size_t ob = sizeof(float) * (size_t)s->st.n_out * width;
    float *dsrc = dput(be, src, sb), *dout = dput(be, NULL, ob);
    begin_ok(be, &s->st);
    be->ops->gather_out(be, dout, dsrc, width);
    dget(be, out, dout, ob);
    finish_ok(be, "gather_out");
    dfree(be, dsrc);
    dfree(be, dout);
}

static void test_gather_out(void **state) {
    (void)state;
    static const int32_t p10[] = {5}, p11[] = {2}, p12[] = {9, 4, 7};
    const seq_spec sp[3] = {{0, 1, NULL, p10}, {5, 4, k_tree4, p11}, {37, 7, NULL, p12}};
    tstep *s = malloc(sizeof *s);
    tstep_init(s, 3, sp, 16, 9, 100);
    const int32_t rows[5] = {11, 0, 5, 5, 3};
    tstep_out(s, 5, rows);
    enum { W = 70 };
    float src[12 * W], want[5 * W], got[5 * W], g[5 * W];
    test_fill_random(src, 12 * W, 800, 1.0f);
    for (int i = 0; i < 5; i++) memcpy(want + i * W, src + rows[i] * W, sizeof(float) * W);
    run_gather(g_cpu, s, src, W, got);
    expect_equal_f("cpu gather_out", got, want, 5 * W);
    if (have_gpu("gather_out"))
        for (int gi = 0; gi < N_GPU; gi++) {
            run_gather(g_gpu[gi], s, src, W, g);
            expect_equal_f(k_gpu_name[gi], g, got, 5 * W);
        }
    free(s);
}

/* --- argmax ------------------------------------------------------------------- */

static int32_t argmax_ref(const float *x, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (x[i] != x[i]) continue; /* NaN */
        if (best < 0 || x[i] > x[best]) best = i;
    }
    return best < 0 ? 0 : best;
}

static void run_argmax(specd_backend *be, const float *x, int rows, int width, int32_t *ids) {
    float *dx = dput(be, x, sizeof(float) * (size_t)rows * width);
    int32_t *dids = dput(be, NULL, sizeof(int32_t) * (size_t)rows);
    be->ops->argmax(be, dids, dx, rows, width);
    dget(be, ids, dids, sizeof(int32_t) * (size_t)rows);
    finish_ok(be, "argmax");
    dfree(be, dx);
    dfree(be, dids);
}

static void test_argmax(void **state) {
    (void)state;
    enum { W = 4099, R = 9 };
    float *x = malloc(sizeof(float) * R * W);
    test_fill_random(x, (size_t)R * W, 900, 1.0f);
    float *row;
    /* 1: ties -> the lowest index */
    row = x + 1 * W;
    row[3000] = row[17] = row[2048] = 5.0f;
    /* 2: NaNs (one first) never win; the max is the last element */
    row = x + 2 * W;
    row[0] = NAN;
    for (int i = 100; i < 111; i++) row[i] = NAN;
    row[W - 1] = 2.0f;
    /* 3: all -inf -> 0 */
    row = x + 3 * W;
    for (int i = 0; i < W; i++) row[i] = -INFINITY;
    /* 4: all NaN -> 0 */
    row = x + 4 * W;
    for (int i = 0; i < W; i++) row[i] = NAN;
    /* 5: NaN then -inf everywhere -> 1 */
    row = x + 5 * W;
    for (int i = 0; i < W; i++) row[i] = -INFINITY;
    row[0] = NAN;
    /* 6: +inf twice among NaNs -> the first +inf */
    row = x + 6 * W;
    for (int i = 0; i < W; i += 2) row[i] = NAN;
    row[4000] = row[1025] = INFINITY;
    /* 7: equal maxima at warp and block-stride boundaries */
    row = x + 7 * W;
    row[1056] = row[1024] = row[32] = 9.0f;
    /* 8: -0.0 and +0.0 are equal: the first wins */
    row = x + 8 * W;
    for (int i = 0; i < W; i++) row[i] = -1.0f - fabsf(row[i]);
    row[9] = 0.0f;
    row[5] = -0.0f;
    const int32_t expect_fixed[R] = {-1, 17, W - 1, 0, 0, 1, 1025, 32, 5};
    int32_t want[R], got[R], g[R];
    for (int r = 0; r < R; r++) {
        want[r] = argmax_ref(x + (size_t)r * W, W);
        if (expect_fixed[r] >= 0 && want[r] != expect_fixed[r])
            fail_msg("argmax_ref row %d: %d, constructed to be %d", r, want[r], expect_fixed[r]);
    }
    run_argmax(g_cpu, x, R, W, got);
    for (int r = 0; r < R; r++)
        if (got[r] != want[r]) fail_msg("cpu argmax row %d: got %d, want %d", r, got[r], want[r]);
    /* a narrow width too (fewer elements than GPU threads) */
    int32_t narrow_cpu[R], narrow_g[R];
    float *xn = malloc(sizeof(float) * R * 33);
    for (int r = 0; r < R; r++) memcpy(xn + r * 33, x + (size_t)r * W, sizeof(float) * 33);
    run_argmax(g_cpu, xn, R, 33, narrow_cpu);
    for (int r = 0; r < R; r++)
        if (narrow_cpu[r] != argmax_ref(xn + r * 33, 33))
            fail_msg("cpu argmax width 33 row %d: got %d, want %d", r, narrow_cpu[r],
                     argmax_ref(xn + r * 33, 33));
    if (have_gpu("argmax"))
        for (int gi = 0; gi < N_GPU; gi++) {
            run_argmax(g_gpu[gi], x, R, W, g);
            for (int r = 0; r < R; r++)
                if (g[r] != got[r])
                    fail_msg("%s argmax row %d: got %d, cpu %d", k_gpu_name[gi], r, g[r], got[r]);
            run_argmax(g_gpu[gi], xn, R, 33, narrow_g);
            for (int r = 0; r < R; r++)
                if (narrow_g[r] != narrow_cpu[r])
                    fail_msg("%s argmax width 33 row %d: got %d, cpu %d", k_gpu_name[gi], r,
                             narrow_g[r], narrow_cpu[r]);
        }
    free(x);
    free(xn);
}

/* --- kv_move ------------------------------------------------------------------ */

static void run_kv_move(specd_backend *be, const kvcache *c, const int32_t *src, const int32_t *dst,
                        int n, void *after) {
    specd_kv_layout kv = {dput(be, c->host, c->bytes), c->n_layers, c->kv_dim, c->n_rows};
    be->ops->kv_move(be, &kv, src, dst, n);
    dget(be, after, kv.base, c->bytes);
    finish_ok(be, "kv_move");
    dfree(be, kv.base);
}

static void test_kv_move(void **state) {
    (void)state;
    /* In order: 10->3; 20->10 (overwrites the row the first move read);
     * 3->40 (reads what the first wrote: the old row 10); 40->41; a self
     * move; 63->0 then 0->62 (the old row 63 lands in 62 too). */
    const int32_t src[] = {10, 20, 3, 40, 7, 63, 0};
    const int32_t dst[] = {3, 10, 40, 41, 7, 0, 62};
    const int n = 7;
    const int kv_dims[] = {24, 32}; /* rows of 48/96 and 64/128 bytes */
    const specd_dtype types[] = {SPECD_F32, SPECD_F16};
    int gpu = have_gpu("kv_move");
    for (int di = 0; di < 2; di++)
        for (int ti = 0; ti < 2; ti++) {
            kvcache c;
            kv_init(&c, types[ti], 3, kv_dims[di], 64, 1000 + 10 * di + ti);
            void *want = malloc(c.bytes), *got = malloc(c.bytes), *g = malloc(c.bytes);
            memcpy(want, c.host, c.bytes);
            size_t rb = (size_t)c.kv_dim * c.elem;
            for (int p = 0; p < 2 * c.n_layers; p++)
                for (int i = 0; i < n; i++)
                    memmove((char *)want + kv_index(&c, p, dst[i], 0) * c.elem,
                            (char *)want + kv_index(&c, p, src[i], 0) * c.elem, rb);
            /* the chain really is order-dependent: row 40 holds the old row 10 */
            assert_memory_equal((char *)want + kv_index(&c, 5, 40, 0) * c.elem,
                                (char *)c.host + kv_index(&c, 5, 10, 0) * c.elem, rb);
            char what[96];
            snprintf(what, sizeof what, "cpu kv_move kv_dim %d %s", c.kv_dim,
                     types[ti] == SPECD_F16 ? "F16" : "F32");
            cpu_kv(types[ti]);
            run_kv_move(g_cpu, &c, src, dst, n, got);
            cpu_kv(SPECD_F32);
            expect_cache_equal(what, &c, got, want);
            for (int gi = 0; gpu && gi < N_GPU; gi++) {
                if (g_gpu[gi]->kv_type != types[ti]) continue;
                run_kv_move(g_gpu[gi], &c, src, dst, n, g);
                snprintf(what, sizeof what, "%s kv_move kv_dim %d", k_gpu_name[gi], c.kv_dim);
                expect_cache_equal(what, &c, g, want);
            }
            free(c.host);
            free(want);
            free(got);
            free(g);
        }
}

/* --- prepare_weight with data == NULL ---------------------------------------- */

static void null_tensor(specd_tensor *t, const char *name, specd_dtype type, int cols, int rows) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->n_dims = rows > 0 ? 2 : 1;
    t->ne[0] = (uint64_t)cols;
    t->ne[1] = rows > 0 ? (uint64_t)rows : 1;
    t->ne[2] = t->ne[3] = 1;
    t->data = NULL;
}

/* The values of a prepared random weight, read through the ops that use
 * them: a matrix times the identity (y[t][r] = W[r][t]; one-hot inputs and
 * single products are exact in any precision), a vector as the weight of
 * an rmsnorm of ones with eps 0. vals [rows][cols]. */
static void read_random_weight(specd_backend *be, const specd_tensor *t, float *vals) {
    specd_error err = {{0}};
    specd_bweight w;
    memset(&w, 0, sizeof w);
    if (be->ops->prepare_weight(be, &w, t, &err))
        fail_msg("%s: prepare_weight(%s, data NULL): %s", be->ops->name, t->name, err.msg);
    int cols = (int)t->ne[0], rows = (int)t->ne[1];
    assert_int_equal(w.cols, cols);
    assert_int_equal(w.rows, rows);
    if (t->n_dims == 1) {
        float *ones = malloc(sizeof(float) * cols);
        for (int i = 0; i < cols; i++) ones[i] = 1.0f;
        float *dx = dput(be, ones, sizeof(float) * cols),
              *dy = dput(be, NULL, sizeof(float) * cols);
        be->ops->rmsnorm(be, dy, dx, &w, 1, cols, 0.0f);
        dget(be, vals, dy, sizeof(float) * cols);
        dfree(be, dx);
        dfree(be, dy);
        free(ones);
    } else {
        float *eye = calloc((size_t)cols * cols, sizeof(float));
        for (int i = 0; i < cols; i++) eye[(size_t)i * cols + i] = 1.0f;
        float *y = malloc(sizeof(float) * (size_t)cols * rows);
        float *dx = dput(be, eye, sizeof(float) * (size_t)cols * cols);
        float *dy = dput(be, NULL, sizeof(float) * (size_t)cols * rows);
        be->ops->matmul(be, dy, &w, dx, cols);
        dget(be, y, dy, sizeof(float) * (size_t)cols * rows);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) vals[(size_t)r * cols + c] = y[(size_t)c * rows + r];
        dfree(be, dx);
        dfree(be, dy);
        free(eye);
        free(y);
    }
    finish_ok(be, "prepare_weight(NULL) readback");
    be->ops->release_weight(be, &w);
}

static void test_prepare_weight_random(void **state) {
    (void)state;
    specd_tensor t;
    specd_error err = {{0}};
    null_tensor(&t, "blk.3.attn_q.weight", SPECD_F16, 64, 48);
    specd_bweight w;
    memset(&w, 0, sizeof w);
    assert_int_not_equal(g_cpu->ops->prepare_weight(g_cpu, &w, &t, &err), 0);
    if (!strstr(err.msg, "blk.3.attn_q.weight"))
        fail_msg("cpu refusal does not name the tensor: '%s'", err.msg);
    if (!have_gpu("prepare_weight(data NULL)")) return;

    const struct {
        const char *name;
        specd_dtype type;
        int cols, rows;
    } ts[] = {
        {"blk.0.attn_q.weight", SPECD_F16, 64, 48},
        {"blk.0.ffn_down.weight", SPECD_F32, 100, 40},
        {"blk.0.attn_norm.weight", SPECD_F32, 64, 0},
    };
    enum { NT = 3 };
    for (int gi = 0; gi < N_GPU; gi++) {
        float *vals[NT];
        for (int i = 0; i < NT; i++) {
            int rows = ts[i].rows > 0 ? ts[i].rows : 1;
            size_t n = (size_t)rows * ts[i].cols;
            vals[i] = malloc(sizeof(float) * n);
            null_tensor(&t, ts[i].name, ts[i].type, ts[i].cols, ts[i].rows);
            read_random_weight(g_gpu[gi], &t, vals[i]);
            double lo = 1e30, hi = -1e30, sum = 0, sum2 = 0;
            for (size_t e = 0; e < n; e++) {
                double v = vals[i][e];
                if (!isfinite(v))
                    fail_msg("%s random %s: element %zu not finite", k_gpu_name[gi], ts[i].name, e);
                lo = fmin(lo, v);
                hi = fmax(hi, v);
                sum += v;
                sum2 += v * v;
            }
            double mean = sum / n, sd = sqrt(fmax(0, sum2 / n - mean * mean));
            if (ts[i].rows > 0) {
                double bound = 1.0 / sqrt((double)ts[i].cols), slack = bound * (1 + U_BF16);
                if (lo < -slack || hi > slack)
                    fail_msg("%s random %s: values in [%g, %g], outside +-1/sqrt(%d) = %g",
                             k_gpu_name[gi], ts[i].name, lo, hi, ts[i].cols, bound);
                /* uniform in +-b: mean 0, sd b/sqrt(3); loose (n >= 3000) */
                if (fabs(mean) > 0.1 * bound || fabs(sd / (bound / sqrt(3.0)) - 1) > 0.2)
                    fail_msg("%s random %s: mean %g sd %g do not look uniform in +-%g",
                             k_gpu_name[gi], ts[i].name, mean, sd, bound);
            } else if (lo < 0.9 || hi > 1.1 || hi - lo <= 0) {
                fail_msg("%s random %s: norm vector values in [%g, %g], want varied within "
                         "[0.9, 1.1]",
                         k_gpu_name[gi], ts[i].name, lo, hi);
            }
        }
        /* a fresh backend preparing the same tensors gives the same values */
        specd_backend_opts o = {.name = "cuda", .device = 0, .kv_dtype = gi ? SPECD_KV_F32 : SPECD_KV_AUTO};
        specd_backend *again = specd_backend_create(&o, &err);
        if (!again) fail_msg("second %s backend: %s", k_gpu_name[gi], err.msg);
        for (int i = 0; i < NT; i++) {
            int rows = ts[i].rows > 0 ? ts[i].rows : 1;
            size_t n = (size_t)rows * ts[i].cols;
            float *v2 = malloc(sizeof(float) * n);
            null_tensor(&t, ts[i].name, ts[i].type, ts[i].cols, ts[i].rows);
            read_random_weight(again, &t, v2);
            char what[128];
            snprintf(what, sizeof what, "%s random %s repeated on a fresh backend", k_gpu_name[gi],
                     ts[i].name);
            expect_equal_f(what, v2, vals[i], n);
            free(v2);
            free(vals[i]);
        }
        again->ops->destroy(again);
    }
}

/* --- memory, begin_step / finish -------------------------------------------- */

static void check_memory(specd_backend *be) {
    enum { N = 1000 };
    unsigned char host[N], back[N];
    unsigned char *d = dput(be, NULL, N);
    dget(be, back, d, N);
    for (int i = 0; i < N; i++)
        if (back[i]) fail_msg("%s: alloc not zeroed at byte %d", be->ops->name, i);
    for (int i = 0; i < N; i++) host[i] = (unsigned char)(i * 7 + 1);
    be->ops->from_host(be, d, host, N);
    be->ops->from_host(be, d + 100, host, 50); /* at an offset */
    dget(be, back + 10, d + 10, N - 10);
    memcpy(back, host, 10);
    memcpy(host + 100, host, 50);
    assert_memory_equal(back, host, N);
    finish_ok(be, "memory");
    dfree(be, d);
}

/* embed, rope and gather_out of one step on `be`; outputs concatenated */
static size_t run_step_ops(specd_backend *be, tstep *s, const htensor *E, int clobber, float *out) {
    enum { NH = 2, NKV = 1, HD = 16 };
    int nt = s->st.n_tokens, no = s->st.n_out, dim = E->cols;
    specd_bweight w;
    prep_ok(be, &w, E);
    float *x = dput(be, NULL, sizeof(float) * (size_t)nt * dim);
    float *q = dput(be, NULL, sizeof(float) * (size_t)nt * NH * HD);
    float *k = dput(be, NULL, sizeof(float) * (size_t)nt * NKV * HD);
    float *o = dput(be, NULL, sizeof(float) * (size_t)no * dim);
    begin_ok(be, &s->st);
    /* backend.h: the step's host arrays need to live only until begin_step
     * returns */
    if (clobber) {
        memset(s->tokens, 0x7f, sizeof s->tokens);
        memset(s->cos_sin, 0x7f, sizeof s->cos_sin);
        memset(s->out_rows, 0x7f, sizeof s->out_rows);
        memset(s->pages, 0x7f, sizeof s->pages);
        memset(s->masks, 0x7f, sizeof s->masks);
        memset(s->seqs, 0x7f, sizeof s->seqs);
    }
    be->ops->embed(be, x, &w);
    /* q, k = slices of the embeddings, then rotated */
    for (int t = 0; t < nt; t++) {
        be->ops->axpy(be, q + (size_t)t * NH * HD, 1.0f, x + (size_t)t * dim, NH * HD);
        be->ops->axpy(be, k + (size_t)t * NKV * HD, 1.0f, x + (size_t)t * dim + NH * HD, NKV * HD);
    }
    specd_rope_cfg cfg = {HD, HD, 0};
    be->ops->rope(be, q, k, NH, NKV, &cfg);
    be->ops->gather_out(be, o, x, dim);
    size_t off = 0;
    dget(be, out + off, x, sizeof(float) * (size_t)nt * dim);
    off += (size_t)nt * dim;
    dget(be, out + off, q, sizeof(float) * (size_t)nt * NH * HD);
    off += (size_t)nt * NH * HD;
    dget(be, out + off, k, sizeof(float) * (size_t)nt * NKV * HD);
    off += (size_t)nt * NKV * HD;
    dget(be, out + off, o, sizeof(float) * (size_t)no * dim);
    off += (size_t)no * dim;
    finish_ok(be, "step ops");
    dfree(be, x);
    dfree(be, q);
    dfree(be, k);
    dfree(be, o);
    be->ops->release_weight(be, &w);
    return off;
}

static void test_step_and_finish(void **state) {
    (void)state;
    check_memory(g_cpu);
    htensor E;
    /* F16: exact on every backend (the comparisons below are exact for embed) */
    ht_init(&E, "token_embd.weight", SPECD_F16, 64, 100, 1100, 1.0f, 0);
    static const int32_t p10[] = {5}, p11[] = {2}, p12[] = {9, 4, 7};
    const seq_spec sp[3] = {{0, 1, NULL, p10}, {5, 4, k_tree4, p11}, {37, 7, NULL, p12}};
    int32_t pbig[4][4];
    for (int i = 0; i < 16; i++) pbig[i / 4][i % 4] = (i * 5 + 2) % 16;
    /* 80 tokens: more than the CUDA step buffer's first capacity (64) */
    const seq_spec big[4] = {{0, 20, NULL, pbig[0]},
                             {10, 20, NULL, pbig[1]},
                             {20, 20, NULL, pbig[2]},
                             {30, 20, NULL, pbig[3]}};
    const int32_t rows[3] = {11, 0, 4}, rows_big[4] = {79, 0, 17, 17};
    tstep *s = malloc(sizeof *s), *s2 = malloc(sizeof *s2);
    size_t cap = MAX_TOK * (64 + 32 + 16 + 64);
    float *a = malloc(sizeof(float) * cap), *b = malloc(sizeof(float) * cap);
    specd_error err = {{0}};

    /* the CPU: a step with no ops, then ops; finish reports nothing */
    tstep_init(s, 3, sp, 16, 11, 100);
    tstep_out(s, 3, rows);
    begin_ok(g_cpu, &s->st);
    assert_int_equal(g_cpu->ops->finish(g_cpu, &err), 0);
    size_t n = run_step_ops(g_cpu, s, &E, 0, a);
    assert_int_equal(err.msg[0], 0);
    /* embed really used this step's tokens and gather_out its rows */
    for (int t = 0; t < s->st.n_tokens; t++)
        assert_memory_equal(a + (size_t)t * 64, E.vals + (size_t)s->tokens[t] * 64,
                            64 * sizeof(float));
    for (int i = 0; i < 3; i++)
        assert_memory_equal(a + n - (size_t)(3 - i) * 64, a + (size_t)rows[i] * 64,
                            64 * sizeof(float));
    /* a second begin_step replaces the first */
    tstep_init(s2, 4, big, 16, 12, 100);
    tstep_out(s2, 4, rows_big);
    begin_ok(g_cpu, &s->st);
    size_t n2 = run_step_ops(g_cpu, s2, &E, 0, b);
    for (int t = 0; t < s2->st.n_tokens; t++)
        assert_memory_equal(b + (size_t)t * 64, E.vals + (size_t)s2->tokens[t] * 64,
                            64 * sizeof(float));

    if (have_gpu("begin_step/finish")) {
        float *g = malloc(sizeof(float) * cap);
        for (int gi = 0; gi < N_GPU; gi++) {
            specd_backend *be = g_gpu[gi];
            check_memory(be);
            begin_ok(be, &s->st);
            if (be->ops->finish(be, &err))
                fail_msg("%s: finish of an empty step: %s", k_gpu_name[gi], err.msg);
            /* small step, a larger one (the step buffer grows), the small one
             * again; the host arrays are clobbered right after begin_step */
            for (int rep = 0; rep < 3; rep++) {
                tstep *src = rep == 1 ? s2 : s;
                tstep *cp = malloc(sizeof *cp);
                if (rep == 1) {
                    tstep_init(cp, 4, big, 16, 12, 100);
                    tstep_out(cp, 4, rows_big);
                } else {
                    tstep_init(cp, 3, sp, 16, 11, 100);
                    tstep_out(cp, 3, rows);
                }
                assert_memory_equal(cp->tokens, src->tokens, sizeof cp->tokens);
                size_t ng = run_step_ops(be, cp, &E, 1, g);
                assert_int_equal(ng, rep == 1 ? n2 : n);
                char what[96];
                snprintf(what, sizeof what, "%s step ops (host arrays clobbered) rep %d vs cpu",
                         k_gpu_name[gi], rep);
                expect_close(what, g, rep == 1 ? b : a, ng, 1e-5, 0);
                free(cp);
            }
        }
        free(g);
    }
    free(a);
    free(b);
    free(s);
    free(s2);
    ht_free(&E);
}

/* --- graph recording and replay (CUDA) ---------------------------------------- */

enum {
    M_VOCAB = 203,
    M_DIM = 64,
    M_HIDDEN = 96,
    M_LAYERS = 2,
    M_NH = 4,
    M_NKV = 2,
    M_HD = 16,
    M_PAGES = 40,
    M_MAXTOK = 12
};

typedef struct mini_model {
    htensor emb, out_norm, head;
    htensor attn_norm[M_LAYERS], wq[M_LAYERS], wk[M_LAYERS], wv[M_LAYERS], wo[M_LAYERS];
    htensor ffn_norm[M_LAYERS], wg[M_LAYERS], wu[M_LAYERS], wd[M_LAYERS];
} mini_model;

static void mini_init(mini_model *m, specd_dtype t) {
    int s = 0;
    ht_init(&m->emb, "token_embd.weight", t, M_DIM, M_VOCAB, 1200 + s++, 1.0f, 0);
    ht_init(&m->out_norm, "output_norm.weight", SPECD_F32, M_DIM, 0, 1200 + s++, 0.1f, 1.0f);
    ht_init(&m->head, "output.weight", t, M_DIM, M_VOCAB, 1200 + s++, 0.3f, 0);
    for (int l = 0; l < M_LAYERS; l++) {
        ht_init(&m->attn_norm[l], "attn_norm", SPECD_F32, M_DIM, 0, 1200 + s++, 0.1f, 1.0f);
        ht_init(&m->wq[l], "attn_q", t, M_DIM, M_NH * M_HD, 1200 + s++, 0.4f, 0);
        ht_init(&m->wk[l], "attn_k", t, M_DIM, M_NKV * M_HD, 1200 + s++, 0.4f, 0);
        ht_init(&m->wv[l], "attn_v", t, M_DIM, M_NKV * M_HD, 1200 + s++, 0.3f, 0);
        ht_init(&m->wo[l], "attn_output", t, M_NH * M_HD, M_DIM, 1200 + s++, 0.2f, 0);
        ht_init(&m->ffn_norm[l], "ffn_norm", SPECD_F32, M_DIM, 0, 1200 + s++, 0.1f, 1.0f);
        ht_init(&m->wg[l], "ffn_gate", t, M_DIM, M_HIDDEN, 1200 + s++, 0.3f, 0);
        ht_init(&m->wu[l], "ffn_up", t, M_DIM, M_HIDDEN, 1200 + s++, 0.3f, 0);
        ht_init(&m->wd[l], "ffn_down", t, M_HIDDEN, M_DIM, 1200 + s++, 0.2f, 0);
    }
}

static void mini_free(mini_model *m) {
    ht_free(&m->emb);
    ht_free(&m->out_norm);
    ht_free(&m->head);
    for (int l = 0; l < M_LAYERS; l++) {
        ht_free(&m->attn_norm[l]);
        ht_free(&m->wq[l]);
        ht_free(&m->wk[l]);
        ht_free(&m->wv[l]);
        ht_free(&m->wo[l]);
        ht_free(&m->ffn_norm[l]);
        ht_free(&m->wg[l]);
        ht_free(&m->wu[l]);
        ht_free(&m->wd[l]);
    }
}

/* The model's weights and buffers on one backend. */
typedef struct mini_run {
    specd_backend *be;
    specd_bweight emb, out_norm, head;
    specd_bweight attn_norm[M_LAYERS], wq[M_LAYERS], wk[M_LAYERS], wv[M_LAYERS], wo[M_LAYERS];
    specd_bweight ffn_norm[M_LAYERS], wg[M_LAYERS], wu[M_LAYERS], wd[M_LAYERS];
    float *x, *xb, *xb2, *q, *k, *v, *att, *hb, *hb2, *hid, *logits;
    int32_t *ids;
    specd_kv_layout kv;
    size_t kv_bytes;
} mini_run;

static void mini_run_init(mini_run *r, specd_backend *be, const mini_model *m,
                          const void *kv_init_host) {
    memset(r, 0, sizeof *r);
    r->be = be;
    prep_ok(be, &r->emb, &m->emb);
    prep_ok(be, &r->out_norm, &m->out_norm);
    prep_ok(be, &r->head, &m->head);
    for (int l = 0; l < M_LAYERS; l++) {
        prep_ok(be, &r->attn_norm[l], &m->attn_norm[l]);
        prep_ok(be, &r->wq[l], &m->wq[l]);
        prep_ok(be, &r->wk[l], &m->wk[l]);
        prep_ok(be, &r->wv[l], &m->wv[l]);
        prep_ok(be, &r->wo[l], &m->wo[l]);
        prep_ok(be, &r->ffn_norm[l], &m->ffn_norm[l]);
        prep_ok(be, &r->wg[l], &m->wg[l]);
        prep_ok(be, &r->wu[l], &m->wu[l]);
        prep_ok(be, &r->wd[l], &m->wd[l]);
    }
    size_t T = M_MAXTOK;
    r->x = dput(be, NULL, sizeof(float) * T * M_DIM);
    r->xb = dput(be, NULL, sizeof(float) * T * M_DIM);
    r->xb2 = dput(be, NULL, sizeof(float) * T * M_DIM);
    r->q = dput(be, NULL, sizeof(float) * T * M_NH * M_HD);
    r->att = dput(be, NULL, sizeof(float) * T * M_NH * M_HD);
    r->k = dput(be, NULL, sizeof(float) * T * M_NKV * M_HD);
    r->v = dput(be, NULL, sizeof(float) * T * M_NKV * M_HD);
    r->hb = dput(be, NULL, sizeof(float) * T * M_HIDDEN);
    r->hb2 = dput(be, NULL, sizeof(float) * T * M_HIDDEN);
    r->hid = dput(be, NULL, sizeof(float) * T * M_DIM);
    r->logits = dput(be, NULL, sizeof(float) * T * M_VOCAB);
    r->ids = dput(be, NULL, sizeof(int32_t) * T);
    r->kv_bytes = 2 * (size_t)M_LAYERS * M_PAGES * SPECD_KV_PAGE_ROWS *
                  specd_kv_row_bytes(be->kv_type, M_NKV * M_HD);
    r->kv = (specd_kv_layout){dput(be, kv_init_host, r->kv_bytes), M_LAYERS, M_NKV * M_HD,
                              (int64_t)M_PAGES * SPECD_KV_PAGE_ROWS};
}

static void mini_run_free(mini_run *r) {
    specd_backend *be = r->be;
    void *bufs[] = {r->x,  r->xb,  r->xb2, r->q,      r->att, r->k,      r->v,
                    r->hb, r->hb2, r->hid, r->logits, r->ids, r->kv.base};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dfree(be, bufs[i]);
    be->ops->release_weight(be, &r->emb);
    be->ops->release_weight(be, &r->out_norm);
    be->ops->release_weight(be, &r->head);
    for (int l = 0; l < M_LAYERS; l++) {
        specd_bweight *ws[9] = {&r->attn_norm[l], &r->wq[l], &r->wk[l], &r->wv[l], &r->wo[l],
                                &r->ffn_norm[l],  &r->wg[l], &r->wu[l], &r->wd[l]};
        for (int i = 0; i < 9; i++) be->ops->release_weight(be, ws[i]);
    }
}

/* The ops of one step: a two-layer Llama block stack, as transformer.c
 * issues them (plus scale, and a different RoPE layout per layer). */
static void mini_ops(mini_run *r, int n, int n_out) {
    specd_backend *be = r->be;
    const specd_backend_ops *op = be->ops;
    const float eps = 1e-5f;
    op->embed(be, r->x, &r->emb);
    for (int l = 0; l < M_LAYERS; l++) {
        specd_rope_cfg rc = {M_HD, M_HD, l % 2};
        op->rmsnorm(be, r->xb, r->x, &r->attn_norm[l], n, M_DIM, eps);
        op->matmul(be, r->q, &r->wq[l], r->xb, n);
        op->matmul(be, r->k, &r->wk[l], r->xb, n);
        op->matmul(be, r->v, &r->wv[l], r->xb, n);
        op->rope(be, r->q, r->k, M_NH, M_NKV, &rc);
        op->attention(be, r->att, r->q, r->k, r->v, &r->kv, l, M_NH, M_NKV, M_HD);
        op->matmul(be, r->xb2, &r->wo[l], r->att, n);
        op->axpy(be, r->x, 1.0f, r->xb2, (size_t)n * M_DIM);
        op->rmsnorm(be, r->xb, r->x, &r->ffn_norm[l], n, M_DIM, eps);
        op->matmul(be, r->hb, &r->wg[l], r->xb, n);
        op->matmul(be, r->hb2, &r->wu[l], r->xb, n);
        op->swiglu(be, r->hb, r->hb, r->hb2, (size_t)n * M_HIDDEN);
        op->matmul(be, r->xb, &r->wd[l], r->hb, n);
        op->axpy(be, r->x, 1.0f, r->xb, (size_t)n * M_DIM);
    }
    op->scale(be, r->x, 0.5f, (size_t)n * M_DIM);
    op->gather_out(be, r->xb, r->x, M_DIM);
    op->rmsnorm(be, r->hid, r->xb, &r->out_norm, n_out, M_DIM, eps);
    op->matmul(be, r->logits, &r->head, r->hid, n_out);
    op->argmax(be, r->ids, r->logits, n_out, M_VOCAB);
}

/* One step: begin_step, the ops (inside graph_begin/graph_end when the
 * backend has graphs), outputs to the host. Returns 1 when replayed. */
static int mini_step(mini_run *r, const tstep *s, float *hid, float *logits, int32_t *ids) {
    specd_backend *be = r->be;
    const specd_backend_ops *op = be->ops;
    begin_ok(be, &s->st);
    int replayed = op->graph_begin ? op->graph_begin(be, 0x5eedu) : 0;
    if (!replayed) mini_ops(r, s->st.n_tokens, s->st.n_out);
    if (op->graph_end) op->graph_end(be);
    int no = s->st.n_out;
    dget(be, hid, r->hid, sizeof(float) * (size_t)no * M_DIM);
    dget(be, logits, r->logits, sizeof(float) * (size_t)no * M_VOCAB);
    dget(be, ids, r->ids, sizeof(int32_t) * (size_t)no);
    finish_ok(be, "mini step");
    return replayed;
}

/* Step `idx` of shape A (3 sequences, 12 tokens, 3 outputs) or B (one
 * decode token): same shape, different n_past, trees, pages, tokens. */
static void make_graph_step(tstep *s, int shape_a, int idx) {
    static const int trees[3][4] = {{-1, 0, 0, 1}, {-1, 0, 1, 2}, {-1, -1, 0, 0}};
    static const int past_a[5][3] = {{0, 5, 37}, {3, 20, 2}, {40, 0, 9}, {16, 30, 60}, {1, 1, 1}};
    static const int past_b[3] = {77, 5, 130};
    static const int32_t outs_a[5][3] = {{0, 4, 11}, {11, 2, 7}, {1, 1, 5}, {3, 8, 0}, {10, 9, 4}};
    static const int mult[5] = {3, 7, 11, 13, 17}; /* coprime with M_PAGES */
    int32_t perm[M_PAGES];
    for (int j = 0; j < M_PAGES; j++) perm[j] = (j * mult[idx % 5] + 5 * idx + 1) % M_PAGES;
    seq_spec sp[3];
    int used = 0;
    if (shape_a) {
        const int news[3] = {1, 4, 7};
        for (int q = 0; q < 3; q++) {
            sp[q] =
                (seq_spec){past_a[idx][q], news[q], q == 1 ? trees[idx % 3] : NULL, perm + used};
            used += pages_for(sp[q].n_past + sp[q].n_new);
        }
        assert_true(used <= M_PAGES);
        tstep_init(s, 3, sp, M_HD, 1300 + idx, M_VOCAB);
        tstep_out(s, 3, outs_a[idx]);
    } else {
        sp[0] = (seq_spec){past_b[idx], 1, NULL, perm};
        tstep_init(s, 1, sp, M_HD, 1400 + idx, M_VOCAB);
        const int32_t zero = 0;
        tstep_out(s, 1, &zero);
    }
}

static void expect_outputs(const char *what, const float *g, const float *c, size_t n, double tol) {
    double mx = 1;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(c[i]));
    expect_close(what, g, c, n, tol * mx, 0);
}

static void test_graph_replay(void **state) {
    (void)state;
    if (!have_gpu("graph_begin/graph_end record + replay")) return;
    /* A A B A B B A, graph_reset, A: shape A is seen, recorded, replayed
     * twice, then seen again after the reset; B seen, recorded, replayed. */
    const struct {
        int a, idx, reset_before;
    } seq[] = {{1, 0, 0}, {1, 1, 0}, {0, 0, 0}, {1, 2, 0},
               {0, 1, 0}, {0, 2, 0}, {1, 3, 0}, {1, 4, 1}};
    const int n_steps = sizeof seq / sizeof seq[0];
    for (int gi = 0; gi < N_GPU; gi++) {
        specd_backend *gb = g_gpu[gi];
        /* kv_f32 keeps fp32: F32 weights; the default backend: F16 weights,
         * exact on both sides, so only its fp16 GEMM inputs and KV differ */
        specd_dtype wt = gi == 1 ? SPECD_F32 : SPECD_F16;
        double tol = gi == 1 ? 1e-4 : 1e-2;
        mini_model m;
        mini_init(&m, wt);
        kvcache c;
        kv_init(&c, gb->kv_type, M_LAYERS, M_NKV * M_HD, (int64_t)M_PAGES * SPECD_KV_PAGE_ROWS,
                1500 + gi);
        cpu_kv(gb->kv_type);
        mini_run rc, rg;
        mini_run_init(&rc, g_cpu, &m, c.host);
        mini_run_init(&rg, gb, &m, c.host);
        tstep *s = malloc(sizeof *s);
        float hc[3 * M_DIM], hg[3 * M_DIM], lc[3 * M_VOCAB], lg[3 * M_VOCAB];
        int32_t ic[3], ig[3];
        int replays = 0;
        for (int i = 0; i < n_steps; i++) {
            if (seq[i].reset_before && gb->ops->graph_reset) gb->ops->graph_reset(gb);
            make_graph_step(s, seq[i].a, seq[i].idx);
            mini_step(&rc, s, hc, lc, ic);
            replays += mini_step(&rg, s, hg, lg, ig);
            int no = s->st.n_out;
            char what[128];
            snprintf(what, sizeof what, "%s graph step %d (shape %c) hidden vs cpu", k_gpu_name[gi],
                     i, seq[i].a ? 'A' : 'B');
            expect_outputs(what, hg, hc, (size_t)no * M_DIM, tol);
            snprintf(what, sizeof what, "%s graph step %d (shape %c) logits vs cpu", k_gpu_name[gi],
                     i, seq[i].a ? 'A' : 'B');
            expect_outputs(what, lg, lc, (size_t)no * M_VOCAB, tol);
            for (int o = 0; o < no; o++) {
                const float *row = lc + (size_t)o * M_VOCAB;
                double mx = 1;
                for (int j = 0; j < M_VOCAB; j++) mx = fmax(mx, fabs(row[j]));
                if (ic[o] != argmax_ref(row, M_VOCAB)) fail_msg("cpu argmax in the mini forward");
                if (ig[o] < 0 || ig[o] >= M_VOCAB || row[ig[o]] < row[ic[o]] - tol * mx)
                    fail_msg("%s graph step %d out %d: argmax %d (cpu logit %g), cpu argmax %d "
                             "(%g): not a near-tie",
                             k_gpu_name[gi], i, o, ig[o],
                             ig[o] >= 0 && ig[o] < M_VOCAB ? row[ig[o]] : NAN, ic[o], row[ic[o]]);
            }
        }
        /* the whole KV cache, every step's rows */
        void *kc = malloc(rc.kv_bytes), *kg = malloc(rg.kv_bytes);
        dget(g_cpu, kc, rc.kv.base, rc.kv_bytes);
        dget(gb, kg, rg.kv.base, rg.kv_bytes);
        finish_ok(gb, "kv readback");
        size_t ne = rc.kv_bytes / c.elem;
        for (size_t e = 0; e < ne; e++) {
            double a = kv_get(&c, kc, e), b = kv_get(&c, kg, e);
            /* K and V are matmul outputs of order 1: the same tolerance */
            if (!(fabs(a - b) <= tol * fmax(1, fabs(a))))
                fail_msg("%s graph steps: KV element %zu: %g vs cpu %g", k_gpu_name[gi], e, b, a);
        }
        free(kc);
        free(kg);
        printf("  %s: %d of %d steps replayed a recorded graph\n", k_gpu_name[gi], replays,
               n_steps);
        if (gb->ops->graph_begin && replays == 0)
            fail_msg("%s: no step replayed a graph (it records on the second sighting of a shape; "
                     "steps 3, 5 and 6 should replay)",
                     k_gpu_name[gi]);
        cpu_kv(SPECD_F32);
        mini_run_free(&rc);
        mini_run_free(&rg);
        mini_free(&m);
        free(c.host);
        free(s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_norm_gelu),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_blocks_bitwise),
        cmocka_unit_test(test_attention_split_decode),
        cmocka_unit_test(test_attention_seq_tasks),
        cmocka_unit_test(test_kv_f16_store),
        cmocka_unit_test(test_attention_q8_cache),
        cmocka_unit_test(test_quantize_q8_0),
        cmocka_unit_test(test_kv_q8_0_cuda_refused),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_gather_out),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_kv_move),
        cmocka_unit_test(test_prepare_weight_random),
        cmocka_unit_test(test_step_and_finish),
        cmocka_unit_test(test_graph_replay),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
