// Mixture-of-experts layers: routing, grouping by expert, the grouped expert
// GEMMs on tensor cores and the weighted combine (the launches and the host
// checks are in cuda/moe.rs). The GEMMs' code is in moe_gemm.cu and the
// stream kernels' in moe_stream.cu, each its own compile unit; the pieces
// they share with this file are in moe.cuh.
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
// every tile and the -1 of every padding slot, then a stable scatter: pairs
// in rounds of MG_THREADS; within a warp __match_any_sync ranks equal
// experts, across the round's warps a per-warp count table (tagged with the
// round, so it needs no clearing) gives the offset; the slot of pair q is
// off[e] + (pairs of e before q). Output: meta = [tile count, expert of tile
// 0, 1, ...], slot_pair[slot] = q or -1, pair_slot[q] = slot, or -1 for an
// id outside 0..E (never computed; the host refuses such routes before).
//
// moe_gemm_*: the grouped GEMM, grid (max_tiles, ceil(N / BN)); blocks past
// meta[0] exit at once, so the grid depends only on the chunk's rows. Block
// (t, nb) computes the BM slots of tile t against output columns nb*BN..:
//   gate_up: A row = x[pair / top_k], B = expert e's gate rows e*2N + n and
//            up rows e*2N + N + n, out h[slot, n] = bf16(silu(g) * u);
//   down:    A row = h[slot], B = rows e*N + n of down, out
//            y[slot, n] = bf16(weight[pair] * acc).
// WM x WN warps, each MI x NI m16n8k16 tiles (bf16 in, f32 accumulate);
// K walked 32 at a time through a cp.async pipeline of 3 to 6 stages (the
// 4-warp shapes: as many as 48 KB of static shared memory hold;
// decode-sized tiles are bound by the weight stream and keep more of it in
// flight; 16-byte copies where K % 8 == 0, element copies otherwise; zero
// past K, past N and for padding slots). Fragment addressing as in
// attention_prefill.cu, with the pf_* helpers (ldmatrix, mma, cp.async) of
// mma.cuh. Three shapes: BM 128 x 128 weight rows (8 warps, 4 x 2; gate_up
// BN 64 of each set, down BN 128; 4 stages in dynamic shared memory) for
// prefill-sized steps, where the 64-row tiles were bound by L2 traffic
// (each block re-reads its A and B tiles from L2: the larger tile halves
// the weight re-reads and reads a third fewer bytes per product); BM 64 x
// BN 64 (warps 2 x 2) for steps with a few tiles per expert; BM 16 x BN 64
// (warps 1 x 4) for decode-sized ones, where most of a 64-row tile would be
// padding.
//
// Expert weights are bf16 or FP8 (E4M3 codes, one f32 scale per weight
// row): every kernel that reads them is a template on the weight type W
// (MoeBf16, MoeFp8), its FP8 instances named with the suffix _fp8. FP8
// codes widen exactly (every E4M3 value is a bf16 value) after the load:
// in registers on the GEMV paths, into one bf16 shared tile per k step on
// the GEMM path (the code tiles take the cp.async stages, 16-byte copies
// where K % 16 == 0). Dot products run on the codes and the row scale is
// applied in f32 by the shared epilogues (moe_gate_up_val, moe_down_val):
// silu(g * s_g) * (u * s_u) and w * (acc * s_d); bf16 scales are 1.
//
// moe_combine_bf16: out[r, c] = bf16(sum over k, in k order, of y[slot of
// (r, k), c]) in f32; pairs without a slot add nothing.
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
    PDL_ENTRY();
    moe_route_row(logits, rows, n_exp, top_k, renormalize, ids, weights);
}

extern "C" __global__ void __launch_bounds__(32 * MR_WARPS)
moe_route_f32(const float* __restrict__ logits, int rows, int n_exp, int top_k, int renormalize,
              int* __restrict__ ids, float* __restrict__ weights) {
    PDL_ENTRY();
    moe_route_row(logits, rows, n_exp, top_k, renormalize, ids, weights);
}

// One block of MG_THREADS; dynamic shared memory (2 + MG_WARPS) * n_exp ints.
// meta holds 1 + max_tiles ints, slot_pair max_tiles * bm, pair_slot pairs.
extern "C" __global__ void __launch_bounds__(MG_THREADS)
moe_group(const int* __restrict__ ids, int pairs, int n_exp, int bm, int* __restrict__ meta,
          int* __restrict__ slot_pair, int* __restrict__ pair_slot) {
    PDL_ENTRY();
    extern __shared__ int mg_smem[];
    int* count = mg_smem;           // pairs per expert
    int* next = mg_smem + n_exp;    // next free slot of each expert
    int* wcount = next + n_exp;     // [MG_WARPS][n_exp]: (round + 1) << 8 | count
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    for (int i = tid; i < n_exp; i += MG_THREADS) {
        count[i] = 0;
    }
    for (int i = tid; i < MG_WARPS * n_exp; i += MG_THREADS) {
        wcount[i] = 0;
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
    // Stable scatter, MG_THREADS pairs per round.
    for (int base = 0, round = 1; base < pairs; base += MG_THREADS, round++) {
        int q = base + tid;
        int e = q < pairs ? ids[q] : -1;
        bool valid = q < pairs && e >= 0 && e < n_exp;
        int key = valid ? e : -1;
        unsigned peers = __match_any_sync(0xffffffffu, key);
        int rank = __popc(peers & ((1u << lane) - 1u));
        int leader = __ffs(peers) - 1;
        if (valid && lane == leader) {
            wcount[warp * n_exp + e] = (round << 8) | __popc(peers);
        }
        __syncthreads();
        int before = 0;
        bool last = false;
        if (valid) {
            for (int w = 0; w < MG_WARPS; w++) {
                int v = wcount[w * n_exp + e];
                int c = (v >> 8) == round ? (v & 0xff) : 0;
                if (w < warp) {
                    before += c;
                }
            }
            // The round's last pair of e: the highest lane of the last warp holding e.
            last = lane == 31 - __clz(peers);
            for (int w = warp + 1; w < MG_WARPS; w++) {
                if ((wcount[w * n_exp + e] >> 8) == round) {
                    last = false;
                }
            }
            int s = next[e] + before + rank;
            slot_pair[s] = q;
            pair_slot[q] = s;
        } else if (q < pairs) {
            pair_slot[q] = -1;
        }
        __syncthreads();  // every read of next[] is done
        if (last) {
            next[e] += before + rank + 1;
        }
        __syncthreads();
    }
}

// Grid-stride over rows * n output elements.
extern "C" __global__ void moe_combine_bf16(bf16* __restrict__ out, const bf16* __restrict__ y,
                                            const int* __restrict__ pair_slot, int rows,
                                            int top_k, int n) {
    PDL_ENTRY();
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
        out[i] = f2bf(s);
    }
}

// Two dot products over `chunks` chunks: s0 += a0 . b0, s1 += a1 . b1
// (lane's share; the caller reduces over the warp). a* are weight rows,
// streamed once; b* bf16 activation rows (16 bytes a chunk), reused by
// other warps; SAME_B: b1 is b0 (read once).
template <typename W, bool SAME_B>
__device__ __forceinline__ void mv_dot2(const typename W::Chunk* __restrict__ a0,
                                        const uint4* __restrict__ b0,
                                        const typename W::Chunk* __restrict__ a1,
                                        const uint4* __restrict__ b1, int chunks, int lane,
                                        float& s0, float& s1) {
    constexpr int U = W::UNROLL;
    typedef typename W::Chunk C;
    int c = lane;
    for (; c + 32 * (U - 1) < chunks; c += 32 * U) {
        C wa[U], wb[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            wa[u] = __ldcs(a0 + c + 32 * u);
            wb[u] = __ldcs(a1 + c + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float fa[8], fb[8], xa[8], xb[8];
            W::to_f32(wa[u], fa);
            W::to_f32(wb[u], fb);
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
        W::to_f32(__ldcs(a0 + c), fa);
        W::to_f32(__ldcs(a1 + c), fb);
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
template <typename W>
__device__ __forceinline__ void moe_gemv_gate_up_impl(bf16* __restrict__ h,
                                                      const bf16* __restrict__ x,
                                                      const typename W::T* __restrict__ w,
                                                      const float* __restrict__ w_scale,
                                                      const int* __restrict__ ids, int top_k,
                                                      int n_exp, int inter, int hidden) {
    typedef typename W::Chunk C;
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const int q = blockIdx.y;
    if (j >= inter) {
        return;
    }
    const int e = ids[q];
    float v = 0.0f;
    if (e >= 0 && e < n_exp) {
        const long long gr = (long long)e * 2 * inter + j;  // the gate row; up is inter below
        const typename W::T* gate = w + gr * hidden;
        const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)(q / top_k) * hidden);
        float g = 0.0f, u = 0.0f;
        mv_dot2<W, true>(reinterpret_cast<const C*>(gate), xr,
                         reinterpret_cast<const C*>(gate + (long long)inter * hidden), xr,
                         hidden >> 3, lane, g, u);
        g = warp_sum(g);
        u = warp_sum(u);
        v = moe_gate_up_val<W>(g, u, w_scale, gr, gr + inter);
    }
    if (lane == 0) {
        h[(long long)q * inter + j] = f2bf(v);
    }
}

// out [rows, hidden] (bf16); h [rows * top_k, inter]; w the stacked down.
template <typename W>
__device__ __forceinline__ void moe_gemv_down_impl(bf16* __restrict__ out,
                                                   const bf16* __restrict__ h,
                                                   const typename W::T* __restrict__ w,
                                                   const float* __restrict__ w_scale,
                                                   const int* __restrict__ ids,
                                                   const float* __restrict__ route_w, int top_k,
                                                   int n_exp, int hidden, int inter) {
    typedef typename W::Chunk C;
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
        const long long r0 = (long long)(ok0 ? e0 : 0) * hidden + c;
        const long long r1 = two ? (long long)(ok1 ? e1 : 0) * hidden + c : r0;
        float s0 = 0.0f, s1 = 0.0f;
        mv_dot2<W, false>(reinterpret_cast<const C*>(w + r0 * inter),
                          reinterpret_cast<const uint4*>(h + q0 * inter),
                          reinterpret_cast<const C*>(w + r1 * inter),
                          reinterpret_cast<const uint4*>(h + q1 * inter), chunks, lane, s0, s1);
        s0 = warp_sum(s0);
        s1 = warp_sum(s1);
        if (ok0) {
            total += moe_down_val<W>(s0, route_w[q0], w_scale, r0);
        }
        if (ok1) {
            total += moe_down_val<W>(s1, route_w[q1], w_scale, r1);
        }
    }
    if (lane == 0) {
        out[(long long)r * hidden + c] = f2bf(total);
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
    PDL_ENTRY();
    moe_sigmoid_gate(x, gate, rows, cols, gate_cols);
}

extern "C" __global__ void moe_sigmoid_gate_f32(bf16* __restrict__ x,
                                                const float* __restrict__ gate, int rows,
                                                int cols, int gate_cols) {
    PDL_ENTRY();
    moe_sigmoid_gate(x, gate, rows, cols, gate_cols);
}

// Lane's share of the MV_BM dot products of weight rows w0 and w1 against
// the activation rows rows[s] (nullptr: skipped, sums 0); ONE: w1 is w0
// (read once, s1 left alone).
template <typename W, bool ONE>
__device__ __forceinline__ void mv_tile_dots(const typename W::Chunk* __restrict__ w0,
                                             const typename W::Chunk* __restrict__ w1,
                                             const bf16* const* rows, int chunks, int lane,
                                             float (&s0)[MV_BM], float (&s1)[MV_BM]) {
    for (int c = lane; c < chunks; c += 32) {
        float f0[8], f1[8];
        W::to_f32(__ldcs(w0 + c), f0);
        if (!ONE) {
            W::to_f32(__ldcs(w1 + c), f1);
        }
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
                if (!ONE) {
                    s1[s] = fmaf(f1[i], a[i], s1[s]);
                }
            }
        }
    }
}

// h [slots, inter]; x [rows, hidden]; w the stacked gate_up.
template <typename W>
__device__ __forceinline__ void moe_ggemv_gate_up_impl(bf16* __restrict__ h,
                                                       const bf16* __restrict__ x,
                                                       const typename W::T* __restrict__ w,
                                                       const float* __restrict__ w_scale,
                                                       const int* __restrict__ meta,
                                                       const int* __restrict__ slot_pair,
                                                       int top_k, int inter, int hidden) {
    typedef typename W::Chunk C;
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
    const long long gr = (long long)e * 2 * inter + n;
    const typename W::T* gate = w + gr * hidden;
    float g[MV_BM], u[MV_BM];
#pragma unroll
    for (int s = 0; s < MV_BM; s++) {
        g[s] = u[s] = 0.0f;
    }
    mv_tile_dots<W, false>(reinterpret_cast<const C*>(gate),
                           reinterpret_cast<const C*>(gate + (long long)inter * hidden), rows,
                           hidden >> 3, lane, g, u);
#pragma unroll
    for (int s = 0; s < MV_BM; s++) {
        if (rows[s] == nullptr) {
            continue;
        }
        float gs = warp_sum(g[s]);
        float us = warp_sum(u[s]);
        if (lane == 0) {
            h[(slot0 + s) * inter + n] = f2bf(moe_gate_up_val<W>(gs, us, w_scale, gr, gr + inter));
        }
    }
}

// y [slots, hidden]; h [slots, inter]; w the stacked down.
template <typename W>
__device__ __forceinline__ void moe_ggemv_down_impl(bf16* __restrict__ y,
                                                    const bf16* __restrict__ h,
                                                    const typename W::T* __restrict__ w,
                                                    const float* __restrict__ w_scale,
                                                    const int* __restrict__ meta,
                                                    const int* __restrict__ slot_pair,
                                                    const float* __restrict__ route_w,
                                                    int hidden, int inter) {
    typedef typename W::Chunk C;
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
    const long long dr = (long long)e * hidden + n;
    const C* row = reinterpret_cast<const C*>(w + dr * inter);
    float acc[MV_BM];
#pragma unroll
    for (int s = 0; s < MV_BM; s++) {
        acc[s] = 0.0f;
    }
    mv_tile_dots<W, true>(row, row, rows, inter >> 3, lane, acc, acc);
#pragma unroll
    for (int s = 0; s < MV_BM; s++) {
        if (rows[s] == nullptr) {
            continue;
        }
        float a = warp_sum(acc[s]);
        if (lane == 0) {
            y[(slot0 + s) * hidden + n] =
                f2bf(moe_down_val<W>(a, route_w[slot_pair[slot0 + s]], w_scale, dr));
        }
    }
}

// The GEMV kernels of one weight type (name suffix SFX).
#define MOE_GEMV_KERNELS(W, SFX)                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS) moe_gemv_gate_up##SFX(           \
        bf16* __restrict__ h, const bf16* __restrict__ x, const W::T* __restrict__ w,            \
        const float* __restrict__ w_scale, const int* __restrict__ ids, int top_k, int n_exp,   \
        int inter, int hidden) {                                                                 \
        PDL_ENTRY();                                                                          \
        moe_gemv_gate_up_impl<W>(h, x, w, w_scale, ids, top_k, n_exp, inter, hidden);            \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS) moe_gemv_down##SFX(              \
        bf16* __restrict__ out, const bf16* __restrict__ h, const W::T* __restrict__ w,          \
        const float* __restrict__ w_scale, const int* __restrict__ ids,                          \
        const float* __restrict__ route_w, int top_k, int n_exp, int hidden, int inter) {       \
        PDL_ENTRY();                                                                          \
        moe_gemv_down_impl<W>(out, h, w, w_scale, ids, route_w, top_k, n_exp, hidden, inter);    \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, 1) moe_ggemv_gate_up##SFX(       \
        bf16* __restrict__ h, const bf16* __restrict__ x, const W::T* __restrict__ w,            \
        const float* __restrict__ w_scale, const int* __restrict__ meta,                         \
        const int* __restrict__ slot_pair, int top_k, int inter, int hidden) {                   \
        PDL_ENTRY();                                                                          \
        moe_ggemv_gate_up_impl<W>(h, x, w, w_scale, meta, slot_pair, top_k, inter, hidden);      \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, 1) moe_ggemv_down##SFX(          \
        bf16* __restrict__ y, const bf16* __restrict__ h, const W::T* __restrict__ w,            \
        const float* __restrict__ w_scale, const int* __restrict__ meta,                         \
        const int* __restrict__ slot_pair, const float* __restrict__ route_w, int hidden,        \
        int inter) {                                                                             \
        PDL_ENTRY();                                                                          \
        moe_ggemv_down_impl<W>(y, h, w, w_scale, meta, slot_pair, route_w, hidden, inter);       \
    }

MOE_GEMV_KERNELS(MoeBf16, )
MOE_GEMV_KERNELS(MoeFp8, _fp8)
