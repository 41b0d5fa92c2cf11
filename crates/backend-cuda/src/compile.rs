//! NVRTC compilation of the kernels-cuda/ modules for the device's architecture, with an
//! on-disk cache so a second start skips NVRTC.
//!
//! Target: machine code (`--gpu-architecture=sm_XY`, a cubin) when this NVRTC knows the
//! device's architecture; otherwise PTX for the newest virtual architecture it knows that
//! the device can run (`compute_XY`), which the driver compiles when loading.
//!
//! Cache file: `<dir>/<sm_XY>/<module>-<hash>.<target>.<cubin|ptx>`, where the hash covers
//! the module's source, every header and the compile options, so an edited kernel never
//! loads a stale image. The cache is an optimisation: when it cannot be read or written
//! the backend compiles and carries on.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys;

use crate::driver::tried_names;
use strata_core::Error;

/// Options besides the architecture; part of the cache key.
const BASE_OPTIONS: &[&str] = &["--std=c++17"];
/// Bump to invalidate every cached image (e.g. when the key's layout changes).
const CACHE_FORMAT: &str = "strata-kernel-cache-v1";

/// `-D` options from `STRATA_NVRTC_DEFINES` (space-separated `NAME=VALUE`, e.g.
/// `ATT_FLASH_PIECES=32`): a kernel's tuning constant tried on a device without a rebuild.
/// Part of the cache key.
fn env_defines() -> Vec<String> {
    std::env::var("STRATA_NVRTC_DEFINES")
        .unwrap_or_default()
        .split_whitespace()
        .map(|d| format!("-D{d}"))
        .collect()
}

const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetErrorString",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
];

/// A loadable module image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Image {
    Cubin(Vec<u8>),
    /// NUL-terminated PTX text.
    Ptx(Vec<u8>),
}

impl Image {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Image::Cubin(b) | Image::Ptx(b) => b,
        }
    }
}

/// Where a kernel module's image came from when the device opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Loaded from this cache file; NVRTC was not run.
    Cache(PathBuf),
    /// Compiled by NVRTC for this target (`sm_90`, or `compute_XY` PTX as a fallback).
    Nvrtc { target: String },
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

/// The cache stem of a module: its name and a hash of everything that shapes its image.
pub(crate) fn cache_stem(module: &str, source: &str, headers: &[(&str, &str)]) -> String {
    let mut parts: Vec<&[u8]> = vec![CACHE_FORMAT.as_bytes(), source.as_bytes()];
    for (name, text) in headers {
        parts.push(name.as_bytes());
        parts.push(text.as_bytes());
    }
    for o in BASE_OPTIONS {
        parts.push(o.as_bytes());
    }
    let defines = env_defines();
    for d in &defines {
        parts.push(d.as_bytes());
    }
    format!("{module}-{:016x}", fnv1a(&parts))
}

/// The default cache root: `$STRATA_CACHE_DIR/kernels`, else `$XDG_CACHE_HOME/strata/kernels`,
/// else `~/.cache/strata/kernels`.
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

/// The cached image file for `stem`, preferring machine code for `arch` over the newest
/// PTX (the file is not read: whether a module needs compiling is decided from this).
pub(crate) fn cached_path(dir: &Path, stem: &str, arch: &str) -> Option<PathBuf> {
    let cubin = dir.join(format!("{stem}.{arch}.cubin"));
    if std::fs::metadata(&cubin).is_ok_and(|m| m.len() > 0) {
        return Some(cubin);
    }
    let prefix = format!("{stem}.compute_");
    let mut ptx: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".ptx"))
        })
        .collect();
    ptx.sort();
    ptx.pop()
}

/// A cached image for `stem` ([`cached_path`]'s file, read).
pub(crate) fn cached_image(dir: &Path, stem: &str, arch: &str) -> Option<(Image, PathBuf)> {
    let path = cached_path(dir, stem, arch)?;
    let mut b = std::fs::read(&path).ok().filter(|b| !b.is_empty())?;
    if path.extension().is_some_and(|e| e == "cubin") {
        return Some((Image::Cubin(b), path));
    }
    if b.last() != Some(&0) {
        b.push(0);
    }
    Some((Image::Ptx(b), path))
}

/// Writes an image into the cache (atomically: a temporary file, then a rename); its path,
/// or `None` (logged) when it could not be written.
pub(crate) fn store(dir: &Path, stem: &str, target: &str, image: &Image) -> Option<PathBuf> {
    let ext = match image {
        Image::Cubin(_) => "cubin",
        Image::Ptx(_) => "ptx",
    };
    let path = dir.join(format!("{stem}.{target}.{ext}"));
    let tmp = dir.join(format!(".{stem}.{target}.{ext}.{}.tmp", std::process::id()));
    let r = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, image.bytes()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    match r {
        Ok(()) => Some(path),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!("cuda: could not cache kernel image {}: {e}", path.display());
            None
        }
    }
}

fn nvrtc_error(module: &str, arch: &str, what: String) -> Error {
    Error::Compile {
        module: module.to_string(),
        arch: arch.to_string(),
        log: what,
    }
}

fn nvrtc_message(r: sys::nvrtcResult) -> String {
    // SAFETY: returns a static NUL-terminated string.
    let p = unsafe { sys::nvrtcGetErrorString(r) };
    if p.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: non-null static string from NVRTC.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Loads libnvrtc and checks it has what we call; an error says why not.
fn nvrtc_available() -> Result<(), String> {
    // SAFETY: only tries to dlopen the candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(format!(
            "libnvrtc could not be loaded (tried {}); install the CUDA toolkit's NVRTC or add \
             its folder (e.g. /usr/local/cuda/lib64) to LD_LIBRARY_PATH",
            tried_names("nvrtc")
        ));
    }
    let lib = std::panic::catch_unwind(|| {
        // SAFETY: present, so this does not reach cudarc's panic.
        unsafe { sys::culib() }
    })
    .map_err(|_| "loading libnvrtc panicked".to_string())?;
    let missing: Vec<&str> = NVRTC_SYMBOLS
        .iter()
        .copied()
        // SAFETY: a symbol lookup, nothing is called.
        .filter(|n| unsafe { lib.get::<*const std::ffi::c_void>(n.as_bytes()).is_err() })
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("libnvrtc lacks {}", missing.join(", ")))
    }
}

/// The architectures (e.g. 90 for sm_90) this NVRTC can compile for, if it says.
fn supported_archs() -> Option<Vec<u32>> {
    // SAFETY: a symbol lookup only.
    let has = |n: &str| unsafe {
        sys::culib()
            .get::<*const std::ffi::c_void>(n.as_bytes())
            .is_ok()
    };
    if !has("nvrtcGetNumSupportedArchs") || !has("nvrtcGetSupportedArchs") {
        return None;
    }
    let mut n: c_int = 0;
    // SAFETY: writes one int.
    if unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) } != sys::nvrtcResult::NVRTC_SUCCESS {
        return None;
    }
    let mut v = vec![0 as c_int; usize::try_from(n).ok()?];
    // SAFETY: v has room for the n entries NVRTC reported.
    if unsafe { sys::nvrtcGetSupportedArchs(v.as_mut_ptr()) } != sys::nvrtcResult::NVRTC_SUCCESS {
        return None;
    }
    Some(
        v.into_iter()
            .filter_map(|a| u32::try_from(a).ok())
            .collect(),
    )
}

/// The target for a device of compute capability `cc` (e.g. 90): `sm_90` if NVRTC knows
/// it, else the newest `compute_XY` it knows that is not newer than the device.
pub(crate) fn choose_target(cc: u32, supported: Option<&[u32]>) -> Option<String> {
    match supported {
        None => Some(format!("sm_{cc}")),
        Some(list) if list.contains(&cc) => Some(format!("sm_{cc}")),
        // PTX of an older virtual architecture runs on newer devices (the driver
        // compiles it when the module loads).
        Some(list) => list
            .iter()
            .copied()
            .filter(|&a| a <= cc)
            .max()
            .map(|a| format!("compute_{a}")),
    }
}

struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn program_log(p: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: valid program; the buffer has the size NVRTC reported.
    unsafe {
        if sys::nvrtcGetProgramLogSize(p.0, &mut size) != sys::nvrtcResult::NVRTC_SUCCESS
            || size == 0
        {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        if sys::nvrtcGetProgramLog(p.0, buf.as_mut_ptr().cast::<c_char>())
            != sys::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Compiles one module with NVRTC for compute capability `cc` (e.g. 90). Returns the
/// image and the target it was built for.
pub(crate) fn nvrtc_compile(
    module: &str,
    source: &str,
    headers: &[(&str, &str)],
    cc: u32,
) -> Result<(Image, String), Error> {
    let arch = format!("sm_{cc}");
    nvrtc_available().map_err(|why| nvrtc_error(module, &arch, why))?;
    let target = choose_target(cc, supported_archs().as_deref()).ok_or_else(|| {
        nvrtc_error(
            module,
            &arch,
            "this NVRTC supports no architecture the device can run".into(),
        )
    })?;
    let image = compile_for(module, source, headers, &target)?;
    Ok((image, target))
}

/// Compiles one module for `target` (`sm_XY`: a cubin; `compute_XY`: PTX). NVRTC must
/// have been found loadable.
pub(crate) fn compile_for(
    module: &str,
    source: &str,
    headers: &[(&str, &str)],
    target: &str,
) -> Result<Image, Error> {
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| nvrtc_error(module, target, format!("NUL byte in {s:?}")))
    };
    let src = cstr(source)?;
    let name = cstr(&format!("{module}.cu"))?;
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
    let mut options: Vec<CString> = vec![cstr(&format!("--gpu-architecture={target}"))?];
    for o in BASE_OPTIONS {
        options.push(cstr(o)?);
    }
    for d in env_defines() {
        options.push(cstr(&d)?);
    }
    let option_ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();
    let fail = |call: &str, r: sys::nvrtcResult| {
        nvrtc_error(module, target, format!("{call}: {}", nvrtc_message(r)))
    };
    let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
    let (headers_ptr, names_ptr) = if headers.is_empty() {
        (std::ptr::null(), std::ptr::null())
    } else {
        (text_ptrs.as_ptr(), name_ptrs.as_ptr())
    };
    // SAFETY: every pointer is to a live NUL-terminated string; counts match the arrays.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            name.as_ptr(),
            headers.len() as c_int,
            headers_ptr,
            names_ptr,
        )
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail("nvrtcCreateProgram", r));
    }
    let prog = Program(raw);
    // SAFETY: valid program; options outlive the call.
    let r = unsafe {
        sys::nvrtcCompileProgram(prog.0, option_ptrs.len() as c_int, option_ptrs.as_ptr())
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        let log = program_log(&prog);
        return Err(nvrtc_error(
            module,
            target,
            format!("{}\n{log}", nvrtc_message(r)),
        ));
    }
    let log = program_log(&prog);
    if !log.trim().is_empty() {
        tracing::debug!("cuda: NVRTC log for {module} ({target}):\n{log}");
    }
    let mut size = 0usize;
    // SAFETY: valid, compiled program; buffers have the sizes NVRTC reported.
    let image = unsafe {
        if target.starts_with("sm_") {
            let r = sys::nvrtcGetCUBINSize(prog.0, &mut size);
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("nvrtcGetCUBINSize", r));
            }
            let mut buf = vec![0u8; size];
            let r = sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr().cast::<c_char>());
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("nvrtcGetCUBIN", r));
            }
            Image::Cubin(buf)
        } else {
            let r = sys::nvrtcGetPTXSize(prog.0, &mut size);
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("nvrtcGetPTXSize", r));
            }
            let mut buf = vec![0u8; size];
            let r = sys::nvrtcGetPTX(prog.0, buf.as_mut_ptr().cast::<c_char>());
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("nvrtcGetPTX", r));
            }
            if buf.last() != Some(&0) {
                buf.push(0);
            }
            Image::Ptx(buf)
        }
    };
    Ok(image)
}

/// NVRTC's version, when the library loads (for diagnostics).
pub fn nvrtc_version() -> Option<(u32, u32)> {
    nvrtc_available().ok()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (r == sys::nvrtcResult::NVRTC_SUCCESS).then(|| {
        (
            u32::try_from(major).unwrap_or(0),
            u32::try_from(minor).unwrap_or(0),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_is_machine_code_when_nvrtc_knows_the_device() {
        assert_eq!(
            choose_target(90, Some(&[75, 80, 86, 89, 90, 100])).as_deref(),
            Some("sm_90")
        );
        assert_eq!(choose_target(90, None).as_deref(), Some("sm_90"));
    }

    #[test]
    fn target_falls_back_to_newest_older_virtual_arch() {
        // An NVRTC older than the device: PTX for the newest arch not newer than it.
        assert_eq!(
            choose_target(120, Some(&[75, 80, 86, 89, 90, 100])).as_deref(),
            Some("compute_100")
        );
        assert_eq!(
            choose_target(89, Some(&[75, 80, 86, 90])).as_deref(),
            Some("compute_86")
        );
        assert_eq!(choose_target(70, Some(&[75, 80])), None);
    }

    #[test]
    fn cache_stem_changes_with_source_and_headers() {
        let a = cache_stem("m", "src", &[]);
        assert_eq!(a, cache_stem("m", "src", &[]));
        assert_ne!(a, cache_stem("m", "src2", &[]));
        assert_ne!(a, cache_stem("m", "src", &[("h.cuh", "x")]));
        assert_ne!(
            cache_stem("m", "s", &[("ab", "c")]),
            cache_stem("m", "s", &[("a", "bc")])
        );
        assert!(a.starts_with("m-"));
    }

    #[test]
    fn fnv1a_matches_reference_vectors() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (the published test vector); our
        // separator byte 0xff then goes through one more round.
        let mut h: u64 = 0xaf63_dc4c_8601_ec8c;
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
        assert_eq!(fnv1a(&[b"a"]), h);
        assert_ne!(fnv1a(&[b"a"]), fnv1a(&[b"a", b""]));
    }

    /// NVRTC is optional here (this test runs where it can be loaded, e.g. with the
    /// nvidia-cuda-nvrtc wheel's lib folder on LD_LIBRARY_PATH); no GPU is needed.
    fn with_nvrtc(test: &str) -> bool {
        match nvrtc_available() {
            Ok(()) => true,
            Err(why) => {
                eprintln!("{test}: skipped, {why}");
                false
            }
        }
    }

    #[test]
    fn nvrtc_builds_machine_code_and_ptx_for_every_module() {
        if !with_nvrtc("nvrtc_builds_machine_code_and_ptx_for_every_module") {
            return;
        }
        eprintln!("NVRTC {:?}, archs {:?}", nvrtc_version(), supported_archs());
        for (module, src) in crate::kernels::KERNEL_SOURCES {
            let headers = crate::kernels::KERNEL_HEADERS;
            match compile_for(module, src, headers, "sm_90").unwrap() {
                // An ELF object: the cubin.
                Image::Cubin(b) => assert_eq!(&b[..4], b"\x7fELF", "{module}"),
                other => panic!("{module}: expected a cubin, got {other:?}"),
            }
            match compile_for(module, src, headers, "compute_90").unwrap() {
                Image::Ptx(b) => {
                    let text = String::from_utf8_lossy(&b);
                    assert_eq!(b.last(), Some(&0));
                    assert!(text.contains(".target sm_90"), "{module}");
                    // Every kernel the source defines is an entry point of the PTX.
                    let defined = |k: &&strata_core::KernelId| {
                        k.module() == *module
                            && src.contains(&format!("__global__ void {}(", k.name()))
                    };
                    for id in strata_core::KernelId::ALL.iter().filter(defined) {
                        assert!(
                            text.contains(&format!(".entry {}(", id.name())),
                            "{}",
                            id.name()
                        );
                    }
                }
                other => panic!("{module}: expected PTX, got {other:?}"),
            }
            let (_, target) = nvrtc_compile(module, src, headers, 90).unwrap();
            assert_eq!(target, "sm_90");
        }
    }

    #[test]
    fn nvrtc_errors_carry_the_log() {
        if !with_nvrtc("nvrtc_errors_carry_the_log") {
            return;
        }
        let bad = "extern \"C\" __global__ void broken(int* x) { x[0] = undefined_name; }";
        match compile_for("broken", bad, &[], "sm_90") {
            Err(Error::Compile { module, log, .. }) => {
                assert_eq!(module, "broken");
                assert!(log.contains("undefined_name"), "{log}");
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
    }

    #[test]
    fn cache_round_trip_prefers_cubin() {
        let dir = std::env::temp_dir().join(format!("strata-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(cached_image(&dir, "m-1", "sm_90").is_none());
        store(
            &dir,
            "m-1",
            "compute_86",
            &Image::Ptx(b".version 8.0\0".to_vec()),
        );
        let (img, path) = cached_image(&dir, "m-1", "sm_90").unwrap();
        assert_eq!(img, Image::Ptx(b".version 8.0\0".to_vec()));
        assert!(path.to_string_lossy().ends_with("m-1.compute_86.ptx"));
        store(&dir, "m-1", "sm_90", &Image::Cubin(vec![1, 2, 3]));
        let (img, _) = cached_image(&dir, "m-1", "sm_90").unwrap();
        assert_eq!(img, Image::Cubin(vec![1, 2, 3]));
        // Another device's cubin is not taken.
        assert!(matches!(
            cached_image(&dir, "m-1", "sm_89"),
            Some((Image::Ptx(_), _))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
