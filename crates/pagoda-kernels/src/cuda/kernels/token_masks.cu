// Token masks of structured outputs: mask_logits_bf16 sets every logit of a
// constrained row whose allowed bit is clear to -inf, before penalties and
// sampling (see crates/pagoda-kernels/src/sampling_options.rs, TokenMasks).
//
// `packed`: the n masked rows' indices (ints), then n masks of `words` u32
// words each (bit t % 32 of word t / 32: token t allowed). One block per
// mask; each thread takes tokens t, t + blockDim.x, ...; rows never
// interact and no logit is written twice.

#define TM_THREADS 256

extern "C" __global__ void __launch_bounds__(TM_THREADS)
mask_logits_bf16(bf16* __restrict__ logits, const unsigned int* __restrict__ packed,
                 int n, int words, int vocab) {
    PDL_ENTRY();
    const int m = blockIdx.x;
    if (m >= n) return;
    const int row = (int)packed[m];
    const unsigned int* bits = packed + n + (size_t)m * words;
    bf16* x = logits + (size_t)row * vocab;
    for (int t = threadIdx.x; t < vocab; t += blockDim.x) {
        if (((bits[t >> 5] >> (t & 31)) & 1u) == 0u) {
            x[t] = (bf16)0xff80u;  // -inf
        }
    }
}
