//! What the expert cache did during a request: decode hit rate, experts on the CPU per
//! token, bytes over the bus, and how much of the time the CPU pool and the device worked
//! at once.

use std::fmt;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertStats {
    /// Single-token steps (decode).
    pub decode_tokens: u64,
    /// Routed (token, expert) pairs of decode steps found resident / computed on the CPU.
    pub decode_hits: u64,
    pub decode_misses: u64,
    /// The same for batched steps (prefill).
    pub prefill_hits: u64,
    pub prefill_misses: u64,
    /// Bytes downloaded (router choices, activations) and uploaded (the pool's outputs,
    /// their row map), and bytes written into slots and residency tables.
    pub bytes_down: u64,
    pub bytes_up: u64,
    pub bytes_fill: u64,
    /// Slots filled (initial fill, online learning, adaptation).
    pub slot_fills: u64,
    /// Layers of long batches run on the device from staged experts, and the bytes
    /// uploaded from the file for them.
    pub lent_layers: u64,
    pub bytes_lend: u64,
    /// Seconds the CPU pool worked (from when it had its activations until its outputs
    /// were back on the host), and of those, seconds the device also had expert work
    /// queued (measured per layer by polling the device's event while the pool runs).
    pub pool_seconds: f64,
    pub overlap_seconds: f64,
    /// Seconds the host waited for a layer's activations (the device's part of the layer
    /// before the routed experts, and the download) before the pool could start.
    pub activation_wait_seconds: f64,
    /// Experts of short batches uploaded to a staging set and computed on the device
    /// instead of the pool (`--stream-experts`), counted once per layer.
    pub streamed_experts: u64,
    /// Where the host's time of decode steps went, layer by layer.
    pub decode: DecodeTimeline,
    /// Short batches of several tokens that did not lend (verify windows, short prompt
    /// reads), and the same timeline of their layers.
    pub windows: u64,
    pub window_tokens: u64,
    pub window: DecodeTimeline,
}

/// The host's critical path through the MoE layers of single-token steps (decode), or of
/// short batches, in seconds summed over layers: what a step costs beyond the pool's own
/// work.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodeTimeline {
    /// MoE layers of decode steps.
    pub layers: u64,
    /// From the end of one MoE layer to the start of the next in the same step: queueing
    /// the dense part of the next layer (attention, router).
    pub launch_seconds: f64,
    /// From the start of a MoE layer until the router's choice is on the host (the
    /// device's part of the layer and the download).
    pub router_wait_seconds: f64,
    /// Then until the activations are on the host.
    pub activation_wait_seconds: f64,
    /// The pool's work, from its activations to its outputs.
    pub pool_seconds: f64,
    /// The pool's outputs back to the device and the sum queued.
    pub return_seconds: f64,
    /// Distinct experts the layers' tokens were routed to, summed over layers: the expert
    /// weights a layer reads once per expert (a window's tokens share some of theirs).
    pub distinct_experts: u64,
}

impl ExpertStats {
    pub fn decode_hit_rate(&self) -> f64 {
        let all = self.decode_hits + self.decode_misses;
        if all == 0 {
            1.0
        } else {
            self.decode_hits as f64 / all as f64
        }
    }

    pub fn cpu_experts_per_token(&self) -> f64 {
        if self.decode_tokens == 0 {
            0.0
        } else {
            self.decode_misses as f64 / self.decode_tokens as f64
        }
    }

    pub fn overlap_fraction(&self) -> f64 {
        if self.pool_seconds > 0.0 {
            (self.overlap_seconds / self.pool_seconds).min(1.0)
        } else {
            0.0
        }
    }

    pub fn bus_bytes(&self) -> u64 {
        self.bytes_down + self.bytes_up + self.bytes_fill + self.bytes_lend
    }
}

impl DecodeTimeline {
    /// The phases per step, in milliseconds, over `steps` steps.
    /// Distinct routed experts per MoE layer (0 before any layer).
    pub fn distinct_experts_per_layer(&self) -> f64 {
        self.distinct_experts as f64 / self.layers.max(1) as f64
    }

    pub fn summary(&self, steps: u64) -> String {
        let ms = |s: f64| 1e3 * s / steps.max(1) as f64;
        format!(
            "launches {:.2}, router wait {:.2}, activations {:.2}, CPU pool {:.2}, return {:.2}; {:.1} distinct experts a layer",
            ms(self.launch_seconds),
            ms(self.router_wait_seconds),
            ms(self.activation_wait_seconds),
            ms(self.pool_seconds),
            ms(self.return_seconds),
            self.distinct_experts_per_layer(),
        )
    }
}

impl fmt::Display for ExpertStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        write!(
            f,
            "decode expert cache hit rate {:.1}% ({} of {} routed experts), {:.2} experts on CPU per token, PCIe {:.2} MiB (down {:.2}, up {:.2}, slot fills {:.2} in {} fills, prefill staging {:.2} for {} layers), CPU pool {:.3} s (after {:.3} s waiting for activations), overlap {:.0}%",
            100.0 * self.decode_hit_rate(),
            self.decode_hits,
            self.decode_hits + self.decode_misses,
            self.cpu_experts_per_token(),
            mib(self.bus_bytes()),
            mib(self.bytes_down),
            mib(self.bytes_up),
            mib(self.bytes_fill),
            self.slot_fills,
            mib(self.bytes_lend),
            self.lent_layers,
            self.pool_seconds,
            self.activation_wait_seconds,
            100.0 * self.overlap_fraction(),
        )?;
        if self.streamed_experts > 0 {
            write!(
                f,
                ", {} experts streamed to the device ({:.2} a decode token)",
                self.streamed_experts,
                self.streamed_experts as f64 / self.decode_tokens.max(1) as f64
            )?;
        }
        if self.decode.layers > 0 {
            // A decode layer belongs to a counted decode token.
            let per = self.decode.summary(self.decode_tokens);
            write!(f, "; a decode token's MoE layers (ms): {per}")?;
        }
        if self.window.layers > 0 {
            write!(
                f,
                "; a short batch's MoE layers ({} batches, {:.1} tokens each; ms): {}",
                self.windows,
                self.window_tokens as f64 / self.windows.max(1) as f64,
                self.window.summary(self.windows)
            )?;
        }
        Ok(())
    }
}
