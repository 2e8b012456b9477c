// FP8 linear layers: the per-token quantization of a bf16 activation before
// the FP8 GEMM (cuBLASLt, see fp8_linear.rs), and the rescaling epilogue of
// the unit-scaled GEMM (at the end of this file). Quantization, one block per row: the row's
// absolute maximum, its scale (amax / 448, 1 for an all-zero row) and the
// E4M3 codes of x / scale (f2fp8: round to nearest even, saturating), as
// fp8_matrix.rs's quantize_row does on the host, bit for bit. Rows whose
// width is a multiple of 8 and at most QFP8_THREADS * 8 * QFP8_VECS are read
// from global memory once (16-byte loads kept in registers); wider rows are
// read twice (the second pass mostly from L2).

#define QFP8_THREADS 256
#define QFP8_VECS 8

// Maximum of `v` over the block (QFP8_THREADS threads); every thread gets it.
__device__ __forceinline__ float qfp8_block_max(float v) {
    __shared__ float partial[QFP8_THREADS / 32];
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) {
        partial[warp] = v;
    }
    __syncthreads();
    float m = lane < QFP8_THREADS / 32 ? partial[lane] : 0.0f;
    return warp_max(m);
}

extern "C" __global__ void __launch_bounds__(QFP8_THREADS)
    quant_rows_fp8(fp8* __restrict__ q, float* __restrict__ scales, const bf16* __restrict__ x,
                   int cols) {
    PDL_ENTRY();
    const long long base = (long long)blockIdx.x * cols;
    const bf16* xr = x + base;
    fp8* qr = q + base;
    const bool vec = (cols % 8) == 0 && cols <= QFP8_THREADS * 8 * QFP8_VECS;
    const int nv = cols / 8;
    uint4 regs[QFP8_VECS];
    float amax = 0.0f;
    if (vec) {
        const uint4* xv = (const uint4*)xr;
#pragma unroll
        for (int i = 0; i < QFP8_VECS; ++i) {
            int v = threadIdx.x + i * QFP8_THREADS;
            if (v < nv) {
                regs[i] = xv[v];
                const bf16* e = (const bf16*)&regs[i];
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    amax = fmaxf(amax, fabsf(bf2f(e[j])));
                }
            }
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += QFP8_THREADS) {
            amax = fmaxf(amax, fabsf(bf2f(xr[c])));
        }
    }
    amax = qfp8_block_max(amax);
    // isfinite(amax) && amax > 0, as scale_for_amax on the host.
    const float s = (amax > 0.0f && amax <= 3.402823466e38f) ? amax / 448.0f : 1.0f;
    if (threadIdx.x == 0) {
        scales[blockIdx.x] = s;
    }
    if (vec) {
        uint2* qv = (uint2*)qr;
#pragma unroll
        for (int i = 0; i < QFP8_VECS; ++i) {
            int v = threadIdx.x + i * QFP8_THREADS;
            if (v < nv) {
                const bf16* e = (const bf16*)&regs[i];
                unsigned int lo = 0, hi = 0;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    lo |= (unsigned int)f2fp8(bf2f(e[j]) / s) << (8 * j);
                    hi |= (unsigned int)f2fp8(bf2f(e[j + 4]) / s) << (8 * j);
                }
                qv[v] = make_uint2(lo, hi);
            }
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += QFP8_THREADS) {
            qr[c] = f2fp8(bf2f(xr[c]) / s);
        }
    }
}

// The rescaling epilogue of the unit-scaled FP8 GEMM (fp8_linear.rs): rows
// row0 .. row0 + rows of y [_, cols] from the GEMM's raw f32 sums acc
// [rows, cols] (row-major), each product p = acc * (sx[row] * sw[col]) with
// the input's per-row and the weight's per-column scales (both products
// rounded once, no FMA contraction, so the host can replay it bit for bit).
// fp8_rescale_bf16: y = bf16(p + bias), rounded once; fp8_rescale_acc_f32:
// y = (y + p) + bias into the f32 residual, the order of the bf16 path's
// add_linear (GEMM with beta 1, then add_bias_f32). Each thread takes 4
// adjacent columns (cols a multiple of 4, every row 16-byte aligned) of the
// rows blockIdx.y, blockIdx.y + gridDim.y, ...

#define FP8_RESCALE_THREADS 256

template <bool ACC>
__device__ __forceinline__ void fp8_rescale_impl(void* y, const float* __restrict__ acc,
                                                 const float* __restrict__ sx,
                                                 const float* __restrict__ sw,
                                                 const bf16* __restrict__ bias, int has_bias,
                                                 int row0, int rows, int cols) {
    const int c = (blockIdx.x * FP8_RESCALE_THREADS + threadIdx.x) * 4;
    if (c >= cols) {
        return;
    }
    const float4 w = *(const float4*)(sw + c);
    const float ws[4] = {w.x, w.y, w.z, w.w};
    float b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (has_bias) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            b[j] = bf2f(bias[c + j]);
        }
    }
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const float s = sx[row0 + r];
        const float4 a4 = *(const float4*)(acc + (long long)r * cols + c);
        const float a[4] = {a4.x, a4.y, a4.z, a4.w};
        float p[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            p[j] = __fmul_rn(a[j], __fmul_rn(s, ws[j]));
        }
        const long long o = (long long)(row0 + r) * cols + c;
        if (ACC) {
            float4* yp = (float4*)((float*)y + o);
            float4 v = *yp;
            float out[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                out[j] = __fadd_rn(out[j], p[j]);
                if (has_bias) {
                    out[j] = __fadd_rn(out[j], b[j]);
                }
            }
            *yp = make_float4(out[0], out[1], out[2], out[3]);
        } else {
            unsigned int h[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                h[j] = f2bf(has_bias ? __fadd_rn(p[j], b[j]) : p[j]);
            }
            *(uint2*)((bf16*)y + o) = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
        }
    }
}

extern "C" __global__ void __launch_bounds__(FP8_RESCALE_THREADS)
    fp8_rescale_bf16(bf16* y, const float* acc, const float* sx, const float* sw,
                     const bf16* bias, int has_bias, int row0, int rows, int cols) {
    PDL_ENTRY();
    fp8_rescale_impl<false>(y, acc, sx, sw, bias, has_bias, row0, rows, cols);
}

extern "C" __global__ void __launch_bounds__(FP8_RESCALE_THREADS)
    fp8_rescale_acc_f32(float* y, const float* acc, const float* sx, const float* sw,
                        const bf16* bias, int has_bias, int row0, int rows, int cols) {
    PDL_ENTRY();
    fp8_rescale_impl<true>(y, acc, sx, sw, bias, has_bias, row0, rows, cols);
}
