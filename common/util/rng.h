/* rng.h - counter-based random numbers (Philox4x32-10).
 *
 * specd never keeps a random-number *state*. Every random draw is a pure
 * function of an address:
 *
 *     (seed, stream, counter)  ->  four 32-bit words  ->  a uniform in [0, 1)
 *
 * Why: speculative decoding must give the same output for a seeded request no
 * matter how many draft tokens each verify step accepted, which thread ran
 * first, or whether a session was re-opened on another target. A stateful
 * generator would advance a different number of times on each of those paths.
 * With addressed draws the caller names each draw by what it is for, e.g.
 * (request seed, output position, purpose), and gets the same number on every
 * path that asks for it.
 *
 * The generator is Philox4x32 with 10 rounds (Salmon, Moraes, Dror, Shaw,
 * "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11), the generator behind
 * cuRAND's Philox, JAX and PyTorch's CUDA RNG. It passes BigCrush, and because
 * it is a keyed bijection of the counter, distinct addresses never collide
 * within one seed. The mapping of an address onto Philox is:
 *
 *     key     = { seed & 0xffffffff, seed >> 32 }
 *     counter = { counter & 0xffffffff, counter >> 32,
 *                 stream & 0xffffffff,  stream >> 32 }
 *
 * This is part of specd's reproducibility contract: changing it changes the
 * tokens that every seeded request produces. */
#ifndef SPECD_RNG_H
#define SPECD_RNG_H

#include <stdint.h>
#include <stddef.h>

/* The Philox4x32-10 block function itself, exactly as Random123 defines it
 * (philox4x32_R(10, ctr, key)); exposed so tests can check the published
 * known-answer vectors. */
void specd_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The four 32-bit words at address (seed, stream, counter). */
void specd_rng_u32x4(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]);

/* specd_rng_u32x4 at n consecutive counters: out[4 * i + r] is word r at
 * (seed, stream, counter + i). Sixteen blocks at a time with AVX-512, eight
 * with AVX2 (simd.h picks), the same words as the scalar loop: the
 * sampling race draws noise for every token of the vocabulary this way. */
void specd_rng_u32x4_run(uint64_t seed, uint64_t stream, uint64_t counter, size_t n,
                         uint32_t *out);

/* A uniform double in [0, 1) with 53 random bits (a multiple of 2^-53; 1.0 is
 * never returned, 0.0 is possible), built from the first two words at
 * (seed, stream, counter). */
double specd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);

#endif
