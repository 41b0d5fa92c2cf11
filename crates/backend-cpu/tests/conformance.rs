//! The core conformance suite on the CPU backend, plain and in sanitizer mode.

mod plain {
    strata_core::conformance_tests!(|| strata_backend_cpu::device(
        strata_backend_cpu::CpuOptions::default()
    )
    .ok());
}

mod sanitized {
    strata_core::conformance_tests!(|| strata_backend_cpu::device(
        strata_backend_cpu::CpuOptions {
            sanitize: true,
            max_dma_delay_us: 100,
            ..Default::default()
        }
    )
    .ok());
}
