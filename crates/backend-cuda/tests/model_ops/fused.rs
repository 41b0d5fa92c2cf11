//! The fused forms (module `fused`, kernels-cuda/fused.cu) against the op sequences they
//! replace: on the GPU bit for bit (same f32 operations, the launch shapes of
//! crates/model/src/ops.rs), and against the CPU backend's sequence within the tolerances
//! of the ops they are made of. The CPU backend has no fused forms (it runs the sequences).

use strata_core::{Args, Device, DeviceBuffer, KernelId, LaunchCfg};
use strata_quant::QuantType;

use super::matmul::random_weights;
use super::{Report, Rng, download, launch, ops_cfg, pair, upload};

/// ops.rs's block_per_row: one block per row, about 8 values a thread.
fn per_row(rows: usize, dim: usize) -> LaunchCfg {
    let threads = dim.div_ceil(8).next_multiple_of(32).clamp(32, 256);
    LaunchCfg::linear(rows * threads, threads as u32)
}

fn rms_norm(
    d: &Device,
    x: &DeviceBuffer<f32>,
    w: &DeviceBuffer<f32>,
    y: &DeviceBuffer<f32>,
    rows: usize,
    dim: usize,
) {
    let args = Args::new()
        .read(x)
        .read(w)
        .write(y)
        .u32(rows as u32)
        .u32(dim as u32)
        .f32(1e-6);
    launch(d, KernelId::RmsNorm, &per_row(rows, dim), &args);
}

fn add(d: &Device, a: &DeviceBuffer<f32>, b: &DeviceBuffer<f32>, y: &DeviceBuffer<f32>, n: usize) {
    let args = Args::new().read(a).read(b).write(y).u32(n as u32);
    launch(d, KernelId::Add, &ops_cfg(n), &args);
}

#[test]
fn add_and_combine_norms_match_their_sequences() {
    let Some(p) = pair("add_and_combine_norms_match_their_sequences") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(21);
    let (rows, dim, used) = (3usize, 2048usize, 8usize);
    let (a, b, w) = (
        rng.vec(rows * dim, 3.0),
        rng.vec(rows * dim, 3.0),
        rng.vec(dim, 1.5),
    );
    let (ys, ws) = (rng.vec(rows * used * dim, 2.0), rng.vec(rows * used, 1.0));
    // The sequences: add + rms_norm, moe_combine + add + rms_norm.
    let sequence = |d: &Device| {
        let (ba, bb, bw) = (upload(d, &a), upload(d, &b), upload(d, &w));
        let (bys, bws) = (upload(d, &ys), upload(d, &ws));
        let sum = d.alloc::<f32>(rows * dim).unwrap();
        let y = d.alloc::<f32>(rows * dim).unwrap();
        add(d, &ba, &bb, &sum, rows * dim);
        rms_norm(d, &sum, &bw, &y, rows, dim);
        let first = (download(d, &sum), download(d, &y));
        let comb = d.alloc::<f32>(rows * dim).unwrap();
        let args = Args::new()
            .read(&bys)
            .read(&bws)
            .write(&comb)
            .u32(rows as u32)
            .u32(used as u32)
            .u32(dim as u32);
        launch(d, KernelId::MoeCombine, &ops_cfg(rows * dim), &args);
        add(d, &ba, &comb, &sum, rows * dim);
        rms_norm(d, &sum, &bw, &y, rows, dim);
        (first, (download(d, &sum), download(d, &y)))
    };
    let (cpu_add, cpu_comb) = sequence(&p.cpu);
    let (seq_add, seq_comb) = sequence(&p.gpu);
    let d = &p.gpu;
    let (ba, bb, bw) = (upload(d, &a), upload(d, &b), upload(d, &w));
    let (bys, bws) = (upload(d, &ys), upload(d, &ws));
    let sum = d.alloc::<f32>(rows * dim).unwrap();
    let y = d.alloc::<f32>(rows * dim).unwrap();
    let args = Args::new()
        .read(&ba)
        .read(&bb)
        .write(&sum)
        .read(&bw)
        .write(&y)
        .u32(rows as u32)
        .u32(dim as u32)
        .f32(1e-6);
    launch(d, KernelId::AddRmsNorm, &per_row(rows, dim), &args);
    let (fs, fy) = (download(d, &sum), download(d, &y));
    rep.exact("add_rms_norm sum vs add (GPU)", &fs, &seq_add.0);
    rep.exact("add_rms_norm y vs add + rms_norm (GPU)", &fy, &seq_add.1);
    rep.close(
        "add_rms_norm y vs the CPU sequence",
        &fy,
        &cpu_add.1,
        1e-6,
        |i| f64::from(cpu_add.1[i].abs()).max(1e-3),
    );
    let args = Args::new()
        .read(&bys)
        .read(&bws)
        .read(&ba)
        .write(&sum)
        .read(&bw)
        .write(&y)
        .u32(rows as u32)
        .u32(used as u32)
        .u32(dim as u32)
        .f32(1e-6);
    launch(d, KernelId::CombineAddRmsNorm, &per_row(rows, dim), &args);
    let (fs, fy) = (download(d, &sum), download(d, &y));
    rep.exact("combine_add_rms_norm sum (GPU)", &fs, &seq_comb.0);
    rep.exact("combine_add_rms_norm y (GPU)", &fy, &seq_comb.1);
    rep.close(
        "combine_add_rms_norm y vs the CPU sequence",
        &fy,
        &cpu_comb.1,
        1e-5,
        |i| f64::from(cpu_comb.1[i].abs()).max(1e-3),
    );
    rep.finish();
}

/// rope's arguments for `[tokens, heads, head_dim]` heads, (n_rot, mode, ext_factor) and
/// the fixed YaRN-style parameters the fused test uses.
fn rope_args<'a>(
    x: &'a DeviceBuffer<f32>,
    pos: &'a DeviceBuffer<i32>,
    [nt, heads, hd]: [usize; 3],
    (n_rot, mode, ext): (u32, u32, f32),
) -> Args<'a> {
    Args::new()
        .read_write(x)
        .read(pos)
        .u32(nt as u32)
        .u32(heads as u32)
        .u32(hd as u32)
        .u32(n_rot)
        .u32(mode)
        .f32(1e6)
        .f32(0.5)
        .f32(ext)
        .f32(1.0)
        .f32(32.0)
        .f32(1.0)
        .u32(4096)
}

#[test]
fn qk_norm_rope_store_matches_its_sequence() {
    let Some(p) = pair("qk_norm_rope_store_matches_its_sequence") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(22);
    // (tokens, heads, kv heads, head_dim, n_rot, mode, norm, ext_factor)
    for (nt, nh, nkv, hd, n_rot, mode, norm, ext) in [
        (
            1usize, 32usize, 4usize, 128usize, 128u32, 2u32, true, 0.0f32,
        ),
        (5, 8, 2, 128, 128, 2, true, 1.0),
        (3, 4, 2, 64, 32, 0, false, 0.0),
    ] {
        let (ctx, kvd) = (16usize, nkv * hd);
        let (q, k, v) = (
            rng.vec(nt * nh * hd, 2.0),
            rng.vec(nt * kvd, 2.0),
            rng.vec(nt * kvd, 2.0),
        );
        let (qn, kn) = (rng.vec(hd, 1.5), rng.vec(hd, 1.5));
        let pos: Vec<i32> = (0..nt as i32).map(|t| 7 + t).collect();
        let sequence = |d: &Device| {
            let (bq, bk, bv) = (upload(d, &q), upload(d, &k), upload(d, &v));
            let (bqn, bkn, bpos) = (upload(d, &qn), upload(d, &kn), upload(d, &pos));
            let (q2, k2) = (upload(d, &q), upload(d, &k));
            if norm {
                rms_norm(d, &bq, &bqn, &q2, nt * nh, hd);
                rms_norm(d, &bk, &bkn, &k2, nt * nkv, hd);
            }
            launch(
                d,
                KernelId::Rope,
                &ops_cfg(nt * nh * hd),
                &rope_args(&q2, &bpos, [nt, nh, hd], (n_rot, mode, ext)),
            );
            launch(
                d,
                KernelId::Rope,
                &ops_cfg(nt * kvd),
                &rope_args(&k2, &bpos, [nt, nkv, hd], (n_rot, mode, ext)),
            );
            let kc = upload(d, &vec![7u16; ctx * kvd]);
            let vc = upload(d, &vec![7u16; ctx * kvd]);
            let args = Args::new()
                .read(&k2)
                .read(&bv)
                .read(&bpos)
                .write(&kc)
                .write(&vc)
                .u32(kvd as u32)
                .u32(nt as u32)
                .u32(ctx as u32);
            launch(d, KernelId::KvStore, &ops_cfg(nt * kvd), &args);
            (download(d, &q2), download(d, &kc), download(d, &vc))
        };
        let cpu = sequence(&p.cpu);
        let seq = sequence(&p.gpu);
        let d = &p.gpu;
        let (bq, bk, bv) = (upload(d, &q), upload(d, &k), upload(d, &v));
        let (bqn, bkn, bpos) = (upload(d, &qn), upload(d, &kn), upload(d, &pos));
        let qo = d.alloc::<f32>(nt * nh * hd).unwrap();
        let kc = upload(d, &vec![7u16; ctx * kvd]);
        let vc = upload(d, &vec![7u16; ctx * kvd]);
        let args = Args::new()
            .read(&bq)
            .read(&bk)
            .read(&bv)
            .read(&bqn)
            .read(&bkn)
            .read(&bpos)
            .write(&qo)
            .write(&kc)
            .write(&vc)
            .u32(nt as u32)
            .u32(nh as u32)
            .u32(nkv as u32)
            .u32(hd as u32)
            .u32(ctx as u32)
            .u32(norm as u32)
            .f32(1e-6)
            .u32(n_rot)
            .u32(mode)
            .f32(1e6)
            .f32(0.5)
            .f32(ext)
            .f32(1.0)
            .f32(32.0)
            .f32(1.0)
            .u32(4096);
        let heads = nt * (nh + 2 * nkv);
        launch(
            d,
            KernelId::QkNormRopeStore,
            &LaunchCfg::linear(heads * 32, 256),
            &args,
        );
        let (fq, fk, fv) = (download(d, &qo), download(d, &kc), download(d, &vc));
        let what = format!(
            "qk_norm_rope_store t={nt} heads {nh}/{nkv} hd={hd} rot={n_rot} mode={mode} norm={norm} ext={ext}"
        );
        rep.exact(&format!("{what}: q (GPU sequence)"), &fq, &seq.0);
        rep.exact(&format!("{what}: K cache (GPU sequence)"), &fk, &seq.1);
        rep.exact(&format!("{what}: V cache (GPU sequence)"), &fv, &seq.2);
        rep.close(
            &format!("{what}: q vs the CPU sequence"),
            &fq,
            &cpu.0,
            1e-5,
            |_| 1.0,
        );
    }
    rep.finish();
}

#[test]
fn experts_gate_up_matches_two_products_and_swiglu() {
    let Some(p) = pair("experts_gate_up_matches_two_products_and_swiglu") else {
        return;
    };
    let mut rep = Report::default();
    let mut rng = Rng::new(23);
    let (m, k, n_tokens, n_used, n_expert) = (40usize, 512usize, 2usize, 4usize, 6usize);
    for ty in [
        QuantType::Q4_K,
        QuantType::IQ2_XS,
        QuantType::Q8_0,
        QuantType::Q6_K,
    ] {
        let expert_bytes = ty.row_bytes(k).unwrap() * m + 32;
        let mut wg = Vec::new();
        let mut wu = Vec::new();
        for _ in 0..n_expert {
            wg.extend(random_weights(ty, m, k, &mut rng));
            wg.extend(std::iter::repeat_n(0xEEu8, 32));
            wu.extend(random_weights(ty, m, k, &mut rng));
            wu.extend(std::iter::repeat_n(0xEEu8, 32));
        }
        let ids: Vec<i32> = (0..n_tokens * n_used)
            .map(|_| rng.below(n_expert) as i32)
            .collect();
        let x = rng.vec(n_tokens * k, 2.0);
        let slots = n_tokens * n_used;
        let sequence = |d: &Device| {
            let (bg, bu, bx, bi) = (
                upload(d, &wg),
                upload(d, &wu),
                upload(d, &x),
                upload(d, &ids),
            );
            let (g, u, y) = (
                d.alloc::<f32>(slots * m).unwrap(),
                d.alloc::<f32>(slots * m).unwrap(),
                d.alloc::<f32>(slots * m).unwrap(),
            );
            for (w, out) in [(&bg, &g), (&bu, &u)] {
                let args = Args::new()
                    .read(w)
                    .read(&bx)
                    .read(&bi)
                    .write(out)
                    .u32(ty.id())
                    .u32(m as u32)
                    .u32(k as u32)
                    .u32(n_tokens as u32)
                    .u32(n_used as u32)
                    .u32(0)
                    .u64(expert_bytes as u64);
                launch(
                    d,
                    KernelId::MulMatExperts,
                    &LaunchCfg::linear(slots * m.div_ceil(8) * 128, 128),
                    &args,
                );
            }
            let args = Args::new()
                .read(&g)
                .read(&u)
                .write(&y)
                .u32((slots * m) as u32);
            launch(d, KernelId::Swiglu, &ops_cfg(slots * m), &args);
            (download(d, &y), download(d, &g), download(d, &u))
        };
        let (cpu, g, u) = sequence(&p.cpu);
        let seq = sequence(&p.gpu).0;
        let d = &p.gpu;
        let (bg, bu, bx, bi) = (
            upload(d, &wg),
            upload(d, &wu),
            upload(d, &x),
            upload(d, &ids),
        );
        let y = d.alloc::<f32>(slots * m).unwrap();
        let args = Args::new()
            .read(&bg)
            .read(&bu)
            .read(&bx)
            .read(&bi)
            .write(&y)
            .u32(ty.id())
            .u32(m as u32)
            .u32(k as u32)
            .u32(n_tokens as u32)
            .u32(n_used as u32)
            .u64(expert_bytes as u64)
            .u64(expert_bytes as u64);
        launch(
            d,
            KernelId::ExpertsGateUp,
            &LaunchCfg::linear(slots * m.div_ceil(8) * 128, 128),
            &args,
        );
        let fused = download(d, &y);
        rep.exact(
            &format!("experts_gate_up {ty:?} vs the GPU sequence"),
            &fused,
            &seq,
        );
        // silu(g)·u moves by about |u|·δg + |g|·δu: scaled by (|g| + 1)(|u| + 1).
        let scale = |i: usize| (f64::from(g[i].abs()) + 1.0) * (f64::from(u[i].abs()) + 1.0);
        rep.close(
            &format!("experts_gate_up {ty:?} vs the CPU sequence"),
            &fused,
            &cpu,
            1e-4,
            scale,
        );
    }
    rep.finish();
}
