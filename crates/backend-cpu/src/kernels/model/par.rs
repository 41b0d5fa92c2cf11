//! How the model ops split work over the device's kernel threads. A launch is split
//! only when it has enough work to repay handing it out (about a microsecond with the
//! spinning pool below); small ops (decode-time norms, adds) run on the stream thread.
//!
//! The stream thread works too: a pool for N threads has N - 1 workers, and the caller
//! and the workers claim task indices from one shared counter, so a launch never waits
//! for a sleeping worker before making progress (on a loaded machine the caller may end
//! up doing most of the work itself, which is then no slower than one thread).
//!
//! Splitting never changes a result: every task computes whole output elements in the
//! order one thread would.

use std::sync::Mutex;

pub use super::pool::KernelPool;

/// Work units (about one multiply-add each) below which a launch stays on one thread.
/// Handing a launch to spinning workers costs about a microsecond (tens of thousands of
/// multiply-adds), so only tiny ops stay on the stream thread.
const MIN_PARALLEL_WORK: usize = 32 * 1024;
/// Work units below which a task is not split further.
pub(super) const MIN_TASK_WORK: usize = 16 * 1024;
/// Tasks per thread, so that uneven tasks (experts, causal spans) still balance.
const TASKS_PER_THREAD: usize = 4;

/// Threads a launch may use: the pool's workers and the calling thread.
pub fn threads(pool: Option<&KernelPool>) -> usize {
    pool.map_or(1, KernelPool::threads)
}

/// Work of one task when `total` units are split over the pool: `usize::MAX` (one task)
/// when the whole is too small to repay the split, otherwise enough tasks to balance the
/// pool, none tiny.
pub fn task_work(pool: Option<&KernelPool>, total: usize) -> usize {
    let threads = threads(pool);
    if threads == 1 || total < MIN_PARALLEL_WORK {
        return usize::MAX;
    }
    (total / (threads * tasks_per_thread())).max(MIN_TASK_WORK)
}

/// [`TASKS_PER_THREAD`], or `STRATA_CPU_TASKS_PER_THREAD` (1 to 64) for A/B timing of how
/// finely launches are split (a decode step's expert products are memory-bound: finer
/// tasks shorten the wait for the last one, at a claim each).
fn tasks_per_thread() -> usize {
    static TASKS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *TASKS.get_or_init(|| {
        std::env::var("STRATA_CPU_TASKS_PER_THREAD")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(TASKS_PER_THREAD, |n| n.clamp(1, 64))
    })
}

/// Items per task for `n` items of `work` units each (see [`task_work`]).
pub fn items_per_task(pool: Option<&KernelPool>, n: usize, work: usize) -> usize {
    let work = work.max(1);
    let per_task = task_work(pool, n.saturating_mul(work));
    (per_task / work).clamp(1, n.max(1))
}

/// Runs `f(i)` for every `i < n`: shared with the pool when there is one and `n > 1`.
pub fn for_each(pool: Option<&KernelPool>, n: usize, f: impl Fn(usize) + Send + Sync) {
    match pool {
        Some(p) if n > 1 => p.run(n, &f),
        _ => (0..n).for_each(f),
    }
}

/// `data` in `chunk`-element pieces that tasks borrow mutably by index.
struct Chunks<'a, T> {
    ptr: *mut T,
    len: usize,
    chunk: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: pieces are handed out by index, each index once (see `get`); T: Send.
unsafe impl<T: Send> Sync for Chunks<'_, T> {}

impl<'a, T> Chunks<'a, T> {
    fn new(data: &'a mut [T], chunk: usize) -> Self {
        Chunks {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            chunk,
            _borrow: std::marker::PhantomData,
        }
    }

    fn count(&self) -> usize {
        self.len.div_ceil(self.chunk)
    }

    /// Piece `i`.
    ///
    /// # Safety
    /// Each `i` may be taken once while the pieces are shared.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, i: usize) -> &mut [T] {
        let start = (i * self.chunk).min(self.len);
        let end = (start + self.chunk).min(self.len);
        // SAFETY: start..end lies inside the borrowed slice; pieces do not overlap and
        // each is handed out once (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), end - start) }
    }
}

/// Runs `f(i, chunk)` over the `chunk`-element pieces of `data` (the last may be shorter).
pub fn for_each_chunk<T: Send>(
    pool: Option<&KernelPool>,
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Send + Sync,
) {
    let chunk = chunk.max(1);
    match pool {
        Some(p) if data.len() > chunk => {
            let pieces = Chunks::new(data, chunk);
            // SAFETY: the pool hands out each index once.
            p.run(pieces.count(), &|i| f(i, unsafe { pieces.get(i) }));
        }
        _ => data
            .chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c)),
    }
}

/// [`for_each_chunk`] for a fallible `f`; the first error is returned.
pub fn try_for_each_chunk<T: Send>(
    pool: Option<&KernelPool>,
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) -> Result<(), String> + Send + Sync,
) -> Result<(), String> {
    let chunk = chunk.max(1);
    match pool {
        Some(p) if data.len() > chunk => {
            let pieces = Chunks::new(data, chunk);
            let first_error = Mutex::new(None);
            p.run(pieces.count(), &|i| {
                // SAFETY: the pool hands out each index once.
                if let Err(e) = f(i, unsafe { pieces.get(i) }) {
                    first_error
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(e);
                }
            });
            first_error
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .map_or(Ok(()), Err)
        }
        _ => data
            .chunks_mut(chunk)
            .enumerate()
            .try_for_each(|(i, c)| f(i, c)),
    }
}

/// An output that tasks write in disjoint pieces which are not contiguous chunks (a
/// column block of a row-major matrix), so it cannot be split with `chunks_mut`.
pub struct DisjointOut<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: DisjointOut only hands out element writes through `write`, whose callers
// guarantee that no two tasks write the same index; T: Send moves values across threads.
unsafe impl<T: Send> Send for DisjointOut<'_, T> {}
// SAFETY: as above; shared references only allow `write`, to disjoint indices.
unsafe impl<T: Send> Sync for DisjointOut<'_, T> {}

impl<'a, T> DisjointOut<'a, T> {
    pub fn new(data: &'a mut [T]) -> Self {
        DisjointOut {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Writes `value` at `index`.
    ///
    /// # Safety
    /// No other task may read or write `index` while the output is shared.
    #[inline]
    pub unsafe fn write(&self, index: usize, value: T) {
        assert!(
            index < self.len,
            "DisjointOut index {index} >= {}",
            self.len
        );
        // SAFETY: in bounds (asserted); exclusive per the caller's contract; the slice
        // this was made from stays borrowed for 'a.
        unsafe { self.ptr.add(index).write(value) }
    }

    /// Writes `values` at `index..index + values.len()`.
    ///
    /// # Safety
    /// No other task may read or write those indices while the output is shared.
    #[inline]
    pub unsafe fn write_slice(&self, index: usize, values: &[T])
    where
        T: Copy,
    {
        assert!(
            index
                .checked_add(values.len())
                .is_some_and(|end| end <= self.len),
            "DisjointOut range {index}+{} > {}",
            values.len(),
            self.len
        );
        // SAFETY: in bounds (asserted); exclusive per the caller's contract; `values`
        // cannot overlap the output, which is borrowed mutably for 'a.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.ptr.add(index), values.len()) }
    }

    /// The elements `index..index + len`.
    ///
    /// # Safety
    /// No other task may write those indices while the slice lives.
    #[inline]
    pub unsafe fn slice(&self, index: usize, len: usize) -> &[T] {
        self.check(index, len);
        // SAFETY: in bounds (checked); no concurrent writer per the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.add(index), len) }
    }

    /// The elements `index..index + len`, mutably.
    ///
    /// # Safety
    /// No other task may read or write those indices while the slice lives.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, index: usize, len: usize) -> &mut [T] {
        self.check(index, len);
        // SAFETY: in bounds (checked); exclusive per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(index), len) }
    }

    fn check(&self, index: usize, len: usize) {
        assert!(
            index.checked_add(len).is_some_and(|end| end <= self.len),
            "DisjointOut range {index}+{len} > {}",
            self.len
        );
    }
}
