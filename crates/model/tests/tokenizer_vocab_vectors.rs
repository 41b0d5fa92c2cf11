//! llama.cpp's tokenizer test vectors (tests/fixtures/vocab/*.gguf.inp/.out, made
//! by its test-tokenizer-0 scripts from the Hugging Face tokenizers): every text
//! must give exactly the listed ids, with no BOS/EOS and special tokens not
//! parsed, as test-tokenizer-0 calls `common_tokenize(ctx, text, false, false)`.

mod common;

use strata_model::tokenizer::Tokenizer;

const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn read_vectors(name: &str) -> Vec<(String, Vec<u32>)> {
    let dir = common::vocab_dir();
    let inp = std::fs::read_to_string(dir.join(format!("{name}.inp"))).expect("reading .inp");
    let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).expect("reading .out");
    // Texts are separated by the marker line; the file ends with one.
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEPARATOR) {
            Some(i) => {
                texts.push(rest[..i].to_owned());
                rest = &rest[i + SEPARATOR.len()..];
            }
            None => {
                texts.push(rest.to_owned());
                rest = "";
            }
        }
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("an id in .out"))
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{name}: .inp and .out disagree on the number of tests"
    );
    texts.into_iter().zip(ids).collect()
}

fn check(name: &str) {
    let tok =
        Tokenizer::from_gguf_file(common::vocab_dir().join(name)).expect("loading the vocabulary");
    let vectors = read_vectors(name);
    assert!(vectors.len() > 30, "{name}: only {} vectors", vectors.len());
    let mut failures = Vec::new();
    for (text, want) in &vectors {
        let got = tok.encode(text, false, false).expect("encoding");
        if &got != want {
            failures.push(format!("  {text:?}\n    want {want:?}\n    got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} vectors differ:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
}

#[test]
fn gpt_2() {
    check("ggml-vocab-gpt-2.gguf");
}

#[test]
fn llama_bpe() {
    check("ggml-vocab-llama-bpe.gguf");
}

#[test]
fn qwen2() {
    check("ggml-vocab-qwen2.gguf");
}

#[test]
fn deepseek_llm() {
    check("ggml-vocab-deepseek-llm.gguf");
}

#[test]
fn falcon() {
    check("ggml-vocab-falcon.gguf");
}

#[test]
fn llama_spm() {
    check("ggml-vocab-llama-spm.gguf");
}

#[test]
fn phi_3() {
    check("ggml-vocab-phi-3.gguf");
}
