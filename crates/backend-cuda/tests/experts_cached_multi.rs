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
//! products); the gate-and-up forms of both (kernels-cuda/fused.cu experts_gate_up_multi_q8
//! over resident experts, against experts_gate_up's per-pair units and each token alone;
//! experts_gate_up_cached and its window form over the cache, against the sequence it
//! replaces: two mul_mat_experts_cached and swiglu). Skips with one line when there is no
//! CUDA device.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/variants.rs"]
mod variants;

use strata_core::{Args, Device, DeviceBuffer, KernelId, LaunchCfg, Stream};
use strata_quant::QuantType;
use variants::{FORMATS, GPU, Rng, download, expert_weights, gpu, random_weights, same_bits};

/// One case's outcome, printed; remembered in `failures` when the bits differ.
fn record(kernel: &str, what: String, ok: bool, failures: &mut Vec<String>) {
    let verdict = if ok { "bit-exact" } else { "DIFFERENT" };
    println!("{kernel} {what}: {verdict}");
    if !ok {
        failures.push(what);
    }
}

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

/// A window on a device: its activations, its routing and its output (-7 everywhere), the
/// buffers a launch's arguments borrow.
struct WindowIo {
    s: Stream,
    x: DeviceBuffer<f32>,
    ids: DeviceBuffer<i32>,
    y: DeviceBuffer<f32>,
    n_tokens: u32,
}

impl WindowIo {
    fn new(dev: &Device, x: &[f32], ids: &[i32], m: usize) -> Self {
        let s = dev.main_stream();
        WindowIo {
            s,
            x: dev.alloc_from(x, s).unwrap(),
            ids: dev.alloc_from(ids, s).unwrap(),
            y: dev.alloc_from(&vec![-7.0f32; ids.len() * m], s).unwrap(),
            n_tokens: (ids.len() / N_USED) as u32,
        }
    }

    /// Launches `id` with `args` and gives back the output.
    fn run(&self, dev: &Device, id: KernelId, cfg: LaunchCfg, args: Args<'_>) -> Vec<f32> {
        dev.launch(id, &cfg, &args, self.s).unwrap();
        download(dev, &self.y, self.s)
    }
}

/// A cache's slots and residency table on a device.
fn cache_buffers(dev: &Device, cache: &Cache) -> (DeviceBuffer<u8>, DeviceBuffer<i32>) {
    let s = dev.main_stream();
    (
        dev.alloc_from(&cache.slots, s).unwrap(),
        dev.alloc_from(&cache.table, s).unwrap(),
    )
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
    let io = WindowIo::new(dev, x, ids, m);
    let (slots, table) = cache_buffers(dev, cache);
    let args = Args::new()
        .read(&slots)
        .read(&table)
        .read(&io.x)
        .read(&io.ids)
        .write(&io.y)
        .u32(ty.id())
        .u32(m as u32)
        .u32(k as u32)
        .u32(io.n_tokens)
        .u32(N_USED as u32)
        .u32(per_slot as u32)
        .u32(N_EXPERT as u32)
        .u64(cache.slot_bytes as u64)
        .u64(cache.offset as u64);
    // ops.rs's shape: a 256-thread block per 16 rows of a pair.
    let cfg = LaunchCfg::linear(ids.len() * m.div_ceil(16) * 256, 256);
    io.run(dev, KernelId::MulMatExpertsCached, cfg, args)
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
                    record("mul_mat_experts_cached_multi", what, ok, &mut failures);
                }
            }
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}

/// routing()'s window of `n_tokens` with its id past the experts made valid (the resident
/// kernels have no bound to check ids against); the negative id stays.
fn resident_routing(n_tokens: usize, rng: &mut Rng) -> Vec<i32> {
    let mut ids = routing(n_tokens, rng);
    ids[1] = (ids[0] + 1) % N_EXPERT as i32;
    ids
}

/// Whether a resident window's outputs `got` (`launch` on the default device) are bit for
/// bit `others` (the same launch with the variant left out) and each token launched alone
/// on the default device (`x_rows` activation rows of `k` a token), with NaN rows exactly
/// for the negative ids.
fn resident_window_ok(
    launch: impl Fn(&[f32], &[i32]) -> Vec<f32>,
    got: &[f32],
    others: &[f32],
    (x, ids): (&[f32], &[i32]),
    (m, k, x_rows): (usize, usize, usize),
) -> bool {
    let alone: Vec<f32> = (0..ids.len() / N_USED)
        .flat_map(|t| {
            let xt = &x[t * x_rows * k..(t + 1) * x_rows * k];
            launch(xt, &ids[t * N_USED..(t + 1) * N_USED])
        })
        .collect();
    let nan_rows = ids
        .iter()
        .zip(got.chunks(m))
        .all(|(&e, row)| (e < 0) == row.iter().all(|v| v.is_nan()));
    same_bits(got, others) && same_bits(got, &alone) && nan_rows
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
    let io = WindowIo::new(dev, x, ids, m);
    let bw = dev.alloc_from(w, io.s).unwrap();
    let args = Args::new()
        .read(&bw)
        .read(&io.x)
        .read(&io.ids)
        .write(&io.y)
        .u32(ty.id())
        .u32(m as u32)
        .u32(k as u32)
        .u32(io.n_tokens)
        .u32(N_USED as u32)
        .u32(per_slot as u32)
        .u64(stride as u64);
    // ops.rs's shapes: up to 2 tokens 128-thread blocks of 8 rows a pair, more 256-thread
    // blocks of 16 rows a routed expert (and one more for invalid ids).
    let cfg = if io.n_tokens <= 2 {
        LaunchCfg::linear(m.div_ceil(8) * ids.len() * 128, 128)
    } else {
        LaunchCfg::linear(m.div_ceil(16) * (ids.len().min(N_EXPERT) + 1) * 256, 256)
    };
    io.run(dev, KernelId::MulMatExperts, cfg, args)
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
                let ids = resident_routing(n_tokens, &mut rng);
                let x_rows = if per_slot { N_USED } else { 1 };
                let x: Vec<f32> = (0..n_tokens * x_rows * k)
                    .map(|_| 2.0 * rng.f32())
                    .collect();
                let shape = (m, k, stride);
                let launch =
                    |x: &[f32], ids: &[i32]| resident(&first, ty, shape, &w, x, ids, per_slot);
                let got = launch(&x, &ids);
                let grouped = resident(&without, ty, shape, &w, &x, &ids, per_slot);
                let ok = resident_window_ok(launch, &got, &grouped, (&x, &ids), (m, k, x_rows));
                let what = format!("{ty:?} {m}x{k} per_slot {per_slot} tokens {n_tokens}");
                record("mul_mat_experts_multi_q8", what, ok, &mut failures);
            }
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}

/// experts_gate_up on `dev` (gate and up experts `stride` bytes apart in `wg`, `wu`) for
/// `ids.len() / N_USED` tokens, launched as ops.rs launches it (4-warp blocks of a gate
/// and an up row a warp); the output starts as -7 everywhere.
fn gate_up_resident(
    dev: &Device,
    ty: QuantType,
    (m, k, stride): (usize, usize, usize),
    (wg, wu): (&[u8], &[u8]),
    x: &[f32],
    ids: &[i32],
) -> Vec<f32> {
    let io = WindowIo::new(dev, x, ids, m);
    let (bg, bu) = (
        dev.alloc_from(wg, io.s).unwrap(),
        dev.alloc_from(wu, io.s).unwrap(),
    );
    let args = Args::new()
        .read(&bg)
        .read(&bu)
        .read(&io.x)
        .read(&io.ids)
        .write(&io.y)
        .u32(ty.id())
        .u32(m as u32)
        .u32(k as u32)
        .u32(io.n_tokens)
        .u32(N_USED as u32)
        .u64(stride as u64)
        .u64(stride as u64);
    let cfg = LaunchCfg::linear(m.div_ceil(4) * ids.len() * 128, 128);
    io.run(dev, KernelId::ExpertsGateUp, cfg, args)
}

#[test]
fn experts_gate_up_multi_q8_is_bit_for_bit_each_token_alone() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "experts_gate_up_multi_q8_is_bit_for_bit_each_token_alone";
    let (Some(first), Some(without)) = (gpu(test, ""), gpu(test, "experts_gate_up_multi_q8"))
    else {
        return;
    };
    let mut rng = Rng(0x3c6e_f372_fe94_f82b);
    let mut failures = Vec::new();
    for ty in FORMATS {
        for (m, k) in [(768, 2048), (40, 5120)] {
            if ty.row_bytes(k).is_none() {
                continue;
            }
            let stride = ty.row_bytes(k).unwrap() * m + 64;
            let wg = expert_weights(ty, m, k, N_EXPERT, stride, &mut rng);
            let wu = expert_weights(ty, m, k, N_EXPERT, stride, &mut rng);
            for n_tokens in 2..=8 {
                let ids = resident_routing(n_tokens, &mut rng);
                let x: Vec<f32> = (0..n_tokens * k).map(|_| 2.0 * rng.f32()).collect();
                let (shape, w) = ((m, k, stride), (&wg[..], &wu[..]));
                let launch =
                    |x: &[f32], ids: &[i32]| gate_up_resident(&first, ty, shape, w, x, ids);
                let got = launch(&x, &ids);
                let per_pair = gate_up_resident(&without, ty, shape, w, &x, &ids);
                let ok = resident_window_ok(launch, &got, &per_pair, (&x, &ids), (m, k, 1));
                let what = format!("{ty:?} {m}x{k} tokens {n_tokens}");
                record("experts_gate_up_multi_q8", what, ok, &mut failures);
            }
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}

/// experts_gate_up_cached on `dev` over `cache` (each slot: the gate at `cache.offset`,
/// the up matrix `up_at` bytes on), launched as ops_decode.rs launches it; the output
/// starts as -7 everywhere.
fn gate_up_cached(
    dev: &Device,
    ty: QuantType,
    (m, k): (usize, usize),
    (cache, up_at): (&Cache, usize),
    x: &[f32],
    ids: &[i32],
) -> Vec<f32> {
    let io = WindowIo::new(dev, x, ids, m);
    let (slots, table) = cache_buffers(dev, cache);
    let args = Args::new()
        .read(&slots)
        .read(&table)
        .read(&io.x)
        .read(&io.ids)
        .write(&io.y)
        .u32(ty.id())
        .u32(m as u32)
        .u32(k as u32)
        .u32(io.n_tokens)
        .u32(N_USED as u32)
        .u32(N_EXPERT as u32)
        .u64(cache.slot_bytes as u64)
        .u64(cache.offset as u64)
        .u64((cache.offset + up_at) as u64);
    let cfg = LaunchCfg::linear(m.div_ceil(4) * ids.len() * 128, 128);
    io.run(dev, KernelId::ExpertsGateUpCached, cfg, args)
}

/// The sequence experts_gate_up_cached replaces: mul_mat_experts_cached of the gate and of
/// the up matrix (`up_at` bytes after the gate in each slot), then swiglu.
fn gate_up_sequence(
    dev: &Device,
    ty: QuantType,
    (m, k): (usize, usize),
    (cache, up_at): (&Cache, usize),
    x: &[f32],
    ids: &[i32],
) -> Vec<f32> {
    let gate = cached(dev, ty, m, k, cache, x, ids, false);
    let up_cache = Cache {
        slots: cache.slots.clone(),
        table: cache.table.clone(),
        slot_bytes: cache.slot_bytes,
        offset: cache.offset + up_at,
    };
    let up = cached(dev, ty, m, k, &up_cache, x, ids, false);
    let s = dev.main_stream();
    let (bg, bu) = (
        dev.alloc_from(&gate, s).unwrap(),
        dev.alloc_from(&up, s).unwrap(),
    );
    let y = dev.alloc::<f32>(gate.len()).unwrap();
    let args = Args::new()
        .read(&bg)
        .read(&bu)
        .write(&y)
        .u32(gate.len() as u32);
    dev.launch(
        KernelId::Swiglu,
        &LaunchCfg::linear(gate.len(), 256),
        &args,
        s,
    )
    .unwrap();
    download(dev, &y, s)
}

#[test]
fn experts_gate_up_cached_is_bit_for_bit_the_sequence() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "experts_gate_up_cached_is_bit_for_bit_the_sequence";
    let q8 = "mul_mat_experts_cached_multi_q8";
    let windows = format!("{q8},mul_mat_experts_cached_multi,mul_mat_experts_cached_grouped");
    let (Some(first), Some(per_pair), Some(sequence)) = (
        gpu(test, ""),
        gpu(test, "experts_gate_up_cached_multi_q8"),
        gpu(test, &windows),
    ) else {
        return;
    };
    let mut rng = Rng(0xa54f_f53a_5f1d_36f1);
    let mut failures = Vec::new();
    for ty in FORMATS {
        for (m, k) in [(768, 2048), (40, 5120)] {
            if ty.row_bytes(k).is_none() {
                continue;
            }
            // Each slot: the gate, then the up matrix (a Cache of twice the rows, the gate
            // its first m rows).
            let cache = Cache::new(ty, 2 * m, k, &mut rng);
            let up_at = ty.row_bytes(k).unwrap() * m;
            for n_tokens in 1..=8 {
                // A step's pairs: a window's first token.
                let ids = match n_tokens {
                    1 => routing(2, &mut rng)[..N_USED].to_vec(),
                    n => routing(n, &mut rng),
                };
                let x: Vec<f32> = (0..n_tokens * k).map(|_| 2.0 * rng.f32()).collect();
                let (shape, c) = ((m, k), (&cache, up_at));
                let got = gate_up_cached(&first, ty, shape, c, &x, &ids);
                let pairs = gate_up_cached(&per_pair, ty, shape, c, &x, &ids);
                let want = gate_up_sequence(&sequence, ty, shape, c, &x, &ids);
                // Resident pairs: the sequence's rows; the pool's: untouched; bad ids: NaN.
                let rows_ok = ids.iter().enumerate().all(|(p, &e)| {
                    let (row, want) = (&got[p * m..][..m], &want[p * m..][..m]);
                    if e < 0 || e as usize >= N_EXPERT {
                        row.iter().all(|v| v.is_nan())
                    } else if cache.table[e as usize] < 0 {
                        row.iter().all(|&v| v == -7.0)
                    } else {
                        same_bits(row, want)
                    }
                });
                let ok = rows_ok && same_bits(&got, &pairs);
                let what = format!("{ty:?} {m}x{k} tokens {n_tokens}");
                record("experts_gate_up_cached", what, ok, &mut failures);
            }
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}
