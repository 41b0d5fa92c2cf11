//! POST /v1/completions.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::{generation, read_json};
use crate::AppState;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::openai::{CompletionRequest, Endpoint};
use crate::prompt;

pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    Metrics::add(&state.metrics.requests_total, 1);
    let req: CompletionRequest = read_json(
        &headers,
        body,
        state.config.body_limit,
        Endpoint::Completion,
    )
    .await?;
    super::check_model(&state, req.model.as_deref())?;
    let engine = state.engine().ok_or_else(generation::not_ready)?;
    let tokenizer = engine.tokenizer.clone();
    let n_ctx = engine.n_ctx;
    let (tokens, req) = tokio::task::spawn_blocking(move || {
        prompt::completion_tokens(&tokenizer, &req.prompt).map(|t| (t, req))
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing: {e}")))??;
    let plan = req.options.plan(
        Endpoint::Completion,
        tokens.len(),
        n_ctx,
        &state.config.sampling,
    )?;
    generation::answer(state, Endpoint::Completion, tokens, plan).await
}
