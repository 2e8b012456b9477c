// Prefill attention over the paged KV cache with the query heads of one KV
// head packed into the rows of one block (FlashAttention-2 style: mma.sync
// on tensor cores, online softmax in registers, double-buffered K/V tiles).
//
// Semantics are exactly those of prefill_attention_bf16 (attention_prefill.cu)
// and paged_attention_bf16: query token j of sequence s (rows
// cu_seqlens_q[s]..cu_seqlens_q[s+1] of q/out) sees cache positions
// 0..=context_lens[s] + j (only the last `window` of them when window > 0),
// read through the sequence's block table; query head h reads kv head
// h / (num_heads / num_kv_heads); with softcap > 0 each scaled score x
// becomes softcap * tanh(x / softcap) before the softmax. Every key a query
// sees must already be in the cache (store_kv ran first).
//
// Packed rows: with G = num_heads / num_kv_heads, the G query heads of kv
// head kv of one sequence form q_len * G rows, row r being token r / G and
// head kv * G + r % G (the G heads of a token are adjacent in q and out, so
// packing costs nothing). A block owns BLOCK_M consecutive packed rows of one
// (sequence, kv head): grid (ceil(max_query_len * G / BLOCK_M), num_seqs,
// num_kv_heads), 4 warps, blockIdx.x reversed so the tiles with the most
// keys start first; tiles past a sequence's rows exit at once. K and V are
// read from the cache once per block for all G heads, and a block's rows
// span only BLOCK_M / G tokens, so the causal diagonal wastes little.
//
// Per block (see PfmShape): warp w owns packed rows 16 * MT * w ..+16 * MT
// (MT m16 tiles); the block walks key tiles of BLOCK_N keys, from the one
// holding its first row's first key (with a window, whole tiles before it
// are never read) to the one holding its last row's last key. Key tile t
// lives in stage (t - t0) % 2 of shared memory: tile t + 1 is fetched with
// cp.async (pfm_load_kv) while tile t is computed, one commit group per
// tile (always committed, possibly empty, so wait_group 1 is exact). Q is
// copied once (its own group, ahead of the first tile). S = Q K^T and
// O += P V use mma.sync m16n8k16 (bf16 in, f32 accumulate); Q's A fragments
// stay in registers at head_dim 64 and are re-read with ldmatrix per k-step
// otherwise (registers go to O's accumulators); P is re-packed from S's
// accumulators without leaving registers. Masks apply only on tiles that
// cross a warp's diagonal or window edge; warps whose rows see none of a
// tile's keys, or whose rows are all past the sequence, skip its math (never
// a barrier). O is normalized once at the end, staged as bf16 through the
// warp's own rows of the Q buffer and written with 16-byte stores; rows
// past the sequence are never written.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16; g = lane / 4, c = lane % 4):
//   A (16x16, row): a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B (16x8, col):  b0 (k 2c..2c+1, n g), b1 (k 2c+8..2c+9, n g)
//   C (16x8 f32):   c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
// ldmatrix.x4 gives lane L of matrix i the pair at row L/4, cols 2(L%4)..+1
// (with .trans: rows 2(L%4)..+1 of column L/4); lanes 8i..8i+7 address
// matrix i's rows. Lower column index goes to the lower 16 bits of a pair.
// Hence (the same addressing as attention_prefill.cu):
//   Q (A, row-major [row][dim]):   matrix i = rows 8 (i % 2), dims 8 (i / 2)
//   K (B = K^T, [key][dim]):       matrix i = keys 8 (i / 2), dims 8 (i % 2)
//                                  -> b0, b1 of key block 2np, then of 2np+1
//   V (B, [key][dim], .trans):     matrix i = keys 8 (i % 2), dims 8 (i / 2)
//                                  -> b0, b1 of dim block 2dp, then of 2dp+1
//   P (A from S's C fragments):    k-step j = S n-blocks 2j (a0, a1) and 2j+1 (a2, a3)
//
// Resources (bf16): dynamic shared memory (BLOCK_M + 4 BLOCK_N) rows of head_dim
// + PFM_PAD bf16 (PfmShape::SMEM_ROWS): 55,296 bytes at head_dim 64, 69,632
// at 128, 101,376 at 256; all past 48 KB, so the host raises each kernel's
// limit when it loads the module (attention_prefill_mma.rs). Registers
// (ptxas, sm_90, two blocks per SM by __launch_bounds__): 240 / 246 / 248
// at 64 / 128 / 256, no spills. Key tiles are 32 rows past head_dim 64:
// 64-key S accumulators next to O's (2 x 16 rows x 128 dims) spill at 128.
//
// The cache's element type is a template parameter (one kernel, two
// instantiations per head_dim). A bf16 cache's tiles are copied with
// cp.async straight into the double-buffered bf16 stages. An FP8 E4M3
// cache's tiles are copied with cp.async as raw bytes into two byte stages
// ([BN][HD] each for K and V; the fetch of tile t + 1 overlaps tile t's
// math just the same), and once tile t has landed pfm_widen_fp8 turns it
// into the one bf16 stage the mma reads (exact: every E4M3 value is a
// bf16; one more barrier per tile). Its scales are not applied per element:
// k_scale multiplies the scores' scale and v_scale the output's
// normalization. Shared memory over FP8: (BLOCK_M + 2 BLOCK_N) bf16 rows
// plus 4 BLOCK_N HD bytes, a little less than bf16's (53,248 / 68,608 /
// 100,352 bytes); registers (ptxas, sm_90) 246 / 243 / 255, no spills.

#define PFM_THREADS 128
#define PFM_WARPS 4
// Padding of each shared-memory row (bf16 elements): rows 16 bytes apart
// modulo 128, so the 8 row addresses of an ldmatrix hit distinct banks.
#define PFM_PAD 8

// Tile shapes per head_dim (the host mirrors BLOCK_M and SMEM_ROWS).
template <int HD>
struct PfmShape {
    static constexpr int MT = HD <= 128 ? 2 : 1;          // m16 tiles per warp
    static constexpr int WARP_M = 16 * MT;                // packed rows per warp
    static constexpr int BLOCK_M = PFM_WARPS * WARP_M;    // packed rows per block
    static constexpr int BLOCK_N = HD <= 64 ? 64 : 32;    // keys per tile
    static constexpr bool Q_IN_REGS = HD <= 64;
    static constexpr int LD = HD + PFM_PAD;               // shared row stride (elements)
    static constexpr int SMEM_ROWS = BLOCK_M + 4 * BLOCK_N;  // Q, then 2 x (K, V)
};

// Copies key rows n0..n0+BN-1 of one kv head (element offset head_off of
// each cache slot, slot_stride elements per slot) into s_k and s_v with
// cp.async (the caller commits and waits); rows at or past n_keys are
// zero-filled, so nothing unstored is ever read. A bf16 cache's rows land
// as the bf16 rows the mma reads (row stride HD + PFM_PAD); an FP8 E4M3
// cache's as raw bytes ([BN][HD], no padding), so the fetch of tile t + 1
// overlaps tile t's math as for bf16, and pfm_widen_fp8 turns a landed tile
// into bf16 rows. Each copy moves 16 bytes (8 bf16 or 16 FP8 elements):
// thread tid copies chunk tid % CPR of rows tid / CPR + i * (PFM_THREADS /
// CPR). `bs_shift` is log2(block_size) for a power-of-two block size, else
// -1 (then a division).
template <int HD, int BN, typename T>
__device__ __forceinline__ void pfm_load_kv(T* s_k, T* s_v, const T* __restrict__ k_cache,
                                            const T* __restrict__ v_cache,
                                            const int* __restrict__ table, int block_size,
                                            int bs_shift, int n0, int n_keys,
                                            long long slot_stride, long long head_off, int tid) {
    constexpr int EPC = 16 / sizeof(T);                          // elements per chunk
    constexpr int LD = KvIsFp8<T>::value ? HD : HD + PFM_PAD;  // row stride
    constexpr int CPR = HD / EPC;                                // chunks per row
    constexpr int RPP = PFM_THREADS / CPR;                       // rows per pass of the block
    static_assert(PFM_THREADS % CPR == 0 && BN % RPP == 0, "copy split");
    const int row = tid / CPR;
    const int col = (tid % CPR) * EPC;
#pragma unroll
    for (int p = 0; p < BN / RPP; p++) {
        const int r = row + p * RPP;
        const int key = n0 + r;
        T* dk = &s_k[r * LD + col];
        T* dv = &s_v[r * LD + col];
        if (key < n_keys) {
            const int blk = bs_shift >= 0 ? key >> bs_shift : key / block_size;
            const long long off =
                (long long)(table[blk] * block_size + key - blk * block_size) * slot_stride +
                head_off + col;
            pf_cp_async16(pf_smem_addr(dk), k_cache + off);
            pf_cp_async16(pf_smem_addr(dv), v_cache + off);
        } else {
            pf_zero16(dk);
            pf_zero16(dv);
        }
    }
}

// Zeroes MT x N mma accumulator fragments (four floats each).
template <int MT, int N>
__device__ __forceinline__ void pfm_zero_frags(float (&f)[MT][N][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < N; i++) {
            f[mt][i][0] = f[mt][i][1] = f[mt][i][2] = f[mt][i][3] = 0.0f;
        }
    }
}

// One landed FP8 tile (r_k, r_v: [BN][HD] E4M3 bytes) as bf16 rows of
// s_k and s_v (row stride HD + PFM_PAD): the bytes' own values, exactly
// (every E4M3 value is a bf16), unscaled (k_scale goes into the scores'
// scale, v_scale into the output's normalization). Thread tid widens 8-byte
// chunks tid + i * PFM_THREADS (8 bytes in, 16 out: no bank conflicts).
template <int HD, int BN>
__device__ __forceinline__ void pfm_widen_fp8(const fp8* r_k, const fp8* r_v, bf16* s_k, bf16* s_v,
                                              int tid) {
    constexpr int LD = HD + PFM_PAD;
    constexpr int CPR = HD / 8;        // 8-byte chunks per row
    constexpr int CHUNKS = BN * CPR;   // per matrix
    static_assert(CHUNKS % PFM_THREADS == 0, "widen split");
#pragma unroll
    for (int p = 0; p < 2 * CHUNKS / PFM_THREADS; p++) {
        const bool is_v = p >= CHUNKS / PFM_THREADS;  // uniform over the block
        const int c = tid + p * PFM_THREADS - (is_v ? CHUNKS : 0);
        const int r = c / CPR;
        const int col = (c % CPR) * 8;
        const uint2 w = *reinterpret_cast<const uint2*>((is_v ? r_v : r_k) + r * HD + col);
        float f[8];
        fp8x4_to_f32(w.x, f);
        fp8x4_to_f32(w.y, f + 4);
        bf16* dst = (is_v ? s_v : s_k) + r * LD + col;
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(pf_smem_addr(dst)),
                     "r"(pf_pack_bf16x2(f[0], f[1])), "r"(pf_pack_bf16x2(f[2], f[3])),
                     "r"(pf_pack_bf16x2(f[4], f[5])), "r"(pf_pack_bf16x2(f[6], f[7]))
                     : "memory");
    }
}

template <typename T, int HD>
__device__ __forceinline__ void prefill_mma_tile(
    bf16* __restrict__ out, const bf16* __restrict__ q, const T* __restrict__ k_cache,
    const T* __restrict__ v_cache, const float* __restrict__ kv_scales,
    const int* __restrict__ cu_seqlens_q,
    const int* __restrict__ context_lens, const int* __restrict__ block_tables,
    int max_blocks_per_seq, int block_size, int num_heads, int num_kv_heads, float scale,
    int window, float softcap) {
    using Shape = PfmShape<HD>;
    constexpr int MT = Shape::MT;
    constexpr int WM = Shape::WARP_M;
    constexpr int BM = Shape::BLOCK_M;
    constexpr int BN = Shape::BLOCK_N;
    constexpr bool Q_IN_REGS = Shape::Q_IN_REGS;
    constexpr int LD = Shape::LD;
    constexpr int CPR = HD / 8;               // 16-byte chunks per row
    constexpr int RPP = PFM_THREADS / CPR;    // rows per pass of the block
    constexpr int KSTEPS = HD / 16;           // k-steps of S = Q K^T
    constexpr int NB_S = BN / 8;              // n-blocks of S (8 keys each)
    constexpr int NB_O = HD / 8;              // n-blocks of O (8 dims each)
    static_assert(BM % RPP == 0 && (WM * CPR) % 32 == 0, "copy split");

    // An FP8 cache keeps one bf16 stage (the widened tile being computed)
    // and two stages of raw bytes (the cp.async double buffer).
    constexpr bool FP8 = KvIsFp8<T>::value;
    extern __shared__ __align__(16) unsigned char pfm_smem[];
    bf16* const s_q = reinterpret_cast<bf16*>(pfm_smem);
    bf16* const s_kv = s_q + BM * LD;  // stage s: K at s_kv + 2s BN LD, V after it
    // FP8 only: raw stage s, K at r_kv + 2s BN HD, V after it.
    fp8* const r_kv = reinterpret_cast<fp8*>(s_kv + 2 * BN * LD);

    const int seq = blockIdx.y;
    const int kv_head = blockIdx.z;
    const int group = num_heads / num_kv_heads;
    const int p0 = (gridDim.x - 1 - blockIdx.x) * BM;  // first packed row
    const int q_start = cu_seqlens_q[seq];
    const int q_len = cu_seqlens_q[seq + 1] - q_start;
    const int rows = q_len * group;
    if (p0 >= rows) {
        return;
    }
    const int ctx = context_lens[seq];
    const int n_keys = ctx + (min(p0 + BM, rows) - 1) / group + 1;  // keys the last row sees
    const int n_tiles = (n_keys + BN - 1) / BN;
    // With a window the first row sees keys from ctx + p0 / G + 1 - window
    // on (later rows from later ones): key tiles wholly before that are
    // never read, and the edge tile is masked per row.
    const int t0 = window > 0 ? max(0, ctx + p0 / group + 1 - window) / BN : 0;
    const int* table = block_tables + (long long)seq * max_blocks_per_seq;
    const int bs_shift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;
    const long long slot_stride = (long long)num_kv_heads * HD;
    const long long head_off = (long long)kv_head * HD;
    const long long tok_stride = (long long)num_heads * HD;  // q/out elements per token
    // Tile starting at key n0 into stage st (raw bytes for FP8).
    auto load_tile = [&](int st, int n0) {
        if constexpr (FP8) {
            fp8* const rk = r_kv + 2 * st * BN * HD;
            pfm_load_kv<HD, BN>(rk, rk + BN * HD, k_cache, v_cache, table, block_size, bs_shift,
                                n0, n_keys, slot_stride, head_off, threadIdx.x);
        } else {
            bf16* const sk = s_kv + 2 * st * BN * LD;
            pfm_load_kv<HD, BN>(sk, sk + BN * LD, k_cache, v_cache, table, block_size, bs_shift,
                                n0, n_keys, slot_stride, head_off, threadIdx.x);
        }
    };
    // Element offset in q/out of packed row pr (< rows).
    auto row_off = [&](int pr) -> long long {
        const int tok = pr / group;
        return (long long)(q_start + tok) * tok_stride +
               (long long)(kv_head * group + pr - tok * group) * HD;
    };

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;

    // Q tile -> s_q (group 1); packed rows past the sequence are zero.
    {
        const int row = tid / CPR;
        const int col = (tid % CPR) * 8;
#pragma unroll 4
        for (int p = 0; p < BM / RPP; p++) {
            const int r = row + p * RPP;
            bf16* dst = &s_q[r * LD + col];
            if (p0 + r < rows) {
                pf_cp_async16(pf_smem_addr(dst), q + row_off(p0 + r) + col);
            } else {
                pf_zero16(dst);
            }
        }
        pf_cp_async_commit();
    }
    load_tile(0, t0 * BN);
    pf_cp_async_commit();  // group 2: tile t0

    // A fragments: lane L addresses row (L % 8) + 8 ((L / 8) % 2), dim 8 (L / 16).
    const int a_row = warp * WM + (lane & 7) + 8 * ((lane >> 3) & 1);
    const int a_col = 8 * (lane >> 4);
    unsigned qf[Q_IN_REGS ? MT : 1][Q_IN_REGS ? KSTEPS : 1][4];
    if constexpr (Q_IN_REGS) {
        pf_cp_async_wait1();  // Q landed
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                pf_ldsm_x4(pf_smem_addr(&s_q[(a_row + mt * 16) * LD + ks * 16 + a_col]),
                           qf[mt][ks][0], qf[mt][ks][1], qf[mt][ks][2], qf[mt][ks][3]);
            }
        }
    }

    float o[MT][NB_O][4];
    pfm_zero_frags(o);
    float row_max[MT][2];
    float row_sum[MT][2];  // this lane's partial sums (quad-reduced at the end)
    // The last key each of this lane's rows (mt, half h: row g + 8h) sees;
    // its first is last - span (negative: every key from 0).
    int last_key[MT][2];
    const int span = window > 0 ? window - 1 : (1 << 30);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            row_max[mt][h] = NEG_INF;
            row_sum[mt][h] = 0.0f;
            last_key[mt][h] = ctx + (p0 + warp * WM + mt * 16 + (lane >> 2) + 8 * h) / group;
        }
    }
    // An FP8 cache's k_scale folds into the scores' scale.
    const float scale_log2 = scale * 1.4426950408889634f * kv_scale<T>(kv_scales, 0);
    const float cap_log2 = softcap * 1.4426950408889634f;  // used only when softcap > 0
    // The smallest and largest last key of the warp's rows inside the
    // sequence, and the smallest and largest first key.
    const int pw0 = p0 + warp * WM;
    const bool warp_has_rows = pw0 < rows;  // else its rows are never written
    const int warp_first_last = ctx + pw0 / group;
    const int warp_last_last = ctx + (min(pw0 + WM, rows) - 1) / group;
    const int warp_first_first = warp_first_last - span;
    const int warp_last_first = warp_last_last - span;

    // K operand addressing: matrix i = lane / 8 covers keys 8 (i / 2), dims 8 (i % 2).
    const int k_row = (lane & 7) + 8 * (lane >> 4);
    const int k_col = 8 * ((lane >> 3) & 1);
    // V operand (transposed): matrix i covers keys 8 (i % 2), dims 8 (i / 2).
    const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1);
    const int v_col = 8 * (lane >> 4);

    for (int t = t0; t < n_tiles; t++) {
        const int n0 = t * BN;
        const int stage = (t - t0) & 1;
        bf16* const s_k = FP8 ? s_kv : s_kv + 2 * stage * BN * LD;
        bf16* const s_v = s_k + BN * LD;
        // Tile t + 1 goes to the other stage, last read in iteration t - 1
        // (which ended with a barrier).
        if (t + 1 < n_tiles) {
            load_tile(stage ^ 1, n0 + BN);
        }
        pf_cp_async_commit();  // tile t + 1, possibly empty
        pf_cp_async_wait1();   // tile t (and Q) landed
        __syncthreads();
        if constexpr (FP8) {
            // The bf16 stage was last read in iteration t - 1 (barrier since).
            const fp8* const rk = r_kv + 2 * stage * BN * HD;
            pfm_widen_fp8<HD, BN>(rk, rk + BN * HD, s_k, s_v, tid);
            __syncthreads();
        }

        // Some row of the warp that will be written sees a key of this tile.
        const bool active =
            warp_has_rows && n0 <= warp_last_last && n0 + BN - 1 >= warp_first_first;
        if (active) {
            float s[MT][NB_S][4];
            pfm_zero_frags(s);
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                unsigned a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if constexpr (Q_IN_REGS) {
                        a[mt][0] = qf[mt][ks][0];
                        a[mt][1] = qf[mt][ks][1];
                        a[mt][2] = qf[mt][ks][2];
                        a[mt][3] = qf[mt][ks][3];
                    } else {
                        pf_ldsm_x4(pf_smem_addr(&s_q[(a_row + mt * 16) * LD + ks * 16 + a_col]),
                                   a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
                    }
                }
#pragma unroll
                for (int np = 0; np < NB_S / 2; np++) {
                    unsigned b0, b1, b2, b3;
                    pf_ldsm_x4(pf_smem_addr(&s_k[(np * 16 + k_row) * LD + ks * 16 + k_col]), b0,
                               b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        pf_mma(s[mt][2 * np], a[mt], b0, b1);
                        pf_mma(s[mt][2 * np + 1], a[mt], b2, b3);
                    }
                }
            }

            // Keys past some row's last (causal) or before some row's first (window).
            const bool mask = n0 + BN - 1 > warp_first_last || n0 < warp_last_first;
            unsigned pf[MT][NB_S / 2][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
                for (int nb = 0; nb < NB_S; nb++) {
                    const int key = n0 + nb * 8 + 2 * (lane & 3);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float v = s[mt][nb][e] * scale_log2;
                        if (softcap > 0.0f) {
                            v = softcap_score(v, cap_log2);
                        }
                        const int k = key + (e & 1);
                        const int last = last_key[mt][e >> 1];
                        if (mask && (k > last || k < last - span)) {
                            v = NEG_INF;
                        }
                        s[mt][nb][e] = v;
                    }
                    mx0 = fmaxf(mx0, fmaxf(s[mt][nb][0], s[mt][nb][1]));
                    mx1 = fmaxf(mx1, fmaxf(s[mt][nb][2], s[mt][nb][3]));
                }
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
                // A row that has seen no key yet may see none of this tile
                // either (its window starts in a later tile, or it is past
                // the sequence): its max stays -inf, and exponents are taken
                // against 0 so that its probabilities and correction are 0,
                // never NaN.
                const float new0 = fmaxf(row_max[mt][0], mx0);
                const float new1 = fmaxf(row_max[mt][1], mx1);
                const float base0 = new0 == NEG_INF ? 0.0f : new0;
                const float base1 = new1 == NEG_INF ? 0.0f : new1;
                const float corr0 = pf_exp2(row_max[mt][0] - base0);
                const float corr1 = pf_exp2(row_max[mt][1] - base1);
                row_max[mt][0] = new0;
                row_max[mt][1] = new1;
                float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
                for (int nb = 0; nb < NB_S; nb++) {
                    s[mt][nb][0] = pf_exp2(s[mt][nb][0] - base0);
                    s[mt][nb][1] = pf_exp2(s[mt][nb][1] - base0);
                    s[mt][nb][2] = pf_exp2(s[mt][nb][2] - base1);
                    s[mt][nb][3] = pf_exp2(s[mt][nb][3] - base1);
                    sum0 += s[mt][nb][0] + s[mt][nb][1];
                    sum1 += s[mt][nb][2] + s[mt][nb][3];
                }
                row_sum[mt][0] = row_sum[mt][0] * corr0 + sum0;
                row_sum[mt][1] = row_sum[mt][1] * corr1 + sum1;
                // Once the row maxima settle (most tiles of a long walk)
                // every correction is exactly 1 (ex2 of 0): then the warp
                // skips the rescale of O.
                if (__any_sync(0xffffffffu, corr0 != 1.0f || corr1 != 1.0f)) {
#pragma unroll
                    for (int i = 0; i < NB_O; i++) {
                        o[mt][i][0] *= corr0;
                        o[mt][i][1] *= corr0;
                        o[mt][i][2] *= corr1;
                        o[mt][i][3] *= corr1;
                    }
                }
                // P as A fragments: k-step j covers S n-blocks 2j (keys 0..7) and 2j+1 (8..15).
#pragma unroll
                for (int j = 0; j < NB_S / 2; j++) {
                    pf[mt][j][0] = pf_pack_bf16x2(s[mt][2 * j][0], s[mt][2 * j][1]);
                    pf[mt][j][1] = pf_pack_bf16x2(s[mt][2 * j][2], s[mt][2 * j][3]);
                    pf[mt][j][2] = pf_pack_bf16x2(s[mt][2 * j + 1][0], s[mt][2 * j + 1][1]);
                    pf[mt][j][3] = pf_pack_bf16x2(s[mt][2 * j + 1][2], s[mt][2 * j + 1][3]);
                }
            }

#pragma unroll
            for (int j = 0; j < NB_S / 2; j++) {
#pragma unroll
                for (int dp = 0; dp < NB_O / 2; dp++) {
                    unsigned b0, b1, b2, b3;
                    pf_ldsm_x4_trans(pf_smem_addr(&s_v[(j * 16 + v_row) * LD + dp * 16 + v_col]),
                                     b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        pf_mma(o[mt][2 * dp], pf[mt][j], b0, b1);
                        pf_mma(o[mt][2 * dp + 1], pf[mt][j], b2, b3);
                    }
                }
            }
        }
        __syncthreads();  // every warp is done with this stage
    }

    // O / row sum as bf16 into the warp's own rows of s_q (only this warp
    // reads them, and it is done with them), then 16-byte stores. An FP8
    // cache's v_scale folds into the normalization.
    const float v_scale = kv_scale<T>(kv_scales, 1);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float l0 = row_sum[mt][0], l1 = row_sum[mt][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        // A row past the sequence may have seen nothing (sum 0): it is
        // never written, and 0 keeps its staging finite.
        const float inv0 = l0 > 0.0f ? v_scale / l0 : 0.0f;
        const float inv1 = l1 > 0.0f ? v_scale / l1 : 0.0f;
        bf16* r0 = &s_q[(warp * WM + mt * 16 + (lane >> 2)) * LD + 2 * (lane & 3)];
#pragma unroll
        for (int nb = 0; nb < NB_O; nb++) {
            *reinterpret_cast<unsigned*>(r0 + nb * 8) =
                pf_pack_bf16x2(o[mt][nb][0] * inv0, o[mt][nb][1] * inv0);
            *reinterpret_cast<unsigned*>(r0 + 8 * LD + nb * 8) =
                pf_pack_bf16x2(o[mt][nb][2] * inv1, o[mt][nb][3] * inv1);
        }
    }
    __syncwarp();
#pragma unroll 4
    for (int i = lane; i < WM * CPR; i += 32) {
        const int r = i / CPR;
        const int col = (i % CPR) * 8;
        const int pr = pw0 + r;
        if (pr < rows) {
            *reinterpret_cast<uint4*>(out + row_off(pr) + col) =
                *reinterpret_cast<const uint4*>(&s_q[(warp * WM + r) * LD + col]);
        }
    }
}

// Entry points, one per (cache element, head_dim) (the supported set; see
// attention_prefill_mma.rs). window 0: no sliding window; softcap 0: no
// soft-capping. kv_scales = {k_scale, v_scale} (read by FP8 caches only).
#define PFM_ARGS(KV)                                                                            \
    bf16 *__restrict__ out, const bf16 *__restrict__ q, const KV *__restrict__ k_cache,         \
        const KV *__restrict__ v_cache, const float *__restrict__ kv_scales,                    \
        const int *__restrict__ cu_seqlens_q, const int *__restrict__ context_lens,             \
        const int *__restrict__ block_tables, int max_blocks_per_seq, int block_size,           \
        int num_heads, int num_kv_heads, float scale, int window, float softcap
#define PFM_PASS                                                                                \
    out, q, k_cache, v_cache, kv_scales, cu_seqlens_q, context_lens, block_tables,              \
        max_blocks_per_seq, block_size, num_heads, num_kv_heads, scale, window, softcap

extern "C" __global__ void __launch_bounds__(PFM_THREADS, 2)
prefill_mma_attention_bf16_hd64(PFM_ARGS(bf16)) {
    PDL_ENTRY();
    prefill_mma_tile<bf16, 64>(PFM_PASS);
}

extern "C" __global__ void __launch_bounds__(PFM_THREADS, 2)
prefill_mma_attention_bf16_hd128(PFM_ARGS(bf16)) {
    PDL_ENTRY();
    prefill_mma_tile<bf16, 128>(PFM_PASS);
}

extern "C" __global__ void __launch_bounds__(PFM_THREADS, 2)
prefill_mma_attention_bf16_hd256(PFM_ARGS(bf16)) {
    PDL_ENTRY();
    prefill_mma_tile<bf16, 256>(PFM_PASS);
}

extern "C" __global__ void __launch_bounds__(PFM_THREADS, 2)
prefill_mma_attention_fp8_hd64(PFM_ARGS(fp8)) {
    PDL_ENTRY();
    prefill_mma_tile<fp8, 64>(PFM_PASS);
}

extern "C" __global__ void __launch_bounds__(PFM_THREADS, 2)
prefill_mma_attention_fp8_hd128(PFM_ARGS(fp8)) {
    PDL_ENTRY();
    prefill_mma_tile<fp8, 128>(PFM_PASS);
}

extern "C" __global__ void __launch_bounds__(PFM_THREADS, 2)
prefill_mma_attention_fp8_hd256(PFM_ARGS(fp8)) {
    PDL_ENTRY();
    prefill_mma_tile<fp8, 256>(PFM_PASS);
}
