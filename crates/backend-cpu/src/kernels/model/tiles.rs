//! Several dot products at once, each bit for bit the `vec_dot` strata_quant computes
//! for it. A weight row's blocks are unpacked once and multiplied with up to 8
//! activation rows (prefill, or the tokens routed to one expert), or one activation row
//! goes against 4 weight rows (decode: four independent accumulation chains instead of
//! one) or, for Q4_K, 8 (each block's float finish done for the 8 rows in one vector).
//! Only the arrangement changes: every (weight row, activation row) pair keeps its
//! own accumulators, updated block by block with the same operations as `vec_dot`, so
//! results do not depend on the tile shape or on how rows are split over threads.
//!
//! The kernels exist for the AVX2 level only, the level whose `vec_dot` they mirror;
//! the unit tests compare them with `vec_dot` for every shape.

use strata_quant::{QuantType, SimdLevel};

/// Activation rows one weight row is multiplied with at once.
pub const COLS: usize = 8;
/// Weight rows one activation row is multiplied with at once.
pub const ROWS: usize = 4;
/// The same, for formats whose per-block float finish is vectorised across rows.
pub const ROWS8: usize = 8;

/// `out[c] = vec_dot(k, row, acts[c])` for `c < N`.
pub type ColsFn<const N: usize> = fn(k: usize, row: &[u8], acts: &[&[u8]; N], out: &mut [f32; N]);
/// `out[r] = vec_dot(k, rows[r], act)` for `r < ROWS`.
pub type RowsFn = fn(k: usize, rows: &[&[u8]; ROWS], act: &[u8], out: &mut [f32; ROWS]);
/// `out[r] = vec_dot(k, rows[r], act)` for `r < ROWS8`.
pub type Rows8Fn = fn(k: usize, rows: &[&[u8]; ROWS8], act: &[u8], out: &mut [f32; ROWS8]);

/// A format's tile kernels.
pub struct Tiles {
    /// One weight row against one activation row: `vec_dot` itself, faster where
    /// strata_quant's kernel leaves instructions to save (Q4_K's scale broadcasts).
    pub cols1: ColsFn<1>,
    pub cols8: ColsFn<COLS>,
    pub cols4: ColsFn<4>,
    /// For formats whose `vec_dot` is one long accumulation chain over small blocks
    /// (measured: faster than one row at a time for Q4_1, slower for Q8_0's long rows
    /// on an AMD EPYC, where 4 interleaved row streams defeat the prefetcher).
    pub rows4: Option<RowsFn>,
    /// For formats with a heavy per-block finish (Q4_K: scales, mins, two f16 factors),
    /// which 8 rows share as vectors (measured: see BENCHMARKS.md).
    pub rows8: Option<Rows8Fn>,
}

/// The tile kernels of `ty`, when this CPU runs the AVX2 `vec_dot` they mirror.
pub fn tiles(ty: QuantType) -> Option<&'static Tiles> {
    if strata_quant::detected_simd() != SimdLevel::Avx2 {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        avx2::tiles(ty)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "tiles_avx2.rs"]
mod avx2;

#[path = "tiles_small.rs"]
pub mod small;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 11
        }

        fn f32(&mut self) -> f32 {
            (self.next() % 2_000_001) as f32 / 1_000_000.0 - 1.0
        }
    }

    /// A random weight row: random quants, finite f16 scales of magnitude about `d`
    /// (and `m` for the second scale field of Q4_1 and Q4_K).
    fn weights(ty: QuantType, k: usize, d: f32, m: f32, rng: &mut Rng) -> Vec<u8> {
        let bytes = ty.row_bytes(k).unwrap();
        let mut row: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
        // (block bytes, offsets of the d and m fields): ggml's block layouts.
        let (block_bytes, fields): (usize, Vec<(usize, f32)>) = match ty {
            QuantType::Q4_0 => (18, vec![(0, d)]),
            QuantType::Q8_0 => (34, vec![(0, d)]),
            QuantType::Q4_1 => (20, vec![(0, d), (2, m)]),
            QuantType::Q4_K => (144, vec![(0, d), (2, m)]),
            QuantType::Q6_K => (210, vec![(208, d)]),
            _ => unreachable!(),
        };
        for b in row.chunks_exact_mut(block_bytes) {
            for &(o, scale) in &fields {
                let v = half::f16::from_f32(rng.f32() * scale);
                b[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
            }
        }
        row
    }

    fn acts(ty: QuantType, k: usize, rng: &mut Rng) -> Vec<u8> {
        let kernels = strata_quant::kernels(ty).unwrap();
        let x: Vec<f32> = (0..k).map(|_| rng.f32() * 4.0).collect();
        let mut q = vec![0u8; kernels.act.row_bytes(k).unwrap()];
        strata_quant::quantize_activation_into(kernels.act, &x, &mut q).unwrap();
        q
    }

    /// Every tile shape against `vec_dot` (the oracle: strata_quant's kernel, itself
    /// checked against llama.cpp's), over scale mixes where either term dominates.
    #[test]
    fn tiles_equal_vec_dot_bit_for_bit() {
        if strata_quant::detected_simd() != SimdLevel::Avx2 {
            eprintln!("no AVX2 here: the tile kernels are not used");
            return;
        }
        let mut rng = Rng(7);
        let formats = [
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::Q4_K,
            QuantType::Q6_K,
        ];
        let shapes = [
            (256usize, 0.05f32, 0.05f32),
            (512, 0.001, 0.5),
            (1536, 0.5, 0.001),
            (2816, 0.02, 0.02),
            // Q4_K's 8-row kernel: a full pass of 16 blocks and a partial one.
            (4608, 0.01, 0.03),
        ];
        for (ty, t) in formats.into_iter().flat_map(|ty| {
            avx2::variants(ty)
                .into_iter()
                .flatten()
                .map(move |t| (ty, t))
        }) {
            let dot = strata_quant::kernels(ty).unwrap().vec_dot;
            for (k, d, m) in shapes {
                for _ in 0..4 {
                    let rows: Vec<Vec<u8>> =
                        (0..ROWS).map(|_| weights(ty, k, d, m, &mut rng)).collect();
                    let a: Vec<Vec<u8>> = (0..COLS).map(|_| acts(ty, k, &mut rng)).collect();
                    let want = |r: usize, c: usize| dot(k, &rows[r], &a[c]).to_bits();
                    let refs: [&[u8]; COLS] = std::array::from_fn(|c| a[c].as_slice());
                    let mut out8 = [0f32; COLS];
                    (t.cols8)(k, &rows[0], &refs, &mut out8);
                    for (c, v) in out8.iter().enumerate() {
                        assert_eq!(v.to_bits(), want(0, c), "{ty:?} k={k} cols8 col {c}");
                    }
                    let mut out1 = [0f32; 1];
                    (t.cols1)(k, &rows[2], &[&a[5]], &mut out1);
                    assert_eq!(out1[0].to_bits(), want(2, 5), "{ty:?} k={k} cols1");
                    let refs4: [&[u8]; 4] = std::array::from_fn(|c| a[c + 1].as_slice());
                    let mut out4 = [0f32; 4];
                    (t.cols4)(k, &rows[1], &refs4, &mut out4);
                    for (c, v) in out4.iter().enumerate() {
                        assert_eq!(v.to_bits(), want(1, c + 1), "{ty:?} k={k} cols4 col {c}");
                    }
                    if let Some(rows8) = t.rows8 {
                        let more: Vec<Vec<u8>> =
                            (0..ROWS8).map(|_| weights(ty, k, d, m, &mut rng)).collect();
                        let rrefs: [&[u8]; ROWS8] = std::array::from_fn(|r| more[r].as_slice());
                        let mut outr = [0f32; ROWS8];
                        rows8(k, &rrefs, &a[6], &mut outr);
                        for (r, v) in outr.iter().enumerate() {
                            let want = dot(k, &more[r], &a[6]).to_bits();
                            assert_eq!(v.to_bits(), want, "{ty:?} k={k} rows8 row {r}");
                        }
                    }
                    if let Some(rows4) = t.rows4 {
                        let rrefs: [&[u8]; ROWS] = std::array::from_fn(|r| rows[r].as_slice());
                        let mut outr = [0f32; ROWS];
                        rows4(k, &rrefs, &a[3], &mut outr);
                        for (r, v) in outr.iter().enumerate() {
                            assert_eq!(v.to_bits(), want(r, 3), "{ty:?} k={k} rows4 row {r}");
                        }
                    }
                }
            }
        }
    }
}
