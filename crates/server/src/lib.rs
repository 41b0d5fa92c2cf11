//! `strata serve`: an OpenAI-compatible HTTP server, in pieces as llama.cpp's server is:
//! OpenAI's shapes (`openai`), one module per route (`routes`), the queue's HTTP end
//! (`engine_handle`: tasks and their events), the scheduler thread that owns the device's
//! contexts (`scheduler`) and serves each task in a slot (`slot`), and parked
//! conversations (`park`).

pub mod engine_handle;
pub mod error;
pub mod logprobs;
pub mod metrics;
pub mod openai;
pub mod park;
pub mod prompt;
pub mod routes;
mod scheduler;
mod slot;
mod sse;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use strata_engine::SamplingParams;
use tokio::net::TcpListener;

pub use engine_handle::{Engine, EngineConfig};
pub use error::{ApiError, ServerError};
pub use metrics::Metrics;
pub use park::ParkConfig;

/// Default most bytes of a request body.
pub const DEFAULT_BODY_LIMIT: usize = 4 << 20;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name /v1/models lists and requests must give as `model`.
    pub model_name: String,
    /// When set, every route but /health needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    pub body_limit: usize,
    /// Sampling for fields a request leaves out (the seed is drawn per request).
    pub sampling: SamplingParams,
}

/// What every handler sees. The engine is installed once the model has loaded; until
/// then /health answers 503 and completions 503.
pub struct AppState {
    pub config: ServerConfig,
    pub metrics: Arc<Metrics>,
    engine: OnceLock<Engine>,
    created: u64,
    next_id: AtomicU64,
}

impl AppState {
    pub fn new(config: ServerConfig) -> Arc<Self> {
        Arc::new(AppState {
            config,
            metrics: Arc::new(Metrics::default()),
            engine: OnceLock::new(),
            created: unix_now(),
            next_id: AtomicU64::new(0),
        })
    }

    /// Makes the server ready. A second engine is refused (returned).
    pub fn install(&self, engine: Engine) -> Result<(), Engine> {
        self.engine.set(engine)
    }

    pub fn engine(&self) -> Option<&Engine> {
        self.engine.get()
    }

    pub fn created(&self) -> u64 {
        self.created
    }

    /// A response id unique in this process.
    pub fn next_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06}", self.created)
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Binds `host:port` (port 0: any free one).
pub async fn bind(host: &str, port: u16) -> Result<TcpListener, ServerError> {
    let addr = format!("{host}:{port}");
    TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Serves until `shutdown` completes, then finishes the requests in flight.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    axum::serve(listener, routes::router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(ServerError::Serve)
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
