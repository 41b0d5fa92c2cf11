//! Model weights on the device: borrowed from the mapped file where the device reads host
//! memory (the CPU backend), uploaded through the ordered API elsewhere.

use std::sync::Arc;

use strata_core::{Device, DeviceBuffer, HostMemory, Stream};
use strata_gguf::{GgufFile, QuantType, TensorInfo};

use crate::error::{ModelError, Result};

/// A matrix of `m` rows by `k` columns in a GGUF block format.
pub struct Matrix {
    pub buf: DeviceBuffer<u8>,
    pub ty: QuantType,
    pub m: u32,
    pub k: u32,
}

/// `n_expert` matrices of `m` × `k`, contiguous, `expert_bytes` apart.
pub struct Experts {
    /// All experts on the device; `None` when an expert cache holds some of them in slots
    /// and the CPU pool computes the rest from the file.
    pub buf: Option<DeviceBuffer<u8>>,
    /// Byte offset of expert 0 in the mapped file (expert e at `file_offset + e *
    /// expert_bytes`): the host view the cache fills slots from and the pool reads.
    pub file_offset: u64,
    pub ty: QuantType,
    pub m: u32,
    pub k: u32,
    pub n_expert: u32,
    pub expert_bytes: u64,
}

/// An f32 vector (norm weights, biases).
pub struct Vector {
    pub buf: DeviceBuffer<f32>,
    pub len: u32,
}

struct MappedFile(Arc<GgufFile>);

impl HostMemory for MappedFile {
    fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Loads tensors of one file onto one device.
pub struct Loader<'a> {
    dev: &'a Device,
    stream: Stream,
    gguf: Arc<GgufFile>,
    memory: Arc<dyn HostMemory>,
    /// Bytes uploaded or borrowed so far (for progress).
    pub bytes_loaded: u64,
    /// Whether routed experts go on the device (otherwise only their host view is kept).
    pub experts_on_device: bool,
}

impl<'a> Loader<'a> {
    pub fn new(dev: &'a Device, stream: Stream, gguf: Arc<GgufFile>) -> Self {
        let memory: Arc<dyn HostMemory> = Arc::new(MappedFile(gguf.clone()));
        Loader {
            dev,
            stream,
            gguf,
            memory,
            bytes_loaded: 0,
            experts_on_device: true,
        }
    }

    /// The device this loader puts tensors on.
    pub fn device(&self) -> &Device {
        self.dev
    }

    pub fn gguf(&self) -> &GgufFile {
        &self.gguf
    }

    fn info(&self, name: &str) -> Result<TensorInfo> {
        self.gguf
            .tensor(name)
            .cloned()
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    pub fn has(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }

    fn check_dims(t: &TensorInfo, want: &[u64]) -> Result<()> {
        // Trailing 1s are insignificant (a [k, 1] tensor is a [k] vector).
        let trim = |d: &[u64]| {
            let mut v = d.to_vec();
            while v.len() > 1 && v.last() == Some(&1) {
                v.pop();
            }
            v
        };
        if trim(&t.dims) != trim(want) {
            return Err(ModelError::BadShape {
                name: t.name.clone(),
                got: t.dims.clone(),
                want: want.to_vec(),
            });
        }
        Ok(())
    }

    fn bytes_of(&mut self, t: &TensorInfo) -> Result<DeviceBuffer<u8>> {
        self.bytes_loaded += t.n_bytes;
        let (offset, len) = (t.offset as usize, t.n_bytes as usize);
        if let Some(buf) = self
            .dev
            .import_host::<u8>(self.memory.clone(), offset, len)?
        {
            return Ok(buf);
        }
        let data = self.gguf.tensor_data(t);
        Ok(self.dev.alloc_from(data, self.stream)?)
    }

    fn check_format(t: &TensorInfo) -> Result<()> {
        if strata_quant::kernels(t.ty).is_none() {
            return Err(ModelError::BadTensor {
                name: t.name.clone(),
                detail: format!("format {} is not supported for matrices", t.ty),
            });
        }
        Ok(())
    }

    /// The `[k, m]` (ggml order) matrix `name`.
    pub fn matrix(&mut self, name: &str, k: u32, m: u32) -> Result<Matrix> {
        let t = self.info(name)?;
        Self::check_dims(&t, &[k as u64, m as u64])?;
        Self::check_format(&t)?;
        Ok(Matrix {
            buf: self.bytes_of(&t)?,
            ty: t.ty,
            m,
            k,
        })
    }

    /// The `[k, m, n_expert]` expert matrices `name`.
    pub fn experts(&mut self, name: &str, k: u32, m: u32, n_expert: u32) -> Result<Experts> {
        let t = self.info(name)?;
        Self::check_dims(&t, &[k as u64, m as u64, n_expert as u64])?;
        Self::check_format(&t)?;
        let row =
            t.ty.row_bytes(k as usize)
                .ok_or_else(|| ModelError::BadTensor {
                    name: name.to_string(),
                    detail: format!("row of {k} is not a whole number of {} blocks", t.ty),
                })?;
        let buf = if self.experts_on_device {
            Some(self.bytes_of(&t)?)
        } else {
            None
        };
        Ok(Experts {
            buf,
            file_offset: t.offset,
            ty: t.ty,
            m,
            k,
            n_expert,
            expert_bytes: (row * m as usize) as u64,
        })
    }

    /// The f32 vector `name` of `len` elements (converted to f32 if stored otherwise).
    pub fn vector(&mut self, name: &str, len: u32) -> Result<Vector> {
        let t = self.info(name)?;
        Self::check_dims(&t, &[len as u64])?;
        self.bytes_loaded += t.n_bytes;
        if t.ty == QuantType::F32 && t.offset % 4 == 0 {
            let imported = self.dev.import_host::<f32>(
                self.memory.clone(),
                t.offset as usize,
                len as usize,
            )?;
            if let Some(buf) = imported {
                return Ok(Vector { buf, len });
            }
        }
        let mut values = vec![0f32; len as usize];
        strata_quant::dequantize_row(t.ty, self.gguf.tensor_data(&t), &mut values).map_err(
            |e| ModelError::BadTensor {
                name: name.to_string(),
                detail: e.to_string(),
            },
        )?;
        Ok(Vector {
            buf: self.dev.alloc_from(&values, self.stream)?,
            len,
        })
    }

    pub fn optional_vector(&mut self, name: &str, len: u32) -> Result<Option<Vector>> {
        if self.has(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}
