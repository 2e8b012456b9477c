//! NVRTC compilation of pagoda's kernel sources, cached on disk.
//!
//! The `.cu` files under `kernels/` are compiled into the binary as strings
//! ([`SOURCES`]), concatenated behind `prelude.cuh`, and compiled once per
//! (source, options, NVRTC version) for the device's real architecture
//! (`--gpu-architecture=sm_XX` from its compute capability) into a CUBIN. The
//! CUBIN is kept under `$XDG_CACHE_HOME/pagoda/kernels/` (or
//! `~/.cache/pagoda/kernels/`), named by a hash of everything that went into
//! it, so a later start loads it without compiling. A cache that cannot be
//! read or written is not an error: the kernels are compiled again.
//!
//! The kernels need no CUDA headers (bf16 is handled as raw bits); the include
//! paths under `$CUDA_HOME` (default `/usr/local/cuda`) are passed when they
//! exist, for kernels that will.
//!
//! Cost: a cold compile takes about a second; a cache hit is one file read.

use std::path::{Path, PathBuf};

/// The kernel sources, in the order they are concatenated.
pub(crate) const SOURCES: &[(&str, &str)] = &[
    ("prelude.cuh", include_str!("kernels/prelude.cuh")),
    ("norm.cu", include_str!("kernels/norm.cu")),
    ("elementwise.cu", include_str!("kernels/elementwise.cu")),
    ("qk_norm_rope.cu", include_str!("kernels/qk_norm_rope.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("gemv.cu", include_str!("kernels/gemv.cu")),
    ("gemv_mma.cu", include_str!("kernels/gemv_mma.cu")),
    ("fp8_linear.cu", include_str!("kernels/fp8_linear.cu")),
    ("sampling.cu", include_str!("kernels/sampling.cu")),
    (
        "sampling_extras.cu",
        include_str!("kernels/sampling_extras.cu"),
    ),
    ("token_masks.cu", include_str!("kernels/token_masks.cu")),
    ("logit_adjust.cu", include_str!("kernels/logit_adjust.cu")),
    (
        "attention_decode.cu",
        include_str!("kernels/attention_decode.cu"),
    ),
    // After attention_decode.cu (its helpers and DEC_PARAMS).
    (
        "attention_decode_mma.cu",
        include_str!("kernels/attention_decode_mma.cu"),
    ),
    (
        "attention_prefill.cu",
        include_str!("kernels/attention_prefill.cu"),
    ),
    // After attention_prefill.cu (the mma helpers).
    (
        "attention_prefill_mma.cu",
        include_str!("kernels/attention_prefill_mma.cu"),
    ),
    // After elementwise.cu (silu) and attention_prefill.cu (the mma helpers).
    ("moe.cu", include_str!("kernels/moe.cu")),
];

/// Every `extern "C"` entry point the backend loads from the module.
pub(crate) const KERNELS: &[&str] = &[
    "mask_logits_bf16",
    "fill_u16",
    "fill_u32",
    "rms_norm_bf16",
    "rms_norm_f32",
    "add_rms_norm_bf16",
    "add_rms_norm_f32",
    "head_rms_norm_bf16",
    "layer_norm_bf16",
    "layer_norm_f32",
    "gather_rows_bf16",
    "gather_rows_f32",
    "gather_rows_bf16_f32",
    "gather_rows_f32_f32",
    "add_rows_bf16",
    "add_rows_f32",
    "add_rows_bf16_f32",
    "add_rows_f32_f32",
    "add_bias_bf16",
    "add_bias_f32",
    "add_bias_round_bf16",
    "silu_mul_bf16",
    "silu_mul_v8_bf16",
    "silu_mul2_bf16",
    "relu_bf16",
    "gelu_tanh_mul_bf16",
    "gelu_tanh_mul_v8_bf16",
    "scale_bf16",
    "scale_f32",
    "softcap_bf16",
    "softcap_f32",
    "add_bf16",
    "add_f32_bf16",
    "add_f32_f32",
    "rope_f32",
    "rope_bf16",
    "store_kv_bf16",
    "store_kv_v8_bf16",
    "store_kv_fp8",
    "store_kv_v8_fp8",
    "copy_blocks_bf16",
    "copy_blocks_fp8",
    "fp8_codec",
    "paged_attention_bf16",
    "paged_attention_fp8",
    "gemv_bf16",
    "gemv_bf16_acc_f32",
    "gemv3_bf16",
    "gemv3_norm_bf16",
    "gemv_norm_silu_bf16",
    "gemv_mma_bf16",
    "gemv_mma_acc_f32",
    "gemv_mma3_bf16",
    "qk_norm_rope_f32",
    "qk_norm_rope_bf16",
    "qk_norm_rope_store_f32_bf16",
    "qk_norm_rope_store_bf16_bf16",
    "qk_norm_rope_store_f32_fp8",
    "qk_norm_rope_store_bf16_fp8",
    "quant_rows_fp8",
    "fp8_rescale_bf16",
    "fp8_rescale_acc_f32",
    "sample_bf16",
    "penalize_bf16",
    "logprobs_bf16",
    "prompt_logprobs_bf16",
    "allow_only_bf16",
    "logit_entries_bf16",
    "paged_decode_attention_bf16_hd64_g1",
    "paged_decode_attention_bf16_hd64_g2",
    "paged_decode_attention_bf16_hd64_g4",
    "paged_decode_attention_bf16_hd64_g8",
    "paged_decode_attention_bf16_hd128_g1",
    "paged_decode_attention_bf16_hd128_g2",
    "paged_decode_attention_bf16_hd128_g4",
    "paged_decode_attention_bf16_hd128_g8",
    "paged_decode_attention_bf16_hd256_g1",
    "paged_decode_attention_bf16_hd256_g2",
    "paged_decode_attention_bf16_hd256_g4",
    "paged_decode_attention_bf16_hd256_g8",
    "paged_decode_attention_fp8_hd64_g1",
    "paged_decode_attention_fp8_hd64_g2",
    "paged_decode_attention_fp8_hd64_g4",
    "paged_decode_attention_fp8_hd64_g8",
    "paged_decode_attention_fp8_hd128_g1",
    "paged_decode_attention_fp8_hd128_g2",
    "paged_decode_attention_fp8_hd128_g4",
    "paged_decode_attention_fp8_hd128_g8",
    "paged_decode_attention_fp8_hd256_g1",
    "paged_decode_attention_fp8_hd256_g2",
    "paged_decode_attention_fp8_hd256_g4",
    "paged_decode_attention_fp8_hd256_g8",
    "paged_decode_attention_fp8_tc_hd64",
    "paged_decode_attention_fp8_tc_hd128",
    "paged_decode_attention_fp8_tc_hd256",
    "paged_decode_reduce_bf16",
    "prefill_attention_bf16_hd64",
    "prefill_attention_bf16_hd128",
    "prefill_attention_bf16_hd256",
    "prefill_mma_attention_bf16_hd64",
    "prefill_mma_attention_bf16_hd128",
    "prefill_mma_attention_bf16_hd256",
    "prefill_mma_attention_fp8_hd64",
    "prefill_mma_attention_fp8_hd128",
    "prefill_mma_attention_fp8_hd256",
    "prefill_attention_fp8_hd64",
    "prefill_attention_fp8_hd128",
    "prefill_attention_fp8_hd256",
    "moe_route_bf16",
    "moe_route_f32",
    "moe_group",
    "moe_gemm_gate_up_m64",
    "moe_gemm_gate_up_m16",
    "moe_gemm_down_m64",
    "moe_gemm_down_m16",
    "moe_combine_bf16",
    "moe_gemv_gate_up",
    "moe_gemv_down",
    "moe_ggemv_gate_up",
    "moe_ggemv_down",
    "moe_sigmoid_gate_bf16",
    "moe_sigmoid_gate_f32",
];

/// The whole program: every source file, each behind a `#line` marker so
/// compile errors name the file they come from.
pub(crate) fn program_source() -> String {
    let mut s = String::new();
    for (name, src) in SOURCES {
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(src);
        s.push('\n');
    }
    s
}

/// The CUDA installation root: `$CUDA_HOME`, else `/usr/local/cuda`.
pub(crate) fn cuda_home() -> PathBuf {
    std::env::var_os("CUDA_HOME")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/usr/local/cuda"), PathBuf::from)
}

/// NVRTC options for a device of compute capability `(major, minor)`.
pub(crate) fn options(cc: (i32, i32), cuda_home: &Path) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture=sm_{}{}", cc.0, cc.1),
        "--std=c++17".to_string(),
    ];
    for dir in [cuda_home.join("include"), cuda_home.join("include/cccl")] {
        if dir.is_dir() {
            o.push(format!("--include-path={}", dir.display()));
        }
    }
    o
}

/// 64-bit FNV-1a over the parts, with a separator between them.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(&[0xffu8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// File name of the cached CUBIN for this source, these options and this NVRTC.
pub(crate) fn cache_name(source: &str, opts: &[String], nvrtc_version: (i32, i32)) -> String {
    let version = format!("{}.{}", nvrtc_version.0, nvrtc_version.1);
    let joined = opts.join("\u{1}");
    let h = fnv1a(&[source.as_bytes(), joined.as_bytes(), version.as_bytes()]);
    format!("pagoda-{h:016x}.cubin")
}

/// `$XDG_CACHE_HOME/pagoda/kernels` or `~/.cache/pagoda/kernels`.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("pagoda").join("kernels"))
}

/// Whether `bytes` look like a CUBIN (an ELF image).
fn is_elf(bytes: &[u8]) -> bool {
    bytes.len() > 4 && bytes[..4] == *b"\x7fELF"
}

fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for the call.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed: {r:?}"));
    }
    Ok((major, minor))
}

/// Compiles `source` with `opts` and returns the CUBIN.
fn compile(source: &str, opts: &[String]) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(source).map_err(|e| e.to_string())?;
    let name = c"pagoda_kernels.cu";
    let prog = result::create_program(&src, Some(name)).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `prog` is live until the destroy below; buffers are sized by NVRTC.
    let out = unsafe {
        match result::compile_program(prog, opts) {
            Ok(()) => {
                let mut size = 0usize;
                let r = sys::nvrtcGetCUBINSize(prog, &mut size);
                if r != sys::nvrtcResult::NVRTC_SUCCESS {
                    Err(format!("nvrtcGetCUBINSize: {r:?}"))
                } else {
                    let mut buf = vec![0u8; size];
                    let r = sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast());
                    if r != sys::nvrtcResult::NVRTC_SUCCESS {
                        Err(format!("nvrtcGetCUBIN: {r:?}"))
                    } else {
                        Ok(buf)
                    }
                }
            }
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                        String::from_utf8_lossy(&bytes)
                            .trim_end_matches('\0')
                            .to_string()
                    })
                    .unwrap_or_default();
                Err(format!("{e:?} with options {opts:?}:\n{log}"))
            }
        }
    };
    // SAFETY: created above and not destroyed yet.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// The CUBIN of the kernel program for compute capability `cc`, from the
/// disk cache when present, else compiled (and cached).
pub(crate) fn load_or_compile(cc: (i32, i32)) -> Result<Vec<u8>, String> {
    let source = program_source();
    let opts = options(cc, &cuda_home());
    let name = cache_name(&source, &opts, nvrtc_version()?);
    let path = cache_dir().map(|d| d.join(&name));
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if is_elf(&bytes) {
            return Ok(bytes);
        }
    }
    let cubin = compile(&source, &opts)?;
    if let Some(p) = &path {
        store(p, &cubin);
    }
    Ok(cubin)
}

/// Writes the cache file through a temporary name, so a reader never sees
/// half a file. Failures are ignored (the cache is an optimization).
fn store(path: &Path, bytes: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `extern "C" __global__` names declared in the program (skipping
    /// a `__launch_bounds__(...)` between the return type and the name).
    fn declared_kernels(src: &str) -> Vec<String> {
        let mut names = Vec::new();
        for (i, _) in src.match_indices("extern \"C\" __global__") {
            let mut rest = &src[i..];
            if let Some(lb) = rest.find("__launch_bounds__(") {
                if lb < rest.find('{').unwrap_or(0) && lb < rest.find(';').unwrap_or(usize::MAX) {
                    let close = rest[lb..].find(')').map_or(rest.len(), |c| lb + c + 1);
                    rest = &rest[close..];
                }
            }
            let open = rest.find('(').unwrap_or(rest.len());
            if let Some(name) = rest[..open].split_whitespace().last() {
                names.push(name.to_string());
            }
        }
        // A kernel declared by a macro (`#define M(NAME, ...)` whose body
        // declares `NAME`) is declared once per line `M(name, ...)`.
        for (i, _) in src.match_indices("#define ") {
            let line = &src[i + 8..];
            let Some(open) = line.find('(') else { continue };
            let (macro_name, params) = (&line[..open], &line[open + 1..]);
            let Some(first) = params.split([',', ')']).next().map(str::trim) else {
                continue;
            };
            if let Some(at) = names.iter().position(|n| n == first) {
                names.remove(at);
                for (j, _) in src.match_indices(&format!("\n{macro_name}(")) {
                    let args = &src[j + macro_name.len() + 2..];
                    if let Some(name) = args.split([',', ')']).next() {
                        names.push(name.trim().to_string());
                    }
                }
            }
        }
        names
    }

    #[test]
    fn every_loaded_kernel_is_declared_once_and_every_declared_one_is_loaded() {
        let declared = declared_kernels(&program_source());
        for k in KERNELS {
            let n = declared.iter().filter(|d| d == k).count();
            assert_eq!(n, 1, "{k} declared {n} times");
        }
        for d in &declared {
            assert!(KERNELS.contains(&d.as_str()), "{d} is never loaded");
        }
    }

    #[test]
    fn sources_are_concatenated_with_line_markers_in_order() {
        let s = program_source();
        let mut at = 0;
        for (name, _) in SOURCES {
            let marker = format!("#line 1 \"{name}\"");
            let i = s[at..].find(&marker).expect("marker present") + at;
            at = i + marker.len();
        }
        // The prelude's helpers come before any use.
        assert!(s.find("f2bf(float").unwrap() < s.find("rms_norm_bf16").unwrap());
        // Braces balance (a cheap guard against a truncated file).
        assert_eq!(s.matches('{').count(), s.matches('}').count());
    }

    #[test]
    fn options_target_the_real_architecture() {
        let o = options((9, 0), Path::new("/nonexistent-cuda"));
        assert_eq!(o[0], "--gpu-architecture=sm_90");
        assert!(!o.iter().any(|x| x.starts_with("--include-path")));
        assert_eq!(
            options((12, 1), Path::new("/x"))[0],
            "--gpu-architecture=sm_121"
        );
    }

    #[test]
    fn cache_name_depends_on_source_options_and_version() {
        let o90 = options((9, 0), Path::new("/none"));
        let o80 = options((8, 0), Path::new("/none"));
        let a = cache_name("x", &o90, (13, 0));
        assert_eq!(a, cache_name("x", &o90, (13, 0)));
        assert_ne!(a, cache_name("y", &o90, (13, 0)));
        assert_ne!(a, cache_name("x", &o80, (13, 0)));
        assert_ne!(a, cache_name("x", &o90, (13, 1)));
        assert!(a.starts_with("pagoda-") && a.ends_with(".cubin"));
    }

    /// Compiles the program for sm_90 where libnvrtc can be opened (no GPU
    /// needed), so a kernel that does not compile fails here, not on the GPU.
    #[test]
    fn program_compiles_where_nvrtc_is_present() {
        // SAFETY: only tries to open the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("notice: libnvrtc not found; NVRTC compile test skipped");
            return;
        }
        let opts = options((9, 0), &cuda_home());
        let cubin = compile(&program_source(), &opts).unwrap_or_else(|e| panic!("{e}"));
        assert!(is_elf(&cubin));
    }

    #[test]
    fn elf_check() {
        assert!(is_elf(b"\x7fELF\x02\x01"));
        assert!(!is_elf(b"// PTX"));
        assert!(!is_elf(b""));
    }
}
