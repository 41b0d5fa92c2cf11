//! The transformer ops (module `model` of crates/core/kernels.txt) on the CUDA device,
//! each compared with the CPU backend (the reference: its numerics follow llama.cpp's CPU
//! path and are checked against ggml in crates/backend-cpu/tests) on the same random
//! inputs, launched with the shapes crates/model/src/ops.rs uses. Every comparison is
//! printed (max |Δ| over the op's scale, and the tolerance) before any assertion, so one
//! GPU run reports every op. Skips with one line when there is no CUDA device.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "model_ops/attention.rs"]
mod attention;
#[path = "model_ops/decode_fused.rs"]
mod decode_fused;
#[path = "model_ops/fused.rs"]
mod fused;
#[path = "model_ops/matmul.rs"]
mod matmul;

use std::sync::Mutex;

use strata_core::{Args, Device, DeviceBuffer, Error, KernelId, LaunchCfg};

/// GPU tests in this file run one at a time even without `--test-threads=1`.
static GPU: Mutex<()> = Mutex::new(());

/// The CPU reference device and CUDA device 0.
pub struct Pair {
    pub cpu: Device,
    pub gpu: Device,
    _lock: std::sync::MutexGuard<'static, ()>,
}

/// Both devices, or `None` (after one line saying why) when there is no CUDA device.
pub fn pair(test: &str) -> Option<Pair> {
    let lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    // Every optional kernel in use, whatever the default leaves out: the fused kernels'
    // tests launch them directly.
    let gpu = match strata_backend_cuda::device_with_every_kernel(0) {
        Ok(d) => d,
        Err(e @ (Error::NoDriver { .. } | Error::NoSuchDevice { .. })) => {
            eprintln!("{test}: skipped, no CUDA device here ({e})");
            return None;
        }
        Err(e) => panic!("a CUDA device is present but could not be opened: {e}"),
    };
    let cpu = strata_backend_cpu::device(Default::default()).expect("cpu device");
    Some(Pair {
        cpu,
        gpu,
        _lock: lock,
    })
}

/// The launch shape crates/model/src/ops.rs gives an op over `items` work items.
pub fn ops_cfg(items: usize) -> LaunchCfg {
    LaunchCfg::linear(items, 256)
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

pub fn upload<T: bytemuck::Pod>(dev: &Device, data: &[T]) -> DeviceBuffer<T> {
    dev.alloc_from(data, dev.main_stream()).expect("upload")
}

pub fn download<T: bytemuck::Pod>(dev: &Device, buf: &DeviceBuffer<T>) -> Vec<T> {
    dev.download(buf, dev.main_stream())
        .expect("download")
        .wait()
        .expect("kernel result")
}

#[track_caller]
pub fn launch(dev: &Device, kernel: KernelId, cfg: &LaunchCfg, args: &Args<'_>) {
    dev.launch(kernel, cfg, args, dev.main_stream())
        .expect("launch");
}

/// Comparisons of one test, printed as they are made and asserted at the end.
#[derive(Default)]
pub struct Report {
    failures: Vec<String>,
}

impl Report {
    /// `gpu` against `cpu` element by element: |Δ| / scale(i) must be at most `tol`, and
    /// the GPU value finite where the CPU's is. Prints the largest ratio and |Δ|.
    pub fn close(
        &mut self,
        what: &str,
        gpu: &[f32],
        cpu: &[f32],
        tol: f64,
        scale: impl Fn(usize) -> f64,
    ) {
        let mut worst = (0.0f64, 0.0f64, 0usize);
        let mut bad = None;
        if gpu.len() != cpu.len() {
            bad = Some(format!("length {} vs {}", gpu.len(), cpu.len()));
        }
        for (i, (&g, &c)) in gpu.iter().zip(cpu).enumerate() {
            let d = (f64::from(g) - f64::from(c)).abs();
            let r = d / scale(i).max(f64::MIN_POSITIVE);
            if g.is_finite() != c.is_finite() || r.is_nan() {
                bad.get_or_insert_with(|| format!("element {i}: gpu {g}, cpu {c}"));
                continue;
            }
            if r > worst.0 {
                worst = (r, d, i);
            }
        }
        if worst.0 > tol {
            let i = worst.2;
            bad.get_or_insert_with(|| {
                format!(
                    "element {i}: gpu {}, cpu {} (|Δ|/scale {:.3e} > {tol:.1e})",
                    gpu[i], cpu[i], worst.0
                )
            });
        }
        println!(
            "{what}: max |Δ|/scale {:.3e} (|Δ| {:.3e}), tolerance {tol:.1e}{}",
            worst.0,
            worst.1,
            if bad.is_some() { "  FAILED" } else { "" }
        );
        if let Some(b) = bad {
            self.failures.push(format!("{what}: {b}"));
        }
    }

    /// Bit-for-bit equality.
    pub fn exact<T: bytemuck::Pod + PartialEq + std::fmt::Debug>(
        &mut self,
        what: &str,
        gpu: &[T],
        cpu: &[T],
    ) {
        let first = gpu
            .iter()
            .zip(cpu)
            .position(|(g, c)| bytemuck::bytes_of(g) != bytemuck::bytes_of(c));
        let differ = gpu.iter().zip(cpu).filter(|(g, c)| g != c).count();
        match (gpu.len() == cpu.len(), first) {
            (true, None) => println!("{what}: bit-exact ({} values)", gpu.len()),
            (_, Some(i)) => {
                println!("{what}: {differ} of {} values differ  FAILED", gpu.len());
                self.failures.push(format!(
                    "{what}: element {i}: gpu {:?}, cpu {:?}",
                    gpu[i], cpu[i]
                ));
            }
            (false, None) => {
                self.failures
                    .push(format!("{what}: length {} vs {}", gpu.len(), cpu.len()))
            }
        }
    }

    pub fn fail(&mut self, what: String) {
        println!("{what}  FAILED");
        self.failures.push(what);
    }

    /// Panics listing every failure.
    pub fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} comparison(s) failed:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

#[test]
fn elementwise_ops_match_the_cpu() {
    let Some(p) = pair("elementwise_ops_match_the_cpu") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(1);
    for n in [1usize, 7, 100_003] {
        let (a, b) = (rng.vec(n, 4.0), rng.vec(n, 4.0));
        for (kernel, name) in [(KernelId::Add, "add"), (KernelId::Swiglu, "swiglu")] {
            let run = |d: &Device| {
                let (ba, bb, by) = (upload(d, &a), upload(d, &b), d.alloc::<f32>(n).unwrap());
                let args = Args::new().read(&ba).read(&bb).write(&by).u32(n as u32);
                launch(d, kernel, &ops_cfg(n), &args);
                download(d, &by)
            };
            let (c, g) = (run(&p.cpu), run(&p.gpu));
            if kernel == KernelId::Add {
                rep.exact(&format!("add n={n}"), &g, &c);
            } else {
                rep.close(&format!("{name} n={n}"), &g, &c, 1e-6, |i| {
                    f64::from(c[i].abs()).max(1e-6)
                });
            }
        }
    }
    for (rows, dim) in [(3usize, 5usize), (300, 576)] {
        let (x, b, gate) = (
            rng.vec(rows * dim, 2.0),
            rng.vec(dim, 2.0),
            rng.vec(rows, 3.0),
        );
        let y0 = rng.vec(rows * dim, 2.0);
        let run_add_rows = |d: &Device| {
            let (bx, bb) = (upload(d, &x), upload(d, &b));
            let args = Args::new()
                .read_write(&bx)
                .read(&bb)
                .u32(rows as u32)
                .u32(dim as u32);
            launch(d, KernelId::AddRows, &ops_cfg(rows * dim), &args);
            download(d, &bx)
        };
        rep.exact(
            &format!("add_rows {rows}x{dim}"),
            &run_add_rows(&p.gpu),
            &run_add_rows(&p.cpu),
        );
        let run_gate = |d: &Device| {
            let (bx, bg, by) = (upload(d, &x), upload(d, &gate), upload(d, &y0));
            let args = Args::new()
                .read(&bx)
                .read(&bg)
                .read_write(&by)
                .u32(rows as u32)
                .u32(dim as u32);
            launch(d, KernelId::SigmoidGateAdd, &ops_cfg(rows * dim), &args);
            download(d, &by)
        };
        let (c, g) = (run_gate(&p.cpu), run_gate(&p.gpu));
        rep.close(
            &format!("sigmoid_gate_add {rows}x{dim}"),
            &g,
            &c,
            1e-6,
            |i| f64::from(c[i].abs()).max(1e-6),
        );
    }
    for (n_tokens, n_used, m) in [(1usize, 1usize, 7usize), (5, 8, 576), (33, 2, 300)] {
        let y = rng.vec(n_tokens * n_used * m, 3.0);
        let w = rng.vec(n_tokens * n_used, 1.0);
        let run = |d: &Device| {
            let (by, bw, bo) = (
                upload(d, &y),
                upload(d, &w),
                d.alloc::<f32>(n_tokens * m).unwrap(),
            );
            let args = Args::new()
                .read(&by)
                .read(&bw)
                .write(&bo)
                .u32(n_tokens as u32)
                .u32(n_used as u32)
                .u32(m as u32);
            launch(d, KernelId::MoeCombine, &ops_cfg(n_tokens * m), &args);
            download(d, &bo)
        };
        rep.exact(
            &format!("moe_combine {n_tokens}x{n_used}x{m}"),
            &run(&p.gpu),
            &run(&p.cpu),
        );
    }
    rep.finish();
}

#[test]
fn rms_norm_matches_the_cpu() {
    let Some(p) = pair("rms_norm_matches_the_cpu") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(2);
    // Rows of the hidden state, per-head Q/K norm rows, odd sizes.
    for (rows, dim, eps) in [
        (1usize, 576usize, 1e-5f32),
        (7, 4096, 1e-6),
        (120, 64, 1e-6),
        (3, 100, 1e-5),
        (2, 13, 1e-3),
    ] {
        let x = rng.vec(rows * dim, 3.0);
        let w = rng.vec(dim, 1.5);
        let run = |d: &Device| {
            let (bx, bw, by) = (
                upload(d, &x),
                upload(d, &w),
                d.alloc::<f32>(rows * dim).unwrap(),
            );
            let args = Args::new()
                .read(&bx)
                .read(&bw)
                .write(&by)
                .u32(rows as u32)
                .u32(dim as u32)
                .f32(eps);
            launch(d, KernelId::RmsNorm, &ops_cfg(rows * dim), &args);
            download(d, &by)
        };
        let (c, g) = (run(&p.cpu), run(&p.gpu));
        rep.close(&format!("rms_norm {rows}x{dim}"), &g, &c, 1e-6, |i| {
            f64::from(c[i].abs()).max(1e-6)
        });
    }
    rep.finish();
}

/// One rope configuration: (mode, n_rot, freq_scale, ext_factor, attn_factor).
type RopeCase = (u32, usize, f32, f32, f32);

#[test]
fn rope_matches_the_cpu() {
    let Some(p) = pair("rope_matches_the_cpu") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(3);
    let (n_tokens, n_heads, head_dim) = (6usize, 4usize, 64usize);
    let cases: [RopeCase; 5] = [
        (0, 64, 1.0, 0.0, 1.0),  // normal, full rotation
        (2, 64, 1.0, 0.0, 1.0),  // neox
        (2, 32, 1.0, 0.0, 1.0),  // neox, partial rotation
        (0, 48, 0.25, 1.0, 1.0), // YaRN: interpolation with ramp and magnitude scale
        (2, 64, 0.5, 0.5, 0.9),
    ];
    let pos: Vec<i32> = vec![0, 1, 17, 511, 4095, 30_000];
    for (mode, n_rot, freq_scale, ext_factor, attn_factor) in cases {
        let x = rng.vec(n_tokens * n_heads * head_dim, 2.0);
        let run = |d: &Device| {
            let (bx, bp) = (upload(d, &x), upload(d, &pos));
            let args = Args::new()
                .read_write(&bx)
                .read(&bp)
                .u32(n_tokens as u32)
                .u32(n_heads as u32)
                .u32(head_dim as u32)
                .u32(n_rot as u32)
                .u32(mode)
                .f32(10_000.0)
                .f32(freq_scale)
                .f32(ext_factor)
                .f32(attn_factor)
                .f32(32.0)
                .f32(1.0)
                .u32(4096);
            launch(
                d,
                KernelId::Rope,
                &ops_cfg(n_tokens * n_heads * head_dim),
                &args,
            );
            download(d, &bx)
        };
        let (c, g) = (run(&p.cpu), run(&p.gpu));
        // Angles up to 30,000 rad: cos/sin of the same f32 angle may round differently.
        rep.close(
            &format!("rope mode {mode} n_rot {n_rot} freq_scale {freq_scale} ext {ext_factor}"),
            &g,
            &c,
            1e-5,
            |_| 2.0,
        );
    }
    rep.finish();
}

#[test]
fn kv_store_matches_the_cpu() {
    let Some(p) = pair("kv_store_matches_the_cpu") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(4);
    let (kv_dim, pos0, n_tokens, ctx) = (256usize, 13usize, 9usize, 32usize);
    let mut k = rng.vec(n_tokens * kv_dim, 70_000.0); // beyond f16's range too
    let v = rng.vec(n_tokens * kv_dim, 1e-4); // and into its subnormals
    k[0] = 65_519.0; // the largest value that rounds down to f16::MAX
    k[1] = 65_520.0; // the smallest that rounds to infinity
    let run = |d: &Device| {
        let (bk, bv) = (upload(d, &k), upload(d, &v));
        let (kc, vc) = (
            upload(d, &vec![0x1234u16; ctx * kv_dim]),
            upload(d, &vec![0x4321u16; ctx * kv_dim]),
        );
        // Positions out of order: the buffer, not the row index, places each row.
        let positions: Vec<i32> = (0..n_tokens as i32)
            .rev()
            .map(|t| pos0 as i32 + 2 * t)
            .collect();
        let pos = upload(d, &positions);
        let args = Args::new()
            .read(&bk)
            .read(&bv)
            .read(&pos)
            .write(&kc)
            .write(&vc)
            .u32(kv_dim as u32)
            .u32(n_tokens as u32)
            .u32(ctx as u32);
        launch(d, KernelId::KvStore, &ops_cfg(n_tokens * kv_dim), &args);
        (download(d, &kc), download(d, &vc))
    };
    let (c, g) = (run(&p.cpu), run(&p.gpu));
    rep.exact("kv_store k_cache", &g.0, &c.0);
    rep.exact("kv_store v_cache", &g.1, &c.1);
    rep.finish();
}

#[test]
fn router_topk_matches_the_cpu() {
    let Some(p) = pair("router_topk_matches_the_cpu") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(5);
    for (n_tokens, n_expert, k, norm, ties) in [
        (1usize, 8usize, 2usize, true, false),
        (7, 60, 4, false, false),
        (33, 128, 8, true, false),
        (5, 512, 10, true, false),
        (9, 64, 6, true, true), // logits on a coarse grid: many exact ties
        (3, 16, 16, false, true),
    ] {
        let logits: Vec<f32> = (0..n_tokens * n_expert)
            .map(|_| {
                if ties {
                    rng.below(5) as f32 * 0.5
                } else {
                    rng.f32() * 6.0
                }
            })
            .collect();
        let run = |d: &Device| {
            let bl = upload(d, &logits);
            let (bi, bw) = (
                d.alloc::<i32>(n_tokens * k).unwrap(),
                d.alloc::<f32>(n_tokens * k).unwrap(),
            );
            let args = Args::new()
                .read(&bl)
                .write(&bi)
                .write(&bw)
                .u32(n_tokens as u32)
                .u32(n_expert as u32)
                .u32(k as u32)
                .u32(norm as u32);
            launch(d, KernelId::RouterTopk, &ops_cfg(n_tokens), &args);
            (download(d, &bi), download(d, &bw))
        };
        let (c, g) = (run(&p.cpu), run(&p.gpu));
        let what = format!("router_topk {n_tokens}x{n_expert} k={k} norm={norm} ties={ties}");
        rep.exact(&format!("{what} ids"), &g.0, &c.0);
        rep.close(&format!("{what} weights"), &g.1, &c.1, 1e-6, |i| {
            f64::from(c.1[i].abs()).max(1e-7)
        });
    }
    rep.finish();
}
