//! `qwen3moe` (Qwen3-30B-A3B and kin): NeoX RoPE, RMS norm of Q and K per head, softmax
//! router with the top-k weights normalised.

use strata_gguf::GgufFile;

use crate::error::Result;
use crate::hparams::{self, HParams, QkNorm, RopeMode};

pub fn hparams(g: &GgufFile) -> Result<HParams> {
    let mut h = hparams::common(g, RopeMode::Neox)?;
    h.qk_norm = QkNorm::PerHead;
    h.moe = Some(hparams::moe(g, &h, true)?);
    Ok(h)
}
