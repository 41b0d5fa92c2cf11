//! The transformer ops of crates/core/kernels.txt on the CPU backend, each launched
//! through the Device API (sanitizer on, 1 to 3 kernel threads) and checked against a
//! straightforward f64 reference of its documented meaning; matrix products against the
//! quant crate's dequantisation, and against llama.cpp's ggml (golden files). Error
//! cases must come back as driver errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "model_ops/attention.rs"]
mod attention;
#[path = "model_ops/attention_rows.rs"]
mod attention_rows;
#[path = "model_ops/fuzz.rs"]
mod fuzz;
#[path = "model_ops/gate_up.rs"]
mod gate_up;
#[path = "model_ops/golden.rs"]
mod golden;
#[path = "model_ops/matmul.rs"]
mod matmul;
#[path = "model_ops/rope.rs"]
mod rope;

pub use strata_backend_cpu::{CpuOptions, device};
use strata_core::{Args, Device, DeviceBuffer, Error, KernelId, LaunchCfg};

/// Thread counts every op is run with: none, an even and an odd split.
pub const THREADS: [usize; 3] = [1, 2, 3];

/// A sanitized CPU device with `threads` kernel threads.
pub fn dev(threads: usize) -> Device {
    device(CpuOptions {
        sanitize: true,
        max_dma_delay_us: 20,
        threads: Some(threads),
        ..Default::default()
    })
    .expect("cpu device")
}

/// xorshift64*: deterministic test data without a dependency.
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
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Launches `kernel` on the main stream.
#[track_caller]
pub fn launch(dev: &Device, kernel: KernelId, args: &Args<'_>) {
    dev.launch(kernel, &LaunchCfg::linear(1, 1), args, dev.main_stream())
        .expect("launch");
}

pub fn upload<T: bytemuck::Pod>(dev: &Device, data: &[T]) -> DeviceBuffer<T> {
    dev.alloc_from(data, dev.main_stream()).expect("upload")
}

pub fn download<T: bytemuck::Pod>(dev: &Device, buf: &DeviceBuffer<T>) -> Vec<T> {
    dev.download(buf, dev.main_stream())
        .expect("download")
        .wait()
        .expect("kernel result")
}

/// Asserts `|got - want| <= tol[i]` element by element, naming the first failure.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let t = tol(i);
        assert!(
            (f64::from(g) - w).abs() <= t && g.is_finite(),
            "{what}: element {i}: got {g}, want {w} (tolerance {t})"
        );
    }
}

/// Relative tolerance `rel` of |want|, at least `abs`.
pub fn rel(want: &[f64], rel: f64, abs: f64) -> impl Fn(usize) -> f64 + '_ {
    move |i| (want[i].abs() * rel).max(abs)
}

/// Runs `body` (which launches a bad kernel) and expects the driver error naming `op`.
pub fn expect_kernel_error(dev: &Device, op: &str, what: &str) {
    match dev.synchronize() {
        Err(Error::Driver { message, .. }) => {
            assert!(
                message.contains(op),
                "{what}: error does not name {op}: {message}"
            );
            eprintln!("{what}: {message}");
        }
        other => panic!("{what}: expected a driver error from {op}, got {other:?}"),
    }
}

#[test]
fn elementwise_ops_match_their_definitions() {
    let mut rng = Rng::new(1);
    for threads in THREADS {
        let d = dev(threads);
        for n in [1usize, 7, 100_003] {
            let (a, b) = (rng.vec(n, 4.0), rng.vec(n, 4.0));
            let (ba, bb, by) = (upload(&d, &a), upload(&d, &b), d.alloc::<f32>(n).unwrap());
            for (kernel, name) in [(KernelId::Add, "add"), (KernelId::Swiglu, "swiglu")] {
                launch(
                    &d,
                    kernel,
                    &Args::new().read(&ba).read(&bb).write(&by).u32(n as u32),
                );
                let want: Vec<f64> = a
                    .iter()
                    .zip(&b)
                    .map(|(&x, &y)| {
                        let (x, y) = (f64::from(x), f64::from(y));
                        if name == "add" {
                            x + y
                        } else {
                            x / (1.0 + (-x).exp()) * y
                        }
                    })
                    .collect();
                assert_close(name, &download(&d, &by), &want, rel(&want, 1e-6, 1e-6));
            }
        }
        for (rows, dim) in [(3usize, 5usize), (300, 576)] {
            let (x, b, gate) = (
                rng.vec(rows * dim, 2.0),
                rng.vec(dim, 2.0),
                rng.vec(rows, 3.0),
            );
            let y = rng.vec(rows * dim, 2.0);
            let (bx, bb) = (upload(&d, &x), upload(&d, &b));
            launch(
                &d,
                KernelId::AddRows,
                &Args::new()
                    .read_write(&bx)
                    .read(&bb)
                    .u32(rows as u32)
                    .u32(dim as u32),
            );
            let want: Vec<f64> = (0..rows * dim)
                .map(|i| f64::from(x[i]) + f64::from(b[i % dim]))
                .collect();
            assert_close(
                "add_rows",
                &download(&d, &bx),
                &want,
                rel(&want, 1e-6, 1e-6),
            );

            let (by, bg, bo) = (upload(&d, &y), upload(&d, &gate), upload(&d, &x));
            launch(
                &d,
                KernelId::SigmoidGateAdd,
                &Args::new()
                    .read(&by)
                    .read(&bg)
                    .read_write(&bo)
                    .u32(rows as u32)
                    .u32(dim as u32),
            );
            let want: Vec<f64> = (0..rows * dim)
                .map(|i| {
                    let g = 1.0 / (1.0 + (-f64::from(gate[i / dim])).exp());
                    f64::from(x[i]) + g * f64::from(y[i])
                })
                .collect();
            assert_close(
                "sigmoid_gate_add",
                &download(&d, &bo),
                &want,
                rel(&want, 1e-6, 1e-6),
            );
        }
    }
}

#[test]
fn rms_norm_matches_its_definition() {
    let mut rng = Rng::new(2);
    for threads in THREADS {
        let d = dev(threads);
        for (rows, dim, eps) in [(1usize, 576usize, 1e-5f32), (4, 7, 1e-6), (257, 1024, 1e-6)] {
            let x = rng.vec(rows * dim, 3.0);
            let w = rng.vec(dim, 1.5);
            let (bx, bw, by) = (
                upload(&d, &x),
                upload(&d, &w),
                d.alloc::<f32>(rows * dim).unwrap(),
            );
            launch(
                &d,
                KernelId::RmsNorm,
                &Args::new()
                    .read(&bx)
                    .read(&bw)
                    .write(&by)
                    .u32(rows as u32)
                    .u32(dim as u32)
                    .f32(eps),
            );
            let mut want = Vec::new();
            for r in x.chunks(dim) {
                let ms = r.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dim as f64;
                let s = 1.0 / (ms + f64::from(eps)).sqrt();
                want.extend(
                    r.iter()
                        .zip(&w)
                        .map(|(&v, &g)| f64::from(v) * s * f64::from(g)),
                );
            }
            assert_close(
                "rms_norm",
                &download(&d, &by),
                &want,
                rel(&want, 2e-6, 1e-6),
            );
        }
    }
}

#[test]
fn embed_rows_dequantises_the_chosen_rows() {
    use strata_quant::QuantType;
    let mut rng = Rng::new(3);
    let (vocab, dim) = (50usize, 512usize);
    for ty in [
        QuantType::F32,
        QuantType::F16,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q6_K,
    ] {
        let table = matmul::random_weights(ty, vocab, dim, &mut rng);
        let row_bytes = ty.row_bytes(dim).unwrap();
        for threads in [1, 2] {
            let d = dev(threads);
            let ids: Vec<u32> = (0..70).map(|_| rng.below(vocab) as u32).collect();
            let (bt, bi) = (upload(&d, &table), upload(&d, &ids));
            let out = d.alloc::<f32>(ids.len() * dim).unwrap();
            launch(
                &d,
                KernelId::EmbedRows,
                &Args::new()
                    .read(&bt)
                    .read(&bi)
                    .write(&out)
                    .u32(ty.id())
                    .u32(dim as u32)
                    .u32(ids.len() as u32),
            );
            let got = download(&d, &out);
            let mut row = vec![0.0f32; dim];
            for (t, &id) in ids.iter().enumerate() {
                let id = id as usize;
                strata_quant::dequantize_row(
                    ty,
                    &table[id * row_bytes..(id + 1) * row_bytes],
                    &mut row,
                )
                .unwrap();
                assert_eq!(&got[t * dim..(t + 1) * dim], &row[..], "{ty:?} token {t}");
            }
            // An id past the table is refused.
            let bad = upload(&d, &[vocab as u32]);
            launch(
                &d,
                KernelId::EmbedRows,
                &Args::new()
                    .read(&bt)
                    .read(&bad)
                    .write(&out)
                    .u32(ty.id())
                    .u32(dim as u32)
                    .u32(1),
            );
            expect_kernel_error(&d, "embed_rows", "id past the table");
        }
    }
}

#[test]
fn kv_store_writes_f16_rows_at_their_positions() {
    let mut rng = Rng::new(4);
    let d = dev(2);
    let (kv_dim, ctx, n) = (24usize, 10usize, 4usize);
    // Out of order and with gaps: the positions buffer, not the row index, places a row.
    let positions = [3i32, 8, 4, 0];
    let (k, v) = (rng.vec(n * kv_dim, 5.0), rng.vec(n * kv_dim, 5.0));
    let (bk, bv) = (upload(&d, &k), upload(&d, &v));
    let kc = upload(&d, &vec![0x7777u16; ctx * kv_dim]);
    let vc = upload(&d, &vec![0x7777u16; ctx * kv_dim]);
    let store = |pos: &[i32], n_ctx: u32| {
        let pos = upload(&d, pos);
        launch(
            &d,
            KernelId::KvStore,
            &Args::new()
                .read(&bk)
                .read(&bv)
                .read(&pos)
                .write(&kc)
                .write(&vc)
                .u32(kv_dim as u32)
                .u32(n as u32)
                .u32(n_ctx),
        );
    };
    store(&positions, ctx as u32);
    for (cache, src) in [(download(&d, &kc), &k), (download(&d, &vc), &v)] {
        for (i, &c) in cache.iter().enumerate() {
            let row = i / kv_dim;
            let want = match positions.iter().position(|&p| p as usize == row) {
                Some(t) => half::f16::from_f32(src[t * kv_dim + i % kv_dim]).to_bits(),
                None => 0x7777,
            };
            assert_eq!(c, want, "cache element {i} (row {row})");
        }
    }
    store(&[7, 8, 9, 10], ctx as u32);
    expect_kernel_error(&d, "kv_store", "a position past the cache");
    store(&[0, 1, -2, 3], ctx as u32);
    expect_kernel_error(&d, "kv_store", "a negative position");
    store(&[0, 1, 2, 3], ctx as u32 + 1);
    expect_kernel_error(&d, "kv_store", "n_ctx beyond the cache buffers");
}

/// f64 softmax, then the k best (descending, ties to the lower index), then the norm.
fn reference_topk(logits: &[f32], k: usize, norm: bool) -> (Vec<i32>, Vec<f64>) {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let e: Vec<f64> = logits.iter().map(|&v| (f64::from(v) - max).exp()).collect();
    let s: f64 = e.iter().sum();
    let p: Vec<f64> = e.iter().map(|v| v / s).collect();
    let mut idx: Vec<usize> = (0..p.len()).collect();
    idx.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap().then(a.cmp(&b)));
    let ids: Vec<i32> = idx[..k].iter().map(|&i| i as i32).collect();
    let mut w: Vec<f64> = idx[..k].iter().map(|&i| p[i]).collect();
    if norm {
        let s: f64 = w.iter().sum();
        w.iter_mut().for_each(|v| *v /= s);
    }
    (ids, w)
}

#[test]
fn router_topk_picks_normalises_and_breaks_ties_low() {
    let mut rng = Rng::new(5);
    let d = dev(2);
    let (n_tokens, n_expert, k) = (9usize, 64usize, 8usize);
    let mut logits = rng.vec(n_tokens * n_expert, 4.0);
    // Token 0: every logit equal; token 1: a tie straddling the k-th place.
    logits[..n_expert].fill(0.5);
    for e in [3, 10, 20, 40, 50] {
        logits[n_expert + e] = 9.0;
    }
    for e in [5, 7, 30, 33, 60] {
        logits[n_expert + e] = 7.0;
    }
    let bl = upload(&d, &logits);
    let (ids, w) = (
        d.alloc::<i32>(n_tokens * k).unwrap(),
        d.alloc::<f32>(n_tokens * k).unwrap(),
    );
    for norm in [0u32, 1] {
        launch(
            &d,
            KernelId::RouterTopk,
            &Args::new()
                .read(&bl)
                .write(&ids)
                .write(&w)
                .u32(n_tokens as u32)
                .u32(n_expert as u32)
                .u32(k as u32)
                .u32(norm),
        );
        let (got_ids, got_w) = (download(&d, &ids), download(&d, &w));
        for t in 0..n_tokens {
            let (want_ids, want_w) =
                reference_topk(&logits[t * n_expert..(t + 1) * n_expert], k, norm != 0);
            assert_eq!(
                &got_ids[t * k..(t + 1) * k],
                &want_ids[..],
                "token {t} ids (norm {norm})"
            );
            assert_close(
                &format!("token {t} weights"),
                &got_w[t * k..(t + 1) * k],
                &want_w,
                rel(&want_w, 1e-6, 1e-7),
            );
        }
        assert_eq!(
            &got_ids[..k],
            &[0, 1, 2, 3, 4, 5, 6, 7],
            "all equal: lowest indices"
        );
        assert_eq!(
            &got_ids[k..2 * k],
            &[3, 10, 20, 40, 50, 5, 7, 30],
            "ties at the k-th place"
        );
    }
    launch(
        &d,
        KernelId::RouterTopk,
        &Args::new()
            .read(&bl)
            .write(&ids)
            .write(&w)
            .u32(1)
            .u32(4)
            .u32(5)
            .u32(1),
    );
    expect_kernel_error(&d, "router_topk", "k > n_expert");
}

#[test]
fn moe_combine_is_the_weighted_sum_of_slots() {
    let mut rng = Rng::new(6);
    for threads in THREADS {
        let d = dev(threads);
        for (n_tokens, n_used, m) in [(1usize, 8usize, 2048usize), (37, 4, 300)] {
            let y = rng.vec(n_tokens * n_used * m, 3.0);
            let w = rng.vec(n_tokens * n_used, 1.0);
            let (by, bw, out) = (
                upload(&d, &y),
                upload(&d, &w),
                d.alloc::<f32>(n_tokens * m).unwrap(),
            );
            launch(
                &d,
                KernelId::MoeCombine,
                &Args::new()
                    .read(&by)
                    .read(&bw)
                    .write(&out)
                    .u32(n_tokens as u32)
                    .u32(n_used as u32)
                    .u32(m as u32),
            );
            let want: Vec<f64> = (0..n_tokens * m)
                .map(|i| {
                    let (t, c) = (i / m, i % m);
                    (0..n_used)
                        .map(|j| {
                            f64::from(w[t * n_used + j]) * f64::from(y[(t * n_used + j) * m + c])
                        })
                        .sum()
                })
                .collect();
            assert_close("moe_combine", &download(&d, &out), &want, |_| 1e-5);
        }
    }
}

#[test]
fn sizes_that_do_not_fit_are_driver_errors() {
    let d = dev(2);
    let small = upload(&d, &[0.0f32; 8]);
    let other = upload(&d, &[0.0f32; 8]);
    let out = d.alloc::<f32>(8).unwrap();
    launch(
        &d,
        KernelId::Add,
        &Args::new().read(&small).read(&other).write(&out).u32(9),
    );
    expect_kernel_error(&d, "add", "add past the buffers");
    let w = upload(&d, &[1.0f32; 4]);
    launch(
        &d,
        KernelId::RmsNorm,
        &Args::new()
            .read(&small)
            .read(&w)
            .write(&out)
            .u32(2)
            .u32(8)
            .f32(1e-5),
    );
    expect_kernel_error(&d, "rms_norm", "rms_norm rows past x");
    // Wrong argument kinds are refused too, not misread.
    launch(
        &d,
        KernelId::Add,
        &Args::new().read(&small).read(&other).write(&out).f32(1.0),
    );
    expect_kernel_error(&d, "should be u32", "a float where a count goes");
}
