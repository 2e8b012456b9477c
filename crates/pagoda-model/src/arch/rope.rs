//! Rotary position embedding tables, with linear, Llama 3 and LongRoPE
//! frequency scaling.
//!
//! The table is `[max_positions, rotary_dim]`: cosines in the first half of a
//! row, sines in the second, as [`pagoda_kernels::Backend::rope`] expects
//! (dimensions past `rotary_dim` are not rotated: partial rotary). Computed
//! once at build time, frequencies in f64, angles in f32 as transformers.
//!
//! LongRoPE (Phi-3) has two factor sets; transformers switches between them
//! per forward pass by sequence length. The table is built once, so pagoda
//! picks one set for the model, as vLLM and llama.cpp do: the long factors
//! when the table is longer than `original_max_position_embeddings` (the
//! served context, `max_model_len`, passes the original one), else the short
//! ones. A context within the original length thus matches transformers
//! exactly; a longer one matches transformers' long-sequence forward.

use crate::{ModelConfig, RopeScaling};
use pagoda_kernels::HostTensor;

/// Inverse frequencies `theta^(-2i/dim)` for `i < dim/2`, with scaling
/// applied, for a table of `max_positions` rows (which picks LongRoPE's
/// factor set: long past `original_max_position_embeddings`).
pub fn inv_freq(cfg: &ModelConfig, rotary_dim: usize, max_positions: usize) -> Vec<f64> {
    let base = cfg.rope_theta;
    let plain = (0..rotary_dim / 2).map(|i| 1.0 / base.powf((2 * i) as f64 / rotary_dim as f64));
    match &cfg.rope_scaling {
        None => plain.collect(),
        Some(RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings,
            ..
        }) => {
            let ext = if max_positions > *original_max_position_embeddings {
                long_factor
            } else {
                short_factor
            };
            plain.zip(ext).map(|(f, e)| f / e).collect()
        }
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

/// The `[max_positions, rotary_dim]` cos/sin table (LongRoPE's cos and sin
/// multiplied by its attention factor, as transformers does).
pub fn cos_sin_table(cfg: &ModelConfig, rotary_dim: usize, max_positions: usize) -> HostTensor {
    let freqs = inv_freq(cfg, rotary_dim, max_positions);
    let scale = match &cfg.rope_scaling {
        Some(RopeScaling::LongRope {
            attention_factor, ..
        }) => *attention_factor as f32,
        _ => 1.0,
    };
    let half = rotary_dim / 2;
    let mut data = vec![0f32; max_positions * rotary_dim];
    for (pos, row) in data.chunks_exact_mut(rotary_dim).enumerate() {
        for (i, f) in freqs.iter().enumerate() {
            // HF computes the angle in f32; doing the same keeps long positions aligned.
            let angle = (pos as f32 * *f as f32) as f64;
            row[i] = angle.cos() as f32 * scale;
            row[half + i] = angle.sin() as f32 * scale;
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
            rotary_dim: None,
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
        let plain = inv_freq(&cfg(None), 128, 64);
        let scaled = inv_freq(
            &cfg(Some(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            })),
            128,
            64,
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
    fn longrope_picks_factors_by_table_length_and_scales_cos_and_sin() {
        let longrope = RopeScaling::LongRope {
            short_factor: vec![1.0, 2.0, 4.0],
            long_factor: vec![3.0, 5.0, 7.0],
            original_max_position_embeddings: 16,
            attention_factor: 1.25,
        };
        let c = cfg(Some(longrope));
        let plain = inv_freq(&cfg(None), 6, 16);
        for (max_positions, want) in [(16, [1.0, 2.0, 4.0]), (17, [3.0, 5.0, 7.0])] {
            let got = inv_freq(&c, 6, max_positions);
            for i in 0..3 {
                assert!(
                    (got[i] * want[i] - plain[i]).abs() < 1e-15,
                    "{max_positions} {i}"
                );
            }
        }
        // Row 0 is cos 0 = 1 and sin 0 = 0, scaled.
        let t = cos_sin_table(&c, 6, 17).into_f32_vec();
        assert_eq!(&t[..6], &[1.25, 1.25, 1.25, 0.0, 0.0, 0.0]);
        let angle = (3.0f32 * (plain[1] / 5.0) as f32) as f64;
        assert!((t[3 * 6 + 1] - angle.cos() as f32 * 1.25).abs() < 1e-7);
        assert!((t[3 * 6 + 4] - angle.sin() as f32 * 1.25).abs() < 1e-7);
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
