//! `strata serve --spec 4` against `--spec 0` on the real SmolLM2-135M, greedy: every
//! answer is byte for byte the same (completions and chats, a repetitive prompt whose drafts
//! are accepted, a stop string inside an accepted window, a streamed answer, log
//! probabilities), and a follow-up resumed from the parked conversation reuses exactly as
//! many tokens and answers the same, so what is parked after a stop inside a window is
//! the conversation plain decoding parks, not the drafts accepted past the stop. /metrics
//! counts the windows and accepted drafts, the end-of-request line carries them, and a
//! sampled request is served through speculative sampling. The speculative server
//! verifies every proposal (`--spec-fixed`), so where windows fall does not depend on
//! timings.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
mod http_client;
mod test_server;

use std::path::Path;
use std::sync::Arc;

use http_client::{Logs, Reply, metric, post_json as post, sse_events};
use serde_json::{Value, json};
use strata_core::Device;
use strata_engine::spec::SpecConfig;
use strata_model::Model;
use strata_model::models::smollm2_path;
use strata_model::tokenizer::Tokenizer;
use strata_server::{Engine, EngineConfig};
use test_server::TestServer;

const MODEL: &str = "smollm2-spec";
const N_CTX: u32 = 1024;
/// Raw text SmolLM2 goes on repeating: prompt-lookup drafts are all accepted.
const REPEAT: &str = "The cat sat on the mat.\nThe cat sat on the mat.\nThe cat sat on the mat.\nThe cat sat on the mat.\n";
/// Its answer is "The" (from the prompt's logits), then windows of 4 accepted drafts and a
/// bonus token: " cat sat on the" + " mat", "." "\n" "The" " cat" + " sat". So this stop
/// string ends at the second window's first draft, with three accepted drafts after it.
const STOP: &str = "mat.";
/// Put before [`REPEAT`] for the stopped answer, whose follow-up must then find only its
/// own parked conversation (the answer is the same).
const AGAIN: &str = "Again:\n";
/// Raw text SmolLM2 goes on almost repeating: some drafts are rejected.
const COLOURS: &str = "red, green, blue, red, green, blue, red, green, blue, red, green, blue,";
const SYSTEM: &str = "You are a helpful assistant.";

/// The whole JSON body but its id and creation time.
fn body(r: &Reply) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    let mut v = r.json();
    v["id"] = Value::Null;
    v["created"] = Value::Null;
    v
}

/// A streamed answer: the concatenated texts, the number of text chunks, the finish
/// reason.
fn streamed(r: &Reply, chat: bool) -> (String, usize, String) {
    assert_eq!(r.status, 200, "{}", r.text());
    let (events, done) = sse_events(&r.text());
    assert!(done, "no [DONE]");
    let (mut text, mut chunks, mut finish) = (String::new(), 0, String::new());
    for e in &events {
        let Some(c) = e["choices"].get(0) else {
            continue;
        };
        let t = if chat {
            c["delta"]["content"].as_str()
        } else {
            c["text"].as_str()
        };
        if let Some(t) = t.filter(|t| !t.is_empty()) {
            text.push_str(t);
            chunks += 1;
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, chunks, finish)
}

fn chat_body(messages: &[(&str, &str)], max: usize, stream: bool) -> Value {
    let list: Vec<Value> = messages
        .iter()
        .map(|(r, c)| json!({"role": r, "content": c}))
        .collect();
    json!({"model": MODEL, "messages": list, "temperature": 0, "max_tokens": max, "stream": stream})
}

/// What one server answered, in order, and its counters.
#[derive(Debug, Default)]
struct Run {
    /// Non-streamed bodies (ids and times blanked).
    bodies: Vec<Value>,
    /// Streamed texts and finish reasons.
    streams: Vec<(String, String)>,
    /// Text chunks of the streamed repetitive answer.
    stream_chunks: usize,
    /// Prompt tokens each follow-up reused.
    resumed: Vec<u64>,
    /// Tokens of the stopped answer's prompt.
    stop_prompt: usize,
    /// Windows and accepted drafts after the first repetitive answer, and at the end.
    first: (u64, u64),
    windows: u64,
    drafted: u64,
    accepted: u64,
}

/// The requests of both servers (one slot, so a follow-up finds its conversation either
/// still in the context or parked).
fn scenario(
    model: &Arc<Model>,
    dev: &Device,
    path: &Path,
    spec: SpecConfig,
    draft: Option<Arc<Model>>,
) -> Run {
    let tok = Arc::new(Tokenizer::from_gguf_file(path).unwrap());
    let server = TestServer::start(MODEL, None, 1 << 20);
    let (state, addr) = (server.state.clone(), server.addr);
    let config = EngineConfig {
        spec,
        draft,
        ..EngineConfig::new(N_CTX, 512, 1, 64)
    };
    let engine = Engine::start(
        model.clone(),
        dev.clone(),
        tok.clone(),
        config,
        state.metrics.clone(),
    )
    .unwrap();
    assert!(state.install(engine).is_ok());
    let mut run = Run::default();
    let resumed = |run: &mut Run, before: u64| {
        run.resumed
            .push(metric::<u64>(addr, "strata_resumed_tokens_total") - before);
    };

    // 1. The repetitive prompt.
    let prompt = tok.encode(REPEAT, true, false).unwrap();
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 40}),
    );
    run.bodies.push(body(&r));
    run.first = (
        metric::<u64>(addr, "strata_spec_windows_total"),
        metric::<u64>(addr, "strata_spec_accepted_tokens_total"),
    );
    let continuation = run.bodies[0]["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();

    // 2. The same prompt as text, streamed.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": REPEAT, "temperature": 0, "max_tokens": 40, "stream": true}),
    );
    let (text, chunks, finish) = streamed(&r, false);
    run.streams.push((text, finish));
    run.stream_chunks = chunks;

    // 3. A stop string that the answer reaches inside a window.
    let again = tok
        .encode(&format!("{AGAIN}{REPEAT}"), true, false)
        .unwrap();
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": again, "temperature": 0, "max_tokens": 40, "stop": [STOP]}),
    );
    run.bodies.push(body(&r));

    // 4. Its follow-up: the prompt and the whole unstopped answer, as tokens. It reuses
    // what was parked, which must be what plain decoding fed before the stop: the drafts
    // accepted past it are not part of the conversation.
    let mut follow = again.clone();
    follow.extend(tok.encode(&continuation, false, false).unwrap());
    let before = metric::<u64>(addr, "strata_resumed_tokens_total");
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": follow, "temperature": 0, "max_tokens": 12}),
    );
    run.bodies.push(body(&r));
    resumed(&mut run, before);
    run.stop_prompt = again.len();

    // 5. Drafts partly rejected, with log probabilities (a window's rows give them).
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": COLOURS, "temperature": 0, "max_tokens": 32, "logprobs": 2}),
    );
    run.bodies.push(body(&r));

    // 6. A chat, then the same chat streamed.
    let q1 = "Write the word hello three times, separated by commas.";
    let first = [("system", SYSTEM), ("user", q1)];
    let r = post(addr, "/v1/chat/completions", &chat_body(&first, 24, false));
    run.bodies.push(body(&r));
    let answer = run.bodies[4]["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let r = post(addr, "/v1/chat/completions", &chat_body(&first, 24, true));
    let (text, _, finish) = streamed(&r, true);
    run.streams.push((text, finish));

    // 7. The chat's next turn, resumed from the parked conversation.
    let next = [
        ("system", SYSTEM),
        ("user", q1),
        ("assistant", answer.as_str()),
        ("user", "Now write the word goodbye twice."),
    ];
    let before = metric::<u64>(addr, "strata_resumed_tokens_total");
    let r = post(addr, "/v1/chat/completions", &chat_body(&next, 24, false));
    run.bodies.push(body(&r));
    resumed(&mut run, before);

    // 8. Sampled: speculative sampling (not comparable token for token), served whole.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": REPEAT, "temperature": 0.8, "seed": 5, "max_tokens": 16, "ignore_eos": true}),
    );
    let v = body(&r);
    assert_eq!(v["usage"]["completion_tokens"], 16, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");

    run.windows = metric::<u64>(addr, "strata_spec_windows_total");
    run.drafted = metric::<u64>(addr, "strata_spec_draft_tokens_total");
    run.accepted = metric::<u64>(addr, "strata_spec_accepted_tokens_total");
    server.stop();
    run
}

#[test]
fn serve_spec_answers_as_plain_decoding() {
    let Some(path) = smollm2_path() else {
        eprintln!("skipping: SmolLM2-135M-Instruct.Q4_1.gguf not found (set STRATA_SMOLLM2)");
        return;
    };
    let logs = Logs::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    let dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap();
    let gguf = Arc::new(strata_gguf::GgufFile::open(&path).unwrap());
    let model = Arc::new(Model::load(&dev, dev.main_stream(), gguf, |_, _| {}).unwrap());

    let plain = scenario(&model, &dev, &path, SpecConfig::new(0), None);
    let plain_lines = logs.lines().len();
    let fixed = SpecConfig {
        k: 4,
        adaptive: false,
    };
    let fast = scenario(&model, &dev, &path, fixed.clone(), None);
    // The default policy (windows only where they pay, so where they fall depends on
    // timings) and a draft model (SmolLM2 drafting for itself, in each slot's own
    // context) give the same answers too.
    let adaptive = scenario(&model, &dev, &path, SpecConfig::new(4), None);
    let drafted = scenario(&model, &dev, &path, fixed, Some(model.clone()));
    for (name, run) in [
        ("fixed", &fast),
        ("adaptive", &adaptive),
        ("draft model", &drafted),
    ] {
        assert_eq!(plain.bodies.len(), run.bodies.len());
        for (i, (p, s)) in plain.bodies.iter().zip(&run.bodies).enumerate() {
            assert_eq!(p, s, "answer {i} differs with --spec 4 ({name})");
        }
        assert_eq!(plain.streams, run.streams, "streamed answers ({name})");
        assert_eq!(
            plain.resumed, run.resumed,
            "tokens the follow-ups reused ({name})"
        );
        eprintln!(
            "{name}: {} windows, {}/{} drafts accepted",
            run.windows, run.accepted, run.drafted
        );
    }
    for (i, b) in plain.bodies.iter().enumerate() {
        eprintln!("answer {i}: {}", b["choices"][0]);
    }
    assert!(drafted.windows > 0 && drafted.accepted > 0);

    // The answers are what the requests were meant to be.
    let repeated = plain.bodies[0]["choices"][0]["text"].as_str().unwrap();
    assert!(
        repeated.starts_with("The cat sat on the mat.\nThe cat"),
        "{repeated}"
    );
    assert_eq!(plain.bodies[0]["choices"][0]["finish_reason"], "length");
    assert_eq!(plain.streams[0].0, repeated, "streamed = whole");
    let stopped = &plain.bodies[1]["choices"][0];
    assert_eq!(stopped["finish_reason"], "stop");
    assert_eq!(stopped["text"], "The cat sat on the ");
    // Plain decoding parks the prompt and the tokens it fed: " mat" was, "." (which made
    // the stop string) was not.
    assert_eq!(plain.resumed[0], plain.stop_prompt as u64 + 6);
    assert!(plain.resumed[1] > 0);
    assert_eq!(
        plain.streams[1].0,
        plain.bodies[4]["choices"][0]["message"]["content"]
    );

    // Drafts were verified and accepted from the first repetitive answer on; the
    // streamed answer came in pieces.
    assert_eq!((plain.windows, plain.drafted, plain.accepted), (0, 0, 0));
    assert!(fast.first.0 > 0 && fast.first.1 > 0, "{:?}", fast.first);
    assert!(fast.accepted > 0 && fast.accepted <= fast.drafted);
    assert!(fast.stream_chunks > 1, "{}", fast.stream_chunks);

    // One end-of-request line per request, with the windows when speculating.
    let lines = logs.lines();
    let done: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("request done"))
        .collect();
    assert_eq!(done.len(), 4 * 9, "{done:?}");
    assert!(
        lines[..plain_lines]
            .iter()
            .filter(|l| l.contains("request done"))
            .all(|l| !l.contains("spec:"))
    );
    let first_spec = lines[plain_lines..]
        .iter()
        .find(|l| l.contains("request done"))
        .unwrap();
    eprintln!("{first_spec}");
    assert!(
        first_spec.contains(&format!("spec: {} windows", fast.first.0)),
        "{first_spec}"
    );
    assert!(first_spec.contains("drafts accepted ("), "{first_spec}");
}
