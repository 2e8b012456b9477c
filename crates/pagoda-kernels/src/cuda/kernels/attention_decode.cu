// Paged DECODE attention (every sequence has exactly one query token), split
// over the context like vLLM's paged_attention_v2 / flash-decoding.
//
// Launches (shapes depend only on the step's shape, never on its values, so
// a CUDA graph captured for one decode step replays for any other of the same
// shape):
//   1. paged_decode_attention_{bf16,fp8}_hd{64,128,256}_g{1,2,4,8} (the
//      cache's element type: bf16, or FP8 E4M3 bytes read 8 at a time,
//      more loads in flight per lane than for bf16 (see DecUnroll),
//      decoded four at a time (fp8x4_to_f32), k_scale folded into q's scale
//      and v_scale into the output, f32 accumulation as for bf16): grid
//      (num_seqs, num_kv_heads, max_partitions), DEC_THREADS threads. Block
//      (s, kv, p) attends ALL query heads of kv head `kv`'s group (group =
//      num_heads / num_kv_heads <= G; heads past `group` are masked) over
//      cache positions [first + p * part_size, min(first + (p + 1) *
//      part_size, seq_len)) of sequence s, where seq_len =
//      context_lens[s] + 1 (token s is sequence s's query) and first = 0, or
//      seq_len - window with a sliding window (window > 0): the partitions
//      cover only the window, and no position before it is read.
//      Each K/V byte is read once per group, with 16-byte (8 x bf16) loads.
//      A block whose partition starts at or past seq_len exits at once. When
//      the sequence has ONE partition the block writes the bf16 output itself;
//      otherwise it writes, per head, the partition's max logit m and exp sum
//      l (f32, log2 domain) and its UNNORMALIZED sum_t 2^(s_t - m) v_t (f32),
//      and, given `counters` (num_seqs * num_kv_heads zeros, left zero), the
//      last of the sequence's blocks to finish merges them into the output
//      (dec_merge_if_last), so no second launch is needed.
//      With softcap > 0 each score is soft-capped (softcap_score, in the
//      log2 domain) in shared memory before the softmax.
//      Over an FP8 cache the host runs paged_decode_attention_fp8_tc_hd*
//      of attention_decode_mma.cu instead (tensor cores; same arguments,
//      grid, block and outputs), and these fp8 instantiations only when
//      asked to (PAGODA_DECODE_ATTENTION=cores).
//   2. paged_decode_reduce_bf16: grid (num_seqs, num_heads), 128 threads;
//      merges the partitions of sequences that have more than one (the
//      others return at once: launch 1 already wrote them). Only when launch
//      1 had no counters (the host has too few for the grid, or is told to
//      merge apart); skipped by the host when max_partitions == 1.
//   max_partitions = ceil(min(window, max_blocks_per_seq * block_size) /
//   part_size) (the window term only with a window), and part_size (64,
//   128, 256 or DEC_PARTITION = 512 tokens, a kernel argument) is chosen by
//   the host from the step's shape: both depend on the step's batch size,
//   block-table width and the layer's constant window, never on context
//   lengths.
//
// Inside a block of launch 1 (DEC_WARPS warps):
//   - phase 0: the cache slot of every token of the partition goes to shared
//     memory (one division per token per block, not per lane);
//   - phase 1 (QK): a token's K row is read by TPT = head_dim / 8 lanes, 16
//     bytes each (a warp reads 32 / TPT whole rows per load, coalesced);
//     each lane holds the matching 8 dims of q for the G heads in registers
//     (pre-scaled by scale * log2 e). The G partial dot products are summed
//     over the TPT lanes by a reduce-scatter (each shuffle step halves the
//     values a lane carries: G - 1 + log2(TPT / G) shuffles instead of
//     G * log2(TPT)); one lane per (token, head) writes the score to shared
//     memory. DEC_UNROLL (8, or 4 at G = 8; 12 over FP8, see DecUnroll) loads per lane are issued
//     before the first use.
//   - phase 2: per-head max and exp2 sum over the scores in shared memory
//     (scores become probabilities in place);
//   - phase 3 (PV): same lane layout on V, acc[G][8] in f32 registers; then
//     a shuffle reduction over the tokens of a warp and a shared-memory one
//     over the warps.
// Shared memory (sized for the largest partition): DEC_PARTITION ints +
// max(DEC_PARTITION, DEC_WARPS *
// head_dim) * G floats (+ a little), i.e. 18 KiB at G = 8 up to head_dim
// 128 and 34 KiB at head_dim 256: the cross-warp acc (DEC_WARPS * G *
// head_dim floats) reuses the score buffer.
//
// Partition size: 512 tokens wherever the step has enough blocks without
// splitting further: a 1000-token context splits in two, so batch 256 x 8 kv
// heads gives 4096 busy blocks (many waves on 132 SMs); each block streams up
// to 512 KiB of K+V (hd 128), so its fixed costs (slot table, softmax
// reductions, (hd + 2) * 4 bytes of partials per head written and read back)
// stay under ~2% of its traffic. A small batch would leave most SMs idle at
// 512 (batch 1, 8 kv heads, 1000 tokens: 16 blocks on 132 SMs, each
// streaming 256 KiB alone), so the host halves the partition, down to 64,
// while the grid has under 1.5 blocks per SM per 512 tokens of context (the
// sizes measured fastest on an H200); the partials then cost
// more per K/V byte but the step's latency falls with the wider grid.
// Blocks of partitions past a sequence's end cost a launch and an exit each:
// the block-table width (max_blocks_per_seq) should not be far above the
// longest sequence served.
//
// Costs at the Qwen3-0.6B shape (16 heads, 8 kv heads, head_dim 128, 28
// layers), batch 256 with 1000-token contexts (seq_len 1001, two partitions):
//   K + V read per layer: 256 * 1001 * 8 * 128 * 2 B * 2 = 1.05 GB
//   (q 1 MiB, output 1 MiB, partials 2 * 256 * 16 * 2 * 130 * 4 B = 8.5 MB:
//   about 1.06 GB moved per layer step), so ~0.26 ms per layer at ~4 TB/s,
//   ~7.4 ms per decode step over the 28 layers.
// Arithmetic: 2 * G * head_dim FMAs per token and kv head against 4 *
// head_dim bytes, i.e. G / 2 FMA per byte: memory-bound for G <= 4 on
// CUDA cores; G = 8 needs ~4 FMA per byte (plus conversions and shuffles) and
// may become issue-bound (a tensor-core variant would be the next step).

#define DEC_PARTITION 512
#define DEC_WARPS 4
#define DEC_THREADS (DEC_WARPS * 32)
// K or V loads a lane issues before the first use (fewer at G = 8, whose
// q and acc registers would otherwise push the kernel past 128 registers).
// An FP8 lane's load is 8 bytes, not 16: below G = 8 it issues 12, so a
// lane keeps 96 bytes in flight (bf16: 128) at the registers of the bf16
// kernel (each FP8 load holds half of them); 16 would spill, and so does 12
// at head_dim 64, G = 2 (ptxas, sm_90), which keeps 8. At G = 8 the
// registers are spent already (4 loads, as for bf16).
#define DEC_UNROLL(G) ((G) >= 8 ? 4 : 8)
template <typename KV, int D, int G>
struct DecUnroll {
    static constexpr int value = DEC_UNROLL(G);
};
template <int D, int G>
struct DecUnroll<fp8, D, G> {
    static constexpr int value = (G) >= 8 ? 4 : (D == 64 && G == 2 ? 8 : 12);
};
#define DEC_LOG2E 1.4426950408889634f

// 16 bytes of bf16 through the read-only path.
__device__ __forceinline__ uint4 dec_load16(const bf16* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ void dec_unpack(uint4 v, float* f) {
    f[0] = __uint_as_float(v.x << 16);
    f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16);
    f[3] = __uint_as_float(v.y & 0xffff0000u);
    f[4] = __uint_as_float(v.z << 16);
    f[5] = __uint_as_float(v.z & 0xffff0000u);
    f[6] = __uint_as_float(v.w << 16);
    f[7] = __uint_as_float(v.w & 0xffff0000u);
}

// 8 consecutive cache elements of a lane's chunk: 16 bytes of bf16, or 8
// bytes of FP8 (half the traffic), through the read-only path, unpacked to
// f32 (FP8 through fp82f; the scales are applied outside the loop).
template <typename KV>
struct DecKv8;
template <>
struct DecKv8<bf16> {
    typedef uint4 Raw;
    static __device__ __forceinline__ Raw zero() { return make_uint4(0u, 0u, 0u, 0u); }
    static __device__ __forceinline__ Raw load(const bf16* p) { return dec_load16(p); }
    static __device__ __forceinline__ void unpack(Raw v, float* f) { dec_unpack(v, f); }
};
template <>
struct DecKv8<fp8> {
    typedef uint2 Raw;
    static __device__ __forceinline__ Raw zero() { return make_uint2(0u, 0u); }
    static __device__ __forceinline__ Raw load(const fp8* p) {
        return __ldg(reinterpret_cast<const uint2*>(p));
    }
    static __device__ __forceinline__ void unpack(Raw v, float* f) {
        fp8x4_to_f32(v.x, f);
        fp8x4_to_f32(v.y, f + 4);
    }
};

// Reduce-scatter of N partial sums over the lanes whose index differs in the
// bits O, O/2, ..., 1 (all compile-time). While N > 1, a lane keeps half of
// its values (the upper half where its bit O is set) and receives its
// partner's matching half; `gi` tracks which head s[0] ends up holding. Once
// N == 1 it is a plain all-reduce, and `writer` stays true on one lane of
// each set of lanes holding the same head.
template <int N, int O>
__device__ __forceinline__ void dec_reduce_scatter(float* s, int lane, int& gi, bool& writer) {
    if constexpr (O > 0) {
        if constexpr (N > 1) {
            constexpr int H = N / 2;
            const bool upper = (lane & O) != 0;
#pragma unroll
            for (int i = 0; i < H; i++) {
                float send = upper ? s[i] : s[i + H];
                float keep = upper ? s[i + H] : s[i];
                s[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
            if (upper) {
                gi += H;
            }
            dec_reduce_scatter<H, O / 2>(s, lane, gi, writer);
        } else {
            s[0] += __shfl_xor_sync(0xffffffffu, s[0], O);
            if (lane & O) {
                writer = false;
            }
            dec_reduce_scatter<1, O / 2>(s, lane, gi, writer);
        }
    }
}

// Max (IS_MAX) or sum of `v` over the threads of the block with the same
// tid % G (G divides 32); every thread gets the result for its own tid % G.
// `red` holds DEC_WARPS * G floats.
template <int G, bool IS_MAX>
__device__ __forceinline__ float dec_block_reduce(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o >= G; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = IS_MAX ? fmaxf(v, w) : v + w;
    }
    if (lane < G) {
        red[warp * G + lane] = v;
    }
    __syncthreads();
    const int g = threadIdx.x % G;
    float r = red[g];
#pragma unroll
    for (int w = 1; w < DEC_WARPS; w++) {
        r = IS_MAX ? fmaxf(r, red[w * G + g]) : r + red[w * G + g];
    }
    __syncthreads();
    return r;
}

// The partition merge, folded into launch 1 ("the last block merges"):
// every block of a multi-partition sequence has written its partials when it
// calls this; it makes them visible device-wide (__threadfence) and counts
// itself in `*counter` (one per (sequence, kv head)). The block that counts
// last (the nparts-th) sees every other block's partials, merges the
// group's heads into `out` (out = sum_p 2^(m_p - M) acc_p / sum_p 2^(m_p -
// M) l_p, M = max_p m_p, as paged_decode_reduce_bf16) and sets the counter
// back to 0, so every launch, graph replays included, finds it zeroed. One
// warp merges one head: lane p holds partition p's weight (32 at a time,
// shuffled to the others), lanes read dims lane + 32 i of each partition's
// acc (coalesced, through L2: the partials were written by other blocks).
template <int D>
__device__ __forceinline__ void dec_merge_if_last(bf16* __restrict__ out,
                                                  const float* __restrict__ part_acc,
                                                  const float* __restrict__ part_ml,
                                                  unsigned* __restrict__ counter, long long head0,
                                                  int group, int max_parts, int nparts) {
    __shared__ unsigned s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        s_last = atomicAdd(counter, 1u) == (unsigned)(nparts - 1) ? 1u : 0u;
    }
    __syncthreads();
    if (s_last == 0u) {
        return;
    }
    __threadfence();
    if (threadIdx.x == 0) {
        *counter = 0u;
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int h = warp; h < group; h += DEC_WARPS) {
        const long long slot0 = (head0 + h) * max_parts;
        const float* ml = part_ml + slot0 * 2;
        float gm = NEG_INF;
        for (int p = lane; p < nparts; p += 32) {
            gm = fmaxf(gm, __ldcg(ml + 2 * p));
        }
        gm = warp_max(gm);
        float o[D / 32];
#pragma unroll
        for (int i = 0; i < D / 32; i++) {
            o[i] = 0.0f;
        }
        float gl = 0.0f;
        for (int p0 = 0; p0 < nparts; p0 += 32) {
            float w = 0.0f;
            if (p0 + lane < nparts) {
                w = exp2f(__ldcg(ml + 2 * (p0 + lane)) - gm);
                gl += __ldcg(ml + 2 * (p0 + lane) + 1) * w;
            }
            const int cnt = min(32, nparts - p0);
            const float* acc = part_acc + (slot0 + p0) * D + lane;
#pragma unroll 4
            for (int k = 0; k < cnt; k++) {
                const float wk = __shfl_sync(0xffffffffu, w, k);
#pragma unroll
                for (int i = 0; i < D / 32; i++) {
                    o[i] = fmaf(wk, __ldcg(acc + (long long)k * D + 32 * i), o[i]);
                }
            }
        }
        const float inv = 1.0f / warp_sum(gl);
        bf16* dst = out + (head0 + h) * D + lane;
#pragma unroll
        for (int i = 0; i < D / 32; i++) {
            dst[32 * i] = f2bf(o[i] * inv);
        }
    }
}

// Phase 2 of the decode kernels (this file's and attention_decode_mma.cu's):
// the scores s_score[t * G + h] of the partition's n tokens become softmax
// numerators 2^(s - m_h) in place, soft-capped first (in the log2 domain)
// where softcap > 0; s_m[h] and s_l[h] get each head's max and sum. Thread
// tid sees only head tid % G (G divides DEC_THREADS). Ends with a barrier.
template <int G>
__device__ __forceinline__ void dec_softmax(float* s_score, int n, float softcap, float* s_red,
                                            float* s_m, float* s_l) {
    const int tid = threadIdx.x;
    float m = NEG_INF;
    if (softcap > 0.0f) {
        const float cap_log2 = softcap * DEC_LOG2E;
        for (int i = tid; i < n * G; i += DEC_THREADS) {
            const float x = softcap_score(s_score[i], cap_log2);
            s_score[i] = x;
            m = fmaxf(m, x);
        }
    } else {
        for (int i = tid; i < n * G; i += DEC_THREADS) {
            m = fmaxf(m, s_score[i]);
        }
    }
    m = dec_block_reduce<G, true>(m, s_red);
    float l = 0.0f;
    for (int i = tid; i < n * G; i += DEC_THREADS) {
        const float p = exp2f(s_score[i] - m);
        s_score[i] = p;
        l += p;
    }
    l = dec_block_reduce<G, false>(l, s_red);
    if (tid < G) {
        s_m[tid] = m;
        s_l[tid] = l;
    }
    __syncthreads();
}

// The end of the decode kernels: each of the group's heads h < group sums
// the warps' s_acc[(w * G + h) * D + d], scales by v_scale, and writes the
// bf16 output (the sequence's only partition) or the partition's partials
// (acc, then m and l); with `counters`, the last block of a split sequence
// then merges (dec_merge_if_last).
template <int D, int G>
__device__ __forceinline__ void dec_write(bf16* __restrict__ out, float* __restrict__ part_acc,
                                          float* __restrict__ part_ml, unsigned* counter,
                                          const float* s_acc, const float* s_m, const float* s_l,
                                          float v_scale, long long head0, int group,
                                          int max_parts, int part, int nparts) {
    const bool single = nparts == 1;
    for (int idx = threadIdx.x; idx < G * D; idx += DEC_THREADS) {
        const int h = idx / D;
        const int d = idx - h * D;
        if (h >= group) {
            break;  // idx only grows, and so does h
        }
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) {
            o += s_acc[(w * G + h) * D + d];
        }
        o *= v_scale;
        if (single) {
            out[(head0 + h) * D + d] = f2bf(o / s_l[h]);
        } else {
            const long long slot = (head0 + h) * max_parts + part;
            part_acc[slot * D + d] = o;
            if (d == 0) {
                part_ml[slot * 2] = s_m[h];
                part_ml[slot * 2 + 1] = s_l[h];
            }
        }
    }
    if (!single && counter != nullptr) {
        dec_merge_if_last<D>(out, part_acc, part_ml, counter, head0, group, max_parts, nparts);
    }
}

// The positions partition `part` of sequence `seq` covers: [start, start +
// n), n <= 0 when the partition lies past them (its block returns), and the
// `span` the partitions tile. The
// sequence's positions are clamped to its block table, so even a corrupt
// length reads only the sequence's own table row (the host checked every
// block id it holds); partitions tile the `span` positions the query sees,
// [n_seq - span, n_seq): all of them, or the last `window` (nothing before
// is read).
struct DecSpan {
    int start;
    int n;
    int span;  // the positions all partitions tile
};

__device__ __forceinline__ DecSpan dec_span(const int* __restrict__ context_lens, int seq,
                                            int max_blocks_per_seq, int block_size, int part,
                                            int part_size, int window) {
    const int n_seq = min(context_lens[seq] + 1, max_blocks_per_seq * block_size);
    const int span = window > 0 ? min(window, n_seq) : n_seq;
    const int off = part * part_size;
    return DecSpan{n_seq - span + off, min(part_size, span - off), span};
}

// Phase 0 of both decode kernels: the cache slot of each of the n positions
// from `start` into s_slot, by the block's DEC_THREADS threads.
__device__ __forceinline__ void dec_slots(int* __restrict__ s_slot,
                                          const int* __restrict__ block_tables, int seq,
                                          int max_blocks_per_seq, int block_size, int start,
                                          int n) {
    const int* table = block_tables + (long long)seq * max_blocks_per_seq;
    for (int i = threadIdx.x; i < n; i += DEC_THREADS) {
        const int pos = start + i;
        const int b = pos / block_size;
        s_slot[i] = table[b] * block_size + (pos - b * block_size);
    }
}

template <int D, int G, typename KV>
__device__ __forceinline__ void paged_decode_attention(
    bf16* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
    unsigned* __restrict__ counters, const bf16* __restrict__ q, const KV* __restrict__ k_cache,
    const KV* __restrict__ v_cache, const float* __restrict__ kv_scales,
    const int* __restrict__ context_lens,
    const int* __restrict__ block_tables, int max_blocks_per_seq, int block_size,
    int num_heads, int num_kv_heads, int max_parts, int part_size, float scale, int window,
    float softcap) {
    constexpr int TPT = D / 8;      // lanes per token row (32, 16 or 8)
    constexpr int TPW = 32 / TPT;   // token rows per warp load (1, 2 or 4)
    constexpr int U = DecUnroll<KV, D, G>::value;
    constexpr int STEP = DEC_WARPS * TPW * U;  // tokens per block pass
    // The scores, later the cross-warp acc ([DEC_WARPS][G][D], larger at D = 256).
    constexpr int SCORES = (DEC_PARTITION > DEC_WARPS * D ? DEC_PARTITION : DEC_WARPS * D) * G;
    static_assert(G <= TPT, "a group must not exceed the lanes of a row");

    __shared__ int s_slot[DEC_PARTITION];
    __shared__ __align__(16) float s_score[SCORES];
    __shared__ float s_red[DEC_WARPS * G];
    __shared__ float s_m[G];
    __shared__ float s_l[G];

    const int seq = blockIdx.x;
    const int kv = blockIdx.y;
    const int part = blockIdx.z;
    const DecSpan sp =
        dec_span(context_lens, seq, max_blocks_per_seq, block_size, part, part_size, window);
    if (sp.n <= 0) {
        return;
    }
    const int start = sp.start;
    const int n = sp.n;
    const int group = num_heads / num_kv_heads;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int j = lane % TPT;  // this lane's 8-dim chunk of a row
    const int tg = lane / TPT; // this lane's row within a warp load

    // Phase 0: cache slot of every token of the partition.
    dec_slots(s_slot, block_tables, seq, max_blocks_per_seq, block_size, start, n);

    // This lane's 8 dims of q for each head of the group, in the log2 domain.
    float qf[G][8];
    // An FP8 cache's k_scale folds into q's scale (v_scale into the output).
    const float qs = scale * DEC_LOG2E * kv_scale<KV>(kv_scales, 0);
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (g < group) {
            const long long head = (long long)kv * group + g;
            dec_unpack(dec_load16(q + ((long long)seq * num_heads + head) * D + 8 * j), qf[g]);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                qf[g][i] *= qs;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                qf[g][i] = 0.0f;
            }
        }
    }
    __syncthreads();

    const long long row = (long long)num_kv_heads * D;  // elements per slot
    const KV* k_base = k_cache + (long long)kv * D + 8 * j;
    const KV* v_base = v_cache + (long long)kv * D + 8 * j;
    using Ld = DecKv8<KV>;

    // Phase 1: scores s[t][g] = q_g . k_t (log2 domain).
    for (int base = warp * TPW * U; base < n; base += STEP) {
        typename Ld::Raw kr[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int t = base + u * TPW + tg;
            kr[u] = Ld::zero();
            if (t < n) {
                kr[u] = Ld::load(k_base + (long long)s_slot[t] * row);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float kf[8];
            Ld::unpack(kr[u], kf);
            float s[G];
#pragma unroll
            for (int g = 0; g < G; g++) {
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    a = fmaf(qf[g][i], kf[i], a);
                }
                s[g] = a;
            }
            int gi = 0;
            bool writer = true;
            dec_reduce_scatter<G, TPT / 2>(s, lane, gi, writer);
            const int t = base + u * TPW + tg;
            if (writer && t < n) {
                s_score[t * G + gi] = s[0];
            }
        }
    }
    __syncthreads();

    // Phase 2: softmax numerators in place.
    dec_softmax<G>(s_score, n, softcap, s_red, s_m, s_l);

    // Phase 3: acc[g] = sum_t p[t][g] * v_t over this lane's 8 dims.
    float acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            acc[g][i] = 0.0f;
        }
    }
    for (int base = warp * TPW * U; base < n; base += STEP) {
        typename Ld::Raw vr[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int t = base + u * TPW + tg;
            vr[u] = Ld::zero();
            if (t < n) {
                vr[u] = Ld::load(v_base + (long long)s_slot[t] * row);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int t = base + u * TPW + tg;
            float p[G];
            if (t < n) {
                if constexpr (G % 4 == 0) {
#pragma unroll
                    for (int g = 0; g < G; g += 4) {
                        const float4 p4 = *reinterpret_cast<const float4*>(&s_score[t * G + g]);
                        p[g] = p4.x;
                        p[g + 1] = p4.y;
                        p[g + 2] = p4.z;
                        p[g + 3] = p4.w;
                    }
                } else if constexpr (G == 2) {
                    const float2 p2 = *reinterpret_cast<const float2*>(&s_score[t * G]);
                    p[0] = p2.x;
                    p[1] = p2.y;
                } else {
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        p[g] = s_score[t * G + g];
                    }
                }
            } else {
#pragma unroll
                for (int g = 0; g < G; g++) {
                    p[g] = 0.0f;
                }
            }
            float vf[8];
            Ld::unpack(vr[u], vf);
#pragma unroll
            for (int g = 0; g < G; g++) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    acc[g][i] = fmaf(p[g], vf[i], acc[g][i]);
                }
            }
        }
    }

    // Sum over the rows of a warp load (lanes with the same chunk j).
#pragma unroll
    for (int o = TPT; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < G; g++) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], o);
            }
        }
    }
    __syncthreads();  // every warp is done reading probabilities
    float* s_acc = s_score;  // [DEC_WARPS][G][D]
    if (tg == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            float4* dst = reinterpret_cast<float4*>(&s_acc[(warp * G + g) * D + 8 * j]);
            dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
            dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
        }
    }
    __syncthreads();

    const long long head0 = (long long)seq * num_heads + (long long)kv * group;
    dec_write<D, G>(out, part_acc, part_ml,
                    counters == nullptr ? nullptr : counters + (long long)seq * num_kv_heads + kv,
                    s_acc, s_m, s_l, kv_scale<KV>(kv_scales, 1), head0, group, max_parts, part,
                    (sp.span + part_size - 1) / part_size);
}

// Entry points: one per (cache element, head_dim, G), spelled out so their
// names stay greppable; the arguments are the same for all but the cache's
// element type. They live in attention_decode_bf16.cu (with the reduce
// kernel) and attention_decode_fp8.cu, one compile unit each, both after
// this file (which declares no entry point), so the two compile side by side.
#define DEC_PARAMS(KV)                                                                    \
    bf16 *__restrict__ out, float *__restrict__ part_acc, float *__restrict__ part_ml,    \
        unsigned *__restrict__ counters, const bf16 *__restrict__ q,                      \
        const KV *__restrict__ k_cache, const KV *__restrict__ v_cache,                   \
        const float *__restrict__ kv_scales,                                              \
        const int *__restrict__ context_lens, const int *__restrict__ block_tables,       \
        int max_blocks_per_seq, int block_size, int num_heads, int num_kv_heads,          \
        int max_parts, int part_size, float scale, int window, float softcap
#define DEC_CALL(D, G, KV)                                                                \
    paged_decode_attention<D, G, KV>(out, part_acc, part_ml, counters, q, k_cache,      \
                                     v_cache,                                            \
                                     kv_scales, context_lens, block_tables,              \
                                     max_blocks_per_seq, block_size, num_heads,          \
                                     num_kv_heads, max_parts, part_size, scale, window,  \
                                     softcap)
