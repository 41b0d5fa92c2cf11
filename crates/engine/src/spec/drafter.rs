//! The drafter interface: anything that guesses the next tokens cheaply (prompt lookup
//! now; a draft model or MTP heads later).

pub trait Drafter {
    /// Up to `k` tokens that may follow `history` (the prompt and every accepted token),
    /// most likely first; fewer or none when it has no guess.
    fn propose(&mut self, history: &[u32], k: usize) -> Vec<u32>;

    /// Tokens the target model accepted (appended to the history), for drafters that keep
    /// state of their own.
    fn observe(&mut self, _accepted: &[u32]) {}
}
