//! Paths shared by the model crate's tests.
#![allow(dead_code)]

use std::path::PathBuf;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn vocab_dir() -> PathBuf {
    repo_root().join("tests/fixtures/vocab")
}

pub fn golden_dir(area: &str) -> PathBuf {
    repo_root().join("tests/golden").join(area)
}

/// The SmolLM2 model, or `None` (after saying so) when it is not on this machine.
pub fn smollm2() -> Option<PathBuf> {
    let path = match std::env::var_os("STRATA_SMOLLM2") {
        Some(p) => PathBuf::from(p),
        None => {
            let dir = match std::env::var_os("STRATA_MODEL_DIR") {
                Some(d) => PathBuf::from(d),
                None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                    .join(".cache/strata/models"),
            };
            dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")
        }
    };
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "SmolLM2 not found at {} (run ci/fetch-models.sh); skipping",
            path.display()
        );
        None
    }
}
