//! Dequantizes every tensor of a GGUF file and reports the time taken.
//!
//! `cargo run --release -p pagoda-gguf --example dequant_all -- [FILE]`
//! (default: models/SmolLM2-135M-Instruct.Q4_1.gguf).

use pagoda_gguf::GgufFile;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let t0 = Instant::now();
    let file = GgufFile::open(&path)?;
    let opened = t0.elapsed();
    let t1 = Instant::now();
    let mut elements = 0usize;
    for t in file.tensors() {
        elements += file.dequantize_info(t)?.len();
    }
    let secs = t1.elapsed().as_secs_f64();
    println!(
        "{path}: opened in {:.1} ms; {} tensors, {:.1} M elements dequantized in {:.3} s ({:.0} M elements/s, {} threads)",
        opened.as_secs_f64() * 1e3,
        file.tensors().len(),
        elements as f64 / 1e6,
        secs,
        elements as f64 / 1e6 / secs,
        rayon::current_num_threads()
    );
    Ok(())
}
