/* cuda_common.cuh - small device helpers shared by the .cu files.
 *
 * Everything here is `static inline`: each .cu file is compiled on its own
 * (no separable compilation, no device link step), so each gets its copy. */
#ifndef SPECD_CUDA_COMMON_CUH
#define SPECD_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda_kernels.h"

#define FULL_MASK 0xffffffffu

/* Sum over the 32 lanes of a warp; every lane gets the total. */
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the total. `scratch` is 32 floats of shared memory. The first
 * __syncthreads keeps a previous use of scratch from racing with this one. */
static __device__ __forceinline__ float block_sum(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

/* Element i of an F32/F16/BF16 array as fp32. The branch is uniform across
 * the grid (one type per launch), so it costs nothing next to the load. */
static __device__ __forceinline__ float load_f32(const void *p, specd_dtype type, size_t i) {
    if (type == SPECD_F16) return __half2float(((const __half *)p)[i]);
    if (type == SPECD_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

/* Blocks for a grid-stride loop over n items: enough to fill the GPU many
 * times over, never more than the items need. */
static inline unsigned grid_for(size_t n, int threads) {
    size_t blocks = (n + (size_t)threads - 1) / (size_t)threads;
    if (blocks > 65536) blocks = 65536;
    return blocks ? (unsigned)blocks : 1u;
}

#endif
