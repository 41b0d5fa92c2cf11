//! When the backend launches kernels-cuda/attention_long.cuh's kernels (`attention_long`,
//! `attention_long_q8`) in place of `attention` and `attention_q8`, and their grid. They
//! cut a row of a long span over up to 64 blocks and merge the pieces' results through the
//! stream's scratch buffer; the constants below are the header's (a test reads them back).

use strata_core::KernelArg;

/// Spans longer than this take the long path (attention_long.cuh ATT_LONG_MIN_SPAN): a
/// launch whose context is no longer than it runs the plain kernel, with the same results.
pub(crate) const ATT_LONG_MIN_SPAN: u32 = 1024;
/// Most tokens a launch of the long kernels may have (ATT_LONG_MAX_TOKENS): the launches
/// whose rows must not depend on the batch (variants.rs ATTENTION_PER_ROW_MAX_TOKENS).
pub(crate) const ATT_LONG_MAX_TOKENS: u32 = 64;
/// Groups (clusters) a unit's span is cut into at most (ATT_LONG_GROUPS).
pub(crate) const ATT_LONG_GROUPS: u32 = 4;
/// Blocks of a group: the kernels' cluster width on sm_90 (ATT_LONG_GROUP).
const ATT_LONG_GROUP: u32 = 16;
/// Where the attention's part of the scratch starts: after matvec_q8.cuh's quantised
/// activation rows (ATT_LONG_SCRATCH_AT).
pub(crate) const ATT_LONG_SCRATCH_AT: usize = 655_360;
/// Per-unit counters (u32) at the start of that part (ATT_LONG_COUNTERS).
pub(crate) const ATT_LONG_COUNTERS: usize = 16_384;
/// Bytes of the groups' results after the counters (ATT_LONG_PARTIAL_BYTES): (head_dim +
/// 2) floats per (token, query head, group), for 64 tokens of n_head * (head_dim + 2) up
/// to 8,704 (64 heads of 128, 32 of 256).
pub(crate) const ATT_LONG_PARTIAL_BYTES: usize = 8_912_896;
/// Bytes of the scratch the long kernels use, from its start.
pub(crate) const ATT_LONG_SCRATCH_END: usize =
    ATT_LONG_SCRATCH_AT + 4 * ATT_LONG_COUNTERS + ATT_LONG_PARTIAL_BYTES;
// The scratch holds the attention's part, after mul_mat_vec_q8's.
const _: () = assert!(
    ATT_LONG_SCRATCH_AT >= crate::variants::MVQ_SCRATCH_BYTES
        && crate::variants::SCRATCH_BYTES >= ATT_LONG_SCRATCH_END
);

/// Clusters a launch gets at most (its work items are taken in a grid-stride loop).
pub(crate) const ATT_LONG_MAX_CLUSTERS: u64 = 128;

/// The u32 scalar at argument `i`, if that is one.
pub(crate) fn u32_arg(args: &[KernelArg], i: usize) -> Option<u32> {
    match args.get(i) {
        Some(KernelArg::U32(v)) => Some(*v),
        _ => None,
    }
}

/// Units of a launch of `n_tokens`: (token, K/V head, group of up to 8 query heads).
pub(crate) fn units(n_tokens: u32, n_head: u32, n_kv_head: u32) -> Option<u64> {
    let group = n_head.checked_div(n_kv_head)?;
    Some(u64::from(n_tokens) * u64::from(n_kv_head) * u64::from(group.div_ceil(8)))
}

/// Whether the long kernels take a launch: up to ATT_LONG_MAX_TOKENS tokens, a context
/// longer than ATT_LONG_MIN_SPAN, and a shape whose ATT_LONG_MAX_TOKENS-token launch fits
/// the scratch. The last depends on the model's shape only, not on this launch's tokens:
/// a model's rows take the same path in a launch of one token and in one of 64, so a row's
/// result never depends on its batch.
/// attention(q, pos, k, v, out | n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale)
pub(crate) fn attention_long_applies(args: &[KernelArg], _limit: u32) -> Option<u32> {
    long_span_applies(args, ATT_LONG_GROUPS, ATT_LONG_PARTIAL_BYTES, |d| d != 0)
}

/// What the long-span kernels (these and attention_flash.rs's) ask of a launch: the
/// conditions above for `groups` groups a unit, whose results fit `partial_bytes`, and a
/// head dimension `head_dim_ok` takes.
pub(crate) fn long_span_applies(
    args: &[KernelArg],
    groups: u32,
    partial_bytes: usize,
    head_dim_ok: fn(u32) -> bool,
) -> Option<u32> {
    let (n_tokens, n_head, n_kv_head, head_dim, n_ctx) = (
        u32_arg(args, 5)?,
        u32_arg(args, 6)?,
        u32_arg(args, 7)?,
        u32_arg(args, 8)?,
        u32_arg(args, 9)?,
    );
    if n_tokens == 0 || n_tokens > ATT_LONG_MAX_TOKENS || n_ctx <= ATT_LONG_MIN_SPAN {
        return None;
    }
    if n_kv_head == 0 || n_head % n_kv_head != 0 || !head_dim_ok(head_dim) {
        return None;
    }
    let max_units = units(ATT_LONG_MAX_TOKENS, n_head, n_kv_head)?;
    let partial = u64::from(ATT_LONG_MAX_TOKENS)
        * u64::from(n_head)
        * u64::from(groups)
        * (u64::from(head_dim) + 2)
        * 4;
    (max_units <= ATT_LONG_COUNTERS as u64 && partial <= partial_bytes as u64).then_some(0)
}

/// The long kernels' grid (blocks): a cluster per work item (unit, group), at most
/// ATT_LONG_MAX_CLUSTERS; the kernel skips the items a unit does not have (the groups of
/// a short span past its first), so the grid depends on the launch's shape, never on the
/// positions (which a captured graph changes between replays).
pub(crate) fn attention_long_grid(args: &[KernelArg], _block_threads: u32) -> Option<u32> {
    long_span_grid(args, ATT_LONG_GROUPS, ATT_LONG_GROUP)
}

/// A cluster of `cluster` blocks per work item, `groups` items a unit, at most
/// ATT_LONG_MAX_CLUSTERS clusters (the kernels take the rest in a grid-stride loop).
pub(crate) fn long_span_grid(args: &[KernelArg], groups: u32, cluster: u32) -> Option<u32> {
    let (n_tokens, n_head, n_kv_head) = (u32_arg(args, 5)?, u32_arg(args, 6)?, u32_arg(args, 7)?);
    let items = units(n_tokens, n_head, n_kv_head)? * u64::from(groups);
    let clusters = items.clamp(1, ATT_LONG_MAX_CLUSTERS);
    u32::try_from(clusters * u64::from(cluster)).ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::KERNEL_HEADERS;

    pub(crate) fn attention(
        n_tokens: u32,
        n_head: u32,
        n_kv_head: u32,
        head_dim: u32,
        n_ctx: u32,
    ) -> Vec<KernelArg> {
        let buf = KernelArg::U64(0x1000);
        vec![
            buf,
            buf,
            buf,
            buf,
            buf,
            KernelArg::U32(n_tokens),
            KernelArg::U32(n_head),
            KernelArg::U32(n_kv_head),
            KernelArg::U32(head_dim),
            KernelArg::U32(n_ctx),
            KernelArg::F32(0.088),
        ]
    }

    /// The value of `#define NAME value` in kernels-cuda/attention_long.cuh.
    fn header_define(name: &str) -> Option<u64> {
        define_in("attention_long.cuh", name)
    }

    /// The value of `#define NAME value` in kernels-cuda/`header`.
    pub(crate) fn define_in(header: &str, name: &str) -> Option<u64> {
        let (_, text) = KERNEL_HEADERS.iter().find(|(n, _)| *n == header)?;
        text.lines().find_map(|l| {
            let rest = l.trim().strip_prefix("#define ")?.strip_prefix(name)?;
            if !rest.starts_with(char::is_whitespace) {
                return None; // a longer name
            }
            rest.split_whitespace().next()?.parse().ok()
        })
    }

    #[test]
    fn constants_are_the_headers() {
        assert_eq!(
            header_define("ATT_LONG_MIN_SPAN"),
            Some(u64::from(ATT_LONG_MIN_SPAN))
        );
        assert_eq!(
            header_define("ATT_LONG_MAX_TOKENS"),
            Some(u64::from(ATT_LONG_MAX_TOKENS))
        );
        assert_eq!(
            header_define("ATT_LONG_GROUPS"),
            Some(u64::from(ATT_LONG_GROUPS))
        );
        assert_eq!(
            header_define("ATT_LONG_GROUP"),
            Some(u64::from(ATT_LONG_GROUP))
        );
        assert_eq!(
            header_define("ATT_LONG_SCRATCH_AT"),
            Some(ATT_LONG_SCRATCH_AT as u64)
        );
        assert_eq!(
            header_define("ATT_LONG_COUNTERS"),
            Some(ATT_LONG_COUNTERS as u64)
        );
        assert_eq!(
            header_define("ATT_LONG_PARTIAL_BYTES"),
            Some(ATT_LONG_PARTIAL_BYTES as u64)
        );
    }

    #[test]
    fn long_kernels_take_long_contexts_of_per_row_launches() {
        // Qwen3-30B-A3B's shape: a decode step and a 64-token read at 32K.
        assert_eq!(
            attention_long_applies(&attention(1, 32, 4, 128, 32_768), 0),
            Some(0)
        );
        assert_eq!(
            attention_long_applies(&attention(64, 32, 4, 128, 32_768), 0),
            Some(0)
        );
        // Not: a context no row of which is long, a prefill batch, no tokens.
        assert!(attention_long_applies(&attention(1, 32, 4, 128, 1024), 0).is_none());
        assert_eq!(
            attention_long_applies(&attention(1, 32, 4, 128, 1025), 0),
            Some(0)
        );
        assert!(attention_long_applies(&attention(65, 32, 4, 128, 32_768), 0).is_none());
        assert!(attention_long_applies(&attention(0, 32, 4, 128, 32_768), 0).is_none());
        // Shapes: the largest that fit (64 heads of 128, 32 of 256), one past, bad GQA.
        assert_eq!(
            attention_long_applies(&attention(1, 64, 8, 128, 4096), 0),
            Some(0)
        );
        assert_eq!(
            attention_long_applies(&attention(1, 32, 8, 256, 4096), 0),
            Some(0)
        );
        assert!(attention_long_applies(&attention(1, 64, 8, 256, 4096), 0).is_none());
        assert!(attention_long_applies(&attention(1, 32, 0, 128, 4096), 0).is_none());
        assert!(attention_long_applies(&attention(1, 30, 4, 128, 4096), 0).is_none());
        // The same answer for one token and for 64 of the same model (a row's path must
        // not depend on its batch).
        for (h, kv, d) in [(32, 4, 128), (64, 8, 256), (16, 16, 64), (40, 8, 128)] {
            let one = attention_long_applies(&attention(1, h, kv, d, 8192), 0);
            let many = attention_long_applies(&attention(64, h, kv, d, 8192), 0);
            assert_eq!(one, many, "{h}/{kv} x {d}");
        }
    }

    #[test]
    fn long_grid_is_a_cluster_per_item() {
        // Decode at Qwen3's shape: 4 units of 4 groups, 16 clusters of 16 blocks.
        assert_eq!(
            attention_long_grid(&attention(1, 32, 4, 128, 32_768), 256),
            Some(256)
        );
        // Two head groups per K/V head (group of 12).
        assert_eq!(
            attention_long_grid(&attention(1, 12, 1, 64, 4096), 256),
            Some(2 * 4 * 16)
        );
        // A 5-token window: 80 items; 64 tokens: capped at 128 clusters.
        assert_eq!(
            attention_long_grid(&attention(5, 32, 4, 128, 32_768), 256),
            Some(80 * 16)
        );
        assert_eq!(
            attention_long_grid(&attention(64, 32, 4, 128, 32_768), 256),
            Some(128 * 16)
        );
        assert!(attention_long_grid(&attention(1, 32, 0, 128, 4096), 256).is_none());
    }
}
