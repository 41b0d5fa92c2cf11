//! Arbitrary arguments never panic, abort or touch memory outside the buffers: every
//! model kernel is called directly (strata_backend_cpu::kernels::run, so a panic is
//! not hidden by the stream worker) with random buffer sizes and scalars drawn from
//! edge values, over buffers with guard bytes past their declared end.

use strata_backend_cpu::kernels::{ArgSlot, KernelArgs, run};
use strata_core::{KernelId, LaunchCfg};

use super::Rng;

#[derive(Clone, Copy)]
enum Arg {
    /// A buffer (element size, written?).
    Buf(usize, bool),
    U32,
    /// A ggml type id.
    Type,
    U64,
    F32,
}

fn signature(k: KernelId) -> Vec<Arg> {
    use Arg::*;
    let (r, w) = (|e| Buf(e, false), |e| Buf(e, true));
    match k {
        KernelId::EmbedRows => vec![r(1), r(4), w(4), Type, U32, U32],
        KernelId::RmsNorm => vec![r(4), r(4), w(4), U32, U32, F32],
        KernelId::MulMat => vec![r(1), r(4), w(4), Type, U32, U32, U32],
        KernelId::Add | KernelId::Swiglu => vec![r(4), r(4), w(4), U32],
        KernelId::AddRows => vec![w(4), r(4), U32, U32],
        KernelId::Rope => {
            let mut v = vec![w(4), r(4), U32, U32, U32, U32, U32];
            v.extend([F32; 6]);
            v.push(U32);
            v
        }
        KernelId::KvStore => vec![r(4), r(4), r(4), w(2), w(2), U32, U32, U32],
        KernelId::Attention | KernelId::AttentionRows => {
            vec![r(4), r(4), r(2), r(2), w(4), U32, U32, U32, U32, U32, F32]
        }
        KernelId::RouterTopk => vec![r(4), w(4), w(4), U32, U32, U32, U32],
        KernelId::MulMatExperts => vec![r(1), r(4), r(4), w(4), Type, U32, U32, U32, U32, U32, U64],
        KernelId::MoeCombine => vec![r(4), r(4), w(4), U32, U32, U32],
        KernelId::SigmoidGateAdd => vec![r(4), r(4), w(4), U32, U32],
        _ => vec![],
    }
}

const GUARD: usize = 64;

fn pick<T: Copy>(rng: &mut Rng, xs: &[T]) -> T {
    xs[rng.below(xs.len())]
}

#[test]
fn random_arguments_are_refused_or_served_never_panic() {
    let kernels = [
        KernelId::EmbedRows,
        KernelId::RmsNorm,
        KernelId::MulMat,
        KernelId::Add,
        KernelId::AddRows,
        KernelId::Swiglu,
        KernelId::Rope,
        KernelId::KvStore,
        KernelId::Attention,
        KernelId::AttentionRows,
        KernelId::RouterTopk,
        KernelId::MulMatExperts,
        KernelId::MoeCombine,
        KernelId::SigmoidGateAdd,
    ];
    let pool = strata_backend_cpu::kernels::thread_pool(Some(2)).unwrap();
    let cfg = LaunchCfg::linear(1, 1);
    let mut rng = Rng::new(99);
    let (mut ok, mut refused) = (0, 0);
    for round in 0..3000 {
        let k = kernels[round % kernels.len()];
        // Small counts most of the time, so some launches fit and really run.
        let small = [0u32, 1, 2, 3, 4, 7, 8, 16, 32, 64, 256, 512];
        let edge = [255u32, 1 << 16, 1 << 31, u32::MAX - 1, u32::MAX];
        let types = [0u32, 1, 2, 3, 8, 12, 14, 17, 23, 30, 39, 40, 1000, u32::MAX];
        let mut bufs: Vec<Vec<u64>> = Vec::new();
        let mut slots = Vec::new();
        let mut guards = Vec::new();
        for a in signature(k) {
            slots.push(match a {
                Arg::Buf(elem, writable) => {
                    let n = pick(&mut rng, &[0usize, 1, 4, 16, 64, 256, 1024, 4096]) * elem;
                    // u64 storage, so every element type is aligned.
                    let mut v = vec![0u64; (n + GUARD).div_ceil(8)];
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
                    for b in bytes.iter_mut().take(n) {
                        *b = (rng.next_u64() >> 56) as u8 & 0x3F; // small, finite values
                    }
                    bytes[n..].fill(0xA5);
                    let ptr = bytes.as_mut_ptr();
                    bufs.push(v);
                    guards.push(n);
                    ArgSlot::Buffer {
                        ptr,
                        len: n,
                        writable,
                    }
                }
                Arg::U32 => ArgSlot::U32(if rng.below(8) == 0 {
                    pick(&mut rng, &edge)
                } else {
                    pick(&mut rng, &small)
                }),
                Arg::Type => ArgSlot::U32(pick(&mut rng, &types)),
                Arg::U64 => {
                    ArgSlot::U64(pick(&mut rng, &[0u64, 1, 18, 144, 4096, 1 << 40, u64::MAX]))
                }
                Arg::F32 => ArgSlot::F32(pick(
                    &mut rng,
                    &[0.0f32, 1.0, -1.0, 1e-5, 1e30, f32::NAN, f32::INFINITY],
                )),
            });
        }
        let args = KernelArgs::new(&cfg, slots).with_pool(pool.as_ref());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(k, &args)));
        match r {
            Ok(Ok(())) => ok += 1,
            Ok(Err(_)) => refused += 1,
            Err(_) => panic!("{} panicked on round {round}", k.name()),
        }
        for (i, (b, &n)) in bufs.iter().zip(&guards).enumerate() {
            let bytes: &[u8] = bytemuck::cast_slice(b);
            assert!(
                bytes[n..].iter().all(|&g| g == 0xA5),
                "{} wrote past buffer {i}",
                k.name()
            );
        }
    }
    eprintln!("{ok} launches ran, {refused} were refused");
    assert!(
        ok > 100 && refused > 100,
        "the draw should both fit and misfit ({ok} ran, {refused} refused)"
    );
}
