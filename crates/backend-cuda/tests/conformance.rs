//! The core conformance suite on the CUDA backend. Without a driver or a GPU every test
//! prints one line saying it was skipped. On a GPU run them serially
//! (`--test-threads=1`): several tests time cross-stream races with busy kernels.

fn gpu() -> Option<strata_core::Device> {
    match strata_backend_cuda::device(0) {
        Ok(dev) => Some(dev),
        Err(strata_core::Error::NoDriver { .. } | strata_core::Error::NoSuchDevice { .. }) => None,
        // A GPU that is present but cannot be opened is a failure, not a skip.
        Err(e) => panic!("a CUDA device is present but could not be opened: {e}"),
    }
}

strata_core::conformance_tests!(|| gpu());
