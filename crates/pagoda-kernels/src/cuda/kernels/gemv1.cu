// Batch-1 GEMVs (one x row): the decode step of a dense model at batch 1,
// where every product is a pass over its weight and the step's time is the
// weights' bytes over the bytes in flight. Same products, outputs and
// fusions as gemv.cu's family (which this unit follows: GemvSegs,
// gemv_stage_norm, the OUT_* codes), with three differences:
// - M = 1 only, so the kernel needs few registers (no switch over 8 row
//   counts sized for the largest): more warps resident per SM;
// - each lane keeps GEMV1_LOADS 16-byte weight chunks in flight (gemv.cu: 2),
//   so a warp has 4 KB outstanding (gemv.cu: 1 KB): at 3-4 blocks of 8 warps
//   per SM that is 96-128 KB in flight per SM, well over the ~30 KB an H100
//   needs to reach its bandwidth (gemv.cu: ~24 KB at 3 resident blocks);
// - split-K inside the block: `split` warps (1, 2, 4 or 8, from the host by
//   the output count) share one output, each summing every split-th
//   512-byte slice of the row, then one warp adds their partial sums in
//   order (shared memory), so short products (1,024 outputs) still fill
//   every SM;
// - the fused-norm kernels issue their first weight loads before staging
//   the normalized input, so the norm's reduction overlaps the weight reads.
// The sums are taken in another order than gemv.cu's (equal within f32
// rounding, not bit for bit). Requires K % 8 == 0 and 16-byte aligned rows.

#define GEMV1_LOADS 8

// acc[r] = sum_c w[r][c] * x[c] over this warp's share of the chunks
// (c = lane + 32 * (part + split * i)), warp-reduced. The first batch of
// weight chunks is loaded before `stage()` returns x (bf16, global or
// shared memory when SX).
template <int R, bool SX, typename Stage>
__device__ __forceinline__ void gemv1_dot(float (&acc)[R], const bf16* const (&w)[R],
                                          Stage stage, int k, int part, int split) {
    constexpr int U = GEMV1_LOADS / R;
    const int chunks = k >> 3;
    const int stride = 32 * split;
    int c = (threadIdx.x & 31) + 32 * part;
    uint4 wv[R][U];
#pragma unroll
    for (int r = 0; r < R; r++) {
        acc[r] = 0.0f;
    }
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int cu = c + u * stride;
#pragma unroll
        for (int r = 0; r < R; r++) {
            wv[r][u] = cu < chunks ? __ldg(reinterpret_cast<const uint4*>(w[r]) + cu) : zero;
        }
    }
    const uint4* xp = reinterpret_cast<const uint4*>(stage());
    while (true) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cu = c + u * stride;
            if (cu < chunks) {
                float xf[8];
                bf16x8_to_f32(ld_x<SX>(xp + cu), xf);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float wf[8];
                    bf16x8_to_f32(wv[r][u], wf);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        acc[r] = fmaf(wf[i], xf[i], acc[r]);
                    }
                }
            }
        }
        c += U * stride;
        if (c >= chunks) {
            break;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cu = c + u * stride;
#pragma unroll
            for (int r = 0; r < R; r++) {
                wv[r][u] = cu < chunks ? __ldg(reinterpret_cast<const uint4*>(w[r]) + cu) : zero;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        acc[r] = warp_sum(acc[r]);
    }
}

// One output (OUT_BF16 / OUT_ACC: of the segments) or one gated pair
// (OUT_SILU: segment 0, a [2 * n[0], k] weight) per `split` warps. Every
// thread of the block reaches the barriers (warps past the last output
// read no weights and write nothing).
template <int OUT, bool NORM>
__device__ __forceinline__ void gemv1_block(const GemvSegs& s, const bf16* x,
                                            const float* xres, const bf16* nw, float eps, int k,
                                            int split) {
    constexpr int R = OUT == GEMV_OUT_SILU ? 2 : 1;
    __shared__ float gemv1_part[GEMV_WARPS][R];
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int part = warp % split;
    int n = blockIdx.x * (GEMV_WARPS / split) + warp / split;
    int seg = 0;
    bool valid = true;
    if (n >= s.n[0]) {
        n -= s.n[0];
        seg = 1;
        if (n >= s.n[1]) {
            n -= s.n[1];
            seg = 2;
            if (n >= s.n[2]) {
                valid = false;
                n = 0;
                seg = 0;
            }
        }
    }
    const int n_out = seg == 0 ? s.n[0] : seg == 1 ? s.n[1] : s.n[2];
    const bf16* ws = seg == 0 ? s.w[0] : seg == 1 ? s.w[1] : s.w[2];
    const bf16* wr[R];
    wr[0] = ws + (long long)n * k;
    if constexpr (R == 2) {
        wr[R - 1] = ws + (long long)(n_out + n) * k;
    }
    // Warps past the last output read nothing (their width is 0) but
    // still stage the norm and meet the barriers.
    const int kw = valid ? k : 0;
    float acc[R];
    if constexpr (NORM) {
        gemv1_dot<R, true>(acc, wr, [&]() { return gemv_stage_norm<1>(xres, nw, eps, k); }, kw,
                           part, split);
    } else {
        gemv1_dot<R, false>(acc, wr, [&]() { return x; }, kw, part, split);
    }
    if (split > 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                gemv1_part[warp][r] = acc[r];
            }
        }
        __syncthreads();
        if (part == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                float t = gemv1_part[warp][r];
                for (int p = 1; p < split; p++) {
                    t += gemv1_part[warp + p][r];
                }
                acc[r] = t;
            }
        }
    }
    if (!valid || part != 0 || lane != 0) {
        return;
    }
    void* ys = seg == 0 ? s.y[0] : seg == 1 ? s.y[1] : s.y[2];
    if constexpr (OUT == GEMV_OUT_SILU) {
        float g = bf2f(f2bf(acc[0]));
        float u = bf2f(f2bf(acc[R - 1]));
        static_cast<bf16*>(ys)[n] = f2bf(gate_act<0>(g) * u);
    } else {
        const bf16* bs = seg == 0 ? s.bias[0] : seg == 1 ? s.bias[1] : s.bias[2];
        float b = (s.bias_mask >> seg) & 1 ? bf2f(bs[n]) : 0.0f;
        if constexpr (OUT == GEMV_OUT_ACC) {
            store_gemv(static_cast<float*>(ys), n, acc[0] + b);
        } else {
            store_gemv(static_cast<bf16*>(ys), n, acc[0] + b);
        }
    }
}

// Grid: ceil(outputs * split / GEMV_WARPS) blocks of 32 * GEMV_WARPS
// threads, split in {1, 2, 4, 8} (the norm kernels with k * 2 bytes of
// dynamic shared memory). The same arguments as gemv.cu's kernels of the
// same name without "1" (m is 1), plus split.
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv1_bf16(bf16* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
           const bf16* __restrict__ bias, int has_bias, int n_out, int k, int split) {
    PDL_ENTRY();
    gemv1_block<GEMV_OUT_BF16, false>(gemv_one(y, w, bias, has_bias, n_out), x, nullptr, nullptr,
                                      0.0f, k, split);
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv1_acc_f32(float* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
              const bf16* __restrict__ bias, int has_bias, int n_out, int k, int split) {
    PDL_ENTRY();
    gemv1_block<GEMV_OUT_ACC, false>(gemv_one(y, w, bias, has_bias, n_out), x, nullptr, nullptr,
                                     0.0f, k, split);
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv1_3_bf16(bf16* y0, bf16* y1, bf16* y2, const bf16* __restrict__ x, const bf16* w0,
             const bf16* w1, const bf16* w2, const bf16* b0, const bf16* b1, const bf16* b2,
             int bias_mask, int n0, int n1, int n2, int k, int split) {
    PDL_ENTRY();
    gemv1_block<GEMV_OUT_BF16, false>(
        gemv_three(y0, y1, y2, w0, w1, w2, b0, b1, b2, bias_mask, n0, n1, n2), x, nullptr,
        nullptr, 0.0f, k, split);
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv1_3_norm_bf16(bf16* y0, bf16* y1, bf16* y2, const float* __restrict__ xres,
                  const bf16* __restrict__ nw, float eps, const bf16* w0, const bf16* w1,
                  const bf16* w2, const bf16* b0, const bf16* b1, const bf16* b2, int bias_mask,
                  int n0, int n1, int n2, int k, int split) {
    PDL_ENTRY();
    gemv1_block<GEMV_OUT_BF16, true>(
        gemv_three(y0, y1, y2, w0, w1, w2, b0, b1, b2, bias_mask, n0, n1, n2), nullptr, xres, nw,
        eps, k, split);
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv1_norm_silu_bf16(bf16* __restrict__ y, const float* __restrict__ xres,
                     const bf16* __restrict__ nw, float eps, const bf16* __restrict__ w,
                     int n_inter, int k, int split) {
    PDL_ENTRY();
    gemv1_block<GEMV_OUT_SILU, true>(gemv_one(y, w, w, 0, n_inter), nullptr, xres, nw, eps, k,
                                     split);
}

// silu_mul(linear(x, gate_up)) in one launch (the gate/up product of an
// input already normalized): y [n_inter], w [2 * n_inter, k].
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv1_silu_bf16(bf16* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                int n_inter, int k, int split) {
    PDL_ENTRY();
    gemv1_block<GEMV_OUT_SILU, false>(gemv_one(y, w, w, 0, n_inter), x, nullptr, nullptr, 0.0f, k,
                                      split);
}
