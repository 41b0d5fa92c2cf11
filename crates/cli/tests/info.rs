//! `strata info` on the real SmolLM2 file (figures from the `gguf` Python
//! package 0.19) and on a small MoE file whose expert split is known by
//! construction.

use std::path::{Path, PathBuf};
use std::process::Command;

use strata_gguf::{GgufWriter, QuantType};

fn smollm2() -> Option<PathBuf> {
    let path = std::env::var_os("STRATA_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let dir = std::env::var_os("STRATA_MODEL_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/strata/models")
                });
            dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "SmolLM2 model not found at {} (run ci/fetch-models.sh); skipping",
            path.display()
        );
        None
    }
}

fn strata_info(file: &Path, extra: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("info")
        .arg(file)
        .args(extra)
        .output()
        .expect("run strata");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The line starting with `label` (labels are padded to a column).
fn line<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(label) && l[label.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no `{label}` line in:\n{text}"))
}

fn field<'a>(text: &'a str, label: &str) -> &'a str {
    line(text, label)[label.len()..].trim()
}

#[test]
fn smollm2_text() {
    let Some(path) = smollm2() else { return };
    let (ok, out, err) = strata_info(&path, &[]);
    assert!(ok, "strata info failed: {err}");
    assert_eq!(field(&out, "architecture"), "llama");
    assert_eq!(field(&out, "layers"), "30");
    assert_eq!(field(&out, "embedding"), "576");
    assert_eq!(field(&out, "feed-forward"), "1536");
    assert_eq!(field(&out, "heads"), "9");
    assert_eq!(field(&out, "kv heads"), "3");
    assert_eq!(field(&out, "context"), "8192");
    assert_eq!(field(&out, "rope freq base"), "100000");
    assert_eq!(field(&out, "tokenizer"), "gpt2 (pre: smollm)");
    assert_eq!(field(&out, "vocab"), "49152 tokens");
    assert!(field(&out, "tensors").starts_with("272 "), "{out}");
    let q4_1: Vec<&str> = line(&out, "  Q4_1").split_whitespace().collect();
    assert_eq!(q4_1[1..3], ["210", "tensors"], "{out}");
    let f32_row: Vec<&str> = line(&out, "  F32").split_whitespace().collect();
    assert_eq!(f32_row[1], "61");
    assert!(!out.contains("MoE layers"));
}

#[test]
fn smollm2_json() {
    let Some(path) = smollm2() else { return };
    let (ok, out, err) = strata_info(&path, &["--json", "--vram-gib", "1"]);
    assert!(ok, "strata info failed: {err}");
    let j: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let hp = &j["hyper_parameters"];
    assert_eq!(hp["llama.block_count"], 30);
    assert_eq!(hp["llama.embedding_length"], 576);
    assert_eq!(hp["llama.rope.freq_base"], 100000.0);
    assert_eq!(j["tokenizer"]["vocab_size"], 49152);
    assert_eq!(j["tensors"], 272);
    assert_eq!(j["by_type"]["Q4_1"]["tensors"], 210);
    assert_eq!(j["by_type"]["Q8_0"]["tensors"], 1);
    assert_eq!(j["experts"], serde_json::Value::Null);
}

/// A two-layer, four-expert model: expert tensors Q8_0, the rest F32.
fn write_moe(path: &Path) {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "qwen3moe");
    w.add("general.name", "tiny moe");
    w.add("qwen3moe.block_count", 2u32);
    w.add("qwen3moe.embedding_length", 64u32);
    w.add("qwen3moe.expert_count", 4u32);
    w.add("qwen3moe.expert_used_count", 2u32);
    w.add("qwen3moe.expert_feed_forward_length", 32u32);
    w.add("tokenizer.ggml.model", "gpt2");
    w.add("tokenizer.ggml.tokens", vec!["a", "b", "c"]);
    let mut add = |name: &str, dims: &[u64], ty: QuantType| {
        let n = strata_gguf::tensor_bytes(dims, ty).expect("shape");
        w.add_tensor(name, dims, ty, vec![0u8; n as usize])
            .expect("tensor");
    };
    add("token_embd.weight", &[64, 10], QuantType::F32); // 2560 bytes
    for l in 0..2 {
        add(&format!("blk.{l}.attn_norm.weight"), &[64], QuantType::F32); // 256
        add(
            &format!("blk.{l}.ffn_gate_inp.weight"),
            &[64, 4],
            QuantType::F32,
        ); // 1024
        add(
            &format!("blk.{l}.ffn_gate_exps.weight"),
            &[64, 32, 4],
            QuantType::Q8_0,
        ); // 8704
        add(
            &format!("blk.{l}.ffn_up_exps.weight"),
            &[64, 32, 4],
            QuantType::Q8_0,
        ); // 8704
        add(
            &format!("blk.{l}.ffn_down_exps.weight"),
            &[32, 64, 4],
            QuantType::Q8_0,
        ); // 8704
    }
    w.write_file(path).expect("write");
}

const NON_EXPERT: u64 = 2560 + 2 * (256 + 1024);
const PER_EXPERT: u64 = 3 * 8704 / 4; // each layer's three stacked tensors over 4 experts

#[test]
fn moe_expert_split_and_vram_fit() {
    let dir = std::env::temp_dir().join(format!("strata-info-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("tiny-moe.gguf");
    write_moe(&path);

    // Room for exactly three experts (plus a little) beside the rest.
    let vram = NON_EXPERT + 3 * PER_EXPERT + 100;
    let gib = vram as f64 / (1u64 << 30) as f64;
    let (ok, out, err) = strata_info(&path, &["--vram-gib", &gib.to_string()]);
    assert!(ok, "strata info failed: {err}");
    assert_eq!(field(&out, "experts"), "4");
    assert_eq!(field(&out, "experts used"), "2");
    assert_eq!(field(&out, "MoE layers"), "2 × 4 experts = 8 experts");
    assert!(
        field(&out, "bytes per expert").starts_with(&format!("{PER_EXPERT} ")),
        "{out}"
    );
    assert!(
        field(&out, "non-expert bytes").starts_with(&format!("{NON_EXPERT} ")),
        "{out}"
    );
    assert!(
        field(&out, "vram").contains(": 3 of 8 experts fit"),
        "{out}"
    );

    let (ok, out, _) = strata_info(&path, &["--json", "--vram-gib", "1"]);
    assert!(ok);
    let j: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(j["experts"]["bytes_per_expert"], PER_EXPERT);
    assert_eq!(j["experts"]["non_expert_bytes"], NON_EXPERT);
    assert_eq!(j["experts"]["fit_in_vram"], 8);

    let small = (NON_EXPERT - 1) as f64 / (1u64 << 30) as f64;
    let (ok, out, _) = strata_info(&path, &["--vram-gib", &small.to_string()]);
    assert!(ok);
    assert!(field(&out, "vram").contains("too small"), "{out}");

    let (ok, _, err) = strata_info(&dir.join("missing.gguf"), &[]);
    assert!(!ok && err.contains("missing.gguf"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
