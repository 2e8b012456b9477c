// Causal attention over the paged KV cache, for any mix of prefill (with or
// without a cached prefix) and decode tokens in one launch.
//
// Grid (num_tokens, num_heads), ATT_WARPS warps per block. Token t of
// sequence s (its j-th query token) sees cache positions 0..=context_len + j,
// read through the sequence's block table; query head h reads kv head
// h / (num_heads / num_kv_heads). Warp w takes keys w, w + ATT_WARPS, ...; a
// warp scores one key at a time (each lane holds head_dim/32 of the dims) and
// keeps an online softmax (running max, sum, weighted V) in f32. The warps'
// partial results are merged through shared memory at the end. Correctness
// first: each query token re-reads its keys (prefill tiles come later).
// With window > 0 only the last `window` of those positions are seen; with
// softcap > 0 each scaled score s becomes softcap * tanh(s / softcap). The
// tiled prefill and split-K decode kernels take the same variants; this one
// runs what they do not take (see attention_path.rs).

#define ATT_WARPS 4
#define ATT_MAX_PER_LANE 8  // head_dim <= 256

template <typename KV>
__device__ __forceinline__ void paged_attention(
    bf16* __restrict__ out, const bf16* __restrict__ q, const KV* __restrict__ k_cache,
    const KV* __restrict__ v_cache, const float* __restrict__ kv_scales,
    const int* __restrict__ token_seq, const int* __restrict__ cu_seqlens_q,
    const int* __restrict__ context_lens, const int* __restrict__ block_tables,
    int max_blocks_per_seq, int block_size, int num_heads, int num_kv_heads, int head_dim,
    float scale, int window, float softcap) {
    __shared__ float s_max[ATT_WARPS];
    __shared__ float s_sum[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][ATT_MAX_PER_LANE * 32];

    int tok = blockIdx.x;
    int head = blockIdx.y;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int seq = token_seq[tok];
    int j = tok - cu_seqlens_q[seq];
    int n_keys = context_lens[seq] + j + 1;
    int first = window > 0 && n_keys > window ? n_keys - window : 0;
    int kv_head = head / (num_heads / num_kv_heads);
    const int* table = block_tables + (long long)seq * max_blocks_per_seq;

    const bf16* qh = q + ((long long)tok * num_heads + head) * head_dim;
    const float qscale = scale * kv_scale<KV>(kv_scales, 0);
    float qv[ATT_MAX_PER_LANE];
    float acc[ATT_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
        int d = lane + 32 * i;
        qv[i] = d < head_dim ? bf2f(qh[d]) * qscale : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF;
    float l = 0.0f;
    for (int key = first + warp; key < n_keys; key += ATT_WARPS) {
        int blk = table[key / block_size];
        int off = key % block_size;
        long long base = (((long long)blk * block_size + off) * num_kv_heads + kv_head) * head_dim;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < head_dim) {
                s += qv[i] * kv_ld(k_cache, base + d);
            }
        }
        s = warp_sum(s);
        if (softcap > 0.0f) {
            s = softcap * tanhf(s / softcap);
        }
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new);
        float p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < head_dim) {
                acc[i] = acc[i] * corr + p * kv_ld(v_cache, base + d);
            }
        }
        m = m_new;
    }

    if (lane == 0) {
        s_max[warp] = m;
        s_sum[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d < head_dim) {
            s_acc[warp][d] = acc[i];
        }
    }
    __syncthreads();
    if (warp != 0) {
        return;
    }
    // At least one key (the token's own) is seen, by warp 0: the merged max is finite.
    float gm = NEG_INF;
    for (int w = 0; w < ATT_WARPS; w++) {
        gm = fmaxf(gm, s_max[w]);
    }
    float f[ATT_WARPS];
    float gl = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = s_sum[w] > 0.0f ? expf(s_max[w] - gm) : 0.0f;
        gl += s_sum[w] * f[w];
    }
    float inv = kv_scale<KV>(kv_scales, 1) / gl;
    bf16* oh = out + ((long long)tok * num_heads + head) * head_dim;
    for (int d = lane; d < head_dim; d += 32) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) {
            o += s_acc[w][d] * f[w];
        }
        oh[d] = f2bf(o * inv);
    }
}

#define ATT_ARGS(KV)                                                                         \
    bf16 *__restrict__ out, const bf16 *__restrict__ q, const KV *__restrict__ k_cache,      \
        const KV *__restrict__ v_cache, const float *__restrict__ kv_scales,                 \
        const int *__restrict__ token_seq, const int *__restrict__ cu_seqlens_q,             \
        const int *__restrict__ context_lens, const int *__restrict__ block_tables,          \
        int max_blocks_per_seq, int block_size, int num_heads, int num_kv_heads,             \
        int head_dim, float scale, int window, float softcap
#define ATT_PASS                                                                             \
    out, q, k_cache, v_cache, kv_scales, token_seq, cu_seqlens_q, context_lens, block_tables, \
        max_blocks_per_seq, block_size, num_heads, num_kv_heads, head_dim, scale, window,    \
        softcap

// Entry points by cache element type (the activations are bf16 in both).
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
paged_attention_bf16(ATT_ARGS(bf16)) {
    PDL_ENTRY();
    paged_attention<bf16>(ATT_PASS);
}

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
paged_attention_fp8(ATT_ARGS(fp8)) {
    PDL_ENTRY();
    paged_attention<fp8>(ATT_PASS);
}
