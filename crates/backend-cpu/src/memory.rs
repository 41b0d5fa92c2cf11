//! Host allocations standing in for device memory and pinned memory.

use std::alloc::Layout;
use std::sync::{Arc, Mutex, RwLock};

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
    /// A stretch of an [`Arena`] chunk, which is unmapped when its last block drops.
    Packed(#[allow(dead_code)] Arc<memmap2::MmapMut>),
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
        // A mapping is unmapped when its (last) `MmapMut` drops.
        if !matches!(self.storage, Storage::Heap) {
            return;
        }
        if let Ok(layout) = Layout::from_size_align(self.len.max(1), alloc_align()) {
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

/// Size of a huge page (x86-64 and most aarch64 kernels): the unit [`Arena`] collapses.
const HUGE_PAGE: usize = 2 << 20;

/// Copies of small imported blocks (model tensors under 2 MiB: attention matrices, norms)
/// packed one after another into shared anonymous chunks, so that they too are read from
/// huge pages, and so that a model's file pages can all be dropped once its tensors are
/// copied (where some stay borrowed from the file mapping, the kernel maps the file's
/// large folios around them, megabytes of neighbouring tensors already copied).
///
/// A chunk is filled on 4 KiB pages and each 2 MiB stretch is collapsed into a huge page
/// once it is full (`MADV_COLLAPSE`): asking for huge pages up front would make the
/// last, partly filled stretch cost a whole huge page.
pub struct Arena {
    chunk: Option<Chunk>,
    /// Address space of a chunk; only the bytes written become resident.
    chunk_size: usize,
}

impl Default for Arena {
    fn default() -> Self {
        Arena {
            chunk: None,
            chunk_size: 64 << 20,
        }
    }
}

struct Chunk {
    map: Arc<memmap2::MmapMut>,
    /// `map`'s first byte (writes go through it: the `Arc` hands out no `&mut`).
    base: *mut u8,
    used: usize,
}

// SAFETY: `base` points into `map`, which the chunk owns; the arena is used under a lock.
unsafe impl Send for Chunk {}

impl Arena {
    /// A copy of `src` in the current chunk (a new one when it does not fit). `None` when
    /// no chunk can be mapped.
    pub fn copy(&mut self, src: &[u8]) -> Option<AlignedBytes> {
        let len = src.len();
        let fits = |c: &Chunk| c.used.next_multiple_of(ALIGN) + len <= c.map.len();
        if !self.chunk.as_ref().is_some_and(fits) {
            let mut map = memmap2::MmapMut::map_anon(self.chunk_size.max(len).max(1)).ok()?;
            let base = map.as_mut_ptr();
            self.chunk = Some(Chunk {
                map: Arc::new(map),
                base,
                used: 0,
            });
        }
        let c = self.chunk.as_mut()?;
        let start = c.used.next_multiple_of(ALIGN);
        // SAFETY: [start, start + len) lies inside the chunk (checked above) and past every
        // block handed out so far, so nothing else reads or writes it.
        let dst = unsafe { c.base.add(start) };
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, len) };
        let base = c.base as usize;
        collapse_full(base, base + c.used, base + start + len);
        c.used = start + len;
        Some(AlignedBytes {
            ptr: dst,
            len,
            storage: Storage::Packed(c.map.clone()),
        })
    }
}

/// Collapses into huge pages the aligned 2 MiB stretches of a chunk starting at `chunk`
/// whose last byte was just written: those ending in `(was, now]`, with every byte from
/// `chunk` to `now` written (a stretch with unwritten pages would make them resident).
/// Advice only: where THP is unavailable the pages stay small.
fn collapse_full(chunk: usize, was: usize, now: usize) {
    #[cfg(target_os = "linux")]
    {
        /// linux/mman.h (Linux 6.1; older kernels answer EINVAL, which changes nothing).
        const MADV_COLLAPSE: libc::c_int = 25;
        let mut start = chunk.next_multiple_of(HUGE_PAGE);
        while start + HUGE_PAGE <= now {
            if start + HUGE_PAGE > was {
                // SAFETY: advice on written pages of a mapping this process owns;
                // collapsing keeps their contents.
                unsafe { libc::madvise(start as *mut libc::c_void, HUGE_PAGE, MADV_COLLAPSE) };
            }
            start += HUGE_PAGE;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (chunk, was, now);
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

/// Drops this process's page-table entries for the pages around `src` when `src` lies in
/// a read-only file mapping (a model file) whose tensors are being copied: the whole 2 MiB
/// stretches `src` touches, as far as the mapping goes. Reading `src` for its copy mapped
/// more than `src`: fault-around maps up to 64 KiB around each fault, and a file in large
/// folios (ext4 since Linux 6.16) is mapped 2 MiB at a time, neighbouring tensors copied
/// earlier included. Pages dropped here that are still wanted (a tensor not copied yet,
/// or one left borrowed) fault back in from the page cache, unchanged. Anything else
/// (heap, anonymous or writable memory, where dropping pages would lose data) is left
/// alone. Linux only.
pub fn release_file_pages(src: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        let (start, end) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
        let Some((map_lo, map_hi)) = read_only_file_mapping(start, end) else {
            return;
        };
        let page = 4096;
        let lo = (start - start % HUGE_PAGE).max(map_lo.next_multiple_of(page));
        let hi = end.next_multiple_of(HUGE_PAGE).min(map_hi / page * page);
        if hi <= lo {
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

/// The bounds of the mapping of /proc/self/maps that holds `[start, end)` when it is
/// read-only and backed by a file (a non-zero inode).
#[cfg(target_os = "linux")]
fn read_only_file_mapping(start: usize, end: usize) -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (range, perms, _offset, _dev, inode) =
            (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let (a, b) = range.split_once('-')?;
        let (a, b) = (
            usize::from_str_radix(a, 16).ok()?,
            usize::from_str_radix(b, 16).ok()?,
        );
        (a <= start && end <= b && perms.starts_with("r--") && inode != "0").then_some((a, b))
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

    /// Arena copies are exact, aligned, packed one after another in a chunk, a block that
    /// does not fit starts a new chunk, and blocks outlive the arena. The 5 MiB block
    /// completes two huge-page stretches, which are collapsed: the bytes stay.
    #[test]
    fn arena_packs_exact_aligned_copies() {
        let mut arena = Arena {
            chunk: None,
            chunk_size: 8 << 20,
        };
        let sizes = [100, 5000, 3, 70_000, 5 << 20, 1, 3 << 20];
        let sources: Vec<Vec<u8>> = sizes
            .iter()
            .map(|&n| pattern(n + 1)[1..].to_vec())
            .collect();
        let blocks: Vec<AlignedBytes> = sources.iter().map(|s| arena.copy(s).unwrap()).collect();
        drop(arena);
        for (b, s) in blocks.iter().zip(&sources) {
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            // SAFETY: the block holds len bytes at ptr, kept alive by its chunk.
            let got = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.len()) };
            assert!(got == s.as_slice());
        }
        for i in 0..5 {
            let end = blocks[i].as_ptr() as usize + blocks[i].len();
            let next = blocks[i + 1].as_ptr() as usize;
            assert!(
                next >= end && next - end < ALIGN,
                "block {} not packed",
                i + 1
            );
        }
        // 3 MiB more does not fit in the 8 MiB chunk: a chunk of its own.
        let last = blocks[6].as_ptr() as usize;
        assert!(
            last < blocks[0].as_ptr() as usize || last >= blocks[0].as_ptr() as usize + (8 << 20)
        );
    }

    /// Present bits of this process's pages `[lo, hi)` (/proc/self/pagemap).
    #[cfg(target_os = "linux")]
    fn present(lo: usize, hi: usize) -> Vec<bool> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
        f.seek(SeekFrom::Start((lo / 4096 * 8) as u64)).unwrap();
        let mut buf = vec![0u8; (hi - lo) / 4096 * 8];
        f.read_exact(&mut buf).unwrap();
        buf.chunks(8)
            .map(|e| u64::from_le_bytes(e.try_into().unwrap()) >> 63 == 1)
            .collect()
    }

    /// Releasing a slice of a file mapping drops the whole 2 MiB stretches around it (what
    /// fault-around or a large folio mapped with it), within the mapping, and nothing else.
    #[cfg(target_os = "linux")]
    #[test]
    fn release_drops_the_stretches_around_a_slice() {
        let len = 8 << 20;
        let path = std::env::temp_dir().join(format!("strata-stretch-{}", std::process::id()));
        std::fs::write(&path, pattern(len)).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the file is ours and not modified while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let base = map.as_ptr() as usize;
        assert!(map.iter().map(|&b| u64::from(b)).sum::<u64>() > 0);
        let (start, end) = (base + (4 << 20) + 100, base + (4 << 20) + 300);
        release_file_pages(&map[start - base..end - base]);
        let (lo, hi) = (
            start / HUGE_PAGE * HUGE_PAGE,
            end.next_multiple_of(HUGE_PAGE),
        );
        let (mut kept, mut outside) = (0, 0);
        for (i, p) in present(base, base + len).into_iter().enumerate() {
            let page = base + i * 4096;
            if (lo..hi).contains(&page) {
                assert!(!p, "page {i} of the stretch is still mapped");
            } else {
                outside += 1;
                kept += usize::from(p);
            }
        }
        // Outside the stretch, everything read stays (bar what reclaim takes meanwhile).
        assert!(kept * 10 >= outside * 9, "{kept} of {outside} pages kept");
        assert!(map[..] == pattern(len)[..]);
        drop(map);
        let _ = std::fs::remove_file(&path);
    }
}
