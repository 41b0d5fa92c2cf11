//! Host allocations standing in for device memory and pinned memory.

use std::alloc::Layout;
use std::sync::{Mutex, RwLock};

use crate::sanitizer::AccessLog;

/// Alignment of every allocation: enough for any SIMD load the kernels make.
pub const ALIGN: usize = 64;

/// A zeroed, 64-byte-aligned heap block.
pub struct AlignedBytes {
    ptr: *mut u8,
    len: usize,
    /// False for borrowed (imported) host memory, which is never freed here.
    owned: bool,
}

// SAFETY: a plain owned heap block.
unsafe impl Send for AlignedBytes {}
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len.max(1), alloc_align()).ok()?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(AlignedBytes {
            ptr,
            len,
            owned: true,
        })
    }

    /// Borrowed memory; the caller keeps it alive and unchanged while this exists.
    pub fn borrowed(ptr: *const u8, len: usize) -> Self {
        AlignedBytes {
            ptr: ptr as *mut u8,
            len,
            owned: false,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_owned(&self) -> bool {
        self.owned
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Ok(layout) = Layout::from_size_align(self.len.max(1), alloc_align()) {
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

/// The one alignment used for every block, so `Drop` can rebuild the layout.
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
