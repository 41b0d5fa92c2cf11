//! strata's device layer: the raw verbs every backend implements ([`Backend`]) and the
//! ordered API the engine uses ([`Device`]).
//!
//! Ordering lives here, once: every buffer remembers the fence of its last write and the
//! reads since, and every launch, copy, upload, download or graph replay makes its stream
//! wait for the conflicting accesses of other streams before it is queued. Engine code
//! never sees a raw pointer or a raw copy.

pub mod backend;
mod buffer;
pub mod conformance;
mod device;
mod error;
mod fence;
mod graph;
pub mod kernel;
mod transfer;

pub use backend::{
    Backend, BackendKind, Capabilities, DeviceInfo, KernelTime, MemInfo, RawBuffer, RawEvent,
    RawGraph, RawPinned, RawStream,
};
pub use buffer::{Args, DeviceBuffer, DeviceSlice, HostMemory, PinnedBuffer};
pub use device::{Device, Event, MemoryReport, Stream, UploadCounts};
pub use error::{Error, Hazard, HazardKind, Result, Site};
pub use graph::Graph;
pub use kernel::{
    ARGMAX_MAX_SPLIT, ARGMAX_UNIT_COLS, ATTENTION_ROWS_MAX_TOKENS, Access, KERNEL_MODULES,
    KernelArg, KernelId, LaunchCfg, argmax_row, argmax_split,
};
pub use transfer::Pending;
