//! The expert-cache flags every model-running command shares, and how they become an
//! expert cache: `--expert-cache N|all` (default: what fits beside the other weights, the
//! K/V and `--vram-reserve-mib`), `--cpu-threads`, `--resident`, `--profile`, `--adapt`,
//! `--adapt-async`, `--stream-experts`, `--pin-file`.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use strata_core::Device;
use strata_engine::Context;
use strata_engine::experts::{ExpertCache, ExpertCacheOptions, PinFile, SharedExpertCache};
use strata_gguf::GgufFile;
use strata_model::Model;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct ExpertArgs {
    /// Expert-cache slots in device memory: a number, or `all` to put every routed expert
    /// on the device (default: as many as fit).
    #[arg(long = "expert-cache", value_name = "N|all")]
    pub expert_cache: Option<String>,
    /// Device memory (MiB) the automatic expert-cache size leaves free.
    #[arg(long = "vram-reserve-mib", default_value_t = 512)]
    pub vram_reserve_mib: u64,
    /// Threads of the CPU pool that computes the non-resident experts (default: one per
    /// physical core).
    #[arg(long = "cpu-threads")]
    pub cpu_threads: Option<usize>,
    /// Fixed resident set: it changes only by adaptation (required by --adapt-async).
    #[arg(long)]
    pub resident: bool,
    /// Fill the cache at start-up from this profile (`strata profile`); without one the
    /// cache learns online.
    #[arg(long = "profile", value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Between steps, move hot non-resident experts into the slots of cold ones.
    #[arg(long)]
    pub adapt: bool,
    /// Let adaptation copies overlap decode (with --resident).
    #[arg(long = "adapt-async")]
    pub adapt_async: bool,
    /// Slot copies per step at most (adaptation, online learning).
    #[arg(long = "adapt-copies", default_value_t = 4)]
    pub adapt_copies: usize,
    /// Batches of more tokens than this (long prompts) stream each layer's routed experts
    /// to the device instead of computing the non-resident ones on the CPU (0: never).
    #[arg(long = "short-read", default_value_t = 64)]
    pub short_read: u32,
    /// Decode: up to N of a layer's non-resident experts are uploaded over PCIe into the
    /// staging buffers and computed on the device while the CPU pool computes the others
    /// (0: the pool computes them all; auto: as many as keep both sides busy, measured
    /// layer by layer). On the H200 machine (16 cores) auto took no-cache decode from 46.1
    /// to 52.3-53.6 tokens/s (BENCHMARKS.md, issue 7, session 10). Off by default: a
    /// streamed expert is computed by the device's kernels instead of the CPU's, which
    /// round differently, so with auto (timing decides) greedy output can change from run
    /// to run, and with any N a speculative window can decide other tokens than plain
    /// decode (its misses split differently).
    #[arg(long = "stream-experts", default_value = "0", value_name = "N|auto")]
    pub stream_experts: String,
    /// Page-lock the mapped model file for the GPU, so experts go from it to the device by
    /// DMA without a host copy (auto: when the file takes at most 3/4 of the memory).
    #[arg(long = "pin-file", default_value = "auto", value_name = "auto|on|off")]
    pub pin_file: PinFile,
}

/// Where the routed experts go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// All on the device (a dense model, `all`, or everything fits).
    Device,
    /// An expert cache of this many slots.
    Cache(usize),
}

/// Bytes of the routed-expert tensors, and how many experts they hold.
fn expert_bytes(gguf: &GgufFile, n_expert: u64) -> (u64, u64) {
    let mut bytes = 0;
    let mut experts = 0;
    for t in gguf.tensors() {
        if t.name.ends_with("ffn_gate_exps.weight") {
            experts += n_expert;
        }
        if t.name.contains("_exps.weight") {
            bytes += t.n_bytes;
        }
    }
    (bytes, experts)
}

impl ExpertArgs {
    /// Decides the placement for `gguf` on `dev` beside `kv` bytes of K/V.
    pub fn placement(&self, gguf: &GgufFile, dev: &Device, kv: u64) -> anyhow::Result<Placement> {
        let hp = strata_model::arch::hparams(gguf)?;
        let Some(moe) = &hp.moe else {
            if self.expert_cache.as_deref().is_some_and(|v| v != "all") {
                tracing::warn!(
                    "{}: a dense model has no experts to cache; --expert-cache ignored",
                    hp.arch
                );
            }
            return Ok(Placement::Device);
        };
        let (bytes, n_routed) = expert_bytes(gguf, u64::from(moe.n_expert));
        match self.expert_cache.as_deref() {
            Some("all") => return Ok(Placement::Device),
            Some(n) => {
                let n: usize = n.parse().with_context(|| {
                    format!("--expert-cache takes a number or `all`, got `{n}`")
                })?;
                return Ok(Placement::Cache(n));
            }
            None => {}
        }
        let total: u64 = gguf.tensors().iter().map(|t| t.n_bytes).sum();
        let free = dev.memory()?.free as u64;
        // Long prompts stage two layers' experts (one in use, one prefetched) beside the cache.
        let n_moe_layers = (n_routed / u64::from(moe.n_expert).max(1)).max(1);
        let staging = if self.short_read > 0 {
            2 * bytes / n_moe_layers
        } else {
            0
        };
        let need = (total - bytes) + kv + staging + (self.vram_reserve_mib << 20);
        if total + kv + (self.vram_reserve_mib << 20) <= free {
            return Ok(Placement::Device);
        }
        let per = bytes / n_routed.max(1) + 768; // a slot's alignment padding
        let n = free.saturating_sub(need) / per.max(1);
        tracing::info!(
            "expert cache: {n} of {n_routed} experts fit in {} MiB free (reserve {} MiB)",
            free >> 20,
            self.vram_reserve_mib
        );
        Ok(Placement::Cache(n as usize))
    }

    /// The cache for `model` (loaded without its experts on `dev`).
    pub fn cache(
        &self,
        dev: &Device,
        model: &Model,
        slots: usize,
    ) -> anyhow::Result<SharedExpertCache> {
        if self.adapt_async && !self.resident {
            bail!(
                "--adapt-async needs --resident (the fixed-set mode in which only adaptation changes the cache)"
            );
        }
        let env = strata_backend_cpu::CpuOptions::from_env();
        let pool_dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions {
            threads: self.cpu_threads,
            // The pool's stream gets a layer's work every few hundred microseconds of a
            // decode step: it polls rather than sleeps between them.
            stream_spin_us: env
                .stream_spin_us
                .or(Some(strata_backend_cpu::POOL_STREAM_SPIN_US)),
            ..env
        })
        .context("starting the CPU pool")?;
        let (stream_experts, stream_auto) = match self.stream_experts.as_str() {
            // Auto moves between none and every routed expert of a layer.
            "auto" => (
                model
                    .hp
                    .moe
                    .as_ref()
                    .map_or(0, |m| m.n_expert_used as usize),
                true,
            ),
            "" => (0, false),
            n => (
                n.parse().with_context(|| {
                    format!("--stream-experts takes a number or `auto`, got `{n}`")
                })?,
                false,
            ),
        };
        let opts = ExpertCacheOptions {
            slots,
            // Without a profile the cache learns online; with one, a resident set
            // changes only by adaptation.
            learn: !(self.resident && self.profile.is_some()),
            adapt: self.adapt || self.adapt_async,
            adapt_async: self.adapt_async,
            copies_per_step: self.adapt_copies.max(1),
            lend_min_tokens: self.short_read,
            stream_experts,
            stream_auto,
            pin_file: self.pin_file,
        };
        let cache = ExpertCache::for_model(dev, model, pool_dev, opts, self.profile.as_deref())?;
        Ok(cache.shared())
    }
}

/// Gives `ctx` the cache, if there is one.
pub fn attach(ctx: &mut Context, cache: &Option<SharedExpertCache>) {
    ctx.set_expert_cache(cache.clone());
}

/// The end-of-request line: `strata: decode expert cache hit rate ...`.
pub fn report(ctx: &Context) {
    if let Some(stats) = ctx.take_expert_stats() {
        eprintln!("strata: {stats}");
    }
}
