//! attention_rows (a verify window's attention) against the op it must equal bit for bit:
//! each token's rows launched alone as a one-token attention (decode). The batch-order
//! attention launch over the same tokens must differ somewhere, which shows the bitwise
//! comparison sees a change of summation order.

use strata_core::{Args, Device, DeviceBuffer, KernelId};

use super::{Rng, THREADS, dev, download, launch, upload};

struct Case {
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    /// The window's positions (consecutive in a verify window; any order is allowed).
    pos: Vec<i32>,
}

struct Bufs {
    q: DeviceBuffer<f32>,
    pos: DeviceBuffer<i32>,
    kc: DeviceBuffer<u16>,
    vc: DeviceBuffer<u16>,
    n_ctx: usize,
}

/// Fills a cache of max(pos) + 1 rows through kv_store and uploads the queries.
fn setup(d: &Device, c: &Case, rng: &mut Rng) -> Bufs {
    let kv_dim = c.n_kv_head * c.head_dim;
    let n_ctx = *c.pos.iter().max().unwrap() as usize + 1;
    let (kc, vc) = (
        d.alloc::<u16>(n_ctx * kv_dim).unwrap(),
        d.alloc::<u16>(n_ctx * kv_dim).unwrap(),
    );
    let (bk, bv) = (
        upload(d, &rng.vec(n_ctx * kv_dim, 2.0)),
        upload(d, &rng.vec(n_ctx * kv_dim, 3.0)),
    );
    let all = upload(d, &(0..n_ctx as i32).collect::<Vec<_>>());
    launch(
        d,
        KernelId::KvStore,
        &Args::new()
            .read(&bk)
            .read(&bv)
            .read(&all)
            .write(&kc)
            .write(&vc)
            .u32(kv_dim as u32)
            .u32(n_ctx as u32)
            .u32(n_ctx as u32),
    );
    let q = upload(d, &rng.vec(c.pos.len() * c.n_head * c.head_dim, 2.0));
    Bufs {
        q,
        pos: upload(d, &c.pos),
        kc,
        vc,
        n_ctx,
    }
}

/// `kernel` over tokens `t0..t0 + n` of the window, into `out` at their rows.
fn attend(
    d: &Device,
    kernel: KernelId,
    c: &Case,
    b: &Bufs,
    out: &DeviceBuffer<f32>,
    t0: usize,
    n: usize,
) {
    let row = c.n_head * c.head_dim;
    launch(
        d,
        kernel,
        &Args::new()
            .read_at(&b.q, t0 * row)
            .read_at(&b.pos, t0)
            .read(&b.kc)
            .read(&b.vc)
            .write_at(out, t0 * row)
            .u32(n as u32)
            .u32(c.n_head as u32)
            .u32(c.n_kv_head as u32)
            .u32(c.head_dim as u32)
            .u32(b.n_ctx as u32)
            .f32(1.0 / (c.head_dim as f32).sqrt()),
    );
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn attention_rows_equals_one_token_launches_bit_for_bit() {
    let window = |p0: i32, n: i32| (p0..p0 + n).collect::<Vec<_>>();
    let cases = [
        // SmolLM2's 9:3 x 64, a 5-row window at depth (slot chains of 17-18 rows)
        Case {
            n_head: 9,
            n_kv_head: 3,
            head_dim: 64,
            pos: window(1100, 5),
        },
        // a window that starts inside the first softmax vector and crosses slot 64
        Case {
            n_head: 9,
            n_kv_head: 3,
            head_dim: 64,
            pos: window(60, 9),
        },
        // the first rows of a cache (spans 1..8, shorter than a softmax vector)
        Case {
            n_head: 4,
            n_kv_head: 4,
            head_dim: 64,
            pos: window(0, 8),
        },
        // 128-wide heads, 4:1 groups: 32 query rows per K/V head (several blocks)
        Case {
            n_head: 8,
            n_kv_head: 2,
            head_dim: 128,
            pos: window(300, 8),
        },
        // 256-wide heads, 2 rows
        Case {
            n_head: 2,
            n_kv_head: 1,
            head_dim: 256,
            pos: window(77, 2),
        },
        // positions far apart and out of order: rows only some queries reach
        Case {
            n_head: 6,
            n_kv_head: 2,
            head_dim: 64,
            pos: vec![130, 3, 64, 63, 700, 128],
        },
        // a head size the window path does not take (the one-token path per row)
        Case {
            n_head: 6,
            n_kv_head: 2,
            head_dim: 40,
            pos: window(90, 3),
        },
        // one token: decode itself
        Case {
            n_head: 9,
            n_kv_head: 3,
            head_dim: 64,
            pos: window(500, 1),
        },
    ];
    let mut rng = Rng::new(41);
    let mut batch_differs = 0;
    for threads in THREADS {
        let d = dev(threads);
        for c in &cases {
            let n = c.pos.len();
            let b = setup(&d, c, &mut rng);
            let len = n * c.n_head * c.head_dim;
            let (rows, single, batch) = (
                d.alloc::<f32>(len).unwrap(),
                d.alloc::<f32>(len).unwrap(),
                d.alloc::<f32>(len).unwrap(),
            );
            attend(&d, KernelId::AttentionRows, c, &b, &rows, 0, n);
            for t in 0..n {
                attend(&d, KernelId::Attention, c, &b, &single, t, 1);
            }
            attend(&d, KernelId::Attention, c, &b, &batch, 0, n);
            let (rows, single, batch) = (
                download(&d, &rows),
                download(&d, &single),
                download(&d, &batch),
            );
            let what = format!(
                "{threads} threads, h={}/{} d={} pos={:?}",
                c.n_head, c.n_kv_head, c.head_dim, c.pos
            );
            assert!(
                single.iter().all(|x| x.is_finite()),
                "{what}: non-finite output"
            );
            let first = bits(&rows)
                .iter()
                .zip(bits(&single))
                .position(|(a, b)| *a != b);
            assert_eq!(first, None, "{what}: first differing output (of {len})");
            batch_differs += usize::from(bits(&batch) != bits(&single));
        }
    }
    // The batch order is a different sum: if it never showed, bitwise equality above
    // would say little about the order attention_rows sums in.
    assert!(
        batch_differs >= 10,
        "the batch launch differed in only {batch_differs} cases"
    );
}

/// This process's CPU time in seconds (every thread's run time, /proc/self/task/*/schedstat).
fn cpu_s() -> f64 {
    let ns: u64 = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| {
            let s = std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
            s.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    ns as f64 * 1e-9
}

/// A timing, not a check: `cargo test --release -p strata-backend-cpu --test model_ops
/// attention_rows_cost -- --ignored --nocapture` prints the CPU time of a 5-row window's
/// attention over 30 layers of SmolLM2-shaped caches at depth 1,100 (1 thread), as one
/// attention_rows launch per layer and as 5 one-token launches per layer.
#[test]
#[ignore]
fn attention_rows_cost() {
    let d = dev(1);
    let mut rng = Rng::new(5);
    let c = Case {
        n_head: 9,
        n_kv_head: 3,
        head_dim: 64,
        pos: (1100..1105).collect(),
    };
    let layers: Vec<Bufs> = (0..30).map(|_| setup(&d, &c, &mut rng)).collect();
    let len = 5 * 9 * 64;
    let out = d.alloc::<f32>(len).unwrap();
    for round in 0..3 {
        for rows in [true, false] {
            let c0 = cpu_s();
            for _ in 0..20 {
                for b in &layers {
                    if rows {
                        attend(&d, KernelId::AttentionRows, &c, b, &out, 0, 5);
                    } else {
                        for t in 0..5 {
                            attend(&d, KernelId::Attention, &c, b, &out, t, 1);
                        }
                    }
                }
                d.synchronize().unwrap();
            }
            let ms = (cpu_s() - c0) * 1e3 / 20.0;
            let what = if rows {
                "attention_rows"
            } else {
                "5 one-token launches"
            };
            eprintln!("round {round}: {what}: {ms:.2} ms per window (30 layers)");
        }
    }
}
