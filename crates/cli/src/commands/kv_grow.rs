//! The elastic K/V flags of run, chat, bench and serve: `--kv-grow` (off by default), with
//! `--kv-grow-init` / `--kv-grow-step` (default: $STRATA_KV_GROW_INIT / $STRATA_KV_GROW_STEP,
//! else 4096 / 2048 cells). Growth leaves `--vram-reserve-mib` of device memory free.

use anyhow::Context as _;
use strata_engine::Context;
use strata_engine::kv_grow::KvGrowOptions;

use super::experts::ExpertArgs;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct KvGrowArgs {
    /// Elastic K/V: start at --kv-grow-init cells and grow by --kv-grow-step, taking
    /// expert-cache slots (the hot experts in them move to colder ones' slots); trimmed
    /// back, the slots returned and refilled, at the end of each request. Growth never
    /// takes the --vram-reserve-mib headroom: a request that needs more stops.
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
    /// The elastic K/V's options, or `None` when off (or with `--resident`, whose fixed
    /// set no slot may leave).
    pub fn options(&self, experts: &ExpertArgs) -> anyhow::Result<Option<KvGrowOptions>> {
        if !self.kv_grow {
            return Ok(None);
        }
        if experts.resident {
            tracing::warn!("--resident keeps the expert set fixed: --kv-grow is off");
            return Ok(None);
        }
        let env = KvGrowOptions::from_env().map_err(anyhow::Error::msg)?;
        let opts = KvGrowOptions {
            init: self.init.unwrap_or(env.init),
            step: self.step.unwrap_or(env.step),
            reserve: experts.vram_reserve_mib << 20,
        };
        if opts.init == 0 || opts.step == 0 {
            anyhow::bail!("--kv-grow-init and --kv-grow-step must be positive");
        }
        Ok(Some(opts))
    }

    /// Makes `ctx`'s K/V elastic when asked (trimming the K/V it was created with).
    pub fn apply(&self, ctx: &mut Context, experts: &ExpertArgs) -> anyhow::Result<()> {
        if let Some(opts) = self.options(experts)? {
            ctx.set_kv_grow(Some(opts)).context("--kv-grow")?;
        }
        Ok(())
    }
}
