//! The tensors and metadata of a synthetic model, per architecture, with the
//! names, ggml-order shapes and keys llama.cpp's loader asks for
//! (`src/models/{llama,qwen3moe,qwen2moe,olmoe}.cpp`, `llama-arch.cpp`).

use strata_gguf::QuantType;

use super::spec::{SynthArch, SynthSpec};

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Init {
    /// A weight matrix: RMS `std`.
    Weight { std: f32 },
    /// An RMSNorm gain: uniform on [0.8, 1.2].
    Norm,
    /// An attention bias: uniform on [−0.2, 0.2].
    Bias,
    /// The router of layer `layer`: RMS 1/√hidden, rows scaled by the skew.
    Router { layer: u32 },
}

/// One tensor of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTensor {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub ty: QuantType,
    /// The spec's quant when this matrix's row length is not a whole number of
    /// its blocks and llama-quantize's fallback type was used instead.
    pub fallback_from: Option<QuantType>,
    pub(crate) init: Init,
}

/// llama-quantize's `tensor_type_fallback`: the type a matrix with `row_len`
/// values per row gets when `ty`'s blocks do not divide the row.
pub fn fallback_type(ty: QuantType, row_len: u64) -> QuantType {
    use QuantType::*;
    if row_len.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    let next = match ty {
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        Q2_K | Q3_K => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        other => other,
    };
    if row_len.is_multiple_of(next.block_size() as u64) {
        next
    } else {
        F16
    }
}

struct Planner<'s> {
    spec: &'s SynthSpec,
    out: Vec<PlannedTensor>,
}

impl Planner<'_> {
    /// A matrix in the spec's quant (or its fallback), RMS 1/√row_len.
    fn matrix(&mut self, name: String, dims: &[u64]) {
        let ty = fallback_type(self.spec.quant, dims[0]);
        let std = 1.0 / (dims[0] as f32).sqrt();
        self.push(name, dims, ty, Init::Weight { std }, ty != self.spec.quant);
    }

    fn f32(&mut self, name: String, dims: &[u64], init: Init) {
        self.push(name, dims, QuantType::F32, init, false);
    }

    fn push(&mut self, name: String, dims: &[u64], ty: QuantType, init: Init, fell_back: bool) {
        self.out.push(PlannedTensor {
            name,
            dims: dims.to_vec(),
            ty,
            fallback_from: fell_back.then_some(self.spec.quant),
            init,
        });
    }
}

/// Every tensor of the model, in file order.
pub(crate) fn tensors(spec: &SynthSpec, n_vocab: u32) -> Vec<PlannedTensor> {
    let h = u64::from(spec.hidden);
    let hd = u64::from(spec.head_dim());
    let q = hd * u64::from(spec.heads);
    let kv = hd * u64::from(spec.kv_heads);
    let v = u64::from(n_vocab);
    let e = u64::from(spec.experts);
    let eff = u64::from(spec.expert_ffn);
    let mut p = Planner {
        spec,
        out: Vec::new(),
    };

    // The embedding carries the token's identity through the residual stream,
    // so its rows have RMS 1 (the matrices' 1/√fan-in would let the first
    // attention output drown it). Tied to the LM head it gets 2/√hidden
    // instead, so the logits have a std of about 2, not √hidden.
    let embd_std = if spec.tie_embeddings {
        2.0 / (h as f32).sqrt()
    } else {
        1.0
    };
    let embd_ty = fallback_type(spec.quant, h);
    p.push(
        "token_embd.weight".into(),
        &[h, v],
        embd_ty,
        Init::Weight { std: embd_std },
        false,
    );

    for l in 0..spec.layers {
        let n = |t: &str| format!("blk.{l}.{t}");
        p.f32(n("attn_norm.weight"), &[h], Init::Norm);
        p.matrix(n("attn_q.weight"), &[h, q]);
        p.matrix(n("attn_k.weight"), &[h, kv]);
        p.matrix(n("attn_v.weight"), &[h, kv]);
        if spec.arch == SynthArch::Qwen2Moe {
            p.f32(n("attn_q.bias"), &[q], Init::Bias);
            p.f32(n("attn_k.bias"), &[kv], Init::Bias);
            p.f32(n("attn_v.bias"), &[kv], Init::Bias);
        }
        match spec.arch {
            // Per-head norms of Q and K.
            SynthArch::Qwen3Moe => {
                p.f32(n("attn_q_norm.weight"), &[hd], Init::Norm);
                p.f32(n("attn_k_norm.weight"), &[hd], Init::Norm);
            }
            // olmoe normalises the whole Q and K projections.
            SynthArch::Olmoe => {
                p.f32(n("attn_q_norm.weight"), &[q], Init::Norm);
                p.f32(n("attn_k_norm.weight"), &[kv], Init::Norm);
            }
            _ => {}
        }
        p.matrix(n("attn_output.weight"), &[q, h]);
        p.f32(n("ffn_norm.weight"), &[h], Init::Norm);

        if !spec.is_moe() {
            let ff = u64::from(spec.ffn);
            p.matrix(n("ffn_gate.weight"), &[h, ff]);
            p.matrix(n("ffn_up.weight"), &[h, ff]);
            p.matrix(n("ffn_down.weight"), &[ff, h]);
            continue;
        }
        p.f32(n("ffn_gate_inp.weight"), &[h, e], Init::Router { layer: l });
        p.matrix(n("ffn_gate_exps.weight"), &[h, eff, e]);
        p.matrix(n("ffn_up_exps.weight"), &[h, eff, e]);
        p.matrix(n("ffn_down_exps.weight"), &[eff, h, e]);
        if spec.arch == SynthArch::Qwen2Moe {
            let sff = u64::from(spec.shared_ffn);
            let std = 1.0 / (h as f32).sqrt();
            p.f32(n("ffn_gate_inp_shexp.weight"), &[h], Init::Weight { std });
            p.matrix(n("ffn_gate_shexp.weight"), &[h, sff]);
            p.matrix(n("ffn_up_shexp.weight"), &[h, sff]);
            p.matrix(n("ffn_down_shexp.weight"), &[sff, h]);
        }
    }

    p.f32("output_norm.weight".into(), &[h], Init::Norm);
    if !spec.tie_embeddings {
        p.matrix("output.weight".into(), &[h, v]);
    }
    p.out
}

/// llama.cpp's `general.file_type` (`llama_ftype`) for a file mostly of `ty`.
pub(crate) fn file_type(ty: QuantType) -> u32 {
    use QuantType::*;
    match ty {
        F32 => 0,
        F16 => 1,
        Q4_0 => 2,
        Q4_1 => 3,
        Q8_0 => 7,
        Q5_0 => 8,
        Q5_1 => 9,
        Q2_K => 10,
        Q3_K => 12, // Q3_K_M
        Q4_K => 14, // Q4_K_S
        Q5_K => 16, // Q5_K_S
        Q6_K => 18,
        IQ2_XXS => 19,
        IQ2_XS => 20,
        IQ3_XXS => 23,
        IQ4_NL => 25,
        IQ3_S => 26,
        IQ2_S => 28,
        IQ4_XS => 30,
        BF16 => 32,
        MXFP4 => 38, // MXFP4_MOE
        _ => 1024,   // LLAMA_FTYPE_GUESSED
    }
}

/// The architecture's hyper-parameter keys, as llama.cpp's converter writes them.
pub(crate) fn hparams(spec: &SynthSpec, n_vocab: u32) -> Vec<(String, strata_gguf::Value)> {
    use strata_gguf::Value;
    let a = spec.arch.name();
    let k = |s: &str| format!("{a}.{s}");
    let mut m: Vec<(String, Value)> = vec![
        (k("vocab_size"), Value::U32(n_vocab)),
        (k("context_length"), Value::U32(spec.context_length)),
        (k("embedding_length"), Value::U32(spec.hidden)),
        (k("block_count"), Value::U32(spec.layers)),
    ];
    // The FFN width llama.cpp sizes the experts by: llama (Mixtral) and olmoe
    // read feed_forward_length; qwen2moe/qwen3moe read expert_feed_forward_length.
    let ffn = match spec.arch {
        SynthArch::Llama if !spec.is_moe() => spec.ffn,
        SynthArch::Llama | SynthArch::Olmoe => spec.expert_ffn,
        SynthArch::Qwen2Moe | SynthArch::Qwen3Moe => spec.ffn,
    };
    m.push((k("feed_forward_length"), Value::U32(ffn)));
    m.push((k("attention.head_count"), Value::U32(spec.heads)));
    m.push((k("attention.head_count_kv"), Value::U32(spec.kv_heads)));
    m.push((k("rope.freq_base"), Value::F32(spec.rope_freq_base)));
    m.push((
        k("attention.layer_norm_rms_epsilon"),
        Value::F32(spec.rms_eps),
    ));
    let hd = spec.head_dim();
    if spec.arch == SynthArch::Qwen3Moe || hd * spec.heads != spec.hidden {
        m.push((k("attention.key_length"), Value::U32(hd)));
        m.push((k("attention.value_length"), Value::U32(hd)));
    }
    m.push((k("rope.dimension_count"), Value::U32(hd)));
    if spec.is_moe() {
        m.push((k("expert_count"), Value::U32(spec.experts)));
        m.push((k("expert_used_count"), Value::U32(spec.experts_used)));
    }
    if matches!(spec.arch, SynthArch::Qwen2Moe | SynthArch::Qwen3Moe) {
        m.push((k("expert_feed_forward_length"), Value::U32(spec.expert_ffn)));
    }
    if spec.arch == SynthArch::Qwen2Moe {
        m.push((
            k("expert_shared_feed_forward_length"),
            Value::U32(spec.shared_ffn),
        ));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_follows_llama_quantize() {
        use QuantType::*;
        assert_eq!(fallback_type(Q4_K, 256), Q4_K);
        assert_eq!(fallback_type(Q4_K, 128), Q5_0);
        assert_eq!(fallback_type(Q6_K, 128), Q8_0);
        assert_eq!(fallback_type(IQ2_XS, 96), IQ4_NL);
        assert_eq!(fallback_type(Q2_K, 64), Q4_0);
        assert_eq!(fallback_type(Q4_K, 48), F16);
        assert_eq!(fallback_type(Q8_0, 48), F16);
        assert_eq!(fallback_type(F16, 7), F16);
    }
}
