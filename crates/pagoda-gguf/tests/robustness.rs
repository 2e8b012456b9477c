//! Property tests: a truncated or corrupted file gives `Ok` or an `Err`,
//! never a panic, and never an allocation out of proportion to its size.
//!
//! A counting global allocator records the largest single allocation made by
//! the test thread while it parses; parsing may allocate a small constant
//! times the file size (a `String` per 8-byte length field, a `TensorInfo`
//! per 24-byte tensor info), and dequantizing exactly the f32 output.

use pagoda_gguf::{GgufFile, GgufWriter, MetadataArray, MetadataValue};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = TRACKING.try_with(|t| {
        if t.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` and returns its result with the largest allocation it made.
fn tracked<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    TRACKING.with(|t| t.set(true));
    let r = f();
    TRACKING.with(|t| t.set(false));
    (r, LARGEST.with(|l| l.get()))
}

fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata(
        "general.architecture",
        MetadataValue::String("llama".into()),
    )
    .add_metadata("llama.block_count", MetadataValue::U32(2))
    .add_metadata(
        "tokenizer.ggml.tokens",
        MetadataValue::Array(MetadataArray::String(
            (0..20).map(|i| format!("tok{i}")).collect(),
        )),
    )
    .add_metadata(
        "scores",
        MetadataValue::Array(MetadataArray::F32(vec![0.5; 16])),
    )
    .add_metadata(
        "nested",
        MetadataValue::Array(MetadataArray::Array(vec![
            MetadataArray::U16(vec![1, 2, 3]);
            3
        ])),
    );
    let xs: Vec<f32> = (0..128).map(|i| i as f32 * 0.01 - 0.6).collect();
    w.add_f32("a.weight", &[4, 8], &xs[..32]).unwrap();
    w.add_f16("b.weight", &[2, 32], &xs[..64]).unwrap();
    w.add_q8_0("c.weight", &[2, 64], &xs).unwrap();
    w.to_bytes()
}

/// Parses `bytes` and dequantizes everything it lists, checking allocations.
fn check(bytes: Vec<u8>) {
    let len = bytes.len();
    let (parsed, largest) = tracked(|| GgufFile::from_bytes(bytes));
    assert!(
        largest <= 4 * len + 4096,
        "parse allocated {largest} bytes for a {len}-byte file"
    );
    if let Ok(file) = parsed {
        for t in file.tensors() {
            let (r, largest) = tracked(|| file.dequantize_info(t).map(|v| v.len()));
            assert!(
                largest <= 4 * t.n_elements() + 4096,
                "{}: {largest} bytes",
                t.name
            );
            if let Ok(n) = r {
                assert_eq!(n, t.n_elements());
            }
            let _ = file.tensor_values(&t.name);
        }
    }
}

#[test]
fn the_counter_sees_allocations() {
    let (v, largest) = tracked(|| vec![1u8; 100_000]);
    assert_eq!(v.len(), 100_000);
    assert!(largest >= 100_000);
}

#[test]
fn the_valid_file_parses() {
    let f = GgufFile::from_bytes(valid_file()).unwrap();
    assert_eq!(f.tensors().len(), 3);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn truncation_never_panics(cut in 0usize..2048) {
        let mut b = valid_file();
        b.truncate(cut.min(b.len()));
        check(b);
    }

    #[test]
    fn overwritten_bytes_never_panic(
        edits in proptest::collection::vec((0usize..4096, any::<u8>()), 1..8)
    ) {
        let mut b = valid_file();
        let len = b.len();
        for (at, v) in edits {
            b[at % len] = v;
        }
        check(b);
    }

    #[test]
    fn overwritten_words_never_panic(at in 0usize..4096, v in any::<u64>(), cut in proptest::option::of(0usize..4096)) {
        // Whole 8-byte words reach counts and lengths more often than bytes.
        let mut b = valid_file();
        let len = b.len();
        let at = at % (len - 8);
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        if let Some(c) = cut { b.truncate(c.min(len)); }
        check(b);
    }
}

/// The real SmolLM2 file up to the start of its tensor data (its header:
/// 49k tokens, 49k merges, 272 tensor infos), or `None` if it is missing.
fn smollm2_header() -> Vec<u8> {
    use std::sync::OnceLock;
    static HEADER: OnceLock<Vec<u8>> = OnceLock::new();
    HEADER
        .get_or_init(|| {
            let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
            let file = GgufFile::open(&p)
                .unwrap_or_else(|e| panic!("{e}: run scripts/fetch-default-model.sh"));
            let bytes = std::fs::read(&p).unwrap();
            bytes[..file.data_offset() + 64].to_vec()
        })
        .clone()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn real_header_cut_or_corrupted_never_panics(
        cut in 0usize..2_000_000,
        edits in proptest::collection::vec((0usize..2_000_000, any::<u8>()), 0..4),
    ) {
        let mut b = smollm2_header();
        let len = b.len();
        let edited = !edits.is_empty();
        for (at, v) in edits {
            b[at % len] = v;
        }
        b.truncate(cut.min(len));
        let n = b.len();
        let (r, largest) = tracked(|| GgufFile::from_bytes(b).map(|f| f.tensors().len()));
        prop_assert!(largest <= 4 * n + 4096, "{largest} bytes for {n}");
        // Unedited and cut anywhere: the tensor data is not all there.
        prop_assert!(edited || r.is_err());
    }
}
