//! Times the host part of loading a model's dummy weights, without a GPU:
//! for every tensor of a `config.json` shape, in checkpoint order and one
//! at a time (never the whole model on the host), the generation of its
//! values (`DummySource::get`, what `--dummy-weights` reads) and their
//! conversion to bf16 (what the CUDA backend uploads), in parallel
//! (`HostData::into_bf16`) and, with `--serial`, one element at a time as
//! the conversion was done before, checking the two give the same bits;
//! with `--fp8`, also the FP8 quantization of every matrix (what
//! `--quantization fp8` uploads instead, `quantize_host`).
//!
//! Usage: cargo run --release -p pagoda-model --example dummy_load_timing --
//!        CONFIG.json [--layers N] [--serial] [--fp8]
//! (`--layers N`: only the first N decoder layers, plus the embeddings,
//! final norm and LM head; the rayon pool takes `RAYON_NUM_THREADS`.)
//! Each phase is given in wall seconds and in CPU seconds of the process
//! (user + system, from /proc/self/stat where there is one): on a shared
//! machine the CPU seconds are the work, whatever the contention.

use pagoda_kernels::HostData;
use pagoda_model::loader::dummy::{tensor_shapes, DummySource};
use pagoda_model::loader::hf_config::parse_hf_config;
use pagoda_model::loader::WeightSource;
use std::time::Instant;

/// User + system CPU seconds of this process so far (0 without /proc).
fn cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) in parentheses.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here; in
    // clock ticks, 100 per second on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// The layer index in a tensor name `model.layers.{l}.…`, if any.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: dummy_load_timing CONFIG.json [--layers N] [--serial]")?;
    let layers = match args.iter().position(|a| a == "--layers") {
        Some(i) => Some(
            args.get(i + 1)
                .ok_or("--layers needs N")?
                .parse::<usize>()?,
        ),
        None => None,
    };
    let serial = args.iter().any(|a| a == "--serial");
    let fp8 = args.iter().any(|a| a == "--fp8");
    let (mut fp8_s, mut fp8_cpu, mut fp8_elements) = (0.0f64, 0.0f64, 0usize);
    let cfg = parse_hf_config(&std::fs::read_to_string(path)?, None)?;
    let src = DummySource::new(&cfg)?;
    let (mut gen_s, mut conv_s, mut serial_s) = (0.0f64, 0.0f64, 0.0f64);
    let (mut gen_cpu, mut conv_cpu, mut serial_cpu) = (0.0f64, 0.0f64, 0.0f64);
    let (mut elements, mut tensors, mut largest) = (0usize, 0usize, 0usize);
    let all = Instant::now();
    for (name, shape) in tensor_shapes(&cfg) {
        if let (Some(n), Some(l)) = (layers, layer_of(&name)) {
            if l >= n {
                continue;
            }
        }
        let (t, c) = (Instant::now(), cpu_secs());
        let host = src.get(&name)?;
        gen_s += t.elapsed().as_secs_f64();
        gen_cpu += cpu_secs() - c;
        let numel: usize = shape.iter().product();
        elements += numel;
        tensors += 1;
        largest = largest.max(numel);
        let reference = if serial {
            let HostData::F32(v) = &host.data else {
                return Err("dummy values are f32".into());
            };
            let (t, c) = (Instant::now(), cpu_secs());
            let r: Vec<u16> = v
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect();
            serial_s += t.elapsed().as_secs_f64();
            serial_cpu += cpu_secs() - c;
            Some(r)
        } else {
            None
        };
        if fp8 && host.shape.len() == 2 {
            let (t, c) = (Instant::now(), cpu_secs());
            let m = pagoda_kernels::fp8_matrix::quantize_host(&host)?;
            fp8_s += t.elapsed().as_secs_f64();
            fp8_cpu += cpu_secs() - c;
            fp8_elements += m.codes.len();
        }
        let (t, c) = (Instant::now(), cpu_secs());
        let bf = host.data.into_bf16();
        conv_s += t.elapsed().as_secs_f64();
        conv_cpu += cpu_secs() - c;
        if let Some(r) = reference {
            if !bf.iter().map(|x| x.to_bits()).eq(r) {
                return Err(format!("{name}: parallel and serial bf16 differ").into());
            }
        }
    }
    let threads = rayon::current_num_threads();
    println!(
        "{path}: {tensors} tensors{}, {:.3} G elements (largest {:.1} M), {threads} threads",
        layers.map_or(String::new(), |n| format!(
            " (first {n} of {} layers)",
            cfg.num_hidden_layers
        )),
        elements as f64 * 1e-9,
        largest as f64 * 1e-6
    );
    println!(
        "generate {gen_s:.2} s ({gen_cpu:.2} s CPU, {:.2} CPU ns/element), bf16 parallel \
         {conv_s:.2} s ({conv_cpu:.2} s CPU, {:.2} CPU ns/element){}, total {:.2} s",
        gen_cpu * 1e9 / elements.max(1) as f64,
        conv_cpu * 1e9 / elements.max(1) as f64,
        if serial {
            format!(
                ", bf16 serial {serial_s:.2} s ({serial_cpu:.2} s CPU, {:.2} CPU ns/element), \
                 same bits",
                serial_cpu * 1e9 / elements.max(1) as f64
            )
        } else {
            String::new()
        },
        all.elapsed().as_secs_f64()
    );
    if fp8 {
        println!(
            "fp8 quantize {fp8_s:.2} s ({fp8_cpu:.2} s CPU, {:.2} CPU ns/element) over {:.3} G elements",
            fp8_cpu * 1e9 / fp8_elements.max(1) as f64,
            fp8_elements as f64 * 1e-9
        );
    }
    Ok(())
}
