// Sampling on the device: one token id per bf16 logits row, with the host
// sampler's semantics (crates/pagoda-engine/src/sampler.rs), one thread block
// per row, rows independent of each other (batch invariant).
//
// Semantics, per row (parameters: 6 ints of the packed step, see storage.rs):
// - temperature NaN or < 1e-5: greedy argmax; ties to the lowest id, NaN never
//   chosen, token 0 when no logit is above -inf;
// - else v = x / T (NaN -> -inf), w = exp(v - max v) (0 below e^-87; tokens at
//   +inf weigh 1 and the rest 0 when max v is +inf); top-k keeps the k best
//   ranked, top-p the shortest ranked prefix (of the top-k set) whose mass
//   reaches p times the top-k mass (at least one token), min-p drops w < min_p
//   (p_i < min_p * p_max, as w_max = 1); one draw u = (random >> 11) * 2^-53
//   picks the first token whose inclusive cumulative mass exceeds u * total.
//   Ranking is by logit descending, then id ascending (w is monotone in the
//   logit, so this is the host's weight-then-id rank).
// - walk order of the draw, as the host: ascending id when neither top-k nor
//   top-p filters (the host's dense support, min-p or not); rank order when
//   either does (the host's sparse candidate list).
//
// Exactness: every mass is an integer, q = round(w * 2^40), so all sums are
// exact and independent of the summation order (the result for a row is a
// function of that row alone). Totals stay below 2^63 for vocab < 2^23.
// Differences from the host's f64 sums of f32 weights (~1e-7 relative) only
// move a boundary; a token with 0 < w < 2^-41 (q = 0) is never drawn.
//
// Algorithm (no sort): keys are the 16-bit bf16 bit patterns made monotone
// (NaN as -inf, -0 as +0). A radix select in two levels (2048 bins of key >> 5
// with counts and masses, then the 32 codes of one bin) finds the exact key at
// any rank or mass threshold; ties at that key have equal weight, so how many
// of them a threshold keeps is arithmetic, and they are taken lowest id first.
// The draw is one more select by mass; the j-th tie in id order (rarely
// needed: j = 0 is the bin's smallest id, tracked by the fine pass) costs one
// ordered counting pass.
//
// Passes over a row of V logits (each reads 2V bytes, L2-resident after the
// first): greedy 1; dense draw 3 (max, per-warp segment sums, one warp walks
// one segment); filtered 2 + one fine pass per distinct bin among the top-k,
// top-p and draw thresholds (1 to 3) + rarely the ordered tie pass.
// Shared memory ~25 KB, 1024 threads, 64 registers, no spills (sm_90). The
// level-1 histogram uses 32-bit shared atomics only (counts aggregate per
// warp; masses as two words with an exact carry), never a 64-bit CAS loop.

#define SMP_THREADS 1024
#define SMP_WARPS 32
#define SMP_BINS 2048
#define SMP_FINE 32
#define SMP_KEY_NEG_INF 0x007fu

typedef unsigned long long smp_u64;

// Monotone 16-bit key of a bf16 logit: larger key = larger logit.
__device__ __forceinline__ unsigned smp_key(bf16 b) {
    unsigned u = b;
    if ((u & 0x7fffu) > 0x7f80u) {
        u = 0xff80u;  // NaN ranks (and weighs) as -inf
    }
    if (u == 0x8000u) {
        u = 0u;  // -0 ties with +0
    }
    return (u & 0x8000u) ? (~u & 0xffffu) : (u | 0x8000u);
}

// The logit a key stands for.
__device__ __forceinline__ float smp_key_value(unsigned k) {
    unsigned u = (k & 0x8000u) ? (k & 0x7fffu) : (~k & 0xffffu);
    return bf2f((bf16)u);
}

// Weight of logit x: exp(x / t - vmax) as the host computes it.
__device__ __noinline__ float smp_weight(float x, float t, float vmax) {
    float v = x / t;
    if (v != v) {
        return 0.0f;
    }
    if (vmax == __int_as_float(0x7f800000)) {
        return v == vmax ? 1.0f : 0.0f;
    }
    float d = v - vmax;
    return d < -87.0f ? 0.0f : expf(d);
}

// Fixed-point mass of a weight in [0, 1].
__device__ __forceinline__ smp_u64 smp_mass(float w) {
    return __float2ull_rn(w * 1099511627776.0f);  // 2^40
}

// Mass of every token holding key k.
__device__ __forceinline__ smp_u64 smp_key_mass(unsigned k, float t, float vmax) {
    return smp_mass(smp_weight(smp_key_value(k), t, vmax));
}

// Adds q to the 64-bit value lo + 2^32 hi with 32-bit atomics only: the
// adder whose add wraps `lo` carries into `hi`, so the result is exact and
// independent of the order.
__device__ __forceinline__ void smp_add_mass(unsigned* lo, unsigned* hi, smp_u64 q) {
    unsigned ql = (unsigned)q;
    unsigned carry = 0u;
    if (ql != 0u) {
        unsigned old = atomicAdd(lo, ql);
        carry = old > 0xffffffffu - ql ? 1u : 0u;
    }
    unsigned qh = (unsigned)(q >> 32) + carry;
    if (qh != 0u) {
        atomicAdd(hi, qh);
    }
}

// floor(u53 * total / 2^53) without overflow (u53 < 2^53, total < 2^63).
__device__ __forceinline__ smp_u64 smp_scale(smp_u64 u53, smp_u64 total) {
    smp_u64 lo = u53 * total;
    smp_u64 hi = __umul64hi(u53, total);
    return (hi << 11) | (lo >> 53);
}

__device__ __forceinline__ smp_u64 smp_warp_scan(smp_u64 v) {
    int lane = threadIdx.x & 31;
    for (int o = 1; o < 32; o <<= 1) {
        smp_u64 n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) {
            v += n;
        }
    }
    return v;
}

__device__ __forceinline__ smp_u64 smp_warp_sum(smp_u64 v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// Block-wide sum / max; every thread gets the result. `red`: 32 entries.
__device__ smp_u64 smp_block_sum(smp_u64 v, smp_u64* red) {
    v = smp_warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        red[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    smp_u64 s = 0;
    for (int w = 0; w < SMP_WARPS; w++) {
        s += red[w];
    }
    return s;
}

__device__ smp_u64 smp_block_max(smp_u64 v, smp_u64* red) {
    for (int o = 16; o > 0; o >>= 1) {
        smp_u64 n = __shfl_xor_sync(0xffffffffu, v, o);
        v = n > v ? n : v;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        red[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    smp_u64 m = 0;
    for (int w = 0; w < SMP_WARPS; w++) {
        m = red[w] > m ? red[w] : m;
    }
    return m;
}

// What a select found.
struct SmpSel {
    int bin;           // level-1 bin, or -1
    int code;          // exact key, or -1
    smp_u64 above;     // the selected quantity before it (rank order)
    smp_u64 cnt_above; // tokens with a larger key (fine select)
    smp_u64 mass_above;
    smp_u64 n;         // tokens holding the key
    smp_u64 q;         // mass of each of them
    int lo;            // code & 31
};

// Level 1: the first bin in rank order (descending bin) whose inclusive
// prefix of `bins` exceeds `target`; bin -1 when the total does not.
template <typename T>
__device__ void smp_select_bins(const T* bins, smp_u64 target, smp_u64* red, SmpSel* sel) {
    int t = threadIdx.x;
    int lane = t & 31, warp = t >> 5;
    smp_u64 a0 = bins[SMP_BINS - 1 - 2 * t];
    smp_u64 a1 = bins[SMP_BINS - 2 - 2 * t];
    smp_u64 v = smp_warp_scan(a0 + a1);
    __syncthreads();
    if (t == 0) {
        sel->bin = -1;
    }
    if (lane == 31) {
        red[warp] = v;
    }
    __syncthreads();
    smp_u64 base = 0;
    for (int w = 0; w < warp; w++) {
        base += red[w];
    }
    smp_u64 excl = base + v - (a0 + a1);
    if (excl <= target && target < excl + a0) {
        sel->bin = SMP_BINS - 1 - 2 * t;
        sel->above = excl;
    } else if (excl + a0 <= target && target < excl + a0 + a1) {
        sel->bin = SMP_BINS - 2 - 2 * t;
        sel->above = excl + a0;
    }
    __syncthreads();
}

// Sum of `bins` over the bins ranked above `bin` (larger index).
template <typename T>
__device__ smp_u64 smp_sum_above(const T* bins, int bin, smp_u64* red) {
    int t = threadIdx.x;
    smp_u64 s = 0;
    if (2 * t > bin) {
        s += bins[2 * t];
    }
    if (2 * t + 1 > bin) {
        s += bins[2 * t + 1];
    }
    return smp_block_sum(s, red);
}

// Level 2 counts: tokens per code of `bin`, and the smallest id per code.
__device__ void smp_fine_pass(const bf16* x, int vocab, int bin, unsigned* fcnt,
                              unsigned* fmin) {
    __syncthreads();
    if (threadIdx.x < SMP_FINE) {
        fcnt[threadIdx.x] = 0u;
        fmin[threadIdx.x] = 0xffffffffu;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += SMP_THREADS) {
        unsigned k = smp_key(x[i]);
        if ((int)(k >> 5) == bin) {
            atomicAdd(&fcnt[k & 31u], 1u);
            atomicMin(&fmin[k & 31u], (unsigned)i);
        }
    }
    __syncthreads();
}

// Level 2 select within `bin`: the first code in rank order whose inclusive
// prefix (of counts, or of masses when by_mass) exceeds `target`.
__device__ void smp_fine_select(int bin, const unsigned* fcnt, bool by_mass, smp_u64 target,
                                float t, float vmax, SmpSel* sel) {
    if (threadIdx.x < 32) {
        int lane = threadIdx.x;
        int lo = 31 - lane;
        unsigned code = ((unsigned)bin << 5) | (unsigned)lo;
        smp_u64 c = fcnt[lo];
        smp_u64 q = smp_key_mass(code, t, vmax);
        smp_u64 m = c * q;
        smp_u64 val = by_mass ? m : c;
        smp_u64 vi = smp_warp_scan(val);
        smp_u64 ci = smp_warp_scan(c);
        smp_u64 mi = smp_warp_scan(m);
        bool hit = vi - val <= target && target < vi;
        unsigned hm = __ballot_sync(0xffffffffu, hit);
        if (lane == 0 && hm == 0u) {
            sel->code = -1;
        }
        if (hit) {
            sel->code = (int)code;
            sel->lo = lo;
            sel->above = vi - val;
            sel->cnt_above = ci - c;
            sel->mass_above = mi - m;
            sel->n = c;
            sel->q = q;
        }
    }
    __syncthreads();
}

// Tokens [ws, we) of a warp's contiguous segment (ids ascending).
__device__ __forceinline__ void smp_segment(int vocab, int* ws, int* we) {
    int seg = ((vocab + SMP_THREADS - 1) / SMP_THREADS) * 32;
    int w = threadIdx.x >> 5;
    int s = w * seg;
    *ws = s < vocab ? s : vocab;
    *we = s + seg < vocab ? s + seg : vocab;
}

// Shared state of one row.
struct SmpShared {
    smp_u64 red[SMP_WARPS];
    smp_u64 seg[SMP_WARPS];
    unsigned fcnt[SMP_FINE];
    unsigned fmin[SMP_FINE];
    SmpSel sel;
    int fine_bin;
    int pick_warp;
    int pick_tok;
    smp_u64 pick_rem;
};

// The `j`-th (0-based) token in id order whose key is `code` (-1 if none).
__device__ int smp_nth_with_key(const bf16* x, int vocab, unsigned code, smp_u64 j,
                                SmpShared* sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int ws, we;
    smp_segment(vocab, &ws, &we);
    unsigned c = 0;
    for (int base = ws; base < we; base += 32) {
        int i = base + lane;
        bool hit = i < we && smp_key(x[i]) == code;
        c += __popc(__ballot_sync(0xffffffffu, hit));
    }
    __syncthreads();
    if (lane == 0) {
        sh->seg[warp] = c;
    }
    __syncthreads();
    if (warp == 0) {
        smp_u64 v = sh->seg[lane];
        smp_u64 incl = smp_warp_scan(v);
        bool hit = incl - v <= j && j < incl;
        unsigned m = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) {
            sh->pick_warp = m ? __ffs(m) - 1 : -1;
            sh->pick_tok = -1;
        }
        if (hit) {
            sh->pick_rem = j - (incl - v);
        }
    }
    __syncthreads();
    int found = -1;
    if (warp == sh->pick_warp) {
        smp_u64 rem = sh->pick_rem, run = 0;
        for (int base = ws; base < we; base += 32) {
            int i = base + lane;
            bool hit = i < we && smp_key(x[i]) == code;
            unsigned m = __ballot_sync(0xffffffffu, hit);
            unsigned n = __popc(m);
            if (run + n > rem) {
                for (smp_u64 s = run; s < rem; s++) {
                    m &= m - 1u;
                }
                found = base + __ffs(m) - 1;
                break;
            }
            run += n;
        }
        if (lane == 0) {
            sh->pick_tok = found;
        }
    }
    __syncthreads();
    return sh->pick_tok;
}

// Draw in id order over the tokens with w >= min_w (the host's dense support).
__device__ int smp_draw_dense(const bf16* x, int vocab, float t, float vmax, float min_w,
                              smp_u64 u53, SmpShared* sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int ws, we;
    smp_segment(vocab, &ws, &we);
    smp_u64 s = 0;
    for (int base = ws; base < we; base += 32) {
        int i = base + lane;
        if (i < we) {
            float w = smp_weight(smp_key_value(smp_key(x[i])), t, vmax);
            if (w >= min_w) {
                s += smp_mass(w);
            }
        }
    }
    s = smp_warp_sum(s);
    __syncthreads();
    if (lane == 0) {
        sh->seg[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        smp_u64 v = sh->seg[lane];
        smp_u64 incl = smp_warp_scan(v);
        smp_u64 total = __shfl_sync(0xffffffffu, incl, 31);
        smp_u64 target = smp_scale(u53, total);
        bool hit = incl - v <= target && target < incl;
        unsigned m = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) {
            sh->pick_warp = m ? __ffs(m) - 1 : -1;
            sh->pick_tok = -1;
        }
        if (hit) {
            sh->pick_rem = target - (incl - v);
        }
    }
    __syncthreads();
    int found = -1;
    if (warp == sh->pick_warp) {
        smp_u64 rem = sh->pick_rem, run = 0;
        for (int base = ws; base < we; base += 32) {
            int i = base + lane;
            smp_u64 q = 0;
            if (i < we) {
                float w = smp_weight(smp_key_value(smp_key(x[i])), t, vmax);
                if (w >= min_w) {
                    q = smp_mass(w);
                }
            }
            smp_u64 incl = smp_warp_scan(q);
            unsigned m = __ballot_sync(0xffffffffu, run + incl > rem);
            if (m) {
                found = base + __ffs(m) - 1;
                break;
            }
            run += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) {
            sh->pick_tok = found;
        }
    }
    __syncthreads();
    return sh->pick_tok;
}

// This thread's largest (key << 32 | ~id) over the row `x` of `vocab`
// logits (the lowest id wins ties once reduced over the block). The
// 16-byte-aligned middle of the row is read 8 logits a load, the unaligned
// ends one logit a thread. A greedy row is this pass alone, in one block:
// about 23 us for a 151,936-logit row on an H200 (a graph node's time)
// with 2-byte loads and with these alike, so the block's instructions, not
// the 300 KB it reads, look like the bound.
__device__ __forceinline__ smp_u64 smp_row_max(const bf16* __restrict__ x, int vocab) {
    const int tid = threadIdx.x;
    smp_u64 best = ((smp_u64)SMP_KEY_NEG_INF << 32) | 0xffffffffull;
    // Logits before the first 16-byte boundary, and whole 8-logit chunks after.
    const int head = min(vocab, (int)(((16u - ((unsigned)(unsigned long long)x & 15u)) & 15u) >> 1));
    const int chunks = (vocab - head) >> 3;
    const int tail = head + 8 * chunks;
    if (tid < head) {
        best = ((smp_u64)smp_key(x[tid]) << 32) | (smp_u64)(0xffffffffu - (unsigned)tid);
    }
    const uint4* v = reinterpret_cast<const uint4*>(x + head);
#pragma unroll 4
    for (int c = tid; c < chunks; c += SMP_THREADS) {
        const uint4 w = __ldg(v + c);
        const unsigned u[4] = {w.x, w.y, w.z, w.w};
        const unsigned id0 = (unsigned)(head + 8 * c);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const bf16 b = (bf16)((u[k >> 1] >> (16 * (k & 1))) & 0xffffu);
            const smp_u64 cand = ((smp_u64)smp_key(b) << 32) | (smp_u64)(0xffffffffu - (id0 + k));
            best = cand > best ? cand : best;
        }
    }
    for (int i = tail + tid; i < vocab; i += SMP_THREADS) {
        const smp_u64 cand = ((smp_u64)smp_key(x[i]) << 32) | (smp_u64)(0xffffffffu - (unsigned)i);
        best = cand > best ? cand : best;
    }
    return best;
}

// out[row] = the token sampled from row `blockIdx.x` of `logits` ([rows,
// vocab] bf16) with the parameters at `sampling + 6 * row`. kept[2 * row]
// and kept[2 * row + 1] get the length and fixed-point mass of the kept
// rank prefix when top-k or top-p filtered the row, else 0 and 0 (the
// logprobs kernel's input, see sampling_extras.cu).
extern "C" __global__ void __launch_bounds__(SMP_THREADS)
sample_bf16(int* __restrict__ out, const bf16* __restrict__ logits,
            const int* __restrict__ sampling, int vocab, smp_u64* __restrict__ kept) {
    PDL_ENTRY();
    __shared__ unsigned s_cnt[SMP_BINS];
    __shared__ smp_u64 s_mass[SMP_BINS];
    __shared__ SmpShared sh;

    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const bf16* x = logits + (long long)row * vocab;
    const int* prm = sampling + 6 * row;
    const float temp = __int_as_float(prm[0]);
    const unsigned top_k = (unsigned)prm[1];
    const float top_p = __int_as_float(prm[2]);
    const float min_p = __int_as_float(prm[3]);
    const smp_u64 u53 = ((smp_u64)(unsigned)prm[4] | ((smp_u64)(unsigned)prm[5] << 32)) >> 11;
    if (tid == 0) {
        kept[2 * row] = 0ull;
        kept[2 * row + 1] = 0ull;
    }

    // Pass 1: the largest key, lowest id first (key << 32 | ~id).
    smp_u64 best = smp_row_max(x, vocab);
    best = smp_block_max(best, sh.red);
    const unsigned max_key = (unsigned)(best >> 32);
    const int top = max_key == SMP_KEY_NEG_INF ? 0 : (int)(0xffffffffu - (unsigned)best);
    if (!(temp >= 1e-5f) || max_key == SMP_KEY_NEG_INF) {
        if (tid == 0) {
            out[row] = top;
        }
        return;
    }

    const float vmax = smp_key_value(max_key) / temp;
    const float min_w = min_p > 0.0f ? fminf(min_p, 1.0f) : 0.0f;
    const bool k_on = top_k > 0u && top_k < (unsigned)vocab;
    const bool p_on = top_p < 1.0f;

    if (!k_on && !p_on) {
        int tok = smp_draw_dense(x, vocab, temp, vmax, min_w, u53, &sh);
        if (tid == 0) {
            out[row] = tok >= 0 ? tok : top;
        }
        return;
    }

    // Pass 2: level-1 histogram (counts and masses), the total mass and the
    // min-p set's size and mass.
    // Masses accumulate as two 32-bit words per bin (sm_90 has no native
    // 64-bit shared atomic add), then become one 64-bit word in place.
    unsigned* mass_lo = (unsigned*)s_mass;
    unsigned* mass_hi = mass_lo + SMP_BINS;
    for (int b = tid; b < SMP_BINS; b += SMP_THREADS) {
        s_cnt[b] = 0u;
        mass_lo[b] = 0u;
        mass_hi[b] = 0u;
    }
    __syncthreads();
    smp_u64 all_mass = 0, m_cnt = 0, m_mass = 0;
    for (int i = tid; i < vocab; i += SMP_THREADS) {
        unsigned k = smp_key(x[i]);
        float w = smp_weight(smp_key_value(k), temp, vmax);
        smp_u64 q = smp_mass(w);
        atomicAdd(&s_cnt[k >> 5], 1u);
        smp_add_mass(&mass_lo[k >> 5], &mass_hi[k >> 5], q);
        all_mass += q;
        if (w >= min_w) {
            m_cnt += 1;
            m_mass += q;
        }
    }
    __syncthreads();
    {
        smp_u64 m0 = ((smp_u64)mass_hi[2 * tid] << 32) | mass_lo[2 * tid];
        smp_u64 m1 = ((smp_u64)mass_hi[2 * tid + 1] << 32) | mass_lo[2 * tid + 1];
        __syncthreads();
        s_mass[2 * tid] = m0;
        s_mass[2 * tid + 1] = m1;
    }
    all_mass = smp_block_sum(all_mass, sh.red);
    m_cnt = smp_block_sum(m_cnt, sh.red);
    m_mass = smp_block_sum(m_mass, sh.red);
    if (tid == 0) {
        sh.fine_bin = -1;
    }
    __syncthreads();

    // Every kept set is a rank prefix: (length, mass) of each, then the shortest.
    smp_u64 len = (smp_u64)vocab, mass = all_mass;
    if (k_on) {
        smp_select_bins(s_cnt, (smp_u64)top_k - 1, sh.red, &sh.sel);
        int bin = sh.sel.bin;
        smp_u64 cnt1 = sh.sel.above;
        if (bin < 0) {
            if (tid == 0) out[row] = top;
            return;
        }
        smp_u64 mass1 = smp_sum_above(s_mass, bin, sh.red);
        smp_fine_pass(x, vocab, bin, sh.fcnt, sh.fmin);
        if (tid == 0) sh.fine_bin = bin;
        smp_fine_select(bin, sh.fcnt, false, (smp_u64)top_k - 1 - cnt1, temp, vmax, &sh.sel);
        if (sh.sel.code < 0) {
            if (tid == 0) out[row] = top;
            return;
        }
        smp_u64 above = cnt1 + sh.sel.cnt_above;
        smp_u64 keep = (smp_u64)top_k - above;
        len = top_k;
        mass = mass1 + sh.sel.mass_above + keep * sh.sel.q;
        __syncthreads();
    }
    if (p_on) {
        double tg = (double)top_p * (double)mass;
        smp_u64 target = tg > 0.0 ? (smp_u64)ceil(tg) : 0ull;
        target = target < 1ull ? 1ull : (target > mass ? mass : target);
        smp_select_bins(s_mass, target - 1, sh.red, &sh.sel);
        int bin = sh.sel.bin;
        smp_u64 mass1 = sh.sel.above;
        if (bin < 0) {
            if (tid == 0) out[row] = top;
            return;
        }
        smp_u64 cnt1 = smp_sum_above(s_cnt, bin, sh.red);
        if (sh.fine_bin != bin) {
            smp_fine_pass(x, vocab, bin, sh.fcnt, sh.fmin);
            if (tid == 0) sh.fine_bin = bin;
        }
        smp_fine_select(bin, sh.fcnt, true, target - 1 - mass1, temp, vmax, &sh.sel);
        if (sh.sel.code < 0 || sh.sel.q == 0ull) {
            if (tid == 0) out[row] = top;
            return;
        }
        smp_u64 above = mass1 + sh.sel.mass_above;
        smp_u64 ties = (target - above + sh.sel.q - 1) / sh.sel.q;
        smp_u64 plen = cnt1 + sh.sel.cnt_above + ties;
        if (plen < len) {
            len = plen;
            mass = above + ties * sh.sel.q;
        }
        __syncthreads();
    }
    if (m_cnt < len) {
        len = m_cnt;
        mass = m_mass;
    }

    if (tid == 0) {
        kept[2 * row] = len;
        kept[2 * row + 1] = mass;
    }

    // The draw, in rank order over the first `len` ranked tokens.
    smp_u64 target = smp_scale(u53, mass);
    smp_select_bins(s_mass, target, sh.red, &sh.sel);
    int bin = sh.sel.bin;
    smp_u64 mass1 = sh.sel.above;
    if (bin < 0) {
        if (tid == 0) out[row] = top;
        return;
    }
    if (sh.fine_bin != bin) {
        smp_fine_pass(x, vocab, bin, sh.fcnt, sh.fmin);
        if (tid == 0) sh.fine_bin = bin;
    }
    smp_fine_select(bin, sh.fcnt, true, target - mass1, temp, vmax, &sh.sel);
    if (sh.sel.code < 0 || sh.sel.q == 0ull) {
        if (tid == 0) out[row] = top;
        return;
    }
    smp_u64 j = (target - mass1 - sh.sel.mass_above) / sh.sel.q;
    int tok;
    if (j == 0ull) {
        tok = (int)sh.fmin[sh.sel.lo];
    } else {
        tok = smp_nth_with_key(x, vocab, (unsigned)sh.sel.code, j, &sh);
    }
    if (tid == 0) {
        out[row] = tok >= 0 ? tok : top;
    }
}
