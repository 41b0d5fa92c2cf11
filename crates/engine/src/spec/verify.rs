//! Acceptance of a verify window and the statistics of a generation's windows.

/// Given the model's choice after each window row (`choices[i]` follows row i, row 0
/// being the last accepted token) and the `drafts` that were rows 1.., returns how many
/// drafts are accepted: the longest prefix where `drafts[i] == choices[i]`. The tokens
/// to emit are `choices[..=accepted]` (the accepted drafts, then the bonus token).
pub fn accept_prefix(drafts: &[u32], choices: &[u32]) -> usize {
    drafts
        .iter()
        .zip(choices)
        .take_while(|(d, c)| d == c)
        .count()
}

/// Counts over one generation's verify windows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// Windows that carried at least one draft.
    pub windows: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl SpecStats {
    pub fn accepted_per_window(&self) -> f64 {
        if self.windows == 0 {
            0.0
        } else {
            self.accepted as f64 / self.windows as f64
        }
    }

    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// One line for stderr.
    pub fn summary(&self) -> String {
        format!(
            "spec: {} windows, {:.2} accepted tokens/window, acceptance {:.1}% ({}/{} drafts)",
            self.windows,
            self.accepted_per_window(),
            100.0 * self.acceptance_rate(),
            self.accepted,
            self.drafted
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_longest_matching_prefix() {
        assert_eq!(accept_prefix(&[5, 6, 7], &[5, 6, 9, 1]), 2);
        assert_eq!(accept_prefix(&[5, 6, 7], &[4, 6, 7, 1]), 0);
        assert_eq!(accept_prefix(&[5, 6, 7], &[5, 6, 7, 1]), 3);
        assert_eq!(accept_prefix(&[], &[3]), 0);
    }
}
