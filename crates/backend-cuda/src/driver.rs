//! Loading the CUDA driver safely, and turning driver results into `strata_core::Error`.
//!
//! cudarc (with `dynamic-loading`) panics on the first call when libcuda cannot be
//! loaded, and on the first call of a function the loaded library lacks. So before any
//! cudarc call we load the library ourselves, check that every symbol this crate calls is
//! there, and only then call `cuInit`. A machine without a driver gets
//! `Error::NoDriver`, never a panic.

use std::ffi::{CStr, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys;
use strata_core::Error;

pub(crate) const NAME: &str = "cuda";

/// Every driver entry point this crate (and its `table_race` binary) calls. A library
/// without one of them is refused up front instead of panicking mid-run.
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyHtoD_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuModuleGetGlobal_v2",
    "cuLaunchKernel",
    "cuGraphInstantiateWithFlags",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuGraphLaunch",
];

/// What `cuInit` found: the driver works, and there may or may not be a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InitState {
    Ready,
    NoDevice,
}

static INIT: OnceLock<Result<InitState, String>> = OnceLock::new();

/// Loads and initialises the driver once per process.
pub(crate) fn init() -> Result<InitState, Error> {
    INIT.get_or_init(|| {
        // A panic inside cudarc's loader is the last thing that could still slip past
        // the checks in `load_and_init`; it becomes a NoDriver reason, not a crash.
        std::panic::catch_unwind(load_and_init).unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(format!("loading libcuda panicked: {what}"))
        })
    })
    .clone()
    .map_err(|reason| Error::NoDriver {
        backend: NAME,
        reason,
    })
}

/// Whether the optional entry point `name` exists (only meaningful after [`init`]).
pub(crate) fn has_symbol(name: &str) -> bool {
    // SAFETY: the library loaded in `init` (callers only ask afterwards); looking up a
    // symbol does not call it.
    unsafe { sys::culib().get::<*const c_void>(name.as_bytes()).is_ok() }
}

fn load_and_init() -> Result<InitState, String> {
    // SAFETY: only tries to dlopen the candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(format!(
            "libcuda could not be loaded (tried {}); install the NVIDIA driver or add its \
             folder to LD_LIBRARY_PATH",
            tried_names("cuda")
        ));
    }
    // SAFETY: present, so cudarc's loader returns it instead of panicking.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = DRIVER_SYMBOLS
        .iter()
        .copied()
        // SAFETY: a symbol lookup, nothing is called.
        .filter(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()).is_err() })
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "libcuda lacks {}: the driver is older than the CUDA 13.0 API strata uses",
            missing.join(", ")
        ));
    }
    // SAFETY: symbol present; cuInit has no preconditions.
    match unsafe { sys::cuInit(0) } {
        sys::CUresult::CUDA_SUCCESS => Ok(InitState::Ready),
        sys::CUresult::CUDA_ERROR_NO_DEVICE => Ok(InitState::NoDevice),
        r => Err(format!("cuInit failed: {}", describe(r))),
    }
}

/// The library names cudarc tries for `lib`, shortened for an error message.
pub(crate) fn tried_names(lib: &str) -> String {
    let all = cudarc::get_lib_name_candidates(lib);
    // The Linux names (libX.so, libX.so.N); the libX64_NN.so variants are Windows-style.
    let shown: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|n| !n.contains("64"))
        .collect();
    format!(
        "{} and {} other names",
        shown.join(", "),
        all.len() - shown.len()
    )
}

/// "CUDA_ERROR_NAME: description" for a driver result.
pub(crate) fn describe(r: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both calls only write a pointer to a static string (or leave it null).
    let (rn, rt) = unsafe {
        (
            sys::cuGetErrorName(r, &mut name),
            sys::cuGetErrorString(r, &mut text),
        )
    };
    let read = |ok: bool, p: *const std::ffi::c_char| {
        // SAFETY: the driver returns NUL-terminated static strings.
        (ok && !p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let ok = |x: sys::CUresult| x == sys::CUresult::CUDA_SUCCESS;
    match (read(ok(rn), name), read(ok(rt), text)) {
        (Some(n), Some(t)) => format!("{n}: {t}"),
        (Some(n), None) => n,
        _ => format!("{r:?}"),
    }
}

/// An error naming the failed driver call.
pub(crate) fn error(call: &'static str, r: sys::CUresult) -> Error {
    Error::Driver {
        backend: NAME,
        call,
        message: describe(r),
    }
}

/// `Ok(())` on success, else an error naming `call`.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<(), Error> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(error(call, r))
    }
}

/// Number of CUDA devices (0 when the driver works but has none).
pub(crate) fn device_count() -> Result<usize, Error> {
    if init()? == InitState::NoDevice {
        return Ok(0);
    }
    let mut n = 0;
    // SAFETY: initialised; writes one int.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The handle, name, total memory and compute capability of device `ordinal`.
pub(crate) struct DeviceProps {
    pub handle: sys::CUdevice,
    pub name: String,
    pub total_memory: usize,
    pub cc: (u32, u32),
    /// Host memory mapped read-only (a model file) can be page-locked for the device.
    pub read_only_register: bool,
}

impl DeviceProps {
    /// "sm_90" for compute capability 9.0.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.cc.0, self.cc.1)
    }
}

pub(crate) fn device_props(ordinal: usize) -> Result<DeviceProps, Error> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::NoSuchDevice {
            backend: NAME,
            ordinal,
            count,
        });
    }
    let ord = i32::try_from(ordinal).map_err(|_| Error::NoSuchDevice {
        backend: NAME,
        ordinal,
        count,
    })?;
    let mut handle: sys::CUdevice = 0;
    // SAFETY: initialised; every call writes only into the locals passed.
    unsafe {
        check("cuDeviceGet", sys::cuDeviceGet(&mut handle, ord))?;
        let mut name = [0 as std::ffi::c_char; 256];
        check(
            "cuDeviceGetName",
            sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, handle),
        )?;
        let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
        let mut total = 0usize;
        check(
            "cuDeviceTotalMem_v2",
            sys::cuDeviceTotalMem_v2(&mut total, handle),
        )?;
        let attr = |a: sys::CUdevice_attribute| -> Result<u32, Error> {
            let mut v = 0;
            check(
                "cuDeviceGetAttribute",
                sys::cuDeviceGetAttribute(&mut v, a, handle),
            )?;
            Ok(u32::try_from(v).unwrap_or(0))
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let read_only_register =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED)
                .unwrap_or(0)
                != 0;
        Ok(DeviceProps {
            handle,
            name,
            total_memory: total,
            cc: (major, minor),
            read_only_register,
        })
    }
}

/// The driver's CUDA version as (major, minor), e.g. (13, 0).
pub(crate) fn driver_version() -> Result<(u32, u32), Error> {
    init()?;
    let mut v = 0;
    // SAFETY: initialised; writes one int.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut v)
    })?;
    let v = u32::try_from(v).unwrap_or(0);
    Ok((v / 1000, (v % 1000) / 10))
}
