//! `strata profile`: routing counts per (layer, expert) over a file of prompts (one per
//! line), written as JSON for `--profile` to fill the expert cache with at start-up.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use strata_engine::experts::{ModelId, Profile};
use strata_engine::{Context, GenerateParams, SamplingParams, generate};

use super::common::{self, ModelArgs};
use super::experts::Placement;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompts, one per line (blank lines skipped).
    #[arg(long)]
    pub prompts: PathBuf,
    /// Where to write the profile.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// Tokens generated (greedy) after each prompt, so decode routing is counted too.
    #[arg(short = 'n', long = "n-predict", default_value_t = 32)]
    pub n_predict: usize,
    /// Plain completion: no chat template.
    #[arg(long)]
    pub raw: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("reading {}", args.prompts.display()))?;
    let prompts: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if prompts.is_empty() {
        bail!("{} holds no prompts", args.prompts.display());
    }
    // Counting needs the routing on the host: run through an expert cache even when every
    // expert would fit (sized as the flags say, all experts at most).
    let mut model_args = args.model.clone();
    if model_args.experts.expert_cache.as_deref() == Some("all") {
        model_args.experts.expert_cache = None;
    }
    let probe = strata_gguf::GgufFile::open(&model_args.model)
        .with_context(|| format!("opening {}", model_args.model.display()))?;
    let hp = strata_model::arch::hparams(&probe)?;
    let Some(moe) = &hp.moe else {
        bail!("{}: a dense model has no experts to profile", hp.arch);
    };
    if model_args.experts.expert_cache.is_none() {
        let dev = common::device(model_args.backend.as_deref(), model_args.gpu)?;
        let n_ctx = model_args.ctx.unwrap_or(hp.n_ctx_train.min(4096)).max(1);
        let all = moe.n_expert as usize * hp.n_layer as usize;
        let n = match model_args.experts.placement(
            &probe,
            &dev,
            common::kv_bytes_for(&hp, n_ctx, model_args.kv),
        )? {
            Placement::Device => all,
            Placement::Cache(n) => n.min(all),
        };
        model_args.experts.expert_cache = Some(n.to_string());
    }
    drop(probe);
    let loaded = common::load(&model_args)?;
    let Some(cache) = loaded.experts.clone() else {
        bail!("the model's experts are all on the device; nothing to count");
    };
    let before = cache
        .lock()
        .map_err(|_| anyhow::anyhow!("expert cache poisoned"))?
        .counts()
        .to_vec();
    let params = GenerateParams {
        max_tokens: args.n_predict,
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut tokens_seen = 0u64;
    for (i, prompt) in prompts.iter().enumerate() {
        let toks = if args.raw {
            loaded.tokenizer.encode(prompt, true, false)?
        } else {
            common::chat_tokens(&loaded.tokenizer, &[("user", prompt)])?
        };
        let mut ctx = Context::with_kv(
            loaded.model.clone(),
            loaded.dev.clone(),
            loaded.n_ctx,
            model_args.batch,
            loaded.kv,
        )?;
        ctx.set_micro_batch(model_args.micro_batch(&loaded));
        ctx.set_expert_cache(Some(cache.clone()));
        let g = generate(&mut ctx, &loaded.tokenizer, &toks, &params, |_| true)?;
        tokens_seen += (toks.len() + g.tokens.len()) as u64;
        tracing::info!(
            "profile: prompt {}/{} ({} + {} tokens)",
            i + 1,
            prompts.len(),
            toks.len(),
            g.tokens.len()
        );
    }
    let cache = cache
        .lock()
        .map_err(|_| anyhow::anyhow!("expert cache poisoned"))?;
    let counts: Vec<u64> = cache
        .counts()
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    let id = ModelId::of(&loaded.model, &loaded.model.gguf)?;
    Profile::new(id, tokens_seen, &counts).write(&args.output)?;
    eprintln!(
        "strata: profile of {} prompts ({tokens_seen} tokens) written to {}",
        prompts.len(),
        args.output.display()
    );
    Ok(())
}
