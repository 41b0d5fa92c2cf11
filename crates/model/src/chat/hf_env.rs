//! The minijinja environment that behaves like transformers' Jinja2 one.

use std::sync::{Arc, LazyLock};

use minijinja::value::{
    Enumerator, Kwargs, Object, ObjectRepr, Rest, Value, ValueKind, ValueOrKwargs,
};
use minijinja::{Environment, Error, ErrorKind, State};

use super::pyjson::{self, DumpOptions};
use super::pyrepr::{is_none, py_none, python_str};
use super::strftime::DateTime;

/// Context variable holding the date `strftime_now` formats.
pub(crate) const NOW_VAR: &str = "__strata_strftime_now";

/// The cause attached to errors from `raise_exception`.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Raised {}

/// The message of a `raise_exception` call, if that is what `e` is.
pub(crate) fn raised_message(e: &Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        source = s.source();
    }
    None
}

/// What Jinja2's `map`, `select`, `reject`, `selectattr` and `rejectattr`
/// return: a generator (empty for a false input, which Jinja2 does not iterate). It iterates like a list but has no length and is not
/// JSON serializable, as in Python.
#[derive(Debug)]
struct Generator(Vec<Value>);

impl Object for Generator {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Iterable
    }
    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.clone())
    }
    fn is_true(self: &Arc<Self>) -> bool {
        true // a Python generator object is always true
    }
}

fn generator(items: Vec<Value>) -> Value {
    Value::from_object(Generator(items))
}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let text = message.as_str().map(str::to_owned).unwrap_or_else(|| {
        let mut s = String::new();
        python_str(&message, &mut s);
        s
    });
    Err(Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(Raised(text)))
}

fn strftime_now(state: &State, format: String) -> Result<Value, Error> {
    let now = state
        .lookup(NOW_VAR)
        .and_then(|v| v.as_str().and_then(DateTime::parse))
        .unwrap_or_else(DateTime::now_utc);
    Ok(Value::from(now.strftime(&format)))
}

fn type_error(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, arguments by position or name.
fn tojson(value: Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.into_values();
    let (positional, kwargs): (&[Value], Kwargs) = minijinja::value::from_args(&args)?;
    if positional.len() > 4 {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let pick = |index: usize, name: &str| -> Result<Option<Value>, Error> {
        let named: Option<Value> = kwargs.get(name)?;
        Ok(named.or_else(|| positional.get(index).cloned()))
    };
    let ensure_ascii = pick(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(1, "indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => return Err(type_error("tojson: indent must be an integer or a string")),
        },
    };
    let (item_separator, key_separator) = match pick(2, "separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_owned(),
                    b.as_str().unwrap_or_default().to_owned(),
                ),
                _ => return Err(type_error("tojson: separators must be two strings")),
            }
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let sort_keys = pick(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let opts = DumpOptions {
        ensure_ascii,
        indent,
        item_separator,
        key_separator,
        sort_keys,
    };
    pyjson::dumps(&value, &opts)
        .map(Value::from)
        .map_err(|e| type_error(e.0))
}

/// Jinja2's `length`: `len(value)`; undefined has length 0, a generator none.
fn length(value: Value) -> Result<Value, Error> {
    if value.downcast_object_ref::<Generator>().is_some() {
        return Err(type_error("object of type 'generator' has no len()"));
    }
    minijinja::filters::length(&value).map(Value::from)
}

/// Jinja2's `string`: `str(value)`.
fn string(value: Value) -> Value {
    if value.kind() == ValueKind::String {
        return value;
    }
    let mut s = String::new();
    python_str(&value, &mut s);
    Value::from(s)
}

static GENERATION_TAG: LazyLock<Option<fancy_regex::Regex>> = LazyLock::new(|| {
    fancy_regex::Regex::new(r"\{%([-+]?)\s*(generation|endgeneration)\s*([-+]?)%\}").ok()
});

/// transformers' `{% generation %}...{% endgeneration %}` renders its body in a
/// scope of its own; `{% with %}` does the same in minijinja, with the same
/// whitespace control.
pub(crate) fn rewrite_generation_tags(source: &str) -> String {
    match GENERATION_TAG.as_ref() {
        Some(re) if source.contains("generation") => re
            .replace_all(source, |c: &fancy_regex::Captures| {
                let tag = if &c[2] == "generation" {
                    "with"
                } else {
                    "endwith"
                };
                format!("{{%{} {tag} {}%}}", &c[1], &c[3])
            })
            .into_owned(),
        _ => source.to_owned(),
    }
}

pub(crate) fn environment() -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?,
    );
    env.set_unknown_method_callback(|state, value, method, args| {
        let rv = minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)?;
        // `dict.get` of a missing key is Python's None.
        Ok(if rv.is_none() { py_none() } else { rv })
    });
    env.add_test("none", |v: Value| is_none(&v));
    env.set_formatter(|out, _state, value| {
        let mut s = String::new();
        python_str(value, &mut s);
        out.write_str(&s).map_err(Error::from)
    });
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_filter("string", string);
    env.add_filter(
        "map",
        |state: &mut State, v: Value, args: Rest<ValueOrKwargs>| {
            if !v.is_true() {
                return Ok(generator(Vec::new()));
            }
            minijinja::filters::map(state, v, args).map(generator)
        },
    );
    env.add_filter(
        "select",
        |state: &mut State, v: Value, test: Option<String>, args: Rest<ValueOrKwargs>| {
            if !v.is_true() {
                return Ok(generator(Vec::new()));
            }
            minijinja::filters::select(state, v, test.map(Into::into), args).map(generator)
        },
    );
    env.add_filter(
        "reject",
        |state: &mut State, v: Value, test: Option<String>, args: Rest<ValueOrKwargs>| {
            if !v.is_true() {
                return Ok(generator(Vec::new()));
            }
            minijinja::filters::reject(state, v, test.map(Into::into), args).map(generator)
        },
    );
    env.add_filter(
        "selectattr",
        |state: &mut State,
         v: Value,
         attr: String,
         test: Option<String>,
         args: Rest<ValueOrKwargs>| {
            if !v.is_true() {
                return Ok(generator(Vec::new()));
            }
            minijinja::filters::selectattr(state, v, attr.into(), test.map(Into::into), args)
                .map(generator)
        },
    );
    env.add_filter(
        "rejectattr",
        |state: &mut State,
         v: Value,
         attr: String,
         test: Option<String>,
         args: Rest<ValueOrKwargs>| {
            if !v.is_true() {
                return Ok(generator(Vec::new()));
            }
            minijinja::filters::rejectattr(state, v, attr.into(), test.map(Into::into), args)
                .map(generator)
        },
    );
    Ok(env)
}
