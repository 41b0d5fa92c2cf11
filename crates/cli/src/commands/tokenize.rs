//! `strata tokenize`: a text's token ids, as llama.cpp's `llama-tokenize --ids` prints them.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use strata_model::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file (a vocabulary-only file is enough).
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    /// The text to tokenize (taken as is: no escape processing).
    #[arg(conflicts_with = "file", required_unless_present = "file")]
    text: Option<String>,
    /// Read the text from this file, byte for byte.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// Add no BOS/EOS even if the model asks for them.
    #[arg(long)]
    no_bos: bool,
    /// Treat control tokens written in the text (`<|im_start|>`) as plain text.
    #[arg(long)]
    no_parse_special: bool,
    /// Print one token per line with its text instead of the id list.
    #[arg(long)]
    pieces: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = match (&args.text, &args.file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => {
            let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            String::from_utf8(bytes)
                .with_context(|| format!("{} is not UTF-8 text", f.display()))?
        }
        (None, None) => bail!("give a text or --file"),
    };
    let tokenizer = Tokenizer::from_gguf_file(&args.model)
        .with_context(|| format!("loading the tokenizer of {}", args.model.display()))?;
    let ids = tokenizer.encode(&text, !args.no_bos, !args.no_parse_special)?;

    let mut out = std::io::stdout().lock();
    if args.pieces {
        for &id in &ids {
            let piece = tokenizer.token_to_piece(id, 0, true);
            match std::str::from_utf8(piece) {
                Ok(s) => writeln!(out, "{id:6} -> '{s}'")?,
                Err(_) => writeln!(
                    out,
                    "{id:6} -> '{}' (utf-8 decode failure)",
                    String::from_utf8_lossy(piece)
                )?,
            }
        }
    } else {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", "))?;
    }
    Ok(())
}
