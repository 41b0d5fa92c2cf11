//! The server end to end on the real SmolLM2-135M: answers equal what the engine gives for
//! the same prompt (the prompt written here in ChatML by hand, not by the server's
//! template code), streaming equals non-streaming, a parked conversation is resumed
//! without changing the answer, hostile requests get 4xx, and concurrent clients (one of
//! which leaves mid-stream) are all served.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
mod http_client;
mod test_server;

use std::net::SocketAddr;
use std::sync::Arc;

use http_client::{Reply, send, sse_events};
use serde_json::{Value, json};
use strata_engine::{Context, GenerateParams, SamplingParams, StopReason, generate};
use strata_model::Model;
use strata_model::models::smollm2_path;
use strata_model::tokenizer::Tokenizer;
use strata_server::{Engine, EngineConfig};
use test_server::TestServer;

const KEY: &str = "test-key-123";
const MODEL: &str = "smollm2-test";
const N_CTX: u32 = 1024;
const MAX_TOKENS: usize = 20;
const SYSTEM: &str = "You are a helpful assistant.";

/// SmolLM2's ChatML, written out: (role, content) pairs and the assistant prompt.
fn chatml(messages: &[(&str, &str)]) -> String {
    let mut s = String::new();
    for (role, content) in messages {
        s.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
    }
    s.push_str("<|im_start|>assistant\n");
    s
}

struct Expected {
    text: String,
    prompt_tokens: usize,
    completion_tokens: usize,
    finish: &'static str,
}

/// What the engine itself answers, greedily, on a fresh context.
fn engine_answer(
    model: &Arc<Model>,
    dev: &strata_core::Device,
    tok: &Tokenizer,
    tokens: &[u32],
    max: usize,
) -> Expected {
    let mut ctx = Context::new(model.clone(), dev.clone(), N_CTX, 512).unwrap();
    let params = GenerateParams {
        max_tokens: max,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    };
    let g = generate(&mut ctx, tok, tokens, &params, |_| true).unwrap();
    Expected {
        text: g.text,
        prompt_tokens: tokens.len(),
        completion_tokens: g.tokens.len(),
        finish: if matches!(g.stop, StopReason::Length | StopReason::ContextFull) {
            "length"
        } else {
            "stop"
        },
    }
}

fn auth() -> (&'static str, String) {
    ("Authorization", format!("Bearer {KEY}"))
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    let (k, v) = auth();
    send(
        addr,
        "POST",
        path,
        &[(k, &v), ("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn get(addr: SocketAddr, path: &str) -> Reply {
    let (k, v) = auth();
    send(addr, "GET", path, &[(k, &v)], b"")
}

/// [`http_client::metric`] with this server's API key.
fn metric(addr: SocketAddr, name: &str) -> u64 {
    http_client::metric_value(&get(addr, "/metrics").text(), name)
}

fn chat_body(messages: &[(&str, &str)], stream: bool) -> Value {
    let list: Vec<Value> = messages
        .iter()
        .map(|(r, c)| json!({"role": r, "content": c}))
        .collect();
    json!({
        "model": MODEL,
        "messages": list,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "stream": stream,
        "stream_options": {"include_usage": stream},
    })
}

/// Streamed chat: the concatenated deltas, the finish reason and the usage chunk.
fn stream_chat(reply: &Reply) -> (String, String, Value) {
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        reply
            .head
            .to_ascii_lowercase()
            .contains("text/event-stream")
    );
    let (events, done) = sse_events(&reply.text());
    assert!(done, "no [DONE]");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut finish = String::new();
    let mut usage = Value::Null;
    for e in &events {
        assert_eq!(e["object"], "chat.completion.chunk");
        if let Some(c) = e["choices"].get(0) {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        } else {
            usage = e["usage"].clone();
        }
    }
    (text, finish, usage)
}

fn check_usage(usage: &Value, want: &Expected) {
    assert_eq!(usage["prompt_tokens"], want.prompt_tokens, "{usage}");
    assert_eq!(
        usage["completion_tokens"], want.completion_tokens,
        "{usage}"
    );
    assert_eq!(
        usage["total_tokens"],
        want.prompt_tokens + want.completion_tokens
    );
}

#[test]
fn serve_smollm2_end_to_end() {
    let Some(path) = smollm2_path() else {
        eprintln!("skipping: SmolLM2-135M-Instruct.Q4_1.gguf not found (set STRATA_SMOLLM2)");
        return;
    };
    let server = TestServer::start(MODEL, Some(KEY), 64 << 10);
    let (state, addr) = (server.state.clone(), server.addr);

    // Listening but not loaded: /health is 503, completions too.
    assert_eq!(get(addr, "/health").status, 503);
    let early = post(
        addr,
        "/v1/chat/completions",
        &chat_body(&[("user", "hi")], false),
    );
    assert_eq!(early.status, 503, "{}", early.text());

    // The oracle answers, computed before the engine thread takes the device.
    let dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap();
    let gguf = Arc::new(strata_gguf::GgufFile::open(&path).unwrap());
    let tok = Tokenizer::from_gguf_file(&path).unwrap();
    let model = Arc::new(Model::load(&dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
    let q1 = "What is the capital of France?";
    let first = [("system", SYSTEM), ("user", q1)];
    let first_tokens = tok.encode(&chatml(&first), true, true).unwrap();
    let want1 = engine_answer(&model, &dev, &tok, &first_tokens, MAX_TOKENS);
    let q2 = "And of Italy?";
    let follow = [
        ("system", SYSTEM),
        ("user", q1),
        ("assistant", want1.text.as_str()),
        ("user", q2),
    ];
    let follow_tokens = tok.encode(&chatml(&follow), true, true).unwrap();
    let want2 = engine_answer(&model, &dev, &tok, &follow_tokens, MAX_TOKENS);
    let raw_prompt = "The capital of France is";
    let raw_tokens = tok.encode(raw_prompt, true, false).unwrap();
    let want_raw = engine_answer(&model, &dev, &tok, &raw_tokens, 8);
    assert!(!want1.text.is_empty() && !want2.text.is_empty());

    let engine = Engine::start(
        model,
        dev,
        Arc::new(tok),
        EngineConfig {
            max_queue: 8,
            ..EngineConfig::new(N_CTX, 512, 2, 64)
        },
        state.metrics.clone(),
    )
    .unwrap();
    assert!(state.install(engine).is_ok());
    assert_eq!(get(addr, "/health").status, 200);

    // GET /v1/models.
    let models = get(addr, "/v1/models").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);

    // 1. A greedy chat completion equals the engine's answer for the same prompt.
    let r = post(addr, "/v1/chat/completions", &chat_body(&first, false));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want1.text.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], want1.finish);
    check_usage(&v["usage"], &want1);

    // 2. Streamed deltas add up to the same text; the usage chunk comes last.
    let r = post(addr, "/v1/chat/completions", &chat_body(&first, true));
    let (text, finish, usage) = stream_chat(&r);
    assert_eq!(text, want1.text);
    assert_eq!(finish, want1.finish);
    check_usage(&usage, &want1);

    // 3. The follow-up resumes the parked conversation and answers as a fresh context.
    let resumed_before = metric(addr, "strata_resumed_tokens_total");
    let r = post(addr, "/v1/chat/completions", &chat_body(&follow, false));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], want2.text.as_str());
    check_usage(&v["usage"], &want2);
    let resumed = metric(addr, "strata_resumed_tokens_total") - resumed_before;
    assert!(
        resumed as usize >= first_tokens.len(),
        "resumed only {resumed} tokens of a {}-token shared prefix",
        first_tokens.len()
    );
    assert!(metric(addr, "strata_parked_conversations") >= 1);

    // 4. /v1/completions on a raw prompt.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": raw_prompt, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want_raw.text.as_str());
    check_usage(&v["usage"], &want_raw);

    hostile_requests(addr);
    assert_eq!(
        get(addr, "/health").status,
        200,
        "health after hostile requests"
    );

    concurrent_clients(addr, &first, &want1);

    server.stop();
}

/// Every request here is wrong in one way and must get exactly `status` with an OpenAI
/// error body.
fn hostile_requests(addr: SocketAddr) {
    let ok_msgs = json!([{"role": "user", "content": "hi"}]);
    let chat = |extra: Value| {
        let mut b = json!({"model": MODEL, "messages": ok_msgs, "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                b.as_object_mut().unwrap().remove(k);
            } else {
                b[k] = v.clone();
            }
        }
        b
    };
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("not JSON", b"{\"model\": ".to_vec(), 400),
        ("a JSON list", b"[1, 2]".to_vec(), 400),
        ("no messages", chat(json!({"messages": null})).to_string().into_bytes(), 400),
        ("empty messages", chat(json!({"messages": []})).to_string().into_bytes(), 400),
        ("messages a string", chat(json!({"messages": "hi"})).to_string().into_bytes(), 400),
        ("unknown role", chat(json!({"messages": [{"role": "wizard", "content": "x"}]})).to_string().into_bytes(), 400),
        ("content a number", chat(json!({"messages": [{"role": "user", "content": 5}]})).to_string().into_bytes(), 400),
        ("image content", chat(json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})).to_string().into_bytes(), 400),
        ("user without content", chat(json!({"messages": [{"role": "user"}]})).to_string().into_bytes(), 400),
        ("max_tokens 0", chat(json!({"max_tokens": 0})).to_string().into_bytes(), 400),
        ("max_tokens negative", chat(json!({"max_tokens": -5})).to_string().into_bytes(), 400),
        ("max_tokens a string", chat(json!({"max_tokens": "ten"})).to_string().into_bytes(), 400),
        ("max_completion_tokens 0", chat(json!({"max_completion_tokens": 0})).to_string().into_bytes(), 400),
        ("over the context", chat(json!({"max_tokens": 100000})).to_string().into_bytes(), 400),
        ("temperature 5", chat(json!({"temperature": 5})).to_string().into_bytes(), 400),
        ("temperature a string", chat(json!({"temperature": "hot"})).to_string().into_bytes(), 400),
        ("top_p 0", chat(json!({"top_p": 0})).to_string().into_bytes(), 400),
        ("top_k negative", chat(json!({"top_k": -1})).to_string().into_bytes(), 400),
        ("min_p 2", chat(json!({"min_p": 2})).to_string().into_bytes(), 400),
        ("presence_penalty 3", chat(json!({"presence_penalty": 3})).to_string().into_bytes(), 400),
        ("frequency_penalty -9", chat(json!({"frequency_penalty": -9})).to_string().into_bytes(), 400),
        ("stop a number", chat(json!({"stop": 42})).to_string().into_bytes(), 400),
        ("empty stop string", chat(json!({"stop": [""]})).to_string().into_bytes(), 400),
        ("seed a string", chat(json!({"seed": "abc"})).to_string().into_bytes(), 400),
        ("stream a string", chat(json!({"stream": "yes"})).to_string().into_bytes(), 400),
        ("n 2", chat(json!({"n": 2})).to_string().into_bytes(), 400),
        ("unknown model", chat(json!({"model": "gpt-4"})).to_string().into_bytes(), 400),
        ("no model", chat(json!({"model": null})).to_string().into_bytes(), 400),
        ("body over the limit", chat(json!({"messages": [{"role": "user", "content": "x".repeat(100 << 10)}]})).to_string().into_bytes(), 413),
    ];
    let (k, v) = auth();
    for (what, body, status) in &cases {
        let r = send(
            addr,
            "POST",
            "/v1/chat/completions",
            &[(k, &v), ("Content-Type", "application/json")],
            body,
        );
        assert_eq!(r.status, *status, "{what}: {}", r.text());
        let e = r.json();
        assert!(e["error"]["message"].is_string(), "{what}: {e}");
        assert!(e["error"]["type"].is_string(), "{what}: {e}");
    }
    let completion_cases = [
        (
            "prompt an object",
            json!({"model": MODEL, "prompt": {"a": 1}}),
        ),
        (
            "token out of the vocabulary",
            json!({"model": MODEL, "prompt": [99999999]}),
        ),
        ("two prompts", json!({"model": MODEL, "prompt": ["a", "b"]})),
        ("no prompt", json!({"model": MODEL})),
    ];
    for (what, body) in &completion_cases {
        let r = post(addr, "/v1/completions", body);
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        assert!(r.json()["error"]["message"].is_string());
    }
    // Authorization.
    let body = chat(json!({})).to_string();
    let r = send(addr, "POST", "/v1/chat/completions", &[], body.as_bytes());
    assert_eq!(r.status, 401, "no key: {}", r.text());
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer wrong")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 401, "wrong key");
    assert_eq!(send(addr, "GET", "/v1/models", &[], b"").status, 401);
    assert_eq!(
        send(addr, "GET", "/health", &[], b"").status,
        200,
        "/health needs no key"
    );
    // Routes and methods.
    assert_eq!(get(addr, "/v1/nothing").status, 404);
    assert_eq!(get(addr, "/v1/chat/completions").status, 405);
}

/// Four streaming clients at once all get the greedy answer; a fifth leaves after its
/// first chunk and its generation stops early instead of running to max_tokens.
fn concurrent_clients(addr: SocketAddr, first: &[(&str, &str)], want: &Expected) {
    use std::io::{Read, Write};
    let completion_before = metric(addr, "strata_completion_tokens_total");
    const LEAVER_MAX: u64 = 300;
    let leaver = std::thread::spawn(move || {
        let body = json!({
            "model": MODEL,
            "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
            "max_tokens": LEAVER_MAX,
            "temperature": 0,
            "stream": true,
        })
        .to_string();
        let (k, v) = auth();
        let mut s = http_client::connect(addr);
        s.write_all(&http_client::request_bytes(
            "POST",
            "/v1/completions",
            &[(k, &v), ("Content-Type", "application/json")],
            body.as_bytes(),
        ))
        .unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while !String::from_utf8_lossy(&seen).contains("\"text\"") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed before the first chunk");
            seen.extend_from_slice(&buf[..n]);
        }
        // Leave mid-stream.
        drop(s);
    });
    let body = chat_body(first, true);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || stream_chat(&post(addr, "/v1/chat/completions", &body)))
        })
        .collect();
    leaver.join().unwrap();
    for c in clients {
        let (text, finish, usage) = c.join().unwrap();
        assert_eq!(text, want.text);
        assert_eq!(finish, want.finish);
        check_usage(&usage, want);
    }
    // Everything served: the queue is empty; the leaver's generation was cut short.
    let mut depth = metric(addr, "strata_queue_depth");
    for _ in 0..100 {
        if depth == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        depth = metric(addr, "strata_queue_depth");
    }
    assert_eq!(depth, 0);
    let generated = metric(addr, "strata_completion_tokens_total") - completion_before;
    let leaver_tokens = generated - 4 * want.completion_tokens as u64;
    assert!(
        leaver_tokens < LEAVER_MAX / 2,
        "the client that left still got {leaver_tokens} tokens generated"
    );
}
