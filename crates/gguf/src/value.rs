//! Metadata values: scalars, and arrays stored as one typed vector each.
//!
//! A 150k-token vocabulary is one [`StringArray`] (all bytes in one buffer plus
//! end offsets), a 150k-float score table one `Vec<f32>`: no enum per element.

use std::fmt;
use std::sync::Arc;

/// GGUF's `gguf_type` ids (file-format facts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub const fn id(self) -> u32 {
        match self {
            Self::U8 => 0,
            Self::I8 => 1,
            Self::U16 => 2,
            Self::I16 => 3,
            Self::U32 => 4,
            Self::I32 => 5,
            Self::F32 => 6,
            Self::Bool => 7,
            Self::String => 8,
            Self::Array => 9,
            Self::U64 => 10,
            Self::I64 => 11,
            Self::F64 => 12,
        }
    }

    pub const fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::String,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    /// Bytes of one value of a fixed-size type; `None` for strings and arrays.
    pub const fn fixed_size(self) -> Option<usize> {
        match self {
            Self::U8 | Self::I8 | Self::Bool => Some(1),
            Self::U16 | Self::I16 => Some(2),
            Self::U32 | Self::I32 | Self::F32 => Some(4),
            Self::U64 | Self::I64 | Self::F64 => Some(8),
            Self::String | Self::Array => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::U16 => "u16",
            Self::I16 => "i16",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::F32 => "f32",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Array => "array",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F64 => "f64",
        }
    }
}

/// One metadata value.
///
/// A scalar string that is not valid UTF-8 is held here lossily (U+FFFD);
/// its exact bytes stay available from [`crate::Metadata::string_bytes`], and
/// [`crate::GgufFile::get_str`] refuses it with [`crate::GgufError::InvalidUtf8`].
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Self::U8(_) => ValueType::U8,
            Self::I8(_) => ValueType::I8,
            Self::U16(_) => ValueType::U16,
            Self::I16(_) => ValueType::I16,
            Self::U32(_) => ValueType::U32,
            Self::I32(_) => ValueType::I32,
            Self::U64(_) => ValueType::U64,
            Self::I64(_) => ValueType::I64,
            Self::F32(_) => ValueType::F32,
            Self::F64(_) => ValueType::F64,
            Self::Bool(_) => ValueType::Bool,
            Self::String(_) => ValueType::String,
            Self::Array(_) => ValueType::Array,
        }
    }

    /// The value of an integer of any width; `None` for every other type.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Self::U8(v) => v.into(),
            Self::I8(v) => v.into(),
            Self::U16(v) => v.into(),
            Self::I16(v) => v.into(),
            Self::U32(v) => v.into(),
            Self::I32(v) => v.into(),
            Self::U64(v) => v.into(),
            Self::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// `"u32"`, `"string"`, `"array of f32"`, … for error messages.
    pub fn type_description(&self) -> String {
        match self {
            Self::Array(a) => a.type_description(),
            v => v.value_type().name().to_string(),
        }
    }
}

impl fmt::Display for Value {
    /// Scalars as themselves, strings quoted, arrays as a summary
    /// (`[string; 49152]`) so a vocabulary never floods a terminal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::U8(v) => write!(f, "{v}"),
            Self::I8(v) => write!(f, "{v}"),
            Self::U16(v) => write!(f, "{v}"),
            Self::I16(v) => write!(f, "{v}"),
            Self::U32(v) => write!(f, "{v}"),
            Self::I32(v) => write!(f, "{v}"),
            Self::U64(v) => write!(f, "{v}"),
            Self::I64(v) => write!(f, "{v}"),
            Self::F32(v) => write!(f, "{v}"),
            Self::F64(v) => write!(f, "{v}"),
            Self::Bool(v) => write!(f, "{v}"),
            Self::String(s) => write!(f, "{s:?}"),
            Self::Array(a) => write!(f, "[{}; {}]", a.element_description(), a.len()),
        }
    }
}

/// A metadata array: one typed vector per element type; arrays of arrays
/// hold each inner array (which carries its own element type) in a `Vec`.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(StringArray),
    Array(Vec<Array>),
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Self::U8(v) => v.len(),
            Self::I8(v) => v.len(),
            Self::U16(v) => v.len(),
            Self::I16(v) => v.len(),
            Self::U32(v) => v.len(),
            Self::I32(v) => v.len(),
            Self::U64(v) => v.len(),
            Self::I64(v) => v.len(),
            Self::F32(v) => v.len(),
            Self::F64(v) => v.len(),
            Self::Bool(v) => v.len(),
            Self::String(v) => v.len(),
            Self::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The type of the elements, as written in the file.
    pub fn element_type(&self) -> ValueType {
        match self {
            Self::U8(_) => ValueType::U8,
            Self::I8(_) => ValueType::I8,
            Self::U16(_) => ValueType::U16,
            Self::I16(_) => ValueType::I16,
            Self::U32(_) => ValueType::U32,
            Self::I32(_) => ValueType::I32,
            Self::U64(_) => ValueType::U64,
            Self::I64(_) => ValueType::I64,
            Self::F32(_) => ValueType::F32,
            Self::F64(_) => ValueType::F64,
            Self::Bool(_) => ValueType::Bool,
            Self::String(_) => ValueType::String,
            Self::Array(_) => ValueType::Array,
        }
    }

    /// An empty array of element type `ty`.
    pub fn empty(ty: ValueType) -> Self {
        match ty {
            ValueType::U8 => Self::U8(Vec::new()),
            ValueType::I8 => Self::I8(Vec::new()),
            ValueType::U16 => Self::U16(Vec::new()),
            ValueType::I16 => Self::I16(Vec::new()),
            ValueType::U32 => Self::U32(Vec::new()),
            ValueType::I32 => Self::I32(Vec::new()),
            ValueType::U64 => Self::U64(Vec::new()),
            ValueType::I64 => Self::I64(Vec::new()),
            ValueType::F32 => Self::F32(Vec::new()),
            ValueType::F64 => Self::F64(Vec::new()),
            ValueType::Bool => Self::Bool(Vec::new()),
            ValueType::String => Self::String(StringArray::new()),
            ValueType::Array => Self::Array(Vec::new()),
        }
    }

    /// The elements of an integer array of any width, widened; `None` for
    /// every other element type.
    pub fn integers(&self) -> Option<Vec<i128>> {
        fn widen<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Self::U8(v) => widen(v),
            Self::I8(v) => widen(v),
            Self::U16(v) => widen(v),
            Self::I16(v) => widen(v),
            Self::U32(v) => widen(v),
            Self::I32(v) => widen(v),
            Self::U64(v) => widen(v),
            Self::I64(v) => widen(v),
            _ => return None,
        })
    }

    /// `"array of string"`, `"array of array"`, … for error messages.
    pub fn type_description(&self) -> String {
        format!("array of {}", self.element_description())
    }

    fn element_description(&self) -> &'static str {
        self.element_type().name()
    }
}

/// A list of byte strings stored in one buffer. GGUF strings are meant to be
/// UTF-8, but llama.cpp accepts any bytes in token strings, so nothing is lost
/// here: [`StringArray::get_bytes`] is exact, [`StringArray::get`] checks UTF-8.
///
/// The buffers are shared: a clone costs two reference counts, so a tokenizer
/// built from a file's vocabulary holds the same bytes as the file's metadata
/// rather than a second copy (a 150k vocabulary and its merges are megabytes).
/// [`StringArray::push`] on a shared array copies it first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StringArray {
    bytes: Arc<Vec<u8>>,
    /// `ends[i]` is where string `i` ends in `bytes`; it starts at `ends[i-1]`.
    /// 32 bits: half the memory of a vocabulary's offsets (the reader refuses a
    /// string array of more than 4 GiB).
    ends: Arc<Vec<u32>>,
}

impl StringArray {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `strings` strings of `bytes` bytes in all.
    pub fn with_capacity(strings: usize, bytes: usize) -> Self {
        Self {
            bytes: Arc::new(Vec::with_capacity(bytes)),
            ends: Arc::new(Vec::with_capacity(strings)),
        }
    }

    /// Bytes one array can hold in all.
    pub const MAX_BYTES: usize = u32::MAX as usize;

    /// Appends `s`.
    ///
    /// # Panics
    /// When the array would pass [`StringArray::MAX_BYTES`] (4 GiB).
    pub fn push(&mut self, s: impl AsRef<[u8]>) {
        let bytes = Arc::make_mut(&mut self.bytes);
        bytes.extend_from_slice(s.as_ref());
        let end = u32::try_from(bytes.len());
        assert!(end.is_ok(), "a string array holds at most 4 GiB");
        Arc::make_mut(&mut self.ends).push(end.unwrap_or(u32::MAX));
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The exact bytes of string `i`.
    #[inline]
    pub fn get_bytes(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.bytes.get(start..end)
    }

    /// String `i`, or `Some(Err)` if its bytes are not UTF-8.
    pub fn get(&self, i: usize) -> Option<Result<&str, std::str::Utf8Error>> {
        self.get_bytes(i).map(std::str::from_utf8)
    }

    pub fn iter_bytes(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.get_bytes(i).unwrap_or_default())
    }

    /// Every string as `&str`, or the index of the first one that is not UTF-8.
    pub fn to_strs(&self) -> Result<Vec<&str>, usize> {
        self.iter_bytes()
            .enumerate()
            .map(|(i, b)| std::str::from_utf8(b).map_err(|_| i))
            .collect()
    }

    /// Bytes of all strings together.
    pub fn total_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Whether `self` and `other` hold the same buffers (a clone, not a copy).
    pub fn shares_buffers_with(&self, other: &StringArray) -> bool {
        Arc::ptr_eq(&self.bytes, &other.bytes) && Arc::ptr_eq(&self.ends, &other.ends)
    }
}

/// `array[i]`: the bytes of string `i`; panics when `i` is out of range, as
/// indexing a `Vec` does ([`StringArray::get_bytes`] does not).
impl std::ops::Index<usize> for StringArray {
    type Output = [u8];

    fn index(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }
}

impl<S: AsRef<[u8]>> FromIterator<S> for StringArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut out = Self::new();
        for s in iter {
            out.push(s);
        }
        out
    }
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Self { Value::$v(x) }
        }
        impl From<Vec<$t>> for Array {
            fn from(x: Vec<$t>) -> Self { Array::$v(x) }
        }
        impl From<Vec<$t>> for Value {
            fn from(x: Vec<$t>) -> Self { Value::Array(Array::$v(x)) }
        }
    )*};
}
scalar_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64, bool => Bool);

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_string())
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Self {
        Value::Array(a)
    }
}

impl From<StringArray> for Array {
    fn from(a: StringArray) -> Self {
        Array::String(a)
    }
}

impl From<StringArray> for Value {
    fn from(a: StringArray) -> Self {
        Value::Array(Array::String(a))
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Self {
        Value::Array(Array::String(v.into_iter().collect()))
    }
}

impl From<Vec<String>> for Value {
    fn from(v: Vec<String>) -> Self {
        Value::Array(Array::String(v.into_iter().collect()))
    }
}

impl From<Vec<Array>> for Value {
    fn from(v: Vec<Array>) -> Self {
        Value::Array(Array::Array(v))
    }
}
