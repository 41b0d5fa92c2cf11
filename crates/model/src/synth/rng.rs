//! Deterministic randomness and number conversions for the synthetic models.
//!
//! Everything here uses only integer arithmetic and IEEE-754 `+ - * / sqrt`,
//! which every machine rounds identically, so a seed gives the same bytes
//! everywhere: no platform `libm` (`exp`, `ln`, `powf` differ in the last bit
//! between C libraries), no hash-map iteration order.

/// splitmix64: seeds the generators and mixes names into seeds.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a name, so each tensor draws from its own stream whatever the
/// order tensors are generated in.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// xoshiro256**: the generator every tensor's data is drawn from.
pub(crate) struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// The stream for `name` under the model seed `seed`.
    pub(crate) fn for_stream(seed: u64, name: &str) -> Self {
        let mut sm = seed ^ fnv1a(name.as_bytes()).rotate_left(17);
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Self { s }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    pub(crate) fn fill_bytes(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let v = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&v[..rest.len()]);
        }
    }

    /// Uniform in [0, 1), from the top 24 bits (exact in f32).
    pub(crate) fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / 16_777_216.0)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn signed_f32(&mut self) -> f32 {
        self.unit_f32() * 2.0 - 1.0
    }

    /// Uniform integer in `lo..=hi` (the range is tiny, so the modulo bias is negligible).
    pub(crate) fn range_u32(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next_u64() % u64::from(hi - lo + 1)) as u32
    }

    /// A uniformly random permutation of `0..n` (Fisher–Yates).
    pub(crate) fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            p.swap(i, j);
        }
        p
    }
}

/// f32 → IEEE half, round to nearest even (the conversion ggml's
/// `GGML_FP32_TO_FP16` performs), saturating to ±65504 instead of infinity
/// so a random tensor can never hold an infinity or a NaN.
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7FFF_FFFF;
    if abs >= 0x477F_F000 {
        // ≥ 65520 rounds to infinity in IEEE; saturate (and map NaN to the max too).
        return sign | 0x7BFF;
    }
    if abs < 0x3880_0000 {
        // Below 2^-14: a subnormal half (or zero). Scale to units of 2^-24 and round.
        if abs < 0x3300_0000 {
            return sign; // below half of the smallest subnormal: rounds to zero
        }
        let mant = (abs & 0x007F_FFFF) | 0x0080_0000;
        let exp = (abs >> 23) as i32; // 102..=112
        let shift = (126 - exp) as u32; // 14..=24
        let half = mant >> shift;
        let rem = mant & ((1u32 << shift) - 1);
        let halfway = 1u32 << (shift - 1);
        let rounded = if rem > halfway || (rem == halfway && half & 1 == 1) {
            half + 1
        } else {
            half
        };
        return sign | rounded as u16;
    }
    // Normal: rebias the exponent (127 → 15) and round 23 mantissa bits to 10.
    let rebased = abs - 0x3800_0000;
    let half = rebased >> 13;
    let rem = rebased & 0x1FFF;
    let rounded = if rem > 0x1000 || (rem == 0x1000 && half & 1 == 1) {
        half + 1
    } else {
        half
    };
    sign | rounded as u16
}

/// IEEE half → f32 (exact).
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let exp = u32::from((h >> 10) & 0x1F);
    let mant = u32::from(h & 0x3FF);
    if exp == 0 {
        // Zero or subnormal: mant · 2^-24, exact in f32.
        let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        return sign * mant as f32 * (1.0 / 16_777_216.0);
    }
    let sign_bits = u32::from(h & 0x8000) << 16;
    if exp == 0x1F {
        return f32::from_bits(sign_bits | 0x7F80_0000 | (mant << 13));
    }
    f32::from_bits(sign_bits | ((exp + 112) << 23) | (mant << 13))
}

/// f32 → bfloat16, round to nearest even (as ggml's `GGML_FP32_TO_BF16` for finite values).
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// `x^(-s)` for `x ≥ 1`, `s ≥ 0`, computed as `2^(-s·log2 x)` with series that
/// use only basic arithmetic, so every machine gets the same bits.
pub(crate) fn pow_neg(x: f64, s: f64) -> f64 {
    exp2(-s * log2(x))
}

/// log2 for x > 0: split off the binary exponent, then a series for ln of the
/// mantissa in [1, 2) via atanh: ln m = 2·atanh((m-1)/(m+1)).
fn log2(x: f64) -> f64 {
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7FF) as i64 - 1023;
    let m = f64::from_bits((bits & 0x000F_FFFF_FFFF_FFFF) | 0x3FF0_0000_0000_0000);
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let mut term = t;
    let mut sum = 0.0;
    let mut k = 1.0;
    while k < 80.0 {
        sum += term / k;
        term *= t2;
        k += 2.0;
    }
    exp as f64 + 2.0 * sum / std::f64::consts::LN_2
}

/// 2^y: integer part by exponent bits, fractional part by a Taylor series of e^(f·ln 2).
fn exp2(y: f64) -> f64 {
    if y < -1000.0 {
        return 0.0;
    }
    let n = y.floor();
    let f = (y - n) * std::f64::consts::LN_2;
    let mut term = 1.0;
    let mut sum = 1.0;
    let mut k = 1.0;
    while k < 30.0 {
        term *= f / k;
        sum += term;
        k += 1.0;
    }
    let mut scale = 1.0;
    let mut e = n as i64;
    while e < 0 {
        scale *= 0.5;
        e += 1;
    }
    while e > 0 {
        scale *= 2.0;
        e -= 1;
    }
    sum * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_finite_half() {
        for h in 0u16..=0xFFFF {
            let exp = (h >> 10) & 0x1F;
            if exp == 0x1F {
                continue;
            }
            let f = f16_to_f32(h);
            let back = f32_to_f16(f);
            // -0 and +0 both fine; everything else exact.
            assert!(
                back == h || (f == 0.0 && back & 0x7FFF == 0),
                "{h:#06x} -> {f} -> {back:#06x}"
            );
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3C00);
        // 1 + 3·2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9: ties to even.
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3C02);
        assert_eq!(f32_to_f16(65504.0), 0x7BFF);
        assert_eq!(f32_to_f16(1e9), 0x7BFF);
        assert_eq!(f32_to_f16(-2.0), 0xC000);
        // Smallest subnormal 2^-24 and half of it (ties to even: zero).
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001);
        assert_eq!(f32_to_f16(2.980_232_2e-8), 0x0000);
    }

    #[test]
    fn pow_neg_matches_libm_closely() {
        for &x in &[1.0, 2.0, 3.0, 7.0, 100.0, 511.0] {
            for &s in &[0.0, 0.5, 1.0, 1.3, 2.0] {
                let ours = pow_neg(x, s);
                let libm = x.powf(-s);
                assert!(
                    (ours - libm).abs() <= 1e-12 * libm.max(1e-300),
                    "{x}^-{s}: {ours} vs {libm}"
                );
            }
        }
    }

    #[test]
    fn streams_differ_by_name_and_seed() {
        let a = Rng::for_stream(1, "blk.0.attn_q.weight").next_u64();
        let b = Rng::for_stream(1, "blk.0.attn_k.weight").next_u64();
        let c = Rng::for_stream(2, "blk.0.attn_q.weight").next_u64();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, Rng::for_stream(1, "blk.0.attn_q.weight").next_u64());
    }

    #[test]
    fn permutation_is_a_permutation() {
        let mut r = Rng::for_stream(7, "perm");
        let mut p = r.permutation(100);
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
    }
}
