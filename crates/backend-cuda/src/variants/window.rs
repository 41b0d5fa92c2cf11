//! The verify-window variants' choices: which launches of 2..=8 tokens the kernels that
//! group a window's (token, routed expert) pairs by expert take (kernels-cuda/
//! matvec_window.cuh, matvec_window_q8.cuh), their activation rows and their grids.

use strata_core::KernelArg;

use super::{mvq_rows_fit, tensor_core_format, u32_arg};

/// Verify windows: launches of this many tokens at most take mul_mat_experts_cached_multi
/// (one for one token is the per-pair kernel's units, which the kernel keeps).
const CACHED_MULTI_MAX_TOKENS: u32 = 8;
/// Pairs (token, used slot) mul_mat_experts_cached_multi groups by expert
/// (kernels-cuda/matvec_window.cuh MVW_PAIRS); past that it runs the per-pair units.
const CACHED_MULTI_MAX_PAIRS: u32 = 64;

/// Whether mul_mat_experts_cached_multi takes a launch of `n_tokens` tokens of `n_used`
/// routed experts each: a verify window of 2..=8 tokens whose pairs it can group.
pub(super) fn cached_multi_applies(n_tokens: u32, n_used: u32) -> bool {
    (2..=CACHED_MULTI_MAX_TOKENS).contains(&n_tokens)
        && n_tokens
            .checked_mul(n_used)
            .is_some_and(|p| p <= CACHED_MULTI_MAX_PAIRS)
}

/// The _q8 window products' launches (mul_mat_experts_cached_multi_q8,
/// mul_mat_experts_multi_q8): `Some((activation rows, k))` for a window of `n` tokens of
/// `used` routed experts that mul_mat_experts_cached_multi takes, of weights of ggml type
/// `ty` in whole blocks, whose rows (one per token, or per pair with `per_slot`) fit the
/// scratch at mvq_row_stride apart.
fn window_q8_rows(ty: u32, k: u32, n: u32, used: u32, per_slot: u32) -> Option<(u32, u32)> {
    if !cached_multi_applies(n, used) || k == 0 {
        return None;
    }
    tensor_core_format(ty)?.row_bytes(k as usize)?;
    let rows = if per_slot != 0 { n * used } else { n };
    mvq_rows_fit(rows, k).then_some((rows, k))
}

/// [`window_q8_rows`] of a launch of mul_mat_experts_cached(slots, table, x, ids, y | type,
/// m, k, n_tokens, n_used, x_per_slot, ...).
pub(super) fn cached_multi_q8_rows(a: &[KernelArg]) -> Option<(u32, u32)> {
    window_q8_rows(
        u32_arg(a, 5)?,
        u32_arg(a, 7)?,
        u32_arg(a, 8)?,
        u32_arg(a, 9)?,
        u32_arg(a, 10)?,
    )
}

/// [`window_q8_rows`] of a launch of mul_mat_experts(w, x, ids, y | type, m, k, n_tokens,
/// n_used, x_per_slot, expert_bytes).
pub(super) fn experts_multi_q8_rows(a: &[KernelArg]) -> Option<(u32, u32)> {
    window_q8_rows(
        u32_arg(a, 4)?,
        u32_arg(a, 6)?,
        u32_arg(a, 7)?,
        u32_arg(a, 8)?,
        u32_arg(a, 9)?,
    )
}

/// The fused gate and up window forms' launches (experts_gate_up_multi_q8,
/// experts_gate_up_cached_multi_q8), both (5 buffers | type, m, k, n_tokens, n_used, ...):
/// `Some((activation rows, k))` (a token's row each) for a window [`window_q8_rows`] takes.
pub(super) fn gate_up_window_rows(a: &[KernelArg]) -> Option<(u32, u32)> {
    let (ty, k, n, used) = (
        u32_arg(a, 5)?,
        u32_arg(a, 7)?,
        u32_arg(a, 8)?,
        u32_arg(a, 9)?,
    );
    window_q8_rows(ty, k, n, used, 0)
}

/// Blocks of those forms: a rank per pair, units of one gate and one up row a warp (at most
/// 8 warps), one wave at most, as [`experts_window_q8_blocks`].
pub(super) fn gate_up_window_blocks(a: &[KernelArg], block_threads: u32) -> Option<u32> {
    let (m, n, used) = (u32_arg(a, 6)?, u32_arg(a, 8)?, u32_arg(a, 9)?);
    let ranks = n.checked_mul(used)?;
    let units = ranks.checked_mul(m.div_ceil((block_threads / 32).clamp(1, 8)))?;
    Some(units.min(window_max_blocks(block_threads)))
}

/// Units of the window kernels that take a unit per (routed expert, 16 rows) rather than
/// per (pair, 16 rows), for `m` rows and `ranks` experts at most: the row groups of
/// `block_threads` / 32 warps of 2 rows (matvec.cuh MV_ROWS, matmul.cuh MM_ROWS; at most 8
/// warps compute) of each.
fn expert_units(m: u32, ranks: u32, block_threads: u32) -> Option<u32> {
    let rows = (block_threads / 32).clamp(1, 8) * 2;
    ranks.checked_mul(m.div_ceil(rows))
}

/// [`expert_units`] of the cached expert kernels: at most one rank per pair and per expert
/// (ids outside the experts share one).
/// mul_mat_experts_cached(slots, table, x, ids, y | type, m, k, n_tokens, n_used,
/// x_per_slot, n_expert, ...)
pub(super) fn cached_expert_units(a: &[KernelArg], block_threads: u32) -> Option<u32> {
    let (m, n, used, n_expert) = (
        u32_arg(a, 6)?,
        u32_arg(a, 8)?,
        u32_arg(a, 9)?,
        u32_arg(a, 11)?,
    );
    let ranks = n.checked_mul(used)?.min(n_expert.checked_add(1)?);
    expert_units(m, ranks, block_threads)
}

/// Blocks of mul_mat_experts_cached_multi_q8: [`cached_expert_units`], at most
/// [`window_max_blocks`]. The kernel takes its units in a grid-stride loop; a block
/// past the window's distinct experts (known only there) would wait, read the ids and
/// leave, and each block computes the window's keys once for all its units.
pub(super) fn cached_window_q8_blocks(a: &[KernelArg], block_threads: u32) -> Option<u32> {
    Some(cached_expert_units(a, block_threads)?.min(window_max_blocks(block_threads)))
}

/// Blocks of mul_mat_experts_multi_q8, as [`cached_window_q8_blocks`]: a rank per pair (the
/// kernel has no expert count), at most one wave.
/// mul_mat_experts(w, x, ids, y | type, m, k, n_tokens, n_used, ...)
pub(super) fn experts_window_q8_blocks(a: &[KernelArg], block_threads: u32) -> Option<u32> {
    let (m, n, used) = (u32_arg(a, 5)?, u32_arg(a, 7)?, u32_arg(a, 8)?);
    let units = expert_units(m, n.checked_mul(used)?, block_threads)?;
    Some(units.min(window_max_blocks(block_threads)))
}

/// One wave of mul_mat_experts_cached_multi_q8 on an H200 (132 SMs of 3 blocks: its
/// `__launch_bounds__(256, 3)`). H200, Qwen3-30B-A3B-shaped Q4_K, 50% cache, K=4: a window
/// 10.37 ms with this cap against 10.80 with a block per unit a window could have
/// (`tools/h200_call.sh window-grid`, REPS=2). Any grid gives the same results; a GPU with
/// fewer SMs runs more than a wave.
pub(super) const CACHED_WINDOW_MAX_BLOCKS: u32 = 396;

/// The window kernels' grid cap for blocks of `block_threads`: one wave of their warps,
/// [`CACHED_WINDOW_MAX_BLOCKS`] blocks of 8 warps (24 warps an SM), so 4-warp blocks (ops.rs
/// launches gate and up products, and windows of 2 tokens, in them) get twice the blocks
/// rather than half the warps. (H200, 50% cache: the fused gate and up window form took
/// 58.3 us a launch at 396 blocks of 4 warps, about its two separate products' 2 x 28.7.)
pub(super) fn window_max_blocks(block_threads: u32) -> u32 {
    CACHED_WINDOW_MAX_BLOCKS * 8 / (block_threads / 32).clamp(1, 8)
}
