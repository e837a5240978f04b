/* cuda_kv.cu - moving KV cache rows (compaction after a tree verify keeps
 * the accepted path's rows and packs them behind the committed ones).
 *
 * One block per (layer, K or V) pool; each block walks the (src, dst)
 * pairs strictly in order with a barrier between pairs, because a later
 * pair may read a row that an earlier pair wrote (see
 * specd_transformer_kv_compact in common/model/transformer.c). The pools are
 * independent, so the blocks need no ordering among themselves. */
#include "cuda_common.cuh"

#define KV_MOVE_THREADS 256

/* CPU twin: cpu_kv_move. W is the copy word: the widest of uint4 (16
 * bytes), uint32_t and uint16_t that divides the row and the base address
 * (rows are kv_dim elements of 2 or 4 bytes). */
template <typename W>
static __global__ void kv_move_kernel(void *base, int64_t n_rows, size_t row_words,
                                      const int32_t *pairs, int n) {
    /* blockIdx.x = pool index 2*layer + (0 = K, 1 = V), pools back to back */
    W *pool = (W *)base + (size_t)blockIdx.x * (size_t)n_rows * row_words;
    for (int i = 0; i < n; i++) {
        int32_t src = pairs[i], dst = pairs[n + i];
        /* src/dst are block-uniform, so every thread takes the same branch and
         * reaches the barrier below */
        if (src != dst && src >= 0 && dst >= 0 && src < n_rows && dst < n_rows) {
            const W *s = pool + (size_t)src * row_words;
            W *d = pool + (size_t)dst * row_words;
            for (size_t w = threadIdx.x; w < row_words; w += blockDim.x) d[w] = s[w];
        }
        /* the barrier makes this pair's writes visible to the whole block
         * before the next pair reads */
        __syncthreads();
    }
}

extern "C" cudaError_t cuda_kv_move(void *base, int n_layers, int64_t n_rows, size_t row_bytes,
                                    const int32_t *pairs, int n, cudaStream_t stream) {
    if (n <= 0 || n_layers <= 0 || n_rows <= 0 || !row_bytes) return cudaSuccess;
    if (row_bytes % 2) return cudaErrorInvalidValue;
    unsigned blocks = (unsigned)(2 * n_layers);
    uintptr_t a = (uintptr_t)base;
    if (row_bytes % 16 == 0 && a % 16 == 0)
        kv_move_kernel<uint4><<<blocks, KV_MOVE_THREADS, 0, stream>>>(base, n_rows, row_bytes / 16,
                                                                      pairs, n);
    else if (row_bytes % 4 == 0 && a % 4 == 0)
        kv_move_kernel<uint32_t><<<blocks, KV_MOVE_THREADS, 0, stream>>>(base, n_rows,
                                                                         row_bytes / 4, pairs, n);
    else
        kv_move_kernel<uint16_t><<<blocks, KV_MOVE_THREADS, 0, stream>>>(base, n_rows,
                                                                         row_bytes / 2, pairs, n);
    return cudaGetLastError();
}
