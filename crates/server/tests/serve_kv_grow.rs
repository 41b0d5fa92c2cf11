//! `strata serve --kv-grow` through the HTTP API, on the CPU backend with a synthetic
//! qwen3moe whose routed experts run through an expert cache of 24 slots. The issue's
//! scenario at its sizes (INIT 4096, STEP 2048, batches of 512): (1) an 8,080-token
//! document; (2) a new short chat; (3) the document's follow-up (the document, its reply
//! and a question), resumed from the parked conversation; (4) another short chat. The
//! elastic server grows (4096 -> 6144 -> 8192 as the document's batches arrive, and to
//! 8192 again when the parked document comes back) and trims twice, one log line each
//! with its stall, ends with the K/V back at its initial cells, and answers exactly as a
//! server with a fixed K/V. A third server whose --vram-reserve-mib leaves no room to
//! grow stops the document and its follow-up with finish_reason "length" and one log line
//! each, and still answers the chats as the others do. About 25 s in sanitizer mode.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
mod http_client;
mod test_server;

use std::net::SocketAddr;
use std::sync::Arc;

use http_client::{Logs, Reply, metric, post_json as post, send};
use serde_json::json;
use strata_core::Device;
use strata_engine::experts::{ExpertCache, ExpertCacheOptions};
use strata_engine::kv_grow::KvGrowOptions;
use strata_gguf::GgufFile;
use strata_model::synth::{self, SynthSpec};
use strata_model::tokenizer::{Tokenizer, TokenizerSpec};
use strata_model::{LoadOptions, Model};
use strata_server::{Engine, EngineConfig};
use test_server::TestServer;

const MODEL: &str = "synth-moe";
const N_CTX: u32 = 16384;
const N_BATCH: u32 = 512;
const INIT: u32 = 4096;
const STEP: u32 = 2048;
const DOC: usize = 8080;
const REPLY: usize = 6;

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

/// Token ids past the specials (0..3).
fn tokens(n: usize, seed: u32) -> Vec<u32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            3 + s % 509
        })
        .collect()
}

/// What a request got: text, finish reason, prompt and completion tokens.
#[derive(Debug, PartialEq)]
struct Answer {
    text: String,
    finish: String,
    usage: (u64, u64),
}

fn answer(r: &Reply, chat: bool) -> Answer {
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    let text = if chat {
        c["message"]["content"].as_str()
    } else {
        c["text"].as_str()
    };
    Answer {
        text: text.unwrap().to_string(),
        finish: c["finish_reason"].as_str().unwrap().to_string(),
        usage: (
            v["usage"]["prompt_tokens"].as_u64().unwrap(),
            v["usage"]["completion_tokens"].as_u64().unwrap(),
        ),
    }
}

fn complete(addr: SocketAddr, prompt: &[u32]) -> Answer {
    let body = json!({
        "model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": REPLY,
        "ignore_eos": true,
    });
    answer(&post(addr, "/v1/completions", &body), false)
}

fn chat(addr: SocketAddr, text: &str) -> Answer {
    let body = json!({
        "model": MODEL, "messages": [{"role": "user", "content": text}],
        "temperature": 0, "max_tokens": REPLY, "ignore_eos": true,
    });
    answer(&post(addr, "/v1/chat/completions", &body), true)
}

struct Run {
    answers: Vec<Answer>,
    /// Prompt tokens the follow-up reused.
    resumed: f64,
    grows: f64,
    trims: f64,
    refusals: f64,
    cells: f64,
}

/// One server (one context, a fresh device and expert cache) through the scenario.
fn scenario(grow: Option<KvGrowOptions>, reserve_all: bool) -> Run {
    let g = model_file();
    let dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap();
    let pool = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap();
    let tok = Tokenizer::from_spec(&TokenizerSpec::from_gguf(&g).unwrap()).unwrap();
    let opts = LoadOptions {
        experts_on_device: false,
    };
    let model = Model::load_with(&dev, dev.main_stream(), g, opts, |_, _| {}).unwrap();
    let model = Arc::new(model);
    let cache_opts = ExpertCacheOptions {
        slots: 24,
        ..Default::default()
    };
    let cache = ExpertCache::for_model(&dev, &model, pool, cache_opts, None).unwrap();
    // A reserve of all the memory free now: no growth fits.
    let grow = grow.map(|o| KvGrowOptions {
        reserve: if reserve_all { free(&dev) } else { o.reserve },
        ..o
    });

    let server = TestServer::start(MODEL, None, 1 << 20);
    let (state, addr) = (server.state.clone(), server.addr);
    let config = EngineConfig {
        experts: Some(cache.shared()),
        kv_grow: grow,
        ..EngineConfig::new(N_CTX, N_BATCH, 1, 64)
    };
    let engine = Engine::start(model, dev, Arc::new(tok), config, state.metrics.clone()).unwrap();
    assert!(state.install(engine).is_ok());

    let mut answers = Vec::new();
    // (1) The document.
    let doc = tokens(DOC, 1);
    answers.push(complete(addr, &doc));
    // (2) A new chat.
    answers.push(chat(
        addr,
        "Hello, world! How are you today? Once upon a time there was a little house at the end of the road, where an old man lived with his cat.",
    ));
    // (3) The follow-up: the document, its reply, a question.
    let reply = state
        .engine()
        .unwrap()
        .tokenizer
        .encode(&answers[0].text, false, false)
        .unwrap();
    let mut follow_up = doc.clone();
    follow_up.extend(&reply);
    follow_up.extend(tokens(8, 3));
    let resumed_before = metric::<f64>(addr, "strata_resumed_tokens_total");
    answers.push(complete(addr, &follow_up));
    let resumed = metric::<f64>(addr, "strata_resumed_tokens_total") - resumed_before;
    // (4) Another new chat.
    answers.push(chat(
        addr,
        "What is the time? It is ten past three in the afternoon, and the weather is warm and clear. The quick brown fox jumps over the lazy dog.",
    ));

    assert_eq!(
        send(addr, "GET", "/health", &[], b"").status,
        200,
        "the server stopped answering"
    );
    let run = Run {
        answers,
        resumed,
        grows: metric::<f64>(addr, "strata_kv_grows_total"),
        trims: metric::<f64>(addr, "strata_kv_trims_total"),
        refusals: metric::<f64>(addr, "strata_kv_refusals_total"),
        cells: metric::<f64>(addr, "strata_kv_cells"),
    };
    server.stop();
    run
}

fn free(dev: &Device) -> u64 {
    dev.memory().unwrap().free as u64
}

#[test]
fn serve_with_kv_grow_answers_as_a_fixed_kv_and_trims_back() {
    let logs = Logs::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    let elastic_opts = KvGrowOptions {
        init: INIT,
        step: STEP,
        reserve: 0,
    };

    let fixed = scenario(None, false);
    let elastic = scenario(Some(elastic_opts), false);
    let kv_lines: Vec<String> = logs
        .lines()
        .into_iter()
        .filter(|l| l.contains("K/V grown") || l.contains("K/V trimmed"))
        .collect();
    for l in &kv_lines {
        eprintln!("{l}");
    }
    let starved = scenario(Some(elastic_opts), true);
    let stopped: Vec<String> = logs
        .lines()
        .into_iter()
        .filter(|l| l.contains("request stopped (finish_reason length)"))
        .collect();
    for l in &stopped {
        eprintln!("{l}");
    }
    let usage: Vec<(u64, u64)> = fixed.answers.iter().map(|a| a.usage).collect();
    eprintln!("(prompt, completion) tokens of the four requests: {usage:?}");

    // The replies of a growing and trimming K/V are the fixed K/V's.
    assert_eq!(elastic.answers, fixed.answers);
    assert_eq!(fixed.answers[0].usage, (DOC as u64, REPLY as u64));
    assert_eq!(fixed.answers[0].finish, "length");
    // Both resumed the follow-up from the parked document (at least the document).
    assert!(fixed.resumed >= DOC as f64, "{}", fixed.resumed);
    assert_eq!(elastic.resumed, fixed.resumed);
    // The document grew 4096 -> 6144 -> 8192 a batch at a time; the follow-up grew back to
    // 8192 when its parked conversation came back; each was trimmed when it ended.
    assert_eq!((elastic.grows, elastic.trims), (3.0, 2.0));
    assert_eq!(kv_lines.len(), 5, "{kv_lines:?}");
    assert!(kv_lines.iter().all(|l| l.contains("stall so far: median")));
    assert!(kv_lines[0].contains(&format!("K/V grown to {} cells", INIT + STEP)));
    assert!(kv_lines[1].contains(&format!("K/V grown to {} cells", INIT + 2 * STEP)));
    assert!(kv_lines[2].contains(&format!("K/V trimmed to {INIT} cells")));
    assert!(kv_lines[2].contains("slots returned to the expert cache"));
    assert_eq!(elastic.cells, INIT as f64);
    assert_eq!(fixed.cells, N_CTX as f64);
    assert_eq!((fixed.grows, fixed.trims, fixed.refusals), (0.0, 0.0, 0.0));
    assert_eq!(elastic.refusals, 0.0);

    // No room to grow: the document stops at its initial cells with "length", one log
    // line; the chats are answered as before.
    assert_eq!(starved.refusals, 2.0, "the document and its follow-up");
    assert_eq!(stopped.len(), 2, "{stopped:?}");
    assert!(stopped[0].contains("--vram-reserve-mib"));
    let doc = &starved.answers[0];
    assert_eq!(
        (doc.finish.as_str(), doc.usage),
        ("length", (DOC as u64, 0))
    );
    assert_eq!(starved.answers[1], fixed.answers[1]);
    assert_eq!(starved.answers[3], fixed.answers[3]);
    assert_eq!(starved.grows, 0.0);
}
