//! Fences: how far a stream had got when it touched a buffer. Counters, not events;
//! an event is recorded only when work crosses streams.

use crate::kernel::Access;

/// The point in `stream`'s queue just after one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fence {
    pub stream: u32,
    pub seq: u64,
}

/// The accesses of a buffer that a later access may have to wait for: the last write,
/// and the reads since it (at most one per stream, the latest).
#[derive(Debug, Default)]
pub(crate) struct BufferFences {
    pub last_write: Option<Fence>,
    pub reads: Vec<Fence>,
}

impl BufferFences {
    /// The fences an access of kind `access` must be ordered after.
    pub fn dependencies(&self, access: Access, out: &mut Vec<Fence>) {
        if let Some(w) = self.last_write {
            out.push(w);
        }
        if access.writes() {
            out.extend(self.reads.iter().copied());
        }
    }

    /// Notes that `fence` performed `access`.
    pub fn record(&mut self, access: Access, fence: Fence) {
        if access.writes() {
            self.last_write = Some(fence);
            self.reads.clear();
        } else {
            match self.reads.iter_mut().find(|r| r.stream == fence.stream) {
                Some(r) => r.seq = r.seq.max(fence.seq),
                None => self.reads.push(fence),
            }
        }
    }

    /// Every fence still relevant to freeing the buffer.
    pub fn all(&self) -> Vec<Fence> {
        let mut v: Vec<Fence> = self.last_write.into_iter().collect();
        v.extend(self.reads.iter().copied());
        v
    }
}

/// A stream's vector clock: for every stream, the last of its operations this one is
/// known to be ordered after.
#[derive(Clone, Debug, Default)]
pub(crate) struct Clock(pub Vec<u64>);

impl Clock {
    pub fn get(&self, stream: u32) -> u64 {
        self.0.get(stream as usize).copied().unwrap_or(0)
    }
    pub fn set_max(&mut self, stream: u32, seq: u64) {
        let i = stream as usize;
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        self.0[i] = self.0[i].max(seq);
    }
    pub fn merge(&mut self, other: &Clock) {
        for (i, &s) in other.0.iter().enumerate() {
            self.set_max(i as u32, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_waits_for_reads_and_the_last_write() {
        let mut f = BufferFences::default();
        f.record(Access::Write, Fence { stream: 0, seq: 1 });
        f.record(Access::Read, Fence { stream: 1, seq: 4 });
        f.record(Access::Read, Fence { stream: 1, seq: 6 });
        f.record(Access::Read, Fence { stream: 2, seq: 2 });
        let mut deps = Vec::new();
        f.dependencies(Access::Read, &mut deps);
        assert_eq!(deps, vec![Fence { stream: 0, seq: 1 }]);
        deps.clear();
        f.dependencies(Access::Write, &mut deps);
        assert_eq!(deps.len(), 3);
        assert!(deps.contains(&Fence { stream: 1, seq: 6 }));
        f.record(Access::ReadWrite, Fence { stream: 2, seq: 3 });
        assert!(f.reads.is_empty());
        assert_eq!(f.last_write, Some(Fence { stream: 2, seq: 3 }));
    }
}
