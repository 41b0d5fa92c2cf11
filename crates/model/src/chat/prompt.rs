//! A chat's prompt tokens for a model: the template's BOS/EOS texts from the vocabulary,
//! and the rendered text tokenized as llama.cpp does (control tokens recognised, one BOS
//! even where the template writes its own). Shared by `strata run/chat` and the server.

use super::ChatInputs;
use crate::tokenizer::{Tokenizer, TokenizerError};

impl ChatInputs {
    /// Sets `bos_token` and `eos_token` to the texts of the vocabulary's BOS and EOS.
    pub fn with_special_texts(mut self, tok: &Tokenizer) -> Self {
        let text_of = |id: Option<u32>| {
            id.and_then(|i| tok.token_text(i))
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        self.bos_token = text_of(tok.special().bos);
        self.eos_token = text_of(tok.special().eos);
        self
    }
}

/// The tokens of a rendered chat prompt: control tokens recognised, the vocabulary's BOS
/// added, and a doubled BOS (the template's own and the tokenizer's) made one.
pub fn encode_chat(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, TokenizerError> {
    let mut ids = tok.encode(text, true, true)?;
    if let Some(bos) = tok.special().bos
        && ids.len() >= 2
        && ids[0] == bos
        && ids[1] == bos
    {
        ids.remove(0);
    }
    Ok(ids)
}
