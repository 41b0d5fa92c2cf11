//! `strata chat`: an interactive conversation. The K/V cache is kept between turns: each
//! turn re-renders the conversation and feeds only the tokens after the longest prefix
//! the context already holds.

use std::io::{BufRead, Write};

use strata_engine::{Context, GenerateParams, generate};

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
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n_predict: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let loaded = common::load(&args.model)?;
    let mut ctx = Context::with_kv(
        loaded.model.clone(),
        loaded.dev.clone(),
        loaded.n_ctx,
        args.model.batch,
        loaded.kv,
    )?;
    ctx.set_micro_batch(args.model.micro_batch(&loaded));
    experts::attach(&mut ctx, &loaded.experts);
    args.kv_grow.apply(&mut ctx, &args.model.experts)?;
    let mut turns: Vec<(String, String)> = Vec::new();
    if let Some(s) = &args.system {
        turns.push(("system".into(), s.clone()));
    }
    let params = GenerateParams {
        max_tokens: args.n_predict,
        sampling: args.sampling.params(),
        ..Default::default()
    };
    eprintln!("strata chat: type a message, an empty line or Ctrl-D to quit");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line?;
        if line.trim().is_empty() {
            break;
        }
        turns.push(("user".into(), line));
        let messages: Vec<(&str, &str)> = turns
            .iter()
            .map(|(r, c)| (r.as_str(), c.as_str()))
            .collect();
        let tokens = common::chat_tokens(&loaded.tokenizer, &messages)?;
        let reuse = ctx
            .tokens()
            .iter()
            .zip(&tokens)
            .take_while(|(a, b)| a == b)
            .count()
            // Always feed at least one token so there are logits to sample from.
            .min(tokens.len().saturating_sub(1));
        ctx.truncate(reuse);
        let mut stdout = std::io::stdout().lock();
        let g = generate(
            &mut ctx,
            &loaded.tokenizer,
            &tokens[reuse..],
            &params,
            |t| stdout.write_all(t.as_bytes()).is_ok() && stdout.flush().is_ok(),
        );
        let _ = writeln!(stdout);
        // The end of a request: an elastic K/V gives its slots back (the next turn
        // re-reads what did not fit the initial cells).
        if let Err(e) = ctx.trim_kv() {
            eprintln!("strata: {e}");
        }
        experts::report(&ctx);
        match g {
            Ok(g) => {
                tracing::debug!("turn: reused {reuse} tokens, read {}", tokens.len() - reuse);
                turns.push(("assistant".into(), g.text));
            }
            Err(e) => {
                eprintln!("strata: {e}");
                turns.pop();
            }
        }
    }
    Ok(())
}
