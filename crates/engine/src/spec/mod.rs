//! Speculative decoding: a [`Drafter`] proposes up to K tokens, the target model
//! evaluates [last token + drafts] in one verify window, and drafts are accepted by the
//! sampler's own distribution ([`accept_sampled`]: the longest prefix equal to the model's
//! choice in greedy mode, speculative sampling otherwise), then one more token from the
//! model. Exact: greedy output is token for token that of plain greedy decoding (every
//! window row is computed as a one-token step computes it,
//! [`crate::Context::eval_verify`]), and sampled output has the plain distribution. A
//! back-off policy ([`BackOff`]) verifies drafts only where they have paid lately.
//! [`measure_window_cost`] times a window against a plain step with a [`ReplayDrafter`].

pub mod backoff;
pub mod draft_model;
pub mod drafter;
pub mod ngram;
pub mod replay;
pub mod speculator;
pub mod verify;
pub mod window_cost;

pub use backoff::BackOff;
pub use draft_model::{DraftModel, DraftModelError};
pub use drafter::Drafter;
pub use ngram::NgramDrafter;
pub use replay::ReplayDrafter;
pub use speculator::{SpecConfig, Speculator, Step};
pub use verify::{SpecStats, accept_prefix, accept_sampled};
pub use window_cost::{
    WindowCost, WindowCostError, measure_window_cost, measure_window_costs, time_windows,
};
