//! Chat templates (`tokenizer.chat_template`) rendered with minijinja the way
//! Hugging Face transformers renders them with Jinja2: trim_blocks and
//! lstrip_blocks, `raise_exception`, `strftime_now`, its `tojson`
//! (`json.dumps(..., ensure_ascii=False)` with `indent`, `separators`,
//! `sort_keys`), the `{% generation %}` tag, Python's string methods, and values
//! printed as Python prints them (`True`, `None`, `['a']`, `1e+16`).
//!
//! Checked against Jinja2 on 65 templates (tests/golden/templates). Known
//! differences:
//! - Jinja2's `Markup` escaping: in Jinja2 `'a'|safe + text` HTML-escapes `text`;
//!   minijinja has no Markup type, so strata concatenates plainly
//!   (meetkai-functionary-medium-v3.1 with tools renders `"` where Jinja2 writes `&#34;`).
//! - Nones that come from the data (JSON `null`, absent `tools`) behave as in
//!   Python, but a `none` written in the template iterates as empty in minijinja
//!   where Jinja2 raises.
//! - `~` and `join` write booleans and none as minijinja does (`true`, `none`);
//!   `{{ }}` output and `|string` write them as Python does.
//! - `strftime_now` uses UTC unless a date is given; transformers uses local time.

mod error;
mod hf_env;
mod prompt;
mod pyjson;
mod pyrepr;
mod strftime;

use minijinja::Environment;
use minijinja::value::Value;

pub use error::ChatError;
pub use prompt::encode_chat;
pub use strftime::DateTime;

/// The template name used in error messages.
const TEMPLATE_NAME: &str = "chat_template";

/// What a template is rendered with: the context Hugging Face passes.
#[derive(Clone, Debug)]
pub struct ChatInputs {
    /// A list of message objects (`role`, `content`, `tool_calls`, ...).
    pub messages: Value,
    /// A list of tool definitions; `None` renders as Python's `None`.
    pub tools: Option<Value>,
    pub add_generation_prompt: bool,
    pub bos_token: String,
    pub eos_token: String,
    /// More template variables (`enable_thinking`, ...).
    pub extra: Vec<(String, Value)>,
    /// The date `strftime_now` sees; `None` means now (UTC).
    pub now: Option<DateTime>,
}

impl ChatInputs {
    /// Inputs from JSON text: `messages` is a JSON list of messages, `tools` a
    /// JSON list of tools. Object key order is kept, as Python keeps it.
    pub fn from_json(messages: &str, tools: Option<&str>) -> Result<Self, ChatError> {
        let messages = parse_json_list(messages, "the messages")?;
        let tools = tools.map(|t| parse_json_list(t, "the tools")).transpose()?;
        Ok(Self {
            messages,
            tools,
            add_generation_prompt: false,
            bos_token: String::new(),
            eos_token: String::new(),
            extra: Vec::new(),
            now: None,
        })
    }
}

/// JSON text to a template value, object key order kept.
pub fn parse_json(text: &str, what: &str) -> Result<Value, ChatError> {
    pyjson::parse(text).map_err(|e| ChatError::BadJson {
        what: what.to_owned(),
        reason: e.to_string(),
    })
}

fn parse_json_list(text: &str, what: &str) -> Result<Value, ChatError> {
    let v = parse_json(text, what)?;
    if v.kind() != minijinja::value::ValueKind::Seq {
        return Err(ChatError::BadInput {
            what: what.to_owned(),
            expected: "list",
        });
    }
    Ok(v)
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    pub fn new(source: &str) -> Result<Self, ChatError> {
        let mut env = hf_env::environment().map_err(|e| ChatError::Syntax {
            line: None,
            message: describe(&e),
        })?;
        let source = hf_env::rewrite_generation_tags(source);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| ChatError::Syntax {
                line: e.line(),
                message: describe(&e),
            })?;
        Ok(Self { env })
    }

    /// Renders the prompt. Fails, naming the template line, when the template
    /// raises or uses a value in a way Jinja2 would refuse.
    pub fn render(&self, inputs: &ChatInputs) -> Result<String, ChatError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Syntax {
                line: e.line(),
                message: describe(&e),
            })?;
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), inputs.messages.clone()),
            (
                "tools".into(),
                inputs.tools.clone().unwrap_or_else(pyrepr::py_none),
            ),
            ("documents".into(), pyrepr::py_none()),
            (
                "add_generation_prompt".into(),
                Value::from(inputs.add_generation_prompt),
            ),
            ("bos_token".into(), Value::from(inputs.bos_token.as_str())),
            ("eos_token".into(), Value::from(inputs.eos_token.as_str())),
        ];
        for (k, v) in &inputs.extra {
            match ctx.iter_mut().find(|(key, _)| key == k) {
                Some(slot) => slot.1 = v.clone(),
                None => ctx.push((k.clone(), v.clone())),
            }
        }
        let now = inputs.now.unwrap_or_else(DateTime::now_utc);
        ctx.push((
            hf_env::NOW_VAR.into(),
            Value::from(now.strftime("%Y-%m-%dT%H:%M:%S")),
        ));
        template
            .render(Value::from_pairs(ctx))
            .map_err(|e| match hf_env::raised_message(&e) {
                Some(message) => ChatError::Raised {
                    line: e.line(),
                    message,
                },
                None => ChatError::Render {
                    line: e.line(),
                    message: describe(&e),
                },
            })
    }
}

/// The error's own message and those of its causes.
fn describe(e: &minijinja::Error) -> String {
    let mut msg = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let _ = std::fmt::Write::write_fmt(&mut msg, format_args!(": {s}"));
        source = s.source();
    }
    msg
}
