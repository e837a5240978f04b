/* simd.c - see simd.h. */
#include "common/util/simd.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static specd_simd_level g_best;
static _Atomic int g_active;

static specd_simd_level detect_best(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (avx2 && avx512) return SPECD_SIMD_AVX512;
    if (avx2) return SPECD_SIMD_AVX2;
#endif
    return SPECD_SIMD_SCALAR;
}

/* The level a name means, or -1 if the name is unknown. */
static int level_named(const char *name) {
    if (!strcmp(name, "scalar")) return SPECD_SIMD_SCALAR;
    if (!strcmp(name, "avx2") || !strcmp(name, "avxvnni")) return SPECD_SIMD_AVX2;
    if (!strcmp(name, "avx512") || !strcmp(name, "avx512vnni")) return SPECD_SIMD_AVX512;
    return -1;
}

static void init(void) {
    g_best = detect_best();
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
