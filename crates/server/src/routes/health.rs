//! GET /health: 503 while the model loads, 200 once requests can be served.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::json_response;
use crate::AppState;

pub async fn handle(State(state): State<Arc<AppState>>) -> Response {
    if state.engine().is_some() {
        json_response(StatusCode::OK, &json!({"status": "ok"}))
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "loading model", "error": {"message": "the model is still loading", "type": "unavailable_error", "param": null, "code": 503}}),
        )
    }
}
