//! Errors of chat-template rendering.

/// Why a chat template could not be compiled or rendered. Every variant that
/// comes from the template names its line when minijinja knows it.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("chat template{}: {message}", at_line(*line))]
    Syntax {
        line: Option<usize>,
        message: String,
    },

    /// The template called `raise_exception(message)`.
    #[error("chat template{} raised an exception: {message}", at_line(*line))]
    Raised {
        line: Option<usize>,
        message: String,
    },

    #[error("chat template{}: {message}", at_line(*line))]
    Render {
        line: Option<usize>,
        message: String,
    },

    #[error("{what} is not valid JSON: {reason}")]
    BadJson { what: String, reason: String },

    #[error("{what} must be a JSON {expected}")]
    BadInput {
        what: String,
        expected: &'static str,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" line {l}")).unwrap_or_default()
}
