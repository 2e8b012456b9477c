//! Tests of the dummy weights against the NumPy twin
//! (`scripts/golden/dummy_weights.py`) and Hugging Face's parameter lists.

use super::*;

/// Llama-shaped config with the given sizes; other fields neutral.
fn config(
    arch: Architecture,
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: usize,
    kv: usize,
    vocab: usize,
) -> ModelConfig {
    ModelConfig {
        architecture: arch,
        hidden_size: hidden,
        intermediate_size: inter,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim: None,
        vocab_size: vocab,
        max_position_embeddings: 2048,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: None,
        tie_word_embeddings: true,
        attention_bias: false,
        bos_token_id: None,
        eos_token_ids: vec![],
        word_embed_proj_dim: None,
        do_layer_norm_before: true,
        torch_dtype: None,
        sliding_window: None,
        gemma: None,
        rotary_dim: None,
        moe: None,
    }
}

fn bits(name: &str, shape: &[usize], idx: usize) -> u32 {
    dummy_values(name, shape)[idx].to_bits()
}

#[test]
fn fnv1a64_matches_reference_vectors() {
    // Published FNV-1a 64 test vectors: "" is the offset basis, "a" -> 0xaf63dc4c8601ec8c.
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    // /work/refenv/bin/python -c "import sys; sys.path.insert(0,'scripts/golden'); import dummy_weights as d; print(hex(d.fnv1a64('model.embed_tokens.weight')))"
    assert_eq!(fnv1a64(b"model.embed_tokens.weight"), 0xa88f_d795_d5c6_d156);
}

/// Bit patterns produced by the NumPy implementation:
/// /work/refenv/bin/python -c "import sys, numpy as np; sys.path.insert(0,'scripts/golden'); import dummy_weights as d; v=d.dummy_values(NAME, SHAPE).reshape(-1); print('%#010x' % int(v[I:I+1].view(np.uint32)[0]))"
/// (the same table is `CHECKS` in dummy_weights.py, which checks itself against it).
const NUMPY_VALUES: &[(&str, &[usize], usize, u32)] = &[
    ("model.embed_tokens.weight", &[512, 64], 0, 0xbd644827), // -0.05573287
    ("model.embed_tokens.weight", &[512, 64], 1, 0xbd9f9c14),
    ("model.embed_tokens.weight", &[512, 64], 63, 0x3d6b0e87),
    ("model.embed_tokens.weight", &[512, 64], 64, 0xbe4996a1),
    ("model.embed_tokens.weight", &[512, 64], 32767, 0xbe5a3a28),
    (
        "model.layers.0.input_layernorm.weight",
        &[64],
        0,
        0x3f7c9717,
    ), // 0.98668045
    (
        "model.layers.0.input_layernorm.weight",
        &[64],
        5,
        0x3f705ca8,
    ),
    (
        "model.layers.0.input_layernorm.weight",
        &[64],
        63,
        0x3f8a33b5,
    ),
    ("model.layers.1.self_attn.q_proj.bias", &[64], 0, 0xbcee6700),
    ("model.layers.1.self_attn.q_proj.bias", &[64], 7, 0x3d2db0da),
    (
        "model.layers.0.mlp.down_proj.weight",
        &[64, 128],
        0,
        0xbca52b18,
    ),
    (
        "model.layers.0.mlp.down_proj.weight",
        &[64, 128],
        8191,
        0x3e0e8223,
    ),
    ("model.decoder.final_layer_norm.bias", &[64], 3, 0x3d4283d7),
    (
        "model.layers.0.self_attn.q_norm.weight",
        &[32],
        31,
        0x3f7fff0d,
    ),
    // Across the rayon chunk boundary (65536 elements per chunk).
    ("lm_head.weight", &[300, 512], 65535, 0xbc2f6a0a),
    ("lm_head.weight", &[300, 512], 65536, 0xbb0ac542),
    ("lm_head.weight", &[300, 512], 153599, 0xbd038042),
];

#[test]
fn values_match_numpy_implementation() {
    for &(name, shape, idx, expected) in NUMPY_VALUES {
        let got = bits(name, shape, idx);
        assert_eq!(
            got,
            expected,
            "{name} {shape:?} [{idx}]: {} ({got:#010x})",
            f32::from_bits(got)
        );
    }
}

#[test]
fn uniform_at_large_indices_matches_numpy() {
    // Indices inside Qwen3-0.6B's [151936, 1024] embedding, without generating it:
    // /work/refenv/bin/python -c "import sys, numpy as np; sys.path.insert(0,'scripts/golden'); import dummy_weights as d; print([hex(x) for x in d.uniform(d.fnv1a64('model.embed_tokens.weight'), np.array([123456789, 155582463], dtype=np.uint64)).view(np.uint32)])"
    let seed = fnv1a64(b"model.embed_tokens.weight");
    assert_eq!(uniform(seed, 123_456_789).to_bits(), 0x3f1499b4);
    assert_eq!(uniform(seed, 155_582_463).to_bits(), 0x3f7bc5d8);
}

#[test]
fn values_are_in_their_ranges_and_independent_of_call_order() {
    let a = dummy_values("x.weight", &[40, 75]);
    let bound = (3.0f64 / 75.0).sqrt() as f32;
    assert!(a.iter().all(|v| v.abs() <= bound));
    let n = dummy_values("x.norm.weight", &[75]);
    assert!(n.iter().all(|v| (0.9..=1.1).contains(v)));
    let b = dummy_values("x.bias", &[75]);
    assert!(b.iter().all(|v| v.abs() <= 0.1));
    // A prefix of a tensor's values does not depend on the tensor's size.
    assert_eq!(dummy_values("x.bias", &[10])[..], b[..10]);
    assert_eq!(dummy_values("x.weight", &[40, 75]), a);
}

/// Tensor counts and parameter totals of Hugging Face models built on the meta
/// device from these configs (`len(state_dict)` without a tied `lm_head.weight`,
/// and the sum of `numel`), with transformers 5.x.
#[test]
fn tensor_lists_match_hugging_face_parameter_counts() {
    let mut qwen3 = config(Architecture::Qwen3, 1024, 3072, 28, 16, 8, 151_936);
    qwen3.head_dim = Some(128);
    let smollm2 = config(Architecture::Llama, 576, 1536, 30, 9, 3, 49_152);
    let mut qwen2 = config(Architecture::Qwen2, 896, 4864, 24, 14, 2, 151_936);
    qwen2.attention_bias = true;
    let opt125 = config(Architecture::Opt, 768, 3072, 12, 12, 12, 50_272);
    let mut opt350 = config(Architecture::Opt, 1024, 4096, 24, 16, 16, 50_272);
    opt350.word_embed_proj_dim = Some(512);
    opt350.do_layer_norm_before = false;
    for (label, cfg, tensors, params) in [
        ("Qwen3-0.6B", qwen3, 310, 596_049_920),
        ("SmolLM2-135M", smollm2, 272, 134_515_008),
        ("Qwen2-0.5B", qwen2, 290, 494_032_768),
        ("OPT-125m", opt125, 196, 125_239_296),
        ("OPT-350m", opt350, 388, 331_196_416),
    ] {
        let src = DummySource::new(&cfg).unwrap();
        assert_eq!(src.tensor_names().len(), tensors, "{label} tensor count");
        assert_eq!(src.num_parameters(), params, "{label} parameters");
    }
}

#[test]
fn names_and_shapes_per_architecture() {
    let mut qwen3 = config(Architecture::Qwen3, 64, 128, 2, 4, 2, 512);
    qwen3.head_dim = Some(32);
    qwen3.tie_word_embeddings = false;
    let src = DummySource::new(&qwen3).unwrap();
    assert_eq!(
        src.shape("model.layers.1.self_attn.q_proj.weight"),
        Some(&[128, 64][..])
    );
    assert_eq!(
        src.shape("model.layers.1.self_attn.k_proj.weight"),
        Some(&[64, 64][..])
    );
    assert_eq!(
        src.shape("model.layers.1.self_attn.o_proj.weight"),
        Some(&[64, 128][..])
    );
    assert_eq!(
        src.shape("model.layers.0.self_attn.k_norm.weight"),
        Some(&[32][..])
    );
    assert_eq!(src.shape("lm_head.weight"), Some(&[512, 64][..]));
    assert!(!src.contains("model.layers.0.self_attn.q_proj.bias"));
    assert!(!src.contains("model.layers.2.input_layernorm.weight"));

    let mut qwen2 = config(Architecture::Qwen2, 64, 128, 2, 4, 2, 512);
    qwen2.tie_word_embeddings = false;
    let src = DummySource::new(&qwen2).unwrap();
    assert_eq!(
        src.shape("model.layers.0.self_attn.k_proj.bias"),
        Some(&[32][..])
    );
    assert!(!src.contains("model.layers.0.self_attn.o_proj.bias"));
    assert!(!src.contains("model.layers.0.self_attn.q_norm.weight"));

    let llama = config(Architecture::Llama, 64, 128, 2, 4, 2, 512);
    let src = DummySource::new(&llama).unwrap();
    assert!(!src.contains("lm_head.weight"));
    assert_eq!(
        src.tensor_names().first().map(String::as_str),
        Some("model.embed_tokens.weight")
    );
    assert_eq!(
        src.tensor_names().last().map(String::as_str),
        Some("model.norm.weight")
    );

    let mut opt = config(Architecture::Opt, 64, 128, 2, 4, 4, 512);
    opt.max_position_embeddings = 256;
    let src = DummySource::new(&opt).unwrap();
    assert_eq!(
        src.shape("model.decoder.embed_positions.weight"),
        Some(&[258, 64][..])
    );
    assert_eq!(
        src.shape("model.decoder.layers.1.fc1.weight"),
        Some(&[128, 64][..])
    );
    assert_eq!(
        src.shape("model.decoder.layers.1.fc2.bias"),
        Some(&[64][..])
    );
    assert_eq!(
        src.shape("model.decoder.layers.0.self_attn.out_proj.bias"),
        Some(&[64][..])
    );
    assert_eq!(
        src.shape("model.decoder.layers.0.self_attn_layer_norm.weight"),
        Some(&[64][..])
    );
    assert_eq!(
        src.shape("model.decoder.final_layer_norm.bias"),
        Some(&[64][..])
    );
}

#[test]
fn get_generates_the_named_tensor() {
    let cfg = config(Architecture::Llama, 64, 128, 2, 4, 2, 512);
    let src = DummySource::new(&cfg).unwrap();
    let t = src.get("model.embed_tokens.weight").unwrap();
    assert_eq!(t.shape, vec![512, 64]);
    let v = t.into_f32_vec();
    assert_eq!(v[32767].to_bits(), 0xbe5a3a28);
    let n = src
        .get("model.layers.0.input_layernorm.weight")
        .unwrap()
        .into_f32_vec();
    assert_eq!(n[5].to_bits(), 0x3f705ca8);
    assert!(matches!(
        src.get("lm_head.weight"),
        Err(ModelError::MissingTensor(_))
    ));
}

#[test]
fn invalid_config_is_rejected() {
    let cfg = config(Architecture::Llama, 64, 128, 2, 4, 3, 512);
    assert!(matches!(DummySource::new(&cfg), Err(ModelError::Config(_))));
}

#[test]
fn safetensors_round_trip_of_dummy_weights() {
    use super::super::safetensors_writer::{write_safetensors, StorageDtype};
    let cfg = config(Architecture::Qwen2, 64, 128, 1, 4, 2, 512);
    let src = DummySource::new(&cfg).unwrap();
    let path = std::env::temp_dir().join(format!(
        "pagoda-dummy-rt-{}.safetensors",
        std::process::id()
    ));
    write_safetensors(&src, src.tensor_names(), StorageDtype::F32, &path).unwrap();
    let buf = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let st = safetensors::SafeTensors::deserialize(&buf).unwrap();
    assert_eq!(st.len(), src.tensor_names().len());
    for name in src.tensor_names() {
        let view = st.tensor(name).unwrap();
        let expected = src.get(name).unwrap();
        assert_eq!(view.shape(), &expected.shape[..], "{name}");
        let got: Vec<f32> = view
            .data()
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, expected.into_f32_vec(), "{name}");
    }
}

/// The `tensors` list of `tests/golden/tiny-<arch>/golden.json`: Hugging Face's
/// `state_dict()` names and shapes (a tied `lm_head.weight` left out), written by
/// scripts/golden/models.py.
fn hf_tensors(arch: &str) -> Vec<(String, Vec<usize>)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(format!("tiny-{arch}"))
        .join("golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out: Vec<(String, Vec<usize>)> = json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let shape = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            (t["name"].as_str().unwrap().to_string(), shape)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn tiny_golden_models_have_exactly_the_dummy_tensors() {
    // The configs of scripts/golden/models.py's tiny models.
    let mut llama = config(Architecture::Llama, 64, 128, 2, 4, 2, 512);
    llama.head_dim = Some(16);
    let mut llama_bias = llama.clone();
    llama_bias.attention_bias = true;
    llama_bias.tie_word_embeddings = false;
    let mut qwen2 = config(Architecture::Qwen2, 64, 128, 2, 4, 2, 512);
    qwen2.tie_word_embeddings = false;
    qwen2.attention_bias = true;
    let mut qwen3 = config(Architecture::Qwen3, 64, 128, 3, 4, 2, 512);
    qwen3.head_dim = Some(32);
    qwen3.tie_word_embeddings = false;
    let mut opt = config(Architecture::Opt, 64, 128, 2, 4, 4, 512);
    opt.max_position_embeddings = 256;
    for (arch, cfg) in [
        ("llama", llama),
        ("llama-attnbias", llama_bias),
        ("qwen2", qwen2),
        ("qwen3", qwen3),
        ("opt", opt),
    ] {
        let mut ours = tensor_shapes(&cfg);
        ours.sort();
        assert_eq!(ours, hf_tensors(arch), "{arch}");
    }
}

/// The tiny golden directories' config.json, read by pagoda's own parser, give
/// the same tensors as Hugging Face built from them.
#[test]
fn tiny_golden_configs_parse_to_the_hugging_face_tensors() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden");
    let archs = [
        "llama",
        "llama-attnbias",
        "qwen2",
        "qwen3",
        "opt",
        "gemma3",
        "gemma2",
        "mistral",
        "mistral-v03",
        "phi3",
        "qwen3-moe",
        "mixtral",
        "qwen2-moe",
    ];
    for arch in archs {
        let cfg =
            super::super::hf_config::load_hf_config(&root.join(format!("tiny-{arch}"))).unwrap();
        let mut ours = tensor_shapes(&cfg);
        ours.sort();
        assert_eq!(ours, hf_tensors(arch), "{arch}");
    }
    let llama = super::super::hf_config::load_hf_config(&root.join("tiny-llama")).unwrap();
    assert_eq!(
        llama.rope_scaling,
        Some(crate::RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 32,
        })
    );
    assert_eq!(llama.rope_theta, 500000.0);
    let qwen2_moe = super::super::hf_config::load_hf_config(&root.join("tiny-qwen2-moe")).unwrap();
    let m = qwen2_moe.moe.as_ref().unwrap();
    assert_eq!(m.shared_expert_intermediate_size, Some(64));
    assert_eq!(m.sparse_layers, vec![true, false, true]);
    assert!(!m.norm_topk_prob && qwen2_moe.attention_bias);
    // transformers 5's per-layer-type rope_parameters and layer_types.
    let gemma3 = super::super::hf_config::load_hf_config(&root.join("tiny-gemma3")).unwrap();
    assert_eq!(gemma3.rope_theta, 1e6);
    assert_eq!(
        gemma3.rope_scaling,
        Some(crate::RopeScaling::Linear { factor: 2.0 })
    );
    assert_eq!(gemma3.sliding_window, Some(6));
    let g = gemma3.gemma.unwrap();
    assert_eq!(g.sliding_layers, vec![true, true, false, true]);
    assert_eq!(g.rope_local_base_freq, 1e4);
    assert_eq!(g.query_pre_attn_scalar, 24.0);
    let mistral = super::super::hf_config::load_hf_config(&root.join("tiny-mistral")).unwrap();
    assert_eq!(mistral.sliding_window, Some(8));
    let v03 = super::super::hf_config::load_hf_config(&root.join("tiny-mistral-v03")).unwrap();
    assert_eq!((v03.sliding_window, v03.head_dim), (None, Some(32)));
    // Phi-3: the legacy rope_scaling and transformers 5's rope_parameters.
    let phi3 = super::super::hf_config::load_hf_config(&root.join("tiny-phi3")).unwrap();
    assert_eq!(phi3.rotary_dim, Some(12));
    assert_eq!(phi3.sliding_window, Some(8));
    let Some(crate::RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings,
        attention_factor,
    }) = phi3.rope_scaling
    else {
        panic!("{:?}", phi3.rope_scaling)
    };
    assert_eq!(short_factor, [1.0, 1.25, 1.5, 2.0, 2.5, 3.0]);
    assert_eq!(long_factor, [2.0, 3.0, 4.0, 6.0, 8.0, 12.0]);
    assert_eq!(original_max_position_embeddings, 64);
    // transformers' attention_scaling for this config: sqrt(1 + ln 4 / ln 64).
    assert!((attention_factor - 1.1547005383792517).abs() < 1e-12);
}

/// The dummy config of Qwen3-30B-A3B's shape (scripts/gpu/qwen3-30b-a3b.json)
/// has the published parameter count, 30,532,122,624.
#[test]
fn qwen3_30b_a3b_shape_has_the_published_parameter_count() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/gpu/qwen3-30b-a3b.json");
    let cfg = super::super::hf_config::load_config_file(&path).unwrap();
    assert_eq!(cfg.architecture, Architecture::Qwen3Moe);
    let m = cfg.moe.as_ref().unwrap();
    assert_eq!((m.num_experts, m.num_experts_per_tok), (128, 8));
    assert!(m.norm_topk_prob && m.sparse_layers.iter().all(|&s| s));
    let src = DummySource::new(&cfg).unwrap();
    assert_eq!(src.num_parameters(), 30_532_122_624);
    assert_eq!(
        src.shape("model.layers.47.mlp.experts.gate_up_proj"),
        Some(&[128, 1536, 2048][..])
    );
}
