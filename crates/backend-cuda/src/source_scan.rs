//! What the embedded kernels-cuda/ sources say about their kernels, read from the text:
//! each `extern "C" __global__` definition's name and module, and whether its body opens
//! with `pdl_begin` (common.cuh's `pdl_begin()` and its forms), which is what makes a programmatic dependent launch
//! of it safe. Read from the sources so a kernel added without that call is simply
//! launched the ordinary way, never early.

use crate::kernels::KERNEL_SOURCES;

/// One kernel definition in the embedded sources.
#[derive(Debug)]
pub(crate) struct KernelDef {
    pub name: String,
    pub module: &'static str,
    /// Whether the body's first statement is common.cuh's `pdl_begin()` (or one of its
    /// `pdl_begin_*` forms, which prefetch weights first).
    pub waits_for_previous: bool,
}

const MARKER: &str = "extern \"C\" __global__ void ";

/// Every kernel the embedded sources define, in source order.
pub(crate) fn kernel_defs() -> Vec<KernelDef> {
    let mut out = Vec::new();
    for (module, src) in KERNEL_SOURCES {
        for piece in src.split(MARKER).skip(1) {
            let piece = skip_attributes(piece);
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // Parameter lists hold no braces: the first one opens the body.
            let body = piece.split_once('{').map_or("", |(_, b)| b);
            out.push(KernelDef {
                name,
                module,
                waits_for_previous: body.trim_start().starts_with("pdl_begin"),
            });
        }
    }
    out
}

/// `piece` past the attributes that may stand between `void` and the name:
/// `__launch_bounds__(..)`, `__cluster_dims__(..)`, or an all-caps macro standing for one.
fn skip_attributes(mut piece: &str) -> &str {
    loop {
        let p = piece.trim_start();
        let word: String = p
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if word == "__launch_bounds__" || word == "__cluster_dims__" {
            piece = p.split_once(')').map_or("", |(_, r)| r);
        } else if !word.is_empty()
            && word
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            piece = &p[word.len()..];
        } else {
            return p;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_skipped_and_the_wait_is_seen_only_first() {
        let p = skip_attributes(" __launch_bounds__(256, 4)\n ATT_CLUSTER_DIMS name(int a) {");
        assert!(p.starts_with("name("));
        let defs = kernel_defs();
        assert!(
            defs.iter()
                .any(|d| d.name == "mul_mat_vec" && d.waits_for_previous)
        );
        // mul_mat_vec_q8 and mul_mat_vec_q8_rows (which wait themselves, once their
        // weights are requested), the window expert products over quantised rows,
        // mul_mat_qkv_q8_rows, and the kernels launched before them.
        for name in [
            "mul_mat_vec_q8",
            "mul_mat_vec_q8_rows",
            "quantise_act_q8",
            "mul_mat_experts_cached_multi_q8",
            "quantise_act_q8_window",
            "mul_mat_experts_multi_q8",
            "quantise_act_q8_experts",
            "experts_gate_up_multi_q8",
            "quantise_act_q8_gate_up",
            "experts_gate_up_cached_multi_q8",
            "quantise_act_q8_gate_up_window",
            "mul_mat_qkv_q8_rows",
            "quantise_act_q8_qkv",
        ] {
            assert!(
                defs.iter().any(|d| d.name == name && d.waits_for_previous),
                "{name}"
            );
        }
        // conformance.cu's kernels test ordered uploads and do not take part.
        assert!(
            defs.iter()
                .filter(|d| d.module == "conformance")
                .all(|d| !d.waits_for_previous)
        );
    }
}
