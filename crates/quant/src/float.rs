//! The float formats F32, F16 and BF16.
//!
//! As in ggml, each float weight format is dotted with an activation of the
//! same type (`vec_dot_type`): F16 weights with an f16-rounded activation,
//! BF16 with bf16. Products are formed in f32 (exact for f16·f16 and
//! bf16·bf16) and summed in f64, as ggml's scalar `ggml_vec_dot_f16/bf16/f32`.

use crate::block::{bf16_to_f32, f16_at, f32_at};
use crate::{ActFormat, FormatKernels, QuantType};

pub(crate) fn dequant_f32(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32_at(b, 0);
    }
}

pub(crate) fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16_at(b, 0);
    }
}

pub(crate) fn dequant_bf16(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub(crate) fn vec_dot_f32(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let (row, act) = (&row[..4 * n], &act[..4 * n]);
    let mut sum = 0.0f64;
    for (w, a) in row.chunks_exact(4).zip(act.chunks_exact(4)) {
        sum += f64::from(f32_at(w, 0) * f32_at(a, 0));
    }
    sum as f32
}

pub(crate) fn vec_dot_f16(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let (row, act) = (&row[..2 * n], &act[..2 * n]);
    let mut sum = 0.0f64;
    for (w, a) in row.chunks_exact(2).zip(act.chunks_exact(2)) {
        sum += f64::from(f16_at(w, 0) * f16_at(a, 0));
    }
    sum as f32
}

pub(crate) fn vec_dot_bf16(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let (row, act) = (&row[..2 * n], &act[..2 * n]);
    let mut sum = 0.0f64;
    for (w, a) in row.chunks_exact(2).zip(act.chunks_exact(2)) {
        let w = bf16_to_f32(u16::from_le_bytes([w[0], w[1]]));
        let a = bf16_to_f32(u16::from_le_bytes([a[0], a[1]]));
        sum += f64::from(w * a);
    }
    sum as f32
}

pub(crate) static F32: FormatKernels = FormatKernels {
    ty: QuantType::F32,
    dequant: dequant_f32,
    vec_dot: vec_dot_f32,
    act: ActFormat::F32,
};

pub(crate) static F16: FormatKernels = FormatKernels {
    ty: QuantType::F16,
    dequant: dequant_f16,
    vec_dot: vec_dot_f16,
    act: ActFormat::F16,
};

pub(crate) static BF16: FormatKernels = FormatKernels {
    ty: QuantType::BF16,
    dequant: dequant_bf16,
    vec_dot: vec_dot_bf16,
    act: ActFormat::BF16,
};
