//! Interop with the `gguf` Python package 0.19: strata's writer must produce
//! byte-for-byte the file gguf.GGUFWriter wrote for the same content
//! (tests/golden/gguf/writer_all_types.gguf, from tools/gen_gguf_golden.py),
//! and strata's reader must read that file as gguf.GGUFReader did.

mod common;

use strata_gguf::{Array, GgufError, GgufFile, GgufWriter, QuantType, StringArray, Value};

/// name, type, numpy shape (outermost first) — as WRITER_TENSORS in the script.
const WRITER_TENSORS: &[(&str, QuantType, &[u64])] = &[
    ("f32.weight", QuantType::F32, &[3, 5]),
    ("f16.weight", QuantType::F16, &[2, 4]),
    ("bf16.weight", QuantType::BF16, &[3, 4]),
    ("q8_0.weight", QuantType::Q8_0, &[2, 64]),
    ("q4_1.weight", QuantType::Q4_1, &[2, 3, 32]),
    ("q4_k.weight", QuantType::Q4_K, &[1, 256]),
    ("iq2_xs.weight", QuantType::IQ2_XS, &[256]),
    ("mxfp4.weight", QuantType::MXFP4, &[64]),
    ("i32.tensor", QuantType::I32, &[7]),
    ("f32.4d", QuantType::F32, &[2, 1, 3, 2]),
];

/// The script's `pattern_bytes`: tensor k's data.
fn pattern_bytes(n: u64, k: u64) -> Vec<u8> {
    (0..n).map(|i| ((i * 31 + k * 7 + 3) % 251) as u8).collect()
}

fn strings(items: &[&[u8]]) -> StringArray {
    items.iter().collect()
}

/// The same content, in the same order, as `build_writer_golden` in the script.
#[allow(clippy::approx_constant)] // 3.14159 is the golden's value, not an approximation of pi
fn golden_writer() -> GgufWriter<'static> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "strata-test");
    w.set_alignment(64).expect("alignment");
    w.add("t.u8", 200u8);
    w.add("t.i8", -100i8);
    w.add("t.u16", 65535u16);
    w.add("t.i16", -32768i16);
    w.add("t.u32", 4_000_000_000u32);
    w.add("t.i32", -2_000_000_000i32);
    w.add("t.f32", 3.14159f32);
    w.add("t.bool_true", true);
    w.add("t.bool_false", false);
    w.add("t.string", "héllo ✓ 🦀");
    w.add("t.empty_string", "");
    w.add_string_bytes("t.non_utf8_string", b"ok\xff\xfe\x80");
    w.add("t.u64", u64::MAX);
    w.add("t.i64", i64::MIN);
    w.add("t.f64", -2.5e-300f64);
    w.add("t.arr_u8", vec![0u8, 1, 255]);
    w.add("t.arr_i8", vec![-128i8, 0, 127]);
    w.add("t.arr_u16", vec![0u16, 65535]);
    w.add("t.arr_i16", vec![-32768i16, 32767]);
    w.add("t.arr_u32", vec![1u32, 2, u32::MAX]);
    w.add("t.arr_i32", vec![-1i32, 0, 1, i32::MAX]);
    w.add("t.arr_u64", vec![0u64, u64::MAX]);
    w.add("t.arr_i64", vec![i64::MIN, 5]);
    w.add("t.arr_f32", vec![0.5f32, -1.25, 1e30, f32::INFINITY]);
    w.add("t.arr_f64", vec![0.1f64, -1e300, 2.0]);
    w.add("t.arr_bool", vec![true, false, true]);
    w.add(
        "t.arr_string",
        strings(&[b"a", b"", "ünï".as_bytes(), b"\xc3\x28raw"]),
    );
    w.add(
        "t.arr_nested_i32",
        vec![Array::I32(vec![1, 2, 3]), Array::I32(vec![4, 5])],
    );
    w.add(
        "t.arr_nested_mixed",
        vec![
            Array::String(strings(&[b"x", b"yz"])),
            Array::F32(vec![1.5]),
            Array::Bool(vec![true, false]),
        ],
    );
    w.add(
        "t.arr_nested_deep",
        vec![
            Array::Array(vec![Array::I32(vec![7])]),
            Array::Array(vec![Array::I32(vec![8, 9]), Array::I32(vec![10])]),
        ],
    );
    w.add(
        "t.arr_nested_u8",
        vec![Array::U8(vec![1, 2]), Array::U8(vec![3])],
    );
    w.add("t.last", "end");
    for (k, &(name, ty, np_shape)) in WRITER_TENSORS.iter().enumerate() {
        let dims: Vec<u64> = np_shape.iter().rev().copied().collect();
        let n = strata_gguf::tensor_bytes(&dims, ty).expect("shape");
        w.add_tensor(name, &dims, ty, pattern_bytes(n, k as u64))
            .expect("tensor");
    }
    w
}

fn golden_bytes() -> Vec<u8> {
    let path = common::repo_root().join("tests/golden/gguf/writer_all_types.gguf");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn writer_matches_gguf_py_byte_for_byte() {
    let ours = golden_writer().to_bytes().expect("write");
    let theirs = golden_bytes();
    if ours != theirs {
        let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
        panic!(
            "strata wrote {} bytes, gguf-py {}; first difference at {first:?}",
            ours.len(),
            theirs.len()
        );
    }
}

#[test]
fn reader_matches_gguf_py_on_its_file() {
    let f = GgufFile::from_bytes(golden_bytes()).expect("open golden");
    common::summary::assert_matches(&f, &common::summary::load("writer_all_types.json"));
}

#[test]
fn reading_gguf_py_file_gives_back_the_written_content() {
    let f = GgufFile::from_bytes(golden_bytes()).expect("open golden");
    let w = golden_writer();
    assert_eq!(f.metadata(), w.metadata());
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.get_u64("t.u64").expect("u64"), u64::MAX);
    assert_eq!(f.get_str("t.string").expect("string"), "héllo ✓ 🦀");
    assert_eq!(
        f.get_string_bytes("t.non_utf8_string").expect("bytes"),
        b"ok\xff\xfe\x80"
    );
    assert!(matches!(
        f.get_str("t.non_utf8_string"),
        Err(GgufError::InvalidUtf8 { key, index: None }) if key == "t.non_utf8_string"
    ));
    assert!(matches!(
        f.get_str_array("t.arr_string"),
        Err(GgufError::InvalidUtf8 { index: Some(3), .. })
    ));
    assert_eq!(
        f.get_bytes_array("t.arr_string").expect("bytes")[3],
        b"\xc3\x28raw"
    );
    // Lossless integer conversions, and refusals that name the key.
    assert_eq!(f.get_i32("t.u8").expect("u8 as i32"), 200);
    assert_eq!(f.get_u32_array("t.arr_u8").expect("u8s"), [0, 1, 255]);
    let err = f.get_u32("t.i8").expect_err("negative");
    assert!(err.to_string().contains("t.i8"), "{err}");
    let err = f.get_i32_array("t.arr_u32").expect_err("too big");
    assert!(err.to_string().contains("t.arr_u32"), "{err}");
    let err = f.get_f32("t.f64").expect_err("inexact");
    assert!(err.to_string().contains("t.f64"), "{err}");
    assert_eq!(f.get_f64("t.f64").expect("f64"), -2.5e-300);
    assert!(matches!(
        f.get_bool("t.u8"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(f.get_str("nope"), Err(GgufError::MissingKey { key }) if key == "nope"));
    assert_eq!(f.architecture().expect("arch"), "strata-test");
    assert!(
        matches!(f.get("t.arr_nested_deep"), Some(Value::Array(Array::Array(a))) if a.len() == 2)
    );
    for (k, &(name, ty, np_shape)) in WRITER_TENSORS.iter().enumerate() {
        let t = f.tensor(name).expect("tensor");
        assert_eq!(t.ty, ty);
        assert_eq!(t.dims, np_shape.iter().rev().copied().collect::<Vec<_>>());
        assert_eq!(
            f.tensor_data(t),
            pattern_bytes(t.n_bytes, k as u64),
            "{name}"
        );
        assert_eq!(t.offset % 64, 0, "{name} aligned");
    }
}

/// Reading SmolLM2 and writing it back reproduces the file exactly: the
/// converter that wrote it (gguf-py) and strata's writer agree on the layout.
#[test]
fn smollm2_rewrites_byte_for_byte() {
    let Some(path) = common::smollm2() else {
        return;
    };
    let f = GgufFile::open(&path).expect("open");
    let bytes = GgufWriter::from_file(&f)
        .expect("writer")
        .to_bytes()
        .expect("write");
    assert_eq!(bytes.len() as u64, f.file_len());
    assert!(
        bytes == f.bytes(),
        "rewritten SmolLM2 differs from the original"
    );
}
