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

    /// A copy of `src` in its own anonymous mapping with transparent huge pages asked for
    /// (weights read by every decode step: on a VM, 4 KiB pages made streaming them 35-50%
    /// slower from TLB misses). `None` when the mapping cannot be made.
    pub fn huge_copy(src: &[u8]) -> Option<Self> {
        let mut map = memmap2::MmapMut::map_anon(src.len().max(1)).ok()?;
        // Advice only: without THP the copy still works, on small pages.
        let _ = map.advise(memmap2::Advice::HugePage);
        map[..src.len()].copy_from_slice(src);
        Some(AlignedBytes {
            ptr: map.as_mut_ptr(),
            len: src.len(),
            storage: Storage::Mapped(map),
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

/// Drops this process's page-table entries for the whole pages inside `src` when `src`
/// lies in a read-only file mapping (a model file), so pages that were copied
/// elsewhere stop counting in the resident set; reading them again faults them back in
/// from the page cache, unchanged. Anything else (heap, anonymous or writable memory,
/// where dropping pages would lose data) is left alone. Linux only.
pub fn release_file_pages(src: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        let page = 4096;
        let (start, end) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
        let (lo, hi) = (start.next_multiple_of(page), end / page * page);
        if hi <= lo || !in_read_only_file_mapping(start, end) {
            return;
        }
        // SAFETY: [lo, hi) lies inside a read-only file mapping (checked above), whose
        // pages are clean page-cache pages: MADV_DONTNEED only unmaps them, later reads
        // fault them back in with the same bytes; no data is lost, no reference dangles.
        unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = src;
}

/// Whether `[start, end)` lies in one mapping of /proc/self/maps that is read-only and
/// backed by a file (a non-zero inode).
#[cfg(target_os = "linux")]
fn in_read_only_file_mapping(start: usize, end: usize) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    maps.lines().any(|line| {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(_offset), Some(_dev), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        let Some((a, b)) = range.split_once('-') else {
            return false;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            return false;
        };
        a <= start && end <= b && perms.starts_with("r--") && inode != "0"
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    /// A huge-page copy holds the source's bytes; releasing the pages of memory that is
    /// not a read-only file mapping (here: the heap, where MADV_DONTNEED would zero them)
    /// leaves it untouched.
    #[test]
    fn huge_copy_is_exact_and_heap_pages_are_kept() {
        let src = pattern(3 << 20);
        let copy = AlignedBytes::huge_copy(&src).unwrap();
        // SAFETY: the copy owns len bytes at ptr.
        let got = unsafe { std::slice::from_raw_parts(copy.as_ptr(), copy.len()) };
        assert!(got == src.as_slice());
        release_file_pages(&src);
        assert!(src == pattern(3 << 20), "heap bytes changed");
    }

    /// Released pages of a read-only file mapping read back unchanged (from the page
    /// cache).
    #[test]
    fn released_file_pages_read_back_unchanged() {
        let path = std::env::temp_dir().join(format!("strata-release-{}", std::process::id()));
        std::fs::write(&path, pattern(1 << 20)).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the file is ours and not modified while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let sum = |m: &[u8]| m.iter().map(|&b| u64::from(b)).sum::<u64>();
        let before = sum(&map);
        release_file_pages(&map[100..(1 << 20) - 100]);
        assert_eq!(sum(&map), before);
        assert!(map[..] == pattern(1 << 20)[..]);
        drop(map);
        let _ = std::fs::remove_file(&path);
    }
}
