//! The HIP backend: [`strata_core::Backend`] on the HIP runtime API for AMD GPUs, with
//! the kernels of kernels-hip/ compiled by hiprtc for the device's `gcnArchName` and
//! cached on disk.
//!
//! # Why the runtime is loaded at run time, not through `hip-sys`
//!
//! `hip-sys` (0.1, with `hip-runtime-sys`) would give bindings, but its build script
//! panics unless ROCm's headers are installed (`$HIP_PATH/include/hip/hip_runtime_api.h`)
//! and it links `libamdhip64` at build time; it binds no hiprtc at all. strata's default
//! build and `cargo test --workspace` must work on machines with no GPU software. So the
//! few dozen HIP and hiprtc functions this crate calls are declared here (`ffi.rs`, only
//! signatures that are the same from ROCm 5.2 to 7) and `libamdhip64` / `libhiprtc` are
//! opened with `libloading` (already in the tree through cudarc). The crate builds
//! everywhere; without ROCm, or without the amdgpu kernel driver, [`devices`] and
//! [`device`] return [`strata_core::Error::NoDriver`] with the reason, never a panic.
//!
//! No version-dependent struct is read field by field: memory comes from `hipMemGetInfo`
//! and `hipDeviceTotalMem`, sizes from `hipDeviceGetAttribute`, and the architecture from
//! the device properties read as opaque bytes (see `runtime.rs`), or `STRATA_HIP_ARCH`.
//!
//! hiprtc needs no GPU, only the runtime library: the tests compile every kernels-hip/
//! module for gfx90a (wave64) and gfx1030 (wave32) on CI machines without one.

mod backend;
mod compile;
mod ffi;
mod kernels;
mod runtime;

pub use backend::{HipBackend, HipOptions};
pub use compile::{
    CompiledModule, Origin as ModuleOrigin, amdgpu_elf_mach, compiler_isas, default_cache_dir,
    hiprtc_version,
};
pub use kernels::{compile_module, compile_source, kernel_modules};

use strata_core::{BackendKind, Device, DeviceInfo, Result};

/// Every HIP device on this machine; `Err(NoDriver)` when the runtime cannot be loaded
/// or the amdgpu kernel driver is absent, an empty list when the driver is there but
/// has no device. Compiles nothing.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let count = runtime::device_count()?;
    (0..count)
        .map(|ordinal| {
            let p = runtime::device_props(ordinal)?;
            Ok(DeviceInfo {
                backend: BackendKind::Hip,
                ordinal,
                name: p.name,
                total_memory: p.total_memory,
                arch: p.arch,
            })
        })
        .collect()
}

/// The HIP runtime's version as (major, minor, patch), e.g. (5, 2, 21153).
pub fn runtime_version() -> Result<(u32, u32, u32)> {
    runtime::runtime_version()
}

/// A [`Device`] over HIP device `ordinal`, with the default kernel cache.
pub fn device(ordinal: usize) -> Result<Device> {
    device_with(ordinal, &HipOptions::default())
}

/// A [`Device`] over HIP device `ordinal` with every kernel it has in use, for tests that
/// launch optional kernels directly (the HIP backend leaves none out; the CUDA backend's
/// function of the same name overrides its default skip list).
pub fn device_with_every_kernel(ordinal: usize) -> Result<Device> {
    device(ordinal)
}

/// A [`Device`] over HIP device `ordinal`, opened with `opts`.
pub fn device_with(ordinal: usize, opts: &HipOptions) -> Result<Device> {
    Device::new(Box::new(HipBackend::new(ordinal, opts)?))
}
