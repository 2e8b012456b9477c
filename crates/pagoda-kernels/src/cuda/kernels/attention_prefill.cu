// Tiled causal prefill attention over the paged KV cache (varlen, cached
// prefix, GQA), on tensor cores with an online softmax.
//
// Semantics are those of paged_attention_bf16: query token j of sequence s
// (rows cu_seqlens_q[s]..cu_seqlens_q[s+1] of q/out) sees cache positions
// 0..=context_lens[s] + j (only the last `window` of them when window > 0),
// read through the sequence's block table (slot
// block_tables[s * max_blocks_per_seq + pos / block_size] * block_size +
// pos % block_size); query head h reads kv head h / (num_heads / num_kv_heads);
// with softcap > 0 each scaled score x becomes softcap * tanh(x / softcap)
// before the softmax. Every key a query sees must already be in the cache
// (store_kv ran first).
//
// Work split: grid (ceil(max_query_len / 64), num_seqs, num_heads), 4 warps.
// One block owns a 64-row query tile of one sequence and one head (warp w:
// rows 16w..16w+15); blockIdx.x is reversed so the tiles with the most keys
// start first; tiles past a sequence's query_len exit at once. The block
// walks the keys its rows see, BLOCK_N (64, or 32 at head_dim 256) at a
// time, from the tile holding its first row's first key (with a window,
// whole key tiles before it are never read, so the work per query tile is
// bounded by the window, not by the context) to the one holding its last
// row's last key: K and V rows are
// gathered from the paged cache into shared memory with 16-byte cp.async
// copies (each key row looks its block up; any block_size works; rows past
// the tile's last key are zero-filled, so nothing unstored is ever read).
// S = Q K^T and O += P V use mma.sync m16n8k16 (bf16 in, f32 accumulate),
// with Q (A fragments) in registers for the whole walk (or re-read from
// shared memory at head_dim 256, see PfShape) and P re-packed from S's
// accumulators without leaving registers. The causal and window masks are
// applied only on tiles that cross a warp's diagonal or window edge; warps
// whose rows see none of a tile's keys, or whose rows are all past
// query_len, skip its math (but never a barrier). O is normalized once at
// the end and written as bf16; rows past query_len are never written.
//
// Pipelining with one K and one V buffer: K(t+1) is fetched while the
// softmax and P V of tile t run, and V(t+1) while S of tile t+1 runs
// (cp.async groups, always one commit per stage so wait_group 1 is exact).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16; g = lane / 4, c = lane % 4):
//   A (16x16, row): a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B (16x8, col):  b0 (k 2c..2c+1, n g), b1 (k 2c+8..2c+9, n g)
//   C (16x8 f32):   c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
// ldmatrix.x4 gives lane L of matrix i the pair at row L/4, cols 2(L%4)..+1
// (with .trans: rows 2(L%4)..+1 of column L/4); lanes 8i..8i+7 address
// matrix i's rows. Lower column index goes to the lower 16 bits of a pair.
//
// Resources (sm_90, see scripts/check-kernels.py): dynamic shared memory
// PF_SMEM_ROWS * (head_dim + 8) bf16 = 34,816 bytes at head_dim 128 (18,432
// at 64: Q staged through the V buffer; 67,584 at 256: Q, K and V buffers of
// 64, 32 and 32 rows, past 48 KB, so the host raises the kernel's limit when
// it loads the module).
//
// Cost at the Qwen3-0.6B shape (16 heads, 8 kv heads, head_dim 128) for one
// 512-token prompt, per layer: causal attention is 4 * head_dim * heads *
// (512 * 513 / 2) = 1.08 GFLOP (the 64x64 tiling executes 1.21 GFLOP with
// the diagonal tiles computed whole), i.e. ~1.5 us at ~700 TFLOP/s bf16
// dense; it also moves ~6 MB (Q, K, V, O once each), ~1.5 us at ~4 TB/s,
// and launches only 8 * 16 = 128 blocks, so at this size it is bound by
// latency and occupancy, not by either ceiling.

#define PF_BLOCK_M 64
#define PF_THREADS 128
// Rows of dynamic shared memory per block, each head_dim + PF_PAD bf16 (see PfShape).
#define PF_SMEM_ROWS 128
// Padding of each shared-memory row (bf16 elements): rows 16 bytes apart
// modulo 128, so the 8 row addresses of an ldmatrix hit distinct banks.
#define PF_PAD 8

// Tile shapes per head_dim. Up to 128 dims, Q's A fragments stay in
// registers for the whole walk (staged once through the V buffer) and key
// tiles are 64 rows. At 256 dims Q's fragments (64 registers) and O's
// accumulators (128) would not both fit in 255 registers, so Q stays in its
// own shared buffer (its fragments re-read with ldmatrix per key tile) and
// key tiles are 32 rows. Either way the block uses PF_SMEM_ROWS rows of
// (head_dim + PF_PAD) bf16 of dynamic shared memory (the host sizes the
// launch from that; 67,584 bytes at 256 dims needs the opt-in past 48 KB).
template <int HD>
struct PfShape {
    static constexpr bool Q_IN_REGS = HD <= 128;
    static constexpr int BLOCK_N = HD <= 128 ? 64 : 32;
    static constexpr int SMEM_ROWS = Q_IN_REGS ? 2 * BLOCK_N : PF_BLOCK_M + 2 * BLOCK_N;
};

template <int HD, typename KV>
__device__ __forceinline__ void prefill_attention_tile(
    bf16* __restrict__ out, const bf16* __restrict__ q, const KV* __restrict__ k_cache,
    const KV* __restrict__ v_cache, const float* __restrict__ kv_scales,
    const int* __restrict__ cu_seqlens_q,
    const int* __restrict__ context_lens, const int* __restrict__ block_tables,
    int max_blocks_per_seq, int block_size, int num_heads, int num_kv_heads, float scale,
    int window, float softcap) {
    using Shape = PfShape<HD>;
    constexpr bool Q_IN_REGS = Shape::Q_IN_REGS;
    constexpr int BN = Shape::BLOCK_N;            // keys per tile
    constexpr int LD = HD + PF_PAD;               // shared row stride (elements)
    constexpr int CPR = HD / 8;                   // 16-byte chunks per row
    constexpr int RPP = PF_THREADS / CPR;         // rows one pass of the block copies
    constexpr int PASSES = BN / RPP;              // passes per key tile
    constexpr int Q_PASSES = PF_BLOCK_M / RPP;    // passes of the Q tile
    constexpr int KSTEPS = HD / 16;               // k-steps of S = Q K^T
    constexpr int NB_S = BN / 8;                  // n-blocks of S (8 keys each)
    constexpr int NB_O = HD / 8;                  // n-blocks of O (8 dims each)
    static_assert(!Q_IN_REGS || PF_BLOCK_M == BN, "Q is staged through the V buffer");
    static_assert(PF_THREADS % CPR == 0 && BN % RPP == 0 && PF_BLOCK_M % RPP == 0, "copy split");
    static_assert(Shape::SMEM_ROWS == PF_SMEM_ROWS, "the host sizes shared memory from this");

    extern __shared__ __align__(16) unsigned char pf_smem[];
    bf16* const s_k = reinterpret_cast<bf16*>(pf_smem);
    bf16* const s_v = s_k + BN * LD;
    bf16* const s_q = Q_IN_REGS ? s_v : s_v + BN * LD;

    const int seq = blockIdx.y;
    const int head = blockIdx.z;
    const int m0 = (gridDim.x - 1 - blockIdx.x) * PF_BLOCK_M;
    const int q_start = cu_seqlens_q[seq];
    const int q_len = cu_seqlens_q[seq + 1] - q_start;
    if (m0 >= q_len) {
        return;
    }
    const int ctx = context_lens[seq];
    const int tile_rows = min(PF_BLOCK_M, q_len - m0);
    const int n_keys = ctx + m0 + tile_rows;  // keys the tile's last row sees
    const int n_tiles = (n_keys + BN - 1) / BN;
    // With a window the tile's first row sees keys from ctx + m0 + 1 - window
    // on (later rows from later ones): key tiles wholly before that are never
    // read, and the edge tile is masked per row.
    const int t0 = window > 0 ? max(0, ctx + m0 + 1 - window) / BN : 0;
    const int kv_head = head / (num_heads / num_kv_heads);
    const int* table = block_tables + (long long)seq * max_blocks_per_seq;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int copy_row = tid / CPR;        // first row this thread copies
    const int copy_col = (tid % CPR) * 8;  // its chunk's first element
    const long long slot_stride = (long long)num_kv_heads * HD;
    const long long head_off = (long long)kv_head * HD + copy_col;

    // Q tile -> s_q (group 0); rows past query_len are zero.
    {
        const long long q_stride = (long long)num_heads * HD;
        const bf16* qb = q + ((long long)(q_start + m0) * num_heads + head) * HD + copy_col;
#pragma unroll
        for (int p = 0; p < Q_PASSES; p++) {
            int r = copy_row + p * RPP;
            bf16* dst = &s_q[r * LD + copy_col];
            if (r < tile_rows) {
                pf_cp_async16(pf_smem_addr(dst), qb + r * q_stride);
            } else {
                pf_zero16(dst);
            }
        }
        pf_cp_async_commit();
    }

    // Cache slot of each row this thread copies in the current key tile
    // (-1 past n_keys); shared by the K and V copies of that tile.
    int slots[PASSES];
    auto find_slots = [&](int n0) {
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            int key = n0 + copy_row + p * RPP;
            slots[p] = key < n_keys ? table[key / block_size] * block_size + key % block_size : -1;
        }
    };
    // A bf16 cache is copied with cp.async; an FP8 one (8 bytes a chunk) is
    // loaded, dequantized (byte * scale, rounded to bf16) and stored to the
    // same bf16 tile, so everything after the tile loads is the same.
    auto issue = [&](bf16* buf, const KV* __restrict__ cache, float kv_sc) {
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            bf16* dst = &buf[(copy_row + p * RPP) * LD + copy_col];
            if (slots[p] < 0) {
                pf_zero16(dst);
            } else if constexpr (KvIsFp8<KV>::value) {
                const uint2 raw = __ldg(reinterpret_cast<const uint2*>(
                    cache + (long long)slots[p] * slot_stride + head_off));
                float f[8];
                fp8x4_to_f32(raw.x, f);
                fp8x4_to_f32(raw.y, f + 4);
                unsigned w[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    w[i] = pf_pack_bf16x2(f[2 * i] * kv_sc, f[2 * i + 1] * kv_sc);
                }
                *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
            } else {
                pf_cp_async16(pf_smem_addr(dst), cache + (long long)slots[p] * slot_stride + head_off);
            }
        }
    };
    const float k_sc = kv_scale<KV>(kv_scales, 0);
    const float v_sc = kv_scale<KV>(kv_scales, 1);

    find_slots(t0 * BN);
    issue(s_k, k_cache, k_sc);
    pf_cp_async_commit();  // group 1: K(t0)

    pf_cp_async_wait1();  // Q landed
    __syncthreads();
    // A fragments: matrix i = lane / 8 covers rows 8 * (i % 2), cols 8 * (i / 2).
    const int a_row = warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1);
    const int a_col = 8 * (lane >> 4);
    unsigned qf[Q_IN_REGS ? KSTEPS : 1][4];
    if constexpr (Q_IN_REGS) {
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
            pf_ldsm_x4(pf_smem_addr(&s_q[a_row * LD + ks * 16 + a_col]), qf[ks][0], qf[ks][1],
                       qf[ks][2], qf[ks][3]);
        }
        __syncthreads();  // every warp holds its Q; s_v is free
    }
    issue(s_v, v_cache, v_sc);
    pf_cp_async_commit();  // group 2: V(t0)

    float o[NB_O][4];
#pragma unroll
    for (int i = 0; i < NB_O; i++) {
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    }
    float row_max[2] = {NEG_INF, NEG_INF};
    float row_sum[2] = {0.0f, 0.0f};  // this lane's partial sums (quad-reduced at the end)
    const float scale_log2 = scale * 1.4426950408889634f;
    const float cap_log2 = softcap * 1.4426950408889634f;  // used only when softcap > 0
    // Query index j of this lane's rows (c0/c1 and c2/c3), and the last key each sees.
    const int row_j = m0 + warp * 16 + (lane >> 2);
    const int last_key0 = ctx + row_j;
    const int last_key1 = ctx + row_j + 8;
    const int warp_first_last = ctx + m0 + warp * 16;      // smallest last key in the warp
    const int warp_last_last = warp_first_last + 15;       // largest
    // The first key each row sees (may be negative: then every key from 0),
    // and the smallest and largest of the warp's.
    const int span = window > 0 ? window - 1 : warp_last_last;
    const int first_key0 = last_key0 - span;
    const int first_key1 = last_key1 - span;
    const int warp_first_first = warp_first_last - span;
    const int warp_last_first = warp_last_last - span;
    const bool warp_has_rows = m0 + warp * 16 < q_len;     // else its rows are never written

    // K operand addressing: matrix i = lane / 8 covers keys 8 * (i / 2), dims 8 * (i % 2).
    const int k_row = (lane & 7) + 8 * (lane >> 4);
    const int k_col = 8 * ((lane >> 3) & 1);
    // V operand (transposed): matrix i covers keys 8 * (i % 2), dims 8 * (i / 2).
    const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1);
    const int v_col = 8 * (lane >> 4);

    for (int t = t0; t < n_tiles; t++) {
        const int n0 = t * BN;
        // Some row of the warp that will be written sees a key of this tile.
        const bool active =
            warp_has_rows && n0 <= warp_last_last && n0 + BN - 1 >= warp_first_first;
        pf_cp_async_wait1();  // K(t) landed
        __syncthreads();

        float s[NB_S][4];
#pragma unroll
        for (int i = 0; i < NB_S; i++) {
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
        }
        if (active) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                unsigned a[4];
                if constexpr (Q_IN_REGS) {
                    a[0] = qf[ks][0];
                    a[1] = qf[ks][1];
                    a[2] = qf[ks][2];
                    a[3] = qf[ks][3];
                } else {
                    pf_ldsm_x4(pf_smem_addr(&s_q[a_row * LD + ks * 16 + a_col]), a[0], a[1], a[2],
                               a[3]);
                }
#pragma unroll
                for (int np = 0; np < NB_S / 2; np++) {
                    unsigned b0, b1, b2, b3;
                    pf_ldsm_x4(pf_smem_addr(&s_k[(np * 16 + k_row) * LD + ks * 16 + k_col]), b0, b1,
                               b2, b3);
                    pf_mma(s[2 * np], a, b0, b1);
                    pf_mma(s[2 * np + 1], a, b2, b3);
                }
            }
        }
        __syncthreads();  // every warp is done with s_k
        if (t + 1 < n_tiles) {
            find_slots(n0 + BN);
            issue(s_k, k_cache, k_sc);
        }
        pf_cp_async_commit();  // K(t+1), possibly empty

        unsigned pf[NB_S / 2][4];
        if (active) {
            // Keys past some row's last (causal) or before some row's first (window).
            const bool mask = n0 + BN - 1 > warp_first_last || n0 < warp_last_first;
            float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
            for (int nb = 0; nb < NB_S; nb++) {
                int key = n0 + nb * 8 + 2 * (lane & 3);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = s[nb][e] * scale_log2;
                    if (softcap > 0.0f) {
                        v = softcap_score(v, cap_log2);
                    }
                    const int k = key + (e & 1);
                    if (mask && (k > (e < 2 ? last_key0 : last_key1) ||
                                 k < (e < 2 ? first_key0 : first_key1))) {
                        v = NEG_INF;
                    }
                    s[nb][e] = v;
                }
                mx0 = fmaxf(mx0, fmaxf(s[nb][0], s[nb][1]));
                mx1 = fmaxf(mx1, fmaxf(s[nb][2], s[nb][3]));
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            // A row that has seen no key yet may see none of this tile either
            // (its window starts in a later tile, or it is past query_len):
            // its max stays -inf, and exponents are taken against 0 so that
            // its probabilities and correction are 0, never NaN.
            const float new0 = fmaxf(row_max[0], mx0);
            const float new1 = fmaxf(row_max[1], mx1);
            const float base0 = new0 == NEG_INF ? 0.0f : new0;
            const float base1 = new1 == NEG_INF ? 0.0f : new1;
            const float corr0 = pf_exp2(row_max[0] - base0);
            const float corr1 = pf_exp2(row_max[1] - base1);
            row_max[0] = new0;
            row_max[1] = new1;
            float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
            for (int nb = 0; nb < NB_S; nb++) {
                s[nb][0] = pf_exp2(s[nb][0] - base0);
                s[nb][1] = pf_exp2(s[nb][1] - base0);
                s[nb][2] = pf_exp2(s[nb][2] - base1);
                s[nb][3] = pf_exp2(s[nb][3] - base1);
                sum0 += s[nb][0] + s[nb][1];
                sum1 += s[nb][2] + s[nb][3];
            }
            row_sum[0] = row_sum[0] * corr0 + sum0;
            row_sum[1] = row_sum[1] * corr1 + sum1;
#pragma unroll
            for (int i = 0; i < NB_O; i++) {
                o[i][0] *= corr0;
                o[i][1] *= corr0;
                o[i][2] *= corr1;
                o[i][3] *= corr1;
            }
            // P as A fragments: k-step j covers S n-blocks 2j (cols 0..7) and 2j+1 (8..15).
#pragma unroll
            for (int j = 0; j < NB_S / 2; j++) {
                pf[j][0] = pf_pack_bf16x2(s[2 * j][0], s[2 * j][1]);
                pf[j][1] = pf_pack_bf16x2(s[2 * j][2], s[2 * j][3]);
                pf[j][2] = pf_pack_bf16x2(s[2 * j + 1][0], s[2 * j + 1][1]);
                pf[j][3] = pf_pack_bf16x2(s[2 * j + 1][2], s[2 * j + 1][3]);
            }
        }

        pf_cp_async_wait1();  // V(t) landed
        __syncthreads();
        if (active) {
#pragma unroll
            for (int j = 0; j < NB_S / 2; j++) {
#pragma unroll
                for (int dp = 0; dp < NB_O / 2; dp++) {
                    unsigned b0, b1, b2, b3;
                    pf_ldsm_x4_trans(pf_smem_addr(&s_v[(j * 16 + v_row) * LD + dp * 16 + v_col]), b0,
                                     b1, b2, b3);
                    pf_mma(o[2 * dp], pf[j], b0, b1);
                    pf_mma(o[2 * dp + 1], pf[j], b2, b3);
                }
            }
        }
        __syncthreads();  // every warp is done with s_v
        if (t + 1 < n_tiles) {
            issue(s_v, v_cache, v_sc);  // slots still hold tile t+1's
        }
        pf_cp_async_commit();  // V(t+1), possibly empty
    }

    // Full row sums (the four lanes of a quad share a row), then O / sum.
    float l0 = row_sum[0], l1 = row_sum[1];
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = 1.0f / l0;
    const float inv1 = 1.0f / l1;
    const long long out_stride = (long long)num_heads * HD;
    bf16* ob = out + ((long long)(q_start + row_j) * num_heads + head) * HD + 2 * (lane & 3);
    const bool write0 = row_j < q_len;
    const bool write1 = row_j + 8 < q_len;
#pragma unroll
    for (int nb = 0; nb < NB_O; nb++) {
        if (write0) {
            *reinterpret_cast<unsigned*>(ob + nb * 8) =
                pf_pack_bf16x2(o[nb][0] * inv0, o[nb][1] * inv0);
        }
        if (write1) {
            *reinterpret_cast<unsigned*>(ob + 8 * out_stride + nb * 8) =
                pf_pack_bf16x2(o[nb][2] * inv1, o[nb][3] * inv1);
        }
    }
}

// Entry points, one per (cache element type, head_dim) (the supported set;
// see attention_prefill.rs). window 0: no sliding window; softcap 0: no
// soft-capping.
#define PF_ARGS(KV)                                                                             \
    bf16 *__restrict__ out, const bf16 *__restrict__ q, const KV *__restrict__ k_cache,         \
        const KV *__restrict__ v_cache, const float *__restrict__ kv_scales,                    \
        const int *__restrict__ cu_seqlens_q, const int *__restrict__ context_lens,             \
        const int *__restrict__ block_tables, int max_blocks_per_seq, int block_size,           \
        int num_heads, int num_kv_heads, float scale, int window, float softcap
#define PF_PASS                                                                                 \
    out, q, k_cache, v_cache, kv_scales, cu_seqlens_q, context_lens, block_tables,              \
        max_blocks_per_seq, block_size, num_heads, num_kv_heads, scale, window, softcap

extern "C" __global__ void __launch_bounds__(PF_THREADS)
prefill_attention_bf16_hd64(PF_ARGS(bf16)) {
    PDL_ENTRY();
    prefill_attention_tile<64, bf16>(PF_PASS);
}

extern "C" __global__ void __launch_bounds__(PF_THREADS)
prefill_attention_bf16_hd128(PF_ARGS(bf16)) {
    PDL_ENTRY();
    prefill_attention_tile<128, bf16>(PF_PASS);
}

extern "C" __global__ void __launch_bounds__(PF_THREADS)
prefill_attention_bf16_hd256(PF_ARGS(bf16)) {
    PDL_ENTRY();
    prefill_attention_tile<256, bf16>(PF_PASS);
}

extern "C" __global__ void __launch_bounds__(PF_THREADS)
prefill_attention_fp8_hd64(PF_ARGS(fp8)) {
    PDL_ENTRY();
    prefill_attention_tile<64, fp8>(PF_PASS);
}

extern "C" __global__ void __launch_bounds__(PF_THREADS)
prefill_attention_fp8_hd128(PF_ARGS(fp8)) {
    PDL_ENTRY();
    prefill_attention_tile<128, fp8>(PF_PASS);
}

extern "C" __global__ void __launch_bounds__(PF_THREADS)
prefill_attention_fp8_hd256(PF_ARGS(fp8)) {
    PDL_ENTRY();
    prefill_attention_tile<256, fp8>(PF_PASS);
}
