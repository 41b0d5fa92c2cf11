//! The expert cache on the CPU backend, with a second CPU device as the CPU pool: the
//! logits are the same bit for bit for every cache size (0, 1, half, all experts) and with
//! the cache changing while it runs (profile fill, online learning, adaptation, async
//! adaptation); no residency change leaves a sanitizer finding; an unordered table upload
//! is caught; a profile recorded for another model is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use strata_backend_cpu::CpuOptions;
use strata_core::Device;
use strata_engine::Context;
use strata_engine::experts::{
    ExpertCache, ExpertCacheOptions, ExpertError, ModelId, PinFile, Profile, SharedExpertCache,
};
use strata_gguf::GgufFile;
use strata_model::synth::{self, SynthArch, SynthSpec};
use strata_model::{LoadOptions, Model};

/// Three experts per token: with two, a sum in the wrong order would still be exact
/// (a + b == b + a), and the test could not see it.
fn spec(arch: SynthArch, quant: &str, seed: u64) -> SynthSpec {
    let mut s: SynthSpec = serde_json::from_value(serde_json::json!({
        "vocab": 512, "context_length": 4096, "rms_eps": 1e-6, "tie_embeddings": false,
        "head_dim": null, "ffn": 256, "experts": 8, "experts_used": 3,
        "expert_ffn": 128, "shared_ffn": 256, "router_skew": 1.0, "rope_freq_base": 10000.0,
        "arch": "llama", "layers": 3, "hidden": 256, "heads": 4, "kv_heads": 2, "seed": seed,
        "quant": quant,
    }))
    .unwrap();
    s.arch = arch;
    s
}

fn gguf(arch: SynthArch, quant: &str, seed: u64) -> Arc<GgufFile> {
    let bytes = synth::synthesize(&spec(arch, quant, seed)).unwrap();
    Arc::new(GgufFile::from_bytes(bytes).unwrap())
}

fn cpu(sanitize: bool) -> Device {
    let mut o = CpuOptions::from_env();
    o.sanitize |= sanitize;
    strata_backend_cpu::device(o).unwrap()
}

fn load(dev: &Device, g: &Arc<GgufFile>, on_device: bool) -> Arc<Model> {
    let opts = LoadOptions {
        experts_on_device: on_device,
    };
    Arc::new(Model::load_with(dev, dev.main_stream(), g.clone(), opts, |_, _| {}).unwrap())
}

const PROMPT: [u32; 9] = [1, 7, 42, 99, 3, 250, 17, 8, 400];

/// A prompt in batches of 4, then `steps` decode steps; every step's logits.
fn run(ctx: &mut Context, steps: usize) -> Vec<Vec<f32>> {
    let mut out = vec![ctx.eval(&PROMPT).unwrap()];
    for i in 0..steps {
        out.push(ctx.eval(&[(i as u32 * 37 + 11) % 512]).unwrap());
    }
    out
}

fn context(model: &Arc<Model>, dev: &Device, cache: Option<SharedExpertCache>) -> Context {
    let mut ctx = Context::new(model.clone(), dev.clone(), 64, 4).unwrap();
    ctx.set_expert_cache(cache);
    ctx
}

fn cache(model: &Model, dev: &Device, opts: ExpertCacheOptions) -> SharedExpertCache {
    ExpertCache::for_model(dev, model, cpu(false), opts, None)
        .unwrap()
        .shared()
}

/// A configuration's `stream` that means `--stream-experts auto`.
const STREAM_AUTO: usize = usize::MAX;

#[test]
fn logits_are_the_same_for_every_cache_size() {
    for (arch, quant) in [(SynthArch::Qwen3Moe, "Q4_K"), (SynthArch::Qwen2Moe, "Q8_0")] {
        let g = gguf(arch, quant, 5);
        let reference = {
            let dev = cpu(false);
            run(&mut context(&load(&dev, &g, true), &dev, None), 10)
        };
        let n_routed = 3 * 8;
        // Every configuration with uploads staged through a host copy, then straight from
        // the registered file (a fresh device each: registration lasts a device's life).
        for pin in [PinFile::Off, PinFile::On] {
            let dev = cpu(false);
            let model = load(&dev, &g, false);
            // (slots, online learning, adaptation, lend batches of more than this many
            // tokens, experts a layer streamed to a staging set instead of the pool)
            for (slots, learn, adapt, lend, stream) in [
                (0, false, false, 0, 0),
                (1, false, false, 0, 0),
                (n_routed / 2, false, false, 0, 0),
                (n_routed / 2, true, true, 0, 0),
                (n_routed, false, false, 0, 0),
                (n_routed, true, false, 0, 0),
                (0, false, false, 2, 0),
                (n_routed / 2, false, false, 2, 0),
                (0, false, false, 0, 1),
                (0, false, false, 0, 8),
                (n_routed / 2, false, false, 0, 1),
                // Decode streams into the sets the lent prompt batches used and prefetched.
                (n_routed / 2, false, false, 2, 1),
                // As many as the finish order of the two sides asks for, layer by layer.
                (0, false, false, 0, STREAM_AUTO),
                (n_routed / 2, false, false, 2, STREAM_AUTO),
            ] {
                let opts = ExpertCacheOptions {
                    slots,
                    learn,
                    adapt,
                    lend_min_tokens: lend,
                    stream_experts: stream.min(8),
                    stream_auto: stream == STREAM_AUTO,
                    pin_file: pin,
                    ..Default::default()
                };
                let c = cache(&model, &dev, opts);
                if !learn {
                    // A fixed set: the experts of the first `slots` (layer, expert) pairs.
                    let counts: Vec<u64> = (0..n_routed as u64).map(|i| 100 - i).collect();
                    c.lock().unwrap().fill_from_counts(&counts).unwrap();
                }
                let mut ctx = context(&model, &dev, Some(c.clone()));
                let got = run(&mut ctx, 10);
                let stats = c.lock().unwrap().stats().clone();
                eprintln!(
                    "{arch:?} {quant} slots {slots} learn {learn} adapt {adapt} lend {lend} stream {stream}: {stats}"
                );
                assert_eq!(stats.streamed_experts > 0, stream > 0, "{stats}");
                // Prompt batches of 4 tokens are lent when the threshold is below 4.
                assert_eq!(
                    stats.lent_layers > 0,
                    lend > 0 && slots < n_routed,
                    "{stats}"
                );
                for (i, (r, g)) in reference.iter().zip(&got).enumerate() {
                    assert!(r.iter().all(|x| x.is_finite()));
                    assert_eq!(r, g, "{arch:?} {quant}: {slots} slots, step {i} differs");
                }
                // Each configuration must exercise what it claims.
                let (hits, misses) = (
                    stats.decode_hits + stats.prefill_hits,
                    stats.decode_misses + stats.prefill_misses,
                );
                match slots {
                    0 => assert_eq!(hits, 0),
                    1 => {}
                    s if s == n_routed => assert!(hits > 0 && stats.slot_fills > 0),
                    _ => assert!(hits > 0 && misses > 0, "{slots} slots: {stats}"),
                }
                if slots == n_routed && !learn {
                    assert_eq!(misses, 0);
                }
            }
            let uploads = dev.upload_counts();
            eprintln!("{arch:?} {quant} {pin:?}: {uploads:?}");
            // Both paths carried experts from the file.
            match pin {
                PinFile::Off => assert!(uploads.direct == 0 && uploads.staged > 0),
                _ => assert!(uploads.direct > 0),
            }
        }
    }
}

#[test]
fn residency_changes_leave_no_sanitizer_finding() {
    let g = gguf(SynthArch::Qwen3Moe, "Q4_0", 9);
    let dev = cpu(true);
    let model = load(&dev, &g, false);
    // (online learning, adaptation, asynchronously, lend above, experts streamed a layer)
    for (learn, adapt, adapt_async, lend, stream) in [
        (true, false, false, 0, 0),
        (true, true, false, 2, 2),
        (false, true, true, 2, 1),
    ] {
        let opts = ExpertCacheOptions {
            slots: 6,
            learn,
            adapt,
            adapt_async,
            copies_per_step: 2,
            lend_min_tokens: lend,
            stream_experts: stream,
            stream_auto: false,
            // The first configuration stages its uploads; the file is registered from the
            // second on (for the device's life).
            pin_file: if adapt { PinFile::On } else { PinFile::Off },
        };
        let c = cache(&model, &dev, opts);
        if !learn {
            c.lock().unwrap().fill_from_counts(&[1; 24]).unwrap();
        }
        let initial = c.lock().unwrap().stats().slot_fills;
        let mut ctx = context(&model, &dev, Some(c.clone()));
        run(&mut ctx, 24);
        dev.synchronize().unwrap();
        assert!(dev.take_hazards().is_empty());
        let cache = c.lock().unwrap();
        let table = cache.residency();
        let on_device = dev
            .download(table.device(), dev.main_stream())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(
            on_device,
            table.host(),
            "device table differs from the host's"
        );
        assert!(
            cache.stats().slot_fills > initial,
            "learn {learn} adapt {adapt}: no residency change while running"
        );
    }
}

#[test]
fn an_unordered_table_upload_is_caught() {
    let g = gguf(SynthArch::Qwen3Moe, "Q4_0", 9);
    let dev = cpu(true);
    let model = load(&dev, &g, false);
    let opts = ExpertCacheOptions {
        slots: 12,
        learn: false,
        ..Default::default()
    };
    let c = cache(&model, &dev, opts);
    c.lock().unwrap().fill_from_counts(&[1; 24]).unwrap();
    let mut ctx = context(&model, &dev, Some(c.clone()));
    ctx.eval(&PROMPT).unwrap();
    let mut caught = false;
    for i in 0..8 {
        {
            // The founding bug: the same table, written without ordering.
            let cache = c.lock().unwrap();
            let table = cache.residency();
            dev.upload_unordered(table.device(), table.host()).unwrap();
        }
        let r = ctx
            .eval(&[i + 5])
            .map(|_| ())
            .and_then(|()| Ok(dev.synchronize()?));
        if let Err(e) = r {
            let text = e.to_string();
            assert!(text.contains("unordered"), "unexpected error: {text}");
            caught = true;
            break;
        }
    }
    assert!(
        caught,
        "the sanitizer did not report the unordered table upload"
    );
}

#[test]
fn a_profile_of_another_model_is_refused() {
    let dev = cpu(false);
    let (ga, gb) = (
        gguf(SynthArch::Qwen3Moe, "Q4_0", 1),
        gguf(SynthArch::Qwen3Moe, "Q4_0", 2),
    );
    let (ma, mb) = (load(&dev, &ga, false), load(&dev, &gb, false));
    let dir = std::env::temp_dir().join(format!("strata-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a.json");
    let counts: Vec<u64> = (0..24).collect();
    Profile::new(ModelId::of(&ma, &ga).unwrap(), 12, &counts)
        .write(&path)
        .unwrap();
    let opts = || ExpertCacheOptions {
        slots: 4,
        ..Default::default()
    };
    // The model it was recorded on takes it, hottest experts first.
    let c = ExpertCache::for_model(&dev, &ma, cpu(false), opts(), Some(&path)).unwrap();
    let top: Vec<u32> = (0..4).map(|s| c.residency().owner(s).unwrap().1).collect();
    assert_eq!(
        top,
        vec![7, 6, 5, 4],
        "layer 2's experts 7..4 are the hottest"
    );
    // Another model's profile is refused, naming both.
    let err = ExpertCache::for_model(&dev, &mb, cpu(false), opts(), Some(&path))
        .err()
        .expect("a profile for another model must be refused");
    assert!(
        matches!(err, ExpertError::ProfileForAnotherModel { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("another model"), "{err}");
    // And a file that is not a profile at all.
    std::fs::write(&path, "{\"hello\": 1}").unwrap();
    let err = ExpertCache::for_model(&dev, &ma, cpu(false), opts(), Some(&path))
        .err()
        .expect("not a profile");
    assert!(
        err.to_string().contains("not a strata expert profile"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A trim refills at most 16 of the slots it returns at once and the rest between the
/// next steps, hottest first, until every slot holds an expert again; the device table
/// equals the host's after each change.
#[test]
fn a_trim_refills_the_rest_between_steps() {
    let dev = cpu(true);
    // 6 layers x 8 experts: 48 routed, all of them slots.
    let mut s = spec(SynthArch::Qwen3Moe, "Q4_K", 5);
    s.layers = 6;
    let g = Arc::new(GgufFile::from_bytes(synth::synthesize(&s).unwrap()).unwrap());
    let model = load(&dev, &g, false);
    let opts = ExpertCacheOptions {
        slots: 48,
        learn: false,
        ..Default::default()
    };
    let mut c = ExpertCache::for_model(&dev, &model, cpu(false), opts, None).unwrap();
    // Distinct heats, so "hottest first" names one order.
    let counts: Vec<u64> = (0..48u64).map(|i| 1000 - i * 7).collect();
    c.fill_from_counts(&counts).unwrap();
    let same_table = |c: &ExpertCache| {
        let s = dev.main_stream();
        let got = dev
            .download(c.residency().device(), s)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(
            got,
            c.residency().host(),
            "device table differs from the host's"
        );
    };
    assert_eq!(c.residency().resident_count(), 48);
    let took = c.take_slots(40).unwrap();
    assert_eq!((took.slots, took.resident), (40, 8));
    let back = c
        .return_slots_with(40, &mut |d, b, h, s| d.upload(b, h, s))
        .unwrap();
    assert_eq!((back.slots, back.experts, back.resident), (40, 8, 16));
    // The 8 hottest not resident are the first 8 taken (slots 8..16), whose bytes the
    // lent slots still hold: none is uploaded again.
    assert_eq!(back.in_place, 8);
    same_table(&c);
    // The 8 refilled at once are the hottest of those not resident.
    let resident: Vec<bool> = (0..48)
        .map(|i| c.residency().slot_of(i / 8, (i % 8) as u32).is_some())
        .collect();
    let hottest_out = (0..48).filter(|&i| !resident[i]).min().unwrap();
    let coldest_in = (8..48).filter(|&i| resident[i]).max().unwrap();
    assert!(
        coldest_in < hottest_out,
        "refilled {coldest_in} before {hottest_out}"
    );
    // Then 16 a step.
    c.between_steps().unwrap();
    assert_eq!(c.residency().resident_count(), 32);
    same_table(&c);
    c.between_steps().unwrap();
    assert_eq!(c.residency().resident_count(), 48);
    same_table(&c);
}
