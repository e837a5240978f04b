/* cuda_rope.cu - rotary position embedding of q and k, in place.
 *
 * One thread per (token, head, rotated pair): pairs are independent, and a
 * flat index over all of them keeps every thread busy whatever the head
 * count. The step's cos_sin table holds each token's (cos, sin) per
 * frequency, so no trigonometry happens here. */
#include "cuda_common.cuh"

#define ROPE_THREADS 256

/* CPU twin: cpu_rope / rope_head. Pairs are (2i, 2i+1) when interleaved
 * (GGUF weights), else (i, i + rot_dim/2) (Hugging Face weights); dims at
 * and past rot_dim are left alone. */
static __global__ void rope_kernel(float *q, float *k, const float *cos_sin, int n_tok,
                                   int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                                   int interleaved) {
    const int half = rot_dim / 2, heads = n_heads + n_kv_heads;
    const size_t total = (size_t)n_tok * heads * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t th = idx / half;
        int h = (int)(th % heads);
        int t = (int)(th / heads);
        float *v = h < n_heads ? q + ((size_t)t * n_heads + h) * head_dim
                               : k + ((size_t)t * n_kv_heads + (h - n_heads)) * head_dim;
        const float *cs = cos_sin + (size_t)t * rot_dim + 2 * i;
        float c = cs[0], s = cs[1];
        int a = interleaved ? 2 * i : i;
        int b = interleaved ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

extern "C" cudaError_t cuda_rope(float *q, float *k, const float *cos_sin, int n_tok, int n_heads,
                                 int n_kv_heads, int head_dim, int rot_dim, int interleaved,
                                 cudaStream_t stream) {
    if (!k) n_kv_heads = 0;
    if (!q) n_heads = 0;
    size_t total = (size_t)(n_tok > 0 ? n_tok : 0) * (size_t)(n_heads + n_kv_heads) * (rot_dim / 2);
    if (!total) return cudaSuccess;
    rope_kernel<<<grid_for(total, ROPE_THREADS), ROPE_THREADS, 0, stream>>>(
        q, k, cos_sin, n_tok, n_heads, n_kv_heads, head_dim, rot_dim, interleaved);
    return cudaGetLastError();
}
