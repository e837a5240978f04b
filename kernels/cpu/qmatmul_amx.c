/* qmatmul_amx.c - the integer-activation matmul's many-token passes on AMX
 * int8 tiles (Intel Sapphire Rapids and later), for Q4_0, Q4_1 and Q8_0
 * tiles (read qmatmul.h first: tile layout and operation order).
 *
 * Why: at 2-16 tokens (a verify tree, a batch of decodes) the VNNI kernels
 * spend most of their time in vpdpbusd, 8 a block per token, on the two
 * ports every other 512-bit instruction needs too. One AMX tdpbsud does a
 * block for all of a pass's tokens at once: C[t][i] = sum_k A[t][k] *
 * B[k / 4][4 i + k % 4], A the tokens' 32 activation bytes (signed), B the
 * tile's 16 rows x 32 weights (unsigned nibbles, or signed bytes with
 * tdpbssd for Q8_0). That B is exactly the layout qmatmul.h's tiles already
 * hold (4 consecutive weights of each of 16 rows in 64 bytes), so a Q8_0
 * tile loads straight from the matrix and a 4-bit one needs only its
 * nibbles split into bytes, as the VNNI kernel does into registers.
 *
 * Each block's int32 sums leave the tile unit through memory (tilestored)
 * and meet their scales in zmm registers in the order every path keeps:
 *
 *     acc = fma((float)isum, wd * xd[b], acc);  acc = fma(wm, xs[b], acc)
 *
 * The integer sums are exact, so every output bit equals the VNNI
 * kernel's and the scalar twin's: AMX changes speed only. Blocks go in
 * pairs with two sets of tiles (A, B, C for an even and an odd block), and
 * the epilogue runs a pair behind the dots.
 *
 * But each block's sums must leave the tile (tilestored), and on the
 * Sapphire Rapids VM a tilestored took 4.2 ns whether it carried 1, 5 or
 * 16 tokens' sums (a tdpbsud 2.6 ns on 5 rows; docs/BENCHMARKS.md, the
 * forty-eighth session), so the tiles pay only from about 14 tokens a
 * pass (AMX_MIN_PASS, with the measurements): a decode step, a
 * verify tree of a few tokens and a small batch keep the VNNI kernel, as
 * do the other tile kinds (cpu_qkernels_amx installs only Q4 and Q8).
 *
 * The tiles need the kernel's permission (arch_prctl ARCH_REQ_XCOMP_PERM,
 * Linux 5.16+), asked once in cpu_amx_usable(); where it is refused the
 * "amx" set does not exist and the VNNI set is the best. A task loads its
 * tile configuration (rows = the pass's tokens) and releases the tiles at
 * its end, so a thread that is switched out between tasks carries no tile
 * state. */
#include "qmatmul.h"
#include "quant_impl.h"

#include "common/util/simd.h"

#include <stdatomic.h>

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TAMX "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,amx-tile,amx-int8"

/* The tile registers: C (int32 sums), A (activations), B (weights), for
 * the even (0) and the odd (1) block of a pair. The intrinsics take tile
 * numbers as literals (GCC pastes them into the instruction), hence the
 * numbers below and not these names. */
enum { TC0 = 0, TC1 = 1, TA0 = 2, TA1 = 3, TB0 = 4, TB1 = 5 };

/* ldtilecfg's 64-byte operand (palette 1). */
typedef struct amx_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) amx_cfg;

static __attribute__((target(TAMX))) void amx_configure(int nt) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int p = 0; p < 2; p++) {
        c.rows[TC0 + p] = (uint8_t)nt, c.colsb[TC0 + p] = 64; /* nt x 16 int32 */
        c.rows[TA0 + p] = (uint8_t)nt, c.colsb[TA0 + p] = 32; /* nt x 32 int8 */
        c.rows[TB0 + p] = 8, c.colsb[TB0 + p] = 64;           /* 8 x (16 x 4) */
    }
    _tile_loadconfig(&c);
}

/* A block's dot on tiles C, A, B (TC0, TA0, TB0 or TC1, TA1, TB1): the
 * pass's nt activation rows of the block at xq (stride cols bytes), the
 * weights at bp (64-byte rows), the sums stored to cs (nt rows of 16
 * int32). Q4 weights are unsigned (tdpbsud), Q8_0's signed (tdpbssd). */
#define AMX_DOT(C, A, B, DP, xq, cols, bp, cs) \
    do {                                       \
        _tile_loadd(A, (xq), (cols));          \
        _tile_loadd(B, (bp), 64);              \
        _tile_zero(C);                         \
        DP(C, A, B);                           \
        _tile_stored(C, (cs), 64);             \
    } while (0)

/* The nibbles of a Q4 tile's block as 8 rows of 64 bytes (B's layout):
 * rows 0-3 the low nibbles of qs[0..3] (columns 0-15), rows 4-7 the high
 * ones (columns 16-31), as qmatmul.h's layout puts them. */
static inline __attribute__((always_inline, target(TAMX))) void unpack_q4(uint8_t *dst,
                                                                          const uint8_t *qs) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    for (int v = 0; v < 4; v++) {
        const __m512i raw = _mm512_loadu_si512((const void *)(qs + 64 * v));
        _mm512_store_si512((void *)(dst + 64 * v), _mm512_and_si512(raw, lo4));
        _mm512_store_si512((void *)(dst + 64 * (v + 4)),
                           _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo4));
    }
}

/* The pass's tokens' epilogue for one block: sums cs[t][0..15] into acc[t]
 * in the shared order. Q4 tiles have mins (wm, xs); Q8_0 does not. */
#define EPILOGUE(acc, cs, nt, t0, nb, b, wd, MIN)                                         \
    do {                                                                                  \
        for (int t_ = 0; t_ < (nt); t_++) {                                               \
            const size_t xb_ = (size_t)((t0) + t_) * (nb) + (b);                          \
            const __m512 f_ = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)((cs) + 16 * t_))); \
            (acc)[t_] = _mm512_fmadd_ps(f_, _mm512_mul_ps((wd), _mm512_set1_ps(a->a.d[xb_])), \
                                        (acc)[t_]);                                       \
            MIN;                                                                          \
        }                                                                                 \
    } while (0)
#define MIN_Q4 acc[t_] = _mm512_fmadd_ps(wm, _mm512_set1_ps(a->a.s[xb_]), acc[t_])
#define MIN_NONE ((void)0)

/* Stores a pass's nt tokens' 16 outputs of row group g (fewer where the
 * matrix ends). */
static inline __attribute__((always_inline, target(TAMX))) void
store_pass(const cpu_qmm_args *a, int64_t g, int t0, int nt, const __m512 *acc) {
    const int64_t n = a->w->rows - g * QT_ROWS;
    const __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(a->y + (size_t)(t0 + t) * a->ldy + g * QT_ROWS, m, acc[t]);
}

/* Blocks unpacked ahead of their dot (Q4): a tile load of bytes that
 * vector stores have just written waits for those stores to reach the
 * cache (nothing forwards a store into a tile), so a block's nibbles are
 * split 6 blocks before its dot, into a ring of 8 slots. Unpacked just
 * before each dot, a 2-token Q4_1 matmul took 3x the VNNI kernel's time;
 * all of a row group's blocks first, 1.6-2.2x. */
#define AMX_AHEAD 6
#define AMX_RING 8

/* One pass of nt (2..16) tokens over row group g, blocks in pairs, and
 * software-pipelined: pair b's dots go to the tiles while the epilogue of
 * pair b - 2 reads its sums, as a vector load of what tilestored has just
 * written waits for it to reach the cache (cs holds two pairs' sums). q8
 * is a constant in each caller: 0 Q4 tiles (tdpbsud on the unpacked
 * nibbles, mins), 1 Q8_0 tiles (tdpbssd on the tile itself, 32 bytes of
 * scales then 8 rows of 64 bytes). */
static inline __attribute__((always_inline, target(TAMX))) void
amx_pass(const cpu_qmm_args *a, int64_t g, int t0, int nt, const int q8) {
    const cpu_qweight *W = a->w;
    const int64_t nb = W->nb;
    const int bytes = q8 ? QT_Q8_BYTES : QT_Q4_BYTES;
    _Alignas(64) uint8_t ring[AMX_RING][512];
    _Alignas(64) int32_t cs[2][2 * 16 * 16];
    __m512 acc[16];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    const uint8_t *gp = W->data + (size_t)g * W->group_bytes;
    const int8_t *xq = a->a.q + (size_t)t0 * W->cols;
    if (!q8)
        for (int64_t u = 0; u < nb && u < AMX_AHEAD; u++) unpack_q4(ring[u], gp + (size_t)u * bytes + 64);
    for (int64_t b = 0; b < nb + 2; b += 2) {
        if (b < nb) {
            const uint8_t *tp = gp + (size_t)b * bytes;
            PREFETCH_TILE(tp, 2 * bytes);
            int32_t *cp = cs[(b >> 1) & 1];
            if (q8) {
                AMX_DOT(0, 2, 4, _tile_dpbssd, xq + b * QT_COLS, W->cols, tp + 32, cp);
                if (b + 1 < nb)
                    AMX_DOT(1, 3, 5, _tile_dpbssd, xq + (b + 1) * QT_COLS, W->cols,
                            tp + bytes + 32, cp + 256);
            } else {
                for (int64_t u = b + AMX_AHEAD; u < b + AMX_AHEAD + 2 && u < nb; u++)
                    unpack_q4(ring[u % AMX_RING], gp + (size_t)u * bytes + 64);
                AMX_DOT(0, 2, 4, _tile_dpbsud, xq + b * QT_COLS, W->cols, ring[b % AMX_RING], cp);
                if (b + 1 < nb)
                    AMX_DOT(1, 3, 5, _tile_dpbsud, xq + (b + 1) * QT_COLS, W->cols,
                            ring[(b + 1) % AMX_RING], cp + 256);
            }
        }
        if (b >= 2) {
            const int64_t pb = b - 2;
            const int32_t *pc = cs[(pb >> 1) & 1];
            for (int64_t k = pb; k < pb + 2 && k < nb; k++) {
                const uint8_t *tp = gp + (size_t)k * bytes;
                const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tp));
                if (q8) {
                    EPILOGUE(acc, pc + 256 * (k - pb), nt, t0, nb, k, wd, MIN_NONE);
                } else {
                    const __m512 wm =
                        _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tp + 32)));
                    EPILOGUE(acc, pc + 256 * (k - pb), nt, t0, nb, k, wd, MIN_Q4);
                }
            }
        }
    }
    store_pass(a, g, t0, nt, acc);
}
static __attribute__((target(TAMX))) void q4_amx_pass(const cpu_qmm_args *a, int64_t g, int t0,
                                                      int nt) {
    amx_pass(a, g, t0, nt, 0);
}
static __attribute__((target(TAMX))) void q8_amx_pass(const cpu_qmm_args *a, int64_t g, int t0,
                                                      int nt) {
    amx_pass(a, g, t0, nt, 1);
}

/* The VNNI kernels that calls with short passes go to, saved at install. */
static cpu_qrows_fn g_vnni[CPU_QKINDS];

typedef void (*amx_pass_fn)(const cpu_qmm_args *a, int64_t g, int t0, int nt);

/* The fewest tokens a pass takes on the tiles. A block's sums leave the
 * tile by a tilestored that costs the same for 1 token as for 16, and its
 * unpacked weights enter through memory too, so below this the VNNI
 * kernel's 8 vpdpbusd a token are cheaper. The whole default model's
 * matmuls on two threads (bench_matmul --quick --tokens 8,12,14,16,24,28,32, SPR VM, two
 * runs each), the tiles against VNNI: with every pass length on the tiles
 * 1.10-1.14x the time at 8 tokens, 0.97-1.02x at 12, 0.96-1.00x at 14; as
 * shipped 0.97-0.98x at 14, 0.91-0.98x at 16, 0.90-0.92x at 32 (one
 * thread: 0.78-0.79x at 16, 0.75-0.79x at 32).
 *
 * Tried and slower: four C tiles sharing two A and two B (a step of four
 * blocks; 1.15-1.2x this kernel's time at 16 tokens, one thread), all of a
 * row group's blocks unpacked before its first dot (1.1-1.2x at 16-32;
 * once for all passes: prefill 0.95-0.97x, but 32 tokens 1.05-1.15x). */
#define AMX_MIN_PASS 14
static _Atomic int g_min_pass = AMX_MIN_PASS;

int cpu_amx_min_pass(int n) {
    return n > 0 ? atomic_exchange(&g_min_pass, n) : atomic_load(&g_min_pass);
}

/* Row groups [g0, g1) for all tokens in passes of at most 16, as equal as
 * they go (cpu_split_passes, as qmatmul_avx512.c's driver), each group's
 * passes together so its tiles stay in the L1 between them; the VNNI
 * kernel where the passes would be shorter than AMX_MIN_PASS. The tile
 * configuration is loaded when a pass's token count differs from the last
 * one's. */
static __attribute__((target(TAMX))) void amx_drive(const cpu_qmm_args *a, int64_t g0, int64_t g1,
                                                    cpu_qkind kind, amx_pass_fn pass) {
    const int n_tok = a->a.n_tok;
    if (n_tok <= 0) return;
    const cpu_pass_split sp = cpu_split_passes(n_tok, 16);
    if (sp.base < atomic_load_explicit(&g_min_pass, memory_order_relaxed)) {
        g_vnni[kind](a, g0, g1);
        return;
    }
    int configured = 0;
    for (int64_t g = g0; g < g1; g++) {
        for (int p = 0, t0 = 0; p < sp.passes; p++) {
            const int nt = sp.base + (p < sp.longer);
            if (nt != configured) amx_configure(nt), configured = nt;
            pass(a, g, t0, nt);
            t0 += nt;
        }
    }
    _tile_release();
}

static void q4_amx(const cpu_qmm_args *a, int64_t g0, int64_t g1) {
    amx_drive(a, g0, g1, CPU_Q4, q4_amx_pass);
}
static void q8_amx(const cpu_qmm_args *a, int64_t g0, int64_t g1) {
    amx_drive(a, g0, g1, CPU_Q8, q8_amx_pass);
}

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int cpu_amx_usable(void) {
    /* the CPU has the tiles (common/util/simd.h's check); the kernel must
     * also grant this process their state */
    if (!specd_cpu_features_get()->amx_int8) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int cpu_qkernels_amx(cpu_kernel_set *ks) {
    g_vnni[CPU_Q4] = ks->qrows[CPU_Q4];
    g_vnni[CPU_Q8] = ks->qrows[CPU_Q8];
    ks->qrows[CPU_Q4] = q4_amx;
    ks->qrows[CPU_Q8] = q8_amx;
    return 1;
}

#else
int cpu_amx_min_pass(int n) {
    (void)n;
    return 0;
}
int cpu_amx_usable(void) { return 0; }
int cpu_qkernels_amx(cpu_kernel_set *ks) {
    (void)ks;
    return 0;
}
#endif
