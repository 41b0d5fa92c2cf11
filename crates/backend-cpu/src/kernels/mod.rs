//! The CPU twin of every kernel in kernels-cuda/, dispatched by `KernelId`. The match is
//! exhaustive, so a kernel added to the CUDA sources without a CPU version fails to build.

mod conformance;
mod experts;
mod model;
mod sample;

pub use model::{KernelPool, thread_pool};

use std::cell::Cell;

use strata_core::{KernelId, LaunchCfg};

/// One argument as a CPU kernel sees it.
#[derive(Clone, Copy, Debug)]
pub enum ArgSlot {
    Buffer {
        ptr: *mut u8,
        len: usize,
        writable: bool,
    },
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
}

/// A kernel's arguments, with the buffers locked for the duration of the call.
pub struct KernelArgs<'a> {
    pub cfg: &'a LaunchCfg,
    slots: Vec<ArgSlot>,
    /// Bit i set once argument i has been handed out mutably (a second time would alias).
    taken_mut: Cell<u64>,
    /// The device's kernel threads; `None` runs everything on the calling stream thread.
    pub pool: Option<&'a KernelPool>,
}

impl<'a> KernelArgs<'a> {
    pub fn new(cfg: &'a LaunchCfg, slots: Vec<ArgSlot>) -> Self {
        KernelArgs {
            cfg,
            slots,
            taken_mut: Cell::new(0),
            pool: None,
        }
    }

    /// The same arguments, with heavy kernels split over `pool`.
    pub fn with_pool(mut self, pool: Option<&'a KernelPool>) -> Self {
        self.pool = pool;
        self
    }

    fn slot(&self, i: usize) -> Result<ArgSlot, String> {
        self.slots
            .get(i)
            .copied()
            .ok_or_else(|| format!("argument {i} missing ({} given)", self.slots.len()))
    }

    fn raw<T: bytemuck::Pod>(&self, i: usize) -> Result<(*mut u8, usize, bool), String> {
        match self.slot(i)? {
            ArgSlot::Buffer { ptr, len, writable } => {
                if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
                    return Err(format!("argument {i} is misaligned for its element type"));
                }
                Ok((ptr, len / std::mem::size_of::<T>(), writable))
            }
            other => Err(format!("argument {i} should be a buffer, got {other:?}")),
        }
    }

    /// Buffer argument `i` as a slice of `T`, from its offset to the end of the buffer.
    pub fn buf<T: bytemuck::Pod>(&self, i: usize) -> Result<&[T], String> {
        let (ptr, n, _) = self.raw::<T>(i)?;
        if self.taken_mut.get() & (1u64 << i.min(63)) != 0 {
            return Err(format!("argument {i} is already borrowed mutably"));
        }
        // SAFETY: the buffer is locked for this call, aligned, and holds n elements.
        Ok(unsafe { std::slice::from_raw_parts(ptr as *const T, n) })
    }

    /// Buffer argument `i` mutably (declared as written); each index at most once.
    #[allow(clippy::mut_from_ref)]
    pub fn buf_mut<T: bytemuck::Pod>(&self, i: usize) -> Result<&mut [T], String> {
        let (ptr, n, writable) = self.raw::<T>(i)?;
        if !writable {
            return Err(format!("argument {i} was declared read-only"));
        }
        let bit = 1u64 << i.min(63);
        if self.taken_mut.get() & bit != 0 {
            return Err(format!("argument {i} borrowed mutably twice"));
        }
        self.taken_mut.set(self.taken_mut.get() | bit);
        // SAFETY: locked exclusively for this call; the launch refused aliasing writes; the
        // bit above prevents a second mutable borrow of the same argument.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut T, n) })
    }

    pub fn u32(&self, i: usize) -> Result<u32, String> {
        match self.slot(i)? {
            ArgSlot::U32(v) => Ok(v),
            other => Err(format!("argument {i} should be u32, got {other:?}")),
        }
    }
    pub fn i32(&self, i: usize) -> Result<i32, String> {
        match self.slot(i)? {
            ArgSlot::I32(v) => Ok(v),
            other => Err(format!("argument {i} should be i32, got {other:?}")),
        }
    }
    pub fn u64(&self, i: usize) -> Result<u64, String> {
        match self.slot(i)? {
            ArgSlot::U64(v) => Ok(v),
            other => Err(format!("argument {i} should be u64, got {other:?}")),
        }
    }
    pub fn f32(&self, i: usize) -> Result<f32, String> {
        match self.slot(i)? {
            ArgSlot::F32(v) => Ok(v),
            other => Err(format!("argument {i} should be f32, got {other:?}")),
        }
    }
}

/// Whether this backend has `kernel`: every listed kernel but the fused forms, except
/// experts_gate_up (the CPU pool's decode step). With only that one, `Ops::has_fused`
/// stays false, so the forward pass keeps running the op sequences on this backend.
pub fn supported(kernel: KernelId) -> bool {
    kernel.module() != "fused" || kernel == KernelId::ExpertsGateUp
}

/// Runs `kernel` with `args` on the calling thread.
pub fn run(kernel: KernelId, args: &KernelArgs<'_>) -> Result<(), String> {
    match kernel {
        KernelId::FillU32 => conformance::fill_u32(args),
        KernelId::AddU32 => conformance::add_u32(args),
        KernelId::CheckTable => conformance::check_table(args),
        KernelId::BusyWait => conformance::busy_wait(args),
        KernelId::EmbedRows => model::embed_rows(args),
        KernelId::RmsNorm => model::rms_norm(args),
        KernelId::MulMat => model::mul_mat(args),
        KernelId::Add => model::add(args),
        KernelId::AddRows => model::add_rows(args),
        KernelId::Swiglu => model::swiglu(args),
        KernelId::Rope => model::rope(args),
        KernelId::KvStore => model::kv_store(args),
        KernelId::Attention => model::attention(args),
        KernelId::AttentionRows => model::attention_rows(args),
        KernelId::RouterTopk => model::router_topk(args),
        KernelId::MulMatExperts => model::mul_mat_experts(args),
        KernelId::MoeCombine => model::moe_combine(args),
        KernelId::SigmoidGateAdd => model::sigmoid_gate_add(args),
        KernelId::KvStoreQ8 => model::kv_store_q8(args),
        KernelId::AttentionQ8 => model::attention_q8(args),
        KernelId::MulMatExpertsCached => experts::mul_mat_experts_cached(args),
        KernelId::MoeCombineSplit => experts::moe_combine_split(args),
        KernelId::ExpertsGateUp => model::experts_gate_up(args),
        KernelId::ArgmaxRows => sample::argmax_rows(args),
        // The other fused forms are a GPU capability: this backend runs their op sequences,
        // which keeps it equal to llama.cpp op by op (`supported` says no).
        KernelId::AddRmsNorm
        | KernelId::CombineAddRmsNorm
        | KernelId::QkNormRopeStore
        | KernelId::MulMatQkv
        | KernelId::RouterMatvecTopk
        | KernelId::MulMatAddRmsNorm
        | KernelId::ExpertsDownNorm
        | KernelId::MulMatQkvRope
        | KernelId::ExpertsGateUpCached => Err(format!(
            "{} is not a CPU kernel (run its op sequence instead)",
            kernel.name()
        )),
    }
}
