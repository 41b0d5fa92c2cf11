//! The variant table's choices and the constants it shares with the kernels.

use super::*;
use strata_core::{Access, RawBuffer};

#[test]
fn variants_apply_to_one_token_launches_only() {
    let buf = KernelArg::Buffer {
        buf: RawBuffer(0x1000),
        offset: 0,
        bytes: 0,
        access: Access::Read,
    };
    let mul_mat = |n| {
        [
            buf,
            buf,
            buf,
            KernelArg::U32(12),
            KernelArg::U32(64),
            KernelArg::U32(256),
            KernelArg::U32(n),
        ]
    };
    let v = VARIANTS.iter().find(|v| v.func == "mul_mat_vec").unwrap();
    assert_eq!((v.applies)(&mul_mat(1), 0), Some(0));
    // Float weights of up to 8 tokens (a step's router, a window's): mul_mat_vec_f, ahead
    // of mul_mat_vec; not Q4_K (12), not 9 tokens.
    let f = VARIANTS.iter().find(|v| v.func == "mul_mat_vec_f").unwrap();
    assert!((f.applies)(&mul_mat(1), 0).is_none());
    for ty in [0, 1, 30] {
        let mut router = mul_mat(1);
        router[3] = KernelArg::U32(ty);
        assert_eq!((f.applies)(&router, 0), Some(0));
        router[6] = KernelArg::U32(8);
        assert_eq!((f.applies)(&router, 0), Some(0));
        router[6] = KernelArg::U32(9);
        assert!((f.applies)(&router, 0).is_none());
    }
    let at = |name: &str| VARIANTS.iter().position(|v| v.func == name).unwrap();
    assert!(at("mul_mat_vec_f") < at("mul_mat_vec"));
    assert!((v.applies)(&mul_mat(8), 0).is_none());
    assert!((v.applies)(&mul_mat(1)[..6], 0).is_none());
    // Tensor cores for 16 tokens and more, when the tile fits the shared memory.
    let mma = VARIANTS.iter().find(|v| v.func == "mul_mat_mma").unwrap();
    assert!((mma.applies)(&mul_mat(8), 232_448).is_none());
    // Q4_K, 256 values: 64 rows of 144 bytes (+ pad) and 32 tokens of 256 (+ pad) + scales.
    let bytes = 64 * (144 + 16) + 32 * (256 + 16) + 32 * 8 * 8;
    assert_eq!((mma.applies)(&mul_mat(16), 232_448), Some(bytes));
    assert!((mma.applies)(&mul_mat(16), bytes - 1).is_some_and(|b| b < bytes));
    assert!((mma.applies)(&mul_mat(16), 1000).is_none());
    let mut f16 = mul_mat(64);
    f16[3] = KernelArg::U32(1);
    assert!((mma.applies)(&f16, 232_448).is_none());
}

#[test]
fn cached_experts_group_windows_only() {
    let buf = KernelArg::U64(0x1000); // the buffers' values do not matter here
    // (slots, table, x, ids, y | type, m, k, n_tokens, n_used, x_per_slot, n_expert, ...)
    let cached = |n: u32, used: u32, n_expert: u32| {
        let mut a = vec![buf; 5];
        a.extend([12, 768, 2048, n, used, 0, n_expert].map(KernelArg::U32));
        a.extend([KernelArg::U64(1 << 20), KernelArg::U64(0)]);
        a
    };
    let v = VARIANTS
        .iter()
        .find(|v| v.func == "mul_mat_experts_cached_grouped")
        .unwrap();
    assert_eq!(v.of, KernelId::MulMatExpertsCached);
    assert!((v.applies)(&cached(1, 8, 128), 0).is_none());
    assert!((v.applies)(&cached(2, 8, 128), 0).is_none());
    assert_eq!((v.applies)(&cached(5, 8, 128), 0), Some(0));
    let grid = v.grid.unwrap();
    // 40 pairs over at most 40 experts, 48 units of 16 rows each.
    assert_eq!(grid(&cached(5, 8, 128), 256), Some(40 * 48));
    // 512 pairs, but 128 experts and the invalid-id rank.
    assert_eq!(grid(&cached(64, 8, 128), 256), Some(129 * 48));
}

#[test]
fn cached_experts_multi_takes_windows_of_up_to_64_pairs() {
    let buf = KernelArg::U64(0x1000); // the buffers' values do not matter here
    let cached = |n: u32, used: u32, n_expert: u32| {
        let mut a = vec![buf; 5];
        a.extend([12, 768, 2048, n, used, 0, n_expert].map(KernelArg::U32));
        a.extend([KernelArg::U64(1 << 20), KernelArg::U64(0)]);
        a
    };
    let pos = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
    let v = &VARIANTS[pos("mul_mat_experts_cached_multi")];
    assert_eq!(v.of, KernelId::MulMatExpertsCached);
    // Listed before the grouped form, which would otherwise take windows of 3 or more.
    assert!(pos("mul_mat_experts_cached_multi") < pos("mul_mat_experts_cached_grouped"));
    assert!((v.applies)(&cached(1, 8, 128), 0).is_none());
    for n in 2..=8 {
        assert_eq!((v.applies)(&cached(n, 8, 128), 0), Some(0), "{n} tokens");
    }
    assert!((v.applies)(&cached(9, 8, 128), 0).is_none());
    // 8 tokens of 16 experts: 128 pairs, more than the kernel groups.
    assert!((v.applies)(&cached(8, 16, 128), 0).is_none());
    assert!((v.applies)(&cached(4, 16, 128), 0).is_some());
    assert!((v.applies)(&cached(5, 8, 128)[..8], 0).is_none());
    let grid = v.grid.unwrap();
    // 40 pairs over at most 40 experts, 48 units of 16 rows each; 8 of 6 experts (and
    // the invalid ids' rank): 7.
    assert_eq!(grid(&cached(5, 8, 128), 256), Some(40 * 48));
    assert_eq!(grid(&cached(2, 4, 6), 256), Some(7 * 48));
    // 4 warps a block: units of 8 rows.
    assert_eq!(grid(&cached(5, 8, 128), 128), Some(40 * 96));
}

#[test]
fn cached_experts_multi_q8_takes_quantised_windows_whose_rows_fit_the_scratch() {
    let buf = KernelArg::U64(0x1000); // the buffers' values do not matter here
    // (slots, table, x, ids, y | type, m, k, n_tokens, n_used, x_per_slot, n_expert, ...)
    let cached = |ty: u32, k: u32, n: u32, per_slot: u32| {
        let mut a = vec![buf; 5];
        a.extend([ty, 768, k, n, 8, per_slot, 128].map(KernelArg::U32));
        a.extend([KernelArg::U64(1 << 20), KernelArg::U64(0)]);
        a
    };
    let pos = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
    let v = &VARIANTS[pos("mul_mat_experts_cached_multi_q8")];
    let multi = &VARIANTS[pos("mul_mat_experts_cached_multi")];
    assert_eq!(v.of, KernelId::MulMatExpertsCached);
    // First for the launches it takes; the other keeps what it declines (and takes them
    // all when STRATA_CUDA_SKIP names it).
    assert!(pos("mul_mat_experts_cached_multi_q8") < pos("mul_mat_experts_cached_multi"));
    assert!(!v.large_smem && !v.scratch && !v.grid_exact);
    // Q4_K gate/up (a token's row of 2,048) and down (a pair's row of 768): windows of 2..=8.
    for n in 2..=8 {
        assert_eq!((v.applies)(&cached(12, 2048, n, 0), 0), Some(0), "{n}");
        assert_eq!((v.applies)(&cached(12, 768, n, 1), 0), Some(0), "{n}");
    }
    // Not: one token or 9, float weights (nothing to quantise), not whole blocks, rows
    // past the scratch (64 pairs of 16,384 values), fewer arguments.
    for a in [
        cached(12, 2048, 1, 0),
        cached(12, 2048, 9, 0),
        cached(0, 2048, 4, 0),
        cached(1, 2048, 4, 0),
        cached(30, 2048, 4, 0),
        cached(12, 2000, 4, 0),
        cached(12, 0, 4, 0),
        cached(12, 16_384, 8, 1),
    ] {
        assert!((v.applies)(&a, 0).is_none(), "{a:?}");
    }
    assert!((v.applies)(&cached(12, 16_384, 8, 0), 0).is_some());
    assert!((v.applies)(&cached(12, 2048, 4, 0)[..10], 0).is_none());
    // Only windows the other takes, of every quantised format it takes.
    for ty in 0..64 {
        let a = cached(ty, 4096, 5, 1);
        if (v.applies)(&a, 0).is_some() {
            assert!((multi.applies)(&a, 0).is_some(), "{ty}");
        }
    }
    assert!((v.applies)(&cached(39, 4096, 5, 1), 0).is_some()); // MXFP4
    // The other's grid, one H200 wave at most (396 blocks): 2 tokens' 16 pairs of 768
    // rows have 16 x 48 units, 5 tokens' 40 x 48.
    let (grid, grid_multi) = (v.grid.unwrap(), multi.grid.unwrap());
    assert_eq!(grid_multi(&cached(12, 2048, 5, 0), 256), Some(40 * 48));
    assert_eq!(grid(&cached(12, 2048, 5, 0), 256), Some(396));
    let small = |n| {
        let mut a = cached(12, 2048, n, 0);
        a[6] = KernelArg::U32(40); // 40 rows: 3 units of 16 per pair
        a
    };
    assert_eq!(grid(&small(2), 256), Some(16 * 3));
    assert_eq!(grid(&small(2), 256), grid_multi(&small(2), 256));
    // Every activation row quantised first: a token's rows, or a row per pair; 256 values
    // a block.
    let pre = v.pre.as_ref().unwrap();
    assert_eq!(pre.func, "quantise_act_q8_window");
    assert_eq!((pre.grid)(&cached(12, 2048, 5, 0)), Some(5 * 8));
    assert_eq!((pre.grid)(&cached(12, 768, 5, 1)), Some(40 * 3));
    assert!((pre.grid)(&cached(12, 768, 9, 1)).is_none());
    // In use by default (STRATA_CUDA_SKIP=...,mul_mat_experts_cached_multi_q8 for the other).
    if std::env::var("STRATA_CUDA_SKIP").is_err() {
        let skipped = crate::launch_options::LaunchOptions::from_env().skip_optional;
        assert!(
            !skipped
                .split(',')
                .any(|n| n.trim() == "mul_mat_experts_cached_multi_q8")
        );
    }
}

#[test]
fn mul_mat_vec_q8_takes_one_token_of_a_quantised_format() {
    // mul_mat(w, x, y | type, m, k, n); the buffers' values do not matter here.
    let mul_mat = |ty, m, k, n| {
        let u = KernelArg::U32;
        [KernelArg::U64(0x1000); 3]
            .into_iter()
            .chain([u(ty), u(m), u(k), u(n)])
    };
    let find = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
    let v = &VARIANTS[find("mul_mat_vec_q8")];
    let applies = |ty, m, k, n| (v.applies)(&mul_mat(ty, m, k, n).collect::<Vec<_>>(), 0);
    // Q4_K, 4,096 values: 4 warps x 4 steps of 4 blocks of 144 bytes (+ 30 slack, in
    // 16-byte segments).
    assert_eq!(applies(12, 2048, 4096, 1), Some(4 * 4 * 592));
    // Q8_0, 20,480 values: 8 steps staged (of 32 blocks of 34 bytes).
    assert_eq!(applies(8, 16, 20_480, 1), Some(4 * 8 * 1104));
    assert_eq!(applies(12, 2048, 65_536, 1), Some(4 * 8 * 592));
    // Not: two tokens, none, a float format, a row past the scratch, not whole blocks.
    assert!(applies(12, 2048, 4096, 2).is_none());
    assert!(applies(12, 2048, 4096, 0).is_none());
    assert!(applies(1, 2048, 4096, 1).is_none());
    assert!(applies(12, 2048, 65_536 + 256, 1).is_none());
    assert!(applies(12, 2048, 4000, 1).is_none());
    // Every stage fits the 48 KiB a block has without opting in.
    for ty in [
        2u32, 3, 6, 7, 8, 10, 11, 12, 13, 14, 16, 17, 18, 20, 21, 22, 23, 39,
    ] {
        assert!(
            applies(ty, 64, 65_536, 1).is_some_and(|b| b <= 48 * 1024),
            "{ty}"
        );
    }
    // Its grid: a row a warp of up to 4, whatever grid the launch had.
    let grid = v.grid.unwrap();
    let args: Vec<_> = mul_mat(12, 2050, 4096, 1).collect();
    assert_eq!(grid(&args, 128), Some(513));
    assert_eq!(grid(&args, 256), Some(513));
    assert_eq!(grid(&args, 64), Some(1025));
    assert!(v.grid_exact);
    // The activation quantised first: 256 values a block.
    let pre = v.pre.as_ref().unwrap();
    assert_eq!((pre.grid)(&args), Some(16));
    // Before mul_mat_vec, which keeps the launches it declines (for_launch takes the
    // first variant that applies); the scratch holds the longest row it takes.
    assert!(find("mul_mat_vec_q8") < find("mul_mat_vec"));
    // The scratch holds a verify window's 8 rows of the longest (mul_mat_vec_q8_rows).
    assert_eq!(MVQ_SCRATCH_BYTES, 8 * (65_536 + 65_536 / 32 * 8));
}

#[test]
fn mul_mat_vec_q8_rows_takes_windows_of_2_to_8_tokens() {
    // mul_mat(w, x, y | type, m, k, n)
    let mul_mat = |ty, m, k, n| {
        let u = KernelArg::U32;
        let mut a = vec![KernelArg::U64(0x1000); 3];
        a.extend([u(ty), u(m), u(k), u(n)]);
        a
    };
    let find = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
    let v = &VARIANTS[find("mul_mat_vec_q8_rows")];
    let one = &VARIANTS[find("mul_mat_vec_q8")];
    assert_eq!(v.of, KernelId::MulMat);
    let applies = |ty, m, k, n| (v.applies)(&mul_mat(ty, m, k, n), 0);
    // The same shared memory as one token (the weight row staged once for all rows).
    for n in 2..=8 {
        assert_eq!(applies(12, 2048, 4096, n), Some(4 * 4 * 592), "{n}");
        assert_eq!(
            applies(12, 2048, 4096, n),
            (one.applies)(&mul_mat(12, 2048, 4096, 1), 0)
        );
    }
    assert_eq!(applies(8, 16, 20_480, 5), Some(4 * 8 * 1104));
    // 8 rows of the longest row mul_mat_vec_q8 takes fit the scratch.
    assert_eq!(applies(12, 2048, 65_536, 8), Some(4 * 8 * 592));
    // Not: one token (mul_mat_vec_q8's), none, 9 and more, what mul_mat_vec_q8 refuses
    // (a float format, a row past MVQ_MAX_K, not whole blocks).
    for n in [0, 1, 9, 16, 64] {
        assert!(applies(12, 2048, 4096, n).is_none(), "{n}");
    }
    assert!(applies(1, 2048, 4096, 4).is_none());
    assert!(applies(0, 2048, 4096, 4).is_none());
    assert!(applies(12, 2048, 65_536 + 256, 2).is_none());
    assert!(applies(12, 2048, 4000, 2).is_none());
    // Every format mul_mat_vec_q8 takes, and no other.
    for ty in 0..64 {
        let alone = (one.applies)(&mul_mat(ty, 64, 65_536, 1), 0);
        assert_eq!(applies(ty, 64, 65_536, 8), alone, "{ty}");
    }
    // Its grid is mul_mat_vec_q8's (a row a warp of up to 4), whatever the tokens.
    let (grid, grid_one) = (v.grid.unwrap(), one.grid.unwrap());
    for block in [64, 128, 256] {
        assert_eq!(
            grid(&mul_mat(12, 2050, 4096, 5), block),
            grid_one(&mul_mat(12, 2050, 4096, 1), block)
        );
    }
    assert_eq!(grid(&mul_mat(12, 2050, 4096, 5), 128), Some(513));
    assert!(v.grid_exact && !v.large_smem && !v.scratch);
    // quantise_act_q8 first, for every row: 256 values a block.
    let pre = v.pre.as_ref().unwrap();
    assert_eq!(pre.func, one.pre.as_ref().unwrap().func);
    assert_eq!((pre.grid)(&mul_mat(12, 2050, 4096, 5)), Some(5 * 16));
    assert_eq!((pre.grid)(&mul_mat(12, 2050, 768, 8)), Some(8 * 3));
    // Before the tiled kernels that would take these launches otherwise; after the
    // one-token form.
    assert!(find("mul_mat_vec_q8") < find("mul_mat_vec_q8_rows"));
    assert!(find("mul_mat_vec_q8_rows") < find("mul_mat_mma"));
    // In use by default since measured on the H200 (launch_options.rs).
    let skipped = crate::launch_options::LaunchOptions::from_env();
    if std::env::var("STRATA_CUDA_SKIP").is_err() {
        assert!(
            !skipped
                .skip_optional
                .split(',')
                .any(|n| n.trim() == "mul_mat_vec_q8_rows")
        );
    }
}

#[test]
fn experts_gate_up_q8_takes_one_token() {
    // experts_gate_up(wg, wu, x, ids, y | type, m, k, n_tokens, n_used, eb_g, eb_u)
    let args = |n_tokens| {
        let u = KernelArg::U32;
        let mut a = vec![KernelArg::U64(0x1000); 5];
        a.extend([u(12), u(768), u(2048), u(n_tokens), u(8)]);
        a.extend([KernelArg::U64(1 << 20), KernelArg::U64(1 << 20)]);
        a
    };
    let v = VARIANTS
        .iter()
        .find(|v| v.func == "experts_gate_up_q8")
        .unwrap();
    assert_eq!(v.of, KernelId::ExpertsGateUp);
    // Q4_K, 2,048 values: 4 warps x 2 rows x 2 steps of 592 bytes.
    assert_eq!((v.applies)(&args(1), 0), Some(4 * 2 * 2 * 592));
    assert!((v.applies)(&args(2), 0).is_none());
    // Q8_0's 65,536 values: 5 steps of 1,104 bytes fit 48 KiB, not 8.
    let mut q8 = args(1);
    (q8[5], q8[7]) = (KernelArg::U32(8), KernelArg::U32(65_536));
    assert_eq!((v.applies)(&q8, 0), Some(4 * 2 * 5 * 1104));
    // 768 rows in units of 4, per slot.
    assert_eq!((v.grid.unwrap())(&args(1), 128), Some(192 * 8));
    assert_eq!((v.pre.as_ref().unwrap().grid)(&args(1)), Some(8));
}

#[test]
fn mul_mat_experts_q8_takes_one_token() {
    // mul_mat_experts(w, x, ids, y | type, m, k, n_tokens, n_used, x_per_slot, bytes)
    let args = |k, n_tokens, per_slot| {
        let u = KernelArg::U32;
        let mut a = vec![KernelArg::U64(0x1000); 4];
        a.extend([u(12), u(2048), u(k), u(n_tokens), u(8), u(per_slot)]);
        a.push(KernelArg::U64(1 << 20));
        a
    };
    let find = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
    let v = &VARIANTS[find("mul_mat_experts_q8")];
    // The down projection's shape: 8 slots' rows of 768 values, one step staged.
    assert_eq!((v.applies)(&args(768, 1, 1), 0), Some(4 * 592));
    assert!((v.applies)(&args(768, 2, 1), 0).is_none());
    // 8 rows of the longest row fit the scratch (a verify window's, 640 KiB); 9 do not.
    assert!((v.applies)(&args(65_536, 1, 1), 0).is_some());
    let mut nine = args(65_536, 1, 1);
    nine[8] = KernelArg::U32(9);
    assert!((v.applies)(&nine, 0).is_none());
    nine[9] = KernelArg::U32(0);
    assert!((v.applies)(&nine, 0).is_some());
    assert_eq!((v.grid.unwrap())(&args(768, 1, 1), 128), Some(512 * 8));
    let pre = v.pre.as_ref().unwrap();
    assert_eq!((pre.grid)(&args(768, 1, 1)), Some(8 * 3));
    assert_eq!((pre.grid)(&args(768, 1, 0)), Some(3));
    // Before mul_mat_experts_vec, which keeps what it declines.
    assert!(find("mul_mat_experts_q8") < find("mul_mat_experts_vec"));
}

#[test]
fn mul_mat_experts_multi_q8_takes_quantised_windows() {
    // mul_mat_experts(w, x, ids, y | type, m, k, n_tokens, n_used, x_per_slot, bytes)
    let args = |ty, m, k, n_tokens, per_slot| {
        let u = KernelArg::U32;
        let mut a = vec![KernelArg::U64(0x1000); 4];
        a.extend([u(ty), u(m), u(k), u(n_tokens), u(8), u(per_slot)]);
        a.push(KernelArg::U64(1 << 20));
        a
    };
    let find = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
    let v = &VARIANTS[find("mul_mat_experts_multi_q8")];
    assert_eq!(v.of, KernelId::MulMatExperts);
    assert!(!v.large_smem && !v.scratch && !v.grid_exact);
    // Q4_K gate/up (a token's row of 2,048) and down (a pair's row of 768): windows of
    // 2..=8 tokens.
    for n in 2..=8 {
        assert_eq!((v.applies)(&args(12, 768, 2048, n, 0), 0), Some(0), "{n}");
        assert_eq!((v.applies)(&args(12, 2048, 768, n, 1), 0), Some(0), "{n}");
    }
    // Not: one token (mul_mat_experts_q8's, or the per-pair kernels'), 9 tokens (72
    // pairs), float weights, not whole blocks, rows past the scratch, fewer arguments.
    for a in [
        args(12, 768, 2048, 1, 0),
        args(12, 768, 2048, 9, 0),
        args(0, 768, 2048, 4, 0),
        args(1, 768, 2048, 4, 0),
        args(30, 768, 2048, 4, 0),
        args(12, 768, 2000, 4, 0),
        args(12, 768, 0, 4, 0),
        args(12, 768, 16_384, 8, 1),
    ] {
        assert!((v.applies)(&a, 0).is_none(), "{a:?}");
    }
    assert!((v.applies)(&args(12, 768, 16_384, 8, 0), 0).is_some());
    assert!((v.applies)(&args(12, 768, 2048, 4, 0)[..9], 0).is_none());
    // One H200 wave at most: 5 tokens' 40 pairs of 768 rows have 40 x 48 units; 2 tokens of
    // 40 rows in 4-warp blocks (ops.rs's decode-sized launch), 16 pairs x 5 units of 8.
    let grid = v.grid.unwrap();
    assert_eq!(grid(&args(12, 768, 2048, 5, 0), 256), Some(396));
    assert_eq!(grid(&args(12, 40, 2048, 2, 0), 128), Some(16 * 5));
    assert_eq!(grid(&args(12, 40, 2048, 2, 0), 256), Some(16 * 3));
    // Every activation row quantised first by mul_mat_experts_q8's pre-launch: a token's
    // rows, or a row per pair; 256 values a block.
    let pre = v.pre.as_ref().unwrap();
    assert_eq!(pre.func, "quantise_act_q8_experts");
    assert_eq!((pre.grid)(&args(12, 768, 2048, 5, 0)), Some(5 * 8));
    assert_eq!((pre.grid)(&args(12, 2048, 768, 5, 1)), Some(40 * 3));
    assert!((pre.grid)(&args(12, 2048, 768, 9, 1)).is_none());
    // After the one-token form, before mul_mat_experts_vec (which keeps what it declines).
    assert!(find("mul_mat_experts_q8") < find("mul_mat_experts_multi_q8"));
    assert!(find("mul_mat_experts_multi_q8") < find("mul_mat_experts_vec"));
    if std::env::var("STRATA_CUDA_SKIP").is_err() {
        let skipped = crate::launch_options::LaunchOptions::from_env().skip_optional;
        assert!(
            !skipped
                .split(',')
                .any(|n| n.trim() == "mul_mat_experts_multi_q8")
        );
    }
}

#[test]
fn gate_up_window_forms_take_quantised_windows() {
    // experts_gate_up(wg, wu, x, ids, y | type, m, k, n_tokens, n_used, bytes_g, bytes_u)
    // and experts_gate_up_cached(slots, table, x, ids, y | type, m, k, n_tokens, n_used,
    // n_expert, slot_bytes, offset_g, offset_u): the same scalars first.
    let args = |ty, m, k, n_tokens| {
        let u = KernelArg::U32;
        let mut a = vec![KernelArg::U64(0x1000); 5];
        a.extend([u(ty), u(m), u(k), u(n_tokens), u(8)]);
        a.extend([KernelArg::U64(1 << 20), KernelArg::U64(1 << 20)]);
        a
    };
    let find = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
    for (func, of, pre) in [
        (
            "experts_gate_up_multi_q8",
            KernelId::ExpertsGateUp,
            "quantise_act_q8_gate_up",
        ),
        (
            "experts_gate_up_cached_multi_q8",
            KernelId::ExpertsGateUpCached,
            "quantise_act_q8_gate_up_window",
        ),
    ] {
        let v = &VARIANTS[find(func)];
        assert_eq!(v.of, of);
        assert!(!v.large_smem && !v.scratch && !v.grid_exact);
        // Q4_K gate/up of Qwen3-30B-A3B (768 x 2048): windows of 2..=8 tokens.
        for n in 2..=8 {
            assert_eq!(
                (v.applies)(&args(12, 768, 2048, n), 0),
                Some(0),
                "{func} {n}"
            );
        }
        // Not: one token, 9 tokens (72 pairs), float weights, not whole blocks, no rows.
        for a in [
            args(12, 768, 2048, 1),
            args(12, 768, 2048, 9),
            args(0, 768, 2048, 4),
            args(1, 768, 2048, 4),
            args(12, 768, 2000, 4),
            args(12, 768, 0, 4),
        ] {
            assert!((v.applies)(&a, 0).is_none(), "{func} {a:?}");
        }
        // A unit per (routed expert, a gate and an up row a warp): 5 tokens' 40 pairs of 768
        // rows in 4-warp blocks have 40 x 192 units, one H200 wave at most; 2 tokens of 40
        // rows, 16 x 10 units of 4 (8 of 8-warp blocks).
        let grid = v.grid.unwrap();
        // One wave of 24 warps an SM: 792 blocks of 4 warps, 396 of 8.
        assert_eq!(grid(&args(12, 768, 2048, 5), 128), Some(792));
        assert_eq!(grid(&args(12, 768, 2048, 5), 256), Some(396));
        assert_eq!(grid(&args(12, 40, 2048, 2), 128), Some(16 * 10));
        assert_eq!(grid(&args(12, 40, 2048, 2), 256), Some(16 * 5));
        // Every token's row quantised first, 256 values a block.
        let p = v.pre.as_ref().unwrap();
        assert_eq!(p.func, pre);
        assert_eq!((p.grid)(&args(12, 768, 2048, 5)), Some(5 * 8));
        assert!((p.grid)(&args(12, 768, 2048, 9)).is_none());
    }
    // The one-token form keeps the steps.
    assert!(find("experts_gate_up_q8") < find("experts_gate_up_multi_q8"));
}

#[test]
fn attention_prefill_applies_to_long_launches_it_can_take() {
    let buf = KernelArg::Buffer {
        buf: RawBuffer(0x1000),
        offset: 0,
        bytes: 0,
        access: Access::Read,
    };
    let attention = |n_tokens, n_head, n_kv_head, head_dim| {
        [
            buf,
            buf,
            buf,
            buf,
            buf,
            KernelArg::U32(n_tokens),
            KernelArg::U32(n_head),
            KernelArg::U32(n_kv_head),
            KernelArg::U32(head_dim),
            KernelArg::U32(4096),
            KernelArg::F32(0.1),
        ]
    };
    let v = VARIANTS
        .iter()
        .find(|v| v.func == "attention_prefill")
        .unwrap();
    // Its grid: 16 tokens x 8 query heads a 256-thread tile, per K/V head.
    let grid = v.grid.unwrap();
    assert_eq!(grid(&attention(4096, 32, 4, 128), 256), Some(1024));
    assert_eq!(grid(&attention(65, 32, 4, 128), 256), Some(20));
    assert_eq!(grid(&attention(100, 8, 2, 64), 128), Some(14));
    // 384 staged rows of 136 f16 for head_dim 128.
    assert_eq!(
        (v.applies)(&attention(65, 32, 4, 128), 232_448),
        Some(104_448)
    );
    assert_eq!(
        (v.applies)(&attention(512, 8, 2, 64), 232_448),
        Some(55_296)
    );
    assert!((v.applies)(&attention(64, 32, 4, 128), 232_448).is_none());
    assert!((v.applies)(&attention(512, 32, 4, 128), 104_447).is_none());
    assert!((v.applies)(&attention(512, 32, 4, 80), 232_448).is_none());
    assert!((v.applies)(&attention(512, 32, 4, 256), 232_448).is_none());
    assert!((v.applies)(&attention(512, 32, 0, 128), 232_448).is_none());
    assert!((v.applies)(&attention(512, 30, 4, 128), 232_448).is_none());
    // The q8_0 cache's: the same launches and grid, 256 converted rows and two stages of
    // 128 raw rows (160 bytes for head_dim 128: 136 bytes of blocks at any even offset).
    let q8 = VARIANTS
        .iter()
        .find(|v| v.func == "attention_prefill_q8")
        .unwrap();
    assert_eq!(q8.of, KernelId::AttentionQ8);
    assert!(q8.large_smem && !q8.scratch && q8.pre.is_none());
    let qwen3 = (q8.applies)(&attention(65, 32, 4, 128), 232_448).unwrap();
    assert_eq!(qwen3, 256 * 136 * 2 + 256 * 160);
    // Two blocks an SM (228 KiB, 1 KiB of it reserved a block), as for the f16 cache.
    assert!(2 * (qwen3 + 1024) <= 228 * 1024);
    assert_eq!(
        (q8.applies)(&attention(512, 8, 2, 64), 232_448),
        Some(256 * 72 * 2 + 256 * 96)
    );
    assert_eq!(
        (q8.applies)(&attention(512, 6, 2, 96), 232_448),
        Some(256 * 104 * 2 + 256 * 128)
    );
    assert!((q8.applies)(&attention(64, 32, 4, 128), 232_448).is_none());
    assert!((q8.applies)(&attention(512, 32, 4, 128), 110_591).is_none());
    assert!((q8.applies)(&attention(512, 32, 4, 80), 232_448).is_none());
    assert_eq!(
        (q8.grid.unwrap())(&attention(4096, 32, 4, 128), 256),
        Some(1024)
    );
    // Decode steps and verify windows (up to 64 tokens) keep the per-row kernels and their
    // long-span variants; those never take a prefill.
    for id in [KernelId::Attention, KernelId::AttentionQ8] {
        for n in [1, 8, 64, 65, 4096] {
            let taking: Vec<_> = VARIANTS
                .iter()
                .filter(|v| v.of == id && (v.applies)(&attention(n, 32, 4, 128), 232_448).is_some())
                .map(|v| v.func)
                .collect();
            let prefill = taking.iter().filter(|f| f.contains("prefill")).count();
            let want = if n > 64 { taking.len().max(1) } else { 0 };
            assert_eq!(prefill, want, "{n} tokens: {taking:?}");
        }
    }
}

#[test]
fn flash_attention_is_preferred_over_attention_long() {
    let find = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
    // for_launch takes the first variant that applies: attention_flash where it does,
    // attention_long for what it declines (or when STRATA_CUDA_SKIP leaves it out).
    assert!(find("attention_flash") < find("attention_long"));
    assert!(find("attention_flash_q8") < find("attention_long_q8"));
    assert_eq!(VARIANTS[find("attention_flash")].of, KernelId::Attention);
    assert_eq!(
        VARIANTS[find("attention_flash_q8")].of,
        KernelId::AttentionQ8
    );
    assert!(VARIANTS[find("attention_flash")].scratch);
}

#[test]
fn mmq_variants_take_launches_of_more_than_64_tokens() {
    let buf = KernelArg::Buffer {
        buf: RawBuffer(0x1000),
        offset: 0,
        bytes: 0,
        access: Access::Read,
    };
    let mul_mat = |ty, n| {
        [
            buf,
            buf,
            buf,
            KernelArg::U32(ty),
            KernelArg::U32(2048),
            KernelArg::U32(2048),
            KernelArg::U32(n),
        ]
    };
    let experts = |n| {
        let u = KernelArg::U32;
        [
            buf,
            buf,
            buf,
            buf,
            u(12),
            u(768),
            u(2048),
            u(n),
            u(8),
            u(0),
            KernelArg::U64(1),
        ]
    };
    let find = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
    let (dense, experts_v) = (
        &VARIANTS[find("mul_mat_mmq")],
        &VARIANTS[find("mul_mat_experts_mmq")],
    );
    // Q4_K: raw rows of 144 bytes in 11 segments of 16 (an odd count), see mmq_layout.
    let bytes = 128 * 272 + 8 * 128 * 16 + 128 * 176 + 64 * 272 + 8 * 64 * 16;
    assert_eq!(bytes, 99_328);
    assert_eq!((dense.applies)(&mul_mat(12, 65), 232_448), Some(bytes));
    assert!((dense.applies)(&mul_mat(12, 64), 232_448).is_none());
    assert!((dense.applies)(&mul_mat(12, 65), bytes - 1).is_none());
    assert!((dense.applies)(&mul_mat(1, 512), 232_448).is_none());
    assert_eq!(
        (experts_v.applies)(&experts(65), 232_448),
        Some(bytes + 4096)
    );
    assert!((experts_v.applies)(&experts(64), 232_448).is_none());
    // Listed before the bit-exact kernels, which keep 16..64 tokens (for_launch takes
    // the first variant that applies).
    assert!(find("mul_mat_mmq") < find("mul_mat_mma"));
    assert!(find("mul_mat_experts_mmq") < find("mul_mat_experts_mma"));
}

#[test]
fn mul_mat_qkv_q8_rows_takes_windows_whose_formats_share_an_activation() {
    // mul_mat_qkv(wq, wk, wv, x, q, k, v | type_q, type_k, type_v, m_q, m_k, m_v, k, n)
    let qkv = |t: [u32; 3], m: [u32; 3], k, n| {
        let u = KernelArg::U32;
        let mut a = vec![KernelArg::U64(0x1000); 7];
        a.extend(t.map(u));
        a.extend(m.map(u));
        a.extend([u(k), u(n)]);
        a
    };
    let find = |f: &str| VARIANTS.iter().position(|v| v.func == f).unwrap();
    let v = &VARIANTS[find("mul_mat_qkv_q8_rows")];
    let rows = &VARIANTS[find("mul_mat_vec_q8_rows")];
    assert_eq!(v.of, KernelId::MulMatQkv);
    let (q4k, q6k, q8_0, q4_0, q4_1, q5_1) = (12, 14, 8, 2, 3, 7);
    let m = [4096, 512, 512];
    let applies = |t, k, n| (v.applies)(&qkv(t, m, k, n), 0);
    let rows_smem = |ty, k, n| {
        (rows.applies)(
            &[KernelArg::U64(0); 3]
                .into_iter()
                .chain([ty, 64, k, n].map(KernelArg::U32))
                .collect::<Vec<_>>(),
            0,
        )
    };
    for n in 2..=8 {
        // The largest of the three matrices' mul_mat_vec_q8_rows shared memory.
        assert_eq!(applies([q4k, q4k, q4k], 2048, n), rows_smem(q4k, 2048, n));
        assert_eq!(applies([q4k, q4k, q6k], 2048, n), rows_smem(q6k, 2048, n));
        assert_eq!(applies([q6k, q4k, q4k], 2048, n), rows_smem(q6k, 2048, n));
        assert!(applies([q8_0, q8_0, q4_0], 576, n).is_some());
        assert!(applies([q4_1, q4_1, q5_1], 576, n).is_some());
    }
    // Not: one token (the kernel's), 9, activation formats that differ (Q8_K, Q8_0,
    // Q8_1), a K-quant at SmolLM2's 576 (not whole blocks), float weights.
    for n in [0, 1, 9] {
        assert!(applies([q4k, q4k, q4k], 2048, n).is_none(), "{n}");
    }
    assert!(applies([q4k, q4k, q8_0], 2048, 4).is_none());
    assert!(applies([q8_0, q4_1, q8_0], 2048, 4).is_none());
    assert!(applies([q4k, q4k, q4k], 576, 4).is_none());
    assert!(applies([q8_0, q8_0, q4k], 576, 4).is_none());
    assert!(applies([0, 0, 0], 2048, 4).is_none());
    // A unit of 4 rows (a row a warp) of Q, then K, then V; the rows quantised once.
    let grid = v.grid.unwrap();
    assert_eq!(
        grid(&qkv([q4k; 3], [4096, 514, 512], 2048, 5), 128),
        Some(1024 + 129 + 128)
    );
    assert!(v.grid_exact && !v.large_smem && !v.scratch);
    let pre = v.pre.as_ref().unwrap();
    assert_eq!(pre.func, "quantise_act_q8_qkv");
    assert_eq!((pre.grid)(&qkv([q4k; 3], m, 2048, 5)), Some(5 * 8));
    assert_eq!((pre.grid)(&qkv([q8_0; 3], m, 576, 3)), Some(3 * 3));
}
