//! Tokenizer speed on 1 MiB of text (the chat templates of tests/fixtures,
//! repeated): a measurement for BENCHMARKS.md, not a pass/fail test.
//! Run: cargo test --release -p strata-model --test tokenizer_bench -- --ignored --nocapture
//! (STRATA_BENCH_TEXT=path also writes the text there, to time llama-tokenize on it).

mod common;

use std::time::Instant;

use strata_model::tokenizer::Tokenizer;

fn bench_text() -> String {
    let dir = common::repo_root().join("tests/fixtures/templates");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("templates")
        .map(|e| e.expect("entry").path())
        .collect();
    paths.sort();
    let corpus: String = paths
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("template"))
        .collect();
    let mut text = String::with_capacity(1 << 20);
    while text.len() < 1 << 20 {
        text.push_str(&corpus);
    }
    let mut cut = 1 << 20;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text
}

#[test]
#[ignore = "benchmark"]
fn tokenize_one_mebibyte() {
    let text = bench_text();
    if let Some(path) = std::env::var_os("STRATA_BENCH_TEXT") {
        std::fs::write(path, &text).expect("writing the text");
    }
    let mut models = vec![
        ("gpt-2", common::vocab_dir().join("ggml-vocab-gpt-2.gguf")),
        (
            "llama-bpe",
            common::vocab_dir().join("ggml-vocab-llama-bpe.gguf"),
        ),
        (
            "llama-spm",
            common::vocab_dir().join("ggml-vocab-llama-spm.gguf"),
        ),
    ];
    if let Some(p) = common::smollm2() {
        models.insert(0, ("SmolLM2", p));
    }
    for (name, path) in models {
        let tok = Tokenizer::from_gguf_file(&path).expect("vocab");
        let _ = tok.encode(&text[..4096], false, true).expect("warm-up");
        // The best of five runs: the machine is shared, the minimum is the least disturbed.
        let mut secs = f64::INFINITY;
        let mut ids = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            ids = tok.encode(&text, false, true).expect("encode");
            secs = secs.min(start.elapsed().as_secs_f64());
        }
        println!(
            "{name}: {} bytes -> {} tokens in {:.3} s ({:.2} MB/s)",
            text.len(),
            ids.len(),
            secs,
            text.len() as f64 / secs / 1e6
        );
    }
}
