// Skinny products on tensor cores for steps of up to 16 rows:
// y[M, N] = x[M, K] @ w[N, K]^T (+ bias), M <= 16, K % 8 == 0, 16-byte
// aligned rows (the host checks; other shapes go elsewhere). Rounded once
// to bf16 (gemv_mma_bf16) or added into the f32 residual
// (gemv_mma_acc_f32), the bias added in f32 before either.
//
// One block of GMMA_WARPS warps owns 8 consecutive outputs (so even a
// 2048-wide o_proj spreads over 256 blocks) and splits K between its warps:
// warp i takes the 32-wide k-steps i, i + GMMA_WARPS, ... so the warps of a
// block read neighbouring 64-byte pieces of the same rows at once. Each
// k-step is two mma.sync m16n8k16 (bf16 in, f32 accumulate) with A = x
// (rows g and g + 8 of lane (g = lane / 4, q = lane % 4)) and B = w^T (the
// block's 8 rows): lane (g, q) loads 16 bytes of w row g and of x rows g,
// g + 8 at k = 32 s + 8 q, and their 4-byte halves serve as the fragments'
// k pairs. The dot product does not care in which order k is walked, and A
// and B use the same order: mma j takes the fragment's k pairs {2q, 2q + 1}
// from k = 32 s + 8 q + 4 j + {0, 1} and {2q + 8, 2q + 9} from + {2, 3}.
// So every load is 16 bytes and no shared memory is needed until the end,
// where the GMMA_WARPS partial 16 x 8 tiles are summed in a fixed order
// (the same result on every run). Rows >= M load zeros (no memory access);
// with M <= 8 the upper 8 rows are not even loaded (GMMA_BIG = false).
//
// The two numbers (Llama-3.1-8B, batch 1): a decode step reads the 16 GB of
// weights once, ~3.7 ms at 4.3 TB/s; FLOPs are 2 per weight per row, on
// tensor cores never the limit (the CUDA-core kernel of gemv.cu needs 2 M
// FMAs per weight, which at M = 16 is the FP32 peak). Each warp keeps
// GMMA_U k-steps (GMMA_U x 512 bytes of w) in flight; w is read with
// L1::no_allocate so L1 keeps x.

#define GMMA_WARPS 8
#define GMMA_U 4

__device__ __forceinline__ void gmma_mma(float* d, unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A streamed 16-byte weight load (read once: not kept in L1).
__device__ __forceinline__ uint4 gmma_ld_stream(const bf16* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Block `tile` of one product: outputs 8 tile .. 8 tile + 7.
template <bool BIG, typename Y>
__device__ __forceinline__ void gemv_mma_body(Y* __restrict__ y, const bf16* __restrict__ x,
                                              const bf16* __restrict__ w,
                                              const bf16* __restrict__ bias, int has_bias,
                                              int m, int n_out, int k, int tile) {
    __shared__ float part[GMMA_WARPS][16][8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, q = lane & 3;
    const int n0 = tile * 8;
    const bool w_ok = n0 + g < n_out;
    const bf16* wr = w + (long long)(w_ok ? n0 + g : 0) * k;
    const bool x0_ok = g < m;
    const bool x1_ok = BIG && g + 8 < m;
    const bf16* x0 = x + (long long)(x0_ok ? g : 0) * k;
    const bf16* x1 = x + (long long)(x1_ok ? g + 8 : 0) * k;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int steps = (k + 31) >> 5;
    for (int s0 = warp; s0 < steps; s0 += GMMA_WARPS * GMMA_U) {
        uint4 wv[GMMA_U], xa[GMMA_U], xb[GMMA_U];
#pragma unroll
        for (int u = 0; u < GMMA_U; u++) {
            const int kk = (s0 + u * GMMA_WARPS) * 32 + q * 8;
            const bool in = kk < k;
            wv[u] = in && w_ok ? gmma_ld_stream(wr + kk) : zero;
            xa[u] = in && x0_ok ? __ldg(reinterpret_cast<const uint4*>(x0 + kk)) : zero;
            xb[u] = BIG && in && x1_ok ? __ldg(reinterpret_cast<const uint4*>(x1 + kk)) : zero;
        }
#pragma unroll
        for (int u = 0; u < GMMA_U; u++) {
            gmma_mma(c, xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv[u].x, wv[u].y);
            gmma_mma(c, xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv[u].z, wv[u].w);
        }
    }
    // c[0..1]: rows g, outputs 2q, 2q + 1; c[2..3]: rows g + 8.
    part[warp][g][2 * q] = c[0];
    part[warp][g][2 * q + 1] = c[1];
    part[warp][g + 8][2 * q] = c[2];
    part[warp][g + 8][2 * q + 1] = c[3];
    __syncthreads();
    const int t = threadIdx.x;
    const int r = t >> 3, o = t & 7;
    const int n = n0 + o;
    if (t < 128 && r < m && n < n_out) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < GMMA_WARPS; i++) {
            acc += part[i][r][o];
        }
        if (has_bias) {
            acc += bf2f(bias[n]);
        }
        store_gemv(y, (long long)r * n_out + n, acc);
    }
}

// Grid: ceil(n_out / 8) blocks of 32 * GMMA_WARPS threads; m in 1..=16.
extern "C" __global__ void __launch_bounds__(GMMA_WARPS * 32)
gemv_mma_bf16(bf16* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
              const bf16* __restrict__ bias, int has_bias, int m, int n_out, int k) {
    PDL_ENTRY();
    if (m > 8) {
        gemv_mma_body<true>(y, x, w, bias, has_bias, m, n_out, k, blockIdx.x);
    } else {
        gemv_mma_body<false>(y, x, w, bias, has_bias, m, n_out, k, blockIdx.x);
    }
}

extern "C" __global__ void __launch_bounds__(GMMA_WARPS * 32)
gemv_mma_acc_f32(float* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                 const bf16* __restrict__ bias, int has_bias, int m, int n_out, int k) {
    PDL_ENTRY();
    if (m > 8) {
        gemv_mma_body<true>(y, x, w, bias, has_bias, m, n_out, k, blockIdx.x);
    } else {
        gemv_mma_body<false>(y, x, w, bias, has_bias, m, n_out, k, blockIdx.x);
    }
}

// Three products of the same x in one launch (an attention layer's q, k and
// v projections): blocks 0 .. t0 - 1 are product 0's tiles, then product
// 1's, then product 2's (t_i = ceil(n_i / 8)); each block does exactly what
// gemv_mma_bf16 does for its tile, so the outputs have the same bits.
// Bit i of bias_mask says whether product i has a bias.
template <bool BIG>
__device__ __forceinline__ void gemv_mma3(bf16* y0, bf16* y1, bf16* y2, const bf16* x,
                                          const bf16* w0, const bf16* w1, const bf16* w2,
                                          const bf16* b0, const bf16* b1, const bf16* b2,
                                          int bias_mask, int m, int n0, int n1, int n2, int k) {
    const int t0 = (n0 + 7) >> 3, t1 = (n1 + 7) >> 3;
    const int t = blockIdx.x;
    if (t < t0) {
        gemv_mma_body<BIG>(y0, x, w0, b0, bias_mask & 1, m, n0, k, t);
    } else if (t < t0 + t1) {
        gemv_mma_body<BIG>(y1, x, w1, b1, bias_mask & 2, m, n1, k, t - t0);
    } else {
        gemv_mma_body<BIG>(y2, x, w2, b2, bias_mask & 4, m, n2, k, t - t0 - t1);
    }
}

// Grid: ceil(n0 / 8) + ceil(n1 / 8) + ceil(n2 / 8) blocks of 32 * GMMA_WARPS.
extern "C" __global__ void __launch_bounds__(GMMA_WARPS * 32)
gemv_mma3_bf16(bf16* y0, bf16* y1, bf16* y2, const bf16* __restrict__ x,
               const bf16* __restrict__ w0, const bf16* __restrict__ w1,
               const bf16* __restrict__ w2, const bf16* __restrict__ b0,
               const bf16* __restrict__ b1, const bf16* __restrict__ b2, int bias_mask, int m,
               int n0, int n1, int n2, int k) {
    PDL_ENTRY();
    if (m > 8) {
        gemv_mma3<true>(y0, y1, y2, x, w0, w1, w2, b0, b1, b2, bias_mask, m, n0, n1, n2, k);
    } else {
        gemv_mma3<false>(y0, y1, y2, x, w0, w1, w2, b0, b1, b2, bias_mask, m, n0, n1, n2, k);
    }
}
