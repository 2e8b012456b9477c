// Logit adjustments on the device, before penalties and the draw (see
// crates/pagoda-kernels/src/logit_adjust.rs for the semantics; its
// `apply_row` is the reference).
//
// Per-row header (LA_ROW_INTS ints per sampling row): entries start and
// length (in (token, bias bits) pairs of `entries`), allowed start and
// length (in tokens of `allowed`; 0: every token allowed). Rows never
// interact; rows without adjustments return at once.
//
// allow_only_bf16: grid (rows, chunks); each thread walks tokens of its
// row with a grid-stride loop and sets to -inf every logit whose token is
// not in the row's allowed list (ascending: one binary search per token).
//
// logit_entries_bf16: one block per row; each thread takes entries (their
// tokens are distinct, so no two threads touch one logit) and adds the bias
// in f32 (-inf bans), rounding to bf16 in place.
//
// Launched in that order; the two commute (a banned or masked logit stays
// -inf whatever is added).

#define LA_ROW_INTS 4
#define LA_THREADS 256

extern "C" __global__ void __launch_bounds__(LA_THREADS)
allow_only_bf16(bf16* __restrict__ logits, const int* __restrict__ rows,
                const int* __restrict__ allowed, int vocab) {
    PDL_ENTRY();
    const int row = blockIdx.x;
    const int* r = rows + LA_ROW_INTS * row;
    const int start = r[2];
    const int len = r[3];
    if (len <= 0) {
        return;
    }
    const int* a = allowed + start;
    bf16* x = logits + (long long)row * vocab;
    const bf16 neg_inf = (bf16)0xff80u;
    for (int t = blockIdx.y * LA_THREADS + threadIdx.x; t < vocab;
         t += gridDim.y * LA_THREADS) {
        int lo = 0;
        int hi = len;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (a[mid] < t) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if (lo >= len || a[lo] != t) {
            x[t] = neg_inf;
        }
    }
}

extern "C" __global__ void __launch_bounds__(LA_THREADS)
logit_entries_bf16(bf16* __restrict__ logits, const int* __restrict__ rows,
                   const int* __restrict__ entries, int vocab) {
    PDL_ENTRY();
    const int row = blockIdx.x;
    const int* r = rows + LA_ROW_INTS * row;
    const int start = r[0];
    const int len = r[1];
    bf16* x = logits + (long long)row * vocab;
    for (int e = threadIdx.x; e < len; e += LA_THREADS) {
        const long long at = 2ll * ((long long)start + e);
        const int tok = entries[at];
        if (tok < 0 || tok >= vocab) {
            continue;
        }
        const float bias = __int_as_float(entries[at + 1]);
        x[tok] = f2bf(__fadd_rn(bf2f(x[tok]), bias));
    }
}
