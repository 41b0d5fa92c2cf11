//! GET /v1/models: the one model this server runs.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::json_response;
use crate::AppState;
use crate::openai;

pub async fn handle(State(state): State<Arc<AppState>>) -> Response {
    json_response(
        StatusCode::OK,
        &openai::model_list(&state.config.model_name, state.created()),
    )
}
