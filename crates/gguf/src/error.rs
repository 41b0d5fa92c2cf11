//! Errors of the GGUF reader and writer.
//!
//! Every error about a file's content names the metadata key or the tensor it
//! concerns (or its position, when the name itself could not be read).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot write GGUF: {0}")]
    WriteIo(#[source] std::io::Error),

    #[error("not a GGUF file: the first bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },

    #[error(
        "GGUF version 1 is not supported (it predates 64-bit counts); \
         re-convert the model with a current llama.cpp"
    )]
    VersionOne,

    #[error("GGUF version {version} is not supported (strata reads versions 2 and 3)")]
    UnsupportedVersion { version: u32 },

    #[error("big-endian GGUF files are not supported (the version field reads {version:#010x})")]
    BigEndian { version: u32 },

    /// The fixed header or the counts in it are unusable.
    #[error("bad GGUF header: {reason}")]
    BadHeader { reason: String },

    /// A metadata entry whose key could not be read.
    #[error("metadata entry #{index}: {reason}")]
    BadKey { index: u64, reason: String },

    /// A metadata value that is truncated, of an unknown type, or inconsistent.
    #[error("metadata key `{key}`: {reason}")]
    BadValue { key: String, reason: String },

    /// A tensor index entry that is truncated or inconsistent; `tensor` is the
    /// name, or `#i` when the name itself could not be read.
    #[error("tensor `{tensor}`: {reason}")]
    BadTensor { tensor: String, reason: String },

    #[error("metadata key `{key}` is missing")]
    MissingKey { key: String },

    #[error("metadata key `{key}` holds {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },

    #[error("metadata key `{key}` holds {value}, which does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },

    #[error("metadata key `{key}`{}: string is not valid UTF-8", index.map(|i| format!(" element {i}")).unwrap_or_default())]
    InvalidUtf8 { key: String, index: Option<usize> },

    /// The writer was asked for something it cannot write.
    #[error("GGUF writer: {reason}")]
    BadWrite { reason: String },
}
