// The decode-regime expert GEMMs ("stream" kernels): each touched expert's
// weights are read exactly once per step, at copy bandwidth, by blocks
// that hold all of the expert's slots (the launches are in
// cuda/moe_stream.rs). They take moe.cu's grouping (moe_group with 16-slot
// tiles) and are compiled after moe.cuh, whose weight types (MoeBf16,
// MoeFp8), epilogues and moe_load16 they share.
//
// Grid (E, ceil(N / BN)), MS_THREADS threads (8 warps): block (e, nb)
// finds expert e's tiles in meta (contiguous, ascending: one scan of
// meta[1 .. 1 + meta[0]] with shared atomics) and exits at once if it has
// none, so untouched experts cost almost nothing (see start-up below) and
// the grid depends only on E and N. Otherwise it streams MS_ROWS = 128 weight rows over all of K:
//   gate_up (MODE 0): BN 64 output columns, gate rows e*2N + n and up rows
//            e*2N + N + n; warp w owns columns 8w .. 8w + 7 of both;
//            out h[slot, n] = bf16(silu(g) * u);
//   down (MODE 1):    BN 128 output columns, rows e*N + n; warp w owns
//            columns 16w .. 16w + 15 (two n8 tiles);
//            out y[slot, n] = bf16(weight[pair] * acc);
// against the expert's slots held MS_MT m16 tiles (32 slots) at a time:
// an expert of at most 32 slots reads its weights once; one of more
// (rare in decode) takes a pass per 32 slots, each re-reading them.
//
// The K walk: stages of BK = 128 bytes of every weight row (128 FP8
// codes or 64 bf16 weights; one 128-byte line a row per stage, 16 KB a
// stage) plus the pass's activation rows over the same k range (bf16, 2 *
// BK bytes a row, only the rows the expert has), through a cp.async
// pipeline of MS_STAGES stages in dynamic shared memory. Each thread's
// share of a stage (a fixed chunk of fixed rows) is computed once: a full
// stage of 16-byte-aligned rows is that many plain 16-byte copies, rows
// past N and absent slots skipped (an mma's output row and column depend
// only on their own A row and B column, and those outputs are never
// stored); the K tail and unaligned rows take an out-of-line checked copy
// that zero-fills. MS_STAGES - 1 = 3 stages in flight: 48 KB
// of weights a block, 2 blocks an SM on sm_90 (96 KB of shared memory
// each for FP8, 80 KB for bf16): about 96 KB in flight an SM, over the
// ~25-30 KB that 3.35 TB/s x ~1 us of latency asks for.
//
// Start-up: the first pass's weight stages (which need only e and the
// column slice) are issued before the scan of meta and the slot lookups,
// so the weight stream starts while those two dependent round trips wait;
// the activation stages follow as one more group, waited for whole at the
// first k step. A block whose expert has no pair drops its prefetch (48 KB;
// only below ~64 rows are experts idle).
//
// Fragments: the product is computed transposed, D = W x A^T: the warp's
// two sets of 8 weight rows (gate and up; down's two column octets) are
// one m16 A tile and the slots are four n8 B tiles, so gate and up of an
// output meet in one thread (c0 / c2) and the shared epilogues apply.
// bf16 weights: A and B come from ldmatrix.x4 in the standard k order;
// both tiles' 16-byte chunk c of row r sits at c ^ (r & 7) (rows of 128
// bytes: ldmatrix reads 8 rows at one chunk a phase). FP8 weights, no
// ldmatrix: within each k32 block thread (g = lane / 4, t = lane % 4)
// takes the physical k 8t .. 8t + 7 of its rows (8 bytes of a code row,
// one 16-byte load of an activation row); its first mma consumes 8t .. 8t
// + 3 as the logical k {2t, 2t + 1, 2t + 8, 2t + 9} of the m16n8k16
// layout, the second 8t + 4 .. 8t + 7 likewise: the same permutation of k
// for A and B, so the dot products are unchanged, the codes widen in
// registers (cvt.rn.f16x2.e4m3x2, exact; then to bf16, exact: every E4M3
// value is a bf16 value) straight into fragment order and the activation
// loads are B fragments as loaded: no widened tile, no extra barrier, no
// register shuffles. The row scales apply in f32 in the shared epilogues,
// as on every other path. The FP8 tiles are swizzled for those loads: an
// activation row's (256 bytes) chunk c at c ^ 4 in odd rows (a quarter
// warp reads rows g, g + 1 at 64 bytes each), a code row's 32-byte unit u
// at u ^ (row & 3) (a half warp reads 4 rows at 32 bytes each).

#define MS_THREADS 256
#define MS_WARPS (MS_THREADS / 32)
#define MS_MT 2
#define MS_SLOTS (16 * MS_MT)
#define MS_ROWS 128
#define MS_ROW_BYTES 128
#define MS_STAGES 4

// Dynamic shared memory of one block: MS_STAGES weight stages then
// MS_STAGES activation stages (the launch passes the same figure).
template <typename W>
struct MsLayout {
    static constexpr int BK = W::FP8 ? MS_ROW_BYTES : MS_ROW_BYTES / 2;
    static constexpr int W_STAGE = MS_ROWS * MS_ROW_BYTES;
    static constexpr int A_ROW = 2 * BK;
    static constexpr int A_STAGE = MS_SLOTS * A_ROW;
    static constexpr int BYTES = MS_STAGES * (W_STAGE + A_STAGE);
};

// Byte offset of 16-byte chunk c of row r in an FP8 block's activation
// tile (rows of 256 bytes, read by 16-byte loads: a quarter warp reads rows
// g, g + 1 at 64 bytes each).
__device__ __forceinline__ int ms_fp8_act_chunk(int r, int c) { return (c ^ ((r & 1) << 2)) * 16; }

// Byte offset of 16-byte chunk c of row r in a bf16 block's weight or
// activation tile (rows of 128 bytes, read by ldmatrix: 8 rows at one
// chunk a phase).
__device__ __forceinline__ int ms_ldsm_chunk(int r, int c) { return (c ^ (r & 7)) * 16; }

// Byte offset of 16-byte chunk c of row r in a code tile (rows of 128 bytes).
__device__ __forceinline__ int ms_code_chunk(int r, int c) {
    return ((((c >> 1) ^ (r & 3)) << 1) | (c & 1)) * 16;
}

__device__ __forceinline__ uint4 ms_lds128(const unsigned char* p) {
    return *reinterpret_cast<const uint4*>(p);
}

// Four FP8 codes (lowest byte first) as two bf16x2: codes 0, 1 and 2, 3.
__device__ __forceinline__ void ms_widen4(unsigned w, unsigned& lo, unsigned& hi) {
    float f[4];
    fp8x4_to_f32(w, f);
    lo = moe_pack_bf16x2(f[0], f[1]);
    hi = moe_pack_bf16x2(f[2], f[3]);
}

// Weight row r0 + i * STEP of a block whose row r is column r % BN of set
// r / BN (sets n rows apart, rows k elements long), from row r0's start.
template <typename T, int STEP, int BN>
__device__ __forceinline__ const T* ms_w_src(const T* row0, int i, int n, int k) {
    return row0 + ((long long)((i * STEP) / BN) * n + (i * STEP) % BN) * k;
}

// The checked copies of one thread's share of a stage (the K tail, or
// rows that are not 16-byte aligned): element copies with zero fill, out
// of line so the plain path's registers stay free of them. Weight rows
// r0 + i * STEP (ms_w_src; bit i of mask: below N), i < PER.
template <typename T, int PER, int STEP, int BN, int DST_STEP>
__device__ __noinline__ void ms_load_w_checked(unsigned char* dst, const T* row0, unsigned mask,
                                               int n, int k, int kk, bool vec) {
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const T* src = (mask & (1u << i)) ? ms_w_src<T, STEP, BN>(row0, i, n, k) : nullptr;
        moe_load16(reinterpret_cast<T*>(dst + i * DST_STEP), src, kk, k, vec);
    }
}

// Activation rows r0 + i * STEP below `rows` (sources in rows_of, null for
// padding), i < PER.
template <int PER, int STEP, int DST_STEP>
__device__ __noinline__ void ms_load_a_checked(unsigned char* dst, const bf16* const* rows_of,
                                               int r0, int rows, int k, int kk, bool vec) {
#pragma unroll
    for (int i = 0; i < PER; i++) {
        if (r0 + i * STEP < rows) {
            moe_load16(reinterpret_cast<bf16*>(dst + i * DST_STEP), rows_of[r0 + i * STEP], kk,
                       k, vec);
        }
    }
}

template <typename W, int MODE>
__device__ __forceinline__ void moe_stream_impl(bf16* __restrict__ out, const bf16* __restrict__ a,
                                                const typename W::T* __restrict__ w,
                                                const float* __restrict__ w_scale,
                                                const int* __restrict__ meta,
                                                const int* __restrict__ slot_pair,
                                                const float* __restrict__ route_w, int top_k,
                                                int n, int k, int vec) {
    typedef typename W::T WT;
    typedef MsLayout<W> L;
    constexpr bool Q = W::FP8;
    constexpr int NSETS = MODE == 0 ? 2 : 1;
    constexpr int NT = 2 / NSETS;                  // n8 tiles of each set a warp owns
    constexpr int BN = MS_WARPS * 8 * NT;          // output columns of a block
    constexpr int BK = L::BK;
    constexpr int KB = BK / 32;                    // k32 blocks a stage
    constexpr int W_CPR = MS_ROW_BYTES / 16;       // 16-byte chunks a weight row and stage
    constexpr int A_CPR = L::A_ROW / 16;           // and an activation row
    constexpr int W_ELEMS = 16 / (int)sizeof(WT);  // weights a chunk
    static_assert(NSETS * BN == MS_ROWS, "a block streams MS_ROWS weight rows");

    extern __shared__ __align__(16) unsigned char ms_smem[];
    unsigned char* s_w = ms_smem;
    unsigned char* s_a = ms_smem + MS_STAGES * L::W_STAGE;
    __shared__ const bf16* a_rows[MS_SLOTS];
    __shared__ int s_first, s_last;

    const int e = blockIdx.x;
    const int n0 = blockIdx.y * BN;
    const int tid = threadIdx.x;
    const bool vec_a = vec != 0;
    const bool vec_w = vec_a && (!Q || k % 16 == 0);  // 16-byte code copies
    const int k_tiles = (k + BK - 1) / BK;
    if (tid == 0) {
        s_first = 0x7fffffff;
        s_last = -1;
    }

    // This thread's share of every weight stage, fixed for the block: chunk
    // wch of rows r0 + i * W_STEP. Row r of the block is column n0 + r % BN
    // of set r / BN, so its source is row0 (row r0's) plus a constant
    // offset, bit i of wmask says whether its column is below N, and its
    // place in a stage is dst0 plus i * W_STEP rows (W_STEP keeps the
    // swizzle's row bits).
    constexpr int W_STEP = MS_THREADS / W_CPR;
    constexpr int W_PER = MS_ROWS / W_STEP;
    static_assert(BN % W_STEP == 0 && W_STEP % 8 == 0, "rows of a thread share a swizzle");
    const int wch = tid % W_CPR;
    const int r0 = tid / W_CPR;
    const WT* row0 = w + ((long long)e * NSETS * n + n0 + r0) * k;
    const int wdst0 = r0 * MS_ROW_BYTES + (Q ? ms_code_chunk(r0, wch) : ms_ldsm_chunk(r0, wch));
    unsigned wmask = 0;
#pragma unroll
    for (int i = 0; i < W_PER; i++) {
        wmask |= (n0 + r0 + (i * W_STEP) % BN < n ? 1u : 0u) << i;
    }
    // A full stage of 16-byte-aligned rows is plain copies; rows past N are
    // skipped (their columns are never stored, and an mma's output column
    // depends on its own B column only). The K tail and unaligned rows
    // take the checked element path, which zero-fills.
    auto load_w = [&](int stage, int k0) {
        unsigned char* sw = s_w + stage * L::W_STAGE + wdst0;
        if (vec_w && k0 + BK <= k) {
            const unsigned dst = pf_smem_addr(sw);
#pragma unroll
            for (int i = 0; i < W_PER; i++) {
                if (wmask & (1u << i)) {
                    const WT* src = ms_w_src<WT, W_STEP, BN>(row0, i, n, k);
                    pf_cp_async16(dst + i * W_STEP * MS_ROW_BYTES, src + k0 + wch * W_ELEMS);
                }
            }
        } else {
            ms_load_w_checked<WT, W_PER, W_STEP, BN, W_STEP * MS_ROW_BYTES>(
                sw, row0, wmask, n, k, k0 + wch * W_ELEMS, vec_w);
        }
    };
    // The first pass's weight stages go out before the expert's slots are
    // known (they need only e and n0), so the stream starts while the scan
    // below and the slot lookups wait on their loads: groups 0 .. S - 2,
    // one stage each. A block whose expert has no pair drops them (48 KB,
    // only while some experts are idle, i.e. below ~64 rows).
#pragma unroll
    for (int st = 0; st < MS_STAGES - 1; st++) {
        if (st < k_tiles) {
            load_w(st, st * BK);
        }
        pf_cp_async_commit();
    }
    __syncthreads();  // s_first, s_last
    const int tiles = meta[0];
    for (int t = tid; t < tiles; t += MS_THREADS) {
        if (meta[1 + t] == e) {
            atomicMin(&s_first, t);
            atomicMax(&s_last, t);
        }
    }
    __syncthreads();
    const int first = s_first, last = s_last;
    if (last < 0) {
        moe_cp_async_wait<0>();
        return;  // the expert has no pair: nothing else of its weights is read
    }

    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;
    const int t4 = lane & 3;
    const long long wrow0 = (long long)e * NSETS * n;  // the expert's first weight row

    for (int p0 = first; p0 <= last; p0 += MS_MT) {
        const int mt = min(MS_MT, last + 1 - p0);  // m16 tiles this pass (uniform)
        const long long slot0 = (long long)p0 * 16;
        const bool first_pass = p0 == first;
        for (int r = tid; r < MS_SLOTS; r += MS_THREADS) {
            const bf16* row = nullptr;
            if (r < mt * 16) {
                const int p = slot_pair[slot0 + r];
                if (p >= 0) {
                    row = MODE == 0 ? a + (long long)(p / top_k) * k : a + (slot0 + r) * k;
                }
            }
            a_rows[r] = row;
        }
        __syncthreads();

        // This thread's share of the pass's activation stages: chunk ach of
        // rows ar0 + i * A_STEP (A_STEP keeps the swizzle's row bit); absent
        // rows (past the pass's tiles, or padding) are skipped on the plain
        // path: their accumulator rows are never stored.
        constexpr int A_STEP = MS_THREADS / A_CPR;
        constexpr int A_PER = MS_SLOTS / A_STEP;
        static_assert(A_STEP % (Q ? 2 : 8) == 0, "rows of a thread share a swizzle");
        const int ach = tid % A_CPR;
        const int ar0 = tid / A_CPR;
        const int adst0 =
            ar0 * L::A_ROW + (Q ? ms_fp8_act_chunk(ar0, ach) : ms_ldsm_chunk(ar0, ach));
        auto load_a = [&](int stage, int k0) {
            unsigned char* sa = s_a + stage * L::A_STAGE + adst0;
            if (vec_a && k0 + BK <= k) {
                const unsigned dst = pf_smem_addr(sa);
#pragma unroll
                for (int i = 0; i < A_PER; i++) {
                    if (ar0 + i * A_STEP < mt * 16) {
                        const bf16* row = a_rows[ar0 + i * A_STEP];
                        if (row != nullptr) {
                            pf_cp_async16(dst + i * A_STEP * L::A_ROW, row + k0 + ach * 8);
                        }
                    }
                }
            } else {
                ms_load_a_checked<A_PER, A_STEP, A_STEP * L::A_ROW>(sa, a_rows, ar0, mt * 16, k,
                                                                    k0 + ach * 8, vec_a);
            }
        };
        // Prologue: the first pass adds its activation stages as one more
        // group (waited for whole at kt 0); a later pass loads weights and
        // activations stage by stage.
        if (first_pass) {
#pragma unroll
            for (int st = 0; st < MS_STAGES - 1; st++) {
                if (st < k_tiles) {
                    load_a(st, st * BK);
                }
            }
            pf_cp_async_commit();
        } else {
#pragma unroll
            for (int st = 0; st < MS_STAGES - 1; st++) {
                if (st < k_tiles) {
                    load_w(st, st * BK);
                    load_a(st, st * BK);
                }
                pf_cp_async_commit();
            }
        }

        // acc[n8 tile of slots]: rows g of the m16 tile are the warp's first
        // 8 weight rows (gate, or down's first 8 columns), rows g + 8 its
        // other 8 (up, or down's next 8).
        float acc[MS_SLOTS / 8][4];
#pragma unroll
        for (int j = 0; j < MS_SLOTS / 8; j++)
            acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        // The warp's two sets of weight rows (block rows r_lo + i, r_hi + i).
        const int r_lo = MODE == 0 ? warp * 8 : warp * 16;
        const int r_hi = MODE == 0 ? BN + warp * 8 : warp * 16 + 8;
        // bf16 ldmatrix rows: lane i supplies row i % 8 of matrix i / 8.
        const int lq = lane & 7, lm = lane >> 3;
        // A: (lo, hi) x (chunk, chunk + 1); B: (tile, tile + 1) x (chunk, chunk + 1).
        const int a_row = ((lm & 1) ? r_hi : r_lo) + lq;
        const int b_row = (lm >> 1) * 8 + lq;

        for (int kt = 0; kt < k_tiles; kt++) {
            // Stage kt landed (the first pass's kt 0 waits for its whole
            // prologue: the activation stages are its last group).
            if (first_pass && kt == 0) {
                moe_cp_async_wait<0>();
            } else {
                moe_cp_async_wait<MS_STAGES - 2>();
            }
            __syncthreads();  // and every warp is done with the stage reloaded below
            const int nk = kt + MS_STAGES - 1;
            if (nk < k_tiles) {
                load_w(nk % MS_STAGES, nk * BK);
                load_a(nk % MS_STAGES, nk * BK);
            }
            pf_cp_async_commit();
            const unsigned char* sw = s_w + (kt % MS_STAGES) * L::W_STAGE;
            const unsigned char* sa = s_a + (kt % MS_STAGES) * L::A_STAGE;
            if constexpr (Q) {
#pragma unroll
                for (int kb = 0; kb < KB; kb++) {
                    // A: the two weight rows' codes at physical k 8t .. 8t + 7,
                    // widened straight into fragment order; B: slot row g of
                    // each n8 tile over the same k.
                    const int rl = r_lo + g, rh = r_hi + g;
                    const uint2 ql = *reinterpret_cast<const uint2*>(
                        sw + rl * MS_ROW_BYTES + ((kb ^ (rl & 3)) << 5) + 8 * t4);
                    const uint2 qh = *reinterpret_cast<const uint2*>(
                        sw + rh * MS_ROW_BYTES + ((kb ^ (rh & 3)) << 5) + 8 * t4);
                    unsigned lo[4], hi[4];
                    ms_widen4(ql.x, lo[0], lo[1]);
                    ms_widen4(ql.y, lo[2], lo[3]);
                    ms_widen4(qh.x, hi[0], hi[1]);
                    ms_widen4(qh.y, hi[2], hi[3]);
                    const unsigned a1[4] = {lo[0], hi[0], lo[1], hi[1]};
                    const unsigned a2[4] = {lo[2], hi[2], lo[3], hi[3]};
#pragma unroll
                    for (int j = 0; j < MS_SLOTS / 8; j++) {
                        if (j < 2 * mt) {
                            const int r = j * 8 + g;
                            const uint4 b =
                                ms_lds128(sa + r * L::A_ROW + ms_fp8_act_chunk(r, 4 * kb + t4));
                            pf_mma(acc[j], a1, b.x, b.y);
                            pf_mma(acc[j], a2, b.z, b.w);
                        }
                    }
                }
            } else {
                // Standard k order: each k16 step's A (16 weight rows) and
                // B (two n8 tiles of slots) come from ldmatrix.
#pragma unroll
                for (int ks = 0; ks < BK / 16; ks++) {
                    const int c = 2 * ks + (lm >> 1);
                    unsigned af[4];
                    pf_ldsm_x4(pf_smem_addr(sw + a_row * MS_ROW_BYTES + ms_ldsm_chunk(a_row, c)),
                               af[0], af[1], af[2], af[3]);
#pragma unroll
                    for (int jp = 0; jp < MS_SLOTS / 16; jp++) {
                        if (jp < mt) {
                            const int r = jp * 16 + b_row;
                            const int cb = 2 * ks + (lm & 1);
                            unsigned bf[4];
                            pf_ldsm_x4(pf_smem_addr(sa + r * L::A_ROW + ms_ldsm_chunk(r, cb)),
                                       bf[0], bf[1], bf[2], bf[3]);
                            pf_mma(acc[2 * jp], af, bf[0], bf[1]);
                            pf_mma(acc[2 * jp + 1], af, bf[2], bf[3]);
                        }
                    }
                }
            }
        }
        moe_cp_async_wait<0>();

        // C fragments: c0, c1 at weight row g and slots 2t, 2t + 1 of n8
        // tile j; c2, c3 at weight row g + 8.
#pragma unroll
        for (int j = 0; j < MS_SLOTS / 8; j++) {
            if (j >= 2 * mt) {
                continue;
            }
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                const long long slot = slot0 + j * 8 + 2 * t4 + jj;
                const int p = slot_pair[slot];
                if (p < 0) {
                    continue;
                }
                bf16* orow = out + slot * n;
                if constexpr (MODE == 0) {
                    const int col = n0 + warp * 8 + g;
                    if (col < n) {
                        orow[col] = f2bf(moe_gate_up_val<W>(acc[j][jj], acc[j][2 + jj], w_scale,
                                                            wrow0 + col, wrow0 + n + col));
                    }
                } else {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int col = n0 + warp * 16 + g + 8 * h;
                        if (col < n) {
                            orow[col] = f2bf(moe_down_val<W>(acc[j][2 * h + jj], route_w[p],
                                                             w_scale, wrow0 + col));
                        }
                    }
                }
            }
        }
        __syncthreads();  // a_rows and the stages are free for the next pass
    }
}

// The two stream kernels of one weight type (name suffix SFX); the same
// arguments as the grouped GEMMs.
#define MOE_STREAM_KERNELS(W, SFX)                                                               \
    extern "C" __global__ void __launch_bounds__(MS_THREADS, 2)                                  \
        moe_stream_gate_up##SFX(MOE_GEMM_ARGS(W::T)) {                                          \
        PDL_ENTRY();                                                                             \
        moe_stream_impl<W, 0>(MOE_GEMM_PASS);                                                    \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MS_THREADS, 2)                                  \
        moe_stream_down##SFX(MOE_GEMM_ARGS(W::T)) {                                             \
        PDL_ENTRY();                                                                             \
        moe_stream_impl<W, 1>(MOE_GEMM_PASS);                                                    \
    }

MOE_STREAM_KERNELS(MoeBf16, )
MOE_STREAM_KERNELS(MoeFp8, _fp8)
