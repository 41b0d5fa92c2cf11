//! Token ids against llama.cpp's `llama-tokenize` (tests/golden/tokenizer, made by
//! tools/gen_tokenizer_golden.py): hand-picked and random texts, each tokenized as
//! a user would (BOS/EOS per the model, special tokens parsed) and raw.

mod common;

use std::path::Path;

use serde::Deserialize;
use strata_model::tokenizer::Tokenizer;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
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

fn check(model: &Path, name: &str) {
    let tok = Tokenizer::from_gguf_file(model).expect("loading the vocabulary");
    let golden = load(name);
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
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        golden.cases.len(),
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
