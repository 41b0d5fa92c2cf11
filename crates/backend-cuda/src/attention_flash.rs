//! When the backend launches kernels-cuda/attention_flash.cuh's kernels (`attention_flash`,
//! `attention_flash_q8`) in place of `attention` and `attention_q8`, ahead of
//! attention_long's, and their grid. They cut a row of a long span into up to 32 pieces
//! (one block each, on tensor cores) in groups of 16 (a cluster each) and merge the groups'
//! results through the stream's scratch buffer; the constants below are the header's (a
//! test reads them back). `STRATA_CUDA_SKIP=...,attention_flash,attention_flash_q8` leaves
//! them out, so attention_long runs those launches again (an A/B without a rebuild).

use strata_core::KernelArg;

use crate::attention_long::{
    ATT_LONG_COUNTERS, ATT_LONG_SCRATCH_AT, long_span_applies, long_span_grid,
};

/// The only head dimension the kernels take (ATT_FLASH_HEAD_DIM): others run
/// attention_long.
pub(crate) const ATT_FLASH_HEAD_DIM: u32 = 128;
/// Groups (clusters) a unit's span is cut into at most (ATT_FLASH_GROUPS).
pub(crate) const ATT_FLASH_GROUPS: u32 = 2;
/// Blocks of a group: the kernels' cluster width on sm_90 (ATT_FLASH_GROUP).
const ATT_FLASH_GROUP: u32 = 16;
/// Bytes of the groups' results after attention_long's per-unit counters, which the
/// kernels share (ATT_FLASH_PARTIAL_BYTES): (head_dim + 2) floats per (token, query head,
/// group), for 64 tokens of up to 64 query heads of 128.
pub(crate) const ATT_FLASH_PARTIAL_BYTES: usize = 4_259_840;
/// Bytes of the scratch the flash kernels use, from its start.
pub(crate) const ATT_FLASH_SCRATCH_END: usize =
    ATT_LONG_SCRATCH_AT + 4 * ATT_LONG_COUNTERS + ATT_FLASH_PARTIAL_BYTES;
const _: () = assert!(crate::variants::SCRATCH_BYTES >= ATT_FLASH_SCRATCH_END);

/// Whether the flash kernels take a launch: attention_long's launches (up to 64 tokens, a
/// context longer than ATT_LONG_MIN_SPAN) of head_dim 128 whose 64-token launch fits the
/// scratch. As for attention_long, the answer depends on the model's shape, not on this
/// launch's tokens, so a row takes the same path in a launch of one token and in one of 64.
/// attention(q, pos, k, v, out | n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale)
pub(crate) fn attention_flash_applies(args: &[KernelArg], _limit: u32) -> Option<u32> {
    long_span_applies(args, ATT_FLASH_GROUPS, ATT_FLASH_PARTIAL_BYTES, |d| {
        d == ATT_FLASH_HEAD_DIM
    })
}

/// The flash kernels' grid (blocks): a cluster per work item (group, unit), at most
/// ATT_LONG_MAX_CLUSTERS (a grid-stride loop takes the rest); the kernel skips the items a
/// unit does not have, so the grid depends on the launch's shape, never on the positions.
pub(crate) fn attention_flash_grid(args: &[KernelArg], _block_threads: u32) -> Option<u32> {
    long_span_grid(args, ATT_FLASH_GROUPS, ATT_FLASH_GROUP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention_long::tests::{attention, define_in};

    fn header_define(name: &str) -> Option<u64> {
        define_in("attention_flash.cuh", name)
    }

    #[test]
    fn constants_are_the_headers() {
        assert_eq!(
            header_define("ATT_FLASH_HEAD_DIM"),
            Some(u64::from(ATT_FLASH_HEAD_DIM))
        );
        assert_eq!(
            header_define("ATT_FLASH_GROUPS"),
            Some(u64::from(ATT_FLASH_GROUPS))
        );
        assert_eq!(
            header_define("ATT_FLASH_GROUP"),
            Some(u64::from(ATT_FLASH_GROUP))
        );
        assert_eq!(
            header_define("ATT_FLASH_PARTIAL_BYTES"),
            Some(ATT_FLASH_PARTIAL_BYTES as u64)
        );
        // 64 tokens x 64 query heads x 2 groups x (128 + 2) floats.
        assert_eq!(ATT_FLASH_PARTIAL_BYTES, 64 * 64 * 2 * 130 * 4);
    }

    #[test]
    fn staged_build_names_its_shared_memory() {
        // kernels.rs gives a variant the dynamic shared memory its module's `<func>_smem`
        // says: model.cu defines attention_flash's under ATT_FLASH_STAGED, off by default.
        let model = crate::kernels::source_of("model").expect("model.cu");
        assert!(model.contains("__constant__ uint32_t attention_flash_smem = ATT_FLASH_SMEM;"));
        assert_eq!(header_define("ATT_FLASH_STAGED"), Some(0));
    }

    #[test]
    fn flash_kernels_take_long_contexts_of_head_dim_128() {
        // Qwen3-30B-A3B's shape: a decode step and a 64-token read at 32K.
        assert_eq!(
            attention_flash_applies(&attention(1, 32, 4, 128, 32_768), 0),
            Some(0)
        );
        assert_eq!(
            attention_flash_applies(&attention(64, 32, 4, 128, 32_768), 0),
            Some(0)
        );
        // Not: a context no row of which is long, a prefill batch, no tokens, another
        // head dimension (attention_long's), more than 64 query heads, bad GQA.
        assert!(attention_flash_applies(&attention(1, 32, 4, 128, 1024), 0).is_none());
        assert!(attention_flash_applies(&attention(65, 32, 4, 128, 32_768), 0).is_none());
        assert!(attention_flash_applies(&attention(0, 32, 4, 128, 32_768), 0).is_none());
        assert!(attention_flash_applies(&attention(1, 32, 8, 256, 4096), 0).is_none());
        assert!(attention_flash_applies(&attention(1, 16, 16, 64, 4096), 0).is_none());
        assert_eq!(
            attention_flash_applies(&attention(1, 64, 8, 128, 4096), 0),
            Some(0)
        );
        assert!(attention_flash_applies(&attention(1, 72, 8, 128, 4096), 0).is_none());
        assert!(attention_flash_applies(&attention(1, 32, 0, 128, 4096), 0).is_none());
        assert!(attention_flash_applies(&attention(1, 30, 4, 128, 4096), 0).is_none());
        // The same answer for one token and for 64 of the same model.
        for (h, kv) in [(32, 4), (64, 8), (40, 8), (12, 1)] {
            let one = attention_flash_applies(&attention(1, h, kv, 128, 8192), 0);
            let many = attention_flash_applies(&attention(64, h, kv, 128, 8192), 0);
            assert_eq!(one, many, "{h}/{kv}");
        }
    }

    #[test]
    fn flash_grid_is_a_cluster_per_item() {
        // Decode at Qwen3's shape: 4 units of 2 groups, 8 clusters of 16 blocks.
        assert_eq!(
            attention_flash_grid(&attention(1, 32, 4, 128, 32_768), 256),
            Some(128)
        );
        // Two head groups per K/V head (group of 12).
        assert_eq!(
            attention_flash_grid(&attention(1, 12, 1, 128, 4096), 256),
            Some(2 * 2 * 16)
        );
        // A 5-token window: 40 items; 64 tokens' 512 are capped at 128 clusters.
        assert_eq!(
            attention_flash_grid(&attention(5, 32, 4, 128, 32_768), 256),
            Some(40 * 16)
        );
        assert_eq!(
            attention_flash_grid(&attention(64, 32, 4, 128, 32_768), 256),
            Some(128 * 16)
        );
        assert!(attention_flash_grid(&attention(1, 32, 0, 128, 4096), 256).is_none());
    }
}
