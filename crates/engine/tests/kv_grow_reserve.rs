//! Elastic K/V against `--vram-reserve-mib` on the CPU backend in sanitizer mode (synthetic
//! qwen3moe through an expert cache of 24 slots). The reserve is set so that, beside the
//! initial 256-cell K/V, a 512-cell one fits and not a byte more: a whole 512-cell step
//! (to 768) does not fit, so the K/V grows by less (to the 512 cells the batch needs); the
//! next batch
//! that needs more is refused with the `KvFull` error naming cells, bytes and the reserve,
//! and nothing changes: the conversation goes on, and every reply equals a run with a
//! fixed K/V. Free memory never drops below the reserve, and the sanitizer reports nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use strata_backend_cpu::CpuOptions;
use strata_core::Device;
use strata_engine::experts::{ExpertCache, ExpertCacheOptions, SharedExpertCache};
use strata_engine::kv_grow::KvGrowOptions;
use strata_engine::sampler::argmax;
use strata_engine::{Context, EngineError};
use strata_gguf::GgufFile;
use strata_model::synth::{self, SynthSpec};
use strata_model::{KvFormat, LoadOptions, Model};

/// 2 layers x 16 experts; a K/V cell is 256 bytes (2 layers, K and V, 32 f16 values).
fn model_file() -> Arc<GgufFile> {
    let spec: SynthSpec = serde_json::from_value(serde_json::json!({
        "vocab": 512, "context_length": 4096, "rms_eps": 1e-6, "tie_embeddings": false,
        "head_dim": null, "ffn": 256, "experts": 16, "experts_used": 3,
        "expert_ffn": 256, "shared_ffn": 256, "router_skew": 1.0, "rope_freq_base": 10000.0,
        "arch": "qwen3moe", "layers": 2, "hidden": 128, "heads": 4, "kv_heads": 1, "seed": 5,
        "quant": "Q8_0",
    }))
    .unwrap();
    Arc::new(GgufFile::from_bytes(synth::synthesize(&spec).unwrap()).unwrap())
}

fn cpu(sanitize: bool) -> Device {
    let mut o = CpuOptions::from_env();
    o.sanitize |= sanitize;
    strata_backend_cpu::device(o).unwrap()
}

fn setup(dev: &Device, g: &Arc<GgufFile>) -> (Arc<Model>, SharedExpertCache) {
    let opts = LoadOptions {
        experts_on_device: false,
    };
    let model =
        Arc::new(Model::load_with(dev, dev.main_stream(), g.clone(), opts, |_, _| {}).unwrap());
    let cache_opts = ExpertCacheOptions {
        slots: 24,
        ..Default::default()
    };
    let cache = ExpertCache::for_model(dev, &model, cpu(false), cache_opts, None).unwrap();
    let cache = cache.shared();
    let counts: Vec<u64> = (0..32).map(|i| 100 - (i % 16) as u64 * 5).collect();
    cache.lock().unwrap().fill_from_counts(&counts).unwrap();
    (model, cache)
}

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s % 512
        })
        .collect()
}

/// Greedy continuation: `n` tokens after `logits`, each fed; the logits after the last.
fn decode(ctx: &mut Context, logits: &mut Vec<f32>, n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(logits) as u32;
        out.push(t);
        *logits = ctx.eval(&[t]).unwrap();
    }
    out
}

const INIT: u32 = 256;
const STEP: u32 = 512;

/// Replies of the scenario: a 300-token document and 6 tokens; (refused, for the elastic
/// K/V: a 300-token addition); 10 more tokens of the same conversation; a new 58-token
/// chat and 6 tokens.
fn reference(model: &Arc<Model>, dev: &Device, cache: &SharedExpertCache) -> Vec<Vec<u32>> {
    let mut ctx = Context::new(model.clone(), dev.clone(), 1024, 512).unwrap();
    ctx.set_expert_cache(Some(cache.clone()));
    let mut l = ctx.eval(&tokens(300, 1)).unwrap();
    let first = decode(&mut ctx, &mut l, 6);
    let more = decode(&mut ctx, &mut l, 10);
    ctx.truncate(0);
    let mut l = ctx.eval(&tokens(58, 2)).unwrap();
    let chat = decode(&mut ctx, &mut l, 6);
    vec![first, more, chat]
}

#[test]
fn growth_stays_out_of_the_reserve_and_a_refused_batch_changes_nothing() {
    let g = model_file();
    let dev = cpu(true);
    let (model, cache) = setup(&dev, &g);
    let want = reference(&model, &dev, &cache);
    let cell = KvFormat::F16.bytes_for(&model, 1);
    assert_eq!(cell, 256);

    let opts = KvGrowOptions {
        init: INIT,
        step: STEP,
        reserve: 0,
    };
    let mut ctx =
        Context::with_kv_grow(model.clone(), dev.clone(), 1024, 512, KvFormat::F16, opts).unwrap();
    ctx.set_expert_cache(Some(cache.clone()));
    assert_eq!(ctx.kv_cells(), INIT as usize);
    // Warm up what a step allocates once (the expert cache's staging, its split buffers).
    let mut l = ctx.eval(&tokens(200, 9)).unwrap();
    decode(&mut ctx, &mut l, 2);
    ctx.truncate(0);
    dev.synchronize().unwrap();
    // Beside the 256-cell K/V, room for a 512-cell one and not a byte more.
    let free = dev.memory().unwrap().free as u64;
    let reserve = free - 512 * cell;
    ctx.set_kv_grow(Some(KvGrowOptions { reserve, ..opts }))
        .unwrap();

    // A 300-token document: a whole step (768 cells) does not fit, 512 cells do.
    let mut l = ctx.eval(&tokens(300, 1)).unwrap();
    assert_eq!(ctx.kv_cells(), 512);
    assert!(dev.memory().unwrap().free as u64 >= reserve);
    let first = decode(&mut ctx, &mut l, 6);
    assert_eq!(first, want[0]);
    let log = ctx.kv_grow_stats().unwrap().log.clone();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0].starts_with("K/V grown to 512 cells")
            && log[0].contains("less than a 512-cell step")
            && log[0].contains("stall so far: median"),
        "{}",
        log[0]
    );

    // 300 more tokens need 768 cells: refused, naming cells, bytes and the reserve.
    let held = ctx.tokens().to_vec();
    let err = ctx.eval(&tokens(300, 3)).unwrap_err();
    let text = err.to_string();
    eprintln!("refused: {text}");
    match err {
        EngineError::KvFull {
            needed,
            cells,
            bytes,
            have,
            reserve: r,
            ..
        } => {
            assert_eq!((needed, cells, have), (306 + 300, 768, 512));
            assert_eq!(bytes, 768 * cell);
            assert_eq!(r, reserve);
        }
        other => panic!("expected KvFull, got {other}"),
    }
    assert!(text.contains("768 cells") && text.contains("--vram-reserve-mib"));
    assert!(text.contains(&format!("{:.1} MiB", (768 * cell) as f64 / 1048576.0)));
    // Nothing changed: the same K/V, the same tokens, and the conversation goes on.
    assert_eq!(ctx.kv_cells(), 512);
    assert_eq!(ctx.tokens(), &held[..]);
    assert_eq!(ctx.kv_grow_stats().unwrap().refusals, 1);
    assert_eq!(decode(&mut ctx, &mut l, 10), want[1]);

    // The request ends: trimmed, and a new chat is served as before.
    ctx.trim_kv().unwrap();
    assert_eq!(ctx.kv_cells(), INIT as usize);
    assert_eq!(cache.lock().unwrap().slots_taken(), 0);
    ctx.truncate(0);
    let mut l = ctx.eval(&tokens(58, 2)).unwrap();
    assert_eq!(decode(&mut ctx, &mut l, 6), want[2]);

    dev.synchronize().unwrap();
    assert!(dev.memory().unwrap().free as u64 >= reserve);
    let hazards = dev.take_hazards();
    assert!(hazards.is_empty(), "sanitizer findings: {hazards:?}");
    let c = cache.lock().unwrap();
    let on_device = dev
        .download(c.residency().device(), dev.main_stream())
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(on_device, c.residency().host());
}

/// Two contexts share the cache: one trim returns its own slots, not the other's.
#[test]
fn a_trim_returns_only_its_own_slots() {
    let g = model_file();
    let dev = cpu(false);
    let (model, cache) = setup(&dev, &g);
    let opts = KvGrowOptions {
        init: INIT,
        step: 256,
        reserve: 0,
    };
    let mut a =
        Context::with_kv_grow(model.clone(), dev.clone(), 1024, 512, KvFormat::F16, opts).unwrap();
    let mut b =
        Context::with_kv_grow(model.clone(), dev.clone(), 1024, 512, KvFormat::F16, opts).unwrap();
    a.set_expert_cache(Some(cache.clone()));
    b.set_expert_cache(Some(cache.clone()));
    a.eval(&tokens(600, 1)).unwrap();
    let after_a = cache.lock().unwrap().slots_taken();
    b.eval(&tokens(400, 2)).unwrap();
    let after_b = cache.lock().unwrap().slots_taken();
    assert!(after_a > 0 && after_b > after_a);
    a.trim_kv().unwrap();
    assert_eq!(cache.lock().unwrap().slots_taken(), after_b - after_a);
    assert_eq!(b.kv_grow_stats().unwrap().slots_held, after_b - after_a);
    b.trim_kv().unwrap();
    assert_eq!(cache.lock().unwrap().slots_taken(), 0);
}

/// A trim whose old and new K/V do not fit side by side (another allocation took the
/// memory meanwhile; here a buffer of the test's) frees the old one first: the context
/// starts empty, nothing fails, and the slots return to the cache.
#[test]
fn a_trim_without_room_for_both_copies_starts_the_context_empty() {
    let g = model_file();
    let mut o = CpuOptions::from_env();
    o.memory_limit = Some(64 << 20);
    let dev = strata_backend_cpu::device(o).unwrap();
    let (model, cache) = setup(&dev, &g);
    let opts = KvGrowOptions {
        init: INIT,
        step: 768,
        reserve: 0,
    };
    let mut a =
        Context::with_kv_grow(model.clone(), dev.clone(), 1024, 512, KvFormat::F16, opts).unwrap();
    a.set_expert_cache(Some(cache.clone()));
    a.eval(&tokens(600, 1)).unwrap();
    assert_eq!(a.kv_cells(), 1024);
    assert!(cache.lock().unwrap().slots_taken() > 0);
    dev.synchronize().unwrap();
    // Everything free but one cell short of a trimmed K/V.
    let free = dev.memory().unwrap().free;
    let hog = dev.alloc::<u8>(free - 255 * 256).unwrap();
    a.trim_kv().unwrap();
    assert_eq!(a.kv_cells(), INIT as usize);
    assert!(a.tokens().is_empty());
    assert_eq!(cache.lock().unwrap().slots_taken(), 0);
    assert_eq!(a.kv_grow_stats().unwrap().trims, 1);
    drop(hog);
    // The context works on, and grows again.
    a.eval(&tokens(300, 5)).unwrap();
    assert_eq!(a.kv_cells(), 1024);
    dev.synchronize().unwrap();
    assert!(dev.take_hazards().is_empty());
}
