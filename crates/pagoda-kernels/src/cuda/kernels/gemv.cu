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
//
// One kernel family, its fusions template parameters of gemv_warp (see
// cuda/gemv.rs):
// - up to three weights of one x (q, k, v) in one launch: the warps of the
//   grid are cut into segments, one per weight (gemv3_bf16);
// - OUT: y = product (rounded once), y += product (the f32 residual), or
//   the gated MLP's act(gate) * up of two weight rows (n and n_out + n of a
//   stacked [2 * n_out, K] gate_up weight), each rounded to bf16 first, as
//   linear then silu_mul round them (gemv_silu_bf16).
// A warp's sums are taken in the same order in every variant, so the fused
// products equal the unfused ones bit for bit.

#define GEMV_MAX_ROWS 8
#define GEMV_WARPS 8

#define GEMV_OUT_BF16 0
#define GEMV_OUT_ACC 1
#define GEMV_OUT_SILU 2

// acc[r][m] = sum_c w[r][c] * x[m][c] over the warp's R weight rows and the
// M rows of x (row stride k), warp-reduced (every lane holds the sums).
template <int M, int R>
__device__ __forceinline__ void gemv_dot(float (&acc)[R][M], const bf16* const (&w)[R],
                                         const bf16* x, int k) {
    int lane = threadIdx.x & 31;
    int chunks = k >> 3;
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int m = 0; m < M; m++) {
            acc[r][m] = 0.0f;
        }
    }
    int c = lane;
    // Two weight chunks of each row in flight per lane.
    for (; c + 32 < chunks; c += 64) {
        float fa[R][8], fb[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4* wr = reinterpret_cast<const uint4*>(w[r]);
            bf16x8_to_f32(__ldg(wr + c), fa[r]);
            bf16x8_to_f32(__ldg(wr + c + 32), fb[r]);
        }
#pragma unroll
        for (int m = 0; m < M; m++) {
            const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)m * k);
            float xa[8], xb[8];
            bf16x8_to_f32(__ldg(xr + c), xa);
            bf16x8_to_f32(__ldg(xr + c + 32), xb);
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    acc[r][m] = fmaf(fa[r][i], xa[i], acc[r][m]);
                    acc[r][m] = fmaf(fb[r][i], xb[i], acc[r][m]);
                }
            }
        }
    }
    for (; c < chunks; c += 32) {
        float fa[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) {
            bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(w[r]) + c), fa[r]);
        }
#pragma unroll
        for (int m = 0; m < M; m++) {
            const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)m * k);
            float xa[8];
            bf16x8_to_f32(__ldg(xr + c), xa);
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    acc[r][m] = fmaf(fa[r][i], xa[i], acc[r][m]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int m = 0; m < M; m++) {
            acc[r][m] = warp_sum(acc[r][m]);
        }
    }
}

// Up to three products of one x: weight s has n[s] outputs (0: absent),
// writes y[s] and adds bias[s] where bit s of bias_mask is set.
struct GemvSegs {
    void* y[3];
    const bf16* w[3];
    const bf16* bias[3];
    int n[3];
    int bias_mask;
};

// One warp per output of the segments (OUT_BF16 / OUT_ACC) or per gated
// output pair (OUT_SILU: segment 0 only, n[0] outputs of a [2 * n[0], k]
// weight). x: M bf16 rows.
template <int M, int OUT>
__device__ __forceinline__ void gemv_warp(const GemvSegs& s, const bf16* x, int k) {
    int lane = threadIdx.x & 31;
    int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    // The segment of output n (selects, not indexing: s stays in registers).
    int seg = 0;
    if (n >= s.n[0]) {
        n -= s.n[0];
        seg = 1;
        if (n >= s.n[1]) {
            n -= s.n[1];
            seg = 2;
            if (n >= s.n[2]) {
                return;
            }
        }
    }
    const int n_out = seg == 0 ? s.n[0] : seg == 1 ? s.n[1] : s.n[2];
    const bf16* ws = seg == 0 ? s.w[0] : seg == 1 ? s.w[1] : s.w[2];
    void* ys = seg == 0 ? s.y[0] : seg == 1 ? s.y[1] : s.y[2];
    if constexpr (OUT == GEMV_OUT_SILU) {
        const bf16* const w[2] = {ws + (long long)n * k, ws + (long long)(n_out + n) * k};
        float acc[2][M];
        gemv_dot<M, 2>(acc, w, x, k);
        if (lane == 0) {
            bf16* y = static_cast<bf16*>(ys);
#pragma unroll
            for (int m = 0; m < M; m++) {
                float g = bf2f(f2bf(acc[0][m]));
                float u = bf2f(f2bf(acc[1][m]));
                y[(long long)m * n_out + n] = f2bf(gate_act<0>(g) * u);
            }
        }
    } else {
        const bf16* const w[1] = {ws + (long long)n * k};
        float acc[1][M];
        gemv_dot<M, 1>(acc, w, x, k);
        if (lane == 0) {
            const bf16* bs = seg == 0 ? s.bias[0] : seg == 1 ? s.bias[1] : s.bias[2];
            float b = (s.bias_mask >> seg) & 1 ? bf2f(bs[n]) : 0.0f;
#pragma unroll
            for (int m = 0; m < M; m++) {
                long long i = (long long)m * n_out + n;
                if constexpr (OUT == GEMV_OUT_ACC) {
                    store_gemv(static_cast<float*>(ys), i, acc[0][m] + b);
                } else {
                    store_gemv(static_cast<bf16*>(ys), i, acc[0][m] + b);
                }
            }
        }
    }
}

// The row-count dispatch (M <= GEMV_MAX_ROWS).
template <int OUT>
__device__ __forceinline__ void gemv_family(const GemvSegs& s, const bf16* x, int m, int k) {
#define GEMV_CASE(MM)                     \
    case MM:                              \
        gemv_warp<MM, OUT>(s, x, k);      \
        break;
    switch (m) {
        GEMV_CASE(1)
        GEMV_CASE(2)
        GEMV_CASE(3)
        GEMV_CASE(4)
        GEMV_CASE(5)
        GEMV_CASE(6)
        GEMV_CASE(7)
        default:
        GEMV_CASE(8)
    }
#undef GEMV_CASE
}

__device__ __forceinline__ GemvSegs gemv_one(void* y, const bf16* w, const bf16* bias,
                                             int has_bias, int n_out) {
    GemvSegs s;
    s.y[0] = y;
    s.w[0] = w;
    s.bias[0] = bias;
    s.n[0] = n_out;
    for (int i = 1; i < 3; i++) {
        s.y[i] = nullptr;
        s.w[i] = w;
        s.bias[i] = bias;
        s.n[i] = 0;
    }
    s.bias_mask = has_bias ? 1 : 0;
    return s;
}

__device__ __forceinline__ GemvSegs gemv_three(bf16* y0, bf16* y1, bf16* y2, const bf16* w0,
                                               const bf16* w1, const bf16* w2, const bf16* b0,
                                               const bf16* b1, const bf16* b2, int bias_mask,
                                               int n0, int n1, int n2) {
    GemvSegs s;
    s.y[0] = y0;
    s.y[1] = y1;
    s.y[2] = y2;
    s.w[0] = w0;
    s.w[1] = w1;
    s.w[2] = w2;
    s.bias[0] = b0;
    s.bias[1] = b1;
    s.bias[2] = b2;
    s.n[0] = n0;
    s.n[1] = n1;
    s.n[2] = n2;
    s.bias_mask = bias_mask;
    return s;
}

// Grid: ceil(outputs / GEMV_WARPS) blocks of 32 * GEMV_WARPS threads.
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_bf16(bf16* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
          const bf16* __restrict__ bias, int has_bias, int m, int n_out, int k) {
    PDL_ENTRY();
    gemv_family<GEMV_OUT_BF16>(gemv_one(y, w, bias, has_bias, n_out), x, m, k);
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_bf16_acc_f32(float* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                  const bf16* __restrict__ bias, int has_bias, int m, int n_out, int k) {
    PDL_ENTRY();
    gemv_family<GEMV_OUT_ACC>(gemv_one(y, w, bias, has_bias, n_out), x, m, k);
}

// q, k and v of one x in one launch (linear3).
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv3_bf16(bf16* y0, bf16* y1, bf16* y2, const bf16* __restrict__ x, const bf16* w0,
           const bf16* w1, const bf16* w2, const bf16* b0, const bf16* b1, const bf16* b2,
           int bias_mask, int m, int n0, int n1, int n2, int k) {
    PDL_ENTRY();
    gemv_family<GEMV_OUT_BF16>(
        gemv_three(y0, y1, y2, w0, w1, w2, b0, b1, b2, bias_mask, n0, n1, n2), x, m, k);
}

// silu_mul(linear(x, gate_up)) in one launch (gate_up_silu): y [m, n_inter],
// w [2 * n_inter, k]. At least 3 blocks an SM (the 8-row case's two weight
// rows a warp would take 92 registers and 2 blocks: a third fewer loads in
// flight on the largest product of a layer).
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, 3)
gemv_silu_bf16(bf16* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
               int m, int n_inter, int k) {
    PDL_ENTRY();
    gemv_family<GEMV_OUT_SILU>(gemv_one(y, w, w, 0, n_inter), x, m, k);
}
