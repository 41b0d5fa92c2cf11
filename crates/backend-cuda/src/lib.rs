//! The CUDA backend: [`strata_core::Backend`] on the CUDA driver API (through cudarc,
//! loaded at run time), with the kernels of kernels-cuda/ compiled by NVRTC for the
//! device's architecture and cached on disk.
//!
//! A machine without the NVIDIA driver builds and runs this crate: [`devices`] and
//! [`device`] then return [`strata_core::Error::NoDriver`] instead of panicking.

mod attention_flash;
mod attention_long;
mod backend;
mod compile;
mod driver;
mod kernel_timing;
mod kernels;
mod launch_options;
mod source_scan;
mod variants;

pub use backend::{CudaBackend, CudaOptions};
pub use compile::{Origin as ModuleOrigin, default_cache_dir, nvrtc_version};
pub use kernels::precompile;
pub use launch_options::{DependentLaunch, LaunchOptions};
pub use variants::runs_as;

use strata_core::{BackendKind, Device, DeviceInfo, Result};

/// Every CUDA device on this machine; `Err(NoDriver)` when the driver cannot be loaded,
/// an empty list when it loads but finds no device. Creates no context.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let count = driver::device_count()?;
    (0..count)
        .map(|ordinal| {
            let p = driver::device_props(ordinal)?;
            Ok(DeviceInfo {
                backend: BackendKind::Cuda,
                ordinal,
                arch: p.arch(),
                name: p.name,
                total_memory: p.total_memory,
            })
        })
        .collect()
}

/// The driver's CUDA version as (major, minor), e.g. (13, 0).
pub fn driver_version() -> Result<(u32, u32)> {
    driver::driver_version()
}

/// A [`Device`] over CUDA device `ordinal`, with the default kernel cache.
pub fn device(ordinal: usize) -> Result<Device> {
    device_with(ordinal, &CudaOptions::default())
}

/// A [`Device`] over CUDA device `ordinal` with every optional kernel in use, whatever
/// the default (or `STRATA_CUDA_SKIP`) leaves out: for tests that launch them directly.
pub fn device_with_every_kernel(ordinal: usize) -> Result<Device> {
    let opts = CudaOptions {
        launch: LaunchOptions::all_kernels(),
        ..CudaOptions::default()
    };
    device_with(ordinal, &opts)
}

/// A [`Device`] over CUDA device `ordinal`, opened with `opts`.
pub fn device_with(ordinal: usize, opts: &CudaOptions) -> Result<Device> {
    Device::new(Box::new(CudaBackend::new(ordinal, opts)?))
}
