//! vLLM's `prompt_logprobs` shape: a list with one entry per prompt token,
//! `null` for the first (nothing precedes it), else an object from token
//! id (as a string) to `{"logprob", "rank", "decoded_token"}`: the prompt
//! token itself first, then the most likely alternatives not already
//! listed. On a completion choice; at the top of a chat response.

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

/// One token's entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptTokenLogprob {
    /// `-inf` is written as -9999.0, as vLLM does (JSON has no infinity).
    pub logprob: f32,
    /// 1 for the most likely token.
    pub rank: u32,
    pub decoded_token: String,
}

/// The whole list; entries keep their order when written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptLogprobs(pub Vec<Option<Vec<(u32, PromptTokenLogprob)>>>);

impl Serialize for PromptLogprobs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for e in &self.0 {
            seq.serialize_element(&e.as_deref().map(Entry))?;
        }
        seq.end()
    }
}

struct Entry<'a>(&'a [(u32, PromptTokenLogprob)]);

impl Serialize for Entry<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (id, lp) in self.0 {
            m.serialize_entry(&id.to_string(), lp)?;
        }
        m.end()
    }
}
