//! mul_mat, mul_mat_experts and embed_rows for every weight format, CUDA against the CPU.
//!
//! Tolerance of the products: |Δ| ≤ 1e-5 · Σ|w·x| per output. Both devices quantise the
//! activations identically (ggml's reference quantisers, bit for bit) and sum each block
//! in integers, so they differ only in the order of f32 operations (~1e-7 of Σ|w·x|); one
//! activation quant off by one would already show as ~1/(127·k) of it.

use strata_core::{Args, Device, KernelId, LaunchCfg};
use strata_quant::QuantType;

use super::{Report, Rng, download, launch, ops_cfg, pair, upload};

/// Every weight format the ABI names.
pub const FORMATS: [QuantType; 21] = {
    use QuantType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS,
        IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, MXFP4,
    ]
};

const TOL: f64 = 1e-5;

fn is_float(ty: QuantType) -> bool {
    matches!(ty, QuantType::F32 | QuantType::F16 | QuantType::BF16)
}

/// Byte offsets of the f16 scales in one block (ggml-common.h), which random bytes would
/// make NaN or huge; every other byte of a block may be anything.
fn f16_scale_offsets(ty: QuantType) -> &'static [usize] {
    use QuantType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// `rows` random rows of `cols` values of `ty`, with sane scales.
pub fn random_weights(ty: QuantType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        QuantType::F32 => {
            return rng
                .vec(n, 1.0)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
        }
        QuantType::F16 => {
            return rng
                .vec(n, 1.0)
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect();
        }
        QuantType::BF16 => {
            return rng
                .vec(n, 1.0)
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect();
        }
        _ => {}
    }
    let bytes = ty.row_bytes(cols).expect("whole blocks") * rows;
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
    for block in w.chunks_exact_mut(ty.type_size()) {
        if ty == QuantType::MXFP4 {
            block[0] = 118 + rng.below(8) as u8; // E8M0 exponent: scales 2^-9 .. 2^-2
        }
        for &o in f16_scale_offsets(ty) {
            let d = half::f16::from_f32(0.002 + 0.02 * (rng.f32() + 1.0));
            block[o..o + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    w
}

/// Σ_j |w_rj · x_tj| for every output (t, r): the scale of the products' rounding.
fn magnitudes(ty: QuantType, w: &[u8], m: usize, k: usize, x: &[f32]) -> Vec<f64> {
    let rb = ty.row_bytes(k).unwrap();
    let rows: Vec<Vec<f32>> = (0..m)
        .map(|r| {
            let mut row = vec![0.0f32; k];
            strata_quant::dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut row).unwrap();
            row
        })
        .collect();
    let mut mag = Vec::new();
    for xr in x.chunks_exact(k.max(1)) {
        for row in &rows {
            mag.push(
                row.iter()
                    .zip(xr)
                    .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                    .sum::<f64>()
                    + 1e-6,
            );
        }
    }
    mag
}

/// y = x · wᵀ with the weights starting `w_off` bytes into their buffer.
#[allow(clippy::too_many_arguments)]
fn mul_mat(
    d: &Device,
    ty: QuantType,
    w: &[u8],
    w_off: usize,
    x: &[f32],
    (m, k, n): (usize, usize, usize),
    cfg: &LaunchCfg,
) -> Vec<f32> {
    let mut padded = vec![0xA5u8; w_off];
    padded.extend_from_slice(w);
    let (bw, bx) = (upload(d, &padded), upload(d, x));
    let by = d.alloc::<f32>(n * m).unwrap();
    let args = Args::new()
        .read_at(&bw, w_off)
        .read(&bx)
        .write(&by)
        .u32(ty.id())
        .u32(m as u32)
        .u32(k as u32)
        .u32(n as u32);
    launch(d, KernelId::MulMat, cfg, &args);
    download(d, &by)
}

/// Activations with the corner cases of the quantisers in their first rows: a Q8_K block
/// whose largest magnitude occurs twice with opposite signs (the first wins), and an
/// all-zero block.
/// No value gets different Q8_0/Q8_1 quants from the two quantisers: the CPU backend (as
/// ggml's x86 one) scales by 127 / amax and rounds ties to even, the CUDA kernels (as
/// ggml-cuda's) by 1 / (amax / 127) and round ties away from zero. The two scales can
/// differ by an ulp, so a product near a half (not only exactly on one) can round to
/// different quants, and one such value moves a product by a whole quant step (seen in a
/// 40-token Q4_1 case). Such values are moved an ulp towards zero until both agree.
fn activations(rng: &mut Rng, n: usize, k: usize) -> Vec<f32> {
    let mut x = rng.vec(n * k, 2.0);
    if n >= 2 && k >= 512 {
        x[5] = -2.5;
        x[9] = 2.5;
        x[k + 256..k + 512].fill(0.0);
    }
    for block in x.chunks_mut(32) {
        let amax = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        if amax == 0.0 {
            continue;
        }
        let (id_gpu, id_cpu) = (1.0 / (amax / 127.0), 127.0 / amax);
        let differ = |v: f32| (v * id_gpu).round() != (v * id_cpu).round_ties_even();
        for v in block.iter_mut() {
            // Towards zero, so the block's largest magnitude (and its scale) stays.
            while differ(*v) && *v != 0.0 {
                *v = f32::from_bits(v.to_bits() - 1);
            }
        }
    }
    x
}

#[test]
fn mul_mat_matches_the_cpu_for_every_format() {
    let Some(p) = pair("mul_mat_matches_the_cpu_for_every_format") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(10);
    for ty in FORMATS {
        let mut shapes = vec![
            (37usize, 512usize, 1usize), // decode, fewer rows than a unit takes
            (300, 512, 1),
            (64, 512, 3),
            (45, 512, 17),    // three token tiles, the last of one row
            (16, 20_480, 1),  // a row longer than the staged activations
            (16, 20_480, 11), // tiles of 8 and 3, chunked differently
            (72, 1280, 40),   // many tokens: tensor cores (quantised formats), a row tail
            // More than 64 tokens: mmq.cuh (quantised formats; float accumulation, not bit
            // for bit the one-row kernels): token tiles of 64 and 36, a short row tile.
            (136, 768, 100),
        ];
        if is_float(ty) {
            shapes.push((7, 100, 3)); // rows that are no whole number of vectors
            shapes.push((5, 33, 1));
        }
        for (si, &(m, k, n)) in shapes.iter().enumerate() {
            let w = random_weights(ty, m, k, &mut rng);
            let x = activations(&mut rng, n, k);
            // An offset that breaks 16-byte alignment (F32 keeps its 4-byte alignment).
            let w_off = if si == 2 {
                if is_float(ty) { 4 } else { 2 }
            } else {
                0
            };
            let cpu = mul_mat(&p.cpu, ty, &w, w_off, &x, (m, k, n), &ops_cfg(n * m));
            let gpu = mul_mat(&p.gpu, ty, &w, w_off, &x, (m, k, n), &ops_cfg(n * m));
            let mag = magnitudes(ty, &w, m, k, &x);
            let what = format!(
                "mul_mat {ty:?} {m}x{k} n={n}{}",
                if w_off > 0 { " (offset)" } else { "" }
            );
            rep.close(&what, &gpu, &cpu, TOL, |i| mag[i]);
            // Row t of x alone (the one-token kernel).
            let alone = |t: usize| {
                let x_t = &x[t * k..(t + 1) * k];
                mul_mat(&p.gpu, ty, &w, w_off, x_t, (m, k, 1), &ops_cfg(m))
            };
            if si == 7 {
                // Rows alone (the one-token kernel) agree within rounding, not bit for bit:
                // a wrong scale, min or sub-block in either misses by far more.
                for t in [0usize, 63, 64, 99] {
                    rep.close(
                        &format!("{what} row {t} alone"),
                        &alone(t),
                        &gpu[t * m..(t + 1) * m],
                        TOL,
                        |i| mag[t * m + i],
                    );
                }
            }
            if si == 5 || si == 6 {
                // A row's result does not depend on the rows launched with it (tiles of 8
                // and 3 here, chunked differently; tensor-core tiles of 32 and 8): each
                // alone, bit-exact.
                let rows: &[usize] = if si == 5 {
                    &[0, 7, 8, 10]
                } else {
                    &[0, 31, 32, 39]
                };
                for &t in rows {
                    rep.exact(
                        &format!("{what} row {t} alone"),
                        &alone(t),
                        &gpu[t * m..(t + 1) * m],
                    );
                }
            }
            if si == 3 || si == 6 {
                // Any launch shape gives the same numbers: few blocks of 4 warps (each
                // takes many units), more blocks than units, one block, 2-warp blocks.
                for cfg in [
                    LaunchCfg {
                        grid: [3, 1, 1],
                        block: [128, 1, 1],
                        shared_bytes: 0,
                    },
                    LaunchCfg {
                        grid: [4096, 1, 1],
                        block: [256, 1, 1],
                        shared_bytes: 0,
                    },
                    // One block takes every unit (the matmuls are compiled for blocks of
                    // at most 256 threads, model.cu's __launch_bounds__), and 2-warp blocks.
                    LaunchCfg {
                        grid: [1, 1, 1],
                        block: [256, 1, 1],
                        shared_bytes: 0,
                    },
                    LaunchCfg {
                        grid: [5, 1, 1],
                        block: [64, 1, 1],
                        shared_bytes: 0,
                    },
                ] {
                    let alt = mul_mat(&p.gpu, ty, &w, w_off, &x, (m, k, n), &cfg);
                    rep.exact(
                        &format!("{what} grid {} block {}", cfg.grid[0], cfg.block[0]),
                        &alt,
                        &gpu,
                    );
                }
            }
        }
    }
    rep.finish();
}

/// The shape of a mul_mat_experts launch: weights of `ty`, `m` x `k` per expert, experts
/// `expert_bytes` apart; `n_used` slots a token, activations per token or per slot.
struct ExpertsShape {
    ty: QuantType,
    m: usize,
    k: usize,
    n_used: usize,
    per_slot: bool,
    expert_bytes: usize,
}

/// mul_mat_experts on `d` over `n_tokens` tokens of x (rows per token or per slot) routed
/// by `ids`, launched as crates/model/src/ops.rs launches it.
fn mul_mat_experts_on(
    d: &Device,
    s: &ExpertsShape,
    w: &[u8],
    x: &[f32],
    ids: &[i32],
    n_tokens: usize,
) -> Vec<f32> {
    let (bw, bx, bi) = (upload(d, w), upload(d, x), upload(d, ids));
    let slots = n_tokens * s.n_used;
    let by = d.alloc::<f32>(slots * s.m).unwrap();
    let args = Args::new()
        .read(&bw)
        .read(&bx)
        .read(&bi)
        .write(&by)
        .u32(s.ty.id())
        .u32(s.m as u32)
        .u32(s.k as u32)
        .u32(n_tokens as u32)
        .u32(s.n_used as u32)
        .u32(s.per_slot as u32)
        .u64(s.expert_bytes as u64);
    launch(d, KernelId::MulMatExperts, &ops_cfg(slots * s.m), &args);
    download(d, &by)
}

#[test]
fn mul_mat_experts_matches_the_cpu_for_every_format() {
    let Some(p) = pair("mul_mat_experts_matches_the_cpu_for_every_format") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(11);
    let n_expert = 5usize;
    for ty in FORMATS {
        for (m, k, n_tokens, n_used, per_slot) in [
            (40usize, 512usize, 3usize, 2usize, false),
            (40, 512, 3, 2, true),
            (24, 256, 9, 4, false),
            (17, 1024, 1, 8, true),
            (72, 512, 64, 2, false), // many tokens: tensor cores (quantised formats)
            // More than 64 tokens: mmq.cuh (float accumulation over K).
            (72, 512, 70, 2, false),
        ] {
            let matrix = ty.row_bytes(k).unwrap() * m;
            let expert_bytes = matrix + 32; // experts need not be back to back
            let mut w = Vec::with_capacity(n_expert * expert_bytes);
            for _ in 0..n_expert {
                w.extend(random_weights(ty, m, k, &mut rng));
                w.extend(std::iter::repeat_n(0xEEu8, 32));
            }
            let ids: Vec<i32> = (0..n_tokens * n_used)
                .map(|_| rng.below(n_expert) as i32)
                .collect();
            let x_rows = if per_slot {
                n_tokens * n_used
            } else {
                n_tokens
            };
            let x = activations(&mut rng, x_rows, k);
            // The product of `n_tokens` rows of x' (and their ids) on `d`.
            let run = |d: &Device, x: &[f32], ids: &[i32], n_tokens: usize| {
                let shape = ExpertsShape {
                    ty,
                    m,
                    k,
                    n_used,
                    per_slot,
                    expert_bytes,
                };
                mul_mat_experts_on(d, &shape, &w, x, ids, n_tokens)
            };
            let (cpu, gpu) = (
                run(&p.cpu, &x, &ids, n_tokens),
                run(&p.gpu, &x, &ids, n_tokens),
            );
            // The scale of output (t, j, r): expert ids[t][j]'s row r against x'.
            let mut mag = Vec::with_capacity(cpu.len());
            for (s, &e) in ids.iter().enumerate() {
                let e = e as usize;
                let xr = if per_slot { s } else { s / n_used };
                let we = &w[e * expert_bytes..e * expert_bytes + matrix];
                mag.extend(magnitudes(ty, we, m, k, &x[xr * k..(xr + 1) * k]));
            }
            let what = format!(
                "mul_mat_experts {ty:?} {m}x{k} tokens {n_tokens} used {n_used} per_slot {per_slot}"
            );
            rep.close(&what, &gpu, &cpu, TOL, |i| mag[i]);
            if n_tokens >= 64 && !per_slot {
                // Each token alone (the one-token kernel) gives its rows bit for bit up to
                // 64 tokens a launch (mma.cuh); past that (mmq.cuh) within rounding.
                for t in [0usize, 33, n_tokens - 1] {
                    let x_t = &x[t * k..(t + 1) * k];
                    let alone = run(&p.gpu, x_t, &ids[t * n_used..(t + 1) * n_used], 1);
                    let slots = t * n_used * m..(t + 1) * n_used * m;
                    let label = format!("{what} token {t} alone");
                    if n_tokens <= 64 {
                        rep.exact(&label, &alone, &gpu[slots]);
                    } else {
                        let base = slots.start;
                        rep.close(&label, &alone, &gpu[slots], TOL, |i| mag[base + i]);
                    }
                }
            }
        }
    }
    rep.finish();
}

/// The expert cache's product on the device (mul_mat_experts_cached: one token per unit;
/// windows of 3 and 5 tokens take its multi variant, 9 its grouped one) against the device's uncached mul_mat_experts, bit
/// for bit on the resident pairs; the pool's pairs are left untouched; each token of a
/// window alone gives its rows bit for bit (a verify window must not change a row).
#[test]
fn mul_mat_experts_cached_equals_the_uncached_kernel() {
    let Some(p) = pair("mul_mat_experts_cached_equals_the_uncached_kernel") else {
        return;
    };
    let d = &p.gpu;
    let mut rep = Report::default();
    let mut rng = Rng::new(23);
    let (n_expert, m, k, n_used) = (6usize, 48usize, 512usize, 3usize);
    // Experts 0, 2, 4 and 5 in slots 2, 0, 3 and 1; 1 and 3 on the CPU pool.
    let table: [i32; 6] = [2, -1, 0, -1, 3, 1];
    let offset = 64usize;
    for ty in [
        QuantType::Q4_K,
        QuantType::Q6_K,
        QuantType::Q8_0,
        QuantType::IQ2_XS,
        QuantType::F16,
    ] {
        let matrix = ty.row_bytes(k).unwrap() * m;
        let expert_bytes = matrix + 32;
        let slot_bytes = offset + matrix + 16;
        let experts: Vec<Vec<u8>> = (0..n_expert)
            .map(|_| random_weights(ty, m, k, &mut rng))
            .collect();
        let mut w = Vec::new();
        for e in &experts {
            w.extend(e);
            w.extend(std::iter::repeat_n(0xEEu8, 32));
        }
        let mut slots = vec![0xABu8; 4 * slot_bytes];
        for (e, &s) in table.iter().enumerate() {
            if s >= 0 {
                let at = s as usize * slot_bytes + offset;
                slots[at..at + matrix].copy_from_slice(&experts[e]);
            }
        }
        let (bslots, btable) = (upload(d, &slots), upload(d, &table));
        for n_tokens in [1usize, 3, 5, 9] {
            let ids: Vec<i32> = (0..n_tokens * n_used)
                .map(|_| rng.below(n_expert) as i32)
                .collect();
            let x = activations(&mut rng, n_tokens, k);
            let shape = ExpertsShape {
                ty,
                m,
                k,
                n_used,
                per_slot: false,
                expert_bytes,
            };
            let cached = |x: &[f32], ids: &[i32], n: usize| {
                let (bx, bi) = (upload(d, x), upload(d, ids));
                let by = upload(d, &vec![-7.0f32; n * n_used * m]);
                let args = Args::new()
                    .read(&bslots)
                    .read(&btable)
                    .read(&bx)
                    .read(&bi)
                    .write(&by)
                    .u32(ty.id())
                    .u32(m as u32)
                    .u32(k as u32)
                    .u32(n as u32)
                    .u32(n_used as u32)
                    .u32(0)
                    .u32(n_expert as u32)
                    .u64(slot_bytes as u64)
                    .u64(offset as u64);
                // ops.rs's shape: a 256-thread block per 16 rows of a pair.
                let cfg = LaunchCfg::linear(n * n_used * m.div_ceil(16) * 256, 256);
                launch(d, KernelId::MulMatExpertsCached, &cfg, &args);
                download(d, &by)
            };
            let want = mul_mat_experts_on(d, &shape, &w, &x, &ids, n_tokens);
            let got = cached(&x, &ids, n_tokens);
            // Resident pairs as the uncached kernel; the pool's pairs untouched.
            let expect: Vec<f32> = want
                .chunks(m)
                .zip(&ids)
                .flat_map(|(row, &e)| {
                    let resident = table[e as usize] >= 0;
                    row.iter().map(move |&v| if resident { v } else { -7.0 })
                })
                .collect();
            let what = format!("mul_mat_experts_cached {ty:?} tokens {n_tokens}");
            rep.exact(&what, &got, &expect);
            for t in [0, n_tokens - 1] {
                let pairs = t * n_used..(t + 1) * n_used;
                let alone = cached(&x[t * k..(t + 1) * k], &ids[pairs.clone()], 1);
                let rows = pairs.start * m..pairs.end * m;
                rep.exact(&format!("{what} token {t} alone"), &alone, &got[rows]);
            }
        }
    }
    rep.finish();
}

#[test]
fn embed_rows_is_bit_exact_for_every_format() {
    let Some(p) = pair("embed_rows_is_bit_exact_for_every_format") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(12);
    for ty in FORMATS {
        let (rows, dim) = (10usize, 512usize);
        let table = random_weights(ty, rows, dim, &mut rng);
        let ids: Vec<u32> = vec![3, 0, 9, 3, 7];
        let run = |d: &Device| {
            let (bt, bi) = (upload(d, &table), upload(d, &ids));
            let out = d.alloc::<f32>(ids.len() * dim).unwrap();
            let args = Args::new()
                .read(&bt)
                .read(&bi)
                .write(&out)
                .u32(ty.id())
                .u32(dim as u32)
                .u32(ids.len() as u32);
            launch(d, KernelId::EmbedRows, &ops_cfg(ids.len() * dim), &args);
            download(d, &out)
        };
        rep.exact(&format!("embed_rows {ty:?}"), &run(&p.gpu), &run(&p.cpu));
    }
    rep.finish();
}

/// Decode-sized products (n = 1, 4096 x 4096) timed on the GPU with the launch shape
/// crates/model/src/ops.rs uses and with one block per 16 weight rows (the shape the kernel
/// is written for), after checking both against the CPU. Prints effective weight GB/s.
#[test]
fn mul_mat_decode_timing_report() {
    let Some(p) = pair("mul_mat_decode_timing_report") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(13);
    let (m, k) = (4096usize, 4096usize);
    for ty in [
        QuantType::Q4_K,
        QuantType::Q8_0,
        QuantType::IQ2_XS,
        QuantType::F16,
    ] {
        let w = random_weights(ty, m, k, &mut rng);
        let x = rng.vec(k, 2.0);
        let cpu = mul_mat(&p.cpu, ty, &w, 0, &x, (m, k, 1), &ops_cfg(m));
        let mag = magnitudes(ty, &w, m, k, &x);
        let (bw, bx) = (upload(&p.gpu, &w), upload(&p.gpu, &x));
        let by = p.gpu.alloc::<f32>(m).unwrap();
        let args = Args::new()
            .read(&bw)
            .read(&bx)
            .write(&by)
            .u32(ty.id())
            .u32(m as u32)
            .u32(k as u32)
            .u32(1);
        let per_rows = LaunchCfg {
            grid: [(m / 16) as u32, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
        };
        for (name, cfg) in [
            ("ops.rs shape", ops_cfg(m)),
            ("block per 16 rows", per_rows),
        ] {
            launch(&p.gpu, KernelId::MulMat, &cfg, &args);
            let gpu = download(&p.gpu, &by);
            rep.close(
                &format!("mul_mat {ty:?} {m}x{k} n=1 ({name})"),
                &gpu,
                &cpu,
                TOL,
                |i| mag[i],
            );
            let reps = 50;
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                launch(&p.gpu, KernelId::MulMat, &cfg, &args);
            }
            p.gpu.synchronize().unwrap();
            let us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(reps);
            println!(
                "  timing {ty:?} {name}: {us:.1} us per launch, {:.0} GB/s of weights",
                w.len() as f64 / us / 1e3
            );
        }
    }
    rep.finish();
}
