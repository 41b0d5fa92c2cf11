//! The expert cache's kernels (crates/core/kernels.txt, module `experts`): the routed
//! experts whose weights sit in device slots, found through the residency table, and the
//! recombination of the device's and the CPU pool's outputs.
//!
//! `mul_mat_experts_cached` gathers the resident (token, slot) pairs into a batch of
//! one-slot tokens and runs the model's `mul_mat_experts` on it, so every output is the
//! same `vec_dot` of the same weight row and quantised activation as the uncached kernel
//! computes: the logits do not depend on which experts are resident.

use strata_core::LaunchCfg;

use super::{ArgSlot, KernelArgs, model};

fn need(op: &str, what: &str, need: Option<usize>, have: usize) -> Result<usize, String> {
    match need {
        Some(n) if n <= have => Ok(n),
        Some(n) => Err(format!(
            "{op}: {what} needs {n} elements, the buffer holds {have}"
        )),
        None => Err(format!("{op}: the size of {what} overflows")),
    }
}

/// A read-only argument over `v`.
fn slot<T>(v: &[T]) -> ArgSlot {
    ArgSlot::Buffer {
        ptr: v.as_ptr() as *mut u8,
        len: std::mem::size_of_val(v),
        writable: false,
    }
}

/// A written argument over `v`.
fn slot_mut<T>(v: &mut [T]) -> ArgSlot {
    ArgSlot::Buffer {
        ptr: v.as_mut_ptr() as *mut u8,
        len: std::mem::size_of_val(v),
        writable: true,
    }
}

/// `y[t][j] = x' * W^T` for the pairs whose expert has a slot (see kernels.txt).
pub fn mul_mat_experts_cached(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "mul_mat_experts_cached";
    let slots = a.buf::<u8>(0)?;
    let table = a.buf::<i32>(1)?;
    let x = a.buf::<f32>(2)?;
    let ids = a.buf::<i32>(3)?;
    let y = a.buf_mut::<f32>(4)?;
    let (type_id, m, k) = (a.u32(5)?, a.u32(6)? as usize, a.u32(7)? as usize);
    let (n_tokens, n_used) = (a.u32(8)? as usize, a.u32(9)? as usize);
    let x_per_slot = a.u32(10)? != 0;
    let n_expert = a.u32(11)? as usize;
    let slot_bytes = usize::try_from(a.u64(12)?)
        .map_err(|_| format!("{OP}: slot_bytes does not fit this machine's addresses"))?;
    let matrix_offset = usize::try_from(a.u64(13)?)
        .map_err(|_| format!("{OP}: matrix_offset does not fit this machine's addresses"))?;
    let pairs = need(OP, "ids", n_tokens.checked_mul(n_used), ids.len())?;
    need(OP, "the residency table", Some(n_expert), table.len())?;
    need(OP, "y", pairs.checked_mul(m), y.len())?;
    let x_rows = if x_per_slot { pairs } else { n_tokens };
    need(OP, "x", x_rows.checked_mul(k), x.len())?;
    if matrix_offset > slots.len() {
        return Err(format!(
            "{OP}: matrix_offset {matrix_offset} is past the {} slot bytes",
            slots.len()
        ));
    }
    // The resident pairs: (slot, activation row, output row).
    let mut resident = Vec::new();
    for (p, &id) in ids[..pairs].iter().enumerate() {
        let e = usize::try_from(id)
            .ok()
            .filter(|&e| e < n_expert)
            .ok_or_else(|| format!("{OP}: pair {p} has expert id {id} (n_expert {n_expert})"))?;
        let s = table[e];
        if s >= 0 {
            let act = if x_per_slot { p } else { p / n_used };
            resident.push((s, act, p));
        }
    }
    if resident.is_empty() || m == 0 {
        return Ok(());
    }
    // Gathered as tokens of one slot each: x_g[i] = x'[pair i], ids_g[i] = its slot.
    let mut xg = Vec::with_capacity(resident.len() * k);
    for &(_, act, _) in &resident {
        xg.extend_from_slice(&x[act * k..(act + 1) * k]);
    }
    let ids_g: Vec<i32> = resident.iter().map(|&(s, _, _)| s).collect();
    let mut yg = vec![0f32; resident.len() * m];
    let cfg = LaunchCfg::linear(1, 1);
    let inner = KernelArgs::new(
        &cfg,
        vec![
            slot(&slots[matrix_offset..]),
            slot(&xg),
            slot(&ids_g),
            slot_mut(&mut yg),
            ArgSlot::U32(type_id),
            ArgSlot::U32(m as u32),
            ArgSlot::U32(k as u32),
            ArgSlot::U32(resident.len() as u32),
            ArgSlot::U32(1),
            ArgSlot::U32(0),
            ArgSlot::U64(slot_bytes as u64),
        ],
    )
    .with_pool(a.pool);
    model::mul_mat_experts(&inner).map_err(|e| e.replacen("mul_mat_experts", OP, 1))?;
    for (row, &(_, _, p)) in yg.chunks_exact(m).zip(&resident) {
        y[p * m..(p + 1) * m].copy_from_slice(row);
    }
    Ok(())
}

/// `out[t] = Σ_j weights[t][j] * y'[t][j]`, y' from the pool's rows where `host_row` says.
pub fn moe_combine_split(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "moe_combine_split";
    let y = a.buf::<f32>(0)?;
    let y_host = a.buf::<f32>(1)?;
    let host_row = a.buf::<i32>(2)?;
    let weights = a.buf::<f32>(3)?;
    let out = a.buf_mut::<f32>(4)?;
    let (n_tokens, n_used, m) = (a.u32(5)? as usize, a.u32(6)? as usize, a.u32(7)? as usize);
    let pairs = need(OP, "weights", n_tokens.checked_mul(n_used), weights.len())?;
    need(OP, "host_row", Some(pairs), host_row.len())?;
    need(OP, "y", pairs.checked_mul(m), y.len())?;
    need(OP, "out", n_tokens.checked_mul(m), out.len())?;
    if m == 0 {
        return Ok(());
    }
    let row_of = |p: usize| -> Result<&[f32], String> {
        match usize::try_from(host_row[p]) {
            Ok(r) => {
                let end = need(
                    OP,
                    "y_host",
                    r.checked_add(1).and_then(|r| r.checked_mul(m)),
                    y_host.len(),
                )?;
                Ok(&y_host[end - m..end])
            }
            Err(_) => Ok(&y[p * m..(p + 1) * m]),
        }
    };
    for (t, o) in out[..n_tokens * m].chunks_exact_mut(m).enumerate() {
        // As moe_combine: the first slot assigned, the others added in slot order.
        if n_used == 0 {
            o.fill(0.0);
            continue;
        }
        for j in 0..n_used {
            let p = t * n_used + j;
            let (w, yj) = (weights[p], row_of(p)?);
            if j == 0 {
                for (acc, &v) in o.iter_mut().zip(yj) {
                    *acc = w * v;
                }
            } else {
                for (acc, &v) in o.iter_mut().zip(yj) {
                    *acc += w * v;
                }
            }
        }
    }
    Ok(())
}
