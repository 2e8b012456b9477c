// Shared by the expert kernels of moe.cu, moe_gemm.cu and moe_stream.cu
// (their algorithms are in moe.cu's header): tile constants, the weight
// types, the two epilogues, the cp.async tile loads and the GEMMs' common
// argument list. Included by each of their compile units.

#define MR_WARPS 4
#define MR_CACHE 8
#define MG_THREADS 256
#define MG_WARPS (MG_THREADS / 32)
#define MOE_THREADS 128
#define MOE_BK 32
#define MOE_LD (MOE_BK + 8)
#define MV_WARPS 8
#define MV_BM 8

// Waits until at most N committed cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void moe_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Expert weight storage, the template parameter W of every kernel that
// reads expert weights: bf16, or FP8 E4M3 codes with one f32 scale per
// weight row (`w_scale`, indexed like the rows; unread for bf16). A "chunk"
// is 8 consecutive weights of a row (16 bytes of bf16, 8 of FP8); the GEMV
// loops keep UNROLL chunks of a row in flight per lane, the same 64 bytes
// for both. Codes widen exactly (every E4M3 value is an f16 and a bf16);
// the dot products run on the codes and each is multiplied by its row's
// scale in f32 in the epilogue.
struct MoeBf16 {
    typedef bf16 T;
    typedef uint4 Chunk;
    static constexpr bool FP8 = false;
    static constexpr int UNROLL = 4;
    __device__ static __forceinline__ float scale(const float*, long long) { return 1.0f; }
    __device__ static __forceinline__ void to_f32(Chunk c, float* f) { bf16x8_to_f32(c, f); }
};

struct MoeFp8 {
    typedef fp8 T;
    typedef uint2 Chunk;
    static constexpr bool FP8 = true;
    static constexpr int UNROLL = 8;
    __device__ static __forceinline__ float scale(const float* s, long long row) { return s[row]; }
    __device__ static __forceinline__ void to_f32(Chunk c, float* f) {
        fp8x4_to_f32(c.x, f);
        fp8x4_to_f32(c.y, f + 4);
    }
};

// The two epilogues of every path: a gate_up output from the gate and up
// dot products of weight rows gr and ur, and a down output from the dot
// product of weight row dr and the pair's routing weight.
template <typename W>
__device__ __forceinline__ float moe_gate_up_val(float g, float u, const float* __restrict__ s,
                                                 long long gr, long long ur) {
    return silu(g * W::scale(s, gr)) * (u * W::scale(s, ur));
}

template <typename W>
__device__ __forceinline__ float moe_down_val(float acc, float route_w,
                                              const float* __restrict__ s, long long dr) {
    return route_w * (acc * W::scale(s, dr));
}

// One 16-byte piece of a GEMM operand tile into shared memory: a cp.async
// where rows are 16-byte aligned (vec), element copies otherwise; zero past
// k and for absent rows.
template <typename T>
__device__ __forceinline__ void moe_load16(T* dst, const T* src, int kk, int k, bool vec) {
    constexpr int N = 16 / sizeof(T);
    if (vec) {
        if (src != nullptr && kk < k) {
            pf_cp_async16(pf_smem_addr(dst), src + kk);
        } else {
            pf_zero16(dst);
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) {
            dst[i] = (src != nullptr && kk + i < k) ? src[kk + i] : (T)0;
        }
    }
}

// Two f32 values that are exactly bf16 values (widened codes) as a bf16x2.
__device__ __forceinline__ unsigned moe_pack_bf16x2(float lo, float hi) {
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

#define MOE_GEMM_ARGS(WT)                                                                        \
    bf16 *__restrict__ out, const bf16 *__restrict__ a, const WT *__restrict__ w,                \
        const float *__restrict__ w_scale, const int *__restrict__ meta,                          \
        const int *__restrict__ slot_pair, const float *__restrict__ route_w, int top_k, int n,   \
        int k, int vec
#define MOE_GEMM_PASS out, a, w, w_scale, meta, slot_pair, route_w, top_k, n, k, vec
