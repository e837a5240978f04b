/* vec_avx2.c - AVX2 elementwise kernels: SwiGLU (the FFN's silu(gate) * up,
 * 46k exponentials per token on the default model, a serial step between
 * matmuls that libm's scalar expf made visible at decode).
 *
 * exp(x) = 2^n * e^r with n = round(x / ln 2) and r = x - n ln 2 (ln 2 split
 * in a high part exact in float and a low part), e^r by a degree-6
 * polynomial (Cephes' expf coefficients), 2^n built in the exponent bits.
 * x is clamped to [-87.3, 88.7], where the result stays normal; silu needs no
 * more (silu(g) = g / (1 + e^-g) is -0 or g itself beyond). Error: within 2
 * ulp of expf (test_backend_ops compares the op with the scalar twin). */
#include "quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define TAVX2 __attribute__((target("avx2,fma")))

static inline TAVX2 __m256 exp_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n: n + 127 in the exponent field (n in [-126, 128] after the clamp;
     * 2^128 would overflow the field, so scale by 2^(n-1) twice there) */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i half = _mm256_srai_epi32(ni, 1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    const __m256 s2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

static TAVX2 void swiglu_avx2(float *out, const float *gate, const float *up, size_t n) {
    size_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp_avx2(_mm256_xor_ps(g, neg));
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) out[i] = cpu_swiglu_scalar_one(gate[i], up[i]);
}

/* specd_argmax's rule: the first index of the largest value, NaN never
 * wins (all NaN: 0). Pass 1 finds the maximum (vmaxps returns its second
 * operand when the first is NaN, so the running max never becomes NaN);
 * pass 2 the first index holding it. A row of logits (196 KB for 49k
 * entries) stays in L2 between the passes. */
static TAVX2 int argmax_avx2(const float *x, int n) {
    if (n <= 0) return -1;
    __m256 m = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    float mx[8], best;
    _mm256_storeu_ps(mx, m);
    best = mx[0];
    for (int k = 1; k < 8; k++) best = mx[k] > best ? mx[k] : best;
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    const __m256 b = _mm256_set1_ps(best);
    for (i = 0; i + 8 <= n; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++)
        if (x[i] == best) return i;
    return 0; /* every value NaN */
}

int cpu_vec_avx2(cpu_kernel_set *ks) {
    ks->argmax = argmax_avx2;
    ks->swiglu = swiglu_avx2;
    return 1;
}

#else
int cpu_vec_avx2(cpu_kernel_set *ks) {
    (void)ks;
    return 0;
}
#endif
