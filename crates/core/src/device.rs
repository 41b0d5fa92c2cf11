//! `Device`: the ordered API over any backend. Every operation names the buffers it reads
//! and writes; before it is queued, core makes its stream wait for the conflicting
//! accesses of other streams (recording an event only when work crosses streams).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{
    Backend, Capabilities, DeviceInfo, RawBuffer, RawEvent, RawGraph, RawPinned, RawStream,
};
use crate::buffer::{Args, BufferState, DeviceBuffer};
use crate::error::{Error, Hazard, Result, Site};
use crate::fence::{BufferFences, Clock, Fence};
use crate::kernel::{Access, KernelArg, KernelId, LaunchCfg};

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

/// An ordered queue of device work. Cheap to copy; valid only with its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream {
    pub(crate) index: u32,
    pub(crate) device: u64,
}

impl Stream {
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// Memory as the engine sizes caches from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryReport {
    pub total: usize,
    pub free: usize,
    /// Bytes held by live buffers of this `Device`.
    pub reserved: usize,
}

/// Bytes uploaded so far by [`Device::upload_ranges`] and the uploads built on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadCounts {
    /// Straight from host memory registered with [`Device::register_host`].
    pub direct: u64,
    /// Through a host copy into staging.
    pub staged: u64,
}

pub(crate) struct StreamState {
    pub raw: RawStream,
    /// Operations queued so far; the fence of the latest is `(index, seq)`.
    pub seq: u64,
    pub clock: Clock,
    /// The latest deferred-release event (by `DeferredEvent::order`) seen complete.
    pub released_upto: u64,
}

pub(crate) struct Capture {
    pub stream: u32,
    /// Recorded on the capturing stream just before capture began; other streams that
    /// must wait for its earlier work wait on this (a record during capture would be
    /// captured, not run).
    pub pre_event: RawEvent,
    pub accesses: Vec<(Arc<BufferState>, Access)>,
}

/// Something to release once the device is done with it.
pub(crate) enum Deferred {
    Buffer(RawBuffer, usize),
    Graph(RawGraph),
}

pub(crate) struct DeferredItem {
    pub what: Deferred,
    pub fences: Vec<Fence>,
    pub events: Vec<DeferredEvent>,
}

/// An event recorded on `stream` for a deferred release, the `order`-th such record.
pub(crate) struct DeferredEvent {
    pub raw: RawEvent,
    pub stream: u32,
    pub order: u64,
}

/// Host memory registered with the backend: uploads from inside it skip staging.
pub(crate) struct Registered {
    pub pinned: RawPinned,
    /// Keeps the memory alive (and, being shared, unchanged) while registered.
    pub _memory: Arc<dyn crate::buffer::HostMemory>,
}

impl Registered {
    /// Where `bytes` starts inside this region, when it lies wholly inside.
    pub fn offset_of(&self, bytes: &[u8]) -> Option<usize> {
        let start = bytes.as_ptr() as usize;
        let at = start.checked_sub(self.pinned.ptr as usize)?;
        (at.checked_add(bytes.len())? <= self.pinned.len).then_some(at)
    }
}

pub(crate) struct Staging {
    pub pinned: RawPinned,
    pub busy: Option<RawEvent>,
}

pub(crate) struct State {
    pub streams: Vec<StreamState>,
    pub capture: Option<Capture>,
    /// In the order their events were recorded (see `Inner::collect`).
    pub deferred: Vec<DeferredItem>,
    /// Deferred-release events recorded so far.
    pub deferred_events: u64,
    pub staging: Vec<Staging>,
    pub registered: Vec<Registered>,
    pub uploads: UploadCounts,
    pub reserved: usize,
    pub hazards: Vec<Hazard>,
}

pub(crate) struct Inner {
    pub id: u64,
    /// Test-only mutant: when set, core inserts no cross-stream waits at all.
    pub ordering_disabled: std::sync::atomic::AtomicBool,
    pub backend: Box<dyn Backend>,
    pub info: DeviceInfo,
    pub caps: Capabilities,
    pub state: Mutex<State>,
}

/// A device and its ordered API. Clones share the device.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("info", &self.inner.info)
            .finish()
    }
}

impl Device {
    /// Wraps a backend; creates its first stream (see [`Device::main_stream`]).
    pub fn new(backend: Box<dyn Backend>) -> Result<Self> {
        let info = backend.info();
        let caps = backend.capabilities();
        let raw = backend.create_stream()?;
        let state = State {
            streams: vec![StreamState {
                raw,
                seq: 0,
                clock: Clock::default(),
                released_upto: 0,
            }],
            capture: None,
            deferred: Vec::new(),
            deferred_events: 0,
            staging: Vec::new(),
            registered: Vec::new(),
            uploads: UploadCounts::default(),
            reserved: 0,
            hazards: Vec::new(),
        };
        Ok(Device {
            inner: Arc::new(Inner {
                id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
                ordering_disabled: std::sync::atomic::AtomicBool::new(false),
                backend,
                info,
                caps,
                state: Mutex::new(state),
            }),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    pub fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// The stream created with the device.
    pub fn main_stream(&self) -> Stream {
        Stream {
            index: 0,
            device: self.inner.id,
        }
    }

    pub fn create_stream(&self) -> Result<Stream> {
        let mut st = self.inner.lock();
        let raw = self.inner.backend.create_stream()?;
        st.streams.push(StreamState {
            raw,
            seq: 0,
            clock: Clock::default(),
            released_upto: 0,
        });
        Ok(Stream {
            index: (st.streams.len() - 1) as u32,
            device: self.inner.id,
        })
    }

    pub fn memory(&self) -> Result<MemoryReport> {
        let st = self.inner.lock();
        let m = self.inner.backend.mem_info()?;
        Ok(MemoryReport {
            total: m.total,
            free: m.free,
            reserved: st.reserved,
        })
    }

    /// How the uploads so far went: straight from registered host memory, or staged.
    pub fn upload_counts(&self) -> UploadCounts {
        self.inner.lock().uploads
    }

    /// A buffer of `len` elements; its contents are unspecified until written.
    #[track_caller]
    pub fn alloc<T: bytemuck::Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let site = std::panic::Location::caller();
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(Error::OutOfMemory {
                backend: self.inner.info.backend.name(),
                requested: usize::MAX,
                free: 0,
            })?;
        let mut st = self.inner.lock();
        self.inner.refuse_during_capture(&st, "allocation", site)?;
        self.inner.collect(&mut st);
        let raw = self.inner.backend.alloc(bytes.max(1))?;
        st.reserved += bytes;
        drop(st);
        Ok(DeviceBuffer::new(self.inner.clone(), raw, len))
    }

    /// Whether the backend has `kernel`.
    pub fn supports(&self, kernel: KernelId) -> bool {
        self.inner.backend.supports(kernel)
    }

    /// Borrows `memory[offset..offset + len * size_of::<T>()]` as a read-only device buffer
    /// without copying, where the device reads host memory directly; `Ok(None)` elsewhere
    /// (the caller uploads instead). The buffer keeps `memory` alive.
    #[track_caller]
    pub fn import_host<T: bytemuck::Pod>(
        &self,
        memory: Arc<dyn crate::buffer::HostMemory>,
        offset: usize,
        len: usize,
    ) -> Result<Option<DeviceBuffer<T>>> {
        let site = std::panic::Location::caller();
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        let all = memory.bytes();
        if offset.checked_add(bytes).is_none_or(|end| end > all.len()) {
            return Err(Error::OutOfBounds {
                op: "import_host",
                site,
                offset,
                elements: len,
                len: all.len() / std::mem::size_of::<T>().max(1),
            });
        }
        // SAFETY: in bounds (checked above); the buffer holds `memory`, so the bytes live
        // and, being shared and immutable, stay unchanged until it is freed.
        let raw = unsafe {
            self.inner
                .backend
                .import_host(all.as_ptr().add(offset), bytes)?
        };
        Ok(raw.map(|raw| {
            DeviceBuffer::with_owner(self.inner.clone(), raw, len, Some(memory.clone()))
        }))
    }

    /// Page-locks `memory` (read-only host memory: a mapped model file) for the device, so
    /// that every later upload whose source lies inside it goes straight from it by DMA,
    /// without a host copy into staging. `Ok(false)` where the backend cannot (uploads then
    /// stage as before). The device keeps `memory` alive until it is dropped. Page-locking
    /// touches every page: for a file not yet in the page cache that is a full read.
    pub fn register_host(&self, memory: Arc<dyn crate::buffer::HostMemory>) -> Result<bool> {
        let bytes = memory.bytes();
        if bytes.is_empty() {
            return Ok(false);
        }
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        if self
            .inner
            .lock()
            .registered
            .iter()
            .any(|r| r.offset_of(bytes).is_some())
        {
            return Ok(true);
        }
        // Outside the lock: pinning gigabytes takes seconds, and nothing else needs it.
        // SAFETY: `memory` is shared and immutable; the device holds it until the region is
        // unregistered (in `Inner::drop`, after synchronising).
        let Some(pinned) = (unsafe { self.inner.backend.register_host(ptr, len)? }) else {
            return Ok(false);
        };
        self.inner
            .lock()
            .registered
            .push(crate::device::Registered {
                pinned,
                _memory: memory,
            });
        Ok(true)
    }

    /// Launches `kernel` on `stream` after the accesses of other streams it conflicts with.
    #[track_caller]
    pub fn launch(
        &self,
        kernel: KernelId,
        cfg: &LaunchCfg,
        args: &Args<'_>,
        stream: Stream,
    ) -> Result<()> {
        let site = std::panic::Location::caller();
        self.inner.check_stream(stream, site)?;
        if !self.inner.backend.supports(kernel) {
            return Err(Error::Unsupported {
                what: kernel.name(),
                backend: self.inner.info.backend.name(),
            });
        }
        let raw_args = args.to_raw(self.inner.id, site)?;
        let accesses = args.accesses();
        let mut st = self.inner.lock();
        let raw = st.streams[stream.index as usize].raw;
        if let Some(cap) = st.capture.as_mut()
            && cap.stream == stream.index
        {
            // Recorded, not run: fences are resolved when the graph is replayed.
            self.inner
                .backend
                .launch(raw, kernel, cfg, &raw_args, site)?;
            cap.accesses.extend(accesses);
            return Ok(());
        }
        self.inner.order(&mut st, stream.index, &accesses)?;
        self.inner
            .backend
            .launch(raw, kernel, cfg, &raw_args, site)?;
        self.inner.complete(&mut st, stream.index, &accesses);
        Ok(())
    }

    /// Copies all of `src` into the start of `dst` on `stream`.
    #[track_caller]
    pub fn copy<T: bytemuck::Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        src: &DeviceBuffer<T>,
        stream: Stream,
    ) -> Result<()> {
        self.copy_range(dst, 0, src, 0, src.len(), stream)
    }

    /// Copies `len` elements from `src[src_offset..]` to `dst[dst_offset..]`.
    #[track_caller]
    pub fn copy_range<T: bytemuck::Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        dst_offset: usize,
        src: &DeviceBuffer<T>,
        src_offset: usize,
        len: usize,
        stream: Stream,
    ) -> Result<()> {
        let site = std::panic::Location::caller();
        self.inner.check_stream(stream, site)?;
        dst.check_range("copy", dst_offset, len, site)?;
        dst.check_writable(site)?;
        src.check_range("copy", src_offset, len, site)?;
        self.inner.check_owner(dst.state(), site)?;
        self.inner.check_owner(src.state(), site)?;
        let size = std::mem::size_of::<T>();
        let (d, s) = (dst.state().clone(), src.state().clone());
        let accesses = [(s.clone(), Access::Read), (d.clone(), Access::Write)];
        let mut st = self.inner.lock();
        let capturing = st
            .capture
            .as_ref()
            .is_some_and(|c| c.stream == stream.index);
        let raw = st.streams[stream.index as usize].raw;
        if capturing {
            self.inner.backend.copy_d2d(
                raw,
                d.raw,
                dst_offset * size,
                s.raw,
                src_offset * size,
                len * size,
                site,
            )?;
            if let Some(cap) = st.capture.as_mut() {
                cap.accesses.extend(accesses.iter().cloned());
            }
            return Ok(());
        }
        self.inner.order(&mut st, stream.index, &accesses)?;
        self.inner.backend.copy_d2d(
            raw,
            d.raw,
            dst_offset * size,
            s.raw,
            src_offset * size,
            len * size,
            site,
        )?;
        self.inner.complete(&mut st, stream.index, &accesses);
        Ok(())
    }

    /// Waits for all work on every stream, then reports sanitizer findings as an error.
    #[track_caller]
    pub fn synchronize(&self) -> Result<()> {
        let site = std::panic::Location::caller();
        {
            let st = self.inner.lock();
            self.inner.refuse_during_capture(&st, "synchronize", site)?;
        }
        self.inner.backend.synchronize()?;
        let mut st = self.inner.lock();
        self.inner.collect(&mut st);
        self.inner.hazards_to_error(&mut st)
    }

    /// A host-waitable marker of everything queued on `stream` so far.
    #[track_caller]
    pub fn record(&self, stream: Stream) -> Result<Event> {
        let site = std::panic::Location::caller();
        self.inner.check_stream(stream, site)?;
        let st = self.inner.lock();
        self.inner
            .refuse_during_capture(&st, "event record", site)?;
        let raw = self
            .inner
            .backend
            .record_event(st.streams[stream.index as usize].raw)?;
        Ok(Event {
            inner: self.inner.clone(),
            raw: Some(raw),
        })
    }

    /// Turns core's ordering off, for the tests that prove the sanitizer would catch a
    /// core that forgot a wait.
    #[cfg(feature = "hazard-testing")]
    pub fn disable_ordering_for_test(&self) {
        self.inner.ordering_disabled.store(true, Ordering::Relaxed);
    }

    /// Device time per kernel since the last call, where the backend profiles launches
    /// (CUDA with `STRATA_KERNEL_TIMING=1`); empty otherwise.
    pub fn kernel_times(&self) -> Result<Vec<crate::KernelTime>> {
        self.inner.backend.kernel_times()
    }

    /// Sanitizer findings so far (also returned as errors by host waits).
    pub fn take_hazards(&self) -> Vec<Hazard> {
        let mut st = self.inner.lock();
        let mut h = std::mem::take(&mut st.hazards);
        h.extend(self.inner.backend.take_hazards());
        h
    }
}

/// A point in a stream the host can wait for.
pub struct Event {
    inner: Arc<Inner>,
    raw: Option<RawEvent>,
}

impl Event {
    pub fn is_done(&self) -> Result<bool> {
        match self.raw {
            Some(e) => self.inner.backend.event_done(e),
            None => Ok(true),
        }
    }
    /// Blocks until the stream reached this point; reports sanitizer findings.
    pub fn wait(&self) -> Result<()> {
        if let Some(e) = self.raw {
            self.inner.backend.event_wait(e)?;
        }
        let mut st = self.inner.lock();
        self.inner.hazards_to_error(&mut st)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(e) = self.raw.take() {
            self.inner.backend.destroy_event(e);
        }
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves fences as they were before the operation
        // that panicked; continuing with them is sound (at worst a wait too many).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn check_stream(&self, stream: Stream, site: Site) -> Result<()> {
        if stream.device != self.id {
            return Err(Error::ForeignBuffer { site });
        }
        Ok(())
    }

    pub(crate) fn check_owner(&self, b: &BufferState, site: Site) -> Result<()> {
        if b.device_id() != self.id {
            return Err(Error::ForeignBuffer { site });
        }
        Ok(())
    }

    pub(crate) fn refuse_during_capture(
        &self,
        st: &State,
        op: &'static str,
        site: Site,
    ) -> Result<()> {
        match &st.capture {
            Some(c) => Err(Error::CaptureForbidden {
                op,
                stream: c.stream,
                site,
            }),
            None => Ok(()),
        }
    }

    /// Makes `stream` wait for every access of another stream that `accesses` conflict with.
    pub(crate) fn order(
        &self,
        st: &mut State,
        stream: u32,
        accesses: &[(Arc<BufferState>, Access)],
    ) -> Result<()> {
        let mut deps = Vec::new();
        for (b, a) in accesses {
            b.fences().dependencies(*a, &mut deps);
        }
        self.wait_for(st, stream, &deps)
    }

    /// Makes `stream` wait for `deps` (fences of other streams it is not yet ordered after).
    pub(crate) fn wait_for(&self, st: &mut State, stream: u32, deps: &[Fence]) -> Result<()> {
        if self.ordering_disabled.load(Ordering::Relaxed) {
            return Ok(());
        }
        for dep in deps {
            if dep.stream == stream || st.streams[stream as usize].clock.get(dep.stream) >= dep.seq
            {
                continue;
            }
            let src = dep.stream as usize;
            let event = match &st.capture {
                Some(c) if c.stream == dep.stream => c.pre_event,
                _ => self.backend.record_event(st.streams[src].raw)?,
            };
            let waited = self
                .backend
                .stream_wait_event(st.streams[stream as usize].raw, event);
            if st.capture.as_ref().is_none_or(|c| c.pre_event != event) {
                self.backend.destroy_event(event);
            }
            waited?;
            let (src_clock, src_seq) = (st.streams[src].clock.clone(), st.streams[src].seq);
            let clock = &mut st.streams[stream as usize].clock;
            clock.merge(&src_clock);
            clock.set_max(dep.stream, src_seq);
        }
        Ok(())
    }

    /// Advances `stream` past one queued operation and stamps the buffers it touched.
    pub(crate) fn complete(
        &self,
        st: &mut State,
        stream: u32,
        accesses: &[(Arc<BufferState>, Access)],
    ) -> Fence {
        let s = &mut st.streams[stream as usize];
        s.seq += 1;
        let fence = Fence { stream, seq: s.seq };
        for (b, a) in accesses {
            b.fences().record(*a, fence);
        }
        fence
    }

    /// Releases what the device has finished with. Events on one stream complete in the
    /// order they were recorded, and the list is kept in that order, so a pass asks the
    /// backend about a stream's events only until one is still pending (the later ones are
    /// too) and never again about one older than an event seen complete: dropping n
    /// buffers in a row (one pass each) costs O(n) event queries, not O(n^2), and each
    /// item is released in the same pass as when every event was queried.
    pub(crate) fn collect(&self, st: &mut State) {
        let capturing = st.capture.as_ref().map(|c| c.stream);
        // Per stream, the earliest event found pending in this pass.
        let mut pending = vec![u64::MAX; st.streams.len()];
        let items = std::mem::take(&mut st.deferred);
        let mut kept = Vec::with_capacity(items.len());
        for mut item in items {
            // Events for fences are recorded late (here), never on a capturing stream.
            let mut ready = true;
            let mut fences = std::mem::take(&mut item.fences);
            fences.retain(|f| {
                if Some(f.stream) == capturing {
                    ready = false;
                    return true;
                }
                match self.backend.record_event(st.streams[f.stream as usize].raw) {
                    Ok(raw) => {
                        st.deferred_events += 1;
                        item.events.push(DeferredEvent {
                            raw,
                            stream: f.stream,
                            order: st.deferred_events,
                        });
                        false
                    }
                    Err(_) => {
                        ready = false;
                        true
                    }
                }
            });
            item.fences = fences;
            if ready
                && item
                    .events
                    .iter()
                    .all(|e| self.deferred_event_done(st, &mut pending, e))
            {
                self.release(item, st);
            } else {
                kept.push(item);
            }
        }
        // Nothing defers during a pass (releases free raw memory only).
        kept.append(&mut st.deferred);
        st.deferred = kept;
    }

    /// Whether `e` has completed, asking the backend only when the pass's earlier answers
    /// for its stream do not already say.
    fn deferred_event_done(&self, st: &mut State, pending: &mut [u64], e: &DeferredEvent) -> bool {
        let s = e.stream as usize;
        if e.order <= st.streams[s].released_upto {
            return true;
        }
        if e.order >= pending[s] {
            return false;
        }
        match self.backend.event_done(e.raw) {
            Ok(true) => {
                st.streams[s].released_upto = e.order;
                true
            }
            Ok(false) => {
                pending[s] = e.order;
                false
            }
            Err(_) => false,
        }
    }

    fn release(&self, item: DeferredItem, st: &mut State) {
        for e in item.events {
            self.backend.destroy_event(e.raw);
        }
        match item.what {
            // SAFETY: every fence of the buffer/graph/pinned memory has completed.
            Deferred::Buffer(raw, bytes) => {
                unsafe { self.backend.free(raw) };
                st.reserved = st.reserved.saturating_sub(bytes);
            }
            Deferred::Graph(g) => self.backend.destroy_graph(g),
        }
    }

    pub(crate) fn defer(&self, what: Deferred, fences: Vec<Fence>) {
        let mut st = self.lock();
        st.deferred.push(DeferredItem {
            what,
            fences,
            events: Vec::new(),
        });
        self.collect(&mut st);
    }

    pub(crate) fn hazards_to_error(&self, st: &mut State) -> Result<()> {
        st.hazards.extend(self.backend.take_hazards());
        if st.hazards.is_empty() {
            Ok(())
        } else {
            let h = std::mem::take(&mut st.hazards);
            for hz in &h {
                tracing::error!("sanitizer: {hz}");
            }
            Err(Error::Hazards(h))
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.backend.synchronize();
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let deferred = std::mem::take(&mut st.deferred);
        let staging = std::mem::take(&mut st.staging);
        for item in deferred {
            for e in item.events {
                self.backend.destroy_event(e.raw);
            }
            match item.what {
                // SAFETY: the device is idle after synchronize.
                Deferred::Buffer(raw, _) => unsafe { self.backend.free(raw) },
                Deferred::Graph(g) => self.backend.destroy_graph(g),
            }
        }
        for s in staging {
            if let Some(e) = s.busy {
                self.backend.destroy_event(e);
            }
            // SAFETY: idle device.
            unsafe { self.backend.free_pinned(s.pinned) };
        }
        for r in std::mem::take(&mut st.registered) {
            // SAFETY: idle device; the memory is released only after this.
            unsafe { self.backend.unregister_host(r.pinned) };
        }
        if let Some(c) = st.capture.take() {
            self.backend.destroy_event(c.pre_event);
        }
    }
}

pub(crate) fn raw_buffer_arg(
    b: &BufferState,
    offset: usize,
    bytes: usize,
    access: Access,
) -> KernelArg {
    KernelArg::Buffer {
        buf: b.raw,
        offset,
        bytes,
        access,
    }
}

pub(crate) fn fences_of(b: &BufferFences) -> Vec<Fence> {
    b.all()
}
