//! The per-device kernel table: every kernels-cuda/ module compiled (or taken from the
//! cache) and loaded, every `KernelId` resolved once to its `CUfunction`, so a launch is
//! an index, never a string look-up. Also the packing of `KernelArg`s into the
//! parameter array `cuLaunchKernel` reads.

use std::ffi::CString;
use std::path::Path;

use cudarc::driver::sys;
use strata_core::{Error, KernelArg, KernelId};

use crate::compile::{self, Image, Origin};
use crate::driver::{self, check};
use crate::source_scan;

include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));

/// Most arguments one launch may pass (fused.cu's mul_mat_qkv_rope takes 34).
pub(crate) const MAX_ARGS: usize = 40;

/// One resolved kernel.
pub(crate) struct KernelEntry {
    pub func: sys::CUfunction,
    /// Byte size of each parameter, when the driver can tell (`cuFuncGetParamInfo`).
    pub params: Option<Vec<usize>>,
    /// Blocks per thread-block cluster the kernel was compiled for (`__cluster_dims__`,
    /// e.g. attention on sm_90), else 1: the launch rounds its grid up to a multiple
    /// (every kernel takes its work in grid-stride loops, so extra blocks are idle).
    pub cluster_width: u32,
    /// The most dynamic shared memory a launch may give it (bytes): raised to what the
    /// device allows for variants (which may ask for it), else 0.
    pub max_dynamic_smem: u32,
    /// Launched as a programmatic dependent launch (sm_90, the kernel opens with
    /// common.cuh's `pdl_begin()`): it may start before the kernel ahead of it ends.
    pub dependent_launch: bool,
}

impl KernelEntry {
    fn new(func: sys::CUfunction) -> Self {
        Self {
            func,
            params: param_sizes(func),
            cluster_width: cluster_width(func),
            max_dynamic_smem: 0,
            dependent_launch: false,
        }
    }

    /// An entry allowed as much dynamic shared memory as the device gives one block.
    fn with_large_smem(func: sys::CUfunction) -> Self {
        Self {
            max_dynamic_smem: raise_dynamic_smem(func),
            ..Self::new(func)
        }
    }

    /// `grid_x` rounded up to a whole number of clusters.
    pub fn grid_x(&self, grid_x: u32) -> u32 {
        match self.cluster_width {
            0 | 1 => grid_x,
            w => grid_x.div_ceil(w).saturating_mul(w),
        }
    }
}

/// A variant's own grid: the blocks it has work for, from the launch's arguments and block
/// size (`None`: the launch's grid).
pub(crate) type VariantGrid = fn(args: &[KernelArg], block_threads: u32) -> Option<u32>;

/// A kernel the backend launches in place of a listed one when `applies` says so for the
/// launch's arguments: the same signature and bit for bit the same results, compiled for
/// that shape (ggml-cuda likewise picks its matrix-vector kernel for one-token products).
pub(crate) struct Variant {
    pub of: KernelId,
    pub func: &'static str,
    /// `Some(bytes of dynamic shared memory it needs)` when the variant runs this launch,
    /// given the most the kernel may have (`limit`).
    pub applies: fn(args: &[KernelArg], limit: u32) -> Option<u32>,
    /// Whether it may ask for more than the default 48 KiB (the limit is raised at load
    /// only for these: a raised limit can change the L1/shared split of every launch).
    pub large_smem: bool,
    /// The blocks the variant has work for, given the launch's arguments and block size,
    /// when that is fewer than the launch's grid (its kernel's units are coarser): the
    /// launch is cut to them instead of scheduling blocks that exit at once.
    pub grid: Option<VariantGrid>,
}

/// The u32 scalar at argument `i`, if that is one.
fn u32_arg(args: &[KernelArg], i: usize) -> Option<u32> {
    match args.get(i) {
        Some(KernelArg::U32(v)) => Some(*v),
        _ => None,
    }
}

/// Tokens from which products run on tensor cores (kernels-cuda/mma.cuh): below, the
/// weights staged in shared memory would serve too few tokens to pay for staging them.
const MMA_MIN_TOKENS: u32 = 16;
/// Grouped expert products on tensor cores from this many tokens (a few tokens per
/// routed expert, with 8 of 128 experts per token).
const MMA_EXPERTS_MIN_TOKENS: u32 = 64;

/// Slots the grouped expert kernel lists at once (kernels-cuda/model.cu MMA_LIST_MAX).
const MMA_LIST_MAX: u64 = 8192;

/// Dynamic shared memory mma.cuh's kernels take for weights of ggml type `ty` and rows of
/// `k` values (mma_layout, mma_tokens: 64 weight rows and the largest token tile of 32,
/// 16 or 8 that fits `limit` with `extra` bytes besides), or `None` for a format without
/// a tensor-core path.
fn mma_shared_bytes(ty: u32, k: u32, extra: u64, limit: u32) -> Option<u32> {
    let t = tensor_core_format(ty)?;
    let row_bytes = u64::try_from(t.row_bytes(k as usize)?).ok()?;
    let (k, w_stride) = (u64::from(k), row_bytes.div_ceil(16) * 16 + 16);
    [32u64, 16, 8].into_iter().find_map(|tokens| {
        // Weight rows; activation rows, their scales and sums; what the caller adds.
        let bytes = 64 * w_stride + tokens * (k + 16) + tokens * (k / 32) * 8 + extra;
        u32::try_from(bytes).ok().filter(|&b| b <= limit)
    })
}

/// The quantised format of ggml type `ty` if the tensor-core kernels (mma.cuh, mmq.cuh)
/// take it.
fn tensor_core_format(ty: u32) -> Option<strata_quant::QuantType> {
    use strata_quant::QuantType;
    // kernels-cuda/quant.cuh's QUANT_FORMATS.
    const FORMATS: [QuantType; 18] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q2_K,
        QuantType::Q3_K,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
        QuantType::IQ2_XXS,
        QuantType::IQ2_XS,
        QuantType::IQ2_S,
        QuantType::IQ3_XXS,
        QuantType::IQ3_S,
        QuantType::IQ4_NL,
        QuantType::IQ4_XS,
        QuantType::MXFP4,
    ];
    QuantType::from_id(ty).filter(|t| FORMATS.contains(t))
}

/// Launches of more than this many tokens attend on tensor cores (attention_prefill.cuh):
/// the per-row kernel's results do not depend on the batch, which decode steps, verify
/// windows and short reads need; a prefill only needs them within rounding.
const ATTENTION_PER_ROW_MAX_TOKENS: u32 = 64;

/// Dynamic shared memory attention_prefill takes (atp_smem_bytes: 128 query rows and two
/// stages of 64 K and 64 V rows, each row head_dim f16 + 8 of padding), or `None` for a
/// launch it does not take (head_dim not a multiple of 32 or over 128, a group of query
/// heads larger than a block's 128 rows) or that does not fit `limit`.
fn attention_prefill_smem(args: &[KernelArg], limit: u32) -> Option<u32> {
    // attention(q, pos, k, v, out | n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale)
    let (n_tokens, n_head, n_kv_head, head_dim) = (
        u32_arg(args, 5)?,
        u32_arg(args, 6)?,
        u32_arg(args, 7)?,
        u32_arg(args, 8)?,
    );
    let shape_ok = n_kv_head > 0
        && n_head % n_kv_head == 0
        && n_head / n_kv_head <= 128
        && head_dim > 0
        && head_dim % 32 == 0
        && head_dim <= 128;
    if n_tokens <= ATTENTION_PER_ROW_MAX_TOKENS || !shape_ok {
        return None;
    }
    Some((128 + 4 * 64) * (head_dim + 8) * 2).filter(|&b| b <= limit)
}

/// Launches of more than this many tokens run mmq.cuh's kernels (float accumulation over
/// K, within rounding of the one-row kernels); up to it, whose rows must not depend on the
/// batch (decode, verify windows, short reads), the bit-exact ones.
const MMQ_MIN_TOKENS_EXCLUSIVE: u32 = 64;
/// Slots mul_mat_experts_mmq lists at once (kernels-cuda/mmq.cuh MMQ_LIST), 4 bytes each.
const MMQ_LIST: u64 = 1024;

/// Dynamic shared memory mmq.cuh's kernels take for ggml type `ty` (mmq_layout: 128
/// weight rows of 272 int8 bytes and their 8 sub-blocks' float4 terms, the raw bytes of a
/// 256-value chunk of each row, 64 activation rows of 272 bytes and their sub-blocks'
/// float4 terms), plus `extra`, or `None` for a format without that path.
fn mmq_shared_bytes(ty: u32, extra: u64, limit: u32) -> Option<u32> {
    let t = tensor_core_format(ty)?;
    let chunk = u64::try_from(t.row_bytes(256)?).ok()?;
    let mut raw_stride = (chunk.div_ceil(16) + 1) * 16;
    if (raw_stride / 16) % 2 == 0 {
        raw_stride += 16;
    }
    let bytes = 128 * 272 + 8 * 128 * 16 + 128 * raw_stride + 64 * 272 + 8 * 64 * 16;
    u32::try_from(bytes + extra).ok().filter(|&b| b <= limit)
}

/// attention_prefill's units (attention_prefill.cuh): tiles of 16 query rows a warp, as
/// many tokens as fill them with one K/V head's query heads, per K/V head. The model's grid
/// for `attention` is a block per (token, query head), 128 times as many at Qwen3's shape.
fn attention_prefill_grid(args: &[KernelArg], block_threads: u32) -> Option<u32> {
    let (n_tokens, n_head, n_kv_head) = (u32_arg(args, 5)?, u32_arg(args, 6)?, u32_arg(args, 7)?);
    let group = n_head.checked_div(n_kv_head)?;
    let tokens_per_tile = (16 * (block_threads / 32)).checked_div(group)?;
    let tiles = n_tokens.div_ceil(tokens_per_tile.max(1));
    tiles.checked_mul(n_kv_head).map(|b| b.max(1))
}

/// Variants for launches of one token (kernels-cuda/matvec.cuh: fewer registers, no
/// staging) and of many (mma.cuh: tensor cores).
pub(crate) const VARIANTS: &[Variant] = &[
    // mul_mat(w, x, y | type, m, k, n)
    Variant {
        of: KernelId::MulMat,
        func: "mul_mat_vec",
        applies: |a, _| u32_arg(a, 6).is_some_and(|n| n <= 1).then_some(0),
        large_smem: false,
        grid: None,
    },
    Variant {
        of: KernelId::MulMat,
        func: "mul_mat_mmq",
        applies: |a, limit| match (u32_arg(a, 3), u32_arg(a, 6)) {
            (Some(ty), Some(n)) if n > MMQ_MIN_TOKENS_EXCLUSIVE => mmq_shared_bytes(ty, 0, limit),
            _ => None,
        },
        large_smem: true,
        // Units of 128 rows x 64 tokens (mmq.cuh), where ops.rs gives a block per 16 rows
        // and 8 tokens.
        grid: Some(|a, _| {
            let (m, n) = (u32_arg(a, 4)?, u32_arg(a, 6)?);
            m.div_ceil(128).checked_mul(n.div_ceil(64))
        }),
    },
    Variant {
        of: KernelId::MulMat,
        func: "mul_mat_mma",
        applies: |a, limit| match (u32_arg(a, 3), u32_arg(a, 5), u32_arg(a, 6)) {
            (Some(ty), Some(k), Some(n)) if n >= MMA_MIN_TOKENS => {
                mma_shared_bytes(ty, k, 0, limit)
            }
            _ => None,
        },
        large_smem: true,
        grid: None,
    },
    // mul_mat_experts(w, x, ids, y | type, m, k, n_tokens, ...): the ungrouped form.
    Variant {
        of: KernelId::MulMatExperts,
        func: "mul_mat_experts_vec",
        applies: |a, _| u32_arg(a, 7).is_some_and(|n| n <= 2).then_some(0),
        large_smem: false,
        grid: None,
    },
    Variant {
        of: KernelId::MulMatExperts,
        func: "mul_mat_experts_mmq",
        applies: |a, limit| match (u32_arg(a, 4), u32_arg(a, 7)) {
            (Some(ty), Some(n)) if n > MMQ_MIN_TOKENS_EXCLUSIVE => {
                mmq_shared_bytes(ty, MMQ_LIST * 4, limit)
            }
            _ => None,
        },
        large_smem: true,
        grid: None,
    },
    Variant {
        of: KernelId::MulMatExperts,
        func: "mul_mat_experts_mma",
        applies: |a, limit| match (u32_arg(a, 4), u32_arg(a, 6), u32_arg(a, 7), u32_arg(a, 8)) {
            (Some(ty), Some(k), Some(n), Some(used)) if n >= MMA_EXPERTS_MIN_TOKENS => {
                // Room for the listed slots, 4 bytes each.
                let list = (u64::from(n) * u64::from(used)).min(MMA_LIST_MAX) * 4;
                mma_shared_bytes(ty, k, list, limit)
            }
            _ => None,
        },
        large_smem: true,
        grid: None,
    },
    // attention(q, pos, k, v, out | n_tokens, ...): prefill batches on tensor cores.
    Variant {
        of: KernelId::Attention,
        func: "attention_prefill",
        applies: attention_prefill_smem,
        large_smem: true,
        grid: Some(attention_prefill_grid),
    },
];

/// Optional kernels left out unless `STRATA_CUDA_SKIP` is set (to "" for none): on the
/// H200 (Qwen3-30B-A3B-shaped Q4_K, tg128) decode ran at 139.0 tokens/s with them and
/// 157.9 without. Each ends in a one-block tail (top-k, the slot combine and norm) that
/// waits for the whole product, longer than the separate launch it saves.
const SKIPPED_BY_DEFAULT: &str = "router_matvec_topk,experts_down_norm";

/// Whether launches may overlap the kernel ahead of them (programmatic dependent launch,
/// sm_90): `STRATA_CUDA_PDL` = `0` (off), `early` (the next kernel's blocks may be placed
/// once every block of this one has started), `mid` (once every block of a one-token
/// product has read its weights; the default), `late` (as this one's blocks exit). See
/// common.cuh's pdl_begin. H200, tg128 (Qwen3-30B-A3B-shaped Q4_K, two alternating rounds):
/// off 146.3/148.5, late 151.7/153.8, mid 156.0/156.1, early 139.6/139.1 tokens/s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DependentLaunch {
    Off,
    Late,
    Early,
    Mid,
}

/// How the kernel table launches: which optional kernels it leaves out, and whether
/// launches overlap the kernel before them.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Optional (module `fused`) kernels left out, comma-separated.
    pub skip_optional: String,
    pub dependent: DependentLaunch,
}

impl LaunchOptions {
    /// From `STRATA_CUDA_SKIP` (default: [`SKIPPED_BY_DEFAULT`]) and `STRATA_CUDA_PDL`.
    pub fn from_env() -> Self {
        let skip = std::env::var("STRATA_CUDA_SKIP");
        let dependent = match std::env::var("STRATA_CUDA_PDL").as_deref() {
            Ok("0") => DependentLaunch::Off,
            Ok("early") => DependentLaunch::Early,
            Ok("mid") => DependentLaunch::Mid,
            Ok("late") => DependentLaunch::Late,
            _ => DependentLaunch::Mid,
        };
        Self {
            skip_optional: skip.as_deref().unwrap_or(SKIPPED_BY_DEFAULT).to_string(),
            dependent,
        }
    }

    /// Every optional kernel in use (tests of the fused kernels).
    pub fn all_kernels() -> Self {
        Self {
            skip_optional: String::new(),
            ..Self::from_env()
        }
    }
}

/// Writes `value` into the module's `__constant__ uint32_t name` (before any launch).
fn set_module_u32(m: sys::CUmodule, name: &str, value: u32) -> Result<(), Error> {
    let Ok(cname) = CString::new(name) else {
        return Ok(());
    };
    let (mut ptr, mut bytes): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: loaded module; NUL-terminated name; writes a pointer and a size.
    let r = unsafe { sys::cuModuleGetGlobal_v2(&mut ptr, &mut bytes, m, cname.as_ptr()) };
    if r != sys::CUresult::CUDA_SUCCESS || bytes != 4 {
        return Ok(()); // a module that does not include common.cuh
    }
    // SAFETY: a 4-byte device symbol of the current context; synchronous copy.
    check("cuMemcpyHtoD_v2", unsafe {
        sys::cuMemcpyHtoD_v2(ptr, (&value as *const u32).cast(), 4)
    })
}

/// What one launch runs: the kernel or a variant, the dynamic shared memory it asks for,
/// and the variant's own grid, if it has one.
pub(crate) struct LaunchChoice<'a> {
    pub entry: &'a KernelEntry,
    pub dynamic_smem: u32,
    pub grid: Option<VariantGrid>,
}

/// Every module of one context and the kernel table built from them.
pub(crate) struct KernelTable {
    modules: Vec<sys::CUmodule>,
    /// Indexed by `KernelId::index()`; `None` for a kernel no CUDA source defines.
    entries: Vec<Option<KernelEntry>>,
    /// The VARIANTS whose function the modules define, with their entries.
    variants: Vec<(&'static Variant, KernelEntry)>,
    /// How each module was obtained, in `KERNEL_MODULES` order.
    pub origins: Vec<(&'static str, Origin)>,
}

// SAFETY: module and function handles are plain driver handles, valid on any thread
// that has their context current (the backend binds it before every call).
unsafe impl Send for KernelTable {}
unsafe impl Sync for KernelTable {}

/// The embedded source of `module`.
pub(crate) fn source_of(module: &str) -> Option<&'static str> {
    KERNEL_SOURCES
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, s)| *s)
}

fn load_image(image: &Image) -> Result<sys::CUmodule, Error> {
    let mut m: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: a complete cubin, or NUL-terminated PTX; the context is current.
    check("cuModuleLoadData", unsafe {
        sys::cuModuleLoadData(&mut m, image.bytes().as_ptr().cast())
    })?;
    Ok(m)
}

/// Compiles (or takes from `cache_root`) and loads one module.
fn load_module(
    module: &'static str,
    cc: (u32, u32),
    cache_root: Option<&Path>,
) -> Result<(sys::CUmodule, Origin), Error> {
    let arch = format!("sm_{}{}", cc.0, cc.1);
    let source = source_of(module).ok_or_else(|| Error::Compile {
        module: module.to_string(),
        arch: arch.clone(),
        log: "no embedded source for this module".into(),
    })?;
    let stem = compile::cache_stem(module, source, KERNEL_HEADERS);
    let dir = cache_root.map(|r| r.join(&arch));
    if let Some(dir) = &dir
        && let Some((image, path)) = compile::cached_image(dir, &stem, &arch)
    {
        match load_image(&image) {
            Ok(m) => return Ok((m, Origin::Cache(path))),
            Err(e) => {
                // A corrupt or incompatible (e.g. PTX from a newer NVRTC) image: drop it
                // and build a fresh one.
                tracing::warn!(
                    "cuda: cached {} unusable ({e}); recompiling",
                    path.display()
                );
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let (image, target) = compile::nvrtc_compile(module, source, KERNEL_HEADERS, cc.0 * 10 + cc.1)?;
    let m = load_image(&image)?;
    if let Some(dir) = &dir {
        compile::store(dir, &stem, &target, &image);
    }
    Ok((m, Origin::Nvrtc { target }))
}

/// The cluster width `f` requires (1 when it declares none or the driver cannot say). A
/// width above 8 (not portable; Hopper runs 16) is allowed for `f` here, or its launches
/// would fail.
fn cluster_width(f: sys::CUfunction) -> u32 {
    let mut w = 0i32;
    // SAFETY: valid function; writes one integer.
    let r = unsafe {
        sys::cuFuncGetAttribute(
            &mut w,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
            f,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return 1;
    }
    let width = u32::try_from(w).unwrap_or(1).max(1);
    if width > 8 {
        // SAFETY: valid function; sets one attribute.
        let r = unsafe {
            sys::cuFuncSetAttribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                1,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!("cuda: a kernel needs clusters of {width} blocks, not allowed ({r:?})");
        }
    }
    width
}

/// Raises `f`'s dynamic shared memory limit to the most the device allows one block
/// (the opt-in sizes of sm_90, sm_80, sm_86/89, then the default), less its static
/// shared memory; returns the limit set.
fn raise_dynamic_smem(f: sys::CUfunction) -> u32 {
    let mut fixed = 0i32;
    // SAFETY: valid function; writes one integer.
    let r = unsafe {
        sys::cuFuncGetAttribute(
            &mut fixed,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            f,
        )
    };
    let fixed = if r == sys::CUresult::CUDA_SUCCESS {
        fixed.max(0)
    } else {
        0
    };
    for total in [232_448i32, 166_912, 101_376, 49_152] {
        let bytes = total - fixed;
        // SAFETY: valid function; sets one attribute (refused above the device's limit).
        let r = unsafe {
            sys::cuFuncSetAttribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
        };
        if r == sys::CUresult::CUDA_SUCCESS {
            return u32::try_from(bytes).unwrap_or(0);
        }
    }
    0
}

/// Parameter sizes of `f`, or `None` when the driver cannot report them.
fn param_sizes(f: sys::CUfunction) -> Option<Vec<usize>> {
    if !driver::has_symbol("cuFuncGetParamInfo") {
        return None;
    }
    let mut sizes = Vec::new();
    for i in 0..=MAX_ARGS * 4 {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: valid function; writes two integers.
        let r = unsafe { sys::cuFuncGetParamInfo(f, i, &mut offset, &mut size) };
        match r {
            sys::CUresult::CUDA_SUCCESS => sizes.push(size),
            // Past the last parameter. A kernel that seems to take none is left
            // unchecked: the same error could mean the query is not supported for it.
            sys::CUresult::CUDA_ERROR_INVALID_VALUE if !sizes.is_empty() => {
                return Some(sizes);
            }
            _ => return None,
        }
    }
    None
}

impl KernelTable {
    /// Builds the table; the device's context must be current on this thread. Every
    /// kernels-cuda/ module that defines a listed kernel is compiled and loaded; a kernel
    /// with no CUDA definition is left out (`supports` says false for it).
    pub fn load(
        cc: (u32, u32),
        cache_root: Option<&Path>,
        launch: &LaunchOptions,
    ) -> Result<Self, Error> {
        let mut table = KernelTable {
            modules: Vec::new(),
            entries: Vec::with_capacity(KernelId::COUNT),
            variants: Vec::new(),
            origins: Vec::new(),
        };
        let mut loaded: Vec<(&'static str, sys::CUmodule)> = Vec::new();
        // On error `table` drops here and unloads what was loaded.
        for (module, _) in KERNEL_SOURCES {
            if !KernelId::ALL.iter().any(|id| id.module() == *module) {
                tracing::debug!("cuda: kernels-cuda/{module}.cu defines no listed kernel");
                continue;
            }
            let (m, origin) = load_module(module, cc, cache_root)?;
            table.modules.push(m);
            table.origins.push((module, origin));
            loaded.push((module, m));
        }
        let function = |m: sys::CUmodule, name: &str| {
            CString::new(name).ok().and_then(|name| {
                let mut f: sys::CUfunction = std::ptr::null_mut();
                // SAFETY: loaded module; NUL-terminated name.
                let r = unsafe { sys::cuModuleGetFunction(&mut f, m, name.as_ptr()) };
                (r == sys::CUresult::CUDA_SUCCESS).then_some(f)
            })
        };
        // A variant named in STRATA_CUDA_SKIP is left out (its kernel, or another variant,
        // runs those launches): an A/B of a variant without a rebuild.
        let skip = launch.skip_optional.as_str();
        for v in VARIANTS {
            if skip.split(',').any(|n| n.trim() == v.func) {
                tracing::info!("cuda: variant {} left out (STRATA_CUDA_SKIP)", v.func);
                continue;
            }
            let module = loaded.iter().find(|(name, _)| *name == v.of.module());
            if let Some(f) = module.and_then(|&(_, m)| function(m, v.func)) {
                let entry = if v.large_smem {
                    KernelEntry::with_large_smem(f)
                } else {
                    KernelEntry::new(f)
                };
                table.variants.push((v, entry));
            }
        }
        for id in KernelId::ALL {
            let Some(&(_, m)) = loaded.iter().find(|(name, _)| *name == id.module()) else {
                table.entries.push(None);
                continue;
            };
            let func = function(m, id.name());
            match func {
                Some(f) => table.entries.push(Some(KernelEntry::new(f))),
                None => {
                    tracing::warn!(
                        "cuda: kernel {} is not defined in kernels-cuda/{}.cu; it is unsupported",
                        id.name(),
                        id.module()
                    );
                    table.entries.push(None);
                }
            }
        }
        if cc.0 >= 9 && launch.dependent != DependentLaunch::Off {
            table.allow_dependent_launches(launch.dependent)?;
        }
        table.skip_optional(Some(&launch.skip_optional));
        Ok(table)
    }

    /// Marks the kernels whose source opens with `pdl_begin()` for programmatic dependent
    /// launch, and tells every module when to let the next kernel's blocks be placed.
    fn allow_dependent_launches(&mut self, mode: DependentLaunch) -> Result<(), Error> {
        if !driver::has_symbol("cuLaunchKernelEx") {
            return Ok(());
        }
        let trigger = match mode {
            DependentLaunch::Off | DependentLaunch::Late => 0,
            DependentLaunch::Early => 1,
            DependentLaunch::Mid => 2,
        };
        for &m in &self.modules {
            set_module_u32(m, "strata_pdl_trigger", trigger)?;
        }
        let defs = source_scan::kernel_defs();
        let waits = |module: &str, name: &str| {
            defs.iter()
                .any(|d| d.waits_for_previous && d.module == module && d.name == name)
        };
        for (id, entry) in KernelId::ALL.iter().zip(self.entries.iter_mut()) {
            if let Some(e) = entry {
                e.dependent_launch = waits(id.module(), id.name());
            }
        }
        for (v, e) in &mut self.variants {
            e.dependent_launch = waits(v.of.module(), v.func);
        }
        Ok(())
    }

    /// Leaves out the optional (module `fused`) kernels named in `list` (comma-separated,
    /// from `STRATA_CUDA_SKIP`): the engine then runs the op sequences they replace, so one
    /// run can compare the two or step around a faulty fused kernel without a rebuild.
    fn skip_optional(&mut self, list: Option<&str>) {
        for name in list
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
        {
            match KernelId::ALL.iter().find(|id| id.name() == name) {
                Some(id) if id.module() == "fused" => {
                    if let Some(e) = self.entries.get_mut(id.index()) {
                        *e = None;
                        tracing::info!("cuda: {name} left out (STRATA_CUDA_SKIP)");
                    }
                }
                _ if VARIANTS.iter().any(|v| v.func == name) => {} // left out at load
                _ => tracing::warn!("cuda: STRATA_CUDA_SKIP names {name}, not an optional kernel"),
            }
        }
    }

    /// The kernel, or `None` when no CUDA source defines it.
    pub fn get(&self, id: KernelId) -> Option<&KernelEntry> {
        self.entries.get(id.index()).and_then(Option::as_ref)
    }

    /// What a launch of `id` with `args` runs: a variant that applies (with the dynamic
    /// shared memory it needs), else the kernel (with none).
    pub fn for_launch(&self, id: KernelId, args: &[KernelArg]) -> Option<LaunchChoice<'_>> {
        // Only a defined kernel has variants (`supports` answers for the kernel).
        let kernel = self.get(id)?;
        let chosen = self
            .variants
            .iter()
            .filter(|(v, _)| v.of == id)
            .find_map(|(v, e)| {
                (v.applies)(args, e.max_dynamic_smem).map(|smem| LaunchChoice {
                    entry: e,
                    dynamic_smem: smem,
                    grid: v.grid,
                })
            });
        chosen.or(Some(LaunchChoice {
            entry: kernel,
            dynamic_smem: 0,
            grid: None,
        }))
    }
}

impl Drop for KernelTable {
    fn drop(&mut self) {
        for m in self.modules.drain(..) {
            // SAFETY: loaded by this table; no launch is queued after the device drops
            // (the backend synchronises first).
            unsafe {
                sys::cuModuleUnload(m);
            }
        }
    }
}

/// Bytes a parameter of this kind occupies in the kernel's signature.
pub(crate) fn arg_size(a: &KernelArg) -> usize {
    match a {
        KernelArg::Buffer { .. } | KernelArg::U64(_) => 8,
        KernelArg::U32(_) | KernelArg::I32(_) | KernelArg::F32(_) => 4,
    }
}

/// Checks `args` against the kernel's parameter sizes; the reason when they disagree.
pub(crate) fn check_args(params: &[usize], args: &[KernelArg]) -> Result<(), String> {
    if params.len() != args.len() {
        return Err(format!(
            "the kernel takes {} arguments, {} were passed",
            params.len(),
            args.len()
        ));
    }
    for (i, (p, a)) in params.iter().zip(args).enumerate() {
        if *p != arg_size(a) {
            return Err(format!(
                "argument {i} is {} bytes ({a:?}) but the kernel's parameter is {p} bytes",
                arg_size(a)
            ));
        }
    }
    Ok(())
}

/// Writes each argument's value into its own 8-byte slot (the driver copies `size`
/// bytes from each slot's address). Buffers become `CUdeviceptr + offset`.
pub(crate) fn pack(args: &[KernelArg], slots: &mut [u64; MAX_ARGS]) -> Result<usize, String> {
    if args.len() > MAX_ARGS {
        return Err(format!(
            "{} arguments; at most {MAX_ARGS} are supported",
            args.len()
        ));
    }
    let low4 = |b: [u8; 4]| u64::from_ne_bytes([b[0], b[1], b[2], b[3], 0, 0, 0, 0]);
    for (slot, a) in slots.iter_mut().zip(args) {
        *slot = match *a {
            KernelArg::Buffer { buf, offset, .. } => buf
                .0
                .checked_add(offset as u64)
                .ok_or_else(|| format!("buffer offset {offset} overflows the address"))?,
            KernelArg::U64(v) => v,
            KernelArg::U32(v) => low4(v.to_ne_bytes()),
            KernelArg::I32(v) => low4(v.to_ne_bytes()),
            KernelArg::F32(v) => low4(v.to_ne_bytes()),
        };
    }
    Ok(args.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::{Access, RawBuffer};

    /// Every `extern "C" __global__ void name(` in the embedded sources, with its module.
    fn declared() -> Vec<(String, &'static str)> {
        source_scan::kernel_defs()
            .into_iter()
            .map(|d| (d.name, d.module))
            .collect()
    }

    #[test]
    fn every_cuda_kernel_is_a_listed_kernel_of_its_module() {
        // A kernel in kernels-cuda/ that core's list lacks (or files under another
        // module) could never be launched: a typo, caught here.
        let declared = declared();
        assert!(!declared.is_empty());
        for (name, module) in &declared {
            assert!(
                KernelId::ALL
                    .iter()
                    .any(|id| id.name() == name && id.module() == *module)
                    || VARIANTS
                        .iter()
                        .any(|v| v.func == name && v.of.module() == *module),
                "kernels-cuda/{module}.cu defines {name}, which crates/core/kernels.txt does not list under {module}"
            );
        }
    }

    #[test]
    fn every_variant_is_defined_in_its_kernels_module() {
        let declared = declared();
        for v in VARIANTS {
            assert!(
                declared
                    .iter()
                    .any(|(n, m)| n == v.func && *m == v.of.module()),
                "{} (variant of {}) missing from kernels-cuda/{}.cu",
                v.func,
                v.of.name(),
                v.of.module()
            );
        }
    }

    #[test]
    fn variants_apply_to_one_token_launches_only() {
        let buf = KernelArg::Buffer {
            buf: RawBuffer(0x1000),
            offset: 0,
            access: Access::Read,
        };
        let mul_mat = |n| {
            [
                buf,
                buf,
                buf,
                KernelArg::U32(12),
                KernelArg::U32(64),
                KernelArg::U32(256),
                KernelArg::U32(n),
            ]
        };
        let v = VARIANTS.iter().find(|v| v.of == KernelId::MulMat).unwrap();
        assert_eq!((v.applies)(&mul_mat(1), 0), Some(0));
        assert!((v.applies)(&mul_mat(8), 0).is_none());
        assert!((v.applies)(&mul_mat(1)[..6], 0).is_none());
        // Tensor cores for 16 tokens and more, when the tile fits the shared memory.
        let mma = VARIANTS.iter().find(|v| v.func == "mul_mat_mma").unwrap();
        assert!((mma.applies)(&mul_mat(8), 232_448).is_none());
        // Q4_K, 256 values: 64 rows of 144 bytes (+ pad) and 32 tokens of 256 (+ pad) + scales.
        let bytes = 64 * (144 + 16) + 32 * (256 + 16) + 32 * 8 * 8;
        assert_eq!((mma.applies)(&mul_mat(16), 232_448), Some(bytes));
        assert!((mma.applies)(&mul_mat(16), bytes - 1).is_some_and(|b| b < bytes));
        assert!((mma.applies)(&mul_mat(16), 1000).is_none());
        let mut f16 = mul_mat(64);
        f16[3] = KernelArg::U32(1);
        assert!((mma.applies)(&f16, 232_448).is_none());
    }

    #[test]
    fn attention_prefill_applies_to_long_launches_it_can_take() {
        let buf = KernelArg::Buffer {
            buf: RawBuffer(0x1000),
            offset: 0,
            access: Access::Read,
        };
        let attention = |n_tokens, n_head, n_kv_head, head_dim| {
            [
                buf,
                buf,
                buf,
                buf,
                buf,
                KernelArg::U32(n_tokens),
                KernelArg::U32(n_head),
                KernelArg::U32(n_kv_head),
                KernelArg::U32(head_dim),
                KernelArg::U32(4096),
                KernelArg::F32(0.1),
            ]
        };
        let v = VARIANTS
            .iter()
            .find(|v| v.func == "attention_prefill")
            .unwrap();
        // Its grid: 16 tokens x 8 query heads a 256-thread tile, per K/V head.
        let grid = v.grid.unwrap();
        assert_eq!(grid(&attention(4096, 32, 4, 128), 256), Some(1024));
        assert_eq!(grid(&attention(65, 32, 4, 128), 256), Some(20));
        assert_eq!(grid(&attention(100, 8, 2, 64), 128), Some(14));
        // 384 staged rows of 136 f16 for head_dim 128.
        assert_eq!(
            (v.applies)(&attention(65, 32, 4, 128), 232_448),
            Some(104_448)
        );
        assert_eq!(
            (v.applies)(&attention(512, 8, 2, 64), 232_448),
            Some(55_296)
        );
        assert!((v.applies)(&attention(64, 32, 4, 128), 232_448).is_none());
        assert!((v.applies)(&attention(512, 32, 4, 128), 104_447).is_none());
        assert!((v.applies)(&attention(512, 32, 4, 80), 232_448).is_none());
        assert!((v.applies)(&attention(512, 32, 4, 256), 232_448).is_none());
        assert!((v.applies)(&attention(512, 32, 0, 128), 232_448).is_none());
        assert!((v.applies)(&attention(512, 30, 4, 128), 232_448).is_none());
    }

    #[test]
    fn mmq_variants_take_launches_of_more_than_64_tokens() {
        let buf = KernelArg::Buffer {
            buf: RawBuffer(0x1000),
            offset: 0,
            access: Access::Read,
        };
        let mul_mat = |ty, n| {
            [
                buf,
                buf,
                buf,
                KernelArg::U32(ty),
                KernelArg::U32(2048),
                KernelArg::U32(2048),
                KernelArg::U32(n),
            ]
        };
        let experts = |n| {
            let u = KernelArg::U32;
            [
                buf,
                buf,
                buf,
                buf,
                u(12),
                u(768),
                u(2048),
                u(n),
                u(8),
                u(0),
                KernelArg::U64(1),
            ]
        };
        let find = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
        let (dense, experts_v) = (
            &VARIANTS[find("mul_mat_mmq")],
            &VARIANTS[find("mul_mat_experts_mmq")],
        );
        // Q4_K: raw rows of 144 bytes in 11 segments of 16 (an odd count), see mmq_layout.
        let bytes = 128 * 272 + 8 * 128 * 16 + 128 * 176 + 64 * 272 + 8 * 64 * 16;
        assert_eq!(bytes, 99_328);
        assert_eq!((dense.applies)(&mul_mat(12, 65), 232_448), Some(bytes));
        assert!((dense.applies)(&mul_mat(12, 64), 232_448).is_none());
        assert!((dense.applies)(&mul_mat(12, 65), bytes - 1).is_none());
        assert!((dense.applies)(&mul_mat(1, 512), 232_448).is_none());
        assert_eq!(
            (experts_v.applies)(&experts(65), 232_448),
            Some(bytes + 4096)
        );
        assert!((experts_v.applies)(&experts(64), 232_448).is_none());
        // Listed before the bit-exact kernels, which keep 16..64 tokens (for_launch takes
        // the first variant that applies).
        assert!(find("mul_mat_mmq") < find("mul_mat_mma"));
        assert!(find("mul_mat_experts_mmq") < find("mul_mat_experts_mma"));
    }

    #[test]
    fn the_conformance_kernels_are_all_defined() {
        let declared = declared();
        for id in KernelId::ALL
            .iter()
            .filter(|id| id.module() == "conformance")
        {
            assert!(
                declared
                    .iter()
                    .any(|(n, m)| n == id.name() && *m == "conformance"),
                "{} missing from kernels-cuda/conformance.cu",
                id.name()
            );
        }
    }

    #[test]
    fn only_optional_kernels_can_be_skipped() {
        let entry = || {
            Some(KernelEntry {
                func: std::ptr::null_mut(),
                params: None,
                cluster_width: 1,
                max_dynamic_smem: 0,
                dependent_launch: false,
            })
        };
        let mut table = KernelTable {
            modules: Vec::new(),
            entries: KernelId::ALL.iter().map(|_| entry()).collect(),
            variants: Vec::new(),
            origins: Vec::new(),
        };
        table.skip_optional(Some(" mul_mat_qkv,rms_norm,,no_such_kernel"));
        assert!(table.get(KernelId::MulMatQkv).is_none());
        assert!(table.get(KernelId::RmsNorm).is_some());
        assert!(table.get(KernelId::ExpertsDownNorm).is_some());
        table.skip_optional(None);
        assert!(table.get(KernelId::RouterMatvecTopk).is_some());
    }

    #[test]
    fn scalars_are_packed_into_the_low_bytes_of_their_slot() {
        let args = [
            KernelArg::Buffer {
                buf: RawBuffer(0x7000_0000_0000),
                offset: 64,
                access: Access::Read,
            },
            KernelArg::U32(0xdead_beef),
            KernelArg::I32(-2),
            KernelArg::F32(1.5),
            KernelArg::U64(u64::MAX - 1),
        ];
        let mut slots = [0u64; MAX_ARGS];
        assert_eq!(pack(&args, &mut slots), Ok(5));
        let bytes = |i: usize| slots[i].to_ne_bytes();
        assert_eq!(slots[0], 0x7000_0000_0040);
        assert_eq!(
            u32::from_ne_bytes(bytes(1)[..4].try_into().unwrap()),
            0xdead_beef
        );
        assert_eq!(i32::from_ne_bytes(bytes(2)[..4].try_into().unwrap()), -2);
        assert_eq!(f32::from_ne_bytes(bytes(3)[..4].try_into().unwrap()), 1.5);
        assert_eq!(slots[4], u64::MAX - 1);
    }

    #[test]
    fn too_many_or_overflowing_arguments_are_refused() {
        let mut slots = [0u64; MAX_ARGS];
        assert!(pack(&[KernelArg::U32(0); MAX_ARGS + 1], &mut slots).is_err());
        let overflow = KernelArg::Buffer {
            buf: RawBuffer(u64::MAX),
            offset: 1,
            access: Access::Read,
        };
        assert!(pack(&[overflow], &mut slots).is_err());
    }

    #[test]
    fn argument_sizes_are_checked_against_the_signature() {
        let buf = KernelArg::Buffer {
            buf: RawBuffer(0x1000),
            offset: 0,
            access: Access::Write,
        };
        // fill_u32(unsigned int*, unsigned int, unsigned int)
        let sig = [8, 4, 4];
        assert!(check_args(&sig, &[buf, KernelArg::U32(1), KernelArg::U32(2)]).is_ok());
        assert!(check_args(&sig, &[buf, KernelArg::U32(1)]).is_err());
        assert!(check_args(&sig, &[buf, KernelArg::U64(1), KernelArg::U32(2)]).is_err());
    }
}
