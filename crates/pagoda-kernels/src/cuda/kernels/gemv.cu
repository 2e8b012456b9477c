// Skinny matrix products for decode: y[M, N] = x[M, K] @ w[N, K]^T (+ bias)
// for M <= GEMV_MAX_ROWS, where a GEMM library's tiles are mostly idle and
// the product is a pass over the weights.
//
// One warp per output feature n: each lane streams w[n, :] in 16-byte
// chunks (8 bf16; consecutive lanes take consecutive chunks, so a warp reads
// 512 contiguous bytes per iteration), multiplies them by the same chunk of
// every x row (x is tiny and shared by all warps, so it is served from L1),
// and keeps M f32 sums; a warp reduction finishes each sum and lane 0 writes
// the M outputs (+ bias), rounded once to bf16 (gemv_bf16) or added into the
// f32 residual stream (gemv_bf16_acc_f32, the decode path of add_linear). Requires K % 8 == 0 and
// 16-byte aligned rows (the host checks; other shapes go to cuBLAS).
//
// The two numbers (Qwen3-0.6B, batch 1): every decode step reads each weight
// once, ~1.2 GB with the tied LM head, ~0.28 ms at 4.2 TB/s; FLOPs are 2
// per weight per row, negligible. Each warp keeps 2 chunks of w in flight.

#define GEMV_MAX_ROWS 8
#define GEMV_WARPS 8

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

// Y = bf16: y = x w^T (+ bias); Y = float: y += x w^T (+ bias).
template <int M, typename Y>
__device__ __forceinline__ void gemv_rows(Y* __restrict__ y, const bf16* __restrict__ x,
                                          const bf16* __restrict__ w,
                                          const bf16* __restrict__ bias, int has_bias, int n_out,
                                          int k) {
    int lane = threadIdx.x & 31;
    int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (n >= n_out) {
        return;
    }
    const uint4* wr = reinterpret_cast<const uint4*>(w + (long long)n * k);
    int chunks = k >> 3;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) {
        acc[m] = 0.0f;
    }
    int c = lane;
    // Two weight chunks in flight per lane.
    for (; c + 32 < chunks; c += 64) {
        uint4 wa = __ldg(wr + c);
        uint4 wb = __ldg(wr + c + 32);
        float fa[8], fb[8];
        bf16x8_to_f32(wa, fa);
        bf16x8_to_f32(wb, fb);
#pragma unroll
        for (int m = 0; m < M; m++) {
            const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)m * k);
            float xa[8], xb[8];
            bf16x8_to_f32(__ldg(xr + c), xa);
            bf16x8_to_f32(__ldg(xr + c + 32), xb);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                acc[m] = fmaf(fa[i], xa[i], acc[m]);
                acc[m] = fmaf(fb[i], xb[i], acc[m]);
            }
        }
    }
    for (; c < chunks; c += 32) {
        float fa[8];
        bf16x8_to_f32(__ldg(wr + c), fa);
#pragma unroll
        for (int m = 0; m < M; m++) {
            const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)m * k);
            float xa[8];
            bf16x8_to_f32(__ldg(xr + c), xa);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                acc[m] = fmaf(fa[i], xa[i], acc[m]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; m++) {
        acc[m] = warp_sum(acc[m]);
    }
    if (lane == 0) {
        float b = has_bias ? bf2f(bias[n]) : 0.0f;
#pragma unroll
        for (int m = 0; m < M; m++) {
            store_gemv(y, (long long)m * n_out + n, acc[m] + b);
        }
    }
}

template <typename Y>
__device__ __forceinline__ void gemv_dispatch(Y* __restrict__ y, const bf16* __restrict__ x,
                                              const bf16* __restrict__ w,
                                              const bf16* __restrict__ bias, int has_bias, int m,
                                              int n_out, int k) {
    switch (m) {
        case 1: gemv_rows<1>(y, x, w, bias, has_bias, n_out, k); break;
        case 2: gemv_rows<2>(y, x, w, bias, has_bias, n_out, k); break;
        case 3: gemv_rows<3>(y, x, w, bias, has_bias, n_out, k); break;
        case 4: gemv_rows<4>(y, x, w, bias, has_bias, n_out, k); break;
        case 5: gemv_rows<5>(y, x, w, bias, has_bias, n_out, k); break;
        case 6: gemv_rows<6>(y, x, w, bias, has_bias, n_out, k); break;
        case 7: gemv_rows<7>(y, x, w, bias, has_bias, n_out, k); break;
        default: gemv_rows<8>(y, x, w, bias, has_bias, n_out, k); break;
    }
}

// Grid: ceil(n_out / GEMV_WARPS) blocks of 32 * GEMV_WARPS threads.
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_bf16(bf16* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
          const bf16* __restrict__ bias, int has_bias, int m, int n_out, int k) {
    gemv_dispatch(y, x, w, bias, has_bias, m, n_out, k);
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_bf16_acc_f32(float* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                  const bf16* __restrict__ bias, int has_bias, int m, int n_out, int k) {
    gemv_dispatch(y, x, w, bias, has_bias, m, n_out, k);
}
