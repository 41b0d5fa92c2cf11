//! Host allocations standing in for device memory and pinned memory.

use std::alloc::Layout;
use std::sync::{Mutex, RwLock};

use crate::sanitizer::AccessLog;

/// Alignment of every allocation: enough for any SIMD load the kernels make.
pub const ALIGN: usize = 64;

/// Blocks from this size on are anonymous mappings of their own rather than heap blocks:
/// their pages are zero without a memset and stay out of the resident set until a kernel
/// first writes them (a scratch sized for a full batch costs only the rows a batch uses),
/// and freeing one returns its pages to the system at once (glibc would keep a freed
/// heap block, and raises its mmap threshold after each large free, so the next context's
/// buffers would land in the retained heap).
const MAP_FROM: usize = 64 << 10;

enum Storage {
    /// A heap block of `Layout::from_size_align(len.max(1), alloc_align())`.
    Heap,
    /// Its own anonymous mapping (page-aligned, zero-filled on first touch).
    Mapped(#[allow(dead_code)] memmap2::MmapMut),
    /// Borrowed (imported) host memory, never freed here.
    Borrowed,
}

/// A zeroed block aligned to [`alloc_align`].
pub struct AlignedBytes {
    ptr: *mut u8,
    len: usize,
    storage: Storage,
}

// SAFETY: a plain owned heap block or mapping (or borrowed memory whose owner keeps it
// alive and unchanged while this exists).
unsafe impl Send for AlignedBytes {}
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> Option<Self> {
        if len >= MAP_FROM {
            let mut map = memmap2::MmapMut::map_anon(len).ok()?;
            return Some(AlignedBytes {
                ptr: map.as_mut_ptr(),
                len,
                storage: Storage::Mapped(map),
            });
        }
        let layout = Layout::from_size_align(len.max(1), alloc_align()).ok()?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(AlignedBytes {
            ptr,
            len,
            storage: Storage::Heap,
        })
    }

    /// Borrowed memory; the caller keeps it alive and unchanged while this exists.
    pub fn borrowed(ptr: *const u8, len: usize) -> Self {
        AlignedBytes {
            ptr: ptr as *mut u8,
            len,
            storage: Storage::Borrowed,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_owned(&self) -> bool {
        !matches!(self.storage, Storage::Borrowed)
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        // A mapping is unmapped when its `MmapMut` drops.
        if !matches!(self.storage, Storage::Heap) {
            return;
        }
        if let Ok(layout) = Layout::from_size_align(self.len.max(1), alloc_align()) {
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

/// The one alignment used for every heap block, so `Drop` can rebuild the layout
/// (mappings are page-aligned).
pub fn alloc_align() -> usize {
    ALIGN.max(4096)
}

/// One "device" allocation: its bytes behind a lock (kernels on different stream threads
/// take it shared or exclusive, so even a racing program stays memory-safe) and, in
/// sanitizer mode, the log of its accesses.
pub struct CpuBuffer {
    pub id: u64,
    pub data: RwLock<AlignedBytes>,
    pub log: Mutex<AccessLog>,
}
