//! A decode step replayed from a captured graph gives exactly the logits of the same step
//! launched kernel by kernel, at every position (the positions come from a device buffer
//! the step uploads, not from the recording), and the K/V it leaves behind is the same. So
//! do speculative verify windows (one graph per window length).

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
        "arch": "llama", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "seed": 5,
        "quant": quant,
    }))
    .unwrap();
    s.arch = arch;
    if experts == 0 {
        s.experts_used = 0;
    }
    s
}

/// Prompt, then `steps` greedy-free decode steps on fixed tokens; every step's logits.
fn run(model: &Arc<Model>, dev: &strata_core::Device, graphs: bool, steps: usize) -> Vec<Vec<f32>> {
    let mut ctx = Context::new(model.clone(), dev.clone(), 128, 16).unwrap();
    ctx.set_graphs(graphs);
    let mut out = vec![ctx.eval(&[1, 7, 42, 99, 3]).unwrap()];
    for i in 0..steps {
        out.push(ctx.eval(&[(i as u32 * 37 + 11) % 512]).unwrap());
    }
    // A rewind (the server's prefix reuse) replays the same graph at earlier positions.
    ctx.truncate(3);
    out.push(ctx.eval(&[200]).unwrap());
    out.push(ctx.eval(&[201]).unwrap());
    out
}

/// Prompt, then verify windows of several lengths (each length twice, at other positions,
/// and once after a rewind, as rejected drafts cause); every window's logits, then a step.
fn run_windows(model: &Arc<Model>, dev: &strata_core::Device, graphs: bool) -> Vec<Vec<f32>> {
    let mut ctx = Context::new(model.clone(), dev.clone(), 128, 16).unwrap();
    ctx.set_graphs(graphs);
    let mut out = vec![ctx.eval(&[1, 7, 42, 99, 3]).unwrap()];
    for (i, len) in [2usize, 5, 2, 9, 5, 1].into_iter().enumerate() {
        let window: Vec<u32> = (0..len as u32)
            .map(|j| (i as u32 * 53 + j * 17 + 5) % 512)
            .collect();
        out.push(ctx.eval_verify(&window).unwrap());
        if len > 2 {
            let keep = ctx.tokens().len() - len + 1;
            ctx.truncate(keep);
        }
    }
    out.push(ctx.eval(&[77]).unwrap());
    out
}

#[test]
fn graph_replay_matches_eager_decode_bit_for_bit() {
    let dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap();
    for (arch, quant, experts) in [
        (SynthArch::Llama, "Q4_K", 0),
        (SynthArch::Qwen3Moe, "Q8_0", 8),
        (SynthArch::Qwen2Moe, "Q6_K", 8),
    ] {
        let bytes = synth::synthesize(&spec(arch, quant, experts)).unwrap();
        let gguf = Arc::new(GgufFile::from_bytes(bytes).unwrap());
        let model = Arc::new(Model::load(&dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
        let eager = run(&model, &dev, false, 12);
        let graph = run(&model, &dev, true, 12);
        assert_eq!(eager.len(), graph.len());
        for (i, (e, g)) in eager.iter().zip(&graph).enumerate() {
            assert!(
                e.iter().all(|x| x.is_finite()),
                "{arch:?} {quant}: step {i} not finite"
            );
            assert_eq!(
                e, g,
                "{arch:?} {quant}: step {i} differs between graph and eager"
            );
        }
        let eager = run_windows(&model, &dev, false);
        let graph = run_windows(&model, &dev, true);
        for (i, (e, g)) in eager.iter().zip(&graph).enumerate() {
            assert!(
                e.iter().all(|x| x.is_finite()),
                "{arch:?} {quant}: window {i}"
            );
            assert_eq!(
                e, g,
                "{arch:?} {quant}: window {i} differs between graph and eager"
            );
        }
        // The two windows of 2 tokens ran at different positions: different logits.
        assert_ne!(
            graph[1], graph[3],
            "{arch:?} {quant}: a replayed window went stale"
        );
        let graph = run(&model, &dev, true, 12);
        // The steps must differ from each other, or a stale position would go unnoticed.
        assert_ne!(
            graph[1], graph[2],
            "{arch:?} {quant}: consecutive steps identical"
        );
    }
}
