//! `Backend` for HIP, on the runtime API: non-blocking streams, events without timing,
//! plain device allocations, pinned host memory, async copies, launches from the
//! per-device kernel table, and stream capture into executable graphs.
//!
//! Nothing here decides an order. Core records events and queues waits; this file only
//! carries them out, and never synchronises "to be safe".
//!
//! Handles: a `RawBuffer` is the device pointer itself, a `RawEvent` the `hipEvent_t`, a
//! `RawGraph` the `hipGraphExec_t`, and a `RawStream` indexes this backend's stream list.
//! HIP keeps a current device per thread (no contexts), so every call first makes this
//! backend's device current on the calling thread.

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::{Mutex, RwLock};

use strata_core::{
    Backend, BackendKind, Capabilities, DeviceInfo, Error, KernelArg, KernelId, LaunchCfg, MemInfo,
    RawBuffer, RawEvent, RawGraph, RawPinned, RawStream, Result, Site,
};

use crate::compile::{self, Origin as ModuleOrigin};
use crate::ffi::{self, HIP_ERROR_NOT_READY, HIP_ERROR_OUT_OF_MEMORY, HIP_SUCCESS, Handle, HipApi};
use crate::kernels::{self, KernelTable, LoadSpec, MAX_ARGS};
use crate::runtime::{self, NAME, check};

/// How a HIP device is opened.
#[derive(Clone, Debug)]
pub struct HipOptions {
    /// Root of the compiled-kernel cache (`<root>/<gfx target>/<module>-<hash>.hsaco`);
    /// `None` compiles every start. Default: [`compile::default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
}

impl Default for HipOptions {
    fn default() -> Self {
        HipOptions {
            cache_dir: compile::default_cache_dir(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One HIP device: its streams, event pool and kernel table.
pub struct HipBackend {
    api: &'static HipApi,
    info: DeviceInfo,
    ordinal: c_int,
    warp_size: u32,
    compute_units: u32,
    /// `hipStream_t`s, indexed by `RawStream`.
    streams: RwLock<Vec<usize>>,
    /// Idle `hipEvent_t`s. Reusing one is safe: a wait already queued on an event keeps
    /// the state of the record it saw, whatever is recorded later.
    event_pool: Mutex<Vec<usize>>,
    /// `None` only while dropping (modules unload before the streams go).
    kernels: Option<KernelTable>,
    origins: Vec<(&'static str, ModuleOrigin)>,
}

impl HipBackend {
    /// Opens device `ordinal` and builds its kernel table (from the cache, or with hiprtc).
    pub fn new(ordinal: usize, opts: &HipOptions) -> Result<Self> {
        let props = runtime::device_props(ordinal)?;
        let mut backend = HipBackend {
            api: runtime::api()?,
            info: DeviceInfo {
                backend: BackendKind::Hip,
                ordinal,
                name: props.name.clone(),
                total_memory: props.total_memory,
                arch: props.arch.clone(),
            },
            ordinal: props.ordinal,
            warp_size: props.warp_size,
            compute_units: props.compute_units,
            streams: RwLock::new(Vec::new()),
            event_pool: Mutex::new(Vec::new()),
            kernels: None,
            origins: Vec::new(),
        };
        backend.bind()?;
        let defines: Vec<(&str, String)> = props
            .wall_clock_khz
            .map(|k| vec![("STRATA_WALL_CLOCK_KHZ", format!("{k}ull"))])
            .unwrap_or_default();
        let table = KernelTable::load(&LoadSpec {
            target: &props.arch,
            defines: &defines,
            cache_root: opts.cache_dir.as_deref(),
        })?;
        backend.origins = table.origins.clone();
        for (m, o) in &backend.origins {
            tracing::debug!("hip: kernel module {m}: {o:?}");
        }
        backend.kernels = Some(table);
        Ok(backend)
    }

    /// How each kernel module was obtained (cache or hiprtc), in module order.
    pub fn module_origins(&self) -> &[(&'static str, ModuleOrigin)] {
        &self.origins
    }

    /// Lanes per wavefront: 64 on GCN/CDNA, 32 on RDNA.
    pub fn warp_size(&self) -> u32 {
        self.warp_size
    }

    /// Compute units (HIP's multiprocessor count).
    pub fn compute_units(&self) -> u32 {
        self.compute_units
    }

    /// Makes this device current on the calling thread. Every backend call does this
    /// itself.
    pub fn bind(&self) -> Result<()> {
        let mut cur: c_int = -1;
        // SAFETY: writes one int.
        let r = unsafe { (self.api.hipGetDevice)(&mut cur) };
        if r == HIP_SUCCESS && cur == self.ordinal {
            return Ok(());
        }
        // SAFETY: an ordinal checked against the device count.
        check("hipSetDevice", unsafe {
            (self.api.hipSetDevice)(self.ordinal)
        })
    }

    fn stream(&self, s: RawStream) -> Result<Handle> {
        self.streams
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(s.0 as usize)
            .map(|&h| h as Handle)
            .ok_or_else(|| Error::Driver {
                backend: NAME,
                call: "stream lookup",
                message: format!("unknown stream {}", s.0),
            })
    }

    fn oom(&self, requested: usize) -> Error {
        let free = self.mem_info().map_or(0, |m| m.free);
        Error::OutOfMemory {
            backend: NAME,
            requested,
            free,
        }
    }
}

/// Refuses a copy whose pinned side (`what`: source or destination) would run past `p`.
fn pinned_range(
    p: &RawPinned,
    offset: usize,
    bytes: usize,
    call: &'static str,
    what: &str,
) -> Result<()> {
    if offset.checked_add(bytes).is_none_or(|end| end > p.len) {
        return Err(Error::Driver {
            backend: NAME,
            call,
            message: format!("{what} range past the pinned buffer"),
        });
    }
    Ok(())
}

/// A device address as HIP takes it.
fn dptr(buf: RawBuffer, offset: usize) -> Handle {
    (buf.0 as usize).wrapping_add(offset) as Handle
}

impl Backend for HipBackend {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            graphs: true,
            pinned_memory: true,
            async_copies: true,
            sanitizer: false,
        }
    }

    fn mem_info(&self) -> Result<MemInfo> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two integers.
        check("hipMemGetInfo", unsafe {
            (self.api.hipMemGetInfo)(&mut free, &mut total)
        })?;
        Ok(MemInfo { total, free })
    }

    fn create_stream(&self) -> Result<RawStream> {
        self.bind()?;
        let mut s: Handle = std::ptr::null_mut();
        // SAFETY: writes the new stream handle. Non-blocking: no implicit ordering with
        // the null stream; every order is core's.
        check("hipStreamCreateWithFlags", unsafe {
            (self.api.hipStreamCreateWithFlags)(&mut s, ffi::HIP_STREAM_NON_BLOCKING)
        })?;
        let mut streams = self.streams.write().unwrap_or_else(|e| e.into_inner());
        streams.push(s as usize);
        Ok(RawStream((streams.len() - 1) as u32))
    }

    fn alloc(&self, bytes: usize) -> Result<RawBuffer> {
        self.bind()?;
        let mut p: Handle = std::ptr::null_mut();
        // SAFETY: writes the device pointer.
        match unsafe { (self.api.hipMalloc)(&mut p, bytes) } {
            HIP_SUCCESS => Ok(RawBuffer(p as u64)),
            HIP_ERROR_OUT_OF_MEMORY => Err(self.oom(bytes)),
            r => Err(runtime::error("hipMalloc", r)),
        }
    }

    unsafe fn free(&self, buf: RawBuffer) {
        if let Err(e) = self.bind() {
            tracing::error!("hip: free of {:#x}: {e}", buf.0);
            return;
        }
        // SAFETY: the caller guarantees no queued work uses the buffer.
        if let Err(e) = check("hipFree", unsafe { (self.api.hipFree)(dptr(buf, 0)) }) {
            tracing::error!("hip: {e}");
        }
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<RawPinned> {
        self.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes the host pointer.
        match unsafe { (self.api.hipHostMalloc)(&mut p, bytes, ffi::HIP_HOST_MALLOC_DEFAULT) } {
            HIP_SUCCESS => Ok(RawPinned {
                id: p as u64,
                ptr: p.cast::<u8>(),
                len: bytes,
            }),
            HIP_ERROR_OUT_OF_MEMORY => Err(Error::OutOfMemory {
                backend: NAME,
                requested: bytes,
                free: 0,
            }),
            r => Err(runtime::error("hipHostMalloc", r)),
        }
    }

    unsafe fn free_pinned(&self, pinned: RawPinned) {
        if let Err(e) = self.bind() {
            tracing::error!("hip: free of pinned memory: {e}");
            return;
        }
        // SAFETY: the caller guarantees no queued copy uses it.
        if let Err(e) = check("hipHostFree", unsafe {
            (self.api.hipHostFree)(pinned.ptr.cast())
        }) {
            tracing::error!("hip: {e}");
        }
    }

    fn record_event(&self, stream: RawStream) -> Result<RawEvent> {
        self.bind()?;
        let s = self.stream(stream)?;
        let pooled = lock(&self.event_pool).pop();
        let ev = match pooled {
            Some(e) => e as Handle,
            None => {
                let mut e: Handle = std::ptr::null_mut();
                // SAFETY: writes the event handle. No timing: cheaper records and waits.
                check("hipEventCreateWithFlags", unsafe {
                    (self.api.hipEventCreateWithFlags)(&mut e, ffi::HIP_EVENT_DISABLE_TIMING)
                })?;
                e
            }
        };
        // SAFETY: valid event and stream.
        if let Err(e) = check("hipEventRecord", unsafe {
            (self.api.hipEventRecord)(ev, s)
        }) {
            lock(&self.event_pool).push(ev as usize);
            return Err(e);
        }
        Ok(RawEvent(ev as u64))
    }

    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: valid stream; an event this backend recorded.
        check("hipStreamWaitEvent", unsafe {
            (self.api.hipStreamWaitEvent)(s, event.0 as Handle, 0)
        })
    }

    fn event_done(&self, event: RawEvent) -> Result<bool> {
        self.bind()?;
        // SAFETY: an event this backend recorded.
        match unsafe { (self.api.hipEventQuery)(event.0 as Handle) } {
            HIP_SUCCESS => Ok(true),
            HIP_ERROR_NOT_READY => Ok(false),
            r => Err(runtime::error("hipEventQuery", r)),
        }
    }

    fn event_wait(&self, event: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: an event this backend recorded.
        check("hipEventSynchronize", unsafe {
            (self.api.hipEventSynchronize)(event.0 as Handle)
        })
    }

    fn destroy_event(&self, event: RawEvent) {
        lock(&self.event_pool).push(event.0 as usize);
    }

    unsafe fn copy_h2d(
        &self,
        stream: RawStream,
        dst: RawBuffer,
        dst_offset: usize,
        src: &RawPinned,
        src_offset: usize,
        bytes: usize,
        _site: Site,
    ) -> Result<()> {
        pinned_range(src, src_offset, bytes, "hipMemcpyHtoDAsync", "source")?;
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: source range checked; the caller keeps it alive and the destination
        // range inside `dst` until the copy completes.
        check("hipMemcpyHtoDAsync", unsafe {
            (self.api.hipMemcpyHtoDAsync)(
                dptr(dst, dst_offset),
                src.ptr.add(src_offset).cast::<c_void>(),
                bytes,
                s,
            )
        })
    }

    unsafe fn copy_d2h(
        &self,
        stream: RawStream,
        dst: &RawPinned,
        dst_offset: usize,
        src: RawBuffer,
        src_offset: usize,
        bytes: usize,
        _site: Site,
    ) -> Result<()> {
        pinned_range(dst, dst_offset, bytes, "hipMemcpyDtoHAsync", "destination")?;
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: destination range checked; the caller keeps it alive and unread until
        // the copy completes.
        check("hipMemcpyDtoHAsync", unsafe {
            (self.api.hipMemcpyDtoHAsync)(
                dst.ptr.add(dst_offset).cast::<c_void>(),
                dptr(src, src_offset),
                bytes,
                s,
            )
        })
    }

    fn copy_d2d(
        &self,
        stream: RawStream,
        dst: RawBuffer,
        dst_offset: usize,
        src: RawBuffer,
        src_offset: usize,
        bytes: usize,
        _site: Site,
    ) -> Result<()> {
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: core checked both ranges against the buffers' lengths.
        check("hipMemcpyDtoDAsync", unsafe {
            (self.api.hipMemcpyDtoDAsync)(dptr(dst, dst_offset), dptr(src, src_offset), bytes, s)
        })
    }

    fn launch(
        &self,
        stream: RawStream,
        kernel: KernelId,
        cfg: &LaunchCfg,
        args: &[KernelArg],
        site: Site,
    ) -> Result<()> {
        let bad = |reason: String| Error::BadLaunch {
            kernel: kernel.name(),
            site,
            reason,
        };
        let entry =
            self.kernels
                .as_ref()
                .and_then(|t| t.get(kernel))
                .ok_or(Error::Unsupported {
                    what: kernel.name(),
                    backend: NAME,
                })?;
        if let Some(params) = &entry.params {
            kernels::check_args(params, args).map_err(bad)?;
        }
        let mut slots = [0u64; MAX_ARGS];
        let n = kernels::pack(args, &mut slots).map_err(bad)?;
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (p, slot) in params.iter_mut().zip(slots.iter_mut()).take(n) {
            *p = (slot as *mut u64).cast::<c_void>();
        }
        self.bind()?;
        let s = self.stream(stream)?;
        let [gx, gy, gz] = cfg.grid;
        let [bx, by, bz] = cfg.block;
        // SAFETY: `params` holds one pointer per kernel parameter (checked against the
        // declared signature), each to a slot alive for the call. The grid counts
        // blocks, as in CUDA.
        check("hipModuleLaunchKernel", unsafe {
            (self.api.hipModuleLaunchKernel)(
                entry.func,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                cfg.shared_bytes,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn begin_capture(&self, stream: RawStream) -> Result<()> {
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: valid stream. Relaxed: core, not the runtime, refuses what capture
        // forbids, and relaxed mode lets other threads keep using the device meanwhile.
        check("hipStreamBeginCapture", unsafe {
            (self.api.hipStreamBeginCapture)(s, ffi::HIP_STREAM_CAPTURE_MODE_RELAXED)
        })
    }

    fn end_capture(&self, stream: RawStream) -> Result<RawGraph> {
        self.bind()?;
        let s = self.stream(stream)?;
        let mut graph: Handle = std::ptr::null_mut();
        // SAFETY: valid stream; writes the graph handle.
        check("hipStreamEndCapture", unsafe {
            (self.api.hipStreamEndCapture)(s, &mut graph)
        })?;
        let mut exec: Handle = std::ptr::null_mut();
        let mut log = [0u8; 512];
        // SAFETY: the graph just captured; the log buffer has the length passed. The
        // template is not needed once instantiated.
        let r = unsafe {
            (self.api.hipGraphInstantiate)(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                log.as_mut_ptr().cast(),
                log.len(),
            )
        };
        // SAFETY: a graph we own.
        unsafe { (self.api.hipGraphDestroy)(graph) };
        if r != HIP_SUCCESS {
            let detail = std::ffi::CStr::from_bytes_until_nul(&log)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Err(Error::Driver {
                backend: NAME,
                call: "hipGraphInstantiate",
                message: format!("{} {detail}", runtime::describe(r))
                    .trim()
                    .to_string(),
            });
        }
        Ok(RawGraph(exec as u64))
    }

    fn replay(&self, graph: RawGraph, stream: RawStream, _site: Site) -> Result<()> {
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: an executable graph this backend instantiated.
        check("hipGraphLaunch", unsafe {
            (self.api.hipGraphLaunch)(graph.0 as Handle, s)
        })
    }

    fn destroy_graph(&self, graph: RawGraph) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: core destroys a graph once, after its replays completed.
        if let Err(e) = check("hipGraphExecDestroy", unsafe {
            (self.api.hipGraphExecDestroy)(graph.0 as Handle)
        }) {
            tracing::error!("hip: {e}");
        }
    }

    fn supports(&self, kernel: KernelId) -> bool {
        self.kernels
            .as_ref()
            .is_some_and(|t| t.get(kernel).is_some())
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments.
        check("hipDeviceSynchronize", unsafe {
            (self.api.hipDeviceSynchronize)()
        })
    }

    fn copy_h2d_unordered(
        &self,
        dst: RawBuffer,
        dst_offset: usize,
        src: &[u8],
        _site: Site,
    ) -> Result<()> {
        self.bind()?;
        // The founding bug, on purpose: the synchronous copy from pageable memory may
        // return once the bytes are staged, and nothing orders a non-blocking stream
        // after it.
        // SAFETY: `src` is valid for its length (HIP only reads it); the destination
        // range is the caller's.
        check("hipMemcpyHtoD", unsafe {
            (self.api.hipMemcpyHtoD)(
                dptr(dst, dst_offset),
                src.as_ptr().cast_mut().cast::<c_void>(),
                src.len(),
            )
        })
    }
}

impl Drop for HipBackend {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: the device's own work must finish before its modules and streams go.
        unsafe {
            (self.api.hipDeviceSynchronize)();
        }
        self.kernels = None;
        for e in lock(&self.event_pool).drain(..) {
            // SAFETY: pooled events are idle.
            unsafe { (self.api.hipEventDestroy)(e as Handle) };
        }
        for s in self
            .streams
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // SAFETY: idle after the synchronisation above.
            unsafe { (self.api.hipStreamDestroy)(s as Handle) };
        }
    }
}
