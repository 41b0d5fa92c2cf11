//! MXFP4 (OCP microscaling FP4): scalar reference kernels.
//!
//! A block of 32 E2M1 values shares one E8M0 exponent. ggml stores the E2M1
//! values doubled ([`KVALUES_MXFP4`], integers) and halves the scale to match;
//! the arithmetic follows `dequantize_row_mxfp4` and `ggml_vec_dot_mxfp4_q8_0`
//! operation for operation, so results are equal.
//!
//! Layout (17 bytes per 32): `u8 e` (E8M0), `u8 qs[16]`; byte `j` holds element
//! `j` in its low nibble and element `j + 16` in its high nibble.

use crate::activation::Q8_0_BYTES;
use crate::block::f16_at;
use crate::iq_tables::{KVALUES_MXFP4, check_dequant, check_lengths, e8m0_to_f32_half};
use crate::{ActFormat, FormatKernels, QuantType};

pub(crate) const MXFP4_BYTES: usize = 17;

pub(crate) static MXFP4_SCALAR: FormatKernels = FormatKernels {
    ty: QuantType::MXFP4,
    dequant: dequant_mxfp4,
    vec_dot: vec_dot_mxfp4,
    act: ActFormat::Q8_0,
};

pub fn dequant_mxfp4(src: &[u8], dst: &mut [f32]) {
    let nb = check_dequant(32, MXFP4_BYTES, src, dst);
    for (x, y) in src
        .chunks_exact(MXFP4_BYTES)
        .zip(dst.chunks_exact_mut(32))
        .take(nb)
    {
        let d = e8m0_to_f32_half(x[0]);
        for j in 0..16 {
            y[j] = f32::from(KVALUES_MXFP4[usize::from(x[1 + j] & 0xf)]) * d;
            y[j + 16] = f32::from(KVALUES_MXFP4[usize::from(x[1 + j] >> 4)]) * d;
        }
    }
}

pub fn vec_dot_mxfp4(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, 32, MXFP4_BYTES, row, Q8_0_BYTES, act);
    let mut sumf = 0f32;
    for (x, y) in row
        .chunks_exact(MXFP4_BYTES)
        .zip(act.chunks_exact(Q8_0_BYTES))
        .take(nb)
    {
        let d = f16_at(y, 0) * e8m0_to_f32_half(x[0]);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for j in 0..16 {
            sumi1 +=
                i32::from(y[2 + j] as i8) * i32::from(KVALUES_MXFP4[usize::from(x[1 + j] & 0xf)]);
            sumi2 +=
                i32::from(y[18 + j] as i8) * i32::from(KVALUES_MXFP4[usize::from(x[1 + j] >> 4)]);
        }
        sumf += d * (sumi1 + sumi2) as f32;
    }
    sumf
}
