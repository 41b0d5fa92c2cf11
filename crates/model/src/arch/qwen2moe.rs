//! `qwen2moe` (Qwen1.5-MoE, Qwen2-57B-A14B): NeoX RoPE, Q/K/V biases, softmax router
//! without normalisation, and a shared expert scaled by a sigmoid gate.

use strata_gguf::GgufFile;

use crate::error::{ModelError, Result};
use crate::hparams::{self, HParams, RopeMode};

pub fn hparams(g: &GgufFile) -> Result<HParams> {
    let mut h = hparams::common(g, RopeMode::Neox)?;
    h.attn_bias = true;
    let mut moe = hparams::moe(g, &h, false)?;
    let shared = hparams::u32_or(g, "expert_shared_feed_forward_length", 0)?;
    if shared == 0 {
        return Err(ModelError::BadHParams(
            "qwen2moe: expert_shared_feed_forward_length is missing".into(),
        ));
    }
    moe.n_ff_shared = Some(shared);
    h.moe = Some(moe);
    Ok(h)
}
