/* peak.c - the arithmetic this CPU can do at best (peak.h).
 *
 * Every loop below carries its accumulators from one iteration to the next
 * (so the compiler can neither drop nor hoist the work) and has enough
 * independent chains to be limited by throughput, not latency. The int8
 * forms without VNNI feed vpmaddubsw inputs that an empty asm statement
 * "changes" every iteration: otherwise the multiply is loop-invariant and
 * only the final add would remain. */
#include "peak.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "matmul.h"
#include "common/util/clock.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PEAK_X86 1
#endif

/* Loop iterations per task: ~5-20 ms of work on the machines we know. */
#define ITERS 2000000L
#define TASKS_PER_THREAD 4
#define PASSES 3

typedef enum { K_SCALAR, K_AVX2, K_AVXVNNI, K_AVX512, K_AVX512VNNI } kind;

static kind active_kind(void) {
    const char *n = cpu_simd_name();
    /* amx: the VNNI peak, as its tiles take only passes of 14+ tokens
     * (qmatmul_amx.c) and every other integer dot is vpdpbusd */
    if (!strcmp(n, "avx512vnni") || !strcmp(n, "amx")) return K_AVX512VNNI;
    if (!strcmp(n, "avx512")) return K_AVX512;
    if (!strcmp(n, "avxvnni")) return K_AVXVNNI;
    if (!strcmp(n, "avx2")) return K_AVX2;
    return K_SCALAR;
}

/* What each task leaves, so no loop is dead code. */
static _Atomic uint32_t g_sink;

static void sink_u32(uint32_t v) { atomic_fetch_xor_explicit(&g_sink, v, memory_order_relaxed); }
static void sink_f(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    sink_u32(u);
}

/* ---- fp32 ------------------------------------------------------------------ */

/* a = a * x + y converges to y / (1 - x) = 1000: no overflow, no denormals */
#define FX 0.999f
#define FY 1.0f

static double fp32_scalar(void) {
    float a[12];
    for (int i = 0; i < 12; i++) a[i] = (float)i;
    for (long k = 0; k < ITERS; k++)
        for (int i = 0; i < 12; i++) a[i] = a[i] * FX + FY;
    float s = 0;
    for (int i = 0; i < 12; i++) s += a[i];
    sink_f(s);
    return 12.0 * ITERS;
}

#ifdef PEAK_X86
/* 12 chains of vfmadd231ps; VF the vector type, P the intrinsics prefix,
 * LANE0 reads lane 0 of the sum. */
#define DEF_FMA(NAME, TARGET, VF, P, LANE0, LANES)                                             \
    __attribute__((target(TARGET))) static double NAME(void) {                                 \
        const VF x = P##_set1_ps(FX), y = P##_set1_ps(FY);                                     \
        VF a0 = P##_set1_ps(0), a1 = P##_set1_ps(1), a2 = P##_set1_ps(2), a3 = P##_set1_ps(3), \
           a4 = P##_set1_ps(4), a5 = P##_set1_ps(5), a6 = P##_set1_ps(6), a7 = P##_set1_ps(7), \
           a8 = P##_set1_ps(8), a9 = P##_set1_ps(9), a10 = P##_set1_ps(10),                    \
           a11 = P##_set1_ps(11);                                                              \
        for (long k = 0; k < ITERS; k++) {                                                     \
            a0 = P##_fmadd_ps(a0, x, y), a1 = P##_fmadd_ps(a1, x, y);                          \
            a2 = P##_fmadd_ps(a2, x, y), a3 = P##_fmadd_ps(a3, x, y);                          \
            a4 = P##_fmadd_ps(a4, x, y), a5 = P##_fmadd_ps(a5, x, y);                          \
            a6 = P##_fmadd_ps(a6, x, y), a7 = P##_fmadd_ps(a7, x, y);                          \
            a8 = P##_fmadd_ps(a8, x, y), a9 = P##_fmadd_ps(a9, x, y);                          \
            a10 = P##_fmadd_ps(a10, x, y), a11 = P##_fmadd_ps(a11, x, y);                      \
        }                                                                                      \
        VF t = P##_add_ps(P##_add_ps(P##_add_ps(a0, a1), P##_add_ps(a2, a3)),                  \
                          P##_add_ps(P##_add_ps(a4, a5), P##_add_ps(a6, a7)));                 \
        t = P##_add_ps(t, P##_add_ps(P##_add_ps(a8, a9), P##_add_ps(a10, a11)));               \
        sink_f(LANE0(t));                                                                      \
        return 12.0 * (LANES) * ITERS;                                                         \
    }

DEF_FMA(fp32_avx2, "avx2,fma", __m256, _mm256, _mm256_cvtss_f32, 8)
DEF_FMA(fp32_avx512, "avx512f", __m512, _mm512, _mm512_cvtss_f32, 16)
#endif

/* ---- int8 ------------------------------------------------------------------ */

/* The portable kernels' form: a 32-element int8 dot per block, from L1.
 * The asm statement makes the inputs look new each pass (no hoisting). */
static double int8_scalar(void) {
    uint8_t u[32];
    int8_t s[32];
    for (int j = 0; j < 32; j++) u[j] = (uint8_t)(j * 7 + 1), s[j] = (int8_t)(j * 5 - 70);
    uint32_t acc = 0; /* unsigned: the running total wraps, by definition */
    long iters = ITERS / 4;
    for (long k = 0; k < iters; k++) {
        __asm__ volatile("" : : "r"(u), "r"(s) : "memory");
        int32_t d = 0;
        for (int j = 0; j < 32; j++) d += (int32_t)u[j] * (int32_t)s[j];
        acc += (uint32_t)d;
    }
    sink_u32(acc);
    return 32.0 * iters;
}

#ifdef PEAK_X86
/* Without VNNI: vpmaddubsw + vpmaddwd + vpaddd, 4 chains (the adds are the
 * only loop-carried part; the asm keeps the products from being hoisted).
 * VI: the integer vector type, P its intrinsics prefix, RX the asm
 * register class, LANE0 reads lane 0 of an integer vector. */
#define DEF_MADDUBS(NAME, TARGET, VI, P, RX, LANE0, LANES)                                    \
    __attribute__((target(TARGET))) static double NAME(void) {                                 \
        const VI ones = P##_set1_epi16(1), s = P##_set1_epi8(3);                               \
        VI u0 = P##_set1_epi8(1), u1 = P##_set1_epi8(2), u2 = P##_set1_epi8(3),                \
           u3 = P##_set1_epi8(4);                                                              \
        VI a0 = P##_set1_epi32(0), a1 = a0, a2 = a0, a3 = a0;                                  \
        for (long k = 0; k < ITERS; k++) {                                                     \
            __asm__ volatile("" : "+" RX(u0), "+" RX(u1), "+" RX(u2), "+" RX(u3));             \
            a0 = P##_add_epi32(a0, P##_madd_epi16(P##_maddubs_epi16(u0, s), ones));            \
            a1 = P##_add_epi32(a1, P##_madd_epi16(P##_maddubs_epi16(u1, s), ones));            \
            a2 = P##_add_epi32(a2, P##_madd_epi16(P##_maddubs_epi16(u2, s), ones));            \
            a3 = P##_add_epi32(a3, P##_madd_epi16(P##_maddubs_epi16(u3, s), ones));            \
        }                                                                                      \
        VI t = P##_add_epi32(P##_add_epi32(a0, a1), P##_add_epi32(a2, a3));                    \
        sink_u32((uint32_t)LANE0(t));                                                          \
        return 4.0 * (LANES) * ITERS;                                                          \
    }

/* With VNNI: vpdpbusd, 12 chains. Distinct starts: chains with equal
 * inputs and starts would be merged by the compiler. */
#define DEF_VNNI(NAME, TARGET, VI, P, DP, LANE0, LANES)                                        \
    __attribute__((target(TARGET))) static double NAME(void) {                                 \
        const VI s = P##_set1_epi8(3);                                                         \
        const VI u0 = P##_set1_epi8(1), u1 = P##_set1_epi8(2), u2 = P##_set1_epi8(3),          \
                 u3 = P##_set1_epi8(4), u4 = P##_set1_epi8(5), u5 = P##_set1_epi8(6);          \
        VI a0 = P##_set1_epi32(0), a1 = P##_set1_epi32(1), a2 = P##_set1_epi32(2),             \
           a3 = P##_set1_epi32(3), a4 = P##_set1_epi32(4), a5 = P##_set1_epi32(5),             \
           a6 = P##_set1_epi32(6), a7 = P##_set1_epi32(7), a8 = P##_set1_epi32(8),             \
           a9 = P##_set1_epi32(9), a10 = P##_set1_epi32(10), a11 = P##_set1_epi32(11);         \
        for (long k = 0; k < ITERS; k++) {                                                     \
            a0 = DP(a0, u0, s), a1 = DP(a1, u1, s), a2 = DP(a2, u2, s), a3 = DP(a3, u3, s);    \
            a4 = DP(a4, u4, s), a5 = DP(a5, u5, s), a6 = DP(a6, u0, s), a7 = DP(a7, u1, s);    \
            a8 = DP(a8, u2, s), a9 = DP(a9, u3, s), a10 = DP(a10, u4, s), a11 = DP(a11, u5, s); \
        }                                                                                      \
        VI t = P##_add_epi32(P##_add_epi32(P##_add_epi32(a0, a1), a2),                         \
                             P##_add_epi32(P##_add_epi32(a3, a4), a5));                        \
        t = P##_add_epi32(t, P##_add_epi32(P##_add_epi32(a6, a7), a8));                        \
        t = P##_add_epi32(t, P##_add_epi32(P##_add_epi32(a9, a10), a11));                      \
        sink_u32((uint32_t)LANE0(t));                                                          \
        return 12.0 * (LANES) * ITERS;                                                         \
    }

/* lane 0, not a reduction: GCC's _mm512_reduce_add_epi32 adds in signed
 * int, which may overflow (UBSan) */
#define LANE0_256(t) _mm256_extract_epi32((t), 0)
#define LANE0_512(t) _mm_cvtsi128_si32(_mm512_castsi512_si128(t))
#define TBW "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"

DEF_MADDUBS(int8_avx2, "avx2,fma", __m256i, _mm256, "x", LANE0_256, 32)
DEF_MADDUBS(int8_avx512, TBW, __m512i, _mm512, "v", LANE0_512, 64)
DEF_VNNI(int8_avxvnni, "avx2,fma,avxvnni", __m256i, _mm256, _mm256_dpbusd_avx_epi32, LANE0_256,
         32)
DEF_VNNI(int8_avx512vnni, TBW ",avx512vnni", __m512i, _mm512, _mm512_dpbusd_epi32, LANE0_512, 64)
#endif

/* ---- running them ---------------------------------------------------------- */

typedef double (*peak_fn)(void);

typedef struct peak_job {
    peak_fn fn;
    _Atomic long long macs; /* summed by the tasks (whole MACs) */
} peak_job;

static void peak_task(void *ctx, int task, int thread) {
    (void)task, (void)thread;
    peak_job *j = ctx;
    atomic_fetch_add_explicit(&j->macs, (long long)j->fn(), memory_order_relaxed);
}

/* MAC/s of fn on every pool thread: the best of PASSES passes. */
static double run_peak(specd_pool *pool, peak_fn fn) {
    int tasks = TASKS_PER_THREAD * specd_pool_size(pool);
    double best = 0;
    for (int p = 0; p < PASSES; p++) {
        peak_job j = {.fn = fn};
        atomic_init(&j.macs, 0);
        double t0 = specd_now_s();
        specd_pool_run(pool, tasks, peak_task, &j);
        double dt = specd_now_s() - t0;
        double rate = dt > 0 ? (double)atomic_load(&j.macs) / dt : 0;
        if (rate > best) best = rate;
    }
    return best;
}

double cpu_peak_fp32_macs(specd_pool *pool) {
    peak_fn fn = fp32_scalar;
#ifdef PEAK_X86
    switch (active_kind()) {
    case K_AVX512VNNI:
    case K_AVX512: fn = fp32_avx512; break;
    case K_AVXVNNI:
    case K_AVX2: fn = fp32_avx2; break;
    case K_SCALAR: break;
    }
#endif
    return run_peak(pool, fn);
}

double cpu_peak_int8_macs(specd_pool *pool) {
    peak_fn fn = int8_scalar;
#ifdef PEAK_X86
    switch (active_kind()) {
    case K_AVX512VNNI: fn = int8_avx512vnni; break;
    case K_AVX512: fn = int8_avx512; break;
    case K_AVXVNNI: fn = int8_avxvnni; break;
    case K_AVX2: fn = int8_avx2; break;
    case K_SCALAR: break;
    }
#endif
    return run_peak(pool, fn);
}
