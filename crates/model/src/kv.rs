//! The K/V cache: its formats (`--kv f16|int8`), its buffers, and the launches that store
//! new rows into it and attend over it (crates/core/kernels.txt: kv_store and attention
//! for f16, kv_store_q8 and attention_q8 for int8).
//!
//! Both formats keep a layer's K (and V) as `n_ctx` u16 rows, every layer's K in one buffer
//! and every layer's V in another: an f16 row is `kv_dim` halves; an int8 row is
//! `kv_dim / 32` q8_0 blocks of 17 u16 (an f16 scale and 32 int8 values), ggml's block
//! layout, so llama.cpp's `-ctk q8_0 -ctv q8_0` is the memory anchor (34 bytes per 32
//! values, 53% of f16).

use strata_core::{
    ATTENTION_ROWS_MAX_TOKENS, Args, Device, DeviceBuffer, DeviceSlice, KernelId, LaunchCfg, Stream,
};

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

    /// Device bytes of the K and V of `model` for `n_ctx` positions (linear in `n_ctx`:
    /// without the under 256 bytes a layer's rows may be padded by in a [`KvCache`]).
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

/// u16 words between two layers' first rows are a multiple of this (256 bytes, what a
/// device allocation is aligned to), so each layer's rows start as aligned as they did in
/// a buffer of their own, whatever `n_ctx` and the row size.
const LAYER_ALIGN_WORDS: usize = 128;

/// Every layer's `n_ctx` rows for K in one buffer, and for V in another, in `format`: layer
/// `l`'s rows start at `l * layer_words()` and are laid out as a buffer of their own would
/// be, and each kernel gets its layer as a region ([`DeviceSlice`]), which it cannot reach
/// past on the CPU backend. Two allocations (and two frees) per cache, not two per layer:
/// what a K/V grow or trim costs the host (issue 8). Core orders accesses per buffer, so
/// a layer's launch waits for the other layers' work on the buffer too; every K/V launch
/// and row copy is on the context's stream, where it is ordered anyway.
///
/// `format` and `n_ctx` are for reading: the layout was computed from them.
pub struct KvCache {
    pub format: KvFormat,
    pub n_ctx: u32,
    layers: usize,
    row_words: usize,
    /// `None` in a placeholder without buffers ([`KvCache::empty`]).
    k: Option<DeviceBuffer<u16>>,
    v: Option<DeviceBuffer<u16>>,
}

impl KvCache {
    /// An f16 cache of `n_ctx` positions.
    pub fn new(dev: &Device, model: &Model, n_ctx: u32) -> Result<Self> {
        Self::with_format(dev, model, n_ctx, KvFormat::F16)
    }

    /// A cache of `n_ctx` positions in `format`.
    pub fn with_format(dev: &Device, model: &Model, n_ctx: u32, format: KvFormat) -> Result<Self> {
        format.check(model.hp.head_dim)?;
        let (layers, kv_dim) = (model.hp.n_layer as usize, model.hp.kv_dim() as usize);
        Self::with_shape(dev, layers, kv_dim, n_ctx, format)
    }

    /// A cache of `layers` layers of `n_ctx` positions of `kv_dim` values in `format`
    /// (whose head size `with_format` checks).
    pub fn with_shape(
        dev: &Device,
        layers: usize,
        kv_dim: usize,
        n_ctx: u32,
        format: KvFormat,
    ) -> Result<Self> {
        let mut kv = Self::empty(format);
        kv.layers = layers;
        kv.row_words = format.row_words(kv_dim);
        kv.n_ctx = n_ctx;
        let words = layers
            .checked_mul(kv.layer_words())
            .ok_or_else(|| ModelError::BadHParams(format!("a K/V of {n_ctx} cells")))?;
        kv.k = Some(dev.alloc::<u16>(words.max(1))?);
        kv.v = Some(dev.alloc::<u16>(words.max(1))?);
        Ok(kv)
    }

    /// A placeholder of no layers and no buffers, for while a cache is replaced.
    pub fn empty(format: KvFormat) -> Self {
        KvCache {
            format,
            n_ctx: 0,
            layers: 0,
            row_words: 0,
            k: None,
            v: None,
        }
    }

    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|b| b.bytes()).sum()
    }

    /// Layers held (0 in a placeholder).
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// u16 words of one position in one layer's K (and V).
    pub fn row_words(&self) -> usize {
        self.row_words
    }

    /// u16 words from one layer's first row to the next layer's: its `n_ctx` rows, then
    /// padding to [`LAYER_ALIGN_WORDS`].
    pub fn layer_words(&self) -> usize {
        (self.n_ctx as usize * self.row_words).next_multiple_of(LAYER_ALIGN_WORDS)
    }

    /// The buffers holding every layer's K and V (`None` in a placeholder).
    pub fn buffers(&self) -> Option<(&DeviceBuffer<u16>, &DeviceBuffer<u16>)> {
        self.k.as_ref().zip(self.v.as_ref())
    }

    /// Layer `il`'s K and V rows: regions of `n_ctx` rows each.
    pub fn layer(&self, il: usize) -> Result<(DeviceSlice<'_, u16>, DeviceSlice<'_, u16>)> {
        let bufs = self.buffers().filter(|_| il < self.layers);
        let (k, v) = bufs.ok_or_else(|| {
            ModelError::BadHParams(format!(
                "K/V layer {il} asked of a cache of {} layers",
                self.layers
            ))
        })?;
        let (at, len) = (
            il * self.layer_words(),
            self.n_ctx as usize * self.row_words,
        );
        Ok((k.slice(at, len)?, v.slice(at, len)?))
    }

    /// Copies the first `keep` rows of every layer of `src` (a cache of the same format and
    /// model, of any size) into this one, on `stream` by ordered device copies (one per
    /// layer and K or V: the layers' strides differ): K/V growth and trimming, which
    /// allocate the new cache first (`with_format`) and time the two apart.
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
        let same = src.format == self.format
            && src.layers == self.layers
            && src.row_words == self.row_words;
        let bufs = self.buffers().zip(src.buffers()).filter(|_| same);
        let Some(((dk, dv), (sk, sv))) = bufs else {
            return Err(ModelError::BadHParams(format!(
                "K/V rows copied from a {} cache of {} layers into a {} cache of {}",
                src.format, src.layers, self.format, self.layers
            )));
        };
        let (d_stride, s_stride) = (self.layer_words(), src.layer_words());
        for il in 0..self.layers {
            for (d, s) in [(dk, sk), (dv, sv)] {
                dev.copy_range(d, il * d_stride, s, il * s_stride, words, stream)?;
            }
        }
        Ok(())
    }

    /// Stores the `n` rows `k` and `v` (at the positions in `pos`) into layer `il`.
    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &self,
        ops: &Ops<'_>,
        il: usize,
        k: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        pos: &DeviceBuffer<i32>,
        kv_dim: u32,
        n: u32,
    ) -> Result<()> {
        let (kc, vc) = self.layer(il)?;
        match self.format {
            KvFormat::F16 => ops.kv_store(k, v, pos, kc, vc, kv_dim, n, self.n_ctx)?,
            KvFormat::Int8 => {
                let args = Args::new()
                    .read(k)
                    .read(v)
                    .read(pos)
                    .write_slice(kc)
                    .write_slice(vc)
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
    /// `out`; `per_row` computes each row as a one-token step does (int8: launches of at
    /// most ATTENTION_ROWS_MAX_TOKENS rows, whose rows do not depend on the launch; a longer
    /// one may take a prefill kernel, as the CUDA backend's attention_prefill_q8).
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
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
        let (kc, vc) = self.layer(il)?;
        let (n_head, n_kv_head, head_dim) = heads;
        let n_ctx = self.n_ctx;
        match (self.format, per_row) {
            (KvFormat::F16, true) => ops.attention_per_row(
                q, pos, kc, vc, out, n, n_head, n_kv_head, head_dim, n_ctx, scale,
            )?,
            (KvFormat::F16, false) => ops.attention(
                q, pos, kc, vc, out, n, n_head, n_kv_head, head_dim, n_ctx, scale,
            )?,
            (KvFormat::Int8, per_row) => {
                let most = if per_row {
                    ATTENTION_ROWS_MAX_TOKENS
                } else {
                    n
                };
                let shape = (n, n_head, n_kv_head, head_dim, n_ctx);
                let caches = (kc, vc);
                ops.attention_launches(
                    KernelId::AttentionQ8,
                    most,
                    q,
                    pos,
                    caches,
                    out,
                    shape,
                    scale,
                )?;
            }
        }
        Ok(())
    }
}
