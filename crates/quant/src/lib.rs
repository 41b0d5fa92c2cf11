//! Block formats: layouts, dequantisation and dot products on the CPU, bit-exact
//! with ggml's definitions.
//!
//! One file per family of formats. Each implemented format exposes a
//! [`FormatKernels`] table; [`kernels`] returns the fastest one this CPU can
//! run and [`scalar_kernels`] the reference one the SIMD paths are tested against.
//!
//! Weight formats and the activation format their dot product takes (ggml's
//! `vec_dot_type`):
//!
//! | weights | activation |
//! |---|---|
//! | F32 | F32 |
//! | F16 | F16 (as ggml: the activation is rounded to f16) |
//! | BF16 | BF16 (likewise) |
//! | Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 | Q8_0 |
//! | Q4_1, Q5_1 | Q8_1 |
//! | Q2_K … Q6_K, IQ2_*, IQ3_*, IQ4_XS | Q8_K |

pub mod activation;
mod block;
mod float;
pub mod format;
mod iq2;
mod iq3;
mod iq4;
#[cfg(target_arch = "x86_64")]
mod iq4_avx2;
#[cfg(target_arch = "x86_64")]
mod iq_avx2;
pub mod iq_tables;
mod kquants;
mod legacy;
pub mod matmul;
mod mxfp4;
pub mod q4k_rows8;

#[cfg(target_arch = "x86_64")]
mod simd_avx2_activation;
#[cfg(target_arch = "x86_64")]
mod simd_avx2_float;
#[cfg(target_arch = "x86_64")]
mod simd_avx2_kquants;
#[cfg(target_arch = "x86_64")]
mod simd_avx2_legacy;
#[cfg(target_arch = "aarch64")]
mod simd_neon;

pub use format::QuantType;
pub use matmul::{matmul, matvec};

/// Errors of the checked entry points (lengths and formats); the raw kernels in
/// [`FormatKernels`] assume checked arguments.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("{ty}: no CPU kernels for this format")]
    Unsupported { ty: QuantType },
    #[error("{what}: {n} values is not a whole number of {block}-value blocks")]
    PartialBlock {
        what: &'static str,
        n: usize,
        block: usize,
    },
    #[error("{what}: expected {expected} bytes, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

/// The activation format a weight format's dot product takes, as llama.cpp
/// pairs them (`vec_dot_type`).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    F32,
    F16,
    BF16,
    Q8_0,
    Q8_1,
    Q8_K,
}

impl ActFormat {
    /// Values per block.
    pub const fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q8_0 | Self::Q8_1 => activation::QK8,
            Self::Q8_K => activation::QK_K,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q8_0 => activation::Q8_0_BYTES,
            Self::Q8_1 => activation::Q8_1_BYTES,
            Self::Q8_K => activation::Q8_K_BYTES,
        }
    }

    /// Bytes of a row of `n` values, or `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let b = self.block_size();
        n.is_multiple_of(b).then(|| n / b * self.type_size())
    }
}

/// The CPU kernels of one weight format.
pub struct FormatKernels {
    pub ty: QuantType,
    /// Dequantise a row: `src` holds `dst.len() / block_size` blocks.
    pub dequant: fn(src: &[u8], dst: &mut [f32]),
    /// Dot product of a quantised row of `n` elements with an activation row
    /// already quantised to `act` (see [`quantize_activation`]). `n` must be a
    /// multiple of both block sizes and both slices at least a row long; a
    /// short slice panics (never reads out of bounds).
    pub vec_dot: fn(n: usize, row: &[u8], act: &[u8]) -> f32,
    pub act: ActFormat,
}

/// The instruction sets the kernels come in, from slowest to fastest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Portable Rust, the reference.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// aarch64 NEON (baseline there). Only one SIMD family exists per
    /// architecture, so the order between `Avx2` and `Neon` means nothing.
    Neon,
}

/// The best [`SimdLevel`] this CPU runs.
pub fn detected_simd() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return SimdLevel::Avx2;
        }
    }
    if cfg!(target_arch = "aarch64") {
        SimdLevel::Neon
    } else {
        SimdLevel::Scalar
    }
}

/// The fastest kernels for `ty` on this CPU, or `None` if the format is not implemented.
pub fn kernels(ty: QuantType) -> Option<&'static FormatKernels> {
    kernels_at(ty, detected_simd())
}

/// The kernels for `ty` using at most `level` (clamped to what this CPU runs);
/// formats without a SIMD version at that level get the scalar one.
pub fn kernels_at(ty: QuantType, level: SimdLevel) -> Option<&'static FormatKernels> {
    let level = level.min(detected_simd());
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2
        && let Some(k) = avx2_kernels(ty)
    {
        return Some(k);
    }
    #[cfg(target_arch = "aarch64")]
    if level >= SimdLevel::Neon
        && let Some(k) = neon_kernels(ty)
    {
        return Some(k);
    }
    let _ = level;
    scalar_kernels(ty)
}

/// NEON kernels (baseline on aarch64; compiled and tested under qemu-aarch64).
#[cfg(target_arch = "aarch64")]
fn neon_kernels(ty: QuantType) -> Option<&'static FormatKernels> {
    use QuantType::*;
    Some(match ty {
        F32 => &simd_neon::F32,
        BF16 => &simd_neon::BF16,
        Q4_0 => &simd_neon::Q4_0,
        Q4_1 => &simd_neon::Q4_1,
        Q5_0 => &simd_neon::Q5_0,
        Q5_1 => &simd_neon::Q5_1,
        Q8_0 => &simd_neon::Q8_0,
        Q2_K => &simd_neon::Q2_K,
        Q3_K => &simd_neon::Q3_K,
        Q4_K => &simd_neon::Q4_K,
        Q5_K => &simd_neon::Q5_K,
        Q6_K => &simd_neon::Q6_K,
        _ => return None,
    })
}

/// AVX2 kernels (the caller has checked the CPU runs AVX2 + FMA + F16C).
#[cfg(target_arch = "x86_64")]
fn avx2_kernels(ty: QuantType) -> Option<&'static FormatKernels> {
    // Filled in by the SIMD files; IQ formats and MXFP4 add their arms here.
    use QuantType::*;
    Some(match ty {
        F32 => &simd_avx2_float::F32,
        F16 => &simd_avx2_float::F16,
        BF16 => &simd_avx2_float::BF16,
        Q4_0 => &simd_avx2_legacy::Q4_0,
        Q4_1 => &simd_avx2_legacy::Q4_1,
        Q5_0 => &simd_avx2_legacy::Q5_0,
        Q5_1 => &simd_avx2_legacy::Q5_1,
        Q8_0 => &simd_avx2_legacy::Q8_0,
        Q2_K => &simd_avx2_kquants::Q2_K,
        Q3_K => &simd_avx2_kquants::Q3_K,
        Q4_K => &simd_avx2_kquants::Q4_K,
        Q5_K => &simd_avx2_kquants::Q5_K,
        Q6_K => &simd_avx2_kquants::Q6_K,
        IQ2_XXS => &iq_avx2::IQ2_XXS_AVX2,
        IQ2_XS => &iq_avx2::IQ2_XS_AVX2,
        IQ2_S => &iq_avx2::IQ2_S_AVX2,
        IQ3_XXS => &iq_avx2::IQ3_XXS_AVX2,
        IQ3_S => &iq_avx2::IQ3_S_AVX2,
        IQ4_NL => &iq4_avx2::IQ4_NL_AVX2,
        IQ4_XS => &iq4_avx2::IQ4_XS_AVX2,
        MXFP4 => &iq4_avx2::MXFP4_AVX2,
        _ => return None,
    })
}

/// The scalar reference kernels for `ty`.
pub fn scalar_kernels(ty: QuantType) -> Option<&'static FormatKernels> {
    use QuantType::*;
    Some(match ty {
        F32 => &float::F32,
        F16 => &float::F16,
        BF16 => &float::BF16,
        Q4_0 => &legacy::Q4_0,
        Q4_1 => &legacy::Q4_1,
        Q5_0 => &legacy::Q5_0,
        Q5_1 => &legacy::Q5_1,
        Q8_0 => &legacy::Q8_0,
        Q2_K => &kquants::Q2_K,
        Q3_K => &kquants::Q3_K,
        Q4_K => &kquants::Q4_K,
        Q5_K => &kquants::Q5_K,
        Q6_K => &kquants::Q6_K,
        IQ2_XXS => &iq2::IQ2_XXS_SCALAR,
        IQ2_XS => &iq2::IQ2_XS_SCALAR,
        IQ2_S => &iq2::IQ2_S_SCALAR,
        IQ3_XXS => &iq3::IQ3_XXS_SCALAR,
        IQ3_S => &iq3::IQ3_S_SCALAR,
        IQ4_NL => &iq4::IQ4_NL_SCALAR,
        IQ4_XS => &iq4::IQ4_XS_SCALAR,
        MXFP4 => &mxfp4::MXFP4_SCALAR,
        _ => return None,
    })
}

fn check_blocks(what: &'static str, n: usize, block: usize) -> Result<usize, QuantError> {
    if !n.is_multiple_of(block) {
        return Err(QuantError::PartialBlock { what, n, block });
    }
    Ok(n / block)
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), QuantError> {
    if expected != got {
        return Err(QuantError::Length {
            what,
            expected,
            got,
        });
    }
    Ok(())
}

/// Quantise an f32 activation row into `out` (exactly `act.row_bytes(x.len())` long).
pub fn quantize_activation_into(
    act: ActFormat,
    x: &[f32],
    out: &mut [u8],
) -> Result<(), QuantError> {
    quantize_activation_into_at(detected_simd(), act, x, out)
}

/// [`quantize_activation_into`] using at most `level` (clamped to this CPU).
/// The scalar level is ggml's reference quantiser; the AVX2 level is what
/// llama.cpp's CPU backend runs on x86, which for Q8_0 and Q8_1 differs from the
/// reference at ties and near-ties (see simd_avx2_activation.rs).
pub fn quantize_activation_into_at(
    level: SimdLevel,
    act: ActFormat,
    x: &[f32],
    out: &mut [u8],
) -> Result<(), QuantError> {
    let nb = check_blocks("activation row", x.len(), act.block_size())?;
    check_len("activation buffer", nb * act.type_size(), out.len())?;
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2 && simd_avx2_activation::quantize_row(act, x, out) {
        return Ok(());
    }
    let _ = level;
    match act {
        ActFormat::F32 => activation::quantize_row_f32(x, out),
        ActFormat::F16 => activation::quantize_row_f16(x, out),
        ActFormat::BF16 => activation::quantize_row_bf16(x, out),
        ActFormat::Q8_0 => activation::quantize_row_q8_0(x, out),
        ActFormat::Q8_1 => activation::quantize_row_q8_1(x, out),
        ActFormat::Q8_K => activation::quantize_row_q8_k(x, out),
    }
    Ok(())
}

/// Quantise an f32 activation row as llama.cpp does on this CPU (see [`quantize_activation_into_at`]).
pub fn quantize_activation(act: ActFormat, x: &[f32]) -> Result<Vec<u8>, QuantError> {
    let nb = check_blocks("activation row", x.len(), act.block_size())?;
    let mut out = vec![0u8; nb * act.type_size()];
    quantize_activation_into(act, x, &mut out)?;
    Ok(out)
}

/// Dequantise an activation row (the values a dot product really multiplies by).
pub fn dequantize_activation(
    act: ActFormat,
    src: &[u8],
    dst: &mut [f32],
) -> Result<(), QuantError> {
    let nb = check_blocks("activation row", dst.len(), act.block_size())?;
    check_len("activation row", nb * act.type_size(), src.len())?;
    match act {
        ActFormat::F32 => float::dequant_f32(src, dst),
        ActFormat::F16 => float::dequant_f16(src, dst),
        ActFormat::BF16 => float::dequant_bf16(src, dst),
        ActFormat::Q8_0 => activation::dequantize_row_q8_0(src, dst),
        ActFormat::Q8_1 => activation::dequantize_row_q8_1(src, dst),
        ActFormat::Q8_K => activation::dequantize_row_q8_k(src, dst),
    }
    Ok(())
}

/// Dequantise a row of `dst.len()` values of type `ty` from `src`.
pub fn dequantize_row(ty: QuantType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let k = kernels(ty).ok_or(QuantError::Unsupported { ty })?;
    let nb = check_blocks("weight row", dst.len(), ty.block_size())?;
    check_len("weight row", nb * ty.type_size(), src.len())?;
    (k.dequant)(src, dst);
    Ok(())
}

/// Dot product of a row of `n` values of type `ty` with an activation row
/// quantised by [`quantize_activation`] to `kernels(ty).act`.
pub fn vec_dot(ty: QuantType, n: usize, row: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    let k = kernels(ty).ok_or(QuantError::Unsupported { ty })?;
    check_row_args(k, n, row, act)?;
    Ok((k.vec_dot)(n, row, act))
}

/// Checks the arguments of `k.vec_dot(n, row, act)`.
pub(crate) fn check_row_args(
    k: &FormatKernels,
    n: usize,
    row: &[u8],
    act: &[u8],
) -> Result<(), QuantError> {
    let nb = check_blocks("weight row", n, k.ty.block_size())?;
    check_len("weight row", nb * k.ty.type_size(), row.len())?;
    let na = check_blocks("activation row", n, k.act.block_size())?;
    check_len("activation row", na * k.act.type_size(), act.len())?;
    Ok(())
}
