//! `pagoda info`: what a model is, without running it; for a GGUF file pagoda
//! cannot run, everything it lacks (architecture, tensor types, tokenizer),
//! read from the header before anything is loaded.

use super::{open, ModelArgs};
use anyhow::Result;
use clap::Args;
use pagoda_model::loader::gguf_check;

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
    if args.json {
        let mut value = serde_json::to_value(&summary)?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert("missing_support".into(), missing.into());
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{summary}");
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
