//! `olmoe` (OLMoE-1B-7B): NeoX RoPE, RMS norm of Q and K over all heads at once, softmax
//! router without normalisation.

use strata_gguf::GgufFile;

use crate::error::Result;
use crate::hparams::{self, HParams, QkNorm, RopeMode};

pub fn hparams(g: &GgufFile) -> Result<HParams> {
    let mut h = hparams::common(g, RopeMode::Neox)?;
    h.qk_norm = QkNorm::Full;
    let mut moe = hparams::moe(g, &h, false)?;
    // OLMoE's experts are feed_forward_length wide, as llama.cpp sizes them.
    moe.n_ff_exp = h.n_ff;
    h.moe = Some(moe);
    Ok(h)
}
