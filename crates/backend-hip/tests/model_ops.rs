//! The transformer ops (module `model` of crates/core/kernels.txt) on HIP device 0, each
//! compared with the CPU backend: crates/backend-cuda/tests/model_ops.rs and its cases
//! (model_ops/matmul.rs, model_ops/attention.rs), compiled here with the name
//! `strata_backend_cuda` bound to this crate. Both GPU backends so run the same cases at
//! the same tolerances, and a change to them (a new ABI, a new case) reaches both. In that
//! file's messages "CUDA" means the HIP device here. Without an AMD GPU every test skips;
//! `skipped_without_an_amd_gpu` says so in one line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

// At the crate root, an `extern crate` name joins the extern prelude, so the shared file's
// `strata_backend_cuda::device(0)` opens the HIP device.
extern crate strata_backend_hip as strata_backend_cuda;

// Its helpers are `pub` for its own case files; one (Report::fail) no case calls, which
// rustc only notices inside a module.
#[allow(dead_code)]
#[path = "../../backend-cuda/tests/model_ops.rs"]
mod model_ops;

#[test]
fn skipped_without_an_amd_gpu() {
    if let Err(e) = strata_backend_hip::device(0) {
        // Uncaptured (the harness hides eprintln! of passing tests): one line in CI's log.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "hip model_ops: every test skipped, no AMD GPU (HIP) here: {e}"
        );
    }
}
