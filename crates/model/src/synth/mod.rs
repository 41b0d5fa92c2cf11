//! `strata synth`: random-weight GGUF models of a supported architecture,
//! shape and weight format, which llama.cpp loads and runs — for tests (its
//! logits are the oracle) and benchmarks.
//!
//! - [`SynthSpec`] describes the model; [`synthesize`] returns the file's bytes,
//!   [`synthesize_to_file`] streams it to disk (a large model is never held in
//!   memory).
//! - The output is a pure function of the spec: the weights come from
//!   xoshiro256** streams seeded by `seed` and each tensor's name, with only
//!   IEEE basic arithmetic, so every machine writes the same bytes.
//! - Weights: random valid blocks whose dequantised values have an RMS of
//!   about 1/√fan-in ([`blocks`]); norm gains near 1; router rows scaled by the
//!   `router_skew` Zipf law; biases, norms and routers in F32 as in real files.
//! - Matrices whose row length is not a whole number of the quant's blocks
//!   (the FFN down projection of a narrow expert, the attention output when
//!   heads × head_dim is odd-sized) get llama-quantize's fallback type
//!   ([`fallback_type`]); `hidden` itself must be a multiple of the block.

mod blocks;
mod plan;
mod prefetch;
mod rng;
mod spec;
mod vocab;

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use strata_gguf::{GgufError, GgufWriter, Value};

pub use blocks::{SUPPORTED_TYPES, is_supported};
pub use plan::{PlannedTensor, fallback_type};
pub use spec::{DEFAULT_VOCAB, SynthArch, SynthSpec};

use plan::Init;
use rng::Rng;

/// Metadata key holding the spec (JSON) the file was made from.
pub const SPEC_KEY: &str = "strata.synth.spec";

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("cannot synthesize this model: {0}")]
    Spec(String),
    #[error("tokenizer donor {}: {reason}", path.display())]
    Donor { path: PathBuf, reason: String },
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

impl SynthSpec {
    /// The vocabulary size: the donor's, or `vocab` (default 512) with the
    /// built-in tokenizer.
    pub fn n_vocab(&self) -> Result<u32, SynthError> {
        match &self.tokenizer_from {
            None => Ok(self.vocab.unwrap_or(DEFAULT_VOCAB)),
            Some(path) => {
                let mut scratch = GgufWriter::new();
                let n = vocab::copy_donor(&mut scratch, path)?;
                match self.vocab {
                    Some(v) if v != n => Err(SynthError::Spec(format!(
                        "vocab {v} differs from the donor tokenizer's {n} tokens; leave vocab unset"
                    ))),
                    _ => Ok(n),
                }
            }
        }
    }

    /// Every tensor the file will hold, in order, with its format (after
    /// fallbacks); checks the spec first.
    pub fn tensor_plan(&self) -> Result<Vec<PlannedTensor>, SynthError> {
        self.validate()?;
        Ok(plan::tensors(self, self.n_vocab()?))
    }
}

/// The whole file in memory.
pub fn synthesize(spec: &SynthSpec) -> Result<Vec<u8>, SynthError> {
    let mut out = Vec::new();
    synthesize_to(spec, &mut out)?;
    Ok(out)
}

/// Writes the file to `path`; returns its size in bytes.
pub fn synthesize_to_file(spec: &SynthSpec, path: impl AsRef<Path>) -> Result<u64, SynthError> {
    Ok(writer(spec)?.write_file(path)?)
}

/// Writes the file to `out`; returns its size in bytes.
pub fn synthesize_to(spec: &SynthSpec, out: &mut dyn Write) -> Result<u64, SynthError> {
    Ok(writer(spec)?.write_to(out)?)
}

fn writer(spec: &SynthSpec) -> Result<GgufWriter<'_>, SynthError> {
    spec.validate()?;
    let arch = spec.arch.name();
    let mut w = GgufWriter::new();
    w.add("general.architecture", arch);
    w.add("general.name", format!("strata-synth {arch}"));
    w.add("general.file_type", Value::U32(plan::file_type(spec.quant)));
    w.add("general.quantization_version", Value::U32(2));
    let spec_json = serde_json::to_string(spec)
        .map_err(|e| SynthError::Spec(format!("cannot serialise the spec: {e}")))?;
    w.add(SPEC_KEY, spec_json);

    // Tokenizer keys go after the hyper-parameters, as converters write them;
    // the donor (if any) fixes the vocabulary size, so read it into a scratch
    // writer first.
    let mut tok = GgufWriter::new();
    let n_vocab = match &spec.tokenizer_from {
        Some(path) => {
            let n = vocab::copy_donor(&mut tok, path)?;
            if let Some(v) = spec.vocab.filter(|&v| v != n) {
                return Err(SynthError::Spec(format!(
                    "vocab {v} differs from the donor tokenizer's {n} tokens; leave vocab unset"
                )));
            }
            n
        }
        None => {
            let n = spec.vocab.unwrap_or(DEFAULT_VOCAB);
            vocab::add_builtin(&mut tok, n);
            n
        }
    };
    for (k, v) in plan::hparams(spec, n_vocab) {
        w.add(k, v);
    }
    for (k, v) in tok.metadata().iter() {
        match v {
            Value::String(_) => {
                w.add_string_bytes(k, tok.metadata().string_bytes(k).unwrap_or_default())
            }
            v => w.add(k, v.clone()),
        }
    }

    let tensors = plan::tensors(spec, n_vocab);
    let ahead = prefetch::Prefetcher::new(spec, &tensors);
    for (i, t) in tensors.iter().enumerate() {
        let ahead = ahead.clone();
        w.add_tensor_with(&t.name, &t.dims, t.ty, move |out| {
            out.write_all(&ahead.take(i)?)
        })?;
    }
    Ok(w)
}

/// Bytes generated per write while streaming a tensor.
const CHUNK_BYTES: usize = 1 << 22;

fn fill_tensor(spec: &SynthSpec, t: &PlannedTensor, out: &mut dyn Write) -> io::Result<()> {
    let mut rng = Rng::for_stream(spec.seed, &t.name);
    let row_len = t.dims[0] as usize;
    let n_rows: usize = t.dims[1..].iter().map(|&d| d as usize).product();
    match t.init {
        Init::Weight { std } => {
            let row_bytes = t.ty.row_bytes(row_len).unwrap_or(0).max(1);
            let rows_per_chunk = (CHUNK_BYTES / row_bytes).max(1);
            let mut buf = Vec::with_capacity(rows_per_chunk * row_bytes);
            let mut done = 0;
            while done < n_rows {
                let rows = rows_per_chunk.min(n_rows - done);
                buf.clear();
                blocks::random_rows(t.ty, row_len, rows, std, &mut rng, &mut buf);
                out.write_all(&buf)?;
                done += rows;
            }
            Ok(())
        }
        Init::Norm => write_floats(t, (0..row_len).map(|_| 1.0 + 0.2 * rng.signed_f32()), out),
        Init::Bias => write_floats(t, (0..row_len).map(|_| 0.2 * rng.signed_f32()), out),
        Init::Router { layer } => {
            let scale = router_row_scales(spec, layer);
            let a = 3f32.sqrt() / (row_len as f32).sqrt();
            let mut values = Vec::with_capacity(row_len * n_rows);
            for s in scale {
                values.extend((0..row_len).map(|_| rng.signed_f32() * a * s));
            }
            write_floats(t, values.into_iter(), out)
        }
    }
}

fn write_floats(
    t: &PlannedTensor,
    values: impl Iterator<Item = f32>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let values: Vec<f32> = values.collect();
    let mut buf = Vec::with_capacity(values.len() * 4);
    blocks::encode_floats(t.ty, &values, &mut buf);
    out.write_all(&buf)
}

/// Router row multipliers of one layer: the experts are ranked by a random
/// permutation of the layer (its own stream, `router_rank.<layer>`), and the
/// expert of rank r gets (r+1)^(−router_skew). Exposed for tests and tools
/// that want to know which experts a file makes hot.
pub fn router_row_scales(spec: &SynthSpec, layer: u32) -> Vec<f32> {
    let n = spec.experts as usize;
    let mut scale = vec![1.0f32; n];
    if spec.router_skew > 0.0 {
        let order = expert_hotness_order(spec, layer);
        for (rank, &expert) in order.iter().enumerate() {
            scale[expert] = rng::pow_neg(rank as f64 + 1.0, f64::from(spec.router_skew)) as f32;
        }
    }
    scale
}

/// The experts of `layer` from hottest to coldest under `router_skew > 0`.
pub fn expert_hotness_order(spec: &SynthSpec, layer: u32) -> Vec<usize> {
    Rng::for_stream(spec.seed, &format!("router_rank.{layer}")).permutation(spec.experts as usize)
}
