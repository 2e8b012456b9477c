// Entry points of the split-K decode attention over a bf16 cache, and the
// partition merge (launch 2); the kernel and its launch scheme are in
// attention_decode.cu, which this compile unit includes first.

extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd64_g1(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(64, 1, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd64_g2(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(64, 2, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd64_g4(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(64, 4, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd64_g8(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(64, 8, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd128_g1(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(128, 1, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd128_g2(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(128, 2, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd128_g4(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(128, 4, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd128_g8(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(128, 8, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd256_g1(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(256, 1, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd256_g2(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(256, 2, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd256_g4(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(256, 4, bf16);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_bf16_hd256_g8(DEC_PARAMS(bf16)) {
    PDL_ENTRY();
    DEC_CALL(256, 8, bf16);
}
// Merges the partitions of each (sequence, head) whose sequence has more
// than one: out = sum_p 2^(m_p - M) acc_p / sum_p 2^(m_p - M) l_p, with
// M = max_p m_p. Sequences of one partition were written by launch 1.
extern "C" __global__ void __launch_bounds__(128)
paged_decode_reduce_bf16(bf16* __restrict__ out, const float* __restrict__ part_acc,
                         const float* __restrict__ part_ml, const int* __restrict__ context_lens,
                         int max_blocks_per_seq, int block_size, int num_heads, int head_dim,
                         int max_parts, int part_size, int window) {
    PDL_ENTRY();
    const int seq = blockIdx.x;
    const int head = blockIdx.y;
    const int n_seq = min(context_lens[seq] + 1, max_blocks_per_seq * block_size);
    const int span = window > 0 ? min(window, n_seq) : n_seq;  // as in launch 1
    const int nparts = min((span + part_size - 1) / part_size, max_parts);
    if (nparts <= 1) {
        return;
    }
    const long long base = ((long long)seq * num_heads + head) * max_parts;
    const float* ml = part_ml + base * 2;
    float gm = NEG_INF;
    for (int p = 0; p < nparts; p++) {
        gm = fmaxf(gm, ml[2 * p]);
    }
    float gl = 0.0f;
    for (int p = 0; p < nparts; p++) {
        gl += ml[2 * p + 1] * exp2f(ml[2 * p] - gm);
    }
    const float inv = 1.0f / gl;
    bf16* o = out + ((long long)seq * num_heads + head) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int p = 0; p < nparts; p++) {
            a += part_acc[(base + p) * head_dim + d] * exp2f(ml[2 * p] - gm);
        }
        o[d] = f2bf(a * inv);
    }
}
