//! The drafter interface: anything that guesses the next tokens cheaply (prompt lookup, a
//! small draft model; MTP heads later).

use crate::error::Result;

pub trait Drafter {
    /// Up to `k` tokens that may follow `history` (the prompt and every accepted token),
    /// most likely first; fewer or none when it has no guess.
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>>;

    /// What kind of guess the last proposal was (the n-gram drafter: the length of the
    /// match it came from), so acceptance is tracked per kind and a kind that does not pay
    /// stops being drafted. Drafters with one kind of guess keep 0.
    fn last_class(&self) -> usize {
        0
    }

    /// Tokens the target model accepted (appended to the history), for drafters that keep
    /// state of their own.
    fn observe(&mut self, _accepted: &[u32]) {}
}
