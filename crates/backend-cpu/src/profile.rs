//! Opt-in timing of the CPU backend (`STRATA_KERNEL_TIMING=1`, as on CUDA): the stream
//! thread's wall time in each kernel (`Device::kernel_times`), and how busy the kernel
//! threads were during split launches ([`pool_utilisation`]), to tell a launch's work from
//! what surrounds it (hand-offs between the host and the stream thread, the wait at the
//! end of a split launch for its last task). Off, it costs one relaxed load a launch.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use strata_core::{KernelId, KernelTime};

/// Whether `STRATA_KERNEL_TIMING=1` (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("STRATA_KERNEL_TIMING").is_ok_and(|v| v == "1"))
}

/// One device's kernel times since the last [`KernelTimes::take`].
#[derive(Default)]
pub struct KernelTimes {
    by_kernel: Mutex<HashMap<KernelId, (u64, f64)>>,
}

impl KernelTimes {
    pub fn add(&self, kernel: KernelId, seconds: f64) {
        let mut m = self.by_kernel.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry(kernel).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += seconds;
    }

    /// The times so far (most time first), and a fresh start.
    pub fn take(&self) -> Vec<KernelTime> {
        let m = std::mem::take(&mut *self.by_kernel.lock().unwrap_or_else(|e| e.into_inner()));
        let mut v: Vec<KernelTime> = m
            .into_iter()
            .map(|(kernel, (launches, seconds))| KernelTime {
                kernel,
                function: kernel.name(),
                launches,
                seconds,
                // Core replays CPU graphs op by op: every launch is recorded.
                one_replay: false,
            })
            .collect();
        v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        v
    }
}

/// Split launches of every kernel pool in the process, while timing is on.
static SPLIT_LAUNCHES: AtomicU64 = AtomicU64::new(0);
/// Their wall time times the threads each could use, in nanoseconds.
static THREAD_NS: AtomicU64 = AtomicU64::new(0);
/// Time spent inside their tasks, summed over threads, in nanoseconds.
static BUSY_NS: AtomicU64 = AtomicU64::new(0);

/// How busy the kernel threads were in split launches: launches, thread-seconds
/// available (wall time x threads) and thread-seconds spent in tasks. The rest is
/// dispatch, claiming and the wait for the last task. Process-wide counters, for
/// timing tools (`STRATA_KERNEL_TIMING=1`; all zero otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolUtilisation {
    pub launches: u64,
    pub thread_seconds: f64,
    pub busy_seconds: f64,
}

pub fn pool_utilisation() -> PoolUtilisation {
    PoolUtilisation {
        launches: SPLIT_LAUNCHES.load(Ordering::Relaxed),
        thread_seconds: THREAD_NS.load(Ordering::Relaxed) as f64 * 1e-9,
        busy_seconds: BUSY_NS.load(Ordering::Relaxed) as f64 * 1e-9,
    }
}

/// Adds one split launch of `wall_ns` over `threads` threads.
pub(crate) fn add_split_launch(wall_ns: u64, threads: usize) {
    SPLIT_LAUNCHES.fetch_add(1, Ordering::Relaxed);
    THREAD_NS.fetch_add(wall_ns.saturating_mul(threads as u64), Ordering::Relaxed);
}

/// Adds `ns` spent in one task.
pub(crate) fn add_task(ns: u64) {
    BUSY_NS.fetch_add(ns, Ordering::Relaxed);
}
