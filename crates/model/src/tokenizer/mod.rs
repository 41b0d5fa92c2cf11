//! Tokenizers built from a GGUF vocabulary, matching llama.cpp token for token:
//! byte-level BPE with the pre-tokenizer named by `tokenizer.ggml.pre`, and
//! SentencePiece (`llama`) vocabularies with byte fallback.

mod bpe;
mod decode;
mod error;
mod fxhash;
mod pre_table;
mod pretokenize;
mod spec;
mod special;
mod spm;
mod text_index;
mod vocab;

use std::path::Path;

pub use decode::StreamDecoder;
pub use error::TokenizerError;
pub use spec::{SpecialIds, TokenizerSpec, token_type};
pub use vocab::{SpecialTokens, TokenId, VocabKind, attr};

use bpe::BpeModel;
use special::{Fragment, SpecialMatcher};
use vocab::Vocab;

/// The tokenizer models strata supports, for error messages.
const SUPPORTED_MODELS: &str = "gpt2 (byte-level BPE), llama (SentencePiece)";

enum Model {
    Bpe(Box<BpeModel>),
    Spm(spm::SpmModel),
}

/// A tokenizer for one vocabulary. Cheap to share: every method takes `&self`.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    matcher: SpecialMatcher,
    /// Special tokens found in text even without `parse_special` (user-defined ones).
    user_defined_by_length: Vec<TokenId>,
    /// Each token's text as it is printed (`token_to_piece`), in one buffer, built on
    /// first use: a model loaded to be benchmarked, or served token ids, never decodes.
    pieces: std::sync::OnceLock<strata_gguf::StringArray>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Builds the tokenizer of a GGUF file's vocabulary.
    pub fn from_gguf_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let file = strata_gguf::GgufFile::open(path)?;
        Self::from_spec(&TokenizerSpec::from_gguf(&file)?)
    }

    pub fn from_spec(spec: &TokenizerSpec) -> Result<Self, TokenizerError> {
        let kind = match spec.model.as_str() {
            "gpt2" => VocabKind::Bpe,
            "llama" => VocabKind::Spm,
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    model: other.to_owned(),
                    supported: SUPPORTED_MODELS.to_owned(),
                });
            }
        };
        let (pre, add_bos_default, add_space_prefix_default, clean_spaces) = match kind {
            VocabKind::Bpe => {
                if spec.pre.as_deref().is_none_or(str::is_empty) {
                    tracing::warn!(
                        "tokenizer.ggml.pre is missing: using llama.cpp's default pre-tokenizer"
                    );
                }
                let pre = pre_table::lookup(spec.pre.as_deref()).ok_or_else(|| {
                    TokenizerError::UnsupportedPre {
                        pre: spec.pre.clone().unwrap_or_default(),
                        supported: pre_table::supported_names(),
                    }
                })?;
                (Some(pre), pre.add_bos, false, pre.clean_spaces)
            }
            VocabKind::Spm => (None, true, true, false),
        };
        let vocab = Vocab::build(spec, kind, pre.is_some_and(|p| p.no_default_bos))?;
        let model = match pre {
            Some(pre) => Model::Bpe(Box::new(BpeModel::new(&vocab, &spec.merges, &pre)?)),
            None => Model::Spm(spm::SpmModel::new(&vocab)),
        };
        let add_bos = spec.add_bos.unwrap_or(add_bos_default);
        let add_eos = spec.add_eos.unwrap_or(false);
        if add_bos && vocab.special.bos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                which: "a BOS token (add_bos_token is set)",
            });
        }
        if add_eos && vocab.special.eos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                which: "an EOS token (add_eos_token is set)",
            });
        }
        let matcher = SpecialMatcher::new(&vocab, &vocab.special_by_length);
        let user_defined_by_length = vocab
            .special_by_length
            .iter()
            .copied()
            .filter(|&id| vocab.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) == 0)
            .collect();
        Ok(Self {
            vocab,
            model,
            matcher,
            user_defined_by_length,
            pieces: std::sync::OnceLock::new(),
            add_bos,
            add_eos,
            add_space_prefix: spec.add_space_prefix.unwrap_or(add_space_prefix_default),
            clean_spaces,
            chat_template: spec.chat_template.clone(),
        })
    }

    /// Tokens of `text` as llama.cpp's `llama_tokenize`: `add_special` adds BOS
    /// and EOS where the model asks for them; `parse_special` lets control
    /// tokens written in the text (`<|im_start|>`) become those tokens.
    /// User-defined tokens are always matched whole.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<TokenId>, TokenizerError> {
        let order = if parse_special {
            &self.vocab.special_by_length
        } else {
            &self.user_defined_by_length
        };
        let fragments = special::partition(&self.vocab, &self.matcher, order, text);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.vocab.special.bos);
        }
        match &self.model {
            Model::Bpe(bpe) => {
                for f in &fragments {
                    match f {
                        Fragment::Text(r) => bpe.encode(&self.vocab, &text[r.clone()], &mut out)?,
                        Fragment::Token(id) => out.push(*id),
                    }
                }
            }
            Model::Spm(spm) => {
                // A space is put before the text at the start and after every special token.
                let mut prev_special = true;
                let mut buf = String::new();
                for f in &fragments {
                    match f {
                        Fragment::Text(r) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[r.clone()]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm.encode(&self.vocab, &escaped, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(*id);
                            prev_special = true;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.vocab.special.eos);
        }
        Ok(out)
    }

    pub fn kind(&self) -> VocabKind {
        match self.model {
            Model::Bpe(_) => VocabKind::Bpe,
            Model::Spm(_) => VocabKind::Spm,
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.n_tokens()
    }

    pub fn special(&self) -> &SpecialTokens {
        &self.vocab.special
    }

    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn adds_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether `id` ends generation (EOS, EOT, `<|im_end|>` and the like).
    pub fn is_eog(&self, id: TokenId) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// The token's text as stored in the vocabulary.
    pub fn token_text(&self, id: TokenId) -> Option<&[u8]> {
        ((id as usize) < self.vocab.n_tokens()).then(|| self.vocab.text(id))
    }

    /// The token's attribute bits ([`attr`]).
    pub fn token_attr(&self, id: TokenId) -> Option<u32> {
        self.vocab.attrs.get(id as usize).copied()
    }

    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.vocab.id_of(text.as_bytes())
    }

    /// `tokenizer.chat_template`, if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_spec(model: &str, pre: Option<&str>) -> TokenizerSpec {
        TokenizerSpec {
            model: model.into(),
            pre: pre.map(Into::into),
            tokens: ["a", "b", "ab"].into_iter().collect(),
            merges: ["a b"].into_iter().collect(),
            ..TokenizerSpec::default()
        }
    }

    #[test]
    fn unknown_pre_tokenizer_lists_the_supported_ones() {
        let Err(e) = Tokenizer::from_spec(&tiny_spec("gpt2", Some("no-such-pre"))) else {
            panic!("accepted an unknown pre-tokenizer")
        };
        let msg = e.to_string();
        assert!(msg.contains("`no-such-pre`"), "{msg}");
        for name in [
            "gpt-2",
            "llama-bpe",
            "qwen2",
            "smollm",
            "deepseek-llm",
            "falcon",
        ] {
            assert!(msg.contains(name), "{name} missing from: {msg}");
        }
    }

    #[test]
    fn tokenizer_and_template_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<crate::chat::ChatTemplate>();
    }

    #[test]
    fn unknown_model_is_an_error() {
        let Err(e) = Tokenizer::from_spec(&tiny_spec("t5", None)) else {
            panic!("accepted t5")
        };
        assert!(e.to_string().contains("`t5`"));
    }

    #[test]
    fn merges_apply_by_rank() {
        let tok = Tokenizer::from_spec(&tiny_spec("gpt2", Some("gpt-2"))).unwrap();
        assert_eq!(tok.encode("abab", false, false).unwrap(), vec![2, 2]);
        assert_eq!(tok.encode("ba", false, false).unwrap(), vec![1, 0]);
    }
}
