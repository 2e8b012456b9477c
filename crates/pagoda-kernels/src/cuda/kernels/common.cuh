// Small helpers shared by several compile units: the grid-stride loop, the
// gate activations, one rotary pair, the GEMV stores and bf16x8 unpacking.
// Device functions and macros only, no entry points.

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)gridDim.x * blockDim.x)

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

__device__ __forceinline__ float gelu_tanh(float g) {
    return 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
}

// The gate activations of the gated MLPs: 0 = SiLU, 1 = gelu_tanh
// (transformers' gelu_pytorch_tanh).
template <int ACT>
__device__ __forceinline__ float gate_act(float g) {
    return ACT == 0 ? silu(g) : gelu_tanh(g);
}

// One rotated pair, each product and sum rounded on its own (no fused
// multiply-add), so every kernel that rotates gives the same bits.
__device__ __forceinline__ void rope_rotate(bf16* h, int a, int b, float x1, float x2, float c,
                                            float s) {
    h[a] = f2bf(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
    h[b] = f2bf(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

__device__ __forceinline__ void store_gemv(bf16* y, long long i, float v) { y[i] = f2bf(v); }
__device__ __forceinline__ void store_gemv(float* y, long long i, float v) { y[i] += v; }

__device__ __forceinline__ void bf16x8_to_f32(const uint4 v, float* f) {
    const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}
