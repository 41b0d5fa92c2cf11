//! The speculative-decoding flags of run and serve: `--spec K`, `--spec-fixed` and
//! `--draft-model FILE`, and loading the draft model.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use strata_engine::spec::{SpecConfig, draft_model};
use strata_model::Model;

use super::common::Loaded;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpecArgs {
    /// Speculative decoding: verify up to K prompt-lookup drafts per forward pass (greedy
    /// output is the same as without it; sampled output has the same distribution). 0: off.
    #[arg(long, default_value_t = 0)]
    pub spec: usize,
    /// Verify every proposal of up to K drafts, even where drafts are rarely accepted
    /// (default: back off and decode plainly where drafting does not pay).
    #[arg(long)]
    pub spec_fixed: bool,
    /// Draft with this small GGUF model (the same vocabulary; it decodes greedily in a
    /// context of its own on the same device) instead of prompt lookup; needs --spec K.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
}

impl SpecArgs {
    pub fn config(&self) -> SpecConfig {
        SpecConfig {
            k: self.spec,
            adaptive: !self.spec_fixed,
        }
    }

    /// The `--draft-model`, loaded on the target's device and checked against its
    /// vocabulary; `None` without the flag.
    pub fn load_draft(&self, loaded: &Loaded) -> anyhow::Result<Option<Arc<Model>>> {
        let Some(path) = &self.draft_model else {
            return Ok(None);
        };
        if self.spec == 0 {
            anyhow::bail!("--draft-model drafts for speculative decoding: give --spec K too");
        }
        let model = load(path, loaded)?;
        draft_model::same_vocabulary(&model, &loaded.model)?;
        Ok(Some(Arc::new(model)))
    }
}

fn load(path: &Path, loaded: &Loaded) -> anyhow::Result<Model> {
    let gguf = Arc::new(
        strata_gguf::GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?,
    );
    Model::load(&loaded.dev, loaded.dev.main_stream(), gguf, |_, _| {})
        .with_context(|| format!("loading the draft model {}", path.display()))
}
