// KV cache element helpers shared by the attention kernels and the KV
// stores (elementwise.cu, qk_norm_rope.cu): loads, scales and stores of a
// bf16 or FP8 E4M3 cache. Device functions only, no entry points; included
// (concatenated after prelude.cuh) by each compile unit that needs it.

// KV cache elements, for the attention kernels templated on them: bf16, or
// FP8 E4M3 bytes whose value is byte * scale, with the layer's scales in a
// small device buffer kv_scales = {k_scale, v_scale} (read, never baked into
// a launch, so a captured graph follows a change). A bf16 cache ignores it.
// The scales are folded where they cost nothing: k_scale into the query's
// scale, v_scale into the output's normalization.
template <typename KV>
struct KvIsFp8 {
    static constexpr bool value = false;
};
template <>
struct KvIsFp8<fp8> {
    static constexpr bool value = true;
};
__device__ __forceinline__ float kv_ld(const bf16* p, long long i) { return bf2f(p[i]); }
__device__ __forceinline__ float kv_ld(const fp8* p, long long i) { return fp82f(p[i]); }
// Scale `i` (0: K, 1: V) of a cache of element type KV.
template <typename KV>
__device__ __forceinline__ float kv_scale(const float* __restrict__ kv_scales, int i) {
    if constexpr (KvIsFp8<KV>::value) {
        return kv_scales[i];
    } else {
        return 1.0f;
    }
}

// Stores of one element (kv_put) or eight (kv_put8, a 16-byte bf16 load's
// worth) into a cache: a bf16 cache takes the bits, an FP8 one
// f2fp8(x / scale) (round to nearest even, saturating: fp8.rs's encoder).
__device__ __forceinline__ void kv_put(bf16* c, long long i, bf16 x, float) { c[i] = x; }
__device__ __forceinline__ void kv_put(fp8* c, long long i, bf16 x, float s) {
    c[i] = f2fp8(bf2f(x) / s);
}

__device__ __forceinline__ void kv_put8(bf16* c, long long i, uint4 x, float) {
    *(uint4*)(c + i) = x;
}
__device__ __forceinline__ void kv_put8(fp8* c, long long i, uint4 x, float s) {
    const unsigned w[4] = {x.x, x.y, x.z, x.w};
    unsigned o[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const unsigned h = (w[e / 2] >> (16 * (e % 2))) & 0xffffu;
        const unsigned b = f2fp8(bf2f((bf16)h) / s);
        o[e / 4] |= b << (8 * (e % 4));
    }
    *(uint2*)(c + i) = make_uint2(o[0], o[1]);
}
