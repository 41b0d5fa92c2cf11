//! Errors of the tokenizer.

/// Why a tokenizer could not be built or could not encode a text.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read the tokenizer from the GGUF file: {0}")]
    Gguf(#[from] strata_gguf::GgufError),

    #[error("tokenizer model `{model}` is not supported (supported: {supported})")]
    UnsupportedModel { model: String, supported: String },

    #[error(
        "pre-tokenizer `{pre}` (tokenizer.ggml.pre) is not supported; supported values: {supported}"
    )]
    UnsupportedPre { pre: String, supported: String },

    #[error("the vocabulary is unusable: {reason}")]
    BadVocab { reason: String },

    #[error("pre-tokenizer regex `{pattern}` does not compile: {reason}")]
    BadRegex { pattern: String, reason: String },

    #[error("pre-tokenizer regex `{pattern}` failed on the input: {reason}")]
    RegexRuntime { pattern: String, reason: String },

    #[error("{which} is needed but the vocabulary has none")]
    MissingSpecial { which: &'static str },
}
