// Q/K head RMSNorm (Qwen3's q_norm / k_norm, optional) and rotary embedding
// of q and k in one launch: the decode-step replacement of head_rms_norm on
// q, head_rms_norm on k, rope on q and rope on k (four launches), with the
// same bits as that sequence.
//
// One block per (row, head) of q, then of k, of ceil32(head_dim) threads,
// as head_rms_norm's launch: the same sum of squares through block_sum, the
// same normalized value rounded to bf16, staged in shared memory; then each
// thread i < rd / 2 rotates pair i from the staged values with rope_rotate
// (elementwise.cu, as rope does) and threads past rd write their normalized
// value back. head_dim <= 1024 (the host checks).

template <typename T>
__device__ void qk_norm_rope_impl(bf16* __restrict__ q, bf16* __restrict__ k,
                                  const bf16* __restrict__ qw, const bf16* __restrict__ kw,
                                  int has_norm, const int* __restrict__ positions,
                                  const T* __restrict__ table, int q_heads, int k_heads,
                                  int head_dim, int rd, int style, float eps) {
    __shared__ float hv[1024];
    const int per_row = q_heads + k_heads;
    const int r = blockIdx.x / per_row;
    const int hh = blockIdx.x - r * per_row;
    bf16* h;
    const bf16* w;
    if (hh < q_heads) {
        h = q + ((long long)r * q_heads + hh) * head_dim;
        w = qw;
    } else {
        h = k + ((long long)r * k_heads + (hh - q_heads)) * head_dim;
        w = kw;
    }
    if (has_norm) {
        float ss = 0.0f;
        for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
            float v = bf2f(h[c]);
            ss += v * v;
        }
        float inv = rsqrtf(block_sum(ss) / (float)head_dim + eps);
        for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
            hv[c] = bf2f(f2bf(bf2f(h[c]) * inv * bf2f(w[c])));
        }
    } else {
        for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
            hv[c] = bf2f(h[c]);
        }
    }
    __syncthreads();
    const int half = rd / 2;
    const long long trow = (long long)positions[r] * rd;
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        if (c < half) {
            float cs = ld(table, trow + c);
            float sn = ld(table, trow + half + c);
            int a = style == 0 ? c : 2 * c;
            int b = style == 0 ? c + half : 2 * c + 1;
            rope_rotate(h, a, b, hv[a], hv[b], cs, sn);
        } else if (c >= rd && has_norm) {
            h[c] = f2bf(hv[c]);
        }
    }
}

// Grid: rows * (q_heads + k_heads) blocks of ceil32(head_dim) threads.
extern "C" __global__ void qk_norm_rope_f32(bf16* q, bf16* k, const bf16* qw, const bf16* kw,
                                            int has_norm, const int* positions,
                                            const float* table, int q_heads, int k_heads,
                                            int head_dim, int rd, int style, float eps) {
    qk_norm_rope_impl(q, k, qw, kw, has_norm, positions, table, q_heads, k_heads, head_dim, rd,
                      style, eps);
}

extern "C" __global__ void qk_norm_rope_bf16(bf16* q, bf16* k, const bf16* qw, const bf16* kw,
                                             int has_norm, const int* positions,
                                             const bf16* table, int q_heads, int k_heads,
                                             int head_dim, int rd, int style, float eps) {
    qk_norm_rope_impl(q, k, qw, kw, has_norm, positions, table, q_heads, k_heads, head_dim, rd,
                      style, eps);
}
