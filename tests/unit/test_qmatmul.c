/* test_qmatmul.c - the integer-activation matmul (kernels/cpu/qmatmul.h).
 *
 * What must hold, and how it is checked:
 *   - every SIMD path (scalar, avx2, avxvnni, avx512, avx512vnni: each one
 *     this CPU has, forced in turn) equals the scalar twin bit for bit, for
 *     every tile kind, shapes with partial row groups, 1..70 tokens and 1, 2
 *     and 3 threads;
 *   - batch invariance: each row of a batch equals that row computed alone,
 *     bit for bit, wherever it sits in the batch;
 *   - several matrices on one input (cpu_qmatmuls) equal each one alone;
 *   - accuracy against a double-precision matmul on the dequantized weights
 *     and the unquantized activations, within the bound that int8
 *     activations allow: each activation moves by at most half a step
 *     (max|x_block| / 254), so |y - y_ref| <= sum_b max|x_b|/254 *
 *     sum_{c in b} |w_c|, plus 1e-5 * sum|w*x| for float rounding;
 *   - the quantizer's values on known inputs, and which types have the path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/threadpool.h"
#include "tests/harness/test_util.h"

static const char *const k_paths[] = {CPU_SIMD_PATH_NAMES};
#define N_PATHS (sizeof k_paths / sizeof k_paths[0])
static const specd_dtype k_types[] = {SPECD_Q4_0, SPECD_Q4_1, SPECD_Q5_0, SPECD_Q5_1,
                                      SPECD_Q8_0, SPECD_Q4_K, SPECD_Q5_K, SPECD_Q6_K,
                                      SPECD_Q3_K, SPECD_Q2_K, SPECD_IQ4_NL, SPECD_IQ4_XS};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

/* A test's width for a type: the K-quants come in super-blocks of 256. */
static int64_t type_cols(specd_dtype type, int64_t cols) {
    const int k = type == SPECD_Q4_K || type == SPECD_Q5_K || type == SPECD_Q6_K ||
                  type == SPECD_Q3_K || type == SPECD_Q2_K || type == SPECD_IQ4_XS;
    return k ? (cols + 255) / 256 * 256 : cols;
}

typedef struct qfixture {
    specd_tensor t;
    uint8_t *raw;
    size_t row_bytes;
    cpu_qweight w;
} qfixture;

/* fill_nibbles: every 4-bit weight of a Q4 type set to 15, every 5-bit
 * one to 31, every 6-bit one of Q6_K to 63, every 3-bit one of Q3_K to 7
 * (+3), every 2-bit one of Q2_K to 3 with its scales and mins 15: the
 * largest */
static void qfix_make_ex(qfixture *f, specd_dtype type, int64_t rows, int64_t cols, uint64_t seed,
                         int fill_nibbles) {
    memset(f, 0, sizeof *f);
    f->raw = test_random_weights(type, rows, cols, seed, &f->row_bytes);
    if (fill_nibbles) {
        /* GGUF blocks: Q4_0 = fp16 d + 16 nibble bytes, Q4_1 = fp16 d,
         * fp16 m + 16 nibble bytes; Q5_0 / Q5_1 = the same with 4 bytes of
         * fifth bits before the nibbles; Q4_K = 16 bytes of scales + 128
         * of nibbles (Q5_K: + 32 of fifth bits first); Q6_K = 128 bytes of
         * low bits, 64 of top bits, then scales and d; Q3_K = 32 bytes of
         * third bits, 64 of low bits, then scales and d; Q2_K = 16 bytes
         * of scales and mins, 64 of quants, then d and dmin */
        size_t head = type == SPECD_Q4_1 || type == SPECD_Q5_1   ? 4
                      : type == SPECD_Q4_K || type == SPECD_Q5_K ? 16
                      : type == SPECD_Q6_K || type == SPECD_Q2_K || type == SPECD_Q3_K ? 0
                                                                 : 2;
        size_t quants = type == SPECD_Q4_K   ? 128
                        : type == SPECD_Q5_K ? 160
                        : type == SPECD_Q6_K ? 192
                        : type == SPECD_Q2_K ? 80
                        : type == SPECD_Q3_K ? 96
                        : type == SPECD_Q5_0 || type == SPECD_Q5_1 ? 20
                                                                   : 16;
        size_t blk = specd_dtype_get(type)->block_bytes;
        assert_true(type != SPECD_Q8_0);
        for (size_t o = 0; o + blk <= f->row_bytes * (size_t)rows; o += blk)
            memset(f->raw + o + head, 0xFF, quants);
    }
    snprintf(f->t.name, sizeof f->t.name, "test.weight");
    f->t.type = type;
    f->t.n_dims = 2;
    f->t.ne[0] = (uint64_t)cols;
    f->t.ne[1] = (uint64_t)rows;
    f->t.ne[2] = f->t.ne[3] = 1;
    f->t.data = f->raw;
    f->t.nbytes = f->row_bytes * (size_t)rows;
    assert_int_equal(cpu_qweight_make(&f->t, &f->w, NULL), 1);
}

static void qfix_make(qfixture *f, specd_dtype type, int64_t rows, int64_t cols, uint64_t seed) {
    qfix_make_ex(f, type, rows, cols, seed, 0);
}

static void qfix_free(qfixture *f) {
    cpu_qweight_free(&f->w);
    free(f->raw);
}

static float *alloc_nan(size_t n) {
    float *p = malloc(sizeof(float) * n);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = NAN; /* unwritten outputs show */
    return p;
}

static void expect_same_bits(const float *a, const float *b, int n_tok, int64_t rows,
                             const char *what, const char *path, specd_dtype type, int threads) {
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < rows; r++) {
            size_t i = (size_t)t * rows + r;
            if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
                fail_msg("%s: path %s, %s, %lld rows, %d tokens, %d threads: y[%d][%lld] = "
                         "%.9g, expected %.9g",
                         what, path, specd_dtype_get(type)->name, (long long)rows, n_tok,
                         threads, t, (long long)r, a[i], b[i]);
        }
}

/* Every path against the scalar twin, bit for bit. The token counts make
 * every pass size of every kernel (1..16 tokens; 33 is 11 + 11 + 11, 70 is
 * five passes of 14 on AVX-512 VNNI) and uneven splits (17 is 9 + 8). */
static void test_paths_equal_scalar_twin(void **state) {
    (void)state;
    const int64_t shapes[][2] = {{16, 32}, {37, 64}, {20, 64}, {5, 96}, {192, 576}, {203, 1536}};
    const int toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 15, 16, 17, 33, 70};
    specd_pool *pools[3] = {specd_pool_create(1), specd_pool_create(2), specd_pool_create(3)};
    int tested = 0;
    for (size_t p = 0; p < N_PATHS; p++) {
        if (!cpu_simd_force(k_paths[p])) {
            print_message("  (path %s not available on this CPU)\n", k_paths[p]);
            continue;
        }
        tested++;
        for (size_t ti = 0; ti < N_TYPES; ti++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                qfixture f;
                qfix_make(&f, k_types[ti], shapes[si][0], type_cols(k_types[ti], shapes[si][1]),
                          100 + si + 10 * ti);
                for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
                    int n = toks[k];
                    size_t ny = (size_t)n * (size_t)f.w.rows;
                    float *x = malloc(sizeof(float) * (size_t)n * (size_t)f.w.cols);
                    test_fill_random(x, (size_t)n * (size_t)f.w.cols, 7 + k, 1.5f);
                    float *ref = alloc_nan(ny);
                    cpu_qmatmul_ref(ref, &f.w, x, n);
                    for (int pi = 0; pi < 3; pi++) {
                        float *y = alloc_nan(ny);
                        cpu_qmatmul(pools[pi], y, &f.w, x, n);
                        expect_same_bits(y, ref, n, f.w.rows, "twin", k_paths[p], k_types[ti],
                                         pi + 1);
                        free(y);
                    }
                    free(ref);
                    free(x);
                }
                qfix_free(&f);
            }
    }
    assert_true(tested >= 1);
    cpu_simd_force("auto");
    for (int i = 0; i < 3; i++) specd_pool_destroy(pools[i]);
}

/* The "amx" path's tiles take only passes of AMX_MIN_PASS (14) tokens or
 * more, so the twin test above reaches them only at 14-16 and 70 tokens.
 * Here every pass length from 2 goes to the tiles, on matrices of 1, 3,
 * 18 and 48 blocks (odd counts end on half a block pair; 48 wraps the
 * unpacking ring several times) and a last row group of 5 rows: bit for
 * bit the scalar twin, on one thread and on two. */
static void test_amx_every_pass_length(void **state) {
    (void)state;
    if (!cpu_simd_force("amx")) {
        print_message("  (no AMX here: the tiles' kernels were not run)\n");
        skip();
    }
    const int old = cpu_amx_min_pass(2);
    const specd_dtype types[] = {SPECD_Q4_0, SPECD_Q4_1, SPECD_Q8_0};
    const int64_t shapes[][2] = {{16, 32}, {37, 96}, {192, 576}, {53, 1536}};
    specd_pool *pool2 = specd_pool_create(2);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            qfixture f;
            qfix_make(&f, types[ti], shapes[si][0], shapes[si][1], 900 + si + 10 * ti);
            for (int n = 2; n <= 34; n += n < 17 ? 1 : 15) {
                size_t ny = (size_t)n * (size_t)f.w.rows;
                float *x = malloc(sizeof(float) * (size_t)n * (size_t)f.w.cols);
                test_fill_random(x, (size_t)n * (size_t)f.w.cols, 31 + n, 2.0f);
                float *ref = alloc_nan(ny), *y = alloc_nan(ny);
                cpu_qmatmul_ref(ref, &f.w, x, n);
                cpu_qmatmul(NULL, y, &f.w, x, n);
                expect_same_bits(y, ref, n, f.w.rows, "amx", "amx", types[ti], 1);
                for (size_t i = 0; i < ny; i++) y[i] = NAN;
                cpu_qmatmul(pool2, y, &f.w, x, n);
                expect_same_bits(y, ref, n, f.w.rows, "amx", "amx", types[ti], 2);
                free(ref), free(y), free(x);
            }
            qfix_free(&f);
        }
    specd_pool_destroy(pool2);
    cpu_amx_min_pass(old);
    cpu_simd_force("auto");
}

/* The largest products the 2-, 3-, 4-, 5- and 6-bit kernels meet: every
 * weight 3 (7, 15, 31, 63) and every activation +-127 (a block of equal
 * values quantizes to 127), where an int16 intermediate (vpmaddubsw's
 * pairs, 3,810 here; four Q5 chunks' pairs, 31,496; two Q6_K chunks',
 * 32,004; four Q2_K chunks', 3,048) or a too-narrow partial sum would show.
 * Every path against the scalar twin, bit for bit. */
static void test_q4_extremes(void **state) {
    (void)state;
    const specd_dtype types[] = {SPECD_Q4_0, SPECD_Q4_1, SPECD_Q5_0, SPECD_Q5_1,
                                 SPECD_Q4_K, SPECD_Q5_K, SPECD_Q6_K, SPECD_Q3_K, SPECD_Q2_K};
    enum { ROWS = 48, COLS = 256, NTOK = 5 };
    float x[NTOK * COLS];
    for (int t = 0; t < NTOK; t++)
        for (int c = 0; c < COLS; c++) {
            int blk = c / 32;
            float v = t == 0 ? 1.0f : t == 1 ? -1.0f : t == 2 ? (blk % 2 ? -3.0f : 3.0f)
                                                     : (float)((c * 7 + t) % 5) - 2.0f;
            x[t * COLS + c] = v;
        }
    int tested = 0;
    for (size_t p = 0; p < N_PATHS; p++) {
        if (!cpu_simd_force(k_paths[p])) continue;
        tested++;
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            qfixture f;
            qfix_make_ex(&f, types[ti], ROWS, COLS, 500 + ti, 1);
            float ref[NTOK * ROWS], y[NTOK * ROWS];
            cpu_qmatmul_ref(ref, &f.w, x, NTOK);
            cpu_qmatmul(NULL, y, &f.w, x, NTOK);
            expect_same_bits(y, ref, NTOK, ROWS, "extremes", k_paths[p], types[ti], 1);
            qfix_free(&f);
        }
    }
    assert_true(tested >= 1);
    cpu_simd_force("auto");
}

/* A row's result does not depend on its batch: every row of batches of
 * several sizes, at shuffled positions, equals the row computed alone. */
static void test_batch_invariance(void **state) {
    (void)state;
    specd_pool *pool = specd_pool_create(2);
    const int64_t rows = 75, cols = 768;
    const int max_n = 64;
    float *rowsx = malloc(sizeof(float) * (size_t)max_n * cols);
    test_fill_random(rowsx, (size_t)max_n * cols, 99, 2.0f);
    for (size_t p = 0; p < N_PATHS; p++) {
        if (!cpu_simd_force(k_paths[p])) continue;
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            qfixture f;
            qfix_make(&f, k_types[ti], rows, cols, 31 + ti);
            /* each distinct row alone */
            float *alone = malloc(sizeof(float) * (size_t)max_n * rows);
            for (int t = 0; t < max_n; t++)
                cpu_qmatmul(pool, alone + (size_t)t * rows, &f.w, rowsx + (size_t)t * cols, 1);
            const int sizes[] = {2, 3, 8, 9, 13, 64};
            uint64_t s = 12345;
            for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                int n = sizes[si];
                int *pick = malloc(sizeof(int) * (size_t)n);
                float *x = malloc(sizeof(float) * (size_t)n * cols);
                for (int i = 0; i < n; i++) {
                    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                    pick[i] = (int)((s >> 33) % max_n);
                    memcpy(x + (size_t)i * cols, rowsx + (size_t)pick[i] * cols,
                           sizeof(float) * cols);
                }
                float *y = alloc_nan((size_t)n * rows);
                cpu_qmatmul(pool, y, &f.w, x, n);
                for (int i = 0; i < n; i++)
                    if (memcmp(y + (size_t)i * rows, alone + (size_t)pick[i] * rows,
                               sizeof(float) * rows) != 0)
                        fail_msg("path %s %s: row %d of a batch of %d differs from the row alone",
                                 k_paths[p], specd_dtype_get(k_types[ti])->name, i, n);
                free(y);
                free(x);
                free(pick);
            }
            free(alone);
            qfix_free(&f);
        }
    }
    cpu_simd_force("auto");
    free(rowsx);
    specd_pool_destroy(pool);
}

/* cpu_qmatmuls (one quantization, one pool run for several matrices) gives
 * each matrix exactly what cpu_qmatmul gives it: mixed tile kinds, row
 * counts that end in partial groups, 1..70 tokens, 1..3 threads, every
 * path. Matrices of different widths are refused. */
static void test_qmatmuls_equal_one_by_one(void **state) {
    (void)state;
    const int64_t cols = 256;
    const specd_dtype types[] = {SPECD_Q4_1, SPECD_Q6_K, SPECD_Q4_K, SPECD_Q8_0};
    const int64_t rows[] = {37, 16, 5, 203};
    const int toks[] = {1, 2, 3, 5, 17, 70};
    specd_pool *pools[3] = {specd_pool_create(1), specd_pool_create(2), specd_pool_create(3)};
    qfixture f[4];
    for (int i = 0; i < 4; i++) qfix_make(&f[i], types[i], rows[i], cols, 500 + (uint64_t)i);
    const cpu_qweight *w[4] = {&f[0].w, &f[1].w, &f[2].w, &f[3].w};
    for (size_t p = 0; p < N_PATHS; p++) {
        if (!cpu_simd_force(k_paths[p])) continue;
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
            int n = toks[k];
            float *x = malloc(sizeof(float) * (size_t)n * cols);
            test_fill_random(x, (size_t)n * cols, 40 + k, 1.5f);
            for (int n_mats = 1; n_mats <= 4; n_mats++)
                for (int pi = 0; pi < 3; pi++) {
                    float *y[4], *one[4];
                    for (int i = 0; i < n_mats; i++) {
                        y[i] = alloc_nan((size_t)n * (size_t)rows[i]);
                        one[i] = alloc_nan((size_t)n * (size_t)rows[i]);
                        cpu_qmatmul(pools[pi], one[i], w[i], x, n);
                    }
                    assert_int_equal(cpu_qmatmuls(pools[pi], n_mats, y, w, x, n), 0);
                    for (int i = 0; i < n_mats; i++) {
                        expect_same_bits(y[i], one[i], n, rows[i], "qmatmuls", k_paths[p],
                                         types[i], pi + 1);
                        free(y[i]);
                        free(one[i]);
                    }
                }
            free(x);
        }
    }
    cpu_simd_force("auto");
    qfixture wide;
    qfix_make(&wide, SPECD_Q4_1, 16, 2 * cols, 9);
    const cpu_qweight *mixed[2] = {&f[0].w, &wide.w};
    float *y2[2] = {NULL, NULL};
    assert_int_equal(cpu_qmatmuls(pools[1], 2, y2, mixed, NULL, 1), -1);
    assert_int_equal(cpu_qmatmuls(pools[1], CPU_QMATMULS_MAX + 1, y2, mixed, NULL, 1), -1);
    qfix_free(&wide);
    for (int i = 0; i < 4; i++) qfix_free(&f[i]);
    for (int i = 0; i < 3; i++) specd_pool_destroy(pools[i]);
}

/* Against double precision on the dequantized weights and the original
 * activations, within the int8 activation bound (file header). */
static void test_accuracy_bound(void **state) {
    (void)state;
    specd_pool *pool = specd_pool_create(2);
    const int64_t rows = 48, cols = 1536;
    const int n = 5;
    float *wr = malloc(sizeof(float) * cols);
    float *x = malloc(sizeof(float) * n * cols);
    test_fill_random(x, (size_t)n * cols, 3, 1.0f);
    /* an outlier per row, as real activations have, so blocks differ */
    for (int t = 0; t < n; t++) x[t * cols + 17 * (t + 1)] = 9.0f;
    double worst = 0;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        qfixture f;
        qfix_make(&f, k_types[ti], rows, cols, 5 + ti);
        float *y = alloc_nan((size_t)n * rows);
        cpu_qmatmul(pool, y, &f.w, x, n);
        for (int64_t r = 0; r < rows; r++) {
            cpu_dequant_row_ref(k_types[ti], f.raw + r * f.row_bytes, wr, cols);
            for (int t = 0; t < n; t++) {
                const float *xt = x + (size_t)t * cols;
                double ref = 0, mag = 0, bound = 0;
                for (int64_t b = 0; b < cols / 32; b++) {
                    double amax = 0, wsum = 0;
                    for (int j = 0; j < 32; j++) {
                        int64_t c = 32 * b + j;
                        ref += (double)wr[c] * xt[c];
                        mag += fabs((double)wr[c] * xt[c]);
                        amax = fmax(amax, fabs(xt[c]));
                        wsum += fabs(wr[c]);
                    }
                    bound += amax / 254.0 * wsum;
                }
                bound += 1e-5 * mag;
                double err = fabs(y[t * rows + r] - ref);
                if (bound > 0 && err / bound > worst) worst = err / bound;
                if (!(err <= bound))
                    fail_msg("%s: y[%d][%lld] = %.9g, ref %.9g, error %.3g over the bound %.3g",
                             specd_dtype_get(k_types[ti])->name, t, (long long)r,
                             y[t * rows + r], ref, err, bound);
            }
        }
        free(y);
        qfix_free(&f);
    }
    print_message("  worst error / bound: %.3f\n", worst);
    free(wr);
    free(x);
    specd_pool_destroy(pool);
}

static void test_quantizer_known_values(void **state) {
    (void)state;
    float x[64];
    int8_t q[64];
    float d[2], s[2];
    int32_t sq[2];
    /* block 0: x_j = j - 15.5 * (j odd) ... a ramp with max |x| = 31 at j=31 */
    for (int j = 0; j < 32; j++) x[j] = (float)j * ((j & 1) ? -1.0f : 1.0f);
    /* block 1: all zero -> d = 0, q = 0 */
    for (int j = 32; j < 64; j++) x[j] = 0.0f;
    cpu_quantize_act(x, 1, 64, q, d, s, sq);
    assert_true(d[0] == 31.0f / 127.0f);
    int32_t sum = 0;
    for (int j = 0; j < 32; j++) {
        float want = rintf(x[j] * (1.0f / d[0]));
        assert_int_equal(q[j], (int)want);
        sum += q[j];
    }
    assert_int_equal(q[31], -127);
    assert_int_equal(sq[0], sum);
    assert_true(s[0] == d[0] * (float)sum);
    assert_true(d[1] == 0.0f && s[1] == 0.0f && sq[1] == 0);
    for (int j = 32; j < 64; j++) assert_int_equal(q[j], 0);
}

/* Every path's quantizer equals the scalar one bit for bit, on values with
 * exact ties (x * (1/d) landing on k + 0.5), zeros, tiny and huge blocks. */
static void test_quantizers_equal(void **state) {
    (void)state;
    const int n = 7;
    const int64_t cols = 1536, nb = cols / 32;
    float *x = malloc(sizeof(float) * n * cols);
    test_fill_random(x, (size_t)n * cols, 5, 3.0f);
    for (int j = 0; j < 32; j++) x[j] = (float)j - 15.5f;      /* ties at d = 15.5/127 */
    for (int j = 32; j < 64; j++) x[j] = 0.0f;                  /* an all-zero block */
    for (int j = 64; j < 96; j++) x[j] = 1e-30f * (float)(j - 80); /* tiny */
    for (int j = 96; j < 128; j++) x[j] = 1e30f * (float)(j - 112); /* huge */
    int8_t *q0 = malloc((size_t)n * cols), *q1 = malloc((size_t)n * cols);
    float *d0 = malloc(sizeof(float) * n * nb), *d1 = malloc(sizeof(float) * n * nb);
    float *s0 = malloc(sizeof(float) * n * nb), *s1 = malloc(sizeof(float) * n * nb);
    int32_t *a0 = malloc(sizeof(int32_t) * n * nb), *a1 = malloc(sizeof(int32_t) * n * nb);
    cpu_quantize_act(x, n, cols, q0, d0, s0, a0);
    for (size_t p = 0; p < N_PATHS; p++) {
        if (!cpu_simd_force(k_paths[p])) continue;
        cpu_quantize_act_active(x, n, cols, q1, d1, s1, a1);
        if (memcmp(q0, q1, (size_t)n * cols) || memcmp(d0, d1, sizeof(float) * n * nb) ||
            memcmp(s0, s1, sizeof(float) * n * nb) || memcmp(a0, a1, sizeof(int32_t) * n * nb))
            fail_msg("path %s: the quantizer differs from the scalar one", k_paths[p]);
    }
    cpu_simd_force("auto");
    free(x), free(q0), free(q1), free(d0), free(d1), free(s0), free(s1), free(a0), free(a1);
}

/* Types without a tile kind keep the fp32 path; so do bad shapes. */
static void test_which_types(void **state) {
    (void)state;
    const specd_dtype no[] = {SPECD_F32, SPECD_F16, SPECD_BF16};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        size_t rb;
        uint8_t *raw = test_random_weights(no[i], 4, 256, 1, &rb);
        specd_tensor t;
        memset(&t, 0, sizeof t);
        t.type = no[i];
        t.n_dims = 2;
        t.ne[0] = 256;
        t.ne[1] = 4;
        t.data = raw;
        cpu_qweight w;
        assert_int_equal(cpu_qweight_make(&t, &w, NULL), 0);
        free(raw);
    }
    /* Q4_0 with a scale whose -8x overflows fp16 keeps the fp32 path too */
    uint8_t blk[18] = {0};
    uint16_t big = specd_f32_to_fp16(30000.0f);
    memcpy(blk, &big, 2);
    specd_tensor t;
    memset(&t, 0, sizeof t);
    t.type = SPECD_Q4_0;
    t.n_dims = 2;
    t.ne[0] = 32;
    t.ne[1] = 1;
    t.data = blk;
    cpu_qweight w;
    assert_int_equal(cpu_qweight_make(&t, &w, NULL), 0);
    /* the K-quants take their super-blocks of 256 whole, and repack into
     * about the GGUF's bytes (qmatmul.h: 2432, 2944, 3392, 1856 and 1408
     * per 16 x 256) */
    const specd_dtype k[] = {SPECD_Q4_K, SPECD_Q5_K, SPECD_Q6_K, SPECD_Q3_K, SPECD_Q2_K};
    const size_t sb_bytes[] = {2432, 2944, 3392, 1856, 1408};
    for (int i = 0; i < 5; i++) {
        size_t rb;
        uint8_t *raw = test_random_weights(k[i], 20, 512, 2, &rb);
        t.type = k[i];
        t.ne[0] = 512;
        t.ne[1] = 20;
        t.data = raw;
        assert_int_equal(cpu_qweight_make(&t, &w, NULL), 1);
        assert_int_equal(cpu_qweight_bytes(&w), 2 * 2 * sb_bytes[i]);
        cpu_qweight_free(&w);
        t.ne[0] = 128; /* half a super-block: not a K-quant row */
        assert_int_equal(cpu_qweight_make(&t, &w, NULL), -1);
        free(raw);
    }
}

/* The weight arena (weight_arena.h): 64-byte aligned, zeroed, disjoint
 * allocations, small ones sharing a chunk and one larger than a chunk
 * getting its own; and a matrix repacked into it holds exactly the tiles
 * of one repacked into memory of its own (the kernels cannot tell them
 * apart). Whether the kernel backs it with huge pages depends on the
 * machine's THP setting, so no test asserts it. */
static void test_weight_arena(void **state) {
    (void)state;
    cpu_arena *a = cpu_arena_create();
    assert_non_null(a);
    uint8_t *prev = NULL;
    size_t prev_n = 0;
    const size_t sizes[] = {1, 100, 64, 4096, 1000000, CPU_ARENA_CHUNK + 12345, 333};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *p = cpu_arena_alloc(a, sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        for (size_t j = 0; j < sizes[i]; j += 4093) assert_int_equal(p[j], 0);
        assert_int_equal(p[sizes[i] - 1], 0);
        /* disjoint from the one before (the only neighbour a bump can hit) */
        if (prev) assert_true(p >= prev + prev_n || p + sizes[i] <= prev);
        memset(p, 0xAB, sizes[i]);
        prev = p, prev_n = sizes[i];
    }
    assert_true(cpu_arena_used(a) >= CPU_ARENA_CHUNK + 1000000);
    qfixture f;
    qfix_make(&f, SPECD_Q4_1, 40, 96, 3); /* 40 rows: a padded last group */
    cpu_qweight w;
    assert_int_equal(cpu_qweight_make(&f.t, &w, a), 1);
    assert_int_equal(w.owned, 0);
    assert_int_equal(cpu_qweight_bytes(&w), cpu_qweight_bytes(&f.w));
    assert_memory_equal(w.data, f.w.data, cpu_qweight_bytes(&w));
    cpu_qweight_free(&w); /* the arena keeps the bytes; this only forgets them */
    assert_null(w.data);
    qfix_free(&f);
    cpu_arena_destroy(a);
    cpu_arena_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weight_arena),
        cmocka_unit_test(test_quantizer_known_values),
        cmocka_unit_test(test_which_types),
        cmocka_unit_test(test_quantizers_equal),
        cmocka_unit_test(test_paths_equal_scalar_twin),
        cmocka_unit_test(test_amx_every_pass_length),
        cmocka_unit_test(test_q4_extremes),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_qmatmuls_equal_one_by_one),
        cmocka_unit_test(test_accuracy_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
