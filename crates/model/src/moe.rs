//! The hook through which an expert cache runs a MoE layer's routed experts: the forward
//! pass computes the router's choice on the device, then hands the layer to a
//! [`RoutedExperts`] instead of launching `mul_mat_experts` over weights it does not hold.

use strata_core::DeviceBuffer;

use crate::error::Result;
use crate::ops::Ops;
use crate::weights::Experts;

/// One MoE layer's routed-expert work for `n` tokens, as the forward pass lays it out.
pub struct MoeIo<'a> {
    pub layer: usize,
    pub n_tokens: u32,
    pub n_used: u32,
    pub n_embd: u32,
    /// `[n][n_embd]`: the normalised input.
    pub xn: &'a DeviceBuffer<f32>,
    /// `[n][n_used]`: the chosen experts and their weights (router_topk's output).
    pub expert_ids: &'a DeviceBuffer<i32>,
    pub expert_w: &'a DeviceBuffer<f32>,
    /// Scratch of `[n][n_used][ff]` each (gate, up, swiglu).
    pub fa: &'a DeviceBuffer<f32>,
    pub fb: &'a DeviceBuffer<f32>,
    pub fc: &'a DeviceBuffer<f32>,
    /// Scratch of `[n][n_used][n_embd]`: each pair's expert output.
    pub moe_y: &'a DeviceBuffer<f32>,
    /// `[n][n_embd]`: where the weighted sum goes.
    pub out: &'a DeviceBuffer<f32>,
    pub gate: &'a Experts,
    pub up: &'a Experts,
    pub down: &'a Experts,
}

/// Runs the routed experts of a layer (writing `io.out`), on the device and beside it.
/// Implemented by the engine's expert cache; it may wait for the device (a step with an
/// expert cache is not captured as a graph).
pub trait RoutedExperts {
    fn run(&mut self, ops: &Ops<'_>, io: &MoeIo<'_>) -> Result<()>;
}
