//! When drafting pays: a verify window of `1 + d` rows costs more than the one-token step
//! it replaces (on the CPU each extra row costs about half a step: the matrix products
//! are compute-bound), so a draft is only worth its row when it is likely to be accepted.
//! The policy keeps, per drafter class (for prompt lookup: the match length), a recent
//! estimate of the chance that a draft token is accepted given the ones before it were,
//! and measures the step and the window costs as it goes; it drafts the `d` that gives the
//! most expected tokens per unit of time, and nothing when no `d` beats a plain step.

use std::collections::VecDeque;
use std::time::Duration;

/// Pseudo-counts of the prior of the pooled estimate (every class together): acceptance
/// `PRIOR_ACCEPT` over `PRIOR_WEIGHT` trials, optimistic enough that drafting gets tried,
/// weak enough that two failed windows turn it off. A class's own estimate starts from
/// the pooled one with the same weight, so after failures elsewhere a fresh class starts
/// pessimistic, and during a long copy an unseen match length starts optimistic.
const PRIOR_ACCEPT: f64 = 0.6;
const PRIOR_WEIGHT: f64 = 2.0;
/// Each new window of a class first scales its counts by this: the estimate follows the
/// last ten or so windows (a rewrite alternates between copied and changed stretches).
const DECAY: f64 = 0.85;
/// A window's extra cost per draft row, as a fraction of a step, until measured.
const PRIOR_ROW_COST: f64 = 0.25;
/// Timings kept (the median of the last ones: a shared machine gives outliers both ways).
const TIMINGS: usize = 9;
/// After this many declined proposals in a row, verify one draft anyway: the estimates of
/// a declined class or of the row cost (one slow window on a busy machine) get refreshed.
const PROBE_EVERY: usize = 32;
/// A plain step is timed after this many windows in a row (the step cost drifts as the
/// context grows; with every draft accepted no plain step would run otherwise).
const STEP_EVERY: usize = 64;
/// Drafting must promise this much more than a plain step (noise in the estimates).
const MARGIN: f64 = 1.02;

#[derive(Clone, Copy, Debug, Default)]
struct ClassStats {
    accepted: f64,
    trials: f64,
}

impl ClassStats {
    /// The acceptance estimate, shrunk towards `prior`.
    fn rate(&self, prior: f64) -> f64 {
        (self.accepted + prior * PRIOR_WEIGHT) / (self.trials + PRIOR_WEIGHT)
    }

    fn record(&mut self, drafted: usize, accepted: usize) {
        self.accepted *= DECAY;
        self.trials *= DECAY;
        // Draft i was tried only when every one before it was accepted.
        self.accepted += accepted as f64;
        self.trials += (accepted + usize::from(accepted < drafted)) as f64;
    }
}

#[derive(Clone, Debug, Default)]
pub struct BackOff {
    classes: Vec<ClassStats>,
    /// Every class's windows together.
    pooled: ClassStats,
    /// Recent plain one-token steps, seconds.
    step_s: Timings,
    /// Recent windows' extra time per draft row (drafting included), seconds.
    row_s: Timings,
    /// Proposals declined since the last window.
    declined: usize,
    /// The next proposal is verified whatever the estimates say.
    probe: bool,
    /// Windows since the last plain step.
    windows_in_a_row: usize,
    /// Window lengths (bit `d`: windows of `d` drafts) run before. The first window of
    /// each length is not timed: it also captures that length's graph (GPU backends: tens
    /// of steps' time) or grows the logits scratch to its rows.
    warmed_up: u64,
    /// Whether a plain step ran before (the first also captures the decode graph).
    step_warmed_up: bool,
}

#[derive(Clone, Debug, Default)]
struct Timings(VecDeque<f64>);

impl Timings {
    fn push(&mut self, t: f64) {
        if self.0.len() == TIMINGS {
            self.0.pop_front();
        }
        self.0.push_back(t);
    }

    fn median(&self) -> Option<f64> {
        let mut v: Vec<f64> = self.0.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }
}

impl BackOff {
    pub fn new() -> Self {
        Self::default()
    }

    /// The chance that a draft of `class` is accepted after its predecessors were.
    pub fn acceptance(&self, class: usize) -> f64 {
        let pooled = self.pooled.rate(PRIOR_ACCEPT);
        let class = self.classes.get(class).copied().unwrap_or_default();
        class.rate(pooled)
    }

    /// A draft row's cost relative to a plain step (at most one step: the rows could
    /// always be computed one by one).
    pub fn row_cost(&self) -> f64 {
        match (self.step_s.median(), self.row_s.median()) {
            (Some(step), Some(row)) if step > 0.0 => (row / step).min(1.0),
            _ => PRIOR_ROW_COST,
        }
    }

    /// [`BackOff::row_cost`] once both costs were measured.
    pub fn measured_row_cost(&self) -> Option<f64> {
        self.row_s
            .median()
            .and(self.step_s.median())
            .map(|_| self.row_cost())
    }

    /// How many of `available` drafts of `class` to verify (0: decode plainly).
    pub fn drafts_for(&self, class: usize, available: usize) -> usize {
        best_draft(self.acceptance(class), self.row_cost(), available)
    }

    /// [`BackOff::drafts_for`], counting declines: after [`PROBE_EVERY`] in a row one
    /// draft is verified anyway.
    pub fn decide(&mut self, class: usize, available: usize) -> usize {
        let d = self.drafts_for(class, available);
        if available == 0 {
            return 0;
        }
        if d > 0 || std::mem::take(&mut self.probe) || self.count_decline() {
            return d.max(1);
        }
        0
    }

    /// Counts a declined opportunity; true when it is time for a probe.
    fn count_decline(&mut self) -> bool {
        self.declined += 1;
        if self.declined >= PROBE_EVERY {
            self.declined = 0;
            return true;
        }
        false
    }

    /// How many drafts to ask the drafter for, at most `k`: the most any class could get
    /// now (a drafter that pays per drafted token, like a draft model, is asked for no
    /// more), 0 when none could pay, except for a probe now and then.
    pub fn ask(&mut self, k: usize) -> usize {
        let pooled = self.pooled.rate(PRIOR_ACCEPT);
        let best = self
            .classes
            .iter()
            .map(|c| c.rate(pooled))
            .fold(pooled, f64::max);
        let n = best_draft(best, self.row_cost(), k);
        if n == 0 && k > 0 && self.count_decline() {
            self.probe = true;
            return 1;
        }
        n
    }

    /// A window of `class` verified `drafted` drafts, accepting `accepted` of them.
    pub fn record_window(&mut self, class: usize, drafted: usize, accepted: usize) {
        self.declined = 0;
        if self.classes.len() <= class {
            self.classes.resize(class + 1, ClassStats::default());
        }
        self.windows_in_a_row += 1;
        self.classes[class].record(drafted, accepted);
        self.pooled.record(drafted, accepted);
    }

    /// Whether the next step should be a plain one, to time it: none was timed yet (the
    /// cost of a row is relative to it), or not for a long time.
    pub fn wants_plain_step(&self) -> bool {
        self.step_s.0.is_empty() || self.windows_in_a_row >= STEP_EVERY
    }

    /// A plain step took `t`.
    pub fn record_step(&mut self, t: Duration) {
        self.windows_in_a_row = 0;
        if std::mem::replace(&mut self.step_warmed_up, true) {
            self.step_s.push(t.as_secs_f64());
        }
    }

    /// A window of `drafted` drafts took `t` (drafting, verifying and accepting).
    pub fn record_window_time(&mut self, drafted: usize, t: Duration) {
        let Some(step) = self.step_s.median() else {
            return;
        };
        let bit = 1u64 << drafted.min(63);
        let seen = self.warmed_up & bit != 0;
        self.warmed_up |= bit;
        if drafted == 0 || !seen {
            return;
        }
        let extra = ((t.as_secs_f64() - step) / drafted as f64).max(0.0);
        self.row_s.push(extra);
    }
}

/// The `d` in 1..=`available` that maximises expected tokens per unit of time, a window
/// of `d` drafts yielding `1 + a + a^2 + ... + a^d` tokens (each draft accepted with
/// chance `a` once its predecessors were, then the bonus token) for a cost of
/// `1 + row_cost * d` steps; 0 when none beats a plain step.
pub fn best_draft(a: f64, row_cost: f64, available: usize) -> usize {
    let (mut best, mut best_gain) = (0, MARGIN);
    let (mut tokens, mut p) = (1.0, 1.0);
    for d in 1..=available {
        p *= a;
        tokens += p;
        let gain = tokens / (1.0 + row_cost * d as f64);
        if gain > best_gain {
            (best, best_gain) = (d, gain);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_only_when_it_pays() {
        // Cheap rows and likely drafts: all of them.
        assert_eq!(best_draft(0.95, 0.05, 4), 4);
        // Unlikely drafts at half a step per row: none.
        assert_eq!(best_draft(0.1, 0.5, 4), 0);
        assert_eq!(best_draft(0.9, 0.5, 0), 0);
        // Break-even: one draft at a = c yields 1 + a tokens for 1 + a steps.
        assert_eq!(best_draft(0.5, 0.5, 1), 0);
        assert_eq!(best_draft(0.6, 0.5, 1), 1);
    }

    #[test]
    fn failed_windows_turn_a_class_off_and_others_stay_on() {
        let mut b = BackOff::new();
        assert!(b.wants_plain_step(), "the step cost is measured first");
        b.record_step(Duration::from_millis(500));
        assert!(
            b.wants_plain_step(),
            "the first step captures a graph: not timed"
        );
        b.record_step(Duration::from_millis(10));
        assert!(!b.wants_plain_step());
        b.record_window_time(4, Duration::from_millis(300));
        assert_eq!(b.measured_row_cost(), None, "the first window is a warm-up");
        b.record_window_time(4, Duration::from_millis(30));
        assert!((b.row_cost() - 0.5).abs() < 1e-9);
        // A window of another length captures its own graph first: not timed either.
        b.record_window_time(2, Duration::from_millis(400));
        assert!((b.row_cost() - 0.5).abs() < 1e-9);
        assert!(b.drafts_for(1, 4) > 0, "a fresh class is tried");
        for _ in 0..2 {
            b.record_window(1, 4, 0);
        }
        assert_eq!(b.drafts_for(1, 4), 0);
        // A class not seen yet starts from the pooled estimate: off too.
        assert_eq!(b.drafts_for(2, 4), 0);
        for _ in 0..3 {
            b.record_window(5, 4, 4);
        }
        assert_eq!(b.drafts_for(5, 4), 4);
        assert_eq!(b.ask(8), b.drafts_for(5, 8));
        // A declined class is probed with one draft now and then.
        let probes = (0..3 * PROBE_EVERY).filter(|_| b.decide(1, 4) > 0).count();
        assert_eq!(probes, 3);
        // A long run of windows gets a plain step timed again.
        for _ in 0..STEP_EVERY {
            b.record_window(5, 4, 4);
        }
        assert!(b.wants_plain_step());
    }
}
