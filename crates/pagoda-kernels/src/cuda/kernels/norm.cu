// Normalizations, one block per row (or per (row, head) for head_rms_norm).
// Inputs are bf16 activations or the f32 residual stream, outputs bf16;
// weights bf16; every reduction is in f32.

// y = RMSNorm(x); x is a bf16 activation or the f32 residual stream.
template <typename X>
__device__ void rms_norm_impl(bf16* __restrict__ y, const X* __restrict__ x,
                              const bf16* __restrict__ w, int cols, float eps) {
    const X* xr = x + (long long)blockIdx.x * cols;
    bf16* yr = y + (long long)blockIdx.x * cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = ld(xr, c);
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss) / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        yr[c] = f2bf(ld(xr, c) * inv * bf2f(w[c]));
    }
}

extern "C" __global__ void rms_norm_bf16(bf16* __restrict__ y, const bf16* __restrict__ x,
                                         const bf16* __restrict__ w, int cols, float eps) {
    PDL_ENTRY();
    rms_norm_impl(y, x, w, cols, eps);
}

extern "C" __global__ void rms_norm_f32(bf16* __restrict__ y, const float* __restrict__ x,
                                        const bf16* __restrict__ w, int cols, float eps) {
    PDL_ENTRY();
    rms_norm_impl(y, x, w, cols, eps);
}

// residual += x (stored at the residual's precision); y = RMSNorm(residual).
template <typename R>
__device__ void add_rms_norm_impl(bf16* __restrict__ y, R* __restrict__ residual,
                                  const bf16* __restrict__ x, const bf16* __restrict__ w,
                                  int cols, float eps) {
    long long base = (long long)blockIdx.x * cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        st(residual, base + c, ld(residual, base + c) + bf2f(x[base + c]));
        float v = ld(residual, base + c);
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss) / (float)cols + eps);
    // Each thread re-reads only the residual elements it wrote itself.
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        y[base + c] = f2bf(ld(residual, base + c) * inv * bf2f(w[c]));
    }
}

extern "C" __global__ void add_rms_norm_bf16(bf16* __restrict__ y, bf16* __restrict__ residual,
                                             const bf16* __restrict__ x,
                                             const bf16* __restrict__ w, int cols, float eps) {
    PDL_ENTRY();
    add_rms_norm_impl(y, residual, x, w, cols, eps);
}

extern "C" __global__ void add_rms_norm_f32(bf16* __restrict__ y, float* __restrict__ residual,
                                            const bf16* __restrict__ x,
                                            const bf16* __restrict__ w, int cols, float eps) {
    PDL_ENTRY();
    add_rms_norm_impl(y, residual, x, w, cols, eps);
}

// In place on every head_dim slice; one block per (row, head).
extern "C" __global__ void head_rms_norm_bf16(bf16* __restrict__ x, const bf16* __restrict__ w,
                                              int head_dim, float eps) {
    PDL_ENTRY();
    bf16* h = x + (long long)blockIdx.x * head_dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        float v = bf2f(h[c]);
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss) / (float)head_dim + eps);
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        h[c] = f2bf(bf2f(h[c]) * inv * bf2f(w[c]));
    }
}

template <typename X>
__device__ void layer_norm_impl(bf16* __restrict__ y, const X* __restrict__ x,
                                const bf16* __restrict__ w, const bf16* __restrict__ b, int cols,
                                float eps) {
    const X* xr = x + (long long)blockIdx.x * cols;
    bf16* yr = y + (long long)blockIdx.x * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        s += ld(xr, c);
    }
    float mean = block_sum(s) / (float)cols;
    float sq = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float d = ld(xr, c) - mean;
        sq += d * d;
    }
    float inv = rsqrtf(block_sum(sq) / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        yr[c] = f2bf((ld(xr, c) - mean) * inv * bf2f(w[c]) + bf2f(b[c]));
    }
}

extern "C" __global__ void layer_norm_bf16(bf16* __restrict__ y, const bf16* __restrict__ x,
                                           const bf16* __restrict__ w, const bf16* __restrict__ b,
                                           int cols, float eps) {
    PDL_ENTRY();
    layer_norm_impl(y, x, w, b, cols, eps);
}

extern "C" __global__ void layer_norm_f32(bf16* __restrict__ y, const float* __restrict__ x,
                                          const bf16* __restrict__ w, const bf16* __restrict__ b,
                                          int cols, float eps) {
    PDL_ENTRY();
    layer_norm_impl(y, x, w, b, cols, eps);
}
