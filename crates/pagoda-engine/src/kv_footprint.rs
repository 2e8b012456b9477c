//! The KV-cache footprint of one sequence: bytes per token of context with
//! every position kept, and with the blocks a sliding window has passed
//! released (what the scheduler does in every windowed KV cache group:
//! every layer where all share one window, the local layers' groups where
//! local and global layers mix; see [`pagoda_model::KvLayout`]).
//!
//! Pure arithmetic over the config; the figures `pagoda info` and the
//! start-up log print, and BENCHMARKS.md quotes.

use pagoda_core::kv_cache_manager::max_blocks_in_window;
use pagoda_model::{KvLayout, ModelConfig};
use serde::Serialize;

/// One sequence's KV bytes at a given context length.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KvFootprint {
    /// Bytes of K and V per position, all layers together.
    pub bytes_per_token: usize,
    /// The context length of the figures below.
    pub context_len: usize,
    /// Bytes a sequence of `context_len` tokens holds, every position kept.
    pub bytes_full: usize,
    /// Bytes it holds while decoding with passed blocks released (equal to
    /// `bytes_full` without a uniform window).
    pub bytes_released: usize,
}

impl KvFootprint {
    /// `bytes_released` per token of context.
    pub fn released_bytes_per_token(&self) -> f64 {
        self.bytes_released as f64 / self.context_len.max(1) as f64
    }
}

/// The footprint of one sequence of `context_len` tokens for `cfg`, whose
/// layers take `layer_token_bytes` per position (K and V of one layer:
/// `2 * kv_dim * element size`), in blocks of `block_size` positions. While
/// decoding, a KV cache group with a window `w` keeps at most
/// `max_blocks_in_window(w, 1, block_size)` blocks, each a page of the
/// layout's `num_slots` layer slots (a group with fewer layers pays for
/// its empty slots).
pub fn kv_footprint(
    cfg: &ModelConfig,
    layer_token_bytes: usize,
    context_len: usize,
    block_size: usize,
) -> KvFootprint {
    let layers = cfg.num_hidden_layers;
    let bytes_per_token = layer_token_bytes * layers;
    let full_positions = context_len.div_ceil(block_size) * block_size;
    let layout = KvLayout::for_config(cfg, true);
    let page_token_bytes = layer_token_bytes * layout.num_slots;
    let bytes_released = layout
        .windows
        .iter()
        .map(|w| match w {
            Some(w) => full_positions.min(max_blocks_in_window(*w, 1, block_size) * block_size),
            None => full_positions,
        })
        .sum::<usize>()
        * page_token_bytes;
    KvFootprint {
        bytes_per_token,
        context_len,
        bytes_full: full_positions * bytes_per_token,
        // Padding slots may cost more than they save on short contexts.
        bytes_released: bytes_released.min(full_positions * bytes_per_token),
    }
}

/// A line for logs and `pagoda info`.
pub fn describe(f: &KvFootprint, dtype: &str) -> String {
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    if f.bytes_released == f.bytes_full {
        format!(
            "{} bytes ({dtype}) per token of context; a {}-token sequence holds {:.1} MiB",
            f.bytes_per_token,
            f.context_len,
            mib(f.bytes_full)
        )
    } else {
        format!(
            "{} bytes ({dtype}) per token of context kept; a {}-token sequence holds {:.1} MiB \
             with every block kept, {:.1} MiB ({:.0} bytes per token) with the blocks its \
             sliding windows passed released",
            f.bytes_per_token,
            f.context_len,
            mib(f.bytes_full),
            mib(f.bytes_released),
            f.released_bytes_per_token()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_model::loader::hf_config::parse_hf_config;

    fn mistral(window: Option<usize>) -> ModelConfig {
        let w = window.map_or("null".to_string(), |w| w.to_string());
        parse_hf_config(
            &format!(
                r#"{{"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "max_position_embeddings": 32768, "vocab_size": 32000, "sliding_window": {w}}}"#
            ),
            None,
        )
        .unwrap()
    }

    #[test]
    fn mistral_7b_keeps_one_window_per_layer() {
        let layer_token = 2 * 8 * 128 * 2; // K and V, 8 kv heads of 128, bf16
        let f = kv_footprint(&mistral(Some(4096)), layer_token, 32768, 16);
        assert_eq!(f.bytes_per_token, 131072);
        assert_eq!(f.bytes_full, 32768 * 131072);
        // ceil((4096 + 64 + 1 + 16 - 3) / 16) = 261 blocks per layer.
        assert_eq!(f.bytes_released, 261 * 16 * 131072);
        let f = kv_footprint(&mistral(None), layer_token, 32768, 16);
        assert_eq!(f.bytes_released, f.bytes_full);
        // A context within the window keeps everything.
        let f = kv_footprint(&mistral(Some(4096)), layer_token, 1000, 16);
        assert_eq!(f.bytes_released, f.bytes_full);
    }

    fn gemma3_1b() -> ModelConfig {
        parse_hf_config(
            r#"{"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
            "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 256, "max_position_embeddings": 32768, "vocab_size": 262144,
            "sliding_window": 512, "sliding_window_pattern": 6, "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256}"#,
            None,
        )
        .unwrap()
    }

    #[test]
    fn gemma3_1b_keeps_global_layers_and_one_window_per_local_group() {
        let cfg = gemma3_1b();
        let layer_token = 2 * 256 * 2; // K and V, one kv head of 256, bf16
        let f = kv_footprint(&cfg, layer_token, 32768, 16);
        assert_eq!(f.bytes_per_token, 26 * 1024);
        assert_eq!(f.bytes_full, 32768 * 26 * 1024);
        // 4 global layers (one group of 4 slots) keep everything; 6 local
        // groups of 4 slots keep ceil((512 + 64 + 1 + 16 - 3) / 16) = 37
        // blocks each.
        let local = 37 * 16;
        assert_eq!(f.bytes_released, (32768 + 6 * local) * 4 * 1024);
        assert!(f.released_bytes_per_token() < 5000.0);
        // A short context pays no more than with every layer kept.
        let f = kv_footprint(&cfg, layer_token, 100, 16);
        assert_eq!(f.bytes_released, f.bytes_full);
    }
}
