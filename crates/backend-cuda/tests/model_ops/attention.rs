//! attention over a cache filled by kv_store on each device, CUDA against the CPU.

use strata_core::{Args, Device, DeviceBuffer, KernelId, LaunchCfg};

use super::{Report, Rng, download, launch, ops_cfg, pair, upload};

struct Case {
    n_tokens: usize,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    pos0: usize,
}

/// Random queries, and K and V rows for every position up to the case's last.
fn case_inputs(rng: &mut Rng, c: &Case) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = (c.pos0 + c.n_tokens) * c.n_kv_head * c.head_dim;
    (
        rng.vec(c.n_tokens * c.n_head * c.head_dim, 2.0),
        rng.vec(rows, 2.0),
        rng.vec(rows, 1.0),
    )
}

/// Stores K/V rows 0..pos0 + n_tokens (f16, or q8_0 with `q8`), then attends with the
/// launch shape `cfg`.
#[allow(clippy::too_many_arguments)]
fn run(
    d: &Device,
    q8: bool,
    c: &Case,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    cfg: &LaunchCfg,
) -> Vec<f32> {
    let (kv_dim, ctx) = (c.n_kv_head * c.head_dim, c.pos0 + c.n_tokens);
    let (kc, vc) = store(d, q8, ctx, kv_dim, k, v);
    let bq = upload(d, q);
    let out = d.alloc::<f32>(c.n_tokens * c.n_head * c.head_dim).unwrap();
    let pos = upload(
        d,
        &(c.pos0 as i32..(c.pos0 + c.n_tokens) as i32).collect::<Vec<_>>(),
    );
    let args = Args::new()
        .read(&bq)
        .read(&pos)
        .read(&kc)
        .read(&vc)
        .write(&out)
        .u32(c.n_tokens as u32)
        .u32(c.n_head as u32)
        .u32(c.n_kv_head as u32)
        .u32(c.head_dim as u32)
        .u32(ctx as u32)
        .f32(1.0 / (c.head_dim as f32).sqrt());
    let kernel = if q8 {
        KernelId::AttentionQ8
    } else {
        KernelId::Attention
    };
    launch(d, kernel, cfg, &args);
    download(d, &out)
}

/// Launches of more tokens than this go to attention_prefill (crates/backend-cuda/src/kernels.rs).
const PER_ROW_MAX_TOKENS: usize = 64;

/// attention_prefill against the CPU. Both round each probability to f16 before P·V, the
/// CPU the normalised one and the kernel the unnormalised exponential (online softmax), so
/// each weight w differs by up to about 2^-11·w on either side, and the output (values in
/// [-1, 1]) by at most about 2^-10 in total; the scores' summation order and exp2 add
/// ~1e-6 relative. In the emulator (tools/cuda_emulate, `attention_prefill`) the kernel
/// stays within 1.4e-4 of the exact softmax. A wrong mask or scale is far outside: with the
/// mask letting each row see one row past its position the emulator's worst error is 0.16
/// to 1.7 (the extra row's score is as large as any: q and k are uniform in [-2, 2], so
/// over thousands of (token, head) rows some give it weight > 0.1), and a scale 5% off
/// gives 0.045 to 0.052.
const PREFILL_TOL: f64 = 1e-3;

#[test]
fn attention_matches_the_cpu() {
    let Some(p) = pair("attention_matches_the_cpu") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(6);
    let cases = [
        // decode steps
        Case {
            n_tokens: 1,
            n_head: 9,
            n_kv_head: 3,
            head_dim: 64,
            pos0: 0,
        },
        Case {
            n_tokens: 1,
            n_head: 8,
            n_kv_head: 2,
            head_dim: 128,
            pos0: 700,
        },
        Case {
            n_tokens: 1,
            n_head: 4,
            n_kv_head: 4,
            head_dim: 256,
            pos0: 5000,
        },
        // prefill batches, with and without history
        Case {
            n_tokens: 20,
            n_head: 8,
            n_kv_head: 2,
            head_dim: 64,
            pos0: 0,
        },
        Case {
            n_tokens: 7,
            n_head: 6,
            n_kv_head: 1,
            head_dim: 96,
            pos0: 37,
        },
        Case {
            n_tokens: 3,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 6,
            pos0: 5,
        },
        // More than 64 tokens: the tensor-core prefill kernel (attention_prefill.cuh).
        // Qwen3-30B-A3B's heads at positions 200..500 (spans of 201..500 rows: no tile or
        // chunk boundary lines up), and groups of 4 at head_dim 64 over 100 tokens
        // (tiles of 32 tokens, the last one partial).
        Case {
            n_tokens: 300,
            n_head: 32,
            n_kv_head: 4,
            head_dim: 128,
            pos0: 200,
        },
        Case {
            n_tokens: 100,
            n_head: 8,
            n_kv_head: 2,
            head_dim: 64,
            pos0: 37,
        },
    ];
    for c in &cases {
        let (q, k, v) = case_inputs(&mut rng, c);
        let units = c.n_tokens * c.n_head;
        let cpu = run(&p.cpu, false, c, &q, &k, &v, &ops_cfg(units));
        let what = format!(
            "attention t={} heads {}/{} hd={} pos0={}",
            c.n_tokens, c.n_head, c.n_kv_head, c.head_dim, c.pos0
        );
        // Outputs are averages of values in [-1, 1]: an absolute scale. Both devices round
        // the normalised probabilities to f16 as ggml does; a score that differs in its
        // last bit (the dot products sum in another order) can move one probability by
        // one f16 step (2^-11 of it), hence the tolerance.
        let gpu = run(&p.gpu, false, c, &q, &k, &v, &ops_cfg(units));
        let tol = if c.n_tokens > PER_ROW_MAX_TOKENS {
            PREFILL_TOL
        } else {
            5e-4
        };
        rep.close(&format!("{what} (ops.rs shape)"), &gpu, &cpu, tol, |_| 1.0);
        // One block per (token, head), the shape the kernel is written for: same numbers.
        let per_unit = LaunchCfg {
            grid: [units as u32, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
        };
        let gpu2 = run(&p.gpu, false, c, &q, &k, &v, &per_unit);
        rep.exact(
            &format!("{what} block per unit vs ops.rs shape"),
            &gpu2,
            &gpu,
        );
    }
    rep.finish();
}

/// attention_q8 launches of more than 64 tokens (attention_prefill_q8: the q8_0 blocks
/// converted to f16 in shared memory, then attention_prefill's tensor-core path) against
/// the CPU's int8 attention, which keeps the query and the values d·q unrounded: besides
/// the probabilities' f16 rounding (PREFILL_TOL), the f16 query and K values move each
/// score by ~5e-4 (random, over 128 products), so a row of few keys (a fresh prompt's
/// first tokens) is off by up to ~7e-4 (the emulator's attention_prefill_q8 test, and a
/// host model of these roundings over this shape: 6.0e-4 to 7.3e-4 over 11 seeds; 3e-4 at
/// positions 200..500). Qwen3-30B-A3B's heads for a fresh prompt and a batch at positions
/// 200..500, and groups of 4 at head_dim 64 at 37..137 (a partial last tile); a block per
/// (token, head), as kv.rs launches it, and the few blocks of ops_cfg give the same bits.
#[test]
fn attention_q8_prefill_matches_the_cpu() {
    let Some(p) = pair("attention_q8_prefill_matches_the_cpu") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(62);
    let qwen3 = |n_tokens, pos0| Case {
        n_tokens,
        n_head: 32,
        n_kv_head: 4,
        head_dim: 128,
        pos0,
    };
    let cases = [
        qwen3(300, 0),
        qwen3(300, 200),
        Case {
            n_tokens: 100,
            n_head: 8,
            n_kv_head: 2,
            head_dim: 64,
            pos0: 37,
        },
    ];
    for c in &cases {
        let (q, k, v) = case_inputs(&mut rng, c);
        let units = c.n_tokens * c.n_head;
        let per_unit = LaunchCfg::linear(units * 256, 256);
        let what = format!(
            "attention_q8 t={} heads {}/{} hd={} pos0={}",
            c.n_tokens, c.n_head, c.n_kv_head, c.head_dim, c.pos0
        );
        let cpu = run(&p.cpu, true, c, &q, &k, &v, &per_unit);
        let gpu = run(&p.gpu, true, c, &q, &k, &v, &per_unit);
        rep.close(&what, &gpu, &cpu, PREFILL_TOL, |_| 1.0);
        let gpu2 = run(&p.gpu, true, c, &q, &k, &v, &ops_cfg(units));
        rep.exact(&format!("{what} ops_cfg vs a block per unit"), &gpu2, &gpu);
    }
    rep.finish();
}

/// A cache of `ctx` rows of random K/V in either format (kv_store or kv_store_q8 from the
/// same rows on each device): (k_cache, v_cache).
fn store(
    d: &Device,
    q8: bool,
    ctx: usize,
    kv_dim: usize,
    k: &[f32],
    v: &[f32],
) -> (DeviceBuffer<u16>, DeviceBuffer<u16>) {
    let words = if q8 { kv_dim / 32 * 17 } else { kv_dim };
    let (kc, vc) = (
        d.alloc::<u16>(ctx * words).unwrap(),
        d.alloc::<u16>(ctx * words).unwrap(),
    );
    let (bk, bv) = (upload(d, k), upload(d, v));
    let all = upload(d, &(0..ctx as i32).collect::<Vec<_>>());
    let args = Args::new()
        .read(&bk)
        .read(&bv)
        .read(&all)
        .write(&kc)
        .write(&vc)
        .u32(kv_dim as u32)
        .u32(ctx as u32)
        .u32(ctx as u32);
    let kernel = if q8 {
        KernelId::KvStoreQ8
    } else {
        KernelId::KvStore
    };
    launch(d, kernel, &ops_cfg(ctx * kv_dim), &args);
    (kc, vc)
}

/// Attention of the queries `q` at positions `pos` over a stored cache, as ops.rs (f16) or
/// kv.rs (q8_0) launches it: a 256-thread block per (token, query head).
#[allow(clippy::too_many_arguments)]
fn attend(
    d: &Device,
    q8: bool,
    cache: &(DeviceBuffer<u16>, DeviceBuffer<u16>),
    q: &[f32],
    pos: &[i32],
    heads: (usize, usize, usize),
    ctx: usize,
) -> Vec<f32> {
    let (n_head, n_kv_head, head_dim) = heads;
    let n = pos.len();
    let (bq, bp) = (upload(d, q), upload(d, pos));
    let out = d.alloc::<f32>(n * n_head * head_dim).unwrap();
    let args = Args::new()
        .read(&bq)
        .read(&bp)
        .read(&cache.0)
        .read(&cache.1)
        .write(&out)
        .u32(n as u32)
        .u32(n_head as u32)
        .u32(n_kv_head as u32)
        .u32(head_dim as u32)
        .u32(ctx as u32)
        .f32(1.0 / (head_dim as f32).sqrt());
    let kernel = if q8 {
        KernelId::AttentionQ8
    } else {
        KernelId::Attention
    };
    launch(d, kernel, &ops_cfg(n * n_head), &args);
    download(d, &out)
}

/// attention_q8 at head_dims off 64 (Phi-3's 96, and 32: a row's four score threads split
/// off q8_0 block edges, attention.cuh AttKvQ8) and on it (64, 128), against the CPU's int8
/// attention: decode steps and short batches (the per-row kernel, f32 sums as the CPU's:
/// ~1e-7 from the exact softmax in the emulator's attention_q8 test, 2e-4 as the deep
/// test's q8 tolerance), a span past 1,024 rows at 96 (attention_long_q8) and a batch of
/// 65 tokens at 96 (attention_prefill_q8, PREFILL_TOL). A block per (token, head), as kv.rs
/// launches it, and the few blocks of ops_cfg give the same bits.
#[test]
fn attention_q8_head_dims_match_the_cpu() {
    let Some(p) = pair("attention_q8_head_dims_match_the_cpu") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(63);
    let case = |n_tokens, n_head, n_kv_head, head_dim, pos0| Case {
        n_tokens,
        n_head,
        n_kv_head,
        head_dim,
        pos0,
    };
    let cases = [
        case(1, 4, 2, 32, 300),
        case(7, 12, 1, 32, 37),
        case(1, 8, 2, 64, 300),
        case(1, 32, 32, 96, 700),
        case(7, 6, 2, 96, 37),
        case(2, 32, 32, 96, 1500),
        case(65, 6, 2, 96, 0),
        case(1, 8, 2, 128, 300),
    ];
    for c in &cases {
        let kv_dim = c.n_kv_head * c.head_dim;
        let ctx = c.pos0 + c.n_tokens;
        let q = rng.vec(c.n_tokens * c.n_head * c.head_dim, 2.0);
        let k = rng.vec(ctx * kv_dim, 2.0);
        let v = rng.vec(ctx * kv_dim, 1.0);
        let units = c.n_tokens * c.n_head;
        let per_unit = LaunchCfg::linear(units * 256, 256);
        let what = format!(
            "attention_q8 t={} heads {}/{} hd={} pos0={}",
            c.n_tokens, c.n_head, c.n_kv_head, c.head_dim, c.pos0
        );
        let cpu = run(&p.cpu, true, c, &q, &k, &v, &per_unit);
        let gpu = run(&p.gpu, true, c, &q, &k, &v, &per_unit);
        let tol = if c.n_tokens > PER_ROW_MAX_TOKENS {
            PREFILL_TOL
        } else {
            2e-4
        };
        rep.close(&what, &gpu, &cpu, tol, |_| 1.0);
        let gpu2 = run(&p.gpu, true, c, &q, &k, &v, &ops_cfg(units));
        rep.exact(&format!("{what} ops_cfg vs a block per unit"), &gpu2, &gpu);
    }
    rep.finish();
}

/// Qwen3-30B-A3B's heads (32 query heads over 4 K/V heads of 128) deep in the cache, where
/// a unit spans more than a cluster's 16 chunks of 64 rows (attention.cuh), for both cache
/// formats: one token at depth 20000, and a 64-token window at 1100..1164 (chunk 18 starts
/// at 1152), against the CPU; and each of some of the window's rows launched alone gives
/// the same bits as in the window (decode steps, verify windows and short reads rely on
/// it: the engine's spec identity); a second window straddles the long kernels' threshold
/// (its rows of spans over 1,024 split over many blocks, the others as before), so both
/// paths run in one launch. On CUDA the long rows take attention_flash (head_dim 128:
/// tensor cores, the probabilities and the q8_0 cache's values rounded to f16, within
/// 8e-5 of the exact softmax at 101 rows and 2.5e-5 at 3,000 in the emulator);
/// tests/attention_flash.rs compares it with attention_long. The q8_0 cache's other
/// kernels sum in f32 as the CPU does (~1e-5 apart in the emulator); its tolerance is
/// the flash kernel's.
#[test]
fn attention_deep_and_in_windows_matches_the_cpu() {
    let Some(p) = pair("attention_deep_and_in_windows_matches_the_cpu") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(61);
    let heads = (32, 4, 128);
    let (n_head, n_kv_head, head_dim) = heads;
    let (kv_dim, row) = (n_kv_head * head_dim, n_head * head_dim);
    let ctx = 20_001;
    let k = rng.vec(ctx * kv_dim, 2.0);
    let v = rng.vec(ctx * kv_dim, 1.0);
    for q8 in [false, true] {
        let fmt = if q8 { "attention_q8" } else { "attention" };
        let tol = if q8 { 2e-4 } else { 5e-4 };
        let (cpu_cache, gpu_cache) = (
            store(&p.cpu, q8, ctx, kv_dim, &k, &v),
            store(&p.gpu, q8, ctx, kv_dim, &k, &v),
        );
        let deep_q = rng.vec(row, 2.0);
        let deep = [20_000i32];
        let cpu = attend(&p.cpu, q8, &cpu_cache, &deep_q, &deep, heads, ctx);
        let gpu = attend(&p.gpu, q8, &gpu_cache, &deep_q, &deep, heads, ctx);
        rep.close(
            &format!("{fmt} one token at 20000"),
            &gpu,
            &cpu,
            tol,
            |_| 1.0,
        );
        // The second window straddles the long kernels' threshold (spans over 1,024 rows:
        // its row 34, at 1024, is the first long one; backend-cuda attention_long.rs).
        for (start, rows) in [(1100, [0usize, 51, 52, 63]), (990, [0, 33, 34, 63])] {
            let window: Vec<i32> = (start..start + 64).collect();
            let q = rng.vec(window.len() * row, 2.0);
            let cpu = attend(&p.cpu, q8, &cpu_cache, &q, &window, heads, ctx);
            let gpu = attend(&p.gpu, q8, &gpu_cache, &q, &window, heads, ctx);
            rep.close(
                &format!("{fmt} 64 tokens at {start}"),
                &gpu,
                &cpu,
                tol,
                |_| 1.0,
            );
            for t in rows {
                let alone = attend(
                    &p.gpu,
                    q8,
                    &gpu_cache,
                    &q[t * row..(t + 1) * row],
                    &window[t..t + 1],
                    heads,
                    ctx,
                );
                rep.exact(
                    &format!("{fmt} row {t} of the window at {start} alone"),
                    &alone,
                    &gpu[t * row..(t + 1) * row],
                );
            }
        }
    }
    rep.finish();
}
