/* cuda_elementwise.cu - the memory-bound one-liners: SwiGLU, axpy, scale,
 * fp32 -> fp16/bf16 conversion, embedding and row gathers, random fill.
 *
 * Flat ops use grid-stride loops over size_t indices (n may exceed 2^31);
 * row ops use one block per row with the threads striding the row, so each
 * warp reads consecutive addresses. */
#include "cuda_common.cuh"

#define EW_THREADS 256

/* CPU twin: cpu_swiglu. expf (not __expf): the accurate exponential, so the
 * result tracks the CPU's to a few ulp. */
static __global__ void swiglu_kernel(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* CPU twin: cpu_axpy. */
static __global__ void axpy_kernel(float *y, float a, const float *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += a * x[i];
}

/* CPU twin: cpu_scale. */
static __global__ void scale_kernel(float *x, float a, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= a;
}

/* CPU twin: specd_f32_to_fp16 / specd_f32_to_bf16 (both round to nearest
 * even, as the _rn intrinsics do). */
static __global__ void to_f16_kernel(__half *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}
static __global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* CPU twin: cpu_embed (cpu_tensor_row of each id). One block per output
 * row. */
static __global__ void embed_kernel(float *out, const void *table, specd_dtype type,
                                    int64_t rows, int64_t cols, const int32_t *ids) {
    int32_t id = ids[blockIdx.x];
    float *o = out + (size_t)blockIdx.x * cols;
    if (id < 0 || id >= rows) { /* the caller validates ids; never read outside */
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = 0.0f;
        return;
    }
    size_t base = (size_t)id * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = load_f32(table, type, base + c);
}

/* CPU twin: cpu_gather_out. */
static __global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *rows,
                                          int width) {
    const float *s = src + (size_t)rows[blockIdx.x] * width;
    float *d = dst + (size_t)blockIdx.x * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
}

/* splitmix64's finalizer: a good 64-bit mix, so hash(seed, i) values are
 * independent enough for benchmark weights. */
static __device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* No CPU twin (benchmark weights exist only on the GPU). */
static __global__ void fill_random_kernel(void *dst, specd_dtype type, size_t n, uint64_t seed,
                                          float lo, float hi) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        /* top 24 bits -> [0, 1) exactly representable in fp32 */
        float u = (float)(mix64(seed ^ mix64(i)) >> 40) * (1.0f / 16777216.0f);
        float v = lo + (hi - lo) * u;
        if (type == SPECD_F16) ((__half *)dst)[i] = __float2half_rn(v);
        else if (type == SPECD_BF16) ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(v);
        else ((float *)dst)[i] = v;
    }
}

extern "C" cudaError_t cuda_swiglu(float *out, const float *gate, const float *up, size_t n,
                                   cudaStream_t stream) {
    if (!n) return cudaSuccess;
    swiglu_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, gate, up, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_axpy(float *y, float a, const float *x, size_t n,
                                 cudaStream_t stream) {
    if (!n) return cudaSuccess;
    axpy_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, stream>>>(y, a, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_scale(float *x, float a, size_t n, cudaStream_t stream) {
    if (!n) return cudaSuccess;
    scale_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, stream>>>(x, a, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_convert_f32(void *dst, specd_dtype dst_type, const float *src,
                                        size_t n, cudaStream_t stream) {
    if (!n) return cudaSuccess;
    if (dst_type == SPECD_F16)
        to_f16_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, stream>>>((__half *)dst, src, n);
    else if (dst_type == SPECD_BF16)
        to_bf16_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, stream>>>(
            (__nv_bfloat16 *)dst, src, n);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_embed(float *out, const void *table, specd_dtype type, int64_t rows,
                                  int64_t cols, const int32_t *ids, int n, cudaStream_t stream) {
    if (n <= 0 || cols <= 0) return cudaSuccess;
    embed_kernel<<<n, EW_THREADS, 0, stream>>>(out, table, type, rows, cols, ids);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_gather_rows(float *dst, const float *src, const int32_t *rows, int n,
                                        int width, cudaStream_t stream) {
    if (n <= 0 || width <= 0) return cudaSuccess;
    gather_rows_kernel<<<n, EW_THREADS, 0, stream>>>(dst, src, rows, width);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_fill_random(void *dst, specd_dtype type, size_t n, uint64_t seed,
                                        float lo, float hi, cudaStream_t stream) {
    if (!n) return cudaSuccess;
    fill_random_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, stream>>>(dst, type, n, seed,
                                                                             lo, hi);
    return cudaGetLastError();
}
