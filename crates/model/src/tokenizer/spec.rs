//! Everything a tokenizer is built from, as plain data (the `tokenizer.*` keys of a GGUF file).

use strata_gguf::{Array, GgufFile, StringArray, Value};

use super::error::TokenizerError;

/// Token types as GGUF stores them in `tokenizer.ggml.token_type`.
pub mod token_type {
    pub const UNDEFINED: i32 = 0;
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// Ids of the special tokens named in the metadata; `None` where a key is absent
/// (the tokenizer then applies llama.cpp's defaults for the model type).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// The vocabulary and its options, independent of where they were read from.
#[derive(Clone, Debug, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: names the pre-tokenizer of a BPE vocabulary.
    pub pre: Option<String>,
    /// Token texts, exact bytes (a few vocabularies hold non-UTF-8 tokens).
    /// Read from a file, this shares the file's metadata buffers.
    pub tokens: StringArray,
    pub scores: Option<Vec<f32>>,
    pub token_types: Option<Vec<i32>>,
    /// BPE merges, `"left right"` as exact bytes, in rank order.
    pub merges: StringArray,
    pub special: SpecialIds,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
    /// `general.name`: llama.cpp keys a few per-token attributes on it (Phi-3).
    pub model_name: Option<String>,
    /// `general.architecture`.
    pub architecture: Option<String>,
}

fn opt<T>(
    r: Result<T, strata_gguf::GgufError>,
    file: &GgufFile,
    key: &str,
) -> Result<Option<T>, TokenizerError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(_) if file.get(key).is_none() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl TokenizerSpec {
    /// Reads the `tokenizer.*` keys of a GGUF file (weights are not touched, so a
    /// vocabulary-only file works).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        let str_key = |key: &str| opt(file.get_str(key).map(str::to_owned), file, key);
        let bool_key = |key: &str| opt(file.get_bool(key), file, key);
        let id_key = |key: &str| opt(file.get_u32(key), file, key);

        let model = file.get_str("tokenizer.ggml.model")?.to_owned();
        // Clones of string arrays share their buffers: the vocabulary and the
        // merges are held once, by the file's metadata and the tokenizer together.
        let tokens = file.get_string_array("tokenizer.ggml.tokens")?.clone();
        let merges = match file.get("tokenizer.ggml.merges") {
            None => StringArray::new(),
            Some(_) => file.get_string_array("tokenizer.ggml.merges")?.clone(),
        };
        // llama.cpp accepts integer scores as well as f32 ones.
        let scores = match file.get("tokenizer.ggml.scores") {
            None => None,
            Some(Value::Array(Array::F32(v))) => Some(v.clone()),
            Some(Value::Array(a)) => match a.integers() {
                Some(ints) => Some(ints.into_iter().map(|i| i as f32).collect()),
                None => Some(file.get_f32_array("tokenizer.ggml.scores")?),
            },
            Some(_) => Some(file.get_f32_array("tokenizer.ggml.scores")?),
        };
        let token_types = match file.get("tokenizer.ggml.token_type") {
            None => None,
            Some(_) => Some(file.get_i32_array("tokenizer.ggml.token_type")?),
        };
        let special = SpecialIds {
            bos: id_key("tokenizer.ggml.bos_token_id")?,
            eos: id_key("tokenizer.ggml.eos_token_id")?,
            eot: id_key("tokenizer.ggml.eot_token_id")?,
            eom: id_key("tokenizer.ggml.eom_token_id")?,
            unk: id_key("tokenizer.ggml.unknown_token_id")?,
            // llama.cpp's key is spelled this way.
            sep: id_key("tokenizer.ggml.seperator_token_id")?,
            pad: id_key("tokenizer.ggml.padding_token_id")?,
            mask: id_key("tokenizer.ggml.mask_token_id")?,
            // The deprecated keys are read last by llama.cpp, so they win.
            fim_pre: id_key("tokenizer.ggml.prefix_token_id")?
                .or(id_key("tokenizer.ggml.fim_pre_token_id")?),
            fim_suf: id_key("tokenizer.ggml.suffix_token_id")?
                .or(id_key("tokenizer.ggml.fim_suf_token_id")?),
            fim_mid: id_key("tokenizer.ggml.middle_token_id")?
                .or(id_key("tokenizer.ggml.fim_mid_token_id")?),
            fim_pad: id_key("tokenizer.ggml.fim_pad_token_id")?,
            fim_rep: id_key("tokenizer.ggml.fim_rep_token_id")?,
            fim_sep: id_key("tokenizer.ggml.fim_sep_token_id")?,
        };
        Ok(Self {
            model,
            pre: str_key("tokenizer.ggml.pre")?,
            tokens,
            scores,
            token_types,
            merges,
            special,
            add_bos: bool_key("tokenizer.ggml.add_bos_token")?,
            add_eos: bool_key("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: bool_key("tokenizer.ggml.add_space_prefix")?,
            chat_template: str_key("tokenizer.chat_template")?,
            model_name: str_key("general.name")?,
            architecture: str_key("general.architecture")?,
        })
    }
}
