//! A batch run as several smaller forward passes (`Context::set_micro_batch`, which the
//! CLI uses on the CPU to bound resident scratch) gives the CPU's logits of the whole
//! batch bit for bit: every piece keeps at least 2 tokens, so attention keeps the batch's
//! summation order, and every other kernel computes each token's row on its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use strata_engine::Context;
use strata_gguf::GgufFile;
use strata_model::Model;
use strata_model::synth::{self, SynthArch, SynthSpec};

fn spec(arch: SynthArch, quant: &str, experts: u32) -> SynthSpec {
    let mut s: SynthSpec = serde_json::from_value(serde_json::json!({
        "vocab": 512, "context_length": 4096, "rms_eps": 1e-6, "tie_embeddings": false,
        "head_dim": null, "ffn": 256, "experts": experts, "experts_used": 2,
        "expert_ffn": 128, "shared_ffn": 256, "router_skew": 0.0, "rope_freq_base": 10000.0,
        "arch": "llama", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "seed": 9,
        "quant": quant,
    }))
    .unwrap();
    s.arch = arch;
    if experts == 0 {
        s.experts_used = 0;
    }
    s
}

/// Every row's logits of `prompt` fed in batches of 64, each run as passes of at most
/// `ubatch` tokens (None: whole batches), then two decode steps.
fn run(
    model: &Arc<Model>,
    dev: &strata_core::Device,
    prompt: &[u32],
    ubatch: Option<u32>,
) -> Vec<f32> {
    let mut ctx = Context::new(model.clone(), dev.clone(), 256, 64).unwrap();
    if let Some(n) = ubatch {
        ctx.set_micro_batch(n);
    }
    let mut out = ctx.eval_all(prompt).unwrap();
    out.extend(ctx.eval(&[17]).unwrap());
    out.extend(ctx.eval(&[18]).unwrap());
    out
}

#[test]
fn micro_batches_give_the_batch_logits_bit_for_bit() {
    let dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap();
    for (arch, quant, experts) in [
        (SynthArch::Llama, "Q4_1", 0),
        (SynthArch::Llama, "Q4_K", 0),
        (SynthArch::Qwen3Moe, "Q4_K", 8),
        (SynthArch::Qwen2Moe, "Q6_K", 8),
    ] {
        let bytes = synth::synthesize(&spec(arch, quant, experts)).unwrap();
        let gguf = Arc::new(GgufFile::from_bytes(bytes).unwrap());
        let model = Arc::new(Model::load(&dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
        // 150 = 64 + 64 + 22 tokens; 129 = 64 + 64 + 1 (a 1-token batch stays one, as
        // llama.cpp's ubatch split would leave it).
        for len in [150u32, 129] {
            let prompt: Vec<u32> = (0..len).map(|i| (i * 97 + 5) % 512).collect();
            let whole = run(&model, &dev, &prompt, None);
            assert!(
                whole.iter().all(|x| x.is_finite()),
                "{arch:?} {quant}: not finite"
            );
            for ubatch in [4, 7, 16] {
                let split = run(&model, &dev, &prompt, Some(ubatch));
                assert_eq!(whole.len(), split.len());
                let first_diff = whole
                    .iter()
                    .zip(&split)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(
                    first_diff, None,
                    "{arch:?} {quant}: {len} tokens in passes of {ubatch} differ (at value index)"
                );
            }
        }
    }
}
