//! `strata bench`: prefill and decode speed, the way llama-bench measures them (random
//! prompt tokens for pp, one token at a time for tg).

use std::time::Instant;

use strata_engine::Context;

use super::common::{self, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens to prefill (0 skips).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens to decode (0 skips).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions; the figures are the mean.
    #[arg(short = 'r', long, default_value_t = 1)]
    pub reps: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut model_args = args.model.clone();
    let need = (args.n_prompt + args.n_gen + 1) as u32;
    model_args.ctx = Some(model_args.ctx.unwrap_or(need).max(need));
    let loaded = common::load(&model_args)?;
    let vocab = loaded.model.hp.n_vocab;
    let mut rng = strata_engine::sampler::Rng::new(42);
    let reps = args.reps.max(1);
    let (mut pp_s, mut tg_s) = (0.0, 0.0);
    for rep in 0..reps {
        let mut ctx = Context::new(
            loaded.model.clone(),
            loaded.dev.clone(),
            loaded.n_ctx,
            model_args.batch,
        )?;
        if args.n_prompt > 0 {
            let prompt: Vec<u32> = (0..args.n_prompt)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect();
            let t = Instant::now();
            ctx.eval(&prompt)?;
            pp_s += t.elapsed().as_secs_f64();
        }
        if args.n_gen > 0 {
            let mut tok = (rng.next_u64() % vocab as u64) as u32;
            let t = Instant::now();
            for _ in 0..args.n_gen {
                let logits = ctx.eval(&[tok])?;
                tok = strata_engine::sampler::argmax(&logits);
            }
            tg_s += t.elapsed().as_secs_f64();
        }
        tracing::info!("bench repetition {}/{reps} done", rep + 1);
    }
    let pp = if pp_s > 0.0 {
        (args.n_prompt * reps) as f64 / pp_s
    } else {
        0.0
    };
    let tg = if tg_s > 0.0 {
        (args.n_gen * reps) as f64 / tg_s
    } else {
        0.0
    };
    let info = loaded.dev.info();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if args.json {
        let obj = serde_json::json!({
            "model": args.model.model.display().to_string(),
            "architecture": loaded.model.hp.arch,
            "backend": info.backend.name(),
            "device": info.name,
            "threads": threads,
            "prefill_tokens": args.n_prompt,
            "prefill_tokens_per_s": pp,
            "decode_tokens": args.n_gen,
            "decode_tokens_per_s": tg,
            "repetitions": reps,
        });
        println!("{obj}");
    } else {
        println!(
            "model: {} ({})",
            args.model.model.display(),
            loaded.model.hp.arch
        );
        println!(
            "backend: {} on {} ({threads} threads)",
            info.backend.name(),
            info.name
        );
        println!("pp{}: {pp:.1} tokens/s", args.n_prompt);
        println!("tg{}: {tg:.1} tokens/s", args.n_gen);
    }
    Ok(())
}
