//! The reader against files built by the writer (round trip, and one
//! corruption per validation rule) and against the real SmolLM2 file, whose
//! reference values come from the Python `gguf` package
//! (scripts/golden/gguf_dequant.py -> tests/golden/gguf_reference.json).

use half::{bf16, f16};
use pagoda_gguf::{
    GgmlType, GgufError, GgufFile, GgufWriter, MetadataArray, MetadataValue, TensorValues,
};
use std::path::PathBuf;

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata(
        "general.architecture",
        MetadataValue::String("llama".into()),
    )
    .add_metadata("u8", MetadataValue::U8(200))
    .add_metadata("i8", MetadataValue::I8(-3))
    .add_metadata("u16", MetadataValue::U16(60000))
    .add_metadata("i16", MetadataValue::I16(-30000))
    .add_metadata("u32", MetadataValue::U32(4_000_000_000))
    .add_metadata("i32", MetadataValue::I32(-7))
    .add_metadata("u64", MetadataValue::U64(1 << 50))
    .add_metadata("i64", MetadataValue::I64(-(1 << 50)))
    .add_metadata("f32", MetadataValue::F32(1e-5))
    .add_metadata("f64", MetadataValue::F64(0.125))
    .add_metadata("bool", MetadataValue::Bool(true))
    .add_metadata(
        "tokens",
        MetadataValue::Array(MetadataArray::String(vec![
            "<s>".into(),
            "héllo".into(),
            "".into(),
        ])),
    )
    .add_metadata(
        "types",
        MetadataValue::Array(MetadataArray::I32(vec![3, 1, 1])),
    )
    .add_metadata(
        "nested",
        MetadataValue::Array(MetadataArray::Array(vec![
            MetadataArray::U8(vec![1, 2]),
            MetadataArray::Array(vec![MetadataArray::F64(vec![0.5])]),
            MetadataArray::Bool(vec![true, false]),
        ])),
    );
    w
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * scale)
        .collect()
}

fn sample_file() -> Vec<u8> {
    let mut w = sample_writer();
    w.add_f32("norm.weight", &[8], &ramp(8, 0.1)).unwrap();
    w.add_f16("proj.weight", &[3, 4], &ramp(12, 0.01)).unwrap();
    w.add_q8_0("embd.weight", &[5, 64], &ramp(320, 0.02))
        .unwrap();
    w.to_bytes()
}

#[test]
fn writer_round_trip() {
    let file = GgufFile::from_bytes(sample_file()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.data_offset() % 32, 0);
    let md = file.metadata();
    let w = sample_writer();
    // Every written pair reads back equal, in order.
    let written = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(written.metadata().entries(), md.entries());
    assert_eq!(md.len(), 15);
    assert_eq!(md.get("u8"), Some(&MetadataValue::U8(200)));
    assert_eq!(md.get_u32("u16").unwrap(), 60000);
    assert_eq!(md.get_u32("u32").unwrap(), 4_000_000_000);
    assert_eq!(md.get_i64("i64").unwrap(), -(1 << 50));
    assert_eq!(md.get_f32("f32").unwrap(), 1e-5);
    assert!(md.get_bool("bool").unwrap());
    assert_eq!(md.get_string_array("tokens").unwrap(), ["<s>", "héllo", ""]);
    assert_eq!(md.get_i32_array("types").unwrap(), [3, 1, 1]);
    assert!(
        matches!(md.get("nested"), Some(MetadataValue::Array(MetadataArray::Array(v))) if v.len() == 3)
    );

    let names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["norm.weight", "proj.weight", "embd.weight"]);
    let proj = file.tensor("proj.weight").unwrap();
    assert_eq!(proj.ne, [4, 3]);
    assert_eq!(proj.shape(), [3, 4]);
    assert_eq!(proj.ggml_type, GgmlType::F16);
    for t in file.tensors() {
        assert_eq!(t.offset % 32, 0);
    }

    assert_eq!(file.dequantize("norm.weight").unwrap(), ramp(8, 0.1));
    let want16: Vec<f16> = ramp(12, 0.01).into_iter().map(f16::from_f32).collect();
    assert_eq!(
        file.tensor_values("proj.weight").unwrap(),
        TensorValues::F16(want16.clone())
    );
    assert_eq!(file.f16_values(proj).unwrap(), want16);
    let as_f32: Vec<f32> = want16.iter().map(|x| x.to_f32()).collect();
    assert_eq!(file.dequantize("proj.weight").unwrap(), as_f32);

    // Q8_0: each value within half a quantization step (plus f16 rounding of d).
    let orig = ramp(320, 0.02);
    let got = file.dequantize("embd.weight").unwrap();
    for (block_o, block_g) in orig.chunks(32).zip(got.chunks(32)) {
        let amax = block_o.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (o, g) in block_o.iter().zip(block_g) {
            assert!(
                (o - g).abs() <= amax / 127.0 * 0.5 + amax * 2e-3,
                "{o} vs {g}"
            );
        }
    }
    assert!(matches!(
        file.dequantize("nope"),
        Err(GgufError::MissingTensor(_))
    ));
    assert!(matches!(
        file.f16_values(file.tensor("norm.weight").unwrap()),
        Err(GgufError::WrongTensorType { .. })
    ));
}

#[test]
fn bf16_tensors_stay_bf16_and_alignment_is_honoured() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", MetadataValue::U32(64));
    w.add_f32("a", &[3], &[1.0, 2.0, 3.0]).unwrap();
    let vals = [1.0f32, -0.5, 3.0e10, 7.0];
    let bytes: Vec<u8> = vals
        .iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect();
    w.add_raw("b", &[2, 2], GgmlType::BF16, bytes).unwrap();
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.data_offset() % 64, 0);
    assert_eq!(file.tensor("b").unwrap().offset, 64);
    let want: Vec<bf16> = vals.iter().map(|&x| bf16::from_f32(x)).collect();
    assert_eq!(
        file.tensor_values("b").unwrap(),
        TensorValues::BF16(want.clone())
    );
    let f: Vec<f32> = want.iter().map(|x| x.to_f32()).collect();
    assert_eq!(file.dequantize("b").unwrap(), f);
}

#[test]
fn open_reads_from_disk_and_names_missing_files() {
    let dir = std::env::temp_dir().join(format!("pagoda-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.gguf");
    std::fs::write(&path, sample_file()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.tensors().len(), 3);
    std::fs::remove_dir_all(&dir).unwrap();
    let err = GgufFile::open(dir.join("missing.gguf")).unwrap_err();
    assert!(err.to_string().contains("missing.gguf"), "{err}");
}

/// Byte position just after the name of tensor info `name` (where n_dims is).
fn info_pos(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap()
        + needle.len()
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn err(bytes: Vec<u8>) -> GgufError {
    GgufFile::from_bytes(bytes).unwrap_err()
}

#[test]
fn header_errors() {
    let good = sample_file();
    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(err(b), GgufError::BadMagic { .. }));
    for v in [1, 4, 0xFFFF_FFFF] {
        let mut b = good.clone();
        put_u32(&mut b, 4, v);
        assert!(matches!(err(b), GgufError::UnsupportedVersion(x) if x == v));
    }
    let mut b = good.clone();
    put_u32(&mut b, 4, 2);
    assert!(
        GgufFile::from_bytes(b).is_ok(),
        "version 2 has the same layout"
    );
    // Counts larger than the file can hold.
    let mut b = good.clone();
    put_u64(&mut b, 8, u64::MAX / 2);
    assert!(matches!(err(b), GgufError::CountTooLarge { .. }));
    let mut b = good.clone();
    put_u64(&mut b, 16, 1 << 40);
    assert!(matches!(err(b), GgufError::CountTooLarge { .. }));
    // A string length past the end of the file.
    let mut b = good.clone();
    put_u64(&mut b, 24, 1 << 40);
    let e = err(b);
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
    // An unknown value type, named by its key.
    let mut b = good.clone();
    let key = b"general.architecture";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    put_u32(&mut b, at, 13);
    let e = err(b);
    assert!(matches!(e, GgufError::UnknownValueType { type_id: 13, .. }));
    assert!(e.to_string().contains("general.architecture"), "{e}");
}

#[test]
fn every_truncation_is_an_error() {
    let good = sample_file();
    let last_data_end = {
        let f = GgufFile::from_bytes(good.clone()).unwrap();
        f.tensors()
            .iter()
            .map(|t| f.data_offset() + t.offset as usize + t.n_bytes())
            .max()
            .unwrap()
    };
    for len in 0..last_data_end {
        let e = GgufFile::from_bytes(good[..len].to_vec()).unwrap_err();
        assert!(
            matches!(
                e,
                GgufError::Truncated { .. }
                    | GgufError::CountTooLarge { .. }
                    | GgufError::OutOfBounds { .. }
            ),
            "cut at {len}: {e}"
        );
    }
}

#[test]
fn duplicate_keys_and_tensors_are_errors() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", MetadataValue::U8(1))
        .add_metadata("k", MetadataValue::U8(2));
    assert!(matches!(err(w.to_bytes()), GgufError::Duplicate { .. }));
    let mut w = GgufWriter::new();
    w.add_f32("t", &[1], &[1.0])
        .unwrap()
        .add_f32("t", &[1], &[2.0])
        .unwrap();
    assert!(matches!(err(w.to_bytes()), GgufError::Duplicate { .. }));
}

#[test]
fn tensor_info_errors() {
    let good = sample_file();
    let at = info_pos(&good, "embd.weight"); // n_dims u32, ne[2] u64, type u32, offset u64
    let (ne0, ne1, ty, off) = (at + 4, at + 12, at + 20, at + 24);

    let mut b = good.clone();
    put_u32(&mut b, ty, 99);
    assert!(matches!(
        err(b),
        GgufError::UnknownGgmlType { type_id: 99, .. }
    ));

    let mut b = good.clone();
    put_u32(&mut b, at, 5);
    assert!(matches!(err(b), GgufError::TooManyDims { n_dims: 5, .. }));

    let mut b = good.clone();
    put_u64(&mut b, ne0, 1 << 40);
    put_u64(&mut b, ne1, 1 << 40);
    assert!(matches!(err(b), GgufError::ShapeOverflow { .. }));

    let mut b = good.clone();
    put_u64(&mut b, ne0, 48);
    assert!(matches!(
        err(b),
        GgufError::BlockMisfit {
            ne0: 48,
            block_size: 32,
            ..
        }
    ));

    let mut b = good.clone();
    put_u64(&mut b, off, 8);
    assert!(matches!(err(b), GgufError::Misaligned { offset: 8, .. }));

    let mut b = good.clone();
    put_u64(&mut b, off, 1 << 20);
    assert!(matches!(err(b), GgufError::OutOfBounds { .. }));

    let mut b = good.clone();
    put_u64(&mut b, off, u64::MAX - 31);
    assert!(matches!(err(b), GgufError::OutOfBounds { .. }));

    let mut b = good.clone();
    put_u64(&mut b, ne1, 6); // one row more than the data holds
    assert!(matches!(err(b), GgufError::OutOfBounds { .. }));

    // A known type that cannot be dequantized still lists, and says so.
    let mut b = good.clone();
    // MXFP4 blocks are 32 elements in 17 bytes: smaller than Q8_0, still in bounds.
    put_u32(&mut b, ty, GgmlType::MXFP4.id());
    let f = GgufFile::from_bytes(b).unwrap();
    assert_eq!(f.tensor("embd.weight").unwrap().ggml_type, GgmlType::MXFP4);
    let e = f.dequantize("embd.weight").unwrap_err();
    assert!(
        e.to_string().contains("MXFP4") && e.to_string().contains("embd.weight"),
        "{e}"
    );
}

#[test]
fn bad_alignment_is_an_error() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", MetadataValue::U32(24));
    assert!(matches!(err(w.to_bytes()), GgufError::BadAlignment(24)));
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", MetadataValue::String("x".into()));
    assert!(matches!(err(w.to_bytes()), GgufError::WrongType { .. }));
}

fn smollm2_path() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-default-model.sh",
        p.display()
    );
    p
}

#[test]
fn smollm2_matches_python_gguf() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/gguf_reference.json")).unwrap();
    let g = &golden["smollm2"];
    let file = GgufFile::open(smollm2_path()).unwrap();
    let md = file.metadata();
    let gm = &g["metadata"];
    assert_eq!(file.version(), 3);
    assert_eq!(
        file.tensors().len() as u64,
        g["tensor_count"].as_u64().unwrap()
    );
    assert_eq!(
        md.get_str("general.architecture").unwrap(),
        gm["general.architecture"].as_str().unwrap()
    );
    assert_eq!(
        md.get_u32("llama.block_count").unwrap() as u64,
        gm["llama.block_count"].as_u64().unwrap()
    );
    assert_eq!(
        md.get_u64("llama.embedding_length").unwrap(),
        gm["llama.embedding_length"].as_u64().unwrap()
    );
    assert_eq!(md.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(
        md.get_f32("llama.rope.freq_base").unwrap() as f64,
        gm["llama.rope.freq_base"].as_f64().unwrap()
    );
    assert_eq!(
        md.get_u32("tokenizer.ggml.bos_token_id").unwrap() as u64,
        gm["tokenizer.ggml.bos_token_id"].as_u64().unwrap()
    );
    assert_eq!(
        md.get_str("tokenizer.ggml.model").unwrap(),
        gm["tokenizer.ggml.model"].as_str().unwrap()
    );
    let tokens = md.get_string_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len() as u64, gm["tokens_len"].as_u64().unwrap());
    assert_eq!(tokens[100], gm["token_100"].as_str().unwrap());
    let merges = md.get_string_array("tokenizer.ggml.merges").unwrap();
    assert_eq!(merges.len() as u64, gm["merges_len"].as_u64().unwrap());
    assert_eq!(merges[0], gm["merge_0"].as_str().unwrap());

    assert_eq!(
        file.tensor("token_embd.weight").unwrap().ggml_type,
        GgmlType::Q8_0
    );
    assert_eq!(
        file.tensor("blk.0.attn_q.weight").unwrap().ggml_type,
        GgmlType::Q4_1
    );

    for t in g["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let info = file.tensor(name).unwrap();
        assert_eq!(info.ggml_type.name(), t["type"].as_str().unwrap(), "{name}");
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(info.shape(), shape, "{name}");
        let values = file.dequantize(name).unwrap();
        assert_eq!(values.len(), shape.iter().product::<usize>());
        let idx = t["indices"].as_array().unwrap();
        let want = t["values"].as_array().unwrap();
        for (i, w) in idx.iter().zip(want) {
            let (i, w) = (i.as_u64().unwrap() as usize, w.as_f64().unwrap() as f32);
            assert!(
                (values[i] - w).abs() <= 1e-6 * w.abs().max(1e-3),
                "{name}[{i}]: {} vs {w}",
                values[i]
            );
        }
        let sum: f64 = values.iter().map(|&x| x as f64).sum();
        let want_sum = t["sum"].as_f64().unwrap();
        assert!(
            (sum - want_sum).abs() <= 1e-6 * values.len() as f64,
            "{name} sum {sum} vs {want_sum}"
        );
    }
}
