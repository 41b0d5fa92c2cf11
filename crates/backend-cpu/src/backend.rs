//! `Backend` for the CPU: streams are worker threads, device memory is host memory,
//! graphs are recorded operation lists, and in sanitizer mode uploads land after a random
//! simulated DMA delay while every access is checked against the fences it should have
//! waited for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use strata_core::{
    Access, Backend, BackendKind, Capabilities, DeviceInfo, Error, Hazard, KernelArg, KernelId,
    LaunchCfg, MemInfo, RawBuffer, RawEvent, RawGraph, RawPinned, RawStream, Result, Site,
};

use crate::CpuOptions;
use crate::kernels;
use crate::memory::{AlignedBytes, Arena, CpuBuffer};
use crate::profile::{self, KernelTimes};
use crate::sanitizer::{AccessLog, DelayRng, VClock};
use crate::shared::{RecordedOp, Shared, driver, lock, mem_total};
use crate::worker::{EventState, StreamWorker, idle_spin};

pub(crate) const NAME: &str = "cpu";
/// Worker 0 is the "legacy" queue of unordered copies; user streams start at 1.
pub(crate) const LEGACY: usize = 0;

/// The CPU backend. Create a [`strata_core::Device`] over it with [`crate::device`].
pub struct CpuBackend {
    sh: Arc<Shared>,
}

impl CpuBackend {
    pub fn new(opts: CpuOptions) -> Result<Self> {
        let legacy = StreamWorker::spawn(LEGACY as u32, idle_spin(opts.stream_spin_us))
            .map_err(|e| driver("spawn", e.to_string()))?;
        let total_memory = opts.memory_limit.unwrap_or_else(mem_total);
        let seed = opts.seed;
        let pool = kernels::thread_pool(opts.threads).map_err(|e| driver("threads", e))?;
        Ok(CpuBackend {
            sh: Arc::new(Shared {
                opts,
                workers: Mutex::new(vec![legacy]),
                buffers: Mutex::new(HashMap::new()),
                pinned: Mutex::new(HashMap::new()),
                events: Mutex::new(HashMap::new()),
                graphs: Mutex::new(HashMap::new()),
                capturing: Mutex::new(HashMap::new()),
                hazards: Mutex::new(Vec::new()),
                failures: Mutex::new(Vec::new()),
                next_id: AtomicU64::new(1),
                allocated: AtomicUsize::new(0),
                arena: Mutex::new(Arena::default()),
                rng: Mutex::new(DelayRng::new(seed)),
                total_memory,
                pool,
                kernel_times: KernelTimes::default(),
            }),
        })
    }
}

fn cpu_arch() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut s = String::from("x86_64");
        if std::arch::is_x86_feature_detected!("avx2") {
            s.push_str("+avx2");
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            s.push_str("+avx512f");
        }
        s
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

impl Backend for CpuBackend {
    fn supports(&self, kernel: KernelId) -> bool {
        kernels::supported(kernel)
    }

    fn info(&self) -> DeviceInfo {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        DeviceInfo {
            backend: BackendKind::Cpu,
            ordinal: 0,
            name: format!("CPU ({threads} threads)"),
            total_memory: self.sh.total_memory,
            arch: cpu_arch(),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            graphs: true,
            pinned_memory: true,
            async_copies: true,
            sanitizer: self.sh.opts.sanitize,
        }
    }

    fn mem_info(&self) -> Result<MemInfo> {
        let used = self.sh.allocated.load(Ordering::Relaxed);
        Ok(MemInfo {
            total: self.sh.total_memory,
            free: self.sh.total_memory.saturating_sub(used),
        })
    }

    fn create_stream(&self) -> Result<RawStream> {
        let mut w = lock(&self.sh.workers);
        let index = w.len() as u32;
        let spin = idle_spin(self.sh.opts.stream_spin_us);
        w.push(StreamWorker::spawn(index, spin).map_err(|e| driver("spawn", e.to_string()))?);
        Ok(RawStream(index))
    }

    fn alloc(&self, bytes: usize) -> Result<RawBuffer> {
        let used = self.sh.allocated.load(Ordering::Relaxed);
        let oom = || Error::OutOfMemory {
            backend: NAME,
            requested: bytes,
            free: self.sh.total_memory.saturating_sub(used),
        };
        if used.saturating_add(bytes) > self.sh.total_memory {
            return Err(oom());
        }
        let data = AlignedBytes::zeroed(bytes).ok_or_else(oom)?;
        self.sh.allocated.fetch_add(bytes, Ordering::Relaxed);
        let id = self.sh.id();
        lock(&self.sh.buffers).insert(
            id,
            Arc::new(CpuBuffer {
                id,
                data: std::sync::RwLock::new(data),
                log: Mutex::new(AccessLog::default()),
            }),
        );
        Ok(RawBuffer(id))
    }

    unsafe fn free(&self, buf: RawBuffer) {
        if let Some(b) = lock(&self.sh.buffers).remove(&buf.0) {
            let len = b
                .data
                .read()
                .map_or(0, |d| if d.is_owned() { d.len() } else { 0 });
            self.sh.allocated.fetch_sub(len, Ordering::Relaxed);
        }
    }

    unsafe fn import_host(&self, ptr: *const u8, len: usize) -> Result<Option<RawBuffer>> {
        // Device memory is host memory: borrow it, or copy big blocks to huge pages. Core
        // refuses every write to it, so the shared bytes are never mutated through this
        // buffer.
        // SAFETY: core guarantees len readable bytes at ptr, alive and unchanged while
        // the buffer exists.
        let data = self
            .sh
            .huge_copy(unsafe { std::slice::from_raw_parts(ptr, len) })
            .unwrap_or_else(|| AlignedBytes::borrowed(ptr, len));
        let id = self.sh.id();
        lock(&self.sh.buffers).insert(
            id,
            Arc::new(CpuBuffer {
                id,
                data: std::sync::RwLock::new(data),
                log: Mutex::new(AccessLog::default()),
            }),
        );
        Ok(Some(RawBuffer(id)))
    }

    unsafe fn register_host(&self, ptr: *const u8, len: usize) -> Result<Option<RawPinned>> {
        // Host memory is already what copies read: the handle only names it, and copies
        // from it run on the stream thread like those from pinned memory. Core never
        // writes through it (`copy_h2d` only reads its source).
        Ok(Some(RawPinned {
            id: self.sh.id(),
            ptr: ptr.cast_mut(),
            len,
        }))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<RawPinned> {
        let mem = AlignedBytes::zeroed(bytes).ok_or(Error::OutOfMemory {
            backend: NAME,
            requested: bytes,
            free: 0,
        })?;
        let id = self.sh.id();
        let raw = RawPinned {
            id,
            ptr: mem.as_ptr(),
            len: mem.len(),
        };
        lock(&self.sh.pinned).insert(id, mem);
        Ok(raw)
    }

    unsafe fn free_pinned(&self, pinned: RawPinned) {
        lock(&self.sh.pinned).remove(&pinned.id);
    }

    fn record_event(&self, stream: RawStream) -> Result<RawEvent> {
        if lock(&self.sh.capturing).contains_key(&stream.0) {
            return Err(Error::Capture(
                "event record on a capturing CPU stream".into(),
            ));
        }
        let worker = self.sh.worker(stream)?;
        let clock: Arc<Mutex<Option<VClock>>> = Arc::new(Mutex::new(None));
        let c = clock.clone();
        let target = worker.push(Box::new(move |ctx| {
            *lock(&c) = Some(ctx.clock.clone());
        }));
        let id = self.sh.id();
        lock(&self.sh.events).insert(
            id,
            Arc::new(EventState {
                worker,
                target,
                clock,
            }),
        );
        Ok(RawEvent(id))
    }

    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        if lock(&self.sh.capturing).contains_key(&stream.0) {
            return Err(Error::Capture(
                "event wait on a capturing CPU stream".into(),
            ));
        }
        let ev = lock(&self.sh.events)
            .get(&event.0)
            .cloned()
            .ok_or_else(|| driver("stream_wait_event", format!("unknown event {}", event.0)))?;
        self.sh.worker(stream)?.push(Box::new(move |ctx| {
            ev.wait();
            if let Some(c) = lock(&ev.clock).as_ref() {
                ctx.clock.merge(c);
            }
        }));
        Ok(())
    }

    fn event_done(&self, event: RawEvent) -> Result<bool> {
        Ok(lock(&self.sh.events).get(&event.0).is_none_or(|e| e.done()))
    }

    fn event_wait(&self, event: RawEvent) -> Result<()> {
        let ev = lock(&self.sh.events).get(&event.0).cloned();
        if let Some(ev) = ev {
            ev.wait();
        }
        self.sh.take_failures()
    }

    fn destroy_event(&self, event: RawEvent) {
        lock(&self.sh.events).remove(&event.0);
    }

    unsafe fn copy_h2d(
        &self,
        stream: RawStream,
        dst: RawBuffer,
        dst_offset: usize,
        src: &RawPinned,
        src_offset: usize,
        bytes: usize,
        site: Site,
    ) -> Result<()> {
        if src_offset + bytes > src.len {
            return Err(driver(
                "copy_h2d",
                "source range past the pinned buffer".into(),
            ));
        }
        let d = self.sh.buffer(dst)?;
        let src_ptr = src.ptr as usize + src_offset;
        let sh = self.sh.clone();
        self.sh.worker(stream)?.push(Box::new(move |ctx| {
            sh.delay();
            let r = sh.with_locked(ctx, site, &[(d, Access::Write)], |p| {
                let (dp, dl) = p[0];
                if dst_offset + bytes > dl {
                    return Err("upload past the end of the buffer".to_string());
                }
                // SAFETY: core keeps the pinned source alive and unchanged until this
                // copy's event completes; bounds checked above.
                unsafe {
                    std::ptr::copy_nonoverlapping(src_ptr as *const u8, dp.add(dst_offset), bytes)
                };
                Ok(())
            });
            if let Err(e) = r {
                sh.fail(format!("upload at {site}: {e}"));
            }
        }));
        Ok(())
    }

    unsafe fn copy_d2h(
        &self,
        stream: RawStream,
        dst: &RawPinned,
        dst_offset: usize,
        src: RawBuffer,
        src_offset: usize,
        bytes: usize,
        site: Site,
    ) -> Result<()> {
        if dst_offset + bytes > dst.len {
            return Err(driver(
                "copy_d2h",
                "destination range past the pinned buffer".into(),
            ));
        }
        let s = self.sh.buffer(src)?;
        let dst_ptr = dst.ptr as usize + dst_offset;
        let sh = self.sh.clone();
        self.sh.worker(stream)?.push(Box::new(move |ctx| {
            let r = sh.with_locked(ctx, site, &[(s, Access::Read)], |p| {
                let (sp, sl) = p[0];
                if src_offset + bytes > sl {
                    return Err("download past the end of the buffer".to_string());
                }
                // SAFETY: core keeps the pinned destination alive and unread until this
                // copy's event completes; bounds checked above.
                unsafe {
                    std::ptr::copy_nonoverlapping(sp.add(src_offset), dst_ptr as *mut u8, bytes)
                };
                Ok(())
            });
            if let Err(e) = r {
                sh.fail(format!("download at {site}: {e}"));
            }
        }));
        Ok(())
    }

    fn copy_d2d(
        &self,
        stream: RawStream,
        dst: RawBuffer,
        dst_offset: usize,
        src: RawBuffer,
        src_offset: usize,
        bytes: usize,
        site: Site,
    ) -> Result<()> {
        let op = RecordedOp::Copy {
            dst,
            dst_offset,
            src,
            src_offset,
            bytes,
        };
        if let Some(ops) = lock(&self.sh.capturing).get_mut(&stream.0) {
            ops.push(op);
            return Ok(());
        }
        self.sh.enqueue(stream, op, site)
    }

    fn launch(
        &self,
        stream: RawStream,
        kernel: KernelId,
        cfg: &LaunchCfg,
        args: &[KernelArg],
        site: Site,
    ) -> Result<()> {
        // Aliasing is refused at launch (and at capture), not later on a worker.
        self.sh.launch_buffers(args)?;
        let op = RecordedOp::Launch {
            kernel,
            cfg: *cfg,
            args: args.to_vec(),
        };
        if let Some(ops) = lock(&self.sh.capturing).get_mut(&stream.0) {
            ops.push(op);
            return Ok(());
        }
        self.sh.enqueue(stream, op, site)
    }

    fn begin_capture(&self, stream: RawStream) -> Result<()> {
        self.sh.worker(stream)?;
        let mut c = lock(&self.sh.capturing);
        if c.contains_key(&stream.0) {
            return Err(Error::Capture(format!(
                "CPU stream {} is already capturing",
                stream.0
            )));
        }
        c.insert(stream.0, Vec::new());
        Ok(())
    }

    fn end_capture(&self, stream: RawStream) -> Result<RawGraph> {
        let ops = lock(&self.sh.capturing)
            .remove(&stream.0)
            .ok_or_else(|| Error::Capture(format!("CPU stream {} is not capturing", stream.0)))?;
        let id = self.sh.id();
        lock(&self.sh.graphs).insert(id, Arc::new(ops));
        Ok(RawGraph(id))
    }

    fn replay(&self, graph: RawGraph, stream: RawStream, site: Site) -> Result<()> {
        let ops = lock(&self.sh.graphs)
            .get(&graph.0)
            .cloned()
            .ok_or_else(|| driver("replay", format!("unknown graph {}", graph.0)))?;
        self.sh.enqueue_graph(stream, ops, site)
    }

    fn destroy_graph(&self, graph: RawGraph) {
        lock(&self.sh.graphs).remove(&graph.0);
    }

    fn synchronize(&self) -> Result<()> {
        let workers: Vec<_> = lock(&self.sh.workers).clone();
        for w in workers {
            w.drain();
        }
        self.sh.take_failures()
    }

    fn take_hazards(&self) -> Vec<Hazard> {
        std::mem::take(&mut *lock(&self.sh.hazards))
    }

    fn kernel_times(&self) -> Result<Vec<strata_core::KernelTime>> {
        if !profile::enabled() {
            return Ok(Vec::new());
        }
        self.synchronize()?;
        Ok(self.sh.kernel_times.take())
    }

    fn copy_h2d_unordered(
        &self,
        dst: RawBuffer,
        dst_offset: usize,
        src: &[u8],
        site: Site,
    ) -> Result<()> {
        // Like a pageable cudaMemcpy: the bytes are staged and the call returns; the
        // "DMA" lands later on a queue no user stream is ordered with.
        let d = self.sh.buffer(dst)?;
        let bytes = src.to_vec();
        let sh = self.sh.clone();
        self.sh
            .worker(RawStream(LEGACY as u32))?
            .push(Box::new(move |ctx| {
                sh.delay();
                let r = sh.with_locked(ctx, site, &[(d, Access::Write)], |p| {
                    let (dp, dl) = p[0];
                    if dst_offset + bytes.len() > dl {
                        return Err("unordered upload past the end of the buffer".to_string());
                    }
                    // SAFETY: bounds checked.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            bytes.as_ptr(),
                            dp.add(dst_offset),
                            bytes.len(),
                        )
                    };
                    Ok(())
                });
                if let Err(e) = r {
                    sh.fail(format!("unordered upload at {site}: {e}"));
                }
            }));
        Ok(())
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        let _ = self.synchronize();
    }
}
