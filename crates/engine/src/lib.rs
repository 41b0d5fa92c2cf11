//! The engine: contexts (K/V and batches), sampling and generation. Later: the expert
//! cache, the CPU pool, elastic K/V, the verifier and sessions.

pub mod context;
pub mod error;
pub mod experts;
pub mod generate;
pub mod kv_grow;
pub mod kv_snapshot;
pub mod perplexity;
pub mod sampler;
pub mod spec;
pub mod stop;

pub use context::Context;
pub use error::{EngineError, Result};
pub use generate::{
    GenerateParams, Generation, StopReason, generate, generate_spec, generate_with,
};
pub use kv_snapshot::KvSnapshot;
pub use sampler::{Sampler, SamplingParams};
