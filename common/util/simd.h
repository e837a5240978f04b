/* simd.h - which vector instruction set the code outside kernels/ may use.
 *
 * kernels/cpu picks its own kernel set (matmul.h: scalar, avx2, avxvnni,
 * avx512, avx512vnni, amx) for the matmuls and attention. The few hot loops below
 * kernels/ (the sampling core's weights and its race, the Philox stream of
 * rng.h) need only the width: scalar, AVX2 or AVX-512. This is that choice,
 * made once from __builtin_cpu_supports and overridden the same way as the
 * kernels': SPECD_SIMD=scalar|avx2|avxvnni|avx512|avx512vnni|amx in the
 * environment (the VNNI and AMX names mean their width here), or
 * specd_simd_force(),
 * which cpu_simd_force() also calls, so that a test or bench that forces a
 * kernel path forces this one with it.
 *
 * Every vector loop chosen here has a scalar twin with the same bits: what a
 * path changes is speed, never a sampled token. */
#ifndef SPECD_SIMD_H
#define SPECD_SIMD_H

typedef enum specd_simd_level {
    SPECD_SIMD_SCALAR = 0,
    SPECD_SIMD_AVX2 = 1,   /* AVX2 + FMA */
    SPECD_SIMD_AVX512 = 2, /* AVX-512 F, BW, VL, DQ */
} specd_simd_level;

/* What this CPU can run, detected once (CPUID, and through
 * __builtin_cpu_supports the register state the OS enables): the one
 * feature check in specd. kernels/cpu picks its kernel sets from it, and the
 * levels above are its avx2 and avx512. */
typedef struct specd_cpu_features {
    int avx2;       /* AVX2 and FMA */
    int f16c;       /* fp16 <-> fp32 conversions */
    int avxvnni;    /* AVX-VNNI: vpdpbusd on ymm, VEX-encoded */
    int avx512;     /* AVX-512 F, BW, VL and DQ */
    int avx512vnni; /* AVX512-VNNI */
    int amx_int8;   /* AMX-TILE and AMX-INT8 in CPUID (the process must still
                     * be granted the tile state: kernels/cpu/qmatmul_amx.c) */
} specd_cpu_features;

const specd_cpu_features *specd_cpu_features_get(void);

/* The active level: the best this CPU has unless SPECD_SIMD or
 * specd_simd_force() chose another. */
specd_simd_level specd_simd_active(void);

/* Use the level a SPECD_SIMD name means ("auto": the best available).
 * 0, and nothing changes, if the name is unknown or the CPU lacks it. */
int specd_simd_force(const char *name);

#endif
