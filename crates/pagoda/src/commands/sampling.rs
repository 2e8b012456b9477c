//! The sampling options `generate` and `chat` share (same flags, same
//! defaults), turned into checked [`SamplingParams`].

use anyhow::Result;
use clap::Args;
use pagoda_core::SamplingParams;

/// How tokens are drawn; `--max-tokens` stays with each command, whose
/// defaults differ.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 picks the most likely token (greedy).
    #[arg(
        long,
        default_value_t = 0.7,
        value_name = "T",
        allow_negative_numbers = true
    )]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probability adds up to P.
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "P",
        allow_negative_numbers = true
    )]
    pub top_p: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_k: usize,
    /// Drop tokens less likely than P times the most likely one.
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "P",
        allow_negative_numbers = true
    )]
    pub min_p: f32,
    /// Penalize tokens already in the prompt or output (1: off).
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "R",
        allow_negative_numbers = true
    )]
    pub repetition_penalty: f32,
    /// Seed for sampling; the same seed gives the same output.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Stop when this string is generated (repeatable); it is not printed.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// The checked parameters, generating at most `max_tokens`.
    pub fn params(&self, max_tokens: usize) -> Result<SamplingParams> {
        let params = SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            max_tokens,
            ignore_eos: self.ignore_eos,
            stop: self.stop.clone(),
            ..SamplingParams::default()
        };
        params.validate()?;
        Ok(params)
    }
}
