//! NVRTC compilation of pagoda's kernel sources, cached on disk.
//!
//! The `.cu` files under `kernels/` (and the `.cuh` helpers they share) are
//! compiled into the binary as strings ([`SOURCES`]) and grouped into
//! compile units ([`UNITS`]): each unit is `prelude.cuh`, the headers it
//! needs and its `.cu` files, concatenated, and is its own NVRTC program and
//! CUDA module. Every source that declares entry points belongs to exactly
//! one unit, so every entry point ([`KERNELS`]) is in exactly one module
//! (tested); a source without any (the `.cuh` headers, the split-K decode
//! kernel's body in `attention_decode.cu`) may open several units.
//!
//! Each unit is compiled once per (its source, options, NVRTC version) for
//! the device's real architecture (`--gpu-architecture=sm_XX` from its
//! compute capability) into a CUBIN, kept under
//! `$XDG_CACHE_HOME/pagoda/kernels/` (or `~/.cache/pagoda/kernels/`) named by
//! a hash of everything that went into it, so a later start loads it
//! without compiling, and an edit to one unit recompiles only that unit. A
//! cache that cannot be read or written is not an error: the unit is
//! compiled again. Units missing from the cache are compiled concurrently,
//! one thread each ([`load_or_compile_all`]; NVRTC is thread-safe across
//! programs), so a cold start costs about the slowest unit, not the sum.
//!
//! The kernels need no CUDA headers (bf16 is handled as raw bits); the include
//! paths under `$CUDA_HOME` (default `/usr/local/cuda`) are passed when they
//! exist, for kernels that will.
//!
//! Cost: a cold compile of the largest unit takes seconds (see
//! `scripts/check-kernels.py`, which times each unit); a cache hit is one
//! file read per unit.

use std::path::{Path, PathBuf};

/// The kernel sources by file name: the prelude, the shared headers, then
/// every `.cu` file.
pub(crate) const SOURCES: &[(&str, &str)] = &[
    ("prelude.cuh", include_str!("kernels/prelude.cuh")),
    ("common.cuh", include_str!("kernels/common.cuh")),
    ("kv.cuh", include_str!("kernels/kv.cuh")),
    ("mma.cuh", include_str!("kernels/mma.cuh")),
    ("moe.cuh", include_str!("kernels/moe.cuh")),
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
        "attention_decode_bf16.cu",
        include_str!("kernels/attention_decode_bf16.cu"),
    ),
    (
        "attention_decode_fp8.cu",
        include_str!("kernels/attention_decode_fp8.cu"),
    ),
    (
        "attention_prefill.cu",
        include_str!("kernels/attention_prefill.cu"),
    ),
    (
        "attention_prefill_mma.cu",
        include_str!("kernels/attention_prefill_mma.cu"),
    ),
    ("moe.cu", include_str!("kernels/moe.cu")),
    ("moe_gemm.cu", include_str!("kernels/moe_gemm.cu")),
    ("moe_stream.cu", include_str!("kernels/moe_stream.cu")),
];

/// The compile units: a name and the sources after `prelude.cuh`, in the
/// order they are concatenated (headers first). One unit per heavy file (the
/// split-K decode attention's 24 instantiations in two, by cache element
/// type, and its tensor-core FP8 kernels in a third; the MoE kernels in three: routing, grouping and GEMVs, the grouped
/// GEMMs, the stream kernels) so they compile side by side; the light files
/// share one.
pub(crate) const UNITS: &[(&str, &[&str])] = &[
    (
        "attention_decode_bf16",
        &["kv.cuh", "attention_decode.cu", "attention_decode_bf16.cu"],
    ),
    (
        "attention_decode_fp8",
        &["kv.cuh", "attention_decode.cu", "attention_decode_fp8.cu"],
    ),
    (
        "attention_decode_fp8_tc",
        &["kv.cuh", "attention_decode.cu", "attention_decode_mma.cu"],
    ),
    ("gemv", &["common.cuh", "gemv.cu"]),
    (
        "attention_prefill",
        &["kv.cuh", "mma.cuh", "attention_prefill.cu"],
    ),
    (
        "attention_prefill_mma",
        &["kv.cuh", "mma.cuh", "attention_prefill_mma.cu"],
    ),
    ("moe", &["common.cuh", "mma.cuh", "moe.cuh", "moe.cu"]),
    (
        "moe_gemm",
        &["common.cuh", "mma.cuh", "moe.cuh", "moe_gemm.cu"],
    ),
    (
        "moe_stream",
        &["common.cuh", "mma.cuh", "moe.cuh", "moe_stream.cu"],
    ),
    ("elementwise", &["common.cuh", "kv.cuh", "elementwise.cu"]),
    ("sampling", &["sampling.cu", "sampling_extras.cu"]),
    (
        "misc",
        &[
            "common.cuh",
            "kv.cuh",
            "norm.cu",
            "qk_norm_rope.cu",
            "attention.cu",
            "gemv_mma.cu",
            "fp8_linear.cu",
            "token_masks.cu",
            "logit_adjust.cu",
        ],
    ),
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
    "gemv_silu_bf16",
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
    "moe_gemm_gate_up_m128",
    "moe_gemm_down_m128",
    "moe_combine_bf16",
    "moe_gemv_gate_up",
    "moe_gemv_down",
    "moe_ggemv_gate_up",
    "moe_ggemv_down",
    "moe_gemm_gate_up_m64_fp8",
    "moe_gemm_gate_up_m16_fp8",
    "moe_gemm_down_m64_fp8",
    "moe_gemm_down_m16_fp8",
    "moe_gemm_gate_up_m128_fp8",
    "moe_gemm_down_m128_fp8",
    "moe_gemv_gate_up_fp8",
    "moe_gemv_down_fp8",
    "moe_ggemv_gate_up_fp8",
    "moe_ggemv_down_fp8",
    "moe_stream_gate_up",
    "moe_stream_down",
    "moe_stream_gate_up_fp8",
    "moe_stream_down_fp8",
    "moe_sigmoid_gate_bf16",
    "moe_sigmoid_gate_f32",
];

/// The text of source file `name`, if it is one of [`SOURCES`].
fn source_text(name: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// The program of one unit: `prelude.cuh` then the unit's files, each
/// behind a `#line` marker so compile errors name the file they come from.
pub(crate) fn unit_source(files: &[&str]) -> Result<String, String> {
    unit_source_from(files, source_text)
}

/// [`unit_source`] over the sources `text` answers (tests swap one file).
fn unit_source_from(
    files: &[&str],
    text: impl Fn(&str) -> Option<&'static str>,
) -> Result<String, String> {
    let mut s = String::new();
    for name in std::iter::once(&"prelude.cuh").chain(files) {
        let src = text(name).ok_or_else(|| format!("unknown kernel source {name}"))?;
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(src);
        s.push('\n');
    }
    Ok(s)
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

/// Compiles `source` (the program of unit `unit`) with `opts` and returns
/// the CUBIN.
fn compile(unit: &str, source: &str, opts: &[String]) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(source).map_err(|e| e.to_string())?;
    let name = std::ffi::CString::new(format!("pagoda_{unit}.cu")).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, Some(name.as_c_str())).map_err(|e| format!("{e:?}"))?;
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

/// One unit's CUBIN and where it came from.
pub(crate) struct UnitCubin {
    /// The unit's name in [`UNITS`].
    pub name: &'static str,
    pub cubin: Vec<u8>,
    /// Whether the CUBIN came from the disk cache.
    pub cached: bool,
    /// Seconds its compile took on its thread (0 on a cache hit).
    pub compile_s: f64,
}

/// The CUBIN of every unit in [`UNITS`] order for compute capability `cc`:
/// from the disk cache where present, the others compiled concurrently (one
/// thread per unit) and cached.
pub(crate) fn load_or_compile_all(cc: (i32, i32)) -> Result<Vec<UnitCubin>, String> {
    let opts = options(cc, &cuda_home());
    let version = nvrtc_version()?;
    let dir = cache_dir();
    let mut done: Vec<Option<UnitCubin>> = Vec::with_capacity(UNITS.len());
    let mut jobs = Vec::new();
    for (i, (name, files)) in UNITS.iter().enumerate() {
        let source = unit_source(files)?;
        let path = dir
            .as_ref()
            .map(|d| d.join(cache_name(&source, &opts, version)));
        let hit = path
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .filter(|b| is_elf(b));
        done.push(hit.map(|cubin| UnitCubin {
            name,
            cubin,
            cached: true,
            compile_s: 0.0,
        }));
        if done[i].is_none() {
            jobs.push((i, *name, source, path));
        }
    }
    let opts = &opts;
    let compiled = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(i, name, source, path)| {
                let h = std::thread::Builder::new()
                    .name(format!("nvrtc-{name}"))
                    .spawn_scoped(s, move || {
                        let t = std::time::Instant::now();
                        let cubin = compile(name, &source, opts)
                            .map_err(|e| format!("unit {name}: {e}"))?;
                        if let Some(p) = &path {
                            store(p, &cubin);
                        }
                        Ok::<_, String>(UnitCubin {
                            name,
                            cubin,
                            cached: false,
                            compile_s: t.elapsed().as_secs_f64(),
                        })
                    });
                (i, name, h)
            })
            .collect();
        let mut out = Vec::new();
        for (i, name, h) in handles {
            let h = h.map_err(|e| format!("cannot start the compile thread of {name}: {e}"))?;
            let unit = h
                .join()
                .map_err(|_| format!("the compile thread of unit {name} panicked"))??;
            out.push((i, unit));
        }
        Ok::<_, String>(out)
    })?;
    for (i, unit) in compiled {
        done[i] = Some(unit);
    }
    Ok(done.into_iter().flatten().collect())
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
#[path = "compile_tests.rs"]
mod tests;
