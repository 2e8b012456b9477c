//! The GGUF weight source: config from metadata, name mapping, llama's q/k
//! row order, dtypes, tokenizer metadata — on small files built with
//! pagoda-gguf's writer (the real SmolLM2 file is tested in gguf_smollm2.rs).

use pagoda_gguf::{GgufFile, GgufWriter, MetadataArray, MetadataValue};
use pagoda_kernels::HostData;
use pagoda_model::loader::gguf::{
    config_from_gguf, gguf_to_hf_name, hf_to_gguf_name, llama3_scaling_from_freqs,
    unpermute_qk_rows, GgufSource,
};
use pagoda_model::loader::WeightSource;
use pagoda_model::{Architecture, ModelError, RopeScaling};
use proptest::prelude::*;

/// llama.cpp's convert-time permutation, from its definition: each head's
/// rows, viewed as `[2, head_dim / 2, cols]`, are transposed to
/// `[head_dim / 2, 2, cols]`.
fn permute_forward<T: Copy>(w: &[T], cols: usize, n_head: usize) -> Vec<T> {
    let rows = w.len() / cols;
    let half = rows / n_head / 2;
    let mut out = Vec::with_capacity(w.len());
    for h in 0..n_head {
        for j in 0..half {
            for i in 0..2 {
                let src = h * 2 * half + i * half + j;
                out.extend_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

proptest! {
    #[test]
    fn unpermute_inverts_llama_cpp_permutation(n_head in 1usize..6, half in 1usize..9, cols in 1usize..5) {
        let n = n_head * 2 * half * cols;
        let w: Vec<u32> = (0..n as u32).collect();
        let stored = permute_forward(&w, cols, n_head);
        prop_assert_eq!(unpermute_qk_rows(&stored, cols, n_head).unwrap(), w);
    }
}

#[test]
fn unpermute_rejects_shapes_that_do_not_split() {
    assert!(unpermute_qk_rows(&[0u8; 6], 1, 2).is_none()); // head of 3 rows
    assert!(unpermute_qk_rows(&[0u8; 8], 3, 1).is_none());
    assert!(unpermute_qk_rows(&[0u8; 8], 1, 0).is_none());
}

#[test]
fn names_map_both_ways() {
    let pairs = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
        (
            "model.layers.0.self_attn.q_proj.weight",
            "blk.0.attn_q.weight",
        ),
        ("model.layers.3.self_attn.k_proj.bias", "blk.3.attn_k.bias"),
        (
            "model.layers.12.self_attn.v_proj.weight",
            "blk.12.attn_v.weight",
        ),
        (
            "model.layers.1.self_attn.o_proj.weight",
            "blk.1.attn_output.weight",
        ),
        // Llama-family attention_bias: llama.cpp's name of the o_proj bias.
        (
            "model.layers.1.self_attn.o_proj.bias",
            "blk.1.attn_output.bias",
        ),
        (
            "model.layers.1.input_layernorm.weight",
            "blk.1.attn_norm.weight",
        ),
        (
            "model.layers.1.post_attention_layernorm.weight",
            "blk.1.ffn_norm.weight",
        ),
        (
            "model.layers.1.mlp.gate_proj.weight",
            "blk.1.ffn_gate.weight",
        ),
        ("model.layers.1.mlp.up_proj.weight", "blk.1.ffn_up.weight"),
        (
            "model.layers.1.mlp.down_proj.weight",
            "blk.1.ffn_down.weight",
        ),
        (
            "model.layers.2.self_attn.q_norm.weight",
            "blk.2.attn_q_norm.weight",
        ),
        (
            "model.layers.2.self_attn.k_norm.weight",
            "blk.2.attn_k_norm.weight",
        ),
    ];
    for (hf, g) in pairs {
        assert_eq!(hf_to_gguf_name(hf).as_deref(), Some(g));
        assert_eq!(gguf_to_hf_name(g).as_deref(), Some(hf));
    }
    for bad in [
        "model.layers.x.mlp.up_proj.weight",
        "model.layers.0.mlp.up_proj.scale",
        "rope_freqs.weight",
        "blk.0.attn_q",
    ] {
        assert_eq!(hf_to_gguf_name(bad), None, "{bad}");
        assert_eq!(gguf_to_hf_name(bad), None, "{bad}");
    }
}

struct Tiny {
    arch: &'static str,
    heads: u32,
    kv_heads: Option<u32>,
    tied: bool,
}

const HIDDEN: usize = 64;

/// A one-layer model of `arch` with hidden size 64 and head_dim 16.
fn tiny(t: &Tiny) -> GgufWriter {
    let a = t.arch;
    let mut w = GgufWriter::new();
    let s = |x: &str| MetadataValue::String(x.into());
    w.add_metadata("general.architecture", s(a))
        .add_metadata(&format!("{a}.context_length"), MetadataValue::U32(256))
        .add_metadata(
            &format!("{a}.embedding_length"),
            MetadataValue::U32(HIDDEN as u32),
        )
        .add_metadata(&format!("{a}.block_count"), MetadataValue::U32(1))
        .add_metadata(&format!("{a}.feed_forward_length"), MetadataValue::U64(96))
        .add_metadata(
            &format!("{a}.attention.head_count"),
            MetadataValue::U32(t.heads),
        )
        .add_metadata(
            &format!("{a}.attention.layer_norm_rms_epsilon"),
            MetadataValue::F32(1e-6),
        )
        .add_metadata("tokenizer.ggml.model", s("gpt2"))
        .add_metadata(
            "tokenizer.ggml.tokens",
            MetadataValue::Array(MetadataArray::String(
                (0..32).map(|i| format!("t{i}")).collect(),
            )),
        )
        .add_metadata(
            "tokenizer.ggml.token_type",
            MetadataValue::Array(MetadataArray::I32(vec![1; 32])),
        )
        .add_metadata("tokenizer.ggml.eos_token_id", MetadataValue::U32(2))
        .add_metadata("tokenizer.ggml.add_bos_token", MetadataValue::Bool(false));
    if let Some(kv) = t.kv_heads {
        w.add_metadata(
            &format!("{a}.attention.head_count_kv"),
            MetadataValue::U32(kv),
        );
    }
    let kv_rows = 16 * t.kv_heads.unwrap_or(t.heads) as usize;
    let ramp = |n: usize| (0..n).map(|i| i as f32).collect::<Vec<f32>>();
    w.add_q8_0("token_embd.weight", &[32, HIDDEN], &ramp(32 * HIDDEN))
        .unwrap();
    w.add_f32("blk.0.attn_norm.weight", &[HIDDEN], &ramp(HIDDEN))
        .unwrap();
    // q rows hold their own index so the row order is visible after loading.
    let q: Vec<f32> = (0..HIDDEN * HIDDEN).map(|i| (i / HIDDEN) as f32).collect();
    w.add_f16("blk.0.attn_q.weight", &[HIDDEN, HIDDEN], &q)
        .unwrap();
    let k: Vec<f32> = (0..kv_rows * HIDDEN).map(|i| (i / HIDDEN) as f32).collect();
    w.add_f32("blk.0.attn_k.weight", &[kv_rows, HIDDEN], &k)
        .unwrap();
    if a == "qwen2" {
        w.add_f32("blk.0.attn_q.bias", &[HIDDEN], &ramp(HIDDEN))
            .unwrap();
    }
    if !t.tied {
        w.add_f32("output.weight", &[32, HIDDEN], &ramp(32 * HIDDEN))
            .unwrap();
    }
    w
}

fn open(w: &GgufWriter) -> pagoda_model::Result<(pagoda_model::ModelConfig, GgufSource)> {
    GgufSource::from_file(GgufFile::from_bytes(w.to_bytes())?)
}

#[test]
fn llama_config_names_and_unpermuted_rows() {
    let (cfg, src) = open(&tiny(&Tiny {
        arch: "llama",
        heads: 4,
        kv_heads: Some(2),
        tied: true,
    }))
    .unwrap();
    assert_eq!(cfg.architecture, Architecture::Llama);
    assert_eq!(
        (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_hidden_layers
        ),
        (64, 96, 1)
    );
    assert_eq!(
        (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim()
        ),
        (4, 2, 16)
    );
    assert_eq!((cfg.vocab_size, cfg.max_position_embeddings), (32, 256));
    assert_eq!(cfg.rope_theta, 10_000.0);
    assert!((cfg.rms_norm_eps - 1e-6).abs() < 1e-12);
    assert!(cfg.tie_word_embeddings && !cfg.attention_bias);
    assert_eq!(
        (cfg.bos_token_id, cfg.eos_token_ids.as_slice()),
        (None, &[2u32][..])
    );
    assert_eq!(config_from_gguf(src.file()).unwrap(), cfg);
    assert!(src.contains("model.embed_tokens.weight"));
    assert!(!src.contains("lm_head.weight"));

    // q (F16, kept as F16): stored row 2j + i of a head is HF row i * 8 + j.
    let q = src.get("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.shape, [64, 64]);
    let HostData::F16(qv) = &q.data else {
        panic!("q_proj should stay f16, got {}", q.data.dtype_name())
    };
    for (hf_row, &v) in qv.iter().step_by(HIDDEN).enumerate() {
        let (h, r) = (hf_row / 16, hf_row % 16);
        let stored = h * 16 + 2 * (r % 8) + r / 8;
        assert_eq!(v.to_f32(), stored as f32, "q row {hf_row}");
    }
    // k uses the KV head count for its permutation.
    let k = src.get("model.layers.0.self_attn.k_proj.weight").unwrap();
    assert_eq!(k.shape, [32, 64]);
    let kv = k.to_f32_vec();
    for hf_row in 0..32 {
        let (h, r) = (hf_row / 16, hf_row % 16);
        assert_eq!(kv[hf_row * HIDDEN], (h * 16 + 2 * (r % 8) + r / 8) as f32);
    }
    // Quantized tensors come back as f32, in GGUF's shape reversed.
    let e = src.get("model.embed_tokens.weight").unwrap();
    assert_eq!(
        (e.shape.as_slice(), e.data.dtype_name()),
        (&[32, 64][..], "f32")
    );
    assert!(matches!(
        src.get("lm_head.weight"),
        Err(ModelError::MissingTensor(_))
    ));

    let infos = src.tensor_infos();
    assert_eq!(infos.len(), 4);
    let q_info = infos
        .iter()
        .find(|t| t.name == "blk.0.attn_q.weight")
        .unwrap();
    assert_eq!(
        (q_info.shape.as_slice(), q_info.dtype.as_str()),
        (&[64, 64][..], "f16")
    );
    assert_eq!(
        src.num_parameters(),
        (32 * 64 + 64 + 64 * 64 + 32 * 64) as u64
    );
}

#[test]
fn qwen2_is_not_permuted_and_has_biases() {
    let (cfg, src) = open(&tiny(&Tiny {
        arch: "qwen2",
        heads: 4,
        kv_heads: None,
        tied: false,
    }))
    .unwrap();
    assert_eq!(cfg.architecture, Architecture::Qwen2);
    assert_eq!(
        cfg.num_key_value_heads, 4,
        "head_count_kv defaults to head_count"
    );
    assert!(cfg.attention_bias && !cfg.tie_word_embeddings);
    assert!(src.contains("lm_head.weight"));
    let q = src
        .get("model.layers.0.self_attn.q_proj.weight")
        .unwrap()
        .to_f32_vec();
    for row in 0..HIDDEN {
        assert_eq!(q[row * HIDDEN], row as f32);
    }
    let b = src.get("model.layers.0.self_attn.q_proj.bias").unwrap();
    assert_eq!(b.shape, [64]);
    assert_eq!(
        b.to_f32_vec(),
        (0..64).map(|i| i as f32).collect::<Vec<_>>()
    );
}

#[test]
fn qwen3_reads_head_dim_and_scaling() {
    let mut w = tiny(&Tiny {
        arch: "qwen3",
        heads: 4,
        kv_heads: Some(4),
        tied: true,
    });
    w.add_metadata("qwen3.attention.key_length", MetadataValue::U32(16))
        .add_metadata("qwen3.rope.freq_base", MetadataValue::F32(1e6))
        .add_metadata(
            "qwen3.rope.scaling.type",
            MetadataValue::String("linear".into()),
        )
        .add_metadata("qwen3.rope.scaling.factor", MetadataValue::F32(4.0));
    w.add_f32("blk.0.attn_q_norm.weight", &[16], &[1.0; 16])
        .unwrap();
    let (cfg, src) = open(&w).unwrap();
    assert_eq!(cfg.architecture, Architecture::Qwen3);
    assert_eq!(cfg.head_dim, Some(16));
    assert_eq!(cfg.rope_theta, 1e6);
    assert_eq!(cfg.rope_scaling, Some(RopeScaling::Linear { factor: 4.0 }));
    assert!(!cfg.attention_bias);
    assert_eq!(
        src.get("model.layers.0.self_attn.q_norm.weight")
            .unwrap()
            .shape,
        [16]
    );
    // Not permuted.
    let q = src
        .get("model.layers.0.self_attn.q_proj.weight")
        .unwrap()
        .to_f32_vec();
    assert_eq!(q[HIDDEN], 1.0);
}

#[test]
fn config_errors_name_the_problem() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetadataValue::String("gpt2".into()));
    match open(&w) {
        Err(ModelError::UnknownArchitecture(a)) => assert_eq!(a, "gpt2"),
        other => panic!("{:?}", other.err()),
    }
    let mut w = GgufWriter::new();
    w.add_metadata(
        "general.architecture",
        MetadataValue::String("llama".into()),
    )
    .add_metadata("llama.embedding_length", MetadataValue::U32(64))
    .add_metadata("llama.attention.head_count", MetadataValue::U32(4));
    let e = open(&w).err().unwrap();
    assert!(matches!(e, ModelError::Config(_)), "{e}");
    assert!(e.to_string().contains("llama."), "{e}");
    assert!(e.to_string().contains("missing metadata key"), "{e}");
    let mut w = tiny(&Tiny {
        arch: "llama",
        heads: 4,
        kv_heads: Some(2),
        tied: true,
    });
    w.add_metadata(
        "llama.rope.scaling.type",
        MetadataValue::String("yarn".into()),
    );
    let e = open(&w).err().unwrap();
    assert!(
        matches!(e, ModelError::Config(_)) && e.to_string().contains("yarn"),
        "{e}"
    );
    let w = tiny(&Tiny {
        arch: "llama",
        heads: 4,
        kv_heads: Some(3),
        tied: true,
    });
    let e = open(&w).err().unwrap();
    assert!(e.to_string().contains("num_key_value_heads"), "{e}");
}

#[test]
fn tokenizer_metadata_reads_all_fields() {
    let (_, src) = open(&tiny(&Tiny {
        arch: "llama",
        heads: 4,
        kv_heads: None,
        tied: true,
    }))
    .unwrap();
    let t = src.tokenizer_metadata().unwrap();
    assert_eq!(t.model, "gpt2");
    assert_eq!((t.tokens.len(), t.tokens[5].as_str()), (32, "t5"));
    assert!(t.merges.is_empty() && t.pre.is_none() && t.chat_template.is_none());
    assert_eq!(t.token_types, vec![1; 32]);
    assert_eq!((t.bos_token_id, t.eos_token_id), (None, Some(2)));
    assert_eq!((t.add_bos_token, t.add_eos_token), (Some(false), None));
}

#[test]
fn llama3_scaling_is_recovered_from_rope_freqs() {
    // Divisors as Llama 3.1 defines them (factor 8, low 1, high 4, original 8192).
    let (head_dim, theta, factor) = (64usize, 500_000f64, 8f64);
    let freqs: Vec<f32> = (0..head_dim / 2)
        .map(|i| {
            let wavelen = 2.0 * std::f64::consts::PI * theta.powf(2.0 * i as f64 / head_dim as f64);
            if wavelen < 8192.0 / 4.0 {
                1.0
            } else if wavelen > 8192.0 {
                factor as f32
            } else {
                let smooth = (8192.0 / wavelen - 1.0) / 3.0;
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect();
    assert!(
        freqs.iter().any(|&f| f > 1.0 && f < 8.0),
        "the test should cover the blend"
    );
    assert_eq!(
        llama3_scaling_from_freqs(&freqs, head_dim, theta),
        Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        })
    );
    let mut off = freqs.clone();
    off[10] *= 1.5;
    assert_eq!(llama3_scaling_from_freqs(&off, head_dim, theta), None);
}

#[test]
fn sliding_window_is_read_from_metadata() {
    let t = Tiny {
        arch: "llama",
        heads: 4,
        kv_heads: None,
        tied: true,
    };
    let (cfg, _) = open(&tiny(&t)).unwrap();
    assert_eq!(cfg.sliding_window, None);
    for (stored, want) in [(4096, Some(4096)), (0, None)] {
        let mut w = tiny(&t);
        w.add_metadata("llama.attention.sliding_window", MetadataValue::U32(stored));
        let (cfg, _) = open(&w).unwrap();
        assert_eq!(cfg.sliding_window, want, "stored {stored}");
    }
}

#[test]
fn gemma3_config_norm_names_and_shifted_norm_weights() {
    let mut w = tiny(&Tiny {
        arch: "gemma3",
        heads: 4,
        kv_heads: Some(2),
        tied: true,
    });
    w.add_metadata("gemma3.attention.key_length", MetadataValue::U32(16))
        .add_metadata("gemma3.rope.freq_base", MetadataValue::F32(1e6))
        .add_metadata("gemma3.attention.sliding_window", MetadataValue::U32(512));
    // llama.cpp stores 1 + w for every Gemma norm.
    let stored: Vec<f32> = (0..HIDDEN).map(|i| 1.0 + i as f32 / 64.0).collect();
    for name in ["post_attention_norm", "ffn_norm", "post_ffw_norm"] {
        w.add_f32(&format!("blk.0.{name}.weight"), &[HIDDEN], &stored)
            .unwrap();
    }
    w.add_f32("blk.0.attn_q_norm.weight", &[16], &[1.5; 16])
        .unwrap();
    w.add_f16("output_norm.weight", &[HIDDEN], &stored).unwrap();
    let (cfg, src) = open(&w).unwrap();
    assert_eq!(cfg.architecture, Architecture::Gemma3);
    assert_eq!(cfg.sliding_window, Some(512));
    let g = cfg.gemma.as_ref().unwrap();
    assert_eq!(g.sliding_layers, vec![true]);
    assert_eq!(g.rope_local_base_freq, 1e4);
    assert_eq!(cfg.rope_theta, 1e6);
    assert_eq!(g.query_pre_attn_scalar, 16.0);
    assert_eq!(
        (g.attn_logit_softcapping, g.final_logit_softcapping),
        (None, None)
    );
    let want: Vec<f32> = stored.iter().map(|x| x - 1.0).collect();
    for hf in [
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.pre_feedforward_layernorm.weight",
        "model.layers.0.post_feedforward_layernorm.weight",
        "model.norm.weight",
    ] {
        assert_eq!(src.get(hf).unwrap().to_f32_vec(), want, "{hf}");
    }
    // attn_norm (ramp 0..64 as stored) is the input norm, shifted too.
    let input = src
        .get("model.layers.0.input_layernorm.weight")
        .unwrap()
        .to_f32_vec();
    assert_eq!(input[3], 2.0);
    assert_eq!(
        src.get("model.layers.0.self_attn.q_norm.weight")
            .unwrap()
            .to_f32_vec(),
        vec![0.5; 16]
    );
    // Not permuted, and matrices are not shifted.
    let q = src
        .get("model.layers.0.self_attn.q_proj.weight")
        .unwrap()
        .to_f32_vec();
    assert_eq!(q[HIDDEN], 1.0);
    assert!(!src.contains("model.layers.0.post_attention_layernorm.bias"));
}

#[test]
fn gemma2_reads_soft_capping_and_alternates_layers() {
    let mut w = tiny(&Tiny {
        arch: "gemma2",
        heads: 4,
        kv_heads: Some(2),
        tied: true,
    });
    w.add_metadata("gemma2.attention.sliding_window", MetadataValue::U32(8))
        .add_metadata("gemma2.attn_logit_softcapping", MetadataValue::F32(50.0))
        .add_metadata("gemma2.final_logit_softcapping", MetadataValue::F32(30.0));
    let (cfg, _) = open(&w).unwrap();
    assert_eq!(cfg.architecture, Architecture::Gemma2);
    let g = cfg.gemma.as_ref().unwrap();
    assert_eq!(g.sliding_layers, vec![true]);
    assert_eq!(
        (g.attn_logit_softcapping, g.final_logit_softcapping),
        (Some(50.0), Some(30.0))
    );
    assert_eq!(g.rope_local_base_freq, cfg.rope_theta);
}
