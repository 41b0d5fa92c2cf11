//! `strata synth` against the files llama.cpp loaded and ran
//! (tests/golden/models/synth, from tools/gen_model_golden.py): re-creating
//! each golden spec gives the very same bytes (sha256), and the file, read
//! with strata-gguf, has the tensors and hyper-parameters that the `gguf`
//! package read from the file llama.cpp accepted.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers panic on broken goldens

use std::path::PathBuf;

use serde_json::Value as Json;
use strata_gguf::{GgufFile, Value};
use strata_model::synth::{self, SynthSpec};

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/models/synth")
}

fn index() -> Json {
    let path = golden_dir().join("index.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// SHA-256 (FIPS 180-4), so the test needs no hashing crate.
fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for chunk in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes([
                chunk[4 * i],
                chunk[4 * i + 1],
                chunk[4 * i + 2],
                chunk[4 * i + 3],
            ]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[test]
fn sha256_matches_the_standard_vectors() {
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    assert_eq!(
        sha256_hex(long),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
}

/// A scalar metadata value as the JSON number/string/bool the `gguf` package wrote.
fn value_as_json(v: &Value) -> Json {
    match v {
        Value::String(s) => Json::from(s.as_str()),
        Value::Bool(b) => Json::from(*b),
        Value::F32(f) => Json::from(f64::from(*f)),
        Value::F64(f) => Json::from(*f),
        other => Json::from(other.as_integer().map(|i| i as i64).unwrap_or(i64::MIN)),
    }
}

#[test]
fn every_golden_spec_is_re_created_byte_for_byte() {
    let index = index();
    let models = index["models"].as_array().unwrap();
    assert!(models.len() >= 35, "5 architectures × 7 formats expected");
    for m in models {
        let name = m["name"].as_str().unwrap();
        let spec: SynthSpec = serde_json::from_value(m["spec"].clone()).unwrap();
        let bytes = synth::synthesize(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            bytes.len() as u64,
            m["file_bytes"].as_u64().unwrap(),
            "{name}: size"
        );
        assert_eq!(
            sha256_hex(&bytes),
            m["sha256"].as_str().unwrap(),
            "{name}: sha256"
        );

        let file = GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The tensors llama.cpp found (it refuses a missing, extra or mis-shaped one).
        let expected = m["tensors"].as_array().unwrap();
        assert_eq!(file.tensors().len(), expected.len(), "{name}: tensor count");
        for (t, e) in file.tensors().iter().zip(expected) {
            assert_eq!(t.name, e["name"].as_str().unwrap(), "{name}");
            let dims: Vec<u64> = e["dims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(t.dims, dims, "{name}: {}", t.name);
            assert_eq!(
                t.ty.name(),
                e["type"].as_str().unwrap(),
                "{name}: {}",
                t.name
            );
        }
        for (key, want) in m["metadata"].as_object().unwrap() {
            let got = file
                .get(key)
                .unwrap_or_else(|| panic!("{name}: no `{key}`"));
            assert_eq!(&value_as_json(got), want, "{name}: `{key}`");
        }
        // The spec travels in the file.
        let embedded: SynthSpec =
            serde_json::from_str(file.get_str(synth::SPEC_KEY).unwrap()).unwrap();
        assert_eq!(embedded, spec, "{name}: embedded spec");
    }
}

#[test]
fn golden_logits_files_match_their_index() {
    let index = index();
    for m in index["models"].as_array().unwrap() {
        let shape: Vec<usize> = m["logits_shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let tokens = m["tokens"].as_array().unwrap();
        assert_eq!(shape[0], tokens.len());
        assert_eq!(shape[1] as u64, m["spec"]["vocab"].as_u64().unwrap());
        let path = golden_dir().join(m["logits_file"].as_str().unwrap());
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(raw.len(), shape[0] * shape[1] * 4, "{}", path.display());
        let logits: Vec<f32> = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert!(logits.iter().all(|x| x.is_finite()));
        for (pos, want) in m["argmax"].as_array().unwrap().iter().enumerate() {
            let row = &logits[pos * shape[1]..(pos + 1) * shape[1]];
            let arg = row
                .iter()
                .enumerate()
                .fold(0, |best, (i, &x)| if x > row[best] { i } else { best });
            assert_eq!(arg as u64, want.as_u64().unwrap());
        }
    }
}
