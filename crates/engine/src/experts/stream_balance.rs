//! How many of a decode layer's missing experts go to the device (`--stream-experts auto`):
//! the device computes streamed experts while the CPU pool computes the rest, so the layer
//! ends when the slower side does. After each decode layer the split moves one expert
//! toward the side that finished first: to the device when it was idle for longer than
//! the pool takes for an expert and a half (the margin keeps it from swinging back and
//! forth), back to the pool when the pool finished first. The bus's speed, the pool's
//! cores and the device's load are never modelled; only the finish order is measured.

use std::time::Duration;

/// Decode layers between probes when nothing is streamed and the device has no experts
/// of its own to compare the pool against (no finish order to measure).
const PROBE_EVERY: u32 = 256;

#[derive(Clone, Debug)]
pub(crate) struct StreamBalance {
    n: usize,
    max: usize,
    blind_layers: u32,
}

impl StreamBalance {
    /// Starts by streaming one expert (if `max` allows), up to `max` a layer.
    pub fn new(max: usize) -> Self {
        StreamBalance {
            n: max.min(1),
            max,
            blind_layers: 0,
        }
    }

    /// Experts to stream in the next layer.
    pub fn n(&self) -> usize {
        self.n
    }

    /// One decode layer's outcome: when the device side finished, counted from the pool's
    /// start (`None`: after the pool, or no device side at all when `device_work` is
    /// false), the pool's time, and the experts it computed.
    pub fn observe(
        &mut self,
        device_work: bool,
        device_end: Option<Duration>,
        pool: Duration,
        pool_experts: usize,
    ) {
        if !device_work {
            self.blind_layers += 1;
            if self.blind_layers >= PROBE_EVERY {
                self.blind_layers = 0;
                self.n = self.max.min(1);
            }
            return;
        }
        self.blind_layers = 0;
        match device_end {
            Some(done) => {
                let per_expert = pool / pool_experts.max(1) as u32;
                if pool.saturating_sub(done) > per_expert * 3 / 2 && self.n < self.max {
                    self.n += 1;
                }
            }
            None => self.n = self.n.saturating_sub(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn moves_toward_the_side_that_finished_first_and_settles() {
        // A device side that takes 60 units an expert and a pool that takes 100: a layer
        // of 8 experts ends soonest with 5 streamed (300 against 300).
        let mut b = StreamBalance::new(8);
        assert_eq!(b.n(), 1);
        let mut seen = Vec::new();
        for _ in 0..40 {
            let n = b.n();
            let device = 60 * n as u32;
            let pool = 100 * (8 - n) as u32;
            let device_end = (device <= pool).then_some(MS * device);
            b.observe(true, device_end, MS * pool, 8 - n);
            seen.push(b.n());
        }
        // Up one a layer while the device is idle for more than 150 (at 4: 400 - 240 =
        // 160), then it stays.
        assert_eq!(&seen[..5], &[2, 3, 4, 5, 5]);
        assert!(seen[5..].iter().all(|&n| n == 5), "{seen:?}");
    }

    #[test]
    fn backs_off_when_the_device_is_slower_and_probes_when_blind() {
        let mut b = StreamBalance::new(4);
        b.observe(true, None, MS * 10, 7);
        assert_eq!(b.n(), 0);
        b.observe(true, None, MS * 10, 8);
        assert_eq!(b.n(), 0, "never below none");
        for i in 1..PROBE_EVERY {
            b.observe(false, None, MS * 10, 8);
            assert_eq!(b.n(), 0, "probed after {i} layers");
        }
        b.observe(false, None, MS * 10, 8);
        assert_eq!(b.n(), 1);
        // Never past the maximum.
        let mut b = StreamBalance::new(2);
        for _ in 0..10 {
            b.observe(true, Some(MS), MS * 100, 6);
        }
        assert_eq!(b.n(), 2);
        assert_eq!(StreamBalance::new(0).n(), 0);
    }
}
