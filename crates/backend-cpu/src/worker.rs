//! A stream is a worker thread running its queue in order; an event is a position in a
//! stream's queue. Waits between streams block the waiting worker, as a GPU stream would.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::sanitizer::VClock;

/// What a job sees of its stream: its index, how many jobs ran before, its clock.
pub struct JobCtx {
    pub stream: u32,
    /// Position of the running job in the stream (1-based).
    pub seq: u64,
    pub clock: VClock,
}

pub type Job = Box<dyn FnOnce(&mut JobCtx) + Send>;

/// Most jobs a stream holds before [`StreamWorker::push`] waits for it (a decode step's
/// graph is one job; a 192-token prefill pass of SmolLM2 ~1000 launches).
pub const MAX_PENDING: u64 = 1024;

/// Jobs finished so far, with a condvar for waiters (shared with the thread; the
/// thread must not own the worker, or dropping the worker could never stop it).
#[derive(Default)]
struct Progress {
    done: Mutex<Done>,
    cv: Condvar,
    /// `done.count`, published after each job (release) for waiters that poll.
    finished: AtomicU64,
}

/// The finished-job count and the smallest count a waiter sleeps for, so the thread
/// wakes waiters once when their job is done, not after every job (a decode step is
/// hundreds of launches; a wake-up each cost a context switch of the waiting host).
#[derive(Default)]
struct Done {
    count: u64,
    /// Smallest target of the sleeping waiters; 0 when none sleeps.
    wanted: u64,
}

/// How long an idle stream polls its queue before it sleeps: the device's
/// `CpuOptions::stream_spin_us` (`CpuOptions::from_env` reads `STRATA_CPU_STREAM_SPIN_US`),
/// none by default. Waking a sleeping stream thread cost ~9 us of a 22 us
/// upload-and-download round trip on a 2-core VM; a CPU pool whose stream gets its next
/// layer every few hundred microseconds skips that, at a core spent polling while the GPU
/// part of the layer runs.
pub fn idle_spin(us: Option<u64>) -> Duration {
    Duration::from_micros(us.unwrap_or(0).min(10_000))
}

/// How long a host waiting on a polling stream (one with an idle spin, the CPU pool's)
/// polls its finished count before it sleeps: `STRATA_CPU_HOST_POLL_US` (at most 100 ms),
/// none by default. Polling skips the futex wake-up (on the 2-vCPU EPYC the pool device's
/// upload-and-download round trip went 13.0 -> 7.5 us), but the polling host is one more
/// runnable thread beside the pool's: on that VM under load (load average 4.5) a pool
/// layer at 1 thread took a median 1.7-2.9 ms instead of 1.03 ms in 3 of 5 alternating
/// runs, so it stays off until a 16-core host shows it pays.
fn host_poll(spin: Duration) -> Duration {
    static US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let us = *US.get_or_init(|| {
        std::env::var("STRATA_CPU_HOST_POLL_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    });
    if spin.is_zero() {
        Duration::ZERO
    } else {
        Duration::from_micros(us.min(100_000))
    }
}

/// The next job, polled for up to `spin` (yielding now and then, so a loaded machine's
/// other threads run) before sleeping on the channel; `None` once the channel is closed.
fn next_job(rx: &Receiver<Job>, spin: Duration) -> Option<Job> {
    if !spin.is_zero() {
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                match rx.try_recv() {
                    Ok(job) => return Some(job),
                    Err(TryRecvError::Disconnected) => return None,
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                }
            }
            if start.elapsed() > spin {
                break;
            }
            std::thread::yield_now();
        }
    }
    rx.recv().ok()
}

pub struct StreamWorker {
    sender: Mutex<Option<Sender<Job>>>,
    /// How long a host waiting for this stream polls before it sleeps ([`host_poll`]).
    host_poll: Duration,
    /// Jobs queued so far.
    queued: Mutex<u64>,
    progress: Arc<Progress>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl StreamWorker {
    /// A stream thread that polls its queue for `spin` before it sleeps when idle.
    pub fn spawn(index: u32, spin: Duration) -> std::io::Result<Arc<Self>> {
        let (tx, rx) = channel::<Job>();
        let worker = Arc::new(StreamWorker {
            sender: Mutex::new(Some(tx)),
            host_poll: host_poll(spin),
            queued: Mutex::new(0),
            progress: Arc::new(Progress::default()),
            thread: Mutex::new(None),
        });
        let progress = worker.progress.clone();
        let handle = std::thread::Builder::new()
            .name(format!("strata-cpu-stream-{index}"))
            .spawn(move || {
                let mut ctx = JobCtx {
                    stream: index,
                    seq: 0,
                    clock: VClock::default(),
                };
                while let Some(job) = next_job(&rx, spin) {
                    ctx.seq += 1;
                    ctx.clock.set(index, ctx.seq);
                    // A panicking kernel must not wedge the stream: count it done anyway.
                    let r =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut ctx)));
                    if r.is_err() {
                        tracing::error!("a job on CPU stream {index} panicked");
                    }
                    let mut d = progress.done.lock().unwrap_or_else(|e| e.into_inner());
                    d.count += 1;
                    // Release: a poller that reads this count sees the job's writes.
                    progress.finished.store(d.count, Ordering::Release);
                    if d.wanted != 0 && d.count >= d.wanted {
                        d.wanted = 0;
                        progress.cv.notify_all();
                    }
                }
            })?;
        *worker.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        Ok(worker)
    }

    /// Queues `job`; returns its position (1-based). When the stream is more than
    /// [`MAX_PENDING`] jobs behind, first waits until it is half that: a prompt's micro-
    /// batches are queued in one go, and each launch holds its arguments and buffer
    /// references until it runs (512 tokens in passes of 64 held ~1 MB). Waiting cannot
    /// deadlock: a queued job only ever waits for jobs queued before it.
    pub fn push(&self, job: Job) -> u64 {
        let queued = self.queued();
        if queued > self.done() + MAX_PENDING {
            self.wait_until(queued - MAX_PENDING / 2);
        }
        let mut q = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = sender.as_ref()
            && s.send(job).is_ok()
        {
            *q += 1;
        }
        *q
    }

    pub fn queued(&self) -> u64 {
        *self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn done(&self) -> u64 {
        self.progress.finished.load(Ordering::Acquire)
    }

    /// Blocks until at least `target` jobs have finished: polls first on a polling
    /// stream (see [`host_poll`]), then sleeps.
    pub fn wait_until(&self, target: u64) {
        if !self.host_poll.is_zero() && self.poll_until(target) {
            return;
        }
        let mut d = self.progress.done.lock().unwrap_or_else(|e| e.into_inner());
        while d.count < target {
            // Woken when the smallest target is reached: every waiter then re-registers.
            if d.wanted == 0 || target < d.wanted {
                d.wanted = target;
            }
            d = self.progress.cv.wait(d).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Polls the finished-job count for up to `host_poll` (yielding now and then, so the
    /// stream and kernel threads keep their cores on a loaded machine); true once at
    /// least `target` jobs have finished.
    fn poll_until(&self, target: u64) -> bool {
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                if self.done() >= target {
                    return true;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() > self.host_poll {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Waits for every queued job.
    pub fn drain(&self) {
        self.wait_until(self.queued());
    }
}

impl Drop for StreamWorker {
    fn drop(&mut self) {
        self.sender.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

/// A recorded position in a stream, with that stream's clock there (filled in when the
/// marker job runs) so waiters inherit what it had waited for.
pub struct EventState {
    pub worker: Arc<StreamWorker>,
    pub target: u64,
    pub clock: Arc<Mutex<Option<VClock>>>,
}

impl EventState {
    pub fn done(&self) -> bool {
        self.worker.done() >= self.target
    }
    pub fn wait(&self) {
        self.worker.wait_until(self.target);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A host waiting on a polling stream returns once its job has finished and sees
    /// what the job wrote, whether the job ends while it polls (short jobs) or after it
    /// has gone to sleep (longer than the poll).
    #[test]
    fn a_polling_wait_returns_after_the_job_with_its_writes() {
        let mut w = StreamWorker::spawn(0, Duration::from_micros(100)).unwrap();
        // As with STRATA_CPU_HOST_POLL_US=2000.
        Arc::get_mut(&mut w).unwrap().host_poll = Duration::from_millis(2);
        for (i, sleep_us) in [0u64, 50, 300, 5_000, 0, 3_000].into_iter().enumerate() {
            let cell = Arc::new(Mutex::new(None));
            let c = cell.clone();
            let target = w.push(Box::new(move |_| {
                std::thread::sleep(Duration::from_micros(sleep_us));
                *c.lock().unwrap() = Some(i);
            }));
            w.wait_until(target);
            assert!(w.done() >= target);
            assert_eq!(*cell.lock().unwrap(), Some(i), "job {i} ({sleep_us} us)");
        }
    }

    /// While the stream is stuck on a slow job, `push` holds the queue to at most
    /// `MAX_PENDING` jobs behind (it would queue all of them at once otherwise), and every
    /// job still runs, in order.
    #[test]
    fn push_waits_while_the_stream_is_far_behind() {
        let w = StreamWorker::spawn(0, Duration::ZERO).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        w.push(Box::new(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50))
        }));
        let n = 3 * MAX_PENDING;
        for i in 0..n {
            let o = order.clone();
            w.push(Box::new(move |_| o.lock().unwrap().push(i)));
            assert!(w.queued() - w.done() <= MAX_PENDING + 1, "job {i}");
        }
        w.drain();
        assert_eq!(*order.lock().unwrap(), (0..n).collect::<Vec<_>>());
    }
}
