// Shared helpers of pagoda's CUDA kernels: bf16 <-> f32 conversion without
// the CUDA headers (bf16 is the top half of an f32; conversion rounds to
// nearest even and keeps NaN a NaN) and block-wide f32 sums.
//
// Every compile unit (compile.rs's UNITS) is this prelude, the shared .cuh
// helpers it needs and its .cu files, concatenated and compiled with NVRTC as
// one module; entry points are `extern "C"` so their names are stable.

typedef unsigned short bf16;

// Programmatic dependent launch (sm_90 and newer): the host may launch a
// kernel with the programmatic-stream-serialization attribute, so that its
// blocks start while the kernel before it in the stream still runs. Every
// kernel's first statement is PDL_ENTRY(), before it reads anything:
// griddepcontrol.wait blocks until the previous kernel has completed and
// its writes are visible (at once when the launch has no such dependency),
// and since every kernel waits so, a kernel never overtakes any earlier
// one. griddepcontrol.launch_dependents then lets the next kernel's blocks
// be scheduled (they wait in turn). Before sm_90 there is no such launch
// (the host sets the attribute only from compute capability 9.0) and the
// macro is empty.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_ENTRY() \
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_ENTRY() \
    do {            \
    } while (0)
#endif

// -inf without <math.h> (NVRTC has no INFINITY without the headers).
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf2f(bf16 v) {
    return __uint_as_float(((unsigned int)v) << 16);
}

__device__ __forceinline__ bf16 f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16)0x7fc0;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// FP8 E4M3 ("e4m3fn") <-> f32: the device side of `pagoda_kernels::fp8`.
// Encoding rounds to nearest even and saturates finite values to +-448; NaN
// stays NaN. Ada and Hopper convert in hardware; older devices apply the
// same rules in integer code, so every arch gives the host's bytes.
typedef unsigned char fp8;

__device__ __forceinline__ float fp82f(fp8 b) {
#if __CUDA_ARCH__ >= 890
    unsigned int h2;
    unsigned short in = b;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
    unsigned short lo = (unsigned short)(h2 & 0xffffu);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(lo));
    return f;
#else
    unsigned int s = ((unsigned int)b & 0x80u) << 24;
    unsigned int e = ((unsigned int)b >> 3) & 0xfu;
    unsigned int m = (unsigned int)b & 7u;
    if (e == 15u && m == 7u) {
        return __uint_as_float(s | 0x7fc00000u);
    }
    float v = e == 0u ? (float)m * (1.0f / 512.0f)
                      : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return __uint_as_float(__float_as_uint(v) | s);
#endif
}

// Four FP8 E4M3 values (the bytes of `w`, lowest first) as f32, exactly as
// fp82f decodes them: on Ada and Hopper two cvt.rn.f16x2.e4m3x2 (two bytes
// each; every E4M3 value is an f16 normal or zero, so this is exact) and
// four f16 widenings, i.e. 1.5 instructions a value instead of fp82f's
// extract, convert and widen per byte. Hot loops (decode and prefill
// attention over an FP8 cache) decode through this.
__device__ __forceinline__ void fp8x4_to_f32(unsigned w, float* f) {
#if __CUDA_ARCH__ >= 890
    unsigned lo2, hi2;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo2), "=r"(hi2)
        : "r"(w));
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\t"
        "cvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\t}"
        : "=f"(f[0]), "=f"(f[1])
        : "r"(lo2));
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\t"
        "cvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\t}"
        : "=f"(f[2]), "=f"(f[3])
        : "r"(hi2));
#else
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[i] = fp82f((fp8)((w >> (8 * i)) & 0xffu));
    }
#endif
}

__device__ __forceinline__ fp8 f2fp8(float f) {
#if __CUDA_ARCH__ >= 890
    unsigned short out;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(0.0f), "f"(f));
    return (fp8)(out & 0xffu);
#else
    unsigned int u = __float_as_uint(f);
    unsigned int s = (u >> 24) & 0x80u;
    unsigned int bits = u & 0x7fffffffu;
    if (bits > 0x7f800000u) {
        return (fp8)0x7fu;
    }
    float a = __uint_as_float(bits);
    if (a >= 448.0f) {
        return (fp8)(s | 0x7eu);
    }
    if (a < 0.015625f) {
        return (fp8)(s | (unsigned int)__float2int_rn(a * 512.0f));
    }
    unsigned int e = (bits >> 23) - 120u;
    unsigned int m = (bits >> 20) & 7u;
    unsigned int rem = bits & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (m & 1u))) {
        m += 1u;
        if (m == 8u) {
            m = 0u;
            e += 1u;
        }
    }
    unsigned int code = (e << 3) | m;
    return (fp8)(s | (code > 0x7eu ? 0x7eu : code));
#endif
}

// Loads and stores of activation elements as f32, for kernels templated on
// the element type (bf16 activations, the f32 residual stream, f32 tables).
__device__ __forceinline__ float ld(const bf16* p, long long i) { return bf2f(p[i]); }
__device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ void st(bf16* p, long long i, float v) { p[i] = f2bf(v); }
__device__ __forceinline__ void st(float* p, long long i, float v) { p[i] = v; }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the result. Uses 33 floats of shared memory.
__device__ float block_sum(float v) {
    __shared__ float partial[33];
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) {
        partial[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        float s = lane < nw ? partial[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) {
            partial[32] = s;
        }
    }
    __syncthreads();
    return partial[32];
}

// Logit soft-capping (Gemma 2): cap * tanh(s / cap), as cap - 2 cap / (e + 1)
// with e = 2^(2 s log2(e) / cap): one exp2 and one approximate reciprocal, an absolute
// error of a few ulp of cap (what the softmax feels), saturating to +-cap
// (e overflows to inf or underflows to 0) and never NaN for a finite s.
// Scores in the log2 domain (s * log2 e) take cap * log2 e as their cap.
__device__ __forceinline__ float softcap_score(float s, float cap) {
    const float e = exp2f(s * (2.0f * 1.4426950408889634f / cap));
    float r;  // 1 / (e + 1) within 1 ulp; +0 for inf (no call, unlike __frcp_rn)
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e + 1.0f));
    return cap - 2.0f * cap * r;
}
