//! A loaded model: hyper-parameters and weights on one device.

use std::sync::Arc;

use strata_core::{Device, Stream};
use strata_gguf::GgufFile;

use crate::arch;
use crate::error::{ModelError, Result};
use crate::hparams::{HParams, QkNorm};
use crate::weights::{Experts, Loader, Matrix, Vector};

pub struct Attention {
    pub norm: Vector,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub bq: Option<Vector>,
    pub bk: Option<Vector>,
    pub bv: Option<Vector>,
    pub bo: Option<Vector>,
    pub q_norm: Option<Vector>,
    pub k_norm: Option<Vector>,
}

pub struct SharedExpert {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    /// `[n_embd] -> 1`: the sigmoid gate's logit.
    pub gate_inp: Matrix,
}

// One per layer, built once and never moved around: boxing the larger variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum Ffn {
    Dense {
        gate: Matrix,
        up: Matrix,
        down: Matrix,
    },
    Moe {
        router: Matrix,
        gate: Experts,
        up: Experts,
        down: Experts,
        shared: Option<SharedExpert>,
    },
}

pub struct Layer {
    pub attn: Attention,
    pub ffn_norm: Vector,
    pub ffn: Ffn,
}

pub struct Model {
    pub hp: HParams,
    pub tok_embd: Matrix,
    pub output_norm: Vector,
    /// `None`: tied to `tok_embd`.
    pub output: Option<Matrix>,
    pub layers: Vec<Layer>,
    pub gguf: Arc<GgufFile>,
}

/// How a model is put on its device.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Put the routed experts on the device (`--expert-cache all`); otherwise only their
    /// place in the mapped file is kept, for an expert cache and its CPU pool.
    pub experts_on_device: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            experts_on_device: true,
        }
    }
}

impl Model {
    /// Reads hyper-parameters and puts every weight on `dev` (uploads on `stream`).
    /// `progress` is called with (layers done, layers total).
    pub fn load(
        dev: &Device,
        stream: Stream,
        gguf: Arc<GgufFile>,
        progress: impl FnMut(usize, usize),
    ) -> Result<Model> {
        Self::load_with(dev, stream, gguf, LoadOptions::default(), progress)
    }

    /// [`Model::load`] with options.
    pub fn load_with(
        dev: &Device,
        stream: Stream,
        gguf: Arc<GgufFile>,
        opts: LoadOptions,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Model> {
        let hp = arch::hparams(&gguf)?;
        let mut ld = Loader::new(dev, stream, gguf.clone());
        ld.experts_on_device = opts.experts_on_device;
        let (e, v) = (hp.n_embd, hp.n_vocab);
        let tok_embd = ld.matrix("token_embd.weight", e, v)?;
        let output_norm = ld.vector("output_norm.weight", e)?;
        let output = if ld.has("output.weight") {
            Some(ld.matrix("output.weight", e, v)?)
        } else {
            None
        };
        if ld.has("rope_freqs.weight") || ld.has("blk.0.rope_freqs.weight") {
            return Err(ModelError::Unsupported {
                arch: hp.arch.clone(),
                what: "rope frequency factors",
                detail: "rope_freqs tensors (Llama 3.1 style scaling)".into(),
            });
        }
        let mut layers = Vec::with_capacity(hp.n_layer as usize);
        for i in 0..hp.n_layer {
            layers.push(load_layer(&mut ld, &hp, i)?);
            progress(i as usize + 1, hp.n_layer as usize);
        }
        tracing::debug!("loaded {} bytes of weights", ld.bytes_loaded);
        Ok(Model {
            hp,
            tok_embd,
            output_norm,
            output,
            layers,
            gguf,
        })
    }

    /// Whether the routed experts are on the device (no expert cache needed).
    pub fn experts_on_device(&self) -> bool {
        self.layers.iter().all(|l| match &l.ffn {
            Ffn::Moe { gate, up, down, .. } => {
                gate.buf.is_some() && up.buf.is_some() && down.buf.is_some()
            }
            Ffn::Dense { .. } => true,
        })
    }

    pub fn output(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.tok_embd)
    }
}

fn load_layer(ld: &mut Loader<'_>, hp: &HParams, i: u32) -> Result<Layer> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let (e, qd, kvd) = (hp.n_embd, hp.q_dim(), hp.kv_dim());
    for bias in ["ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"] {
        if ld.has(&n(bias)) {
            return Err(ModelError::Unsupported {
                arch: hp.arch.clone(),
                what: "FFN biases",
                detail: n(bias),
            });
        }
    }
    let (q_norm, k_norm) = match hp.qk_norm {
        QkNorm::None => (None, None),
        QkNorm::PerHead => (
            Some(ld.vector(&n("attn_q_norm.weight"), hp.head_dim)?),
            Some(ld.vector(&n("attn_k_norm.weight"), hp.head_dim)?),
        ),
        QkNorm::Full => (
            Some(ld.vector(&n("attn_q_norm.weight"), qd)?),
            Some(ld.vector(&n("attn_k_norm.weight"), kvd)?),
        ),
    };
    let attn = Attention {
        norm: ld.vector(&n("attn_norm.weight"), e)?,
        wq: ld.matrix(&n("attn_q.weight"), e, qd)?,
        wk: ld.matrix(&n("attn_k.weight"), e, kvd)?,
        wv: ld.matrix(&n("attn_v.weight"), e, kvd)?,
        wo: ld.matrix(&n("attn_output.weight"), qd, e)?,
        bq: ld.optional_vector(&n("attn_q.bias"), qd)?,
        bk: ld.optional_vector(&n("attn_k.bias"), kvd)?,
        bv: ld.optional_vector(&n("attn_v.bias"), kvd)?,
        bo: ld.optional_vector(&n("attn_output.bias"), e)?,
        q_norm,
        k_norm,
    };
    if hp.attn_bias && (attn.bq.is_none() || attn.bk.is_none() || attn.bv.is_none()) {
        return Err(ModelError::MissingTensor(n(
            "attn_q.bias / attn_k.bias / attn_v.bias",
        )));
    }
    let ffn_norm = ld.vector(&n("ffn_norm.weight"), e)?;
    let ffn = match &hp.moe {
        None => {
            if hp.n_ff == 0 {
                return Err(ModelError::BadHParams(format!(
                    "{}: feed_forward_length is missing",
                    hp.arch
                )));
            }
            Ffn::Dense {
                gate: ld.matrix(&n("ffn_gate.weight"), e, hp.n_ff)?,
                up: ld.matrix(&n("ffn_up.weight"), e, hp.n_ff)?,
                down: ld.matrix(&n("ffn_down.weight"), hp.n_ff, e)?,
            }
        }
        Some(moe) => {
            let (x, f) = (moe.n_expert, moe.n_ff_exp);
            let shared = match moe.n_ff_shared {
                None => None,
                Some(fs) => Some(SharedExpert {
                    gate: ld.matrix(&n("ffn_gate_shexp.weight"), e, fs)?,
                    up: ld.matrix(&n("ffn_up_shexp.weight"), e, fs)?,
                    down: ld.matrix(&n("ffn_down_shexp.weight"), fs, e)?,
                    gate_inp: ld.matrix(&n("ffn_gate_inp_shexp.weight"), e, 1)?,
                }),
            };
            Ffn::Moe {
                router: ld.matrix(&n("ffn_gate_inp.weight"), e, x)?,
                gate: ld.experts(&n("ffn_gate_exps.weight"), e, f, x)?,
                up: ld.experts(&n("ffn_up_exps.weight"), e, f, x)?,
                down: ld.experts(&n("ffn_down_exps.weight"), f, e, x)?,
                shared,
            }
        }
    };
    Ok(Layer {
        attn,
        ffn_norm,
        ffn,
    })
}
