/* test_matmul.c - CPU matmul/dequant kernels against their references, and
 * the thread pool.
 *
 * Weights are random but valid blocks of each type (random quants, random
 * fp16 scales), activations random in [-1, 1]. Every SIMD path this CPU has
 * is tested (scalar always; avx2 and avx512 when present), with several pool
 * sizes (none, 1, 2 and 3 threads, the last more than this CI box's cores).
 *
 * Tolerances:
 *   - dequantization must equal cpu_dequant_row_ref bit for bit (the fast
 *     paths reproduce the reference's order of float operations; fp16 and
 *     bf16 conversions are exact);
 *   - matmul outputs must satisfy |y - y_ref| <= 1e-5 * sum_c |w_c * x_c|.
 *     y_ref accumulates in double, so the difference is the fast kernel's
 *     float rounding: each weight may differ by half an ulp (FMA instead of
 *     multiply-then-add when expanding Q4_1/Q4_K), and float accumulation
 *     over ~cols/32 terms per lane plus a lane reduction adds a few ulps of
 *     the running sum of magnitudes. Scaling by sum |w*x| (not |y|) keeps
 *     the bound meaningful when positive and negative terms cancel. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util/dtype.h"
#include "common/spec/sampling.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/peak.h"
#include "kernels/cpu/quant_impl.h" /* the attention kernel set */
#include "kernels/cpu/threadpool.h"
#include "tests/harness/test_util.h"

/* ---- random valid weights ---------------------------------------------- */

static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* ---- the SIMD paths to test -------------------------------------------- */

static const char *const k_paths[] = {"scalar", "avx2", "avx512"};

static const specd_dtype k_types[] = {SPECD_F32,  SPECD_F16,  SPECD_BF16, SPECD_Q8_0,
                                      SPECD_Q4_0, SPECD_Q4_1, SPECD_Q5_0, SPECD_Q5_1,
                                      SPECD_Q4_K, SPECD_Q5_K, SPECD_Q6_K, SPECD_Q2_K,
                                      SPECD_Q3_K, SPECD_IQ4_NL, SPECD_IQ4_XS};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

/* ---- dequantization ----------------------------------------------------- */

static void test_dequant_exact(void **state) {
    (void)state;
    for (size_t p = 0; p < 3; p++) {
        if (!cpu_simd_force(k_paths[p])) {
            print_message("  (path %s not available on this CPU)\n", k_paths[p]);
            continue;
        }
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            specd_dtype type = k_types[ti];
            const int64_t be = specd_dtype_get(type)->block_elems;
            /* lengths: one block, odd block counts, and plain tails */
            const int64_t lens[] = {256, 512, 1280, 4096, 32 * 3, 70, 2085, 1};
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                int64_t n = lens[li];
                if (n % be) continue;
                size_t rb;
                uint8_t *w = test_random_weights(type, 1, n, 11 + li, &rb);
                float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
                cpu_dequant_row(type, w, a, n);
                cpu_dequant_row_ref(type, w, b, n);
                if (memcmp(a, b, (size_t)n * 4) != 0) {
                    for (int64_t i = 0; i < n; i++)
                        if (memcmp(&a[i], &b[i], 4))
                            fail_msg("%s %s n=%lld: element %lld is %.9g, ref %.9g", k_paths[p],
                                     specd_dtype_get(type)->name, (long long)n, (long long)i,
                                     a[i], b[i]);
                }
                free(a);
                free(b);
                free(w);
            }
        }
    }
    cpu_simd_force("auto");
}

/* Hand-made blocks with known values pin the layouts themselves (the random
 * comparisons above only show that fast == reference). */
static void test_dequant_known_values(void **state) {
    (void)state;
    float out[256];
    /* Q4_1: d = 0.5, m = -1, byte j = (j+1) << 4 | j -> element j = j*0.5-1,
     * element j+16 = ((j+1)&15)*0.5 - 1 */
    uint8_t q41[20];
    put_u16(q41, specd_f32_to_fp16(0.5f));
    put_u16(q41 + 2, specd_f32_to_fp16(-1.0f));
    for (int j = 0; j < 16; j++) q41[4 + j] = (uint8_t)((((j + 1) & 15) << 4) | j);
    cpu_dequant_row_ref(SPECD_Q4_1, q41, out, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == j * 0.5f - 1.0f);
        assert_true(out[j + 16] == ((j + 1) & 15) * 0.5f - 1.0f);
    }
    /* Q4_0: d = 2, nibble 8 -> 0, nibble 0 -> -16, nibble 15 -> 14 */
    uint8_t q40[18];
    put_u16(q40, specd_f32_to_fp16(2.0f));
    for (int j = 0; j < 16; j++) q40[2 + j] = (uint8_t)(0xF0 | (j == 0 ? 8 : 0));
    cpu_dequant_row_ref(SPECD_Q4_0, q40, out, 32);
    assert_true(out[0] == 0.0f && out[1] == -16.0f && out[16] == 14.0f);
    /* Q5_0 (GGML's block_q5_0): d = 1; byte j holds j (element j) and 15-j
     * (element j+16); qh = 0xAAAA5555, bit e the fifth bit of element e:
     * the even elements below 16 and the odd ones above get 16 */
    uint8_t q50[22];
    put_u16(q50, specd_f32_to_fp16(1.0f));
    const uint32_t qh = 0xAAAA5555u;
    memcpy(q50 + 2, &qh, 4);
    for (int j = 0; j < 16; j++) q50[6 + j] = (uint8_t)(j | ((15 - j) << 4));
    cpu_dequant_row_ref(SPECD_Q5_0, q50, out, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == (float)(j + (j % 2 == 0 ? 16 : 0) - 16));
        assert_true(out[16 + j] == (float)(15 - j + (j % 2 ? 16 : 0) - 16));
    }
    /* Q5_1: the same quants with d = 0.5, m = -2: w = q * 0.5 - 2 */
    uint8_t q51[24];
    put_u16(q51, specd_f32_to_fp16(0.5f));
    put_u16(q51 + 2, specd_f32_to_fp16(-2.0f));
    memcpy(q51 + 4, q50 + 2, 20);
    cpu_dequant_row_ref(SPECD_Q5_1, q51, out, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == (float)(j + (j % 2 == 0 ? 16 : 0)) * 0.5f - 2.0f);
        assert_true(out[16 + j] == (float)(15 - j + (j % 2 ? 16 : 0)) * 0.5f - 2.0f);
    }
    /* Q8_0: d = 0.25, q = -128..-97 */
    uint8_t q80[34];
    put_u16(q80, specd_f32_to_fp16(0.25f));
    for (int j = 0; j < 32; j++) q80[2 + j] = (uint8_t)(int8_t)(-128 + j);
    cpu_dequant_row_ref(SPECD_Q8_0, q80, out, 32);
    for (int j = 0; j < 32; j++) assert_true(out[j] == 0.25f * (float)(-128 + j));
    /* Q4_K: d = 1, dmin = 1; sub-block s has scale s+1 (s<4) / 40+s (s>=4)
     * and min 2s (s<4) / 20+s (s>=4); all quants 3 (low) and 5 (high). */
    uint8_t q4k[144] = {0};
    put_u16(q4k, specd_f32_to_fp16(1.0f));
    put_u16(q4k + 2, specd_f32_to_fp16(1.0f));
    for (int s = 0; s < 4; s++) {
        int sc_hi = 40 + s + 4, mn_hi = 20 + s + 4; /* sub-blocks 4..7 */
        q4k[4 + s] = (uint8_t)((s + 1) | ((sc_hi >> 4) << 6));
        q4k[4 + s + 4] = (uint8_t)((2 * s) | ((mn_hi >> 4) << 6));
        q4k[4 + s + 8] = (uint8_t)((sc_hi & 15) | ((mn_hi & 15) << 4));
    }
    memset(q4k + 16, 0x53, 128);
    cpu_dequant_row_ref(SPECD_Q4_K, q4k, out, 256);
    for (int s = 0; s < 8; s++) {
        float sc = s < 4 ? (float)(s + 1) : (float)(40 + s);
        float mn = s < 4 ? (float)(2 * s) : (float)(20 + s);
        float q = (s & 1) ? 5.0f : 3.0f;
        for (int j = 0; j < 32; j++) assert_true(out[32 * s + j] == sc * q - mn);
    }
    /* Q5_K (GGML's block_q5_K): Q4_K's scales and nibbles above, and qh[l]
     * = l: element l of sub-block s gets 16 when bit s of l is set */
    uint8_t q5k[176];
    memcpy(q5k, q4k, 16);
    for (int l = 0; l < 32; l++) q5k[16 + l] = (uint8_t)l;
    memset(q5k + 48, 0x53, 128);
    cpu_dequant_row_ref(SPECD_Q5_K, q5k, out, 256);
    for (int s = 0; s < 8; s++) {
        float sc = s < 4 ? (float)(s + 1) : (float)(40 + s);
        float mn = s < 4 ? (float)(2 * s) : (float)(20 + s);
        for (int l = 0; l < 32; l++) {
            float q = ((s & 1) ? 5.0f : 3.0f) + (float)(((l >> s) & 1) * 16);
            assert_true(out[32 * s + l] == sc * q - mn);
        }
    }
    /* Q6_K: d = 1, scales = index+1; ql = 0x21 (lo 1, hi 2), qh = 0b11100100
     * (quarters get high bits 0,1,2,3) -> quarter k: q = lo|hi<<4 - 32 */
    uint8_t q6k[210];
    memset(q6k, 0x21, 128);
    memset(q6k + 128, 0xE4, 64);
    for (int i = 0; i < 16; i++) q6k[192 + i] = (uint8_t)(i + 1);
    put_u16(q6k + 208, specd_f32_to_fp16(1.0f));
    cpu_dequant_row_ref(SPECD_Q6_K, q6k, out, 256);
    for (int i = 0; i < 256; i++) {
        int h = i / 128, k = (i % 128) / 32, l = i % 32;
        int lo = (k >= 2) ? 2 : 1;
        int q = (lo | (k << 4)) - 32;
        float sc = (float)(8 * h + 2 * k + l / 16 + 1);
        assert_true(out[i] == sc * (float)q);
    }
    /* Q2_K (GGML's block_q2_K): d = 1, dmin = 0.5; sub-block s has scale s
     * and min 15 - s; every qs byte 0xE4, so group g's 2-bit quants are
     * g % 4 (bits 2(g % 4) of each byte). */
    uint8_t q2k[84];
    for (int s = 0; s < 16; s++) q2k[s] = (uint8_t)(s | (15 - s) << 4);
    memset(q2k + 16, 0xE4, 64);
    put_u16(q2k + 80, specd_f32_to_fp16(1.0f));
    put_u16(q2k + 82, specd_f32_to_fp16(0.5f));
    cpu_dequant_row_ref(SPECD_Q2_K, q2k, out, 256);
    for (int i = 0; i < 256; i++) {
        const int g = i / 32, s = i / 16;
        assert_true(out[i] == (float)s * (float)(g % 4) - 0.5f * (float)(15 - s));
    }
    /* IQ4_NL: d = 0.5, qs[j] = j | (15 - j) << 4: element j is level j,
     * element j + 16 level 15 - j; GGML's levels written out here. */
    static const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};
    uint8_t nl[18];
    put_u16(nl, specd_f32_to_fp16(0.5f));
    for (int j = 0; j < 16; j++) nl[2 + j] = (uint8_t)(j | (15 - j) << 4);
    cpu_dequant_row_ref(SPECD_IQ4_NL, nl, out, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == 0.5f * (float)levels[j]);
        assert_true(out[j + 16] == 0.5f * (float)levels[15 - j]);
    }
    /* IQ4_XS: d = 1; block j's 6-bit scale 4j + 3 (low nibbles 4j + 3 & 15
     * in scales_l, top bits (4j + 3) >> 4 in scales_h); every nibble 9 */
    uint8_t xs[136] = {0};
    put_u16(xs, specd_f32_to_fp16(1.0f));
    uint16_t sh = 0;
    for (int j = 0; j < 8; j++) {
        const int sc = 4 * j + 3;
        xs[4 + j / 2] |= (uint8_t)((sc & 15) << (4 * (j % 2)));
        sh |= (uint16_t)((sc >> 4) << (2 * j));
    }
    put_u16(xs + 2, sh);
    memset(xs + 8, 0x99, 128);
    cpu_dequant_row_ref(SPECD_IQ4_XS, xs, out, 256);
    for (int i = 0; i < 256; i++)
        assert_true(out[i] == (float)(4 * (i / 32) + 3 - 32) * (float)levels[9]);
    /* Q3_K (block_q3_K): d = 1; scale bytes 0..7 = k | k << 4 and 8..11 =
     * 0xE4, so sub-block s's 6-bit scale is (s % 8) | (s / 4) << 4; hmask
     * 0x55 sets the third bit of even groups only (odd ones subtract 4). */
    uint8_t q3k[110];
    memset(q3k, 0x55, 32);
    memset(q3k + 32, 0xE4, 64);
    for (int k = 0; k < 8; k++) q3k[96 + k] = (uint8_t)(k | k << 4);
    memset(q3k + 104, 0xE4, 4);
    put_u16(q3k + 108, specd_f32_to_fp16(1.0f));
    cpu_dequant_row_ref(SPECD_Q3_K, q3k, out, 256);
    for (int i = 0; i < 256; i++) {
        const int g = i / 32, s = i / 16;
        const int sc = ((s % 8) | (s / 4) << 4) - 32, q = g % 4 - (g % 2 ? 4 : 0);
        assert_true(out[i] == (float)sc * (float)q);
    }
}

/* ---- matmul ------------------------------------------------------------- */

/* Largest err / sum|w*x| seen, reported so that a shrinking margin shows. */
static double g_worst_ratio;

typedef struct shape {
    int64_t rows, cols;
} shape;

static void check_matmul(specd_pool *pool, const char *path, specd_dtype type, shape sh,
                         int n_tok, uint64_t seed) {
    size_t rb;
    uint8_t *w = test_random_weights(type, sh.rows, sh.cols, seed, &rb);
    specd_tensor W;
    memset(&W, 0, sizeof W);
    snprintf(W.name, sizeof W.name, "test.weight");
    W.type = type;
    W.n_dims = 2;
    W.ne[0] = (uint64_t)sh.cols;
    W.ne[1] = (uint64_t)sh.rows;
    W.ne[2] = W.ne[3] = 1;
    W.data = w;
    W.nbytes = rb * (size_t)sh.rows;

    float *x = malloc(sizeof(float) * (size_t)(n_tok * sh.cols));
    test_fill_random(x, (size_t)(n_tok * sh.cols), seed + 7, 1.0f);
    float *y = malloc(sizeof(float) * (size_t)(n_tok * sh.rows));
    float *yr = malloc(sizeof(float) * (size_t)(n_tok * sh.rows));
    float *wr = malloc(sizeof(float) * (size_t)sh.cols);
    for (int64_t i = 0; i < n_tok * sh.rows; i++) y[i] = NAN; /* catch unwritten outputs */

    cpu_matmul(pool, y, &W, x, n_tok);
    cpu_matmul_ref(yr, &W, x, n_tok);

    for (int64_t r = 0; r < sh.rows; r++) {
        cpu_dequant_row_ref(type, w + r * rb, wr, sh.cols);
        for (int t = 0; t < n_tok; t++) {
            double mag = 0;
            for (int64_t c = 0; c < sh.cols; c++) mag += fabs((double)wr[c] * x[t * sh.cols + c]);
            double got = y[t * sh.rows + r], want = yr[t * sh.rows + r];
            double err = fabs(got - want);
            if (mag > 0 && err / mag > g_worst_ratio) g_worst_ratio = err / mag;
            if (!(err <= 1e-5 * mag + 1e-30))
                fail_msg("%s %s [%lld x %lld] n_tok=%d threads=%d: y[%d][%lld] = %.9g, ref %.9g "
                         "(err %.3g, bound %.3g)",
                         path, specd_dtype_get(type)->name, (long long)sh.rows,
                         (long long)sh.cols, n_tok, specd_pool_size(pool), t, (long long)r, got,
                         want, err, 1e-5 * mag);
        }
    }
    free(wr);
    free(yr);
    free(y);
    free(x);
    free(w);
}

static void test_matmul_all(void **state) {
    (void)state;
    /* Shapes: tiny; rows not a multiple of the 16-row chunk granule or of
     * the kernels' row tiles (2, 4, 16 rows); several chunks with a ragged
     * last one; rows split into several column blocks at 8 tokens (1280
     * columns); rows longer than one 2048-column scale segment (2560, 2085);
     * plain-type rows that are not a multiple of 32 (70, 2085). */
    const shape shapes_q[] = {{1, 256}, {37, 512}, {300, 256}, {67, 1280}, {19, 2560}};
    const shape shapes_plain[] = {{5, 70}, {33, 96}, {130, 576}, {7, 2085}};
    const int toks[] = {1, 2, 3, 5, 8, 17};
    specd_pool *pools[4] = {NULL, specd_pool_create(1), specd_pool_create(2),
                            specd_pool_create(3)};
    uint64_t seed = 1;
    for (size_t p = 0; p < 3; p++) {
        if (!cpu_simd_force(k_paths[p])) {
            print_message("  (path %s not available on this CPU)\n", k_paths[p]);
            continue;
        }
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            specd_dtype type = k_types[ti];
            const int64_t be = specd_dtype_get(type)->block_elems;
            for (int set = 0; set < 2; set++) {
                const shape *shs = set ? shapes_plain : shapes_q;
                size_t nsh = set ? sizeof shapes_plain / sizeof shapes_plain[0]
                                 : sizeof shapes_q / sizeof shapes_q[0];
                for (size_t si = 0; si < nsh; si++) {
                    if (shs[si].cols % be) continue;
                    for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++, seed++)
                        check_matmul(pools[(seed >> 1) % 4], k_paths[p], type, shs[si], toks[k],
                                     seed);
                }
            }
        }
    }
    for (int i = 0; i < 4; i++) specd_pool_destroy(pools[i]);
    cpu_simd_force("auto");
    print_message("  worst |y - y_ref| / sum|w*x| = %.3g (bound 1e-5)\n", g_worst_ratio);
}

/* The default model's shapes and types, once per pool size on the auto path. */
static void test_matmul_model_shapes(void **state) {
    (void)state;
    const shape shapes[] = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}};
    for (int threads = 1; threads <= 2; threads++) {
        specd_pool *pool = specd_pool_create(threads);
        for (size_t i = 0; i < 4; i++) {
            check_matmul(pool, cpu_simd_name(), SPECD_Q4_1, shapes[i], 1, 100 + i);
            check_matmul(pool, cpu_simd_name(), SPECD_Q4_1, shapes[i], 8, 200 + i);
        }
        check_matmul(pool, cpu_simd_name(), SPECD_Q8_0, (shape){4099, 576}, 1, 300);
        check_matmul(pool, cpu_simd_name(), SPECD_Q8_0, (shape){1000, 576}, 3, 301);
        specd_pool_destroy(pool);
    }
}

static void test_tensor_row(void **state) {
    (void)state;
    size_t rb;
    uint8_t *w = test_random_weights(SPECD_Q8_0, 10, 576, 5, &rb);
    specd_tensor W;
    memset(&W, 0, sizeof W);
    W.type = SPECD_Q8_0;
    W.n_dims = 2;
    W.ne[0] = 576;
    W.ne[1] = 10;
    W.ne[2] = W.ne[3] = 1;
    W.data = w;
    float a[576], b[576];
    cpu_tensor_row(&W, 7, a);
    cpu_dequant_row_ref(SPECD_Q8_0, w + 7 * rb, b, 576);
    assert_memory_equal(a, b, sizeof a);
    free(w);
}

static void test_simd_force(void **state) {
    (void)state;
    assert_true(cpu_simd_force("scalar"));
    assert_string_equal(cpu_simd_name(), "scalar");
    assert_false(cpu_simd_force("no-such-isa"));
    assert_string_equal(cpu_simd_name(), "scalar");
    assert_true(cpu_simd_force("auto"));
    print_message("  auto SIMD path: %s\n", cpu_simd_name());
}

/* The peaks (peak.h) on every path this CPU has: positive, and below what
 * any core could issue (4 multiply-add instructions a cycle at 6 GHz, 16
 * fp32 lanes or 64 int8 products each), which a loop the compiler had
 * dropped or merged would exceed. No lower bound beyond zero: a busy host
 * can make any measured rate arbitrarily small (CI once saw the scalar int8
 * loop at 1e8 MAC/s). One thread (a NULL pool). */
static void test_peaks_every_path(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        if (!cpu_simd_force(paths[i])) continue;
        double fp32 = cpu_peak_fp32_macs(NULL), int8 = cpu_peak_int8_macs(NULL);
        print_message("  %-10s fp32 %6.1f G MAC/s, int8 %6.1f G MAC/s (1 thread)\n", paths[i],
                      fp32 / 1e9, int8 / 1e9);
        assert_true(isfinite(fp32) && fp32 > 0 && fp32 < 4.0 * 16 * 6e9);
        assert_true(isfinite(int8) && int8 > 0 && int8 < 4.0 * 64 * 6e9);
    }
    cpu_simd_force("auto");
}

/* ---- thread pool -------------------------------------------------------- */

typedef struct count_ctx {
    atomic_int *hits;
    int n_threads;
    atomic_int bad_thread;
} count_ctx;

static void count_task(void *ctx, int task, int thread) {
    count_ctx *c = ctx;
    atomic_fetch_add(&c->hits[task], 1);
    if (thread < 0 || thread >= c->n_threads) atomic_store(&c->bad_thread, 1);
}

static void run_and_check(specd_pool *pool, int n_tasks) {
    atomic_int *hits = calloc((size_t)(n_tasks > 0 ? n_tasks : 1), sizeof *hits);
    count_ctx c = {.hits = hits, .n_threads = specd_pool_size(pool)};
    atomic_init(&c.bad_thread, 0);
    specd_pool_run(pool, n_tasks, count_task, &c);
    for (int t = 0; t < n_tasks; t++)
        if (atomic_load(&hits[t]) != 1)
            fail_msg("pool of %d, %d tasks: task %d ran %d times", specd_pool_size(pool), n_tasks,
                     t, atomic_load(&hits[t]));
    assert_int_equal(atomic_load(&c.bad_thread), 0);
    free(hits);
}

static void test_pool_every_task_once(void **state) {
    (void)state;
    const int sizes[] = {1, 2, 4};
    const int tasks[] = {0, 1, 2, 3, 7, 64, 1000};
    for (size_t s = 0; s < 3; s++) {
        specd_pool *pool = specd_pool_create(sizes[s]);
        assert_non_null(pool);
        assert_int_equal(specd_pool_size(pool), sizes[s]);
        /* Many back-to-back runs: the spinning hand-off path. */
        for (int i = 0; i < 3000; i++) run_and_check(pool, tasks[i % 7]);
        specd_pool_destroy(pool);
    }
}

static void test_pool_sleep_wake(void **state) {
    (void)state;
    specd_pool *pool = specd_pool_create(3);
    for (int i = 0; i < 4; i++) {
        run_and_check(pool, 50);
        usleep(20000); /* longer than the spin window: workers go to sleep */
    }
    specd_pool_destroy(pool); /* destroy with sleeping workers */
    pool = specd_pool_create(2);
    run_and_check(pool, 10);
    specd_pool_destroy(pool); /* destroy with spinning workers */
    specd_pool_destroy(NULL);
    assert_int_equal(specd_pool_size(NULL), 1);
}

typedef struct sum_ctx {
    const float *x;
    double *partial;
    int n;
    int per_task;
} sum_ctx;

static void sum_task(void *ctx, int task, int thread) {
    (void)thread;
    sum_ctx *c = ctx;
    double s = 0;
    int end = (task + 1) * c->per_task < c->n ? (task + 1) * c->per_task : c->n;
    for (int i = task * c->per_task; i < end; i++) s += c->x[i];
    c->partial[task] = s;
}

/* Results written by workers are visible to the caller after run returns. */
static void test_pool_results_visible(void **state) {
    (void)state;
    const int n = 100000, per = 1000, nt = n / per;
    float *x = malloc(sizeof(float) * n);
    double *part = malloc(sizeof(double) * nt);
    test_fill_random(x, n, 3, 1.0f);
    double want = 0;
    for (int i = 0; i < n; i++) want += x[i];
    specd_pool *pool = specd_pool_create(0);
    assert_true(specd_pool_size(pool) >= 1);
    for (int rep = 0; rep < 200; rep++) {
        memset(part, 0, sizeof(double) * nt);
        sum_ctx c = {x, part, n, per};
        specd_pool_run(pool, nt, sum_task, &c);
        double got = 0;
        for (int t = 0; t < nt; t++) got += part[t];
        assert_true(fabs(got - want) < 1e-9 * n);
    }
    specd_pool_destroy(pool);
    free(part);
    free(x);
}

/* An optional argument runs only the tests matching it (e.g. "test_pool*"). */
/* Bitwise batch invariance of the fp32-activation kernels ("exact"): each
 * row of a batch equals the row computed alone, for every type and path
 * (one pass over all columns per row, two accumulators per output whatever
 * the tile). */
static void test_matmul_batch_invariance(void **state) {
    (void)state;
    specd_pool *pool = specd_pool_create(2);
    const int64_t rows = 21, cols = 1536;
    const int sizes[] = {2, 3, 4, 5, 8, 9, 17};
    float *xs = malloc(sizeof(float) * 17 * cols);
    test_fill_random(xs, 17 * (size_t)cols, 41, 1.0f);
    for (size_t p = 0; p < 3; p++) {
        if (!cpu_simd_force(k_paths[p])) continue;
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            specd_dtype type = k_types[ti];
            size_t rb;
            uint8_t *w = test_random_weights(type, rows, cols, 77 + ti, &rb);
            specd_tensor W;
            memset(&W, 0, sizeof W);
            W.type = type;
            W.n_dims = 2;
            W.ne[0] = (uint64_t)cols;
            W.ne[1] = (uint64_t)rows;
            W.data = w;
            float *alone = malloc(sizeof(float) * 17 * rows);
            for (int t = 0; t < 17; t++) cpu_matmul(pool, alone + t * rows, &W, xs + t * cols, 1);
            for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                int n = sizes[si];
                float *y = malloc(sizeof(float) * (size_t)n * rows);
                /* rows in reverse order: token t of the batch is row 16 - t */
                float *x = malloc(sizeof(float) * (size_t)n * cols);
                for (int t = 0; t < n; t++)
                    memcpy(x + t * cols, xs + (16 - t) * cols, sizeof(float) * cols);
                cpu_matmul(pool, y, &W, x, n);
                for (int t = 0; t < n; t++)
                    if (memcmp(y + t * rows, alone + (16 - t) * rows, sizeof(float) * rows))
                        fail_msg("%s %s: row %d of a batch of %d differs from the row alone",
                                 k_paths[p], specd_dtype_get(type)->name, t, n);
                free(x);
                free(y);
            }
            free(alone);
            free(w);
        }
    }
    cpu_simd_force("auto");
    free(xs);
    specd_pool_destroy(pool);
}

/* SwiGLU on every path against double precision: silu(g) * u within 4 ulp
 * (the AVX2 exp is within 2 ulp of expf), over the range a model sees and
 * past where exp over- or underflows; and the AVX-512 kernel bit for bit the
 * AVX2 one's, whole arrays and every tail length. */
static void test_swiglu_paths(void **state) {
    (void)state;
    const size_t n = 4099; /* a tail past the vector width */
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n),
          *y = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        g[i] = -120.0f + 240.0f * (float)i / (float)(n - 1);
        u[i] = 1.0f + 0.001f * (float)(i % 7);
    }
    g[0] = 0.0f, g[1] = -0.0f, g[2] = 1e-20f, g[3] = -88.5f, g[4] = 88.5f;
    specd_pool *pool = specd_pool_create(2);
    float *y_avx2 = NULL;
    for (size_t p = 0; p < 3; p++) {
        if (!cpu_simd_force(k_paths[p])) continue;
        cpu_swiglu(pool, y, g, u, n);
        /* split over the pool (n is past SWIGLU_SPLIT_MIN), the same bits as
         * the path's kernel over the whole array */
        {
            float *whole = malloc(sizeof(float) * n);
            cpu_active_kernels()->swiglu(whole, g, u, n);
            if (memcmp(whole, y, sizeof(float) * n))
                fail_msg("%s: swiglu split over the pool differs from one call", k_paths[p]);
            free(whole);
        }
        /* the AVX-512 kernel keeps the AVX2 one's bits (vec_avx512.c) */
        if (!strcmp(k_paths[p], "avx2")) {
            y_avx2 = malloc(sizeof(float) * n);
            memcpy(y_avx2, y, sizeof(float) * n);
        } else if (!strcmp(k_paths[p], "avx512") && y_avx2) {
            for (size_t i = 0; i < n; i++)
                if (memcmp(&y[i], &y_avx2[i], sizeof(float)))
                    fail_msg("avx512: swiglu(%.9g, %.9g) = %.9g, the avx2 kernel %.9g", g[i],
                             u[i], y[i], y_avx2[i]);
            /* every tail length, in both kernels */
            for (size_t m = 1; m <= 40; m++) {
                float a[40], b[40];
                cpu_active_kernels()->swiglu(a, g + 2000, u + 2000, m);
                cpu_simd_force("avx2");
                cpu_active_kernels()->swiglu(b, g + 2000, u + 2000, m);
                cpu_simd_force("avx512");
                if (memcmp(a, b, sizeof(float) * m))
                    fail_msg("avx512: swiglu of %zu values differs from the avx2 kernel's", m);
            }
        }
        for (size_t i = 0; i < n; i++) {
            double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
            double err = fabs(y[i] - want);
            if (!(err <= 4.8e-7 * fabs(want) + 1e-30)) /* tiny: exp overflows */
                fail_msg("%s: swiglu(%.9g, %.9g) = %.9g, want %.9g", k_paths[p], g[i], u[i], y[i],
                         want);
        }
    }
    cpu_simd_force("auto");
    specd_pool_destroy(pool);
    free(g), free(u), free(y), free(y_avx2);
}

/* ---- attention's block kernels ------------------------------------------ */

static float urand_pm1(uint32_t *st) {
    *st = *st * 1664525u + 1013904223u;
    return (float)(*st >> 8) / 8388608.0f - 1.0f;
}

/* The paged attention kernels of every path against their own per-query and
 * per-row kernels, bit for bit, as quant_impl.h promises (the block ones
 * read each row once for nq queries and must not change a query's
 * arithmetic): nq 1..16 (whole and partial groups of 4), head sizes 64, 128
 * 48 and 32 (a half head: the split decode's V side), fp32 and fp16 pools,
 * rows in shuffled pages and a partial page.
 * V side scores hold zeros (rows the kernels must skip, as the per-row loop
 * does), in some queries only. test_backend_ops compares whole attention
 * passes across paths; this one reaches the block kernels' corner cases
 * (a zero score in a chunk, nq not a multiple of 4) directly. */
static void test_attention_block_kernels(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    enum { ROWS = 150, PAGES = (ROWS + SPECD_KV_PAGE_ROWS - 1) / SPECD_KV_PAGE_ROWS + 2 };
    const int hds[] = {64, 128, 48, 32}; /* 32: a half head (split decode) */
    int32_t pages[PAGES];
    for (int i = 0; i < PAGES; i++) pages[i] = (i * 3 + 1) % PAGES; /* out of order */
    int tested = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!cpu_simd_force(paths[pi])) continue;
        const cpu_kernel_set *ks = cpu_active_kernels();
        tested++;
        for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
            for (int f16 = 0; f16 < 2; f16++) {
                const int hd = hds[hi];
                const size_t stride = 2 * (size_t)hd, off = (size_t)hd; /* 2nd of 2 KV heads */
                const size_t pool_n = (size_t)PAGES * SPECD_KV_PAGE_ROWS * stride;
                float *kp = malloc(sizeof(float) * pool_n), *vp = malloc(sizeof(float) * pool_n);
                uint16_t *kh = malloc(2 * pool_n), *vh = malloc(2 * pool_n);
                uint32_t st = 12345u + (uint32_t)(hd * 2 + f16);
                for (size_t i = 0; i < pool_n; i++) {
                    kh[i] = specd_f32_to_fp16(urand_pm1(&st));
                    vh[i] = specd_f32_to_fp16(urand_pm1(&st));
                    kp[i] = specd_fp16_to_f32(kh[i]); /* the same values in both pools */
                    vp[i] = specd_fp16_to_f32(vh[i]);
                }
                float q[CPU_ATTN_MAXQ][128], sc_b[CPU_ATTN_MAXQ][ROWS], sc_1[ROWS], w[CPU_ATTN_MAXQ][ROWS];
                float ob[CPU_ATTN_MAXQ][128], o1[128], o2[128], inv[CPU_ATTN_MAXQ];
                for (int k = 0; k < CPU_ATTN_MAXQ; k++) {
                    for (int d = 0; d < hd; d++) q[k][d] = urand_pm1(&st);
                    inv[k] = 0.01f + 0.001f * (float)k;
                    for (int r = 0; r < ROWS; r++) /* zeros in odd queries, none in even */
                        w[k][r] = (k % 2 && r % 11 == 3) ? 0.0f : 0.5f + 0.5f * urand_pm1(&st) + 1e-3f;
                }
                const float scale = 0.125f;
                for (int nq = 1; nq <= CPU_ATTN_MAXQ; nq++) {
                    const int n_rows = ROWS - nq; /* row counts past whole 4-row groups */
                    const float *qs[CPU_ATTN_MAXQ];
                    float *ss[CPU_ATTN_MAXQ], *os[CPU_ATTN_MAXQ], maxs[CPU_ATTN_MAXQ];
                    const float *ws[CPU_ATTN_MAXQ];
                    for (int k = 0; k < nq; k++) {
                        qs[k] = q[k], ss[k] = sc_b[k], os[k] = ob[k], ws[k] = w[k];
                        maxs[k] = -INFINITY;
                        memset(ob[k], 0, sizeof ob[k]);
                    }
                    if (f16 ? ks->kv_dots_block_f16 != NULL : ks->kv_dots_block != NULL) {
                        if (f16)
                            ks->kv_dots_block_f16(qs, nq, kh, pages, n_rows, stride, off, hd, scale,
                                                  ss, maxs);
                        else
                            ks->kv_dots_block(qs, nq, kp, pages, n_rows, stride, off, hd, scale, ss,
                                              maxs);
                        for (int k = 0; k < nq; k++) {
                            float m = -INFINITY;
                            for (int r = 0; r < n_rows; r++) {
                                const void *row = f16 ? (const void *)cpu_kv_paged_row_f16(
                                                            kh, pages, r, stride, off)
                                                      : (const void *)cpu_kv_paged_row(
                                                            kp, pages, r, stride, off);
                                sc_1[r] = ks->kv_dot(q[k], row, f16, hd) * scale;
                                if (sc_1[r] > m) m = sc_1[r];
                            }
                            if (memcmp(sc_1, sc_b[k], sizeof(float) * (size_t)n_rows) != 0 ||
                                m != maxs[k])
                                fail_msg("%s hd %d %s nq %d: query %d's scores or max differ "
                                         "from kv_dot's",
                                         paths[pi], hd, f16 ? "f16" : "f32", nq, k);
                        }
                    }
                    if (f16 ? ks->kv_axpys_block_f16 != NULL : ks->kv_axpys_block != NULL) {
                        if (f16)
                            ks->kv_axpys_block_f16(os, ws, inv, nq, vh, pages, n_rows, stride, off, hd);
                        else
                            ks->kv_axpys_block(os, ws, inv, nq, vp, pages, n_rows, stride, off, hd);
                        for (int k = 0; k < nq; k++) {
                            memset(o1, 0, sizeof o1), memset(o2, 0, sizeof o2);
                            for (int r = 0; r < n_rows; r++) {
                                if (w[k][r] == 0.0f) continue;
                                const void *row = f16 ? (const void *)cpu_kv_paged_row_f16(
                                                            vh, pages, r, stride, off)
                                                      : (const void *)cpu_kv_paged_row(
                                                            vp, pages, r, stride, off);
                                ks->kv_axpy(o1, w[k][r] * inv[k], row, f16, hd);
                            }
                            if (f16 && ks->kv_axpys_f16)
                                ks->kv_axpys_f16(o2, w[k], inv[k], vh, pages, n_rows, stride, off, hd);
                            else if (!f16 && ks->kv_axpys)
                                ks->kv_axpys(o2, w[k], inv[k], vp, pages, n_rows, stride, off, hd);
                            else
                                memcpy(o2, o1, sizeof o1);
                            if (memcmp(o1, ob[k], sizeof(float) * (size_t)hd) != 0 ||
                                memcmp(o2, ob[k], sizeof(float) * (size_t)hd) != 0)
                                fail_msg("%s hd %d %s nq %d: query %d's output differs from "
                                         "kv_axpy's or kv_axpys'",
                                         paths[pi], hd, f16 ? "f16" : "f32", nq, k);
                        }
                    }
                }
                free(kp), free(vp), free(kh), free(vh);
            }
    }
    cpu_simd_force("auto");
    assert_true(tested >= 1);
}

/* softmax_exp on every path: exp(s - max) within 2 ulps-ish of double's
 * (scalar expf, the vector polynomial), masked (-inf) rows exactly 0, and
 * the sum within 1e-6 relative; the vector paths (avx2, avxvnni, avx512,
 * avx512vnni) give the AVX2 kernel's values and sum bit for bit, since
 * attention's output is compared across them bitwise. Lengths cross the
 * kernels' 256-value flush and end in every tail size. */
static void test_softmax_exp_paths(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    enum { N = 700 };
    float in[N], out[N], ref[N];
    uint32_t st = 99u;
    /* mask patterns: scattered (every 13th, and a run of 20 past the
     * flush), none (a prompt's committed rows), and one short run in the
     * middle (a tree's masked siblings): the kernels add runs of 16 visible
     * values straight into their lanes and squeeze the rest */
    for (int pat = 0; pat < 3; pat++)
    for (int n = 1; n <= N; n += (n < 40 ? 1 : 37)) {
        float mx = -INFINITY;
        for (int i = 0; i < n; i++) {
            in[i] = 12.0f * urand_pm1(&st);
            int masked = pat == 0   ? i % 13 == 5 || (n > 300 && i >= 280 && i < 300)
                         : pat == 1 ? 0
                                    : i >= n / 2 && i < n / 2 + 3;
            if (masked) in[i] = -INFINITY;
            if (in[i] > mx) mx = in[i];
        }
        if (mx == -INFINITY) continue;
        int have_ref = 0;
        double ref_sum = 0;
        for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
            if (!cpu_simd_force(paths[pi])) continue;
            memcpy(out, in, sizeof(float) * (size_t)n);
            double sum = cpu_active_kernels()->softmax_exp(out, n, mx);
            double want_sum = 0;
            for (int i = 0; i < n; i++) {
                double want = in[i] == -INFINITY ? 0.0 : exp((double)(in[i] - mx)); /* the kernels subtract in float */
                want_sum += want;
                if (in[i] == -INFINITY ? out[i] != 0.0f
                                       : !(fabs(out[i] - want) <= 3e-7 * want))
                    fail_msg("%s n %d: exp(%.9g - %.9g) = %.9g, want %.9g", paths[pi], n, in[i],
                             mx, out[i], want);
            }
            if (!(fabs(sum - want_sum) <= 1e-6 * want_sum))
                fail_msg("%s n %d: sum %.17g, want %.17g", paths[pi], n, sum, want_sum);
            if (pi == 0) continue; /* the scalar path has its own expf */
            /* the vector kernels' documented order (vec_avx2.c): the k-th
             * non-zero value into lane k % 16 of 16 double sums, then
             * (lanes 0-3 + lanes 4-7) + (8-11 + 12-15) lane-wise, the two
             * halves of that, then its two lanes */
            double lane[16] = {0};
            for (int i = 0, k = 0; i < n; i++)
                if (out[i] != 0.0f) lane[k++ % 16] += (double)out[i];
            double a[4], h[2];
            for (int l = 0; l < 4; l++) a[l] = (lane[l] + lane[4 + l]) + (lane[8 + l] + lane[12 + l]);
            h[0] = a[0] + a[2], h[1] = a[1] + a[3];
            if (sum != h[0] + h[1])
                fail_msg("%s n %d pattern %d: sum %.17g, the documented order gives %.17g",
                         paths[pi], n, pat, sum, h[0] + h[1]);
            if (!have_ref) {
                memcpy(ref, out, sizeof(float) * (size_t)n);
                ref_sum = sum, have_ref = 1;
            } else if (memcmp(ref, out, sizeof(float) * (size_t)n) != 0 || sum != ref_sum) {
                fail_msg("%s n %d: values or sum differ from the avx2 kernel's", paths[pi], n);
            }
        }
    }
    cpu_simd_force("auto");
}

/* The argmax op on every path equals specd_argmax: ties to the first index,
 * NaN never wins, -inf rows, all-NaN rows, tails past the vector width. */
static void test_argmax_paths(void **state) {
    (void)state;
    const int width = 1003, rows = 9;
    float *x = malloc(sizeof(float) * rows * width);
    test_fill_random(x, (size_t)rows * width, 17, 5.0f);
    x[0 * width + 500] = 9.0f, x[0 * width + 700] = 9.0f;        /* tie: 500 */
    x[1 * width + 1002] = 50.0f;                                 /* in the tail */
    for (int i = 0; i < width; i++) x[2 * width + i] = -INFINITY; /* all -inf: 0 */
    for (int i = 0; i < width; i++) x[3 * width + i] = NAN;       /* all NaN: 0 */
    x[4 * width + 3] = NAN, x[4 * width + 4] = 100.0f;          /* NaN never wins */
    for (int i = 0; i < width; i++) x[5 * width + i] = i < 10 ? NAN : -INFINITY;
    int32_t ids[9];
    specd_pool *pool = specd_pool_create(2);
    for (size_t p = 0; p < 3; p++) {
        if (!cpu_simd_force(k_paths[p])) continue;
        for (int n = 1; n <= rows; n += rows - 1) {
            cpu_argmax_rows(pool, ids, x, n, width);
            for (int r = 0; r < n; r++)
                if (ids[r] != specd_argmax(x + (size_t)r * width, width))
                    fail_msg("%s: argmax of row %d is %d, specd_argmax %d", k_paths[p], r, ids[r],
                             specd_argmax(x + (size_t)r * width, width));
        }
    }
    cpu_simd_force("auto");
    specd_pool_destroy(pool);
    free(x);
}

/* rows x kvd values of Q8_0 blocks with random bytes: int8 from -128 to
 * 127 and fp16 scales of every finite exponent (an inf/NaN exponent is
 * cleared). Returns the generator's state, for more draws after. */
static uint64_t random_q8_pool(uint8_t *pool, int rows, int kvd, uint64_t st) {
    const size_t rb = (size_t)kvd / 32 * 34;
    for (size_t i = 0; i < (size_t)rows * rb; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        pool[i] = (uint8_t)(st >> 33);
    }
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < kvd / 32; b++) {
            uint8_t *d = pool + (size_t)r * rb + (size_t)b * 34;
            if ((d[1] & 0x7C) == 0x7C) d[1] &= 0xBB; /* exponent 31 (inf/NaN) -> finite */
        }
    return st;
}

/* kv_rows_q8 (a Q8_0 KV cache's rows into fp32) on every path equals the
 * reference dequantizer bit for bit, over random block bytes: int8 values
 * from -128 to 127 and fp16 scales from subnormal to 65504 (every finite
 * exponent; NaN and inf scales left out, whose payloads are not part of
 * the contract), for heads of 32, 64 and 128 at an offset into the row,
 * through a scattered page table, with a page's prefetch in range. */
static void test_kv_rows_q8_paths(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    enum { KVD = 256, PAGES = 4, ROWS = PAGES * SPECD_KV_PAGE_ROWS, RB = KVD / 32 * 34 };
    static uint8_t pool[ROWS * RB];
    random_q8_pool(pool, ROWS, KVD, 77);
    const int32_t pages[PAGES] = {2, 0, 3, 1};
    static const int heads[] = {32, 64, 128};
    static float got[ROWS * 128 + 1], want[ROWS * 128];
    int tested = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!cpu_simd_force(paths[pi])) continue;
        tested++;
        for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
            const int n = heads[hi];
            const size_t off = (size_t)(KVD - n); /* the last head of the row */
            const int r = 3, nr = ROWS - 3 - 5;
            memset(got, 0xAB, sizeof got);
            cpu_active_kernels()->kv_rows_q8(got, pool, pages, r, nr, KVD, off, n);
            for (int i = 0; i < nr; i++) {
                const int phys = pages[(r + i) / SPECD_KV_PAGE_ROWS] * SPECD_KV_PAGE_ROWS +
                                 (r + i) % SPECD_KV_PAGE_ROWS;
                cpu_dequant_row_ref(SPECD_Q8_0, pool + (size_t)phys * RB + off / 32 * 34,
                                    want + (size_t)i * n, n);
            }
            for (int e = 0; e < nr * n; e++)
                if (memcmp(&got[e], &want[e], sizeof(float)))
                    fail_msg("%s head %d: row %d element %d is %.9g, the reference %.9g", paths[pi],
                             n, e / n, e % n, (double)got[e], (double)want[e]);
            const uint8_t guard[4] = {0xAB, 0xAB, 0xAB, 0xAB};
            if (memcmp(&got[nr * n], guard, 4)) fail_msg("%s head %d: wrote past its rows", paths[pi], n);
        }
    }
    cpu_simd_force("auto");
    assert_true(tested >= 1);
}

/* kv_dots_q8 (a Q8_0 cache's K side, kv_q8.c) on every path equals its
 * definition written out here, bit for bit: per block the exact integer
 * dot of the query's and the row's int8 values, then acc = fma(isum,
 * dq * dk, acc) over the blocks in order, then acc * scale. Random int8
 * from -128 to 127 on both sides, fp16 row scales over every finite
 * exponent, query scales of both signs; heads of 32 to 256 (the vector
 * kernels) and 288 (their scalar fallback) at an offset into the row;
 * 1 to 64 queries; row counts that end inside a page, on a page edge
 * and mid-tile; a scattered page table. Each query's max over the first
 * n_max rows (n_rows, or 3 or 6 fewer, or none) is the largest score
 * there. Nothing past the rows is written. */
static void test_kv_dots_q8_paths(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    enum { KVD = 320, PAGES = 5, ROWS = PAGES * SPECD_KV_PAGE_ROWS, RB = KVD / 32 * 34, MAXQ = 64 };
    static uint8_t pool[ROWS * RB];
    uint64_t st = random_q8_pool(pool, ROWS, KVD, 91);
    const int32_t pages[PAGES] = {3, 0, 4, 2, 1};
    static int8_t qv[MAXQ * KVD];
    static float qd[MAXQ * KVD / 32];
    for (size_t i = 0; i < sizeof qv; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        qv[i] = (int8_t)(uint8_t)(st >> 33);
    }
    for (size_t i = 0; i < sizeof qd / sizeof qd[0]; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        qd[i] = (float)((double)(st >> 40) / (double)(1 << 24) * 8.0 - 4.0) * 1e-2f;
    }
    static const int heads[] = {32, 64, 128, 256, 288};
    static const int n_rows_list[] = {1, 7, 8, 15, 16, 17, 40, ROWS};
    static const int nqs[] = {1, 3, 16, 48, MAXQ};
    static float got[MAXQ][ROWS + 1], want[MAXQ][ROWS];
    float *gp[MAXQ];
    for (int k = 0; k < MAXQ; k++) gp[k] = got[k];
    const float scale = 0.125f;
    int tested = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!cpu_simd_force(paths[pi])) continue;
        tested++;
        for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
            const int n = heads[hi], nb = n / 32;
            const size_t off = (size_t)(KVD - n); /* the last head of the row */
            /* the queries' blocks as the kernel takes them: query k's n
             * values, scales and sums contiguous */
            static int8_t q[MAXQ * KVD];
            static float d[MAXQ * KVD / 32];
            static int32_t sums[MAXQ * KVD / 32];
            for (int k = 0; k < MAXQ; k++)
                for (int b = 0; b < nb; b++) {
                    int32_t sum = 0;
                    for (int i = 0; i < 32; i++) {
                        q[k * n + b * 32 + i] = qv[k * KVD + b * 32 + i];
                        sum += qv[k * KVD + b * 32 + i];
                    }
                    d[k * nb + b] = qd[k * (KVD / 32) + b];
                    sums[k * nb + b] = sum;
                }
            for (int r = 0; r < ROWS; r++) {
                const int phys = pages[r / SPECD_KV_PAGE_ROWS] * SPECD_KV_PAGE_ROWS +
                                 r % SPECD_KV_PAGE_ROWS;
                const uint8_t *row = pool + (size_t)phys * RB + off / 32 * 34;
                for (int k = 0; k < MAXQ; k++) {
                    float acc = 0.0f;
                    for (int b = 0; b < nb; b++) {
                        const uint8_t *blk = row + b * 34;
                        int32_t isum = 0;
                        for (int i = 0; i < 32; i++)
                            isum += (int32_t)q[k * n + b * 32 + i] * (int32_t)(int8_t)blk[2 + i];
                        uint16_t h;
                        memcpy(&h, blk, 2);
                        acc = fmaf((float)isum, d[k * nb + b] * specd_fp16_to_f32(h), acc);
                    }
                    want[k][r] = acc * scale;
                }
            }
            for (size_t ri = 0; ri < sizeof n_rows_list / sizeof n_rows_list[0]; ri++)
                for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++) {
                    const int n_rows = n_rows_list[ri], nq = nqs[qi];
                    memset(got, 0xAB, sizeof got);
                    const int n_max = n_rows - (int)(ri % 3) * 3 < 0 ? 0 : n_rows - (int)(ri % 3) * 3;
                    float maxs[MAXQ];
                    cpu_active_kernels()->kv_dots_q8(q, d, sums, nq, pool, pages, n_rows, KVD,
                                                     off, n, scale, gp, n_max, maxs);
                    for (int k = 0; k < nq; k++) {
                        float m = -INFINITY;
                        for (int r = 0; r < n_max; r++)
                            if (want[k][r] > m) m = want[k][r];
                        if (memcmp(&m, &maxs[k], sizeof m))
                            fail_msg("%s head %d, %d rows, max over %d: query %d's max is %.9g, "
                                     "want %.9g",
                                     paths[pi], n, n_rows, n_max, k, (double)maxs[k], (double)m);
                    }
                    for (int k = 0; k < nq; k++) {
                        for (int r = 0; r < n_rows; r++)
                            if (memcmp(&got[k][r], &want[k][r], sizeof(float)))
                                fail_msg("%s head %d, %d rows, %d queries: query %d row %d is "
                                         "%.9g, the definition %.9g",
                                         paths[pi], n, n_rows, nq, k, r, (double)got[k][r],
                                         (double)want[k][r]);
                        const uint8_t guard[4] = {0xAB, 0xAB, 0xAB, 0xAB};
                        if (memcmp(&got[k][n_rows], guard, 4))
                            fail_msg("%s head %d, %d rows: query %d written past its rows",
                                     paths[pi], n, n_rows, k);
                    }
                    for (int k = nq; k < MAXQ; k++) {
                        const uint8_t guard[4] = {0xAB, 0xAB, 0xAB, 0xAB};
                        if (memcmp(&got[k][0], guard, 4))
                            fail_msg("%s head %d: query %d of %d written", paths[pi], n, k, nq);
                    }
                }
        }
    }
    cpu_simd_force("auto");
    assert_true(tested >= 1);
}

/* quantize_q8_0 (a Q8_0 cache's new rows) on every path gives
 * cpu_quantize_row_q8_0's blocks byte for byte: random rows at many
 * magnitudes, and blocks holding the rounding edges (halves of both signs,
 * the float just below a half, -0), NaN (stored as 0 and never the max),
 * inf (its block all 0 with an inf scale), an all-zero block and fp16
 * subnormal and overflowing scales. */
static void test_quantize_q8_0_paths(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    enum { N = 32 * 40 };
    static float x[N];
    static uint8_t got[N / 32 * 34 + 4], want[N / 32 * 34];
    uint64_t st = 5;
    for (int b = 0; b < N / 32; b++) {
        const float mag = ldexpf(1.0f, b % 20 * 3 - 30);
        for (int i = 0; i < 32; i++) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            x[b * 32 + i] = ((float)(st >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * mag;
        }
    }
    /* block 0: amax 127, so values land on halves exactly */
    static const float edge[] = {127.0f, 0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f,
                                 0x1.fffffep-2f, -0x1.fffffep-2f, -0.0f, 126.5f, -126.5f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) x[i] = edge[i];
    x[32 + 3] = NAN;                       /* block 1: a NaN among values */
    x[64 + 7] = INFINITY;                  /* block 2: an inf */
    for (int i = 0; i < 32; i++) x[96 + i] = 0.0f; /* block 3: zero */
    x[128 + 5] = 1e-9f;                    /* block 4: d subnormal in fp16 */
    for (int i = 0; i < 32; i++) x[160 + i] = 1e7f * (float)(i - 16); /* block 5: d overflows fp16 */
    cpu_quantize_row_q8_0(x, want, N);
    int tested = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!cpu_simd_force(paths[pi])) continue;
        tested++;
        memset(got, 0xAB, sizeof got);
        cpu_active_kernels()->quantize_q8_0(x, got, N);
        for (size_t i = 0; i < sizeof want; i++)
            if (got[i] != want[i])
                fail_msg("%s: byte %zu (block %zu) is 0x%02x, the reference 0x%02x", paths[pi], i,
                         i / 34, got[i], want[i]);
        if (got[sizeof want] != 0xAB) fail_msg("%s: wrote past the row", paths[pi]);
    }
    cpu_simd_force("auto");
    assert_true(tested >= 1);
}

/* A layer's row ops (RMSNorm, RoPE, the residual add) on every path equal
 * their scalar twins in row_ops.c bit for bit, whatever the width: tails
 * of every length past the vector, RMSNorm with and without a weight and
 * over values from 1e-30 to 1e30 (the double sum must not lose them), RoPE
 * with interleaved and split pairs, on whole and partial rotary dims and on
 * heads whose half is not a multiple of the vector. The twins themselves
 * are checked against a double-precision formula. */
static void test_row_ops_paths(void **state) {
    (void)state;
    static const char *const paths[] = {CPU_SIMD_PATH_NAMES};
    enum { MAXD = 2100 };
    float *x = malloc(sizeof(float) * MAXD), *w = malloc(sizeof(float) * MAXD);
    float *want = malloc(sizeof(float) * MAXD), *got = malloc(sizeof(float) * MAXD);
    test_fill_random(x, MAXD, 41, 3.0f);
    test_fill_random(w, MAXD, 42, 1.5f);
    x[5] = 1e30f, x[6] = -1e-30f, x[700] = 0.0f, x[701] = -0.0f;
    static const int dims[] = {1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 576, 577, 1536, 2048, 2100};
    int tested = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof *paths; pi++) {
        if (!cpu_simd_force(paths[pi])) continue;
        const cpu_kernel_set *ks = cpu_active_kernels();
        tested++;
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
            const int dim = dims[di];
            for (int wi = 0; wi < 2; wi++) {
                const float *wt = wi ? w : NULL;
                const float *xr = x + (dim < 1000 ? 3 : 0); /* unaligned rows too */
                cpu_rmsnorm_row_scalar(want, xr, wt, dim, 1e-5f);
                ks->rmsnorm_row(got, xr, wt, dim, 1e-5f);
                if (memcmp(want, got, sizeof(float) * (size_t)dim))
                    fail_msg("%s: rmsnorm of %d values (weight %d) differs from the scalar twin",
                             paths[pi], dim, wi);
                if (pi == 0 && dim == 576) { /* the twin against double arithmetic */
                    double ss = 0;
                    for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
                    const double r = 1.0 / sqrt(ss / dim + 1e-5);
                    for (int i = 0; i < dim; i++) {
                        const double ref = xr[i] * r * (wt ? wt[i] : 1.0f);
                        if (fabs(got[i] - ref) > 3e-7 * fabs(ref) + 1e-37)
                            fail_msg("rmsnorm[%d] = %.9g, want %.9g", i, got[i], ref);
                    }
                }
            }
        }
        /* RoPE: (head_dim, rot_dim) with halves of 32, 16, 24, 5 and 3 */
        static const int shapes[][2] = {{64, 64}, {64, 32}, {48, 48}, {10, 10}, {128, 6}};
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (int inter = 0; inter < 2; inter++) {
                const int hd = shapes[si][0], rot = shapes[si][1], nh = 3;
                float cs[128];
                for (int i = 0; i < rot / 2; i++) {
                    const double ang = (17.0 + 3.0 * si) * pow(10000.0, -2.0 * i / rot);
                    cs[2 * i] = (float)cos(ang), cs[2 * i + 1] = (float)sin(ang);
                }
                memcpy(want, x + 11, sizeof(float) * (size_t)(hd * nh));
                memcpy(got, x + 11, sizeof(float) * (size_t)(hd * nh));
                cpu_rope_heads_scalar(want, nh, hd, cs, rot, inter);
                ks->rope_heads(got, nh, hd, cs, rot, inter);
                if (memcmp(want, got, sizeof(float) * (size_t)(hd * nh)))
                    fail_msg("%s: rope head %d rot %d interleaved %d differs from the scalar twin",
                             paths[pi], hd, rot, inter);
                if (pi == 0) /* the twin: a rotation, and the rest of the head left alone */
                    for (int h = 0; h < nh; h++)
                        for (int i = 0; i < rot / 2; i++) {
                            const int a = inter ? 2 * i : i, b = inter ? 2 * i + 1 : i + rot / 2;
                            const double x0 = x[11 + h * hd + a], x1 = x[11 + h * hd + b];
                            const double r0 = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
                            const double r1 = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
                            if (fabs(got[h * hd + a] - r0) > 1e-6 * (fabs(x0) + fabs(x1)) ||
                                fabs(got[h * hd + b] - r1) > 1e-6 * (fabs(x0) + fabs(x1)))
                                fail_msg("rope pair %d of head %d: %.9g %.9g, want %.9g %.9g", i,
                                         h, got[h * hd + a], got[h * hd + b], r0, r1);
                        }
                if (pi == 0 && rot < hd && memcmp(got + rot, x + 11 + rot, sizeof(float) * (size_t)(hd - rot)))
                    fail_msg("rope rot %d of %d changed the unrotated part", rot, hd);
            }
        /* the residual add, every tail and a scaled one */
        for (int n = 1; n <= MAXD; n = n < 40 ? n + 1 : n * 3) {
            const float a = n % 2 ? 1.0f : -0.37f;
            memcpy(want, w, sizeof(float) * (size_t)n);
            memcpy(got, w, sizeof(float) * (size_t)n);
            cpu_axpy_scalar(want, a, x, (size_t)n);
            ks->axpy(got, a, x, (size_t)n);
            if (memcmp(want, got, sizeof(float) * (size_t)n))
                fail_msg("%s: axpy of %d values differs from the scalar twin", paths[pi], n);
            if (pi == 0 && want[n - 1] != w[n - 1] + a * x[n - 1])
                fail_msg("axpy[%d] = %.9g, want %.9g", n - 1, want[n - 1], w[n - 1] + a * x[n - 1]);
        }
    }
    cpu_simd_force("auto");
    assert_true(tested >= 1);
    free(x), free(w), free(want), free(got);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_every_task_once),
        cmocka_unit_test(test_pool_sleep_wake),
        cmocka_unit_test(test_pool_results_visible),
        cmocka_unit_test(test_simd_force),
        cmocka_unit_test(test_peaks_every_path),
        cmocka_unit_test(test_dequant_known_values),
        cmocka_unit_test(test_dequant_exact),
        cmocka_unit_test(test_tensor_row),
        cmocka_unit_test(test_matmul_all),
        cmocka_unit_test(test_matmul_model_shapes),
        cmocka_unit_test(test_matmul_batch_invariance),
        cmocka_unit_test(test_swiglu_paths),
        cmocka_unit_test(test_argmax_paths),
        cmocka_unit_test(test_attention_block_kernels),
        cmocka_unit_test(test_softmax_exp_paths),
        cmocka_unit_test(test_kv_rows_q8_paths),
        cmocka_unit_test(test_kv_dots_q8_paths),
        cmocka_unit_test(test_quantize_q8_0_paths),
        cmocka_unit_test(test_row_ops_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
