//! hiprtc compilation of the kernels-hip/ modules for the device's target id
//! (`gcnArchName`, e.g. `gfx90a:sramecc+:xnack-`), with an on-disk cache so a second
//! start skips the compiler.
//!
//! Cache file: `<root>/<target>/<module>-<hash>.hsaco` (`:` in the target becomes `_`),
//! where the hash covers the module's source, every header, the compile options (target
//! and defines included) and which hiprtc compiled it, so an edited kernel or a new ROCm
//! never loads a stale code object. The cache is an optimisation: when it cannot be read
//! or written the backend compiles and carries on.
//!
//! hiprtc needs no GPU: the CI compiles every module for gfx90a (wave64) and gfx1030
//! (wave32) on machines without one.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use strata_core::Error;

use crate::ffi::{self, HIPRTC_SUCCESS, RtcApi, RtcProgram, RtcResult};
use crate::runtime;

/// Options besides the target and defines; part of the cache key. Warnings are on so a
/// compile test can refuse them; at run time they only reach the debug log. No FP
/// contraction: ROCm's `__fmul_rn`/`__fadd_rn` are plain operators that clang's default
/// (`fast`) fuses into an FMA, which would break the kernels' bit-exact numerics; only an
/// explicit `fmaf` fuses (as in CUDA, where the `_rn` intrinsics never fuse).
pub(crate) const BASE_OPTIONS: &[&str] =
    &["-O3", "-std=c++17", "-ffp-contract=off", "-Wall", "-Wextra"];
/// Bump to invalidate every cached code object (e.g. when the key's layout changes).
const CACHE_FORMAT: &str = "strata-hip-kernel-cache-v1";
/// ELF `e_machine` of AMD GPU code objects.
const EM_AMDGPU: u16 = 0xe0;

/// Where a kernel module's code object came from when the device opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Loaded from this cache file; hiprtc was not run.
    Cache(PathBuf),
    /// Compiled by hiprtc for this target id.
    Hiprtc { target: String },
}

/// A compiled module: the code object and what the compiler said.
#[derive(Clone, Debug)]
pub struct CompiledModule {
    /// An AMD GPU ELF code object, ready for `hipModuleLoadData`.
    pub code: Vec<u8>,
    /// hiprtc's log (warnings); empty for a clean compile.
    pub log: String,
    /// The options it was compiled with.
    pub options: Vec<String>,
}

/// Every compile option for `target`, in order: target, base options, defines.
pub(crate) fn options(target: &str, defines: &[(&str, String)]) -> Vec<String> {
    let mut o = vec![format!("--offload-arch={target}")];
    o.extend(BASE_OPTIONS.iter().map(|s| s.to_string()));
    o.extend(defines.iter().map(|(k, v)| format!("-D{k}={v}")));
    o
}

/// FNV-1a, 64 bits: a stable hash (std's `DefaultHasher` may change between Rust
/// releases, which would silently empty every cache).
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separator, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The cache stem of a module: its name and a hash of everything that shapes its code.
pub(crate) fn cache_stem(
    module: &str,
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
    compiler: &str,
) -> String {
    let mut parts: Vec<&[u8]> = vec![
        CACHE_FORMAT.as_bytes(),
        compiler.as_bytes(),
        source.as_bytes(),
    ];
    for (name, text) in headers {
        parts.push(name.as_bytes());
        parts.push(text.as_bytes());
    }
    for o in options {
        parts.push(o.as_bytes());
    }
    format!("{module}-{:016x}", fnv1a(&parts))
}

/// The cache folder name of a target id.
pub(crate) fn target_dir(target: &str) -> String {
    target.replace(':', "_")
}

/// The default cache root (shared with the CUDA backend; targets never collide):
/// `$STRATA_CACHE_DIR/kernels`, else `$XDG_CACHE_HOME/strata/kernels`, else
/// `~/.cache/strata/kernels`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("STRATA_CACHE_DIR") {
        return Some(d.join("kernels"));
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return Some(d.join("strata").join("kernels"));
    }
    env("HOME").map(|h| h.join(".cache").join("strata").join("kernels"))
}

/// The `EF_AMDGPU_MACH` field of an AMD GPU ELF code object (e.g. 0x3f for gfx90a), or
/// `None` when `code` is not one.
pub fn amdgpu_elf_mach(code: &[u8]) -> Option<u32> {
    if code.len() < 64 || &code[..4] != b"\x7fELF" || code[4] != 2 {
        return None;
    }
    let machine = u16::from_le_bytes([code[18], code[19]]);
    let flags = u32::from_le_bytes([code[48], code[49], code[50], code[51]]);
    (machine == EM_AMDGPU).then_some(flags & 0xff)
}

/// A cached code object for `stem`, if one is there and is an AMD GPU ELF.
pub(crate) fn cached_code(dir: &Path, stem: &str) -> Option<(Vec<u8>, PathBuf)> {
    let path = dir.join(format!("{stem}.hsaco"));
    let code = std::fs::read(&path).ok()?;
    if amdgpu_elf_mach(&code).is_none() {
        tracing::warn!("hip: {} is not a code object; recompiling", path.display());
        let _ = std::fs::remove_file(&path);
        return None;
    }
    Some((code, path))
}

/// Writes a code object into the cache (atomically: a temporary file, then a rename).
pub(crate) fn store(dir: &Path, stem: &str, code: &[u8]) {
    let path = dir.join(format!("{stem}.hsaco"));
    let tmp = dir.join(format!(".{stem}.hsaco.{}.tmp", std::process::id()));
    let r = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, code))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!("hip: could not cache kernel code {}: {e}", path.display());
    }
}

fn compile_error(module: &str, target: &str, log: String) -> Error {
    Error::Compile {
        module: module.to_string(),
        arch: target.to_string(),
        log,
    }
}

fn rtc_message(api: &RtcApi, r: RtcResult) -> String {
    // SAFETY: returns a static NUL-terminated string (or null).
    let p = unsafe { (api.hiprtcGetErrorString)(r) };
    if p.is_null() {
        format!("hiprtc error {r}")
    } else {
        // SAFETY: non-null static string from hiprtc.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// hiprtc's version as it reports it, when the library loads.
pub fn hiprtc_version() -> Option<(u32, u32)> {
    let api = &ffi::rtc().ok()?.api;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    let r = unsafe { (api.hiprtcVersion)(&mut major, &mut minor) };
    (r == HIPRTC_SUCCESS).then(|| {
        (
            u32::try_from(major).unwrap_or(0),
            u32::try_from(minor).unwrap_or(0),
        )
    })
}

/// comgr's version (the compiler behind hiprtc), when it loads.
pub(crate) fn comgr_version() -> Option<(usize, usize)> {
    let api = &ffi::comgr().ok()?.api;
    let (mut major, mut minor) = (0usize, 0usize);
    // SAFETY: writes two integers.
    unsafe { (api.amd_comgr_get_version)(&mut major, &mut minor) };
    Some((major, minor))
}

/// Which hiprtc compiles: its library and versions. Part of the cache key.
pub(crate) fn compiler_identity() -> String {
    let path = ffi::rtc().map(|l| l.path.clone()).unwrap_or_default();
    format!(
        "{path} rtc {:?} runtime {:?} comgr {:?}",
        hiprtc_version(),
        runtime::runtime_version().ok(),
        comgr_version()
    )
}

/// The processors (e.g. "gfx90a") the installed compiler knows, from comgr; `None`
/// when comgr cannot be loaded or does not say.
pub fn compiler_isas() -> Option<Vec<String>> {
    static ISAS: OnceLock<Option<Vec<String>>> = OnceLock::new();
    ISAS.get_or_init(|| {
        let api = &ffi::comgr().ok()?.api;
        let mut n = 0usize;
        // SAFETY: writes one integer.
        if unsafe { (api.amd_comgr_get_isa_count)(&mut n) } != 0 {
            return None;
        }
        let mut out: Vec<String> = Vec::new();
        for i in 0..n {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: i < count; writes a pointer to a static string.
            if unsafe { (api.amd_comgr_get_isa_name)(i, &mut p) } != 0 || p.is_null() {
                continue;
            }
            // SAFETY: a NUL-terminated static string from comgr.
            let full = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            // "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-" -> "gfx90a"
            let isa = full.rsplit("--").next().unwrap_or(&full);
            let base = runtime::base_arch(isa).to_string();
            if !out.contains(&base) {
                out.push(base);
            }
        }
        Some(out)
    })
    .clone()
}

/// hiprtc of ROCm 5.2 aborts the process (a heap corruption in its target parsing) when
/// asked for a processor it does not know, so the target is checked against comgr's list
/// first. Without comgr's answer the compile goes ahead.
fn check_target_known(module: &str, target: &str) -> Result<(), Error> {
    if !runtime::is_target_id(target) {
        return Err(compile_error(
            module,
            target,
            "not an AMD GPU target id (expected e.g. gfx90a or gfx90a:xnack-)".into(),
        ));
    }
    let Some(isas) = compiler_isas() else {
        return Ok(());
    };
    let base = runtime::base_arch(target);
    if isas.iter().any(|i| i == base) {
        return Ok(());
    }
    Err(compile_error(
        module,
        target,
        format!(
            "the installed ROCm compiler does not know {base} (it knows {}); install a newer \
             ROCm, or for a consumer GPU of a known family set HSA_OVERRIDE_GFX_VERSION \
             (e.g. 10.3.0 for gfx103x)",
            isas.join(", ")
        ),
    ))
}

struct Program<'a>(&'a RtcApi, RtcProgram);

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: created by hiprtcCreateProgram and destroyed once.
        unsafe {
            (self.0.hiprtcDestroyProgram)(&mut self.1);
        }
    }
}

fn program_log(p: &Program) -> String {
    let api = p.0;
    let mut size = 0usize;
    // SAFETY: valid program; the buffer has the size hiprtc reported.
    unsafe {
        if (api.hiprtcGetProgramLogSize)(p.1, &mut size) != HIPRTC_SUCCESS || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size + 1];
        if (api.hiprtcGetProgramLog)(p.1, buf.as_mut_ptr().cast::<c_char>()) != HIPRTC_SUCCESS {
            return String::new();
        }
        CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Compiles one module for `target` with `defines`. hiprtc must be loadable; no GPU is
/// needed. Compiles are serialised (they are rare, and hiprtc's thread safety has varied
/// between releases).
pub(crate) fn compile(
    module: &str,
    source: &str,
    headers: &[(&str, &str)],
    target: &str,
    defines: &[(&str, String)],
) -> Result<CompiledModule, Error> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let api = &ffi::rtc()
        .map_err(|why| compile_error(module, target, why))?
        .api;
    check_target_known(module, target)?;
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| compile_error(module, target, format!("NUL byte in {s:?}")))
    };
    let src = cstr(source)?;
    let name = cstr(&format!("{module}.hip"))?;
    let header_texts: Vec<CString> = headers
        .iter()
        .map(|(_, t)| cstr(t))
        .collect::<Result<_, _>>()?;
    let header_names: Vec<CString> = headers
        .iter()
        .map(|(n, _)| cstr(n))
        .collect::<Result<_, _>>()?;
    let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
    let opts = options(target, defines);
    let opt_c: Vec<CString> = opts.iter().map(|o| cstr(o)).collect::<Result<_, _>>()?;
    let opt_ptrs: Vec<*const c_char> = opt_c.iter().map(|c| c.as_ptr()).collect();
    let fail = |call: &str, r: RtcResult| {
        compile_error(module, target, format!("{call}: {}", rtc_message(api, r)))
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (headers_ptr, names_ptr) = if headers.is_empty() {
        (std::ptr::null(), std::ptr::null())
    } else {
        (text_ptrs.as_ptr(), name_ptrs.as_ptr())
    };
    let mut raw: RtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is to a live NUL-terminated string; counts match the arrays.
    let r = unsafe {
        (api.hiprtcCreateProgram)(
            &mut raw,
            src.as_ptr(),
            name.as_ptr(),
            headers.len() as c_int,
            headers_ptr,
            names_ptr,
        )
    };
    if r != HIPRTC_SUCCESS {
        return Err(fail("hiprtcCreateProgram", r));
    }
    let prog = Program(api, raw);
    // SAFETY: valid program; the options outlive the call.
    let r =
        unsafe { (api.hiprtcCompileProgram)(prog.1, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = program_log(&prog);
    if r != HIPRTC_SUCCESS {
        return Err(compile_error(
            module,
            target,
            format!("{}\n{log}", rtc_message(api, r)),
        ));
    }
    let mut size = 0usize;
    // SAFETY: valid, compiled program; the buffer has the size hiprtc reported.
    let code = unsafe {
        let r = (api.hiprtcGetCodeSize)(prog.1, &mut size);
        if r != HIPRTC_SUCCESS {
            return Err(fail("hiprtcGetCodeSize", r));
        }
        let mut buf = vec![0u8; size];
        let r = (api.hiprtcGetCode)(prog.1, buf.as_mut_ptr().cast::<c_char>());
        if r != HIPRTC_SUCCESS {
            return Err(fail("hiprtcGetCode", r));
        }
        buf
    };
    if amdgpu_elf_mach(&code).is_none() {
        return Err(compile_error(
            module,
            target,
            format!(
                "hiprtc returned {} bytes that are not an AMD GPU code object",
                code.len()
            ),
        ));
    }
    if !log.trim().is_empty() {
        tracing::debug!("hip: hiprtc log for {module} ({target}):\n{log}");
    }
    Ok(CompiledModule {
        code,
        log,
        options: opts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_put_the_target_first_and_defines_last() {
        let o = options(
            "gfx90a:xnack-",
            &[("STRATA_WALL_CLOCK_KHZ", "25000ull".into())],
        );
        assert_eq!(o[0], "--offload-arch=gfx90a:xnack-");
        assert_eq!(
            o.last().map(String::as_str),
            Some("-DSTRATA_WALL_CLOCK_KHZ=25000ull")
        );
        assert!(o.iter().any(|s| s == "-Wall"));
    }

    #[test]
    fn cache_stem_changes_with_everything_that_shapes_the_code() {
        let opts = options("gfx90a", &[]);
        let a = cache_stem("m", "src", &[], &opts, "rtc 1");
        assert_eq!(a, cache_stem("m", "src", &[], &opts, "rtc 1"));
        assert_ne!(a, cache_stem("m", "src2", &[], &opts, "rtc 1"));
        assert_ne!(
            a,
            cache_stem("m", "src", &[("strata.h", "x")], &opts, "rtc 1")
        );
        assert_ne!(
            a,
            cache_stem("m", "src", &[], &options("gfx1030", &[]), "rtc 1")
        );
        assert_ne!(a, cache_stem("m", "src", &[], &opts, "rtc 2"));
        assert!(a.starts_with("m-"));
        assert_eq!(
            target_dir("gfx90a:sramecc+:xnack-"),
            "gfx90a_sramecc+_xnack-"
        );
    }

    #[test]
    fn fnv1a_matches_reference_vectors() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (the published test vector); the
        // separator byte 0xff then goes through one more round.
        let mut h: u64 = 0xaf63_dc4c_8601_ec8c;
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
        assert_eq!(fnv1a(&[b"a"]), h);
    }

    #[test]
    fn only_amdgpu_elf_is_taken_for_code() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[18] = 0xe0;
        elf[48] = 0x3f;
        elf[49] = 0x05;
        assert_eq!(amdgpu_elf_mach(&elf), Some(0x3f));
        elf[18] = 0x3e; // x86-64
        assert_eq!(amdgpu_elf_mach(&elf), None);
        assert_eq!(amdgpu_elf_mach(b"not a code object"), None);
    }

    #[test]
    fn cache_round_trip_refuses_garbage() {
        let dir =
            std::env::temp_dir().join(format!("strata-hip-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(cached_code(&dir, "m-1").is_none());
        let mut elf = vec![0u8; 80];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[18] = 0xe0;
        store(&dir, "m-1", &elf);
        let (code, path) = cached_code(&dir, "m-1").expect("stored code object");
        assert_eq!(code, elf);
        assert!(path.ends_with("m-1.hsaco"));
        std::fs::write(&path, b"garbage").expect("write");
        assert!(cached_code(&dir, "m-1").is_none());
        assert!(!path.exists(), "a garbage cache file is removed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_target_that_is_not_a_gfx_id_is_refused_before_hiprtc() {
        // hiprtc 5.2 aborts on an unknown target; this must never reach it.
        match compile("m", "", &[], "sm_90", &[]) {
            Err(Error::Compile { log, .. }) => {
                assert!(log.contains("target id") || log.contains("hiprtc"), "{log}")
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
    }
}
