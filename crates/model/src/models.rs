//! Where cached model files are found: ci/fetch-models.sh (the README's commands) puts them
//! in `$STRATA_MODEL_DIR` or `~/.cache/strata/models`, and every test that runs the real
//! model looks for it here.

use std::path::PathBuf;

/// The real model of the tests and the main command.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The folder of cached models: `$STRATA_MODEL_DIR`, else `~/.cache/strata/models`.
pub fn model_dir() -> Option<PathBuf> {
    std::env::var_os("STRATA_MODEL_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/strata/models")))
}

/// SmolLM2-135M-Instruct Q4_1: `$STRATA_SMOLLM2`, else [`SMOLLM2_FILE`] in [`model_dir`];
/// `None` when that file does not exist.
pub fn smollm2_path() -> Option<PathBuf> {
    let p = match std::env::var_os("STRATA_SMOLLM2") {
        Some(p) => PathBuf::from(p),
        None => model_dir()?.join(SMOLLM2_FILE),
    };
    p.exists().then_some(p)
}
