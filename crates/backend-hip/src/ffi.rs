//! The HIP runtime, hiprtc and comgr entry points this crate calls, declared here and
//! resolved at run time with `libloading`. Nothing links ROCm at build time.
//!
//! Only functions whose C signatures have not changed from ROCm 5.2 to ROCm 7 are
//! declared, and no versioned struct crosses the boundary (the one exception, the device
//! properties blob, is read as opaque bytes: see `runtime::arch_from_properties`).
//! The libraries stay loaded for the life of the process (the `OnceLock`s below are never
//! dropped), so the function pointers copied out of them stay valid.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

use libloading::Library;

/// `hipError_t`.
pub(crate) type HipError = c_int;
/// Every HIP handle (`hipStream_t`, `hipEvent_t`, `hipModule_t`, `hipFunction_t`,
/// `hipGraph_t`, `hipGraphExec_t`) and device pointer (`hipDeviceptr_t`) is a pointer.
pub(crate) type Handle = *mut c_void;
/// `hiprtcResult`.
pub(crate) type RtcResult = c_int;
/// `hiprtcProgram`.
pub(crate) type RtcProgram = *mut c_void;

pub(crate) const HIP_SUCCESS: HipError = 0;
pub(crate) const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
pub(crate) const HIP_ERROR_NO_DEVICE: HipError = 100;
pub(crate) const HIP_ERROR_NOT_READY: HipError = 600;
pub(crate) const HIPRTC_SUCCESS: RtcResult = 0;

/// `hipStreamNonBlocking`: no implicit ordering with the null stream.
pub(crate) const HIP_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `hipEventDisableTiming`.
pub(crate) const HIP_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `hipHostMallocDefault`: page-locked, usable as a DMA source and target.
pub(crate) const HIP_HOST_MALLOC_DEFAULT: c_uint = 0x0;
/// `hipStreamCaptureModeRelaxed`.
pub(crate) const HIP_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// `hipDeviceAttribute_t` values. The enum keeps its numbering across ROCm releases
/// (removed entries became `hipDeviceAttributeUnusedN` placeholders).
pub(crate) const ATTR_MULTIPROCESSOR_COUNT: c_int = 63;
pub(crate) const ATTR_WARP_SIZE: c_int = 87;
/// `hipDeviceAttributeWallClockRate` (kHz): ROCm 6 and later; 5.x refuses it.
pub(crate) const ATTR_WALL_CLOCK_RATE: c_int = 10017;

/// Declares a table of C entry points and how to resolve it from a library: every
/// symbol is looked up before any is taken, so a library that lacks one is refused with
/// the list of what it lacks.
macro_rules! entry_points {
    ($(#[$meta:meta])* pub(crate) struct $name:ident {
        $( fn $f:ident($($arg:ty),* $(,)?) -> $ret:ty; )*
    }) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        pub(crate) struct $name {
            $( pub $f: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        impl $name {
            pub(crate) const SYMBOLS: &'static [&'static str] = &[$(stringify!($f)),*];

            /// # Safety
            /// `lib` must export these functions with these C signatures (it is the
            /// library the table is named after), and must outlive the table.
            unsafe fn resolve(lib: &Library) -> Result<Self, Vec<&'static str>> {
                let missing: Vec<&'static str> = Self::SYMBOLS
                    .iter()
                    .copied()
                    // SAFETY: a symbol lookup; nothing is called.
                    .filter(|s| unsafe { lib.get::<*const c_void>(s.as_bytes()) }.is_err())
                    .collect();
                if !missing.is_empty() {
                    return Err(missing);
                }
                Ok($name {
                    $(
                        // SAFETY: present (checked above), with the declared signature
                        // (the caller's promise).
                        $f: unsafe {
                            *lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                                stringify!($f).as_bytes(),
                            )
                            .map_err(|_| vec![stringify!($f)])?
                        },
                    )*
                })
            }
        }
    };
}

entry_points! {
    /// The HIP runtime (libamdhip64).
    pub(crate) struct HipApi {
        fn hipGetErrorName(HipError) -> *const c_char;
        fn hipGetErrorString(HipError) -> *const c_char;
        fn hipRuntimeGetVersion(*mut c_int) -> HipError;
        fn hipGetDeviceCount(*mut c_int) -> HipError;
        fn hipGetDevice(*mut c_int) -> HipError;
        fn hipSetDevice(c_int) -> HipError;
        fn hipDeviceGetName(*mut c_char, c_int, c_int) -> HipError;
        fn hipDeviceTotalMem(*mut usize, c_int) -> HipError;
        fn hipDeviceGetAttribute(*mut c_int, c_int, c_int) -> HipError;
        fn hipDeviceSynchronize() -> HipError;
        fn hipMemGetInfo(*mut usize, *mut usize) -> HipError;
        fn hipMalloc(*mut Handle, usize) -> HipError;
        fn hipFree(Handle) -> HipError;
        fn hipHostMalloc(*mut *mut c_void, usize, c_uint) -> HipError;
        fn hipHostFree(*mut c_void) -> HipError;
        fn hipMemcpyHtoD(Handle, *mut c_void, usize) -> HipError;
        fn hipMemcpyHtoDAsync(Handle, *mut c_void, usize, Handle) -> HipError;
        fn hipMemcpyDtoHAsync(*mut c_void, Handle, usize, Handle) -> HipError;
        fn hipMemcpyDtoDAsync(Handle, Handle, usize, Handle) -> HipError;
        fn hipStreamCreateWithFlags(*mut Handle, c_uint) -> HipError;
        fn hipStreamDestroy(Handle) -> HipError;
        fn hipStreamWaitEvent(Handle, Handle, c_uint) -> HipError;
        fn hipEventCreateWithFlags(*mut Handle, c_uint) -> HipError;
        fn hipEventRecord(Handle, Handle) -> HipError;
        fn hipEventQuery(Handle) -> HipError;
        fn hipEventSynchronize(Handle) -> HipError;
        fn hipEventDestroy(Handle) -> HipError;
        fn hipModuleLoadData(*mut Handle, *const c_void) -> HipError;
        fn hipModuleUnload(Handle) -> HipError;
        fn hipModuleGetFunction(*mut Handle, Handle, *const c_char) -> HipError;
        fn hipModuleLaunchKernel(
            Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle,
            *mut *mut c_void, *mut *mut c_void,
        ) -> HipError;
        fn hipStreamBeginCapture(Handle, c_int) -> HipError;
        fn hipStreamEndCapture(Handle, *mut Handle) -> HipError;
        fn hipGraphInstantiate(*mut Handle, Handle, *mut Handle, *mut c_char, usize) -> HipError;
        fn hipGraphLaunch(Handle, Handle) -> HipError;
        fn hipGraphExecDestroy(Handle) -> HipError;
        fn hipGraphDestroy(Handle) -> HipError;
    }
}

entry_points! {
    /// hiprtc: in libhiprtc from ROCm 6 on, inside libamdhip64 before.
    pub(crate) struct RtcApi {
        fn hiprtcVersion(*mut c_int, *mut c_int) -> RtcResult;
        fn hiprtcGetErrorString(RtcResult) -> *const c_char;
        fn hiprtcCreateProgram(
            *mut RtcProgram, *const c_char, *const c_char, c_int,
            *const *const c_char, *const *const c_char,
        ) -> RtcResult;
        fn hiprtcCompileProgram(RtcProgram, c_int, *const *const c_char) -> RtcResult;
        fn hiprtcDestroyProgram(*mut RtcProgram) -> RtcResult;
        fn hiprtcGetProgramLogSize(RtcProgram, *mut usize) -> RtcResult;
        fn hiprtcGetProgramLog(RtcProgram, *mut c_char) -> RtcResult;
        fn hiprtcGetCodeSize(RtcProgram, *mut usize) -> RtcResult;
        fn hiprtcGetCode(RtcProgram, *mut c_char) -> RtcResult;
    }
}

entry_points! {
    /// The code object manager hiprtc compiles through; asked only which ISAs it knows.
    pub(crate) struct ComgrApi {
        fn amd_comgr_get_version(*mut usize, *mut usize) -> ();
        fn amd_comgr_get_isa_count(*mut usize) -> c_int;
        fn amd_comgr_get_isa_name(usize, *mut *const c_char) -> c_int;
    }
}

/// A loaded library and its entry points.
pub(crate) struct Loaded<T> {
    pub api: T,
    /// The name or path it was loaded by.
    pub path: String,
    _lib: Library,
}

/// Sonames to try for `stem` (newest ROCm first), then the same names in the folders a
/// ROCm install uses when the dynamic loader was not told about it.
fn candidates(stem: &str, versions: &[&str]) -> Vec<String> {
    let mut names = vec![format!("{stem}.so")];
    names.extend(versions.iter().map(|v| format!("{stem}.so.{v}")));
    let mut dirs: Vec<PathBuf> = ["ROCM_PATH", "HIP_PATH"]
        .iter()
        .filter_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
        .map(|d| PathBuf::from(d).join("lib"))
        .collect();
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    let mut all = names.clone();
    for d in &dirs {
        for n in &names {
            all.push(d.join(n).display().to_string());
        }
    }
    all.dedup();
    all
}

pub(crate) fn hip_candidates() -> Vec<String> {
    candidates("libamdhip64", &["7", "6", "5"])
}

fn rtc_candidates() -> Vec<String> {
    let mut c = candidates("libhiprtc", &["7", "6", "5"]);
    // ROCm 5.x has hiprtc inside the runtime library.
    c.extend(hip_candidates());
    c
}

fn comgr_candidates() -> Vec<String> {
    candidates("libamd_comgr", &["3", "2"])
}

/// Loads the first candidate that opens and exports every symbol of `T`; the error
/// names what was tried and why each was refused.
fn load_first<T>(
    what: &str,
    names: &[String],
    resolve: unsafe fn(&Library) -> Result<T, Vec<&'static str>>,
) -> Result<Loaded<T>, String> {
    let mut lacking: Vec<String> = Vec::new();
    for name in names {
        // SAFETY: loading a ROCm library runs its initialisers, which only set up the
        // runtime's own state; nothing else of this process is touched.
        let Ok(lib) = (unsafe { Library::new(name) }) else {
            continue;
        };
        // SAFETY: the library is the one `T` describes (by name); `Loaded` keeps it alive
        // as long as the table.
        match unsafe { resolve(&lib) } {
            Ok(api) => {
                return Ok(Loaded {
                    api,
                    path: name.clone(),
                    _lib: lib,
                });
            }
            Err(missing) => lacking.push(format!("{name} lacks {}", missing.join(", "))),
        }
    }
    let shown: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| !n.contains('/'))
        .collect();
    let mut msg = format!(
        "{what} could not be loaded (tried {} and {} paths under $ROCM_PATH, $HIP_PATH and \
         /opt/rocm)",
        shown.join(", "),
        names.len() - shown.len()
    );
    if !lacking.is_empty() {
        msg.push_str(&format!("; {}", lacking.join("; ")));
    }
    Err(msg)
}

static HIP: OnceLock<Result<Loaded<HipApi>, String>> = OnceLock::new();
static RTC: OnceLock<Result<Loaded<RtcApi>, String>> = OnceLock::new();
static COMGR: OnceLock<Result<Loaded<ComgrApi>, String>> = OnceLock::new();

/// The HIP runtime, loaded once per process.
pub(crate) fn hip() -> Result<&'static Loaded<HipApi>, String> {
    HIP.get_or_init(|| load_first("libamdhip64", &hip_candidates(), HipApi::resolve))
        .as_ref()
        .map_err(|e| {
            format!(
                "{e}; install ROCm's HIP runtime (Debian 12: apt-get install libamdhip64-5; \
                 ROCm releases: rocm-hip-runtime) or add its folder to LD_LIBRARY_PATH"
            )
        })
}

/// hiprtc, loaded once per process.
pub(crate) fn rtc() -> Result<&'static Loaded<RtcApi>, String> {
    RTC.get_or_init(|| load_first("hiprtc", &rtc_candidates(), RtcApi::resolve))
        .as_ref()
        .map_err(|e| {
            format!(
                "{e}; install hiprtc (Debian 12: apt-get install libamdhip64-5 \
                 libhiprtc-builtins5; ROCm 6+: hiprtc) or add its folder to LD_LIBRARY_PATH"
            )
        })
}

/// comgr, loaded once per process.
pub(crate) fn comgr() -> Result<&'static Loaded<ComgrApi>, String> {
    COMGR
        .get_or_init(|| load_first("libamd_comgr", &comgr_candidates(), ComgrApi::resolve))
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_try_sonames_before_rocm_folders() {
        let c = candidates("libamdhip64", &["6", "5"]);
        assert_eq!(
            &c[..3],
            ["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"]
        );
        assert!(c.contains(&"/opt/rocm/lib/libamdhip64.so.5".to_string()));
        // hiprtc falls back to the runtime library (ROCm 5.x keeps it there).
        let r = rtc_candidates();
        assert!(r[0].starts_with("libhiprtc"));
        assert!(r.iter().any(|n| n == "libamdhip64.so.5"));
    }

    #[test]
    fn tables_name_every_entry_point() {
        assert_eq!(HipApi::SYMBOLS.len(), 37);
        assert!(HipApi::SYMBOLS.contains(&"hipModuleLaunchKernel"));
        assert!(RtcApi::SYMBOLS.contains(&"hiprtcGetCode"));
    }

    #[test]
    fn a_library_without_the_symbols_is_refused_with_their_names() {
        // libc loads everywhere and exports none of HIP.
        let lib = ["libc.so.6", "libc.so"]
            .iter()
            // SAFETY: loading libc again only bumps its reference count.
            .find_map(|n| unsafe { Library::new(*n) }.ok());
        let Some(lib) = lib else {
            eprintln!("a_library_without_the_symbols_is_refused: no libc to load; skipped");
            return;
        };
        // SAFETY: libc lacks these symbols, so nothing is ever called.
        match unsafe { HipApi::resolve(&lib) } {
            Err(missing) => {
                assert_eq!(missing.len(), HipApi::SYMBOLS.len());
                assert_eq!(missing[0], "hipGetErrorName");
            }
            Ok(_) => panic!("libc resolved as HIP"),
        }
    }
}
