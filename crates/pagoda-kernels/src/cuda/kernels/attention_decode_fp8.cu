// Entry points of the split-K decode attention over an FP8 E4M3 cache; the
// kernel and its launch scheme are in attention_decode.cu, which this
// compile unit includes first.

extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd64_g1(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(64, 1, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd64_g2(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(64, 2, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd64_g4(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(64, 4, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd64_g8(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(64, 8, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd128_g1(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(128, 1, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd128_g2(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(128, 2, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd128_g4(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(128, 4, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd128_g8(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(128, 8, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd256_g1(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(256, 1, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd256_g2(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(256, 2, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd256_g4(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(256, 4, fp8);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
paged_decode_attention_fp8_hd256_g8(DEC_PARAMS(fp8)) {
    PDL_ENTRY();
    DEC_CALL(256, 8, fp8);
}
