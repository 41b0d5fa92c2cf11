//! `strata serve`: an OpenAI-compatible HTTP server (crates/server). It listens first, so
//! /health answers 503 while the model loads, then 200.

use std::sync::Arc;

use anyhow::Context as _;
use strata_server::{AppState, Engine, EngineConfig, ParkConfig, ServerConfig};

use super::common::{self, ModelArgs, SamplingArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling for the fields a request leaves out.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Elastic K/V per context: grown on demand, trimmed when its request ends.
    #[command(flatten)]
    pub kv_grow: super::kv_grow::KvGrowArgs,
    /// Speculative decoding of every request, each slot drafting from its own conversation
    /// (or with its own context of the draft model).
    #[command(flatten)]
    pub spec: super::spec::SpecArgs,
    /// Address to listen on (loopback only unless asked).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free one; the chosen one is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer <key>` (default: $STRATA_API_KEY).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests served at once, each in its own context on the device.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Host memory (MiB) for parked conversations: the K/V of finished requests, so a
    /// follow-up reads only its new tokens. 0: park on disk only (with --park-dir).
    #[arg(long, default_value_t = 2048)]
    pub park_mib: usize,
    /// Directory that parked conversations spill to past --park-mib (least recently used
    /// first). Without it they are dropped instead.
    #[arg(long)]
    pub park_dir: Option<std::path::PathBuf>,
    /// Disk (MiB) for spilled conversations in --park-dir.
    #[arg(long, default_value_t = 16384)]
    pub park_disk_mib: usize,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM before they are
    /// cancelled.
    #[arg(long, default_value_t = 10)]
    pub shutdown_grace: u64,
    /// Most requests queued or being served; more get 503 (server_busy).
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// The model name clients give (default: the file name without .gguf).
    #[arg(long)]
    pub alias: Option<String>,
    /// Most bytes of a request body.
    #[arg(long, default_value_t = strata_server::DEFAULT_BODY_LIMIT)]
    pub body_limit: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = rt.block_on(serve(args));
    // A model still loading when a signal came is not waited for.
    rt.shutdown_background();
    result
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let api_key = args
        .api_key
        .clone()
        .or_else(|| std::env::var("STRATA_API_KEY").ok())
        .filter(|k| !k.is_empty());
    let model_name = args.alias.clone().unwrap_or_else(|| {
        args.model
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "strata".into())
    });
    let state = AppState::new(ServerConfig {
        model_name: model_name.clone(),
        api_key,
        body_limit: args.body_limit,
        sampling: args.sampling.params(),
    });
    let loopback = args
        .host
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
        || args.host == "localhost";
    if !loopback && state.config.api_key.is_none() {
        eprintln!(
            "strata: warning: listening on {} without an API key: anyone who can reach it can use it (--api-key)",
            args.host
        );
    }
    let listener = strata_server::bind(&args.host, args.port).await?;
    eprintln!(
        "strata: listening on http://{} (model `{model_name}`)",
        listener.local_addr()?
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // Told when a signal came, so in-flight requests get a grace period, then are cancelled.
    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        tokio::select! {
            _ = strata_server::shutdown_signal() => {
                eprintln!("strata: shutting down (no new requests; finishing those in flight)");
                let _ = signalled_tx.send(());
            }
            _ = stop_rx => {}
        }
    };
    let server = tokio::spawn(strata_server::serve(listener, state.clone(), shutdown));
    let model_args = args.model.clone();
    let parallel = args.parallel;
    let kv_grow = args.kv_grow.options(&args.model.experts)?;
    let cells = kv_grow.map(|o| o.init);
    let spec_args = args.spec.clone();
    let loaded = tokio::task::spawn_blocking(move || {
        let l = common::load_elastic(&model_args, parallel, cells)?;
        let draft = spec_args.load_draft(&l)?;
        anyhow::Ok((l, draft))
    })
    .await
    .context("loading the model")?;
    let (loaded, draft) = match loaded {
        Ok(l) => l,
        Err(e) => {
            let _ = stop_tx.send(());
            let _ = server.await;
            return Err(e);
        }
    };
    let engine = Engine::start(
        loaded.model,
        loaded.dev,
        Arc::new(loaded.tokenizer),
        EngineConfig {
            n_ctx: loaded.n_ctx,
            n_batch: args.model.batch,
            parallel: args.parallel,
            park: ParkConfig {
                host_bytes: args.park_mib << 20,
                dir: args.park_dir.clone(),
                disk_bytes: args.park_disk_mib << 20,
            },
            max_queue: args.max_queue,
            experts: loaded.experts.clone(),
            kv: loaded.kv,
            kv_grow,
            spec: args.spec.config(),
            draft,
        },
        state.metrics.clone(),
    )?;
    if state.install(engine).is_err() {
        anyhow::bail!("the engine was installed twice");
    }
    let elastic = kv_grow.map_or(String::new(), |o| {
        format!(
            "; elastic K/V from {} cells in steps of {}, leaving {} MiB free",
            o.init.min(loaded.n_ctx),
            o.step,
            o.reserve >> 20
        )
    });
    let spec = match (args.spec.spec, &args.spec.draft_model) {
        (0, _) => String::new(),
        (k, Some(p)) => format!(
            "; speculative decoding: up to {k} drafts from {}",
            p.display()
        ),
        (k, None) => format!("; speculative decoding: up to {k} prompt-lookup drafts"),
    };
    eprintln!(
        "strata: ready ({} positions per conversation{elastic}{spec})",
        loaded.n_ctx
    );
    let grace = std::time::Duration::from_secs(args.shutdown_grace);
    let canceller = {
        let state = state.clone();
        tokio::spawn(async move {
            if signalled_rx.await.is_ok() {
                tokio::time::sleep(grace).await;
                eprintln!("strata: cancelling the requests still in flight");
                if let Some(engine) = state.engine() {
                    let engine_stop = std::time::Duration::from_secs(10);
                    tokio::task::block_in_place(|| engine.stop(engine_stop));
                }
            }
        })
    };
    server.await.context("the server task")??;
    canceller.abort();
    drop(stop_tx);
    // Parked conversations' files are removed before exiting.
    if let Some(engine) = state.engine() {
        tokio::task::block_in_place(|| engine.stop(std::time::Duration::from_secs(10)));
    }
    eprintln!("strata: stopped");
    Ok(())
}
