//! Tests of `config.json` parsing. Expected defaults are transformers 5's
//! (checked with `LlamaConfig(hidden_size=64, num_attention_heads=4)` and
//! friends in the reference venv), not read back from the code under test.

use super::*;

fn parse(json: &str) -> Result<ModelConfig> {
    parse_hf_config(json, None)
}

fn config_err(r: Result<ModelConfig>) -> String {
    match r {
        Err(ModelError::Config(msg)) => msg,
        other => panic!("expected a config error, got {other:?}"),
    }
}

/// The smallest Llama-shaped config: only the required fields.
const LLAMA_MIN: &str = r#"{
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 100
}"#;

#[test]
fn llama_minimal_gets_transformers_defaults() {
    let c = parse(LLAMA_MIN).unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (64, 128, 2)
    );
    assert_eq!((c.num_attention_heads, c.num_key_value_heads), (4, 4));
    assert_eq!(c.head_dim, None);
    assert_eq!(c.head_dim(), 16);
    assert_eq!(c.vocab_size, 100);
    assert_eq!(c.max_position_embeddings, 2048);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.rope_theta, 10000.0);
    assert_eq!(c.rope_scaling, None);
    assert!(!c.tie_word_embeddings);
    assert!(!c.attention_bias);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);
    assert_eq!(c.torch_dtype, None);
}

#[test]
fn llama3_full_config_with_rope_scaling_and_eos_list() {
    // Shaped like meta-llama/Llama-3.2-1B-Instruct's config.json (smaller dims).
    let json = r#"{
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 1000, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
        "torch_dtype": "bfloat16", "hidden_act": "silu"
    }"#;
    let c = parse(json).unwrap();
    assert_eq!(c.num_key_value_heads, 2);
    assert_eq!(c.head_dim, Some(16));
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.rope_theta, 500000.0);
    assert_eq!(
        c.rope_scaling,
        Some(RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        })
    );
    assert!(c.tie_word_embeddings);
    assert_eq!(c.bos_token_id, Some(128000));
    assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
}

#[test]
fn llama3_rope_without_original_max_uses_max_position_embeddings() {
    let json = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0}}"#;
    match parse(json).unwrap().rope_scaling {
        Some(RopeScaling::Llama3 {
            original_max_position_embeddings,
            ..
        }) => {
            assert_eq!(original_max_position_embeddings, 4096)
        }
        other => panic!("expected llama3 scaling, got {other:?}"),
    }
}

#[test]
fn linear_rope_under_old_type_key_and_transformers5_rope_parameters() {
    let old = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
        "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}"#;
    let c = parse(old).unwrap();
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
    assert_eq!(c.rope_theta, 500000.0);

    let new = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
        "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 250000.0}}"#;
    let c = parse(new).unwrap();
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 4.0 }));
    assert_eq!(c.rope_theta, 250000.0);

    let default = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}"#;
    let c = parse(default).unwrap();
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.rope_theta, 1e6);
}

#[test]
fn unknown_rope_type_is_rejected_by_name() {
    let json = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#;
    let msg = config_err(parse(json));
    assert!(msg.contains("yarn") && msg.contains("config.json"), "{msg}");
    let missing_factor = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
        "rope_scaling": {"rope_type": "linear"}}"#;
    let msg = config_err(parse(missing_factor));
    assert!(msg.contains("\"factor\""), "{msg}");
}

#[test]
fn mistral_defaults_eight_kv_heads_and_long_context() {
    let json = r#"{"architectures": ["MistralForCausalLM"], "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 16,
        "vocab_size": 10, "sliding_window": null, "rope_theta": 1000000.0}"#;
    let c = parse(json).unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(c.num_key_value_heads, 8);
    assert_eq!(c.max_position_embeddings, 131072);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2])
    );
}

#[test]
fn qwen2_has_qkv_bias_and_no_default_special_tokens() {
    // Shaped like Qwen/Qwen2.5-0.5B-Instruct.
    let json = r#"{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": true,
        "use_sliding_window": false, "sliding_window": 32768,
        "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"}"#;
    let c = parse(json).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.attention_bias);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.num_key_value_heads, 2);
    assert_eq!(c.eos_token_ids, vec![151645]);

    let minimal = r#"{"model_type": "qwen2", "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 1, "num_attention_heads": 32, "vocab_size": 10}"#;
    let c = parse(minimal).unwrap();
    assert_eq!(c.num_key_value_heads, 32, "Qwen2Config's literal default");
    assert_eq!(c.max_position_embeddings, 32768);
    assert!(!c.tie_word_embeddings);
    assert_eq!((c.bos_token_id, c.eos_token_ids.len()), (None, 0));
}

#[test]
fn qwen3_head_dim_is_explicit_with_default_128() {
    let json = r#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 300,
        "attention_bias": false, "tie_word_embeddings": true, "dtype": "bfloat16",
        "eos_token_id": 151645}"#;
    let c = parse(json).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen3);
    assert_eq!(c.head_dim, Some(32));
    assert_eq!((c.q_dim(), c.kv_dim()), (128, 64));
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    assert!(!c.attention_bias);

    let no_head_dim = r#"{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
        "vocab_size": 10}"#;
    assert_eq!(parse(no_head_dim).unwrap().head_dim, Some(128));
}

#[test]
fn opt_maps_ffn_dim_and_ties_embeddings_by_default() {
    // Shaped like facebook/opt-125m.
    let json = r#"{"architectures": ["OPTForCausalLM"], "model_type": "opt",
        "hidden_size": 64, "ffn_dim": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 500, "max_position_embeddings": 2048,
        "word_embed_proj_dim": 64, "do_layer_norm_before": true, "enable_bias": true,
        "activation_function": "relu", "bos_token_id": 2, "eos_token_id": 2,
        "torch_dtype": "float16"}"#;
    let c = parse(json).unwrap();
    assert_eq!(c.architecture, Architecture::Opt);
    assert_eq!(c.intermediate_size, 256);
    assert_eq!(c.num_key_value_heads, 4);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.word_embed_proj_dim, Some(64));
    assert!(c.do_layer_norm_before);
    assert_eq!(c.rope_scaling, None);

    let post_norm = r#"{"model_type": "opt", "hidden_size": 64, "ffn_dim": 256,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
        "do_layer_norm_before": false}"#;
    let c = parse(post_norm).unwrap();
    assert!(!c.do_layer_norm_before);
    assert_eq!((c.max_position_embeddings, c.bos_token_id), (2048, Some(2)));

    let no_ffn = r#"{"model_type": "opt", "hidden_size": 64, "intermediate_size": 256,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10}"#;
    let msg = config_err(parse(no_ffn));
    assert!(msg.contains("\"ffn_dim\""), "{msg}");

    let no_bias = post_norm.replace("\"do_layer_norm_before\": false", "\"enable_bias\": false");
    assert!(config_err(parse(&no_bias)).contains("enable_bias"));
}

#[test]
fn generation_config_eos_ids_are_merged_without_duplicates() {
    let gen = r#"{"bos_token_id": 1, "eos_token_id": [2, 7, 9], "do_sample": true}"#;
    let c = parse_hf_config(LLAMA_MIN, Some(gen)).unwrap();
    assert_eq!(c.eos_token_ids, vec![2, 7, 9]);
    let gen_int = r#"{"eos_token_id": 5}"#;
    assert_eq!(
        parse_hf_config(LLAMA_MIN, Some(gen_int))
            .unwrap()
            .eos_token_ids,
        vec![2, 5]
    );
    let bad = r#"{"eos_token_id": "x"}"#;
    let msg = config_err(parse_hf_config(LLAMA_MIN, Some(bad)));
    assert!(
        msg.contains("generation_config.json") && msg.contains("eos_token_id"),
        "{msg}"
    );
}

#[test]
fn missing_required_field_names_field_and_file() {
    let json = LLAMA_MIN.replace("\"vocab_size\": 100", "\"vocab_size\": null");
    let msg = config_err(parse(&json));
    assert!(
        msg.contains("\"vocab_size\"") && msg.contains("config.json"),
        "{msg}"
    );
    let json = LLAMA_MIN.replace("\"hidden_size\": 64,", "");
    assert!(config_err(parse(&json)).contains("\"hidden_size\""));
}

#[test]
fn wrong_types_and_bad_json_are_config_errors() {
    let json = LLAMA_MIN.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": \"two\"");
    let msg = config_err(parse(&json));
    assert!(
        msg.contains("num_hidden_layers") && msg.contains("\"two\""),
        "{msg}"
    );
    let json = LLAMA_MIN.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": -2");
    assert!(config_err(parse(&json)).contains("num_hidden_layers"));
    assert!(config_err(parse("{not json")).contains("not valid JSON"));
    assert!(config_err(parse("[1, 2]")).contains("object"));
}

#[test]
fn inconsistent_shapes_fail_validation() {
    let json = LLAMA_MIN.replace(
        "\"num_attention_heads\": 4",
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 3",
    );
    let msg = config_err(parse(&json));
    assert!(msg.contains("num_key_value_heads"), "{msg}");
}

#[test]
fn unknown_architecture_is_its_own_error() {
    let json = LLAMA_MIN.replace("LlamaForCausalLM", "GPT2LMHeadModel");
    match parse(&json) {
        Err(ModelError::UnknownArchitecture(name)) => assert_eq!(name, "GPT2LMHeadModel"),
        other => panic!("expected UnknownArchitecture, got {other:?}"),
    }
    let json = r#"{"model_type": "gemma", "hidden_size": 64}"#;
    assert!(matches!(parse(json), Err(ModelError::UnknownArchitecture(n)) if n == "gemma"));
    let neither = r#"{"hidden_size": 64}"#;
    assert!(config_err(parse(neither)).contains("model_type"));
}

#[test]
fn unsupported_features_are_rejected_not_ignored() {
    let json = LLAMA_MIN.replace(
        "\"vocab_size\": 100",
        "\"vocab_size\": 100, \"mlp_bias\": true",
    );
    assert!(config_err(parse(&json)).contains("mlp_bias"));
    let json = LLAMA_MIN.replace(
        "\"vocab_size\": 100",
        "\"vocab_size\": 100, \"hidden_act\": \"gelu\"",
    );
    assert!(config_err(parse(&json)).contains("gelu"));
}

#[test]
fn load_hf_config_reads_both_files_and_names_missing_dir() {
    let dir = std::env::temp_dir().join(format!("pagoda-hfcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), LLAMA_MIN).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [2, 3]}"#,
    )
    .unwrap();
    let c = load_hf_config(&dir).unwrap();
    assert_eq!(c.eos_token_ids, vec![2, 3]);
    std::fs::write(dir.join("config.json"), "{").unwrap();
    let msg = config_err(load_hf_config(&dir));
    assert!(
        msg.contains(&dir.join("config.json").display().to_string()),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(matches!(load_hf_config(&dir), Err(ModelError::Io { .. })));
}

/// A config of `model_type` with `extra` fields (`, "key": value` pairs).
fn with_fields(model_type: &str, extra: &str) -> ModelConfig {
    let json = format!(
        r#"{{"model_type": "{model_type}", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 10{extra}}}"#
    );
    parse(&json).unwrap()
}

#[test]
fn sliding_window_is_recorded_only_where_in_use() {
    // Mistral v0.1 slides over 4096 tokens; later Mistrals say null.
    let c = with_fields("mistral", r#", "sliding_window": 4096"#);
    assert_eq!(c.sliding_window, Some(4096));
    assert_eq!(
        with_fields("mistral", r#", "sliding_window": null"#).sliding_window,
        None
    );
    // Absent is MistralConfig's default.
    assert_eq!(with_fields("mistral", "").sliding_window, Some(4096));
    assert_eq!(
        with_fields("mistral", r#", "sliding_window": 0"#).sliding_window,
        None
    );
    // Qwen2 configs carry a window that `use_sliding_window: false` leaves unused.
    let off = r#", "use_sliding_window": false, "sliding_window": 32768"#;
    assert_eq!(with_fields("qwen2", off).sliding_window, None);
    assert_eq!(with_fields("qwen3", off).sliding_window, None);
    let on = r#", "use_sliding_window": true, "sliding_window": 512"#;
    assert_eq!(with_fields("qwen2", on).sliding_window, Some(512));
    assert_eq!(with_fields("qwen3", on).sliding_window, Some(512));
    // From layer max_window_layers on: none of 2 layers when it is 2, one when 1.
    let from2 = format!(r#"{on}, "max_window_layers": 2"#);
    assert_eq!(with_fields("qwen2", &from2).sliding_window, None);
    let from1 = format!(r#"{on}, "max_window_layers": 1"#);
    assert_eq!(with_fields("qwen2", &from1).sliding_window, Some(512));
    // An explicit layer list decides.
    let full = format!(r#"{on}, "layer_types": ["full_attention", "full_attention"]"#);
    assert_eq!(with_fields("qwen2", &full).sliding_window, None);
    let all =
        r#", "sliding_window": 64, "layer_types": ["sliding_attention", "sliding_attention"]"#;
    assert_eq!(with_fields("mistral", all).sliding_window, Some(64));
    // Mixed lists mean different things to transformers and vLLM.
    let mixed = r#", "sliding_window": 64, "layer_types": ["full_attention", "sliding_attention"]"#;
    let json = format!(
        r#"{{"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 10{mixed}}}"#
    );
    assert!(config_err(parse(&json)).contains("layer_types mixing"));
    let bad = r#", "sliding_window": 64, "layer_types": "sliding_attention""#;
    let json = format!(
        r#"{{"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 10{bad}}}"#
    );
    assert!(config_err(parse(&json)).contains("layer_types"));
    // Llama has no sliding window, whatever the file says.
    let llama = with_fields("llama", r#", "sliding_window": 64"#);
    assert_eq!(llama.sliding_window, None);
}

#[test]
fn a_context_past_an_unapplied_window_is_refused() {
    // Qwen2's window covers only the layers from max_window_layers on.
    let c = with_fields(
        "qwen2",
        r#", "use_sliding_window": true, "sliding_window": 4096, "max_window_layers": 1"#,
    );
    assert_eq!(c.check_context_len(4096), Ok(()));
    assert_eq!(c.check_context_len(1), Ok(()));
    let msg = c.check_context_len(4097).unwrap_err();
    assert!(
        msg.contains("sliding-window") && msg.contains("4096"),
        "{msg}"
    );
    assert!(msg.contains("4097"), "{msg}");
    let full = with_fields("mistral", r#", "sliding_window": null"#);
    assert_eq!(full.check_context_len(1 << 20), Ok(()));
    // Mistral's window is applied by the Llama file: any context is exact.
    let mistral = with_fields("mistral", r#", "sliding_window": 4096"#);
    assert_eq!(mistral.check_context_len(1 << 20), Ok(()));
}

/// gemma-3-270m's published config.json (the fields that matter).
const GEMMA3_270M: &str = r#"{
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "vocab_size": 262144, "max_position_embeddings": 32768,
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": null,
    "sliding_window": 512, "_sliding_window_pattern": 6,
    "attn_logit_softcapping": null, "final_logit_softcapping": null,
    "use_bidirectional_attention": false, "torch_dtype": "bfloat16",
    "eos_token_id": [1, 106], "bos_token_id": 2
}"#;

#[test]
fn gemma3_text_config_with_legacy_rope_keys() {
    let c = parse(GEMMA3_270M).unwrap();
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!((c.num_key_value_heads, c.head_dim()), (1, 256));
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.sliding_window, Some(512));
    assert!(c.tie_word_embeddings);
    assert_eq!(c.eos_token_ids, vec![1, 106]);
    let g = c.gemma.as_ref().unwrap();
    let global: Vec<usize> = (0..18).filter(|&i| !g.sliding_layers[i]).collect();
    assert_eq!(global, vec![5, 11, 17]);
    assert_eq!(g.rope_local_base_freq, 1e4);
    assert_eq!(g.query_pre_attn_scalar, 256.0);
    assert_eq!(
        (g.attn_logit_softcapping, g.final_logit_softcapping),
        (None, None)
    );
    // Gemma applies the window itself: long contexts are fine.
    assert!(c.check_context_len(32768).is_ok());
}

#[test]
fn gemma3_multimodal_config_reads_text_config_with_class_defaults() {
    let json = r#"{
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "eos_token_id": [1, 106],
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
            "intermediate_size": 10240, "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}
    }"#;
    let c = parse(json).unwrap();
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!((c.num_attention_heads, c.num_key_value_heads), (8, 4));
    assert_eq!((c.head_dim(), c.vocab_size), (256, 262_208));
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 8.0 }));
    assert_eq!(c.sliding_window, Some(1024));
    assert_eq!(c.eos_token_ids, vec![1, 106]);
    assert_eq!(c.gemma.as_ref().unwrap().rope_local_base_freq, 1e4);
}

#[test]
fn gemma2_defaults_soft_capping_and_alternating_layers() {
    let c = with_fields("gemma2", r#", "sliding_window": 4096"#);
    assert_eq!(c.architecture, Architecture::Gemma2);
    let g = c.gemma.as_ref().unwrap();
    assert_eq!(g.sliding_layers, vec![true, false]);
    assert_eq!(
        (g.attn_logit_softcapping, g.final_logit_softcapping),
        (Some(50.0), Some(30.0))
    );
    assert_eq!(g.rope_local_base_freq, c.rope_theta);
    let off = with_fields("gemma2", r#", "attn_logit_softcapping": null"#);
    assert_eq!(off.gemma.unwrap().attn_logit_softcapping, None);
}

#[test]
fn gemma_unsupported_options_are_errors() {
    for extra in [
        r#", "hidden_activation": "silu""#,
        r#", "use_bidirectional_attention": true"#,
        r#", "attention_bias": true"#,
        r#", "layer_types": ["sliding_attention", "chunked_attention"]"#,
        r#", "layer_types": ["sliding_attention"]"#,
    ] {
        let json = format!(
            r#"{{"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10{extra}}}"#
        );
        assert!(parse(&json).is_err(), "{extra}");
    }
}

/// Phi-3.5-mini's published config.json (the fields that matter; factors cut to
/// the rotary half of a tiny head).
#[test]
fn phi3_longrope_su_and_partial_rotary() {
    let base = r#""architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 32064,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096"#;
    let factors = r#""short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],
        "long_factor": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]"#;
    for kind in ["longrope", "su"] {
        let c = parse(&format!(
            r#"{{{base}, "rope_scaling": {{"type": "{kind}", {factors}}}, "sliding_window": 262144}}"#
        ))
        .unwrap();
        assert_eq!(c.architecture, crate::Architecture::Phi3);
        // Phi3Config's defaults.
        assert_eq!((c.num_key_value_heads, c.rms_norm_eps), (4, 1e-5));
        assert_eq!(c.eos_token_ids, vec![32000]);
        assert_eq!(c.sliding_window, Some(262144));
        assert_eq!(c.rotary_dim, None);
        let Some(RopeScaling::LongRope {
            original_max_position_embeddings,
            attention_factor,
            ..
        }) = c.rope_scaling
        else {
            panic!("{kind}: {:?}", c.rope_scaling)
        };
        assert_eq!(original_max_position_embeddings, 4096);
        // transformers: sqrt(1 + ln(131072 / 4096) / ln 4096).
        let want = (1.0 + (32f64).ln() / (4096f64).ln()).sqrt();
        assert!((attention_factor - want).abs() < 1e-12);
    }
    // Phi-4-mini: 0.75 of the head rotated; factors for those 12 dimensions only.
    let phi4 = format!(
        r#"{{{base}, "partial_rotary_factor": 0.75, "rope_scaling": {{"type": "longrope",
        "short_factor": [1, 1, 1, 1, 1, 1], "long_factor": [2, 2, 2, 2, 2, 2]}}}}"#
    );
    let c = parse(&phi4).unwrap();
    assert_eq!((c.rotary_dim, c.sliding_window), (Some(12), None));
    // Factors that do not fit the rotary dimensions are an error naming them.
    let bad = phi4.replace("0.75", "0.5");
    assert!(config_err(parse(&bad)).contains("short_factor"));
    let missing = format!(r#"{{{base}, "rope_scaling": {{"type": "longrope"}}}}"#);
    assert!(config_err(parse(&missing)).contains("short_factor"));
}
