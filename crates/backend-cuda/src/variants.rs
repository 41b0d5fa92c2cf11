//! The kernels the backend launches in place of a listed one for some launch shapes
//! (one-token matvecs, tensor-core products and attention for many tokens), chosen from
//! the launch's arguments: when each applies, the dynamic shared memory it needs and the
//! grid it has work for.

use strata_core::{KernelArg, KernelId};

use crate::attention_flash::{
    ATT_FLASH_SCRATCH_END, attention_flash_applies, attention_flash_grid,
};
use crate::attention_long::{ATT_LONG_SCRATCH_END, attention_long_applies, attention_long_grid};
use window::{
    cached_expert_units, cached_multi_applies, cached_multi_q8_rows, cached_window_q8_blocks,
    experts_multi_q8_rows, experts_window_q8_blocks, gate_up_window_blocks, gate_up_window_rows,
};

/// A variant's own grid: the blocks it has work for, from the launch's arguments and block
/// size (`None`: the launch's grid).
pub(crate) type VariantGrid = fn(args: &[KernelArg], block_threads: u32) -> Option<u32>;

/// A kernel the backend launches in place of a listed one when `applies` says so for the
/// launch's arguments: the same signature, compiled for that shape (ggml-cuda likewise
/// picks its matrix-vector kernel for one-token products). Up to 64 tokens a launch its
/// results are bit for bit the kernel's (decode steps, verify windows and short reads rely
/// on rows not depending on their batch); past that (mmq.cuh, attention_prefill.cuh) they
/// agree within rounding.
pub(crate) struct Variant {
    pub of: KernelId,
    pub func: &'static str,
    /// `Some(bytes of dynamic shared memory it needs)` when the variant runs this launch,
    /// given the most the kernel may have (`limit`).
    pub applies: fn(args: &[KernelArg], limit: u32) -> Option<u32>,
    /// Whether it may ask for more than the default 48 KiB (the limit is raised at load
    /// only for these: a raised limit can change the L1/shared split of every launch).
    pub large_smem: bool,
    /// The blocks the variant has work for, given the launch's arguments and block size,
    /// when that is fewer than the launch's grid (its kernel's units are coarser): the
    /// launch is cut to them instead of scheduling blocks that exit at once.
    pub grid: Option<VariantGrid>,
    /// Whether `grid` is the launch's grid whatever the kernel's was, more blocks as well
    /// as fewer (the variant's units are finer than its kernel's).
    pub grid_exact: bool,
    /// A kernel launched just before this one (see [`PreLaunch`]).
    pub pre: Option<PreLaunch>,
    /// Whether it takes the stream's scratch buffer as one more argument without a
    /// pre-launch (attention_long: its per-unit counters and partial results).
    pub scratch: bool,
}

/// A kernel the backend launches just before a variant, on the same stream and with the
/// variant's arguments, both followed by one more: the stream's scratch buffer (the
/// backend's own, [`SCRATCH_BYTES`], one per stream and never reallocated, so a captured
/// graph keeps a valid address), which the pre-launch writes and the variant reads. Work
/// done once per launch instead of once per block (mul_mat_vec_q8's activation quantised).
pub(crate) struct PreLaunch {
    pub func: &'static str,
    /// Its grid for the launch's arguments (`None`: one block).
    pub grid: fn(args: &[KernelArg]) -> Option<u32>,
    /// Threads of its blocks.
    pub block: u32,
}

/// Bytes of each stream's scratch buffer: mul_mat_vec_q8's quantised activation rows
/// ([`MVQ_SCRATCH_BYTES`]), then (attention_long.rs ATT_LONG_SCRATCH_AT) the per-unit
/// counters and partial results of attention_long or attention_flash (one attention
/// launch runs at a time on a stream; each leaves the counters 0): ~17 MiB in all.
pub(crate) const SCRATCH_BYTES: usize = if ATT_FLASH_SCRATCH_END > ATT_LONG_SCRATCH_END {
    ATT_FLASH_SCRATCH_END
} else {
    ATT_LONG_SCRATCH_END
};

/// The scratch's part for matvec_q8.cuh's quantised activation rows (a byte per value,
/// then a scale and a Q8_1 sum per 32 values, rows mvq_row_stride apart): a verify
/// window's [`MVQ_TOKENS`] rows of up to [`MVQ_MAX_K`] values (mul_mat_vec_q8_rows).
pub(crate) const MVQ_SCRATCH_BYTES: usize = MVQ_TOKENS as usize * mvq_row_stride(MVQ_MAX_K);

/// Longest row mul_mat_vec_q8 takes (longer ones run mul_mat_vec).
const MVQ_MAX_K: u32 = 65_536;
/// Most activation rows (tokens) mul_mat_vec_q8_rows takes (matvec_q8.cuh MVQ_TOKENS).
const MVQ_TOKENS: u32 = 8;

/// Bytes between quantised activation rows in the scratch (matvec_q8.cuh
/// mvq_row_stride): 1.25 bytes a value, rounded up to 16.
const fn mvq_row_stride(k: u32) -> usize {
    (k as usize * 5 / 4).div_ceil(16) * 16
}
/// kernels-cuda/matvec_q8.cuh: warps of a block that compute (ops.rs launches one-token
/// products in blocks of 4 warps), steps of 1,024 values staged per warp at most.
const MVQ_WARPS: u32 = 4;
const MVQ_MAX_DEPTH: u32 = 8;

/// Dynamic shared memory matvec_q8.cuh's products take for `rows` weight rows a warp
/// (mul_mat_vec_q8 1, experts_gate_up_q8 2: gate and up) of ggml type `ty` and `k`
/// values: each of MVQ_WARPS warps stages up to MVQ_MAX_DEPTH steps of each row
/// (mvq_stage_u4: a step's bytes at any alignment, in 16-byte segments). `None` for a
/// launch they do not take: more than one token, a float format (nothing to quantise), a
/// row longer than the scratch holds or not whole blocks.
fn mvq_smem(ty: u32, k: u32, tokens: u32, rows: u32) -> Option<u32> {
    if tokens != 1 || k == 0 || k > MVQ_MAX_K {
        return None;
    }
    let t = tensor_core_format(ty)?;
    t.row_bytes(k as usize)?;
    let step = u32::try_from(t.row_bytes(1024)?).ok()?;
    let stage = (step + 30) / 16 * 16;
    // At most the 48 KiB a block has without opting in (Q8_0's gate and up rows: 5 steps).
    let fit = MVQ_SMEM_MAX / (MVQ_WARPS * rows * stage);
    let depth = k.div_ceil(1024).min(MVQ_MAX_DEPTH).min(fit);
    (depth > 0).then_some(MVQ_WARPS * rows * depth * stage)
}

/// Dynamic shared memory a kernel may take without raising its limit.
const MVQ_SMEM_MAX: u32 = 48 * 1024;

/// Blocks of matvec_q8.cuh's products: a unit of up to MVQ_WARPS rows (a row a warp) per
/// `per_row_group` (slots), whatever grid the launch had.
fn mvq_grid(m: u32, per_row_group: u32, block_threads: u32) -> Option<u32> {
    let warps = (block_threads / 32).clamp(1, MVQ_WARPS);
    m.div_ceil(warps)
        .checked_mul(per_row_group)
        .map(|g| g.max(1))
}

/// The quantise kernel before matvec_q8.cuh's products: 256 values a block of 256 threads
/// (MVQ_QUANT_VALUES), for `k` values.
fn mvq_quantise_grid(k: u32) -> u32 {
    k.div_ceil(256).max(1)
}

/// mul_mat_experts_q8's launches: `Some((activation rows, k))` for one token, the token's
/// row or (x_per_slot) one per slot, when they fit the scratch at mvq_row_stride apart.
/// mul_mat_experts(w, x, ids, y | type, m, k, n_tokens, n_used, x_per_slot, expert_bytes)
fn mvq_expert_rows(a: &[KernelArg]) -> Option<(u32, u32)> {
    let (k, n_used, per_slot) = (u32_arg(a, 6)?, u32_arg(a, 8)?, u32_arg(a, 9)?);
    let rows = if per_slot != 0 { n_used } else { 1 };
    mvq_rows_fit(rows, k).then_some((rows, k))
}

/// Whether `rows` quantised activation rows of `k` values fit the scratch.
fn mvq_rows_fit(rows: u32, k: u32) -> bool {
    (rows as usize)
        .checked_mul(mvq_row_stride(k))
        .is_some_and(|b| b <= MVQ_SCRATCH_BYTES)
}

/// Dynamic shared memory mul_mat_vec_q8_rows takes for a launch of `tokens` activation
/// rows, weights of ggml type `ty` and rows of `k` values: a verify window's 2..=MVQ_TOKENS
/// rows, where mul_mat_vec_q8 would take each row alone (each warp stages its weight row
/// once, as for one token, so the same bytes).
fn mvq_rows_smem(ty: u32, k: u32, tokens: u32) -> Option<u32> {
    if !(2..=MVQ_TOKENS).contains(&tokens) || !mvq_rows_fit(tokens, k) {
        return None;
    }
    mvq_smem(ty, k, 1, 1)
}

/// Dynamic shared memory mul_mat_qkv_q8_rows takes for a window's Q, K and V:
/// mvq_rows_smem of each matrix (the largest: the kernel stages each unit's rows at the
/// depth its format fits), when all three quantised formats share an activation format
/// (the rows are quantised once for all three).
/// mul_mat_qkv(wq, wk, wv, x, q, k, v | type_q, type_k, type_v, m_q, m_k, m_v, k, n)
fn qkv_rows_smem(a: &[KernelArg]) -> Option<u32> {
    let (k, n) = (u32_arg(a, 13)?, u32_arg(a, 14)?);
    let types = [u32_arg(a, 7)?, u32_arg(a, 8)?, u32_arg(a, 9)?];
    let act = |ty: u32| Some(strata_quant::scalar_kernels(tensor_core_format(ty)?)?.act);
    let first = act(types[0])?;
    let mut smem = 0;
    for ty in types {
        if act(ty)? != first {
            return None;
        }
        smem = smem.max(mvq_rows_smem(ty, k, n)?);
    }
    Some(smem)
}

/// Blocks of mul_mat_qkv_q8_rows: mvq_grid's units of Q, then K, then V.
fn qkv_rows_grid(a: &[KernelArg], block_threads: u32) -> Option<u32> {
    let mut blocks = 0u32;
    for i in 10..13 {
        blocks = blocks.checked_add(mvq_grid(u32_arg(a, i)?, 1, block_threads)?)?;
    }
    Some(blocks)
}

/// The u32 scalar at argument `i`, if that is one.
fn u32_arg(args: &[KernelArg], i: usize) -> Option<u32> {
    match args.get(i) {
        Some(KernelArg::U32(v)) => Some(*v),
        _ => None,
    }
}

/// Tokens from which products run on tensor cores (kernels-cuda/mma.cuh): below, the
/// weights staged in shared memory would serve too few tokens to pay for staging them.
const MMA_MIN_TOKENS: u32 = 16;
/// Grouped expert products on tensor cores from this many tokens (a few tokens per
/// routed expert, with 8 of 128 experts per token).
const MMA_EXPERTS_MIN_TOKENS: u32 = 64;

/// Tokens above which expert products group their pairs by expert (kernels-cuda/
/// slot_units.cuh MOE_GROUP_MIN_TOKENS).
const MOE_GROUP_MIN_TOKENS: u32 = 2;

/// Slots the grouped expert kernel lists at once (kernels-cuda/model.cu MMA_LIST_MAX).
const MMA_LIST_MAX: u64 = 8192;

/// Dynamic shared memory mma.cuh's kernels take for weights of ggml type `ty` and rows of
/// `k` values (mma_layout, mma_tokens: 64 weight rows and the largest token tile of 32,
/// 16 or 8 that fits `limit` with `extra` bytes besides), or `None` for a format without
/// a tensor-core path.
fn mma_shared_bytes(ty: u32, k: u32, extra: u64, limit: u32) -> Option<u32> {
    let t = tensor_core_format(ty)?;
    let row_bytes = u64::try_from(t.row_bytes(k as usize)?).ok()?;
    let (k, w_stride) = (u64::from(k), row_bytes.div_ceil(16) * 16 + 16);
    [32u64, 16, 8].into_iter().find_map(|tokens| {
        // Weight rows; activation rows, their scales and sums; what the caller adds.
        let bytes = 64 * w_stride + tokens * (k + 16) + tokens * (k / 32) * 8 + extra;
        u32::try_from(bytes).ok().filter(|&b| b <= limit)
    })
}

/// The quantised format of ggml type `ty` if the tensor-core kernels (mma.cuh, mmq.cuh)
/// take it.
fn tensor_core_format(ty: u32) -> Option<strata_quant::QuantType> {
    use strata_quant::QuantType;
    // kernels-cuda/quant.cuh's QUANT_FORMATS.
    const FORMATS: [QuantType; 18] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q2_K,
        QuantType::Q3_K,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
        QuantType::IQ2_XXS,
        QuantType::IQ2_XS,
        QuantType::IQ2_S,
        QuantType::IQ3_XXS,
        QuantType::IQ3_S,
        QuantType::IQ4_NL,
        QuantType::IQ4_XS,
        QuantType::MXFP4,
    ];
    QuantType::from_id(ty).filter(|t| FORMATS.contains(t))
}

/// Launches of more than this many tokens attend on tensor cores (attention_prefill.cuh,
/// either cache format): the per-row kernels' results do not depend on the batch, which
/// decode steps, verify windows and short reads need; a prefill only needs them within
/// rounding.
const ATTENTION_PER_ROW_MAX_TOKENS: u32 = 64;

/// The K/V cache format of an attention launch: f16 rows, or q8_0 blocks (kv_q8.cuh).
#[derive(Clone, Copy)]
enum KvRows {
    F16,
    Q8,
}

/// Dynamic shared memory attention_prefill (f16 cache) and attention_prefill_q8 take
/// (attention_prefill.cuh): 128 query rows of head_dim f16 + 8 of padding, then two stages
/// of 64 K and 64 V rows alike (atp_smem_bytes), or for q8_0 one converted chunk of them
/// and two stages of 64 K and 64 V raw rows, each the 16-byte pieces that cover a head's
/// blocks from any even offset (atp_q8_smem_bytes). `None` for a launch they do not take
/// (head_dim not a multiple of 32 or over 128, a group of query heads larger than a
/// block's 128 rows) or that does not fit `limit`.
fn attention_prefill_smem(args: &[KernelArg], limit: u32, rows: KvRows) -> Option<u32> {
    // attention(q, pos, k, v, out | n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale)
    let (n_tokens, n_head, n_kv_head, head_dim) = (
        u32_arg(args, 5)?,
        u32_arg(args, 6)?,
        u32_arg(args, 7)?,
        u32_arg(args, 8)?,
    );
    let shape_ok = n_kv_head > 0
        && n_head % n_kv_head == 0
        && n_head / n_kv_head <= 128
        && head_dim > 0
        && head_dim % 32 == 0
        && head_dim <= 128;
    if n_tokens <= ATTENTION_PER_ROW_MAX_TOKENS || !shape_ok {
        return None;
    }
    let row = (head_dim + 8) * 2;
    let bytes = match rows {
        KvRows::F16 => (128 + 4 * 64) * row,
        KvRows::Q8 => {
            let raw_row = (head_dim / 32 * 34 + 14).div_ceil(16) * 16;
            (128 + 2 * 64) * row + 4 * 64 * raw_row
        }
    };
    Some(bytes).filter(|&b| b <= limit)
}

/// Launches of more than this many tokens run mmq.cuh's kernels (float accumulation over
/// K, within rounding of the one-row kernels); up to it, whose rows must not depend on the
/// batch (decode, verify windows, short reads), the bit-exact ones.
const MMQ_MIN_TOKENS_EXCLUSIVE: u32 = 64;
/// Slots mul_mat_experts_mmq lists at once (kernels-cuda/mmq.cuh MMQ_LIST), 4 bytes each.
const MMQ_LIST: u64 = 1024;

/// Dynamic shared memory mmq.cuh's kernels take for ggml type `ty` (mmq_layout: 128
/// weight rows of 272 int8 bytes and their 8 sub-blocks' float4 terms, the raw bytes of a
/// 256-value chunk of each row, 64 activation rows of 272 bytes and their sub-blocks'
/// float4 terms), plus `extra`, or `None` for a format without that path.
fn mmq_shared_bytes(ty: u32, extra: u64, limit: u32) -> Option<u32> {
    let t = tensor_core_format(ty)?;
    let chunk = u64::try_from(t.row_bytes(256)?).ok()?;
    let mut raw_stride = (chunk.div_ceil(16) + 1) * 16;
    if (raw_stride / 16) % 2 == 0 {
        raw_stride += 16;
    }
    let bytes = 128 * 272 + 8 * 128 * 16 + 128 * raw_stride + 64 * 272 + 8 * 64 * 16;
    u32::try_from(bytes + extra).ok().filter(|&b| b <= limit)
}

/// attention_prefill's units (attention_prefill.cuh): tiles of 16 query rows a warp, as
/// many tokens as fill them with one K/V head's query heads, per K/V head. The model's grid
/// for `attention` is a block per (token, query head), 128 times as many at Qwen3's shape.
fn attention_prefill_grid(args: &[KernelArg], block_threads: u32) -> Option<u32> {
    let (n_tokens, n_head, n_kv_head) = (u32_arg(args, 5)?, u32_arg(args, 6)?, u32_arg(args, 7)?);
    let group = n_head.checked_div(n_kv_head)?;
    let tokens_per_tile = (16 * (block_threads / 32)).checked_div(group)?;
    let tiles = n_tokens.div_ceil(tokens_per_tile.max(1));
    tiles.checked_mul(n_kv_head).map(|b| b.max(1))
}

/// The float weight formats (kernels-cuda/quant.cuh's T_F32, T_F16, T_BF16), by ggml id.
const FLOAT_TYPES: [u32; 3] = [
    strata_quant::QuantType::F32.id(),
    strata_quant::QuantType::F16.id(),
    strata_quant::QuantType::BF16.id(),
];

/// Variants for launches of one token (kernels-cuda/matvec_q8.cuh: the activation
/// quantised once, every weight row's bytes in flight; matvec.cuh: fewer registers, no
/// staging) and of many (mma.cuh: tensor cores).
/// A fused gate and up window form of `of` (fused.cu's `func`, launched after `pre`).
const fn gate_up_window(of: KernelId, func: &'static str, pre: &'static str) -> Variant {
    Variant {
        of,
        func,
        applies: |a, _| gate_up_window_rows(a).map(|_| 0),
        large_smem: false,
        grid: Some(gate_up_window_blocks),
        grid_exact: false,
        pre: Some(PreLaunch {
            func: pre,
            grid: |a| {
                let (rows, k) = gate_up_window_rows(a)?;
                rows.checked_mul(mvq_quantise_grid(k))
            },
            block: 256,
        }),
        scratch: false,
    }
}

pub(crate) const VARIANTS: &[Variant] = &[
    // mul_mat(w, x, y | type, m, k, n)
    Variant {
        of: KernelId::MulMat,
        func: "mul_mat_vec_q8",
        applies: |a, _| mvq_smem(u32_arg(a, 3)?, u32_arg(a, 5)?, u32_arg(a, 6)?, 1),
        large_smem: false,
        // A row a warp (ops.rs's grid has two), so an SM holds more warps.
        grid: Some(|a, block| mvq_grid(u32_arg(a, 4)?, 1, block)),
        grid_exact: true,
        pre: Some(PreLaunch {
            func: "quantise_act_q8",
            grid: |a| Some(mvq_quantise_grid(u32_arg(a, 5)?)),
            block: 256,
        }),
        scratch: false,
    },
    // The same for a verify window of 2..=8 tokens: each weight row staged once for all
    // the rows, every row bit for bit mul_mat_vec_q8's for it alone (launch_options.rs
    // leaves it out by default until measured).
    Variant {
        of: KernelId::MulMat,
        func: "mul_mat_vec_q8_rows",
        applies: |a, _| mvq_rows_smem(u32_arg(a, 3)?, u32_arg(a, 5)?, u32_arg(a, 6)?),
        large_smem: false,
        grid: Some(|a, block| mvq_grid(u32_arg(a, 4)?, 1, block)),
        grid_exact: true,
        // quantise_act_q8 quantises the n rows, mvq_row_stride apart.
        pre: Some(PreLaunch {
            func: "quantise_act_q8",
            grid: |a| u32_arg(a, 6)?.checked_mul(mvq_quantise_grid(u32_arg(a, 5)?)),
            block: 256,
        }),
        scratch: false,
    },
    // Up to MVQ_TOKENS tokens with float weights (the routers, a verify window's too):
    // mul_mat_vec's units, a unit per (token, rows), their loads batched (matvec.cuh's
    // mv_float_rows), in a kernel whose registers are its own. Each token's row is bit for
    // bit its one-token product (the tiled mul_mat's too); the weights are read again per
    // token, from L2 (a router is 1 MiB).
    Variant {
        of: KernelId::MulMat,
        func: "mul_mat_vec_f",
        applies: |a, _| {
            let float = u32_arg(a, 3).is_some_and(|ty| FLOAT_TYPES.contains(&ty));
            (float && u32_arg(a, 6).is_some_and(|n| n <= MVQ_TOKENS)).then_some(0)
        },
        large_smem: false,
        grid: None,
        grid_exact: false,
        pre: None,
        scratch: false,
    },
    Variant {
        of: KernelId::MulMat,
        func: "mul_mat_vec",
        applies: |a, _| u32_arg(a, 6).is_some_and(|n| n <= 1).then_some(0),
        large_smem: false,
        grid: None,
        grid_exact: false,
        pre: None,
        scratch: false,
    },
    Variant {
        of: KernelId::MulMat,
        func: "mul_mat_mmq",
        applies: |a, limit| match (u32_arg(a, 3), u32_arg(a, 6)) {
            (Some(ty), Some(n)) if n > MMQ_MIN_TOKENS_EXCLUSIVE => mmq_shared_bytes(ty, 0, limit),
            _ => None,
        },
        large_smem: true,
        // Units of 128 rows x 64 tokens (mmq.cuh), where ops.rs gives a block per 16 rows
        // and 8 tokens.
        grid: Some(|a, _| {
            let (m, n) = (u32_arg(a, 4)?, u32_arg(a, 6)?);
            m.div_ceil(128).checked_mul(n.div_ceil(64))
        }),
        grid_exact: false,
        pre: None,
        scratch: false,
    },
    Variant {
        of: KernelId::MulMat,
        func: "mul_mat_mma",
        applies: |a, limit| match (u32_arg(a, 3), u32_arg(a, 5), u32_arg(a, 6)) {
            (Some(ty), Some(k), Some(n)) if n >= MMA_MIN_TOKENS => {
                mma_shared_bytes(ty, k, 0, limit)
            }
            _ => None,
        },
        large_smem: true,
        grid: None,
        grid_exact: false,
        pre: None,
        scratch: false,
    },
    // mul_mat_qkv(wq, wk, wv, x, q, k, v | type_q, .., m_q, .., k, n) for a verify window of
    // 2..=8 tokens: mul_mat_vec_q8_rows' units for Q, K and V in one launch over the rows
    // quantised once (fused.cu), every output bit for bit mul_mat_vec_q8_rows' for its
    // matrix alone. One-token launches keep the kernel.
    Variant {
        of: KernelId::MulMatQkv,
        func: "mul_mat_qkv_q8_rows",
        applies: |a, _| qkv_rows_smem(a),
        large_smem: false,
        grid: Some(qkv_rows_grid),
        grid_exact: true,
        pre: Some(PreLaunch {
            func: "quantise_act_q8_qkv",
            grid: |a| u32_arg(a, 14)?.checked_mul(mvq_quantise_grid(u32_arg(a, 13)?)),
            block: 256,
        }),
        scratch: false,
    },
    // mul_mat_experts(w, x, ids, y | type, m, k, n_tokens, ...): the ungrouped form.
    Variant {
        of: KernelId::MulMatExperts,
        func: "mul_mat_experts_q8",
        applies: |a, _| {
            mvq_expert_rows(a)?;
            mvq_smem(u32_arg(a, 4)?, u32_arg(a, 6)?, u32_arg(a, 7)?, 1)
        },
        large_smem: false,
        // A row a warp, per slot.
        grid: Some(|a, block| {
            let slots = u32_arg(a, 7)?.checked_mul(u32_arg(a, 8)?)?;
            mvq_grid(u32_arg(a, 5)?, slots, block)
        }),
        grid_exact: true,
        pre: Some(PreLaunch {
            func: "quantise_act_q8_experts",
            grid: |a| {
                let (rows, k) = mvq_expert_rows(a)?;
                rows.checked_mul(mvq_quantise_grid(k))
            },
            block: 256,
        }),
        scratch: false,
    },
    // The same for a verify window of a quantised format: mul_mat_experts_cached_multi_q8's
    // units over resident experts (model.cu mul_mat_experts_multi_q8), each routed expert's
    // rows read once for all its pairs, over rows quantised once by the same pre-launch;
    // bit for bit the per-pair forms (mul_mat_experts_vec, mul_mat_experts_q8 for a token
    // alone). Before mul_mat_experts_vec, which keeps what this declines.
    Variant {
        of: KernelId::MulMatExperts,
        func: "mul_mat_experts_multi_q8",
        applies: |a, _| experts_multi_q8_rows(a).map(|_| 0),
        large_smem: false,
        grid: Some(experts_window_q8_blocks),
        grid_exact: false,
        pre: Some(PreLaunch {
            func: "quantise_act_q8_experts",
            grid: |a| {
                let (rows, k) = experts_multi_q8_rows(a)?;
                rows.checked_mul(mvq_quantise_grid(k))
            },
            block: 256,
        }),
        scratch: false,
    },
    Variant {
        of: KernelId::MulMatExperts,
        func: "mul_mat_experts_vec",
        applies: |a, _| u32_arg(a, 7).is_some_and(|n| n <= 2).then_some(0),
        large_smem: false,
        grid: None,
        grid_exact: false,
        pre: None,
        scratch: false,
    },
    Variant {
        of: KernelId::MulMatExperts,
        func: "mul_mat_experts_mmq",
        applies: |a, limit| match (u32_arg(a, 4), u32_arg(a, 7)) {
            (Some(ty), Some(n)) if n > MMQ_MIN_TOKENS_EXCLUSIVE => {
                mmq_shared_bytes(ty, MMQ_LIST * 4, limit)
            }
            _ => None,
        },
        large_smem: true,
        grid: None,
        grid_exact: false,
        pre: None,
        scratch: false,
    },
    Variant {
        of: KernelId::MulMatExperts,
        func: "mul_mat_experts_mma",
        applies: |a, limit| match (u32_arg(a, 4), u32_arg(a, 6), u32_arg(a, 7), u32_arg(a, 8)) {
            (Some(ty), Some(k), Some(n), Some(used)) if n >= MMA_EXPERTS_MIN_TOKENS => {
                // Room for the listed slots, 4 bytes each.
                let list = (u64::from(n) * u64::from(used)).min(MMA_LIST_MAX) * 4;
                mma_shared_bytes(ty, k, list, limit)
            }
            _ => None,
        },
        large_smem: true,
        grid: None,
        grid_exact: false,
        pre: None,
        scratch: false,
    },
    // mul_mat_experts_cached(slots, table, x, ids, y | type, m, k, n_tokens, n_used,
    // x_per_slot, n_expert, ...) for a verify window of a quantised format: as
    // mul_mat_experts_cached_multi (below, which keeps what this declines) over activation
    // rows quantised once per launch by quantise_act_q8_window (every unit of the other
    // quantises its rows itself, between two block barriers); bit for bit the per-pair
    // kernel (experts.cu, matvec_window_q8.cuh).
    Variant {
        of: KernelId::MulMatExpertsCached,
        func: "mul_mat_experts_cached_multi_q8",
        applies: |a, _| cached_multi_q8_rows(a).map(|_| 0),
        large_smem: false,
        grid: Some(cached_window_q8_blocks),
        grid_exact: false,
        pre: Some(PreLaunch {
            func: "quantise_act_q8_window",
            grid: |a| {
                let (rows, k) = cached_multi_q8_rows(a)?;
                rows.checked_mul(mvq_quantise_grid(k))
            },
            block: 256,
        }),
        scratch: false,
    },
    // The same for every window format: a one-token unit per (routed expert, 16 rows), its
    // rows read once for every pair routed to it (experts.cu).
    Variant {
        of: KernelId::MulMatExpertsCached,
        func: "mul_mat_experts_cached_multi",
        applies: |a, _| cached_multi_applies(u32_arg(a, 8)?, u32_arg(a, 9)?).then_some(0),
        large_smem: false,
        grid: Some(cached_expert_units),
        grid_exact: false,
        pre: None,
        scratch: false,
    },
    // mul_mat_experts_cached(slots, table, x, ids, y | type, m, k, n_tokens, n_used,
    // x_per_slot, n_expert, ...): a window's pairs grouped by expert (experts.cu), each
    // resident expert's rows decoded once per tile of its pairs.
    Variant {
        of: KernelId::MulMatExpertsCached,
        func: "mul_mat_experts_cached_grouped",
        applies: |a, _| {
            u32_arg(a, 8)
                .is_some_and(|n| n > MOE_GROUP_MIN_TOKENS)
                .then_some(0)
        },
        large_smem: false,
        // A unit per (routed expert, 16 rows), not per (pair, 16 rows).
        grid: Some(cached_expert_units),
        grid_exact: false,
        pre: None,
        scratch: false,
    },
    // experts_gate_up(wg, wu, x, ids, y | type, m, k, n_tokens, n_used, ...): one token.
    Variant {
        of: KernelId::ExpertsGateUp,
        func: "experts_gate_up_q8",
        applies: |a, _| mvq_smem(u32_arg(a, 5)?, u32_arg(a, 7)?, u32_arg(a, 8)?, 2),
        large_smem: false,
        // A gate and up row pair a warp, per slot (as ops.rs's grid for 4-warp blocks).
        grid: Some(|a, block| {
            let slots = u32_arg(a, 8)?.checked_mul(u32_arg(a, 9)?)?;
            mvq_grid(u32_arg(a, 6)?, slots, block)
        }),
        grid_exact: true,
        pre: Some(PreLaunch {
            func: "quantise_act_q8_gate_up",
            grid: |a| Some(mvq_quantise_grid(u32_arg(a, 7)?)),
            block: 256,
        }),
        scratch: false,
    },
    // experts_gate_up(wg, wu, x, ids, y | type, m, k, n_tokens, n_used, ...) for a verify
    // window of a quantised format: mul_mat_experts_multi_q8's units with a warp's rows one
    // gate and one up row (fused.cu), each routed expert's rows read once for all its pairs,
    // over every token's row quantised once by the one-token form's pre-launch; bit for bit
    // the kernel (its per-pair units).
    gate_up_window(
        KernelId::ExpertsGateUp,
        "experts_gate_up_multi_q8",
        "quantise_act_q8_gate_up",
    ),
    // experts_gate_up_cached(slots, table, x, ids, y | type, m, k, n_tokens, n_used, ...)
    // for a verify window: the same units over the cache's slots (fused.cu), bit for bit the
    // kernel.
    gate_up_window(
        KernelId::ExpertsGateUpCached,
        "experts_gate_up_cached_multi_q8",
        "quantise_act_q8_gate_up_window",
    ),
    // attention(q, pos, k, v, out | n_tokens, ...) of up to 64 tokens in a context longer
    // than 1,024 rows, head_dim 128: long spans over up to 128 blocks on tensor cores
    // (attention_flash.cuh); before attention_long, which keeps what it declines.
    Variant {
        of: KernelId::Attention,
        func: "attention_flash",
        applies: attention_flash_applies,
        large_smem: false,
        grid: Some(attention_flash_grid),
        grid_exact: true,
        pre: None,
        scratch: true,
    },
    Variant {
        of: KernelId::AttentionQ8,
        func: "attention_flash_q8",
        applies: attention_flash_applies,
        large_smem: false,
        grid: Some(attention_flash_grid),
        grid_exact: true,
        pre: None,
        scratch: true,
    },
    // The same launches of other head dimensions (or with attention_flash left out): long
    // spans over up to 64 blocks (attention_long.cuh).
    Variant {
        of: KernelId::Attention,
        func: "attention_long",
        applies: attention_long_applies,
        large_smem: false,
        grid: Some(attention_long_grid),
        grid_exact: true,
        pre: None,
        scratch: true,
    },
    Variant {
        of: KernelId::AttentionQ8,
        func: "attention_long_q8",
        applies: attention_long_applies,
        large_smem: false,
        grid: Some(attention_long_grid),
        grid_exact: true,
        pre: None,
        scratch: true,
    },
    // attention(q, pos, k, v, out | n_tokens, ...): prefill batches on tensor cores.
    Variant {
        of: KernelId::Attention,
        func: "attention_prefill",
        applies: |a, limit| attention_prefill_smem(a, limit, KvRows::F16),
        large_smem: true,
        grid: Some(attention_prefill_grid),
        grid_exact: false,
        pre: None,
        scratch: false,
    },
    // The same over the q8_0 caches: their blocks converted to f16 in shared memory.
    Variant {
        of: KernelId::AttentionQ8,
        func: "attention_prefill_q8",
        applies: |a, limit| attention_prefill_smem(a, limit, KvRows::Q8),
        large_smem: true,
        grid: Some(attention_prefill_grid),
        grid_exact: false,
        pre: None,
        scratch: false,
    },
];

/// A kernel the backend runs with another kernel's function and some of its variants,
/// because they compute what it asks for.
pub(crate) struct Alias {
    pub id: KernelId,
    pub runs: KernelId,
    /// The variants of `runs` that may take its launches (the others never do).
    pub variants: &'static [&'static str],
    /// Most tokens (argument 5) a launch may have.
    pub max_tokens: u32,
}

/// attention_rows (a verify window's rows, each as a one-token launch computes it):
/// attention's kernel and its long-span variants compute each row of a launch of up to
/// ATT_LONG_MAX_TOKENS tokens from that row's own span only, whatever the launch's other
/// rows (attention.cuh, attention_long.cuh, attention_flash.cuh; the GPU tests check rows
/// alone against rows in windows), so one launch replaces the window's one-token launches.
/// The prefill variant (tiles over the batch, over ATTENTION_PER_ROW_MAX_TOKENS tokens)
/// never takes them.
pub(crate) const ALIASES: &[Alias] = &[Alias {
    id: KernelId::AttentionRows,
    runs: KernelId::Attention,
    variants: &["attention_flash", "attention_long"],
    max_tokens: crate::attention_long::ATT_LONG_MAX_TOKENS,
}];

// attention_rows' contract (core) must fit what the alias takes.
const _: () =
    assert!(crate::attention_long::ATT_LONG_MAX_TOKENS >= strata_core::ATTENTION_ROWS_MAX_TOKENS);

/// The kernel whose function `id` runs on this backend, when it runs another's.
pub fn runs_as(id: KernelId) -> Option<KernelId> {
    ALIASES.iter().find(|a| a.id == id).map(|a| a.runs)
}

#[cfg(test)]
mod tests;
mod window;
