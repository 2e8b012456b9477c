//! The `quantization_config` of a Hugging Face `config.json`: which
//! quantized checkpoints pagoda loads, and a clear error for the rest.
//!
//! Supported: `quant_method: "compressed-tensors"` with every config group a
//! float-quantized 8-bit scheme (llm-compressor's FP8 / FP8_DYNAMIC): weights
//! `{num_bits: 8, type: "float"}` with a `channel` or `tensor` strategy
//! (stored F8_E4M3 with a `weight_scale`, read by the safetensors source's
//! `get_fp8`), input activations absent or 8-bit float. Activations are
//! always quantized dynamically per token at run time: a static
//! `input_scale` in the checkpoint is accepted and not used. Anything else
//! (other methods such as GPTQ, AWQ, bitsandbytes or block-wise `fp8`,
//! other bit widths, group/block strategies, a KV cache scheme) is refused,
//! naming what is unsupported.

use crate::{ModelError, Result};
use serde_json::Value;

/// Checks `config.json`'s `quantization_config` (absent: nothing to check).
pub fn check(config: &Value, file: &str) -> Result<()> {
    let Some(q) = config.get("quantization_config") else {
        return Ok(());
    };
    if q.is_null() {
        return Ok(());
    }
    let bad = |what: String| {
        ModelError::Config(format!(
            "{file}: quantization_config: {what} is not supported (pagoda loads \
             compressed-tensors FP8 checkpoints: 8-bit float weights per channel or per tensor)"
        ))
    };
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
    if method != "compressed-tensors" {
        return Err(bad(format!("quant_method {method:?}")));
    }
    if let Some(format) = q.get("format").and_then(Value::as_str) {
        if format != "float-quantized" && format != "naive-quantized" {
            return Err(bad(format!("format {format:?}")));
        }
    }
    if q.get("kv_cache_scheme").is_some_and(|v| !v.is_null()) {
        return Err(bad("a kv_cache_scheme".into()));
    }
    let groups = match q.get("config_groups") {
        Some(Value::Object(g)) if !g.is_empty() => g,
        _ => {
            return Err(bad(
                "a compressed-tensors config without config_groups".into()
            ))
        }
    };
    for (name, g) in groups {
        let scheme = |key: &str, strategies: &[&str]| -> Result<()> {
            let Some(s) = g.get(key).filter(|v| !v.is_null()) else {
                return if key == "weights" {
                    Err(bad(format!("group {name:?} without weights")))
                } else {
                    Ok(())
                };
            };
            let bits = s.get("num_bits").and_then(Value::as_u64);
            let ty = s.get("type").and_then(Value::as_str);
            if bits != Some(8) || ty != Some("float") {
                return Err(bad(format!(
                    "group {name:?} {key} of {} bits, type {}",
                    bits.map_or("?".into(), |b| b.to_string()),
                    ty.unwrap_or("?")
                )));
            }
            let strategy = s.get("strategy").and_then(Value::as_str).unwrap_or("");
            if !strategies.contains(&strategy) {
                return Err(bad(format!("group {name:?} {key} strategy {strategy:?}")));
            }
            Ok(())
        };
        scheme("weights", &["channel", "tensor"])?;
        scheme("input_activations", &["token", "tensor"])?;
        if g.get("output_activations").is_some_and(|v| !v.is_null()) {
            return Err(bad(format!("group {name:?} output_activations")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;
    use serde_json::json;

    fn fp8(weights: serde_json::Value) -> serde_json::Value {
        json!({"quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true},
            }},
            "ignore": ["lm_head"],
        }})
    }

    #[test]
    fn accepts_fp8_channel_and_tensor_and_no_config() {
        check(&json!({}), "config.json").unwrap();
        for strategy in ["channel", "tensor"] {
            let w = json!({"num_bits": 8, "type": "float", "strategy": strategy});
            check(&fp8(w), "config.json").unwrap();
        }
    }

    #[test]
    fn refuses_other_schemes_naming_them() {
        let cases = [
            (
                json!({"quantization_config": {"quant_method": "gptq", "bits": 4}}),
                "\"gptq\"",
            ),
            (
                fp8(json!({"num_bits": 4, "type": "int", "strategy": "group"})),
                "4 bits, type int",
            ),
            (
                fp8(json!({"num_bits": 8, "type": "float", "strategy": "block"})),
                "strategy \"block\"",
            ),
        ];
        for (cfg, needle) in cases {
            let e = check(&cfg, "config.json").unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("not supported"), "{e}");
        }
        let mut kv = fp8(json!({"num_bits": 8, "type": "float", "strategy": "channel"}));
        kv["quantization_config"]["kv_cache_scheme"] = json!({"num_bits": 8, "type": "float"});
        assert!(check(&kv, "c")
            .unwrap_err()
            .to_string()
            .contains("kv_cache_scheme"));
    }
}
