//! The GGUF weight source on the real SmolLM2-135M-Instruct Q4_1 file, against
//! Hugging Face transformers' GGUF loader (which also undoes llama.cpp's q/k
//! row permutation): scripts/golden/gguf_qk_unpermute.py ->
//! tests/golden/smollm2_gguf_qk.json.

use pagoda_model::loader::gguf::{config_from_gguf, gguf_to_hf_name, GgufSource};
use pagoda_model::loader::WeightSource;
use pagoda_model::Architecture;
use std::path::PathBuf;

fn smollm2() -> (pagoda_model::ModelConfig, GgufSource) {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-default-model.sh",
        p.display()
    );
    GgufSource::open(&p).unwrap()
}

#[test]
fn smollm2_matches_transformers() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/smollm2_gguf_qk.json")).unwrap();
    let (cfg, src) = smollm2();
    let g = &golden["config"];
    assert_eq!(cfg.architecture, Architecture::Llama);
    assert_eq!(cfg.hidden_size, 576);
    assert_eq!(cfg.num_hidden_layers, 30);
    assert_eq!((cfg.num_attention_heads, cfg.num_key_value_heads), (9, 3));
    assert_eq!(cfg.intermediate_size, 1536);
    assert_eq!(cfg.vocab_size, 49152);
    assert!(cfg.tie_word_embeddings);
    for (field, ours) in [
        ("hidden_size", cfg.hidden_size),
        ("num_hidden_layers", cfg.num_hidden_layers),
        ("num_attention_heads", cfg.num_attention_heads),
        ("num_key_value_heads", cfg.num_key_value_heads),
        ("intermediate_size", cfg.intermediate_size),
        ("vocab_size", cfg.vocab_size),
    ] {
        assert_eq!(ours as u64, g[field].as_u64().unwrap(), "{field}");
    }
    assert_eq!(cfg.rope_theta, g["rope_theta"].as_f64().unwrap());
    assert!((cfg.rms_norm_eps - g["rms_norm_eps"].as_f64().unwrap()).abs() < 1e-12);
    assert_eq!(
        cfg.tie_word_embeddings,
        g["tie_word_embeddings"].as_bool().unwrap()
    );
    assert_eq!(
        (cfg.bos_token_id, cfg.eos_token_ids.as_slice()),
        (Some(1), &[2u32][..])
    );
    assert_eq!(cfg.torch_dtype.as_deref(), Some("Q4_1"));
    assert_eq!(config_from_gguf(src.file()).unwrap(), cfg);

    let cols: Vec<usize> = golden["cols"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap() as usize)
        .collect();
    for name in [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
    ] {
        let want = &golden[name];
        let t = src.get(name).unwrap();
        let shape: Vec<usize> = want["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(t.shape, shape, "{name}");
        let v = t.to_f32_vec();
        let ncols = shape[1];
        let rows = want["rows"].as_array().unwrap();
        for (ri, r) in rows.iter().enumerate() {
            let r = r.as_u64().unwrap() as usize;
            for (ci, &c) in cols.iter().enumerate() {
                let w = want["values"][ri][ci].as_f64().unwrap() as f32;
                let got = v[r * ncols + c];
                assert!(
                    (got - w).abs() <= 1e-6 * w.abs().max(1e-3),
                    "{name}[{r},{c}]: {got} vs {w}"
                );
            }
            let sum: f64 = v[r * ncols..(r + 1) * ncols]
                .iter()
                .map(|&x| x as f64)
                .sum();
            let want_sum = want["row_sums"][ri].as_f64().unwrap();
            assert!(
                (sum - want_sum).abs() < 1e-4,
                "{name} row {r} sum {sum} vs {want_sum}"
            );
        }
    }
}

#[test]
fn smollm2_tokenizer_metadata_and_listing() {
    let (_, src) = smollm2();
    let t = src.tokenizer_metadata().unwrap();
    assert_eq!(
        (t.model.as_str(), t.pre.as_deref()),
        ("gpt2", Some("smollm"))
    );
    assert_eq!(
        (t.tokens.len(), t.merges.len(), t.token_types.len()),
        (49152, 48900, 49152)
    );
    assert_eq!(
        (t.bos_token_id, t.eos_token_id, t.add_bos_token),
        (Some(1), Some(2), Some(false))
    );
    assert!(t.chat_template.unwrap().contains("<|im_start|>"));
    let infos = src.tensor_infos();
    assert_eq!(infos.len(), 272);
    let embd = infos
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .unwrap();
    assert_eq!(
        (embd.shape.as_slice(), embd.dtype.as_str()),
        (&[49152, 576][..], "q8_0")
    );
    assert_eq!(
        src.num_parameters(),
        infos
            .iter()
            .map(|t| t.shape.iter().product::<usize>() as u64)
            .sum::<u64>()
    );
    // 134.5M parameters, tied embeddings counted once.
    assert!(
        (134_000_000..135_000_000).contains(&src.num_parameters()),
        "{}",
        src.num_parameters()
    );
    // Every tensor of the file maps to a Hugging Face name.
    for t in &infos {
        assert!(gguf_to_hf_name(&t.name).is_some(), "{}", t.name);
    }
}

/// `get_stored` hands out the file's blocks (q/k rows reordered as whole
/// block rows) that dequantize to exactly what `get` returns, and dense
/// tensors as `get` does.
#[test]
fn smollm2_stored_blocks_dequantize_to_get() {
    use pagoda_kernels::{GgmlType, HostData};
    let (_, src) = smollm2();
    for (name, ty) in [
        ("model.layers.0.self_attn.q_proj.weight", GgmlType::Q4_1),
        ("model.layers.3.self_attn.k_proj.weight", GgmlType::Q4_1),
        ("model.layers.29.mlp.down_proj.weight", GgmlType::Q4_1),
        ("model.embed_tokens.weight", GgmlType::Q8_0),
    ] {
        let stored = src.get_stored(name).unwrap();
        let dense = src.get(name).unwrap();
        assert_eq!(stored.shape, dense.shape, "{name}");
        let HostData::Quant(q) = &stored.data else {
            panic!("{name}: expected blocks, got {}", stored.data.dtype_name())
        };
        assert_eq!(q.ty, ty, "{name}");
        assert_eq!(stored.to_f32_vec(), dense.to_f32_vec(), "{name}");
    }
    let norm = src
        .get_stored("model.layers.0.input_layernorm.weight")
        .unwrap();
    assert_eq!(norm.data.dtype_name(), "f32");
}
