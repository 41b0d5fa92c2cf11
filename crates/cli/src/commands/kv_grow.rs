//! The elastic K/V flags of run, chat and bench: `--kv-grow` (off by default), with
//! `--kv-grow-init` / `--kv-grow-step` (default: $STRATA_KV_GROW_INIT / $STRATA_KV_GROW_STEP,
//! else 4096 / 2048 cells).

use anyhow::Context as _;
use strata_engine::Context;
use strata_engine::kv_grow::KvGrowOptions;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct KvGrowArgs {
    /// Elastic K/V: start at --kv-grow-init cells and grow by --kv-grow-step, taking
    /// expert-cache slots (the hot experts in them move to colder ones' slots); trimmed
    /// back, the slots returned and refilled, at the end of each request.
    #[arg(long = "kv-grow")]
    pub kv_grow: bool,
    /// Initial K/V cells with --kv-grow (default: $STRATA_KV_GROW_INIT, else 4096).
    #[arg(long = "kv-grow-init", value_name = "CELLS")]
    pub init: Option<u32>,
    /// Cells per growth step with --kv-grow (default: $STRATA_KV_GROW_STEP, else 2048).
    #[arg(long = "kv-grow-step", value_name = "CELLS")]
    pub step: Option<u32>,
}

impl KvGrowArgs {
    /// Makes `ctx`'s K/V elastic when asked (not with `--resident`, whose fixed set no
    /// slot may leave).
    pub fn apply(&self, ctx: &mut Context, resident: bool) -> anyhow::Result<()> {
        if !self.kv_grow {
            return Ok(());
        }
        if resident {
            tracing::warn!("--resident keeps the expert set fixed: --kv-grow is off");
            return Ok(());
        }
        let env = KvGrowOptions::from_env().map_err(anyhow::Error::msg)?;
        let opts = KvGrowOptions {
            init: self.init.unwrap_or(env.init),
            step: self.step.unwrap_or(env.step),
        };
        ctx.set_kv_grow(Some(opts)).context("--kv-grow")?;
        Ok(())
    }
}
