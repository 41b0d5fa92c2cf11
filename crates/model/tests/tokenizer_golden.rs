//! Token ids against llama.cpp's `llama-tokenize` (tests/golden/tokenizer, made by
//! tools/gen_tokenizer_golden.py): hand-picked and random texts, each tokenized as
//! a user would (BOS/EOS per the model, special tokens parsed) and raw, plus the
//! piece llama.cpp prints for every token seen.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use strata_model::tokenizer::{Tokenizer, TokenizerSpec};

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
    /// Token id → its piece as llama.cpp prints it (hex bytes).
    #[serde(default)]
    pieces: BTreeMap<String, String>,
    /// For the pre-tokenizer goldens: the `tokenizer.ggml.pre` put on the gpt-2 vocabulary.
    #[serde(default)]
    pre: Option<String>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    add_special: bool,
    parse_special: bool,
    ids: Vec<u32>,
}

fn load(name: &str) -> Golden {
    let path = common::golden_dir("tokenizer").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden JSON")
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Every difference between `tok` and the golden.
fn compare(tok: &Tokenizer, golden: &Golden, name: &str) -> Vec<String> {
    assert!(
        golden.cases.len() >= 40,
        "{name}: only {} cases",
        golden.cases.len()
    );
    let mut failures = Vec::new();
    for c in &golden.cases {
        let got = tok
            .encode(&c.text, c.add_special, c.parse_special)
            .expect("encoding");
        if got != c.ids {
            failures.push(format!(
                "  {:?} (add_special {}, parse_special {})\n    want {:?}\n    got  {:?}",
                c.text, c.add_special, c.parse_special, c.ids, got
            ));
        }
    }
    for (id, hex) in &golden.pieces {
        let id: u32 = id.parse().expect("an id");
        let want = unhex(hex);
        let got = tok.token_to_piece(id, 0, true);
        if got != want.as_slice() {
            failures.push(format!(
                "  piece of {id}: want {:?} got {:?}",
                String::from_utf8_lossy(&want),
                String::from_utf8_lossy(got)
            ));
        }
    }
    failures
}

fn check(model: &Path, name: &str) {
    let tok = Tokenizer::from_gguf_file(model).expect("loading the vocabulary");
    let golden = load(name);
    assert!(
        golden.pieces.len() > 50,
        "{name}: only {} pieces",
        golden.pieces.len()
    );
    let failures = compare(&tok, &golden, name);
    assert!(
        failures.is_empty(),
        "{name}: {} differences from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn vocab(name: &str) {
    check(
        &common::vocab_dir().join(format!("ggml-vocab-{name}.gguf")),
        &format!("vocab-{name}"),
    );
}

#[test]
fn smollm2_matches_llama_tokenize() {
    let Some(model) = common::smollm2() else {
        return;
    };
    check(&model, "smollm2");
}

#[test]
fn gpt_2_matches_llama_tokenize() {
    vocab("gpt-2");
}

#[test]
fn llama_bpe_matches_llama_tokenize() {
    vocab("llama-bpe");
}

#[test]
fn qwen2_matches_llama_tokenize() {
    vocab("qwen2");
}

#[test]
fn deepseek_llm_matches_llama_tokenize() {
    vocab("deepseek-llm");
}

#[test]
fn falcon_matches_llama_tokenize() {
    vocab("falcon");
}

#[test]
fn llama_spm_matches_llama_tokenize() {
    vocab("llama-spm");
}

#[test]
fn phi_3_matches_llama_tokenize() {
    vocab("phi-3");
}

/// Every supported pre-tokenizer, on the gpt-2 vocabulary with `tokenizer.ggml.pre`
/// replaced (so llama.cpp applied that pre-tokenizer's regexes and flags).
#[test]
fn every_pre_tokenizer_matches_llama_tokenize() {
    let file = strata_gguf::GgufFile::open(common::vocab_dir().join("ggml-vocab-gpt-2.gguf"))
        .expect("gpt-2 vocab");
    let base = TokenizerSpec::from_gguf(&file).expect("spec");
    let mut names: Vec<String> = std::fs::read_dir(common::golden_dir("tokenizer"))
        .expect("golden dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("pre-") && n.ends_with(".json"))
        .map(|n| n.trim_end_matches(".json").to_owned())
        .collect();
    names.sort();
    assert!(
        names.len() >= 30,
        "only {} pre-tokenizer goldens",
        names.len()
    );
    let mut failures = Vec::new();
    for name in &names {
        let golden = load(name);
        let spec = TokenizerSpec {
            pre: golden.pre.clone(),
            ..base.clone()
        };
        let tok = Tokenizer::from_spec(&spec).expect("tokenizer");
        failures.extend(
            compare(&tok, &golden, name)
                .into_iter()
                .map(|f| format!("{name}: {f}")),
        );
    }
    assert!(
        failures.is_empty(),
        "{} differences from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
