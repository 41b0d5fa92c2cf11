//! Kernel ids (generated from kernels-cuda/), launch shapes and arguments.

include!(concat!(env!("OUT_DIR"), "/kernel_ids.rs"));

use crate::backend::RawBuffer;

/// Most tokens one `attention_rows` launch may have (kernels.txt): a backend may run it as
/// its `attention`, whose rows stay in one-token order only up to a batch this size.
pub const ATTENTION_ROWS_MAX_TOKENS: u32 = 64;

/// Values of a row one argmax_rows launch unit takes, about: a row is split into
/// [`argmax_split`] pieces, each a GPU block's (a 49,152-entry vocabulary is 12 blocks a
/// row, so a one-row step still spreads its reads over 12 SMs).
pub const ARGMAX_UNIT_COLS: u32 = 4096;
/// Most pieces argmax_rows splits a row into (the partial keys a row needs).
pub const ARGMAX_MAX_SPLIT: u32 = 64;

/// How many pieces argmax_rows takes a row of `n_cols` values in.
pub fn argmax_split(n_cols: u32) -> u32 {
    n_cols.div_ceil(ARGMAX_UNIT_COLS).clamp(1, ARGMAX_MAX_SPLIT)
}

/// argmax_rows' rule (kernels.txt), on the host: the index of the largest value, the lowest
/// among equals (-0 equals +0); NaN ranks below every number (-inf included), so it is
/// chosen only from a row of NaNs, which gives 0, as does an empty row. The one
/// definition of a greedy choice: the engine's sampler, the CPU backend's kernel and the
/// conformance suite use it.
pub fn argmax_row(row: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NAN;
    for (i, &v) in row.iter().enumerate() {
        // `>` is false against NaN either way round: the first number replaces a NaN best.
        if v > best_v || (best_v.is_nan() && !v.is_nan()) {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// Grid and block shape of a launch, in CUDA's terms; the CPU backend reads the grid to
/// split work across its threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchCfg {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

impl LaunchCfg {
    /// One-dimensional launch covering `n` items with `block` threads per block.
    pub fn linear(n: usize, block: u32) -> Self {
        let block = block.max(1);
        let blocks = n.div_ceil(block as usize).max(1);
        Self {
            grid: [u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
        }
    }
}

/// How a kernel uses a buffer argument; core orders launches by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    pub fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// One kernel argument as the backend receives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A device buffer starting `offset` bytes in, of which the kernel may touch `bytes`
    /// (the rest of the buffer, or a region's length: the CPU backend hands its kernels
    /// exactly that slice, so an access past a region is an error there; GPU backends
    /// pass only the address).
    Buffer {
        buf: RawBuffer,
        offset: usize,
        bytes: usize,
        access: Access,
    },
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
}
