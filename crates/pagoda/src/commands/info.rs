//! `pagoda info`: what a model is, without running it (with the KV bytes one
//! sequence of its whole context takes, every block kept and with a sliding
//! window's passed blocks released, and the KV cache groups where local and
//! global layers mix); for a GGUF file pagoda cannot run,
//! everything it lacks (architecture, tensor types, tokenizer), read from
//! the header before anything is loaded. With `--load` it also loads the
//! model as `generate` would and reports the memory it takes
//! ([`super::memory`]: file, KV cache, resident memory and the overhead).

use super::memory::LoadedMemory;
use super::{open, run_on_device, CacheArgs, EngineTask, ModelArgs};
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
    /// Also load the model (weights and KV cache, as `generate` does) and
    /// report the memory it takes: the file, the KV cache and the resident
    /// memory after loading.
    #[arg(long)]
    pub load: bool,
    #[command(flatten)]
    pub cache: CacheArgs,
}

/// Reads the memory of the engine just built.
struct Measure<'a> {
    model: Option<&'a std::path::Path>,
}

impl EngineTask for Measure<'_> {
    type Output = (String, LoadedMemory);

    fn run<B: pagoda_kernels::Backend>(
        self,
        engine: pagoda_engine::LlmEngine<B>,
    ) -> anyhow::Result<Self::Output> {
        let memory = LoadedMemory::of(&engine, self.model);
        Ok((engine.runner().backend_name(), memory))
    }
}

pub fn run(args: InfoArgs) -> Result<()> {
    let missing = check_gguf(&args.model)?;
    let files = open(&args.model, true)?;
    let summary = files.summary();
    let kv = kv_footprint_bf16(&summary.config);
    let loaded = if args.load {
        let task = Measure {
            model: args.model.model.as_deref(),
        };
        Some(run_on_device(files, &args.model, &args.cache, true, task)?)
    } else {
        None
    };
    if args.json {
        let mut value = serde_json::to_value(&summary)?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert("missing_support".into(), missing.into());
            obj.insert("kv_cache_bf16".into(), serde_json::to_value(kv)?);
            if let Some((backend, memory)) = &loaded {
                let mut m = serde_json::to_value(memory)?;
                if let Some(m) = m.as_object_mut() {
                    m.insert("backend".into(), backend.clone().into());
                }
                obj.insert("memory".into(), m);
            }
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
        if let Some((backend, memory)) = &loaded {
            print!("{}", memory.describe(backend));
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
