//! [`GgufFile`]: a GGUF file mapped into memory, its metadata and tensor index parsed.

use std::collections::HashMap;
use std::path::Path;

use crate::GgufError;
use crate::metadata::Metadata;
use crate::parse::parse;
use crate::tensor::TensorInfo;
use crate::value::Value;

/// Where the file's bytes live: a read-only memory map, or a buffer (tests).
enum Backing {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Mapped(m) => m,
            Self::Owned(v) => v,
        }
    }

    /// Drops the mapped pages of the header (metadata and tensor index) from
    /// this process's memory once they are parsed: everything in them has been
    /// copied, and a vocabulary makes them megabytes. A later read of those
    /// bytes faults them in again from the file.
    fn release_header(&self, data_offset: u64) {
        #[cfg(unix)]
        if let Self::Mapped(m) = self {
            // Whole pages only, so no page of tensor data is touched.
            let len = usize::try_from(data_offset).unwrap_or(0) & !(HEADER_PAGE - 1);
            if len > 0 {
                // SAFETY: the mapping is private, read-only and never written,
                // so MADV_DONTNEED discards nothing: the pages are re-read from
                // the file on the next access, and slices into them stay valid.
                let advised =
                    unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, 0, len) };
                if let Err(e) = advised {
                    tracing::debug!("releasing the GGUF header pages: {e}");
                }
            }
        }
        #[cfg(not(unix))]
        let _ = data_offset;
    }
}

/// The smallest page size (4 KiB). Where pages are larger, madvise rounds the
/// length up and may take the first page of tensor data too: harmless, it is
/// re-read from the file when used.
const HEADER_PAGE: usize = 4096;

/// A parsed GGUF file. Tensor data is never copied: [`GgufFile::tensor_data`]
/// borrows from the mapping.
pub struct GgufFile {
    backing: Backing,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Maps `path` read-only and parses it.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // Mapping an empty file fails on some systems; say what is wrong instead.
            return Err(GgufError::BadMagic { found: Vec::new() });
        }
        // SAFETY: the map is read-only and private to this process. Like every
        // mmap-based reader (llama.cpp included), we rely on the model file not
        // being truncated or rewritten by another process while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_backing(Backing::Mapped(map))
    }

    /// Parses a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(backing: Backing) -> Result<GgufFile, GgufError> {
        let parsed = parse(backing.bytes())?;
        backing.release_header(parsed.data_offset);
        let tensor_index = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            backing,
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            tensor_index,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// Tensors in index order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of `t`, borrowed from the map. Ranges were checked when the
    /// file was opened; a `TensorInfo` from another file gets an empty slice
    /// rather than a panic if its range does not fit this one.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = usize::try_from(t.offset)
            .ok()
            .zip(usize::try_from(t.n_bytes).ok())
            .and_then(|(start, n)| Some(start..start.checked_add(n)?));
        range
            .and_then(|r| self.backing.bytes().get(r))
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}
