//! GGUF files: a zero-copy reader on memmap2 and a writer.
//!
//! The reader accepts versions 2 and 3 (little-endian), checks every count and
//! byte range against the file before using it, and reports problems with the
//! key or tensor concerned; it never panics on a malformed file.
//!
//! Strings: GGUF strings are meant to be UTF-8, but llama.cpp accepts any
//! bytes (some vocabularies hold raw bytes as tokens). Nothing is lost here:
//! string arrays keep exact bytes ([`StringArray`]); a scalar string that is not
//! UTF-8 is held lossily in [`Value::String`] with its exact bytes in
//! [`Metadata::string_bytes`]. The `&str` getters refuse non-UTF-8 strings with
//! [`GgufError::InvalidUtf8`] naming the key (and element).

mod error;
mod file;
mod getters;
mod metadata;
mod parse;
mod tensor;
mod value;
mod writer;

pub use error::GgufError;
pub use file::GgufFile;
pub use metadata::Metadata;
pub use strata_quant::QuantType;
pub use tensor::TensorInfo;
pub use value::{Array, StringArray, Value, ValueType};
pub use writer::GgufWriter;

/// ggml's default alignment of tensor data, used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = parse::DEFAULT_ALIGNMENT;

/// Bytes of a tensor of shape `dims` (ggml order) and type `ty`, or why that
/// shape is invalid (a row that is not whole blocks, an int64 overflow).
pub fn tensor_bytes(dims: &[u64], ty: QuantType) -> Result<u64, String> {
    parse::tensor_bytes(dims, ty)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn gguf_file_is_send_and_sync() {
        assert_send_sync::<GgufFile>();
    }
}
