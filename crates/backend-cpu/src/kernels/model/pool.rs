//! The kernel thread pool: persistent workers that spin briefly on a shared atomic between
//! launches (as ggml's thread pool does) and sleep on a condition variable after that.
//! Decode is hundreds of small launches per token; waking sleeping threads for each (what
//! a rayon pool does) cost more than splitting the work saved.
//!
//! One launch at a time: the caller publishes a job (a task function and a count) and a
//! new `state` word, then claims tasks like every worker. `state` packs the launch number,
//! the task count and the next task index, so a claim is one compare-and-swap that also
//! proves the job it read is still the current one; a worker that wakes late for a
//! finished launch finds nothing to claim. The caller returns once every task it published
//! has finished, so the job (borrowed from the caller's frame) outlives every use.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps. Between the launches of one forward
/// pass the gap is a few microseconds; between decode steps (sampling, the next upload)
/// well under a millisecond.
const SPIN: Duration = Duration::from_millis(2);

/// Bits of the task count and of the next index in `state`.
const INDEX_BITS: u32 = 20;
/// Most tasks one `run` publishes at once; larger counts are run in rounds.
const MAX_TASKS: usize = (1 << INDEX_BITS) - 1;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// A task function with its borrow's lifetime erased (see [`KernelPool::run`]).
type Job = &'static (dyn Fn(usize) + Sync);

fn pack(launch: u64, n: usize, next: usize) -> u64 {
    (launch << (2 * INDEX_BITS)) | ((n as u64) << INDEX_BITS) | next as u64
}

/// (task count, next index) of a state word.
fn unpack(s: u64) -> (usize, usize) {
    (
        ((s >> INDEX_BITS) & INDEX_MASK) as usize,
        (s & INDEX_MASK) as usize,
    )
}

struct Shared {
    /// Launch number (high bits), task count, next unclaimed task index.
    state: AtomicU64,
    /// The current launch's task function; written only while no task is claimable.
    job: UnsafeCell<Option<Job>>,
    /// Tasks of the current launch finished by workers.
    done: AtomicUsize,
    /// A task panicked on a worker during the current launch.
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Workers asleep (or about to be) on `wake`.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written by the one caller holding `KernelPool::caller` while no task of
// the previous launch can still run (all finished) and before the new state is published
// with release ordering; workers read it only after claiming a task of that launch, which
// they acquire through `state`. Everything else is atomic or locked.
unsafe impl Sync for Shared {}

impl Shared {
    /// Claims and runs tasks of the launch in `state` until none are left; returns how
    /// many this thread ran.
    /// A panicking task counts as finished and sets `panicked`.
    fn drain(&self) -> usize {
        let mut ran = 0;
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            let (n, next) = unpack(s);
            if next >= n {
                return ran;
            }
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // SAFETY: task `next` of this launch is claimed and unfinished, so the
                    // caller is still inside `run` and `job` holds its function.
                    let job = unsafe { *self.job.get() };
                    if let Some(f) = job {
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(next)));
                        if r.is_err() {
                            self.panicked.store(true, Ordering::Relaxed);
                        }
                    }
                    ran += 1;
                    s = self.state.load(Ordering::Acquire);
                }
                Err(now) => s = now,
            }
        }
    }

    /// Blocks until `state` differs from `seen` (or shutdown): spins for [`SPIN`], then
    /// sleeps until a caller wakes it.
    fn wait_change(&self, seen: u64) {
        let start = Instant::now();
        loop {
            for _ in 0..256 {
                if self.state.load(Ordering::Relaxed) != seen
                    || self.shutdown.load(Ordering::Relaxed)
                {
                    return;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() > SPIN {
                break;
            }
            // Let any other runnable thread have the core (on a machine with as many busy
            // threads as cores, a spinning worker would otherwise delay the stream threads
            // it is waiting for); with nothing else to run this returns at once.
            std::thread::yield_now();
        }
        let mut guard = self.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.state.load(Ordering::SeqCst) == seen && !self.shutdown.load(Ordering::SeqCst) {
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    fn worker(&self) {
        loop {
            let seen = self.state.load(Ordering::Acquire);
            if self.shutdown.load(Ordering::Acquire) {
                return;
            }
            let ran = self.drain();
            if ran > 0 {
                // Release: the caller's acquire of `done` sees this task's writes.
                self.done.fetch_add(ran, Ordering::Release);
                continue;
            }
            self.wait_change(seen);
        }
    }

    fn wake_sleepers(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            drop(self.sleep_lock.lock().unwrap_or_else(|e| e.into_inner()));
            self.wake.notify_all();
        }
    }
}

/// Persistent kernel threads, shared by every stream of one CPU device.
pub struct KernelPool {
    shared: Arc<Shared>,
    /// Held by the launch using the workers (its value: the last launch number). A second
    /// stream launching meanwhile runs its launch on its own thread instead of waiting.
    caller: Mutex<u64>,
    handles: Vec<JoinHandle<()>>,
}

impl KernelPool {
    /// A pool of `workers` threads (launches also run on the calling thread).
    pub fn new(workers: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut pool = KernelPool {
            shared: shared.clone(),
            caller: Mutex::new(0),
            handles: Vec::with_capacity(workers),
        };
        for i in 0..workers {
            let sh = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("strata-cpu-kernel-{i}"))
                .spawn(move || sh.worker())?;
            // Pushed at once, so a failed spawn still stops the threads already started.
            pool.handles.push(h);
        }
        Ok(pool)
    }

    /// Threads a launch runs on: the workers and the caller.
    pub fn threads(&self) -> usize {
        self.handles.len() + 1
    }

    /// Runs `f(i)` for every `i < n` on the calling thread and the workers; returns when
    /// all have finished. A panic in `f` is reported by a panic here, after every task has
    /// finished.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let Ok(mut launch) = self.caller.try_lock() else {
            // Another stream's launch holds the workers: run this one alone.
            (0..n).for_each(f);
            return;
        };
        let t0 = crate::profile::enabled().then(Instant::now);
        let mut start = 0;
        while start < n {
            let count = (n - start).min(MAX_TASKS);
            if t0.is_some() {
                let timed = |i: usize| {
                    let t = Instant::now();
                    f(start + i);
                    crate::profile::add_task(t.elapsed().as_nanos() as u64);
                };
                self.round(&mut launch, count, &timed);
            } else {
                let offset = |i: usize| f(start + i);
                self.round(&mut launch, count, &offset);
            }
            start += count;
        }
        if let Some(t0) = t0 {
            crate::profile::add_split_launch(t0.elapsed().as_nanos() as u64, self.threads());
        }
    }

    /// One launch of `n <= MAX_TASKS` tasks.
    fn round(&self, launch: &mut u64, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let sh = &*self.shared;
        // SAFETY: only the lifetime is erased. Every task of this round finishes before
        // this function returns (it waits on `done` below, panics included), the
        // previous round's tasks have all finished, and no worker calls `job` without
        // first claiming a task of the round it was written for.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        // SAFETY: no task is claimable (the previous round handed out all of its tasks
        // and they finished), so no worker reads `job` now; see `Shared`'s Sync.
        unsafe { *sh.job.get() = Some(job) };
        sh.done.store(0, Ordering::Relaxed);
        sh.panicked.store(false, Ordering::Relaxed);
        *launch = (*launch + 1) & ((1 << (64 - 2 * INDEX_BITS)) - 1);
        sh.state.store(pack(*launch, n, 0), Ordering::SeqCst);
        sh.wake_sleepers();
        let mine = sh.drain();
        let mut spins = 0u32;
        while sh.done.load(Ordering::Acquire) + mine < n {
            spins += 1;
            if spins < 4096 {
                std::hint::spin_loop();
            } else {
                // A worker holding a task was descheduled (loaded machine): yield to it.
                std::thread::yield_now();
            }
        }
        // SAFETY: every task has finished; drop the borrowed function.
        unsafe { *sh.job.get() = None };
        if sh.panicked.load(Ordering::Relaxed) {
            panic!("a CPU kernel task panicked");
        }
    }
}

impl Drop for KernelPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        drop(
            self.shared
                .sleep_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        self.shared.wake.notify_all();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Physical cores this process may use: distinct (package, core) pairs of
/// /proc/cpuinfo, at most the CPUs it may run on; those CPUs where that is unknown.
/// Matrix-vector work is bound by memory and FMA units, which SMT siblings share.
pub fn default_threads() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let physical = std::fs::read_to_string("/proc/cpuinfo").ok().map(|info| {
        let mut cores = std::collections::BTreeSet::new();
        let mut package = "";
        for line in info.lines() {
            let mut kv = line.splitn(2, ':').map(str::trim);
            match (kv.next(), kv.next()) {
                (Some("physical id"), Some(v)) => package = v,
                (Some("core id"), Some(v)) => {
                    cores.insert((package.to_string(), v.to_string()));
                }
                _ => {}
            }
        }
        cores.len()
    });
    match physical {
        Some(p) if p > 0 => p.min(logical),
        _ => logical,
    }
}

/// The kernel pool for `threads` threads (`None`: [`default_threads`]), counting the
/// stream thread that launches: `threads - 1` workers; no pool for one thread.
pub fn thread_pool(threads: Option<usize>) -> Result<Option<KernelPool>, String> {
    let n = threads.unwrap_or_else(default_threads).max(1);
    if n == 1 {
        return Ok(None);
    }
    KernelPool::new(n - 1)
        .map(Some)
        .map_err(|e| format!("cannot start {n} kernel threads: {e}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_task_runs_once_across_many_launches() {
        let pool = KernelPool::new(3).unwrap();
        for n in [0usize, 1, 2, 7, 64, 1000] {
            for _ in 0..50 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "n = {n}"
                );
            }
        }
    }

    #[test]
    fn sleeping_workers_wake_for_the_next_launch() {
        let pool = KernelPool::new(2).unwrap();
        std::thread::sleep(SPIN * 3);
        let hits: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        let threads = Mutex::new(std::collections::BTreeSet::new());
        pool.run(100, &|i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
            threads
                .lock()
                .unwrap()
                .insert(format!("{:?}", std::thread::current().id()));
            std::thread::sleep(Duration::from_micros(200));
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        assert!(threads.lock().unwrap().len() > 1, "the workers never woke");
    }

    #[test]
    fn concurrent_callers_each_finish_their_launch() {
        let pool = KernelPool::new(2).unwrap();
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let sum = AtomicUsize::new(0);
                        pool.run(33, &|i| {
                            sum.fetch_add(i, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 33 * 32 / 2);
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_task_is_reported_after_the_launch_and_the_pool_still_works() {
        let pool = KernelPool::new(2).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(16, &|i| {
                if i == 5 {
                    panic!("task 5");
                }
            });
        }));
        assert!(r.is_err());
        let sum = AtomicUsize::new(0);
        pool.run(10, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 45);
    }
}
