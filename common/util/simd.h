/* simd.h - which vector instruction set the code outside kernels/ may use.
 *
 * kernels/cpu picks its own kernel set (matmul.h: scalar, avx2, avxvnni,
 * avx512, avx512vnni) for the matmuls and attention. The few hot loops below
 * kernels/ (the sampling core's weights and its race, the Philox stream of
 * rng.h) need only the width: scalar, AVX2 or AVX-512. This is that choice,
 * made once from __builtin_cpu_supports and overridden the same way as the
 * kernels': SPECD_SIMD=scalar|avx2|avxvnni|avx512|avx512vnni in the
 * environment (the VNNI names mean their width here), or specd_simd_force(),
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

/* The active level: the best this CPU has unless SPECD_SIMD or
 * specd_simd_force() chose another. */
specd_simd_level specd_simd_active(void);

/* Use the level a SPECD_SIMD name means ("auto": the best available).
 * 0, and nothing changes, if the name is unknown or the CPU lacks it. */
int specd_simd_force(const char *name);

#endif
