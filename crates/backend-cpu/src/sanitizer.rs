//! The sanitizer: every access to a buffer is checked, when it runs, against the
//! buffer's last write (and, for writes, the reads since) using vector clocks that only
//! grow through event waits. An access not ordered after a conflicting one on another
//! stream is a hazard naming both call sites. This is independent of core's fence
//! tracking, which is what it checks.

use strata_core::{Hazard, HazardKind, Site};

/// One access: the stream, its position in that stream's executed operations, the site.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    pub stream: u32,
    pub seq: u64,
    pub site: Site,
}

#[derive(Default, Debug)]
pub struct AccessLog {
    pub last_write: Option<Stamp>,
    pub reads: Vec<Stamp>,
}

/// A stream's knowledge of other streams' progress, as in core but measured at run time.
#[derive(Clone, Debug, Default)]
pub struct VClock(pub Vec<u64>);

impl VClock {
    pub fn get(&self, s: u32) -> u64 {
        self.0.get(s as usize).copied().unwrap_or(0)
    }
    pub fn set(&mut self, s: u32, v: u64) {
        let i = s as usize;
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        self.0[i] = self.0[i].max(v);
    }
    pub fn merge(&mut self, o: &VClock) {
        for (i, &v) in o.0.iter().enumerate() {
            self.set(i as u32, v);
        }
    }
    fn covers(&self, stamp: &Stamp, me: u32) -> bool {
        stamp.stream == me || self.get(stamp.stream) >= stamp.seq
    }
}

fn hazard(kind: HazardKind, buffer: u64, now: &Stamp, other: &Stamp) -> Hazard {
    Hazard {
        kind,
        buffer,
        site: now.site.to_string(),
        stream: now.stream,
        other_site: other.site.to_string(),
        other_stream: other.stream,
    }
}

impl AccessLog {
    /// Checks a read by `now` (on a stream whose clock is `clock`) and logs it.
    pub fn read(&mut self, buffer: u64, now: Stamp, clock: &VClock, out: &mut Vec<Hazard>) {
        if let Some(w) = &self.last_write
            && !clock.covers(w, now.stream)
        {
            out.push(hazard(HazardKind::ReadAfterWrite, buffer, &now, w));
        }
        match self.reads.iter_mut().find(|r| r.stream == now.stream) {
            Some(r) => *r = now,
            None => self.reads.push(now),
        }
    }

    /// Checks a write by `now` and logs it.
    pub fn write(&mut self, buffer: u64, now: Stamp, clock: &VClock, out: &mut Vec<Hazard>) {
        if let Some(w) = &self.last_write
            && !clock.covers(w, now.stream)
        {
            out.push(hazard(HazardKind::WriteAfterWrite, buffer, &now, w));
        }
        for r in &self.reads {
            if !clock.covers(r, now.stream) {
                out.push(hazard(HazardKind::WriteAfterRead, buffer, &now, r));
            }
        }
        self.last_write = Some(now);
        self.reads.clear();
    }
}

/// Small, fast generator for the simulated DMA delays (splitmix64).
pub struct DelayRng(u64);

impl DelayRng {
    pub fn new(seed: u64) -> Self {
        DelayRng(seed)
    }
    pub fn next_below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        if n == 0 { 0 } else { z % n }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(stream: u32, seq: u64) -> Stamp {
        Stamp {
            stream,
            seq,
            site: std::panic::Location::caller(),
        }
    }

    #[test]
    fn unordered_read_is_flagged_and_ordered_read_is_not() {
        let mut log = AccessLog::default();
        let mut out = Vec::new();
        log.write(7, stamp(1, 5), &VClock::default(), &mut out);
        assert!(out.is_empty());
        let mut clock = VClock::default();
        log.read(7, stamp(2, 1), &clock, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].kind, HazardKind::ReadAfterWrite);
        out.clear();
        clock.set(1, 5);
        log.read(7, stamp(2, 2), &clock, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn write_after_unordered_read_is_flagged() {
        let mut log = AccessLog::default();
        let mut out = Vec::new();
        log.read(3, stamp(2, 9), &VClock::default(), &mut out);
        log.write(3, stamp(1, 1), &VClock::default(), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].kind, HazardKind::WriteAfterRead);
    }
}
