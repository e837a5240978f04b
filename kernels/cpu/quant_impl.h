/* quant_impl.h - internal contract between the matmul dispatcher and the
 * per-ISA kernel files (quant_scalar.c, quant_avx2.c, quant_avx512.c).
 *
 * Each SIMD path fills one cpu_kernel_set: for every weight type a dequant
 * function (must give bit-identical results to cpu_dequant_row_ref) and a
 * "rows" function computing a block of outputs of y = x . W^T. The
 * dispatcher (matmul.c) splits rows among threads and picks the set once
 * from the CPU's features. Block layouts are GGML's (see quant_ref.c). */
#ifndef SPECD_CPU_QUANT_IMPL_H
#define SPECD_CPU_QUANT_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/util/dtype.h"
#include "kernels/backend.h" /* SPECD_KV_PAGE_ROWS */
#include "qmatmul.h"

/* Block structs, byte-exact copies of GGML's layouts (the file format). All
 * fields are byte arrays or uint16 so there is no padding; sizes are checked
 * below against dtype.c's table. fp16 values are stored as raw bits. */
typedef struct blk_q8_0 {
    uint16_t d;
    int8_t qs[32];
} blk_q8_0;

typedef struct blk_q4_0 {
    uint16_t d;
    uint8_t qs[16]; /* low nibble = element j, high nibble = element j+16 */
} blk_q4_0;

typedef struct blk_q4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[16];
} blk_q4_1;

/* 5-bit quants: a block's low 4 bits as Q4_0's nibbles, the fifth bit of
 * element j at bit j of qh (little-endian). Q5_0: w = d * (q - 16); Q5_1:
 * w = d * q + m. llama.cpp's Q4_K_M falls back to Q5_0 for matrices whose
 * rows are not whole 256-weight super-blocks. */
typedef struct blk_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
} blk_q5_0;

typedef struct blk_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[16];
} blk_q5_1;

/* 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit
 * min packed into `scales` (see q4k_scale_min). */
typedef struct blk_q4_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[128];
} blk_q4_k;

/* Q4_K with a fifth bit per weight: element l of sub-block s takes bit s
 * of qh[l]; w = d*sc[s] * q - dmin*mn[s], q = 0..31. */
typedef struct blk_q5_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} blk_q5_k;

/* 256 weights in 16 sub-blocks of 16, each with an int8 scale; 6-bit quants
 * split into 4 low bits (ql) and 2 high bits (qh). */
typedef struct blk_q6_k {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
} blk_q6_k;

/* 256 weights in 16 sub-blocks of 16 with 2-bit quants q = 0..3; sub-block
 * s keeps a 4-bit scale in the low nibble of scales[s] and a 4-bit min in
 * the high one: w = (d * sc) * q - dmin * mn. The quants of 32-weight group
 * g (0..7) are bits 2(g % 4), 2(g % 4) + 1 of the 32 bytes
 * qs[32 (g / 4) ..]: element 32g + l in byte l. */
typedef struct blk_q2_k {
    uint8_t scales[16];
    uint8_t qs[64];
    uint16_t d;
    uint16_t dmin;
} blk_q2_k;

/* 256 weights in 16 sub-blocks of 16 with 3-bit quants q = -4..3: two low
 * bits as Q2_K's, and element 32g + l subtracts 4 unless bit g of hmask[l]
 * is set; sub-block s has a 6-bit scale (q3k_scale): w = (d * sc) * q. */
typedef struct blk_q3_k {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    uint16_t d;
} blk_q3_k;

/* Non-linear 4-bit quants: a nibble indexes k_iq4nl, GGML's 16 int8
 * levels. IQ4_NL: 32 weights, w = d * k_iq4nl[q] (Q4_0's nibble order).
 * IQ4_XS: 256 weights in 8 blocks of 32, block j with a 6-bit scale
 * (iq4xs_scale, minus 32): w = (d * sc) * k_iq4nl[q]; block j's nibbles
 * in qs[16 j ..], Q4_0's order. */
typedef struct blk_iq4_nl {
    uint16_t d;
    uint8_t qs[16];
} blk_iq4_nl;

typedef struct blk_iq4_xs {
    uint16_t d;
    uint16_t scales_h; /* bits 2j, 2j+1: the top two bits of block j's scale */
    uint8_t scales_l[4]; /* block j's low four bits: nibble j % 2 of byte j / 2 */
    uint8_t qs[128];
} blk_iq4_xs;

static const int8_t k_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

/* Field offsets for kernels, which address blocks by byte offset: blocks of
 * 18 or 34 bytes can sit at any even address and a caller may pass any
 * address, so the kernels never form possibly misaligned struct pointers. */
enum {
    Q4K_D = offsetof(blk_q4_k, d),
    Q4K_DMIN = offsetof(blk_q4_k, dmin),
    Q4K_SCALES = offsetof(blk_q4_k, scales),
    Q4K_QS = offsetof(blk_q4_k, qs),
    Q5K_QH = offsetof(blk_q5_k, qh), /* d, dmin and scales where Q4_K has them */
    Q5K_QS = offsetof(blk_q5_k, qs),
    Q6K_QL = offsetof(blk_q6_k, ql),
    Q6K_QH = offsetof(blk_q6_k, qh),
    Q6K_SCALES = offsetof(blk_q6_k, scales),
    Q6K_D = offsetof(blk_q6_k, d),
    Q2K_SCALES = offsetof(blk_q2_k, scales),
    Q2K_QS = offsetof(blk_q2_k, qs),
    Q2K_D = offsetof(blk_q2_k, d),
    Q2K_DMIN = offsetof(blk_q2_k, dmin),
    Q3K_HMASK = offsetof(blk_q3_k, hmask),
    Q3K_QS = offsetof(blk_q3_k, qs),
    Q3K_SCALES = offsetof(blk_q3_k, scales),
    Q3K_D = offsetof(blk_q3_k, d),
    IQ4XS_SCALES_H = offsetof(blk_iq4_xs, scales_h),
    IQ4XS_SCALES_L = offsetof(blk_iq4_xs, scales_l),
    IQ4XS_QS = offsetof(blk_iq4_xs, qs),
};

_Static_assert(sizeof(blk_q8_0) == 34, "Q8_0 block size");
_Static_assert(sizeof(blk_q4_0) == 18, "Q4_0 block size");
_Static_assert(sizeof(blk_q4_1) == 20, "Q4_1 block size");
_Static_assert(sizeof(blk_q5_0) == 22, "Q5_0 block size");
_Static_assert(sizeof(blk_q5_1) == 24, "Q5_1 block size");
_Static_assert(sizeof(blk_q4_k) == 144, "Q4_K block size");
_Static_assert(sizeof(blk_q5_k) == 176, "Q5_K block size");
_Static_assert(offsetof(blk_q5_k, scales) == Q4K_SCALES, "Q5_K scales where Q4_K's are");
_Static_assert(sizeof(blk_q6_k) == 210, "Q6_K block size");
_Static_assert(sizeof(blk_q2_k) == 84, "Q2_K block size");
_Static_assert(sizeof(blk_q3_k) == 110, "Q3_K block size");
_Static_assert(sizeof(blk_iq4_nl) == 18, "IQ4_NL block size");
_Static_assert(sizeof(blk_iq4_xs) == 136, "IQ4_XS block size");

/* Scale and min of sub-block j (0..7) of a Q4_K super-block: the first four
 * sub-blocks keep 6 bits in bytes 0..3 (scale) and 4..7 (min); the last four
 * keep their low 4 bits in bytes 8..11 and their top 2 bits in the spare top
 * bits of bytes 0..7. */
static inline void q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Scale of sub-block s (0..15) of a Q3_K super-block, minus its offset 32:
 * the low 4 bits are the low nibbles of bytes 0..7 (s < 8) or their high
 * nibbles (s >= 8), the top 2 bits come from bytes 8..11 (byte 8 + s % 4,
 * bits 2 (s / 4) and 2 (s / 4) + 1). GGML unpacks the same 12 bytes with
 * 32-bit masks. */
static inline int q3k_scale(const uint8_t *sc, int s) {
    const int lo = s < 8 ? sc[s] & 0x0F : sc[s - 8] >> 4;
    const int hi = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    return (lo | hi << 4) - 32;
}

/* Reads a little-endian uint16 without alignment assumptions (blocks of
 * 18/34/210 bytes leave fields at odd addresses). */
static inline uint16_t rd_u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Group g (0..7, 32 weights) of a Q2_K or Q3_K super-block: the 32 bytes
 * of 2-bit quants it reads (element l in byte l) and the shift that picks
 * its two bits. */
static inline const uint8_t *k2_group(const uint8_t *qs, int g, int *shift) {
    *shift = 2 * (g & 3);
    return qs + 32 * (g >> 2);
}

/* Element l (0..31) of group g of a Q3_K super-block: -4..3. */
static inline int q3k_quant(const uint8_t *blk, int g, int l) {
    int shift;
    const uint8_t *q = k2_group(blk + Q3K_QS, g, &shift);
    return ((q[l] >> shift) & 3) - ((blk[Q3K_HMASK + l] >> g) & 1 ? 0 : 4);
}

/* Block j's (0..7) scale of an IQ4_XS super-block b, minus its offset 32. */
static inline int iq4xs_scale(const uint8_t *b, int j) {
    const uint16_t h = rd_u16(b + IQ4XS_SCALES_H);
    return (((b[IQ4XS_SCALES_L + j / 2] >> (4 * (j % 2))) & 0x0F) | ((h >> (2 * j)) & 3) << 4) - 32;
}

/* d * (sc - 32) of 32-weight blocks g0 .. g0 + n - 1 of an IQ4_XS row
 * (g0 and n multiples of 8), as the reference computes them. */
static inline void prep_iq4_xs(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    for (int s = 0; s < n / 8; s++) {
        const uint8_t *b = row + sizeof(blk_iq4_xs) * (size_t)(g0 / 8 + s);
        const float d = specd_fp16_to_f32(rd_u16(b));
        for (int j = 0; j < 8; j++) sd[8 * s + j] = d * (float)iq4xs_scale(b, j);
    }
}

/* d * scale and dmin * min of each 32-weight sub-block of super-blocks
 * g0 / 8 .. (g0 + n) / 8 of a Q4_K or Q5_K row (blocks of `stride` bytes,
 * the same scale fields; g0 and n multiples of 8), as the reference
 * computes them, for the SIMD expanders: group i's at sd[i] and sm[i]. */
static inline void prep_kmin(const uint8_t *row, size_t stride, int64_t g0, int n, float *sd,
                             float *sm) {
    for (int s = 0; s < n / 8; s++) {
        const uint8_t *b = row + stride * (size_t)(g0 / 8 + s);
        const float d = specd_fp16_to_f32(rd_u16(b + Q4K_D));
        const float dmin = specd_fp16_to_f32(rd_u16(b + Q4K_DMIN));
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            q4k_scale_min(j, b + Q4K_SCALES, &sc, &mn);
            sd[8 * s + j] = d * (float)sc;
            sm[8 * s + j] = dmin * (float)mn;
        }
    }
}
static inline void prep_q4_k(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    prep_kmin(row, sizeof(blk_q4_k), g0, n, sd, sm);
}
static inline void prep_q5_k(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    prep_kmin(row, sizeof(blk_q5_k), g0, n, sd, sm);
}

/* The per-sub-block factors of super-blocks g0 / 8 .. (g0 + n) / 8 of a
 * Q2_K or Q3_K row (g0 and n multiples of 8, in 32-weight groups), as the
 * reference computes them, for the SIMD expanders (quant_avx2.c,
 * quant_avx512.c; sm unused): group i's sub-block h
 * (0, 1) at sd[2i + h] (Q3_K: d * sc) or sd[4i + h] and, its min,
 * sd[4i + 2 + h] (Q2_K: d * sc and dmin * mn). */
static inline void prep_q2_k(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    for (int s = 0; s < n / 8; s++) {
        const uint8_t *b = row + sizeof(blk_q2_k) * (size_t)(g0 / 8 + s);
        const float d = specd_fp16_to_f32(rd_u16(b + Q2K_D));
        const float dmin = specd_fp16_to_f32(rd_u16(b + Q2K_DMIN));
        for (int j = 0; j < 16; j++) {
            const uint8_t sc = b[Q2K_SCALES + j];
            sd[32 * s + 4 * (j >> 1) + (j & 1)] = d * (float)(sc & 0x0F);
            sd[32 * s + 4 * (j >> 1) + 2 + (j & 1)] = dmin * (float)(sc >> 4);
        }
    }
}
static inline void prep_q3_k(const uint8_t *row, int64_t g0, int n, float *sd, float *sm) {
    (void)sm;
    for (int s = 0; s < n / 8; s++) {
        const uint8_t *b = row + sizeof(blk_q3_k) * (size_t)(g0 / 8 + s);
        const float d = specd_fp16_to_f32(rd_u16(b + Q3K_D));
        for (int j = 0; j < 16; j++) sd[16 * s + j] = d * (float)q3k_scale(b + Q3K_SCALES, j);
    }
}

/* Dequantizes n elements (a whole number of blocks) of `src` into dst. */
typedef void (*cpu_dequant_fn)(const void *src, float *dst, int64_t n);

/* One matmul y = x . W^T as the kernels see it. Row r of W starts at
 * w + r*row_bytes and has `cols` elements; x is [n_tok][cols], y is
 * [n_tok][ldy].
 *
 * xp is x repacked for multi-token kernels (NULL when n_tok == 1 or the set's
 * nt_max is 0): tokens go in groups of nt_max (the last group may be
 * smaller), and within a group of nt tokens starting at t0 the 32 floats of
 * column group g (columns 32g..32g+31) of token t0+i lie at
 *     xp + t0*ngp*32 + (g*nt + i)*32,        ngp = ceil(cols / 32),
 * zero-padded past `cols`. A kernel thus finds all its tokens' activations
 * for one weight group in one contiguous run, read with constant offsets
 * from one pointer. */
typedef struct cpu_mm_args {
    const uint8_t *w;
    size_t row_bytes;
    int64_t cols;
    const float *x;
    const float *xp;
    int n_tok;
    float *y;
    int64_t ldy;
} cpu_mm_args;

/* Computes y[t*ldy + r] = sum_c W[r][c] * x[t][c] for rows [r0, r1) and all
 * tokens. */
typedef void (*cpu_rows_fn)(const cpu_mm_args *a, int64_t r0, int64_t r1);

static inline int64_t cpu_packed_groups(int64_t cols) { return (cols + 31) / 32; }

/* Writes the packed layout described above (n_tok * ngp * 32 floats). */
static inline void cpu_pack_x(const float *x, int n_tok, int64_t cols, int nt_max, float *xp) {
    const int64_t ngp = cpu_packed_groups(cols);
    for (int t0 = 0; t0 < n_tok; t0 += nt_max) {
        const int nt = n_tok - t0 < nt_max ? n_tok - t0 : nt_max;
        float *base = xp + (int64_t)t0 * ngp * 32;
        for (int64_t g = 0; g < ngp; g++) {
            const int64_t c0 = 32 * g, n = cols - c0 < 32 ? cols - c0 : 32;
            for (int i = 0; i < nt; i++) {
                float *dst = base + (g * nt + i) * 32;
                memcpy(dst, x + (int64_t)(t0 + i) * cols + c0, (size_t)n * sizeof(float));
                if (n < 32) memset(dst + n, 0, (size_t)(32 - n) * sizeof(float));
            }
        }
    }
}

/* The 4 activation bytes a SIMD kernel broadcasts, without alignment or
 * aliasing assumptions (qmatmul_avx2.c, qmatmul_avx512.c). */
static inline int32_t ld32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One prefetch per cache line of a tile, QT_PREFETCH_BYTES ahead (x86
 * kernels only: _mm_prefetch). */
#define PREFETCH_TILE(tile, bytes)                                                         \
    for (int l_ = 0; l_ < (bytes); l_ += 64)                                               \
    _mm_prefetch((const char *)((uintptr_t)(tile) + QT_PREFETCH_BYTES + l_), _MM_HINT_T0)

/* The tile kinds with 16-column halves as the x86 kernel files' DEF_KHALF
 * takes them: tile bytes, header bytes, super-block bytes, the scale and
 * unpacking macros of the file, the chain's offset (q - OFF) and whether
 * the halves have mins. DEF_KH expands a KH_ list into DEF_KHALF's
 * arguments. */
#define KH_Q6K QT_Q6K_BYTES, QT_Q6K_HDR, QT_Q6K_SB, SCALES_I8, UNPACK_Q6K, 32, 0
#define KH_Q3K QT_Q3K_BYTES, QT_Q6K_HDR, QT_Q3K_SB, SCALES_I8, UNPACK_Q3K, 4, 0
#define KH_Q2K QT_Q2K_BYTES, QT_Q4K_HDR, QT_Q2K_SB, SCALES_Q2K, UNPACK_Q2K, 0, 1
#define DEF_KH(...) DEF_KHALF(__VA_ARGS__)

/* The reference dequantizer of one type (quant_ref.c); NULL if unsupported. */
cpu_dequant_fn cpu_dequant_ref_fn(specd_dtype type);

/* Rows ahead that the fp32 and fp16 attention passes (vec_avx2.c,
 * vec_avx512.c) prefetch a KV head's slice of: far enough to cover a DRAM
 * miss at a pass's pace (vec_avx2.c's comment has the measurements). */
#define CPU_KV_PREFETCH_ROWS 64

/* The physical row of a sequence's cache row r (backend.h: row r lives at
 * pages[r / PAGE_ROWS] * PAGE_ROWS + r % PAGE_ROWS). The attention kernels'
 * one address rule; the helpers below add the pool's own layout. */
static inline size_t cpu_kv_phys_row(const int32_t *pages, int r) {
    return (size_t)pages[r / SPECD_KV_PAGE_ROWS] * SPECD_KV_PAGE_ROWS +
           (size_t)(r % SPECD_KV_PAGE_ROWS);
}

/* Element `off` of cache row r in a paged fp32 pool whose rows are `stride`
 * floats. */
static inline const float *cpu_kv_paged_row(const float *pool, const int32_t *pages, int r,
                                            size_t stride, size_t off) {
    return pool + cpu_kv_phys_row(pages, r) * stride + off;
}

/* The same for an fp16 pool. */
static inline const uint16_t *cpu_kv_paged_row_f16(const uint16_t *pool, const int32_t *pages,
                                                   int r, size_t stride, size_t off) {
    return pool + cpu_kv_phys_row(pages, r) * stride + off;
}

/* The first byte of element `off` of cache row r in a paged Q8_0 pool
 * (backend.h's SPECD_Q8_0 KV type): rows of `stride` elements in 34-byte
 * blocks of 32, stride and off multiples of 32. */
static inline const uint8_t *cpu_kv_paged_row_q8(const void *pool, const int32_t *pages, int r,
                                                 size_t stride, size_t off) {
    return (const uint8_t *)pool + (cpu_kv_phys_row(pages, r) * stride + off) / 32 * sizeof(blk_q8_0);
}

/* Prefetches the n values from element off of cache row r of a Q8_0 pool
 * (kv_rows_q8 calls it a page ahead: pages are scattered, which the
 * hardware prefetcher cannot follow). */
static inline void cpu_kv_prefetch_q8(const void *pool, const int32_t *pages, int r, size_t stride,
                                      size_t off, int n) {
    const char *p = (const char *)cpu_kv_paged_row_q8(pool, pages, r, stride, off);
    for (int l = 0; l < n / 32 * (int)sizeof(blk_q8_0); l += 64) __builtin_prefetch(p + l);
}

/* Widest head the fp16 paged kernels convert into their stack buffers;
 * wider heads take the per-row kernels. */
#define CPU_KV_F16_MAX_HEAD 256

/* Query block: up to CPU_ATTN_QB consecutive new tokens of one sequence
 * (cpu_backend.c), taken with as many of their KV head's query heads as
 * fit in CPU_ATTN_MAXQ queries: the block kernels below take at most
 * CPU_ATTN_MAXQ queries, all reading the same K and V rows. */
#define CPU_ATTN_QB 16
#define CPU_ATTN_MAXQ 64

/* The weight types every kernel set covers with a dequant and an fp32-
 * activation rows function, once for every path (quant_scalar.c,
 * quant_avx2.c, quant_avx512.c each expand it to define and to install
 * their functions): X(suffix, type, SDG, GB), where SDG is how many fp32
 * scales per group of 32 weights a SIMD path's prep writes (Q6_K and Q3_K
 * have one per 16 weights, Q2_K one per 16 plus its mins) and GB the bytes
 * per group of 32 weights, for the prefetch position (rounded down for
 * the K-quants' fractional sizes). */
#define CPU_WEIGHT_TYPES(X)            \
    X(f32, SPECD_F32, 1, 128)          \
    X(f16, SPECD_F16, 1, 64)           \
    X(bf16, SPECD_BF16, 1, 64)         \
    X(q8_0, SPECD_Q8_0, 1, 34)         \
    X(q4_0, SPECD_Q4_0, 1, 18)         \
    X(q4_1, SPECD_Q4_1, 1, 20)         \
    X(q5_0, SPECD_Q5_0, 1, 22)         \
    X(q5_1, SPECD_Q5_1, 1, 24)         \
    X(q4_k, SPECD_Q4_K, 1, 144 / 8)    \
    X(q5_k, SPECD_Q5_K, 1, 176 / 8)    \
    X(q6_k, SPECD_Q6_K, 2, 210 / 8)    \
    X(q2_k, SPECD_Q2_K, 4, 84 / 8)     \
    X(q3_k, SPECD_Q3_K, 2, 110 / 8)    \
    X(iq4_nl, SPECD_IQ4_NL, 1, 18)     \
    X(iq4_xs, SPECD_IQ4_XS, 1, 136 / 8)

/* Installs one type's deq_TY and rows_TY into the kernel set `ks` in
 * scope: the SIMD paths expand CPU_WEIGHT_TYPES(CPU_SET_TYPE_KERNELS) after
 * defining both for every type (the scalar path installs the reference
 * dequant instead, so it writes its own). */
#define CPU_SET_TYPE_KERNELS(TY, TYPE, SDG, GB) \
    ks->dequant[TYPE] = deq_##TY;               \
    ks->rows[TYPE] = rows_##TY;

typedef struct cpu_kernel_set {
    const char *name;
    int nt_max; /* token group size of the packed x (0: rows use x only) */
    cpu_dequant_fn dequant[SPECD_DTYPE_COUNT];
    cpu_rows_fn rows[SPECD_DTYPE_COUNT];
    /* the integer-activation kernels, per tile kind (qmatmul.h) */
    cpu_qrows_fn qrows[CPU_QKINDS];
    /* attention over one KV row of n values, fp32 or (f16) fp16:
     * q . row, and o += w * row (cpu_backend.c's scalar ones or vec_avx2.c) */
    float (*kv_dot)(const float *q, const void *row, int f16, int n);
    /* s[r] = exp(s[r] - max) (-inf: exactly 0) for r < n; returns the sum */
    double (*softmax_exp)(float *s, int n, float max);
    void (*kv_axpy)(float *o, float w, const void *row, int f16, int n);
    /* The same over the rows 0..n_rows-1 of one sequence in an fp32 pool,
     * row r at physical row pages[r / PAGE_ROWS] * PAGE_ROWS + r % PAGE_ROWS,
     * its head at element off of a row of `stride` elements. Each row's
     * arithmetic is exactly kv_dot's / kv_axpy's (same operations, same
     * order), so results are bitwise those of the per-row loop; the gain
     * is no call, no division and (kv_axpys) o kept in registers across
     * rows. kv_dots: scores[r] = (q . K_r) * scale, returns the max.
     * kv_axpys: o += (scores[r] * inv) * V_r for rows whose score is not
     * 0, in row order. NULL = use the per-row functions. */
    float (*kv_dots)(const float *q, const float *pool, const int32_t *pages, int n_rows,
                     size_t stride, size_t off, int n, float scale, float *scores);
    void (*kv_axpys)(float *o, const float *scores, float inv, const float *pool,
                     const int32_t *pages, int n_rows, size_t stride, size_t off, int n);
    /* kv_dots for nq (<= CPU_ATTN_MAXQ) queries of one sequence at once (attention's query
     * blocks): each K row is read once for all of them, each query's
     * arithmetic exactly kv_dots'; maxs start at -inf. NULL = per query. */
    void (*kv_dots_block)(const float *const *q, int nq, const float *pool, const int32_t *pages,
                          int n_rows, size_t stride, size_t off, int n, float scale,
                          float *const *scores, float *maxs);
    /* kv_axpys for nq queries: each V row read once per group of queries
     * whose outputs fit in registers (AVX-512: 4 queries x 4 zmm), each
     * query's arithmetic exactly kv_axpys' (one fma per element per row, in
     * row order: the same result in any vector width). NULL = per query.
     * (With every output in memory instead, one V read per row for the
     * whole block measured 4x slower than per query at a 1000-token
     * prefill.) */
    void (*kv_axpys_block)(float *const *o, const float *const *scores, const float *inv,
                           int nq, const float *pool, const int32_t *pages, int n_rows,
                           size_t stride, size_t off, int n);
    /* The four paged kernels above for fp16 pools (backend kv_type F16):
     * each row is converted to fp32 (exact) and then takes exactly the fp32
     * kernels' arithmetic, so results are bitwise kv_dot's / kv_axpy's on
     * the fp16 row (whose f16 paths convert the same way). A block kernel
     * converts a row once for all its queries. NULL = per row. */
    float (*kv_dots_f16)(const float *q, const uint16_t *pool, const int32_t *pages, int n_rows,
                         size_t stride, size_t off, int n, float scale, float *scores);
    void (*kv_axpys_f16)(float *o, const float *scores, float inv, const uint16_t *pool,
                         const int32_t *pages, int n_rows, size_t stride, size_t off, int n);
    void (*kv_dots_block_f16)(const float *const *q, int nq, const uint16_t *pool,
                              const int32_t *pages, int n_rows, size_t stride, size_t off, int n,
                              float scale, float *const *scores, float *maxs);
    void (*kv_axpys_block_f16)(float *const *o, const float *const *scores, const float *inv,
                               int nq, const uint16_t *pool, const int32_t *pages, int n_rows,
                               size_t stride, size_t off, int n);
    /* Rows r..r+nr-1 of a sequence in a Q8_0 pool (cpu_kv_paged_row_q8),
     * the n values from element off, dequantized into dst, row i at
     * dst + i * n: bitwise the reference dequantizer's d * q, which is
     * exact (kv_q8.c) */
    void (*kv_rows_q8)(float *dst, const void *pool, const int32_t *pages, int r, int nr,
                       size_t stride, size_t off, int n);
    /* A Q8_0 pool's K side for nq (<= CPU_ATTN_MAXQ) queries quantized by
     * `quantize` (query k: n int8 at qv + k * n, its n / 32 blocks' scales
     * and sums at qd, qsum + k * n / 32): scores[k][r] for rows [0,
     * n_rows), by integer dots per block and kv_q8.c's fixed fp32
     * epilogue, bitwise cpu_kv_dots_q8_scalar on every path (kv_q8.c);
     * maxs[k] = the largest of query k's scores of rows [0, n_max) (a
     * NaN never; -inf if none) */
    void (*kv_dots_q8)(const int8_t *qv, const float *qd, const int32_t *qsum, int nq,
                       const void *pool, const int32_t *pages, int n_rows, size_t stride,
                       size_t off, int n, float scale, float *const *scores, int n_max,
                       float *maxs);
    /* n values (a whole number of blocks) rounded to Q8_0 blocks at dst,
     * bitwise cpu_quantize_row_q8_0 (kv_q8.c): a Q8_0 cache's new rows */
    void (*quantize_q8_0)(const float *x, void *dst, int64_t n);
    /* specd_argmax's rule over one row (specd_argmax itself or vec_avx2.c) */
    int (*argmax)(const float *x, int n);
    /* dst[i] = x[i] rounded to fp16 (to nearest, ties to even; overflow to
     * inf), bitwise specd_f32_to_fp16 for every non-NaN value: an fp16 KV
     * row as it is stored (cpu_f32_to_f16_row_scalar or vec_avx2.c's F16C) */
    void (*f32_to_f16_row)(uint16_t *dst, const float *x, int n);
    /* out[i] = silu(gate[i]) * up[i] (cpu_swiglu_scalar or vec_avx2.c) */
    void (*swiglu)(float *out, const float *gate, const float *up, size_t n);
    /* the activation quantizer (cpu_quantize_act or a SIMD twin) */
    void (*quantize)(const float *x, int n_tok, int64_t cols, int8_t *q, float *d, float *s,
                     int32_t *sq);
    /* A layer's row ops (row_ops.c has the scalar twins and the order they
     * keep; vec_avx2.c the SIMD ones, bitwise the same on every path):
     * RMSNorm of one row, out[i] = (x[i] * cpu_inv_rms(x)) * w[i] (w NULL:
     * no weight multiply); RoPE on n_heads consecutive head vectors of
     * head_dim, pairs (2i, 2i+1) if interleaved (GGUF) else (i, i +
     * rot_dim / 2) (Hugging Face), angle i's (cos, sin) at cos_sin[2i];
     * the residual add y[i] += a * x[i]. */
    void (*rmsnorm_row)(float *out, const float *x, const float *w, int dim, float eps);
    void (*rope_heads)(float *v, int n_heads, int head_dim, const float *cos_sin, int rot_dim,
                       int interleaved);
    void (*axpy)(float *y, float a, const float *x, size_t n);
} cpu_kernel_set;

/* Each fills `ks` and returns 1, or returns 0 when the file was built
 * without that ISA (non-x86 compilers). They do not check the running CPU;
 * matmul.c does. */
int cpu_kernels_scalar(cpu_kernel_set *ks);
int cpu_kernels_avx2(cpu_kernel_set *ks);
int cpu_kernels_avx512(cpu_kernel_set *ks);
/* The integer-activation kernels of a set (qmatmul*.c); vnni selects the
 * vpdpbusd flavour (AVX-VNNI for avx2, AVX512-VNNI for avx512). */
int cpu_qkernels_scalar(cpu_kernel_set *ks);
/* Elementwise kernels (vec_avx2.c); the scalar ones are below. */
int cpu_vec_avx2(cpu_kernel_set *ks);
static inline float cpu_swiglu_scalar_one(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}
void cpu_swiglu_scalar(float *out, const float *gate, const float *up, size_t n);
/* row_ops.c: the row ops' scalar twins, and RMSNorm's 1 / rms in its fixed
 * order (cpu_inv_rms_finish: the eight partial sums' tree, shared by the
 * SIMD twins) */
float cpu_inv_rms(const float *x, int dim, float eps);
float cpu_inv_rms_finish(const double s[8], int dim, float eps);
void cpu_rmsnorm_row_scalar(float *out, const float *x, const float *w, int dim, float eps);
void cpu_rope_heads_scalar(float *v, int n_heads, int head_dim, const float *cos_sin, int rot_dim,
                           int interleaved);
void cpu_rope_pairs(float *hv, const float *cos_sin, int i0, int half, int interleaved);
void cpu_axpy_scalar(float *y, float a, const float *x, size_t n);
float cpu_kv_dot_scalar(const float *q, const void *row, int f16, int n);
double cpu_softmax_exp_scalar(float *s, int n, float max);
void cpu_kv_axpy_scalar(float *o, float w, const void *row, int f16, int n);
void cpu_f32_to_f16_row_scalar(uint16_t *dst, const float *x, int n);
void cpu_kv_rows_q8_scalar(float *dst, const void *pool, const int32_t *pages, int r, int nr,
                           size_t stride, size_t off, int n);
void cpu_kv_dots_q8_scalar(const int8_t *qv, const float *qd, const int32_t *qsum, int nq,
                           const void *pool, const int32_t *pages, int n_rows, size_t stride,
                           size_t off, int n, float scale, float *const *scores, int n_max,
                           float *maxs);
/* Gives a set kv_q8.c's Q8_0 cache kernels for the instructions it may
 * use. */
typedef enum cpu_kv_q8_level {
    CPU_KV_Q8_SCALAR,
    CPU_KV_Q8_AVX2,
    CPU_KV_Q8_AVXVNNI,
    CPU_KV_Q8_AVX512,
    CPU_KV_Q8_AVX512VNNI,
} cpu_kv_q8_level;
void cpu_kv_q8_install(cpu_kernel_set *ks, cpu_kv_q8_level level);
/* The kernel set chosen at run time (matmul.c). */
const cpu_kernel_set *cpu_active_kernels(void);
int cpu_qkernels_avx2(cpu_kernel_set *ks, int vnni);
int cpu_qkernels_avx512(cpu_kernel_set *ks, int vnni);
/* AMX int8 (qmatmul_amx.c): 1 if the CPU has AMX-TILE and AMX-INT8 and the
 * kernel granted this process the tile state (asked here, once); then
 * cpu_qkernels_amx replaces a VNNI set's Q4 and Q8_0 kernels with ones
 * that take 2 or more tokens on the tiles (bitwise the same results). */
int cpu_amx_usable(void);
int cpu_qkernels_amx(cpu_kernel_set *ks);
/* The AVX-512 set's attention kernels, K and V sides (vec_avx512.c): bitwise
 * the AVX2 set's, which they replace in ks. */
void cpu_vec_avx512(cpu_kernel_set *ks);

#endif
