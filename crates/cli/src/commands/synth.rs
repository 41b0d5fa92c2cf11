//! `strata synth`: write a random-weight GGUF model of a given architecture,
//! shape and weight format (for tests and benchmarks; llama.cpp runs it).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};
use strata_gguf::QuantType;
use strata_model::synth::{self, SynthArch, SynthSpec};

#[derive(clap::Args)]
pub struct Args {
    /// Architecture: llama (dense, or Mixtral-style with --experts), qwen3moe, qwen2moe, olmoe.
    #[arg(long, default_value = "qwen3moe")]
    arch: String,
    #[arg(long, default_value_t = 2)]
    layers: u32,
    #[arg(long, default_value_t = 256)]
    hidden: u32,
    #[arg(long, default_value_t = 4)]
    heads: u32,
    /// K/V heads; default heads / 2 when heads is even, else heads (olmoe: heads).
    #[arg(long)]
    kv_heads: Option<u32>,
    /// Per-head dimension (llama and qwen3moe only); default hidden / heads.
    #[arg(long)]
    head_dim: Option<u32>,
    /// Dense FFN width (llama without experts); default 3 × hidden.
    #[arg(long)]
    ffn: Option<u32>,
    /// Routed experts per layer; default 8 for the MoE architectures, 0 for llama.
    #[arg(long)]
    experts: Option<u32>,
    /// Experts routed per token; default 2 (0 for dense llama).
    #[arg(long)]
    experts_used: Option<u32>,
    /// Width of one routed expert; default hidden.
    #[arg(long)]
    expert_ffn: Option<u32>,
    /// Width of qwen2moe's shared expert; default 2 × expert-ffn.
    #[arg(long)]
    shared_ffn: Option<u32>,
    /// Vocabulary size of the built-in tokenizer (default 512); with
    /// --tokenizer-from the donor's size is used.
    #[arg(long)]
    vocab: Option<u32>,
    #[arg(long, default_value_t = 4096)]
    context_length: u32,
    #[arg(long, default_value_t = 10000.0)]
    rope_freq_base: f32,
    #[arg(long, default_value_t = 1e-6)]
    rms_eps: f32,
    /// Weight format of the large matrices: F32, F16, BF16, Q4_0 … Q8_0, Q2_K … Q6_K,
    /// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, MXFP4.
    #[arg(long, default_value = "Q4_K")]
    quant: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Zipf exponent of the router's per-layer expert preference (0 = uniform).
    #[arg(long, default_value_t = 0.0)]
    router_skew: f32,
    /// Reuse token_embd as the LM head (no output.weight; llama and qwen3moe).
    #[arg(long)]
    tie_embeddings: bool,
    /// Copy the tokenizer (all tokenizer.* keys) from this GGUF file.
    #[arg(long)]
    tokenizer_from: Option<PathBuf>,
    /// Read the whole spec from this JSON file (the form tests/golden/models
    /// stores); the shape and format flags above are then ignored.
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Print the spec as JSON and the tensor list, without writing a file.
    #[arg(long)]
    dry_run: bool,
    /// Output file.
    #[arg(short = 'o', long, required_unless_present = "dry_run")]
    output: Option<PathBuf>,
}

fn spec_from(args: &Args) -> anyhow::Result<SynthSpec> {
    let Some(arch) = SynthArch::from_name(&args.arch) else {
        bail!(
            "unknown --arch `{}`: use llama, qwen3moe, qwen2moe or olmoe",
            args.arch
        );
    };
    let Some(quant) = QuantType::from_name(&args.quant) else {
        bail!("unknown --quant `{}`", args.quant);
    };
    let dense = arch == SynthArch::Llama && args.experts.unwrap_or(0) == 0;
    let experts = args.experts.unwrap_or(if dense { 0 } else { 8 });
    let expert_ffn = args.expert_ffn.unwrap_or(args.hidden);
    Ok(SynthSpec {
        arch,
        layers: args.layers,
        hidden: args.hidden,
        heads: args.heads,
        kv_heads: args.kv_heads.unwrap_or(
            if arch != SynthArch::Olmoe && args.heads.is_multiple_of(2) {
                args.heads / 2
            } else {
                args.heads
            },
        ),
        head_dim: args.head_dim,
        ffn: args.ffn.unwrap_or(3 * args.hidden),
        experts,
        experts_used: args.experts_used.unwrap_or(if dense { 0 } else { 2 }),
        expert_ffn,
        shared_ffn: args.shared_ffn.unwrap_or(2 * expert_ffn),
        vocab: args.vocab,
        context_length: args.context_length,
        rope_freq_base: args.rope_freq_base,
        rms_eps: args.rms_eps,
        quant,
        seed: args.seed,
        router_skew: args.router_skew,
        tie_embeddings: args.tie_embeddings,
        tokenizer_from: args.tokenizer_from.clone(),
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let spec = match &args.spec {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str::<SynthSpec>(&text)
                .with_context(|| format!("{} is not a synth spec", path.display()))?
        }
        None => spec_from(&args)?,
    };
    let plan = spec.tensor_plan()?;
    for t in plan.iter().filter(|t| t.fallback_from.is_some()) {
        eprintln!(
            "note: {} has rows of {} values, not whole {} blocks; written as {} (llama-quantize's fallback)",
            t.name, t.dims[0], spec.quant, t.ty
        );
    }
    if args.dry_run {
        // Written with `?` so a closed pipe (`| head`) ends quietly.
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string_pretty(&spec)?)?;
        for t in &plan {
            writeln!(out, "{:<32} {:>7} {:?}", t.name, t.ty.name(), t.dims)?;
        }
        return Ok(());
    }
    let Some(path) = args.output else {
        bail!("give the output file with -o");
    };
    let params: u64 = plan.iter().map(|t| t.dims.iter().product::<u64>()).sum();
    let bytes = synth::synthesize_to_file(&spec, &path)
        .with_context(|| format!("writing {}", path.display()))?;
    println!(
        "wrote {}: {} {} layers, {} tensors, {:.1} M parameters, {:.1} MiB",
        path.display(),
        spec.arch.name(),
        spec.layers,
        plan.len(),
        params as f64 / 1e6,
        bytes as f64 / (1u64 << 20) as f64
    );
    Ok(())
}
