//! [`GgufWriter`]: builds a GGUF file (the synthetic-model generator's output).
//!
//! Layout as the `gguf` Python package and llama.cpp write it: header, metadata
//! in insertion order, tensor index, zero padding to the alignment, then each
//! tensor's data followed by zero padding to the alignment.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::{self, Write};
use std::path::Path;

use strata_quant::QuantType;

use crate::GgufError;
use crate::file::GgufFile;
use crate::metadata::Metadata;
use crate::parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS, tensor_bytes};
use crate::value::{Array, Value};

/// Writes a tensor's bytes into the file; it must write exactly the tensor's size.
type FillFn<'a> = Box<dyn FnOnce(&mut dyn Write) -> io::Result<()> + 'a>;

enum TensorData<'a> {
    Bytes(Cow<'a, [u8]>),
    Fill(FillFn<'a>),
}

struct PendingTensor<'a> {
    name: String,
    dims: Vec<u64>,
    ty: QuantType,
    n_bytes: u64,
    data: TensorData<'a>,
}

/// A GGUF file being assembled; nothing is written until [`GgufWriter::write_to`].
pub struct GgufWriter<'a> {
    version: u32,
    metadata: Metadata,
    tensors: Vec<PendingTensor<'a>>,
    names: HashSet<String>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> GgufWriter<'a> {
    /// An empty version-3 file.
    pub fn new() -> Self {
        Self {
            version: 3,
            metadata: Metadata::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// A writer holding `file`'s metadata and tensors (data borrowed), in order:
    /// writing it out again reproduces a file in the standard layout.
    pub fn from_file(file: &'a GgufFile) -> Result<Self, GgufError> {
        let mut w = Self::new();
        w.set_version(file.version())?;
        w.metadata = file.metadata().clone();
        for t in file.tensors() {
            w.add_tensor(&t.name, &t.dims, t.ty, file.tensor_data(t))?;
        }
        Ok(w)
    }

    /// GGUF version 2 or 3 (their little-endian layouts are the same).
    pub fn set_version(&mut self, version: u32) -> Result<(), GgufError> {
        if !matches!(version, 2 | 3) {
            return Err(bad_write(format!("cannot write GGUF version {version}")));
        }
        self.version = version;
        Ok(())
    }

    /// Sets `general.alignment` (a power of two); the data is aligned to it.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        if !alignment.is_power_of_two() {
            return Err(bad_write(format!(
                "alignment {alignment} is not a power of two"
            )));
        }
        self.metadata.insert(ALIGNMENT_KEY, Value::U32(alignment));
        Ok(())
    }

    /// Adds (or replaces, keeping its position) a metadata entry.
    pub fn add(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        self.metadata.insert(key, value);
    }

    /// Adds a string entry given as raw bytes, which need not be UTF-8.
    pub fn add_string_bytes(&mut self, key: impl Into<String>, bytes: &[u8]) {
        self.metadata.insert_string_bytes(key, bytes);
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.metadata
    }

    /// Adds a tensor of shape `dims` (ggml order) whose data is `data`.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: QuantType,
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<(), GgufError> {
        let data = data.into();
        let n_bytes = self.check_tensor(name, dims, ty)?;
        if data.len() as u64 != n_bytes {
            return Err(bad_write(format!(
                "tensor `{name}`: {} bytes given, its shape {dims:?} of {ty} needs {n_bytes}",
                data.len()
            )));
        }
        self.push(name, dims, ty, n_bytes, TensorData::Bytes(data));
        Ok(())
    }

    /// Adds a tensor whose data `fill` writes when the file is written, so a
    /// large model never has to be held in memory; `fill` must write exactly
    /// the tensor's size ([`crate::tensor_bytes`]).
    pub fn add_tensor_with(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: QuantType,
        fill: impl FnOnce(&mut dyn Write) -> io::Result<()> + 'a,
    ) -> Result<(), GgufError> {
        let n_bytes = self.check_tensor(name, dims, ty)?;
        self.push(name, dims, ty, n_bytes, TensorData::Fill(Box::new(fill)));
        Ok(())
    }

    fn check_tensor(&self, name: &str, dims: &[u64], ty: QuantType) -> Result<u64, GgufError> {
        if self.names.contains(name) {
            return Err(bad_write(format!("duplicate tensor name `{name}`")));
        }
        if dims.len() > MAX_DIMS as usize {
            return Err(bad_write(format!(
                "tensor `{name}`: {} dimensions, at most {MAX_DIMS} allowed",
                dims.len()
            )));
        }
        tensor_bytes(dims, ty).map_err(|r| bad_write(format!("tensor `{name}`: {r}")))
    }

    fn push(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: QuantType,
        n_bytes: u64,
        data: TensorData<'a>,
    ) {
        self.names.insert(name.to_string());
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            n_bytes,
            data,
        });
    }

    /// The alignment the data will have: `general.alignment` if set, else 32.
    pub fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.get(ALIGNMENT_KEY) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
            Some(v) => Err(bad_write(format!(
                "`{ALIGNMENT_KEY}` must be a u32 power of two, found {} {v}",
                v.type_description()
            ))),
        }
    }

    /// Writes the file to `path`.
    pub fn write_file(self, path: impl AsRef<Path>) -> Result<u64, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut out = io::BufWriter::new(file);
        let n = self.write_to(&mut out)?;
        out.flush().map_err(io)?;
        Ok(n)
    }

    /// The whole file in memory.
    pub fn to_bytes(self) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Writes the file to `out`; returns the number of bytes written.
    pub fn write_to(self, out: &mut dyn Write) -> Result<u64, GgufError> {
        let alignment = self.alignment()?;
        let mut w = Counting { inner: out, n: 0 };

        w.write_all(MAGIC)?;
        w.write_all(&self.version.to_le_bytes())?;
        w.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(self.metadata.len() as u64).to_le_bytes())?;

        for (key, value) in self.metadata.iter() {
            write_string(&mut w, key.as_bytes())?;
            w.write_all(&value.value_type().id().to_le_bytes())?;
            match value {
                Value::String(_) => {
                    let raw = self.metadata.string_bytes(key).unwrap_or_default();
                    write_string(&mut w, raw)?;
                }
                v => write_value(&mut w, v)?,
            }
        }

        let mut offset = 0u64;
        for t in &self.tensors {
            write_string(&mut w, t.name.as_bytes())?;
            w.write_all(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                w.write_all(&d.to_le_bytes())?;
            }
            w.write_all(&t.ty.id().to_le_bytes())?;
            w.write_all(&offset.to_le_bytes())?;
            offset += t.n_bytes.next_multiple_of(alignment);
        }
        w.pad(alignment)?;

        for t in self.tensors {
            let start = w.n;
            match t.data {
                TensorData::Bytes(b) => w.write_all(&b)?,
                TensorData::Fill(fill) => fill(&mut w).map_err(GgufError::WriteIo)?,
            }
            let written = w.n - start;
            if written != t.n_bytes {
                return Err(bad_write(format!(
                    "tensor `{}`: its fill wrote {written} bytes, expected {}",
                    t.name, t.n_bytes
                )));
            }
            w.pad(alignment)?;
        }
        Ok(w.n)
    }
}

fn bad_write(reason: String) -> GgufError {
    GgufError::BadWrite { reason }
}

/// A writer that counts what passes through, for padding and size checks.
struct Counting<'w> {
    inner: &'w mut dyn Write,
    n: u64,
}

impl Counting<'_> {
    fn pad(&mut self, alignment: u64) -> Result<(), GgufError> {
        let pad = self.n.next_multiple_of(alignment) - self.n;
        io::copy(&mut io::repeat(0).take(pad), self).map_err(GgufError::WriteIo)?;
        Ok(())
    }

    fn write_all(&mut self, buf: &[u8]) -> Result<(), GgufError> {
        Write::write_all(self, buf).map_err(GgufError::WriteIo)
    }
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

use std::io::Read as _;

fn write_string(w: &mut Counting<'_>, s: &[u8]) -> Result<(), GgufError> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s)
}

/// A value without its type id (the caller wrote it).
fn write_value(w: &mut Counting<'_>, value: &Value) -> Result<(), GgufError> {
    match value {
        Value::U8(v) => w.write_all(&v.to_le_bytes()),
        Value::I8(v) => w.write_all(&v.to_le_bytes()),
        Value::U16(v) => w.write_all(&v.to_le_bytes()),
        Value::I16(v) => w.write_all(&v.to_le_bytes()),
        Value::U32(v) => w.write_all(&v.to_le_bytes()),
        Value::I32(v) => w.write_all(&v.to_le_bytes()),
        Value::U64(v) => w.write_all(&v.to_le_bytes()),
        Value::I64(v) => w.write_all(&v.to_le_bytes()),
        Value::F32(v) => w.write_all(&v.to_le_bytes()),
        Value::F64(v) => w.write_all(&v.to_le_bytes()),
        Value::Bool(v) => w.write_all(&[u8::from(*v)]),
        Value::String(s) => write_string(w, s.as_bytes()),
        Value::Array(a) => write_array(w, a),
    }
}

/// Element type, count, elements.
fn write_array(w: &mut Counting<'_>, array: &Array) -> Result<(), GgufError> {
    w.write_all(&array.element_type().id().to_le_bytes())?;
    w.write_all(&(array.len() as u64).to_le_bytes())?;
    macro_rules! each_le {
        ($v:expr) => {{
            let mut buf = Vec::with_capacity(std::mem::size_of_val($v.as_slice()));
            for x in $v {
                buf.extend_from_slice(&x.to_le_bytes());
            }
            w.write_all(&buf)
        }};
    }
    match array {
        Array::U8(v) => w.write_all(v),
        Array::I8(v) => each_le!(v),
        Array::U16(v) => each_le!(v),
        Array::I16(v) => each_le!(v),
        Array::U32(v) => each_le!(v),
        Array::I32(v) => each_le!(v),
        Array::U64(v) => each_le!(v),
        Array::I64(v) => each_le!(v),
        Array::F32(v) => each_le!(v),
        Array::F64(v) => each_le!(v),
        Array::Bool(v) => {
            let bytes: Vec<u8> = v.iter().map(|&b| u8::from(b)).collect();
            w.write_all(&bytes)
        }
        Array::String(s) => {
            for b in s.iter_bytes() {
                write_string(w, b)?;
            }
            Ok(())
        }
        Array::Array(arrays) => {
            for a in arrays {
                write_array(w, a)?;
            }
            Ok(())
        }
    }
}
