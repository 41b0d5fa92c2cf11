//! The expert cache's kernels (kernels.txt, module `experts`) on the CPU backend, against
//! the uncached model kernels as the oracle: `mul_mat_experts_cached` gives, bit for bit,
//! `mul_mat_experts`' rows for the resident pairs and leaves the others untouched;
//! `moe_combine_split` with the pool's rows equal to the device's gives `moe_combine`'s
//! sum bit for bit; bad ids and rows are errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_backend_cpu::{CpuOptions, device};
use strata_core::{Args, Device, KernelId, LaunchCfg};

const F32: u32 = 0; // ggml type id
const N_EXPERT: usize = 6;
const M: usize = 5;
const K: usize = 32;
const N_TOKENS: usize = 3;
const N_USED: usize = 3;

fn dev(threads: usize) -> Device {
    device(CpuOptions {
        sanitize: true,
        max_dma_delay_us: 20,
        threads: Some(threads),
        ..Default::default()
    })
    .unwrap()
}

fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn run(d: &Device, k: KernelId, args: &Args<'_>) -> strata_core::Result<()> {
    d.launch(k, &LaunchCfg::linear(1, 1), args, d.main_stream())?;
    d.synchronize()
}

#[test]
fn cached_rows_equal_the_uncached_kernel_and_the_rest_are_untouched() {
    for threads in [1, 3] {
        let d = dev(threads);
        let s = d.main_stream();
        let w = values(1, N_EXPERT * M * K);
        let wbytes: Vec<u8> = bytemuck::cast_slice(&w).to_vec();
        let expert_bytes = M * K * 4;
        let x = values(2, N_TOKENS * K);
        let ids: Vec<i32> = vec![1, 4, 0, 3, 1, 5, 4, 2, 1];
        // Experts 1 and 4 resident in slots 2 and 0 of three; matrix 64 bytes into a slot.
        let (offset, slot_bytes) = (64, expert_bytes + 128);
        let mut table = vec![-1i32; N_EXPERT];
        table[1] = 2;
        table[4] = 0;
        let mut slots = vec![0u8; 3 * slot_bytes];
        for (e, slot) in [(1usize, 2usize), (4, 0)] {
            let at = slot * slot_bytes + offset;
            slots[at..at + expert_bytes]
                .copy_from_slice(&wbytes[e * expert_bytes..(e + 1) * expert_bytes]);
        }
        let (bw, bx, bids) = (
            d.alloc_from(&wbytes, s).unwrap(),
            d.alloc_from(&x, s).unwrap(),
            d.alloc_from(&ids, s).unwrap(),
        );
        let (bslots, btable) = (
            d.alloc_from(&slots, s).unwrap(),
            d.alloc_from(&table, s).unwrap(),
        );
        let reference = d.alloc::<f32>(N_TOKENS * N_USED * M).unwrap();
        run(
            &d,
            KernelId::MulMatExperts,
            &Args::new()
                .read(&bw)
                .read(&bx)
                .read(&bids)
                .write(&reference)
                .u32(F32)
                .u32(M as u32)
                .u32(K as u32)
                .u32(N_TOKENS as u32)
                .u32(N_USED as u32)
                .u32(0)
                .u64(expert_bytes as u64),
        )
        .unwrap();
        let reference = d.download(&reference, s).unwrap().wait().unwrap();
        let sentinel = vec![777.0f32; N_TOKENS * N_USED * M];
        let y = d.alloc_from(&sentinel, s).unwrap();
        let cached = |ids: &strata_core::DeviceBuffer<i32>| {
            run(
                &d,
                KernelId::MulMatExpertsCached,
                &Args::new()
                    .read(&bslots)
                    .read(&btable)
                    .read(&bx)
                    .read(ids)
                    .write(&y)
                    .u32(F32)
                    .u32(M as u32)
                    .u32(K as u32)
                    .u32(N_TOKENS as u32)
                    .u32(N_USED as u32)
                    .u32(0)
                    .u32(N_EXPERT as u32)
                    .u64(slot_bytes as u64)
                    .u64(offset as u64),
            )
        };
        cached(&bids).unwrap();
        let got = d.download(&y, s).unwrap().wait().unwrap();
        for (p, &e) in ids.iter().enumerate() {
            let (g, r) = (&got[p * M..(p + 1) * M], &reference[p * M..(p + 1) * M]);
            if table[e as usize] >= 0 {
                assert_eq!(g, r, "resident pair {p} (expert {e})");
            } else {
                assert!(
                    g.iter().all(|&v| v == 777.0),
                    "pair {p} (expert {e}) was written"
                );
            }
        }
        // An id outside the table is an error, not a wild read.
        let bad = d
            .alloc_from(&[0i32, 1, N_EXPERT as i32, 0, 0, 0, 0, 0, 0], s)
            .unwrap();
        let err = cached(&bad).expect_err("expert id n_expert must be refused");
        assert!(err.to_string().contains("expert id"), "{err}");
    }
}

#[test]
fn split_combine_equals_combine_with_the_same_rows() {
    let d = dev(2);
    let s = d.main_stream();
    let y = values(3, N_TOKENS * N_USED * M);
    let w = values(4, N_TOKENS * N_USED);
    let combined = |host_row: &[i32], y_dev: &[f32], y_host: &[f32]| {
        let (by, bh, br, bw) = (
            d.alloc_from(y_dev, s).unwrap(),
            d.alloc_from(y_host, s).unwrap(),
            d.alloc_from(host_row, s).unwrap(),
            d.alloc_from(&w, s).unwrap(),
        );
        let out = d.alloc::<f32>(N_TOKENS * M).unwrap();
        run(
            &d,
            KernelId::MoeCombineSplit,
            &Args::new()
                .read(&by)
                .read(&bh)
                .read(&br)
                .read(&bw)
                .write(&out)
                .u32(N_TOKENS as u32)
                .u32(N_USED as u32)
                .u32(M as u32),
        )
        .map(|()| d.download(&out, s).unwrap().wait().unwrap())
    };
    let (by, bw) = (d.alloc_from(&y, s).unwrap(), d.alloc_from(&w, s).unwrap());
    let out = d.alloc::<f32>(N_TOKENS * M).unwrap();
    run(
        &d,
        KernelId::MoeCombine,
        &Args::new()
            .read(&by)
            .read(&bw)
            .write(&out)
            .u32(N_TOKENS as u32)
            .u32(N_USED as u32)
            .u32(M as u32),
    )
    .unwrap();
    let reference = d.download(&out, s).unwrap().wait().unwrap();
    // Pairs 1, 3, 4 and 8 come from the pool: its rows hold the same values, the device's
    // rows for them hold garbage that must not be read.
    let from_pool = [1usize, 3, 4, 8];
    let mut host_row = vec![-1i32; N_TOKENS * N_USED];
    let mut y_host = Vec::new();
    let mut y_dev = y.clone();
    for (i, &p) in from_pool.iter().enumerate() {
        host_row[p] = i as i32;
        y_host.extend_from_slice(&y[p * M..(p + 1) * M]);
        y_dev[p * M..(p + 1) * M].fill(f32::NAN);
    }
    assert_eq!(combined(&host_row, &y_dev, &y_host).unwrap(), reference);
    // A pool row that does not exist is an error.
    host_row[8] = from_pool.len() as i32;
    assert!(combined(&host_row, &y_dev, &y_host).is_err());
}
