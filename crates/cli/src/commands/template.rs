//! `strata template`: a conversation rendered through the model's chat template,
//! printed exactly (no newline added).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use strata_gguf::GgufFile;
use strata_model::chat::{ChatInputs, ChatTemplate, DateTime, parse_json};

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file whose `tokenizer.chat_template` (and BOS/EOS texts) to use; a
    /// vocabulary-only file is enough.
    #[arg(short = 'm', long = "model", required_unless_present = "template")]
    model: Option<PathBuf>,
    /// JSON file with the list of messages.
    #[arg(long)]
    messages: PathBuf,
    /// JSON file with the list of tools.
    #[arg(long)]
    tools: Option<PathBuf>,
    /// End with the header that starts the assistant's reply.
    #[arg(long)]
    add_generation_prompt: bool,
    /// Use this Jinja template instead of the model's.
    #[arg(long)]
    template: Option<PathBuf>,
    /// More template variables, `NAME=VALUE` (VALUE is JSON, or else a string).
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
    /// The date `strftime_now` sees, `YYYY-MM-DD[THH:MM:SS]` (default: env
    /// STRATA_CHAT_NOW, else now in UTC).
    #[arg(long)]
    now: Option<String>,
}

fn read(path: &PathBuf) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The text of the token whose id is stored at `key`, if any.
fn token_text(file: &GgufFile, key: &str) -> anyhow::Result<String> {
    let Some(id) = file.get(key).and_then(|v| v.as_integer()) else {
        return Ok(String::new());
    };
    let tokens = file.get_bytes_array("tokenizer.ggml.tokens")?;
    let bytes = usize::try_from(id)
        .ok()
        .and_then(|i| tokens.get(i))
        .copied()
        .unwrap_or_default();
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let file = match &args.model {
        Some(p) => Some(GgufFile::open(p).with_context(|| format!("opening {}", p.display()))?),
        None => None,
    };
    let source = match (&args.template, &file) {
        (Some(t), _) => read(t)?,
        (None, Some(f)) => match f.get("tokenizer.chat_template") {
            Some(_) => f.get_str("tokenizer.chat_template")?.to_owned(),
            None => bail!("the model has no tokenizer.chat_template; give one with --template"),
        },
        (None, None) => bail!("give a model (-m) or a template (--template)"),
    };
    let messages = read(&args.messages)?;
    let tools = args.tools.as_ref().map(read).transpose()?;
    let mut inputs = ChatInputs::from_json(&messages, tools.as_deref())?;
    inputs.add_generation_prompt = args.add_generation_prompt;
    if let Some(f) = &file {
        inputs.bos_token = token_text(f, "tokenizer.ggml.bos_token_id")?;
        inputs.eos_token = token_text(f, "tokenizer.ggml.eos_token_id")?;
    }
    for var in &args.vars {
        let Some((name, value)) = var.split_once('=') else {
            bail!("--var wants NAME=VALUE, got `{var}`");
        };
        let value = parse_json(value, name).unwrap_or_else(|_| value.into());
        inputs.extra.push((name.to_owned(), value));
    }
    let now = args
        .now
        .clone()
        .or_else(|| std::env::var("STRATA_CHAT_NOW").ok());
    if let Some(now) = now {
        inputs.now = Some(
            DateTime::parse(&now)
                .with_context(|| format!("`{now}` is not YYYY-MM-DD[THH:MM:SS]"))?,
        );
    }

    let template = ChatTemplate::new(&source)?;
    let prompt = template.render(&inputs)?;
    let mut out = std::io::stdout().lock();
    out.write_all(prompt.as_bytes())?;
    out.flush()?;
    Ok(())
}
