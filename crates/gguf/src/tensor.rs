//! The tensor index of a GGUF file.

use strata_quant::QuantType;

/// One tensor of the index, with its data range already checked against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Shape in ggml order: `dims[0]` (ne\[0\]) is the contiguous row length.
    pub dims: Vec<u64>,
    pub ty: QuantType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (1 for a tensor with no dimensions).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Elements per row (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of every dimension after the first.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}
