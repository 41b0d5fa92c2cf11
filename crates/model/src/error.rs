//! Errors of loading and running a model.

use strata_gguf::GgufError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Device(#[from] strata_core::Error),
    #[error("architecture `{0}` is not supported (supported: {1})")]
    UnsupportedArch(String, String),
    #[error("{arch}: {what} is not supported: {detail}")]
    Unsupported {
        arch: String,
        what: &'static str,
        detail: String,
    },
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {got:?}, expected {want:?}")]
    BadShape {
        name: String,
        got: Vec<u64>,
        want: Vec<u64>,
    },
    #[error("tensor `{name}`: {detail}")]
    BadTensor { name: String, detail: String },
    #[error("{0}")]
    BadHParams(String),
    #[error("the prompt needs {needed} positions but the context holds {ctx}")]
    ContextFull { needed: usize, ctx: usize },
    #[error("token id {0} is outside the vocabulary ({1} tokens)")]
    BadToken(u32, usize),
    #[error("the routed experts were loaded for an expert cache, and none runs them")]
    ExpertsNotOnDevice,
    #[error("expert cache: {0}")]
    ExpertCache(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
