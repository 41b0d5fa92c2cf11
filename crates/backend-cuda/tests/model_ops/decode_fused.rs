//! The decode step's merged launches (module `fused`, kernels-cuda/fused.cu: mul_mat_qkv,
//! mul_mat_qkv_rope, router_matvec_topk, mul_mat_add_rms_norm, experts_down_norm) against
//! the launches they replace, on the GPU, bit for bit: the same rows (matvec.cuh's units),
//! the same top-k (router.cuh), the same norms (rownorm.cuh with the same block size), the
//! same per-head norm and rope (qkv_heads.cuh's qkr_head). Those launches are
//! checked against the CPU backend by the other model_ops tests.

use strata_core::{Args, Device, DeviceBuffer, KernelId, LaunchCfg};
use strata_quant::QuantType;

use super::matmul::random_weights;
use super::{Report, Rng, download, launch, pair, upload};

/// ops.rs's one-token shape for a quantised product: 128-thread blocks of 8 rows.
fn mv_cfg(m: usize, n: usize) -> LaunchCfg {
    LaunchCfg::linear(m.div_ceil(8) * n * 128, 128)
}

fn mul_mat(
    d: &Device,
    w: &DeviceBuffer<u8>,
    ty: QuantType,
    x: &DeviceBuffer<f32>,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let y = d.alloc::<f32>(n * m).unwrap();
    let args = Args::new()
        .read(w)
        .read(x)
        .write(&y)
        .u32(ty.id())
        .u32(m as u32)
        .u32(k as u32)
        .u32(n as u32);
    launch(d, KernelId::MulMat, &mv_cfg(m, n), &args);
    download(d, &y)
}

#[test]
fn mul_mat_qkv_matches_three_mul_mats() {
    let Some(p) = pair("mul_mat_qkv_matches_three_mul_mats") else {
        return;
    };
    let d = &p.gpu;
    let mut rep = Report::default();
    let mut rng = Rng::new(61);
    let (k, mq, mkv) = (2048usize, 512usize, 64usize);
    use QuantType as T;
    // The last two mix activation formats (Q8_K, Q8_0, Q8_1, none) in one launch.
    let cases = [
        ([T::Q4_K, T::Q4_K, T::Q4_K], 1usize),
        ([T::Q4_K, T::Q4_K, T::Q6_K], 2),
        ([T::Q8_0, T::Q4_K, T::Q4_1], 1),
        ([T::IQ2_XS, T::F16, T::Q4_0], 1),
    ];
    for (types, n) in cases {
        let ms = [mq, mkv, mkv];
        let ws: Vec<_> = types
            .iter()
            .zip(ms)
            .map(|(&ty, m)| upload(d, &random_weights(ty, m, k, &mut rng)))
            .collect();
        let bx = upload(d, &rng.vec(n * k, 2.0));
        let seq: Vec<Vec<f32>> = (0..3)
            .map(|i| mul_mat(d, &ws[i], types[i], &bx, ms[i], k, n))
            .collect();
        let ys: Vec<_> = ms.iter().map(|&m| d.alloc::<f32>(n * m).unwrap()).collect();
        let args = Args::new()
            .read(&ws[0])
            .read(&ws[1])
            .read(&ws[2])
            .read(&bx)
            .write(&ys[0])
            .write(&ys[1])
            .write(&ys[2])
            .u32(types[0].id())
            .u32(types[1].id())
            .u32(types[2].id())
            .u32(mq as u32)
            .u32(mkv as u32)
            .u32(mkv as u32)
            .u32(k as u32)
            .u32(n as u32);
        let units: usize = ms.iter().map(|m| m.div_ceil(8)).sum();
        launch(
            d,
            KernelId::MulMatQkv,
            &LaunchCfg::linear(units * n * 128, 128),
            &args,
        );
        for (i, name) in ["q", "k", "v"].iter().enumerate() {
            rep.exact(
                &format!("mul_mat_qkv {types:?} n={n}: {name} vs mul_mat"),
                &download(d, &ys[i]),
                &seq[i],
            );
        }
    }
    rep.finish();
}

#[test]
fn router_matvec_topk_matches_mul_mat_and_router_topk() {
    let Some(p) = pair("router_matvec_topk_matches_mul_mat_and_router_topk") else {
        return;
    };
    let d = &p.gpu;
    let mut rep = Report::default();
    let mut rng = Rng::new(62);
    let k = 2048usize;
    // (type, experts, tokens, top k, normalised); float routers launch one-warp blocks of
    // 2 rows as ops.rs does, quantised ones mul_mat_vec's blocks.
    let cases = [
        (QuantType::F32, 128usize, 1usize, 8usize, true),
        (QuantType::F32, 60, 3, 4, false),
        (QuantType::Q8_0, 128, 1, 8, true),
    ];
    for (ty, ne, n, top, norm) in cases {
        let bw = upload(d, &random_weights(ty, ne, k, &mut rng));
        let bx = upload(d, &rng.vec(n * k, 2.0));
        let logits = mul_mat(d, &bw, ty, &bx, ne, k, n);
        let bl = upload(d, &logits);
        let (ids, ws) = (
            d.alloc::<i32>(n * top).unwrap(),
            d.alloc::<f32>(n * top).unwrap(),
        );
        let args = Args::new()
            .read(&bl)
            .write(&ids)
            .write(&ws)
            .u32(n as u32)
            .u32(ne as u32)
            .u32(top as u32)
            .u32(norm as u32);
        launch(
            d,
            KernelId::RouterTopk,
            &LaunchCfg::linear(n * 32, 256),
            &args,
        );
        let (ids0, ws0) = (download(d, &ids), download(d, &ws));
        let cfg = if ty == QuantType::F32 {
            LaunchCfg::linear(ne.div_ceil(2) * n * 32, 32)
        } else {
            mv_cfg(ne, n)
        };
        let done = upload(d, &[0u32]);
        // Twice: the first launch's last block must leave the counter at 0.
        for rep_i in 0..2 {
            let l = d.alloc::<f32>(n * ne).unwrap();
            let (i1, w1) = (
                d.alloc::<i32>(n * top).unwrap(),
                d.alloc::<f32>(n * top).unwrap(),
            );
            let args = Args::new()
                .read(&bw)
                .read(&bx)
                .write(&l)
                .write(&i1)
                .write(&w1)
                .read_write(&done)
                .u32(ty.id())
                .u32(ne as u32)
                .u32(k as u32)
                .u32(n as u32)
                .u32(top as u32)
                .u32(norm as u32);
            launch(d, KernelId::RouterMatvecTopk, &cfg, &args);
            let what =
                format!("router_matvec_topk {ty:?} {ne} experts n={n} top {top} launch {rep_i}");
            rep.exact(&format!("{what}: logits"), &download(d, &l), &logits);
            rep.exact(&format!("{what}: ids"), &download(d, &i1), &ids0);
            rep.exact(&format!("{what}: weights"), &download(d, &w1), &ws0);
            rep.exact(&format!("{what}: counter"), &download(d, &done), &[0u32]);
        }
    }
    rep.finish();
}

/// ops.rs's block_per_row threads for a row of `dim`, which ops_decode.rs also gives the
/// products that end in a norm.
fn norm_threads(dim: usize) -> usize {
    dim.div_ceil(8).next_multiple_of(32).clamp(32, 256)
}

/// qk_norm_rope_store's scalars after n_ctx (qwen3's per-head norms and NeoX rope, a base
/// of 1e6), as ops.rs passes them.
fn qkr_tail(a: Args<'_>, hd: usize) -> Args<'_> {
    a.u32(1)
        .f32(1e-6)
        .u32(hd as u32)
        .u32(2)
        .f32(1e6)
        .f32(1.0)
        .f32(0.0)
        .f32(1.0)
        .f32(32.0)
        .f32(1.0)
        .u32(4096)
}

/// Blocks of `threads` over `m` rows (2 rows a warp, up to 8 warps) times `units`.
fn norm_product_cfg(m: usize, units: usize, threads: usize) -> LaunchCfg {
    let rows = (threads / 32).min(8) * 2;
    LaunchCfg::linear(m.div_ceil(rows) * units * threads, threads as u32)
}

#[test]
fn products_ending_in_a_norm_match_their_sequences() {
    let Some(p) = pair("products_ending_in_a_norm_match_their_sequences") else {
        return;
    };
    let d = &p.gpu;
    let mut rep = Report::default();
    let mut rng = Rng::new(63);
    let eps = 1e-6f32;
    let norm_cfg = |rows: usize, dim: usize| {
        let t = norm_threads(dim);
        LaunchCfg::linear(rows * t, t as u32)
    };
    // mul_mat_add_rms_norm = mul_mat, add_rms_norm (the attention output projection).
    for (ty, m, k, n) in [
        (QuantType::Q4_K, 2048usize, 1024usize, 1usize),
        (QuantType::Q8_0, 576, 256, 2),
    ] {
        let bw = upload(d, &random_weights(ty, m, k, &mut rng));
        let bx = upload(d, &rng.vec(n * k, 2.0));
        let (ba, bn) = (upload(d, &rng.vec(n * m, 3.0)), upload(d, &rng.vec(m, 1.5)));
        let y0 = mul_mat(d, &bw, ty, &bx, m, k, n);
        let by0 = upload(d, &y0);
        let (sum, y) = (
            d.alloc::<f32>(n * m).unwrap(),
            d.alloc::<f32>(n * m).unwrap(),
        );
        let args = Args::new()
            .read(&ba)
            .read(&by0)
            .write(&sum)
            .read(&bn)
            .write(&y)
            .u32(n as u32)
            .u32(m as u32)
            .f32(eps);
        launch(d, KernelId::AddRmsNorm, &norm_cfg(n, m), &args);
        let (sum0, out0) = (download(d, &sum), download(d, &y));
        let done = upload(d, &[0u32]);
        for launch_i in 0..2 {
            let outs: Vec<_> = (0..3).map(|_| d.alloc::<f32>(n * m).unwrap()).collect();
            let args = Args::new()
                .read(&bw)
                .read(&bx)
                .write(&outs[0])
                .read(&ba)
                .write(&outs[1])
                .read(&bn)
                .write(&outs[2])
                .read_write(&done)
                .u32(ty.id())
                .u32(m as u32)
                .u32(k as u32)
                .u32(n as u32)
                .f32(eps);
            launch(
                d,
                KernelId::MulMatAddRmsNorm,
                &norm_product_cfg(m, n, norm_threads(m)),
                &args,
            );
            let what = format!("mul_mat_add_rms_norm {ty:?} {m}x{k} n={n} launch {launch_i}");
            rep.exact(&format!("{what}: product"), &download(d, &outs[0]), &y0);
            rep.exact(&format!("{what}: sum"), &download(d, &outs[1]), &sum0);
            rep.exact(&format!("{what}: norm"), &download(d, &outs[2]), &out0);
            rep.exact(&format!("{what}: counter"), &download(d, &done), &[0u32]);
        }
    }
    // experts_down_norm = mul_mat_experts (x per slot), combine_add_rms_norm.
    for (ty, m, k, n_tokens, n_used) in [
        (QuantType::Q4_K, 2048usize, 768usize, 1usize, 8usize),
        (QuantType::Q6_K, 1024, 256, 2, 4),
    ] {
        let n_expert = 16usize;
        let expert_bytes = ty.row_bytes(k).unwrap() * m + 32;
        let mut w = Vec::new();
        for _ in 0..n_expert {
            w.extend(random_weights(ty, m, k, &mut rng));
            w.extend(std::iter::repeat_n(0xEEu8, 32));
        }
        let slots = n_tokens * n_used;
        let ids: Vec<i32> = (0..slots).map(|_| rng.below(n_expert) as i32).collect();
        let (bw, bi) = (upload(d, &w), upload(d, &ids));
        let bx = upload(d, &rng.vec(slots * k, 2.0));
        let (bws, bres, bn) = (
            upload(d, &rng.vec(slots, 1.0)),
            upload(d, &rng.vec(n_tokens * m, 3.0)),
            upload(d, &rng.vec(m, 1.5)),
        );
        let ys = d.alloc::<f32>(slots * m).unwrap();
        let args = Args::new()
            .read(&bw)
            .read(&bx)
            .read(&bi)
            .write(&ys)
            .u32(ty.id())
            .u32(m as u32)
            .u32(k as u32)
            .u32(n_tokens as u32)
            .u32(n_used as u32)
            .u32(1)
            .u64(expert_bytes as u64);
        launch(d, KernelId::MulMatExperts, &mv_cfg(m, slots), &args);
        let (sum, y) = (
            d.alloc::<f32>(n_tokens * m).unwrap(),
            d.alloc::<f32>(n_tokens * m).unwrap(),
        );
        let args = Args::new()
            .read(&ys)
            .read(&bws)
            .read(&bres)
            .write(&sum)
            .read(&bn)
            .write(&y)
            .u32(n_tokens as u32)
            .u32(n_used as u32)
            .u32(m as u32)
            .f32(eps);
        launch(
            d,
            KernelId::CombineAddRmsNorm,
            &norm_cfg(n_tokens, m),
            &args,
        );
        let (ys0, sum0, out0) = (download(d, &ys), download(d, &sum), download(d, &y));
        let done = upload(d, &[0u32]);
        for launch_i in 0..2 {
            let ys1 = d.alloc::<f32>(slots * m).unwrap();
            let (s1, y1) = (
                d.alloc::<f32>(n_tokens * m).unwrap(),
                d.alloc::<f32>(n_tokens * m).unwrap(),
            );
            let args = Args::new()
                .read(&bw)
                .read(&bx)
                .read(&bi)
                .write(&ys1)
                .read(&bws)
                .read(&bres)
                .write(&s1)
                .read(&bn)
                .write(&y1)
                .read_write(&done)
                .u32(ty.id())
                .u32(m as u32)
                .u32(k as u32)
                .u32(n_tokens as u32)
                .u32(n_used as u32)
                .u64(expert_bytes as u64)
                .f32(eps);
            let cfg = norm_product_cfg(m, slots, norm_threads(m));
            launch(d, KernelId::ExpertsDownNorm, &cfg, &args);
            let what = format!(
                "experts_down_norm {ty:?} {m}x{k} tokens {n_tokens} slots {n_used} launch {launch_i}"
            );
            rep.exact(&format!("{what}: slots"), &download(d, &ys1), &ys0);
            rep.exact(&format!("{what}: sum"), &download(d, &s1), &sum0);
            rep.exact(&format!("{what}: norm"), &download(d, &y1), &out0);
            rep.exact(&format!("{what}: counter"), &download(d, &done), &[0u32]);
        }
    }
    rep.finish();
}

/// The buffers one mul_mat_qkv_rope launch (or its sequence) writes: q, k, v, the rotated
/// queries and both caches.
struct QkvRopeOut {
    q: DeviceBuffer<f32>,
    k: DeviceBuffer<f32>,
    v: DeviceBuffer<f32>,
    q_out: DeviceBuffer<f32>,
    k_cache: DeviceBuffer<u16>,
    v_cache: DeviceBuffer<u16>,
}

impl QkvRopeOut {
    /// Fresh outputs for `n` tokens of Q rows `mq` and K/V rows `mkv`, caches of `ctx` rows
    /// of 1.0 (so rows a launch must not write stay visible).
    fn new(d: &Device, n: usize, mq: usize, mkv: usize, ctx: usize) -> Self {
        let alloc = |len: usize| d.alloc::<f32>(len).unwrap();
        let cache = || upload(d, &vec![0x3C00u16; ctx * mkv]);
        QkvRopeOut {
            q: alloc(n * mq),
            k: alloc(n * mkv),
            v: alloc(n * mkv),
            q_out: alloc(n * mq),
            k_cache: cache(),
            v_cache: cache(),
        }
    }

    /// The arguments both mul_mat_qkv and mul_mat_qkv_rope open with: the three weight
    /// matrices, the activation rows, then q, k and v.
    fn qkv_args<'a>(&'a self, ws: &'a [DeviceBuffer<u8>], x: &'a DeviceBuffer<f32>) -> Args<'a> {
        let args = ws.iter().fold(Args::new(), |a, w| a.read(w));
        args.read(x).write(&self.q).write(&self.k).write(&self.v)
    }

    /// Everything it holds, f16 cache rows as their bits in f32s (compared exactly).
    fn download(&self, d: &Device) -> [Vec<f32>; 6] {
        let bits = |b: &DeviceBuffer<u16>| download(d, b).iter().map(|&h| h as f32).collect();
        [
            download(d, &self.q),
            download(d, &self.k),
            download(d, &self.v),
            download(d, &self.q_out),
            bits(&self.k_cache),
            bits(&self.v_cache),
        ]
    }
}

/// The three weight formats (Q, K, V) of a launch whose matrices share one.
fn three_types(a: Args<'_>, ty: QuantType) -> Args<'_> {
    a.u32(ty.id()).u32(ty.id()).u32(ty.id())
}

#[test]
fn mul_mat_qkv_rope_matches_qkv_and_qk_norm_rope_store() {
    let Some(p) = pair("mul_mat_qkv_rope_matches_qkv_and_qk_norm_rope_store") else {
        return;
    };
    let d = &p.gpu;
    let mut rep = Report::default();
    let mut rng = Rng::new(64);
    let (n_head, n_kv, hd, k, ctx) = (32usize, 4usize, 128usize, 2048usize, 32usize);
    let (mq, mkv, heads) = (n_head * hd, n_kv * hd, n_head + 2 * n_kv);
    let ty = QuantType::Q4_K;
    let ws: Vec<_> = [mq, mkv, mkv]
        .iter()
        .map(|&m| upload(d, &random_weights(ty, m, k, &mut rng)))
        .collect();
    let (qn, kn) = (upload(d, &rng.vec(hd, 1.5)), upload(d, &rng.vec(hd, 1.5)));
    // The fused launch of `n` rows of x at positions pos (a decode step for 1; the
    // kernel's per-token units, a (token, head) ticket each, for more).
    let fused =
        |x: &DeviceBuffer<f32>, pos: &DeviceBuffer<i32>, n: usize, done: &DeviceBuffer<u32>| {
            let o = QkvRopeOut::new(d, n, mq, mkv, ctx);
            let args = o
                .qkv_args(&ws, x)
                .read(&qn)
                .read(&kn)
                .read(pos)
                .write(&o.q_out)
                .write(&o.k_cache)
                .write(&o.v_cache)
                .read_write(done);
            let args = three_types(args, ty)
                .u32(k as u32)
                .u32(n as u32)
                .u32(n_head as u32)
                .u32(n_kv as u32)
                .u32(hd as u32)
                .u32(ctx as u32);
            let cfg = LaunchCfg::linear((mq + 2 * mkv) / 8 * n * 128, 128);
            launch(d, KernelId::MulMatQkvRope, &cfg, &qkr_tail(args, hd));
            o.download(d)
        };
    let names = ["q", "k", "v", "rotated q", "K cache", "V cache"];
    // A decode step and batches of 2..=8 tokens (positions up to 19 of the 32 rows).
    for n in [1usize, 2, 3, 5, 8] {
        let bx = upload(d, &rng.vec(n * k, 2.0));
        let at: Vec<i32> = (0..n as i32).map(|t| 5 + 2 * t).collect();
        let pos = upload(d, &at);
        // The sequence: mul_mat_qkv, qk_norm_rope_store.
        let want = QkvRopeOut::new(d, n, mq, mkv, ctx);
        let args = three_types(want.qkv_args(&ws, &bx), ty)
            .u32(mq as u32)
            .u32(mkv as u32)
            .u32(mkv as u32)
            .u32(k as u32)
            .u32(n as u32);
        let units = (mq + 2 * mkv) / 8;
        let cfg = LaunchCfg::linear(units * n * 128, 128);
        launch(d, KernelId::MulMatQkv, &cfg, &args);
        let args = Args::new()
            .read(&want.q)
            .read(&want.k)
            .read(&want.v)
            .read(&qn)
            .read(&kn)
            .read(&pos)
            .write(&want.q_out)
            .write(&want.k_cache)
            .write(&want.v_cache)
            .u32(n as u32)
            .u32(n_head as u32)
            .u32(n_kv as u32)
            .u32(hd as u32)
            .u32(ctx as u32);
        let cfg = LaunchCfg::linear(n * heads * 32, 256);
        launch(d, KernelId::QkNormRopeStore, &cfg, &qkr_tail(args, hd));
        let want = want.download(d);
        let done = upload(d, &vec![0u32; n * heads]);
        // Twice: the counters must come back to 0 for the next launch.
        let mut window: [Vec<f32>; 6] = Default::default();
        for launch_i in 0..2 {
            let got = fused(&bx, &pos, n, &done);
            let what = format!("mul_mat_qkv_rope {ty:?} n={n} launch {launch_i}");
            for ((name, g), w) in names.iter().zip(&got).zip(&want) {
                rep.exact(&format!("{what}: {name}"), g, w);
            }
            rep.exact(
                &format!("{what}: counters"),
                &download(d, &done),
                &vec![0u32; n * heads],
            );
            window = got;
        }
        if n == 1 {
            continue;
        }
        // Each token alone, as a decode step: the same rotated query and the same cache row.
        let xs = download(d, &bx);
        for t in 0..n {
            let x1 = upload(d, &xs[t * k..(t + 1) * k]);
            let step = fused(&x1, &upload(d, &at[t..t + 1]), 1, &done);
            let what = format!("mul_mat_qkv_rope {ty:?} n={n} token {t} alone");
            rep.exact(
                &format!("{what}: rotated q"),
                &step[3],
                &window[3][t * mq..(t + 1) * mq],
            );
            let row = at[t] as usize * mkv..(at[t] as usize + 1) * mkv;
            for c in [4, 5] {
                rep.exact(
                    &format!("{what}: {}", names[c]),
                    &step[c][row.clone()],
                    &window[c][row.clone()],
                );
            }
        }
    }
    rep.finish();
}
