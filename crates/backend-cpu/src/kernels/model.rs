//! CPU versions of the transformer ops (see crates/core/kernels.txt for each signature).
//! Placeholder bodies until the kernels land; each refuses with an error.

use super::KernelArgs;

pub fn embed_rows(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("embed_rows: not implemented on the CPU backend yet".into())
}

pub fn rms_norm(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("rms_norm: not implemented on the CPU backend yet".into())
}

pub fn mul_mat(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("mul_mat: not implemented on the CPU backend yet".into())
}

pub fn add(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("add: not implemented on the CPU backend yet".into())
}

pub fn add_rows(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("add_rows: not implemented on the CPU backend yet".into())
}

pub fn swiglu(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("swiglu: not implemented on the CPU backend yet".into())
}

pub fn rope(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("rope: not implemented on the CPU backend yet".into())
}

pub fn kv_store(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("kv_store: not implemented on the CPU backend yet".into())
}

pub fn attention(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("attention: not implemented on the CPU backend yet".into())
}

pub fn router_topk(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("router_topk: not implemented on the CPU backend yet".into())
}

pub fn mul_mat_experts(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("mul_mat_experts: not implemented on the CPU backend yet".into())
}

pub fn moe_combine(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("moe_combine: not implemented on the CPU backend yet".into())
}

pub fn sigmoid_gate_add(_a: &KernelArgs<'_>) -> Result<(), String> {
    Err("sigmoid_gate_add: not implemented on the CPU backend yet".into())
}
