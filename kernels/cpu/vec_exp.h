/* vec_exp.h - the constants of the vector exp that softmax and SwiGLU use,
 * one copy for the AVX2 set (vec_avx2.c's exp_avx2) and the AVX-512 set
 * (vec_avx512.c's exp512), which apply them in the same operations, so each
 * lane of either gives the same bits (test_softmax_exp_paths).
 *
 * exp(x) = 2^n * p(r): x clamped to [LO, HI] (so the result is a normal
 * number), n = round(x * LOG2E), r = x - n * ln2 in two steps (LN2_HI is
 * exact in few bits, LN2_LO the rest), p the degree-7 polynomial
 * 1 + r + r^2 * (P5 + r * (P4 + ... )) in Horner form, highest first. */
#ifndef SPECD_KERNELS_CPU_VEC_EXP_H
#define SPECD_KERNELS_CPU_VEC_EXP_H

#define CPU_EXP_LO (-87.3f)
#define CPU_EXP_HI 88.7f
#define CPU_EXP_LOG2E 1.44269504088896341f
#define CPU_EXP_LN2_HI 0.693359375f
#define CPU_EXP_LN2_LO (-2.12194440e-4f)
#define CPU_EXP_P0 1.9875691500e-4f
#define CPU_EXP_P1 1.3981999507e-3f
#define CPU_EXP_P2 8.3334519073e-3f
#define CPU_EXP_P3 4.1665795894e-2f
#define CPU_EXP_P4 1.6666665459e-1f
#define CPU_EXP_P5 5.0000001201e-1f

#endif
