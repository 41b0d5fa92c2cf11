//! Random but valid blocks of every supported weight format.
//!
//! A block is random bytes for its codes (every bit pattern of a code, grid
//! index or sign field is valid), with its scale fields set so that the
//! dequantised values have a root-mean-square of about the asked `std`:
//! super-block scales (f16 `d`, `dmin`, an E8M0 exponent for MXFP4) are chosen
//! from the format's RMS at unit scale ([`unit_rms`]); sub-block scales are random
//! within a narrow range, and the mins of the "`d·q − m`" formats are set so each
//! sub-block is centred on zero. Block layouts are ggml's (`ggml-common.h`).

use strata_gguf::QuantType;

use super::rng::{Rng, f16_to_f32, f32_to_bf16, f32_to_f16};

/// The weight formats `strata synth` writes.
pub const SUPPORTED_TYPES: [QuantType; 21] = {
    use QuantType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS,
        IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, MXFP4,
    ]
};

pub fn is_supported(ty: QuantType) -> bool {
    SUPPORTED_TYPES.contains(&ty)
}

/// RMS of a block's dequantised values when its super-block scale is 1, under
/// the code and sub-scale distributions drawn here. Derived from the formats'
/// definitions: e.g. Q4_0 codes q−8 uniform on −8..7 give √21.5; IQ grids'
/// RMS computed from ggml's grid tables (iq2xs_grid: 24.22, …) times the
/// RMS of the random sub-scale factor.
fn unit_rms(ty: QuantType) -> f32 {
    use QuantType::*;
    match ty {
        Q4_0 => 4.637,
        Q4_1 => 4.610,
        Q5_0 => 9.247,
        Q5_1 => 9.233,
        Q8_0 => 73.90,
        // sub-scales 8..15 (rms 11.73) × rms of q−1.5 over q∈0..3 (1.118)
        Q2_K => 13.11,
        // sub-scales −32..31 (rms 18.48) × rms of q∈−4..3 (2.345)
        Q3_K => 43.34,
        // sub-scales 32..63 (rms 48.39) × rms of q−7.5 (4.610) / q−15.5 (9.233)
        Q4_K => 223.1,
        Q5_K => 446.8,
        // int8 sub-scales (rms 73.90) × rms of q−32 (18.48)
        Q6_K => 1365.7,
        // (0.5+ls)/4 for ls∈0..15 (rms 2.3085) × grid rms 23.12 / 24.22 / 24.43
        IQ2_XXS => 53.37,
        IQ2_XS => 55.90,
        IQ2_S => 56.40,
        // (0.5+ls)/2 (rms 4.617) × grid rms 30.85
        IQ3_XXS => 142.4,
        // 1+2·ls (rms 18.47) × grid rms 7.594
        IQ3_S => 140.2,
        // kvalues_iq4nl rms 67.44; IQ4_XS also × (ls−32) for ls∈0..63 (rms 18.48)
        IQ4_NL => 67.44,
        IQ4_XS => 1246.5,
        _ => 1.0,
    }
}

/// Appends `n_rows` rows of `row_len` random values of format `ty` (a quantised
/// format or F32/F16/BF16) whose RMS is about `std`. `row_len` is a multiple of
/// the block size (checked by the caller's plan).
pub(crate) fn random_rows(
    ty: QuantType,
    row_len: usize,
    n_rows: usize,
    std: f32,
    rng: &mut Rng,
    out: &mut Vec<u8>,
) {
    match ty {
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => {
            // Uniform on [-a, a] has RMS a/√3.
            let a = std * 3f32.sqrt();
            let values: Vec<f32> = (0..row_len * n_rows)
                .map(|_| rng.signed_f32() * a)
                .collect();
            encode_floats(ty, &values, out);
        }
        _ => {
            let n_blocks = row_len / ty.block_size() * n_rows;
            let size = ty.type_size();
            let start = out.len();
            out.resize(start + n_blocks * size, 0);
            for block in out[start..].chunks_exact_mut(size) {
                random_block(ty, std, rng, block);
            }
        }
    }
}

/// Appends `values` in a float format (F32, F16 or BF16).
pub(crate) fn encode_floats(ty: QuantType, values: &[f32], out: &mut Vec<u8>) {
    match ty {
        QuantType::F16 => {
            for &v in values {
                out.extend_from_slice(&f32_to_f16(v).to_le_bytes());
            }
        }
        QuantType::BF16 => {
            for &v in values {
                out.extend_from_slice(&f32_to_bf16(v).to_le_bytes());
            }
        }
        _ => {
            for &v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// A positive f16 scale of about `x` (never zero, never infinite).
fn scale_f16(x: f32) -> u16 {
    f32_to_f16(x).max(1)
}

fn put_u16(block: &mut [u8], at: usize, v: u16) {
    block[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// Fills one block: random codes, scales set for an RMS of about `std`.
fn random_block(ty: QuantType, std: f32, rng: &mut Rng, block: &mut [u8]) {
    use QuantType::*;
    rng.fill_bytes(block);
    if ty == MXFP4 {
        block[0] = mxfp4_exponent(std, rng);
        return;
    }
    let d_bits = scale_f16(std / unit_rms(ty));
    let d = f16_to_f32(d_bits);
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_NL | IQ4_XS => {
            put_u16(block, 0, d_bits);
        }
        Q4_1 => {
            // x = d·q + m with q∈0..15: m = −7.5·d centres the block.
            put_u16(block, 0, d_bits);
            put_u16(block, 2, f32_to_f16(-7.5 * d));
        }
        Q5_1 => {
            put_u16(block, 0, d_bits);
            put_u16(block, 2, f32_to_f16(-15.5 * d));
        }
        Q2_K => {
            // scales[16] at 0: low nibble scale, high nibble min; d at 80, dmin at 82.
            // x = d·sc·q − dmin·m, q∈0..3; dmin = 2d and m ≈ 0.75·sc centre it.
            for s in &mut block[..16] {
                let sc = rng.range_u32(8, 15);
                let m = (sc * 3 + 2) / 4;
                *s = (sc | (m << 4)) as u8;
            }
            put_u16(block, 80, d_bits);
            put_u16(block, 82, scale_f16(2.0 * d));
        }
        Q3_K => put_u16(block, 108, d_bits),
        Q4_K => {
            // d at 0, dmin at 2, 12 packed 6-bit scales/mins at 4; q∈0..15.
            // dmin = 8d and m ≈ sc·7.5/8 centre each sub-block.
            let (sc, m) = centred_scales(rng, 15, 16);
            pack_k_scales(&sc, &m, &mut block[4..16]);
            put_u16(block, 0, d_bits);
            put_u16(block, 2, scale_f16(8.0 * d));
        }
        Q5_K => {
            // q∈0..31: dmin = 16d and m ≈ sc·15.5/16.
            let (sc, m) = centred_scales(rng, 31, 32);
            pack_k_scales(&sc, &m, &mut block[4..16]);
            put_u16(block, 0, d_bits);
            put_u16(block, 2, scale_f16(16.0 * d));
        }
        Q6_K => put_u16(block, 208, d_bits),
        _ => {}
    }
}

/// Eight sub-block scales in 32..63 and mins `round(sc·num/den)`.
fn centred_scales(rng: &mut Rng, num: u32, den: u32) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        let s = rng.range_u32(32, 63);
        sc[j] = s as u8;
        m[j] = ((s * num + den / 2) / den) as u8;
    }
    (sc, m)
}

/// Packs eight 6-bit scales and mins as ggml's `get_scale_min_k4` reads them.
fn pack_k_scales(sc: &[u8; 8], m: &[u8; 8], q: &mut [u8]) {
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
}

/// An E8M0 exponent for an MXFP4 block. Values are `kvalues_mxfp4[q] · 2^(e−128)`
/// (the codes' RMS is √34.25 at e = 128); the scale is a power of two, so
/// each block picks one of the two exponents around the target with the
/// probability that makes the mean variance `std²`.
fn mxfp4_exponent(std: f32, rng: &mut Rng) -> u8 {
    let r = f64::from(std) * f64::from(std) / 34.25;
    // 4^a ≤ r < 4^(a+1)
    let mut a: i32 = 0;
    let mut p4 = 1.0f64;
    while p4 > r && a > -120 {
        p4 *= 0.25;
        a -= 1;
    }
    while p4 * 4.0 <= r && a < 120 {
        p4 *= 4.0;
        a += 1;
    }
    let p_low = (4.0 * p4 - r) / (3.0 * p4);
    let e = if f64::from(rng.unit_f32()) < p_low {
        a
    } else {
        a + 1
    };
    (128 + e).clamp(2, 254) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_scales_unpack_as_ggml_reads_them() {
        let sc = [32, 40, 47, 55, 63, 33, 50, 61];
        let m = [30, 37, 44, 52, 59, 31, 47, 57];
        let mut q = [0u8; 12];
        pack_k_scales(&sc, &m, &mut q);
        for j in 0..8 {
            // ggml's get_scale_min_k4
            let (d, mn) = if j < 4 {
                (q[j] & 63, q[j + 4] & 63)
            } else {
                (
                    (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                    (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
                )
            };
            assert_eq!((d, mn), (sc[j], m[j]), "sub-block {j}");
        }
    }

    #[test]
    fn every_supported_type_fills_whole_blocks() {
        let mut rng = Rng::for_stream(3, "t");
        for ty in SUPPORTED_TYPES {
            let mut out = Vec::new();
            random_rows(ty, 256, 2, 0.05, &mut rng, &mut out);
            assert_eq!(out.len(), ty.row_bytes(256).unwrap_or(0) * 2, "{ty}");
        }
    }

    #[test]
    fn mxfp4_exponent_brackets_the_target() {
        let mut rng = Rng::for_stream(3, "mx");
        let std = 0.0625f32;
        let mut var = 0.0;
        for _ in 0..4000 {
            let e = i32::from(mxfp4_exponent(std, &mut rng)) - 128;
            var += 34.25 * 4f64.powi(e);
        }
        let rms = (var / 4000.0).sqrt();
        assert!((rms / f64::from(std) - 1.0).abs() < 0.05, "rms {rms}");
    }
}
