//! `llama`: dense (SmolLM2, Llama) and with experts (Mixtral). Normal RoPE; MoE weights
//! are normalised over the chosen experts.

use strata_gguf::GgufFile;

use crate::error::Result;
use crate::hparams::{self, HParams, RopeMode};

pub fn hparams(g: &GgufFile) -> Result<HParams> {
    let mut h = hparams::common(g, RopeMode::Normal)?;
    let experts = hparams::u32_or(g, "expert_count", 0)?;
    if experts > 0 {
        let mut moe = hparams::moe(g, &h, true)?;
        // Mixtral's experts are feed_forward_length wide, as llama.cpp sizes them.
        moe.n_ff_exp = h.n_ff;
        h.moe = Some(moe);
    }
    Ok(h)
}
