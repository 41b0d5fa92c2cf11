//! Block formats: layouts, dequantisation and dot products on the CPU, bit-exact
//! with ggml's definitions.
//!
//! One file per family of formats. Each implemented format exposes a
//! [`FormatKernels`] table; [`kernels`] returns the fastest one this CPU can
//! run and [`scalar_kernels`] the reference one the SIMD paths are tested against.

pub mod format;

pub use format::QuantType;

/// The activation format a weight format's dot product takes, as llama.cpp
/// pairs them (`vec_dot_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    F32,
    F16,
    BF16,
    Q8_0,
    Q8_1,
    Q8_K,
}

/// The CPU kernels of one weight format.
pub struct FormatKernels {
    pub ty: QuantType,
    /// Dequantise a row: `src` holds `dst.len() / block_size` blocks.
    pub dequant: fn(src: &[u8], dst: &mut [f32]),
    /// Dot product of a quantised row of `n` elements with an activation row
    /// already quantised to `act` (see [`quantize_activation`]).
    pub vec_dot: fn(n: usize, row: &[u8], act: &[u8]) -> f32,
    pub act: ActFormat,
}

/// The fastest kernels for `ty` on this CPU, or `None` if the format is not implemented.
pub fn kernels(ty: QuantType) -> Option<&'static FormatKernels> {
    scalar_kernels(ty)
}

/// The scalar reference kernels for `ty`.
pub fn scalar_kernels(ty: QuantType) -> Option<&'static FormatKernels> {
    let _ = ty;
    None
}
