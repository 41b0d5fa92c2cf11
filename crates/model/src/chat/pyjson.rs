//! JSON in and out with Python's semantics: objects keep their key order when
//! parsed (Python dicts do), and `tojson` writes exactly what `json.dumps` writes.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::pyrepr::{is_none, py_none, python_float};

/// A JSON document as a template value, object key order kept.
pub(crate) struct OrderedJson(pub Value);

impl<'de> Deserialize<'de> for OrderedJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor).map(OrderedJson)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(py_none())
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(py_none())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(OrderedJson(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::from(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut pairs: Vec<(String, Value)> = Vec::new();
        while let Some((k, OrderedJson(v))) = map.next_entry::<String, OrderedJson>()? {
            // A repeated key keeps its first position and takes the last value, as in Python.
            match pairs.iter_mut().find(|(key, _)| *key == k) {
                Some(slot) => slot.1 = v,
                None => pairs.push((k, v)),
            }
        }
        Ok(Value::from_pairs(pairs))
    }
}

/// Parses JSON text into a template value.
pub(crate) fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let OrderedJson(v) = OrderedJson::deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// Options of Python's `json.dumps` that chat templates use.
pub(crate) struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: newline and `s` per level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

/// Why a value cannot be written as JSON (Python raises TypeError there).
pub(crate) struct NotSerializable(pub String);

pub(crate) fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, NotSerializable> {
    let mut out = String::new();
    write_value(&mut out, value, opts, 0)?;
    Ok(out)
}

fn newline(out: &mut String, opts: &DumpOptions, level: usize) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn write_value(
    out: &mut String,
    value: &Value,
    opts: &DumpOptions,
    level: usize,
) -> Result<(), NotSerializable> {
    if is_none(value) {
        out.push_str("null");
        return Ok(());
    }
    match value.kind() {
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => {
            write_string(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter().map(|it| it.collect()).unwrap_or_default();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline(out, opts, level + 1);
                write_value(out, item, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter().map(|it| it.collect()).unwrap_or_default();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline(out, opts, level + 1);
                write_key(out, key, opts)?;
                out.push_str(&opts.key_separator);
                let v = value.get_item(key).unwrap_or(Value::UNDEFINED);
                write_value(out, &v, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push('}');
        }
        ValueKind::Undefined => {
            return Err(NotSerializable(
                "Object of type Undefined is not JSON serializable".into(),
            ));
        }
        ValueKind::Iterable => {
            return Err(NotSerializable(
                "Object of type generator is not JSON serializable".into(),
            ));
        }
        other => {
            return Err(NotSerializable(format!(
                "Object of type {other} is not JSON serializable"
            )));
        }
    }
    Ok(())
}

/// JSON object keys: strings as they are, numbers, booleans and null as JSON writes them.
fn write_key(out: &mut String, key: &Value, opts: &DumpOptions) -> Result<(), NotSerializable> {
    if is_none(key) {
        out.push_str("\"null\"");
        return Ok(());
    }
    match key.kind() {
        ValueKind::String => write_string(out, key.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key);
            write_string(out, &s, opts.ensure_ascii);
        }
        ValueKind::Bool => out.push_str(if key.is_true() {
            "\"true\""
        } else {
            "\"false\""
        }),
        other => {
            return Err(NotSerializable(format!(
                "keys must be str, int, float, bool or None, not {other}"
            )));
        }
    }
    Ok(())
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else {
        match f64::try_from(value.clone()) {
            Ok(f) if f.is_nan() => out.push_str("NaN"),
            Ok(f) if f.is_infinite() => {
                out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" })
            }
            Ok(f) => out.push_str(&python_float(f)),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        }
    }
}

/// A JSON string as Python's encoder writes it.
pub(crate) fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7E => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compact() -> DumpOptions {
        DumpOptions {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }

    #[test]
    fn key_order_survives_a_round_trip() {
        let v = parse(r#"{"b": 1, "a": [1.5, null, true, "é\n"], "c": {}}"#).unwrap();
        assert_eq!(
            dumps(&v, &compact()).ok().unwrap(),
            r#"{"b": 1, "a": [1.5, null, true, "é\n"], "c": {}}"#
        );
    }

    #[test]
    fn ascii_escapes_and_indent_match_python() {
        let v = parse(r#"{"k": ["😀", "é"], "e": []}"#).unwrap();
        let opts = DumpOptions {
            ensure_ascii: true,
            indent: Some("  ".into()),
            item_separator: ",".into(),
            ..compact()
        };
        // json.dumps({"k": ["😀", "é"], "e": []}, ensure_ascii=True, indent=2)
        assert_eq!(
            dumps(&v, &opts).ok().unwrap(),
            "{\n  \"k\": [\n    \"\\ud83d\\ude00\",\n    \"\\u00e9\"\n  ],\n  \"e\": []\n}"
        );
    }
}
