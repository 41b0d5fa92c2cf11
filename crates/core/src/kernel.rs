//! Kernel ids (generated from kernels-cuda/), launch shapes and arguments.

include!(concat!(env!("OUT_DIR"), "/kernel_ids.rs"));

use crate::backend::RawBuffer;

/// Most tokens one `attention_rows` launch may have (kernels.txt): a backend may run it as
/// its `attention`, whose rows stay in one-token order only up to a batch this size.
pub const ATTENTION_ROWS_MAX_TOKENS: u32 = 64;

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
