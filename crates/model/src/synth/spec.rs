//! [`SynthSpec`]: what a synthetic model looks like, and the checks that keep
//! it to shapes llama.cpp's loader accepts.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use strata_gguf::QuantType;

use super::SynthError;
use super::blocks;

/// The architectures `strata synth` writes (llama.cpp's `general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SynthArch {
    /// Dense when `experts == 0` (SmolLM2-like), Mixtral-style MoE otherwise.
    #[serde(rename = "llama")]
    Llama,
    #[serde(rename = "qwen3moe")]
    Qwen3Moe,
    #[serde(rename = "qwen2moe")]
    Qwen2Moe,
    #[serde(rename = "olmoe")]
    Olmoe,
}

impl SynthArch {
    pub const ALL: [SynthArch; 4] = [Self::Llama, Self::Qwen3Moe, Self::Qwen2Moe, Self::Olmoe];

    /// The GGUF architecture name, also the metadata key prefix.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen3Moe => "qwen3moe",
            Self::Qwen2Moe => "qwen2moe",
            Self::Olmoe => "olmoe",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether llama.cpp reads `attention.key_length` for this architecture's
    /// tensor shapes (llama, qwen3moe); qwen2moe and olmoe size Q and the
    /// output projection by the hidden size, so there `heads · head_dim = hidden`.
    pub const fn free_head_dim(self) -> bool {
        matches!(self, Self::Llama | Self::Qwen3Moe)
    }
}

/// A synthetic model: architecture, shape, weight format and seed. Every
/// field has a default ([`SynthSpec::default`]); the JSON form (serde) is what
/// golden files store so a test can re-create the identical file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SynthSpec {
    pub arch: SynthArch,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub kv_heads: u32,
    /// Per-head dimension; `None` means `hidden / heads`. Only llama and
    /// qwen3moe allow another value.
    pub head_dim: Option<u32>,
    /// Dense FFN width (llama with no experts). For qwen2moe/qwen3moe it is
    /// written as `feed_forward_length`, which llama.cpp does not use there.
    pub ffn: u32,
    /// Routed experts per layer (0 = dense llama).
    pub experts: u32,
    pub experts_used: u32,
    /// Width of one routed expert's FFN.
    pub expert_ffn: u32,
    /// Width of qwen2moe's shared expert.
    pub shared_ffn: u32,
    /// Vocabulary size with the built-in tokenizer; `None` = 512. With a donor
    /// tokenizer it is the donor's, and a different value here is an error.
    pub vocab: Option<u32>,
    pub context_length: u32,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// Format of the large matrices (see [`SynthSpec::tensor_plan`] for the
    /// matrices whose row length forces llama-quantize's fallback format).
    #[serde(with = "quant_by_name")]
    pub quant: QuantType,
    pub seed: u64,
    /// Zipf-like router preference: in each layer the experts get a random
    /// rank r (0 = hottest) and router row e is scaled by (r+1)^(−router_skew).
    /// 0 routes uniformly; 1–2 make a few experts hot.
    pub router_skew: f32,
    /// Leave out `output.weight` so the LM head reuses `token_embd.weight`
    /// (llama and qwen3moe only; llama.cpp requires it for qwen2moe and olmoe).
    pub tie_embeddings: bool,
    /// Copy the tokenizer (every `tokenizer.*` key) from this GGUF file
    /// instead of the built-in byte-level BPE vocabulary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer_from: Option<PathBuf>,
}

impl Default for SynthSpec {
    fn default() -> Self {
        Self {
            arch: SynthArch::Qwen3Moe,
            layers: 2,
            hidden: 256,
            heads: 4,
            kv_heads: 2,
            head_dim: None,
            ffn: 768,
            experts: 8,
            experts_used: 2,
            expert_ffn: 256,
            shared_ffn: 512,
            vocab: None,
            context_length: 4096,
            rope_freq_base: 10000.0,
            rms_eps: 1e-6,
            quant: QuantType::Q4_K,
            seed: 1,
            router_skew: 0.0,
            tie_embeddings: false,
            tokenizer_from: None,
        }
    }
}

/// Default vocabulary size of the built-in tokenizer.
pub const DEFAULT_VOCAB: u32 = 512;
/// llama.cpp's LLAMA_MAX_LAYERS and LLAMA_MAX_EXPERTS (llama-hparams.h).
const MAX_LAYERS: u32 = 512;
const MAX_EXPERTS: u32 = 1024;

impl SynthSpec {
    /// Per-head dimension after defaulting.
    pub fn head_dim(&self) -> u32 {
        self.head_dim
            .unwrap_or_else(|| self.hidden.checked_div(self.heads).unwrap_or(0))
    }

    pub fn is_moe(&self) -> bool {
        self.experts > 0
    }

    /// Checks the shape against what llama.cpp's loader and graph accept for
    /// the architecture; the error says which field is wrong and why.
    pub fn validate(&self) -> Result<(), SynthError> {
        let bad = |reason: String| Err(SynthError::Spec(reason));
        let arch = self.arch.name();
        if self.layers == 0 || self.layers > MAX_LAYERS {
            return bad(format!(
                "layers must be 1..={MAX_LAYERS}, got {}",
                self.layers
            ));
        }
        if self.hidden == 0 || self.heads == 0 || self.kv_heads == 0 {
            return bad("hidden, heads and kv_heads must be positive".into());
        }
        if !blocks::is_supported(self.quant) {
            let names: Vec<&str> = blocks::SUPPORTED_TYPES.iter().map(|t| t.name()).collect();
            return bad(format!(
                "quant {} is not supported; use one of {}",
                self.quant,
                names.join(", ")
            ));
        }
        let block = self.quant.block_size() as u32;
        if !self.hidden.is_multiple_of(block) {
            return bad(format!(
                "hidden ({}) must be a multiple of {}'s block size {block}: every matrix \
                 reading the hidden state has rows of hidden values",
                self.hidden, self.quant
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "heads ({}) must be a multiple of kv_heads ({})",
                self.heads, self.kv_heads
            ));
        }
        match self.head_dim {
            Some(hd) if !self.arch.free_head_dim() && hd * self.heads != self.hidden => {
                return bad(format!(
                    "{arch} needs heads × head_dim = hidden ({} × {hd} ≠ {}); \
                     only llama and qwen3moe take another head_dim",
                    self.heads, self.hidden
                ));
            }
            None if !self.hidden.is_multiple_of(self.heads) => {
                return bad(format!(
                    "hidden ({}) is not a multiple of heads ({}); give head_dim",
                    self.hidden, self.heads
                ));
            }
            _ => {}
        }
        let hd = self.head_dim();
        if hd == 0 || !hd.is_multiple_of(2) {
            return bad(format!(
                "head_dim must be even and positive (RoPE rotates pairs), got {hd}"
            ));
        }
        if self.arch == SynthArch::Olmoe && self.kv_heads != self.heads {
            return bad(format!(
                "olmoe normalises K over the whole hidden size (attn_k_norm is {{hidden}}), \
                 so kv_heads must equal heads ({} ≠ {})",
                self.kv_heads, self.heads
            ));
        }
        if self.arch == SynthArch::Llama && self.experts == 0 {
            if self.experts_used != 0 {
                return bad("experts_used must be 0 for a dense llama (experts = 0)".into());
            }
            if self.ffn == 0 {
                return bad("a dense llama needs ffn > 0".into());
            }
        } else {
            if self.experts == 0 {
                return bad(format!("{arch} needs experts > 0"));
            }
            if self.experts > MAX_EXPERTS {
                return bad(format!(
                    "experts must be at most {MAX_EXPERTS} (llama.cpp's limit)"
                ));
            }
            if self.experts_used == 0 || self.experts_used > self.experts {
                return bad(format!(
                    "experts_used must be 1..=experts ({}), got {}",
                    self.experts, self.experts_used
                ));
            }
            if self.expert_ffn == 0 {
                return bad("expert_ffn must be positive".into());
            }
        }
        if self.arch == SynthArch::Qwen2Moe && self.shared_ffn == 0 {
            return bad("qwen2moe needs shared_ffn > 0 (its shared expert is required)".into());
        }
        if self.tie_embeddings && !self.arch.free_head_dim() {
            return bad(format!(
                "{arch} requires output.weight; tie_embeddings is not allowed"
            ));
        }
        if self.context_length == 0 {
            return bad("context_length must be positive".into());
        }
        if !(self.rope_freq_base.is_finite() && self.rope_freq_base > 0.0) {
            return bad(format!(
                "rope_freq_base must be positive, got {}",
                self.rope_freq_base
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return bad(format!("rms_eps must be positive, got {}", self.rms_eps));
        }
        if !(self.router_skew.is_finite() && self.router_skew >= 0.0) {
            return bad(format!("router_skew must be ≥ 0, got {}", self.router_skew));
        }
        if self.router_skew > 0.0 && !self.is_moe() {
            return bad("router_skew needs experts".into());
        }
        if self.tokenizer_from.is_none()
            && let Some(v) = self.vocab
            && v < super::vocab::MIN_BUILTIN_VOCAB
        {
            return bad(format!(
                "the built-in tokenizer needs vocab ≥ {} (256 bytes + 3 specials), got {v}",
                super::vocab::MIN_BUILTIN_VOCAB
            ));
        }
        Ok(())
    }
}

/// (De)serialises a [`QuantType`] as ggml's name ("Q4_K").
mod quant_by_name {
    use serde::{Deserialize, Deserializer, Serializer};
    use strata_gguf::QuantType;

    pub fn serialize<S: Serializer>(ty: &QuantType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(ty.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<QuantType, D::Error> {
        let name = String::deserialize(d)?;
        QuantType::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown quant type `{name}`")))
    }
}
