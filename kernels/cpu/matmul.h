/* matmul.h - CPU matrix-vector/matrix-matrix products on stored weights.
 *
 * y[t][r] = sum_c W[r][c] * x[t][c]   for t < n_tok, r < rows, c < cols
 *
 * W is a specd_tensor as it lies in the model file (F32, F16, BF16, Q8_0,
 * Q4_0, Q4_1, Q4_K, Q6_K), rows = ne[1], cols = ne[0]. Activations and
 * outputs are fp32. Quantized weights are used in place: each block is
 * expanded in registers and multiplied with fp32 activations, so results
 * equal "dequantize to fp32, then fp32 matmul" up to summation order. The
 * weights are never copied to fp32 (decode is bound by reading them).
 *
 * Each kernel has a plain scalar twin (the *_ref functions) that the tests
 * compare against; the fast path is chosen once at run time from the CPU's
 * features (AVX-512, AVX2+FMA, or portable C). */
#ifndef SPECD_CPU_MATMUL_H
#define SPECD_CPU_MATMUL_H

#include <stdint.h>

#include "common/util/tensor.h"
#include "threadpool.h"

/* Dequantizes the first n elements starting at element 0 of `src` (n must
 * be a whole number of blocks) into dst. */
void cpu_dequant_row(specd_dtype type, const void *src, float *dst, int64_t n);
void cpu_dequant_row_ref(specd_dtype type, const void *src, float *dst, int64_t n);

/* Quantizes n values (a multiple of 32) into GGML's Q8_0 blocks at dst,
 * as llama.cpp's reference quantizer does: per block d = max|x| / 127, each
 * value round(x / d) (half away from zero), d stored as fp16. A NaN becomes
 * 0. One plain-C definition for every caller (the Q8_0 KV cache, the
 * speculator's quantized export), so its bits never depend on the SIMD
 * path. */
void cpu_quantize_row_q8_0(const float *x, void *dst, int64_t n);

/* Row r of W as fp32 (used for embedding lookups). */
void cpu_tensor_row(const specd_tensor *W, int64_t r, float *dst);

void cpu_matmul(specd_pool *pool, float *y, const specd_tensor *W, const float *x, int n_tok);
void cpu_matmul_ref(float *y, const specd_tensor *W, const float *x, int n_tok);

/* out[i] = silu(gate[i]) * up[i] by the active path (AVX2: a vector exp
 * within 2 ulp of expf; scalar: expf), over the pool when n is large. */
void cpu_swiglu(specd_pool *pool, float *out, const float *gate, const float *up, size_t n);

/* ids[r] = specd_argmax(x + r * width, width) for each row, by the active
 * path (AVX2: two vector passes), rows over the pool. */
void cpu_argmax_rows(specd_pool *pool, int32_t *ids, const float *x, int n_rows, int width);

/* Every SIMD path's name, worst first: the initializer of the kernel
 * sets' name table (matmul.c), and the list that tests and benches walk
 * ("static const char *const paths[] = {CPU_SIMD_PATH_NAMES};"). */
#define CPU_SIMD_PATH_NAMES "scalar", "avx2", "avxvnni", "avx512", "avx512vnni", "amx"

/* Name of the SIMD path chosen at run time, one of the above (the best
 * the CPU has, unless SPECD_SIMD names another). The VNNI paths differ
 * from their plain twins only in the integer-activation kernels
 * (qmatmul.h), and "amx" from "avx512vnni" only in the Q4 and Q8_0
 * kernels' passes of many tokens (qmatmul_amx.c). */
const char *cpu_simd_name(void);
/* Forces a path (for tests and benches); returns 0 if the CPU lacks it. */
int cpu_simd_force(const char *name);
/* 1 if the CPU (and this build) has the named path. */
int cpu_simd_available(const char *name);

struct specd_backend;
/* Decode steps that a CPU backend ran as a split decode (cpu_backend.c), so
 * that a test comparing that path with the one-run pass can see it ran. */
long cpu_split_decodes(const struct specd_backend *be);
/* Attention passes that ran one task per sequence (cpu_backend.c,
 * cpu_attention), for the test comparing them with each sequence alone. */
long cpu_attention_seq_tasks(const struct specd_backend *be);

#endif
