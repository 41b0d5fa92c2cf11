//! Argument checks shared by the model ops: every size is validated against the buffers
//! before a kernel touches them, so bad arguments become an `Err` naming the problem.

use strata_quant::{FormatKernels, QuantType};

/// The product of `dims`, or an error when it overflows `usize`.
pub fn elems(op: &str, what: &str, dims: &[usize]) -> Result<usize, String> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("{op}: the size of {what} ({dims:?}) overflows"))
}

/// Checks that a buffer of `have` elements holds the `need` the op will touch.
pub fn fits(op: &str, what: &str, need: usize, have: usize) -> Result<(), String> {
    if need > have {
        return Err(format!(
            "{op}: {what} needs {need} elements, the buffer holds {have}"
        ));
    }
    Ok(())
}

/// The first `dims`-product elements of `buf`, checked.
pub fn prefix<'a, T>(
    op: &str,
    what: &str,
    buf: &'a [T],
    dims: &[usize],
) -> Result<&'a [T], String> {
    let n = elems(op, what, dims)?;
    fits(op, what, n, buf.len())?;
    Ok(&buf[..n])
}

/// [`prefix`], mutably.
pub fn prefix_mut<'a, T>(
    op: &str,
    what: &str,
    buf: &'a mut [T],
    dims: &[usize],
) -> Result<&'a mut [T], String> {
    let n = elems(op, what, dims)?;
    fits(op, what, n, buf.len())?;
    Ok(&mut buf[..n])
}

/// A weight format as an op uses it for rows of `cols` values.
#[derive(Clone, Copy)]
pub struct Format {
    pub ty: QuantType,
    pub kernels: &'static FormatKernels,
    /// Bytes of one weight row.
    pub row_bytes: usize,
    /// Bytes of one activation row quantised to `kernels.act`.
    pub act_row_bytes: usize,
}

/// Resolves ggml type id `type_id` for rows of `cols` values.
pub fn format(op: &str, type_id: u32, cols: usize) -> Result<Format, String> {
    let ty = QuantType::from_id(type_id)
        .ok_or_else(|| format!("{op}: unknown ggml type id {type_id}"))?;
    let kernels = strata_quant::kernels(ty)
        .ok_or_else(|| format!("{op}: no CPU kernels for {}", ty.name()))?;
    let row_bytes = ty.row_bytes(cols).ok_or_else(|| {
        format!(
            "{op}: a row of {cols} values is not a whole number of {}-value {} blocks",
            ty.block_size(),
            ty.name()
        )
    })?;
    let act_row_bytes = kernels.act.row_bytes(cols).ok_or_else(|| {
        format!(
            "{op}: a row of {cols} values is not a whole number of {}-value {:?} activation blocks",
            kernels.act.block_size(),
            kernels.act
        )
    })?;
    Ok(Format {
        ty,
        kernels,
        row_bytes,
        act_row_bytes,
    })
}
