//! Errors of the Device API. Every backend failure maps to one of these; nothing panics.

use std::fmt;

/// Where in the program an operation was issued (from `#[track_caller]`).
pub type Site = &'static std::panic::Location<'static>;

/// What a sanitizer found: an access to a buffer that was not ordered after a
/// conflicting access on another stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hazard {
    pub kind: HazardKind,
    /// The backend's id of the buffer.
    pub buffer: u64,
    /// The access that ran without waiting: its site and stream.
    pub site: String,
    pub stream: u32,
    /// The earlier access it conflicts with.
    pub other_site: String,
    pub other_stream: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HazardKind {
    /// A read not ordered after the buffer's last write (it may see stale data).
    ReadAfterWrite,
    /// A write not ordered after an earlier read (the reader may see the new data).
    WriteAfterRead,
    /// A write not ordered after the previous write.
    WriteAfterWrite,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, other) = match self.kind {
            HazardKind::ReadAfterWrite => ("read", "its last write"),
            HazardKind::WriteAfterRead => ("write", "an earlier read"),
            HazardKind::WriteAfterWrite => ("write", "the previous write"),
        };
        write!(
            f,
            "unordered {what} of buffer #{} at {} (stream {}) did not wait for {other} at {} (stream {})",
            self.buffer, self.site, self.stream, self.other_site, self.other_stream
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{backend}: out of device memory: requested {requested} bytes, {free} bytes free")]
    OutOfMemory {
        backend: &'static str,
        requested: usize,
        free: usize,
    },
    #[error("no {backend} driver found: {reason}")]
    NoDriver {
        backend: &'static str,
        reason: String,
    },
    #[error("{backend}: device {ordinal} not found ({count} present)")]
    NoSuchDevice {
        backend: &'static str,
        ordinal: usize,
        count: usize,
    },
    #[error("{backend}: {call} failed: {message}")]
    Driver {
        backend: &'static str,
        call: &'static str,
        message: String,
    },
    #[error("kernel module {module} failed to compile for {arch}: {log}")]
    Compile {
        module: String,
        arch: String,
        log: String,
    },
    #[error("{op} is not allowed while stream {stream} is capturing a graph (at {site})")]
    CaptureForbidden {
        op: &'static str,
        stream: u32,
        site: Site,
    },
    #[error("graph capture: {0}")]
    Capture(String),
    #[error("{what} is not supported by the {backend} backend")]
    Unsupported {
        what: &'static str,
        backend: &'static str,
    },
    #[error("{op} at {site}: {elements} elements at offset {offset} do not fit a buffer of {len}")]
    OutOfBounds {
        op: &'static str,
        site: Site,
        offset: usize,
        elements: usize,
        len: usize,
    },
    #[error("kernel {kernel} at {site}: {reason}")]
    BadLaunch {
        kernel: &'static str,
        site: Site,
        reason: String,
    },
    #[error("write to a read-only (imported host memory) buffer at {site}")]
    ReadOnly { site: Site },
    #[error("buffer belongs to another device (at {site})")]
    ForeignBuffer { site: Site },
    #[error("sanitizer found {} unordered access(es); first: {}", .0.len(), .0.first().map(|h| h.to_string()).unwrap_or_default())]
    Hazards(Vec<Hazard>),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
