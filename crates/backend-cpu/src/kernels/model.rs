//! CPU versions of the transformer ops; crates/core/kernels.txt gives each signature and
//! its meaning, llama.cpp's ggml-cpu the numerics they follow. One file per job:
//!
//! - `check`: argument validation shared by every op (sizes, formats, ids);
//! - `par`: how work is split over the device's thread pool (`pool`: the spinning pool);
//! - `elementwise`: add, add_rows, swiglu, sigmoid_gate_add;
//! - `norm`: rms_norm; `embed`: embed_rows; `rope`: rope (YaRN included);
//! - `matmul`: mul_mat and mul_mat_experts over strata-quant's dot products (`tiles`:
//!   several of them at once, bit for bit); `gate_up`: experts_gate_up, the one fused
//!   kernel this backend has (the CPU pool's gate, up and SwiGLU in one launch);
//! - `attention`: kv_store and causal GQA attention over the f16 cache (`simd`: its
//!   inner loops), and attention_rows, a verify window's rows in decode's order;
//! - `kv_q8`: kv_store_q8 and attention_q8, the int8 (q8_0-block) K/V cache;
//! - `moe`: router_topk and moe_combine.

mod attention;
mod check;
mod elementwise;
mod embed;
mod gate_up;
mod ggml_math;
mod kv_q8;
mod matmul;
mod moe;
mod norm;
mod par;
mod pool;
mod rope;
mod simd;
mod tiles;

pub use attention::{attention, attention_rows, kv_store};
pub use elementwise::{add, add_rows, sigmoid_gate_add, swiglu};
pub use embed::embed_rows;
pub use gate_up::experts_gate_up;
pub use kv_q8::{attention_q8, kv_store_q8};
pub use matmul::{mul_mat, mul_mat_experts};
pub use moe::{moe_combine, router_topk};
pub use norm::rms_norm;
pub use pool::{KernelPool, thread_pool};
pub use rope::rope;
