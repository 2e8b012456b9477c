//! Rotary position embedding tables, including Llama 3 frequency scaling.
//!
//! The table is `[max_positions, rotary_dim]`: cosines in the first half of a
//! row, sines in the second, as [`pagoda_kernels::Backend::rope`] expects.
//! Computed in f64 once at build time.

use crate::{ModelConfig, RopeScaling};
use pagoda_kernels::HostTensor;

/// Inverse frequencies `theta^(-2i/dim)` for `i < dim/2`, with scaling applied.
pub fn inv_freq(cfg: &ModelConfig, rotary_dim: usize) -> Vec<f64> {
    let base = cfg.rope_theta;
    let plain = (0..rotary_dim / 2).map(|i| 1.0 / base.powf((2 * i) as f64 / rotary_dim as f64));
    match &cfg.rope_scaling {
        None => plain.collect(),
        Some(RopeScaling::Linear { factor }) => plain.map(|f| f / factor).collect(),
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => {
            let old_len = *original_max_position_embeddings as f64;
            let low_freq_wavelen = old_len / low_freq_factor;
            let high_freq_wavelen = old_len / high_freq_factor;
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old_len / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// The `[max_positions, rotary_dim]` cos/sin table.
pub fn cos_sin_table(cfg: &ModelConfig, rotary_dim: usize, max_positions: usize) -> HostTensor {
    let freqs = inv_freq(cfg, rotary_dim);
    let half = rotary_dim / 2;
    let mut data = vec![0f32; max_positions * rotary_dim];
    for (pos, row) in data.chunks_exact_mut(rotary_dim).enumerate() {
        for (i, f) in freqs.iter().enumerate() {
            // HF computes the angle in f32; doing the same keeps long positions aligned.
            let angle = (pos as f32 * *f as f32) as f64;
            row[i] = angle.cos() as f32;
            row[half + i] = angle.sin() as f32;
        }
    }
    HostTensor::f32(vec![max_positions, rotary_dim], data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Architecture;

    fn cfg(scaling: Option<RopeScaling>) -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 1,
            num_attention_heads: 4,
            num_key_value_heads: 4,
            head_dim: None,
            vocab_size: 10,
            max_position_embeddings: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 500000.0,
            rope_scaling: scaling,
            tie_word_embeddings: true,
            attention_bias: false,
            bos_token_id: None,
            eos_token_ids: vec![],
            word_embed_proj_dim: None,
            do_layer_norm_before: true,
            torch_dtype: None,
            sliding_window: None,
            gemma: None,
            moe: None,
        }
    }

    #[test]
    fn llama3_scaling_keeps_high_frequencies_and_divides_low_ones() {
        let plain = inv_freq(&cfg(None), 128);
        let scaled = inv_freq(
            &cfg(Some(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            })),
            128,
        );
        // Wavelength 2*pi/f: short ones (< 8192/4) unchanged, long ones (> 8192) divided by 8.
        for (p, s) in plain.iter().zip(&scaled) {
            let wavelen = 2.0 * std::f64::consts::PI / p;
            if wavelen < 2048.0 {
                assert_eq!(p, s);
            } else if wavelen > 8192.0 {
                assert!((p / 8.0 - s).abs() < 1e-18);
            } else {
                assert!(*s < *p && *s > p / 8.0);
            }
        }
    }

    #[test]
    fn table_row_zero_is_identity_rotation() {
        let t = cos_sin_table(&cfg(None), 16, 4).into_f32_vec();
        assert!(t[..8].iter().all(|&c| c == 1.0));
        assert!(t[8..16].iter().all(|&s| s == 0.0));
        // Position 1, frequency 0 has angle 1 rad.
        assert!((t[16] - 1f32.cos()).abs() < 1e-7);
        assert!((t[16 + 8] - 1f32.sin()).abs() < 1e-7);
    }
}
