/* quant_scalar.c - the portable kernel set, used on CPUs without AVX2.
 *
 * Dequantization is the reference itself. The matmul expands a row 256
 * weights at a time into a stack buffer (L1-resident) and takes dot products
 * with every token, so each weight is decoded once per call however many
 * tokens there are. Eight partial sums break the floating-point dependency
 * chain so the compiler can keep several multiply-adds in flight. */
#include "quant_impl.h"

#define SCALAR_CHUNK 256 /* a multiple of every block size */

static float dot_f32(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    for (; i < n; i++) s[0] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* Generic over types: `deq` expands whole blocks; `be`/`bb` are the block's
 * element count and byte size. */
static void rows_generic(cpu_dequant_fn deq, int64_t be, int64_t bb, const cpu_mm_args *a,
                         int64_t r0, int64_t r1) {
    float buf[SCALAR_CHUNK];
    const int64_t cols = a->cols;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = a->w + r * a->row_bytes;
        for (int t = 0; t < a->n_tok; t++) a->y[t * a->ldy + r] = 0.0f;
        for (int64_t c = 0; c < cols; c += SCALAR_CHUNK) {
            int64_t n = cols - c < SCALAR_CHUNK ? cols - c : SCALAR_CHUNK;
            deq(row + c / be * bb, buf, n);
            for (int t = 0; t < a->n_tok; t++)
                a->y[t * a->ldy + r] += dot_f32(buf, a->x + t * cols + c, n);
        }
    }
}

/* rows_TY for every type of CPU_WEIGHT_TYPES (quant_impl.h) */
#define SCALAR_ROWS(TY, TYPE, SDG, GB)                                                \
    static void rows_##TY(const cpu_mm_args *a, int64_t r0, int64_t r1) {             \
        const specd_dtype_info *in = specd_dtype_get(TYPE);                           \
        rows_generic(cpu_dequant_ref_fn(TYPE), in->block_elems, in->block_bytes, a, r0, \
                     r1);                                                             \
    }

CPU_WEIGHT_TYPES(SCALAR_ROWS)

int cpu_kernels_scalar(cpu_kernel_set *ks) {
    memset(ks, 0, sizeof *ks);
    ks->name = "scalar";
#define SET(TY, TYPE, SDG, GB)                     \
    ks->dequant[TYPE] = cpu_dequant_ref_fn(TYPE); \
    ks->rows[TYPE] = rows_##TY;
    CPU_WEIGHT_TYPES(SET)
#undef SET
    return 1;
}
