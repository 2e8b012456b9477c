//! Tests of the mixture-of-experts fields of `config.json` (Qwen3-MoE,
//! Mixtral, Qwen2-MoE) and of the refusal of other MoE families. Defaults
//! are transformers 5's `Qwen3MoeConfig` / `MixtralConfig` /
//! `Qwen2MoeConfig`.

use super::*;

const QWEN3_MOE_MIN: &str = r#"{
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
    "num_attention_heads": 4, "vocab_size": 100
}"#;

#[test]
fn qwen3_moe_defaults_and_layer_pattern() {
    let c = parse_hf_config(QWEN3_MOE_MIN, None).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen3Moe);
    assert_eq!(c.num_key_value_heads, 4);
    assert_eq!(c.head_dim, None);
    assert_eq!(c.max_position_embeddings, 32768);
    let m = c.moe.unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.num_experts_per_tok,
            m.moe_intermediate_size
        ),
        (128, 8, 768)
    );
    assert!(!m.norm_topk_prob);
    assert_eq!(m.sparse_layers, vec![true; 4]);

    // decoder_sparse_step 2: layers 1 and 3; mlp_only_layers takes 3 out.
    let json = QWEN3_MOE_MIN.replace(
        "\"vocab_size\": 100",
        "\"vocab_size\": 100, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3], \
         \"num_experts\": 16, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 8, \
         \"norm_topk_prob\": true",
    );
    let m = parse_hf_config(&json, None).unwrap().moe.unwrap();
    assert_eq!(m.sparse_layers, vec![false, true, false, false]);
    assert_eq!((m.num_experts, m.num_experts_per_tok), (16, 4));
    assert_eq!(m.moe_intermediate_size, 8);
    assert!(m.norm_topk_prob);

    // transformers 5 writes the attribute-mapped name.
    let json = QWEN3_MOE_MIN.replace(
        "\"vocab_size\": 100",
        "\"vocab_size\": 100, \"num_local_experts\": 8",
    );
    assert_eq!(
        parse_hf_config(&json, None)
            .unwrap()
            .moe
            .unwrap()
            .num_experts,
        8
    );
}

#[test]
fn qwen3_moe_bad_fields_are_errors() {
    for extra in [
        "\"decoder_sparse_step\": 0",
        "\"mlp_only_layers\": [\"a\"]",
        "\"num_experts\": 0",
        "\"num_experts\": 4, \"num_experts_per_tok\": 5",
        "\"num_experts_per_tok\": 0",
    ] {
        let json = QWEN3_MOE_MIN.replace(
            "\"vocab_size\": 100",
            &format!("\"vocab_size\": 100, {extra}"),
        );
        assert!(
            matches!(parse_hf_config(&json, None), Err(ModelError::Config(_))),
            "{extra}"
        );
    }
}

#[test]
fn mixtral_defaults_renormalize_every_layer() {
    let json = r#"{
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 3,
        "num_attention_heads": 8, "vocab_size": 100, "sliding_window": null
    }"#;
    let c = parse_hf_config(json, None).unwrap();
    assert_eq!(c.architecture, Architecture::Mixtral);
    assert_eq!(c.num_key_value_heads, 8);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.sliding_window, None);
    assert!(!c.attention_bias);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2])
    );
    let m = c.moe.unwrap();
    assert_eq!((m.num_experts, m.num_experts_per_tok), (8, 2));
    assert_eq!(m.moe_intermediate_size, 32);
    assert!(m.norm_topk_prob);
    assert_eq!(m.sparse_layers, vec![true; 3]);
    // A window in use is recorded, so a longer context is refused.
    let windowed = json.replace("\"sliding_window\": null", "\"sliding_window\": 4096");
    let c = parse_hf_config(&windowed, None).unwrap();
    assert_eq!(c.sliding_window, Some(4096));
    assert!(c.check_context_len(8192).is_err());
}

#[test]
fn other_moe_families_are_refused_by_name() {
    for (arch, model_type) in [
        ("DeepseekV3ForCausalLM", "deepseek_v3"),
        ("GptOssForCausalLM", "gpt_oss"),
        ("Qwen3NextForCausalLM", "qwen3_next"),
        ("OlmoeForCausalLM", "olmoe"),
    ] {
        for field in [
            format!("\"architectures\": [\"{arch}\"]"),
            format!("\"model_type\": \"{model_type}\""),
        ] {
            let json = format!(
                "{{{field}, \"hidden_size\": 64, \"intermediate_size\": 32, \
                 \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100}}"
            );
            match parse_hf_config(&json, None) {
                Err(ModelError::Config(msg)) => {
                    assert!(msg.contains("mixture-of-experts"), "{msg}");
                    assert!(msg.contains(arch) || msg.contains(model_type), "{msg}");
                }
                other => panic!("{arch}: expected a config error, got {other:?}"),
            }
        }
    }
}

#[test]
fn moe_fields_on_a_dense_architecture_fail_validation() {
    let mut c = parse_hf_config(QWEN3_MOE_MIN, None).unwrap();
    c.architecture = Architecture::Qwen3;
    assert!(c.validate().is_err());
    let mut c = parse_hf_config(QWEN3_MOE_MIN, None).unwrap();
    c.moe = None;
    assert!(c.validate().is_err());
    let mut c = parse_hf_config(QWEN3_MOE_MIN, None).unwrap();
    c.moe.as_mut().unwrap().sparse_layers.pop();
    assert!(c.validate().is_err());
}

#[test]
fn qwen2_moe_defaults_shared_expert_and_biases() {
    let json = r#"{
        "architectures": ["Qwen2MoeForCausalLM"],
        "hidden_size": 512, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 32, "vocab_size": 100
    }"#;
    let c = parse_hf_config(json, None).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2Moe);
    assert_eq!(c.num_key_value_heads, 16);
    assert!(c.attention_bias, "qkv_bias defaults to true");
    assert_eq!(c.sliding_window, None);
    let m = c.moe.unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.num_experts_per_tok,
            m.moe_intermediate_size,
            m.shared_expert_intermediate_size
        ),
        (60, 4, 1408, Some(5632))
    );
    assert!(!m.norm_topk_prob);
    assert_eq!(m.sparse_layers, vec![true; 4]);

    let json2 = json.replace(
        "\"vocab_size\": 100",
        "\"vocab_size\": 100, \"qkv_bias\": false, \"norm_topk_prob\": true, \
         \"shared_expert_intermediate_size\": 24, \"mlp_only_layers\": [0], \
         \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16",
    );
    let c = parse_hf_config(&json2, None).unwrap();
    assert!(!c.attention_bias);
    let m = c.moe.unwrap();
    assert_eq!(m.shared_expert_intermediate_size, Some(24));
    assert_eq!(m.sparse_layers, vec![false, true, true, true]);
    assert!(m.norm_topk_prob);

    // A sliding window in use, and a shared expert of width 0, are refused.
    for extra in [
        "\"use_sliding_window\": true, \"sliding_window\": 16",
        "\"shared_expert_intermediate_size\": 0",
    ] {
        let bad = json.replace(
            "\"vocab_size\": 100",
            &format!("\"vocab_size\": 100, {extra}"),
        );
        assert!(
            matches!(parse_hf_config(&bad, None), Err(ModelError::Config(_))),
            "{extra}"
        );
    }
    // Other MoE architectures carry no shared expert.
    let q3 = parse_hf_config(QWEN3_MOE_MIN, None).unwrap();
    assert_eq!(q3.moe.unwrap().shared_expert_intermediate_size, None);
}
