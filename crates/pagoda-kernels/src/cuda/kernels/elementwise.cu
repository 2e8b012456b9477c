// Elementwise and gather ops: grid-stride loops over output elements, so any
// launch size covers any tensor. Index arrays (token ids, positions, rows,
// slots) come from the step's packed int32 buffer and were range-checked on
// the host before the launch.

extern "C" __global__ void fill_u16(unsigned short* p, unsigned short v, long long n) {
    PDL_ENTRY();
    GRID_STRIDE(i, n) { p[i] = v; }
}

extern "C" __global__ void fill_u32(unsigned int* p, unsigned int v, long long n) {
    PDL_ENTRY();
    GRID_STRIDE(i, n) { p[i] = v; }
}

// y[r, c] = table[rows[r] + offset, c]; Y and T are bf16 or float.
template <typename Y, typename T>
__device__ void gather_rows_impl(Y* y, const T* table, const int* rows, int offset, int n_rows,
                                 int cols) {
    long long n = (long long)n_rows * cols;
    GRID_STRIDE(i, n) {
        long long r = i / cols;
        int c = (int)(i - r * cols);
        st(y, i, ld(table, (long long)(rows[r] + offset) * cols + c));
    }
}

// x[r, c] += table[rows[r] + offset, c]
template <typename X, typename T>
__device__ void add_rows_impl(X* x, const T* table, const int* rows, int offset, int n_rows,
                              int cols) {
    long long n = (long long)n_rows * cols;
    GRID_STRIDE(i, n) {
        long long r = i / cols;
        int c = (int)(i - r * cols);
        st(x, i, ld(x, i) + ld(table, (long long)(rows[r] + offset) * cols + c));
    }
}

// Entry points named <op>_<table type>[_<output type>], the output bf16
// where none is named (the f32 outputs are the residual stream).
extern "C" __global__ void gather_rows_bf16(bf16* y, const bf16* table, const int* rows,
                                  int offset, int n_rows, int cols) {
    PDL_ENTRY();
    gather_rows_impl(y, table, rows, offset, n_rows, cols);
}

extern "C" __global__ void add_rows_bf16(bf16* x, const bf16* table, const int* rows, int offset,
                               int n_rows, int cols) {
    PDL_ENTRY();
    add_rows_impl(x, table, rows, offset, n_rows, cols);
}

extern "C" __global__ void gather_rows_f32(bf16* y, const float* table, const int* rows,
                                  int offset, int n_rows, int cols) {
    PDL_ENTRY();
    gather_rows_impl(y, table, rows, offset, n_rows, cols);
}

extern "C" __global__ void add_rows_f32(bf16* x, const float* table, const int* rows, int offset,
                               int n_rows, int cols) {
    PDL_ENTRY();
    add_rows_impl(x, table, rows, offset, n_rows, cols);
}

extern "C" __global__ void gather_rows_bf16_f32(float* y, const bf16* table, const int* rows,
                                  int offset, int n_rows, int cols) {
    PDL_ENTRY();
    gather_rows_impl(y, table, rows, offset, n_rows, cols);
}

extern "C" __global__ void add_rows_bf16_f32(float* x, const bf16* table, const int* rows, int offset,
                               int n_rows, int cols) {
    PDL_ENTRY();
    add_rows_impl(x, table, rows, offset, n_rows, cols);
}

extern "C" __global__ void gather_rows_f32_f32(float* y, const float* table, const int* rows,
                                  int offset, int n_rows, int cols) {
    PDL_ENTRY();
    gather_rows_impl(y, table, rows, offset, n_rows, cols);
}

extern "C" __global__ void add_rows_f32_f32(float* x, const float* table, const int* rows, int offset,
                               int n_rows, int cols) {
    PDL_ENTRY();
    add_rows_impl(x, table, rows, offset, n_rows, cols);
}

// y[r, c] += bias[c]
template <typename Y>
__device__ void add_bias_impl(Y* y, const bf16* bias, int n_rows, int cols) {
    long long n = (long long)n_rows * cols;
    GRID_STRIDE(i, n) { st(y, i, ld(y, i) + bf2f(bias[i % cols])); }
}

extern "C" __global__ void add_bias_bf16(bf16* y, const bf16* bias, int n_rows, int cols) {
    PDL_ENTRY();
    add_bias_impl(y, bias, n_rows, cols);
}

extern "C" __global__ void add_bias_f32(float* y, const bf16* bias, int n_rows, int cols) {
    PDL_ENTRY();
    add_bias_impl(y, bias, n_rows, cols);
}

// y[r, c] = bf16(acc[r, c] + bias[c]): an f32 product and its bias rounded to
// bf16 once, as cuBLASLt's bias epilogue (and PyTorch's bf16 F.linear) does.
extern "C" __global__ void add_bias_round_bf16(bf16* y, const float* acc, const bf16* bias,
                                               int n_rows, int cols) {
    PDL_ENTRY();
    long long n = (long long)n_rows * cols;
    GRID_STRIDE(i, n) { y[i] = f2bf(acc[i] + bf2f(bias[i % cols])); }
}

// y[r, c] = act(gu[r, c]) * gu[r, n + c], one element per thread (any n).
template <int ACT>
__device__ void gated_impl(bf16* y, const bf16* gu, int n_rows, int n) {
    long long total = (long long)n_rows * n;
    GRID_STRIDE(i, total) {
        long long r = i / n;
        int c = (int)(i - r * n);
        const bf16* row = gu + r * 2 * n;
        y[i] = f2bf(gate_act<ACT>(bf2f(row[c])) * bf2f(row[n + c]));
    }
}

// The same, eight elements per thread through 16-byte loads and stores: n is
// a multiple of 8 and y, gu start 16-byte aligned (the host checks n; arena
// ranges are 512-byte aligned), so every row's gate, up and output start
// aligned too.
template <int ACT>
__device__ void gated_v8_impl(bf16* y, const bf16* gu, int n_rows, int n) {
    int n8 = n >> 3;
    long long total = (long long)n_rows * n8;
    GRID_STRIDE(t, total) {
        long long r = t / n8;
        int c8 = (int)(t - r * n8);
        const bf16* row = gu + r * 2 * n;
        uint4 g = ((const uint4*)row)[c8];
        uint4 u = ((const uint4*)(row + n))[c8];
        unsigned int gw[4] = {g.x, g.y, g.z, g.w};
        unsigned int uw[4] = {u.x, u.y, u.z, u.w};
        unsigned int ow[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float g0 = __uint_as_float(gw[j] << 16), g1 = __uint_as_float(gw[j] & 0xffff0000u);
            float u0 = __uint_as_float(uw[j] << 16), u1 = __uint_as_float(uw[j] & 0xffff0000u);
            unsigned int lo = f2bf(gate_act<ACT>(g0) * u0);
            unsigned int hi = f2bf(gate_act<ACT>(g1) * u1);
            ow[j] = lo | (hi << 16);
        }
        ((uint4*)(y + r * n))[c8] = make_uint4(ow[0], ow[1], ow[2], ow[3]);
    }
}

extern "C" __global__ void silu_mul_bf16(bf16* y, const bf16* gu, int n_rows, int n) {
    PDL_ENTRY();
    gated_impl<0>(y, gu, n_rows, n);
}

extern "C" __global__ void silu_mul_v8_bf16(bf16* y, const bf16* gu, int n_rows, int n) {
    PDL_ENTRY();
    gated_v8_impl<0>(y, gu, n_rows, n);
}

extern "C" __global__ void gelu_tanh_mul_bf16(bf16* y, const bf16* gu, int n_rows, int n) {
    PDL_ENTRY();
    gated_impl<1>(y, gu, n_rows, n);
}

extern "C" __global__ void gelu_tanh_mul_v8_bf16(bf16* y, const bf16* gu, int n_rows, int n) {
    PDL_ENTRY();
    gated_v8_impl<1>(y, gu, n_rows, n);
}

extern "C" __global__ void silu_mul2_bf16(bf16* y, const bf16* g, const bf16* u, long long n) {
    PDL_ENTRY();
    GRID_STRIDE(i, n) { y[i] = f2bf(silu(bf2f(g[i])) * bf2f(u[i])); }
}

// x *= factor (bf16 activations or the f32 residual).
template <typename X>
__device__ void scale_impl(X* x, float factor, long long n) {
    GRID_STRIDE(i, n) { st(x, i, ld(x, i) * factor); }
}

extern "C" __global__ void scale_bf16(bf16* x, float factor, long long n) {
    PDL_ENTRY();
    scale_impl(x, factor, n);
}

extern "C" __global__ void scale_f32(float* x, float factor, long long n) {
    PDL_ENTRY();
    scale_impl(x, factor, n);
}

// x = cap * tanh(x / cap)
template <typename X>
__device__ void softcap_impl(X* x, float cap, long long n) {
    GRID_STRIDE(i, n) { st(x, i, cap * tanhf(ld(x, i) / cap)); }
}

extern "C" __global__ void softcap_bf16(bf16* x, float cap, long long n) {
    PDL_ENTRY();
    softcap_impl(x, cap, n);
}

extern "C" __global__ void softcap_f32(float* x, float cap, long long n) {
    PDL_ENTRY();
    softcap_impl(x, cap, n);
}

extern "C" __global__ void relu_bf16(bf16* x, long long n) {
    PDL_ENTRY();
    GRID_STRIDE(i, n) { x[i] = f2bf(fmaxf(bf2f(x[i]), 0.0f)); }
}

// x += y: bf16 += bf16, and the f32 residual += bf16 or f32.
template <typename X, typename Y>
__device__ void add_impl(X* x, const Y* y, long long n) {
    GRID_STRIDE(i, n) { st(x, i, ld(x, i) + ld(y, i)); }
}

extern "C" __global__ void add_bf16(bf16* x, const bf16* y, long long n) {
    PDL_ENTRY();
    add_impl(x, y, n);
}

extern "C" __global__ void add_f32_bf16(float* x, const bf16* y, long long n) {
    PDL_ENTRY();
    add_impl(x, y, n);
}

extern "C" __global__ void add_f32_f32(float* x, const float* y, long long n) {
    PDL_ENTRY();
    add_impl(x, y, n);
}

// Rotary embedding in place. Rows are spread over blockIdx.y (a grid-stride
// loop past 65,535 rows) and the (head, pair) items of a row over the x
// dimension, so a row's position and table row are read once per block and
// no 64-bit division is done per element. The table row of a position holds
// rd/2 cosines then rd/2 sines. style 0 = NeoX (i pairs with i + rd/2),
// 1 = interleaved (2i pairs with 2i + 1).

template <typename T>
__device__ void rope_impl(bf16* x, const int* positions, const T* table, int n_rows,
                          int n_heads, int head_dim, int rd, int style) {
    int half = rd / 2;
    int per_row = n_heads * half;
    for (int r = blockIdx.y; r < n_rows; r += gridDim.y) {
        long long trow = (long long)positions[r] * rd;
        bf16* xr = x + (long long)r * n_heads * head_dim;
        for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < per_row;
             t += gridDim.x * blockDim.x) {
            int hh = t / half;
            int i = t - hh * half;
            bf16* h = xr + hh * head_dim;
            float c = ld(table, trow + i);
            float s = ld(table, trow + half + i);
            int a = style == 0 ? i : 2 * i;
            int b = style == 0 ? i + half : 2 * i + 1;
            rope_rotate(h, a, b, bf2f(h[a]), bf2f(h[b]), c, s);
        }
    }
}

extern "C" __global__ void rope_f32(bf16* x, const int* positions, const float* table,
                                    int n_rows, int n_heads, int head_dim, int rd, int style) {
    PDL_ENTRY();
    rope_impl(x, positions, table, n_rows, n_heads, head_dim, rd, style);
}

extern "C" __global__ void rope_bf16(bf16* x, const int* positions, const bf16* table,
                                     int n_rows, int n_heads, int head_dim, int rd, int style) {
    PDL_ENTRY();
    rope_impl(x, positions, table, n_rows, n_heads, head_dim, rd, style);
}

// Writes each token's K and V row ([width] = num_kv_heads * head_dim) into its
// slot; slot -1 (padding) is skipped. VEC elements (1 or 8) per thread; with
// 8, width is a multiple of 8 and every base is 16-byte aligned (the host
// checks width; arena ranges and cache allocations are aligned), so each
// 8-element group moves as one 16-byte load and one 16-byte (bf16) or
// 8-byte (FP8) store. An FP8 cache (KV = fp8) stores f2fp8(x / scale), the
// layer's k_scale or v_scale from kv_scales = {k_scale, v_scale} (round to
// nearest even, saturating: fp8.rs's encoder); a bf16 one ignores kv_scales.

template <int VEC, typename KV>
__device__ void store_kv_impl(KV* k_cache, KV* v_cache, const bf16* k, const bf16* v,
                              const float* kv_scales, const int* slots, int n_rows, int width) {
    float ks = 1.0f, vs = 1.0f;
    if constexpr (sizeof(KV) == 1) {
        ks = kv_scales[0];
        vs = kv_scales[1];
    }
    int wv = width / VEC;
    long long n = (long long)n_rows * wv;
    GRID_STRIDE(i, n) {
        long long r = i / wv;
        int e = (int)(i - r * wv) * VEC;
        int slot = slots[r];
        if (slot >= 0) {
            long long dst = (long long)slot * width + e;
            long long src = r * width + e;
            if (VEC == 8) {
                kv_put8(k_cache, dst, *(const uint4*)(k + src), ks);
                kv_put8(v_cache, dst, *(const uint4*)(v + src), vs);
            } else {
                kv_put(k_cache, dst, k[src], ks);
                kv_put(v_cache, dst, v[src], vs);
            }
        }
    }
}

#define STORE_KV_ARGS(KV)                                                                  \
    KV *k_cache, KV *v_cache, const bf16 *k, const bf16 *v, const float *kv_scales,       \
        const int *slots, int n_rows, int width
#define STORE_KV_PASS k_cache, v_cache, k, v, kv_scales, slots, n_rows, width

extern "C" __global__ void store_kv_bf16(STORE_KV_ARGS(bf16)) {
    PDL_ENTRY();
    store_kv_impl<1>(STORE_KV_PASS);
}

extern "C" __global__ void store_kv_v8_bf16(STORE_KV_ARGS(bf16)) {
    PDL_ENTRY();
    store_kv_impl<8>(STORE_KV_PASS);
}

extern "C" __global__ void store_kv_fp8(STORE_KV_ARGS(fp8)) {
    PDL_ENTRY();
    store_kv_impl<1>(STORE_KV_PASS);
}

extern "C" __global__ void store_kv_v8_fp8(STORE_KV_ARGS(fp8)) {
    PDL_ENTRY();
    store_kv_impl<8>(STORE_KV_PASS);
}

// Copy-on-write: blockIdx.y picks a (src, dst, num_tokens) triple; copies
// num_tokens * slot_elems leading elements of block src into block dst. The
// elements move as they are (bf16 or FP8 bytes: the scales are per layer).
template <typename T>
__device__ void copy_blocks_impl(T* k_cache, T* v_cache, const int* ops, long long block_elems,
                                 int slot_elems) {
    const int* op = ops + 3 * blockIdx.y;
    long long src = (long long)op[0] * block_elems;
    long long dst = (long long)op[1] * block_elems;
    long long n = (long long)op[2] * slot_elems;
    GRID_STRIDE(i, n) {
        k_cache[dst + i] = k_cache[src + i];
        v_cache[dst + i] = v_cache[src + i];
    }
}

extern "C" __global__ void copy_blocks_bf16(bf16* k_cache, bf16* v_cache, const int* ops,
                                            long long block_elems, int slot_elems) {
    PDL_ENTRY();
    copy_blocks_impl(k_cache, v_cache, ops, block_elems, slot_elems);
}

extern "C" __global__ void copy_blocks_fp8(fp8* k_cache, fp8* v_cache, const int* ops,
                                           long long block_elems, int slot_elems) {
    PDL_ENTRY();
    copy_blocks_impl(k_cache, v_cache, ops, block_elems, slot_elems);
}

// Test hook (cuda::testing::fp8_codec): the device's FP8 E4M3 encoder on
// x[0..n) into enc, and its decoders on codes[0..m): fp82f into dec[0..m),
// fp8x4_to_f32 (four codes a word, the last word zero-padded) into
// dec[m..2m), so a test can hold them against fp8.rs.
extern "C" __global__ void fp8_codec(const float* x, fp8* enc, int n, const fp8* codes, float* dec,
                                     int m) {
    PDL_ENTRY();
    GRID_STRIDE(i, n) { enc[i] = f2fp8(x[i]); }
    GRID_STRIDE(i, m) { dec[i] = fp82f(codes[i]); }
    GRID_STRIDE(i, (m + 3) / 4) {
        unsigned w = 0u;
        for (int b = 0; b < 4 && 4 * i + b < m; b++) {
            w |= (unsigned)codes[4 * i + b] << (8 * b);
        }
        float f[4];
        fp8x4_to_f32(w, f);
        for (int b = 0; b < 4 && 4 * i + b < m; b++) {
            dec[m + 4 * i + b] = f[b];
        }
    }
}
