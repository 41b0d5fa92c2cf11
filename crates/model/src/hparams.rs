//! Hyper-parameters read from GGUF metadata, as llama.cpp reads them.

use strata_gguf::GgufFile;

use crate::error::{ModelError, Result};

/// How rotary embeddings pair dimensions (ggml's rope modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Pairs (2i, 2i+1): llama.
    Normal = 0,
    /// Pairs (i, i + n_rot/2): qwen, olmoe.
    Neox = 2,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub mode: RopeMode,
    pub n_rot: u32,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: u32,
}

/// Where Q/K normalisation applies (qwen3: per head; olmoe: over all heads at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    PerHead,
    Full,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    pub n_expert: u32,
    pub n_expert_used: u32,
    pub n_ff_exp: u32,
    /// Divide the chosen experts' weights by their sum.
    pub norm_topk: bool,
    /// qwen2moe's shared expert with a sigmoid gate, and its FFN width.
    pub n_ff_shared: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    pub arch: String,
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub n_ff: u32,
    pub n_vocab: u32,
    pub n_ctx_train: u32,
    pub rms_eps: f32,
    pub rope: Rope,
    pub attn_scale: f32,
    pub qk_norm: QkNorm,
    pub attn_bias: bool,
    pub moe: Option<Moe>,
}

impl HParams {
    pub fn q_dim(&self) -> u32 {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> u32 {
        self.n_head_kv * self.head_dim
    }
}

/// Reads `{arch}.{suffix}` as u32, or `default` when absent.
pub(crate) fn u32_or(g: &GgufFile, suffix: &str, default: u32) -> Result<u32> {
    let key = g.arch_key(suffix)?;
    match g.get(&key) {
        None => Ok(default),
        Some(_) => Ok(g.get_u32(&key)?),
    }
}

pub(crate) fn f32_or(g: &GgufFile, suffix: &str, default: f32) -> Result<f32> {
    let key = g.arch_key(suffix)?;
    match g.get(&key) {
        None => Ok(default),
        Some(_) => Ok(g.get_f32(&key)?),
    }
}

/// The fields every architecture reads the same way; the architecture file then adjusts
/// rope mode, Q/K norm, biases and MoE.
pub(crate) fn common(g: &GgufFile, rope_mode: RopeMode) -> Result<HParams> {
    let arch = g.architecture()?.to_string();
    let n_layer = g.arch_u32("block_count")?;
    let n_embd = g.arch_u32("embedding_length")?;
    let n_head = g.arch_u32("attention.head_count")?;
    if n_head == 0 || n_embd == 0 || n_layer == 0 {
        return Err(ModelError::BadHParams(format!(
            "{arch}: block_count, embedding_length and attention.head_count must be > 0"
        )));
    }
    let n_head_kv = u32_or(g, "attention.head_count_kv", n_head)?;
    if n_head_kv == 0 || n_head % n_head_kv != 0 {
        return Err(ModelError::BadHParams(format!(
            "{arch}: attention.head_count ({n_head}) must be a multiple of head_count_kv ({n_head_kv})"
        )));
    }
    let head_dim = u32_or(g, "attention.key_length", n_embd / n_head)?;
    let head_dim_v = u32_or(g, "attention.value_length", head_dim)?;
    if head_dim_v != head_dim || head_dim == 0 || head_dim % 2 != 0 {
        return Err(ModelError::Unsupported {
            arch,
            what: "head size",
            detail: format!("key length {head_dim}, value length {head_dim_v}"),
        });
    }
    let n_vocab = match g.get(&g.arch_key("vocab_size")?) {
        Some(_) => g.arch_u32("vocab_size")?,
        None => g.get_string_array("tokenizer.ggml.tokens")?.len() as u32,
    };
    let n_ctx_train = u32_or(g, "context_length", 2048)?;
    let rms_eps = f32_or(g, "attention.layer_norm_rms_epsilon", 1e-5)?;
    let n_rot = u32_or(g, "rope.dimension_count", head_dim)?;
    let freq_base = f32_or(g, "rope.freq_base", 10000.0)?;
    let scaling = match g.get(&g.arch_key("rope.scaling.type")?) {
        Some(_) => g.get_str(&g.arch_key("rope.scaling.type")?)?.to_string(),
        None => "none".to_string(),
    };
    let factor = f32_or(g, "rope.scaling.factor", 0.0)?;
    let freq_scale = if factor > 0.0 { 1.0 / factor } else { 1.0 };
    let ext_factor = match scaling.as_str() {
        "none" | "linear" => 0.0,
        "yarn" => 1.0,
        other => {
            return Err(ModelError::Unsupported {
                arch,
                what: "rope scaling",
                detail: format!("`{other}` (supported: none, linear, yarn)"),
            });
        }
    };
    let n_ctx_orig = u32_or(g, "rope.scaling.original_context_length", n_ctx_train)?;
    let attn_scale = f32_or(g, "attention.scale", 0.0)?;
    let n_ff = u32_or(g, "feed_forward_length", 0)?;
    Ok(HParams {
        arch,
        n_layer,
        n_embd,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_vocab,
        n_ctx_train,
        rms_eps,
        rope: Rope {
            mode: rope_mode,
            n_rot,
            freq_base,
            freq_scale,
            ext_factor,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig,
        },
        attn_scale: if attn_scale == 0.0 {
            1.0 / (head_dim as f32).sqrt()
        } else {
            attn_scale
        },
        qk_norm: QkNorm::None,
        attn_bias: false,
        moe: None,
    })
}

/// Expert counts and widths (`{arch}.expert_count` etc.).
pub(crate) fn moe(g: &GgufFile, h: &HParams, norm_topk: bool) -> Result<Moe> {
    let n_expert = g.arch_u32("expert_count")?;
    let n_expert_used = g.arch_u32("expert_used_count")?;
    if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert {
        return Err(ModelError::BadHParams(format!(
            "{}: expert_used_count ({n_expert_used}) must be in 1..=expert_count ({n_expert})",
            h.arch
        )));
    }
    let scale = f32_or(g, "expert_weights_scale", 0.0)?;
    if scale != 0.0 && scale != 1.0 {
        return Err(ModelError::Unsupported {
            arch: h.arch.clone(),
            what: "expert_weights_scale",
            detail: format!("{scale}"),
        });
    }
    let default_ff = if h.n_ff > 0 {
        h.n_ff / n_expert_used
    } else {
        0
    };
    let n_ff_exp = u32_or(g, "expert_feed_forward_length", default_ff)?;
    if n_ff_exp == 0 {
        return Err(ModelError::BadHParams(format!(
            "{}: expert_feed_forward_length is missing",
            h.arch
        )));
    }
    Ok(Moe {
        n_expert,
        n_expert_used,
        n_ff_exp,
        norm_topk,
        n_ff_shared: None,
    })
}
