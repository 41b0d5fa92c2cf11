//! The ordered key → value map of a GGUF file.

use std::collections::HashMap;

use crate::value::Value;

/// Metadata in file order, with a hash index for look-ups.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    /// Exact bytes of the scalar string values that are not UTF-8, by entry
    /// position (their `Value::String` holds a lossy copy).
    non_utf8: HashMap<usize, Vec<u8>>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            entries: Vec::with_capacity(n),
            index: HashMap::with_capacity(n),
            non_utf8: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> + '_ {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// Sets `key`. A key already present keeps its position (as the `gguf`
    /// Python writer does) and gets the new value.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        let key = key.into();
        let value = value.into();
        match self.index.get(&key) {
            Some(&i) => {
                self.non_utf8.remove(&i);
                self.entries[i].1 = value;
            }
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    /// Sets `key` to a string given as raw bytes, which need not be UTF-8.
    pub fn insert_string_bytes(&mut self, key: impl Into<String>, bytes: &[u8]) {
        let key = key.into();
        match std::str::from_utf8(bytes) {
            Ok(s) => self.insert(key, s),
            Err(_) => {
                self.insert(
                    key.clone(),
                    Value::String(String::from_utf8_lossy(bytes).into_owned()),
                );
                if let Some(&i) = self.index.get(&key) {
                    self.non_utf8.insert(i, bytes.to_vec());
                }
            }
        }
    }

    /// The exact bytes of the scalar string at `key` (UTF-8 or not).
    pub fn string_bytes(&self, key: &str) -> Option<&[u8]> {
        let &i = self.index.get(key)?;
        if let Some(raw) = self.non_utf8.get(&i) {
            return Some(raw);
        }
        match &self.entries[i].1 {
            Value::String(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// Whether the scalar string at `key` was stored lossily.
    pub fn is_non_utf8(&self, key: &str) -> bool {
        self.index
            .get(key)
            .is_some_and(|i| self.non_utf8.contains_key(i))
    }

    /// Removes `key`, keeping the order of the others.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.index.remove(key)?;
        let (_, value) = self.entries.remove(i);
        self.non_utf8.remove(&i);
        for pos in self.index.values_mut() {
            if *pos > i {
                *pos -= 1;
            }
        }
        self.non_utf8 = std::mem::take(&mut self.non_utf8)
            .into_iter()
            .map(|(p, b)| (if p > i { p - 1 } else { p }, b))
            .collect();
        Some(value)
    }
}

impl PartialEq for Metadata {
    /// Same keys in the same order with the same values and the same bytes.
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries && self.non_utf8 == other.non_utf8
    }
}
