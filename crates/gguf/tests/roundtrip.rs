//! reader(writer(x)) == x, including what gguf-py cannot write (empty and
//! deeply nested arrays, version 2, zero-size tensors, streamed tensor data),
//! and the writer's refusals.

use strata_gguf::{
    Array, GgufError, GgufFile, GgufWriter, QuantType, StringArray, Value, ValueType,
};

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545f4914f6cdd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, max_len: u64) -> Vec<u8> {
        let n = self.below(max_len + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

const ALL_TYPES: [ValueType; 13] = [
    ValueType::U8,
    ValueType::I8,
    ValueType::U16,
    ValueType::I16,
    ValueType::U32,
    ValueType::I32,
    ValueType::F32,
    ValueType::Bool,
    ValueType::String,
    ValueType::Array,
    ValueType::U64,
    ValueType::I64,
    ValueType::F64,
];

fn random_array(rng: &mut Rng, depth: u32) -> Array {
    let mut ty = ALL_TYPES[rng.below(13) as usize];
    if ty == ValueType::Array && depth >= 3 {
        ty = ValueType::U8;
    }
    let n = rng.below(6) as usize;
    let mut r = || rng.next();
    match ty {
        ValueType::U8 => Array::U8((0..n).map(|_| r() as u8).collect()),
        ValueType::I8 => Array::I8((0..n).map(|_| r() as i8).collect()),
        ValueType::U16 => Array::U16((0..n).map(|_| r() as u16).collect()),
        ValueType::I16 => Array::I16((0..n).map(|_| r() as i16).collect()),
        ValueType::U32 => Array::U32((0..n).map(|_| r() as u32).collect()),
        ValueType::I32 => Array::I32((0..n).map(|_| r() as i32).collect()),
        ValueType::U64 => Array::U64((0..n).map(|_| r()).collect()),
        ValueType::I64 => Array::I64((0..n).map(|_| r() as i64).collect()),
        // Bit patterns that are not NaN, so `==` can compare them.
        ValueType::F32 => Array::F32((0..n).map(|_| (r() % 1_000_000) as f32 / 7.0).collect()),
        ValueType::F64 => Array::F64((0..n).map(|_| (r() % 1_000_000) as f64 / -3.0).collect()),
        ValueType::Bool => Array::Bool((0..n).map(|_| r() % 2 == 0).collect()),
        ValueType::String => Array::String((0..n).map(|_| rng.bytes(12)).collect()),
        ValueType::Array => Array::Array((0..n).map(|_| random_array(rng, depth + 1)).collect()),
    }
}

fn random_value(rng: &mut Rng) -> Value {
    let x = rng.next();
    match ALL_TYPES[rng.below(13) as usize] {
        ValueType::U8 => Value::U8(x as u8),
        ValueType::I8 => Value::I8(x as i8),
        ValueType::U16 => Value::U16(x as u16),
        ValueType::I16 => Value::I16(x as i16),
        ValueType::U32 => Value::U32(x as u32),
        ValueType::I32 => Value::I32(x as i32),
        ValueType::U64 => Value::U64(x),
        ValueType::I64 => Value::I64(x as i64),
        ValueType::F32 => Value::F32((x % 10_000) as f32 * 0.25),
        ValueType::F64 => Value::F64((x % 10_000) as f64 * -0.125),
        ValueType::Bool => Value::Bool(x % 2 == 1),
        ValueType::String => Value::String(format!("s{x}é")),
        ValueType::Array => Value::Array(random_array(rng, 0)),
    }
}

const TENSOR_TYPES: [QuantType; 6] = [
    QuantType::F32,
    QuantType::F16,
    QuantType::Q4_0,
    QuantType::Q6_K,
    QuantType::IQ4_XS,
    QuantType::I8,
];

#[test]
fn random_files_round_trip() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for case in 0..200 {
        let mut w = GgufWriter::new();
        if case % 3 == 0 {
            w.set_version(2).expect("v2");
        }
        if case % 4 == 1 {
            w.set_alignment(1 << rng.below(8)).expect("alignment");
        }
        let n_kv = rng.below(12);
        for i in 0..n_kv {
            if rng.below(10) == 0 {
                let raw = rng.bytes(8);
                w.add_string_bytes(format!("k{i}.raw"), &raw);
            } else {
                w.add(format!("k{i}"), random_value(&mut rng));
            }
        }
        let mut tensors = Vec::new();
        for i in 0..rng.below(6) {
            let ty = TENSOR_TYPES[rng.below(6) as usize];
            // A scalar (no dimensions) has one element: only for types with 1-element blocks.
            let min_dims = u64::from(ty.block_size() > 1);
            let n_dims = (min_dims + rng.below(5 - min_dims)) as usize;
            let mut dims: Vec<u64> = (0..n_dims).map(|_| 1 + rng.below(3)).collect();
            if let Some(d0) = dims.first_mut() {
                *d0 *= ty.block_size() as u64;
            }
            let n = strata_gguf::tensor_bytes(&dims, ty).expect("shape");
            let data: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            w.add_tensor(&format!("t{i}"), &dims, ty, data.clone())
                .expect("tensor");
            tensors.push((format!("t{i}"), dims, ty, data));
        }
        let metadata = w.metadata().clone();
        let version = if case % 3 == 0 { 2 } else { 3 };
        let alignment = w.alignment().expect("alignment");
        let bytes = w.to_bytes().expect("write");

        let f = GgufFile::from_bytes(bytes.clone()).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert_eq!(f.version(), version);
        assert_eq!(f.alignment(), alignment);
        assert_eq!(f.metadata(), &metadata, "case {case}");
        assert_eq!(f.tensors().len(), tensors.len());
        for (t, (name, dims, ty, data)) in f.tensors().iter().zip(&tensors) {
            assert_eq!((&t.name, &t.dims, t.ty), (name, dims, *ty));
            assert_eq!(f.tensor_data(t), data.as_slice(), "case {case} {name}");
            assert_eq!(t.offset % alignment, 0);
        }
        // And writing what was read gives the same bytes again.
        let again = GgufWriter::from_file(&f)
            .expect("writer")
            .to_bytes()
            .expect("write");
        assert!(again == bytes, "case {case}: rewrite differs");
    }
}

#[test]
fn empty_arrays_keep_their_element_type() {
    let mut w = GgufWriter::new();
    for (i, ty) in ALL_TYPES.iter().enumerate() {
        w.add(format!("empty.{i}"), Array::empty(*ty));
    }
    w.add(
        "nested.empty",
        vec![Array::empty(ValueType::F64), Array::Array(vec![])],
    );
    let expected = w.metadata().clone();
    let f = GgufFile::from_bytes(w.to_bytes().expect("write")).expect("read");
    assert_eq!(f.metadata(), &expected);
    assert_eq!(
        f.get_str_array("empty.8").expect("strings"),
        Vec::<&str>::new()
    );
    assert_eq!(
        f.get_array("empty.6").expect("f32").element_type(),
        ValueType::F32
    );
}

#[test]
fn streamed_and_zero_size_tensors() {
    let mut w = GgufWriter::new();
    w.add_tensor_with("streamed", &[64, 3], QuantType::Q8_0, |out| {
        for row in 0..3u8 {
            out.write_all(&[row; 68])?;
        }
        Ok(())
    })
    .expect("streamed");
    w.add_tensor("empty", &[0, 5], QuantType::F32, Vec::new())
        .expect("empty");
    w.add_tensor("scalar", &[], QuantType::F32, 1.5f32.to_le_bytes().to_vec())
        .expect("scalar");
    let f = GgufFile::from_bytes(w.to_bytes().expect("write")).expect("read");
    let t = f.tensor("streamed").expect("streamed");
    assert_eq!(t.n_bytes, 204);
    assert_eq!(&f.tensor_data(t)[68..136], &[1u8; 68]);
    assert_eq!(f.tensor("empty").expect("empty").n_bytes, 0);
    let scalar = f.tensor("scalar").expect("scalar");
    assert_eq!(scalar.n_elements(), 1);
    assert_eq!(f.tensor_data(scalar), 1.5f32.to_le_bytes());
}

#[test]
fn writer_refuses_what_it_cannot_write() {
    let mut w = GgufWriter::new();
    let bad = |r: Result<(), GgufError>| matches!(r, Err(GgufError::BadWrite { .. }));
    assert!(bad(w.set_version(1)));
    assert!(bad(w.set_alignment(48)));
    assert!(bad(w.add_tensor("q", &[33], QuantType::Q4_0, vec![0; 18])));
    assert!(bad(w.add_tensor("f", &[4], QuantType::F32, vec![0; 15])));
    assert!(bad(w.add_tensor(
        "d",
        &[1, 1, 1, 1, 1],
        QuantType::F32,
        vec![0; 4]
    )));
    w.add_tensor("a", &[1], QuantType::F32, vec![0; 4])
        .expect("a");
    assert!(bad(w.add_tensor("a", &[1], QuantType::F32, vec![0; 4])));
    // A fill that writes the wrong number of bytes fails the write, naming the tensor.
    w.add_tensor_with("short", &[8], QuantType::F32, |out| out.write_all(&[0; 31]))
        .expect("short");
    let err = w.to_bytes().expect_err("short fill");
    assert!(err.to_string().contains("short"), "{err}");
    // general.alignment set by hand to something unusable.
    let mut w = GgufWriter::new();
    w.add("general.alignment", 64u64);
    assert!(matches!(w.to_bytes(), Err(GgufError::BadWrite { .. })));
}

#[test]
fn string_array_is_compact_and_exact() {
    let vocab: StringArray = (0..150_000).map(|i| format!("tok{i}")).collect();
    assert_eq!(vocab.len(), 150_000);
    assert_eq!(
        vocab.get(149_999).expect("last").expect("utf8"),
        "tok149999"
    );
    let mut w = GgufWriter::new();
    w.add("tokenizer.ggml.tokens", vocab.clone());
    w.add(
        "tokenizer.ggml.scores",
        (0..150_000).map(|i| i as f32).collect::<Vec<f32>>(),
    );
    let f = GgufFile::from_bytes(w.to_bytes().expect("write")).expect("read");
    assert_eq!(
        f.get_string_array("tokenizer.ggml.tokens").expect("tokens"),
        &vocab
    );
    assert_eq!(
        f.get_f32_array("tokenizer.ggml.scores").expect("scores")[12345],
        12345.0
    );
}
