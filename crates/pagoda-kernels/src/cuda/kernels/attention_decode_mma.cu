// Paged DECODE attention over an FP8 E4M3 cache on tensor cores:
// paged_decode_attention_fp8_tc_hd{64,128,256}. Same launch, arguments,
// partitions and outputs as paged_decode_attention_fp8_hd*_g* of
// attention_decode.cu (grid (num_seqs, num_kv_heads, max_partitions),
// DEC_THREADS threads, part_size tokens per block, the bf16 output for
// single-partition sequences, else the f32 partials that
// paged_decode_reduce_bf16 merges), so that file's guarantees hold as
// written there: launch shapes never depend on context lengths (graph
// replay), the window's partitions start at its first position, blocks past
// a sequence's end exit at once, k_scale folds into the scores' scale and
// v_scale into the output. Sliding window and soft-cap are arguments.
//
// Why: per cache byte the CUDA-core kernel decodes one FP8 element and does
// G FMAs with it (bf16: half of that per byte), which makes it issue-bound
// at ~60% of the bandwidth bf16 reaches. Here both products run on
// mma.sync m16n8k16 (f16 in, f32 accumulate), so per element what is left
// on the CUDA cores is half a convert (cvt.rn.f16x2.e4m3x2, exact: every
// E4M3 value is an f16) plus, for V, half a byte permute.
//
// Shapes (g = lane / 4, c = lane % 4; layouts as in attention_prefill_mma.cu):
//   QK: S^T[16 keys x 8 heads] = K[16 x D] . Q^T[D x 8]: A = K tiles, B = q.
//       The query heads are the N = 8 columns, so one kernel serves every
//       group of 1..8 (heads past `group` are zero and never written) and
//       nothing is padded to 16. The reduction order over head dims is
//       free, so lane (g, c) reads 16-byte chunks of ITS OWN slice of dims
//       [c D/4, (c+1) D/4) of keys g and g + 8 (four lanes cover a row:
//       coalesced) and k-step ks takes slice bytes 4ks..4ks+3 (a0/a1: 4ks,
//       4ks+1 of keys g, g+8; a2/a3: 4ks+2, 4ks+3); q is held the same way
//       (b0/b1: words 2ks, 2ks+1 of head g's slice, in registers).
//   PV: O^T[D x 8 heads] += V^T[D x 16 keys] . P^T[16 keys x 8 heads]: A =
//       V tiles, B = probabilities. Keys and dims are both relabelled: lane
//       (g, c) reads dims [g D/8, (g+1) D/8) (eight lanes cover a row) of
//       keys 4c..4c+3 of the tile; m-tile mt's rows g and g + 8 are dims
//       g D/8 + 2mt and + 1, its k pairs (2c, 2c+1), (2c+8, 2c+9) keys
//       (4c, 4c+1), (4c+2, 4c+3). One prmt per key pair and m-tile pairs
//       up the bytes of two keys before the convert; P is packed to f16x2
//       from the scores in shared memory.
// q in f16: q's bf16 values are scaled by 2^e, e chosen per block from the
// group's largest |q| (amax 2^e in [2^14, 2^15)), so no q overflows f16 and
// every bf16 q value above amax 2^-29 stays exact (f16 has more mantissa
// than bf16); 2^-e folds into the scores' f32 scale with k_scale. Products
// (<= 2^15 x 448) and their sums stay far inside f32. P in f16 is rounded
// to 11 bits (the CUDA-core kernel keeps f32): relative error 2^-12 per
// weight, far below the bf16 output's rounding.
// Phases as in attention_decode.cu: slot table, scores to shared memory
// ([token][8] f32), per-head softmax in place (soft-capped first where
// asked), PV, cross-warp sum in shared memory reusing the score buffer.
// Each warp walks 16-key tiles w, w + 4, ... and issues U = 256 / D tiles'
// loads (128 bytes per lane, as the bf16 kernel) before the first use;
// keys past the partition read nothing (zero bytes, probability 0).
// Shared memory: DEC_PARTITION ints + max(DEC_PARTITION, DEC_WARPS D) * 8
// floats: 18 KiB up to head_dim 128, 34 KiB at 256.
//
// Needs sm_80 (mma.sync f16, as the prefill kernels); the e4m3 convert is
// hardware on sm_89+, the exact integer decode of prelude.cuh below. The
// bf16 cache keeps the CUDA-core kernel: at G / 2 FMA per byte it already
// runs at ~92% of copy bandwidth. The host picks (attention_decode.rs).

// 32-bit f16 pair from two f32 (`lo` in bits 0..15), rounded to nearest even.
__device__ __forceinline__ unsigned dtc_pack_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The four E4M3 bytes of w (lowest first) as two f16 pairs: lo = bytes 0, 1,
// hi = bytes 2, 3 (the lower byte in the lower half). Exact.
__device__ __forceinline__ void dtc_e4m3x4(unsigned w, unsigned& lo, unsigned& hi) {
#if __CUDA_ARCH__ >= 890
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
#else
    float f[4];
    fp8x4_to_f32(w, f);
    lo = dtc_pack_f16x2(f[0], f[1]);
    hi = dtc_pack_f16x2(f[2], f[3]);
#endif
}

// Bytes of {b, a} picked by `sel` (PTX prmt: nibble i picks result byte i,
// 0..3 from a, 4..7 from b).
__device__ __forceinline__ unsigned dtc_prmt(unsigned a, unsigned b, unsigned sel) {
    unsigned r;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// d += a * b for one m16n8k16 tile (f16 operands, f32 accumulators).
__device__ __forceinline__ void dtc_mma(float* d, unsigned a0, unsigned a1, unsigned a2,
                                       unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// W consecutive 32-bit words at p (16-byte aligned for W >= 4, 8-byte for
// W == 2) through the read-only path.
template <int W>
__device__ __forceinline__ void dtc_load(const fp8* p, unsigned* w) {
    if constexpr (W >= 4) {
#pragma unroll
        for (int i = 0; i < W / 4; i++) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
        }
    } else {
        static_assert(W == 2, "8 or 16n bytes");
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
        w[0] = v.x;
        w[1] = v.y;
    }
}

template <int W>
__device__ __forceinline__ void dtc_zero(unsigned* w) {
#pragma unroll
    for (int i = 0; i < W; i++) {
        w[i] = 0u;
    }
}

#define DTC_N 8     // query-head columns of an mma (the largest group)
#define DTC_TILE 16 // keys per mma tile

template <int D>
__device__ __forceinline__ void paged_decode_attention_tc(
    bf16* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
    unsigned* __restrict__ counters, const bf16* __restrict__ q, const fp8* __restrict__ k_cache,
    const fp8* __restrict__ v_cache,
    const float* __restrict__ kv_scales, const int* __restrict__ context_lens,
    const int* __restrict__ block_tables, int max_blocks_per_seq, int block_size, int num_heads,
    int num_kv_heads, int max_parts, int part_size, float scale, int window, float softcap) {
    constexpr int U = 256 / D;      // tiles whose loads a warp issues at once
    constexpr int KS = D / 16;      // QK k-steps = PV m-tiles
    constexpr int KW = D / 16;      // K words a lane reads per key (D / 4 bytes)
    constexpr int VW = D / 32;      // V words a lane reads per key (D / 8 bytes)
    constexpr int STEP = DEC_WARPS * U * DTC_TILE;  // tokens per block pass
    constexpr int SCORES = (DEC_PARTITION > DEC_WARPS * D ? DEC_PARTITION : DEC_WARPS * D) * DTC_N;
    static_assert(DEC_PARTITION % DTC_TILE == 0, "whole tiles");

    __shared__ int s_slot[DEC_PARTITION];
    __shared__ __align__(16) float s_score[SCORES];
    __shared__ float s_red[DEC_WARPS * DTC_N];
    __shared__ float s_m[DTC_N];
    __shared__ float s_l[DTC_N];

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
    const int g = lane >> 2;
    const int c = lane & 3;

    // Phase 0: cache slot of every token of the partition.
    dec_slots(s_slot, block_tables, seq, max_blocks_per_seq, block_size, start, n);

    // Head g's dims [c D/4, (c+1) D/4) of q as f16 pairs scaled by 2^e (zero
    // for heads past the group); every warp holds the same fragments.
    const long long head0 = (long long)seq * num_heads + (long long)kv * group;
    unsigned qw[D / 8];
#pragma unroll
    for (int i = 0; i < D / 32; i++) {
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (g < group) {
            v = dec_load16(q + (head0 + g) * D + c * (D / 4) + 8 * i);
        }
        qw[4 * i] = v.x;
        qw[4 * i + 1] = v.y;
        qw[4 * i + 2] = v.z;
        qw[4 * i + 3] = v.w;
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
        amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(qw[i] << 16)),
                                 fabsf(__uint_as_float(qw[i] & 0xffff0000u))));
    }
    amax = warp_max(amax);
    // amax 2^e in [2^14, 2^15); e clamped so 2^e and 2^-e are normal f32.
    const int e = max(-64, min(64, 141 - (int)((__float_as_uint(amax) >> 23) & 0xffu)));
    const float up = __uint_as_float((unsigned)(127 + e) << 23);
    const float down = __uint_as_float((unsigned)(127 - e) << 23);
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
        qw[i] = dtc_pack_f16x2(__uint_as_float(qw[i] << 16) * up,
                               __uint_as_float(qw[i] & 0xffff0000u) * up);
    }
    // Scores in the log2 domain; an FP8 cache's k_scale folds in here.
    const float sc = scale * DEC_LOG2E * kv_scales[0] * down;
    __syncthreads();

    const long long row = (long long)num_kv_heads * D;  // bytes per slot

    // Phase 1: s[t][h] = q_h . k_t for keys g and g + 8 of each tile.
    const fp8* k_base = k_cache + (long long)kv * D + c * (D / 4);
    for (int base = warp * U * DTC_TILE; base < n; base += STEP) {
        unsigned kw[U][2][KW];
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int t = base + u * DTC_TILE + g + 8 * h;
                if (t < n) {
                    dtc_load<KW>(k_base + (long long)s_slot[t] * row, kw[u][h]);
                } else {
                    dtc_zero<KW>(kw[u][h]);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                unsigned a0, a1, a2, a3;
                dtc_e4m3x4(kw[u][0][ks], a0, a2);
                dtc_e4m3x4(kw[u][1][ks], a1, a3);
                dtc_mma(s, a0, a1, a2, a3, qw[2 * ks], qw[2 * ks + 1]);
            }
            // s[0], s[1]: key g, heads 2c, 2c + 1; s[2], s[3]: key g + 8.
            const int t = base + u * DTC_TILE + g;
            if (t < n) {
                *reinterpret_cast<float2*>(&s_score[t * DTC_N + 2 * c]) =
                    make_float2(s[0] * sc, s[1] * sc);
            }
            if (t + 8 < n) {
                *reinterpret_cast<float2*>(&s_score[(t + 8) * DTC_N + 2 * c]) =
                    make_float2(s[2] * sc, s[3] * sc);
            }
        }
    }
    __syncthreads();

    // Phase 2: softmax numerators in place.
    dec_softmax<DTC_N>(s_score, n, softcap, s_red, s_m, s_l);

    // Phase 3: acc[mt] = O^T rows (dims g D/8 + 2mt, + 1) x heads (2c, 2c + 1).
    float acc[KS][4];
#pragma unroll
    for (int mt = 0; mt < KS; mt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc[mt][i] = 0.0f;
        }
    }
    const fp8* v_base = v_cache + (long long)kv * D + g * (D / 8);
    for (int base = warp * U * DTC_TILE; base < n; base += STEP) {
        unsigned vw[U][4][VW];
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int t = base + u * DTC_TILE + 4 * c + j;
                if (t < n) {
                    dtc_load<VW>(v_base + (long long)s_slot[t] * row, vw[u][j]);
                } else {
                    dtc_zero<VW>(vw[u][j]);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int t = base + u * DTC_TILE + 4 * c;
            float p[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                p[j] = t + j < n ? s_score[(t + j) * DTC_N + g] : 0.0f;
            }
            const unsigned b0 = dtc_pack_f16x2(p[0], p[1]);
            const unsigned b1 = dtc_pack_f16x2(p[2], p[3]);
#pragma unroll
            for (int mt = 0; mt < KS; mt++) {
                // Dims 2mt, 2mt + 1 of the lane's chunk: bytes 0, 1 (even mt)
                // or 2, 3 of word mt / 2; pair each with the next key's.
                const unsigned sel = (mt & 1) ? 0x7362u : 0x5140u;
                const unsigned x01 = dtc_prmt(vw[u][0][mt / 2], vw[u][1][mt / 2], sel);
                const unsigned x23 = dtc_prmt(vw[u][2][mt / 2], vw[u][3][mt / 2], sel);
                unsigned a0, a1, a2, a3;
                dtc_e4m3x4(x01, a0, a1);
                dtc_e4m3x4(x23, a2, a3);
                dtc_mma(acc[mt], a0, a1, a2, a3, b0, b1);
            }
        }
    }
    __syncthreads();  // every warp is done reading probabilities

    // Cross-warp sum: s_acc[warp][head][dim].
    float* s_acc = s_score;
#pragma unroll
    for (int mt = 0; mt < KS; mt++) {
        const int d = g * (D / 8) + 2 * mt;
        *reinterpret_cast<float2*>(&s_acc[(warp * DTC_N + 2 * c) * D + d]) =
            make_float2(acc[mt][0], acc[mt][2]);
        *reinterpret_cast<float2*>(&s_acc[(warp * DTC_N + 2 * c + 1) * D + d]) =
            make_float2(acc[mt][1], acc[mt][3]);
    }
    __syncthreads();

    dec_write<D, DTC_N>(out, part_acc, part_ml,
                        counters == nullptr ? nullptr
                                            : counters + (long long)seq * num_kv_heads + kv,
                        s_acc, s_m, s_l, kv_scales[1], head0, group, max_parts, part,
                        (sp.span + part_size - 1) / part_size);
}

// Entry points, one per head_dim (every group of 1..8 shares one); the
// arguments are those of the CUDA-core FP8 kernels (DEC_PARAMS).
#define DTC_CALL(D)                                                                       \
    paged_decode_attention_tc<D>(out, part_acc, part_ml, counters, q, k_cache, v_cache,  \
                                 kv_scales,                                              \
                                 context_lens, block_tables, max_blocks_per_seq,         \
                                 block_size, num_heads, num_kv_heads, max_parts,         \
                                 part_size, scale, window, softcap)

extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_tc_hd64(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DTC_CALL(64);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_tc_hd128(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DTC_CALL(128);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_tc_hd256(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DTC_CALL(256);
}
