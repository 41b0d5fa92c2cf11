//! The per-device kernel table: every kernels-cuda/ module compiled (or taken from the
//! cache) and loaded, every `KernelId` resolved once to its `CUfunction`, so a launch is
//! an index, never a string look-up. Also the packing of `KernelArg`s into the
//! parameter array `cuLaunchKernel` reads.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use cudarc::driver::sys;
use strata_core::{Error, KernelArg, KernelId};

use crate::compile::{self, Image, Origin};
use crate::driver::{self, check};
use crate::launch_options::{DependentLaunch, LaunchOptions};
use crate::source_scan;
use crate::variants::{ALIASES, VARIANTS, Variant, VariantGrid};

include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));

/// Most arguments one launch may pass (fused.cu's mul_mat_qkv_rope takes 34).
pub(crate) const MAX_ARGS: usize = 40;

/// One resolved kernel.
#[derive(Clone)]
pub(crate) struct KernelEntry {
    pub func: sys::CUfunction,
    /// The function's name in its module (the kernel's, or its variant's).
    pub name: &'static str,
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
    fn new(func: sys::CUfunction, name: &'static str) -> Self {
        Self {
            func,
            name,
            params: param_sizes(func),
            cluster_width: cluster_width(func),
            max_dynamic_smem: 0,
            dependent_launch: false,
        }
    }

    /// An entry allowed as much dynamic shared memory as the device gives one block.
    fn with_large_smem(func: sys::CUfunction, name: &'static str) -> Self {
        Self {
            max_dynamic_smem: raise_dynamic_smem(func),
            ..Self::new(func, name)
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

/// The module's `__constant__ uint32_t name`, if it defines one (read once at load).
fn module_u32(m: sys::CUmodule, name: &str) -> Result<Option<u32>, Error> {
    let Ok(cname) = CString::new(name) else {
        return Ok(None);
    };
    let (mut ptr, mut bytes): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: loaded module; NUL-terminated name; writes a pointer and a size.
    let r = unsafe { sys::cuModuleGetGlobal_v2(&mut ptr, &mut bytes, m, cname.as_ptr()) };
    if r != sys::CUresult::CUDA_SUCCESS || bytes != 4 {
        return Ok(None);
    }
    let mut value = 0u32;
    // SAFETY: a 4-byte device symbol of the current context into a live u32 (a synchronous
    // copy: nothing has been launched on the freshly loaded module yet).
    check("cuMemcpyDtoH_v2", unsafe {
        sys::cuMemcpyDtoH_v2((&mut value as *mut u32).cast(), ptr, 4)
    })?;
    Ok(Some(value))
}

/// What one launch runs: the kernel or a variant, the dynamic shared memory it asks for,
/// the variant's own grid, if it has one (replacing the launch's when `grid_exact`, else
/// cutting it), and the kernel to launch first, if it has one.
pub(crate) struct LaunchChoice<'a> {
    pub entry: &'a KernelEntry,
    pub dynamic_smem: u32,
    pub grid: Option<VariantGrid>,
    pub grid_exact: bool,
    pub pre: Option<PreChoice<'a>>,
    /// Whether the stream's scratch is passed as one more argument (a variant with a
    /// pre-launch, or one that says so).
    pub scratch: bool,
}

/// A variant's pre-launch (variants.rs `PreLaunch`): its kernel, grid and block.
pub(crate) struct PreChoice<'a> {
    pub entry: &'a KernelEntry,
    pub grid: u32,
    pub block: u32,
}

/// A variant whose function (and pre-launch's, if it has one) the modules define.
struct LoadedVariant {
    v: &'static Variant,
    entry: KernelEntry,
    pre: Option<KernelEntry>,
    /// Dynamic shared memory every launch needs at least, as the module says
    /// (`<func>_smem`: attention_flash built with ATT_FLASH_STAGED); 0 for most.
    min_smem: u32,
}

/// Every module of one context and the kernel table built from them.
pub(crate) struct KernelTable {
    modules: Vec<sys::CUmodule>,
    /// Indexed by `KernelId::index()`; `None` for a kernel no CUDA source defines.
    entries: Vec<Option<KernelEntry>>,
    /// The VARIANTS whose functions the modules define, with their entries.
    variants: Vec<LoadedVariant>,
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

/// Fills `cache_root` with every module's image for compute capability `cc` without a
/// device (NVRTC only): a machine or container image can be readied before the GPU run, and
/// a tuning experiment (`STRATA_NVRTC_DEFINES`) costs no device time to compile. Returns each
/// module, its image's path and whether it was compiled now (false: already cached).
pub fn precompile(
    cc: (u32, u32),
    cache_root: &Path,
) -> Result<Vec<(&'static str, PathBuf, bool)>, Error> {
    let arch = format!("sm_{}{}", cc.0, cc.1);
    let dir = cache_root.join(&arch);
    let mut fresh = compile_uncached(cc, Some(cache_root));
    let mut done = Vec::new();
    for (module, source) in KERNEL_SOURCES {
        if !KernelId::ALL.iter().any(|id| id.module() == *module) {
            continue;
        }
        let stem = compile::cache_stem(module, source, KERNEL_HEADERS);
        let Some(compiled) = fresh.remove(module) else {
            if let Some(path) = compile::cached_path(&dir, &stem, &arch) {
                done.push((*module, path, false));
                continue;
            }
            return Err(Error::Compile {
                module: module.to_string(),
                arch: arch.clone(),
                log: "neither cached nor compiled".into(),
            });
        };
        let (image, target) = compiled?;
        let path = compile::store(&dir, &stem, &target, &image).ok_or_else(|| Error::Compile {
            module: module.to_string(),
            arch: arch.clone(),
            log: format!("the image could not be written under {}", dir.display()),
        })?;
        done.push((*module, path, true));
    }
    Ok(done)
}

/// An image NVRTC built for a module, with its target, or why it could not.
type Compiled = Result<(compile::Image, String), Error>;

/// NVRTC images of the listed modules `cache_root` does not hold (all of them without a
/// cache), each compiled on a thread of its own: a cold start then costs about the slowest
/// module (model.cu, over a minute on the H200 machine's CPU) instead of the sum of all.
fn compile_uncached(
    cc: (u32, u32),
    cache_root: Option<&Path>,
) -> std::collections::HashMap<&'static str, Compiled> {
    let arch = format!("sm_{}{}", cc.0, cc.1);
    let dir = cache_root.map(|r| r.join(&arch));
    let todo: Vec<(&'static str, &'static str)> = KERNEL_SOURCES
        .iter()
        .filter(|(m, _)| KernelId::ALL.iter().any(|id| id.module() == *m))
        .filter(|(m, src)| {
            let stem = compile::cache_stem(m, src, KERNEL_HEADERS);
            dir.as_ref()
                .is_none_or(|d| compile::cached_path(d, &stem, &arch).is_none())
        })
        .copied()
        .collect();
    std::thread::scope(|s| {
        let jobs: Vec<_> = todo
            .iter()
            .map(|&(m, src)| {
                let job = s.spawn(move || {
                    compile::nvrtc_compile(m, src, KERNEL_HEADERS, cc.0 * 10 + cc.1)
                });
                (m, job)
            })
            .collect();
        jobs.into_iter()
            .map(|(m, job)| {
                let r = job.join().unwrap_or_else(|_| {
                    Err(Error::Compile {
                        module: m.to_string(),
                        arch: arch.clone(),
                        log: "the compiling thread panicked".into(),
                    })
                });
                (m, r)
            })
            .collect()
    })
}

/// Compiles (or takes from `cache_root`, or from `fresh`: images compiled just now) and
/// loads one module.
fn load_module(
    module: &'static str,
    cc: (u32, u32),
    cache_root: Option<&Path>,
    fresh: Option<Compiled>,
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
    let (image, target) = match fresh {
        Some(compiled) => compiled?,
        None => compile::nvrtc_compile(module, source, KERNEL_HEADERS, cc.0 * 10 + cc.1)?,
    };
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
        let mut fresh = compile_uncached(cc, cache_root);
        // On error `table` drops here and unloads what was loaded.
        for (module, _) in KERNEL_SOURCES {
            if !KernelId::ALL.iter().any(|id| id.module() == *module) {
                tracing::debug!("cuda: kernels-cuda/{module}.cu defines no listed kernel");
                continue;
            }
            let (m, origin) = load_module(module, cc, cache_root, fresh.remove(module))?;
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
            let Some(f) = module.and_then(|&(_, m)| function(m, v.func)) else {
                continue;
            };
            let pre = match &v.pre {
                Some(p) => match module.and_then(|&(_, m)| function(m, p.func)) {
                    Some(pf) => Some(KernelEntry::new(pf, p.func)),
                    None => {
                        tracing::warn!("cuda: {} needs {}, not defined; left out", v.func, p.func);
                        continue;
                    }
                },
                None => None,
            };
            // A module built with a data path in dynamic shared memory says how much
            // (attention_flash_smem under ATT_FLASH_STAGED): the kernel gets it on every
            // launch, whatever `applies` says (it cannot see the module's defines).
            let min_smem = match module {
                Some(&(_, m)) => module_u32(m, &format!("{}_smem", v.func))?.unwrap_or(0),
                None => 0,
            };
            let entry = if v.large_smem || min_smem > 0 {
                KernelEntry::with_large_smem(f, v.func)
            } else {
                KernelEntry::new(f, v.func)
            };
            if min_smem > entry.max_dynamic_smem {
                tracing::warn!(
                    "cuda: {} needs {min_smem} bytes of shared memory, the device gives {}; left out",
                    v.func,
                    entry.max_dynamic_smem
                );
                continue;
            }
            if min_smem > 0 {
                tracing::info!(
                    "cuda: {} takes {min_smem} bytes of dynamic shared memory",
                    v.func
                );
            }
            table.variants.push(LoadedVariant {
                v,
                entry,
                pre,
                min_smem,
            });
        }
        for id in KernelId::ALL {
            let Some(&(_, m)) = loaded.iter().find(|(name, _)| *name == id.module()) else {
                table.entries.push(None);
                continue;
            };
            let func = function(m, id.name());
            match func {
                Some(f) => table.entries.push(Some(KernelEntry::new(f, id.name()))),
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
        for a in ALIASES {
            table.entries[a.id.index()] = table.entries[a.runs.index()].clone();
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
                let runs = crate::variants::runs_as(*id).unwrap_or(*id);
                e.dependent_launch = waits(runs.module(), runs.name());
            }
        }
        for lv in &mut self.variants {
            lv.entry.dependent_launch = waits(lv.v.of.module(), lv.v.func);
            if let (Some(p), Some(e)) = (&lv.v.pre, &mut lv.pre) {
                e.dependent_launch = waits(lv.v.of.module(), p.func);
            }
        }
        Ok(())
    }

    /// Leaves out the optional (modules `fused` and `window`) kernels named in `list` (comma-separated,
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
                Some(id) if id.module() == "fused" || id.module() == "window" => {
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
        // A kernel run as another: that one's variants it allows, within its token limit.
        let alias = ALIASES.iter().find(|a| a.id == id);
        if let Some(a) = alias
            && !matches!(args.get(5), Some(KernelArg::U32(n)) if *n <= a.max_tokens)
        {
            return None;
        }
        let of = alias.map_or(id, |a| a.runs);
        let chosen = self
            .variants
            .iter()
            .filter(|lv| lv.v.of == of && alias.is_none_or(|a| a.variants.contains(&lv.v.func)))
            .find_map(|lv| {
                let smem = (lv.v.applies)(args, lv.entry.max_dynamic_smem)?.max(lv.min_smem);
                let pre = match (&lv.v.pre, &lv.pre) {
                    (Some(p), Some(entry)) => Some(PreChoice {
                        entry,
                        grid: (p.grid)(args)?,
                        block: p.block,
                    }),
                    _ => None,
                };
                Some(LaunchChoice {
                    entry: &lv.entry,
                    dynamic_smem: smem,
                    grid: lv.v.grid,
                    grid_exact: lv.v.grid_exact,
                    scratch: lv.v.scratch || pre.is_some(),
                    pre,
                })
            });
        chosen.or(Some(LaunchChoice {
            entry: kernel,
            dynamic_smem: 0,
            grid: None,
            grid_exact: false,
            pre: None,
            scratch: false,
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
                    || VARIANTS.iter().any(|v| {
                        v.of.module() == *module
                            && (v.func == name || v.pre.as_ref().is_some_and(|p| p.func == name))
                    }),
                "kernels-cuda/{module}.cu defines {name}, which crates/core/kernels.txt does not list under {module}"
            );
        }
    }

    #[test]
    fn every_variant_is_defined_in_its_kernels_module() {
        let declared = declared();
        for v in VARIANTS {
            for func in std::iter::once(v.func).chain(v.pre.as_ref().map(|p| p.func)) {
                assert!(
                    declared
                        .iter()
                        .any(|(n, m)| n == func && *m == v.of.module()),
                    "{func} (variant of {}) missing from kernels-cuda/{}.cu",
                    v.of.name(),
                    v.of.module()
                );
            }
        }
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
                name: "test",
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
                bytes: 0,
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
            bytes: 0,
            access: Access::Read,
        };
        assert!(pack(&[overflow], &mut slots).is_err());
    }

    #[test]
    fn argument_sizes_are_checked_against_the_signature() {
        let buf = KernelArg::Buffer {
            buf: RawBuffer(0x1000),
            offset: 0,
            bytes: 0,
            access: Access::Write,
        };
        // fill_u32(unsigned int*, unsigned int, unsigned int)
        let sig = [8, 4, 4];
        assert!(check_args(&sig, &[buf, KernelArg::U32(1), KernelArg::U32(2)]).is_ok());
        assert!(check_args(&sig, &[buf, KernelArg::U32(1)]).is_err());
        assert!(check_args(&sig, &[buf, KernelArg::U64(1), KernelArg::U32(2)]).is_err());
    }
}
