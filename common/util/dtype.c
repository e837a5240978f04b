/* dtype.c - the type table and scalar half-precision conversions. */
#include "common/util/dtype.h"

#include <string.h>

/* Block layouts follow GGML (ggml-common.h); sizes are part of the GGUF file
 * format, so they are facts, not choices. */
static const specd_dtype_info k_types[SPECD_DTYPE_COUNT] = {
    [SPECD_F32] = {"F32", 1, 4, 1},
    [SPECD_F16] = {"F16", 1, 2, 1},
    [SPECD_Q4_0] = {"Q4_0", 32, 18, 1},
    [SPECD_Q4_1] = {"Q4_1", 32, 20, 1},
    [SPECD_Q5_0] = {"Q5_0", 32, 22, 1},
    [SPECD_Q5_1] = {"Q5_1", 32, 24, 1},
    [SPECD_Q8_0] = {"Q8_0", 32, 34, 1},
    [SPECD_Q8_1] = {"Q8_1", 32, 36, 0},
    [SPECD_Q2_K] = {"Q2_K", 256, 84, 1},
    [SPECD_Q3_K] = {"Q3_K", 256, 110, 1},
    [SPECD_Q4_K] = {"Q4_K", 256, 144, 1},
    [SPECD_Q5_K] = {"Q5_K", 256, 176, 1},
    [SPECD_Q6_K] = {"Q6_K", 256, 210, 1},
    [SPECD_Q8_K] = {"Q8_K", 256, 292, 0},
    [SPECD_IQ4_NL] = {"IQ4_NL", 32, 18, 1},
    [SPECD_IQ4_XS] = {"IQ4_XS", 256, 136, 1},
    [SPECD_I8] = {"I8", 1, 1, 0},
    [SPECD_I16] = {"I16", 1, 2, 0},
    [SPECD_I32] = {"I32", 1, 4, 0},
    [SPECD_I64] = {"I64", 1, 8, 0},
    [SPECD_F64] = {"F64", 1, 8, 0},
    [SPECD_BF16] = {"BF16", 1, 2, 1},
};

const specd_dtype_info *specd_dtype_get(uint32_t t) {
    if (t >= SPECD_DTYPE_COUNT || !k_types[t].name) return NULL;
    return &k_types[t];
}

uint64_t specd_dtype_nbytes(specd_dtype t, uint64_t n_elems, int *ok) {
    const specd_dtype_info *info = specd_dtype_get(t);
    *ok = 0;
    if (!info || n_elems % info->block_elems) return 0;
    uint64_t blocks = n_elems / info->block_elems;
    if (blocks > UINT64_MAX / info->block_bytes) return 0;
    *ok = 1;
    return blocks * info->block_bytes;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float specd_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t specd_f32_to_fp16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow */
    if (absx < 0x38800000u) { /* subnormal or zero in fp16 */
        /* round(value / 2^-24) with ties to even */
        float v = bits_f32(absx) * 16777216.0f;
        uint32_t r = (uint32_t)v;
        float frac = v - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t exp = ((absx >> 23) - 112) << 10;
    uint32_t man = (absx >> 13) & 0x3ff;
    uint32_t rest = absx & 0x1fff;
    uint32_t h = exp | man;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float specd_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t specd_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
