//! `strata info FILE [--vram-gib N]`: what a GGUF file holds, and for a
//! Mixture-of-Experts model how many experts would fit in VRAM beside the
//! weights every token uses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::Context;
use serde_json::json;
use strata_gguf::{GgufFile, QuantType};

const GIB: f64 = (1u64 << 30) as f64;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model file.
    pub file: PathBuf,
    /// VRAM to plan for, in GiB: report how many experts fit beside the
    /// non-expert weights (K/V cache and activations not counted).
    #[arg(long, value_name = "N")]
    pub vram_gib: Option<f64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Hyper-parameters shown when present, as `{arch}.{suffix}` keys.
const HYPER_PARAMETERS: &[(&str, &str)] = &[
    ("layers", "block_count"),
    ("embedding", "embedding_length"),
    ("feed-forward", "feed_forward_length"),
    ("heads", "attention.head_count"),
    ("kv heads", "attention.head_count_kv"),
    ("context", "context_length"),
    ("rope freq base", "rope.freq_base"),
    ("experts", "expert_count"),
    ("experts used", "expert_used_count"),
    ("expert feed-forward", "expert_feed_forward_length"),
    ("shared expert ff", "expert_shared_feed_forward_length"),
];

/// Tensor count and bytes of one quant type.
#[derive(Default)]
struct TypeTotals {
    tensors: usize,
    bytes: u64,
}

/// The expert split of a MoE file.
struct Experts {
    per_layer: u64,
    /// Layers that have expert tensors (`blk.N.*_exps*`).
    layers: u64,
    expert_bytes: u64,
    bytes_per_expert: u64,
}

struct Summary {
    architecture: String,
    name: Option<String>,
    hyper: Vec<(&'static str, String, String)>, // label, key, value
    tokenizer_model: Option<String>,
    tokenizer_pre: Option<String>,
    vocab_size: Option<usize>,
    total_bytes: u64,
    by_type: BTreeMap<QuantType, TypeTotals>,
    experts: Option<Experts>,
}

/// Layer number of a `blk.N.…` tensor name.
fn layer_of(name: &str) -> Option<u64> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Expert tensors hold every expert of a layer stacked: llama.cpp names them
/// `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps` (and gpt-oss adds biases).
fn is_expert_tensor(name: &str) -> bool {
    name.contains("_exps.")
}

fn summarize(f: &GgufFile) -> anyhow::Result<Summary> {
    let architecture = f.architecture()?.to_string();
    let hyper = HYPER_PARAMETERS
        .iter()
        .filter_map(|(label, suffix)| {
            let key = format!("{architecture}.{suffix}");
            f.get(&key).map(|v| (*label, key, v.to_string()))
        })
        .collect();
    let mut by_type: BTreeMap<QuantType, TypeTotals> = BTreeMap::new();
    for t in f.tensors() {
        let totals = by_type.entry(t.ty).or_default();
        totals.tensors += 1;
        totals.bytes += t.n_bytes;
    }
    let total_bytes = f.tensors().iter().map(|t| t.n_bytes).sum();
    let vocab_size = f
        .get_string_array("tokenizer.ggml.tokens")
        .ok()
        .map(|a| a.len());
    Ok(Summary {
        name: f.get_str("general.name").ok().map(str::to_string),
        hyper,
        tokenizer_model: f.get_str("tokenizer.ggml.model").ok().map(str::to_string),
        tokenizer_pre: f.get_str("tokenizer.ggml.pre").ok().map(str::to_string),
        vocab_size,
        total_bytes,
        by_type,
        experts: experts(f, &architecture)?,
        architecture,
    })
}

fn experts(f: &GgufFile, arch: &str) -> anyhow::Result<Option<Experts>> {
    let key = format!("{arch}.expert_count");
    let Some(_) = f.get(&key) else {
        return Ok(None);
    };
    let per_layer = f.get_u64(&key)?;
    let expert_tensors: Vec<_> = f
        .tensors()
        .iter()
        .filter(|t| is_expert_tensor(&t.name))
        .collect();
    if per_layer == 0 || expert_tensors.is_empty() {
        return Ok(None);
    }
    let layers: BTreeSet<u64> = expert_tensors
        .iter()
        .filter_map(|t| layer_of(&t.name))
        .collect();
    let layers = (layers.len() as u64).max(1);
    let expert_bytes: u64 = expert_tensors.iter().map(|t| t.n_bytes).sum();
    Ok(Some(Experts {
        per_layer,
        layers,
        expert_bytes,
        bytes_per_expert: expert_bytes / (layers * per_layer),
    }))
}

/// How many experts fit in `vram` bytes beside `non_expert` bytes.
fn experts_that_fit(vram: u64, non_expert: u64, e: &Experts) -> u64 {
    let total = e.layers * e.per_layer;
    match vram.checked_sub(non_expert) {
        Some(room) if e.bytes_per_expert > 0 => (room / e.bytes_per_expert).min(total),
        Some(_) => total,
        None => 0,
    }
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let f =
        GgufFile::open(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let s = summarize(&f)?;
    let vram = match args.vram_gib {
        Some(g) if !(g.is_finite() && g >= 0.0) => {
            anyhow::bail!("--vram-gib must be a non-negative number, got {g}")
        }
        Some(g) => Some((g * GIB) as u64),
        None => None,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&f, &s, vram))?);
    } else {
        print_text(&f, &args.file, &s, vram);
    }
    Ok(())
}

fn to_json(f: &GgufFile, s: &Summary, vram: Option<u64>) -> serde_json::Value {
    let hyper: serde_json::Map<_, _> = s
        .hyper
        .iter()
        .map(|(_, key, _)| {
            let v = f
                .get_u64(key)
                .map(serde_json::Value::from)
                .or_else(|_| f.get_f64(key).map(serde_json::Value::from));
            (
                key.clone(),
                v.unwrap_or_else(|_| f.get(key).map(|v| v.to_string()).into()),
            )
        })
        .collect();
    let by_type: serde_json::Map<_, _> = s
        .by_type
        .iter()
        .map(|(ty, t)| {
            (
                ty.name().to_string(),
                json!({"tensors": t.tensors, "bytes": t.bytes}),
            )
        })
        .collect();
    let experts = s.experts.as_ref().map(|e| {
        let non_expert = s.total_bytes - e.expert_bytes;
        json!({
            "per_layer": e.per_layer,
            "layers": e.layers,
            "expert_bytes": e.expert_bytes,
            "bytes_per_expert": e.bytes_per_expert,
            "non_expert_bytes": non_expert,
            "fit_in_vram": vram.map(|v| experts_that_fit(v, non_expert, e)),
        })
    });
    json!({
        "version": f.version(),
        "architecture": s.architecture,
        "name": s.name,
        "hyper_parameters": hyper,
        "tokenizer": {"model": s.tokenizer_model, "pre": s.tokenizer_pre, "vocab_size": s.vocab_size},
        "tensors": f.tensors().len(),
        "tensor_bytes": s.total_bytes,
        "by_type": by_type,
        "experts": experts,
        "vram_bytes": vram,
    })
}

fn print_text(f: &GgufFile, path: &std::path::Path, s: &Summary, vram: Option<u64>) {
    let row = |label: &str, value: &str| println!("{label:<22}{value}");
    row(
        "file",
        &format!(
            "{} ({}, GGUF v{}, alignment {})",
            path.display(),
            human(f.file_len()),
            f.version(),
            f.alignment()
        ),
    );
    row("architecture", &s.architecture);
    if let Some(name) = &s.name {
        row("name", name);
    }
    for (label, _, value) in &s.hyper {
        row(label, value);
    }
    let tokenizer = match (&s.tokenizer_model, &s.tokenizer_pre) {
        (Some(m), Some(p)) => format!("{m} (pre: {p})"),
        (Some(m), None) => m.clone(),
        _ => "none".to_string(),
    };
    row("tokenizer", &tokenizer);
    if let Some(n) = s.vocab_size {
        row("vocab", &format!("{n} tokens"));
    }
    row(
        "tensors",
        &format!(
            "{} ({} bytes, {})",
            f.tensors().len(),
            s.total_bytes,
            human(s.total_bytes)
        ),
    );
    let mut types: Vec<_> = s.by_type.iter().collect();
    types.sort_by_key(|(ty, t)| (std::cmp::Reverse(t.bytes), **ty));
    for (ty, t) in types {
        println!(
            "  {:<8}{:>6} tensors {:>16} bytes  {}",
            ty.name(),
            t.tensors,
            t.bytes,
            human(t.bytes)
        );
    }
    match &s.experts {
        Some(e) => print_experts(s, e, vram),
        None => {
            if let Some(v) = vram {
                let verdict = if s.total_bytes <= v {
                    "fit"
                } else {
                    "do not fit"
                };
                row(
                    "vram",
                    &format!(
                        "all weights ({}) {verdict} in {}",
                        human(s.total_bytes),
                        human(v)
                    ),
                );
            }
        }
    }
}

fn print_experts(s: &Summary, e: &Experts, vram: Option<u64>) {
    let row = |label: &str, value: &str| println!("{label:<22}{value}");
    let non_expert = s.total_bytes - e.expert_bytes;
    let total = e.layers * e.per_layer;
    row(
        "MoE layers",
        &format!("{} × {} experts = {total} experts", e.layers, e.per_layer),
    );
    row(
        "expert bytes",
        &format!("{} ({})", e.expert_bytes, human(e.expert_bytes)),
    );
    row(
        "bytes per expert",
        &format!("{} ({})", e.bytes_per_expert, human(e.bytes_per_expert)),
    );
    row(
        "non-expert bytes",
        &format!("{non_expert} ({})", human(non_expert)),
    );
    if let Some(v) = vram {
        let fit = experts_that_fit(v, non_expert, e);
        if v < non_expert {
            row(
                "vram",
                &format!(
                    "{}: too small even for the non-expert weights ({})",
                    human(v),
                    human(non_expert)
                ),
            );
        } else {
            row(
                "vram",
                &format!(
                    "{}: {fit} of {total} experts fit beside the non-expert weights ({:.1}%; K/V cache not counted)",
                    human(v),
                    100.0 * fit as f64 / total as f64
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_numbers_and_expert_names() {
        assert_eq!(layer_of("blk.17.ffn_up_exps.weight"), Some(17));
        assert_eq!(layer_of("token_embd.weight"), None);
        assert!(is_expert_tensor("blk.0.ffn_gate_exps.weight"));
        assert!(is_expert_tensor("blk.0.ffn_down_exps.bias"));
        assert!(!is_expert_tensor("blk.0.ffn_gate_shexp.weight"));
        assert!(!is_expert_tensor("blk.0.ffn_gate_inp.weight"));
    }

    #[test]
    fn fitting_experts() {
        let e = Experts {
            per_layer: 4,
            layers: 2,
            expert_bytes: 800,
            bytes_per_expert: 100,
        };
        assert_eq!(experts_that_fit(1000, 500, &e), 5);
        assert_eq!(experts_that_fit(100_000, 500, &e), 8);
        assert_eq!(experts_that_fit(400, 500, &e), 0);
    }
}
