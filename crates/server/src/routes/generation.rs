//! What both completion routes do once a prompt is tokenized: queue the job, then either
//! gather the whole answer or stream it as server-sent events.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::json_response;
use crate::AppState;
use crate::engine_handle::{Event, Task, TokenLogprob};
use crate::error::{ApiError, ServerError};
use crate::openai::{self, Endpoint, Envelope, Plan};
use crate::sse::{self, ChannelStream};

/// Queues `tokens` with `plan` and answers, streamed or whole.
pub async fn answer(
    state: Arc<AppState>,
    endpoint: Endpoint,
    tokens: Vec<u32>,
    plan: Plan,
) -> Result<Response, ApiError> {
    let engine = state.engine().ok_or_else(not_ready)?;
    let (tx, rx) = unbounded_channel();
    engine
        .submit(Task {
            tokens,
            params: plan.params.clone(),
            logprobs: plan.logprobs,
            reuse_prefix: plan.reuse_prefix,
            events: tx,
            queued_at: std::time::Instant::now(),
        })
        .map_err(|e| match e {
            ServerError::Busy(_) => ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                e.to_string(),
            )
            .with_code("server_busy"),
            _ => ApiError::internal(e.to_string()),
        })?;
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    let envelope = Envelope {
        endpoint,
        id: state.next_id(prefix),
        created: crate::unix_now(),
        model: state.config.model_name.clone(),
    };
    if plan.stream {
        let (body_tx, body_rx) = unbounded_channel();
        tokio::spawn(stream_events(rx, body_tx, envelope, plan));
        Ok((
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(ChannelStream(body_rx)),
        )
            .into_response())
    } else {
        gather(rx, &envelope, plan.logprobs.is_some()).await
    }
}

pub fn not_ready() -> ApiError {
    ApiError::status(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "the model is still loading",
    )
}

async fn gather(
    mut rx: UnboundedReceiver<Event>,
    envelope: &Envelope,
    want_logprobs: bool,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut lps: Vec<TokenLogprob> = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(t, l) => {
                text.push_str(&t);
                lps.extend(l);
            }
            Event::Done(f) => {
                let usage = openai::usage(f.prompt_tokens, f.completion_tokens);
                let logprobs = if want_logprobs {
                    openai::logprobs_json(envelope.endpoint, &lps, 0)
                } else {
                    serde_json::Value::Null
                };
                let body =
                    envelope.response(&text, openai::finish_reason(&f.stop), usage, logprobs);
                return Ok(json_response(StatusCode::OK, &body));
            }
            Event::Failed(message) => return Err(ApiError::internal(message)),
        }
    }
    Err(ApiError::internal("the engine dropped the request"))
}

/// Turns engine events into SSE texts. Ends early when the client has gone (the body
/// channel is closed), which drops `rx` and so cancels generation at the next token.
async fn stream_events(
    mut rx: UnboundedReceiver<Event>,
    out: UnboundedSender<String>,
    envelope: Envelope,
    plan: Plan,
) {
    let null = serde_json::Value::Null;
    let chat = envelope.endpoint == Endpoint::Chat;
    if chat
        && out
            .send(sse::event(&envelope.chunk(None, true, None, null.clone())))
            .is_err()
    {
        return;
    }
    // Characters sent so far (the completions' logprobs give text offsets).
    let mut sent_chars = 0usize;
    loop {
        // A client that leaves while its request is still queued is noticed here too.
        let event = tokio::select! {
            e = rx.recv() => e,
            _ = out.closed() => return,
        };
        let Some(event) = event else { return };
        let texts = match event {
            Event::Text(t, l) => {
                let logprobs = if plan.logprobs.is_some() {
                    openai::logprobs_json(envelope.endpoint, &l, sent_chars)
                } else {
                    null.clone()
                };
                sent_chars += t.chars().count();
                vec![sse::event(&envelope.chunk(Some(&t), false, None, logprobs))]
            }
            Event::Done(f) => {
                let finish = openai::finish_reason(&f.stop);
                let mut v = vec![sse::event(&envelope.chunk(
                    None,
                    false,
                    Some(finish),
                    null.clone(),
                ))];
                if plan.include_usage {
                    let usage = openai::usage(f.prompt_tokens, f.completion_tokens);
                    v.push(sse::event(&envelope.usage_chunk(usage)));
                }
                v.push(sse::DONE.to_string());
                v
            }
            Event::Failed(message) => {
                vec![
                    sse::event(&ApiError::internal(message).body()),
                    sse::DONE.to_string(),
                ]
            }
        };
        for t in texts {
            if out.send(t).is_err() {
                return;
            }
        }
    }
}
