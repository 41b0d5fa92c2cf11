//! mul_mat_experts_cached_multi and mul_mat_experts_cached_multi_q8 (kernels-cuda/experts.cu:
//! a verify window's cached expert products, a unit per routed expert whose rows serve every
//! pair routed to it; the _q8 form over activation rows quantised once per launch) on the
//! GPU against the per-pair mul_mat_experts_cached, the same device with the window
//! variants left out (`STRATA_CUDA_SKIP=mul_mat_experts_cached_multi_q8,
//! mul_mat_experts_cached_multi,mul_mat_experts_cached_grouped`): bit for bit for every
//! format (the _q8 form takes the quantised ones; with it left out, the other takes them
//! all), windows of 2 to 8 tokens at Qwen3-30B-A3B's expert shapes (gate/up 768 x 2048 over
//! a token's row, down 2048 x 768 over a row per pair) and a long row (staged in chunks),
//! launched as ops.rs launches them. Pairs whose expert has no slot stay untouched, ids
//! outside the experts give NaN rows. Then the same units over resident experts
//! (kernels-cuda/model.cu mul_mat_experts_multi_q8, a window's mul_mat_experts) against
//! mul_mat_experts with it left out and against each token launched alone (a decode step's
//! products). Skips with one line when there is no CUDA device.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/variants.rs"]
mod variants;

use strata_core::{Args, Device, KernelId, LaunchCfg};
use strata_quant::QuantType;
use variants::{FORMATS, GPU, Rng, download, expert_weights, gpu, random_weights, same_bits};

/// Experts of the test's layer, and how many a token routes to.
const N_EXPERT: usize = 24;
const N_USED: usize = 8;

/// A layer's expert cache: every third expert left to the CPU pool, the others in slots
/// (in an order that is not the experts'), the matrix `offset` bytes into its slot.
struct Cache {
    slots: Vec<u8>,
    table: Vec<i32>,
    slot_bytes: usize,
    offset: usize,
}

impl Cache {
    fn new(ty: QuantType, m: usize, k: usize, rng: &mut Rng) -> Self {
        let offset = 256;
        let matrix = ty.row_bytes(k).unwrap() * m;
        let slot_bytes = (offset + matrix + 16).div_ceil(256) * 256;
        let resident: Vec<usize> = (0..N_EXPERT).filter(|e| e % 3 != 1).collect();
        let mut table = vec![-1i32; N_EXPERT];
        for (i, &e) in resident.iter().enumerate() {
            table[e] = ((i * 5 + 3) % resident.len()) as i32;
        }
        let mut slots = vec![0xABu8; resident.len() * slot_bytes];
        for &e in &resident {
            let at = table[e] as usize * slot_bytes + offset;
            slots[at..at + matrix].copy_from_slice(&weights(ty, m, k, rng));
        }
        Cache {
            slots,
            table,
            slot_bytes,
            offset,
        }
    }
}

/// `m x k` random weights of `ty`: values in [-1, 1) for a float format (random bytes would
/// be NaNs and infinities), else variants.rs's random blocks.
fn weights(ty: QuantType, m: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut values = || (0..m * k).map(|_| rng.f32()).collect::<Vec<f32>>();
    match ty {
        QuantType::F32 => values().into_iter().flat_map(f32::to_le_bytes).collect(),
        QuantType::F16 => values()
            .into_iter()
            .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        QuantType::BF16 => values()
            .into_iter()
            .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => random_weights(ty, m, k, rng),
    }
}

/// A window's routing: each token's experts distinct, half of them from a few experts most
/// tokens share; then the same expert twice in token 0 (an expert with more pairs than
/// tokens), an id past the experts and a negative one (NaN rows).
fn routing(n_tokens: usize, rng: &mut Rng) -> Vec<i32> {
    let mut ids = Vec::with_capacity(n_tokens * N_USED);
    for _ in 0..n_tokens {
        let token = ids.len();
        while ids.len() < token + N_USED {
            let pick = if rng.next_u64().is_multiple_of(2) {
                6
            } else {
                N_EXPERT
            };
            let e = (rng.next_u64() % pick as u64) as i32;
            if !ids[token..].contains(&e) {
                ids.push(e);
            }
        }
    }
    ids[3] = ids[2];
    ids[1] = N_EXPERT as i32;
    ids[N_USED + 4] = -1;
    ids
}

/// mul_mat_experts_cached on `dev` for one window, launched as ops.rs launches it; the
/// output starts as -7 everywhere.
#[allow(clippy::too_many_arguments)]
fn cached(
    dev: &Device,
    ty: QuantType,
    m: usize,
    k: usize,
    cache: &Cache,
    x: &[f32],
    ids: &[i32],
    per_slot: bool,
) -> Vec<f32> {
    let s = dev.main_stream();
    let n_tokens = ids.len() / N_USED;
    let (slots, table) = (
        dev.alloc_from(&cache.slots, s).unwrap(),
        dev.alloc_from(&cache.table, s).unwrap(),
    );
    let (bx, bi) = (
        dev.alloc_from(x, s).unwrap(),
        dev.alloc_from(ids, s).unwrap(),
    );
    let y = dev.alloc_from(&vec![-7.0f32; ids.len() * m], s).unwrap();
    let args = Args::new()
        .read(&slots)
        .read(&table)
        .read(&bx)
        .read(&bi)
        .write(&y)
        .u32(ty.id())
        .u32(m as u32)
        .u32(k as u32)
        .u32(n_tokens as u32)
        .u32(N_USED as u32)
        .u32(per_slot as u32)
        .u32(N_EXPERT as u32)
        .u64(cache.slot_bytes as u64)
        .u64(cache.offset as u64);
    // ops.rs's shape: a 256-thread block per 16 rows of a pair.
    let cfg = LaunchCfg::linear(ids.len() * m.div_ceil(16) * 256, 256);
    dev.launch(KernelId::MulMatExpertsCached, &cfg, &args, s)
        .unwrap();
    download(dev, &y, s)
}

#[test]
fn mul_mat_experts_cached_multi_is_bit_for_bit_the_per_pair_kernel() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "mul_mat_experts_cached_multi_is_bit_for_bit_the_per_pair_kernel";
    // The device as configured by default (the _q8 form first), without the _q8 form, and
    // without any window variant (the per-pair kernel).
    let q8 = "mul_mat_experts_cached_multi_q8";
    let windows = format!("{q8},mul_mat_experts_cached_multi,mul_mat_experts_cached_grouped");
    let (Some(first), Some(multi), Some(per_pair)) =
        (gpu(test, ""), gpu(test, q8), gpu(test, &windows))
    else {
        return;
    };
    let mut rng = Rng(0x6a09_e667_f3bc_c908);
    let mut failures = Vec::new();
    let formats = FORMATS
        .into_iter()
        .chain([QuantType::F16, QuantType::BF16, QuantType::F32]);
    for ty in formats {
        for (m, k, per_slot) in [(768, 2048, false), (2048, 768, true), (40, 5120, false)] {
            if ty.row_bytes(k).is_none() {
                continue;
            }
            let cache = Cache::new(ty, m, k, &mut rng);
            for n_tokens in 2..=8 {
                let ids = routing(n_tokens, &mut rng);
                let rows = if per_slot { ids.len() } else { n_tokens };
                let x: Vec<f32> = (0..rows * k).map(|_| 2.0 * rng.f32()).collect();
                let want = cached(&per_pair, ty, m, k, &cache, &x, &ids, per_slot);
                for (name, dev) in [("default", &first), ("without _q8", &multi)] {
                    let a = cached(dev, ty, m, k, &cache, &x, &ids, per_slot);
                    // What each pair's rows must be besides equal: NaN for a bad id,
                    // untouched for the pool's experts, finite for the resident ones.
                    let rows_ok = ids.iter().zip(a.chunks(m)).all(|(&e, row)| {
                        if e < 0 || e as usize >= N_EXPERT {
                            row.iter().all(|v| v.is_nan())
                        } else if cache.table[e as usize] < 0 {
                            row.iter().all(|&v| v == -7.0)
                        } else {
                            row.iter().all(|v| v.is_finite())
                        }
                    });
                    let ok = same_bits(&a, &want) && rows_ok;
                    let what =
                        format!("{name}: {ty:?} {m}x{k} per_slot {per_slot} tokens {n_tokens}");
                    println!(
                        "mul_mat_experts_cached_multi {what}: {}",
                        if ok { "bit-exact" } else { "DIFFERENT" }
                    );
                    if !ok {
                        failures.push(what);
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}

/// mul_mat_experts on `dev` (experts `stride` bytes apart in `w`) for `ids.len() / N_USED`
/// tokens, launched as ops.rs launches it; the output starts as -7 everywhere.
fn resident(
    dev: &Device,
    ty: QuantType,
    (m, k, stride): (usize, usize, usize),
    w: &[u8],
    x: &[f32],
    ids: &[i32],
    per_slot: bool,
) -> Vec<f32> {
    let s = dev.main_stream();
    let n_tokens = ids.len() / N_USED;
    let (bw, bx, bi) = (
        dev.alloc_from(w, s).unwrap(),
        dev.alloc_from(x, s).unwrap(),
        dev.alloc_from(ids, s).unwrap(),
    );
    let y = dev.alloc_from(&vec![-7.0f32; ids.len() * m], s).unwrap();
    let args = Args::new()
        .read(&bw)
        .read(&bx)
        .read(&bi)
        .write(&y)
        .u32(ty.id())
        .u32(m as u32)
        .u32(k as u32)
        .u32(n_tokens as u32)
        .u32(N_USED as u32)
        .u32(per_slot as u32)
        .u64(stride as u64);
    // ops.rs's shapes: up to 2 tokens 128-thread blocks of 8 rows a pair, more 256-thread
    // blocks of 16 rows a routed expert (and one more for invalid ids).
    let cfg = if n_tokens <= 2 {
        LaunchCfg::linear(m.div_ceil(8) * ids.len() * 128, 128)
    } else {
        LaunchCfg::linear(m.div_ceil(16) * (ids.len().min(N_EXPERT) + 1) * 256, 256)
    };
    dev.launch(KernelId::MulMatExperts, &cfg, &args, s).unwrap();
    download(dev, &y, s)
}

#[test]
fn mul_mat_experts_multi_q8_is_bit_for_bit_each_token_alone() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "mul_mat_experts_multi_q8_is_bit_for_bit_each_token_alone";
    let (Some(first), Some(without)) = (gpu(test, ""), gpu(test, "mul_mat_experts_multi_q8"))
    else {
        return;
    };
    let mut rng = Rng(0xbb67_ae85_84ca_a73b);
    let mut failures = Vec::new();
    for ty in FORMATS {
        for (m, k, per_slot) in [(768, 2048, false), (2048, 768, true), (40, 5120, false)] {
            if ty.row_bytes(k).is_none() {
                continue;
            }
            // Experts 64 bytes apart beyond their matrices.
            let stride = ty.row_bytes(k).unwrap() * m + 64;
            let w = expert_weights(ty, m, k, N_EXPERT, stride, &mut rng);
            for n_tokens in 2..=8 {
                // routing()'s windows with its id past the experts made valid (mul_mat_experts
                // has no bound to check ids against); the negative id stays.
                let mut ids = routing(n_tokens, &mut rng);
                ids[1] = (ids[0] + 1) % N_EXPERT as i32;
                let rows = if per_slot { ids.len() } else { n_tokens };
                let x: Vec<f32> = (0..rows * k).map(|_| 2.0 * rng.f32()).collect();
                let shape = (m, k, stride);
                let got = resident(&first, ty, shape, &w, &x, &ids, per_slot);
                let grouped = resident(&without, ty, shape, &w, &x, &ids, per_slot);
                // Each token alone, as a decode step launches it.
                let x_rows = if per_slot { N_USED } else { 1 };
                let alone: Vec<f32> = (0..n_tokens)
                    .flat_map(|t| {
                        let xt = &x[t * x_rows * k..(t + 1) * x_rows * k];
                        let it = &ids[t * N_USED..(t + 1) * N_USED];
                        resident(&first, ty, shape, &w, xt, it, per_slot)
                    })
                    .collect();
                let nan_rows = ids
                    .iter()
                    .zip(got.chunks(m))
                    .all(|(&e, row)| (e < 0) == row.iter().all(|v| v.is_nan()));
                let ok = same_bits(&got, &grouped) && same_bits(&got, &alone) && nan_rows;
                let what = format!("{ty:?} {m}x{k} per_slot {per_slot} tokens {n_tokens}");
                println!(
                    "mul_mat_experts_multi_q8 {what}: {}",
                    if ok { "bit-exact" } else { "DIFFERENT" }
                );
                if !ok {
                    failures.push(what);
                }
            }
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}
