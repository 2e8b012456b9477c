//! Per-layer FP8 KV cache scales a checkpoint may carry (vLLM /
//! compressed-tensors naming): `model.layers.N.self_attn.k_scale` and
//! `v_scale`, or one `kv_scale` for both. Each is a single positive, finite
//! value (`cache value = fp8 * scale`); a layer without them keeps 1.0, as
//! vLLM does. Anything else is an error naming the tensor, never a silent
//! default.

use crate::loader::WeightSource;
use crate::{ModelError, Result};

/// The `(k_scale, v_scale)` of each of `layers` layers, or `None` when the
/// checkpoint has no scale tensor at all.
pub fn kv_cache_scales(w: &dyn WeightSource, layers: usize) -> Result<Option<Vec<(f32, f32)>>> {
    let mut any = false;
    let mut out = Vec::with_capacity(layers);
    for i in 0..layers {
        let base = format!("model.layers.{i}.self_attn");
        let both = scalar(w, &format!("{base}.kv_scale"))?;
        let k = scalar(w, &format!("{base}.k_scale"))?.or(both);
        let v = scalar(w, &format!("{base}.v_scale"))?.or(both);
        any |= k.is_some() || v.is_some();
        out.push((k.unwrap_or(1.0), v.unwrap_or(1.0)));
    }
    Ok(any.then_some(out))
}

/// The one value of tensor `name`, if the source has it.
fn scalar(w: &dyn WeightSource, name: &str) -> Result<Option<f32>> {
    if !w.contains(name) {
        return Ok(None);
    }
    let t = w.get(name)?;
    let shape = t.shape.clone();
    let v = t.into_f32_vec();
    if v.len() != 1 {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            got: shape,
            expected: vec![1],
        });
    }
    pagoda_kernels::kv_dtype::check_kv_scale(name, v[0]).map_err(ModelError::Config)?;
    Ok(Some(v[0]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_kernels::HostTensor;
    use std::collections::HashMap;

    struct Map(HashMap<String, Vec<f32>>);

    impl WeightSource for Map {
        fn get(&self, name: &str) -> Result<HostTensor> {
            let v = self
                .0
                .get(name)
                .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
            Ok(HostTensor::f32(vec![v.len()], v.clone()))
        }
        fn contains(&self, name: &str) -> bool {
            self.0.contains_key(name)
        }
    }

    fn src(entries: &[(&str, Vec<f32>)]) -> Map {
        Map(entries
            .iter()
            .map(|(n, v)| (n.to_string(), v.clone()))
            .collect())
    }

    #[test]
    fn reads_k_v_and_shared_scales_and_defaults_the_rest() {
        assert!(kv_cache_scales(&src(&[]), 2).unwrap().is_none());
        let w = src(&[
            ("model.layers.0.self_attn.k_scale", vec![0.5]),
            ("model.layers.0.self_attn.v_scale", vec![0.25]),
            ("model.layers.2.self_attn.kv_scale", vec![2.0]),
        ]);
        assert_eq!(
            kv_cache_scales(&w, 3).unwrap().unwrap(),
            vec![(0.5, 0.25), (1.0, 1.0), (2.0, 2.0)]
        );
    }

    #[test]
    fn bad_scales_are_errors_naming_the_tensor() {
        for bad in [vec![0.0], vec![-1.0], vec![f32::NAN], vec![1.0, 2.0]] {
            let w = src(&[("model.layers.1.self_attn.v_scale", bad)]);
            let e = kv_cache_scales(&w, 2).unwrap_err().to_string();
            assert!(e.contains("model.layers.1.self_attn.v_scale"), "{e}");
        }
    }
}
