//! CPU versions of kernels-cuda/sample.cu: the sampling helpers.

use strata_core::argmax_row;

use super::KernelArgs;

/// `ids[r] = argmax_row(x[r])`. The GPU's per-piece keys and tickets are not needed here,
/// but their buffers must be the size the GPU kernel would use (and the tickets stay 0).
pub fn argmax_rows(a: &KernelArgs<'_>) -> Result<(), String> {
    let x = a.buf::<f32>(0)?;
    let ids = a.buf_mut::<u32>(1)?;
    let partial = a.buf::<u64>(2)?;
    let done = a.buf::<u32>(3)?;
    let (n_rows, n_cols, n_split) = (a.u32(4)? as usize, a.u32(5)? as usize, a.u32(6)? as usize);
    let need = |what: &str, n: Option<usize>, have: usize| match n {
        Some(n) if n <= have => Ok(()),
        _ => Err(format!(
            "argmax_rows: {what} too small for {n_rows} rows of {n_cols} in {n_split} pieces \
             (holds {have})"
        )),
    };
    need("x", n_rows.checked_mul(n_cols), x.len())?;
    need("ids", Some(n_rows), ids.len())?;
    need("partial", n_rows.checked_mul(n_split), partial.len())?;
    need("done", Some(n_rows), done.len())?;
    if n_split == 0 {
        return Err("argmax_rows: n_split is 0".into());
    }
    for (r, id) in ids[..n_rows].iter_mut().enumerate() {
        *id = argmax_row(&x[r * n_cols..(r + 1) * n_cols]);
    }
    Ok(())
}
