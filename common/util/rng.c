/* rng.c - Philox4x32-10, see rng.h.
 *
 * Written from the description in the Random123 paper and checked against its
 * known-answer vectors (tests/unit/test_sampling.c). */
#include "common/util/rng.h"

/* Round multipliers and Weyl key increments from the paper (Table 2). The
 * increments are the golden ratio and sqrt(3) - 1 in 0.32 fixed point. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* One round: two 32x32->64 multiplies whose high halves are mixed with the
 * other two words and the round key, then a fixed word permutation. */
static void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k[0];
    uint32_t n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

void specd_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    /* The first round uses the key as given; each later round first bumps it
     * (Random123's philox4x32_R: round, then (bumpkey, round) x 9). */
    philox_round(c, k);
    for (int r = 1; r < 10; r++) {
        k[0] += PHILOX_W0;
        k[1] += PHILOX_W1;
        philox_round(c, k);
    }
    out[0] = c[0];
    out[1] = c[1];
    out[2] = c[2];
    out[3] = c[3];
}

void specd_rng_u32x4(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    specd_philox4x32_10(ctr, key, out);
}

double specd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint32_t w[4];
    specd_rng_u32x4(seed, stream, counter, w);
    /* Top 53 bits of the first 64 output bits: every double k * 2^-53 for
     * k in [0, 2^53) is equally likely, and the product is exact. */
    uint64_t bits = ((uint64_t)w[0] << 32 | w[1]) >> 11;
    return (double)bits * 0x1.0p-53;
}
