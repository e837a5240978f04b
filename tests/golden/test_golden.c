/* test_golden.c - our forward pass against Hugging Face transformers.
 *
 * For every fixture set under tests/golden/data/ (made offline by
 * tests/golden/make_golden.py; see tests/golden/README.md) and every case in
 * it: load the case's model file (HF safetensors directory or GGUF in
 * F32/F16/BF16/Q8_0/Q4_1), prefill the prompt in one call, and require
 *   - logits within the set's tolerance (1e-4 relative to the row scale for
 *     fp32 on identical weights; the README explains the rule),
 *   - the post-norm hidden state within tolerance,
 *   - the 64-token greedy continuation identical, token for token.
 * The real model's set (smollm2) needs models/ from scripts/fetch_model.sh;
 * without it those cases are skipped with a message, never silently.
 *
 * When a CUDA backend can be created, every case runs again on it (after
 * the CPU run, which is unchanged), with the same checks:
 *   - prefill logits and hidden state against the reference, within a
 *     tolerance set by the precision the GPU computes in (the rule is the
 *     fixtures': max |diff| <= tol * max(1, max |ref|)):
 *       F32 models          2e-4: the transformer keeps fp32 weights and KV
 *                           on the GPU (kv_dtype F32) and cuBLAS runs fp32 without
 *                           TF32, so only summation order differs (~1e-5
 *                           measured on the CPU); 2x the fixtures' 1e-4;
 *       F16 and quantized   1.5e-2: the GPU keeps fp16 weights (quantized ones
 *                           dequantized to fp16), rounds every GEMM input to
 *                           fp16 (u = 4.9e-4) and keeps fp16 KV; a CPU
 *                           emulation of exactly that rounding gave at most
 *                           3.9e-3 (logits) and 5e-3 (hidden) over these
 *                           fixtures (smollm2: 1.7e-3), so ~3-4x margin;
 *       BF16 models         6e-2: GEMM inputs rounded to bf16 (u = 3.9e-3);
 *                           the same emulation gave 2.1e-2 / 1.2e-2;
 *   - the argmax the GPU computes equals specd_argmax of the logits it
 *     returns (exactly: same numbers);
 *   - the greedy continuation: each decode step's logits within the same
 *     tolerance of the CPU's logits for the same history, and the tokens
 *     identical to the reference - for F32 models at every step; for the
 *     others a flip is accepted (and the comparison stops there) only at a
 *     step whose reference top1-top2 margin is below 2 * tol * max(1,
 *     max |ref|), the near-tie rule of tests/golden/README.md (the
 *     emulation flips hf_bf16 and gguf_f16_keys cases at such steps).
 * Without a CUDA device one "SKIPPED:" line says why.
 *
 * Every case also runs on the CPU with an fp16 KV cache (kv_cache_dtype
 * f16), with the CUDA run's checks at the tolerance KV_F16_TOL. */
#include <dirent.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/spec/sampling.h"
#include "common/model/transformer.h"
#include "tests/harness/golden.h"
#include "tests/harness/test_util.h"

static int g_cases_run, g_cases_skipped;
static int g_cuda_state; /* 0 = not probed, 1 = available, -1 = not */
static int g_cuda_cases_run;

/* 1 when a CUDA backend can be created here; the first call that finds
 * none prints the one SKIPPED line. */
static int cuda_available(void) {
    if (g_cuda_state == 0) {
        specd_error err = {{0}};
        specd_backend_opts o = {.name = "cuda"};
        specd_backend *be = specd_backend_create(&o, &err);
        if (be) {
            be->ops->destroy(be);
            g_cuda_state = 1;
        } else {
            g_cuda_state = -1;
            printf("SKIPPED: golden comparisons on the CUDA backend: %s\n", err.msg);
            fflush(stdout);
        }
    }
    return g_cuda_state > 0;
}

/* The CUDA run of a case: see the top of the file. cpu_steps[s] are the
 * CPU's logits from which greedy token s was picked (s = 0: the prompt's
 * last row), along the reference's path (the CPU run matched it). */
static void check_case_on(const golden_case *c, const specd_model_file *m,
                          const float *cpu_steps, const specd_backend_opts *bo, const char *on,
                          double tol, int exact_greedy) {
    specd_error err = {{0}};
    int vocab = m->hp.vocab_size, dim = m->hp.dim, n = c->n_prompt;
    specd_transformer_opts o = {.backend = *bo, .n_slots = 1,
                                .max_ctx = n + c->n_greedy + 1, .max_batch = n};
    specd_transformer *t = specd_transformer_create(m, &o, &err);
    if (!t) fail_msg("%s on %s: %s", c->name, on, err.msg);

    int all = c->logits.present && c->logits.positions == GOLDEN_POS_ALL;
    int n_rows = all ? n : 1;
    int32_t *rows = malloc(sizeof(int32_t) * n_rows), *ids = malloc(sizeof(int32_t) * n_rows);
    for (int i = 0; i < n_rows; i++) rows[i] = all ? i : n - 1;
    float *logits = malloc(sizeof(float) * n_rows * vocab);
    float *hidden = malloc(sizeof(float) * n_rows * dim);
    specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = n};
    specd_batch b = {.n_tokens = n, .tokens = c->prompt, .n_seqs = 1, .seqs = &in,
                     .n_out = n_rows, .out_rows = rows, .logits = logits, .hidden = hidden,
                     .argmax = ids};
    if (specd_transformer_forward(t, &b, &err))
        fail_msg("%s on %s: forward: %s", c->name, on, err.msg);
    for (int r = 0; r < n_rows; r++)
        if (ids[r] != specd_argmax(logits + (size_t)r * vocab, vocab))
            fail_msg("%s on %s: row %d: device argmax %d, specd_argmax of its logits %d", c->name, on,
                     r, ids[r], specd_argmax(logits + (size_t)r * vocab, vocab));

    double ref_scale = 1.0;
    if (c->logits.present) {
        float *ref = golden_load_array(&c->logits, &err);
        if (!ref) fail_msg("%s: %s", c->name, on, err.msg);
        golden_diff d = golden_compare(logits, ref, n_rows, vocab);
        if (!golden_within(&d, tol))
            fail_msg("%s on %s: logits differ: max |diff| %.3g at %zu, max |ref| %.3g, tolerance "
                     "%.1g relative; argmax mismatches %d",
                     c->name, on, d.max_abs, d.worst, d.max_ref, tol, d.argmax_mismatches);
        ref_scale = d.max_ref > 1 ? d.max_ref : 1;
        free(ref);
    }
    if (c->hidden.present) {
        float *ref = golden_load_array(&c->hidden, &err);
        if (!ref) fail_msg("%s: %s", c->name, on, err.msg);
        int hrows = c->hidden.rows;
        const float *got = hrows == n_rows ? hidden : hidden + (size_t)(n_rows - 1) * dim;
        golden_diff d = golden_compare(got, ref, hrows, dim);
        if (!golden_within(&d, tol))
            fail_msg("%s on %s: hidden state differs: max |diff| %.3g, max |ref| %.3g, tolerance "
                     "%.1g relative",
                     c->name, on, d.max_abs, d.max_ref, tol);
        free(ref);
    }

    /* greedy, one token per step; step s picks from `cur` */
    const float *cur = logits + (size_t)(n_rows - 1) * vocab;
    int32_t next = ids[n_rows - 1], zero = 0;
    for (int s = 0; s < c->n_greedy; s++) {
        golden_diff d = golden_compare(cur, cpu_steps + (size_t)s * vocab, 1, vocab);
        double scale = d.max_ref > 1 ? d.max_ref : 1;
        if (!(d.max_abs <= tol * scale) || d.nonfinite)
            fail_msg("%s on %s: greedy step %d: logits differ from the cpu's for the same "
                     "tokens: max |diff| %.3g, max |cpu| %.3g, tolerance %.1g relative",
                     c->name, on, s, d.max_abs, d.max_ref, tol);
        if (next != c->greedy[s]) {
            double margin = c->greedy_margins ? c->greedy_margins[s] : 0;
            if (exact_greedy || !(margin < 2 * tol * ref_scale))
                fail_msg("%s on %s: greedy continuation differs at step %d: got %d, reference "
                         "%d (reference top1-top2 margin there %.3g, near-tie bound %.3g)",
                         c->name, on, s, next, c->greedy[s], margin,
                         exact_greedy ? 0.0 : 2 * tol * ref_scale);
            printf("  %s on %s: near-tie flip at greedy step %d (margin %.3g < %.3g); compared "
                   "up to there\n",
                   c->name, on, s, margin, 2 * tol * ref_scale);
            break;
        }
        if (s + 1 == c->n_greedy) break;
        in = (specd_seq_input){.slot = 0, .n_past = n + s, .n_new = 1};
        b = (specd_batch){.n_tokens = 1, .tokens = &next, .n_seqs = 1, .seqs = &in, .n_out = 1,
                          .out_rows = &zero, .logits = logits, .argmax = ids};
        if (specd_transformer_forward(t, &b, &err))
            fail_msg("%s on %s: decode: %s", c->name, on, err.msg);
        if (ids[0] != specd_argmax(logits, vocab))
            fail_msg("%s on %s: greedy step %d: device argmax %d, specd_argmax of its logits %d",
                     c->name, on, s + 1, ids[0], specd_argmax(logits, vocab));
        cur = logits;
        next = ids[0];
    }
    free(rows);
    free(ids);
    free(logits);
    free(hidden);
    specd_transformer_free(t);
}

/* The CUDA run of a case, with the tolerance of the precision the GPU
 * computes in (top of the file). */
static void check_case_cuda(const golden_case *c, const specd_model_file *m,
                            const float *cpu_steps) {
    const specd_tensor *wq = specd_model_tensor(m, "blk.0.attn_q.weight");
    specd_dtype wt = wq ? wq->type : SPECD_F16;
    double tol = wt == SPECD_F32 ? 2e-4 : wt == SPECD_BF16 ? 6e-2 : 1.5e-2;
    specd_backend_opts bo = {.name = "cuda"};
    check_case_on(c, m, cpu_steps, &bo, "cuda", tol, wt == SPECD_F32);
    g_cuda_cases_run++;
}

/* The CPU with an fp16 KV cache (kv_cache_dtype f16), precision exact: K
 * and V rounded to fp16 (u = 4.9e-4) as they are stored, everything else
 * as the fp32 run; the same checks as on CUDA. Measured over these
 * fixtures (2026-11-27): at most 2.8e-3 relative in prefill logits and
 * 3.0e-3 in a greedy step's logits against the fp32 run's (tiny models;
 * smollm2 5.1e-4 and 7.6e-4). The error grows with the sharpness of the
 * model's attention and the length of the history: tiny-gqa after a random
 * 130-token prompt reaches 5.1e-3, the same on the scalar path as on every
 * SIMD one (so rounding, not a kernel), and the GPU kit's extra set (a
 * transformers model initialised with std 0.2, 10x the usual, so its
 * attention is near one-hot) reached 1.02e-2 at its 130-token prompt's
 * greedy step 49 (H200 machine, 2026-11-28). KV_F16_TOL is the CUDA fp16
 * tolerance's 1.5e-2 raised to 2e-2, a 2x margin over that worst case.
 * Flips are accepted at near-ties only, as on CUDA. */
#define KV_F16_TOL 2e-2

static void check_case_kv_f16(const golden_case *c, const specd_model_file *m,
                              const float *cpu_steps) {
    specd_backend_opts bo = {.name = "cpu", .n_threads = 2, .precision = SPECD_PRECISION_EXACT,
                             .kv_dtype = SPECD_KV_F16};
    check_case_on(c, m, cpu_steps, &bo, "cpu with f16 KV", KV_F16_TOL, 0);
}

/* Prefills c->prompt, compares logits and hidden state, then decodes greedily
 * and compares the continuation. */
static void check_case(const golden_set *g, const golden_case *c) {
    specd_error err = {{0}};
    if (!test_file_exists(c->model_path)) {
        printf("  SKIP %s/%s: %s not present (run scripts/fetch_model.sh)\n", g->model, c->name,
               c->model_path);
        g_cases_skipped++;
        return;
    }
    specd_model_file *m = specd_model_open(c->model_path, &err);
    if (!m) fail_msg("%s: open %s: %s", c->name, c->model_path, err.msg);
    int vocab = m->hp.vocab_size, dim = m->hp.dim, n = c->n_prompt;
    assert_int_equal(vocab, g->config.vocab_size);
    /* precision exact: the Hugging Face references are fp32 matmuls on the
     * dequantized weights (the fast path has its own llama.cpp reference,
     * test_llamacpp_logits) */
    specd_transformer_opts o = {.backend = {.name = "cpu", .n_threads = 2,
                                            .precision = SPECD_PRECISION_EXACT},
                                .n_slots = 1, .max_ctx = n + c->n_greedy + 1, .max_batch = n};
    specd_transformer *t = specd_transformer_create(m, &o, &err);
    if (!t) fail_msg("%s: %s", c->name, err.msg);

    /* rows the fixture has: every prompt position, or just the last */
    int all = c->logits.present && c->logits.positions == GOLDEN_POS_ALL;
    int n_rows = all ? n : 1;
    int32_t *rows = malloc(sizeof(int32_t) * n_rows);
    for (int i = 0; i < n_rows; i++) rows[i] = all ? i : n - 1;
    float *logits = malloc(sizeof(float) * n_rows * vocab);
    float *hidden = malloc(sizeof(float) * n_rows * dim);
    specd_seq_input in = {.slot = 0, .n_past = 0, .n_new = n};
    specd_batch b = {.n_tokens = n, .tokens = c->prompt, .n_seqs = 1, .seqs = &in,
                     .n_out = n_rows, .out_rows = rows, .logits = logits, .hidden = hidden};
    if (specd_transformer_forward(t, &b, &err)) fail_msg("%s: forward: %s", c->name, err.msg);

    if (c->logits.present) {
        float *ref = golden_load_array(&c->logits, &err);
        if (!ref) fail_msg("%s: %s", c->name, err.msg);
        assert_int_equal(c->logits.rows, n_rows);
        golden_diff d = golden_compare(logits, ref, n_rows, vocab);
        if (!golden_within(&d, g->logits_rel))
            fail_msg("%s: logits differ: max |diff| %.3g at %zu, max |ref| %.3g, tolerance %.1g "
                     "relative; argmax mismatches %d",
                     c->name, d.max_abs, d.worst, d.max_ref, (double)g->logits_rel,
                     d.argmax_mismatches);
        free(ref);
    }
    if (c->hidden.present) {
        float *ref = golden_load_array(&c->hidden, &err);
        if (!ref) fail_msg("%s: %s", c->name, err.msg);
        int hrows = c->hidden.rows;
        /* the hidden fixture may cover all positions or only the last */
        const float *got = hrows == n_rows ? hidden : hidden + (size_t)(n_rows - 1) * dim;
        golden_diff d = golden_compare(got, ref, hrows, dim);
        if (!golden_within(&d, g->hidden_rel))
            fail_msg("%s: hidden state differs: max |diff| %.3g, max |ref| %.3g", c->name,
                     d.max_abs, d.max_ref);
        free(ref);
    }

    /* greedy continuation, one token per step, no EOS stop; with a GPU the
     * logits of every step are kept for the CUDA run to compare with */
    float *steps = malloc(sizeof(float) * c->n_greedy * vocab);
    int32_t *out = malloc(sizeof(int32_t) * (c->n_greedy + 1));
    int32_t next = specd_argmax(logits + (size_t)(n_rows - 1) * vocab, vocab), zero = 0;
    if (steps)
        memcpy(steps, logits + (size_t)(n_rows - 1) * vocab, sizeof(float) * vocab);
    for (int s = 0; s < c->n_greedy; s++) {
        out[s] = next;
        if (s + 1 == c->n_greedy) break;
        in = (specd_seq_input){.slot = 0, .n_past = n + s, .n_new = 1};
        b = (specd_batch){.n_tokens = 1, .tokens = &next, .n_seqs = 1, .seqs = &in, .n_out = 1,
                          .out_rows = &zero, .logits = logits};
        if (specd_transformer_forward(t, &b, &err)) fail_msg("%s: decode: %s", c->name, err.msg);
        next = specd_argmax(logits, vocab);
        if (steps) memcpy(steps + (size_t)(s + 1) * vocab, logits, sizeof(float) * vocab);
    }
    int diff = golden_greedy_first_diff(c, out, c->n_greedy);
    if (diff >= 0)
        fail_msg("%s: greedy continuation differs at step %d: got %d, reference %d (reference "
                 "top1-top2 margin there %.3g)",
                 c->name, diff, out[diff], c->greedy[diff],
                 c->greedy_margins ? (double)c->greedy_margins[diff] : -1.0);
    g_cases_run++;
    free(out);
    free(rows);
    free(logits);
    free(hidden);
    specd_transformer_free(t);
    check_case_kv_f16(c, m, steps);
    if (cuda_available()) check_case_cuda(c, m, steps);
    free(steps);
    specd_model_close(m);
}

/* Runs the first max_cases cases of the set in dir (all: INT_MAX). */
static void run_set_dir(const char *dir, int max_cases) {
    specd_error err = {{0}};
    golden_set *g = golden_load(dir, &err);
    if (!g) fail_msg("golden set %s: %s", dir, err.msg);
    int n = g->n_cases < max_cases ? g->n_cases : max_cases;
    if (n < g->n_cases) printf("  %s: the first %d of %d cases\n", dir, n, g->n_cases);
    for (int i = 0; i < n; i++) check_case(g, &g->cases[i]);
    golden_free(g);
}

static void run_set(const char *name, int max_cases) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", test_path("tests/golden/data"));
    size_t len = strlen(dir);
    snprintf(dir + len, sizeof dir - len, "/%s", name);
    run_set_dir(dir, max_cases);
}

static void test_tiny_gqa(void **state) {
    (void)state;
    run_set("tiny-gqa", INT_MAX);
}

static void test_tiny_tied(void **state) {
    (void)state;
    run_set("tiny-tied", INT_MAX);
}

/* The real model. Under the sanitizers (the CI job that looks for memory
 * errors, not at numbers: the plain build runs every case) two of its ten
 * cases: the others take the same code at the same shapes, and at ASan's
 * ~10x slowdown they made test_golden that job's longest test (630 s). */
#ifdef SPECD_SANITIZE_BUILD
#define SMOLLM2_CASES 2
#else
#define SMOLLM2_CASES INT_MAX
#endif

static void test_smollm2(void **state) {
    (void)state;
    run_set("smollm2", SMOLLM2_CASES);
}

/* A fixture set made elsewhere, named by SPECD_GOLDEN_EXTRA: the GPU kit's
 * PyTorch cross-check (scripts/gpu/torch_xcheck.py writes a set whose
 * references PyTorch computed on the GPU; scripts/gpu/check.sh points this
 * test at it). Same checks as the committed sets, CPU and CUDA. */
static void test_extra_set(void **state) {
    (void)state;
    const char *dir = getenv("SPECD_GOLDEN_EXTRA");
    if (!dir || !*dir) {
        printf("SKIPPED: no extra fixture set (SPECD_GOLDEN_EXTRA is not set)\n");
        return;
    }
    run_set_dir(dir, INT_MAX);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_gqa),
        cmocka_unit_test(test_tiny_tied),
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_extra_set),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    printf("golden: %d cases compared, %d skipped\n", g_cases_run, g_cases_skipped);
    if (g_cuda_state > 0) printf("golden on cuda: %d cases compared\n", g_cuda_cases_run);
    return rc;
}
