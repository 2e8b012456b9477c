// Q/K head RMSNorm (Qwen3's q_norm / k_norm, optional) and rotary embedding
// of q and k in one launch: the decode-step replacement of head_rms_norm on
// q, head_rms_norm on k, rope on q and rope on k (four launches), with the
// same bits as that sequence.
//
// One block per (row, head) of q, then of k, of ceil32(head_dim) threads,
// as head_rms_norm's launch: the same sum of squares through block_sum, the
// same normalized value rounded to bf16, staged in shared memory; then each
// thread i < rd / 2 rotates pair i from the staged values with rope_rotate
// (elementwise.cu, as rope does) and threads past rd write their normalized
// value back. head_dim <= 1024 (the host checks).
//
// The _store_ kernels also store the step's K/V into the KV cache (the
// decode-step replacement of the store_kv launch that follows): each k head's
// block, once its head is final, puts it and the same head of v at the row's
// slot (slot -1: padding, never written) with store_kv's kv_put, so the cache
// gets store_kv's bits (bf16, or FP8 E4M3 of x / scale).

// Where a k head goes in the KV cache; KV = void: nowhere (no store).
template <typename KV>
struct kv_stores {
    static constexpr bool value = true;
};
template <>
struct kv_stores<void> {
    static constexpr bool value = false;
};

template <typename KV>
struct KvDest {
    KV* k_cache;
    KV* v_cache;
    const bf16* v;
    const float* kv_scales;
    const int* slots;
};

template <typename T, typename KV>
__device__ void qk_norm_rope_impl(bf16* __restrict__ q, bf16* __restrict__ k,
                                  const bf16* __restrict__ qw, const bf16* __restrict__ kw,
                                  int has_norm, const int* __restrict__ positions,
                                  const T* __restrict__ table, int q_heads, int k_heads,
                                  int head_dim, int rd, int style, float eps,
                                  KvDest<KV> dest) {
    __shared__ float hv[1024];
    const int per_row = q_heads + k_heads;
    const int r = blockIdx.x / per_row;
    const int hh = blockIdx.x - r * per_row;
    bf16* h;
    const bf16* w;
    if (hh < q_heads) {
        h = q + ((long long)r * q_heads + hh) * head_dim;
        w = qw;
    } else {
        h = k + ((long long)r * k_heads + (hh - q_heads)) * head_dim;
        w = kw;
    }
    if (has_norm) {
        float ss = 0.0f;
        for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
            float v = bf2f(h[c]);
            ss += v * v;
        }
        float inv = rsqrtf(block_sum(ss) / (float)head_dim + eps);
        for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
            hv[c] = bf2f(f2bf(bf2f(h[c]) * inv * bf2f(w[c])));
        }
    } else {
        for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
            hv[c] = bf2f(h[c]);
        }
    }
    __syncthreads();
    const int half = rd / 2;
    const long long trow = (long long)positions[r] * rd;
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        if (c < half) {
            float cs = ld(table, trow + c);
            float sn = ld(table, trow + half + c);
            int a = style == 0 ? c : 2 * c;
            int b = style == 0 ? c + half : 2 * c + 1;
            rope_rotate(h, a, b, hv[a], hv[b], cs, sn);
        } else if (c >= rd && has_norm) {
            h[c] = f2bf(hv[c]);
        }
    }
    if constexpr (kv_stores<KV>::value) {
        const int kh = hh - q_heads;
        const int slot = dest.slots[r];
        if (kh < 0 || slot < 0) {
            return;
        }
        // The head's final values, written by other threads above.
        __syncthreads();
        float ks = 1.0f, vs = 1.0f;
        if constexpr (sizeof(KV) == 1) {
            ks = dest.kv_scales[0];
            vs = dest.kv_scales[1];
        }
        const long long width = (long long)k_heads * head_dim;
        const long long dst = (long long)slot * width + (long long)kh * head_dim;
        const bf16* vh = dest.v + r * width + (long long)kh * head_dim;
        for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
            kv_put(dest.k_cache, dst + c, h[c], ks);
            kv_put(dest.v_cache, dst + c, vh[c], vs);
        }
    }
}

// Grid: rows * (q_heads + k_heads) blocks of ceil32(head_dim) threads.
extern "C" __global__ void qk_norm_rope_f32(bf16* q, bf16* k, const bf16* qw, const bf16* kw,
                                            int has_norm, const int* positions,
                                            const float* table, int q_heads, int k_heads,
                                            int head_dim, int rd, int style, float eps) {
    PDL_ENTRY();
    qk_norm_rope_impl(q, k, qw, kw, has_norm, positions, table, q_heads, k_heads, head_dim, rd,
                      style, eps, KvDest<void>{});
}

extern "C" __global__ void qk_norm_rope_bf16(bf16* q, bf16* k, const bf16* qw, const bf16* kw,
                                             int has_norm, const int* positions,
                                             const bf16* table, int q_heads, int k_heads,
                                             int head_dim, int rd, int style, float eps) {
    PDL_ENTRY();
    qk_norm_rope_impl(q, k, qw, kw, has_norm, positions, table, q_heads, k_heads, head_dim, rd,
                      style, eps, KvDest<void>{});
}

// The same, then the step's K/V into the cache (slots: the step's slot
// mapping; kv_scales: the layer's {k_scale, v_scale}, read by FP8 caches).
#define QK_STORE_KERNEL(NAME, T, KV)                                                         \
    extern "C" __global__ void NAME(bf16* q, bf16* k, const bf16* qw, const bf16* kw,       \
                                    int has_norm, const int* positions, const T* table,      \
                                    int q_heads, int k_heads, int head_dim, int rd, int style, \
                                    float eps, KV* k_cache, KV* v_cache, const bf16* v,      \
                                    const float* kv_scales, const int* slots) {              \
        PDL_ENTRY();                                                                         \
        qk_norm_rope_impl(q, k, qw, kw, has_norm, positions, table, q_heads, k_heads,        \
                          head_dim, rd, style, eps,                                          \
                          KvDest<KV>{k_cache, v_cache, v, kv_scales, slots});                \
    }

QK_STORE_KERNEL(qk_norm_rope_store_f32_bf16, float, bf16)
QK_STORE_KERNEL(qk_norm_rope_store_bf16_bf16, bf16, bf16)
QK_STORE_KERNEL(qk_norm_rope_store_f32_fp8, float, fp8)
QK_STORE_KERNEL(qk_norm_rope_store_bf16_fp8, bf16, fp8)
