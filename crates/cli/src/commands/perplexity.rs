//! `strata perplexity`: the perplexity of a model on a text, as llama-perplexity computes
//! it (chunks of --ctx tokens, the second half of each scored; strata_engine::perplexity),
//! printing the running value after each chunk and llama-perplexity's final line.

use std::io::Write;

use anyhow::Context as _;
use strata_engine::Context;
use strata_engine::perplexity::{PerplexityOptions, perplexity};

use super::common::{self, ModelArgs};
use super::experts;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score.
    #[arg(short = 'f', long)]
    pub file: std::path::PathBuf,
    /// Chunks to score at most (default: every whole chunk).
    #[arg(long)]
    pub chunks: Option<usize>,
}

/// Tokens per chunk when --ctx is not given (llama-perplexity's usual 512).
const DEFAULT_CHUNK: u32 = 512;

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let mut model_args = args.model.clone();
    let n_ctx = model_args.ctx.unwrap_or(DEFAULT_CHUNK);
    model_args.ctx = Some(n_ctx);
    let loaded = common::load(&model_args)?;
    let tokens = loaded.tokenizer.encode(&text, true, false)?;
    let tok = &loaded.tokenizer;
    let bos = tok.adds_bos().then_some(tok.special().bos).flatten();
    let mut ctx = Context::with_kv(
        loaded.model.clone(),
        loaded.dev.clone(),
        n_ctx,
        model_args.batch,
        loaded.kv,
    )?;
    ctx.set_micro_batch(model_args.micro_batch(&loaded));
    experts::attach(&mut ctx, &loaded.experts);
    let opts = PerplexityOptions {
        n_ctx: n_ctx as usize,
        max_chunks: args.chunks,
        bos,
    };
    let n_chunks = (tokens.len() / n_ctx as usize).min(args.chunks.unwrap_or(usize::MAX));
    eprintln!(
        "strata: perplexity over {n_chunks} chunks of {n_ctx} tokens ({} tokens in the text), {} K/V",
        tokens.len(),
        loaded.kv
    );
    let start = std::time::Instant::now();
    let mut stdout = std::io::stdout().lock();
    let result = perplexity(&mut ctx, &tokens, &opts, |c| {
        let _ = write!(stdout, "[{}]{:.4},", c.index + 1, c.running);
        let _ = stdout.flush();
    })?;
    writeln!(stdout)?;
    writeln!(
        stdout,
        "Final estimate: PPL = {:.4} +/- {:.5}",
        result.value(),
        result.uncertainty()
    )?;
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "strata: {} tokens scored, {} read in {secs:.2} s ({:.1} tokens/s)",
        result.count,
        n_chunks * n_ctx as usize,
        (n_chunks * n_ctx as usize) as f64 / secs.max(1e-9)
    );
    Ok(())
}
