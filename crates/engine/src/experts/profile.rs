//! Expert profiles: routing counts per (layer, expert), written by `strata profile` and read
//! by `--profile` to fill the cache with the hottest experts at start-up. A profile names
//! the model it was recorded on (shape and a fingerprint of its router weights), and one
//! for another model is refused.

use std::path::Path;

use serde::{Deserialize, Serialize};
use strata_gguf::GgufFile;
use strata_model::Model;

use super::ExpertError;

pub const PROFILE_FORMAT: &str = "strata-expert-profile";
pub const PROFILE_VERSION: u32 = 1;

/// What identifies a model for a profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelId {
    pub arch: String,
    pub n_layer: u32,
    pub n_expert: u32,
    pub n_expert_used: u32,
    /// FNV-1a (64-bit, hex) of every router matrix's bytes: different weights route
    /// differently, so counts from them mean nothing here.
    pub router_fnv: String,
}

impl ModelId {
    pub fn of(model: &Model, gguf: &GgufFile) -> Result<ModelId, ExpertError> {
        let moe = model.hp.moe.as_ref().ok_or(ExpertError::Dense)?;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for i in 0..model.hp.n_layer {
            if let Some(t) = gguf.tensor(&format!("blk.{i}.ffn_gate_inp.weight")) {
                for &b in gguf.tensor_data(t) {
                    h ^= u64::from(b);
                    h = h.wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
        }
        Ok(ModelId {
            arch: model.hp.arch.clone(),
            n_layer: model.hp.n_layer,
            n_expert: moe.n_expert,
            n_expert_used: moe.n_expert_used,
            router_fnv: format!("{h:016x}"),
        })
    }
}

/// Routing counts of one or more runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Profile {
    pub format: String,
    pub version: u32,
    pub model: ModelId,
    /// Tokens the counts come from.
    pub tokens: u64,
    /// `counts[layer][expert]`: how many tokens routed to that expert.
    pub counts: Vec<Vec<u64>>,
}

impl Profile {
    pub fn new(model: ModelId, tokens: u64, flat: &[u64]) -> Profile {
        let n = model.n_expert.max(1) as usize;
        Profile {
            format: PROFILE_FORMAT.into(),
            version: PROFILE_VERSION,
            model,
            tokens,
            counts: flat.chunks(n).map(<[u64]>::to_vec).collect(),
        }
    }

    pub fn write(&self, path: &Path) -> Result<(), ExpertError> {
        let text = serde_json::to_string(self).map_err(|e| ExpertError::Profile {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
        std::fs::write(path, text).map_err(|e| ExpertError::Profile {
            path: path.display().to_string(),
            detail: e.to_string(),
        })
    }

    /// Reads `path` and checks it belongs to the model `want` describes.
    pub fn read(path: &Path, want: &ModelId) -> Result<Profile, ExpertError> {
        let bad = |detail: String| ExpertError::Profile {
            path: path.display().to_string(),
            detail,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let p: Profile = serde_json::from_str(&text)
            .map_err(|e| bad(format!("not a strata expert profile: {e}")))?;
        if p.format != PROFILE_FORMAT || p.version != PROFILE_VERSION {
            return Err(bad(format!(
                "format {:?} version {}, expected {PROFILE_FORMAT:?} version {PROFILE_VERSION}",
                p.format, p.version
            )));
        }
        if p.model != *want {
            return Err(ExpertError::ProfileForAnotherModel {
                path: path.display().to_string(),
                theirs: describe(&p.model),
                ours: describe(want),
            });
        }
        let n = want.n_expert as usize;
        if p.counts.len() != want.n_layer as usize || p.counts.iter().any(|c| c.len() != n) {
            return Err(bad(format!(
                "counts are not {} layers of {n} experts",
                want.n_layer
            )));
        }
        Ok(p)
    }

    /// The counts as one `layers x experts` row-major vector.
    pub fn flat(&self) -> Vec<u64> {
        self.counts.concat()
    }
}

fn describe(m: &ModelId) -> String {
    format!(
        "{} with {} layers x {} experts ({} used), routers {}",
        m.arch, m.n_layer, m.n_expert, m.n_expert_used, m.router_fnv
    )
}
