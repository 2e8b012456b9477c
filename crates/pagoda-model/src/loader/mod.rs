//! Weight sources: where a model's tensors come from.
//!
//! Every source answers by Hugging Face tensor name
//! (`model.layers.0.self_attn.q_proj.weight`), so model files know one naming.
//! GGUF files are mapped to those names (and llama's Q/K row permutation is
//! undone) inside the GGUF source.

use crate::Result;
use pagoda_kernels::HostTensor;

pub mod dummy;
pub mod gguf;
pub mod gguf_check;
pub mod gguf_moe;
pub mod hf_config;
pub mod kv_scales;
pub mod quant_config;
pub mod safetensors;
pub mod safetensors_writer;

/// What `pagoda info` shows of one stored tensor.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TensorInfo {
    /// Name in the source's own naming (GGUF names for GGUF files).
    pub name: String,
    /// Outermost dimension first.
    pub shape: Vec<usize>,
    /// Storage type as the file has it: f32, f16, bf16, q4_1, q8_0, ...
    pub dtype: String,
}

/// A source of named host tensors.
pub trait WeightSource: Send + Sync {
    /// Every tensor the source holds, as stored.
    fn tensor_infos(&self) -> Vec<TensorInfo> {
        Vec::new()
    }
    /// The tensor called `name` (Hugging Face naming), dequantized to f32/f16/bf16.
    fn get(&self, name: &str) -> Result<HostTensor>;
    /// Like [`WeightSource::get`], but a quantized tensor comes as its blocks
    /// ([`pagoda_kernels::HostData::Quant`]), for backends that compute on
    /// them; sources without quantized tensors answer as `get`.
    fn get_stored(&self, name: &str) -> Result<HostTensor> {
        self.get(name)
    }
    /// Whether the source has a tensor called `name`.
    fn contains(&self, name: &str) -> bool;
    /// The linear weight `name` as FP8 codes and per-channel scales when
    /// the checkpoint stores it so (an FP8 checkpoint), `None` otherwise.
    fn get_fp8(&self, name: &str) -> Result<Option<pagoda_kernels::Fp8Matrix>> {
        let _ = name;
        Ok(None)
    }
}
