//! OpenAI's request and response shapes for chat completions, completions and models,
//! and the checks that turn a request's fields into generation parameters.

use serde::Deserialize;
use serde_json::{Value, json};
use strata_engine::{GenerateParams, SamplingParams, StopReason};

use crate::error::ApiError;

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
}

/// What a validated request asks for besides the prompt.
#[derive(Debug, Clone)]
pub struct Plan {
    pub params: GenerateParams,
    pub stream: bool,
    pub include_usage: bool,
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
                ignore_eos: false,
                show_special: false,
            },
            stream,
            include_usage,
        })
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
    pub fn response(&self, text: &str, finish: &str, usage: Value) -> Value {
        let mut v = match self.endpoint {
            Endpoint::Chat => self.wrap(
                "chat.completion",
                json!([{
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": null,
                    "finish_reason": finish,
                }]),
            ),
            Endpoint::Completion => self.wrap(
                "text_completion",
                json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]),
            ),
        };
        v["usage"] = usage;
        v
    }

    /// A streamed piece: `role` only on a chat's first chunk, `finish` only on the last.
    pub fn chunk(&self, text: Option<&str>, role: bool, finish: Option<&str>) -> Value {
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
                    json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]),
                )
            }
            Endpoint::Completion => self.wrap(
                "text_completion",
                json!([{"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}]),
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

/// GET /v1/models.
pub fn model_list(name: &str, created: u64) -> Value {
    json!({
        "object": "list",
        "data": [{"id": name, "object": "model", "created": created, "owned_by": "strata"}],
    })
}
