/* cuda_attention.cu - paged attention over the KV cache, split-KV
 * ("flash-decoding") style.
 *
 * Three kernels, queued in order on one stream:
 *  1. kv_append: each new token's k and v rows go into the layer's pools at
 *     the physical row the host computed (kv_row), converted to the cache
 *     type. Tokens of one step see each other's rows, so this runs first.
 *  2. attn_split: grid (n_tok * n_heads, splits). A token's visible logical
 *     rows 0 .. n_past+i are cut into `splits` contiguous chunks, one per
 *     block. In a block each warp takes every ATTN_WARPS-th row of the chunk
 *     and keeps an online softmax (running max m, running sum l, and the
 *     exp-weighted V accumulator) in fp32; the warps then merge in shared
 *     memory and the block writes its partial (m, l, acc[head_dim]).
 *  3. attn_combine: merges a token-head's partials into the output. With a
 *     single split the split kernel writes the output itself and this is
 *     skipped.
 * Decode has one token: without splitting, n_heads blocks would read the
 * whole cache; with it, n_heads * splits blocks share the reading.
 *
 * Everything ragged (which sequence a token belongs to, n_past, masks, page
 * tables) is read from the step buffer, so a recorded graph replays
 * correctly for any sequence lengths.
 *
 * Lane layout: head_dim is even and at most 256; lane l of a warp owns the
 * element pairs (2l + 64c, 2l + 64c + 1) for c = 0..3, so a warp reads a
 * K or V row as consecutive 4-byte (fp16 pair) or 8-byte (fp32 pair) words,
 * and q.k is a per-lane partial sum plus one warp shuffle reduction. */
#include "cuda_common.cuh"

#define ATTN_WARPS 4
#define ATTN_THREADS (ATTN_WARPS * 32)
#define ATTN_PAIRS (CUDA_ATTN_MAX_HEAD_DIM / 64) /* element pairs per lane */
/* A split shorter than this is not worth its block: short contexts use
 * fewer splits (the rest are empty and write an empty partial). */
#define ATTN_MIN_CHUNK (ATTN_WARPS * 8)
/* Aim for about this many blocks per attention call (an H100 keeps ~2000
 * 128-thread blocks resident): splits = ceil(1024 / (n_tok * n_heads)). */
#define ATTN_TARGET_BLOCKS 1024

static __device__ __forceinline__ float2 load_pair(const float *p) {
    return *(const float2 *)p;
}
static __device__ __forceinline__ float2 load_pair(const __half *p) {
    return __half22float2(*(const __half2 *)p);
}
static __device__ __forceinline__ void store_elem(float *p, float v) { *p = v; }
static __device__ __forceinline__ void store_elem(__half *p, float v) { *p = __float2half_rn(v); }

/* CPU twin: the memcpy of the new rows at the top of cpu_attention. */
template <typename T>
static __global__ void kv_append_kernel(T *kpool, T *vpool, const float *k, const float *v,
                                        const int32_t *kv_row, int kv_dim, int64_t n_rows) {
    int t = blockIdx.x;
    int64_t row = kv_row[t];
    if (row < 0 || row >= n_rows) return; /* no page table, or a bad one: never write outside */
    const float *ks = k + (size_t)t * kv_dim, *vs = v + (size_t)t * kv_dim;
    T *kd = kpool + (size_t)row * kv_dim, *vd = vpool + (size_t)row * kv_dim;
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) {
        store_elem(kd + e, ks[e]);
        store_elem(vd + e, vs[e]);
    }
}

/* CPU twin: attn_task (one task = one token-head; here one token-head is
 * `splits` blocks). `partials` holds gridDim.x*gridDim.y (m, l) pairs, then
 * gridDim.x*gridDim.y accumulators of head_dim floats. */
template <typename T>
static __global__ void __launch_bounds__(ATTN_THREADS)
    attn_split_kernel(float *out, float *partials, const float *q, const T *kpool,
                      const T *vpool, cuda_step_dev st, int n_heads, int group, int head_dim,
                      int kv_dim, int64_t n_rows, float scale) {
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_acc[ATTN_WARPS][CUDA_ATTN_MAX_HEAD_DIM];
    const int th = blockIdx.x, split = blockIdx.y, n_splits = gridDim.y;
    const int t = th / n_heads, h = th % n_heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    /* The token's visible logical rows are 0 .. n_past + i (its committed
     * rows, then new rows j <= i); this block takes chunk `split` of them. A
     * token outside every sequence, or one without a page table, sees
     * nothing and gets zeros. */
    int begin = 0, end = 0, n_past = 0;
    int64_t mask_base = -1; /* byte index of mask row i, -1 = causal */
    const int32_t *pages = st.pages;
    int sidx = st.tok_seq[t];
    if (sidx >= 0) {
        cuda_seq_meta s = st.seqs[sidx];
        int i = t - s.tok_start;
        if (s.pages_offset >= 0 && i >= 0 && i < s.n_new) {
            n_past = s.n_past;
            pages += s.pages_offset;
            if (s.mask_offset >= 0) mask_base = (int64_t)s.mask_offset + (int64_t)i * s.n_new;
            int range = n_past + i + 1;
            int chunk = (range + n_splits - 1) / n_splits;
            if (chunk < ATTN_MIN_CHUNK) chunk = ATTN_MIN_CHUNK;
            int64_t b = (int64_t)split * chunk, e = b + chunk; /* 64-bit: no overflow */
            begin = (int)(b < range ? b : range);
            end = (int)(e < range ? e : range);
        }
    }

    const int kvh = h / group; /* grouped-query attention: heads share kv heads */
    const float *qv = q + (size_t)th * head_dim;
    float qr[2 * ATTN_PAIRS], acc[2 * ATTN_PAIRS];
#pragma unroll
    for (int c = 0; c < ATTN_PAIRS; c++) {
        int d = 2 * lane + 64 * c;
        bool on = d < head_dim;
        qr[2 * c] = on ? qv[d] : 0.0f;
        qr[2 * c + 1] = on ? qv[d + 1] : 0.0f;
        acc[2 * c] = acc[2 * c + 1] = 0.0f;
    }

    /* Online softmax over this warp's rows: after each row, l = sum of
     * exp(score - m) and acc = sum of exp(score - m) * v over the rows so far.
     * A larger score rescales both by exp(m_old - m_new) (0 the first time,
     * since m starts at -inf). The row index r is warp-uniform, so the skips
     * below never split a warp before its shuffle. */
    float m = -INFINITY, l = 0.0f;
    for (int r = begin + warp; r < end; r += ATTN_WARPS) {
        if (mask_base >= 0 && r >= n_past && !st.masks[mask_base + (r - n_past)]) continue;
        int64_t phys = (int64_t)pages[r / CUDA_KV_PAGE_ROWS] * CUDA_KV_PAGE_ROWS +
                       r % CUDA_KV_PAGE_ROWS;
        if (phys < 0 || phys >= n_rows) continue; /* a bad page id: skip, never read outside */
        size_t off = (size_t)phys * kv_dim + (size_t)kvh * head_dim;
        const T *kr = kpool + off, *vr = vpool + off;
        float dot = 0.0f;
#pragma unroll
        for (int c = 0; c < ATTN_PAIRS; c++) {
            int d = 2 * lane + 64 * c;
            if (d < head_dim) {
                float2 kk = load_pair(kr + d);
                dot += qr[2 * c] * kk.x + qr[2 * c + 1] * kk.y;
            }
        }
        float score = warp_sum(dot) * scale;
        float m_new = fmaxf(m, score);
        float corr = expf(m - m_new);
        float p = expf(score - m_new);
        l = l * corr + p;
#pragma unroll
        for (int c = 0; c < ATTN_PAIRS; c++) {
            int d = 2 * lane + 64 * c;
            if (d < head_dim) {
                float2 vv = load_pair(vr + d);
                acc[2 * c] = acc[2 * c] * corr + p * vv.x;
                acc[2 * c + 1] = acc[2 * c + 1] * corr + p * vv.y;
            }
        }
        m = m_new;
    }

    /* Merge the warps: rescale each to the block's max. A warp that saw no
     * row has m = -inf and weight 0 (computed as 0, not exp(-inf - -inf)). */
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int c = 0; c < ATTN_PAIRS; c++) {
        int d = 2 * lane + 64 * c;
        if (d < head_dim) {
            sm_acc[warp][d] = acc[2 * c];
            sm_acc[warp][d + 1] = acc[2 * c + 1];
        }
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++) M = fmaxf(M, sm_m[w]);
    float wgt[ATTN_WARPS], L = 0.0f;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++) {
        wgt[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - M);
        L += sm_l[w] * wgt[w];
    }

    if (n_splits == 1) { /* the whole range was ours: write the output */
        float inv = L > 0.0f ? 1.0f / L : 0.0f;
        float *o = out + (size_t)th * head_dim;
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float a = 0.0f;
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; w++) a += sm_acc[w][d] * wgt[w];
            o[d] = a * inv;
        }
        return;
    }
    size_t part = (size_t)th * n_splits + split;
    if (threadIdx.x == 0) {
        partials[2 * part] = M; /* -inf for an empty split: combine gives it weight 0 */
        partials[2 * part + 1] = L;
    }
    float *pa = partials + (size_t)gridDim.x * n_splits * 2 + part * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) a += sm_acc[w][d] * wgt[w];
        pa[d] = a;
    }
}

/* Merges the splits of one token-head: the same rescale-to-the-max as the
 * warp merge above, then the division by the total sum. Every token sees at
 * least itself, so L > 0 for a valid step; L == 0 (no rows) gives zeros, not
 * NaN. */
static __global__ void attn_combine_kernel(float *out, const float *partials, int n_splits,
                                           int head_dim) {
    __shared__ float sm_w[CUDA_ATTN_MAX_SPLITS];
    __shared__ float sm_inv;
    const int th = blockIdx.x;
    const float *ml = partials + (size_t)th * n_splits * 2;
    const float *acc =
        partials + (size_t)gridDim.x * n_splits * 2 + (size_t)th * n_splits * head_dim;
    if (threadIdx.x == 0) {
        float M = -INFINITY;
        for (int s = 0; s < n_splits; s++) M = fmaxf(M, ml[2 * s]);
        float L = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            float w = ml[2 * s] == -INFINITY ? 0.0f : expf(ml[2 * s] - M);
            sm_w[s] = w;
            L += ml[2 * s + 1] * w;
        }
        sm_inv = L > 0.0f ? 1.0f / L : 0.0f;
    }
    __syncthreads();
    float *o = out + (size_t)th * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_splits; s++) a += acc[(size_t)s * head_dim + d] * sm_w[s];
        o[d] = a * sm_inv;
    }
}

extern "C" cudaError_t cuda_kv_append(void *kpool, void *vpool, int kv_f16, const float *k,
                                      const float *v, const int32_t *kv_row, int n_tok,
                                      int kv_dim, int64_t n_rows, cudaStream_t stream) {
    if (n_tok <= 0 || kv_dim <= 0) return cudaSuccess;
    if (kv_f16)
        kv_append_kernel<__half><<<n_tok, 256, 0, stream>>>((__half *)kpool, (__half *)vpool, k, v,
                                                            kv_row, kv_dim, n_rows);
    else
        kv_append_kernel<float><<<n_tok, 256, 0, stream>>>((float *)kpool, (float *)vpool, k, v,
                                                           kv_row, kv_dim, n_rows);
    return cudaGetLastError();
}

extern "C" int cuda_attention_splits(int n_tok, int n_heads) {
    int64_t units = (int64_t)n_tok * n_heads;
    if (units <= 0) return 1;
    int64_t s = (ATTN_TARGET_BLOCKS + units - 1) / units;
    return s > CUDA_ATTN_MAX_SPLITS ? CUDA_ATTN_MAX_SPLITS : (int)s;
}

extern "C" cudaError_t cuda_attention(float *out, float *partials, const float *q,
                                      const void *kpool, const void *vpool, int kv_f16,
                                      cuda_step_dev step, int n_tok, int n_heads, int n_kv_heads,
                                      int head_dim, int64_t n_rows, cudaStream_t stream) {
    if (n_tok <= 0 || n_heads <= 0) return cudaSuccess;
    if (head_dim <= 0 || head_dim % 2 || head_dim > CUDA_ATTN_MAX_HEAD_DIM || n_kv_heads <= 0 ||
        n_heads % n_kv_heads)
        return cudaErrorInvalidValue;
    int splits = cuda_attention_splits(n_tok, n_heads);
    unsigned units = (unsigned)n_tok * (unsigned)n_heads;
    dim3 grid(units, (unsigned)splits);
    int group = n_heads / n_kv_heads, kv_dim = n_kv_heads * head_dim;
    float scale = 1.0f / sqrtf((float)head_dim); /* the CPU's 1.0f / sqrtf(hd) */
    if (kv_f16)
        attn_split_kernel<__half><<<grid, ATTN_THREADS, 0, stream>>>(
            out, partials, q, (const __half *)kpool, (const __half *)vpool, step, n_heads, group,
            head_dim, kv_dim, n_rows, scale);
    else
        attn_split_kernel<float><<<grid, ATTN_THREADS, 0, stream>>>(
            out, partials, q, (const float *)kpool, (const float *)vpool, step, n_heads, group,
            head_dim, kv_dim, n_rows, scale);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || splits == 1) return e;
    attn_combine_kernel<<<units, ATTN_THREADS, 0, stream>>>(out, partials, splits, head_dim);
    return cudaGetLastError();
}
