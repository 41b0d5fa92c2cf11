//! OpenAI's request and response shapes for chat completions, completions and models,
//! and the checks that turn a request's fields into generation parameters.

use serde::Deserialize;
use serde_json::{Value, json};
use strata_engine::{GenerateParams, SamplingParams, StopReason};

use crate::engine_handle::TokenLogprob;
use crate::error::ApiError;
use crate::logprobs::MAX_TOP;

/// Most stop strings a request may give (OpenAI allows 4; llama.cpp more).
const MAX_STOPS: usize = 16;

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub options: GenerationFields,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// A message's content: text, or a list of parts of which only text ones are understood.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    #[serde(flatten)]
    pub options: GenerationFields,
}

/// A completion prompt: text, a list holding one text, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The fields chat completions and completions share.
#[derive(Debug, Default, Deserialize)]
pub struct GenerationFields {
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Chat: a boolean; completions: how many alternatives (0 to 5, up to 20 here).
    pub logprobs: Option<Logprobs>,
    /// Chat only: alternatives per token (0 to 20), with `logprobs: true`.
    pub top_logprobs: Option<i64>,
    /// llama.cpp's extension: `false` reads the whole prompt even if a prefix is parked.
    pub cache_prompt: Option<bool>,
    /// llama.cpp's extension: keep generating past end-of-generation tokens.
    pub ignore_eos: Option<bool>,
    // OpenAI fields accepted and checked, but with nothing to do here.
    pub user: Option<String>,
    pub metadata: Option<Value>,
    pub store: Option<bool>,
    pub service_tier: Option<String>,
    pub parallel_tool_calls: Option<bool>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    pub response_format: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Logprobs {
    Flag(bool),
    Count(i64),
}

/// The fields both endpoints know besides their prompt (`messages` or `prompt`).
const COMMON_FIELDS: [&str; 31] = [
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "cache_prompt",
    "ignore_eos",
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "logit_bias",
    "response_format",
    "tools",
    "tool_choice",
    "echo",
    "suffix",
    "best_of",
];

/// A request body must be a JSON object of known fields: a misspelt parameter is an
/// error, not silently ignored.
pub fn check_fields(body: &Value, endpoint: Endpoint) -> Result<(), ApiError> {
    let Some(map) = body.as_object() else {
        return Err(ApiError::invalid(
            "the request body must be a JSON object",
            None,
        ));
    };
    let (prompt, other) = match endpoint {
        Endpoint::Chat => ("messages", "prompt"),
        Endpoint::Completion => ("prompt", "messages"),
    };
    for key in map.keys() {
        if key != prompt && !COMMON_FIELDS.contains(&key.as_str()) {
            let hint = if key == other {
                format!(" (`{other}` belongs to the other endpoint)")
            } else {
                String::new()
            };
            return Err(
                ApiError::invalid(format!("unknown field `{key}`{hint}"), Some(key))
                    .with_code("unknown_parameter"),
            );
        }
    }
    Ok(())
}

/// What a validated request asks for besides the prompt.
#[derive(Debug, Clone)]
pub struct Plan {
    pub params: GenerateParams,
    pub stream: bool,
    pub include_usage: bool,
    /// Log-probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
    pub reuse_prefix: bool,
}

fn in_range(name: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(Some(x as f32)),
        Some(x) => Err(ApiError::invalid(
            format!("`{name}` must be between {lo} and {hi}, got {x}"),
            Some(name),
        )),
    }
}

impl GenerationFields {
    /// Checks every field against the prompt's length and the context; `defaults` fills
    /// what the request leaves out.
    pub fn plan(
        &self,
        endpoint: Endpoint,
        prompt_tokens: usize,
        n_ctx: usize,
        defaults: &SamplingParams,
    ) -> Result<Plan, ApiError> {
        if let Some(n) = self.n
            && n != 1
        {
            return Err(ApiError::invalid("only `n` = 1 is supported", Some("n")));
        }
        let (name, max) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => ("max_completion_tokens", Some(m)),
            (None, m) => ("max_tokens", m),
        };
        if let Some(m) = max
            && m < 1
        {
            return Err(ApiError::invalid(
                format!("`{name}` must be at least 1, got {m}"),
                Some(name),
            ));
        }
        if prompt_tokens >= n_ctx {
            return Err(ApiError::invalid(
                format!("the prompt has {prompt_tokens} tokens but the context holds {n_ctx}"),
                Some("messages"),
            )
            .with_code("context_length_exceeded"));
        }
        let room = n_ctx - prompt_tokens;
        let max_tokens = match max {
            Some(m) if m as u64 > room as u64 => {
                return Err(ApiError::invalid(
                    format!(
                        "the prompt ({prompt_tokens} tokens) plus `{name}` ({m}) is over the context ({n_ctx} tokens)"
                    ),
                    Some(name),
                )
                .with_code("context_length_exceeded"));
            }
            Some(m) => m as usize,
            None => room,
        };
        let mut s = defaults.clone();
        if let Some(t) = in_range("temperature", self.temperature, 0.0, 2.0)? {
            s.temperature = t;
        }
        if let Some(p) = self.top_p {
            if !(p.is_finite() && p > 0.0 && p <= 1.0) {
                return Err(ApiError::invalid(
                    format!("`top_p` must be in (0, 1], got {p}"),
                    Some("top_p"),
                ));
            }
            s.top_p = p as f32;
        }
        if let Some(k) = self.top_k {
            if k < 0 {
                return Err(ApiError::invalid(
                    format!("`top_k` must be at least 0, got {k}"),
                    Some("top_k"),
                ));
            }
            s.top_k = k as usize;
        }
        if let Some(m) = in_range("min_p", self.min_p, 0.0, 1.0)? {
            s.min_p = m;
        }
        if let Some(r) = self.repeat_penalty {
            if !(r.is_finite() && r > 0.0 && r <= 10.0) {
                return Err(ApiError::invalid(
                    format!("`repeat_penalty` must be in (0, 10], got {r}"),
                    Some("repeat_penalty"),
                ));
            }
            s.repeat_penalty = r as f32;
        }
        if let Some(p) = in_range("presence_penalty", self.presence_penalty, -2.0, 2.0)? {
            s.presence_penalty = p;
        }
        if let Some(f) = in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)? {
            s.frequency_penalty = f;
        }
        s.seed = match self.seed {
            Some(seed) => seed as u64,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        };
        s.validate()
            .map_err(|e| ApiError::invalid(e.to_string(), None))?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOPS {
            return Err(ApiError::invalid(
                format!("`stop` has {} strings; at most {MAX_STOPS}", stop.len()),
                Some("stop"),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "`stop` strings must not be empty",
                Some("stop"),
            ));
        }
        self.check_unsupported()?;
        let logprobs = self.logprobs_plan(endpoint)?;
        let stream = self.stream.unwrap_or(false);
        let include_usage = self
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        Ok(Plan {
            params: GenerateParams {
                max_tokens,
                stop,
                sampling: s,
                ignore_eos: self.ignore_eos.unwrap_or(false),
                show_special: false,
            },
            stream,
            include_usage,
            logprobs,
            reuse_prefix: self.cache_prompt.unwrap_or(true),
        })
    }

    /// Alternatives per token when log-probabilities are asked for.
    fn logprobs_plan(&self, endpoint: Endpoint) -> Result<Option<usize>, ApiError> {
        let top = |n: i64, name: &str| {
            if (0..=MAX_TOP as i64).contains(&n) {
                Ok(n as usize)
            } else {
                Err(ApiError::invalid(
                    format!("`{name}` must be between 0 and {MAX_TOP}, got {n}"),
                    Some(name),
                ))
            }
        };
        match endpoint {
            Endpoint::Chat => {
                let on = match self.logprobs {
                    None | Some(Logprobs::Flag(false)) => false,
                    Some(Logprobs::Flag(true)) => true,
                    Some(Logprobs::Count(_)) => {
                        return Err(ApiError::invalid(
                            "`logprobs` must be a boolean for chat completions (use `top_logprobs` for alternatives)",
                            Some("logprobs"),
                        ));
                    }
                };
                match (on, self.top_logprobs) {
                    (false, Some(_)) => Err(ApiError::invalid(
                        "`top_logprobs` needs `logprobs` set to true",
                        Some("top_logprobs"),
                    )),
                    (false, None) => Ok(None),
                    (true, n) => Ok(Some(top(n.unwrap_or(0), "top_logprobs")?)),
                }
            }
            Endpoint::Completion => match self.logprobs {
                None => Ok(None),
                Some(Logprobs::Count(n)) => Ok(Some(top(n, "logprobs")?)),
                Some(Logprobs::Flag(_)) => Err(ApiError::invalid(
                    "`logprobs` must be an integer (alternatives per token) for completions",
                    Some("logprobs"),
                )),
            },
        }
    }

    /// OpenAI fields this server cannot honour are refused unless they ask for nothing.
    fn check_unsupported(&self) -> Result<(), ApiError> {
        let refuse = |name: &str, what: &str| {
            Err(ApiError::invalid(
                format!("`{name}`: {what} is not supported"),
                Some(name),
            ))
        };
        if self.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
            return refuse("logit_bias", "a logit bias");
        }
        if let Some(f) = &self.response_format
            && !f.is_null()
            && f.get("type").and_then(Value::as_str) != Some("text")
        {
            return refuse("response_format", "a format other than `text`");
        }
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return refuse("tools", "tool calling");
        }
        if let Some(c) = &self.tool_choice
            && !c.is_null()
            && c.as_str() != Some("none")
            && c.as_str() != Some("auto")
        {
            return refuse("tool_choice", "forcing a tool");
        }
        if self.echo == Some(true) {
            return refuse("echo", "echoing the prompt");
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return refuse("suffix", "a suffix (fill-in-the-middle)");
        }
        if let Some(b) = self.best_of
            && b != 1
        {
            return refuse("best_of", "`best_of` other than 1");
        }
        Ok(())
    }
}

/// OpenAI's finish_reason for how generation ended.
pub fn finish_reason(stop: &StopReason) -> &'static str {
    match stop {
        StopReason::Length | StopReason::ContextFull => "length",
        StopReason::Eog | StopReason::StopString(_) | StopReason::Cancelled => "stop",
    }
}

pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// Which endpoint a response belongs to: the object names and the shape of a choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// What every response of one request shares.
#[derive(Clone, Debug)]
pub struct Envelope {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Envelope {
    fn wrap(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "strata",
            "choices": choices,
        })
    }

    /// The whole answer of a non-streaming request.
    pub fn response(&self, text: &str, finish: &str, usage: Value, logprobs: Value) -> Value {
        let mut v = match self.endpoint {
            Endpoint::Chat => self.wrap(
                "chat.completion",
                json!([{
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }]),
            ),
            Endpoint::Completion => self.wrap(
                "text_completion",
                json!([{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]),
            ),
        };
        v["usage"] = usage;
        v
    }

    /// A streamed piece: `role` only on a chat's first chunk, `finish` only on the last.
    pub fn chunk(
        &self,
        text: Option<&str>,
        role: bool,
        finish: Option<&str>,
        logprobs: Value,
    ) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                let mut delta = json!({});
                if role {
                    delta["role"] = json!("assistant");
                }
                if let Some(t) = text {
                    delta["content"] = json!(t);
                }
                self.wrap(
                    "chat.completion.chunk",
                    json!([{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]),
                )
            }
            Endpoint::Completion => self.wrap(
                "text_completion",
                json!([{"index": 0, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish}]),
            ),
        }
    }

    /// The last chunk when `stream_options.include_usage` is set: no choices, the usage.
    pub fn usage_chunk(&self, usage: Value) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        };
        let mut v = self.wrap(object, json!([]));
        v["usage"] = usage;
        v
    }
}

/// A log-probability as JSON can carry it (no infinities; OpenAI's floor).
fn finite(lp: f32) -> f64 {
    if lp.is_finite() { lp as f64 } else { -9999.0 }
}

/// Log-probabilities in the endpoint's shape: chat's `{"content": [...]}` or the legacy
/// completions' `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, whose
/// offsets start at `text_offset` (characters into the answer).
pub fn logprobs_json(endpoint: Endpoint, entries: &[TokenLogprob], text_offset: usize) -> Value {
    match endpoint {
        Endpoint::Chat => {
            let content: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let top: Vec<Value> = e
                        .top
                        .iter()
                        .map(|(t, b, lp)| json!({"token": t, "logprob": finite(*lp), "bytes": b}))
                        .collect();
                    json!({"token": e.token, "logprob": finite(e.logprob), "bytes": e.bytes, "top_logprobs": top})
                })
                .collect();
            json!({"content": content, "refusal": null})
        }
        Endpoint::Completion => {
            let mut offset = text_offset;
            let mut offsets = Vec::with_capacity(entries.len());
            for e in entries {
                offsets.push(offset);
                offset += e.token.chars().count();
            }
            let top: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let m: serde_json::Map<String, Value> = e
                        .top
                        .iter()
                        .map(|(t, _, lp)| (t.clone(), json!(finite(*lp))))
                        .collect();
                    Value::Object(m)
                })
                .collect();
            json!({
                "tokens": entries.iter().map(|e| e.token.clone()).collect::<Vec<_>>(),
                "token_logprobs": entries.iter().map(|e| finite(e.logprob)).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": offsets,
            })
        }
    }
}

/// GET /v1/models.
pub fn model_list(name: &str, created: u64) -> Value {
    json!({
        "object": "list",
        "data": [{"id": name, "object": "model", "created": created, "owned_by": "strata"}],
    })
}
