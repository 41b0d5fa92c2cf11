//! attention over a cache filled by kv_store on each device, CUDA against the CPU.

use strata_core::{Args, Device, KernelId, LaunchCfg};

use super::{Report, Rng, download, launch, ops_cfg, pair, upload};

struct Case {
    n_tokens: usize,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    pos0: usize,
}

/// Stores K/V rows 0..pos0 + n_tokens, then attends with the launch shape `cfg`.
fn run(d: &Device, c: &Case, q: &[f32], k: &[f32], v: &[f32], cfg: &LaunchCfg) -> Vec<f32> {
    let kv_dim = c.n_kv_head * c.head_dim;
    let ctx = c.pos0 + c.n_tokens;
    let (kc, vc) = (
        d.alloc::<u16>(ctx * kv_dim).unwrap(),
        d.alloc::<u16>(ctx * kv_dim).unwrap(),
    );
    let (bk, bv) = (upload(d, k), upload(d, v));
    let all = upload(d, &(0..ctx as i32).collect::<Vec<_>>());
    let store = Args::new()
        .read(&bk)
        .read(&bv)
        .read(&all)
        .write(&kc)
        .write(&vc)
        .u32(kv_dim as u32)
        .u32(ctx as u32)
        .u32(ctx as u32);
    launch(d, KernelId::KvStore, &ops_cfg(ctx * kv_dim), &store);
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
    launch(d, KernelId::Attention, cfg, &args);
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
        let kv_dim = c.n_kv_head * c.head_dim;
        let ctx = c.pos0 + c.n_tokens;
        let q = rng.vec(c.n_tokens * c.n_head * c.head_dim, 2.0);
        let k = rng.vec(ctx * kv_dim, 2.0);
        let v = rng.vec(ctx * kv_dim, 1.0);
        let units = c.n_tokens * c.n_head;
        let cpu = run(&p.cpu, c, &q, &k, &v, &ops_cfg(units));
        let what = format!(
            "attention t={} heads {}/{} hd={} pos0={}",
            c.n_tokens, c.n_head, c.n_kv_head, c.head_dim, c.pos0
        );
        // Outputs are averages of values in [-1, 1]: an absolute scale. Both devices round
        // the normalised probabilities to f16 as ggml does; a score that differs in its
        // last bit (the dot products sum in another order) can move one probability by
        // one f16 step (2^-11 of it), hence the tolerance.
        let gpu = run(&p.gpu, c, &q, &k, &v, &ops_cfg(units));
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
        let gpu2 = run(&p.gpu, c, &q, &k, &v, &per_unit);
        rep.exact(
            &format!("{what} block per unit vs ops.rs shape"),
            &gpu2,
            &gpu,
        );
    }
    rep.finish();
}
