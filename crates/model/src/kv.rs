//! The K/V cache: its formats (`--kv f16|int8`), its buffers, and the launches that store
//! new rows into it and attend over it (crates/core/kernels.txt: kv_store and attention
//! for f16, kv_store_q8 and attention_q8 for int8).
//!
//! Both formats keep a layer's K (and V) as one u16 buffer of `n_ctx` rows: an f16 row is
//! `kv_dim` halves; an int8 row is `kv_dim / 32` q8_0 blocks of 17 u16 (an f16 scale and
//! 32 int8 values), ggml's block layout, so llama.cpp's `-ctk q8_0 -ctv q8_0` is the
//! memory anchor (34 bytes per 32 values, 53% of f16).

use strata_core::{Args, Device, DeviceBuffer, KernelId, LaunchCfg, Stream};

use crate::error::{ModelError, Result};
use crate::model::Model;
use crate::ops::Ops;

/// Values per q8_0 block, and u16 words per block.
const Q8_VALUES: usize = 32;
const Q8_WORDS: usize = 17;

/// How the K/V cache stores its rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvFormat {
    /// IEEE half precision, what llama.cpp's default cache holds.
    #[default]
    F16,
    /// ggml's q8_0 blocks: 32 int8 values with an f16 scale.
    Int8,
}

impl KvFormat {
    /// The name `--kv` takes and logs print.
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::F16 => "f16",
            KvFormat::Int8 => "int8",
        }
    }

    /// Parses `--kv`'s value (`q8_0` is accepted for `int8`, llama.cpp's name).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Some(KvFormat::F16),
            "int8" | "q8_0" | "q8" => Some(KvFormat::Int8),
            _ => None,
        }
    }

    /// The id a snapshot file records.
    pub fn id(self) -> u32 {
        match self {
            KvFormat::F16 => 0,
            KvFormat::Int8 => 1,
        }
    }

    pub fn from_id(id: u32) -> Option<Self> {
        match id {
            0 => Some(KvFormat::F16),
            1 => Some(KvFormat::Int8),
            _ => None,
        }
    }

    /// u16 words of one cache row of `kv_dim` values.
    pub fn row_words(self, kv_dim: usize) -> usize {
        match self {
            KvFormat::F16 => kv_dim,
            KvFormat::Int8 => kv_dim / Q8_VALUES * Q8_WORDS,
        }
    }

    /// Whether heads of `head_dim` values can be stored in this format.
    pub fn check(self, head_dim: u32) -> Result<()> {
        if self == KvFormat::Int8 && !(head_dim as usize).is_multiple_of(Q8_VALUES) {
            return Err(ModelError::BadHParams(format!(
                "int8 K/V needs heads of a multiple of {Q8_VALUES} values; this model's have {head_dim} (use --kv f16)"
            )));
        }
        Ok(())
    }

    /// Device bytes of the K and V of `model` for `n_ctx` positions.
    pub fn bytes_for(self, model: &Model, n_ctx: u64) -> u64 {
        let row = self.row_words(model.hp.kv_dim() as usize) as u64 * 2;
        2 * model.hp.n_layer as u64 * row * n_ctx
    }
}

impl std::fmt::Display for KvFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Per layer, `n_ctx` rows for K and for V, in `format`.
pub struct KvCache {
    pub format: KvFormat,
    pub k: Vec<DeviceBuffer<u16>>,
    pub v: Vec<DeviceBuffer<u16>>,
    pub n_ctx: u32,
}

impl KvCache {
    /// An f16 cache of `n_ctx` positions.
    pub fn new(dev: &Device, model: &Model, n_ctx: u32) -> Result<Self> {
        Self::with_format(dev, model, n_ctx, KvFormat::F16)
    }

    /// A cache of `n_ctx` positions in `format`.
    pub fn with_format(dev: &Device, model: &Model, n_ctx: u32, format: KvFormat) -> Result<Self> {
        format.check(model.hp.head_dim)?;
        let rows = n_ctx as usize * format.row_words(model.hp.kv_dim() as usize);
        let mut k = Vec::new();
        let mut v = Vec::new();
        for _ in 0..model.hp.n_layer {
            k.push(dev.alloc::<u16>(rows.max(1))?);
            v.push(dev.alloc::<u16>(rows.max(1))?);
        }
        Ok(KvCache {
            format,
            k,
            v,
            n_ctx,
        })
    }

    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|b| b.bytes()).sum()
    }

    /// u16 words of one position in one layer's K (and V) buffer.
    pub fn row_words(&self) -> usize {
        self.k
            .first()
            .map_or(0, |b| b.len() / (self.n_ctx as usize).max(1))
    }

    /// Copies the first `keep` rows of every layer of `src` (a cache of the same format and
    /// model, of any size) into this one, on `stream` by ordered device copies: K/V growth
    /// and trimming, which allocate the new cache first (`with_format`) and time the two
    /// apart.
    pub fn copy_rows_from(
        &self,
        dev: &Device,
        src: &KvCache,
        keep: usize,
        stream: Stream,
    ) -> Result<()> {
        let keep = keep.min(self.n_ctx as usize).min(src.n_ctx as usize);
        let words = keep * src.row_words();
        if words == 0 {
            return Ok(());
        }
        if src.format != self.format || src.k.len() != self.k.len() {
            return Err(ModelError::BadHParams(format!(
                "K/V rows copied from a {} cache of {} layers into a {} cache of {}",
                src.format,
                src.k.len(),
                self.format,
                self.k.len()
            )));
        }
        for (s, d) in src.k.iter().chain(&src.v).zip(self.k.iter().chain(&self.v)) {
            dev.copy_range(d, 0, s, 0, words, stream)?;
        }
        Ok(())
    }

    /// Stores the `n` rows `k` and `v` (at the positions in `pos`) into layer `il`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store(
        &self,
        ops: &Ops<'_>,
        il: usize,
        k: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        pos: &DeviceBuffer<i32>,
        kv_dim: u32,
        n: u32,
    ) -> Result<()> {
        let (kc, vc) = (&self.k[il], &self.v[il]);
        match self.format {
            KvFormat::F16 => ops.kv_store(k, v, pos, kc, vc, kv_dim, n, self.n_ctx)?,
            KvFormat::Int8 => {
                let args = Args::new()
                    .read(k)
                    .read(v)
                    .read(pos)
                    .write(kc)
                    .write(vc)
                    .u32(kv_dim)
                    .u32(n)
                    .u32(self.n_ctx);
                let blocks = (n * kv_dim) as usize / Q8_VALUES;
                let cfg = LaunchCfg::linear(blocks.max(1), 256);
                ops.dev
                    .launch(KernelId::KvStoreQ8, &cfg, &args, ops.stream)?;
            }
        }
        Ok(())
    }

    /// Attention of the `n` queries in `q` (positions in `pos`) over layer `il`, into
    /// `out`; `per_row` launches each row as a one-token step (f16 only: the int8 kernel
    /// computes a row the same way whatever the launch).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attend(
        &self,
        ops: &Ops<'_>,
        il: usize,
        q: &DeviceBuffer<f32>,
        pos: &DeviceBuffer<i32>,
        out: &DeviceBuffer<f32>,
        n: u32,
        heads: (u32, u32, u32),
        scale: f32,
        per_row: bool,
    ) -> Result<()> {
        let (kc, vc) = (&self.k[il], &self.v[il]);
        let (n_head, n_kv_head, head_dim) = heads;
        let n_ctx = self.n_ctx;
        match (self.format, per_row) {
            (KvFormat::F16, true) => ops.attention_per_row(
                q, pos, kc, vc, out, n, n_head, n_kv_head, head_dim, n_ctx, scale,
            )?,
            (KvFormat::F16, false) => ops.attention(
                q, pos, kc, vc, out, n, n_head, n_kv_head, head_dim, n_ctx, scale,
            )?,
            (KvFormat::Int8, _) => {
                let args = Args::new()
                    .read(q)
                    .read(pos)
                    .read(kc)
                    .read(vc)
                    .write(out)
                    .u32(n)
                    .u32(n_head)
                    .u32(n_kv_head)
                    .u32(head_dim)
                    .u32(n_ctx)
                    .f32(scale);
                // One 256-thread block per (token, head).
                let cfg = LaunchCfg::linear((n * n_head).max(1) as usize * 256, 256);
                ops.dev
                    .launch(KernelId::AttentionQ8, &cfg, &args, ops.stream)?;
            }
        }
        Ok(())
    }
}
