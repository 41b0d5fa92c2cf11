//! The core conformance suite on the HIP backend. Without ROCm, the amdgpu kernel driver
//! or an AMD GPU, every test prints one line saying it was skipped (the first one to run
//! also prints why, once). On a GPU run them serially (`--test-threads=1`): several
//! tests time cross-stream races with busy kernels.

fn gpu() -> Option<strata_core::Device> {
    match strata_backend_hip::device(0) {
        Ok(dev) => Some(dev),
        Err(
            e @ (strata_core::Error::NoDriver { .. } | strata_core::Error::NoSuchDevice { .. }),
        ) => {
            static WHY: std::sync::Once = std::sync::Once::new();
            WHY.call_once(|| eprintln!("hip conformance: no AMD GPU here: {e}"));
            None
        }
        // A GPU that is present but cannot be opened is a failure, not a skip.
        Err(e) => panic!("a HIP device is present but could not be opened: {e}"),
    }
}

strata_core::conformance_tests!(|| gpu());
