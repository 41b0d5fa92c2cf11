//! Parsing the GGUF header, metadata and tensor index from a byte slice.
//!
//! Every read is bounds-checked against the slice, and every count is checked
//! against the bytes left before anything is allocated for it, so a hostile
//! count costs an error, not memory.

use std::collections::HashSet;

use strata_quant::QuantType;

use crate::GgufError;
use crate::metadata::Metadata;
use crate::tensor::TensorInfo;
use crate::value::{Array, StringArray, Value, ValueType};

pub(crate) const MAGIC: &[u8; 4] = b"GGUF";
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
pub(crate) const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml's `GGML_MAX_DIMS`.
pub(crate) const MAX_DIMS: u32 = 4;
/// Arrays nested deeper than this are refused (recursion would otherwise be
/// bounded only by the file size).
const MAX_ARRAY_DEPTH: u32 = 16;

/// Capacity reserved ahead of parsing a counted list; beyond it, lists grow
/// only as entries actually parse, so memory follows real content.
const MAX_RESERVE: usize = 4096;

/// The capacity to reserve for a list of `count` items.
fn reserve(count: u64) -> usize {
    usize::try_from(count)
        .unwrap_or(MAX_RESERVE)
        .min(MAX_RESERVE)
}

/// Smallest possible metadata entry: empty key (8), type (4), a 1-byte value.
const MIN_KV_BYTES: u64 = 13;
/// Smallest possible tensor index entry: empty name (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;
/// Smallest possible nested array: element type (4) and count (8).
const MIN_ARRAY_BYTES: u64 = 12;
/// Smallest possible string: its length (8).
const MIN_STRING_BYTES: u64 = 8;

pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub data_offset: u64,
}

/// A position in the file; failures are plain reasons that the caller
/// prefixes with the key or tensor they concern.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "truncated: needs {n} bytes at offset {}, but the file is {} bytes",
                self.pos,
                self.bytes.len()
            ));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    /// A length-prefixed byte string.
    fn string(&mut self) -> Result<&'a [u8], String> {
        let at = self.pos;
        let len = self.u64()?;
        if len > self.remaining() {
            return Err(format!(
                "string length {len} at offset {at} exceeds the {} bytes left in the file",
                self.remaining()
            ));
        }
        self.take(len)
    }

    /// A note for errors when `count` items of at least `min_bytes` each cannot
    /// fit in what is left of the file; empty when they can.
    fn implausible(&self, count: u64, min_bytes: u64, what: &str) -> String {
        match count.checked_mul(min_bytes) {
            Some(need) if need <= self.remaining() => String::new(),
            _ => format!(
                " (the header claims {count} {what}, more than the {}-byte file can hold)",
                self.bytes.len()
            ),
        }
    }

    /// Checks that `count` items of at least `min_bytes` each can fit in what
    /// is left, so that a capacity of `count` is bounded by the file size.
    fn check_count(&self, count: u64, min_bytes: u64, what: &str) -> Result<usize, String> {
        match count.checked_mul(min_bytes) {
            Some(need) if need <= self.remaining() => Ok(count as usize),
            _ => Err(format!(
                "{what} count {count} needs at least {min_bytes} bytes each, \
                 but only {} bytes are left in the file",
                self.remaining()
            )),
        }
    }
}

pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, GgufError> {
    let mut cur = Cursor { bytes, pos: 0 };
    let header = |reason: String| GgufError::BadHeader { reason };

    let magic = cur.take(4).map_err(|_| GgufError::BadMagic {
        found: bytes.to_vec(),
    })?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = cur.u32().map_err(|r| header(format!("version: {r}")))?;
    match version {
        2 | 3 => {}
        1 => return Err(GgufError::VersionOne),
        v if matches!(v.swap_bytes(), 1..=3) => return Err(GgufError::BigEndian { version: v }),
        v => return Err(GgufError::UnsupportedVersion { version: v }),
    }
    let n_tensors = cur
        .u64()
        .map_err(|r| header(format!("tensor count: {r}")))?;
    let n_kv = cur
        .u64()
        .map_err(|r| header(format!("metadata count: {r}")))?;
    // Counts are not refused up front: entries are read one by one (lists
    // grow only as they parse), so a truncated file names the entry it cuts.
    // A count the file cannot hold is mentioned in that entry's error.
    let kv_note = cur.implausible(n_kv, MIN_KV_BYTES, "metadata entries");
    let tensor_note = cur.implausible(n_tensors, MIN_TENSOR_INFO_BYTES, "tensors");

    let metadata = parse_metadata(&mut cur, n_kv, &kv_note)?;
    let alignment = alignment_of(&metadata)?;
    let infos = parse_tensor_index(&mut cur, n_tensors, &tensor_note)?;

    let data_offset = (cur.pos as u64).next_multiple_of(alignment);
    let tensors = place_tensors(infos, data_offset, alignment, bytes.len() as u64)?;
    Ok(Parsed {
        version,
        alignment,
        metadata,
        tensors,
        data_offset,
    })
}

fn parse_metadata(cur: &mut Cursor<'_>, n_kv: u64, note: &str) -> Result<Metadata, GgufError> {
    let mut metadata = Metadata::with_capacity(reserve(n_kv));
    for index in 0..n_kv {
        let key_bytes = cur.string().map_err(|r| GgufError::BadKey {
            index,
            reason: format!("key: {r}{note}"),
        })?;
        let key = std::str::from_utf8(key_bytes).map_err(|_| GgufError::BadKey {
            index,
            reason: format!("key {:?} is not UTF-8", String::from_utf8_lossy(key_bytes)),
        })?;
        let bad = |reason: String| GgufError::BadValue {
            key: key.to_string(),
            reason,
        };
        if metadata.contains_key(key) {
            return Err(bad(format!("duplicate key (metadata entry #{index})")));
        }
        let type_id = cur.u32().map_err(|r| bad(format!("value type: {r}")))?;
        let ty = ValueType::from_id(type_id)
            .ok_or_else(|| bad(format!("unknown value type id {type_id}")))?;
        if ty == ValueType::String {
            let raw = cur.string().map_err(bad)?;
            metadata.insert_string_bytes(key, raw);
        } else {
            let value = read_value(cur, ty).map_err(bad)?;
            metadata.insert(key, value);
        }
    }
    Ok(metadata)
}

/// A value of any type but string (which the caller reads as raw bytes).
fn read_value(cur: &mut Cursor<'_>, ty: ValueType) -> Result<Value, String> {
    Ok(match ty {
        ValueType::U8 => Value::U8(u8::from_le_bytes(cur.array()?)),
        ValueType::I8 => Value::I8(i8::from_le_bytes(cur.array()?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(cur.array()?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(cur.array()?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(cur.array()?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(cur.array()?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(cur.array()?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(cur.array()?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(cur.array()?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(cur.array()?)),
        ValueType::Bool => Value::Bool(to_bool(cur.array::<1>()?[0])?),
        ValueType::String => {
            let raw = cur.string()?;
            Value::String(String::from_utf8_lossy(raw).into_owned())
        }
        ValueType::Array => Value::Array(read_array(cur, 0)?),
    })
}

/// GGUF bools are one byte; anything but 0 or 1 means a corrupted file.
fn to_bool(b: u8) -> Result<bool, String> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(format!("bool byte {b} is neither 0 nor 1")),
    }
}

fn read_array(cur: &mut Cursor<'_>, depth: u32) -> Result<Array, String> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(format!("arrays nested more than {MAX_ARRAY_DEPTH} deep"));
    }
    let type_id = cur.u32().map_err(|r| format!("array element type: {r}"))?;
    let ty = ValueType::from_id(type_id)
        .ok_or_else(|| format!("unknown array element type id {type_id}"))?;
    let count = cur.u64().map_err(|r| format!("array count: {r}"))?;

    if let Some(size) = ty.fixed_size() {
        let n = cur.check_count(count, size as u64, &format!("{} array", ty.name()))?;
        let raw = cur.take((n * size) as u64)?;
        return fixed_array(ty, raw);
    }
    match ty {
        ValueType::String => {
            let n = cur.check_count(count, MIN_STRING_BYTES, "string array")?;
            // One pass to size the buffer exactly (a vocabulary's bytes are
            // held for the whole run; a growing Vec would leave spare pages).
            let mut sizing = Cursor {
                bytes: cur.bytes,
                pos: cur.pos,
            };
            let mut total = 0usize;
            for i in 0..n {
                let s = sizing.string().map_err(|r| format!("element {i}: {r}"))?;
                total += s.len();
            }
            if total > StringArray::MAX_BYTES {
                return Err(format!(
                    "a string array of {total} bytes (at most {} are supported)",
                    StringArray::MAX_BYTES
                ));
            }
            let mut strings = StringArray::with_capacity(n, total);
            for i in 0..n {
                let s = cur.string().map_err(|r| format!("element {i}: {r}"))?;
                strings.push(s);
            }
            Ok(Array::String(strings))
        }
        _ => {
            let n = cur.check_count(count, MIN_ARRAY_BYTES, "nested array")?;
            let mut arrays = Vec::with_capacity(n.min(MAX_RESERVE));
            for i in 0..n {
                arrays.push(read_array(cur, depth + 1).map_err(|r| format!("element {i}: {r}"))?);
            }
            Ok(Array::Array(arrays))
        }
    }
}

fn fixed_array(ty: ValueType, raw: &[u8]) -> Result<Array, String> {
    fn le<T, const N: usize>(raw: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
        raw.chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                from(a)
            })
            .collect()
    }
    Ok(match ty {
        ValueType::U8 => Array::U8(raw.to_vec()),
        ValueType::I8 => Array::I8(le(raw, i8::from_le_bytes)),
        ValueType::U16 => Array::U16(le(raw, u16::from_le_bytes)),
        ValueType::I16 => Array::I16(le(raw, i16::from_le_bytes)),
        ValueType::U32 => Array::U32(le(raw, u32::from_le_bytes)),
        ValueType::I32 => Array::I32(le(raw, i32::from_le_bytes)),
        ValueType::U64 => Array::U64(le(raw, u64::from_le_bytes)),
        ValueType::I64 => Array::I64(le(raw, i64::from_le_bytes)),
        ValueType::F32 => Array::F32(le(raw, f32::from_le_bytes)),
        ValueType::F64 => Array::F64(le(raw, f64::from_le_bytes)),
        ValueType::Bool => Array::Bool(
            raw.iter()
                .enumerate()
                .map(|(i, &b)| to_bool(b).map_err(|r| format!("element {i}: {r}")))
                .collect::<Result<_, _>>()?,
        ),
        ValueType::String | ValueType::Array => {
            return Err(format!("{} is not a fixed-size type", ty.name()));
        }
    })
}

/// `general.alignment`: a u32 power of two when present (llama.cpp's rule), else 32.
fn alignment_of(metadata: &Metadata) -> Result<u64, GgufError> {
    let bad = |reason: String| GgufError::BadValue {
        key: ALIGNMENT_KEY.to_string(),
        reason,
    };
    match metadata.get(ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(Value::U32(a)) => Err(bad(format!("alignment {a} is not a power of two"))),
        Some(v) => Err(bad(format!("must be u32, found {}", v.type_description()))),
    }
}

/// A tensor index entry as read, before its data range is known.
struct RawTensor {
    name: String,
    dims: Vec<u64>,
    ty: QuantType,
    relative_offset: u64,
    n_bytes: u64,
}

fn parse_tensor_index(
    cur: &mut Cursor<'_>,
    n_tensors: u64,
    note: &str,
) -> Result<Vec<RawTensor>, GgufError> {
    let reserve = reserve(n_tensors);
    let mut tensors = Vec::with_capacity(reserve);
    let mut seen = HashSet::with_capacity(reserve);
    for i in 0..n_tensors {
        let unnamed = |reason: String| GgufError::BadTensor {
            tensor: format!("#{i}"),
            reason,
        };
        let name_bytes = cur
            .string()
            .map_err(|r| unnamed(format!("name: {r}{note}")))?;
        let name = std::str::from_utf8(name_bytes)
            .map_err(|_| {
                unnamed(format!(
                    "name {:?} is not UTF-8",
                    String::from_utf8_lossy(name_bytes)
                ))
            })?
            .to_string();
        let bad = |reason: String| GgufError::BadTensor {
            tensor: name.clone(),
            reason,
        };
        if !seen.insert(name.clone()) {
            return Err(bad(format!("duplicate tensor name (tensor #{i})")));
        }
        let n_dims = cur
            .u32()
            .map_err(|r| bad(format!("dimension count: {r}")))?;
        if n_dims > MAX_DIMS {
            return Err(bad(format!(
                "{n_dims} dimensions, at most {MAX_DIMS} allowed"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for j in 0..n_dims {
            let ne = cur.u64().map_err(|r| bad(format!("dimension {j}: {r}")))?;
            if ne > i64::MAX as u64 {
                return Err(bad(format!("dimension {j} is negative as int64 ({ne:#x})")));
            }
            dims.push(ne);
        }
        let type_id = cur.u32().map_err(|r| bad(format!("type: {r}")))?;
        let ty = QuantType::from_id(type_id)
            .ok_or_else(|| bad(format!("unknown ggml type id {type_id}")))?;
        let n_bytes = tensor_bytes(&dims, ty).map_err(&bad)?;
        let relative_offset = cur.u64().map_err(|r| bad(format!("data offset: {r}")))?;
        tensors.push(RawTensor {
            name,
            dims,
            ty,
            relative_offset,
            n_bytes,
        });
    }
    Ok(tensors)
}

/// Bytes of a tensor of shape `dims` (ggml order) and type `ty`, checking that
/// rows are whole blocks and that nothing overflows int64 (ggml's limit).
pub(crate) fn tensor_bytes(dims: &[u64], ty: QuantType) -> Result<u64, String> {
    let ne0 = dims.first().copied().unwrap_or(1);
    let block = ty.block_size() as u64;
    if ne0 % block != 0 {
        return Err(format!(
            "{ne0} elements per row is not a multiple of {ty}'s block size {block}"
        ));
    }
    let overflow = || format!("shape {dims:?} of {ty} overflows int64");
    let mut elements: u64 = 1;
    for &ne in dims {
        elements = elements.checked_mul(ne).ok_or_else(overflow)?;
    }
    if elements > i64::MAX as u64 {
        return Err(overflow());
    }
    let mut bytes = (ne0 / block)
        .checked_mul(ty.type_size() as u64)
        .ok_or_else(overflow)?;
    for &ne in dims.iter().skip(1) {
        bytes = bytes.checked_mul(ne).ok_or_else(overflow)?;
    }
    if bytes > i64::MAX as u64 {
        return Err(overflow());
    }
    Ok(bytes)
}

/// Resolves each tensor's absolute data range and checks it is aligned, inside
/// the file and overlaps no other tensor.
fn place_tensors(
    raw: Vec<RawTensor>,
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<Vec<TensorInfo>, GgufError> {
    let mut tensors = Vec::with_capacity(raw.len());
    for t in raw {
        let bad = |reason: String| GgufError::BadTensor {
            tensor: t.name.clone(),
            reason,
        };
        if t.relative_offset % alignment != 0 {
            return Err(bad(format!(
                "data offset {} is not a multiple of the alignment {alignment}",
                t.relative_offset
            )));
        }
        let range = data_offset
            .checked_add(t.relative_offset)
            .and_then(|start| Some((start, start.checked_add(t.n_bytes)?)));
        match range {
            Some((start, end)) if end <= file_len => tensors.push(TensorInfo {
                name: t.name,
                dims: t.dims,
                ty: t.ty,
                offset: start,
                n_bytes: t.n_bytes,
            }),
            _ => {
                return Err(bad(format!(
                    "{} bytes of data at offset {} (data section starts at {data_offset}) \
                     run past the end of the {file_len}-byte file",
                    t.n_bytes, t.relative_offset
                )));
            }
        }
    }

    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.offset < a.offset + a.n_bytes {
            return Err(GgufError::BadTensor {
                tensor: b.name.clone(),
                reason: format!(
                    "data at offset {} overlaps tensor `{}` ({} bytes at offset {})",
                    b.offset, a.name, a.n_bytes, a.offset
                ),
            });
        }
    }
    Ok(tensors)
}
