//! Ordered uploads and downloads. Host data goes through pinned staging owned by core,
//! which is reused only after the copy's event completed, so the caller's slice is free
//! as soon as `upload` returns.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::backend::{RawEvent, RawPinned};
use crate::buffer::{DeviceBuffer, PinnedBuffer};
use crate::device::{Device, Inner, Staging, State, Stream};
use crate::error::{Error, Result, Site};
use crate::kernel::Access;

const MIN_STAGING: usize = 64 * 1024;
/// Host copies into staging of at least this many bytes per thread are split over threads.
const PARALLEL_COPY_CHUNK: usize = 4 << 20;
/// At most this many threads copy one upload into staging.
const PARALLEL_COPY_THREADS: usize = 8;

/// Copies each `(offset, bytes)` part to `dst + offset` (the parts laid end to end from
/// 0), on several threads when they are large together: one thread's memcpy from a
/// memory-mapped file reaches ~6 GB/s, far below a PCIe 5 link, and a long prefill that
/// streams each layer's experts (hundreds of MB a layer) would wait on that copy rather
/// than on the bus.
///
/// # Safety
/// `dst` must be valid for writes of the parts' total length and overlap none of them.
unsafe fn host_copy_parts(dst: *mut u8, parts: &[(usize, &[u8])]) {
    let total: usize = parts.iter().map(|(_, b)| b.len()).sum();
    // Asked once: available_parallelism() reads cgroup files (50-130 us a call measured),
    // and small uploads (a decode step's activations) come many to a token.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let threads = if total < 2 * PARALLEL_COPY_CHUNK {
        1
    } else {
        let cores =
            *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        cores
            .min(PARALLEL_COPY_THREADS)
            .min(total / PARALLEL_COPY_CHUNK)
    };
    // Raw pointers are not Send; the address is, and each thread writes its own range.
    let base = dst as usize;
    // Copies the bytes [lo, hi) of the parts' concatenation.
    let copy_span = move |lo: usize, hi: usize| {
        for &(at, bytes) in parts {
            let (a, b) = (at.max(lo), (at + bytes.len()).min(hi));
            if a < b {
                // SAFETY: inside the caller's destination; spans of different calls
                // are disjoint.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr().add(a - at),
                        (base + a) as *mut u8,
                        b - a,
                    )
                };
            }
        }
    };
    if threads <= 1 {
        copy_span(0, total);
        return;
    }
    let chunk = total.div_ceil(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || copy_span(t * chunk, ((t + 1) * chunk).min(total)));
        }
    });
}

impl Device {
    /// Pinned host memory of `len` elements, zeroed.
    #[track_caller]
    pub fn alloc_pinned<T: bytemuck::Pod>(&self, len: usize) -> Result<PinnedBuffer<T>> {
        let site = std::panic::Location::caller();
        let st = self.inner.lock();
        self.inner
            .refuse_during_capture(&st, "pinned allocation", site)?;
        drop(st);
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        let raw = self.inner.backend.alloc_pinned(bytes.max(1))?;
        Ok(PinnedBuffer::new(self.inner.clone(), raw, len))
    }

    /// A new buffer holding `data`, uploaded on `stream`.
    #[track_caller]
    pub fn alloc_from<T: bytemuck::Pod>(
        &self,
        data: &[T],
        stream: Stream,
    ) -> Result<DeviceBuffer<T>> {
        let buf = self.alloc(data.len())?;
        self.upload(&buf, data, stream)?;
        Ok(buf)
    }

    /// Writes `data` to the start of `dst` on `stream`, ordered after every earlier access
    /// of `dst`; every later access on any stream is ordered after it.
    #[track_caller]
    pub fn upload<T: bytemuck::Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        data: &[T],
        stream: Stream,
    ) -> Result<()> {
        self.upload_at(dst, 0, data, stream)
    }

    /// Writes `data` to `dst[offset..]` on `stream` (ordered as [`Device::upload`]).
    #[track_caller]
    pub fn upload_at<T: bytemuck::Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        offset: usize,
        data: &[T],
        stream: Stream,
    ) -> Result<()> {
        self.upload_ranges(dst, &[(offset, data)], stream)
    }

    /// Writes each `(offset, data)` piece into `dst[offset..]` on `stream`, as one upload
    /// (ordered as [`Device::upload`]). A piece inside host memory registered with
    /// [`Device::register_host`] goes to the device straight from it; the others are copied
    /// into one staging buffer (by several threads when they are large together), then each
    /// goes over the bus. Dozens of expert matrices bound for cache slots then cost one
    /// parallel host copy, or none, instead of a single-threaded memcpy each.
    #[track_caller]
    pub fn upload_ranges<T: bytemuck::Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        pieces: &[(usize, &[T])],
        stream: Stream,
    ) -> Result<()> {
        let site = std::panic::Location::caller();
        self.inner.check_stream(stream, site)?;
        self.inner.check_owner(dst.state(), site)?;
        dst.check_writable(site)?;
        for (offset, data) in pieces {
            dst.check_range("upload", *offset, data.len(), site)?;
        }
        if pieces.is_empty() {
            return Ok(());
        }
        let size = std::mem::size_of::<T>();
        let mut st = self.inner.lock();
        self.inner.refuse_during_capture(&st, "upload", site)?;
        self.inner.collect(&mut st);
        // Each piece's copy: (destination byte, source, byte in the source, bytes), the
        // source a registered region, or staging (filled below).
        let mut copies = Vec::with_capacity(pieces.len());
        let mut staged = Vec::new();
        let (mut direct_bytes, mut staged_bytes) = (0, 0);
        for (offset, data) in pieces {
            let bytes: &[u8] = bytemuck::cast_slice(data);
            let found = st
                .registered
                .iter()
                .enumerate()
                .find_map(|(r, reg)| reg.offset_of(bytes).map(|at| (r, at)));
            let (source, at) = match found {
                Some((r, at)) => {
                    direct_bytes += bytes.len();
                    (Some(r), at)
                }
                None => {
                    staged.push((staged_bytes, bytes));
                    staged_bytes += bytes.len();
                    (None, staged_bytes - bytes.len())
                }
            };
            copies.push((offset * size, source, at, bytes.len()));
        }
        let slot = if staged.is_empty() {
            None
        } else {
            let slot = self.inner.staging_slot(&mut st, staged_bytes)?;
            // SAFETY: the slot is idle (its last copy's event completed) and large enough.
            unsafe { host_copy_parts(st.staging[slot].pinned.ptr, &staged) };
            Some(slot)
        };
        let accesses = [(dst.state().clone(), Access::Write)];
        self.inner.order(&mut st, stream.index, &accesses)?;
        let raw_stream = st.streams[stream.index as usize].raw;
        for &(dst_at, source, at, len) in &copies {
            let src = match (source, slot) {
                (Some(r), _) => &st.registered[r].pinned,
                (None, Some(slot)) => &st.staging[slot].pinned,
                (None, None) => unreachable!("a staged piece has a staging slot"),
            };
            // SAFETY: registered memory is immutable and outlives every copy (it is
            // unregistered only once the device is synchronised, when dropped); staging
            // stays untouched until the event recorded below completes.
            unsafe {
                self.inner.backend.copy_h2d(
                    raw_stream,
                    dst.state().raw,
                    dst_at,
                    src,
                    at,
                    len,
                    site,
                )?
            };
        }
        self.inner.complete(&mut st, stream.index, &accesses);
        st.uploads.direct += direct_bytes as u64;
        st.uploads.staged += staged_bytes as u64;
        if let Some(slot) = slot {
            let ev = self.inner.backend.record_event(raw_stream)?;
            st.staging[slot].busy = Some(ev);
        }
        Ok(())
    }

    /// Uploads `src[range]` from pinned memory into `dst[offset..]` without staging. The
    /// host can touch `src` again only after the copy (`src.host_mut()` waits).
    #[track_caller]
    pub fn upload_pinned<T: bytemuck::Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        offset: usize,
        src: &PinnedBuffer<T>,
        range: std::ops::Range<usize>,
        stream: Stream,
    ) -> Result<()> {
        let site = std::panic::Location::caller();
        self.inner.check_stream(stream, site)?;
        self.inner.check_owner(dst.state(), site)?;
        if !Arc::ptr_eq(&src.device, &self.inner) {
            return Err(Error::ForeignBuffer { site });
        }
        let n = range.end.saturating_sub(range.start);
        if range.start > range.end || range.end > src.len() {
            return Err(Error::OutOfBounds {
                op: "upload_pinned",
                site,
                offset: range.start,
                elements: n,
                len: src.len(),
            });
        }
        dst.check_range("upload_pinned", offset, n, site)?;
        dst.check_writable(site)?;
        let raw_src = src.raw().ok_or(Error::ForeignBuffer { site })?;
        let size = std::mem::size_of::<T>();
        let mut st = self.inner.lock();
        self.inner.refuse_during_capture(&st, "upload", site)?;
        let accesses = [(dst.state().clone(), Access::Write)];
        self.inner.order(&mut st, stream.index, &accesses)?;
        let raw_stream = st.streams[stream.index as usize].raw;
        // SAFETY: `src` cannot be accessed by the host until the event below completes.
        unsafe {
            self.inner.backend.copy_h2d(
                raw_stream,
                dst.state().raw,
                offset * size,
                raw_src,
                range.start * size,
                n * size,
                site,
            )?
        };
        self.inner.complete(&mut st, stream.index, &accesses);
        let ev = self.inner.backend.record_event(raw_stream)?;
        src.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ev);
        Ok(())
    }

    /// Queues a copy of `src` to the host; the value is ready once the returned
    /// [`Pending`] has been waited on.
    #[track_caller]
    pub fn download<T: bytemuck::Pod>(
        &self,
        src: &DeviceBuffer<T>,
        stream: Stream,
    ) -> Result<Pending<T>> {
        self.download_range(src, 0, src.len(), stream)
    }

    /// Queues a copy of `src[offset..offset + len]` to the host (see [`Device::download`]).
    #[track_caller]
    pub fn download_range<T: bytemuck::Pod>(
        &self,
        src: &DeviceBuffer<T>,
        offset: usize,
        len: usize,
        stream: Stream,
    ) -> Result<Pending<T>> {
        let site = std::panic::Location::caller();
        self.inner.check_stream(stream, site)?;
        self.inner.check_owner(src.state(), site)?;
        src.check_range("download", offset, len, site)?;
        let size = std::mem::size_of::<T>();
        let bytes = len * size;
        let mut st = self.inner.lock();
        self.inner.refuse_during_capture(&st, "download", site)?;
        self.inner.collect(&mut st);
        let slot = self.inner.staging_slot(&mut st, bytes)?;
        let accesses = [(src.state().clone(), Access::Read)];
        self.inner.order(&mut st, stream.index, &accesses)?;
        let raw_stream = st.streams[stream.index as usize].raw;
        // SAFETY: the staging slot is removed from the pool until the Pending is done.
        unsafe {
            self.inner.backend.copy_d2h(
                raw_stream,
                &st.staging[slot].pinned,
                0,
                src.state().raw,
                offset * size,
                bytes,
                site,
            )?
        };
        self.inner.complete(&mut st, stream.index, &accesses);
        let event = self.inner.backend.record_event(raw_stream)?;
        let staging = st.staging.swap_remove(slot);
        Ok(Pending {
            inner: self.inner.clone(),
            staging: Some(staging.pinned),
            event: Some(event),
            len,
            site,
            _t: PhantomData,
        })
    }

    /// Copies `src` into the start of pinned `dst`; `dst.host()` waits for it.
    #[track_caller]
    pub fn download_into<T: bytemuck::Pod>(
        &self,
        dst: &PinnedBuffer<T>,
        src: &DeviceBuffer<T>,
        stream: Stream,
    ) -> Result<()> {
        let site = std::panic::Location::caller();
        self.inner.check_stream(stream, site)?;
        self.inner.check_owner(src.state(), site)?;
        if !Arc::ptr_eq(&dst.device, &self.inner) {
            return Err(Error::ForeignBuffer { site });
        }
        if src.len() > dst.len() {
            return Err(Error::OutOfBounds {
                op: "download_into",
                site,
                offset: 0,
                elements: src.len(),
                len: dst.len(),
            });
        }
        let raw_dst = dst.raw().ok_or(Error::ForeignBuffer { site })?;
        let mut st = self.inner.lock();
        self.inner.refuse_during_capture(&st, "download", site)?;
        let accesses = [(src.state().clone(), Access::Read)];
        self.inner.order(&mut st, stream.index, &accesses)?;
        let raw_stream = st.streams[stream.index as usize].raw;
        // SAFETY: host access to dst waits for the event below.
        unsafe {
            self.inner.backend.copy_d2h(
                raw_stream,
                raw_dst,
                0,
                src.state().raw,
                0,
                src.bytes(),
                site,
            )?
        };
        self.inner.complete(&mut st, stream.index, &accesses);
        let ev = self.inner.backend.record_event(raw_stream)?;
        dst.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ev);
        Ok(())
    }

    /// The founding bug, kept for the tests that prove the sanitizer and the hardware
    /// experiment see it: a copy ordered with nothing, and not recorded in any fence.
    #[cfg(feature = "hazard-testing")]
    #[track_caller]
    pub fn upload_unordered<T: bytemuck::Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        data: &[T],
    ) -> Result<()> {
        let site = std::panic::Location::caller();
        dst.check_range("upload_unordered", 0, data.len(), site)?;
        self.inner
            .backend
            .copy_h2d_unordered(dst.state().raw, 0, bytemuck::cast_slice(data), site)
    }
}

impl Inner {
    /// Index of an idle staging buffer of at least `bytes`, allocating one if needed.
    fn staging_slot(&self, st: &mut State, bytes: usize) -> Result<usize> {
        let mut best: Option<(usize, usize)> = None; // (index, capacity): smallest that fits
        for (i, s) in st.staging.iter_mut().enumerate() {
            if s.pinned.len < bytes || best.is_some_and(|(_, cap)| cap <= s.pinned.len) {
                continue;
            }
            if let Some(e) = s.busy {
                if !self.backend.event_done(e)? {
                    continue;
                }
                self.backend.destroy_event(e);
                s.busy = None;
            }
            best = Some((i, s.pinned.len));
        }
        if let Some((i, _)) = best {
            return Ok(i);
        }
        let size = bytes.max(MIN_STAGING).next_power_of_two();
        let pinned = self.backend.alloc_pinned(size)?;
        st.staging.push(Staging { pinned, busy: None });
        Ok(st.staging.len() - 1)
    }

    fn return_staging(&self, pinned: RawPinned) {
        let mut st = self.lock();
        st.staging.push(Staging { pinned, busy: None });
    }
}

/// A download in flight. [`Pending::wait`] blocks until the bytes have arrived.
pub struct Pending<T> {
    inner: Arc<Inner>,
    staging: Option<RawPinned>,
    event: Option<RawEvent>,
    len: usize,
    site: Site,
    _t: PhantomData<T>,
}

impl<T: bytemuck::Pod> Pending<T> {
    pub fn is_ready(&self) -> Result<bool> {
        match self.event {
            Some(e) => self.inner.backend.event_done(e),
            None => Ok(true),
        }
    }

    /// The downloaded values; reports sanitizer findings as an error.
    pub fn wait(mut self) -> Result<Vec<T>> {
        if let Some(e) = self.event.take() {
            let r = self.inner.backend.event_wait(e);
            self.inner.backend.destroy_event(e);
            r?;
        }
        let staging = self
            .staging
            .take()
            .ok_or(Error::ForeignBuffer { site: self.site })?;
        let mut out = vec![T::zeroed(); self.len];
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
        // SAFETY: the copy into staging completed; staging holds at least len elements.
        unsafe { std::ptr::copy_nonoverlapping(staging.ptr, dst.as_mut_ptr(), dst.len()) };
        self.inner.return_staging(staging);
        let mut st = self.inner.lock();
        self.inner.hazards_to_error(&mut st)?;
        Ok(out)
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            let _ = self.inner.backend.event_wait(e);
            self.inner.backend.destroy_event(e);
        }
        if let Some(s) = self.staging.take() {
            self.inner.return_staging(s);
        }
    }
}
