//! Prompt-lookup drafting: the text so far often repeats itself (rewrites, code edits,
//! quoting), so the tokens that followed the latest earlier occurrence of the current
//! suffix are a cheap guess at what comes next.

use super::drafter::Drafter;

/// Matches the longest suffix n-gram (n from `max_n` down to `min_n`) of the history
/// against its earlier positions and proposes the tokens that followed the latest match.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    pub max_n: usize,
    pub min_n: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter { max_n: 3, min_n: 1 }
    }
}

impl Drafter for NgramDrafter {
    fn propose(&mut self, history: &[u32], k: usize) -> Vec<u32> {
        let len = history.len();
        if k == 0 {
            return Vec::new();
        }
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if n >= len {
                continue;
            }
            let suffix = &history[len - n..];
            // Latest earlier occurrence first: an occurrence ending at `end` (< len).
            for start in (0..len - n).rev() {
                if &history[start..start + n] == suffix {
                    let from = start + n;
                    let to = (from + k).min(len);
                    return history[from..to].to_vec();
                }
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_longest_match() {
        let mut d = NgramDrafter::default();
        // "1 2 3 9 ... 1 2 3" -> the tokens after the earlier "1 2 3".
        let h = [1, 2, 3, 9, 8, 7, 5, 2, 3, 4, 1, 2, 3];
        assert_eq!(d.propose(&h, 3), vec![9, 8, 7]);
        // Only a 1-gram matches: the latest earlier "4" is followed by 1 2.
        let h = [4, 1, 2, 5, 4];
        assert_eq!(d.propose(&h, 2), vec![1, 2]);
        // The proposal stops at the end of the history.
        let h = [7, 8, 7];
        assert_eq!(d.propose(&h, 4), vec![8, 7]);
        assert!(d.propose(&[1, 2, 3], 4).is_empty());
        assert!(d.propose(&h, 0).is_empty());
    }
}
