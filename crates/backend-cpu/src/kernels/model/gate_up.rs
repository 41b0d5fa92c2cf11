//! experts_gate_up: a routed expert's gate and up products and their SwiGLU in one
//! launch, bit for bit what mul_mat_experts (gate), mul_mat_experts (up) and swiglu give:
//! the activation is quantised once for both products (the two launches quantise it the
//! same way), every output is the same `vec_dot` (or a tile kernel equal to it), and the
//! SwiGLU is the same element-wise function. One dispatch over the pool instead of three
//! launches, each task computing a range of one expert's gate rows, the same up rows and
//! then their SwiGLU while both are in cache (the CPU pool's decode step: 8 experts of
//! one token a layer).

use std::cell::RefCell;

use super::check::{elems, format, prefix, prefix_mut};
use super::ggml_math;
use super::matmul::{Gemm, Routes, row_tasks, with_quantised};
use super::par::{self, DisjointOut};
use super::tiles::tiles;
use crate::kernels::KernelArgs;

thread_local! {
    /// The stream thread's gate and up outputs before the SwiGLU, reused across launches.
    static GATE_UP_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `y[t][j] = swiglu(x[t] * Wg_e^T, x[t] * Wu_e^T)` for `e = ids[t][j]`.
pub fn experts_gate_up(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "experts_gate_up";
    let wg = a.buf::<u8>(0)?;
    let wu = a.buf::<u8>(1)?;
    let x = a.buf::<f32>(2)?;
    let ids = a.buf::<i32>(3)?;
    let y = a.buf_mut::<f32>(4)?;
    let (type_id, m, k) = (a.u32(5)?, a.u32(6)? as usize, a.u32(7)? as usize);
    let (n_tokens, n_used) = (a.u32(8)? as usize, a.u32(9)? as usize);
    let expert_bytes = |i: usize, which: &str| {
        usize::try_from(a.u64(i)?)
            .map_err(|_| format!("{OP}: {which} does not fit this machine's addresses"))
    };
    let (eb_gate, eb_up) = (
        expert_bytes(10, "expert_bytes_g")?,
        expert_bytes(11, "expert_bytes_u")?,
    );
    let f = format(OP, type_id, k)?;
    let matrix_bytes = elems(OP, "an expert's matrix", &[m, f.row_bytes])?;
    for (which, eb) in [("expert_bytes_g", eb_gate), ("expert_bytes_u", eb_up)] {
        if eb < matrix_bytes {
            return Err(format!(
                "{OP}: {which} {eb} is smaller than one {m} x {k} {} matrix ({matrix_bytes} bytes)",
                f.ty.name()
            ));
        }
    }
    let ids = prefix(OP, "ids", ids, &[n_tokens, n_used])?;
    let x = prefix(OP, "x", x, &[n_tokens, k])?;
    let y = prefix_mut(OP, "y", y, &[n_tokens, n_used, m])?;
    let routes = Routes::new(OP, ids, n_used, false)?;
    let gate = routes.products(OP, wg, eb_gate, matrix_bytes)?;
    let up = routes.products(OP, wu, eb_up, matrix_bytes)?;
    if k == 0 {
        // Both products are zero, and silu(0) * 0 is 0.
        y.fill(0.0);
        return Ok(());
    }
    if m == 0 || gate.is_empty() {
        return Ok(());
    }
    let n = y.len();
    GATE_UP_SCRATCH.with(|cell| {
        let mut fresh = Vec::new();
        let mut held = cell.try_borrow_mut();
        // Re-entered (cannot happen from a stream thread): a fresh buffer.
        let scratch = match held.as_mut() {
            Ok(buf) => &mut **buf,
            Err(_) => &mut fresh,
        };
        scratch.resize(2 * n, 0.0);
        let (gate_out, up_out) = scratch.split_at_mut(n);
        with_quantised(a, &f, x, k, |acts| {
            let gemm = |out| Gemm {
                f,
                k,
                m,
                acts,
                y: out,
                tiles: tiles(f.ty),
            };
            let (g, u) = (
                gemm(DisjointOut::new(gate_out)),
                gemm(DisjointOut::new(up_out)),
            );
            let out = DisjointOut::new(y);
            let tasks = row_tasks(a.pool, m, k, &gate, 2);
            par::for_each(a.pool, tasks.len(), |t| {
                let (i, r0, r1) = tasks[t];
                g.rows(&gate[i], r0, r1);
                u.rows(&up[i], r0, r1);
                for &(_, oi) in gate[i].cols {
                    let at = oi * m + r0;
                    // SAFETY: output row oi's weight rows r0..r1 belong to this task alone
                    // (as in `Gemm::put`), in all three outputs; the two reads see what
                    // this task has just written.
                    unsafe {
                        ggml_math::swiglu(
                            out.slice_mut(at, r1 - r0),
                            g.y.slice(at, r1 - r0),
                            u.y.slice(at, r1 - r0),
                        )
                    };
                }
            });
        })
    })
}
