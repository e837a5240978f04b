/* cmd_bench.c - `specd bench`: how fast the transformer prefills and decodes
 * (`specd bench --e2e`, the end-to-end benchmark of the services, lives in
 * cmd_bench_e2e.c).
 *
 * Default: a table of prefill and decode tokens/s for one stream (the median
 * of --reps runs), the bytes of weights and KV cache a decode step reads, and the
 * memory read bandwidth of this machine measured in the same run, so the
 * decode figure can be read as a fraction of the bandwidth bound. The decode
 * loop is real greedy decoding (argmax fed back), not a synthetic kernel
 * loop. CPU backend only.
 *
 * --verify: the cost of one greedy verification step, in the shape of Table
 * 1 of IBM's "Accelerating Production LLMs with Combined Token/Embedding
 * Speculators": for B sequences with P cached tokens each, ms per forward
 * step of plain decoding (1 new token per sequence) next to the memory
 * bound of that step, and of verifying a chain of k candidates (k+1 new
 * tokens per sequence: the pending token plus the candidates, every row's
 * argmax computed on the device, which is all a greedy verifier needs). On
 * any backend (--backend cpu|cuda), with a model file or a synthetic shape
 * (--shape llama2-7b: random fp16 weights generated on the device, see
 * bench_shapes.h). One table per prompt length P; each cell is the median
 * of --reps steps, timed in runs of equal steps after untimed ones of the
 * same shape (--warmup of them and at least --settle-ms, which also let the
 * CUDA backend record its graph for the step's shape; measure_prompt says
 * why). Steps re-run at the same n_past, overwriting the same cache rows,
 * so the measured state never drifts. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_shapes.h"
#include "cli.h"
#include "common/util/cpu_count.h"
#include "common/util/rng.h"
#include "common/spec/sampling.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/peak.h"
#include "kernels/cpu/threadpool.h"
#include "common/model/transformer.h"

static void bench_usage(void) {
    printf("usage: specd bench [options]\n"
           "  -m, --model PATH     .gguf file or Hugging Face directory (default %s)\n"
           "  -t, --threads N      CPU threads (default: all cores)\n"
           "  --prompt-len N       prefill length in tokens (default 128)\n"
           "  --gen N              decoded tokens per run (default 128)\n"
           "  --reps N             runs; the median is reported (default 3; with --verify\n"
           "                       steps per cell, default 10 on cuda, 3 on cpu)\n"
           "  --no-bandwidth       skip measuring the bounds (memory bandwidth for decode,\n"
           "                       the int8 and fp32 multiply-add peaks for prefill and\n"
           "                       for --verify's goal lines)\n"
           "  --precision P        CPU matmul: fast (int8 activations, default) or exact\n"
           "                       (fp32 activations); also applies to --verify\n"
           "  --kv-cache-dtype T   auto (f16; f32 with --precision exact on the cpu), f32, f16\n"
           "                       or q8_0 (cpu only); also --verify\n"
           "  --e2e                instead: tokens/s and tau through draft-svc + target-svc,\n"
           "                       plain vs each drafter at 1..32 streams (specd bench --e2e -h)\n"
           "  --verify             instead: ms per greedy verification step of a chain of k\n"
           "                       candidates for B sequences with P cached tokens each, vs a\n"
           "                       plain decode step and its memory-bandwidth bound (the shape\n"
           "                       of Table 1 in IBM's speculator paper); options:\n"
           "    --backend NAME     cpu (default) or cuda\n"
           "    --device N         CUDA device (default 0)\n"
           "    --shape NAME       instead of -m: a synthetic model (%s) with random\n"
           "                       fp16 weights generated on the device (not on cpu)\n"
           "    --batches LIST     B values (default 1,2,4,8,32)\n"
           "    --ks LIST          k values, candidates per sequence (default 1,2,4,8,16)\n"
           "    --prompts LIST     P values, cached tokens per sequence (default 64,2048)\n"
           "    --warmup N         untimed steps (and at least --settle-ms of them) before\n"
           "                       each run of a cell's timed steps (default 3)\n"
           "    --settle-ms X      untimed ms of a cell's own shape before each run of its\n"
           "                       timed steps (default 50); 0: the cells take turns one\n"
           "                       step at a time instead (each step then follows another\n"
           "                       shape, as the bench timed before)\n"
           "    --peak-gbs X       memory bandwidth for the bound, GB/s (default: the\n"
           "                       device's rating on cuda, measured here on cpu)\n",
           SPECD_DEFAULT_MODEL, SPECD_BENCH_SHAPE_NAMES);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Bytes of the file's tensors a decode step reads: every layer matrix and
 * norm, the final norm and the LM head (one embedding row is negligible).
 * specd_transformer_decode_weight_bytes gives the same as a backend holds
 * them (the CUDA backend expands quantized blocks to fp16). */
static double decode_weight_bytes(const specd_model_file *m) {
    double total = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const specd_tensor *t = &m->tensors[i];
        if (!strncmp(t->name, "blk.", 4) || !strcmp(t->name, "output_norm.weight") ||
            !strcmp(t->name, "output.weight"))
            total += (double)t->nbytes;
    }
    if (m->hp.tied_embeddings) total += (double)specd_model_tensor(m, "token_embd.weight")->nbytes;
    return total;
}

/* Bytes of K and V one cached token holds, all layers, in the cache's type:
 * what a decode step reads per row of context. */
static double kv_token_bytes(const specd_llama_hparams *hp, specd_dtype kv_type) {
    return (double)hp->n_layers * 2 * (double)specd_kv_row_bytes(kv_type, hp->n_kv_heads * hp->head_dim);
}

typedef struct bw_job {
    const uint64_t *buf;
    size_t words_per_task;
    uint64_t sums[64];
} bw_job;

static void bw_task(void *ctx, int task, int thread) {
    bw_job *j = ctx;
    const uint64_t *p = j->buf + (size_t)task * j->words_per_task;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < j->words_per_task; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    j->sums[thread % 64] += a ^ b ^ c ^ d; /* keeps the loads alive */
}

/* Read bandwidth with all threads: sum a 512 MiB buffer (far beyond any
 * cache) several times and keep the best pass. */
static double measure_bandwidth(int n_threads) {
    size_t bytes = (size_t)512 << 20;
    uint64_t *buf = malloc(bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes);
    specd_pool *pool = specd_pool_create(n_threads);
    int tasks = 64;
    bw_job j = {buf, bytes / sizeof(uint64_t) / tasks, {0}};
    double best = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = cli_now();
        specd_pool_run(pool, tasks, bw_task, &j);
        double gbs = (double)bytes / (cli_now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    specd_pool_destroy(pool);
    free(buf);
    return best;
}

/* The multiply-adds of one forward pass of `rows` new tokens of a sequence
 * with P tokens cached, split by the arithmetic that does them: *mm the
 * matmuls (every layer's weights once per row, int8 on the fast path,
 * fp32 with precision exact; the LM head for `heads` of the rows), *attn
 * the attention (fp32: QK^T and PV, row i reading the P cached keys and
 * the rows up to itself, P + i + 1 keys). */
static void pass_macs(const specd_llama_hparams *hp, int P, int rows, int heads, double *mm,
                      double *attn) {
    double q = (double)hp->n_heads * hp->head_dim, kv = (double)hp->n_kv_heads * hp->head_dim;
    double per_layer = hp->dim * q + 2.0 * hp->dim * kv + q * hp->dim + 3.0 * hp->dim * hp->hidden_dim;
    double keys = (double)rows * P + rows * (rows + 1.0) / 2.0; /* summed over the rows */
    *mm = per_layer * hp->n_layers * rows + (double)hp->vocab_size * hp->dim * heads;
    *attn = 2.0 * hp->n_layers * q * keys;
}

/* This machine's multiply-add peaks (kernels/cpu/peak.h) in the forms the
 * CPU kernels issue: *mm_peak the matmuls' (int8 on the fast path, fp32
 * with precision exact), *attn_peak the attention's (fp32). 0 if unknown. */
static void measure_mac_peaks(specd_precision precision, int n_threads, double *mm_peak,
                              double *attn_peak) {
    specd_pool *pool = specd_pool_create(n_threads);
    *attn_peak = pool ? cpu_peak_fp32_macs(pool) : 0;
    *mm_peak = !pool ? 0 : precision == SPECD_PRECISION_FAST ? cpu_peak_int8_macs(pool) : *attn_peak;
    specd_pool_destroy(pool);
}

/* The compute bound of a prefill of L tokens: its multiply-adds
 * (pass_macs, the LM head once for the prompt's last row) at this
 * machine's measured peaks. Prints the line. */
static void print_prefill_bound(const specd_llama_hparams *hp, int L, double prefill_s,
                                specd_precision precision, int n_threads) {
    double mm, attn, int8, fp32;
    pass_macs(hp, 0, L, 1, &mm, &attn);
    mm /= L; /* a token */
    attn /= L;
    measure_mac_peaks(precision, n_threads, &int8, &fp32);
    if (!(fp32 > 0 && int8 > 0)) return;
    double bound = 1.0 / (mm / int8 + attn / fp32);
    printf("prefill arithmetic per token: %.1f M MAC in matmuls (%s) + %.1f M in attention "
           "(fp32, %d-token prompt)\n"
           "peaks measured here (%d threads, %s): int8 %.0f G MAC/s, fp32 %.0f G MAC/s -> "
           "compute bound %.0f tokens/s (attention %.0f%% of it); prefill runs at %.0f%% of it\n",
           mm / 1e6, precision == SPECD_PRECISION_FAST ? "int8" : "fp32", attn / 1e6, L,
           n_threads, cpu_simd_name(), int8 / 1e9, fp32 / 1e9, bound,
           100.0 * (attn / fp32) / (mm / int8 + attn / fp32), 100.0 * (L / prefill_s) / bound);
}

/* ---- --verify ---------------------------------------------------------------- */

#define MAX_LIST 16
/* Tokens per untimed prefill call: large enough that filling 32 x 2048
 * tokens takes few calls, small next to the verify steps' own activations
 * budget, so it does not decide the memory the transformer needs. */
#define PREFILL_CHUNK 512
/* Untimed steps of a cell's shape before each run of its timed steps, in
 * ms (--settle-ms' default), and the rounds a cell's --reps steps are split
 * into (measure_prompt) */
#define SETTLE_MS 50.0
#define VERIFY_ROUNDS 3
/* Seed of the random token ids: fixed, so two runs feed identical batches. */
#define TOKEN_SEED 0x5bec0de5ULL

typedef struct verify_opts {
    const char *backend; /* "cpu" or "cuda" */
    specd_precision precision;
    specd_kv_dtype kv_dtype;
    int device, threads;
    int reps, warmup;    /* reps 0 = the backend's default */
    double settle_ms;    /* untimed ms of a cell's shape before its timed run; 0 = the
                          * cells take turns one step at a time (measure_prompt) */
    int measure_bw;      /* cpu: measure read bandwidth for the bound */
    double peak_gbs;     /* > 0: the bound's bandwidth, overriding the rest */
    int batches[MAX_LIST], n_b;
    int ks[MAX_LIST], n_k;     /* plain decode (k = 0) is always measured too */
    int prompts[MAX_LIST], n_p;
} verify_opts;

/* The transformer and the host buffers every step reuses. */
typedef struct verify_run {
    specd_transformer *t;
    const verify_opts *o;
    int vocab, max_ctx, max_batch, n_slots;
    int32_t *toks, *rows, *ids; /* [max_batch]: inputs, out_rows 0..n-1, argmax ids */
    specd_seq_input *seqs;      /* [n_slots]: a slot appears once per call */
    double *runs;               /* [1 + n_k][reps]: one batch size's steps */
    uint64_t draws;             /* token ids drawn so far: each batch gets fresh ones */
} verify_run;

/* What the bound is computed from, and how it was obtained (printed). */
typedef struct verify_env {
    char device[160];
    char backend[96];
    const char *kv_name;    /* "F16" / "F32" */
    double weight_bytes;    /* read by every decode step, whatever B, as stored */
    double file_bytes;      /* the same tensors' size in the model file */
    double kv_token_bytes;  /* K and V of one cached token, all layers */
    double peak_bytes_per_s; /* 0 = unknown: no bound columns */
    char peak_src[160];
    /* cpu: the multiply-add peaks (measure_mac_peaks) and the model's
     * shape, for the arithmetic floor of the goal cells; 0 = unknown */
    double mm_peak, attn_peak;
    specd_llama_hparams hp;
} verify_env;

/* A skipped measurement, printed with the tables (it explains their "-"
 * cells) and flushed at once so it keeps its place among the error
 * messages on stderr. */
static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("note: ");
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

static void verify_defaults(verify_opts *o) {
    static const int b[] = {1, 2, 4, 8, 32}, k[] = {1, 2, 4, 8, 16}, p[] = {64, 2048};
    *o = (verify_opts){.backend = "cpu", .warmup = 3, .settle_ms = SETTLE_MS, .measure_bw = 1,
                       .n_b = 5, .n_k = 5, .n_p = 2};
    memcpy(o->batches, b, sizeof b);
    memcpy(o->ks, k, sizeof k);
    memcpy(o->prompts, p, sizeof p);
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Ascending without repeats: rows and columns read in order, the largest
 * value is the last, and a repeated B cannot ask for a slot twice. */
static int sort_unique(int *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_int);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!m || v[i] != v[m - 1]) v[m++] = v[i];
    return m;
}

static int index_of(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return i;
    return -1;
}

/* n random token ids into r->toks. Content does not change the cost of a
 * dense forward pass, but real ids keep every row's arithmetic ordinary
 * (no repeated rows a backend could treat specially). */
static void fill_random(verify_run *r, int n) {
    for (int i = 0; i < n; i++) {
        uint32_t w[4];
        specd_rng_u32x4(TOKEN_SEED, 0, r->draws++, w);
        r->toks[i] = (int32_t)(w[0] % (uint32_t)r->vocab);
    }
}

/* Creates and drops the backend once, so a missing GPU or a backend that is
 * not built fails with its own message before anything is sized, instead
 * of once per batch size in create_fitting's retries. */
static int probe_backend(const verify_opts *o, specd_error *err) {
    specd_backend_opts bo = {.name = o->backend, .n_threads = o->threads, .device = o->device,
                             .precision = o->precision, .kv_dtype = o->kv_dtype};
    specd_backend *be = specd_backend_create(&bo, err);
    if (!be) return -1;
    be->ops->destroy(be);
    return 0;
}

/* Drops prompt lengths the model's context cannot hold with even one new
 * token; returns how many remain. */
static int fit_prompts(verify_opts *o, int max_seq_len) {
    int n = 0;
    for (int i = 0; i < o->n_p; i++) {
        if (o->prompts[i] + 1 <= max_seq_len) o->prompts[n++] = o->prompts[i];
        else
            note("skipping P=%d: the model's context is %d tokens\n", o->prompts[i],
                 max_seq_len);
    }
    return o->n_p = n;
}

/* One transformer for the whole grid: a slot per sequence of the largest
 * batch, rows for the longest prompt plus the longest chain (capped by the
 * model's context; cells beyond it are skipped), and room for the largest
 * step or a prefill chunk. When the device cannot hold that (the KV cache
 * of B=32 x 2k tokens is 32 GiB for a 7B), the largest batch is dropped and
 * creation retried, so the smaller batches are still measured. */
static int create_fitting(verify_run *r, const specd_model_file *m, verify_opts *o) {
    specd_error err = {{0}};
    int max_k = o->ks[o->n_k - 1], max_p = o->prompts[o->n_p - 1];
    r->max_ctx = max_p + max_k + 1 < m->hp.max_seq_len ? max_p + max_k + 1 : m->hp.max_seq_len;
    while (o->n_b > 0) {
        int max_b = o->batches[o->n_b - 1];
        int step = max_b * (max_k + 1);
        r->max_batch = step > PREFILL_CHUNK ? step : PREFILL_CHUNK;
        r->n_slots = max_b;
        specd_transformer_opts to = {
            .backend = {.name = o->backend, .n_threads = o->threads, .device = o->device,
                        .precision = o->precision, .kv_dtype = o->kv_dtype},
            .n_slots = max_b, .max_ctx = r->max_ctx, .max_batch = r->max_batch};
        r->t = specd_transformer_create(m, &to, &err);
        if (r->t) return 0;
        note("cannot create the transformer for B=%d (%d slots x %d rows, %d-token steps): %s\n",
             max_b, max_b, r->max_ctx, r->max_batch, err.msg);
        if (--o->n_b > 0) note("retrying without B=%d\n", max_b);
    }
    fprintf(stderr, "specd bench: no batch size fits: %s\n", err.msg);
    return -1;
}

static int alloc_run(verify_run *r, const specd_model_file *m) {
    size_t n = (size_t)r->max_batch;
    r->vocab = m->hp.vocab_size;
    r->toks = malloc(n * sizeof(int32_t));
    r->rows = malloc(n * sizeof(int32_t));
    r->ids = malloc(n * sizeof(int32_t));
    r->seqs = calloc((size_t)r->n_slots, sizeof *r->seqs);
    r->runs = calloc((size_t)(MAX_LIST + 1) * (size_t)r->o->reps, sizeof(double));
    if (!r->toks || !r->rows || !r->ids || !r->seqs || !r->runs) {
        fprintf(stderr, "specd bench: out of memory\n");
        return -1;
    }
    /* every step asks for all of its rows, in batch order */
    for (size_t i = 0; i < n; i++) r->rows[i] = (int32_t)i;
    return 0;
}

static void free_run(verify_run *r) {
    free(r->toks);
    free(r->rows);
    free(r->ids);
    free(r->seqs);
    free(r->runs);
    specd_transformer_free(r->t);
}

/* Fills slots 0..n_slots-1 with P random tokens each (untimed: it only
 * builds the cache the steps read). Pieces of several slots share a call,
 * up to max_batch tokens, so short prompts do not cost one call per slot;
 * a slot appears at most once per call, so n_slots entries suffice. */
static int prefill(verify_run *r, int P, specd_error *err) {
    int slot = 0, done = 0; /* done: tokens of `slot` already in its cache */
    while (slot < r->n_slots) {
        int n_tok = 0, n_seqs = 0;
        while (slot < r->n_slots && n_tok < r->max_batch) {
            int take = P - done < r->max_batch - n_tok ? P - done : r->max_batch - n_tok;
            r->seqs[n_seqs++] = (specd_seq_input){.slot = slot, .n_past = done, .n_new = take};
            n_tok += take;
            done += take;
            if (done == P) {
                slot++;
                done = 0;
            }
        }
        fill_random(r, n_tok);
        specd_batch b = {.n_tokens = n_tok, .tokens = r->toks, .n_seqs = n_seqs, .seqs = r->seqs};
        if (specd_transformer_forward(r->t, &b, err)) return -1;
    }
    return 0;
}

/* Ms of one step: B sequences at n_past = P each add the pending token
 * plus a chain of k candidates (k = 0: plain decode). A chain is a linear
 * tree, so the causal mask (NULL) is its ancestor mask; every row's argmax
 * comes back, not its logits: exactly a greedy verification. The step
 * writes KV rows past P but commits nothing (n_past stays P), so steps of
 * any shape may follow each other. NAN (with a note) when the step fails,
 * e.g. out of device memory. */
static double one_step(verify_run *r, int B, int P, int k) {
    int n_new = k + 1, n = B * n_new;
    fill_random(r, n);
    for (int s = 0; s < B; s++)
        r->seqs[s] = (specd_seq_input){.slot = s, .n_past = P, .n_new = n_new};
    specd_batch b = {.n_tokens = n, .tokens = r->toks, .n_seqs = B, .seqs = r->seqs,
                     .n_out = n, .out_rows = r->rows, .argmax = r->ids};
    specd_error err = {{0}};
    /* forward ends with the backend's finish (a device sync), so the
     * interval is the whole step as a caller waits for it */
    double t0 = cli_now();
    if (specd_transformer_forward(r->t, &b, &err)) {
        note("P=%d B=%d k=%d failed, skipped: %s\n", P, B, k, err.msg);
        return NAN;
    }
    return (cli_now() - t0) * 1e3;
}

/* The bandwidth the bound divides by: an explicit --peak-gbs, else on the
 * CPU backend the read bandwidth measured here (what decode can actually
 * stream; a CPU has no rating to look up), else the device's theoretical
 * peak as its backend reports it. */
static void pick_peak(verify_env *e, const verify_opts *o, const specd_device_info *di,
                      int n_threads) {
    if (o->peak_gbs > 0) {
        e->peak_bytes_per_s = o->peak_gbs * 1e9;
        snprintf(e->peak_src, sizeof e->peak_src, "given with --peak-gbs");
    } else if (!strcmp(o->backend, "cpu") && o->measure_bw) {
        e->peak_bytes_per_s = measure_bandwidth(n_threads) * 1e9;
        snprintf(e->peak_src, sizeof e->peak_src,
                 "measured here: best of 5 reads of a 512 MiB buffer, %d threads", n_threads);
    } else if (di->peak_bytes_per_s > 0) {
        e->peak_bytes_per_s = di->peak_bytes_per_s;
        snprintf(e->peak_src, sizeof e->peak_src,
                 "the backend's device_info (theoretical peak of the device's memory)");
    } else {
        snprintf(e->peak_src, sizeof e->peak_src, "unknown (pass --peak-gbs): no bound columns");
    }
}

/* Everything the header states, from the transformer's own backend: its KV
 * type is the one the cache really holds (fp32 for fp32 models even on
 * CUDA), and device_info names the device that ran the steps. */
static void describe(verify_env *e, const verify_run *r, const specd_model_file *m,
                     const verify_opts *o) {
    specd_backend *be = specd_transformer_backend(r->t);
    specd_device_info di;
    memset(&di, 0, sizeof di); /* a backend without device_info leaves it unknown */
    int have_info = be->ops->device_info && be->ops->device_info(be, &di) == 0;
    int cpu = !strcmp(o->backend, "cpu"), n_threads = o->threads;
    if (cpu && n_threads <= 0) n_threads = specd_cpu_count(); /* the CPU backend's default */
    if (have_info && di.name[0]) snprintf(e->device, sizeof e->device, "%s", di.name);
    else if (cpu) cli_cpu_model(e->device, sizeof e->device);
    else snprintf(e->device, sizeof e->device, "unknown (the backend has no device_info)");
    if (cpu)
        snprintf(e->backend, sizeof e->backend, "cpu (%s), %d thread%s", cpu_simd_name(),
                 n_threads, n_threads == 1 ? "" : "s");
    else
        snprintf(e->backend, sizeof e->backend, "%s, device %d", be->ops->name, o->device);
    const specd_dtype_info *kv = specd_dtype_get(be->kv_type);
    e->kv_name = kv && kv->name ? kv->name : "?";
    e->weight_bytes = specd_transformer_decode_weight_bytes(r->t);
    e->file_bytes = decode_weight_bytes(m);
    e->kv_token_bytes = kv_token_bytes(&m->hp, be->kv_type);
    e->peak_bytes_per_s = 0;
    pick_peak(e, o, &di, n_threads);
    e->hp = m->hp;
    e->mm_peak = e->attn_peak = 0;
    if (cpu && o->measure_bw) measure_mac_peaks(o->precision, n_threads, &e->mm_peak, &e->attn_peak);
}

static void print_header(const verify_env *e, const verify_opts *o, const specd_model_file *m,
                         const char *model_desc) {
    const specd_llama_hparams *hp = &m->hp;
    printf("verification cost per forward step (the shape of Table 1 in IBM's \"Accelerating "
           "Production LLMs with Combined Token/Embedding Speculators\")\n\n");
    printf("device    %s\n", e->device);
    printf("backend   %s\n", e->backend);
    printf("model     %s (%d layers, dim %d, %d heads, %d kv heads, head_dim %d, vocab %d)\n",
           model_desc, hp->n_layers, hp->dim, hp->n_heads, hp->n_kv_heads, hp->head_dim,
           hp->vocab_size);
    printf("weights   %.1f MB read per decode step as the backend stores them (every blk.* "
           "tensor, output_norm, LM head)", e->weight_bytes / 1e6);
    if (e->file_bytes != e->weight_bytes) printf("; %.1f MB in the file", e->file_bytes / 1e6);
    printf("\n");
    printf("KV cache  %s, %.1f KB per cached token (K and V, all layers)\n", e->kv_name,
           e->kv_token_bytes / 1e3);
    if (e->peak_bytes_per_s > 0)
        printf("peak bw   %.1f GB/s, %s\n", e->peak_bytes_per_s / 1e9, e->peak_src);
    else
        printf("peak bw   %s\n", e->peak_src);
    if (e->mm_peak > 0 && e->attn_peak > 0)
        printf("peak MAC  %.0f G multiply-adds/s in the matmuls (%s), %.0f G in the attention "
               "(fp32), measured here (kernels/cpu/peak.h): the arithmetic floor of the goal "
               "lines\n",
               e->mm_peak / 1e9, o->precision == SPECD_PRECISION_FAST ? "int8" : "fp32",
               e->attn_peak / 1e9);
    if (o->settle_ms > 0)
        printf("timing    median of %d steps, monotonic clock around specd_transformer_forward "
               "(which ends with the backend's sync); a batch size's cells take turns in %d "
               "rounds, each cell a run of equal steps after %d or more untimed ones of its "
               "shape (at least %.0f ms of them)\n\n",
               o->reps, o->reps < VERIFY_ROUNDS ? o->reps : VERIFY_ROUNDS, o->warmup,
               o->settle_ms);
    else
        printf("timing    median of %d steps, monotonic clock around specd_transformer_forward "
               "(which ends with the backend's sync); --settle-ms 0: after %d untimed steps "
               "each, a batch size's cells take turns one step at a time\n\n",
               o->reps, o->warmup);
    printf("columns   plain ms: one decode step, B sequences x 1 new token, argmax of each "
           "row on the device\n"
           "          bound ms: (weights + B x P cached tokens of KV) / peak bw, the least "
           "time a decode step can take\n"
           "          of bound: bound ms / plain ms (100%% = at the bound)\n"
           "          k=K: one verify step, B sequences x (pending token + chain of K "
           "candidates), causal, argmax of all B x (K+1) rows; ms (ratio to plain ms)\n\n");
}

/* The least time a decode step of B sequences with P cached tokens can
 * take: every weight and every cached K/V row read once at peak bandwidth.
 * NAN when the bandwidth is unknown. */
static double bound_ms(const verify_env *e, int B, int P) {
    if (e->peak_bytes_per_s <= 0) return NAN;
    return (e->weight_bytes + (double)B * P * e->kv_token_bytes) / e->peak_bytes_per_s * 1e3;
}

/* ms[bi][0] is plain decode, ms[bi][1 + ki] verify with ks[ki]; NAN =
 * skipped. */
static void print_table(const verify_env *e, const verify_opts *o, int P, const double *ms) {
    int w = 1 + o->n_k;
    printf("P = %d cached tokens per sequence\n\n", P);
    printf("| batch | plain ms | bound ms | of bound |");
    for (int ki = 0; ki < o->n_k; ki++) {
        char head[16];
        snprintf(head, sizeof head, "k=%d", o->ks[ki]);
        printf(" %17s |", head);
    }
    printf("\n|------:|---------:|---------:|---------:|");
    for (int ki = 0; ki < o->n_k; ki++) printf("------------------:|");
    printf("\n");
    for (int bi = 0; bi < o->n_b; bi++) {
        const double *row = ms + (size_t)bi * w;
        int B = o->batches[bi];
        double bound = bound_ms(e, B, P);
        printf("| %5d |", B);
        if (isnan(row[0])) printf("        - |");
        else printf(" %8.2f |", row[0]);
        if (isnan(bound)) printf("        - |");
        else printf(" %8.2f |", bound);
        if (isnan(bound) || isnan(row[0])) printf("        - |");
        else printf(" %7.0f%% |", 100 * bound / row[0]);
        for (int ki = 0; ki < o->n_k; ki++) {
            double v = row[1 + ki];
            char cell[48] = "-";
            if (!isnan(v) && isnan(row[0])) snprintf(cell, sizeof cell, "%.2f", v);
            else if (!isnan(v)) snprintf(cell, sizeof cell, "%.2f (%.2fx)", v, v / row[0]);
            printf(" %17s |", cell);
        }
        printf("\n");
    }
    printf("\n");
}

/* The least time the arithmetic of a step of B sequences x `rows` new
 * tokens (each row's logits made) takes at the measured peaks, whatever
 * the memory does; NAN when the peaks are unknown. */
static double arith_ms(const verify_env *e, int B, int P, int rows) {
    if (!(e->mm_peak > 0 && e->attn_peak > 0)) return NAN;
    double mm, attn;
    pass_macs(&e->hp, P, rows, rows, &mm, &attn);
    return B * (mm / e->mm_peak + attn / e->attn_peak) * 1e3;
}

/* Ends a goal line with "; its arithmetic alone takes X ms at the peaks =
 * Yx of plain" for a goal of `goal` x plain: where Y exceeds the goal, no
 * kernel can meet it on this machine (the step would beat the peak). */
static void print_floor(const verify_env *e, int B, int P, int rows, double plain, double goal) {
    double a = arith_ms(e, B, P, rows);
    if (isnan(a) || isnan(plain)) return;
    printf("; its arithmetic alone takes %.2f ms at the peaks = %.2fx of plain%s", a, a / plain,
           a / plain > goal ? ": out of reach on this machine" : "");
}

/* The numbers the work is judged by, from the batch-1 row: on cuda the GPU
 * kit's (a decode step within 1.25x of the HBM bound, k=4 within 1.10x of
 * it), on cpu the CPU kernels' (k=4 within 1.3x of a plain step, k=8
 * within 1.6x, a plain step of 8 sequences within 2.5x of one; a memory
 * bound is not a goal there). */
static void print_goals(const verify_env *e, const verify_opts *o, int P, const double *ms) {
    int cuda = !strcmp(o->backend, "cuda"), bi = index_of(o->batches, o->n_b, 1);
    const double *row = bi >= 0 ? ms + (size_t)bi * (1 + o->n_k) : NULL;
    double bound = bound_ms(e, 1, P);
    if (!row || isnan(row[0]))
        printf("P=%d: plain decode at batch 1: not measured (needs 1 in --batches)\n", P);
    else if (isnan(bound))
        printf("P=%d: plain decode at batch 1: no bound (unknown bandwidth)\n", P);
    else if (cuda)
        printf("P=%d: plain decode at batch 1: %.2fx of the HBM bound (goal <= 1.25x)\n", P,
               row[0] / bound);
    else
        printf("P=%d: plain decode at batch 1: %.2fx of the memory bound\n", P, row[0] / bound);
    static const int ks[2] = {4, 8};
    static const double goal_cpu[2] = {1.3, 1.6};
    for (int g = 0; g < (cuda ? 1 : 2); g++) { /* cuda: k=4 only */
        double goal = cuda ? 1.10 : goal_cpu[g];
        int ki = index_of(o->ks, o->n_k, ks[g]);
        if (!row || ki < 0 || isnan(row[0]) || isnan(row[1 + ki]))
            printf("P=%d: verify k=%d at batch 1: not measured (needs 1 in --batches, %d in --ks)\n",
                   P, ks[g], ks[g]);
        else {
            printf("P=%d: verify k=%d at batch 1: %.2fx of plain (goal <= %.2fx)", P, ks[g],
                   row[1 + ki] / row[0], goal);
            if (!cuda) print_floor(e, 1, P, ks[g] + 1, row[0], goal);
            printf("\n");
        }
    }
    const int b8 = index_of(o->batches, o->n_b, 8);
    if (!cuda && row && b8 >= 0 && !isnan(row[0]) && !isnan(ms[(size_t)b8 * (1 + o->n_k)])) {
        printf("P=%d: plain decode at batch 8: %.2fx of batch 1 (goal <= 2.50x)", P,
               ms[(size_t)b8 * (1 + o->n_k)] / row[0]);
        print_floor(e, 8, P, 1, row[0], 2.5);
        printf("\n");
    }
    printf("\n");
}

/* One prompt length: prefill, then every (B, k) cell. Returns how many cells
 * were measured (0 when the prefill itself failed). */
static int measure_prompt(verify_run *r, int P, double *ms) {
    const verify_opts *o = r->o;
    int w = 1 + o->n_k, measured = 0;
    for (int i = 0; i < o->n_b * w; i++) ms[i] = NAN;
    specd_error err = {{0}};
    if (prefill(r, P, &err)) {
        note("skipping P=%d: the prefill failed: %s\n", P, err.msg);
        return 0;
    }
    /* A batch size's cells are timed in rounds: in each round every cell in
     * turn runs --settle-ms (and at least --warmup steps) untimed, then its
     * share of --reps timed steps back to back. Rounds, so that a stretch
     * of a shared machine's noise falls on every cell alike (the ratios to
     * plain are what the goals are about). Runs of equal steps, because a
     * step's time depends on the steps before it: on the 2-core Xeon VM a
     * batch-8 plain step right after a 72-token verify step took 5.9 ms,
     * and 5.7, 5.4, 5.2, 5.0, 4.9, 4.8, 4.7 ms in the steps after that (at
     * P=20; a 1-token step before it left it at 4.6-4.7). It is the
     * memory side that lags, not the cores: right after such a step a
     * scalar loop ran at its usual speed, while a read of 64 MB took
     * 3.9-4.1 ms against 2.3-2.4 settled, and recovered over tens of
     * milliseconds (most likely the uncore's clock, lowered during
     * compute-bound work; a cache refill would take one pass). One
     * step of each cell in turn had timed every plain step right after the
     * largest k: the batch-8 plain step at 6.8 ms against 5.0-5.1 ms in a
     * run of its own, the "3.1x of batch 1" that was 2.1x
     * (bench/bench_step_lag.c measures the lag). A serving loop runs one
     * shape after another much like it, so the settled figure is the one
     * to plan with. */
    for (int bi = 0; bi < o->n_b; bi++) {
        const int B = o->batches[bi];
        int live[MAX_LIST + 1]; /* columns still measured: fit and not failed */
        for (int c = 0; c < w; c++) {
            int k = c ? o->ks[c - 1] : 0;
            live[c] = P + k + 1 <= r->max_ctx;
            if (!live[c] && bi == 0) /* only when capped by the model's context; once per column */
                note("P=%d k=%d skipped: %d rows exceed the model's context %d\n", P, k, P + k + 1,
                     r->max_ctx);
        }
        const int rounds = o->settle_ms <= 0      ? o->reps
                           : o->reps < VERIFY_ROUNDS ? o->reps
                                                     : VERIFY_ROUNDS;
        int done = 0; /* timed steps per cell so far, the same for every live cell */
        for (int round = 0; round < rounds; round++) {
            const int take = o->reps / rounds + (round < o->reps % rounds);
            for (int c = 0; c < w; c++) {
                const int k = c ? o->ks[c - 1] : 0;
                const double t0 = cli_now();
                const int warm = round == 0 || o->settle_ms > 0 ? o->warmup : 0;
                for (int i = 0;
                     live[c] && (i < warm || (cli_now() - t0) * 1e3 < o->settle_ms); i++)
                    if (isnan(one_step(r, B, P, k))) live[c] = 0;
                for (int i = 0; live[c] && i < take; i++) {
                    double t = one_step(r, B, P, k);
                    if (isnan(t)) live[c] = 0;
                    r->runs[c * o->reps + done + i] = t;
                }
            }
            done += take;
        }
        for (int c = 0; c < w; c++) {
            if (!live[c]) continue;
            ms[bi * w + c] = median(r->runs + c * o->reps, o->reps);
            measured++;
        }
    }
    return measured;
}

/* The whole --verify run. model_desc names the file or the shape;
 * synthetic: the tensors have no data (random weights on the device). */
static int bench_verify(const specd_model_file *m, const char *model_desc, int synthetic,
                        verify_opts *o) {
    specd_error err = {{0}};
    if (synthetic && !strcmp(o->backend, "cpu")) {
        /* the CPU backend computes on the mmapped file and has nowhere to
         * generate 13 GB of weights; say so instead of its generic refusal */
        fprintf(stderr, "specd bench: --shape %s has no weights: they are generated at random on "
                        "the device, which the cpu backend cannot do; use --backend cuda, or "
                        "-m PATH for a real model on the cpu\n", model_desc);
        return 2;
    }
    if (probe_backend(o, &err)) {
        fprintf(stderr, "specd bench: %s\n", err.msg);
        return 1;
    }
    if (!fit_prompts(o, m->hp.max_seq_len)) {
        fprintf(stderr, "specd bench: no prompt length fits the model's context\n");
        return 1;
    }
    verify_run r = {.o = o};
    if (create_fitting(&r, m, o) || alloc_run(&r, m)) {
        free_run(&r);
        return 1;
    }
    verify_env e;
    describe(&e, &r, m, o);
    print_header(&e, o, m, model_desc);
    double *ms = malloc(sizeof(double) * (size_t)o->n_b * (1 + o->n_k));
    int measured = 0;
    for (int pi = 0; ms && pi < o->n_p; pi++) {
        int P = o->prompts[pi];
        int n = measure_prompt(&r, P, ms);
        if (!n) continue;
        measured += n;
        print_table(&e, o, P, ms);
        print_goals(&e, o, P, ms);
    }
    if (!ms) fprintf(stderr, "specd bench: out of memory\n");
    free(ms);
    free_run(&r);
    return measured ? 0 : 1;
}

/* Parses "1,2,4" into v (at most cap values, each 1..hi). */
static int parse_list(const char *opt, const char *s, int *v, int cap, int hi) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (n == cap) {
            fprintf(stderr, "specd bench: %s takes at most %d values\n", opt, cap);
            exit(2);
        }
        v[n++] = (int)cli_int(opt, tok, 1, hi);
    }
    if (!n) {
        fprintf(stderr, "specd bench: %s needs at least one value\n", opt);
        exit(2);
    }
    return n;
}

/* If argv[*i] is an option only --verify takes, consumes it (and its value)
 * into v / *shape and returns 1; else 0. */
static int verify_option(int argc, char **argv, int *i, verify_opts *v, const char **shape) {
    const char *a = argv[*i];
    if (!strcmp(a, "--backend")) {
        v->backend = cli_value(argc, argv, i);
        if (strcmp(v->backend, "cpu") && strcmp(v->backend, "cuda")) {
            fprintf(stderr, "specd bench: --backend must be cpu or cuda, not '%s'\n", v->backend);
            exit(2);
        }
    } else if (!strcmp(a, "--device")) {
        v->device = (int)cli_int(a, cli_value(argc, argv, i), 0, 1023);
    } else if (!strcmp(a, "--shape")) {
        *shape = cli_value(argc, argv, i);
    } else if (!strcmp(a, "--batches")) {
        v->n_b = parse_list(a, cli_value(argc, argv, i), v->batches, MAX_LIST, 1024);
    } else if (!strcmp(a, "--ks")) {
        v->n_k = parse_list(a, cli_value(argc, argv, i), v->ks, MAX_LIST, 256);
    } else if (!strcmp(a, "--prompts")) {
        v->n_p = parse_list(a, cli_value(argc, argv, i), v->prompts, MAX_LIST, 1 << 20);
    } else if (!strcmp(a, "--warmup")) {
        v->warmup = (int)cli_int(a, cli_value(argc, argv, i), 0, 1000);
    } else if (!strcmp(a, "--settle-ms")) {
        v->settle_ms = (double)cli_int(a, cli_value(argc, argv, i), 0, 10000);
    } else if (!strcmp(a, "--peak-gbs")) {
        v->peak_gbs = cli_float(a, cli_value(argc, argv, i), 1e-3, 1e6);
    } else {
        return 0;
    }
    return 1;
}

/* --verify after parsing: the model or the shape, the options that depend
 * on the backend, then the benchmark. */
static int run_verify(const char *model, const char *shape, verify_opts *v) {
    /* per-cell medians: a GPU step is a few ms and noisier run to run than
     * a CPU one, and costs little to repeat */
    if (v->reps <= 0) v->reps = strcmp(v->backend, "cpu") ? 10 : 3;
    v->n_b = sort_unique(v->batches, v->n_b);
    v->n_k = sort_unique(v->ks, v->n_k);
    v->n_p = sort_unique(v->prompts, v->n_p);
    specd_error err = {{0}};
    specd_model_file *m = shape ? bench_shape_create(shape, &err) : specd_model_open(model, &err);
    if (!m) {
        fprintf(stderr, "specd bench: %s\n", err.msg);
        return shape ? 2 : 1;
    }
    int rc = bench_verify(m, shape ? shape : model, shape != NULL, v);
    specd_model_close(m); /* frees a shape's tensor table too (bench_shapes.h) */
    return rc;
}

int cmd_bench(int argc, char **argv) {
    /* --e2e is a different benchmark (through the services) with its own
     * options; hand the whole command line over. */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--e2e")) return cmd_bench_e2e(argc, argv);
    const char *model = NULL, *shape = NULL, *verify_only = NULL;
    int threads = 0, prompt_len = 128, gen = 128, reps = 0, bandwidth = 1, verify = 0;
    specd_precision precision = SPECD_PRECISION_FAST;
    specd_kv_dtype kv_dtype = SPECD_KV_AUTO;
    verify_opts v;
    verify_defaults(&v);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = cli_value(argc, argv, &i);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            threads = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--prompt-len"))
            prompt_len = (int)cli_int(a, cli_value(argc, argv, &i), 1, 8192);
        else if (!strcmp(a, "--gen")) gen = (int)cli_int(a, cli_value(argc, argv, &i), 1, 8192);
        else if (!strcmp(a, "--reps")) reps = (int)cli_int(a, cli_value(argc, argv, &i), 1, 1000);
        else if (!strcmp(a, "--no-bandwidth")) bandwidth = 0;
        else if (!strcmp(a, "--precision"))
            precision = (specd_precision)cli_precision(a, cli_value(argc, argv, &i));
        else if (!strcmp(a, "--kv-cache-dtype"))
            kv_dtype = (specd_kv_dtype)cli_kv_dtype(a, cli_value(argc, argv, &i));
        else if (!strcmp(a, "--verify")) verify = 1;
        else if (verify_option(argc, argv, &i, &v, &shape)) {
            if (!verify_only) verify_only = a;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage();
            return 0;
        } else {
            fprintf(stderr, "specd bench: unknown option '%s'\n", a);
            return 2;
        }
    }
    /* an option the plain benchmark would silently ignore is a mistake */
    if (verify_only && !verify) {
        fprintf(stderr, "specd bench: %s applies to --verify only\n", verify_only);
        return 2;
    }
    if (model && shape) {
        fprintf(stderr, "specd bench: give -m PATH or --shape NAME, not both\n");
        return 2;
    }
    if (!model) model = SPECD_DEFAULT_MODEL;
    if (verify) {
        v.threads = threads;
        v.reps = reps;
        v.measure_bw = bandwidth;
        v.precision = precision;
        v.kv_dtype = kv_dtype;
        return run_verify(model, shape, &v);
    }
    if (!reps) reps = 3;
    specd_error err = {{0}};
    specd_model_file *m = specd_model_open(model, &err);
    if (!m) {
        fprintf(stderr, "specd bench: %s\n", err.msg);
        return 1;
    }
    const specd_llama_hparams *hp = &m->hp;
    int ctx = prompt_len + gen;
    if (ctx > hp->max_seq_len) {
        fprintf(stderr, "specd bench: --prompt-len + --gen = %d exceeds the model context %d\n",
                ctx, hp->max_seq_len);
        specd_model_close(m);
        return 2;
    }
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = threads,
                                            .precision = precision, .kv_dtype = kv_dtype},
                                .n_slots = 1, .max_ctx = ctx, .max_batch = prompt_len};
    specd_transformer *t = specd_transformer_create(m, &o, &err);
    if (!t) {
        fprintf(stderr, "specd bench: %s\n", err.msg);
        specd_model_close(m);
        return 1;
    }
    int n_threads = threads > 0 ? threads : specd_cpu_count();

    /* a fixed pseudo-random prompt: content does not change the cost */
    int32_t *prompt = malloc(sizeof(int32_t) * prompt_len);
    for (int i = 0; i < prompt_len; i++) prompt[i] = (int32_t)((i * 7919u + 13) % hp->vocab_size);
    float *logits = malloc(sizeof(float) * hp->vocab_size);
    double *pre_s = calloc((size_t)reps, sizeof(double)), *dec_s = calloc((size_t)reps, sizeof(double));
    int rc = 0;

    for (int r = 0; r <= reps && !rc; r++) { /* run 0 warms caches and pages */
        int32_t last = prompt_len - 1;
        specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = prompt_len};
        specd_batch b = {.n_tokens = prompt_len, .tokens = prompt, .n_seqs = 1, .seqs = &in,
                         .n_out = 1, .out_rows = &last, .logits = logits};
        double t0 = cli_now();
        rc = specd_transformer_forward(t, &b, &err);
        double t1 = cli_now();
        int32_t tok = specd_argmax(logits, hp->vocab_size), zero = 0;
        for (int g = 0; g < gen && !rc; g++) {
            in = (specd_seq_input){.slot = 0, .n_past = prompt_len + g, .n_new = 1};
            b = (specd_batch){.n_tokens = 1, .tokens = &tok, .n_seqs = 1, .seqs = &in,
                              .n_out = 1, .out_rows = &zero, .logits = logits};
            rc = specd_transformer_forward(t, &b, &err);
            tok = specd_argmax(logits, hp->vocab_size);
        }
        double t2 = cli_now();
        if (r > 0) {
            pre_s[r - 1] = t1 - t0;
            dec_s[r - 1] = t2 - t1;
        }
    }
    if (rc) {
        fprintf(stderr, "specd bench: %s\n", err.msg);
    } else {
        double pre = median(pre_s, reps), dec = median(dec_s, reps);
        double wbytes = specd_transformer_decode_weight_bytes(t);
        /* decode token g reads the prompt's rows and those of the tokens
         * before it and its own, prompt_len + g + 1 of them: on average over
         * the run prompt_len + (gen + 1) / 2 (at 3,000 tokens of SmolLM2's
         * fp16 cache 69 MB, most of a step's read beside 97 MB of weights) */
        double kvbytes = kv_token_bytes(hp, specd_transformer_kv_dtype(t)) *
                         (prompt_len + (gen + 1) / 2.0);
        double achieved = (wbytes + kvbytes) * gen / dec / 1e9;
        printf("model    %s (%d layers, dim %d, vocab %d)\n", model, hp->n_layers, hp->dim,
               hp->vocab_size);
        printf("backend  %s (%s, precision %s, KV cache %s), %d threads, median of %d runs\n\n",
               specd_transformer_backend_name(t), cpu_simd_name(),
               specd_precision_names[precision], specd_kv_type_name(specd_transformer_kv_dtype(t)),
               n_threads, reps);
        printf("| phase   | tokens | time (ms) | tokens/s |\n");
        printf("|---------|-------:|----------:|---------:|\n");
        printf("| prefill | %6d | %9.1f | %8.1f |\n", prompt_len, pre * 1e3, prompt_len / pre);
        printf("| decode  | %6d | %9.1f | %8.1f |\n", gen, dec * 1e3, gen / dec);
        printf("\nread per decode token: %.1f MB of weights + %.1f MB of KV cache (on average) "
               "-> %.1f GB/s achieved\n",
               wbytes / 1e6, kvbytes / 1e6, achieved);
        if (bandwidth) {
            double bw = measure_bandwidth(n_threads);
            printf("memory read bandwidth (%d threads): %.1f GB/s -> decode bound %.1f tokens/s; "
                   "decode runs at %.0f%% of it\n",
                   n_threads, bw, bw * 1e9 / (wbytes + kvbytes), 100.0 * achieved / bw);
            print_prefill_bound(hp, prompt_len, pre, precision, n_threads);
        }
    }
    free(prompt);
    free(logits);
    free(pre_s);
    free(dec_s);
    specd_transformer_free(t);
    specd_model_close(m);
    return rc ? 1 : 0;
}
