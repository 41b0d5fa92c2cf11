//! Acceptance of a verify window and the statistics of a generation's windows.

use crate::sampler::Sampler;

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

/// Speculative sampling over a window's logit `rows` (row i follows `history` and the
/// first i drafts): draft i is accepted with probability min(1, p(draft) / q(draft)),
/// where p is the sampler's distribution after the row and q the drafter's, a point
/// mass (q = 1) for the deterministic drafters here, so with probability p(draft). The
/// first rejected draft is replaced by a draw from the residual max(0, p - q),
/// normalised: p without the draft. When every draft is accepted, the bonus token is
/// drawn from the last row. The tokens are then distributed exactly as plain sampling's
/// (Leviathan et al. 2023, Chen et al. 2023). With greedy sampling p is a point mass on
/// the arg-max and this is [`accept_prefix`]. Returns the accepted drafts and the
/// final token.
pub fn accept_sampled(
    sampler: &mut Sampler,
    rows: &[f32],
    vocab: usize,
    history: &[u32],
    drafts: &[u32],
) -> Vec<u32> {
    let mut seen = history.to_vec();
    let mut out = Vec::with_capacity(drafts.len() + 1);
    for (i, row) in rows.chunks_exact(vocab).enumerate() {
        // The penalties see the accepted drafts, as plain decoding's history would.
        let dist = sampler.distribution(row, &seen);
        let Some(&draft) = drafts.get(i) else {
            out.push(sampler.draw(&dist));
            break;
        };
        let p = dist.prob(draft);
        let accept = p >= 1.0 || (p > 0.0 && sampler.uniform() < p);
        if !accept {
            out.push(sampler.draw_excluding(&dist, draft));
            break;
        }
        out.push(draft);
        seen.push(draft);
    }
    out
}

/// Counts over one generation's verify windows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// Windows that carried at least one draft.
    pub windows: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// Proposals the back-off policy did not verify (drafts of their kind were rarely
    /// accepted lately).
    pub declined: usize,
    /// Plain one-token steps (no window: nothing proposed, or not worth verifying).
    pub plain: usize,
    /// The back-off policy's last measure of a draft row's cost, in plain steps.
    pub row_cost: Option<f64>,
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

    /// Adds another generation's counts.
    pub fn add(&mut self, other: &SpecStats) {
        self.windows += other.windows;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.declined += other.declined;
        self.plain += other.plain;
        self.row_cost = other.row_cost.or(self.row_cost);
    }

    /// One line for stderr.
    pub fn summary(&self) -> String {
        format!(
            "spec: {} windows, {:.2} accepted tokens/window, acceptance {:.1}% ({}/{} drafts), {} plain steps, {} proposals declined{}",
            self.windows,
            self.accepted_per_window(),
            100.0 * self.acceptance_rate(),
            self.accepted,
            self.drafted,
            self.plain,
            self.declined,
            self.row_cost
                .map(|c| format!(", a draft row costs {c:.2} steps"))
                .unwrap_or_default()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplingParams;

    #[test]
    fn accepts_the_longest_matching_prefix() {
        assert_eq!(accept_prefix(&[5, 6, 7], &[5, 6, 9, 1]), 2);
        assert_eq!(accept_prefix(&[5, 6, 7], &[4, 6, 7, 1]), 0);
        assert_eq!(accept_prefix(&[5, 6, 7], &[5, 6, 7, 1]), 3);
        assert_eq!(accept_prefix(&[], &[3]), 0);
    }

    #[test]
    fn greedy_sampled_acceptance_is_the_matching_prefix() {
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        // Rows whose arg-maxes are 2, 0, 1.
        let rows = [0.0, 1.0, 3.0, 5.0, 1.0, 2.0, 0.0, 4.0, 1.0];
        assert_eq!(
            accept_sampled(&mut s, &rows, 3, &[], &[2, 0]),
            vec![2, 0, 1]
        );
        assert_eq!(accept_sampled(&mut s, &rows, 3, &[], &[2, 1]), vec![2, 0]);
        assert_eq!(accept_sampled(&mut s, &rows, 3, &[], &[1, 1]), vec![2]);
    }

    #[test]
    fn a_one_row_window_is_a_plain_draw_and_residuals_skip_the_draft() {
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 11,
            ..Default::default()
        };
        let row = [0.2f32.ln(), 0.3f32.ln(), 0.5f32.ln()];
        let mut a = Sampler::new(params.clone()).unwrap();
        let mut b = Sampler::new(params).unwrap();
        for _ in 0..50 {
            assert_eq!(
                accept_sampled(&mut a, &row, 3, &[], &[]),
                vec![b.sample(&row, &[])]
            );
        }
        // A rejected draft is never the replacement.
        let two = [row, row].concat();
        for _ in 0..200 {
            let out = accept_sampled(&mut a, &two, 3, &[], &[1]);
            assert!(out.len() == 2 || (out.len() == 1 && out[0] != 1), "{out:?}");
        }
    }
}
