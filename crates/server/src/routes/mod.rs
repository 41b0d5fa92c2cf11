//! The HTTP routes, one module each, and what they share: auth, body reading, JSON
//! answers and the generation loop.

pub mod chat;
pub mod completions;
mod generation;
pub mod health;
pub mod metrics;
pub mod models;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;

use crate::AppState;
use crate::error::ApiError;
use crate::openai::{self, Endpoint};

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/models", get(models::handle))
        .route("/health", get(health::handle))
        .route("/metrics", get(metrics::handle))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::status(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such route",
    )
}

/// With an API key set, every route but /health needs `Authorization: Bearer <key>`.
async fn authorize(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key
        && req.uri().path() != "/health"
    {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given.is_none_or(|g| !constant_time_eq(g.as_bytes(), key.as_bytes())) {
            let mut e = ApiError::status(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or wrong API key (Authorization: Bearer <key>)",
            );
            e.code = Some("invalid_api_key");
            return e.into_response();
        }
    }
    next.run(req).await
}

/// Compares without stopping at the first difference, so timing does not leak the key.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// The body parsed as `T`, at most `limit` bytes (413 past it, 400 when not `T`).
pub async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    endpoint: Endpoint,
) -> Result<T, ApiError> {
    let too_large = || {
        ApiError::status(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is over {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large())?;
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("the request body is not JSON: {e}"), None))?;
    openai::check_fields(&value, endpoint)?;
    serde_json::from_value(value)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid: {e}"), None))
}

/// A request's `model` must name the model served.
pub fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        None => Err(ApiError::invalid("`model` is required", Some("model"))),
        Some(m) if m == state.config.model_name => Ok(()),
        Some(m) => Err(ApiError::invalid(
            format!(
                "the model `{m}` does not exist; this server runs `{}`",
                state.config.model_name
            ),
            Some("model"),
        )
        .with_code("model_not_found")),
    }
}
