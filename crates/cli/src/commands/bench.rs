//! `strata bench`: prefill and decode speed, the way llama-bench measures them (random
//! prompt tokens for pp, one token at a time for tg).

use std::time::Instant;

use strata_engine::experts::ExpertStats;
use strata_engine::spec::{SpecStats, WindowCost, measure_window_costs};
use strata_engine::{Context, GenerateParams, SamplingParams, generate_spec};

use super::common::{self, ModelArgs};
use super::experts;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv_grow: super::kv_grow::KvGrowArgs,
    /// Prompt tokens to prefill (0 skips).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens to decode (0 skips).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Tokens already in the context when decoding starts (llama-bench's -d): 0, the
    /// default, decodes from an empty context as llama-bench's tg does, whatever -p is.
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: usize,
    /// Repetitions; the figures are the mean.
    #[arg(short = 'r', long, default_value_t = 1)]
    pub reps: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Launch every decode kernel instead of replaying the captured step graph.
    #[arg(long)]
    pub no_graphs: bool,
    /// Also measure the device's copy bandwidth (2 GiB of buffers) and report decode as
    /// a fraction of that roofline.
    #[arg(long)]
    pub roofline: bool,
    /// Decode with speculative decoding: up to K prompt-lookup drafts per verify window
    /// (greedy; drafts come from the prompt and the output so far). 0: off.
    #[arg(long, default_value_t = 0)]
    pub spec: usize,
    /// Instead of pp/tg: what a verify window of K+1 positions costs against one decode
    /// step. Decodes -n tokens greedily after a random prompt of -p tokens, one per step,
    /// then again in windows whose K drafts replay that output (all accepted, whatever
    /// the weights); each step and window timed, captures and K/V growth in an untimed
    /// warm-up. Windows up to 16 positions replay captured graphs (unless --no-graphs).
    /// A comma-separated list (1,2,4,8) measures each size after one plain run; with
    /// --json, one object per size, a line each.
    #[arg(
        long,
        value_name = "K[,K...]",
        value_delimiter = ',',
        conflicts_with = "spec"
    )]
    pub spec_window_cost: Vec<usize>,
}

/// Bytes of weights one decode token reads: every matrix once, the routed experts'
/// share of each expert tensor (n_used of n_expert), one row of the token embedding
/// (all of it when it doubles as the output matrix).
fn weight_bytes_per_token(model: &strata_model::Model) -> f64 {
    let tied = model.gguf.tensor("output.weight").is_none();
    let (used, experts) = model
        .hp
        .moe
        .as_ref()
        .map_or((1.0, 1.0), |m| (m.n_expert_used as f64, m.n_expert as f64));
    model
        .gguf
        .tensors()
        .iter()
        .map(|t| {
            let bytes = t.n_bytes as f64;
            if t.name.contains("_exps") {
                bytes * used / experts
            } else if t.name == "token_embd.weight" && !tied {
                bytes / t.dims.get(1).copied().unwrap_or(1).max(1) as f64
            } else {
                bytes
            }
        })
        .sum()
}

/// Bytes of weights a forward reads outside the routed experts (every matrix once, the
/// embedding as in [`weight_bytes_per_token`]), and the bytes of one routed expert summed
/// over the layers: a forward whose layers route to `d` distinct experts each reads
/// `dense + d · expert`.
fn weight_bytes_dense_and_expert(model: &strata_model::Model) -> (f64, f64) {
    let experts = model.hp.moe.as_ref().map_or(1.0, |m| m.n_expert as f64);
    let routed: f64 = model
        .gguf
        .tensors()
        .iter()
        .filter(|t| t.name.contains("_exps"))
        .map(|t| t.n_bytes as f64)
        .sum();
    let used = model
        .hp
        .moe
        .as_ref()
        .map_or(0.0, |m| m.n_expert_used as f64);
    let expert = routed / experts;
    (weight_bytes_per_token(model) - used * expert, expert)
}

/// The fields every `--json` object of `bench` starts with: what ran, where, how.
fn args_json(args: &Args, loaded: &common::Loaded) -> serde_json::Value {
    let info = loaded.dev.info();
    serde_json::json!({
        "model": args.model.model.display().to_string(),
        "architecture": loaded.model.hp.arch,
        "backend": info.backend.name(),
        "device": info.name,
        "threads": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "graphs": !args.no_graphs,
        "kv": loaded.kv.name(),
        "n_ctx": loaded.n_ctx,
    })
}

/// `run`'s fields with a measurement's `fields` added.
fn with_run_fields(mut run: serde_json::Value, fields: serde_json::Value) -> serde_json::Value {
    if let (Some(r), serde_json::Value::Object(f)) = (run.as_object_mut(), fields) {
        r.extend(f);
    }
    run
}

/// Device-to-device copy bandwidth (bytes read + bytes written per second), the
/// roofline a decode step's weight reads are measured against.
fn copy_bandwidth(dev: &strata_core::Device) -> anyhow::Result<f64> {
    let len = 256usize << 20; // 1 GiB of f32
    let (a, b) = (dev.alloc::<f32>(len)?, dev.alloc::<f32>(len)?);
    let stream = dev.main_stream();
    dev.copy(&a, &b, stream)?;
    dev.synchronize()?;
    let reps = 10;
    let t = Instant::now();
    for _ in 0..reps {
        dev.copy(&a, &b, stream)?;
    }
    dev.synchronize()?;
    Ok(2.0 * (len * 4 * reps) as f64 / t.elapsed().as_secs_f64())
}

/// Per-kernel device time of the last repetition's prefill or decode steps (backends
/// that profile: CUDA with STRATA_KERNEL_TIMING=1; graph replays are not broken down, so
/// pair it with --no-graphs), on stderr.
fn print_profile(what: &str, times: &[strata_core::KernelTime], steps: usize) {
    print_profile_per(what, times, steps, "step");
}

/// [`print_profile`] over `steps` units named `unit` (a step, a window).
fn print_profile_per(what: &str, times: &[strata_core::KernelTime], steps: usize, unit: &str) {
    if times.is_empty() {
        return;
    }
    let total: f64 = times.iter().map(|t| t.seconds).sum();
    // A replayed graph's profile is its last replay: one step already.
    let one_replay = times.iter().all(|t| t.one_replay);
    let steps = if one_replay { 1 } else { steps };
    let per_step = |s: f64| 1e6 * s / steps.max(1) as f64;
    eprintln!(
        "{what} profile: {:.1} us of kernel time per {unit} ({})",
        per_step(total),
        if one_replay {
            format!("the last replayed {unit}")
        } else {
            format!("{steps} {unit}s")
        }
    );
    eprintln!(
        "{:<24} {:<32} {:>9} {:>12} {:>10} {:>7}",
        "kernel",
        "function",
        "launches",
        format!("us/{unit}"),
        "us/launch",
        "share"
    );
    for t in times {
        eprintln!(
            "{:<24} {:<32} {:>9} {:>12.1} {:>10.2} {:>6.1}%",
            t.kernel.name(),
            t.function,
            t.launches,
            per_step(t.seconds),
            1e6 * t.seconds / t.launches.max(1) as f64,
            100.0 * t.seconds / total
        );
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut model_args = args.model.clone();
    // At least the warm-up's six positions (a prompt of four, then two decode steps).
    let need = ((args.n_prompt.max(args.depth).max(1) + args.n_gen + 1) as u32).max(6);
    model_args.ctx = Some(model_args.ctx.unwrap_or(need).max(need));
    let loaded = common::load(&model_args)?;
    let vocab = loaded.model.hp.n_vocab;
    let mut rng = strata_engine::sampler::Rng::new(42);
    let reps = args.reps.max(1);
    let new_context = || -> anyhow::Result<Context> {
        let mut ctx = Context::with_kv(
            loaded.model.clone(),
            loaded.dev.clone(),
            loaded.n_ctx,
            model_args.batch,
            loaded.kv,
        )?;
        ctx.set_micro_batch(model_args.micro_batch(&loaded));
        ctx.set_graphs(!args.no_graphs);
        experts::attach(&mut ctx, &loaded.experts);
        args.kv_grow.apply(&mut ctx, &model_args.experts)?;
        Ok(ctx)
    };
    // Warm-up (as llama-bench does): kernel compilation and the decode graph's capture
    // are not part of the figures.
    {
        let mut ctx = new_context()?;
        ctx.eval(&[1, 2, 3, 4])?;
        ctx.eval(&[5])?;
        ctx.eval(&[6])?;
    }
    if !args.spec_window_cost.is_empty() {
        return window_cost(&args, &loaded, &new_context, &mut rng);
    }
    let (mut pp_s, mut tg_s) = (0.0, 0.0);
    let mut decode_profile = Vec::new();
    let mut prefill_profile = Vec::new();
    let mut spec_stats = SpecStats::default();
    for rep in 0..reps {
        let mut ctx = new_context()?;
        // The warm-up's (or the last repetition's) expert statistics are not this one's.
        let _ = ctx.take_expert_stats();
        if args.n_prompt > 0 {
            let prompt: Vec<u32> = (0..args.n_prompt)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect();
            loaded.dev.kernel_times()?; // a profile covers the prompt only
            let t = Instant::now();
            ctx.eval(&prompt)?;
            pp_s += t.elapsed().as_secs_f64();
            prefill_profile = loaded.dev.kernel_times()?;
        }
        if args.n_gen > 0 {
            // Decode from `depth` tokens of context, not after the timed prompt.
            ctx.truncate(0);
            if args.depth > 0 {
                let filler: Vec<u32> = (0..args.depth)
                    .map(|_| (rng.next_u64() % vocab as u64) as u32)
                    .collect();
                ctx.eval(&filler)?;
            }
            let mut tok = (rng.next_u64() % vocab as u64) as u32;
            loaded.dev.kernel_times()?; // a profile covers the decode steps only
            let t = Instant::now();
            if args.spec > 0 {
                let params = GenerateParams {
                    max_tokens: args.n_gen,
                    sampling: SamplingParams::greedy(),
                    ignore_eos: true,
                    ..GenerateParams::default()
                };
                let g = generate_spec(
                    &mut ctx,
                    &loaded.tokenizer,
                    &[tok],
                    &params,
                    args.spec,
                    None,
                    |_| true,
                )?;
                if let Some(s) = g.spec {
                    spec_stats.add(&s);
                }
            } else {
                // Greedy, as generate's plain steps: only the chosen id leaves the device.
                for _ in 0..args.n_gen {
                    tok = ctx.eval_argmax(&[tok])?;
                }
            }
            tg_s += t.elapsed().as_secs_f64();
            decode_profile = loaded.dev.kernel_times()?;
        }
        experts::report(&ctx);
        // A repetition ends as a request does: an elastic K/V trims back (and logs the
        // trim's stall) and its slots return to the expert cache.
        ctx.trim_kv()?;
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
    if args.spec > 0 {
        eprintln!("strata bench: {}", spec_stats.summary());
    }
    let info = loaded.dev.info();
    print_profile("prefill", &prefill_profile, 1);
    print_profile("decode", &decode_profile, args.n_gen);
    let weight_bytes = weight_bytes_per_token(&loaded.model);
    let bandwidth = if args.roofline {
        Some(copy_bandwidth(&loaded.dev)?)
    } else {
        None
    };
    let roofline = bandwidth.map(|bw| tg * weight_bytes / bw);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Which way uploads went (expert fills, staged layers, streamed experts): straight from
    // the registered (page-locked) file, or through a host copy.
    let uploads = loaded.dev.upload_counts();
    if args.json {
        let obj = with_run_fields(
            args_json(&args, &loaded),
            serde_json::json!({
                "prefill_tokens": args.n_prompt,
                "prefill_tokens_per_s": pp,
                "decode_tokens": args.n_gen,
                "decode_depth": args.depth,
                "decode_tokens_per_s": tg,
                "repetitions": reps,
                "weight_bytes_per_token": weight_bytes,
                "device_copy_bytes_per_s": bandwidth,
                "decode_roofline_fraction": roofline,
                "upload_bytes_direct": uploads.direct,
                "upload_bytes_staged": uploads.staged,
            }),
        );
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
        println!("K/V: {} positions, {}", loaded.n_ctx, loaded.kv);
        println!("pp{}: {pp:.1} tokens/s", args.n_prompt);
        println!("tg{}: {tg:.1} tokens/s", args.n_gen);
        println!(
            "uploads: {:.2} GB straight from the registered model file, {:.2} GB through staging",
            uploads.direct as f64 / 1e9,
            uploads.staged as f64 / 1e9
        );
        println!(
            "weights read per decode token: {:.3} GB",
            weight_bytes / 1e9
        );
        if let (Some(bw), Some(f)) = (bandwidth, roofline) {
            println!(
                "device copy bandwidth {:.0} GB/s; decode at {:.1}% of that roofline",
                bw / 1e9,
                100.0 * f
            );
        }
    }
    Ok(())
}

/// `--spec-window-cost K[,K...]`: the timings of `-r` measurements pooled per K, on
/// stdout as text or one JSON object per K; the expert cache's statistics of the last
/// measurement on stderr.
fn window_cost(
    args: &Args,
    loaded: &common::Loaded,
    new_context: &dyn Fn() -> anyhow::Result<Context>,
    rng: &mut strata_engine::sampler::Rng,
) -> anyhow::Result<()> {
    let ks = &args.spec_window_cost;
    let vocab = loaded.model.hp.n_vocab as u64;
    let reps = args.reps.max(1);
    let mut costs = vec![WindowCost::default(); ks.len()];
    for rep in 0..reps {
        let mut ctx = new_context()?;
        let prompt: Vec<u32> = (0..args.n_prompt.max(1))
            .map(|_| (rng.next_u64() % vocab) as u32)
            .collect();
        let measured = measure_window_costs(&mut ctx, &prompt, args.n_gen, ks)?;
        for (cost, m) in costs.iter_mut().zip(&measured) {
            cost.add(m);
        }
        tracing::info!("window-cost repetition {}/{reps} done", rep + 1);
    }
    let hit_rate = |s: &Option<ExpertStats>| {
        s.as_ref().map(|s| {
            let hits = s.decode_hits + s.prefill_hits;
            let all = hits + s.decode_misses + s.prefill_misses;
            if all == 0 {
                1.0
            } else {
                hits as f64 / all as f64
            }
        })
    };
    if let Some(p) = costs.first().and_then(|c| c.plain_experts.as_ref()) {
        eprintln!("strata bench: plain steps: {p}");
    }
    for cost in &costs {
        // Windows are batched steps: the decode figures of the line above stay 0 there.
        if let Some(w) = &cost.window_experts {
            eprintln!(
                "strata bench: windows of {}: expert cache hit rate {:.1}% ({} of {} routed experts), PCIe {:.2} MiB, CPU pool {:.3} s",
                cost.k + 1,
                100.0 * hit_rate(&cost.window_experts).unwrap_or(1.0),
                w.decode_hits + w.prefill_hits,
                w.decode_hits + w.prefill_hits + w.decode_misses + w.prefill_misses,
                w.bus_bytes() as f64 / (1u64 << 20) as f64,
                w.pool_seconds
            );
            if w.window.layers > 0 {
                eprintln!(
                    "strata bench: a window's MoE layers (ms): {}",
                    w.window.summary(w.windows)
                );
            }
            if let Some(p) = &cost.plain_experts {
                let (dense, expert) = weight_bytes_dense_and_expert(&loaded.model);
                let bytes = |distinct: f64| dense + distinct * expert;
                let (step, window) = (
                    bytes(p.decode.distinct_experts_per_layer()),
                    bytes(w.window.distinct_experts_per_layer()),
                );
                // Both read at one bandwidth, a window costs at least this many steps.
                eprintln!(
                    "strata bench: weights a step reads {:.3} GB, a window of {} {:.3} GB ({:.2}x: each distinct expert once)",
                    step / 1e9,
                    cost.k + 1,
                    window / 1e9,
                    window / step
                );
            }
        }
    }
    // Per kernel (STRATA_KERNEL_TIMING=1 on CUDA), the last repetition's.
    if let Some(c) = costs.first() {
        print_profile("plain step", &c.plain_kernels, c.step_seconds.len() / reps);
    }
    for c in &costs {
        let windows = c.window_seconds.len() / reps;
        let what = format!("window of {}", c.k + 1);
        print_profile_per(&what, &c.window_kernels, windows, "window");
    }
    let median_ms = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).map_or(0.0, |s| 1e3 * s)
    };
    // The least a step or window took: the figure least moved by other work on the
    // machine (contention only adds time).
    let min_ms = |v: &[f64]| 1e3 * v.iter().copied().fold(f64::INFINITY, f64::min);
    let info = loaded.dev.info();
    if !args.json {
        println!(
            "model: {} ({}), backend: {} on {}, graphs {}",
            args.model.model.display(),
            loaded.model.hp.arch,
            info.backend.name(),
            info.name,
            if args.no_graphs { "off" } else { "on" }
        );
        if let Some(c) = costs.first() {
            println!(
                "plain decode step: {:.3} ms (median {:.3}; {} steps, {:.1} tokens/s)",
                1e3 * c.mean_step_seconds(),
                median_ms(&c.step_seconds),
                c.step_seconds.len(),
                c.plain_tokens_per_s()
            );
        }
    }
    for c in &costs {
        let k = c.k;
        if args.json {
            let obj = with_run_fields(
                args_json(args, loaded),
                serde_json::json!({
                    "prompt_tokens": args.n_prompt.max(1),
                    "decode_tokens": args.n_gen,
                    "repetitions": reps,
                    "spec_window_k": k,
                    "window_positions": k + 1,
                    "plain_steps": c.step_seconds.len(),
                    "windows": c.window_seconds.len(),
                    "step_ms": 1e3 * c.mean_step_seconds(),
                    "window_ms": 1e3 * c.mean_window_seconds(),
                    "step_ms_median": median_ms(&c.step_seconds),
                    "window_ms_median": median_ms(&c.window_seconds),
                    "step_ms_min": min_ms(&c.step_seconds),
                    "window_ms_min": min_ms(&c.window_seconds),
                    "window_step_ratio": c.ratio(),
                    "plain_tokens_per_s": c.plain_tokens_per_s(),
                    "window_tokens_per_s": c.window_tokens_per_s(),
                    "expert_cache": loaded.experts.is_some(),
                    "plain_expert_hit_rate": hit_rate(&c.plain_experts),
                    "window_expert_hit_rate": hit_rate(&c.window_experts),
                }),
            );
            println!("{obj}");
        } else {
            println!(
                "verify window of {} positions: {:.3} ms (median {:.3}; {} windows, every one accepted {k} drafts, {:.1} tokens/s): {:.3}x a step",
                k + 1,
                1e3 * c.mean_window_seconds(),
                median_ms(&c.window_seconds),
                c.window_seconds.len(),
                c.window_tokens_per_s(),
                c.ratio()
            );
        }
    }
    Ok(())
}
