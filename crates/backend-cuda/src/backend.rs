//! `Backend` for CUDA, on the driver API through cudarc's `sys` layer: non-blocking
//! streams, events without timing, plain device allocations, portable pinned host memory,
//! async copies, launches from the per-device kernel table, and stream capture into
//! executable graphs.
//!
//! Nothing here decides an order. Core records events and queues waits; this file only
//! carries them out, and never synchronises "to be safe" (cudarc's safe layer tracks a
//! read/write event per buffer; that is core's job here, so the safe layer is not used).
//!
//! Handles: a `RawBuffer` is the `CUdeviceptr` itself, a `RawEvent` the `CUevent`, a
//! `RawGraph` the `CUgraphExec`, and a `RawStream` indexes this backend's stream list.

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Mutex, RwLock};

use cudarc::driver::sys;
use strata_core::{
    Backend, BackendKind, Capabilities, DeviceInfo, Error, KernelArg, KernelId, LaunchCfg, MemInfo,
    RawBuffer, RawEvent, RawGraph, RawPinned, RawStream, Result, Site,
};

use crate::compile::{self, Origin as ModuleOrigin};
use crate::driver::{self, NAME, check};
use crate::kernel_timing::KernelTiming;
use crate::kernels::{self, KernelEntry, KernelTable, MAX_ARGS};
use crate::launch_options::LaunchOptions;
use crate::variants::SCRATCH_BYTES;

/// How a CUDA device is opened.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// Root of the compiled-kernel cache (`<root>/<sm_XY>/<module>-<hash>...`); `None`
    /// compiles every start. Default: [`compile::default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Optional kernels left out and dependent launches (default: from the environment).
    pub launch: LaunchOptions,
    /// Per-kernel device time (`Device::kernel_times`; default: `STRATA_KERNEL_TIMING=1`).
    pub kernel_timing: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            cache_dir: compile::default_cache_dir(),
            launch: LaunchOptions::from_env(),
            kernel_timing: KernelTiming::enabled_by_env(),
        }
    }
}

/// One stream and its scratch buffer: [`SCRATCH_BYTES`] of device memory that only
/// launches on this stream use (a variant's pre-launch writes it, the variant reads it:
/// variants.rs `PreLaunch`), so stream order alone keeps them apart. Allocated with the
/// stream and never reallocated: a graph captured on the stream keeps its address. (A
/// graph replayed on another stream than it was captured on would share it with its
/// capture stream; the engine replays a context's graphs on the context's stream.)
#[derive(Clone, Copy)]
struct StreamSlot {
    handle: usize,
    scratch: sys::CUdeviceptr,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One CUDA device: its primary context, streams, event pool and kernel table.
pub struct CudaBackend {
    info: DeviceInfo,
    device: sys::CUdevice,
    /// The device's primary context (a `CUcontext`), retained for our lifetime.
    ctx: usize,
    /// `CUstream`s, indexed by `RawStream`.
    streams: RwLock<Vec<StreamSlot>>,
    /// Idle `CUevent`s. Reusing one is safe: a wait already queued on an event keeps the
    /// state of the record it saw, whatever is recorded later.
    event_pool: Mutex<Vec<usize>>,
    /// `None` only while dropping (modules unload before the context is released).
    kernels: Option<KernelTable>,
    origins: Vec<(&'static str, ModuleOrigin)>,
    /// Per-launch timing events (`STRATA_KERNEL_TIMING=1`).
    timing: Option<KernelTiming>,
    /// The device can page-lock host memory mapped read-only (a model file).
    read_only_register: bool,
}

impl CudaBackend {
    /// Opens device `ordinal`: retains its primary context and builds the kernel table
    /// (from the cache, or with NVRTC).
    pub fn new(ordinal: usize, opts: &CudaOptions) -> Result<Self> {
        let props = driver::device_props(ordinal)?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid device handle; writes the context handle.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, props.handle)
        })?;
        let mut backend = CudaBackend {
            info: DeviceInfo {
                backend: BackendKind::Cuda,
                ordinal,
                name: props.name.clone(),
                total_memory: props.total_memory,
                arch: props.arch(),
            },
            device: props.handle,
            ctx: ctx as usize,
            streams: RwLock::new(Vec::new()),
            event_pool: Mutex::new(Vec::new()),
            kernels: None,
            origins: Vec::new(),
            timing: opts.kernel_timing.then(KernelTiming::default),
            read_only_register: props.read_only_register,
        };
        // From here on an error drops `backend`, which releases the context.
        backend.bind()?;
        let table = KernelTable::load(props.cc, opts.cache_dir.as_deref(), &opts.launch)?;
        backend.origins = table.origins.clone();
        for (m, o) in &backend.origins {
            tracing::debug!("cuda: kernel module {m}: {o:?}");
        }
        backend.kernels = Some(table);
        Ok(backend)
    }

    /// How each kernel module was obtained (cache or NVRTC), in module order.
    pub fn module_origins(&self) -> &[(&'static str, ModuleOrigin)] {
        &self.origins
    }

    /// Makes this device's context current on the calling thread. Every backend call
    /// does this itself; it is public for the hazard experiment, which makes raw driver
    /// calls of its own.
    pub fn bind(&self) -> Result<()> {
        let mut cur: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes the calling thread's current context handle.
        let r = unsafe { sys::cuCtxGetCurrent(&mut cur) };
        if r == sys::CUresult::CUDA_SUCCESS && cur as usize == self.ctx {
            return Ok(());
        }
        // SAFETY: a context we retained.
        check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(self.ctx as sys::CUcontext)
        })
    }

    fn stream(&self, s: RawStream) -> Result<sys::CUstream> {
        self.stream_slot(s).map(|slot| slot.handle as sys::CUstream)
    }

    fn stream_slot(&self, s: RawStream) -> Result<StreamSlot> {
        self.streams
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(s.0 as usize)
            .copied()
            .ok_or_else(|| Error::Driver {
                backend: NAME,
                call: "stream lookup",
                message: format!("unknown stream {}", s.0),
            })
    }

    /// Launches `entry` on `s` with the packed `params`, as a programmatic dependent launch
    /// when the entry is marked for it.
    #[allow(clippy::too_many_arguments)]
    fn launch_entry(
        &self,
        entry: &KernelEntry,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        s: sys::CUstream,
        params: &mut [*mut c_void; MAX_ARGS],
    ) -> Result<()> {
        let ([gx, gy, gz], [bx, by, bz]) = (grid, block);
        if entry.dependent_launch {
            // Programmatic stream serialization: the kernel may start once every block of
            // the one before it has started; its pdl_begin() waits for that one's end.
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value: sys::CUlaunchAttributeValue {
                    programmaticStreamSerializationAllowed: 1,
                },
            };
            let config = sys::CUlaunchConfig {
                gridDimX: gx,
                gridDimY: gy,
                gridDimZ: gz,
                blockDimX: bx,
                blockDimY: by,
                blockDimZ: bz,
                sharedMemBytes: shared,
                hStream: s,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as below; `config` and `attr` live for the call.
            check("cuLaunchKernelEx", unsafe {
                sys::cuLaunchKernelEx(
                    &config,
                    entry.func,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })
        } else {
            // SAFETY: `params` holds one pointer per kernel parameter (checked against the
            // signature when the driver reports it), each to a slot alive for the call.
            check("cuLaunchKernel", unsafe {
                sys::cuLaunchKernel(
                    entry.func,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    shared,
                    s,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })
        }
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

impl Backend for CudaBackend {
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
        check("cuMemGetInfo_v2", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemInfo { total, free })
    }

    fn create_stream(&self) -> Result<RawStream> {
        self.bind()?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: writes the new stream handle. Non-blocking: no implicit ordering with
        // the legacy default stream; every order is core's.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(
                &mut s,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint,
            )
        })?;
        let mut scratch: sys::CUdeviceptr = 0;
        // SAFETY: writes the device pointer.
        let r = unsafe { sys::cuMemAlloc_v2(&mut scratch, SCRATCH_BYTES) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the stream just created, unused.
            unsafe { sys::cuStreamDestroy_v2(s) };
            return Err(match r {
                sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => self.oom(SCRATCH_BYTES),
                r => driver::error("cuMemAlloc_v2", r),
            });
        }
        // Zeroed once: attention_long's per-unit counters start at 0 and every launch
        // leaves them so (attention_long.cuh).
        // SAFETY: the SCRATCH_BYTES just allocated; synchronous.
        let r = unsafe { sys::cuMemsetD8_v2(scratch, 0, SCRATCH_BYTES) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the allocation and stream just created, unused.
            unsafe {
                sys::cuMemFree_v2(scratch);
                sys::cuStreamDestroy_v2(s);
            }
            return Err(driver::error("cuMemsetD8_v2", r));
        }
        let mut streams = self.streams.write().unwrap_or_else(|e| e.into_inner());
        streams.push(StreamSlot {
            handle: s as usize,
            scratch,
        });
        Ok(RawStream((streams.len() - 1) as u32))
    }

    fn alloc(&self, bytes: usize) -> Result<RawBuffer> {
        self.bind()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: writes the device pointer.
        match unsafe { sys::cuMemAlloc_v2(&mut p, bytes) } {
            sys::CUresult::CUDA_SUCCESS => Ok(RawBuffer(p)),
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(self.oom(bytes)),
            r => Err(driver::error("cuMemAlloc_v2", r)),
        }
    }

    unsafe fn free(&self, buf: RawBuffer) {
        if let Err(e) = self.bind() {
            tracing::error!("cuda: free of {:#x}: {e}", buf.0);
            return;
        }
        // SAFETY: the caller guarantees no queued work uses the buffer.
        if let Err(e) = check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(buf.0) }) {
            tracing::error!("cuda: {e}");
        }
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<RawPinned> {
        self.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes the host pointer. Portable: usable from every context.
        match unsafe { sys::cuMemHostAlloc(&mut p, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) } {
            sys::CUresult::CUDA_SUCCESS => Ok(RawPinned {
                id: p as u64,
                ptr: p.cast::<u8>(),
                len: bytes,
            }),
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(Error::OutOfMemory {
                backend: NAME,
                requested: bytes,
                free: 0,
            }),
            r => Err(driver::error("cuMemHostAlloc", r)),
        }
    }

    unsafe fn free_pinned(&self, pinned: RawPinned) {
        if let Err(e) = self.bind() {
            tracing::error!("cuda: free of pinned memory: {e}");
            return;
        }
        // SAFETY: the caller guarantees no queued copy uses it.
        if let Err(e) = check("cuMemFreeHost", unsafe {
            sys::cuMemFreeHost(pinned.ptr.cast())
        }) {
            tracing::error!("cuda: {e}");
        }
    }

    unsafe fn register_host(&self, ptr: *const u8, len: usize) -> Result<Option<RawPinned>> {
        self.bind()?;
        // Whole pages: a page holding any byte of the range is mapped whole.
        const PAGE: usize = 4096;
        let start = ptr as usize & !(PAGE - 1);
        let end = (ptr as usize)
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(PAGE))
            .ok_or(Error::Driver {
                backend: NAME,
                call: "cuMemHostRegister_v2",
                message: "range past the end of the address space".into(),
            })?;
        // A mapped file is read-only to the process, and is registered so only where the
        // device supports it (otherwise the driver refuses: uploads then stage).
        let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        if self.read_only_register {
            flags |= sys::CU_MEMHOSTREGISTER_READ_ONLY;
        }
        // SAFETY: the caller keeps [ptr, ptr + len) mapped and unchanged until unregistered;
        // the whole pages around it are mapped with it.
        check("cuMemHostRegister_v2", unsafe {
            sys::cuMemHostRegister_v2(start as *mut c_void, end - start, flags)
        })?;
        Ok(Some(RawPinned {
            id: start as u64,
            ptr: start as *mut u8,
            len: end - start,
        }))
    }

    unsafe fn unregister_host(&self, region: RawPinned) {
        if let Err(e) = self.bind() {
            tracing::error!("cuda: unregistering host memory: {e}");
            return;
        }
        // SAFETY: registered by `register_host`; the caller guarantees no copy reads it.
        if let Err(e) = check("cuMemHostUnregister", unsafe {
            sys::cuMemHostUnregister(region.ptr.cast())
        }) {
            tracing::error!("cuda: {e}");
        }
    }

    fn record_event(&self, stream: RawStream) -> Result<RawEvent> {
        self.bind()?;
        let s = self.stream(stream)?;
        let pooled = lock(&self.event_pool).pop();
        let ev = match pooled {
            Some(e) => e as sys::CUevent,
            None => {
                let mut e: sys::CUevent = std::ptr::null_mut();
                // SAFETY: writes the event handle. No timing: cheaper records and waits.
                check("cuEventCreate", unsafe {
                    sys::cuEventCreate(
                        &mut e,
                        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as std::ffi::c_uint,
                    )
                })?;
                e
            }
        };
        // SAFETY: valid event and stream.
        if let Err(e) = check("cuEventRecord", unsafe { sys::cuEventRecord(ev, s) }) {
            lock(&self.event_pool).push(ev as usize);
            return Err(e);
        }
        Ok(RawEvent(ev as u64))
    }

    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: valid stream; an event this backend recorded.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(s, event.0 as sys::CUevent, 0)
        })
    }

    fn event_done(&self, event: RawEvent) -> Result<bool> {
        self.bind()?;
        // SAFETY: an event this backend recorded.
        match unsafe { sys::cuEventQuery(event.0 as sys::CUevent) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(driver::error("cuEventQuery", r)),
        }
    }

    fn event_wait(&self, event: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: an event this backend recorded.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(event.0 as sys::CUevent)
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
        if src_offset
            .checked_add(bytes)
            .is_none_or(|end| end > src.len)
        {
            return Err(Error::Driver {
                backend: NAME,
                call: "cuMemcpyHtoDAsync_v2",
                message: "source range past the pinned buffer".into(),
            });
        }
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: source range checked; the caller keeps it alive and the destination
        // range inside `dst` until the copy completes.
        check("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.0 + dst_offset as u64,
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
        if dst_offset
            .checked_add(bytes)
            .is_none_or(|end| end > dst.len)
        {
            return Err(Error::Driver {
                backend: NAME,
                call: "cuMemcpyDtoHAsync_v2",
                message: "destination range past the pinned buffer".into(),
            });
        }
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: destination range checked; the caller keeps it alive and unread until
        // the copy completes.
        check("cuMemcpyDtoHAsync_v2", unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                dst.ptr.add(dst_offset).cast::<c_void>(),
                src.0 + src_offset as u64,
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
        check("cuMemcpyDtoDAsync_v2", unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                dst.0 + dst_offset as u64,
                src.0 + src_offset as u64,
                bytes,
                s,
            )
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
        let choice = self
            .kernels
            .as_ref()
            .and_then(|t| t.for_launch(kernel, args))
            .ok_or(Error::Unsupported {
                what: kernel.name(),
                backend: NAME,
            })?;
        let (entry, variant_smem) = (choice.entry, choice.dynamic_smem);
        self.bind()?;
        let slot = self.stream_slot(stream)?;
        let s = slot.handle as sys::CUstream;
        // A variant with a pre-launch (or attention_long) takes the stream's scratch as one
        // more argument.
        let mut with_scratch = [KernelArg::U32(0); MAX_ARGS];
        let args = match choice.scratch {
            true if args.len() < MAX_ARGS => {
                with_scratch[..args.len()].copy_from_slice(args);
                with_scratch[args.len()] = KernelArg::U64(slot.scratch);
                &with_scratch[..=args.len()]
            }
            true => return Err(bad(format!("{} arguments and a scratch", args.len()))),
            false => args,
        };
        if let Some(params) = &entry.params {
            kernels::check_args(params, args).map_err(bad)?;
        }
        let mut slots = [0u64; MAX_ARGS];
        let n = kernels::pack(args, &mut slots).map_err(bad)?;
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (p, slot) in params.iter_mut().zip(slots.iter_mut()).take(n) {
            *p = (slot as *mut u64).cast::<c_void>();
        }
        let [gx, gy, gz] = cfg.grid;
        // A variant with coarser units than its kernel's runs on the blocks it has work for
        // (its units are taken in grid-stride loops, as every kernel's); one with finer
        // units on its own grid.
        let gx = match choice.grid.and_then(|g| g(args, cfg.block[0])) {
            Some(units) if choice.grid_exact => units,
            Some(units) => gx.min(units),
            None => gx,
        };
        let gx = entry.grid_x(gx);
        let timed = match &self.timing {
            Some(t) => t.start(s)?,
            None => None,
        };
        if let Some(pre) = &choice.pre {
            // Same arguments (scratch included); ordered before the variant by the stream.
            if let Some(params) = &pre.entry.params {
                kernels::check_args(params, args).map_err(bad)?;
            }
            let (grid, block) = ([pre.grid, 1, 1], [pre.block, 1, 1]);
            self.launch_entry(pre.entry, grid, block, 0, s, &mut params)?;
        }
        let shared = cfg.shared_bytes.max(variant_smem);
        self.launch_entry(entry, [gx, gy, gz], cfg.block, shared, s, &mut params)?;
        match (&self.timing, timed) {
            (Some(t), Some(start)) => t.end(kernel, entry.name, start, s),
            _ => Ok(()),
        }
    }

    fn kernel_times(&self) -> Result<Vec<strata_core::KernelTime>> {
        self.bind()?;
        match &self.timing {
            Some(t) => t.drain(),
            None => Ok(Vec::new()),
        }
    }

    fn begin_capture(&self, stream: RawStream) -> Result<()> {
        self.bind()?;
        let s = self.stream(stream)?;
        // SAFETY: valid stream. Relaxed: core, not the driver, refuses what capture
        // forbids, and relaxed mode lets other threads keep using the device meanwhile.
        check("cuStreamBeginCapture_v2", unsafe {
            sys::cuStreamBeginCapture_v2(
                s,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        })
    }

    fn end_capture(&self, stream: RawStream) -> Result<RawGraph> {
        self.bind()?;
        let s = self.stream(stream)?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: valid stream; writes the graph handle.
        check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(s, &mut graph)
        })?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: the graph just captured; the template is not needed once instantiated.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        // SAFETY: a graph we own.
        unsafe { sys::cuGraphDestroy(graph) };
        check("cuGraphInstantiateWithFlags", r)?;
        if let Some(t) = &self.timing {
            t.captured_as(exec as u64);
        }
        Ok(RawGraph(exec as u64))
    }

    fn replay(&self, graph: RawGraph, stream: RawStream, _site: Site) -> Result<()> {
        self.bind()?;
        let s = self.stream(stream)?;
        if let Some(t) = &self.timing {
            t.replayed(graph.0);
        }
        // SAFETY: an executable graph this backend instantiated.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(graph.0 as sys::CUgraphExec, s)
        })
    }

    fn destroy_graph(&self, graph: RawGraph) {
        if self.bind().is_err() {
            return;
        }
        if let Some(t) = &self.timing {
            t.destroyed(graph.0);
        }
        // SAFETY: core destroys a graph once, after its replays completed.
        if let Err(e) = check("cuGraphExecDestroy", unsafe {
            sys::cuGraphExecDestroy(graph.0 as sys::CUgraphExec)
        }) {
            tracing::error!("cuda: {e}");
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
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    fn copy_h2d_unordered(
        &self,
        dst: RawBuffer,
        dst_offset: usize,
        src: &[u8],
        _site: Site,
    ) -> Result<()> {
        self.bind()?;
        // The founding bug, on purpose: the synchronous API from pageable memory may
        // return once the bytes are staged, before the DMA lands, and nothing orders a
        // non-blocking stream after it.
        // SAFETY: `src` is valid for its length; the destination range is the caller's.
        check("cuMemcpyHtoD_v2", unsafe {
            sys::cuMemcpyHtoD_v2(
                dst.0 + dst_offset as u64,
                src.as_ptr().cast::<c_void>(),
                src.len(),
            )
        })
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            // SAFETY: the device's own work must finish before its modules and streams go.
            unsafe {
                sys::cuCtxSynchronize();
            }
            self.kernels = None;
            for e in lock(&self.event_pool).drain(..) {
                // SAFETY: pooled events are idle.
                unsafe { sys::cuEventDestroy_v2(e as sys::CUevent) };
            }
            for slot in self
                .streams
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .drain(..)
            {
                // SAFETY: idle after the synchronisation above.
                unsafe {
                    sys::cuStreamDestroy_v2(slot.handle as sys::CUstream);
                    sys::cuMemFree_v2(slot.scratch);
                }
            }
        }
        // SAFETY: balances the retain in `new`.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}
