//! Tests of the safetensors source: files are written in a temporary
//! directory with the safetensors crate's own serializer (or by hand, for the
//! corrupt ones), and read back through [`SafetensorsSource`].

use super::*;
use ::safetensors::tensor::TensorView;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty directory under the system temp dir; removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("pagoda-st-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tensor to write: name, dtype, shape, raw little-endian bytes.
type Raw = (&'static str, Dtype, Vec<usize>, Vec<u8>);

fn write(path: &Path, tensors: &[Raw]) {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    ::safetensors::serialize_to_file(views, None, path).unwrap();
}

fn values(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (i as f32 - n as f32 / 2.0) * scale)
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn safetensors_err(r: Result<SafetensorsSource>) -> String {
    match r {
        Err(ModelError::Safetensors(msg)) => msg,
        Err(other) => panic!("expected a safetensors error, got {other}"),
        Ok(_) => panic!("expected a safetensors error, got a source"),
    }
}

#[test]
fn single_file_f32_f16_bf16_round_trip() {
    let dir = TempDir::new("single");
    let a = values(6, 0.37);
    let b = values(8, 0.011);
    let c = values(5, 3.1);
    let b16: Vec<f16> = b.iter().map(|&x| f16::from_f32(x)).collect();
    let c16: Vec<bf16> = c.iter().map(|&x| bf16::from_f32(x)).collect();
    write(
        &dir.0.join(SINGLE_FILE),
        &[
            ("model.a.weight", Dtype::F32, vec![2, 3], f32_bytes(&a)),
            (
                "model.b.weight",
                Dtype::F16,
                vec![8],
                b16.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            (
                "lm_head.weight",
                Dtype::BF16,
                vec![5, 1],
                c16.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
        ],
    );
    let src = SafetensorsSource::open_dir(&dir.0).unwrap();
    assert_eq!(src.len(), 3);

    let t = src.get("model.a.weight").unwrap();
    assert_eq!(t.shape, vec![2, 3]);
    assert_eq!(t.data, HostData::F32(a));
    let t = src.get("model.b.weight").unwrap();
    assert_eq!(t.shape, vec![8]);
    assert_eq!(t.data, HostData::F16(b16));
    let t = src.get("lm_head.weight").unwrap();
    assert_eq!(t.shape, vec![5, 1]);
    assert_eq!(t.data, HostData::BF16(c16));

    assert!(src.contains("model.a.weight"));
    assert!(!src.contains("model.z.weight"));
    assert!(
        matches!(src.get("model.z.weight"), Err(ModelError::MissingTensor(n)) if n == "model.z.weight")
    );

    let mut infos = src.tensor_infos();
    infos.sort_by(|x, y| x.name.cmp(&y.name));
    let summary: Vec<(&str, &str, Vec<usize>)> = infos
        .iter()
        .map(|i| (i.name.as_str(), i.dtype.as_str(), i.shape.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("lm_head.weight", "bf16", vec![5, 1]),
            ("model.a.weight", "f32", vec![2, 3]),
            ("model.b.weight", "f16", vec![8]),
        ]
    );
}

#[test]
fn large_tensor_is_converted_in_parallel_correctly() {
    let dir = TempDir::new("large");
    let n = PARALLEL_BYTES / 2 + 3; // f16: above the parallel threshold, odd length
    let v = values(n, 1e-4);
    let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    write(
        &dir.0.join(SINGLE_FILE),
        &[(
            "w",
            Dtype::F16,
            vec![n],
            h.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )],
    );
    let src = SafetensorsSource::open_dir(&dir.0).unwrap();
    assert_eq!(src.get("w").unwrap().data, HostData::F16(h));
}

#[test]
fn names_without_model_prefix_are_found_under_the_prefixed_name() {
    let dir = TempDir::new("prefix");
    let v = values(4, 1.0);
    write(
        &dir.0.join(SINGLE_FILE),
        &[(
            "decoder.embed_tokens.weight",
            Dtype::F32,
            vec![2, 2],
            f32_bytes(&v),
        )],
    );
    let src = SafetensorsSource::open_dir(&dir.0).unwrap();
    assert!(src.contains("model.decoder.embed_tokens.weight"));
    assert_eq!(
        src.get("model.decoder.embed_tokens.weight")
            .unwrap()
            .to_f32_vec(),
        v
    );
}

fn write_index(dir: &Path, entries: &[(&str, &str)]) {
    let map: serde_json::Map<String, serde_json::Value> = entries
        .iter()
        .map(|(t, f)| (t.to_string(), serde_json::Value::from(*f)))
        .collect();
    let json = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join(INDEX_FILE), json.to_string()).unwrap();
}

#[test]
fn sharded_checkpoint_reads_every_shard() {
    let dir = TempDir::new("sharded");
    let (x, y, z) = (values(4, 0.5), values(3, 0.25), values(2, 2.0));
    let zb: Vec<bf16> = z.iter().map(|&v| bf16::from_f32(v)).collect();
    write(
        &dir.0.join("model-00001-of-00002.safetensors"),
        &[
            ("model.x", Dtype::F32, vec![4], f32_bytes(&x)),
            ("model.y", Dtype::F32, vec![3], f32_bytes(&y)),
        ],
    );
    write(
        &dir.0.join("model-00002-of-00002.safetensors"),
        &[(
            "model.z",
            Dtype::BF16,
            vec![2],
            zb.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )],
    );
    write_index(
        &dir.0,
        &[
            ("model.x", "model-00001-of-00002.safetensors"),
            ("model.y", "model-00001-of-00002.safetensors"),
            ("model.z", "model-00002-of-00002.safetensors"),
        ],
    );
    // A stray single file must not be preferred over the index.
    write(
        &dir.0.join(SINGLE_FILE),
        &[("model.other", Dtype::F32, vec![1], f32_bytes(&[1.0]))],
    );

    let src = SafetensorsSource::open_dir(&dir.0).unwrap();
    assert_eq!(src.len(), 3);
    assert_eq!(src.files().count(), 2);
    assert_eq!(src.get("model.x").unwrap().to_f32_vec(), x);
    assert_eq!(src.get("model.y").unwrap().to_f32_vec(), y);
    assert_eq!(src.get("model.z").unwrap().data, HostData::BF16(zb));
    assert!(!src.contains("model.other"));
    assert_eq!(src.tensor_infos().len(), 3);
}

#[test]
fn index_errors_name_the_index_and_the_problem() {
    let dir = TempDir::new("badindex");
    write(
        &dir.0.join("a.safetensors"),
        &[("model.x", Dtype::F32, vec![1], f32_bytes(&[1.0]))],
    );
    // Tensor mapped to a shard that lacks it.
    write_index(
        &dir.0,
        &[("model.x", "a.safetensors"), ("model.y", "a.safetensors")],
    );
    let msg = safetensors_err(SafetensorsSource::open_dir(&dir.0));
    assert!(msg.contains(INDEX_FILE) && msg.contains("model.y"), "{msg}");

    // Shard file missing: an I/O error naming the shard.
    write_index(&dir.0, &[("model.x", "missing.safetensors")]);
    match SafetensorsSource::open_dir(&dir.0) {
        Err(ModelError::Io { path, .. }) => assert!(path.ends_with("missing.safetensors")),
        other => panic!("expected an I/O error, got {other:?}"),
    }

    // Shard outside the directory.
    write_index(&dir.0, &[("model.x", "../a.safetensors")]);
    assert!(safetensors_err(SafetensorsSource::open_dir(&dir.0)).contains("../a.safetensors"));

    // Not JSON / no weight_map.
    std::fs::write(dir.0.join(INDEX_FILE), "{oops").unwrap();
    assert!(safetensors_err(SafetensorsSource::open_dir(&dir.0)).contains("not valid JSON"));
    std::fs::write(dir.0.join(INDEX_FILE), "{}").unwrap();
    assert!(safetensors_err(SafetensorsSource::open_dir(&dir.0)).contains("weight_map"));
}

#[test]
fn empty_directory_names_both_expected_files() {
    let dir = TempDir::new("empty");
    let msg = safetensors_err(SafetensorsSource::open_dir(&dir.0));
    assert!(
        msg.contains(SINGLE_FILE) && msg.contains(INDEX_FILE),
        "{msg}"
    );
}

#[test]
fn unsupported_dtype_names_tensor_and_dtype() {
    let dir = TempDir::new("dtype");
    let ids: Vec<u8> = [1i64, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    write(
        &dir.0.join(SINGLE_FILE),
        &[
            ("model.ok", Dtype::F32, vec![1], f32_bytes(&[0.5])),
            ("model.position_ids", Dtype::I64, vec![3], ids),
        ],
    );
    let src = SafetensorsSource::open_dir(&dir.0).unwrap();
    assert_eq!(src.get("model.ok").unwrap().to_f32_vec(), vec![0.5]);
    match src.get("model.position_ids") {
        Err(ModelError::Safetensors(msg)) => {
            assert!(
                msg.contains("model.position_ids") && msg.contains("I64"),
                "{msg}"
            )
        }
        other => panic!("expected a dtype error, got {other:?}"),
    }
}

/// A file with header text `header` and `data_len` zero bytes of data.
fn raw_file(header: &str, data_len: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(std::iter::repeat_n(0u8, data_len));
    out
}

#[test]
fn corrupt_files_fail_at_open_naming_the_file() {
    let dir = TempDir::new("corrupt");
    let path = dir.0.join(SINGLE_FILE);
    let good_header = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    // Sanity: the hand-written format is right when intact.
    std::fs::write(&path, raw_file(good_header, 8)).unwrap();
    let src = SafetensorsSource::open_dir(&dir.0).unwrap();
    assert_eq!(src.get("w").unwrap().to_f32_vec(), vec![0.0, 0.0]);
    drop(src);

    let mut truncated_header = raw_file(good_header, 8);
    truncated_header.truncate(8 + good_header.len() / 2);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty file", Vec::new()),
        ("shorter than the length prefix", vec![1, 2, 3]),
        ("truncated header", truncated_header),
        (
            "bad JSON",
            raw_file(r#"{"w":{"dtype":"F32","shape":[2],"#, 8),
        ),
        (
            "data offsets past the end",
            raw_file(
                r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}}"#,
                8,
            ),
        ),
        (
            "size disagrees with shape",
            raw_file(
                r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                8,
            ),
        ),
        ("truncated data", raw_file(good_header, 4)),
        (
            "unknown dtype",
            raw_file(
                r#"{"w":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}}"#,
                8,
            ),
        ),
    ];
    for (what, bytes) in cases {
        std::fs::write(&path, bytes).unwrap();
        let msg = safetensors_err(SafetensorsSource::open_dir(&dir.0));
        assert!(msg.contains(&path.display().to_string()), "{what}: {msg}");
        assert!(msg.contains("corrupt"), "{what}: {msg}");
    }
}

#[test]
fn open_hf_dir_returns_config_and_weights() {
    let dir = TempDir::new("hfdir");
    std::fs::write(
        dir.0.join("config.json"),
        r#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 4, "vocab_size": 3, "eos_token_id": 2}"#,
    )
    .unwrap();
    std::fs::write(
        dir.0.join("generation_config.json"),
        r#"{"eos_token_id": [2, 1]}"#,
    )
    .unwrap();
    let emb = values(24, 0.1);
    write(
        &dir.0.join(SINGLE_FILE),
        &[(
            "model.embed_tokens.weight",
            Dtype::F32,
            vec![3, 8],
            f32_bytes(&emb),
        )],
    );
    let (cfg, src) = open_hf_dir(&dir.0).unwrap();
    assert_eq!(cfg.architecture, crate::Architecture::Qwen3);
    assert_eq!(cfg.eos_token_ids, vec![2, 1]);
    assert_eq!(
        src.get("model.embed_tokens.weight").unwrap().to_f32_vec(),
        emb
    );
}
