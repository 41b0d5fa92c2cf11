//! Token embedding look-up: each output row is one dequantised row of the table
//! (ggml_get_rows on a quantised tensor).

use super::check::{format, prefix, prefix_mut};
use super::par;
use crate::kernels::KernelArgs;

/// `out[t] = dequantise(row ids[t] of table)`.
pub fn embed_rows(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "embed_rows";
    let table = a.buf::<u8>(0)?;
    let ids = a.buf::<u32>(1)?;
    let out = a.buf_mut::<f32>(2)?;
    let (type_id, dim, n_tokens) = (a.u32(3)?, a.u32(4)? as usize, a.u32(5)? as usize);
    let f = format(OP, type_id, dim)?;
    let ids = prefix(OP, "ids", ids, &[n_tokens])?;
    let out = prefix_mut(OP, "out", out, &[n_tokens, dim])?;
    if dim == 0 {
        return Ok(());
    }
    let rows = table.len() / f.row_bytes;
    if let Some((t, &id)) = ids.iter().enumerate().find(|&(_, &id)| id as usize >= rows) {
        return Err(format!(
            "{OP}: token {t} has id {id}, but the table holds {rows} rows"
        ));
    }
    let per = par::items_per_task(a.pool, n_tokens, dim * 2);
    par::for_each_chunk(a.pool, out, per * dim, |i, os| {
        for (r, row) in os.chunks_exact_mut(dim).enumerate() {
            let id = ids[i * per + r] as usize;
            let src = &table[id * f.row_bytes..(id + 1) * f.row_bytes];
            (f.kernels.dequant)(src, row);
        }
    });
    Ok(())
}
