//! What a request asks of generation: sampling knobs and stop conditions.

use serde::{Deserialize, Serialize};

/// Per-request generation parameters (vLLM's SamplingParams, OpenAI's names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Drop tokens below `min_p * p_max`; 0 disables.
    pub min_p: f32,
    /// Divides positive logits (multiplies negative ones) of tokens seen in
    /// prompt or output; 1 disables.
    pub repetition_penalty: f32,
    /// Subtracted once per occurrence in the output.
    pub frequency_penalty: f32,
    /// Subtracted once if the token occurs in the output.
    pub presence_penalty: f32,
    /// Seed of this request's own random stream; sampling with a seed gives the
    /// same tokens whatever else is in the batch.
    pub seed: Option<u64>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Token ids that end the request (besides the model's EOS).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end the request; they are not included in the text.
    pub stop: Vec<String>,
    /// A constraint the generated text must satisfy (structured outputs).
    pub structured: Option<StructuredOutput>,
    /// `(token, bias)` added to the raw logits before anything else; a bias
    /// in [-100, 100].
    #[serde(default)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Only these tokens may be sampled (`None`: any; never empty).
    #[serde(default)]
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Words that never appear in the output: each is tokenized with and
    /// without a leading space, and the last token of either is banned
    /// whenever the output ends with the ones before it.
    #[serde(default)]
    pub bad_words: Vec<String>,
    /// End-of-sequence and stop ids are banned, and stop strings do not end
    /// the request, until this many tokens were generated.
    #[serde(default)]
    pub min_tokens: usize,
    /// Keep the matched stop string at the end of the text.
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    /// Leave special tokens (BOS, EOS, chat markers) out of the text.
    #[serde(default = "yes")]
    pub skip_special_tokens: bool,
    /// Put spaces between special tokens and their neighbours in the text
    /// (vLLM's option; see the engine's detokenization for where it acts).
    #[serde(default = "yes")]
    pub spaces_between_special_tokens: bool,
    /// `Some(n)`: report the logprob of every prompt token given its
    /// prefix, with the `n` most likely alternatives (vLLM's
    /// `prompt_logprobs`). Such a request computes its whole prompt: it
    /// takes no prefix from the cache.
    #[serde(default)]
    pub prompt_logprobs: Option<usize>,
}

fn yes() -> bool {
    true
}

/// Largest `|bias|` of `logit_bias` (OpenAI's range).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// A constraint on the text a request generates, enforced token by token by
/// masking the tokens that cannot continue a valid output. The payloads are
/// kept as text; the engine compiles them and reports what is wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StructuredOutput {
    /// Any JSON object (OpenAI's `response_format: json_object`).
    JsonObject,
    /// JSON valid under this JSON Schema (the schema's JSON text).
    JsonSchema(String),
    /// Text matching this regular expression in full.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text derived from this grammar, in Lark syntax (llguidance's dialect,
    /// which also embeds JSON schemas and regexes).
    Lark(String),
    /// Text derived from this grammar in llama.cpp's GBNF (EBNF) syntax.
    Gbnf(String),
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: None,
            max_tokens: 16,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            structured: None,
            logit_bias: Vec::new(),
            allowed_token_ids: None,
            bad_words: Vec::new(),
            min_tokens: 0,
            include_stop_str_in_output: false,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            prompt_logprobs: None,
        }
    }
}

/// A parameter outside its valid range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid {param}: {message}")]
pub struct SamplingParamsError {
    pub param: &'static str,
    pub message: String,
}

impl SamplingParams {
    /// Greedy decoding of up to `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams {
            temperature: 0.0,
            max_tokens,
            ..Default::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Rejects values no sampler can honour, naming the parameter.
    pub fn validate(&self) -> Result<(), SamplingParamsError> {
        let err = |param, message: String| Err(SamplingParamsError { param, message });
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return err(
                "temperature",
                format!("must be >= 0, got {}", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return err("top_p", format!("must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return err("min_p", format!("must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return err(
                "repetition_penalty",
                format!("must be > 0, got {}", self.repetition_penalty),
            );
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return err(name, format!("must be in [-2, 2], got {v}"));
            }
        }
        if self.max_tokens == 0 {
            return err("max_tokens", "must be at least 1".into());
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return err("stop", "stop strings must not be empty".into());
        }
        self.validate_token_rules()
    }

    /// Checks `logit_bias`, `allowed_token_ids`, `bad_words` and
    /// `min_tokens` (token ids against the vocabulary are the engine's check).
    fn validate_token_rules(&self) -> Result<(), SamplingParamsError> {
        let err = |param, message: String| Err(SamplingParamsError { param, message });
        for &(t, b) in &self.logit_bias {
            if !(b.is_finite() && (-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&b)) {
                return err(
                    "logit_bias",
                    format!("the bias of token {t} must be in [-100, 100], got {b}"),
                );
            }
        }
        if self
            .allowed_token_ids
            .as_ref()
            .is_some_and(|a| a.is_empty())
        {
            return err(
                "allowed_token_ids",
                "must list at least one token (or be left out)".into(),
            );
        }
        if self.bad_words.iter().any(|w| w.is_empty()) {
            return err("bad_words", "bad words must not be empty".into());
        }
        if self.min_tokens > self.max_tokens {
            return err(
                "min_tokens",
                format!(
                    "must be at most max_tokens ({}), got {}",
                    self.max_tokens, self.min_tokens
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_parameter() {
        assert!(SamplingParams::default().validate().is_ok());
        let bad = SamplingParams {
            temperature: -0.5,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().param, "temperature");
        let bad = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().param, "top_p");
        let bad = SamplingParams {
            max_tokens: 0,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().param, "max_tokens");
    }

    #[test]
    fn token_rules_are_checked() {
        let ok = SamplingParams {
            logit_bias: vec![(3, 100.0), (4, -100.0)],
            allowed_token_ids: Some(vec![1]),
            bad_words: vec!["x".into()],
            min_tokens: 16,
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        for (bad, name) in [
            (
                SamplingParams {
                    logit_bias: vec![(3, 100.5)],
                    ..Default::default()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(3, f32::NAN)],
                    ..Default::default()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    allowed_token_ids: Some(vec![]),
                    ..Default::default()
                },
                "allowed_token_ids",
            ),
            (
                SamplingParams {
                    bad_words: vec![String::new()],
                    ..Default::default()
                },
                "bad_words",
            ),
            (
                SamplingParams {
                    min_tokens: 17,
                    ..Default::default()
                },
                "min_tokens",
            ),
        ] {
            assert_eq!(bad.validate().unwrap_err().param, name);
        }
    }
}
