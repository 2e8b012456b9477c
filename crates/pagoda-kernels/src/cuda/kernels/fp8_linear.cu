// FP8 linear layers: the per-token quantization of a bf16 activation before
// the FP8 GEMM (cuBLASLt, see fp8_linear.rs). One block per row: the row's
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
