// Mixture-of-experts layers: routing, grouping by expert, the grouped expert
// GEMMs on tensor cores and the weighted combine (the launches and the host
// checks are in cuda/moe.rs).
//
// A "pair" is one (row, k) choice: pair q = row * top_k + k, expert ids[q],
// routing weight weights[q]. The pairs of one chunk of rows are grouped by
// expert into "slots": expert e owns slots off[e] .. off[e] + padded[e],
// padded[e] = its pair count rounded up to the GEMM tile height BM, so every
// BM-slot tile belongs to one expert. Padding slots hold pair -1.
//
// moe_route_{bf16,f32}: one warp per row. Softmax over the row's E logits in
// f32 (max, then the sum of expf(l - max), warp sums in a fixed order), then
// top_k passes: each picks the largest probability strictly after the
// previous pick in the order (probability descending, index ascending), so
// ties go to the lower index and no list of picks is kept; a NaN
// probability ranks below every number (it is still a valid id). With
// renormalize the picked weights are divided by their sum. Rows of at most
// 32 * MR_CACHE experts keep each lane's probabilities in registers between
// the passes (computed once); wider rows recompute them per pass.
//
// moe_group: one block of MG_THREADS. Counts pairs per expert (shared
// atomics), an exclusive scan of the padded counts (one warp), the expert of
// every tile and the -1 of every padding slot, then the scatter: each pair
// takes the next free slot of its expert from a shared atomic counter, so
// expert e's pairs fill its first count[e] slots (real slots lead each
// tile) in an order that may differ between runs; no output depends on it
// (every slot's GEMM row is computed alone and the combine sums a row's
// pairs in k order). Output: meta = [tile count, expert of tile 0, 1, ...],
// slot_pair[slot] = q or -1, pair_slot[q] = slot, or -1 for an id outside
// 0..E (never computed; the host refuses such routes before).
//
// moe_gemm_*: the grouped GEMM, grid (max_tiles, ceil(N / BN)); blocks past
// meta[0] exit at once, so the grid depends only on the chunk's rows. Block
// (t, nb) computes the BM slots of tile t against output columns nb*BN..:
//   gate_up: A row = x[pair / top_k], B = expert e's gate rows e*2N + n and
//            up rows e*2N + N + n, out h[slot, n] = bf16(silu(g) * u);
//   down:    A row = h[slot], B = rows e*N + n of down, out
//            y[slot, n] = bf16(weight[pair] * acc).
// WM x WN warps, each MI x NI m16n8k16 tiles (bf16 in, f32 accumulate),
// BN 64, K walked 64 at a time (128 contiguous bytes of each weight row per
// stage) through a cp.async pipeline of 3 or 4 stages in dynamic shared
// memory (rows unpadded, 16-byte chunks XOR-swizzled: at most 96 KB a
// block, within sm_86/89's 99 KB; 16-byte copies where K % 8 == 0, element
// copies otherwise; zero past K). Only the tile's rows up to its last real slot are loaded, and
// 16-row fragments past it issue no ldmatrix or mma: a decode-sized step
// (a few pairs per expert) costs one pass over each touched expert's
// weights whatever the tile height. Fragment addressing as in
// attention_prefill.cu, whose pf_* helpers (ldmatrix, mma, cp.async) this
// file uses. Two shapes: BM 64 on 4 warps (1 x 4) while experts average
// fewer than 64 pairs, BM 128 on 8 warps (2 x 4) beyond.
//
// moe_combine_bf16: out[r, c] = bf16(sum over k, in k order, of y[slot of
// (r, k), c]) in f32; pairs without a slot add nothing. With add, the sum
// is added to out[r, c] in f32 (moe_experts_add: the residual stream) and
// rounded once; moe_gemv_down likewise.
//
// The GEMV path, for steps with few pairs (decode at small batch, where the
// grouped GEMM's tiles are mostly padding and a step is a pass over the
// chosen experts' weights). No grouping and no scratch but h:
//   moe_gemv_gate_up: grid (ceil(inter / MV_WARPS), pairs); warp j of pair q
//     streams expert ids[q]'s gate row j and up row j with 16-byte loads
//     (consecutive lanes, consecutive chunks: 512 contiguous bytes a warp
//     per load; 4 chunks of each row in flight per lane) against x[q / top_k]
//     (tiny, served from L1), f32 sums, one warp reduction each, and writes
//     h[q, j] = bf16(silu(g) * u);
//   moe_gemv_down: grid (ceil(hidden / MV_WARPS), rows); warp c of row r
//     takes the row's k pairs two at a time (both down rows streamed at
//     once), each dot down_e[c] . h[q] summed in f32 over the warp, and
//     writes out[r, c] = bf16(sum over k, in k order, of weight[q] * dot):
//     the combine is fused, deterministic and rounded once.
// An id outside 0..E adds nothing (h row of zeros, no term in the sum).
// Requires hidden % 8 == 0 and inter % 8 == 0 (16-byte rows; the host
// checks, and takes the grouped path otherwise).
//
// moe_ggemv_{gate_up,down}: the grouped GEMV, for steps with a few pairs
// per expert: moe_group's tiles of MV_BM slots (one expert each), grid
// (ceil(N / MV_WARPS), max_tiles), blocks past meta[0] exit. Warp n of tile
// t streams expert meta[1 + t]'s weight row(s) n once (16-byte loads, as
// above) against the MV_BM slots' activation rows (x[pair / top_k] or
// h[slot], from L1/L2), MV_BM f32 sums each, and writes
//   gate_up: h[slot, n] = bf16(silu(g) * u);
//   down:    y[slot, n] = bf16(weight[pair] * acc);
// then moe_combine_bf16 as in the grouped path. Padding slots write nothing.
//
// moe_sigmoid_gate_{bf16,f32}: a shared expert's gate (Qwen2-MoE),
// x[r, c] = bf16(x[r, c] * sigmoid(gate[r * gate_cols])) in f32;
// grid-stride over rows * cols.

#define MR_WARPS 4
#define MR_CACHE 8
#define MG_THREADS 1024
#define MOE_BN 64
#define MOE_BK 64

// Offset (bf16 elements) of 16-byte chunk `chunk` of row `r` of a GEMM tile
// in shared memory: rows are MOE_BK = 64 elements (128 bytes) with no
// padding, chunk c stored at c ^ (r % 8), so the 8 consecutive rows one
// ldmatrix matrix reads fall in distinct banks.
__device__ __forceinline__ int moe_sw(int r, int chunk) {
    return r * MOE_BK + ((chunk ^ (r & 7)) << 3);
}
#define MV_WARPS 8
#define MV_BM 8

// Waits until at most N committed cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void moe_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <typename T>
__device__ __forceinline__ void moe_route_row(const T* __restrict__ logits, int rows, int n_exp,
                                              int top_k, int renormalize, int* __restrict__ ids,
                                              float* __restrict__ weights) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * MR_WARPS + (threadIdx.x >> 5);
    if (row >= rows) {
        return;
    }
    const T* l = logits + (long long)row * n_exp;
    float m = NEG_INF;
    for (int e = lane; e < n_exp; e += 32) {
        m = fmaxf(m, ld(l, e));
    }
    m = warp_max(m);
    float s = 0.0f;
    for (int e = lane; e < n_exp; e += 32) {
        s += expf(ld(l, e) - m);
    }
    s = warp_sum(s);
    // The previous pick; every probability is at most 1, below 2.
    float prev_v = 2.0f;
    int prev_i = -1;
    float picked = 0.0f;
    int* row_ids = ids + (long long)row * top_k;
    float* row_w = weights + (long long)row * top_k;
    // Up to 32 * MR_CACHE experts, each lane keeps its probabilities in
    // registers across the top_k passes (computed once, the same values).
    const bool cached = n_exp <= 32 * MR_CACHE;
    float p[MR_CACHE];
#pragma unroll
    for (int j = 0; j < MR_CACHE; j++) {
        const int e = lane + 32 * j;
        float v = cached && e < n_exp ? expf(ld(l, e) - m) / s : -1.0f;
        p[j] = v != v ? -1.0f : v;
    }
    for (int t = 0; t < top_k; t++) {
        float best_v = -2.0f;
        int best_i = 0x7fffffff;
        if (cached) {
#pragma unroll
            for (int j = 0; j < MR_CACHE; j++) {
                const int e = lane + 32 * j;
                const float v = p[j];
                bool after = v < prev_v || (v == prev_v && e > prev_i);
                if (e < n_exp && after && (v > best_v || (v == best_v && e < best_i))) {
                    best_v = v;
                    best_i = e;
                }
            }
        } else {
            for (int e = lane; e < n_exp; e += 32) {
                float v = expf(ld(l, e) - m) / s;
                if (v != v) {
                    v = -1.0f;
                }
                bool after = v < prev_v || (v == prev_v && e > prev_i);
                if (after && (v > best_v || (v == best_v && e < best_i))) {
                    best_v = v;
                    best_i = e;
                }
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
            int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
            if (ov > best_v || (ov == best_v && oi < best_i)) {
                best_v = ov;
                best_i = oi;
            }
        }
        prev_v = best_v;
        prev_i = best_i;
        if (lane == 0) {
            // -1 stands for a NaN probability: keep it a NaN.
            float w = best_v < 0.0f ? __int_as_float(0x7fc00000) : best_v;
            row_ids[t] = best_i;
            row_w[t] = w;
            picked += w;
        }
    }
    if (lane == 0 && renormalize) {
        for (int t = 0; t < top_k; t++) {
            row_w[t] = row_w[t] / picked;
        }
    }
}

// Grid: ceil(rows / MR_WARPS) blocks of 32 * MR_WARPS threads.
extern "C" __global__ void __launch_bounds__(32 * MR_WARPS)
moe_route_bf16(const bf16* __restrict__ logits, int rows, int n_exp, int top_k, int renormalize,
               int* __restrict__ ids, float* __restrict__ weights) {
    moe_route_row(logits, rows, n_exp, top_k, renormalize, ids, weights);
}

extern "C" __global__ void __launch_bounds__(32 * MR_WARPS)
moe_route_f32(const float* __restrict__ logits, int rows, int n_exp, int top_k, int renormalize,
              int* __restrict__ ids, float* __restrict__ weights) {
    moe_route_row(logits, rows, n_exp, top_k, renormalize, ids, weights);
}

// One block of MG_THREADS; dynamic shared memory 2 * n_exp ints.
// meta holds 1 + max_tiles ints, slot_pair max_tiles * bm, pair_slot pairs.
extern "C" __global__ void __launch_bounds__(MG_THREADS)
moe_group(const int* __restrict__ ids, int pairs, int n_exp, int bm, int* __restrict__ meta,
          int* __restrict__ slot_pair, int* __restrict__ pair_slot) {
    extern __shared__ int mg_smem[];
    int* count = mg_smem;         // pairs per expert
    int* next = mg_smem + n_exp;  // next free slot of each expert
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    for (int i = tid; i < n_exp; i += MG_THREADS) {
        count[i] = 0;
    }
    __syncthreads();
    for (int q = tid; q < pairs; q += MG_THREADS) {
        int e = ids[q];
        if (e >= 0 && e < n_exp) {
            atomicAdd(&count[e], 1);
        }
    }
    __syncthreads();
    if (warp == 0) {
        // Exclusive scan of the padded counts: lane L owns a contiguous run.
        int per = (n_exp + 31) / 32;
        int lo = min(lane * per, n_exp), hi = min(lo + per, n_exp);
        int local = 0;
        for (int e = lo; e < hi; e++) {
            local += (count[e] + bm - 1) / bm * bm;
        }
        int incl = local;
        for (int o = 1; o < 32; o <<= 1) {
            int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) {
                incl += v;
            }
        }
        int off = incl - local;
        for (int e = lo; e < hi; e++) {
            next[e] = off;
            off += (count[e] + bm - 1) / bm * bm;
        }
        if (lane == 31) {
            meta[0] = incl / bm;
        }
    }
    __syncthreads();
    // Each expert's tiles and padding slots.
    for (int e = tid; e < n_exp; e += MG_THREADS) {
        int c = count[e];
        int padded = (c + bm - 1) / bm * bm;
        int first = next[e];
        for (int t = first / bm; t < (first + padded) / bm; t++) {
            meta[1 + t] = e;
        }
        for (int s = first + c; s < first + padded; s++) {
            slot_pair[s] = -1;
        }
    }
    __syncthreads();  // every read of next[] above is done
    // Scatter: expert e's pairs take its first count[e] slots, in the order
    // the shared atomics grant them (outputs do not depend on it).
    for (int q = tid; q < pairs; q += MG_THREADS) {
        int e = ids[q];
        if (e >= 0 && e < n_exp) {
            int s = atomicAdd(&next[e], 1);
            slot_pair[s] = q;
            pair_slot[q] = s;
        } else {
            pair_slot[q] = -1;
        }
    }
}

extern __shared__ __align__(16) unsigned char moe_dsmem[];

// The grouped GEMM of one (tile, column block); MODE 0 gate_up, 1 down.
// Rows of the tile past the last real slot are neither loaded nor
// multiplied (16-row fragments wholly past it are skipped); A rows of
// padding slots and B rows past n are not loaded (their shared rows hold
// stale values, which reach only outputs that are never stored: an mma's
// output row depends on its A row alone, its column on its B row alone).
// Elements past k are zero in both operands.
template <int BM, int WM, int WN, int STAGES, int MODE>
__device__ __forceinline__ void moe_gemm_tile(bf16* __restrict__ out, const bf16* __restrict__ a,
                                              const bf16* __restrict__ w,
                                              const int* __restrict__ meta,
                                              const int* __restrict__ slot_pair,
                                              const float* __restrict__ route_w, int top_k, int n,
                                              int k, int vec) {
    constexpr int THREADS = 32 * WM * WN;
    constexpr int NSETS = MODE == 0 ? 2 : 1;  // gate and up, or down
    constexpr int BROWS = NSETS * MOE_BN;
    constexpr int MI = BM / (16 * WM);
    constexpr int NI = MOE_BN / (8 * WN);
    constexpr int CPR = MOE_BK / 8;  // 16-byte chunks per tile row
    constexpr int A_STAGE = BM * MOE_BK;
    constexpr int B_STAGE = BROWS * MOE_BK;
    static_assert(BM <= THREADS, "one slot per thread");
    static_assert(MI >= 1 && NI % 2 == 0, "warp tiling");

    bf16* s_a = reinterpret_cast<bf16*>(moe_dsmem);  // [STAGES][BM * MOE_BK], swizzled
    bf16* s_b = s_a + STAGES * A_STAGE;              // [STAGES][BROWS * MOE_BK], swizzled
    __shared__ const bf16* a_rows[BM];
    __shared__ const bf16* b_rows[BROWS];
    __shared__ int s_pair[BM];
    __shared__ int s_hi;

    const int tile = blockIdx.x;
    if (tile >= meta[0]) {
        return;
    }
    const int expert = meta[1 + tile];
    const int n0 = blockIdx.y * MOE_BN;
    const int tid = threadIdx.x;
    const long long slot0 = (long long)tile * BM;
    if (tid == 0) {
        s_hi = 0;
    }
    __syncthreads();
    if (tid < BM) {
        int p = slot_pair[slot0 + tid];
        const bf16* row = nullptr;
        if (p >= 0) {
            row = MODE == 0 ? a + (long long)(p / top_k) * k : a + (slot0 + tid) * k;
            atomicMax(&s_hi, tid + 1);
        }
        a_rows[tid] = row;
        s_pair[tid] = p;
    }
    for (int r = tid; r < BROWS; r += THREADS) {
        int col = n0 + r % MOE_BN;
        const bf16* row = nullptr;
        if (col < n) {
            row = w + ((long long)expert * NSETS * n + (long long)(r / MOE_BN) * n + col) * k;
        }
        b_rows[r] = row;
    }
    __syncthreads();
    // Rows 0 .. hi of the tile hold every real slot.
    const int hi = s_hi;

    auto load = [&](int stage, int k0) {
        bf16* sa = s_a + stage * A_STAGE;
        bf16* sb = s_b + stage * B_STAGE;
        for (int c = tid; c < (hi + BROWS) * CPR; c += THREADS) {
            int r = c / CPR;
            int col = (c % CPR) * 8;
            const bf16* src = r < hi ? a_rows[r] : b_rows[r - hi];
            if (src == nullptr) {
                continue;
            }
            bf16* dst = r < hi ? &sa[moe_sw(r, c % CPR)] : &sb[moe_sw(r - hi, c % CPR)];
            int kk = k0 + col;
            if (vec) {
                if (kk < k) {
                    pf_cp_async16(pf_smem_addr(dst), src + kk);
                } else {
                    pf_zero16(dst);
                }
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    dst[i] = kk + i < k ? src[kk + i] : (bf16)0;
                }
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
    // This warp's first row; fragment mi is live while its rows reach below hi.
    const int wrow0 = wm * MI * 16;

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
        const bf16* sa = s_a + (kt % STAGES) * A_STAGE;
        const bf16* sb = s_b + (kt % STAGES) * B_STAGE;
#pragma unroll
        for (int ks = 0; ks < MOE_BK / 16; ks++) {
            unsigned af[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                if (wrow0 + mi * 16 < hi) {
                    int r = wrow0 + mi * 16 + a_r;
                    pf_ldsm_x4(pf_smem_addr(&sa[moe_sw(r, 2 * ks + (a_c >> 3))]), af[mi][0],
                               af[mi][1], af[mi][2], af[mi][3]);
                }
            }
#pragma unroll
            for (int s = 0; s < NSETS; s++) {
#pragma unroll
                for (int np = 0; np < NI / 2; np++) {
                    unsigned b0, b1, b2, b3;
                    int r = s * MOE_BN + (wn * NI + 2 * np) * 8 + b_r;
                    pf_ldsm_x4(pf_smem_addr(&sb[moe_sw(r, 2 * ks + (b_c >> 3))]), b0, b1, b2, b3);
#pragma unroll
                    for (int mi = 0; mi < MI; mi++) {
                        if (wrow0 + mi * 16 < hi) {
                            pf_mma(acc[s][mi][2 * np], af[mi], b0, b1);
                            pf_mma(acc[s][mi][2 * np + 1], af[mi], b2, b3);
                        }
                    }
                }
            }
        }
    }
    moe_cp_async_wait<0>();

    // C fragments: c0, c1 at (lane / 4, 2 (lane % 4) + 0..1), c2, c3 eight rows down.
    const int g = lane >> 2;
    const int c2 = 2 * (lane & 3);
    const bool pairs_ok = (n & 1) == 0;  // two outputs as one aligned 4-byte store
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
        if (wrow0 + mi * 16 >= hi) {
            continue;
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = wrow0 + mi * 16 + g + 8 * h;
            const int p = s_pair[r];
            if (p < 0) {
                continue;
            }
            const float scale = MODE == 1 ? route_w[p] : 1.0f;
            bf16* orow = out + (slot0 + r) * n;
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
                const int col = n0 + (wn * NI + ni) * 8 + c2;
                float v[2];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    if (MODE == 0) {
                        v[j] = silu(acc[0][mi][ni][2 * h + j]) * acc[NSETS - 1][mi][ni][2 * h + j];
                    } else {
                        v[j] = scale * acc[0][mi][ni][2 * h + j];
                    }
                }
                if (pairs_ok && col + 1 < n) {
                    *reinterpret_cast<unsigned*>(orow + col) = pf_pack_bf16x2(v[0], v[1]);
                } else {
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        if (col + j < n) {
                            orow[col + j] = f2bf(v[j]);
                        }
                    }
                }
            }
        }
    }
}

#define MOE_GEMM_ARGS                                                                            \
    bf16 *__restrict__ out, const bf16 *__restrict__ a, const bf16 *__restrict__ w,              \
        const int *__restrict__ meta, const int *__restrict__ slot_pair,                          \
        const float *__restrict__ route_w, int top_k, int n, int k, int vec
#define MOE_GEMM_PASS out, a, w, meta, slot_pair, route_w, top_k, n, k, vec

// The instances (tile height, warps M x N, stages; moe.rs's GEMM_SHAPES
// holds the same numbers): 64-slot tiles on 4 warps for decode-sized steps,
// where a step streams each touched expert's weights once and 128 bytes of
// every weight row per stage; 128-slot tiles on 8 warps for prefill-sized
// ones, where each weight tile feeds twice the rows.
extern "C" __global__ void __launch_bounds__(128) moe_gemm_gate_up_m64(MOE_GEMM_ARGS) {
    moe_gemm_tile<64, 1, 4, 4, 0>(MOE_GEMM_PASS);
}

extern "C" __global__ void __launch_bounds__(256) moe_gemm_gate_up_m128(MOE_GEMM_ARGS) {
    moe_gemm_tile<128, 2, 4, 3, 0>(MOE_GEMM_PASS);
}

extern "C" __global__ void __launch_bounds__(128) moe_gemm_down_m64(MOE_GEMM_ARGS) {
    moe_gemm_tile<64, 1, 4, 4, 1>(MOE_GEMM_PASS);
}

extern "C" __global__ void __launch_bounds__(256) moe_gemm_down_m128(MOE_GEMM_ARGS) {
    moe_gemm_tile<128, 2, 4, 4, 1>(MOE_GEMM_PASS);
}

// Grid-stride over rows * n output elements.
extern "C" __global__ void moe_combine_bf16(bf16* __restrict__ out, const bf16* __restrict__ y,
                                            const int* __restrict__ pair_slot, int rows,
                                            int top_k, int n, int add) {
    long long total = (long long)rows * n;
    GRID_STRIDE(i, total) {
        long long r = i / n;
        int c = (int)(i - r * n);
        float s = 0.0f;
        for (int j = 0; j < top_k; j++) {
            int slot = pair_slot[r * top_k + j];
            if (slot >= 0) {
                s += bf2f(y[(long long)slot * n + c]);
            }
        }
        out[i] = f2bf(add ? bf2f(out[i]) + s : s);
    }
}

// Two dot products over `chunks` 16-byte chunks: s0 += a0 . b0, s1 += a1 .
// b1 (lane's share; the caller reduces over the warp). a* are streamed
// once (weights), b* are reused by other warps (activations); SAME_B: b1 is
// b0 (read once).
template <bool SAME_B>
__device__ __forceinline__ void mv_dot2(const uint4* __restrict__ a0,
                                        const uint4* __restrict__ b0,
                                        const uint4* __restrict__ a1,
                                        const uint4* __restrict__ b1, int chunks, int lane,
                                        float& s0, float& s1) {
    int c = lane;
    for (; c + 96 < chunks; c += 128) {
        uint4 wa[4], wb[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            wa[u] = __ldcs(a0 + c + 32 * u);
            wb[u] = __ldcs(a1 + c + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float fa[8], fb[8], xa[8], xb[8];
            bf16x8_to_f32(wa[u], fa);
            bf16x8_to_f32(wb[u], fb);
            bf16x8_to_f32(__ldg(b0 + c + 32 * u), xa);
            if (!SAME_B) {
                bf16x8_to_f32(__ldg(b1 + c + 32 * u), xb);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                s0 = fmaf(fa[i], xa[i], s0);
                s1 = fmaf(fb[i], SAME_B ? xa[i] : xb[i], s1);
            }
        }
    }
    for (; c < chunks; c += 32) {
        float fa[8], fb[8], xa[8], xb[8];
        bf16x8_to_f32(__ldcs(a0 + c), fa);
        bf16x8_to_f32(__ldcs(a1 + c), fb);
        bf16x8_to_f32(__ldg(b0 + c), xa);
        if (!SAME_B) {
            bf16x8_to_f32(__ldg(b1 + c), xb);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s0 = fmaf(fa[i], xa[i], s0);
            s1 = fmaf(fb[i], SAME_B ? xa[i] : xb[i], s1);
        }
    }
}

// h [pairs, inter] (bf16); x [rows, hidden]; w the stacked gate_up.
extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)
moe_gemv_gate_up(bf16* __restrict__ h, const bf16* __restrict__ x, const bf16* __restrict__ w,
                 const int* __restrict__ ids, int top_k, int n_exp, int inter, int hidden) {
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const int q = blockIdx.y;
    if (j >= inter) {
        return;
    }
    const int e = ids[q];
    float g = 0.0f, u = 0.0f;
    if (e >= 0 && e < n_exp) {
        const bf16* gate = w + ((long long)e * 2 * inter + j) * hidden;
        const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)(q / top_k) * hidden);
        mv_dot2<true>(reinterpret_cast<const uint4*>(gate), xr,
                reinterpret_cast<const uint4*>(gate + (long long)inter * hidden), xr,
                hidden >> 3, lane, g, u);
        g = warp_sum(g);
        u = warp_sum(u);
    }
    if (lane == 0) {
        h[(long long)q * inter + j] = f2bf(silu(g) * u);
    }
}

// out [rows, hidden] (bf16); h [rows * top_k, inter]; w the stacked down.
extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)
moe_gemv_down(bf16* __restrict__ out, const bf16* __restrict__ h, const bf16* __restrict__ w,
              const int* __restrict__ ids, const float* __restrict__ route_w, int top_k,
              int n_exp, int hidden, int inter, int add) {
    const int lane = threadIdx.x & 31;
    const int c = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const int r = blockIdx.y;
    if (c >= hidden) {
        return;
    }
    const int chunks = inter >> 3;
    float total = 0.0f;
    for (int t = 0; t < top_k; t += 2) {
        // Pairs q0 and q1; past an odd top_k, q1 is q0 again (the same
        // addresses: no second stream) and its term is dropped.
        const bool two = t + 1 < top_k;
        const long long q0 = (long long)r * top_k + t;
        const long long q1 = two ? q0 + 1 : q0;
        const int e0 = ids[q0], e1 = ids[q1];
        const bool ok0 = e0 >= 0 && e0 < n_exp;
        const bool ok1 = two && e1 >= 0 && e1 < n_exp;
        // An id outside 0..E reads expert 0's row (in bounds) and adds nothing.
        const bf16* w0 = w + ((long long)(ok0 ? e0 : 0) * hidden + c) * inter;
        const bf16* w1 = two ? w + ((long long)(ok1 ? e1 : 0) * hidden + c) * inter : w0;
        float s0 = 0.0f, s1 = 0.0f;
        mv_dot2<false>(reinterpret_cast<const uint4*>(w0),
                reinterpret_cast<const uint4*>(h + q0 * inter),
                reinterpret_cast<const uint4*>(w1),
                reinterpret_cast<const uint4*>(h + q1 * inter), chunks, lane, s0, s1);
        s0 = warp_sum(s0);
        s1 = warp_sum(s1);
        if (ok0) {
            total += route_w[q0] * s0;
        }
        if (ok1) {
            total += route_w[q1] * s1;
        }
    }
    if (lane == 0) {
        const long long o = (long long)r * hidden + c;
        out[o] = f2bf(add ? bf2f(out[o]) + total : total);
    }
}

template <typename T>
__device__ __forceinline__ void moe_sigmoid_gate(bf16* __restrict__ x, const T* __restrict__ gate,
                                                 int rows, int cols, int gate_cols) {
    long long total = (long long)rows * cols;
    GRID_STRIDE(i, total) {
        long long r = i / cols;
        float g = ld(gate, r * gate_cols);
        float s = 1.0f / (1.0f + expf(-g));
        x[i] = f2bf(bf2f(x[i]) * s);
    }
}

extern "C" __global__ void moe_sigmoid_gate_bf16(bf16* __restrict__ x,
                                                 const bf16* __restrict__ gate, int rows,
                                                 int cols, int gate_cols) {
    moe_sigmoid_gate(x, gate, rows, cols, gate_cols);
}

extern "C" __global__ void moe_sigmoid_gate_f32(bf16* __restrict__ x,
                                                const float* __restrict__ gate, int rows,
                                                int cols, int gate_cols) {
    moe_sigmoid_gate(x, gate, rows, cols, gate_cols);
}

// Lane's share of the MV_BM dot products of weight rows w0 and w1 against
// the activation rows rows[s] (nullptr: skipped, sums 0).
__device__ __forceinline__ void mv_tile_dots(const uint4* __restrict__ w0,
                                             const uint4* __restrict__ w1,
                                             const bf16* const* rows, int chunks, int lane,
                                             float (&s0)[MV_BM], float (&s1)[MV_BM]) {
    for (int c = lane; c < chunks; c += 32) {
        float f0[8], f1[8];
        bf16x8_to_f32(__ldcs(w0 + c), f0);
        bf16x8_to_f32(__ldcs(w1 + c), f1);
#pragma unroll
        for (int s = 0; s < MV_BM; s++) {
            if (rows[s] == nullptr) {
                continue;
            }
            float a[8];
            bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(rows[s]) + c), a);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                s0[s] = fmaf(f0[i], a[i], s0[s]);
                s1[s] = fmaf(f1[i], a[i], s1[s]);
            }
        }
    }
}

// h [slots, inter]; x [rows, hidden]; w the stacked gate_up.
extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, 1)
moe_ggemv_gate_up(bf16* __restrict__ h, const bf16* __restrict__ x, const bf16* __restrict__ w,
                  const int* __restrict__ meta, const int* __restrict__ slot_pair, int top_k,
                  int inter, int hidden) {
    const int tile = blockIdx.y;
    if (tile >= meta[0]) {
        return;
    }
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (n >= inter) {
        return;
    }
    const int e = meta[1 + tile];
    const long long slot0 = (long long)tile * MV_BM;
    const bf16* rows[MV_BM];
#pragma unroll
    for (int s = 0; s < MV_BM; s++) {
        int p = slot_pair[slot0 + s];
        rows[s] = p >= 0 ? x + (long long)(p / top_k) * hidden : nullptr;
    }
    const bf16* gate = w + ((long long)e * 2 * inter + n) * hidden;
    float g[MV_BM], u[MV_BM];
#pragma unroll
    for (int s = 0; s < MV_BM; s++) {
        g[s] = u[s] = 0.0f;
    }
    mv_tile_dots(reinterpret_cast<const uint4*>(gate),
                 reinterpret_cast<const uint4*>(gate + (long long)inter * hidden), rows,
                 hidden >> 3, lane, g, u);
#pragma unroll
    for (int s = 0; s < MV_BM; s++) {
        if (rows[s] == nullptr) {
            continue;
        }
        float gs = warp_sum(g[s]);
        float us = warp_sum(u[s]);
        if (lane == 0) {
            h[(slot0 + s) * inter + n] = f2bf(silu(gs) * us);
        }
    }
}

// y [slots, hidden]; h [slots, inter]; w the stacked down.
extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, 1)
moe_ggemv_down(bf16* __restrict__ y, const bf16* __restrict__ h, const bf16* __restrict__ w,
               const int* __restrict__ meta, const int* __restrict__ slot_pair,
               const float* __restrict__ route_w, int hidden, int inter) {
    const int tile = blockIdx.y;
    if (tile >= meta[0]) {
        return;
    }
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (n >= hidden) {
        return;
    }
    const int e = meta[1 + tile];
    const long long slot0 = (long long)tile * MV_BM;
    const bf16* rows[MV_BM];
#pragma unroll
    for (int s = 0; s < MV_BM; s++) {
        rows[s] = slot_pair[slot0 + s] >= 0 ? h + (slot0 + s) * inter : nullptr;
    }
    const uint4* row = reinterpret_cast<const uint4*>(w + ((long long)e * hidden + n) * inter);
    float acc[MV_BM];
#pragma unroll
    for (int s = 0; s < MV_BM; s++) {
        acc[s] = 0.0f;
    }
    for (int c = lane; c < (inter >> 3); c += 32) {
        float f[8];
        bf16x8_to_f32(__ldcs(row + c), f);
#pragma unroll
        for (int s = 0; s < MV_BM; s++) {
            if (rows[s] == nullptr) {
                continue;
            }
            float a[8];
            bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(rows[s]) + c), a);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                acc[s] = fmaf(f[i], a[i], acc[s]);
            }
        }
    }
#pragma unroll
    for (int s = 0; s < MV_BM; s++) {
        if (rows[s] == nullptr) {
            continue;
        }
        float a = warp_sum(acc[s]);
        if (lane == 0) {
            y[(slot0 + s) * hidden + n] = f2bf(route_w[slot_pair[slot0 + s]] * a);
        }
    }
}
