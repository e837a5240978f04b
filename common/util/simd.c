/* simd.c - see simd.h. */
#include "common/util/simd.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static specd_cpu_features g_features;
static specd_simd_level g_best;
static _Atomic int g_active;

static void detect_features(specd_cpu_features *f) {
    memset(f, 0, sizeof *f);
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f->avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f->avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    /* Older compilers' __builtin_cpu_supports lack "f16c", the VNNI and
     * the AMX names: ask CPUID (leaf 1 ECX.29; leaf 7.0 ECX.11 and EDX.24,
     * 25; leaf 7.1 EAX.4).
     * The register state they need is AVX's or AVX-512's, checked above. */
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) f->f16c = (c & bit_F16C) != 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f->avx512vnni = f->avx512 && ((c >> 11) & 1);
        f->amx_int8 = ((d >> 24) & 1) && ((d >> 25) & 1); /* EDX.24 AMX-TILE, .25 AMX-INT8 */
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f->avxvnni = f->avx2 && ((a >> 4) & 1);
#endif
}

static specd_simd_level detect_best(const specd_cpu_features *f) {
    if (f->avx2 && f->avx512) return SPECD_SIMD_AVX512;
    if (f->avx2) return SPECD_SIMD_AVX2;
    return SPECD_SIMD_SCALAR;
}

/* The level a name means, or -1 if the name is unknown. */
static int level_named(const char *name) {
    if (!strcmp(name, "scalar")) return SPECD_SIMD_SCALAR;
    if (!strcmp(name, "avx2") || !strcmp(name, "avxvnni")) return SPECD_SIMD_AVX2;
    if (!strcmp(name, "avx512") || !strcmp(name, "avx512vnni") ||
        !strcmp(name, "amx"))
        return SPECD_SIMD_AVX512;
    return -1;
}

static void init(void) {
    detect_features(&g_features);
    g_best = detect_best(&g_features);
    int level = (int)g_best;
    const char *env = getenv("SPECD_SIMD");
    if (env && *env && strcmp(env, "auto") != 0) {
        int want = level_named(env);
        /* kernels/cpu reports an unusable name once; say nothing twice */
        if (want >= 0 && want <= (int)g_best) level = want;
    }
    atomic_store(&g_active, level);
}

specd_simd_level specd_simd_active(void) {
    pthread_once(&g_once, init);
    return (specd_simd_level)atomic_load_explicit(&g_active, memory_order_relaxed);
}

int specd_simd_force(const char *name) {
    pthread_once(&g_once, init);
    int want = !name || !strcmp(name, "auto") ? (int)g_best : level_named(name);
    if (want < 0 || want > (int)g_best) return 0;
    atomic_store(&g_active, want);
    return 1;
}

const specd_cpu_features *specd_cpu_features_get(void) {
    pthread_once(&g_once, init);
    return &g_features;
}
