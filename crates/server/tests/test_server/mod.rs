//! The server every server test runs: the crate's routes on 127.0.0.1 (a free port) in a
//! tokio runtime of its own, started and stopped the same way by each test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use strata_engine::SamplingParams;
use strata_server::{AppState, ServerConfig};

pub struct TestServer {
    pub state: Arc<AppState>,
    pub addr: SocketAddr,
    rt: tokio::runtime::Runtime,
    stop_tx: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), strata_server::ServerError>>,
}

impl TestServer {
    /// Listening, with no engine yet (/health answers 503 until one is installed).
    pub fn start(model_name: &str, api_key: Option<&str>, body_limit: usize) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let state = AppState::new(ServerConfig {
            model_name: model_name.into(),
            api_key: api_key.map(Into::into),
            body_limit,
            sampling: SamplingParams::default(),
        });
        let listener = rt.block_on(strata_server::bind("127.0.0.1", 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = rt.spawn(strata_server::serve(listener, state.clone(), async {
            let _ = stop_rx.await;
        }));
        TestServer {
            state,
            addr,
            rt,
            stop_tx,
            server,
        }
    }

    /// Stops the engine (if one was installed), then the server, which must end cleanly.
    pub fn stop(self) {
        if let Some(engine) = self.state.engine() {
            engine.stop(Duration::from_secs(10));
        }
        let _ = self.stop_tx.send(());
        self.rt.block_on(self.server).unwrap().unwrap();
    }
}
