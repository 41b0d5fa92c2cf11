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
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
