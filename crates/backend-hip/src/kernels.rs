//! The per-device kernel table: every kernels-hip/ module compiled (or taken from the
//! cache) and loaded, every `KernelId` resolved once to its `hipFunction_t`, so a launch
//! is an index, never a string look-up. Also the packing of `KernelArg`s into the
//! parameter array `hipModuleLaunchKernel` reads, checked against each kernel's signature
//! as the source declares it (HIP has no call that reports parameter sizes).

use std::ffi::CString;
use std::path::Path;

use strata_core::{Error, KernelArg, KernelId};

use crate::compile::{self, Origin};
use crate::ffi::{HIP_SUCCESS, Handle};
use crate::runtime::{self, check};

include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));

/// Most arguments one launch may pass.
pub(crate) const MAX_ARGS: usize = 32;

/// One resolved kernel.
pub(crate) struct KernelEntry {
    pub func: Handle,
    /// Byte size of each parameter, from the source's declaration (`None` when it uses a
    /// type this parser does not size; the launch is then unchecked).
    pub params: Option<Vec<usize>>,
}

/// Every module of one device and the kernel table built from them.
pub(crate) struct KernelTable {
    modules: Vec<Handle>,
    /// Indexed by `KernelId::index()`; `None` for a kernel no HIP source defines.
    entries: Vec<Option<KernelEntry>>,
    /// How each module was obtained, in `KERNEL_MODULES` order.
    pub origins: Vec<(&'static str, Origin)>,
}

// SAFETY: module and function handles are plain runtime handles, valid on any thread
// (the backend selects its device before every call).
unsafe impl Send for KernelTable {}
unsafe impl Sync for KernelTable {}

/// The embedded source of `module`.
pub(crate) fn source_of(module: &str) -> Option<&'static str> {
    KERNEL_SOURCES
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, s)| *s)
}

/// The module names of kernels-hip/ (file stems), in file order.
pub fn kernel_modules() -> Vec<&'static str> {
    KERNEL_SOURCES.iter().map(|(m, _)| *m).collect()
}

/// Compiles the embedded kernels-hip/ module `module` for `target` (e.g. "gfx90a") with
/// hiprtc, as the backend would at start-up, without a GPU and without the cache.
pub fn compile_module(module: &str, target: &str) -> Result<compile::CompiledModule, Error> {
    let source = source_of(module).ok_or_else(|| Error::Compile {
        module: module.to_string(),
        arch: target.to_string(),
        log: "no such module in kernels-hip/".into(),
    })?;
    compile::compile(module, source, KERNEL_HEADERS, target, &[])
}

/// Compiles `source` (a kernel file of one's own, which may `#include` the kernels-hip/
/// headers) for `target` with hiprtc, without a GPU: for checking code against the
/// headers, e.g. in tests.
pub fn compile_source(
    name: &str,
    source: &str,
    target: &str,
) -> Result<compile::CompiledModule, Error> {
    compile::compile(name, source, KERNEL_HEADERS, target, &[])
}

/// How a device opens its modules.
pub(crate) struct LoadSpec<'a> {
    pub target: &'a str,
    pub defines: &'a [(&'a str, String)],
    pub cache_root: Option<&'a Path>,
}

fn load_code(code: &[u8]) -> Result<Handle, Error> {
    let api = runtime::api()?;
    let mut m: Handle = std::ptr::null_mut();
    // SAFETY: a complete code object; the device is current.
    check("hipModuleLoadData", unsafe {
        (api.hipModuleLoadData)(&mut m, code.as_ptr().cast())
    })?;
    Ok(m)
}

/// Compiles (or takes from the cache) and loads one module.
fn load_module(module: &'static str, spec: &LoadSpec) -> Result<(Handle, Origin), Error> {
    let source = source_of(module).ok_or_else(|| Error::Compile {
        module: module.to_string(),
        arch: spec.target.to_string(),
        log: "no embedded source for this module".into(),
    })?;
    let options = compile::options(spec.target, spec.defines);
    let stem = compile::cache_stem(
        module,
        source,
        KERNEL_HEADERS,
        &options,
        &compile::compiler_identity(),
    );
    let dir = spec
        .cache_root
        .map(|r| r.join(compile::target_dir(spec.target)));
    if let Some(dir) = &dir
        && let Some((code, path)) = compile::cached_code(dir, &stem)
    {
        match load_code(&code) {
            Ok(m) => return Ok((m, Origin::Cache(path))),
            Err(e) => {
                // A corrupt or incompatible code object: drop it and build a fresh one.
                tracing::warn!("hip: cached {} unusable ({e}); recompiling", path.display());
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let compiled = compile::compile(module, source, KERNEL_HEADERS, spec.target, spec.defines)?;
    let m = load_code(&compiled.code)?;
    if let Some(dir) = &dir {
        compile::store(dir, &stem, &compiled.code);
    }
    Ok((
        m,
        Origin::Hiprtc {
            target: spec.target.to_string(),
        },
    ))
}

impl KernelTable {
    /// Builds the table; the device must be current on this thread. Every kernels-hip/
    /// module that defines a listed kernel is compiled and loaded; a kernel with no HIP
    /// definition is left out (`supports` says false for it).
    pub fn load(spec: &LoadSpec) -> Result<Self, Error> {
        let api = runtime::api()?;
        let mut table = KernelTable {
            modules: Vec::new(),
            entries: Vec::with_capacity(KernelId::COUNT),
            origins: Vec::new(),
        };
        let mut loaded: Vec<(&'static str, Handle)> = Vec::new();
        // On error `table` drops here and unloads what was loaded.
        for (module, _) in KERNEL_SOURCES {
            if !KernelId::ALL.iter().any(|id| id.module() == *module) {
                tracing::debug!("hip: kernels-hip/{module}.hip defines no listed kernel");
                continue;
            }
            let (m, origin) = load_module(module, spec)?;
            table.modules.push(m);
            table.origins.push((module, origin));
            loaded.push((module, m));
        }
        for id in KernelId::ALL {
            let Some(&(module, m)) = loaded.iter().find(|(name, _)| *name == id.module()) else {
                table.entries.push(None);
                continue;
            };
            let func = CString::new(id.name()).ok().and_then(|name| {
                let mut f: Handle = std::ptr::null_mut();
                // SAFETY: loaded module; NUL-terminated name.
                let r = unsafe { (api.hipModuleGetFunction)(&mut f, m, name.as_ptr()) };
                (r == HIP_SUCCESS).then_some(f)
            });
            match func {
                Some(f) => table.entries.push(Some(KernelEntry {
                    func: f,
                    params: source_of(module).and_then(|s| param_sizes(s, id.name())),
                })),
                None => {
                    tracing::warn!(
                        "hip: kernel {} is not defined in kernels-hip/{}.hip; it is unsupported",
                        id.name(),
                        id.module()
                    );
                    table.entries.push(None);
                }
            }
        }
        Ok(table)
    }

    /// The kernel, or `None` when no HIP source defines it.
    pub fn get(&self, id: KernelId) -> Option<&KernelEntry> {
        self.entries.get(id.index()).and_then(Option::as_ref)
    }
}

impl Drop for KernelTable {
    fn drop(&mut self) {
        let Ok(api) = runtime::api() else {
            return;
        };
        for m in self.modules.drain(..) {
            // SAFETY: loaded by this table; no launch is queued after the device drops
            // (the backend synchronises first).
            unsafe {
                (api.hipModuleUnload)(m);
            }
        }
    }
}

/// The parameter list of `extern "C" __global__ void name(...)` in `source`.
fn declared_params<'a>(source: &'a str, name: &str) -> Option<Vec<&'a str>> {
    let marker = format!("extern \"C\" __global__ void {name}(");
    let start = source.find(&marker)? + marker.len();
    let end = start + source[start..].find(')')?;
    let list = source[start..end].trim();
    if list.is_empty() || list == "void" {
        return Some(Vec::new());
    }
    Some(list.split(',').map(str::trim).collect())
}

/// Bytes one declared parameter occupies (`None` for a type not sized here).
fn param_size(decl: &str) -> Option<usize> {
    if decl.contains('*') {
        return Some(8);
    }
    let words: Vec<&str> = decl
        .split_whitespace()
        .filter(|w| !matches!(*w, "const" | "volatile" | "__restrict__" | "restrict"))
        .collect();
    // The last word is the parameter's name.
    let ty = words.get(..words.len().checked_sub(1)?)?.join(" ");
    match ty.as_str() {
        "unsigned long long"
        | "long long"
        | "unsigned long long int"
        | "long long int"
        | "uint64_t"
        | "int64_t"
        | "size_t"
        | "double" => Some(8),
        "unsigned int" | "unsigned" | "int" | "float" | "uint32_t" | "int32_t" => Some(4),
        _ => None,
    }
}

/// Parameter sizes of kernel `name` as `source` declares it.
pub(crate) fn param_sizes(source: &str, name: &str) -> Option<Vec<usize>> {
    declared_params(source, name)?
        .into_iter()
        .map(param_size)
        .collect()
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

/// Writes each argument's value into its own 8-byte slot (the runtime copies each
/// parameter's size from its slot's address). Buffers become device pointer + offset.
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
        let marker = "extern \"C\" __global__ void ";
        let mut out = Vec::new();
        for (module, src) in KERNEL_SOURCES {
            for piece in src.split(marker).skip(1) {
                let name: String = piece
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                out.push((name, *module));
            }
        }
        out
    }

    #[test]
    fn every_hip_kernel_is_a_listed_kernel_of_its_module() {
        let declared = declared();
        assert!(!declared.is_empty());
        for (name, module) in &declared {
            assert!(
                KernelId::ALL
                    .iter()
                    .any(|id| id.name() == name && id.module() == *module),
                "kernels-hip/{module}.hip defines {name}, which crates/core/kernels.txt does not list under {module}"
            );
        }
    }

    #[test]
    fn every_kernel_of_the_cuda_twins_is_defined_with_a_sized_signature() {
        // The kernel table resolves `KernelId` -> (module, name) in these sources, as
        // backend-cuda's does in kernels-cuda/: a kernel CUDA defines in a module that
        // HIP has too must be defined here, or the HIP backend would report it
        // unsupported. The conformance and model modules must be complete.
        let declared = declared();
        let cuda_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels-cuda");
        let modules = kernel_modules();
        assert!(modules.contains(&"conformance") && modules.contains(&"model"));
        for id in KernelId::ALL {
            let cuda = std::fs::read_to_string(cuda_dir.join(format!("{}.cu", id.module())))
                .unwrap_or_default();
            let in_cuda = cuda.contains(&format!("extern \"C\" __global__ void {}(", id.name()));
            let required = matches!(id.module(), "conformance" | "model")
                || (in_cuda && modules.contains(&id.module()));
            if !required {
                continue;
            }
            assert!(
                declared
                    .iter()
                    .any(|(n, m)| n == id.name() && *m == id.module()),
                "{} missing from kernels-hip/{}.hip",
                id.name(),
                id.module()
            );
            let src = source_of(id.module()).unwrap_or_default();
            assert!(param_sizes(src, id.name()).is_some(), "{}", id.name());
        }
    }

    #[test]
    fn the_quant_tables_are_the_cuda_tables() {
        // tools/gen_cuda_quant_tables.py writes both from llama.cpp's ggml-common.h, and
        // backend-cuda's model_tables test checks them against strata-quant's tables.
        let hip = KERNEL_HEADERS
            .iter()
            .find(|(n, _)| *n == "quant_tables.h")
            .map(|(_, t)| *t);
        let cuda = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels-cuda/quant_tables.cuh"),
        )
        .ok();
        assert!(hip.is_some() && cuda.is_some());
        assert!(
            hip == cuda.as_deref(),
            "kernels-hip/quant_tables.h differs from kernels-cuda/quant_tables.cuh: \
             run tools/gen_cuda_quant_tables.py"
        );
    }

    #[test]
    fn hip_signatures_match_the_cuda_twins() {
        // The same kernel takes the same arguments on both GPU backends: read both
        // source trees and compare the sizes each declares.
        let cuda_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels-cuda");
        for (module, src) in KERNEL_SOURCES {
            let Ok(cuda) = std::fs::read_to_string(cuda_dir.join(format!("{module}.cu"))) else {
                continue;
            };
            for id in KernelId::ALL.iter().filter(|id| id.module() == *module) {
                let (h, c) = (param_sizes(src, id.name()), param_sizes(&cuda, id.name()));
                if c.is_some() {
                    assert_eq!(h, c, "{}: HIP and CUDA signatures differ", id.name());
                }
            }
        }
    }

    #[test]
    fn parameter_sizes_are_read_from_declarations() {
        let src = "extern \"C\" __global__ void k(const unsigned int* __restrict__ a, float b,\n\
                   unsigned long long c, int d, const unsigned char* e) {}\n\
                   extern \"C\" __global__ void h(__half x) {}\n\
                   extern \"C\" __global__ void none() {}";
        assert_eq!(param_sizes(src, "k"), Some(vec![8, 4, 8, 4, 8]));
        assert_eq!(param_sizes(src, "h"), None);
        assert_eq!(param_sizes(src, "none"), Some(vec![]));
        assert_eq!(param_sizes(src, "missing"), None);
        let conf = source_of("conformance").unwrap_or_default();
        assert_eq!(param_sizes(conf, "fill_u32"), Some(vec![8, 4, 4]));
        assert_eq!(param_sizes(conf, "busy_wait"), Some(vec![8, 8]));
        assert_eq!(param_sizes(conf, "check_table"), Some(vec![8, 8, 4, 4, 4]));
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
        let low = |i: usize| {
            let b = slots[i].to_ne_bytes();
            [b[0], b[1], b[2], b[3]]
        };
        assert_eq!(slots[0], 0x7000_0000_0040);
        assert_eq!(u32::from_ne_bytes(low(1)), 0xdead_beef);
        assert_eq!(i32::from_ne_bytes(low(2)), -2);
        assert_eq!(f32::from_ne_bytes(low(3)), 1.5);
        assert_eq!(slots[4], u64::MAX - 1);
    }

    #[test]
    fn too_many_overflowing_or_missized_arguments_are_refused() {
        let mut slots = [0u64; MAX_ARGS];
        assert!(pack(&[KernelArg::U32(0); MAX_ARGS + 1], &mut slots).is_err());
        let overflow = KernelArg::Buffer {
            buf: RawBuffer(u64::MAX),
            offset: 1,
            bytes: 0,
            access: Access::Read,
        };
        assert!(pack(&[overflow], &mut slots).is_err());
        let buf = KernelArg::Buffer {
            buf: RawBuffer(0x1000),
            offset: 0,
            bytes: 0,
            access: Access::Write,
        };
        let sig = [8, 4, 4];
        assert!(check_args(&sig, &[buf, KernelArg::U32(1), KernelArg::U32(2)]).is_ok());
        assert!(check_args(&sig, &[buf, KernelArg::U32(1)]).is_err());
        assert!(check_args(&sig, &[buf, KernelArg::U64(1), KernelArg::U32(2)]).is_err());
    }
}
