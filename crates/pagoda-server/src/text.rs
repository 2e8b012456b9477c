//! Tokenization, chat templating and detokenization off the async worker
//! threads.
//!
//! Encoding a few MiB of text takes seconds; on an async worker it would stall
//! every connection that worker serves (`/health` included). [`TextWork::run`]
//! runs such work on tokio's blocking pool, at most [`TextWork::permits`]
//! jobs at a time (a semaphore, so a flood of large requests queues instead
//! of starting hundreds of threads; a job keeps its permit until it ends even
//! if its client went away).
//!
//! Prompts too long for the model are refused before they are tokenized:
//! when the tokenizer bounds the bytes one token can stand for (`k`, see
//! [`Tokenizer::max_bytes_per_token`]), a text of more than
//! `k * max_model_len` bytes has more than `max_model_len` tokens, so
//! [`TextWork::check_len`] refuses it from its length alone. The bound never
//! refuses a text that fits.

use crate::error::ApiError;
use pagoda_model::tokenizer::Tokenizer;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The tokenizer, with a bounded lane to the blocking pool.
pub struct TextWork {
    tokenizer: Arc<Tokenizer>,
    permits: Arc<Semaphore>,
    num_permits: usize,
    /// Texts longer than this many bytes cannot fit `max_model_len` tokens.
    max_text_bytes: Option<usize>,
    max_model_len: usize,
}

impl TextWork {
    /// `max_model_len` bounds the texts [`Self::check_len`] lets through.
    pub fn new(tokenizer: Arc<Tokenizer>, max_model_len: usize) -> Self {
        let num_permits = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 8);
        let max_text_bytes = tokenizer
            .max_bytes_per_token()
            .map(|k| k.saturating_mul(max_model_len));
        TextWork {
            tokenizer,
            permits: Arc::new(Semaphore::new(num_permits)),
            num_permits,
            max_text_bytes,
            max_model_len,
        }
    }

    /// Jobs that may run at once.
    pub fn permits(&self) -> usize {
        self.num_permits
    }

    /// Bytes of text beyond which a prompt is refused untokenized.
    pub fn max_text_bytes(&self) -> Option<usize> {
        self.max_text_bytes
    }

    /// Runs `job` with the tokenizer on the blocking pool.
    pub async fn run<T, F>(&self, job: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Tokenizer, &LenCheck) -> Result<T, ApiError> + Send + 'static,
    {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::internal("the tokenizer pool is closed"))?;
        let tokenizer = self.tokenizer.clone();
        let check = LenCheck {
            max_text_bytes: self.max_text_bytes,
            max_model_len: self.max_model_len,
        };
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            job(&tokenizer, &check)
        })
        .await
        .map_err(|e| ApiError::internal(format!("a tokenizer job failed: {e}")))?
    }

    /// Refuses a text of `len` bytes that cannot fit the model's context.
    pub fn check_len(&self, len: usize, param: &str) -> Result<(), ApiError> {
        LenCheck {
            max_text_bytes: self.max_text_bytes,
            max_model_len: self.max_model_len,
        }
        .check(len, param)
    }
}

/// The length bound, for use inside a job (e.g. on a rendered chat).
#[derive(Debug, Clone, Copy)]
pub struct LenCheck {
    max_text_bytes: Option<usize>,
    max_model_len: usize,
}

impl LenCheck {
    /// 400 (`context_length_exceeded`, naming `param`) for a text of `len`
    /// bytes that has more than `max_model_len` tokens whatever they are.
    pub fn check(&self, len: usize, param: &str) -> Result<(), ApiError> {
        match self.max_text_bytes {
            Some(limit) if len > limit => Err(ApiError::invalid_param(
                param,
                format!(
                    "the prompt has {len} bytes of text, more than this model's maximum \
                     context length of {} tokens can hold (at most {limit} bytes)",
                    self.max_model_len
                ),
            )
            .with_code("context_length_exceeded")),
            _ => Ok(()),
        }
    }
}
