//! Prompt-lookup drafting: the text so far often repeats itself (rewrites, code edits,
//! quoting), so the tokens that followed an earlier occurrence of the current suffix are a
//! cheap guess at what comes next.

use super::drafter::Drafter;
use crate::error::Result;

/// Finds the earlier position whose preceding tokens match the longest suffix of the
/// history (at most `max_n` tokens, at least `min_n`; the latest such position among
/// equals) and proposes the tokens that followed it. The match length is the proposal's
/// class: a long match is a far better guess than a single repeated token.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    pub max_n: usize,
    pub min_n: usize,
    last_match: usize,
}

impl NgramDrafter {
    pub fn new(min_n: usize, max_n: usize) -> Self {
        NgramDrafter {
            max_n: max_n.max(1),
            min_n: min_n.clamp(1, max_n.max(1)),
            last_match: 0,
        }
    }

    /// The position after the best earlier match of the history's suffix, and its length.
    fn best_match(&self, history: &[u32]) -> Option<(usize, usize)> {
        let len = history.len();
        let last = *history.last()?;
        let mut best: Option<(usize, usize)> = None;
        // Candidate ends `e` (exclusive) with history[e - 1] == last, latest first; the
        // suffix itself (e == len) is not a match.
        for e in (1..len).rev() {
            if history[e - 1] != last {
                continue;
            }
            let n = (1..=self.max_n.min(e))
                .take_while(|&i| history[e - i] == history[len - i])
                .count();
            if n >= self.min_n && best.is_none_or(|(_, b)| n > b) {
                best = Some((e, n));
                if n == self.max_n {
                    break;
                }
            }
        }
        best
    }
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter::new(1, 8)
    }
}

impl Drafter for NgramDrafter {
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        self.last_match = 0;
        if k == 0 {
            return Ok(Vec::new());
        }
        let Some((from, n)) = self.best_match(history) else {
            return Ok(Vec::new());
        };
        self.last_match = n;
        let to = (from + k).min(history.len());
        Ok(history[from..to].to_vec())
    }

    fn last_class(&self) -> usize {
        self.last_match
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_longest_match() {
        let mut d = NgramDrafter::new(1, 3);
        // "1 2 3 9 ... 1 2 3" -> the tokens after the earlier "1 2 3".
        let h = [1, 2, 3, 9, 8, 7, 5, 2, 3, 4, 1, 2, 3];
        assert_eq!(d.propose(&h, 3).unwrap(), vec![9, 8, 7]);
        assert_eq!(d.last_class(), 3);
        // Only a 1-gram matches: the latest earlier "4" is followed by 1 2.
        let h = [4, 1, 2, 5, 4];
        assert_eq!(d.propose(&h, 2).unwrap(), vec![1, 2]);
        assert_eq!(d.last_class(), 1);
        // The proposal stops at the end of the history.
        let h = [7, 8, 7];
        assert_eq!(d.propose(&h, 4).unwrap(), vec![8, 7]);
        assert!(d.propose(&[1, 2, 3], 4).unwrap().is_empty());
        assert_eq!(d.last_class(), 0);
        assert!(d.propose(&h, 0).unwrap().is_empty());
    }

    #[test]
    fn a_longer_earlier_match_beats_a_later_shorter_one() {
        let mut d = NgramDrafter::new(1, 8);
        // "5 6 7" occurs early followed by 1; a later "6 7" is followed by 2.
        let h = [5, 6, 7, 1, 0, 6, 7, 2, 0, 5, 6, 7];
        assert_eq!(d.propose(&h, 1).unwrap(), vec![1]);
        assert_eq!(d.last_class(), 3);
        // With a minimum of 4 tokens nothing matches.
        let mut d = NgramDrafter::new(4, 8);
        assert!(d.propose(&h, 1).unwrap().is_empty());
    }
}
