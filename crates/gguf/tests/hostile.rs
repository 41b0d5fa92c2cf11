//! Targeted damage: each field of the format set to a bad value gives the
//! error that names the key or tensor concerned, never a panic or a huge
//! allocation.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicUsize, Ordering};

use strata_gguf::{GgufError, GgufFile, GgufWriter};

/// Records the largest single allocation (see corruption.rs).
struct PeakAlloc;

static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        PEAK.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        PEAK.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    catch_unwind(|| GgufFile::from_bytes(bytes)).expect("the parser panicked")
}

fn golden_file() -> Vec<u8> {
    let path = common::repo_root().join("tests/golden/gguf/writer_all_types.gguf");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn vocab_file() -> Vec<u8> {
    let path = common::repo_root().join("tests/fixtures/vocab/ggml-vocab-llama-spm.gguf");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Offset just after the length-prefixed string `name` (where a key's type id
/// or a tensor's dimension count starts).
fn after_name(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("`{name}` not in the file"));
    at + needle.len()
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Asserts `bytes` fail to parse with an error naming `key`.
fn fails_on_key(bytes: Vec<u8>, key: &str) -> String {
    match parse(bytes) {
        Err(e @ GgufError::BadValue { .. }) if e.to_string().contains(&format!("`{key}`")) => {
            e.to_string()
        }
        other => panic!("expected an error naming key `{key}`, got {other:?}"),
    }
}

/// Asserts `bytes` fail to parse with an error naming `tensor`.
fn fails_on_tensor(bytes: Vec<u8>, tensor: &str) -> String {
    match parse(bytes) {
        Err(GgufError::BadTensor { tensor: t, reason }) if t == tensor => reason,
        other => panic!("expected an error naming tensor `{tensor}`, got {other:?}"),
    }
}

#[test]
fn header_damage() {
    let good = golden_file();
    let mut b = good.clone();
    b[..4].copy_from_slice(b"GGML");
    assert!(matches!(parse(b), Err(GgufError::BadMagic { .. })));
    assert!(matches!(
        parse(b"GG".to_vec()),
        Err(GgufError::BadMagic { .. })
    ));
    assert!(matches!(parse(Vec::new()), Err(GgufError::BadMagic { .. })));

    let mut b = good.clone();
    put_u32(&mut b, 4, 1);
    let err = parse(b).expect_err("v1");
    assert!(matches!(err, GgufError::VersionOne));
    assert!(err.to_string().contains("version 1"), "{err}");
    let mut b = good.clone();
    put_u32(&mut b, 4, 3u32.swap_bytes());
    assert!(matches!(parse(b), Err(GgufError::BigEndian { .. })));
    let mut b = good.clone();
    put_u32(&mut b, 4, 4);
    assert!(matches!(
        parse(b),
        Err(GgufError::UnsupportedVersion { version: 4 })
    ));
    let mut b = good.clone();
    put_u32(&mut b, 4, 2); // v2 and v3 share the little-endian layout
    assert_eq!(parse(b).expect("v2").version(), 2);
}

#[test]
fn absurd_counts_are_refused_without_allocating() {
    let good = vocab_file();
    // Tensor and metadata counts far beyond the file.
    for (at, count) in [(8, u64::MAX), (8, 1 << 40), (16, u64::MAX), (16, 1 << 40)] {
        let mut b = good.clone();
        put_u64(&mut b, at, count);
        let err = parse(b).expect_err("absurd count");
        let text = err.to_string();
        assert!(text.contains("more than the"), "{text}");
        assert!(
            matches!(err, GgufError::BadKey { .. } | GgufError::BadTensor { .. }),
            "{err:?}"
        );
    }
    // The vocabulary's count, a string's length, a key's length.
    let tokens = after_name(&good, "tokenizer.ggml.tokens");
    for count in [u64::MAX, 1 << 62, 1 << 33] {
        let mut b = good.clone();
        put_u64(&mut b, tokens + 8, count);
        fails_on_key(b, "tokenizer.ggml.tokens");
    }
    let scores = after_name(&good, "tokenizer.ggml.scores");
    let mut b = good.clone();
    put_u64(&mut b, scores + 8, u64::MAX / 4);
    fails_on_key(b, "tokenizer.ggml.scores");
    let name = after_name(&good, "general.name");
    let mut b = good.clone();
    put_u64(&mut b, name + 4, 1 << 40);
    fails_on_key(b, "general.name");
    let mut b = good.clone();
    put_u64(&mut b, 24, u64::MAX); // the first key's length
    assert!(matches!(parse(b), Err(GgufError::BadKey { index: 0, .. })));
    // A string inside the vocabulary (the first token's length).
    let mut b = good.clone();
    put_u64(&mut b, tokens + 16, 1 << 50);
    let text = fails_on_key(b, "tokenizer.ggml.tokens");
    assert!(text.contains("element 0"), "{text}");
    let peak = PEAK.load(Ordering::Relaxed);
    assert!(peak < 32 << 20, "an allocation of {peak} bytes was made");
}

#[test]
fn bad_value_types_name_their_key() {
    let good = golden_file();
    let at = after_name(&good, "t.u32");
    let mut b = good.clone();
    put_u32(&mut b, at, 13);
    assert!(fails_on_key(b, "t.u32").contains("unknown value type id 13"));
    let at = after_name(&good, "t.arr_i32");
    let mut b = good.clone();
    put_u32(&mut b, at + 4, 99);
    fails_on_key(b, "t.arr_i32");
    let at = after_name(&good, "t.bool_true");
    let mut b = good.clone();
    b[at + 4] = 2;
    assert!(fails_on_key(b, "t.bool_true").contains("neither 0 nor 1"));
    // A key renamed to the one before it.
    let at = after_name(&good, "t.u8");
    let mut b = good.clone();
    b[at - 4..at].copy_from_slice(b"t.i8");
    assert!(fails_on_key(b, "t.i8").contains("duplicate"));
    // Invalid UTF-8 in a key.
    let mut b = good.clone();
    b[at - 1] = 0xff;
    assert!(matches!(parse(b), Err(GgufError::BadKey { index: 2, .. })));
}

#[test]
fn bad_alignment_names_the_key() {
    let good = golden_file();
    let at = after_name(&good, "general.alignment");
    for a in [0u32, 48, 3] {
        let mut b = good.clone();
        put_u32(&mut b, at + 4, a);
        fails_on_key(b, "general.alignment");
    }
    let mut b = good.clone();
    put_u32(&mut b, at, 5); // u32 → i32: same size, wrong type
    assert!(fails_on_key(b, "general.alignment").contains("must be u32"));
}

#[test]
fn nesting_bomb_is_refused() {
    let mut w = GgufWriter::new();
    w.add("x", 1u8);
    let mut b = w.to_bytes().expect("write");
    b.truncate(24); // header only; one entry follows
    b.extend_from_slice(&4u64.to_le_bytes());
    b.extend_from_slice(b"bomb");
    b.extend_from_slice(&9u32.to_le_bytes()); // ARRAY
    for _ in 0..100_000 {
        b.extend_from_slice(&9u32.to_le_bytes()); // of ARRAY
        b.extend_from_slice(&1u64.to_le_bytes()); // one element
    }
    assert!(fails_on_key(b, "bomb").contains("nested"));
}

#[test]
fn bad_tensor_entries_name_the_tensor() {
    let good = golden_file();
    let f = parse(good.clone()).expect("intact");
    let t = |name: &str| after_name(&good, name);

    // Type ids: removed (4), unknown (99).
    for id in [4u32, 99] {
        let mut b = good.clone();
        put_u32(&mut b, t("q8_0.weight") + 4 + 16, id);
        fails_on_tensor(b, "q8_0.weight");
    }
    // A row that is not whole blocks: Q8_0 with 33 elements per row.
    let mut b = good.clone();
    put_u64(&mut b, t("q8_0.weight") + 4, 33);
    assert!(fails_on_tensor(b, "q8_0.weight").contains("block size"));
    // A shape whose byte size no longer matches the space before the next
    // tensor: 64 → 128 columns makes it overlap its successor.
    let mut b = good.clone();
    put_u64(&mut b, t("q8_0.weight") + 4, 128);
    assert!(fails_on_tensor(b, "q4_1.weight").contains("overlaps tensor `q8_0.weight`"));
    // Overflowing shape, negative dimension, too many dimensions.
    let mut b = good.clone();
    put_u64(&mut b, t("f32.weight") + 4, 1 << 62);
    assert!(fails_on_tensor(b, "f32.weight").contains("overflow"));
    let mut b = good.clone();
    put_u64(&mut b, t("f32.weight") + 4 + 8, 1 << 63);
    assert!(fails_on_tensor(b, "f32.weight").contains("negative"));
    let mut b = good.clone();
    put_u32(&mut b, t("f32.weight"), 5);
    fails_on_tensor(b, "f32.weight");
    // Offsets: past the end, misaligned, overlapping, overflowing.
    let off = |name: &str, n_dims: usize| t(name) + 4 + 8 * n_dims + 4;
    let mut b = good.clone();
    put_u64(&mut b, off("f32.4d", 4), 4096);
    assert!(fails_on_tensor(b, "f32.4d").contains("past the end"));
    let mut b = good.clone();
    put_u64(&mut b, off("f32.4d", 4), u64::MAX - 63);
    fails_on_tensor(b, "f32.4d");
    let mut b = good.clone();
    put_u64(&mut b, off("f16.weight", 2), 64 + 16);
    assert!(fails_on_tensor(b, "f16.weight").contains("alignment"));
    let mut b = good.clone();
    put_u64(&mut b, off("f16.weight", 2), 0);
    assert!(fails_on_tensor(b, "f16.weight").contains("overlaps tensor `f32.weight`"));
    // Two tensors with one name.
    let mut b = good.clone();
    let at = t("f16.weight");
    b[at - 10..at].copy_from_slice(b"f32.weight");
    assert!(fails_on_tensor(b, "f32.weight").contains("duplicate"));
    // A sanity check that the offsets used above are the real fields.
    assert_eq!(f.tensor("f32.4d").expect("f32.4d").dims.len(), 4);
}
