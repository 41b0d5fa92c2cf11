//! Compares a [`GgufFile`] with what the `gguf` Python package's GGUFReader
//! read from the same file (a summary written by tools/gen_gguf_golden.py).

use serde_json::Value as Json;
use strata_gguf::{Array, GgufFile, Value, ValueType};

use super::{FNV_OFFSET, fnv1a};

/// gguf-py's `GGUFValueType` names.
fn py_name(ty: ValueType) -> &'static str {
    match ty {
        ValueType::U8 => "UINT8",
        ValueType::I8 => "INT8",
        ValueType::U16 => "UINT16",
        ValueType::I16 => "INT16",
        ValueType::U32 => "UINT32",
        ValueType::I32 => "INT32",
        ValueType::F32 => "FLOAT32",
        ValueType::Bool => "BOOL",
        ValueType::String => "STRING",
        ValueType::Array => "ARRAY",
        ValueType::U64 => "UINT64",
        ValueType::I64 => "INT64",
        ValueType::F64 => "FLOAT64",
    }
}

/// gguf-py's type chain: an array lists its element type, following the
/// first element down nested arrays; an empty array lists nothing more.
fn type_chain(v: &Value) -> Vec<&'static str> {
    fn array_chain(a: &Array, out: &mut Vec<&'static str>) {
        out.push("ARRAY");
        match a {
            _ if a.is_empty() => {}
            Array::Array(inner) => array_chain(&inner[0], out),
            a => out.push(py_name(a.element_type())),
        }
    }
    let mut out = Vec::new();
    match v {
        Value::Array(a) => array_chain(a, &mut out),
        v => out.push(py_name(v.value_type())),
    }
    out
}

/// The raw bytes of every leaf element, nested arrays flattened (as gguf-py does).
fn leaves(a: &Array, out: &mut Vec<Vec<u8>>) {
    macro_rules! le {
        ($v:expr) => {
            out.extend($v.iter().map(|x| x.to_le_bytes().to_vec()))
        };
    }
    match a {
        Array::U8(v) => le!(v),
        Array::I8(v) => le!(v),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::F64(v) => le!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| vec![u8::from(b)])),
        Array::String(s) => out.extend(s.iter_bytes().map(<[u8]>::to_vec)),
        Array::Array(inner) => inner.iter().for_each(|a| leaves(a, out)),
    }
}

fn json_string_bytes(j: &Json) -> Vec<u8> {
    match j {
        Json::String(s) => s.as_bytes().to_vec(),
        Json::Object(o) => {
            let hex = o["hex"].as_str().expect("hex");
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digit"))
                .collect()
        }
        j => panic!("not a string in the golden: {j}"),
    }
}

fn json_f64(j: &Json) -> f64 {
    match j {
        Json::Object(o) => o["float"].as_str().expect("float").parse().expect("float"),
        j => j.as_f64().expect("number"),
    }
}

/// Checks a leaf's bytes against the golden's rendering of it.
fn check_leaf(ctx: &str, leaf_type: &str, bytes: &[u8], j: &Json) {
    let ok = match leaf_type {
        "STRING" => json_string_bytes(j) == bytes,
        "BOOL" => j.as_bool() == Some(bytes == [1]),
        "FLOAT32" => {
            let f = f32::from_le_bytes(bytes.try_into().expect("f32"));
            f64::from(f) == json_f64(j)
        }
        "FLOAT64" => f64::from_le_bytes(bytes.try_into().expect("f64")) == json_f64(j),
        _ => {
            let mut wide = [0u8; 16];
            wide[..bytes.len()].copy_from_slice(bytes);
            let signed = leaf_type.starts_with("INT");
            let negative = signed && bytes.last().is_some_and(|b| b & 0x80 != 0);
            if negative {
                wide[bytes.len()..].fill(0xff);
            }
            let v = i128::from_le_bytes(wide);
            j.as_i64().map(i128::from).or(j.as_u64().map(i128::from)) == Some(v)
        }
    };
    assert!(ok, "{ctx}: {bytes:02x?} read, golden has {j}");
}

fn check_value(f: &GgufFile, key: &str, golden: &Json) {
    let value = f.get(key).unwrap_or_else(|| panic!("{key}: missing"));
    let types: Vec<&str> = golden["types"]
        .as_array()
        .expect("types")
        .iter()
        .map(|t| t.as_str().expect("type"))
        .collect();
    assert_eq!(type_chain(value), types, "{key}: type");
    let leaf_type = *types.last().expect("type");
    let Value::Array(array) = value else {
        let bytes = match value {
            Value::String(_) => f.get_string_bytes(key).expect("string").to_vec(),
            Value::U8(v) => v.to_le_bytes().to_vec(),
            Value::I8(v) => v.to_le_bytes().to_vec(),
            Value::U16(v) => v.to_le_bytes().to_vec(),
            Value::I16(v) => v.to_le_bytes().to_vec(),
            Value::U32(v) => v.to_le_bytes().to_vec(),
            Value::I32(v) => v.to_le_bytes().to_vec(),
            Value::U64(v) => v.to_le_bytes().to_vec(),
            Value::I64(v) => v.to_le_bytes().to_vec(),
            Value::F32(v) => v.to_le_bytes().to_vec(),
            Value::F64(v) => v.to_le_bytes().to_vec(),
            Value::Bool(v) => vec![u8::from(*v)],
            Value::Array(_) => unreachable!(),
        };
        check_leaf(key, leaf_type, &bytes, &golden["value"]);
        return;
    };
    let mut flat = Vec::new();
    leaves(array, &mut flat);
    assert_eq!(
        flat.len() as u64,
        golden["len"].as_u64().expect("len"),
        "{key}: length"
    );
    // gguf-py hashes string leaves with their 8-byte length, others raw.
    let mut h = FNV_OFFSET;
    for leaf in &flat {
        if leaf_type == "STRING" {
            h = fnv1a(&(leaf.len() as u64).to_le_bytes(), h);
        }
        h = fnv1a(leaf, h);
    }
    assert_eq!(
        format!("{h:016x}"),
        golden["fnv1a"].as_str().expect("fnv"),
        "{key}: hash"
    );
    let shown: Vec<&Vec<u8>> = if let Some(values) = golden.get("values") {
        assert_eq!(values.as_array().expect("values").len(), flat.len());
        flat.iter().collect()
    } else {
        let n = flat.len();
        let mut idx: Vec<usize> = (0..n.min(3)).collect();
        idx.extend(n.saturating_sub(2)..n);
        idx.iter().map(|&i| &flat[i]).collect()
    };
    let golden_values = golden
        .get("values")
        .or(golden.get("first"))
        .and_then(Json::as_array)
        .expect("values");
    for (i, (leaf, j)) in shown.iter().zip(golden_values).enumerate() {
        check_leaf(&format!("{key}[{i}]"), leaf_type, leaf, j);
    }
}

/// Asserts that `f` reads as the golden `summary` says gguf-py read it.
pub fn assert_matches(f: &GgufFile, summary: &Json) {
    let name = summary["file"].as_str().expect("file");
    assert_eq!(
        u64::from(f.version()),
        summary["version"],
        "{name}: version"
    );
    assert_eq!(f.alignment(), summary["alignment"], "{name}: alignment");
    assert_eq!(f.file_len(), summary["file_len"], "{name}: length");
    let kv = summary["kv"].as_array().expect("kv");
    let keys: Vec<&str> = f.metadata().keys().collect();
    let golden_keys: Vec<&str> = kv.iter().map(|e| e["key"].as_str().expect("key")).collect();
    assert_eq!(keys, golden_keys, "{name}: keys in order");
    for entry in kv {
        check_value(f, entry["key"].as_str().expect("key"), entry);
    }
    let tensors = summary["tensors"].as_array().expect("tensors");
    assert_eq!(f.tensors().len(), tensors.len(), "{name}: tensor count");
    if !tensors.is_empty() {
        assert_eq!(
            f.data_offset(),
            summary["data_offset"],
            "{name}: data offset"
        );
    }
    for (t, g) in f.tensors().iter().zip(tensors) {
        let ctx = format!("{name}: tensor {}", t.name);
        assert_eq!(t.name, g["name"].as_str().expect("name"), "{ctx}");
        let dims: Vec<u64> = g["dims"]
            .as_array()
            .expect("dims")
            .iter()
            .map(|d| d.as_u64().expect("dim"))
            .collect();
        assert_eq!(t.dims, dims, "{ctx}: dims");
        assert_eq!(u64::from(t.ty.id()), g["type"], "{ctx}: type");
        assert_eq!(t.offset, g["offset"], "{ctx}: offset");
        assert_eq!(t.n_bytes, g["n_bytes"], "{ctx}: bytes");
        if let Some(hash) = g.get("fnv1a") {
            let h = fnv1a(f.tensor_data(t), FNV_OFFSET);
            assert_eq!(
                format!("{h:016x}"),
                hash.as_str().expect("hash"),
                "{ctx}: data hash"
            );
        }
    }
}

/// The golden JSON file `name` under tests/golden/gguf.
pub fn load(name: &str) -> Json {
    let path = super::repo_root().join("tests/golden/gguf").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden JSON")
}
