//! Matrix × vector and matrix × small batch on the CPU.
//!
//! The weight matrix is `rows` rows of `cols` values of one quantised type,
//! row after row (a GGUF 2-D tensor: `ne0 = cols`, `ne1 = rows`). Activations
//! are f32, quantised once per call to the format the weight type's dot
//! product takes. Work is split over rows into contiguous ranges, one per
//! thread (`std::thread::scope`).

use crate::{ActFormat, FormatKernels, QuantError, QuantType, check_len, kernels};

/// Checks the shapes and returns the kernels and the bytes of one weight row.
fn prepare(
    ty: QuantType,
    w: &[u8],
    rows: usize,
    cols: usize,
) -> Result<(&'static FormatKernels, usize), QuantError> {
    let k = kernels(ty).ok_or(QuantError::Unsupported { ty })?;
    let row_bytes = ty.row_bytes(cols).ok_or(QuantError::PartialBlock {
        what: "matrix row",
        n: cols,
        block: ty.block_size(),
    })?;
    if k.act.row_bytes(cols).is_none() {
        return Err(QuantError::PartialBlock {
            what: "activation row",
            n: cols,
            block: k.act.block_size(),
        });
    }
    check_len("matrix", rows * row_bytes, w.len())?;
    Ok((k, row_bytes))
}

/// Quantises `batch` activation rows of `cols` (> 0) values, one after another.
fn quantize_batch(act: ActFormat, x: &[f32], cols: usize) -> Result<(Vec<u8>, usize), QuantError> {
    let ab = act.row_bytes(cols).unwrap_or(0);
    let mut q = vec![0u8; x.len() / cols * ab];
    for (xr, qr) in x.chunks_exact(cols).zip(q.chunks_exact_mut(ab)) {
        crate::quantize_activation_into(act, xr, qr)?;
    }
    Ok((q, ab))
}

/// Rows per thread: every thread gets at least one row, none is idle.
fn rows_per_thread(rows: usize, threads: usize) -> usize {
    rows.div_ceil(threads.clamp(1, rows.max(1))).max(1)
}

/// `y[r] = Σ_c w[r][c] · x[c]` for every row `r`, over `threads` threads
/// (1 = this thread only). `y.len()` must be `rows`, `x.len()` must be `cols`.
pub fn matvec(
    ty: QuantType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    threads: usize,
) -> Result<(), QuantError> {
    let (k, row_bytes) = prepare(ty, w, rows, cols)?;
    check_len("activation vector", cols, x.len())?;
    check_len("output vector", rows, y.len())?;
    if rows == 0 || cols == 0 {
        y.fill(0.0);
        return Ok(());
    }
    let act = crate::quantize_activation(k.act, x)?;
    matvec_quantized(k, w, row_bytes, cols, &act, y, threads);
    Ok(())
}

/// [`matvec`] with the activation already quantised to `k.act` and the shapes
/// checked: `w` holds `y.len()` rows of `row_bytes`.
pub fn matvec_quantized(
    k: &FormatKernels,
    w: &[u8],
    row_bytes: usize,
    cols: usize,
    act: &[u8],
    y: &mut [f32],
    threads: usize,
) {
    let per = rows_per_thread(y.len(), threads);
    if per >= y.len() {
        return matvec_rows(k, w, row_bytes, cols, act, y);
    }
    std::thread::scope(|s| {
        for (ys, ws) in y.chunks_mut(per).zip(w.chunks(per * row_bytes)) {
            s.spawn(move || matvec_rows(k, ws, row_bytes, cols, act, ys));
        }
    });
}

/// One thread's share: `y[r] = dot(w row r, act)`.
pub fn matvec_rows(
    k: &FormatKernels,
    w: &[u8],
    row_bytes: usize,
    cols: usize,
    act: &[u8],
    y: &mut [f32],
) {
    for (o, row) in y.iter_mut().zip(w.chunks_exact(row_bytes)) {
        *o = (k.vec_dot)(cols, row, act);
    }
}

/// `y[b][r] = Σ_c w[r][c] · x[b][c]` for a batch of activation rows: `x` is
/// `batch × cols`, `y` is `batch × rows`, both row-major. Each weight row is
/// read once and dotted with every activation of the batch while it is in cache.
pub fn matmul(
    ty: QuantType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    threads: usize,
) -> Result<(), QuantError> {
    let (k, row_bytes) = prepare(ty, w, rows, cols)?;
    if rows == 0 || cols == 0 {
        y.fill(0.0);
        return Ok(());
    }
    if !x.len().is_multiple_of(cols) {
        return Err(QuantError::PartialBlock {
            what: "activation batch",
            n: x.len(),
            block: cols,
        });
    }
    let batch = x.len() / cols;
    check_len("output batch", batch * rows, y.len())?;
    let (act, ab) = quantize_batch(k.act, x, cols)?;
    let per = rows_per_thread(rows, threads);
    // Each thread fills a `batch × its rows` tile, copied into y afterwards.
    let tiles: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = w
            .chunks(per * row_bytes)
            .map(|ws| {
                let act = &act;
                s.spawn(move || {
                    let n = ws.len() / row_bytes;
                    let mut tile = vec![0.0f32; batch * n];
                    for (r, row) in ws.chunks_exact(row_bytes).enumerate() {
                        for (b, a) in act.chunks_exact(ab).enumerate() {
                            tile[b * n + r] = (k.vec_dot)(cols, row, a);
                        }
                    }
                    tile
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    for (t, tile) in tiles.iter().enumerate() {
        let n = tile.len() / batch.max(1);
        for b in 0..batch {
            y[b * rows + t * per..b * rows + t * per + n]
                .copy_from_slice(&tile[b * n..(b + 1) * n]);
        }
    }
    Ok(())
}
