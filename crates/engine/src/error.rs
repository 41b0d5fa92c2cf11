//! Errors of running a model.

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] strata_model::ModelError),
    #[error(transparent)]
    Device(#[from] strata_core::Error),
    #[error(transparent)]
    Experts(#[from] crate::experts::ExpertError),
    #[error(transparent)]
    Tokenizer(#[from] strata_model::tokenizer::TokenizerError),
    #[error("the prompt has {prompt} tokens but the context holds {ctx} (raise --ctx)")]
    PromptTooLong { prompt: usize, ctx: usize },
    #[error("invalid sampling parameter: {0}")]
    BadSampling(String),
    #[error("empty prompt: there is nothing to continue from")]
    EmptyPrompt,
    #[error("elastic K/V: {0}")]
    BadKvGrow(String),
    /// The elastic K/V cannot grow without eating into `--vram-reserve-mib` (kv_grow.rs).
    #[error(
        "the K/V cannot grow to hold {needed} positions: {cells} cells take {:.1} MiB of device memory (it holds {have} cells now), {:.1} MiB is free and --vram-reserve-mib keeps {:.1} MiB of it; shorten the conversation, lower --ctx, or use --kv int8 or fewer --expert-cache slots",
        mib(*bytes), mib(*free), mib(*reserve)
    )]
    KvFull {
        needed: usize,
        /// The smallest K/V that would hold them, and its bytes.
        cells: u32,
        bytes: u64,
        have: u32,
        free: u64,
        reserve: u64,
    },
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
