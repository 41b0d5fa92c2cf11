//! A drafter that replays a recorded token sequence: given the prompt and the greedy
//! continuation an earlier run produced, it proposes the target's own next tokens, so every
//! draft is accepted. Benchmarks use it to time verify windows on models whose drafts would
//! never be accepted naturally (random weights).

use super::drafter::Drafter;
use crate::error::Result;

#[derive(Clone, Debug)]
pub struct ReplayDrafter {
    /// The prompt followed by the recorded continuation.
    recorded: Vec<u32>,
}

impl ReplayDrafter {
    /// Replays `continuation`, which followed `prompt` in the recorded run.
    pub fn new(prompt: &[u32], continuation: &[u32]) -> Self {
        ReplayDrafter {
            recorded: [prompt, continuation].concat(),
        }
    }
}

impl Drafter for ReplayDrafter {
    /// The next `k` recorded tokens after `history` (fewer at the recording's end), or none
    /// when `history` is not a prefix of the recording: the output has diverged from it.
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        let from = history.len();
        if from > self.recorded.len() || self.recorded[..from] != *history {
            return Ok(Vec::new());
        }
        let to = (from + k).min(self.recorded.len());
        Ok(self.recorded[from..to].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_the_recorded_tokens_after_the_history() {
        let mut d = ReplayDrafter::new(&[1, 2], &[10, 11, 12, 13]);
        assert_eq!(d.propose(&[1, 2], 2).unwrap(), vec![10, 11]);
        assert_eq!(d.propose(&[1, 2, 10], 2).unwrap(), vec![11, 12]);
        // The recording's end shortens the proposal.
        assert_eq!(d.propose(&[1, 2, 10, 11, 12], 4).unwrap(), vec![13]);
        assert!(d.propose(&[1, 2, 10, 11, 12, 13], 4).unwrap().is_empty());
        assert!(d.propose(&[1, 2, 10], 0).unwrap().is_empty());
    }

    #[test]
    fn proposes_nothing_once_the_history_diverged() {
        let mut d = ReplayDrafter::new(&[1, 2], &[10, 11, 12, 13]);
        // A different output token, a different prompt, a history past the recording.
        assert!(d.propose(&[1, 2, 10, 99], 2).unwrap().is_empty());
        assert!(d.propose(&[1, 2, 10, 99, 12], 2).unwrap().is_empty());
        assert!(d.propose(&[5, 2, 10], 2).unwrap().is_empty());
        assert!(
            d.propose(&[1, 2, 10, 11, 12, 13, 14], 2)
                .unwrap()
                .is_empty()
        );
        // Back on the recording (a rewound conversation), it proposes again.
        assert_eq!(d.propose(&[1, 2, 10, 11], 1).unwrap(), vec![12]);
    }
}
