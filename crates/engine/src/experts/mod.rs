//! The expert cache and the CPU pool (DESIGN.md, "Expert cache" and "CPU pool"): the
//! hottest routed experts live in device slots, found through the residency table; the
//! others are computed on the CPU from the mapped file; both halves are summed on the
//! device in fixed order, so the logits are the same whichever experts are resident (bit
//! for bit on the CPU backend).
//!
//! - `layout`: where each expert's matrices are, in the file and in a slot;
//! - `residency`: the table, host truth and device copy, published by ordered uploads;
//! - `pool`: the CPU pool;
//! - `pin`: page-locking the mapped file, so uploads from it skip staging;
//! - `cache`: slots, fills, online learning, adaptation, and the per-layer offload step;
//! - `profile`: routing counts on disk (`strata profile`, `--profile`);
//! - `stats`: what a request's decode did (hit rate, CPU experts, bytes, overlap);
//! - `stream_balance`: how many missing experts a decode layer streams to the device.

mod cache;
mod layout;
mod pin;
mod pool;
mod profile;
mod residency;
mod stats;
mod stream_balance;

pub use cache::{ExpertCache, ExpertCacheOptions, SlotChange};
pub use layout::{LayerExperts, Layout, MatrixView};
pub use pin::{PinFile, pin_file};
pub use pool::CpuPool;
pub use profile::{ModelId, Profile};
pub use residency::{Residency, TableUpload};
pub use stats::{DecodeTimeline, ExpertStats};

use std::sync::{Arc, Mutex};

/// A cache shared by the contexts of one model (a server's conversations).
pub type SharedExpertCache = Arc<Mutex<ExpertCache>>;

#[derive(Debug, thiserror::Error)]
pub enum ExpertError {
    #[error(transparent)]
    Device(#[from] strata_core::Error),
    #[error(transparent)]
    Model(#[from] strata_model::ModelError),
    #[error("the model has no routed experts: an expert cache has nothing to hold")]
    Dense,
    #[error("layer {0} has no routed experts")]
    NotMoe(usize),
    #[error("the router of layer {0} chose expert {1}, which does not exist")]
    BadExpertId(usize, i32),
    #[error("expert {1} of layer {0} lies outside the model file")]
    OutsideFile(usize, u32),
    #[error("{0} expert-cache slots do not fit this machine's address space")]
    TooManySlots(usize),
    #[error("the CPU pool needs a CPU device that reads the mapped file in place")]
    PoolDevice,
    #[error("routing counts of {0} entries given, the model has {1} (layers x experts)")]
    CountsShape(usize, usize),
    #[error("expert profile {path}: {detail}")]
    Profile { path: String, detail: String },
    #[error(
        "expert profile {path} was recorded for another model ({theirs}); this model is {ours}. Record one for it with `strata profile`"
    )]
    ProfileForAnotherModel {
        path: String,
        theirs: String,
        ours: String,
    },
}

impl ExpertCache {
    /// The cache for `model` on `dev`, with a CPU pool on `pool_dev` and, when `profile`
    /// is given, its slots filled with the profile's hottest experts.
    pub fn for_model(
        dev: &strata_core::Device,
        model: &strata_model::Model,
        pool_dev: strata_core::Device,
        opts: ExpertCacheOptions,
        profile: Option<&std::path::Path>,
    ) -> Result<ExpertCache, ExpertError> {
        let layout = Layout::of(model).ok_or(ExpertError::Dense)?;
        let counts = match profile {
            Some(path) => {
                let id = ModelId::of(model, &model.gguf)?;
                Some(Profile::read(path, &id)?.flat())
            }
            None => None,
        };
        let pool = CpuPool::new(pool_dev, model, model.gguf.clone())?;
        let host_memory = pool.device().info().total_memory as u64;
        pin_file(dev, &model.gguf, opts.pin_file, host_memory);
        let mut cache = ExpertCache::new(dev, layout, model.gguf.clone(), pool, opts)?;
        if let Some(c) = counts {
            cache.fill_from_counts(&c)?;
        }
        Ok(cache)
    }

    /// [`ExpertCache::for_model`], shareable between contexts.
    pub fn shared(self) -> SharedExpertCache {
        Arc::new(Mutex::new(self))
    }
}
