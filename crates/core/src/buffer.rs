//! Device buffers (which remember the fences of their last write and the reads since),
//! pinned host buffers, and kernel argument lists.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{RawBuffer, RawEvent, RawPinned};
use crate::device::{Deferred, Inner, fences_of, raw_buffer_arg};
use crate::error::{Error, Result, Site};
use crate::fence::BufferFences;
use crate::kernel::{Access, KernelArg};

/// Host memory a device buffer can borrow without a copy (a memory-mapped model file).
pub trait HostMemory: Send + Sync {
    fn bytes(&self) -> &[u8];
}

pub(crate) struct BufferState {
    pub raw: RawBuffer,
    pub bytes: usize,
    /// Imported host memory: kernels may read it, nothing may write it.
    pub read_only: bool,
    /// Keeps imported host memory alive as long as the buffer.
    _owner: Option<Arc<dyn HostMemory>>,
    device: Arc<Inner>,
    fences: Mutex<BufferFences>,
}

impl BufferState {
    pub(crate) fn fences(&self) -> MutexGuard<'_, BufferFences> {
        self.fences.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub(crate) fn device_id(&self) -> u64 {
        self.device.id
    }
}

impl Drop for BufferState {
    fn drop(&mut self) {
        // The memory is freed once every stream that touched it has passed that access.
        let fences = fences_of(&self.fences());
        self.device
            .defer(Deferred::Buffer(self.raw, self.bytes), fences);
    }
}

/// A typed allocation in device memory.
pub struct DeviceBuffer<T> {
    state: Arc<BufferState>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer#{}[{}]", self.state.raw.0, self.len)
    }
}

impl<T: bytemuck::Pod> DeviceBuffer<T> {
    pub(crate) fn new(device: Arc<Inner>, raw: RawBuffer, len: usize) -> Self {
        Self::with_owner(device, raw, len, None)
    }

    pub(crate) fn with_owner(
        device: Arc<Inner>,
        raw: RawBuffer,
        len: usize,
        owner: Option<Arc<dyn HostMemory>>,
    ) -> Self {
        DeviceBuffer {
            state: Arc::new(BufferState {
                raw,
                bytes: len * std::mem::size_of::<T>(),
                read_only: owner.is_some(),
                _owner: owner,
                device,
                fences: Mutex::new(BufferFences::default()),
            }),
            len,
            _t: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> usize {
        self.state.bytes
    }

    /// The backend's id of this allocation (as sanitizer reports name it).
    pub fn id(&self) -> u64 {
        self.state.raw.0
    }

    pub(crate) fn state(&self) -> &Arc<BufferState> {
        &self.state
    }

    pub(crate) fn check_writable(&self, site: Site) -> Result<()> {
        if self.state.read_only {
            return Err(Error::ReadOnly { site });
        }
        Ok(())
    }

    /// Whether this buffer borrows host memory read-only (see `Device::import_host`).
    pub fn is_read_only(&self) -> bool {
        self.state.read_only
    }

    pub(crate) fn check_range(
        &self,
        op: &'static str,
        offset: usize,
        elements: usize,
        site: Site,
    ) -> Result<()> {
        match offset.checked_add(elements) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfBounds {
                op,
                site,
                offset,
                elements,
                len: self.len,
            }),
        }
    }

    /// Elements `offset..offset + len` as one kernel argument (see [`DeviceSlice`]);
    /// refused when the region does not lie inside the buffer.
    #[track_caller]
    pub fn slice(&self, offset: usize, len: usize) -> Result<DeviceSlice<'_, T>> {
        self.check_range("slice", offset, len, std::panic::Location::caller())?;
        Ok(DeviceSlice {
            buf: self,
            offset,
            len,
        })
    }
}

/// A region of a device buffer (elements `offset..offset + len`) passed to a kernel as
/// if it were a buffer of its own: the kernel gets the region's start, and the CPU backend
/// hands its kernels only the region's elements, so a kernel touching memory past it fails
/// there (and under the sanitizer) as one overrunning a buffer would. Ordering still
/// tracks the whole buffer: a launch on a region waits for, and stamps, every access to
/// the buffer, which costs nothing when a buffer's regions are all used on one stream.
pub struct DeviceSlice<'a, T> {
    buf: &'a DeviceBuffer<T>,
    offset: usize,
    len: usize,
}

impl<T> Clone for DeviceSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DeviceSlice<'_, T> {}

impl<T> std::fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}[{}..+{}]", self.buf, self.offset, self.len)
    }
}

impl<'a, T> DeviceSlice<'a, T> {
    /// The buffer the region lies in.
    pub fn buffer(&self) -> &'a DeviceBuffer<T> {
        self.buf
    }
    /// The region's first element in the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The whole buffer as a region.
impl<'a, T> From<&'a DeviceBuffer<T>> for DeviceSlice<'a, T> {
    fn from(buf: &'a DeviceBuffer<T>) -> Self {
        DeviceSlice {
            buf,
            offset: 0,
            len: buf.len,
        }
    }
}

enum ArgItem<'a> {
    Buffer {
        state: &'a Arc<BufferState>,
        offset_bytes: usize,
        /// Bytes from `offset_bytes` the kernel may touch.
        bytes: usize,
        access: Access,
        in_bounds: bool,
    },
    Scalar(KernelArg),
}

/// A kernel's arguments in order, each buffer declared as read, written or both.
#[derive(Default)]
pub struct Args<'a> {
    items: Vec<ArgItem<'a>>,
}

impl<'a> Args<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// `b[offset..offset + len]`, or from `offset` to the end with `len` `None`.
    fn buffer<T: bytemuck::Pod>(
        mut self,
        b: &'a DeviceBuffer<T>,
        offset: usize,
        len: Option<usize>,
        access: Access,
    ) -> Self {
        let len = len.unwrap_or(b.len.saturating_sub(offset));
        let size = std::mem::size_of::<T>();
        self.items.push(ArgItem::Buffer {
            state: &b.state,
            offset_bytes: offset.saturating_mul(size),
            bytes: len.saturating_mul(size),
            access,
            in_bounds: offset.checked_add(len).is_some_and(|end| end <= b.len),
        });
        self
    }

    pub fn read<T: bytemuck::Pod>(self, b: &'a DeviceBuffer<T>) -> Self {
        self.buffer(b, 0, None, Access::Read)
    }
    pub fn write<T: bytemuck::Pod>(self, b: &'a DeviceBuffer<T>) -> Self {
        self.buffer(b, 0, None, Access::Write)
    }
    pub fn read_write<T: bytemuck::Pod>(self, b: &'a DeviceBuffer<T>) -> Self {
        self.buffer(b, 0, None, Access::ReadWrite)
    }
    /// `b` from element `offset` on (ordering still covers the whole buffer).
    pub fn read_at<T: bytemuck::Pod>(self, b: &'a DeviceBuffer<T>, offset: usize) -> Self {
        self.buffer(b, offset, None, Access::Read)
    }
    pub fn write_at<T: bytemuck::Pod>(self, b: &'a DeviceBuffer<T>, offset: usize) -> Self {
        self.buffer(b, offset, None, Access::Write)
    }
    /// A region read as if it were a buffer of its own (see [`DeviceSlice`]).
    pub fn read_slice<T: bytemuck::Pod>(self, s: DeviceSlice<'a, T>) -> Self {
        self.buffer(s.buf, s.offset, Some(s.len), Access::Read)
    }
    /// A region written as if it were a buffer of its own (see [`DeviceSlice`]).
    pub fn write_slice<T: bytemuck::Pod>(self, s: DeviceSlice<'a, T>) -> Self {
        self.buffer(s.buf, s.offset, Some(s.len), Access::Write)
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.items.push(ArgItem::Scalar(KernelArg::U32(v)));
        self
    }
    pub fn i32(mut self, v: i32) -> Self {
        self.items.push(ArgItem::Scalar(KernelArg::I32(v)));
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.items.push(ArgItem::Scalar(KernelArg::U64(v)));
        self
    }
    pub fn f32(mut self, v: f32) -> Self {
        self.items.push(ArgItem::Scalar(KernelArg::F32(v)));
        self
    }

    pub(crate) fn to_raw(&self, device: u64, site: Site) -> Result<Vec<KernelArg>> {
        self.items
            .iter()
            .map(|it| match it {
                ArgItem::Buffer {
                    state,
                    offset_bytes,
                    bytes,
                    access,
                    in_bounds,
                } => {
                    if state.device_id() != device {
                        return Err(Error::ForeignBuffer { site });
                    }
                    if state.read_only && access.writes() {
                        return Err(Error::ReadOnly { site });
                    }
                    if !in_bounds {
                        return Err(Error::OutOfBounds {
                            op: "kernel argument",
                            site,
                            offset: *offset_bytes,
                            elements: *bytes,
                            len: state.bytes,
                        });
                    }
                    Ok(raw_buffer_arg(state, *offset_bytes, *bytes, *access))
                }
                ArgItem::Scalar(k) => Ok(*k),
            })
            .collect()
    }

    /// Each distinct buffer once, with the union of its accesses.
    pub(crate) fn accesses(&self) -> Vec<(Arc<BufferState>, Access)> {
        let mut out: Vec<(Arc<BufferState>, Access)> = Vec::new();
        for it in &self.items {
            if let ArgItem::Buffer { state, access, .. } = it {
                match out.iter_mut().find(|(b, _)| Arc::ptr_eq(b, state)) {
                    Some((_, a)) => {
                        if *a != *access {
                            *a = Access::ReadWrite;
                        }
                    }
                    None => out.push(((*state).clone(), *access)),
                }
            }
        }
        out
    }
}

/// Page-locked host memory for DMA. The host may read or write it only once the device
/// copies that use it have completed; [`PinnedBuffer::host`] and
/// [`PinnedBuffer::host_mut`] wait for them.
pub struct PinnedBuffer<T> {
    pub(crate) raw: Option<RawPinned>,
    pub(crate) len: usize,
    pub(crate) device: Arc<Inner>,
    pub(crate) pending: Mutex<Vec<RawEvent>>,
    _t: PhantomData<T>,
}

impl<T: bytemuck::Pod> PinnedBuffer<T> {
    pub(crate) fn new(device: Arc<Inner>, raw: RawPinned, len: usize) -> Self {
        // The backend hands out zeroed or at least initialised bytes; make sure.
        // SAFETY: raw.ptr is valid for raw.len bytes and nothing else uses it yet.
        unsafe { std::ptr::write_bytes(raw.ptr, 0, raw.len) };
        PinnedBuffer {
            raw: Some(raw),
            len,
            device,
            pending: Mutex::new(Vec::new()),
            _t: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn wait_pending(&self) -> Result<()> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for e in p.drain(..) {
            let r = self.device.backend.event_wait(e);
            self.device.backend.destroy_event(e);
            r?;
        }
        Ok(())
    }

    fn ptr(&self) -> *mut u8 {
        self.raw.as_ref().map_or(std::ptr::null_mut(), |r| r.ptr)
    }

    /// The contents, after every device copy into or out of this buffer completed.
    pub fn host(&self) -> Result<&[T]> {
        self.wait_pending()?;
        // SAFETY: no device copy is pending; ptr is valid, aligned (backends allocate
        // pinned memory page-aligned) and initialised for len elements.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr() as *const T, self.len) })
    }

    /// Mutable contents, after every device copy using this buffer completed.
    pub fn host_mut(&mut self) -> Result<&mut [T]> {
        self.wait_pending()?;
        // SAFETY: as in `host`, and `&mut self` excludes other host access.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr() as *mut T, self.len) })
    }

    pub(crate) fn raw(&self) -> Option<&RawPinned> {
        self.raw.as_ref()
    }
}

impl<T> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        let events = std::mem::take(self.pending.get_mut().unwrap_or_else(|e| e.into_inner()));
        for e in &events {
            let _ = self.device.backend.event_wait(*e);
            self.device.backend.destroy_event(*e);
        }
        if let Some(raw) = self.raw.take() {
            // SAFETY: every copy using it has completed (waited above).
            unsafe { self.device.backend.free_pinned(raw) };
        }
    }
}
