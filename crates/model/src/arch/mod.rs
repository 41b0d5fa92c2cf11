//! One file per architecture: how its GGUF metadata maps to hyper-parameters and which
//! variant of the shared transformer blocks it uses.

mod llama;
mod olmoe;
mod qwen2moe;
mod qwen3moe;

use strata_gguf::GgufFile;

use crate::error::{ModelError, Result};
use crate::hparams::HParams;

/// Architectures strata runs, by `general.architecture`.
pub const SUPPORTED: [&str; 4] = ["llama", "qwen3moe", "qwen2moe", "olmoe"];

/// Hyper-parameters of the file's architecture, or a clear refusal.
pub fn hparams(g: &GgufFile) -> Result<HParams> {
    let arch = g.architecture()?;
    match arch {
        "llama" => llama::hparams(g),
        "qwen3moe" => qwen3moe::hparams(g),
        "qwen2moe" => qwen2moe::hparams(g),
        "olmoe" => olmoe::hparams(g),
        other => Err(ModelError::UnsupportedArch(
            other.to_string(),
            SUPPORTED.join(", "),
        )),
    }
}
