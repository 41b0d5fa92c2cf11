//! Helpers shared by the integration tests: a seeded RNG and random valid blocks.
#![allow(dead_code)]

use strata_quant::QuantType;

/// xorshift64*: deterministic, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly normal (sum of uniforms), mean 0, sd ~1.
    pub fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.unit()).sum::<f32>() * 1.732 - 3.464
    }
    pub fn fill(&mut self, b: &mut [u8]) {
        for x in b {
            *x = self.next_u64() as u8;
        }
    }
}

/// Offsets of the f16 scale fields of a block (as tools/gen_quant_golden.py).
pub fn scale_offsets(ty: QuantType) -> &'static [usize] {
    use QuantType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_NL | IQ4_XS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// A signed f16 of magnitude 1e-4..1e-1.
pub fn modest_f16(rng: &mut Rng) -> [u8; 2] {
    let mag = 10f32.powf(-4.0 + 3.0 * rng.unit());
    let v = if rng.next_u64() & 1 == 0 { mag } else { -mag };
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// `n` values of type `ty` as random valid blocks.
pub fn random_row(rng: &mut Rng, ty: QuantType, n: usize) -> Vec<u8> {
    let bytes = ty.row_bytes(n).expect("whole blocks");
    let mut row = vec![0u8; bytes];
    match ty {
        QuantType::F32 => {
            for c in row.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.normal().to_le_bytes());
            }
        }
        QuantType::F16 => {
            for c in row.chunks_exact_mut(2) {
                c.copy_from_slice(&half::f16::from_f32(rng.normal()).to_bits().to_le_bytes());
            }
        }
        QuantType::BF16 => {
            for c in row.chunks_exact_mut(2) {
                c.copy_from_slice(&((rng.normal().to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        _ => {
            rng.fill(&mut row);
            for b in row.chunks_exact_mut(ty.type_size()) {
                for &off in scale_offsets(ty) {
                    b[off..off + 2].copy_from_slice(&modest_f16(rng));
                }
                if ty == QuantType::MXFP4 {
                    b[0] = 117 + (rng.next_u64() % 16) as u8;
                }
            }
        }
    }
    row
}

/// `n` roughly normal activations, with some blocks scaled up and one zero block.
pub fn random_activation(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    for (i, c) in x.chunks_mut(32).enumerate() {
        let s = match i % 5 {
            0 => 10.0,
            1 => 0.01,
            _ => 1.0,
        };
        c.iter_mut().for_each(|v| *v *= s);
    }
    if n >= 64 {
        x[32..64].fill(0.0);
    }
    x
}
