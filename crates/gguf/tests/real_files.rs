//! Real GGUF files written by llama.cpp's and the `gguf` package's converters.

mod common;

use strata_gguf::{GgufFile, QuantType};

#[test]
fn every_vocab_fixture_opens() {
    for path in common::vocab_files() {
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tokens = f
            .get_bytes_array("tokenizer.ggml.tokens")
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            tokens.len() > 1000,
            "{}: {} tokens",
            path.display(),
            tokens.len()
        );
        f.get_str("tokenizer.ggml.model").expect("tokenizer model");
    }
}

/// Every vocab fixture and SmolLM2 read exactly as gguf-py 0.19 reads them:
/// keys in order, types, values, array hashes, tensor index and data hashes.
#[test]
fn real_files_match_gguf_py() {
    let golden = common::summary::load("real_files.json");
    let golden = golden.as_array().expect("list");
    let vocab = common::vocab_files();
    let smollm2 = common::smollm2();
    let mut checked = 0;
    for summary in golden {
        let name = summary["file"].as_str().expect("file");
        let path = vocab
            .iter()
            .find(|p| p.file_name().is_some_and(|n| n == name))
            .cloned()
            .or_else(|| {
                smollm2
                    .clone()
                    .filter(|p| p.file_name().is_some_and(|n| n == name))
            });
        let Some(path) = path else {
            eprintln!("{name}: not present here; skipping its comparison");
            continue;
        };
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        common::summary::assert_matches(&f, summary);
        checked += 1;
    }
    assert!(checked >= vocab.len(), "only {checked} files compared");
}

#[test]
fn smollm2_hyper_parameters_and_tensors() {
    let Some(path) = common::smollm2() else {
        return;
    };
    let f = GgufFile::open(&path).expect("open SmolLM2");
    // Figures from the `gguf` Python package 0.19 (GGUFReader) on this file.
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset(), 1_785_664);
    assert_eq!(f.architecture().expect("arch"), "llama");
    assert_eq!(f.arch_u32("block_count").expect("layers"), 30);
    assert_eq!(f.arch_u32("embedding_length").expect("embd"), 576);
    assert_eq!(f.arch_f32("rope.freq_base").expect("rope"), 100000.0);
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens")
            .expect("tokens")
            .len(),
        49152
    );
    assert_eq!(
        f.get_str_array("tokenizer.ggml.merges")
            .expect("merges")
            .len(),
        48900
    );
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type")
            .expect("types")
            .len(),
        49152
    );
    assert_eq!(f.get_u32("tokenizer.ggml.bos_token_id").expect("bos"), 1);
    assert!(!f.get_bool("tokenizer.ggml.add_bos_token").expect("add_bos"));
    assert_eq!(
        f.get_str_array("general.languages").expect("languages"),
        ["en"]
    );
    assert_eq!(f.metadata().len(), 33);
    assert_eq!(f.tensors().len(), 272);
    let count = |ty| f.tensors().iter().filter(|t| t.ty == ty).count();
    assert_eq!(count(QuantType::Q4_1), 210);
    assert_eq!(count(QuantType::F32), 61);
    assert_eq!(count(QuantType::Q8_0), 1);
    let embd = f.tensor("token_embd.weight").expect("token_embd");
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(f.tensor_data(embd).len() as u64, embd.n_bytes);
}
