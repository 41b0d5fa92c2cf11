//! Exponentials the way llama.cpp's CPU backend computes them, so activations that are
//! quantised downstream (Q8_0/Q8_1/Q8_K before every matrix product) land on the same side
//! of their rounding boundaries as in llama.cpp and greedy tokens agree.
//!
//! ggml evaluates exp, SiLU and softmax over 16-wide AVX-512 vectors (8-wide with AVX2)
//! with a Cody-Waite range reduction and a degree-5 polynomial (the coefficients below are
//! its constants: numerical data), and uses libm's `expf` for the elements past the last
//! whole vector of a row. Both are emulated here element by element in f32 with fused
//! multiply-adds, which gives the same bits as either vector width for finite inputs.
//! The goldens these are checked against were made on an AVX-512 machine: rows are split
//! at multiples of [`LANES`].

/// Elements per vector in the oracle build (AVX-512).
pub const LANES: usize = 16;

/// ggml's vector `expf`, for one element.
#[inline(always)]
pub fn vexp(x: f32) -> f32 {
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23: rounds to an integer in the low bits
    let z = x.mul_add(f32::from_bits(0x3FB8_AA3B), r); // x / ln 2 + r
    let n = z - r;
    // b = x - n * ln2 (in two parts)
    let b = (-n).mul_add(
        f32::from_bits(0x35BF_BE8E),
        (-n).mul_add(f32::from_bits(0x3F31_7200), x),
    );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let c5 = f32::from_bits(0x3C07_2010); // 0x1.0e4020p-7
    let c4 = f32::from_bits(0x3D2B_9F17); // 0x1.573e2ep-5
    let c3 = f32::from_bits(0x3E2A_AF33); // 0x1.555e66p-3
    let c2 = f32::from_bits(0x3EFF_FEDB); // 0x1.fffdb6p-2
    let c1 = f32::from_bits(0x3F7F_FFF6); // 0x1.ffffecp-1
    let j = c5
        .mul_add(b, c4)
        .mul_add(u, c3.mul_add(b, c2))
        .mul_add(u, c1.mul_add(b, 1.0));
    scale_by_pow2(j, n)
}

/// `j * 2^n` for an integral `n` in [-192, 192] (AVX-512's scalef).
#[inline(always)]
fn scale_by_pow2(j: f32, n: f32) -> f32 {
    let n = n as i32;
    // Split so each factor is a normal power of two.
    let half = n / 2;
    let p1 = f32::from_bits(((half + 127).clamp(1, 254) as u32) << 23);
    let p2 = f32::from_bits(((n - half + 127).clamp(1, 254) as u32) << 23);
    j * p1 * p2
}

/// ggml's vector SiLU, for one element: x / (1 + exp(-x)).
#[inline(always)]
pub fn vsilu(x: f32) -> f32 {
    x / (1.0 + vexp(-x))
}

/// ggml's scalar SiLU (`ggml_silu_f32`), used past the last whole vector.
pub fn silu_scalar(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Runs `$body` compiled with FMA where the CPU has it: `mul_add` is then one
/// instruction instead of a call to libm's `fmaf` (the same correctly rounded result).
macro_rules! with_fma {
    ($fma:ident, $(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU runs FMA.
                return unsafe { $fma($($arg),*) };
            }
            $body
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "fma")]
        unsafe fn $fma($($arg: $ty),*) -> $ret $body
    };
}

with_fma!(
    softmax_exp_fma,
    /// `x[i] = exp(x[i] - max)` for the row, returning the sum as ggml accumulates it: each
    /// vector's lanes added in a tree in f32, then into an f64; the tail one by one.
    fn softmax_exp(x: &mut [f32], max: f32) -> f64 {
        let n = x.len();
        let whole = n - n % LANES;
        let mut sum = 0.0f64;
        for chunk in x[..whole].chunks_exact_mut(LANES) {
            let mut v = [0f32; LANES];
            for (o, c) in v.iter_mut().zip(chunk.iter_mut()) {
                *c = vexp(*c - max);
                *o = *c;
            }
            let mut w = LANES / 2;
            while w > 0 {
                for i in 0..w {
                    v[i] += v[i + w];
                }
                w /= 2;
            }
            sum += f64::from(v[0]);
        }
        for c in &mut x[whole..] {
            *c = (*c - max).exp();
            sum += f64::from(*c);
        }
        sum
    }
);

with_fma!(
    swiglu_fma,
    /// `y[i] = vsilu(g[i]) * u[i]` (SwiGLU with ggml's vector SiLU).
    fn swiglu(y: &mut [f32], g: &[f32], u: &[f32]) -> () {
        for ((o, &g), &u) in y.iter_mut().zip(g).zip(u) {
            *o = vsilu(g) * u;
        }
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vexp_is_close_to_libm_and_handles_the_range() {
        for i in -2000..2000 {
            let x = i as f32 * 0.0437;
            let (a, b) = (vexp(x), x.exp());
            assert!(((a - b) / b).abs() < 4e-7, "{x}: {a} vs {b}");
        }
        assert_eq!(vexp(f32::NEG_INFINITY), 0.0);
        assert_eq!(vexp(-200.0), 0.0);
        assert_eq!(vexp(0.0), 1.0);
        assert!(vexp(100.0).is_infinite());
    }

    #[test]
    fn softmax_sum_covers_vector_and_tail() {
        let mut x: Vec<f32> = (0..37).map(|i| i as f32 * 0.1).collect();
        let max = 3.6;
        let s = softmax_exp(&mut x, max);
        let want: f64 = (0..37).map(|i| ((i as f32 * 0.1 - max) as f64).exp()).sum();
        assert!((s - want).abs() / want < 1e-6);
    }
}
