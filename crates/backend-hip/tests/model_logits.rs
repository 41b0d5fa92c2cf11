//! Whole models on HIP device 0 against the CPU backend (logits of synthetic models of every
//! architecture and, where it is on disk, SmolLM2): crates/backend-cuda/tests/model_logits.rs,
//! compiled here with the name `strata_backend_cuda` bound to this crate, so both GPU
//! backends are held to the same bounds. In that file's messages "CUDA" means the HIP device
//! here. Without an AMD GPU every test skips; `skipped_without_an_amd_gpu` says so in one
//! line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

// At the crate root, an `extern crate` name joins the extern prelude, so the shared file's
// `strata_backend_cuda::device(0)` opens the HIP device.
extern crate strata_backend_hip as strata_backend_cuda;

#[path = "../../backend-cuda/tests/model_logits.rs"]
mod model_logits;

#[test]
fn skipped_without_an_amd_gpu() {
    if let Err(e) = strata_backend_hip::device(0) {
        // Uncaptured (the harness hides eprintln! of passing tests): one line in CI's log.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "hip model_logits: every test skipped, no AMD GPU (HIP) here: {e}"
        );
    }
}
