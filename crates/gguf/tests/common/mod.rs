//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `tests/fixtures/vocab/*.gguf`, sorted.
pub fn vocab_files() -> Vec<PathBuf> {
    let dir = repo_root().join("tests/fixtures/vocab");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no vocab fixtures in {}", dir.display());
    files
}

/// SmolLM2-135M-Instruct Q4_1: $STRATA_SMOLLM2, else $STRATA_MODEL_DIR or
/// ~/.cache/strata/models. `None` (after one line saying so) when absent.
pub fn smollm2() -> Option<PathBuf> {
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

pub mod summary;

/// FNV-1a 64 (the hash tools/gen_gguf_golden.py records).
pub fn fnv1a(data: &[u8], mut h: u64) -> u64 {
    for &b in data {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    h
}

pub const FNV_OFFSET: u64 = 0xcbf29ce484222325;
