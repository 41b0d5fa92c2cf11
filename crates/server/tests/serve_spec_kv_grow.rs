//! `strata serve --spec K` with an elastic K/V that cannot grow (`--kv-grow` with every
//! byte of device memory reserved), on the CPU backend with a synthetic qwen3moe whose
//! routed experts run through an expert cache: a verify window needs cells a plain step
//! does not, and where the K/V cannot grow for one the step is a plain one, so the answer
//! stops exactly where plain decoding's does. Needs no downloaded model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
mod http_client;
mod test_server;

use std::sync::Arc;

use http_client::{Reply, metric, post_json as post};
use serde_json::json;
use strata_core::Device;
use strata_engine::experts::{ExpertCache, ExpertCacheOptions};
use strata_engine::kv_grow::KvGrowOptions;
use strata_engine::spec::SpecConfig;
use strata_gguf::GgufFile;
use strata_model::synth::{self, SynthSpec};
use strata_model::tokenizer::{Tokenizer, TokenizerSpec};
use strata_model::{LoadOptions, Model};
use strata_server::{Engine, EngineConfig};
use test_server::TestServer;

const MODEL: &str = "synth-moe";
const N_CTX: u32 = 4096;
const N_BATCH: u32 = 512;

/// serve_kv_grow's model.
fn model_file() -> Arc<GgufFile> {
    let spec: SynthSpec = serde_json::from_value(json!({
        "vocab": 512, "context_length": 4096, "rms_eps": 1e-6, "tie_embeddings": false,
        "head_dim": null, "ffn": 256, "experts": 16, "experts_used": 3,
        "expert_ffn": 256, "shared_ffn": 256, "router_skew": 1.0, "rope_freq_base": 10000.0,
        "arch": "qwen3moe", "layers": 2, "hidden": 128, "heads": 4, "kv_heads": 1, "seed": 23,
        "quant": "Q8_0",
    }))
    .unwrap();
    Arc::new(GgufFile::from_bytes(synth::synthesize(&spec).unwrap()).unwrap())
}

fn free(dev: &Device) -> u64 {
    dev.memory().unwrap().free as u64
}

/// Text, finish reason, prompt and completion tokens.
#[derive(Debug, PartialEq)]
struct Answer {
    text: String,
    finish: String,
    usage: (u64, u64),
}

fn answer(r: &Reply) -> Answer {
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    Answer {
        text: c["text"].as_str().unwrap().to_string(),
        finish: c["finish_reason"].as_str().unwrap().to_string(),
        usage: (
            v["usage"]["prompt_tokens"].as_u64().unwrap(),
            v["usage"]["completion_tokens"].as_u64().unwrap(),
        ),
    }
}

/// One completion on a server whose elastic K/V cannot grow past its initial cells,
/// generated until the K/V is full. With `spec`, the model drafts for itself (every step
/// has drafts, all accepted).
fn starved_completion(spec: SpecConfig) -> Answer {
    let speculating = spec.k > 0;
    let g = model_file();

    let dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap();
    let pool = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap();
    let tok = Tokenizer::from_spec(&TokenizerSpec::from_gguf(&g).unwrap()).unwrap();
    let opts = LoadOptions {
        experts_on_device: false,
    };
    let draft = speculating
        .then(|| Arc::new(Model::load(&dev, dev.main_stream(), g.clone(), |_, _| {}).unwrap()));
    let model = Arc::new(Model::load_with(&dev, dev.main_stream(), g, opts, |_, _| {}).unwrap());
    let cache_opts = ExpertCacheOptions {
        slots: 24,
        ..Default::default()
    };
    let cache = ExpertCache::for_model(&dev, &model, pool, cache_opts, None).unwrap();
    let grow = KvGrowOptions {
        init: 64,
        step: 64,
        reserve: free(&dev),
    };
    let server = TestServer::start(MODEL, None, 1 << 20);
    let (state, addr) = (server.state.clone(), server.addr);
    let config = EngineConfig {
        experts: Some(cache.shared()),
        kv_grow: Some(grow),
        spec,
        draft,
        ..EngineConfig::new(N_CTX, N_BATCH, 1, 64)
    };
    let engine = Engine::start(model, dev, Arc::new(tok), config, state.metrics.clone()).unwrap();
    assert!(state.install(engine).is_ok());
    let prompt: Vec<u32> = [10u32, 11, 12, 13].repeat(12);
    let body = json!({
        "model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 40,
        "ignore_eos": true,
    });
    let a = answer(&post(addr, "/v1/completions", &body));
    let windows = metric::<f64>(addr, "strata_spec_windows_total");
    assert_eq!(windows > 0.0, speculating, "windows: {windows}");
    server.stop();
    a
}

#[test]
fn serve_spec_with_a_k_v_that_cannot_grow_answers_as_plain_decoding() {
    let plain = starved_completion(SpecConfig::new(0));
    let fixed = SpecConfig {
        k: 4,
        adaptive: false,
    };
    let spec = starved_completion(fixed);
    eprintln!("{plain:?}");
    assert_eq!(plain.finish, "length");
    // The 64 cells hold the 48-token prompt and 16 generated tokens; the 17th was not fed.
    assert_eq!(plain.usage, (48, 17));
    assert_eq!(spec, plain);
}
