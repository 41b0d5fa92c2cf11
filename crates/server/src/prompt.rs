//! Requests to prompt tokens: a chat through the model's template, a completion as text
//! or token ids.

use strata_model::chat::{ChatInputs, ChatTemplate};
use strata_model::tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::openai::{ChatMessage, Content, Prompt};

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// A message's text; only text parts are understood.
fn message_text(i: usize, m: &ChatMessage) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match &m.content {
        None if m.role == "assistant" => Ok(String::new()),
        None => Err(ApiError::invalid(
            format!("`{param}` is required for role `{}`", m.role),
            Some(&param),
        )),
        Some(Content::Text(t)) => Ok(t.clone()),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            format!(
                                "content parts of type `{kind}` are not supported (only `text` with a `text` field)"
                            ),
                            Some(&param),
                        ));
                    }
                }
            }
            Ok(text)
        }
    }
}

/// The chat rendered by the model's template with a generation prompt, tokenized with
/// control tokens recognised and a single BOS.
pub fn chat_tokens(tok: &Tokenizer, messages: &[ChatMessage]) -> Result<Vec<u32>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "`messages` must not be empty",
            Some("messages"),
        ));
    }
    let mut list = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                format!(
                    "`messages[{i}].role` must be one of {ROLES:?}, got `{}`",
                    m.role
                ),
                Some(&format!("messages[{i}].role")),
            ));
        }
        list.push(serde_json::json!({"role": m.role, "content": message_text(i, m)?}));
    }
    let Some(source) = tok.chat_template() else {
        return Err(ApiError::invalid(
            "the model has no chat template; use /v1/completions",
            None,
        ));
    };
    let template_error = |e: strata_model::chat::ChatError| {
        ApiError::invalid(
            format!("the chat template refused the messages: {e}"),
            Some("messages"),
        )
    };
    let mut inputs = ChatInputs::from_json(&serde_json::Value::from(list).to_string(), None)
        .map_err(template_error)?
        .with_special_texts(tok);
    inputs.add_generation_prompt = true;
    let text = ChatTemplate::new(source)
        .map_err(|e| ApiError::internal(format!("the model's chat template: {e}")))?
        .render(&inputs)
        .map_err(template_error)?;
    strata_model::chat::encode_chat(tok, &text)
        .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}"), None))
}

fn encode(tok: &Tokenizer, text: &str, parse_special: bool) -> Result<Vec<u32>, ApiError> {
    tok.encode(text, true, parse_special)
        .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}"), None))
}

/// A completion's prompt tokens (text gets the model's BOS; control-token texts are
/// read as plain text).
pub fn completion_tokens(tok: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
    let ids = match prompt {
        Prompt::Text(t) => encode(tok, t, false)?,
        Prompt::Texts(v) if v.len() == 1 => encode(tok, &v[0], false)?,
        Prompt::Texts(v) => {
            return Err(ApiError::invalid(
                format!("`prompt` must hold exactly one text, got {}", v.len()),
                Some("prompt"),
            ));
        }
        Prompt::Tokens(ids) => {
            if let Some(bad) = ids.iter().find(|&&i| i as usize >= tok.n_vocab()) {
                return Err(ApiError::invalid(
                    format!(
                        "token id {bad} is not in the vocabulary ({} tokens)",
                        tok.n_vocab()
                    ),
                    Some("prompt"),
                ));
            }
            ids.clone()
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("the prompt is empty", Some("prompt")));
    }
    Ok(ids)
}
