//! Finding the HIP runtime and its devices, and turning HIP results into
//! `strata_core::Error`. A machine without ROCm, or with ROCm but without the amdgpu
//! kernel driver, gets `Error::NoDriver`, never a panic.

use std::ffi::{CStr, c_char, c_int};
use std::sync::OnceLock;

use strata_core::Error;

use crate::ffi::{self, HIP_ERROR_NO_DEVICE, HIP_SUCCESS, HipApi, HipError};

pub(crate) const NAME: &str = "hip";

/// The kernel driver's device node; HIP finds no device without it.
const KFD: &str = "/dev/kfd";

static COUNT: OnceLock<Result<usize, String>> = OnceLock::new();

/// The runtime's entry points, or `NoDriver` saying why it cannot be loaded.
pub(crate) fn api() -> Result<&'static HipApi, Error> {
    ffi::hip()
        .map(|l| &l.api)
        .map_err(|reason| Error::NoDriver {
            backend: NAME,
            reason,
        })
}

/// Number of HIP devices, found once per process: `NoDriver` without a runtime, or with
/// a runtime but no amdgpu kernel driver; 0 when the driver is there but has no GPU.
pub(crate) fn device_count() -> Result<usize, Error> {
    let api = api()?;
    COUNT
        .get_or_init(|| {
            let mut n: c_int = 0;
            // SAFETY: writes one int.
            match unsafe { (api.hipGetDeviceCount)(&mut n) } {
                HIP_SUCCESS => Ok(usize::try_from(n).unwrap_or(0)),
                HIP_ERROR_NO_DEVICE if !std::path::Path::new(KFD).exists() => Err(format!(
                    "the HIP runtime loaded ({}), but {KFD} is missing: no amdgpu kernel \
                     driver is loaded (or a container was started without --device={KFD} \
                     --device=/dev/dri), so there is no AMD GPU to use",
                    ffi::hip().map(|l| l.path.as_str()).unwrap_or("?")
                )),
                HIP_ERROR_NO_DEVICE => match kfd_access() {
                    Some(why) => Err(why),
                    None => Ok(0),
                },
                r => Err(format!("hipGetDeviceCount failed: {}", describe(r))),
            }
        })
        .clone()
        .map_err(|reason| Error::NoDriver {
            backend: NAME,
            reason,
        })
}

/// Why this process cannot use the kernel driver's node, when it exists but will not
/// open (HIP then reports no device, which would hide the real cause).
fn kfd_access() -> Option<String> {
    match std::fs::OpenOptions::new().read(true).write(true).open(KFD) {
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Some(format!(
            "{KFD} exists but this user may not open it ({e}); add the user to the `render` \
             and `video` groups"
        )),
        Err(_) => None,
    }
}

/// "hipErrorName: description" for a HIP result.
pub(crate) fn describe(r: HipError) -> String {
    let Ok(api) = api() else {
        return format!("HIP error {r}");
    };
    let read = |p: *const c_char| {
        // SAFETY: HIP returns NUL-terminated static strings (or null).
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    // SAFETY: both only return a pointer to a static string.
    let (name, text) = unsafe { ((api.hipGetErrorName)(r), (api.hipGetErrorString)(r)) };
    match (read(name), read(text)) {
        (Some(n), Some(t)) if n != t => format!("{n}: {t}"),
        (Some(n), _) => n,
        _ => format!("HIP error {r}"),
    }
}

/// An error naming the failed HIP call.
pub(crate) fn error(call: &'static str, r: HipError) -> Error {
    Error::Driver {
        backend: NAME,
        call,
        message: describe(r),
    }
}

/// `Ok(())` on success, else an error naming `call`.
pub(crate) fn check(call: &'static str, r: HipError) -> Result<(), Error> {
    if r == HIP_SUCCESS {
        Ok(())
    } else {
        Err(error(call, r))
    }
}

/// What strata needs to know about one device.
pub(crate) struct DeviceProps {
    pub ordinal: c_int,
    pub name: String,
    pub total_memory: usize,
    /// The full target id, e.g. "gfx90a:sramecc+:xnack-".
    pub arch: String,
    pub warp_size: u32,
    pub compute_units: u32,
    /// Rate of `wall_clock64()` in kHz, when the runtime reports it (ROCm 6+).
    pub wall_clock_khz: Option<u32>,
}

/// "gfx90a" for "gfx90a:sramecc+:xnack-".
pub(crate) fn base_arch(target: &str) -> &str {
    target.split(':').next().unwrap_or(target)
}

/// Checks `ordinal` against the device count and converts it for HIP.
pub(crate) fn ordinal_of(ordinal: usize) -> Result<c_int, Error> {
    let count = device_count()?;
    let no_such = Error::NoSuchDevice {
        backend: NAME,
        ordinal,
        count,
    };
    if ordinal >= count {
        return Err(no_such);
    }
    c_int::try_from(ordinal).map_err(|_| no_such)
}

pub(crate) fn device_props(ordinal: usize) -> Result<DeviceProps, Error> {
    let ord = ordinal_of(ordinal)?;
    let api = api()?;
    let attr = |a: c_int| -> Option<u32> {
        let mut v: c_int = 0;
        // SAFETY: writes one int; an attribute this runtime lacks is an error result.
        let r = unsafe { (api.hipDeviceGetAttribute)(&mut v, a, ord) };
        (r == HIP_SUCCESS).then(|| u32::try_from(v).ok()).flatten()
    };
    let mut name = [0 as c_char; 256];
    let mut total = 0usize;
    // SAFETY: each call writes only into the locals passed (the name within its length).
    unsafe {
        check(
            "hipDeviceGetName",
            (api.hipDeviceGetName)(name.as_mut_ptr(), name.len() as c_int, ord),
        )?;
        check(
            "hipDeviceTotalMem",
            (api.hipDeviceTotalMem)(&mut total, ord),
        )?;
    }
    // SAFETY: HIP wrote a NUL-terminated name into the zeroed array.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Ok(DeviceProps {
        ordinal: ord,
        name,
        total_memory: total,
        arch: device_arch(ord)?,
        warp_size: attr(ffi::ATTR_WARP_SIZE).unwrap_or(64),
        compute_units: attr(ffi::ATTR_MULTIPROCESSOR_COUNT).unwrap_or(0),
        // A wrong attribute number (a renumbered enum) gives an implausible rate: refused.
        wall_clock_khz: attr(ffi::ATTR_WALL_CLOCK_RATE)
            .filter(|k| (1_000..=10_000_000).contains(k)),
    })
}

/// The device's target id (`gcnArchName`). `STRATA_HIP_ARCH` overrides it. Otherwise it
/// comes from the runtime's device properties, read as opaque bytes: the struct's layout
/// changed between ROCm 5 and 6 (and the attribute that once returned the name is gone),
/// but in every version the name is a NUL-terminated "gfx…" string inside it.
fn device_arch(ord: c_int) -> Result<String, Error> {
    if let Ok(a) = std::env::var("STRATA_HIP_ARCH")
        && is_target_id(a.trim())
    {
        return Ok(a.trim().to_string());
    }
    let lib = ffi::hip().map_err(|reason| Error::NoDriver {
        backend: NAME,
        reason,
    })?;
    let not_found = |why: &str| Error::Driver {
        backend: NAME,
        call: "hipGetDeviceProperties",
        message: format!("{why}; set STRATA_HIP_ARCH (e.g. gfx90a) to name the architecture"),
    };
    type GetProps = unsafe extern "C" fn(*mut std::ffi::c_void, c_int) -> HipError;
    // Newest layout first; either way the buffer is far larger than the struct.
    let func = ["hipGetDevicePropertiesR0600", "hipGetDeviceProperties"]
        .iter()
        // SAFETY: a symbol lookup; both take (hipDeviceProp_t*, int).
        .find_map(|s| unsafe { lib_symbol::<GetProps>(&lib.path, s) })
        .ok_or_else(|| not_found("the runtime exports no hipGetDeviceProperties"))?;
    let mut blob = vec![0u64; 8192];
    // SAFETY: 64 KiB of zeroes, many times the size of any hipDeviceProp_t.
    check("hipGetDeviceProperties", unsafe {
        func(blob.as_mut_ptr().cast(), ord)
    })?;
    let bytes: Vec<u8> = blob.iter().flat_map(|w| w.to_ne_bytes()).collect();
    arch_from_properties(&bytes)
        .ok_or_else(|| not_found("no gfx target name in the device properties"))
}

/// Looks `symbol` up in the already loaded library `path` (a second `dlopen` of a
/// loaded library only takes a reference).
///
/// # Safety
/// `T` must be the symbol's C signature.
unsafe fn lib_symbol<T: Copy>(path: &str, symbol: &str) -> Option<T> {
    // SAFETY: the library is already loaded; this only bumps its reference count, and the
    // handle is leaked so the symbol stays valid.
    let lib = unsafe { libloading::Library::new(path) }.ok()?;
    // SAFETY: the caller names the signature.
    let f = unsafe { lib.get::<T>(symbol.as_bytes()) }.ok().map(|s| *s);
    std::mem::forget(lib);
    f
}

/// Whether `s` looks like an AMD GPU target id: "gfx" + processor, then optional
/// ":feature+" / ":feature-" parts.
pub(crate) fn is_target_id(s: &str) -> bool {
    let mut parts = s.split(':');
    let proc_ok = parts.next().is_some_and(|p| {
        p.strip_prefix("gfx").is_some_and(|rest| {
            (3..=5).contains(&rest.len()) && rest.bytes().all(|b| b.is_ascii_alphanumeric())
        })
    });
    proc_ok
        && parts.all(|f| {
            f.len() >= 2
                && (f.ends_with('+') || f.ends_with('-'))
                && f[..f.len() - 1]
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
}

/// The gfx target id in a device-properties blob: every NUL-delimited string that is a
/// target id is a candidate, and the longest wins (`gcnArchName` carries the features;
/// the marketing `name` is at most the bare processor).
pub(crate) fn arch_from_properties(blob: &[u8]) -> Option<String> {
    blob.split(|&b| b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .filter(|s| is_target_id(s))
        .max_by_key(|s| s.len())
        .map(str::to_string)
}

/// The HIP runtime's version as (major, minor, patch), e.g. (5, 2, 21153).
pub(crate) fn runtime_version() -> Result<(u32, u32, u32), Error> {
    let api = api()?;
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    check("hipRuntimeGetVersion", unsafe {
        (api.hipRuntimeGetVersion)(&mut v)
    })?;
    Ok(decode_version(u32::try_from(v).unwrap_or(0)))
}

/// HIP's version encoding: major * 10^7 + minor * 10^5 + patch.
pub(crate) fn decode_version(v: u32) -> (u32, u32, u32) {
    (v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_ids_are_recognised() {
        for ok in [
            "gfx90a",
            "gfx1030",
            "gfx942:sramecc+:xnack-",
            "gfx90a:xnack+",
            "gfx1100",
            "gfx803",
        ] {
            assert!(is_target_id(ok), "{ok}");
        }
        for bad in [
            "",
            "gfx",
            "gfx9",
            "sm_90",
            "AMD Instinct MI210",
            "gfx90a:",
            "gfx90a:xnack",
            "gfx 90a",
        ] {
            assert!(!is_target_id(bad), "{bad}");
        }
        assert_eq!(base_arch("gfx90a:sramecc+:xnack-"), "gfx90a");
        assert_eq!(base_arch("gfx1030"), "gfx1030");
    }

    #[test]
    fn arch_is_found_in_either_properties_layout() {
        // ROCm 5's hipDeviceProp_t: name at 0, gcnArchName at byte 396 (of 792).
        let mut r0000 = vec![0u8; 792];
        r0000[..18].copy_from_slice(b"AMD Instinct MI210");
        r0000[396..396 + 22].copy_from_slice(b"gfx90a:sramecc+:xnack-");
        r0000[300..304].copy_from_slice(&40u32.to_ne_bytes());
        assert_eq!(
            arch_from_properties(&r0000).as_deref(),
            Some("gfx90a:sramecc+:xnack-")
        );
        // Some runtimes report the processor as the name too: the full id still wins.
        let mut named = vec![0u8; 2048];
        named[..7].copy_from_slice(b"gfx1030");
        named[1160..1167].copy_from_slice(b"gfx1030");
        assert_eq!(arch_from_properties(&named).as_deref(), Some("gfx1030"));
        assert_eq!(arch_from_properties(&[0u8; 64]), None);
    }

    #[test]
    fn runtime_version_decodes_hips_encoding() {
        // What Debian 12's libamdhip64.so.5.2.21153 returns from hipRuntimeGetVersion.
        assert_eq!(decode_version(50_221_153), (5, 2, 21153));
        assert_eq!(decode_version(60_443_483), (6, 4, 43483));
    }
}
