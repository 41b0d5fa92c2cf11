//! `strata run`: answer one prompt. Only the generated text goes to stdout; logs, progress
//! and timings go to stderr, so the output can be piped and compared.

use std::io::{IsTerminal, Write};

use anyhow::Context as _;
use strata_engine::spec::{DraftModel, Drafter};
use strata_engine::{Context, GenerateParams, generate_with};

use super::common::{self, ModelArgs, SamplingArgs};
use super::experts;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub kv_grow: super::kv_grow::KvGrowArgs,
    /// The prompt.
    #[arg(short = 'p', long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long)]
    pub file: Option<std::path::PathBuf>,
    /// Plain completion: no chat template.
    #[arg(long)]
    pub raw: bool,
    /// System message (chat mode).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    /// Stop when the output contains this text (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub spec: super::spec::SpecArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        (None, None) => anyhow::bail!("give a prompt with -p TEXT or -f FILE"),
    };
    let grow = args.kv_grow.options(&args.model.experts)?;
    let loaded = common::load_elastic(&args.model, 1, grow.map(|o| o.init))?;
    let tokens = if args.raw {
        loaded.tokenizer.encode(&prompt, true, false)?
    } else {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(("system", s.as_str()));
        }
        messages.push(("user", prompt.as_str()));
        common::chat_tokens(&loaded.tokenizer, &messages)?
    };
    let (model, dev) = (loaded.model.clone(), loaded.dev.clone());
    let (n_ctx, batch) = (loaded.n_ctx, args.model.batch);
    // An elastic K/V allocates only its initial cells now.
    let mut ctx = match grow {
        Some(o) => Context::with_kv_grow(model, dev, n_ctx, batch, loaded.kv, o)?,
        None => Context::with_kv(model, dev, n_ctx, batch, loaded.kv)?,
    };
    ctx.set_micro_batch(args.model.micro_batch(&loaded));
    experts::attach(&mut ctx, &loaded.experts);
    let params = GenerateParams {
        max_tokens: args.n_predict,
        stop: args.stop.clone(),
        sampling: args.sampling.params(),
        ignore_eos: args.ignore_eos,
        show_special: false,
    };
    let mut draft = match args.spec.load_draft(&loaded)? {
        Some(m) => {
            let ctx = Context::new(m, loaded.dev.clone(), loaded.n_ctx, args.model.batch)?;
            Some(DraftModel::new(ctx, &loaded.model)?)
        }
        None => None,
    };
    let mut stdout = std::io::stdout().lock();
    let spec = args.spec.config();
    let g = generate_with(
        &mut ctx,
        &loaded.tokenizer,
        &tokens,
        &params,
        &spec,
        draft.as_mut().map(|d| d as &mut dyn Drafter),
        |text| stdout.write_all(text.as_bytes()).is_ok() && stdout.flush().is_ok(),
    )?;
    if stdout.is_terminal() {
        let _ = writeln!(stdout);
    }
    eprintln!(
        "strata: prompt {} tokens in {:.2} s ({:.1} tokens/s); generated {} tokens in {:.2} s ({:.1} tokens/s); stop: {:?}",
        g.prompt_tokens,
        g.prefill_seconds,
        g.prompt_tokens as f64 / g.prefill_seconds.max(1e-9),
        g.tokens.len(),
        g.decode_seconds,
        g.decode_tokens_per_s(),
        g.stop
    );
    if let Some(stats) = &g.spec {
        eprintln!("strata: {}", stats.summary());
    }
    ctx.trim_kv()?;
    experts::report(&ctx);
    Ok(())
}
