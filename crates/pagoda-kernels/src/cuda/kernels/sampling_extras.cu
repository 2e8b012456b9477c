// Penalties and logprobs on the device, around `sample_bf16` (sampling.cu,
// whose helpers this file uses): `penalize_bf16` runs before it on the
// logits rows, `logprobs_bf16` after it on the ids it wrote. Semantics are
// the host sampler's (crates/pagoda-engine/src/sampler.rs); see
// crates/pagoda-kernels/src/sampling_options.rs.
//
// Per-row options (SX_OPT_INTS ints per sampling row): repetition,
// frequency, presence penalty (f32 bits), history start and length (in
// (token, output count) pairs of `hist`), logprobs n (-1: none), and the
// row's slot among the rows asking for logprobs. Rows never interact.
//
// penalize_bf16: one block per row; each thread takes history pairs (the
// tokens are distinct, so no two threads touch one logit) and applies, in
// f32 without contraction, repetition (x > 0: x / r, else x * r) to every
// pair, then x -= f * count and x -= p to pairs with count > 0; the result
// is rounded to bf16 in place. Rows without penalties return at once.
//
// logprobs_bf16: one 1024-thread block per row asking. With T the row's
// temperature (1 for greedy rows) and w = exp(x / T - max(x / T)) as the
// sampler weighs tokens, logprob(t) = ln w_t - ln(kept mass). The kept set
// is a rank prefix (logit descending, id ascending): for rows that filtered
// with top-k / top-p, `sample_bf16` left its length and fixed-point mass in
// `kept`; greedy rows keep every token, other rows those with w >= min_p.
// The top n are found in n passes of a block-wide maximum over the packed
// rank key (key << 32 | ~id) below the previous one; tokens of weight 0 end
// the list. Results: SX_LP_INTS ints per slot after the `rows` ids in `out`:
// the sampled token's logprob (f32 bits), the count, then (id, logprob bits)
// pairs.

#define SX_OPT_INTS 7
#define SX_LP_INTS 42
#define SX_MAX_LOGPROBS 20
#define SX_PEN_THREADS 256
// ln(2^40): masses are fixed point with 40 fractional bits.
#define SX_LN_MASS_ONE 27.725887222397812

extern "C" __global__ void __launch_bounds__(SX_PEN_THREADS)
penalize_bf16(bf16* __restrict__ logits, const int* __restrict__ opts,
              const int* __restrict__ hist, int vocab) {
    PDL_ENTRY();
    const int row = blockIdx.x;
    const int* o = opts + SX_OPT_INTS * row;
    const float rep = __int_as_float(o[0]);
    const float freq = __int_as_float(o[1]);
    const float pres = __int_as_float(o[2]);
    const bool rep_on = rep != 1.0f && rep > 0.0f;
    const bool out_on = freq != 0.0f || pres != 0.0f;
    if (!rep_on && !out_on) {
        return;
    }
    const int start = o[3];
    const int len = o[4];
    bf16* x = logits + (long long)row * vocab;
    for (int e = threadIdx.x; e < len; e += SX_PEN_THREADS) {
        const long long at = 2ll * ((long long)start + e);
        const int tok = hist[at];
        const unsigned cnt = (unsigned)hist[at + 1];
        if (tok < 0 || tok >= vocab) {
            continue;
        }
        float l = bf2f(x[tok]);
        if (rep_on) {
            l = l > 0.0f ? __fdiv_rn(l, rep) : __fmul_rn(l, rep);
        }
        if (out_on && cnt > 0u) {
            l = __fsub_rn(l, __fmul_rn(freq, __uint2float_rn(cnt)));
            l = __fsub_rn(l, pres);
        }
        x[tok] = f2bf(l);
    }
}

// The largest rank key of a logits row, block-wide (SMP_KEY_NEG_INF or
// below when nothing is above -inf).
__device__ __forceinline__ smp_u64 sx_row_max_key(const bf16* __restrict__ x, int vocab,
                                                  smp_u64* red) {
    smp_u64 kmax = 0;
    for (int i = threadIdx.x; i < vocab; i += SMP_THREADS) {
        smp_u64 k = smp_key(x[i]);
        kmax = k > kmax ? k : kmax;
    }
    return smp_block_max(kmax, red);
}

// The next entry of a row's rank order after `prev` (packed key: logit
// descending, then id ascending), block-wide; 0 when none is left. The id
// is 0xffffffff minus the low 32 bits, the logit's key the high 32.
__device__ __forceinline__ smp_u64 sx_next_ranked(const bf16* __restrict__ x, int vocab,
                                                  smp_u64 prev, smp_u64* red) {
    smp_u64 best = 0;
    for (int i = threadIdx.x; i < vocab; i += SMP_THREADS) {
        smp_u64 c = ((smp_u64)smp_key(x[i]) << 32) | (smp_u64)(0xffffffffu - (unsigned)i);
        if (c < prev && c > best) {
            best = c;
        }
    }
    return smp_block_max(best, red);
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
logprobs_bf16(int* __restrict__ out, const bf16* __restrict__ logits,
              const int* __restrict__ sampling, const int* __restrict__ opts,
              const smp_u64* __restrict__ kept, int rows, int vocab) {
    PDL_ENTRY();
    __shared__ smp_u64 red[SMP_WARPS];
    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const int* o = opts + SX_OPT_INTS * row;
    const int n_ask = o[5];
    if (n_ask < 0) {
        return;
    }
    const int n = n_ask < SX_MAX_LOGPROBS ? n_ask : SX_MAX_LOGPROBS;
    int* res = out + rows + (long long)o[6] * SX_LP_INTS;
    const bf16* x = logits + (long long)row * vocab;
    const float temp_in = __int_as_float(sampling[6 * row]);
    const float min_p = __int_as_float(sampling[6 * row + 3]);
    const bool greedy = !(temp_in >= 1e-5f);
    const float temp = greedy ? 1.0f : temp_in;

    // The largest key: the weights' reference point.
    const smp_u64 kmax = sx_row_max_key(x, vocab, red);
    if (kmax <= SMP_KEY_NEG_INF) {
        // Nothing above -inf: no token has probability.
        if (tid == 0) {
            res[0] = (int)0xff800000u;
            res[1] = 0;
        }
        return;
    }
    const float vmax = smp_key_value((unsigned)kmax) / temp;

    // The kept set's length and mass.
    smp_u64 len = kept[2 * row];
    smp_u64 mass = kept[2 * row + 1];
    if (greedy || len == 0ull) {
        const float min_w = (!greedy && min_p > 0.0f) ? fminf(min_p, 1.0f) : 0.0f;
        smp_u64 c = 0, m = 0;
        for (int i = tid; i < vocab; i += SMP_THREADS) {
            float w = smp_weight(smp_key_value(smp_key(x[i])), temp, vmax);
            if (w >= min_w) {
                c += 1;
                m += smp_mass(w);
            }
        }
        len = smp_block_sum(c, red);
        mass = smp_block_sum(m, red);
    }
    // The top token weighs 1 (mass 2^40) and is always kept.
    const double log_total = mass > 0ull ? log((double)mass) - SX_LN_MASS_ONE : 0.0;

    if (tid == 0) {
        const int tok = out[row];
        float lp = NEG_INF;
        if (tok >= 0 && tok < vocab) {
            float w = smp_weight(smp_key_value(smp_key(x[tok])), temp, vmax);
            if (w > 0.0f) {
                lp = (float)(log((double)w) - log_total);
            }
        }
        res[0] = __float_as_int(lp);
    }

    // The top n kept tokens, one block-wide maximum each.
    const smp_u64 nn = (smp_u64)n < len ? (smp_u64)n : len;
    smp_u64 prev = ~0ull;
    int count = 0;
    for (smp_u64 r = 0; r < nn; r++) {
        const smp_u64 best = sx_next_ranked(x, vocab, prev, red);
        if (best == 0ull) {
            break;
        }
        const unsigned key = (unsigned)(best >> 32);
        const int id = (int)(0xffffffffu - (unsigned)best);
        const float w = smp_weight(smp_key_value(key), temp, vmax);
        if (!(w > 0.0f)) {
            break;
        }
        if (tid == 0) {
            res[2 + 2 * count] = id;
            res[3 + 2 * count] = __float_as_int((float)(log((double)w) - log_total));
        }
        count += 1;
        prev = best;
    }
    if (tid == 0) {
        res[1] = count;
    }
}

// prompt_logprobs_bf16: one 1024-thread block per prompt-logprobs row, the
// logits rows `first + r` after the sampling rows, each with a (token, n)
// pair in `targets`. Raw logits (no penalties, temperature or filters), as
// the host's prompt_logprob computes them: lse = max + ln(sum exp(x - max))
// (differences in f32, exponentials and sum in f64), logprob(t) = x_t - lse
// (-inf for a token outside the vocabulary or of logit -inf), rank = 1 + the
// number of logits above x_t, and the top n by the packed rank key (logit
// descending, id ascending; NaN ranks as -inf). Results: SX_PLP_INTS ints
// per row from `out + at`: logprob (f32 bits), rank, count, then (id,
// logprob bits) pairs.

#define SX_PLP_INTS 43

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
prompt_logprobs_bf16(int* __restrict__ out, int at, const bf16* __restrict__ logits,
                     int first, const int* __restrict__ targets, int vocab) {
    PDL_ENTRY();
    __shared__ smp_u64 red[SMP_WARPS];
    __shared__ double dred[SMP_WARPS];
    const int r = blockIdx.x;
    const int tid = threadIdx.x;
    const int tok = targets[2 * r];
    const int n_ask = targets[2 * r + 1];
    const int n = n_ask < 0 ? 0 : (n_ask < SX_MAX_LOGPROBS ? n_ask : SX_MAX_LOGPROBS);
    int* res = out + at + (long long)r * SX_PLP_INTS;
    const bf16* x = logits + (long long)(first + r) * vocab;

    const smp_u64 kmax = sx_row_max_key(x, vocab, red);
    const float vmax = smp_key_value((unsigned)kmax);

    // sum exp(x - max) in f64, reduced in a fixed order.
    double s = 0.0;
    for (int i = tid; i < vocab; i += SMP_THREADS) {
        const float v = bf2f(x[i]);
        if (v == v && v != NEG_INF) {
            s += exp((double)__fsub_rn(v, vmax));
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    __syncthreads();
    if ((tid & 31) == 0) {
        dred[tid >> 5] = s;
    }
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < SMP_WARPS; w++) {
        total += dred[w];
    }
    const bool any = kmax > SMP_KEY_NEG_INF && total > 0.0;
    const float lse = any ? __fadd_rn(vmax, (float)log(total)) : 0.0f;

    // The token's logit and rank.
    const bool in_vocab = tok >= 0 && tok < vocab;
    const float own = in_vocab ? bf2f(x[tok]) : NEG_INF;
    smp_u64 above = 0;
    if (in_vocab) {
        for (int i = tid; i < vocab; i += SMP_THREADS) {
            above += bf2f(x[i]) > own ? 1ull : 0ull;
        }
    }
    above = smp_block_sum(above, red);
    if (tid == 0) {
        const bool finite = any && own == own && own != NEG_INF && own != -NEG_INF;
        res[0] = __float_as_int(finite ? __fsub_rn(own, lse) : NEG_INF);
        res[1] = in_vocab ? (int)(1ull + above) : vocab + 1;
    }

    // The top n, one block-wide maximum each.
    smp_u64 prev = ~0ull;
    int count = 0;
    for (int k = 0; k < n; k++) {
        const smp_u64 best = sx_next_ranked(x, vocab, prev, red);
        if (best == 0ull) {
            break;
        }
        const int id = (int)(0xffffffffu - (unsigned)best);
        const float v = bf2f(x[id]);
        if (tid == 0) {
            const bool finite = any && v == v && v != NEG_INF;
            res[3 + 2 * count] = id;
            res[4 + 2 * count] = __float_as_int(finite ? __fsub_rn(v, lse) : NEG_INF);
        }
        count += 1;
        prev = best;
    }
    if (tid == 0) {
        res[2] = count;
    }
}
