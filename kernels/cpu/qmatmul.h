/* qmatmul.h - the integer-activation matmul (precision "fast", the default).
 *
 * y[t][r] = sum_c W[r][c] * x[t][c], computed the way llama.cpp does on the
 * CPU: each activation row is quantized once per matmul to int8 blocks of 32
 * with an fp32 scale per block (llama.cpp's Q8_1), and every weight block is
 * multiplied with it in integers (maddubs/madd on AVX2, vpdpbusd with VNNI).
 * Only one int32 sum per (row, token, block) ever reaches floating point.
 *
 * Weights are repacked once, at load, into tiles of 16 rows x 32 columns
 * (layout below): a SIMD register holds 4 consecutive weights of each of 16
 * rows (8 with AVX2), so one vpdpbusd against 4 broadcast activation bytes
 * advances 16 output rows at once. Outputs come out as whole vectors: there
 * is no horizontal reduction anywhere.
 *
 * Bitwise batch invariance (a row's result does not depend on what else is
 * in the batch, nor on the thread split) holds by construction: every output
 * element is produced by the same sequence of operations whatever M is, with
 * one fp32 accumulator per element, walked over the blocks in column order:
 *
 *     acc = 0
 *     for each block b:   isum = sum_j wq[j] * xq[j]              (exact int32)
 *                         acc  = fma((float)isum, wd * xd[b], acc)
 *                         acc  = fma(wm, xs[b], acc)          (4-bit types)
 *
 * The scalar twin (cpu_qmatmul_ref) performs exactly those operations with
 * fmaf, so every SIMD path must equal it bit for bit, and the tests check
 * that. Tasks split only the rows, never the columns.
 *
 * The K-quants follow the same order with their own scales per block:
 * Q4_K's and Q5_K's wd = d * sc and wm = -dmin * mn (both exact in fp32:
 * an fp16 times a 6-bit integer), and Q6_K's 16-column halves, each its
 * own int32 sum and scale:
 *
 *     Q6_K:  isum0 = sum_{j<16} (wq[j] - 32) * xq[j]
 *            isum1 = sum_{j>=16} (wq[j] - 32) * xq[j]
 *            acc = fma((float)isum0, wd0 * xd[b], acc)
 *            acc = fma((float)isum1, wd1 * xd[b], acc)   (wd_h = d * sc_h)
 *
 * Q2_K's 16-column halves have a min each as well, taken with the
 * activation half sums (sh, and sq - sh for the second half):
 *
 *     Q2_K:  isum_h = sum_{j in half h} wq[j] * xq[j]             (wq 0..3)
 *            acc = fma((float)isum0, wd0 * xd[b], acc)
 *            acc = fma((float)isum1, wd1 * xd[b], acc)
 *            acc = fma(wm0, xd[b] * sh, acc)
 *            acc = fma(wm1, xd[b] * (sq - sh), acc)
 *            (wd_h = d * sc_h, wm_h = -dmin * mn_h)
 *
 * Q3_K is Q6_K's form with 3-bit quants: wd_h = d * sc_h (sc an int8,
 * -32..31) times (wq - 4), wq 0..7, the chain started at -4 * (the half's
 * activation sum).
 *
 * Supported weight types: Q4_0, Q4_1 (tile kind Q4), Q5_0, Q5_1 (kind
 * Q5), Q8_0 (kind Q8), IQ4_NL and IQ4_XS (kind IQ4), Q4_K (kind Q4K),
 * Q5_K (kind Q5K), Q6_K (kind Q6K), Q3_K (kind Q3K), Q2_K (kind Q2K).
 * Other types keep the fp32-activation kernels (matmul.h), which are
 * also the "exact" precision path for every type. */
#ifndef SPECD_CPU_QMATMUL_H
#define SPECD_CPU_QMATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/tensor.h"
#include "threadpool.h"
#include "weight_arena.h"

#define QT_ROWS 16 /* rows per tile */
#define QT_COLS 32 /* columns per tile = one quantization block */

/* Tile layouts. Q4 and Q8: one tile per (row group g, block b), tiles of a
 * row group consecutive: tile (g, b) at data + (g * nb + b) * tile_bytes.
 *
 *   Q4: d[16] fp16 | m[16] fp16 | qs: 4 x 64 bytes
 *       weight(row i, col c) = d[i] * q + m[i], q a nibble of qs:
 *       col c = 4v + j      (v 0..3, j 0..3): low  nibble of qs[v][4i + j]
 *       col c = 16 + 4v + j                : high nibble of qs[v][4i + j]
 *       (Q4_0's "q - 8" becomes m = -8 d, exact in fp16.)
 *   Q8: d[16] fp16 | qs: 8 x 64 bytes of int8
 *       weight(row i, col 4v + j) = d[i] * qs[v][4i + j]
 *   IQ4: d[16] fp32 | qs: 4 x 64 bytes of nibbles in Q4's order
 *       weight(row i, col c) = d[i] * k_iq4nl[nibble] (quant_impl.h's
 *       16 int8 levels, looked up in the kernels with vpshufb; fp32 d:
 *       IQ4_XS's d * (sc - 32) is exact in fp32, not in fp16)
 *   Q5: Q4's tile | hi: 64 bytes, bit c of hi[4i + j] the fifth bit of
 *       (row i, col 4c + j): q = nibble + 16 * bit, weight = d[i] * q + m[i]
 *       (Q5_0's "q - 16" becomes m = -16 d, exact in fp16.)
 *
 * The K-quants keep GGML's super-blocks of 256 columns: per row group, per
 * super-block, a header of fp32 per-row scales, then the super-block's 8
 * tiles of 32 columns (a group takes group_bytes, nb / 8 super-blocks):
 *
 *   Q4K header: d[16] f32 | mneg[16] f32 (= -dmin)                 128 B
 *       tile:   sc[16] u8 | mn[16] u8 | qs: 4 x 64 bytes (Q4's)    288 B
 *       weight(row i, col c) = (d[i] * sc[i]) * q + mneg[i] * mn[i]
 *   Q5K header: Q4K's
 *       tile:   Q4K's | hi: 64 bytes as Q5's                       352 B
 *       weight(row i, col c) = (d[i] * sc[i]) * q + mneg[i] * mn[i], q 0..31
 *   Q6K header: d[16] f32                                            64 B
 *       tile:   sc[2][16] i8 (columns 0..15, 16..31) |
 *               lo: 4 x 64 bytes, the low 4 bits in Q4's nibble order |
 *               hi: 2 x 64 bytes, the top 2 bits: chunk c = 4k + e
 *               (columns 4c..4c+3) at bits 2e, 2e+1 of hi[k][4i + j] 416 B
 *       weight(row i, col c) = (d[i] * sc[c / 16][i]) * (q - 32), q 0..63
 *   Q3K header: Q6K's
 *       tile:   sc[2][16] i8 (Q6K's) | lo: 2 x 64 bytes, the low 2 bits
 *               as Q2K's q | hi: 64 bytes, the third bit as Q5's     224 B
 *       weight(row i, col c) = (d[i] * sc[c / 16][i]) * (q - 4), q 0..7
 *   Q2K header: Q4K's
 *       tile:   sm[2][16] u8 (columns 0..15, 16..31), GGML's scale bytes:
 *               sc in the low nibble, mn in the high one |
 *               q: 2 x 64 bytes, chunk c = 4k + e at bits 2e, 2e+1 of
 *               q[k][4i + j] (Q6K's hi layout)                     160 B
 *       weight(row i, col c) = (d[i] * sc) * q + mneg[i] * mn, q 0..3,
 *               sc and mn from sm[c / 16][i]
 *
 * That is 2432, 2944, 3392, 1856 and 1408 bytes per 16 rows x 256
 * columns (Q4K, Q5K, Q6K, Q3K, Q2K), against GGML's 2304, 2816, 3360, 1760
 * and 1344: a decode step streams about as many bytes as the GGUF's.
 * (Storing d * sc as fp32 in every tile would cost a third more bytes for
 * Q4_K, and fp16 would round it.)
 *
 * Rows past the tensor's last row (the last group's padding) are zero. */
typedef enum cpu_qkind {
    CPU_Q4 = 0,
    CPU_Q8 = 1,
    CPU_Q4K = 2,
    CPU_Q6K = 3,
    CPU_Q5 = 4,
    CPU_Q5K = 5,
    CPU_IQ4 = 6,
    CPU_Q2K = 7,
    CPU_Q3K = 8,
    CPU_QKINDS
} cpu_qkind;

/* Decode reads a matrix once at a low demand rate (the dot products sit
 * between loads); the kernels keep reads in flight with a software prefetch
 * this far ahead of the tile they work on, one per cache line (prefetches
 * never fault, so the address may lie past the matrix). */
#define QT_PREFETCH_BYTES (12 * 1024)

#define QT_Q4_BYTES (32 + 32 + 256)
#define QT_Q8_BYTES (32 + 512)
#define QT_IQ4_BYTES (64 + 256)
#define QT_Q5_BYTES (QT_Q4_BYTES + 64)
#define QT_SB_BLOCKS 8 /* 32-column blocks per K-quant super-block */
#define QT_Q4K_HDR 128
#define QT_Q4K_BYTES (32 + 256)
#define QT_Q4K_SB (QT_Q4K_HDR + QT_SB_BLOCKS * QT_Q4K_BYTES)
#define QT_Q5K_BYTES (QT_Q4K_BYTES + 64)
#define QT_Q5K_SB (QT_Q4K_HDR + QT_SB_BLOCKS * QT_Q5K_BYTES)
#define QT_Q6K_HDR 64
#define QT_Q6K_BYTES (32 + 256 + 128)
#define QT_Q6K_SB (QT_Q6K_HDR + QT_SB_BLOCKS * QT_Q6K_BYTES)
#define QT_Q3K_BYTES (32 + 128 + 64)
#define QT_Q3K_SB (QT_Q6K_HDR + QT_SB_BLOCKS * QT_Q3K_BYTES)
#define QT_Q2K_BYTES (32 + 128)
#define QT_Q2K_SB (QT_Q4K_HDR + QT_SB_BLOCKS * QT_Q2K_BYTES)

typedef struct cpu_qweight {
    cpu_qkind kind;
    int64_t rows, cols;
    int64_t n_groups; /* ceil(rows / 16) */
    int64_t nb;       /* cols / 32 */
    size_t tile_bytes;  /* one 32-column tile (K-quants: without the header) */
    size_t group_bytes; /* one row group: group g at data + g * group_bytes */
    uint8_t *data;      /* 64-byte aligned */
    int owned;     /* data is the qweight's own (malloc), not an arena's */
} cpu_qweight;

/* Activations as the kernels read them: token t's int8 values at
 * q + t * cols, its block scales at d[t * nb + b], the block's
 * d * sum(q) at s[...] and sum(q) itself at sq[...]; sh[...] is the sum of
 * the block's first 16 values, which only Q6K, Q3K and Q2K tiles read
 * (cpu_act_half_sums; NULL where no such matrix takes the input). */
typedef struct cpu_qact {
    int n_tok;
    int64_t cols, nb;
    const int8_t *q;
    const float *d, *s;
    const int32_t *sq, *sh;
} cpu_qact;

/* 1: repacked into *out; 0: the type has no integer path (use the fp32
 * kernels); -1: out of memory or an unusable tensor (cols not a multiple of
 * 32, a scale that overflows fp16 when scaled). The tiles go into `arena`
 * (weight_arena.h: huge pages, freed with the arena), or with arena NULL
 * into memory of their own that cpu_qweight_free frees. */
int cpu_qweight_make(const specd_tensor *t, cpu_qweight *out, cpu_arena *arena);
void cpu_qweight_free(cpu_qweight *w);
/* Bytes the tiles take (what a pass over the matrix streams). */
size_t cpu_qweight_bytes(const cpu_qweight *w);

/* The quantizer every path shares: block scale d = max|x| / 127, values
 * rint(x / d) (ties to even). Writes n_tok * cols bytes to q and n_tok * nb
 * entries to d, s, sq. */
void cpu_quantize_act(const float *x, int n_tok, int64_t cols, int8_t *q, float *d, float *s,
                      int32_t *sq);

/* sh[t * nb + b] = the sum of block b's first 16 int8 values of token t
 * (Q6_K's halves have their own scales, so their "- 32" needs each half's
 * sum, as do Q3_K's "- 4" and Q2_K's mins; the second half's is sq - sh). */
void cpu_act_half_sums(const int8_t *q, int n_tok, int64_t cols, int32_t *sh);
/* 1 if a matrix of this kind reads sh. */
static inline int cpu_qkind_half_sums(cpu_qkind k) {
    return k == CPU_Q6K || k == CPU_Q3K || k == CPU_Q2K;
}

/* The same, by the active SIMD path's quantizer (bit-identical to it). */
void cpu_quantize_act_active(const float *x, int n_tok, int64_t cols, int8_t *q, float *d,
                             float *s, int32_t *sq);

void cpu_qmatmul(specd_pool *pool, float *y, const cpu_qweight *W, const float *x, int n_tok);

/* y[i] = cpu_qmatmul(W[i], x) for i < n_mats, bit for bit, with x
 * quantized once and every matrix's row groups in one pool run: a layer's
 * q, k and v (and gate and up) read one input, and at decode each pool run
 * costs a hand-off and a wait for the slower thread comparable to a small
 * matrix's work. Every W[i] must have the same cols; -1 if not, or if
 * n_mats is not 1..CPU_QMATMULS_MAX. */
#define CPU_QMATMULS_MAX 4
int cpu_qmatmuls(specd_pool *pool, int n_mats, float *const *y, const cpu_qweight *const *W,
                 const float *x, int n_tok);
/* The "amx" path's shortest pass of tokens that goes to the tiles
 * (qmatmul_amx.c; shorter ones take the VNNI kernel). n > 0 sets it, for
 * tests that run every pass length on the tiles; returns the previous
 * value (n <= 0: only returns it). */
int cpu_amx_min_pass(int n);
/* The scalar twin: the same result, bit for bit, one element at a time. */
void cpu_qmatmul_ref(float *y, const cpu_qweight *W, const float *x, int n_tok);

/* Row groups [g0, g1) for all tokens; y is [n_tok][ldy]. One per ISA and
 * tile kind (qmatmul_scalar/avx2/avx512). */
typedef struct cpu_qmm_args {
    const cpu_qweight *w;
    cpu_qact a;
    float *y;
    int64_t ldy;
} cpu_qmm_args;
typedef void (*cpu_qrows_fn)(const cpu_qmm_args *a, int64_t g0, int64_t g1);

/* A kernel's tokens go in passes of at most `max` tokens, as equal as they
 * go: at 8 a pass, 9 tokens are 5 + 4, not 8 + 1, whose pass of one token
 * decodes every tile again for a single dot. A token's sums are the same in
 * any pass (a fixed order per token), so the split changes no bit. The
 * AVX-512 and AMX drivers split this way (qmatmul_avx512.c, qmatmul_amx.c):
 * pass p holds base + (p < longer) tokens, so the last is the shortest. */
typedef struct cpu_pass_split {
    int passes, base, longer;
} cpu_pass_split;
static inline cpu_pass_split cpu_split_passes(int n_tok, int max) {
    const int passes = (n_tok + max - 1) / max;
    return (cpu_pass_split){passes, n_tok / passes, n_tok % passes};
}

#endif
