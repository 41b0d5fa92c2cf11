//! How the kernel table launches: the optional kernels it leaves out and whether a launch
//! may overlap the kernel before it (programmatic dependent launch).

/// Optional kernels left out unless `STRATA_CUDA_SKIP` is set (to "" for none): on the
/// H200 (Qwen3-30B-A3B-shaped Q4_K, tg128) decode ran at 139.0 tokens/s with the first
/// two and 157.9 without. Each ends in a one-block tail (top-k, the slot combine and norm)
/// that waits for the whole product, longer than the separate launch it saves.
/// `mul_mat_experts_q8` (the down projection over an activation quantised once): 19.83 us
/// a launch with its quantisation, against 17.15 for mul_mat_experts' one-token form, in
/// the replayed decode graph (same call, STRATA_KERNEL_TIMING=1), where mul_mat_vec_q8 and
/// experts_gate_up_q8 were faster than what they replace (13.19 vs 14.77, 21.94 vs 22.98).
/// `mul_mat_experts_cached_grouped` (a verify window's cached experts grouped by expert):
/// a 5-token window with a 50% cache took 25.79 ms with it and 23.75 ms without (skewed
/// routing still gives a window few shared experts, and the tiled form is slower per row).
/// Not left out: `mul_mat_vec_q8_rows` (a verify window's dense products, each weight row
/// staged once for its 2..=8 tokens; bit for bit each row alone, GPU test matvec_q8): a
/// 5-token window's router wait (the device's part up to each MoE layer's router) 7.70 ms
/// with it against 10.51 without, same call, 50% cache (session 12).
/// Not left out either: `mul_mat_experts_cached_multi` (windows of 2..=8 tokens: matvec.cuh's
/// one-token units, a unit per routed expert instead of per pair; variants.rs), listed
/// before the grouped form; name both to run the per-pair kernel for windows. Before it,
/// `mul_mat_experts_cached_multi_q8` (the same units over activation rows quantised once
/// per launch, quantised formats; not yet measured): add it to this list in
/// STRATA_CUDA_SKIP to run `mul_mat_experts_cached_multi` for every window.
const SKIPPED_BY_DEFAULT: &str = "router_matvec_topk,experts_down_norm,mul_mat_experts_q8,\
    mul_mat_experts_cached_grouped";

/// Whether launches may overlap the kernel ahead of them (programmatic dependent launch,
/// sm_90): `STRATA_CUDA_PDL` = `0` (off), `early` (the next kernel's blocks may be placed
/// once every block of this one has started), `mid` (once every block of a one-token
/// product has read its weights; the default), `late` (as this one's blocks exit). See
/// common.cuh's pdl_begin. H200, tg128 (Qwen3-30B-A3B-shaped Q4_K, two alternating rounds):
/// off 146.3/148.5, late 151.7/153.8, mid 156.0/156.1, early 139.6/139.1 tokens/s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DependentLaunch {
    Off,
    Late,
    Early,
    Mid,
}

/// How the kernel table launches: which optional kernels it leaves out, and whether
/// launches overlap the kernel before them.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Optional (module `fused`) kernels left out, comma-separated.
    pub skip_optional: String,
    pub dependent: DependentLaunch,
}

impl LaunchOptions {
    /// From `STRATA_CUDA_SKIP` (default: [`SKIPPED_BY_DEFAULT`]) and `STRATA_CUDA_PDL`.
    pub fn from_env() -> Self {
        let skip = std::env::var("STRATA_CUDA_SKIP");
        let dependent = match std::env::var("STRATA_CUDA_PDL").as_deref() {
            Ok("0") => DependentLaunch::Off,
            Ok("early") => DependentLaunch::Early,
            Ok("mid") => DependentLaunch::Mid,
            Ok("late") => DependentLaunch::Late,
            _ => DependentLaunch::Mid,
        };
        Self {
            skip_optional: skip.as_deref().unwrap_or(SKIPPED_BY_DEFAULT).to_string(),
            dependent,
        }
    }

    /// Every optional kernel in use (tests of the fused kernels).
    pub fn all_kernels() -> Self {
        Self {
            skip_optional: String::new(),
            ..Self::from_env()
        }
    }
}
