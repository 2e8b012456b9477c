// The grouped expert GEMMs on tensor cores (the algorithm and the three
// tile shapes are in moe.cu's header; the launches in cuda/moe.rs). Compiled
// after moe.cuh.

// Shared memory of a grouped GEMM block: STAGES A tiles, the bf16 B tiles
// (one widened tile for FP8 weights) and the FP8 code tiles.
template <typename W, int BM, int BN, int STAGES, int MODE>
struct MoeGemmSmem {
    static constexpr bool Q = W::FP8;
    static constexpr int BROWS = (MODE == 0 ? 2 : 1) * BN;
    static constexpr int QLD = MOE_BK + 16;  // bytes per code tile row
    static constexpr int A = STAGES * BM * MOE_LD * 2;
    static constexpr int B = (Q ? 1 : STAGES) * BROWS * MOE_LD * 2;
    static constexpr int CODES = (Q ? STAGES : 1) * (Q ? BROWS * QLD : 16);
    static constexpr int BYTES = A + B + CODES;
};

// The grouped GEMM of one (column block, tile); MODE 0 gate_up, 1 down.
// FP8 weights: the code tiles go through the cp.async stages (32 bytes a
// row), and each k step widens its stage into one bf16 tile before the
// mma loop (one more barrier); everything from there on is shared. DYN:
// the tiles in dynamic shared memory (MoeGemmSmem::BYTES, which the launch
// passes), else static.
template <typename W, int BM, int BN, int WM, int WN, int STAGES, int MODE, bool DYN = false>
__device__ __forceinline__ void moe_gemm_tile(bf16* __restrict__ out, const bf16* __restrict__ a,
                                              const typename W::T* __restrict__ w,
                                              const float* __restrict__ w_scale,
                                              const int* __restrict__ meta,
                                              const int* __restrict__ slot_pair,
                                              const float* __restrict__ route_w, int top_k, int n,
                                              int k, int vec) {
    typedef typename W::T WT;
    constexpr bool Q = W::FP8;
    constexpr int NSETS = MODE == 0 ? 2 : 1;  // gate and up, or down
    constexpr int BROWS = NSETS * BN;
    constexpr int MI = BM / (16 * WM);
    constexpr int NI = BN / (8 * WN);
    constexpr int CPR = MOE_BK / 8;            // 16-byte chunks per bf16 tile row
    constexpr int QCPR = MOE_BK / 16;          // 16-byte chunks per code tile row
    constexpr int QLD = MOE_BK + 16;           // bytes per code tile row
    constexpr int BSTAGES = Q ? 1 : STAGES;    // bf16 weight tiles
    constexpr int QSTAGES = Q ? STAGES : 1;    // code tiles
    constexpr int THREADS = WM * WN * 32;
    typedef MoeGemmSmem<W, BM, BN, STAGES, MODE> L;
    static_assert(MI >= 1 && NI % 2 == 0, "warp tiling");

    bf16 (*s_a)[BM * MOE_LD];
    bf16 (*s_b)[BROWS * MOE_LD];
    unsigned char (*s_q)[Q ? BROWS * QLD : 16];
    if constexpr (DYN) {
        extern __shared__ __align__(16) unsigned char moe_gemm_smem[];
        s_a = reinterpret_cast<bf16 (*)[BM * MOE_LD]>(moe_gemm_smem);
        s_b = reinterpret_cast<bf16 (*)[BROWS * MOE_LD]>(moe_gemm_smem + L::A);
        s_q = reinterpret_cast<unsigned char (*)[Q ? BROWS * QLD : 16]>(moe_gemm_smem + L::A +
                                                                          L::B);
    } else {
        __shared__ __align__(16) bf16 st_a[STAGES][BM * MOE_LD];
        __shared__ __align__(16) bf16 st_b[BSTAGES][BROWS * MOE_LD];
        __shared__ __align__(16) unsigned char st_q[QSTAGES][Q ? BROWS * QLD : 16];
        s_a = st_a;
        s_b = st_b;
        s_q = st_q;
    }
    __shared__ const bf16* a_rows[BM];
    __shared__ const WT* b_rows[BROWS];

    const int tile = blockIdx.x;
    if (tile >= meta[0]) {
        return;
    }
    const int expert = meta[1 + tile];
    const int n0 = blockIdx.y * BN;
    const int tid = threadIdx.x;
    const long long slot0 = (long long)tile * BM;
    for (int r = tid; r < BM; r += THREADS) {
        int p = slot_pair[slot0 + r];
        const bf16* row = nullptr;
        if (p >= 0) {
            row = MODE == 0 ? a + (long long)(p / top_k) * k : a + (slot0 + r) * k;
        }
        a_rows[r] = row;
    }
    for (int r = tid; r < BROWS; r += THREADS) {
        int col = n0 + r % BN;
        const WT* row = nullptr;
        if (col < n) {
            row = w + ((long long)expert * NSETS * n + (long long)(r / BN) * n + col) * k;
        }
        b_rows[r] = row;
    }
    __syncthreads();

    // 16-byte code copies need k % 16 == 0.
    const bool vec_a = vec != 0;
    const bool vec_b = vec_a && (!Q || k % 16 == 0);
    auto load = [&](int stage, int k0) {
        for (int c = tid; c < BM * CPR; c += THREADS) {
            int r = c / CPR;
            int col = (c % CPR) * 8;
            moe_load16(&s_a[stage][r * MOE_LD + col], a_rows[r], k0 + col, k, vec_a);
        }
        if constexpr (Q) {
            for (int c = tid; c < BROWS * QCPR; c += THREADS) {
                int r = c / QCPR;
                int col = (c % QCPR) * 16;
                moe_load16(&s_q[stage][r * QLD + col], b_rows[r], k0 + col, k, vec_b);
            }
        } else {
            for (int c = tid; c < BROWS * CPR; c += THREADS) {
                int r = c / CPR;
                int col = (c % CPR) * 8;
                moe_load16(&s_b[stage][r * MOE_LD + col], b_rows[r], k0 + col, k, vec_b);
            }
        }
    };

    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp / WN;
    const int wn = warp % WN;
    float acc[NSETS][MI][NI][4];
#pragma unroll
    for (int s = 0; s < NSETS; s++)
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int j = 0; j < NI; j++)
                acc[s][i][j][0] = acc[s][i][j][1] = acc[s][i][j][2] = acc[s][i][j][3] = 0.0f;

    // A fragments: matrix i = lane / 8 covers rows 8 * (i % 2), cols 8 * (i / 2).
    const int a_r = (lane & 7) + 8 * ((lane >> 3) & 1);
    const int a_c = 8 * (lane >> 4);
    // B (rows are n, k contiguous): matrix i covers n 8 * (i / 2), k 8 * (i % 2).
    const int b_r = (lane & 7) + 8 * (lane >> 4);
    const int b_c = 8 * ((lane >> 3) & 1);

    const int k_tiles = (k + MOE_BK - 1) / MOE_BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < k_tiles) {
            load(s, s * MOE_BK);
        }
        pf_cp_async_commit();
    }
    for (int kt = 0; kt < k_tiles; kt++) {
        moe_cp_async_wait<STAGES - 2>();  // tile kt landed (later ones may pend)
        __syncthreads();  // and every warp is done with the stage reloaded below
        const int nk = kt + STAGES - 1;
        if (nk < k_tiles) {
            load(nk % STAGES, nk * MOE_BK);
        }
        pf_cp_async_commit();
        if constexpr (Q) {
            // Widen the stage's codes into the bf16 tile: 8 codes a thread
            // per step (every warp is past its previous mma loop).
            const unsigned char* q = s_q[kt % STAGES];
            for (int i = tid; i < BROWS * (MOE_BK / 8); i += THREADS) {
                int r = i / (MOE_BK / 8);
                int c = (i % (MOE_BK / 8)) * 8;
                uint2 v = *reinterpret_cast<const uint2*>(&q[r * QLD + c]);
                float f[8];
                W::to_f32(v, f);
                uint4 o;
                o.x = moe_pack_bf16x2(f[0], f[1]);
                o.y = moe_pack_bf16x2(f[2], f[3]);
                o.z = moe_pack_bf16x2(f[4], f[5]);
                o.w = moe_pack_bf16x2(f[6], f[7]);
                *reinterpret_cast<uint4*>(&s_b[0][r * MOE_LD + c]) = o;
            }
            __syncthreads();
        }
        const bf16* sa = s_a[kt % STAGES];
        const bf16* sb = s_b[Q ? 0 : kt % STAGES];
#pragma unroll
        for (int ks = 0; ks < MOE_BK / 16; ks++) {
            unsigned af[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                int r = (wm * MI + mi) * 16 + a_r;
                pf_ldsm_x4(pf_smem_addr(&sa[r * MOE_LD + ks * 16 + a_c]), af[mi][0], af[mi][1],
                           af[mi][2], af[mi][3]);
            }
#pragma unroll
            for (int s = 0; s < NSETS; s++) {
#pragma unroll
                for (int np = 0; np < NI / 2; np++) {
                    unsigned b0, b1, b2, b3;
                    int r = s * BN + (wn * NI + 2 * np) * 8 + b_r;
                    pf_ldsm_x4(pf_smem_addr(&sb[r * MOE_LD + ks * 16 + b_c]), b0, b1, b2, b3);
#pragma unroll
                    for (int mi = 0; mi < MI; mi++) {
                        pf_mma(acc[s][mi][2 * np], af[mi], b0, b1);
                        pf_mma(acc[s][mi][2 * np + 1], af[mi], b2, b3);
                    }
                }
            }
        }
    }

    // C fragments: c0, c1 at (lane / 4, 2 (lane % 4) + 0..1), c2, c3 eight rows down.
    const int g = lane >> 2;
    const int c2 = 2 * (lane & 3);
    const long long wrow0 = (long long)expert * NSETS * n;  // the expert's first weight row
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            long long slot = slot0 + (wm * MI + mi) * 16 + g + 8 * h;
            int p = slot_pair[slot];
            if (p < 0) {
                continue;
            }
            bf16* orow = out + slot * n;
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    int col = n0 + (wn * NI + ni) * 8 + c2 + j;
                    if (col < n) {
                        const float v0 = acc[0][mi][ni][2 * h + j];
                        float v;
                        if constexpr (MODE == 0) {
                            v = moe_gate_up_val<W>(v0, acc[NSETS - 1][mi][ni][2 * h + j], w_scale,
                                                   wrow0 + col, wrow0 + n + col);
                        } else {
                            v = moe_down_val<W>(v0, route_w[p], w_scale, wrow0 + col);
                        }
                        orow[col] = f2bf(v);
                    }
                }
            }
        }
    }
}

// The four GEMM kernels of one weight type (name suffix SFX). Stages: as
// many as 48 KB of static shared memory hold (FP8 stages are smaller; the
// widened tile is one more fixed buffer).
#define MOE_GEMM_KERNELS(W, SFX, S_GU64, S_GU16, S_DN64, S_DN16)                                  \
    extern "C" __global__ void __launch_bounds__(MOE_THREADS)                                   \
        moe_gemm_gate_up_m64##SFX(MOE_GEMM_ARGS(W::T)) {                                          \
        PDL_ENTRY();                                                                          \
        moe_gemm_tile<W, 64, 64, 2, 2, S_GU64, 0>(MOE_GEMM_PASS);                                 \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MOE_THREADS)                                   \
        moe_gemm_gate_up_m16##SFX(MOE_GEMM_ARGS(W::T)) {                                          \
        PDL_ENTRY();                                                                          \
        moe_gemm_tile<W, 16, 64, 1, 4, S_GU16, 0>(MOE_GEMM_PASS);                                 \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MOE_THREADS)                                   \
        moe_gemm_down_m64##SFX(MOE_GEMM_ARGS(W::T)) {                                             \
        PDL_ENTRY();                                                                          \
        moe_gemm_tile<W, 64, 64, 2, 2, S_DN64, 1>(MOE_GEMM_PASS);                                 \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MOE_THREADS)                                   \
        moe_gemm_down_m16##SFX(MOE_GEMM_ARGS(W::T)) {                                             \
        PDL_ENTRY();                                                                          \
        moe_gemm_tile<W, 16, 64, 1, 4, S_DN16, 1>(MOE_GEMM_PASS);                                 \
    }

MOE_GEMM_KERNELS(MoeBf16, , 3, 4, 4, 6)
MOE_GEMM_KERNELS(MoeFp8, _fp8, 3, 5, 5, 8)

// The prefill-sized tiles: BM 128, 128 weight rows, 8 warps, 4 stages in
// dynamic shared memory (MoeGemmSmem<W, 128, BN, 4, MODE>::BYTES, the
// figure cuda/moe.rs passes: 80 KB bf16, 74 KB FP8), two blocks an SM.
#define MOE_GEMM_M128_KERNELS(W, SFX)                                                            \
    extern "C" __global__ void __launch_bounds__(256, 2)                                        \
        moe_gemm_gate_up_m128##SFX(MOE_GEMM_ARGS(W::T)) {                                         \
        PDL_ENTRY();                                                                          \
        moe_gemm_tile<W, 128, 64, 4, 2, 4, 0, true>(MOE_GEMM_PASS);                               \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(256, 2)                                        \
        moe_gemm_down_m128##SFX(MOE_GEMM_ARGS(W::T)) {                                            \
        PDL_ENTRY();                                                                          \
        moe_gemm_tile<W, 128, 128, 4, 2, 4, 1, true>(MOE_GEMM_PASS);                              \
    }

MOE_GEMM_M128_KERNELS(MoeBf16, )
MOE_GEMM_M128_KERNELS(MoeFp8, _fp8)
