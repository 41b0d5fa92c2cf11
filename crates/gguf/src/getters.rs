//! Typed metadata look-ups on [`GgufFile`].
//!
//! Integers of any width convert to the asked type when the value fits;
//! floats convert only when exact. Every failure names the key.

use crate::GgufError;
use crate::file::GgufFile;
use crate::value::{Array, StringArray, Value};

/// Converts a widened integer to `T`, or says it does not fit.
fn narrow<T: TryFrom<i128>>(key: &str, v: i128, target: &'static str) -> Result<T, GgufError> {
    T::try_from(v).map_err(|_| GgufError::OutOfRange {
        key: key.to_string(),
        value: v.to_string(),
        target,
    })
}

/// `f64` to `f32` when the value survives the round trip (NaN included).
fn f64_to_f32(v: f64) -> Option<f32> {
    let f = v as f32;
    (f64::from(f) == v || v.is_nan()).then_some(f)
}

impl GgufFile {
    /// The value at `key`, or [`GgufError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: found.type_description(),
        }
    }

    fn integer(&self, key: &str, expected: &'static str) -> Result<i128, GgufError> {
        let v = self.require(key)?;
        v.as_integer()
            .ok_or_else(|| self.wrong_type(key, expected, v))
    }

    /// A string value; non-UTF-8 bytes give [`GgufError::InvalidUtf8`]
    /// (use [`GgufFile::get_string_bytes`] for those).
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(_) if self.metadata().is_non_utf8(key) => Err(GgufError::InvalidUtf8 {
                key: key.to_string(),
                index: None,
            }),
            Value::String(s) => Ok(s),
            v => Err(self.wrong_type(key, "string", v)),
        }
    }

    /// The exact bytes of a string value, UTF-8 or not.
    pub fn get_string_bytes(&self, key: &str) -> Result<&[u8], GgufError> {
        let v = self.require(key)?;
        self.metadata()
            .string_bytes(key)
            .ok_or_else(|| self.wrong_type(key, "string", v))
    }

    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        narrow(key, self.integer(key, "an integer")?, "u32")
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        narrow(key, self.integer(key, "an integer")?, "u64")
    }

    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        narrow(key, self.integer(key, "an integer")?, "i32")
    }

    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        narrow(key, self.integer(key, "an integer")?, "i64")
    }

    /// An `f32`, or an `f64` that is exactly representable as one.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            Value::F32(f) => Ok(*f),
            Value::F64(d) => f64_to_f32(*d).ok_or_else(|| GgufError::OutOfRange {
                key: key.to_string(),
                value: d.to_string(),
                target: "f32",
            }),
            v => Err(self.wrong_type(key, "f32", v)),
        }
    }

    /// An `f64`, or an `f32` widened.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        match self.require(key)? {
            Value::F32(f) => Ok(f64::from(*f)),
            Value::F64(d) => Ok(*d),
            v => Err(self.wrong_type(key, "f64", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(self.wrong_type(key, "bool", v)),
        }
    }

    /// An array of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(self.wrong_type(key, "an array", v)),
        }
    }

    /// An array of strings, stored compactly with its exact bytes.
    pub fn get_string_array(&self, key: &str) -> Result<&StringArray, GgufError> {
        match self.get_array(key)? {
            Array::String(s) => Ok(s),
            a => Err(GgufError::WrongType {
                key: key.to_string(),
                expected: "array of string",
                found: a.type_description(),
            }),
        }
    }

    /// An array of strings as `&str`; an element that is not UTF-8 gives
    /// [`GgufError::InvalidUtf8`] with its index (see [`GgufFile::get_bytes_array`]).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.get_string_array(key)?
            .to_strs()
            .map_err(|i| GgufError::InvalidUtf8 {
                key: key.to_string(),
                index: Some(i),
            })
    }

    /// An array of strings as exact bytes.
    pub fn get_bytes_array(&self, key: &str) -> Result<Vec<&[u8]>, GgufError> {
        Ok(self.get_string_array(key)?.iter_bytes().collect())
    }

    /// An `f32` array, or an `f64` array whose every element is exact in `f32`.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        match self.get_array(key)? {
            Array::F32(v) => Ok(v.clone()),
            Array::F64(v) => v
                .iter()
                .enumerate()
                .map(|(i, &d)| {
                    f64_to_f32(d).ok_or_else(|| GgufError::OutOfRange {
                        key: key.to_string(),
                        value: format!("{d} (element {i})"),
                        target: "f32",
                    })
                })
                .collect(),
            a => Err(GgufError::WrongType {
                key: key.to_string(),
                expected: "array of f32",
                found: a.type_description(),
            }),
        }
    }

    fn integer_array<T: TryFrom<i128>>(
        &self,
        key: &str,
        target: &'static str,
    ) -> Result<Vec<T>, GgufError> {
        fn convert<S: Copy + Into<i128>, T: TryFrom<i128>>(
            key: &str,
            v: &[S],
            target: &'static str,
        ) -> Result<Vec<T>, GgufError> {
            v.iter()
                .enumerate()
                .map(|(i, &x)| {
                    let wide: i128 = x.into();
                    T::try_from(wide).map_err(|_| GgufError::OutOfRange {
                        key: key.to_string(),
                        value: format!("{wide} (element {i})"),
                        target,
                    })
                })
                .collect()
        }
        match self.get_array(key)? {
            Array::U8(v) => convert(key, v, target),
            Array::I8(v) => convert(key, v, target),
            Array::U16(v) => convert(key, v, target),
            Array::I16(v) => convert(key, v, target),
            Array::U32(v) => convert(key, v, target),
            Array::I32(v) => convert(key, v, target),
            Array::U64(v) => convert(key, v, target),
            Array::I64(v) => convert(key, v, target),
            a => Err(GgufError::WrongType {
                key: key.to_string(),
                expected: "array of integers",
                found: a.type_description(),
            }),
        }
    }

    /// An integer array of any width whose elements all fit in `i32`.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.integer_array(key, "i32")
    }

    /// An integer array of any width whose elements all fit in `u32`.
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        self.integer_array(key, "u32")
    }

    /// `general.architecture` (`"llama"`, `"qwen3moe"`, …).
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// The key `"{architecture}.{suffix}"`, e.g. `llama.block_count`.
    pub fn arch_key(&self, suffix: &str) -> Result<String, GgufError> {
        Ok(format!("{}.{suffix}", self.architecture()?))
    }

    /// `"{architecture}.{suffix}"` as `u32`, e.g. `arch_u32("block_count")`.
    pub fn arch_u32(&self, suffix: &str) -> Result<u32, GgufError> {
        self.get_u32(&self.arch_key(suffix)?)
    }

    /// `"{architecture}.{suffix}"` as `f32`, e.g. `arch_f32("rope.freq_base")`.
    pub fn arch_f32(&self, suffix: &str) -> Result<f32, GgufError> {
        self.get_f32(&self.arch_key(suffix)?)
    }
}
