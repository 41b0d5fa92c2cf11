//! The raw verbs a backend implements. No ordering logic lives here: core's
//! [`Device`](crate::Device) decides every wait, and backends only carry them out.

use crate::error::{Hazard, Result, Site};
use crate::kernel::{KernelArg, KernelId, LaunchCfg};

/// A backend's stream handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawStream(pub u32);

/// A backend's device allocation handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawBuffer(pub u64);

/// A backend's event handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawEvent(pub u64);

/// A backend's executable graph handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawGraph(pub u64);

/// Page-locked host memory owned by a backend. `ptr` stays valid until
/// [`Backend::free_pinned`]; core never touches it while a device copy may use it.
#[derive(Debug)]
pub struct RawPinned {
    pub id: u64,
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: the pointer is to backend-owned host memory with no thread affinity; core
// serialises host access against device access through fences.
unsafe impl Send for RawPinned {}
unsafe impl Sync for RawPinned {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
    Hip,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Hip => "hip",
        }
    }
}

/// One kernel's share of a profile: how often it ran and its summed device time.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    pub kernel: KernelId,
    /// The function that ran: the kernel's own name, or the backend's variant of it (a
    /// verify window's `mul_mat` is not the step's).
    pub function: &'static str,
    pub launches: u64,
    pub seconds: f64,
    /// The figures are those of the last replay of a captured graph (one step), not of
    /// every launch since the previous profile.
    pub one_replay: bool,
}

/// What a device can do, so the engine can degrade cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Captured graphs replay as one submission (otherwise core still records and
    /// replays them, op by op).
    pub graphs: bool,
    /// Host memory can be page-locked for DMA.
    pub pinned_memory: bool,
    /// Copies run asynchronously with the host and with other streams.
    pub async_copies: bool,
    /// Reads are checked against fences (the CPU sanitizer).
    pub sanitizer: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub backend: BackendKind,
    pub ordinal: usize,
    pub name: String,
    pub total_memory: usize,
    /// e.g. "sm_90" or "gfx90a"; the CPU backend reports its SIMD level.
    pub arch: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    pub total: usize,
    pub free: usize,
}

/// The verbs of one device. Implementations must be thread-safe; core calls them with
/// its own lock held, so they need not be re-entrant.
pub trait Backend: Send + Sync {
    fn info(&self) -> DeviceInfo;
    fn capabilities(&self) -> Capabilities;
    fn mem_info(&self) -> Result<MemInfo>;

    fn create_stream(&self) -> Result<RawStream>;

    fn alloc(&self, bytes: usize) -> Result<RawBuffer>;
    /// # Safety
    /// No queued or running operation may still use `buf`.
    unsafe fn free(&self, buf: RawBuffer);
    fn alloc_pinned(&self, bytes: usize) -> Result<RawPinned>;
    /// # Safety
    /// No queued or running copy may still use `pinned`.
    unsafe fn free_pinned(&self, pinned: RawPinned);

    /// Marks the current end of `stream`; completes when everything queued before it has.
    fn record_event(&self, stream: RawStream) -> Result<RawEvent>;
    /// Operations queued on `stream` after this call start only once `event` completed.
    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()>;
    fn event_done(&self, event: RawEvent) -> Result<bool>;
    fn event_wait(&self, event: RawEvent) -> Result<()>;
    /// Releases the handle; waits already queued on it still take effect.
    fn destroy_event(&self, event: RawEvent);

    /// # Safety
    /// `src[src_offset..src_offset+bytes]` must stay alive and unchanged until the copy
    /// completes, and the destination range must lie inside `dst`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn copy_h2d(
        &self,
        stream: RawStream,
        dst: RawBuffer,
        dst_offset: usize,
        src: &RawPinned,
        src_offset: usize,
        bytes: usize,
        site: Site,
    ) -> Result<()>;
    /// # Safety
    /// The destination pinned range must stay alive and unread until the copy completes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn copy_d2h(
        &self,
        stream: RawStream,
        dst: &RawPinned,
        dst_offset: usize,
        src: RawBuffer,
        src_offset: usize,
        bytes: usize,
        site: Site,
    ) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn copy_d2d(
        &self,
        stream: RawStream,
        dst: RawBuffer,
        dst_offset: usize,
        src: RawBuffer,
        src_offset: usize,
        bytes: usize,
        site: Site,
    ) -> Result<()>;

    fn launch(
        &self,
        stream: RawStream,
        kernel: KernelId,
        cfg: &LaunchCfg,
        args: &[KernelArg],
        site: Site,
    ) -> Result<()>;

    /// Starts recording `stream`: later launches and device copies on it are recorded,
    /// not run.
    fn begin_capture(&self, stream: RawStream) -> Result<()>;
    fn end_capture(&self, stream: RawStream) -> Result<RawGraph>;
    fn replay(&self, graph: RawGraph, stream: RawStream, site: Site) -> Result<()>;
    fn destroy_graph(&self, graph: RawGraph);

    /// Whether this backend has `kernel` (a backend may implement a subset; launching a
    /// kernel it lacks is an `Unsupported` error).
    fn supports(&self, kernel: KernelId) -> bool {
        let _ = kernel;
        true
    }

    /// Makes read-only host memory visible to kernels without a copy, where the device reads
    /// host memory directly (the CPU backend). `Ok(None)`: not supported; upload instead.
    ///
    /// # Safety
    /// `ptr` must be valid for `len` bytes and unchanged until the buffer is freed.
    unsafe fn import_host(&self, ptr: *const u8, len: usize) -> Result<Option<RawBuffer>> {
        let _ = (ptr, len);
        Ok(None)
    }

    /// Page-locks read-only host memory (a mapped model file) so that copies from it reach
    /// the device straight from it (DMA), with no staging copy on the host. The handle is
    /// then a [`Backend::copy_h2d`] source like pinned memory. `Ok(None)`: not supported
    /// here (uploads stage as before).
    ///
    /// # Safety
    /// `ptr` must be valid for `len` bytes and unchanged until [`Backend::unregister_host`].
    unsafe fn register_host(&self, ptr: *const u8, len: usize) -> Result<Option<RawPinned>> {
        let _ = (ptr, len);
        Ok(None)
    }
    /// Undoes [`Backend::register_host`].
    ///
    /// # Safety
    /// No queued or running copy may still read `region`.
    unsafe fn unregister_host(&self, region: RawPinned) {
        let _ = region;
    }

    /// Waits for every stream of the device.
    fn synchronize(&self) -> Result<()>;

    /// Sanitizer reports since the last call (empty for backends without one).
    fn take_hazards(&self) -> Vec<Hazard> {
        Vec::new()
    }

    /// Device time per kernel of the launches since the last call, where the backend
    /// measures it (a profiling mode); empty otherwise. Waits for those launches.
    fn kernel_times(&self) -> Result<Vec<KernelTime>> {
        Ok(Vec::new())
    }

    /// The founding bug, on purpose: a copy from ordinary host memory on no stream the
    /// caller controls, ordered with nothing (CUDA: `cuMemcpyHtoD` from pageable memory;
    /// CPU: a detached simulated DMA). Only for the tests that prove the hazard exists.
    fn copy_h2d_unordered(
        &self,
        dst: RawBuffer,
        dst_offset: usize,
        src: &[u8],
        site: Site,
    ) -> Result<()> {
        let _ = (dst, dst_offset, src, site);
        Err(crate::Error::Unsupported {
            what: "unordered copies",
            backend: self.info().backend.name(),
        })
    }
}
