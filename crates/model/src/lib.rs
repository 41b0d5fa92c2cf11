//! Model side of strata: architectures, weights, the forward pass, tokenizers and chat
//! templates, all read from a GGUF file.

pub mod arch;
pub mod chat;
pub mod error;
pub mod forward;
pub mod hparams;
pub mod kv;
pub mod model;
pub mod models;
pub mod moe;
pub mod ops;
mod ops_decode;
pub mod synth;
pub mod tokenizer;
pub mod weights;

pub use error::{ModelError, Result};
pub use forward::{KvCache, LogitRows, Scratch};
pub use hparams::HParams;
pub use kv::KvFormat;
pub use model::{LoadOptions, Model};
pub use moe::{MoeIo, RoutedExperts};
