//! Request options -> engine [`SamplingParams`], with OpenAI's defaults and
//! validation (every refusal a 400 naming the parameter).
//!
//! Default `max_tokens`: what the request can get, i.e. the least of what is
//! left of `max_model_len` after the prompt, what the whole KV cache can hold
//! beyond the prompt (so a request without `max_tokens` runs on any cache
//! that holds its prompt), and [`DEFAULT_MAX_TOKENS_CAP`] (so that a request
//! without a limit on a long-context model cannot hold a sequence for tens of
//! thousands of tokens by accident). An explicit `max_tokens` with the prompt
//! must fit in `max_model_len` (vLLM's rule) and in the KV cache, otherwise
//! 400 naming `max_tokens`.
//!
//! The KV bound mirrors the scheduler's admission rule: a sequence of
//! `prompt + max_tokens` tokens needs the KV of all but its last token, so it
//! fits a cache of `C` token slots when `prompt + max_tokens - 1 <= C`.

use crate::error::ApiError;
use crate::openai::SamplingFields;
use pagoda_core::SamplingParams;

/// Cap of the default `max_tokens` (when the request gives none).
pub const DEFAULT_MAX_TOKENS_CAP: usize = 1024;
/// Most choices (`n`) one request may ask for.
pub const MAX_N: usize = 128;
/// Most alternatives per token (`logprobs` / `top_logprobs`).
pub const MAX_LOGPROBS: usize = 20;

/// What a request asks of each of its choices, before the prompt is known.
#[derive(Debug, Clone)]
pub struct ChoiceParams {
    /// `max_tokens` is a placeholder until [`ChoiceParams::for_prompt`].
    pub sampling: SamplingParams,
    /// The request's `max_tokens` (or `max_completion_tokens`), if given.
    pub max_tokens: Option<usize>,
    /// The name the request gave it under (`max_completion_tokens` or
    /// `max_tokens`), named by refusals.
    pub max_tokens_param: &'static str,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// The parameter that holds the prompt (`prompt`, or chat's `messages`),
    /// named by refusals about the prompt's length.
    pub prompt_param: &'static str,
    /// Logprob tokens written as `token_id:N` (`return_tokens_as_token_ids`).
    pub tokens_as_ids: bool,
}

/// What the server can give one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqLimits {
    /// The model's longest prompt + output.
    pub max_model_len: usize,
    /// Token slots of the whole KV cache (`None`: unknown, not checked).
    pub kv_cache_tokens: Option<usize>,
}

/// Refuses a request that would start more than `limit` sequences
/// (`num_prompts` x `n`).
pub fn check_num_seqs(num_prompts: usize, n: usize, limit: usize) -> Result<(), ApiError> {
    let seqs = num_prompts.saturating_mul(n);
    if seqs <= limit {
        return Ok(());
    }
    let param = if n > 1 { "n" } else { "prompt" };
    Err(ApiError::invalid_param(
        param,
        format!(
            "this request asks for {num_prompts} prompt(s) x n={n} = {seqs} sequences, \
             more than the limit of {limit} per request (max_seqs_per_request)"
        ),
    ))
}

fn finite(name: &str, v: Option<f64>, default: f32) -> Result<f32, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() => Ok(x as f32),
        Some(x) => Err(ApiError::invalid_param(
            name,
            format!("{name} must be finite, got {x}"),
        )),
    }
}

impl ChoiceParams {
    /// Validates the sampling options of a request.
    pub fn from_fields(f: &SamplingFields) -> Result<Self, ApiError> {
        let temperature = finite("temperature", f.temperature, 1.0)?;
        if temperature < 0.0 {
            return Err(ApiError::invalid_param(
                "temperature",
                format!("temperature must be >= 0, got {temperature}"),
            ));
        }
        let top_p = finite("top_p", f.top_p, 1.0)?;
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid_param(
                "top_p",
                format!("top_p must be in (0, 1], got {top_p}"),
            ));
        }
        let top_k = match f.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::invalid_param(
                    "top_k",
                    format!("top_k must be -1 (off) or at least 1, got {k}"),
                ))
            }
        };
        let (max_name, max_tokens) = match (f.max_completion_tokens, f.max_tokens) {
            (Some(m), _) => ("max_completion_tokens", Some(m)),
            (None, m) => ("max_tokens", m),
        };
        let max_tokens = match max_tokens {
            None => None,
            Some(m) if m >= 1 => Some(m as usize),
            Some(m) => {
                return Err(ApiError::invalid_param(
                    max_name,
                    format!("{max_name} must be at least 1, got {m}"),
                ))
            }
        };
        let n = match f.n {
            None => 1,
            Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::invalid_param(
                    "n",
                    format!("n must be between 1 and {MAX_N}, got {n}"),
                ))
            }
        };
        let sampling = SamplingParams {
            temperature,
            top_p,
            top_k,
            min_p: finite("min_p", f.min_p, 0.0)?,
            repetition_penalty: finite("repetition_penalty", f.repetition_penalty, 1.0)?,
            frequency_penalty: finite("frequency_penalty", f.frequency_penalty, 0.0)?,
            presence_penalty: finite("presence_penalty", f.presence_penalty, 0.0)?,
            seed: f.seed.map(|s| s as u64),
            max_tokens: 1,
            ignore_eos: f.ignore_eos,
            stop_token_ids: f.stop_token_ids.clone().unwrap_or_default(),
            stop: f.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
            structured: super::structured::constraint(&f.structured)?,
            prompt_logprobs: prompt_logprobs(f)?,
            ..token_rules(f)?
        };
        // `max_tokens` is known only with the prompt: min_tokens is checked
        // against it there.
        SamplingParams {
            max_tokens: usize::MAX,
            ..sampling.clone()
        }
        .validate()
        .map_err(|e| ApiError::invalid_param(e.param, e.to_string()))?;
        Ok(ChoiceParams {
            sampling,
            max_tokens,
            max_tokens_param: max_name,
            n,
            stream: f.stream,
            include_usage: f.stream_options.as_ref().is_some_and(|o| o.include_usage),
            prompt_param: "prompt",
            tokens_as_ids: f.return_tokens_as_token_ids.unwrap_or(false),
        })
    }

    /// The parameters of choice `i` (of `n`) for a prompt of `prompt_len`
    /// tokens: `max_tokens` resolved within `limits`, seed offset by `i`.
    pub fn for_prompt(
        &self,
        prompt_len: usize,
        limits: SeqLimits,
        i: usize,
    ) -> Result<SamplingParams, ApiError> {
        let max_model_len = limits.max_model_len;
        let prompt_param = self.prompt_param;
        if prompt_len == 0 {
            return Err(ApiError::invalid_param(prompt_param, "the prompt is empty"));
        }
        if prompt_len >= max_model_len {
            return Err(ApiError::invalid_param(
                prompt_param,
                format!(
                    "this model's maximum context length is {max_model_len} tokens, \
                     but the prompt has {prompt_len} tokens (no room to generate)"
                ),
            )
            .with_code("context_length_exceeded"));
        }
        let context_room = max_model_len - prompt_len;
        // Tokens the whole cache can give this request beyond its prompt.
        let cache_room = match limits.kv_cache_tokens {
            None => usize::MAX,
            Some(slots) if prompt_len <= slots => slots + 1 - prompt_len,
            Some(slots) => {
                return Err(ApiError::invalid_param(
                    prompt_param,
                    format!(
                        "the prompt has {prompt_len} tokens but the whole KV cache holds \
                         {slots}; send a shorter prompt"
                    ),
                )
                .with_code("context_length_exceeded"))
            }
        };
        let max_name = self.max_tokens_param;
        let max_tokens = match self.max_tokens {
            None => context_room.min(cache_room).min(DEFAULT_MAX_TOKENS_CAP),
            Some(m) if m > context_room => {
                return Err(ApiError::invalid_param(
                    max_name,
                    format!(
                        "this model's maximum context length is {max_model_len} tokens, \
                         but {} were requested ({prompt_len} in the prompt, {m} to generate)",
                        prompt_len + m
                    ),
                )
                .with_code("context_length_exceeded"))
            }
            Some(m) if m > cache_room => {
                return Err(ApiError::invalid_param(
                    max_name,
                    format!(
                        "the whole KV cache holds {} tokens, too few for {prompt_len} \
                         prompt tokens and {m} to generate; {max_name} can be at most \
                         {cache_room} for this prompt",
                        limits.kv_cache_tokens.unwrap_or(0)
                    ),
                )
                .with_code("context_length_exceeded"))
            }
            Some(m) => m,
        };
        if self.sampling.min_tokens > max_tokens {
            return Err(ApiError::invalid_param(
                "min_tokens",
                format!(
                    "min_tokens ({}) must be at most {max_name} ({max_tokens})",
                    self.sampling.min_tokens
                ),
            ));
        }
        Ok(SamplingParams {
            max_tokens,
            seed: self.sampling.seed.map(|s| s.wrapping_add(i as u64)),
            ..self.sampling.clone()
        })
    }
}

/// `logit_bias`, `allowed_token_ids`, `bad_words`, `min_tokens` and the
/// text options of a request (ranges are checked by
/// [`SamplingParams::validate`], ids against the vocabulary by the engine).
fn token_rules(f: &SamplingFields) -> Result<SamplingParams, ApiError> {
    let mut logit_bias = Vec::new();
    for (k, v) in f.logit_bias.iter().flatten() {
        let token = k.trim().parse::<u32>().map_err(|_| {
            ApiError::invalid_param(
                "logit_bias",
                format!("logit_bias keys must be token ids, got {k:?}"),
            )
        })?;
        let bias = v.as_f64().ok_or_else(|| {
            ApiError::invalid_param(
                "logit_bias",
                format!("the bias of token {token} must be a number, got {v}"),
            )
        })?;
        logit_bias.push((token, bias as f32));
    }
    let id = |name: &str, v: i64| {
        u32::try_from(v)
            .map_err(|_| ApiError::invalid_param(name, format!("{name}: {v} is not a token id")))
    };
    let allowed_token_ids = match &f.allowed_token_ids {
        None => None,
        Some(ids) => Some(
            ids.iter()
                .map(|&v| id("allowed_token_ids", v))
                .collect::<Result<Vec<u32>, _>>()?,
        ),
    };
    let min_tokens = match f.min_tokens {
        None => 0,
        Some(m) => usize::try_from(m).map_err(|_| {
            ApiError::invalid_param("min_tokens", format!("min_tokens must be >= 0, got {m}"))
        })?,
    };
    Ok(SamplingParams {
        logit_bias,
        allowed_token_ids,
        bad_words: f.bad_words.clone().unwrap_or_default(),
        min_tokens,
        include_stop_str_in_output: f.include_stop_str_in_output.unwrap_or(false),
        skip_special_tokens: f.skip_special_tokens.unwrap_or(true),
        spaces_between_special_tokens: f.spaces_between_special_tokens.unwrap_or(true),
        ..Default::default()
    })
}

/// `prompt_logprobs`: a count of alternatives, refused with streaming (as
/// vLLM does: they come with the first output, which a stream sends before).
fn prompt_logprobs(f: &SamplingFields) -> Result<Option<usize>, ApiError> {
    let Some(v) = f.prompt_logprobs else {
        return Ok(None);
    };
    if f.stream {
        return Err(ApiError::invalid_param(
            "prompt_logprobs",
            "prompt_logprobs are not available with stream: true",
        ));
    }
    logprobs_count("prompt_logprobs", v).map(Some)
}

/// Checks a logprobs count (`logprobs` or `top_logprobs`).
pub fn logprobs_count(name: &str, v: i64) -> Result<usize, ApiError> {
    if (0..=MAX_LOGPROBS as i64).contains(&v) {
        Ok(v as usize)
    } else {
        Err(ApiError::invalid_param(
            name,
            format!("{name} must be between 0 and {MAX_LOGPROBS}, got {v}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> SamplingFields {
        serde_json::from_str(json).unwrap()
    }

    fn ctx(max_model_len: usize) -> SeqLimits {
        SeqLimits {
            max_model_len,
            kv_cache_tokens: None,
        }
    }

    #[test]
    fn defaults_follow_openai_and_max_tokens_fills_the_context() {
        let p = ChoiceParams::from_fields(&fields("{}")).unwrap();
        assert_eq!(p.sampling.temperature, 1.0);
        assert_eq!(p.n, 1);
        assert_eq!(p.for_prompt(10, ctx(100), 0).unwrap().max_tokens, 90);
        assert_eq!(
            p.for_prompt(10, ctx(8192), 0).unwrap().max_tokens,
            DEFAULT_MAX_TOKENS_CAP
        );
        assert!(p.for_prompt(100, ctx(100), 0).is_err());
    }

    #[test]
    fn out_of_range_values_name_their_parameter() {
        for (json, param) in [
            (r#"{"temperature": -0.5}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_p": 1.5}"#, "top_p"),
            (r#"{"max_tokens": 0}"#, "max_tokens"),
            (r#"{"n": 0}"#, "n"),
            (r#"{"min_p": 2}"#, "min_p"),
            (r#"{"stop": ""}"#, "stop"),
            (r#"{"logit_bias": {"x": 1}}"#, "logit_bias"),
            (r#"{"logit_bias": {"5": 101}}"#, "logit_bias"),
            (r#"{"logit_bias": {"5": "a"}}"#, "logit_bias"),
            (r#"{"allowed_token_ids": [-1]}"#, "allowed_token_ids"),
            (r#"{"allowed_token_ids": []}"#, "allowed_token_ids"),
            (r#"{"bad_words": [""]}"#, "bad_words"),
            (r#"{"min_tokens": -1}"#, "min_tokens"),
        ] {
            let e = ChoiceParams::from_fields(&fields(json)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{json}");
        }
    }

    #[test]
    fn seeds_step_per_choice_and_explicit_max_tokens_must_fit() {
        let p = ChoiceParams::from_fields(&fields(r#"{"seed": 7, "max_tokens": 50}"#)).unwrap();
        assert_eq!(p.for_prompt(10, ctx(100), 2).unwrap().seed, Some(9));
        assert_eq!(p.for_prompt(10, ctx(100), 0).unwrap().max_tokens, 50);
        assert!(p.for_prompt(60, ctx(100), 0).is_err());
    }

    #[test]
    fn default_max_tokens_fits_the_kv_cache_and_refusals_name_the_parameter() {
        // 22 blocks of 16: 352 slots.
        let small = SeqLimits {
            max_model_len: 2048,
            kv_cache_tokens: Some(352),
        };
        let p = ChoiceParams::from_fields(&fields("{}")).unwrap();
        // prompt + max_tokens - 1 <= 352.
        assert_eq!(p.for_prompt(40, small, 0).unwrap().max_tokens, 313);
        assert_eq!(p.for_prompt(352, small, 0).unwrap().max_tokens, 1);
        let e = p.for_prompt(353, small, 0).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        assert!(e.message.contains("352"), "{}", e.message);
        let chat = ChoiceParams {
            prompt_param: "messages",
            ..p.clone()
        };
        let e = chat.for_prompt(400, small, 0).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));

        let p = ChoiceParams::from_fields(&fields(r#"{"max_completion_tokens": 314}"#)).unwrap();
        let e = p.for_prompt(40, small, 0).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_completion_tokens"));
        assert!(e.message.contains("at most 313"), "{}", e.message);
        let p = ChoiceParams::from_fields(&fields(r#"{"max_tokens": 313}"#)).unwrap();
        assert_eq!(p.for_prompt(40, small, 0).unwrap().max_tokens, 313);
    }

    #[test]
    fn token_rules_reach_the_sampling_params() {
        let p = ChoiceParams::from_fields(&fields(
            r#"{"logit_bias": {"7": 100, " 3": -2.5}, "allowed_token_ids": [1, 2],
                "bad_words": ["x"], "min_tokens": 4, "include_stop_str_in_output": true,
                "skip_special_tokens": false, "return_tokens_as_token_ids": true}"#,
        ))
        .unwrap();
        let s = &p.sampling;
        let mut bias = s.logit_bias.clone();
        bias.sort_by_key(|e| e.0);
        assert_eq!(bias, vec![(3, -2.5), (7, 100.0)]);
        assert_eq!(s.allowed_token_ids, Some(vec![1, 2]));
        assert_eq!(s.bad_words, vec!["x".to_string()]);
        assert!(s.include_stop_str_in_output && !s.skip_special_tokens);
        assert!(p.tokens_as_ids);
        assert_eq!(p.for_prompt(10, ctx(100), 0).unwrap().min_tokens, 4);
        let p =
            ChoiceParams::from_fields(&fields(r#"{"min_tokens": 20, "max_tokens": 10}"#)).unwrap();
        let e = p.for_prompt(10, ctx(100), 0).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("min_tokens"));
    }

    #[test]
    fn sequences_per_request_are_capped() {
        assert!(check_num_seqs(2, 128, 256).is_ok());
        let e = check_num_seqs(500, 128, 256).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        assert!(
            e.message.contains("64000") && e.message.contains("256"),
            "{}",
            e.message
        );
        let e = check_num_seqs(300, 1, 256).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }
}
