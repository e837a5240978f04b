/* cuda_argmax.cu - greedy token choice: the index of each row's largest
 * logit, computed where the logits are so only n_rows int32 cross PCIe.
 *
 * One block of 1024 threads per row: decode has one row of ~50k-150k
 * logits, and one block with many loads in flight reads it fastest. */
#include <limits.h>

#include "cuda_common.cuh"

#define ARGMAX_THREADS 1024

/* (v, i) beats (best, bi) when larger, or equal at a lower index (the first
 * index of the max wins). NaN compares false both ways, so it never wins;
 * starting from (-inf, INT_MAX) lets a row of -inf still pick index 0. */
static __device__ __forceinline__ void take_better(float &best, int &bi, float v, int i) {
    if (v > best || (v == best && i < bi)) {
        best = v;
        bi = i;
    }
}

/* CPU twin: cpu_argmax. */
static __global__ void argmax_kernel(int32_t *ids, const float *x, int width) {
    __shared__ float s_val[32];
    __shared__ int s_idx[32];
    const float *row = x + (size_t)blockIdx.x * width;
    float best = -INFINITY;
    int bi = INT_MAX;
    /* each thread scans increasing indices, so strict > keeps its first max */
    for (int i = threadIdx.x; i < width; i += blockDim.x) take_better(best, bi, row[i], i);
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(FULL_MASK, best, o);
        int oi = __shfl_down_sync(FULL_MASK, bi, o);
        take_better(best, bi, ov, oi);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        s_val[warp] = best;
        s_idx[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        int n_warps = blockDim.x >> 5;
        best = lane < n_warps ? s_val[lane] : -INFINITY;
        bi = lane < n_warps ? s_idx[lane] : INT_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_down_sync(FULL_MASK, best, o);
            int oi = __shfl_down_sync(FULL_MASK, bi, o);
            take_better(best, bi, ov, oi);
        }
        if (lane == 0) ids[blockIdx.x] = bi == INT_MAX ? 0 : bi; /* all NaN: 0 */
    }
}

extern "C" cudaError_t cuda_argmax(int32_t *ids, const float *x, int n_rows, int width,
                                   cudaStream_t stream) {
    if (n_rows <= 0) return cudaSuccess;
    argmax_kernel<<<n_rows, ARGMAX_THREADS, 0, stream>>>(ids, x, width);
    return cudaGetLastError();
}
