//! How Python writes values, so that `{{ value }}` renders as Jinja2 renders it
//! (`True`, `None`, `['a', 1]`, `1e+16`), not as minijinja's own forms.

use std::fmt::Write;
use std::sync::Arc;

use minijinja::value::{Object, ObjectRepr, Value, ValueKind};

/// Python's `None` as data passes it in (JSON `null`, absent `tools`). Unlike
/// minijinja's none it is not iterable and has no length, so `for t in tools`
/// and `tools | length` fail as they do in Python; it is false, prints `None`
/// and passes the `none` test.
#[derive(Debug)]
pub(crate) struct PyNone;

impl Object for PyNone {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }
    fn is_true(self: &Arc<Self>) -> bool {
        false
    }
    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("None")
    }
}

pub(crate) fn py_none() -> Value {
    Value::from_object(PyNone)
}

/// Whether `v` is None, either kind.
pub(crate) fn is_none(v: &Value) -> bool {
    v.is_none() || v.downcast_object_ref::<PyNone>().is_some()
}

/// `repr(float)`: the shortest digits that round-trip, positional for
/// exponents from -4 to 15, else `d.ddde±XX`.
pub(crate) fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e6".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let mut s = String::from(sign);
        if point <= 0 {
            s.push_str("0.");
            for _ in 0..-point {
                s.push('0');
            }
            s.push_str(&digits);
        } else if point as usize >= digits.len() {
            s.push_str(&digits);
            for _ in 0..(point as usize - digits.len()) {
                s.push('0');
            }
            s.push_str(".0");
        } else {
            s.push_str(&digits[..point as usize]);
            s.push('.');
            s.push_str(&digits[point as usize..]);
        }
        s
    } else {
        let mut s = String::from(sign);
        s.push_str(&digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let _ = write!(s, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
        s
    }
}

/// `repr(str)`: single quotes unless the text has a single quote and no double one.
fn python_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7F => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `repr(value)`, as Python shows items inside a list or dict.
pub(crate) fn python_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::String => python_str_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            let (open, close) = if value.is_tuple() {
                ('(', ')')
            } else {
                ('[', ']')
            };
            out.push(open);
            let items: Vec<Value> = value.try_iter().map(|it| it.collect()).unwrap_or_default();
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(item, out);
            }
            if value.is_tuple() && items.len() == 1 {
                out.push(',');
            }
            out.push(close);
        }
        ValueKind::Map => {
            out.push('{');
            let keys: Vec<Value> = value.try_iter().map(|it| it.collect()).unwrap_or_default();
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(key, out);
                out.push_str(": ");
                python_repr(&value.get_item(key).unwrap_or(Value::UNDEFINED), out);
            }
            out.push('}');
        }
        _ => python_str(value, out),
    }
}

/// `str(value)`: what `{{ value }}` prints in Jinja2.
pub(crate) fn python_str(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(f) => out.push_str(&python_float(f)),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        },
        ValueKind::Seq | ValueKind::Map => python_repr(value, out),
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (18.5, "18.5"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (100.0, "100.0"),
        ] {
            assert_eq!(python_float(f), want, "{f}");
        }
    }

    #[test]
    fn containers_print_as_python_repr() {
        let v = Value::from_pairs([(
            "a",
            Value::from(vec![Value::from("x'y"), Value::from(true), Value::from(())]),
        )]);
        let mut s = String::new();
        python_str(&v, &mut s);
        assert_eq!(s, r#"{'a': ["x'y", True, None]}"#);
    }
}
