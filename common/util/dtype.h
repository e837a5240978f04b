/* dtype.h - tensor element types, numbered as GGML/GGUF numbers them.
 *
 * Using GGUF's numbering means a GGUF tensor's type field maps to this enum
 * without a table. Safetensors dtypes (F32/F16/BF16) map onto the same enum.
 * Quantized types store `block_elems` weights in `block_bytes` bytes; a row
 * of a quantized matrix is a whole number of blocks. */
#ifndef SPECD_DTYPE_H
#define SPECD_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum specd_dtype {
    SPECD_F32 = 0,
    SPECD_F16 = 1,
    SPECD_Q4_0 = 2,
    SPECD_Q4_1 = 3,
    SPECD_Q5_0 = 6,
    SPECD_Q5_1 = 7,
    SPECD_Q8_0 = 8,
    SPECD_Q8_1 = 9,
    SPECD_Q2_K = 10,
    SPECD_Q3_K = 11,
    SPECD_Q4_K = 12,
    SPECD_Q5_K = 13,
    SPECD_Q6_K = 14,
    SPECD_Q8_K = 15,
    SPECD_IQ4_NL = 20,
    SPECD_IQ4_XS = 23,
    SPECD_I8 = 24,
    SPECD_I16 = 25,
    SPECD_I32 = 26,
    SPECD_I64 = 27,
    SPECD_F64 = 28,
    SPECD_BF16 = 30,
    SPECD_DTYPE_COUNT = 40 /* upper bound of the numbering, not a type */
} specd_dtype;

typedef struct specd_dtype_info {
    const char *name;   /* "Q4_1"; NULL for numbers that are not a type */
    uint32_t block_elems; /* weights per block (1 for plain types) */
    uint32_t block_bytes; /* bytes per block */
    int supported;      /* 1 if specd can compute with it (dequant + matmul) */
} specd_dtype_info;

/* NULL when `t` is not a known type number. */
const specd_dtype_info *specd_dtype_get(uint32_t t);

/* Bytes taken by `n_elems` elements; returns 0 and sets *ok=0 when n_elems is
 * not a whole number of blocks or the size overflows. */
uint64_t specd_dtype_nbytes(specd_dtype t, uint64_t n_elems, int *ok);

/* fp16 / bf16 scalar conversions (exact, round-to-nearest-even on the way in). */
float specd_fp16_to_f32(uint16_t h);
uint16_t specd_f32_to_fp16(float f);
float specd_bf16_to_f32(uint16_t h);
uint16_t specd_f32_to_bf16(float f);

#endif
