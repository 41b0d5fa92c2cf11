//! Damaged files: every truncation and many byte flips of real files give an
//! error (or a sound file, where the damage is harmless), never a panic, an
//! out-of-bounds read or a huge allocation; errors name the key or tensor.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicUsize, Ordering};

use strata_gguf::{Array, GgufError, GgufFile, Value};

/// Records the largest single allocation, to prove hostile counts are never
/// allocated for.
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

/// No test here handles more than a few MiB; a hostile count would ask for far more.
const ALLOCATION_LIMIT: usize = 32 << 20;

fn assert_no_huge_allocation() {
    let peak = PEAK.load(Ordering::Relaxed);
    assert!(
        peak < ALLOCATION_LIMIT,
        "an allocation of {peak} bytes was made"
    );
}

fn golden_file() -> Vec<u8> {
    let path = common::repo_root().join("tests/golden/gguf/writer_all_types.gguf");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The smallest vocab fixture: llama-spm, no tensors, metadata up to the last byte.
fn vocab_file() -> Vec<u8> {
    let path = common::repo_root().join("tests/fixtures/vocab/ggml-vocab-llama-spm.gguf");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Parses `bytes`, failing the test if the parser panics. A file that parses
/// is then exercised in full: every getter on every key, every tensor's data.
fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    let len = bytes.len() as u64;
    let result = catch_unwind(|| GgufFile::from_bytes(bytes)).expect("the parser panicked");
    if let Ok(f) = &result {
        exercise(f, len);
    } else if let Err(e) = &result {
        assert!(!e.to_string().is_empty());
    }
    result
}

fn exercise(f: &GgufFile, len: u64) {
    for key in f.metadata().keys() {
        let _ = (
            f.get_str(key),
            f.get_u32(key),
            f.get_u64(key),
            f.get_i32(key),
        );
        let _ = (f.get_f32(key), f.get_bool(key), f.get_str_array(key));
        let _ = (
            f.get_f32_array(key),
            f.get_i32_array(key),
            f.get_u32_array(key),
        );
        let _ = f.get(key).map(|v| v.to_string());
    }
    let _ = (f.architecture(), f.arch_u32("block_count"));
    let mut ranges = Vec::new();
    for t in f.tensors() {
        assert!(t.offset + t.n_bytes <= len, "{} out of the file", t.name);
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        assert_eq!(t.offset % f.alignment(), f.data_offset() % f.alignment());
        if t.n_bytes > 0 {
            ranges.push((t.offset, t.offset + t.n_bytes));
        }
    }
    ranges.sort();
    assert!(
        ranges.windows(2).all(|w| w[0].1 <= w[1].0),
        "overlapping tensors"
    );
}

/// Encoded size of a value (without its type id), computed independently of
/// the parser from the format's definition.
fn encoded_size(f: &GgufFile, key: &str, v: &Value) -> u64 {
    fn array_size(a: &Array) -> u64 {
        12 + match a {
            Array::String(s) => s.iter_bytes().map(|b| 8 + b.len() as u64).sum(),
            Array::Array(inner) => inner.iter().map(array_size).sum(),
            a => a.len() as u64 * a.element_type().fixed_size().expect("fixed") as u64,
        }
    }
    match v {
        Value::String(_) => 8 + f.get_string_bytes(key).expect("string").len() as u64,
        Value::Array(a) => array_size(a),
        v => v.value_type().fixed_size().expect("fixed") as u64,
    }
}

/// What a file truncated at `n` must report: which entry or tensor it names.
#[derive(Debug, PartialEq)]
enum Expect {
    Header,
    Key(u64),
    Value(String),
    Tensor(String),
    Ok,
}

/// Maps every truncation point of `f`'s file to the error it must give.
fn expectation(f: &GgufFile) -> impl Fn(u64) -> Expect + '_ {
    let mut spans = Vec::new(); // (start, name_end, end, expectation on name, on rest)
    let mut pos = 24u64;
    for (i, (key, value)) in f.metadata().iter().enumerate() {
        let name_end = pos + 8 + key.len() as u64;
        let end = name_end + 4 + encoded_size(f, key, value);
        spans.push((
            pos,
            name_end,
            end,
            Expect::Key(i as u64),
            Expect::Value(key.into()),
        ));
        pos = end;
    }
    for (i, t) in f.tensors().iter().enumerate() {
        let name_end = pos + 8 + t.name.len() as u64;
        let end = name_end + 4 + 8 * t.dims.len() as u64 + 4 + 8;
        let named = Expect::Tensor(t.name.clone());
        spans.push((pos, name_end, end, Expect::Tensor(format!("#{i}")), named));
        pos = end;
    }
    let index_end = pos;
    move |n| {
        if n < 24 {
            return Expect::Header;
        }
        for (start, name_end, end, on_name, on_rest) in &spans {
            if n >= *start && n < *end {
                let e = if n < *name_end { on_name } else { on_rest };
                return match e {
                    Expect::Key(i) => Expect::Key(*i),
                    Expect::Value(k) => Expect::Value(k.clone()),
                    Expect::Tensor(t) => Expect::Tensor(t.clone()),
                    _ => unreachable!(),
                };
            }
        }
        assert!(n >= index_end);
        // The first tensor, in index order, whose data the cut reaches.
        match f.tensors().iter().find(|t| t.offset + t.n_bytes > n) {
            Some(t) => Expect::Tensor(t.name.clone()),
            None => Expect::Ok,
        }
    }
}

fn check_truncation(bytes: &[u8], n: usize, expect: &Expect) {
    let got = parse(bytes[..n].to_vec());
    let ok = match (&got, expect) {
        (Ok(_), Expect::Ok) => true,
        (Err(GgufError::BadMagic { .. } | GgufError::BadHeader { .. }), Expect::Header) => true,
        (Err(GgufError::BadKey { index, .. }), Expect::Key(i)) => index == i,
        (Err(GgufError::BadValue { key, .. }), Expect::Value(k)) => key == k,
        (Err(GgufError::BadTensor { tensor, .. }), Expect::Tensor(t)) => tensor == t,
        _ => false,
    };
    assert!(
        ok,
        "cut at {n}: expected {expect:?}, got {:?}",
        got.map(|_| "a file")
    );
}

#[test]
fn every_truncation_of_a_written_file_fails_naming_its_entry() {
    let bytes = golden_file();
    let f = GgufFile::from_bytes(bytes.clone()).expect("intact file");
    let expect = expectation(&f);
    for n in 0..=bytes.len() {
        check_truncation(&bytes, n, &expect(n as u64));
    }
    assert_no_huge_allocation();
}

#[test]
fn truncations_of_a_vocab_file_fail_naming_their_entry() {
    let bytes = vocab_file();
    let f = GgufFile::from_bytes(bytes.clone()).expect("intact file");
    let expect = expectation(&f);
    assert_eq!(expect(bytes.len() as u64), Expect::Ok);
    // Every byte of the region before the vocabulary, then strides through it.
    let header_region = 4096;
    let cuts = (0..header_region).chain((header_region..bytes.len()).step_by(997));
    for n in cuts {
        let e = expect(n as u64);
        assert_ne!(e, Expect::Ok, "cut at {n}");
        check_truncation(&bytes, n, &e);
    }
    assert_no_huge_allocation();
}

/// Each byte at `positions` replaced in up to four ways; each result is an error or a sound file.
fn flip_all(bytes: &[u8], positions: impl Iterator<Item = usize>, ways: usize) -> (usize, usize) {
    let (mut ok, mut err) = (0, 0);
    for i in positions {
        for m in [|b: u8| b ^ 0xff, |b: u8| b ^ 1, |_| 0, |_| 0x80]
            .into_iter()
            .take(ways)
        {
            let mut damaged = bytes.to_vec();
            damaged[i] = m(damaged[i]);
            match parse(damaged) {
                Ok(_) => ok += 1,
                Err(_) => err += 1,
            }
        }
    }
    (ok, err)
}

#[test]
fn byte_flips_in_headers_and_index_never_panic() {
    let bytes = golden_file();
    let data_offset = GgufFile::from_bytes(bytes.clone())
        .expect("intact")
        .data_offset() as usize;
    let (ok, err) = flip_all(&bytes, 0..data_offset, 4);
    // Flips inside string contents or numbers are harmless; counts, lengths,
    // types and offsets are not. Both kinds must occur.
    assert!(ok > 100 && err > 100, "{ok} sound, {err} refused");

    let vocab = vocab_file();
    // Its header and first entries (up to the vocabulary), then strides.
    let positions = (0..640).chain((640..vocab.len()).step_by(8191));
    let (ok, err) = flip_all(&vocab, positions, 2);
    assert!(ok > 100 && err > 100, "{ok} sound, {err} refused");
    assert_no_huge_allocation();
}

#[test]
fn damage_to_tensor_data_is_harmless() {
    let bytes = golden_file();
    let intact = GgufFile::from_bytes(bytes.clone()).expect("intact");
    for i in (intact.data_offset() as usize..bytes.len()).step_by(7) {
        let mut damaged = bytes.clone();
        damaged[i] ^= 0xff;
        let f = parse(damaged).expect("data damage is not a format error");
        assert_eq!(f.metadata(), intact.metadata());
        assert_eq!(f.tensors(), intact.tensors());
    }
}
