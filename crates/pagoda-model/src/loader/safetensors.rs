//! Hugging Face safetensors checkpoints: `model.safetensors`, or
//! `model.safetensors.index.json` and the shards it names.
//!
//! Every shard is memory-mapped once and its header parsed and validated at
//! open (the safetensors crate checks that offsets are contiguous, sizes match
//! shape x dtype and the data ends exactly at the end of the file), so a
//! corrupt file fails at open with its path, not half-way through loading.
//! `get` copies one tensor out of the map into an owned [`HostTensor`]
//! (F32, F16 or BF16, as stored; other dtypes are an error naming the tensor
//! and its dtype). An FP8 checkpoint's linear weights (F8_E4M3, with a
//! `weight_scale` beside each, per channel or per tensor: compressed-tensors'
//! float-quantized 8-bit scheme) come through `get_fp8` as stored, codes and
//! scales, never requantized.
//!
//! Invariants: the index's `weight_map` is the list of tensors of a sharded
//! checkpoint, and every entry is checked at open to exist in the shard it
//! names; shard names are plain file names inside the directory. Names are
//! Hugging Face's; a checkpoint saved without the `model.` prefix (old OPT
//! exports: `decoder.layers.0...`) is still found under the prefixed name.
//!
//! Costs: open maps the files (no reads beyond the headers); `get` reads
//! and converts the tensor's bytes once, in parallel for large tensors. The
//! maps stay open for the source's lifetime; the files must not be modified
//! while it is alive.

use super::{hf_config, TensorInfo, WeightSource};
use crate::{ModelConfig, ModelError, Result};
use ::safetensors::tensor::{Dtype, Metadata};
use ::safetensors::SafeTensors;
use half::{bf16, f16};
use memmap2::Mmap;
use pagoda_kernels::host::{HostData, HostTensor};
use rayon::prelude::*;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

/// The single-file checkpoint name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The sharded checkpoint index name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Bytes above which a tensor is converted in parallel.
const PARALLEL_BYTES: usize = 1 << 20;

/// One mapped safetensors file and its parsed header.
struct Shard {
    path: PathBuf,
    mmap: Mmap,
    /// Offset of the data section (8 + header length).
    data_start: usize,
    metadata: Metadata,
}

impl Shard {
    fn open(path: &Path) -> Result<Shard> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this source; the module
        // contract is that checkpoint files are not modified while loaded.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| {
            ModelError::Safetensors(format!("{}: corrupt file: {e}", path.display()))
        })?;
        Ok(Shard {
            path: path.to_path_buf(),
            mmap,
            data_start: 8 + header_len,
            metadata,
        })
    }
}

/// A [`WeightSource`] over a safetensors checkpoint (one file or shards).
pub struct SafetensorsSource {
    shards: Vec<Shard>,
    /// Tensor name -> index into `shards`.
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for SafetensorsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsSource")
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("num_tensors", &self.index.len())
            .finish()
    }
}

impl SafetensorsSource {
    /// Opens the checkpoint in `dir`: the index and its shards when
    /// `model.safetensors.index.json` exists, else `model.safetensors`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        if index_path.is_file() {
            return Self::open_index(&index_path);
        }
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            return Self::open_file(&single);
        }
        Err(ModelError::Safetensors(format!(
            "{}: neither {SINGLE_FILE} nor {INDEX_FILE} found",
            dir.display()
        )))
    }

    /// Opens one safetensors file holding every tensor.
    pub fn open_file(path: &Path) -> Result<Self> {
        let shard = Shard::open(path)?;
        let index = shard
            .metadata
            .offset_keys()
            .into_iter()
            .map(|name| (name, 0))
            .collect();
        Ok(SafetensorsSource {
            shards: vec![shard],
            index,
        })
    }

    /// Opens a sharded checkpoint from its `model.safetensors.index.json`.
    pub fn open_index(index_path: &Path) -> Result<Self> {
        let bad =
            |what: String| ModelError::Safetensors(format!("{}: {what}", index_path.display()));
        let text = std::fs::read_to_string(index_path).map_err(|source| ModelError::Io {
            path: index_path.to_path_buf(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let weight_map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
        let dir = index_path.parent().unwrap_or_else(|| Path::new("."));

        // Shards in file-name order, each opened once.
        let mut shard_names: Vec<&str> = Vec::new();
        for (tensor, file) in weight_map {
            let file = file
                .as_str()
                .ok_or_else(|| bad(format!("weight_map[{tensor:?}] is not a file name")))?;
            let plain = Path::new(file)
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
            if !plain {
                return Err(bad(format!(
                    "shard {file:?} is not a file name inside the checkpoint directory"
                )));
            }
            shard_names.push(file);
        }
        shard_names.sort_unstable();
        shard_names.dedup();
        let shards = shard_names
            .iter()
            .map(|name| Shard::open(&dir.join(name)))
            .collect::<Result<Vec<_>>>()?;

        let mut index = HashMap::with_capacity(weight_map.len());
        for (tensor, file) in weight_map {
            let file = file.as_str().unwrap_or_default();
            let i = shard_names
                .binary_search(&file)
                .map_err(|_| bad(format!("weight_map[{tensor:?}] names an unknown shard")))?;
            if shards[i].metadata.info(tensor).is_none() {
                return Err(bad(format!(
                    "weight_map puts {tensor:?} in {file}, which does not contain it"
                )));
            }
            index.insert(tensor.clone(), i);
        }
        Ok(SafetensorsSource { shards, index })
    }

    /// The stored name for Hugging Face name `name` (see the module doc).
    fn resolve<'n>(&self, name: &'n str) -> Option<(&'n str, usize)> {
        if let Some(&i) = self.index.get(name) {
            return Some((name, i));
        }
        let bare = name.strip_prefix("model.")?;
        self.index.get(bare).map(|&i| (bare, i))
    }

    /// Number of tensors in the checkpoint.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The files the tensors come from.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }
}

impl WeightSource for SafetensorsSource {
    fn tensor_infos(&self) -> Vec<TensorInfo> {
        let mut out = Vec::with_capacity(self.index.len());
        for (i, shard) in self.shards.iter().enumerate() {
            for name in shard.metadata.offset_keys() {
                if self.index.get(&name) != Some(&i) {
                    continue;
                }
                if let Some(info) = shard.metadata.info(&name) {
                    out.push(TensorInfo {
                        shape: info.shape.clone(),
                        dtype: info.dtype.to_string().to_ascii_lowercase(),
                        name,
                    });
                }
            }
        }
        out
    }

    fn get_fp8(&self, name: &str) -> Result<Option<pagoda_kernels::Fp8Matrix>> {
        let Some((stored, i)) = self.resolve(name) else {
            return Ok(None);
        };
        let shard = &self.shards[i];
        match shard.metadata.info(stored) {
            Some(info) if info.dtype == Dtype::F8_E4M3 => {}
            _ => return Ok(None),
        }
        let (info, bytes) = self.raw(name)?;
        let [rows, cols] = info.shape[..] else {
            return Err(ModelError::Safetensors(format!(
                "{name}: an FP8 weight must be a matrix, got shape {:?}",
                info.shape
            )));
        };
        let scale_name = format!("{}_scale", name);
        if !self.contains(&scale_name) {
            return Err(ModelError::Safetensors(format!(
                "{name} is FP8 (F8_E4M3) but {scale_name} is missing"
            )));
        }
        let scale = self.get(&scale_name)?;
        let values = scale.to_f32_vec();
        // One scale per output channel ([rows] or [rows, 1]), or one for the
        // whole tensor ([], [1] or [1, 1]), repeated for every row.
        let scales = match (values.len(), scale.shape.as_slice()) {
            (n, [r] | [r, 1]) if n == rows && *r == rows => values,
            (1, [] | [1] | [1, 1]) => vec![values[0]; rows],
            _ => {
                return Err(ModelError::Config(format!(
                    "{scale_name}: shape {:?} is not per channel ([{rows}] or [{rows}, 1]) or per \
                     tensor; block-wise FP8 scales are not supported",
                    scale.shape
                )))
            }
        };
        Ok(Some(pagoda_kernels::Fp8Matrix::new(
            rows,
            cols,
            bytes.to_vec(),
            scales,
        )?))
    }

    fn get(&self, name: &str) -> Result<HostTensor> {
        let (info, bytes) = self.raw(name)?;
        let stored = self.resolve(name).map_or(name, |(s, _)| s);
        let path = self.resolve(name).map(|(_, i)| &self.shards[i].path);
        let data = match info.dtype {
            Dtype::F32 => HostData::F32(decode(bytes, f32::from_le_bytes)),
            Dtype::F16 => HostData::F16(decode(bytes, |b| f16::from_bits(u16::from_le_bytes(b)))),
            Dtype::BF16 => {
                HostData::BF16(decode(bytes, |b| bf16::from_bits(u16::from_le_bytes(b))))
            }
            other => {
                return Err(ModelError::Safetensors(format!(
                    "{}: tensor {stored:?} has dtype {other}; only F32, F16 and BF16 are supported \
                     (F8_E4M3 only for the linear weights of an FP8 checkpoint)",
                    path.map_or_else(String::new, |p| p.display().to_string())
                )))
            }
        };
        Ok(HostTensor {
            shape: info.shape.clone(),
            data,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.resolve(name).is_some()
    }
}

impl SafetensorsSource {
    /// The header entry and the bytes of tensor `name`.
    fn raw(&self, name: &str) -> Result<(&::safetensors::tensor::TensorInfo, &[u8])> {
        let (stored, i) = self
            .resolve(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let shard = &self.shards[i];
        let info = shard
            .metadata
            .info(stored)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let (start, end) = info.data_offsets;
        let bytes = shard
            .mmap
            .get(shard.data_start + start..shard.data_start + end)
            .ok_or_else(|| {
                ModelError::Safetensors(format!(
                    "{}: tensor {stored:?} lies outside the file",
                    shard.path.display()
                ))
            })?;
        Ok((info, bytes))
    }
}

/// Little-endian elements of `N` bytes each (the header check guarantees
/// `bytes.len()` is a multiple of `N`).
fn decode<T: Send, const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> T + Sync) -> Vec<T> {
    let one = |c: &[u8]| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        f(a)
    };
    if bytes.len() >= PARALLEL_BYTES {
        bytes.par_chunks_exact(N).map(one).collect()
    } else {
        bytes.chunks_exact(N).map(one).collect()
    }
}

/// Opens a Hugging Face model directory: its config (with
/// `generation_config.json` merged in) and its safetensors weights.
pub fn open_hf_dir(dir: &Path) -> Result<(ModelConfig, SafetensorsSource)> {
    let config = hf_config::load_hf_config(dir)?;
    let source = SafetensorsSource::open_dir(dir)?;
    Ok((config, source))
}

#[cfg(test)]
#[path = "safetensors_tests.rs"]
mod tests;
