/* cuda_norm.cu - RMS norm, and RMS norm + affine + GELU (the MLP
 * speculator's LayerNormParameterized). One block per row: the row's sum of
 * squares is a block reduction, then every thread scales its elements. */
#include "cuda_common.cuh"

/* Threads per row: about 4+ elements per thread, 32..512 threads. */
static int norm_threads(int dim) {
    int t = 32;
    while (t * 4 < dim && t < 512) t *= 2;
    return t;
}

/* 1 / rms of the block's row (CPU twin: inv_rms). The CPU sums squares in
 * double; a fp32 tree sum over a row of a few thousand elements is within
 * ~1e-6 relative of it. Every thread gets the result. */
static __device__ __forceinline__ float row_inv_rms(const float *xr, int dim, float eps,
                                                    float *scratch) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    return 1.0f / sqrtf(ss / (float)dim + eps); /* IEEE sqrt and divide, as the CPU */
}

/* CPU twin: cpu_rmsnorm. */
static __global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int dim, float eps) {
    __shared__ float scratch[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    float k = row_inv_rms(xr, dim, eps, scratch);
    /* (x * k) * w, in the CPU's order. Each thread rewrites only elements it
     * read itself, after the reduction, so out == x is safe. */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = (xr[i] * k) * (w ? w[i] : 1.0f);
}

static __device__ __forceinline__ float gelu_erf(float x) {
    /* torch.nn.GELU() default: the exact erf form, not the tanh estimate */
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

/* CPU twin: cpu_norm_gelu. */
static __global__ void norm_gelu_kernel(float *out, const float *x, const float *w, const float *b,
                                 int dim, float eps) {
    __shared__ float scratch[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    float k = row_inv_rms(xr, dim, eps, scratch);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float wi = w ? w[i] : 1.0f, bi = b ? b[i] : 0.0f;
        o[i] = gelu_erf(wi * (xr[i] * k) + bi);
    }
}

extern "C" cudaError_t cuda_rmsnorm(float *out, const float *x, const float *w, int n_rows,
                                    int dim, float eps, cudaStream_t stream) {
    if (n_rows <= 0 || dim <= 0) return cudaSuccess;
    rmsnorm_kernel<<<n_rows, norm_threads(dim), 0, stream>>>(out, x, w, dim, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_norm_gelu(float *out, const float *x, const float *w, const float *b,
                                      int n_rows, int dim, float eps, cudaStream_t stream) {
    if (n_rows <= 0 || dim <= 0) return cudaSuccess;
    norm_gelu_kernel<<<n_rows, norm_threads(dim), 0, stream>>>(out, x, w, b, dim, eps);
    return cudaGetLastError();
}
