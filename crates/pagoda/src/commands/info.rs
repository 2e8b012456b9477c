//! `pagoda info`: what a model is, without running it (with the KV bytes one
//! sequence of its whole context takes, every block kept and with a sliding
//! window's passed blocks released, and the KV cache groups where local and
//! global layers mix); for a GGUF file pagoda cannot run,
//! everything it lacks (architecture, tensor types, tokenizer), read from
//! the header before anything is loaded.

use super::{open, ModelArgs};
use anyhow::Result;
use clap::Args;
use pagoda_engine::kv_footprint::{self, KvFootprint};
use pagoda_model::loader::gguf_check;
use pagoda_model::ModelConfig;

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print as one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: InfoArgs) -> Result<()> {
    let missing = check_gguf(&args.model)?;
    let files = open(&args.model, true)?;
    let summary = files.summary();
    let kv = kv_footprint_bf16(&summary.config);
    if args.json {
        let mut value = serde_json::to_value(&summary)?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert("missing_support".into(), missing.into());
            obj.insert("kv_cache_bf16".into(), serde_json::to_value(kv)?);
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{summary}");
        println!(
            "kv cache:             {}",
            kv_footprint::describe(&kv, "bf16")
        );
        let layout = pagoda_model::KvLayout::for_config(&summary.config, true);
        if layout.num_groups() > 1 {
            println!(
                "kv cache groups:      {} (windows {:?}), pages of {} layer slots; \
                 prefix cache reuses whole blocks",
                layout.num_groups(),
                layout.windows,
                layout.num_slots
            );
        }
        for m in &missing {
            println!("pagoda lacks: {m}");
        }
    }
    Ok(())
}

/// For a GGUF file, everything pagoda lacks to run it (architecture, tensor
/// types, tokenizer), from the header alone, before anything is loaded. A
/// file whose architecture is unknown cannot be described further: that is
/// an error naming every missing piece.
fn check_gguf(model: &ModelArgs) -> Result<Vec<String>> {
    let Some(path) = model.model.as_ref().filter(|p| p.is_file()) else {
        return Ok(Vec::new());
    };
    if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
        return Ok(Vec::new());
    }
    let missing = gguf_check::missing_support_at(path)?;
    if gguf_check::lacks_architecture(&missing) {
        anyhow::bail!("{}: pagoda lacks: {}", path.display(), missing.join("; "));
    }
    Ok(missing)
}

/// One sequence of the model's whole context in bf16 blocks of 16 positions
/// (the CUDA cache's element type and the default block size).
fn kv_footprint_bf16(cfg: &ModelConfig) -> KvFootprint {
    kv_footprint::kv_footprint(cfg, 2 * cfg.kv_dim() * 2, cfg.max_position_embeddings, 16)
}
