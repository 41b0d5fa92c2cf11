//! Speculative decoding with greedy acceptance: a [`Drafter`] proposes up to K tokens, the
//! target model evaluates [last token + drafts] in one verify window, and the longest
//! prefix of drafts that equals the model's own greedy choice is accepted, plus the
//! model's next token after it (the bonus). Exact: the output is token for token the
//! output of plain greedy decoding, because every window row is computed as a one-token
//! step computes it ([`crate::Context::eval_verify`]).

pub mod drafter;
pub mod ngram;
pub mod verify;

pub use drafter::Drafter;
pub use ngram::NgramDrafter;
pub use verify::{SpecStats, accept_prefix};
