//! Token texts, scores and attributes, with llama.cpp's adjustments of the
//! attributes (end-of-generation and fill-in-the-middle tokens forced to
//! control, gpt-oss channel tokens shown, Phi-3's right-stripping).

use std::collections::BTreeSet;

use strata_gguf::StringArray;

use super::error::TokenizerError;
use super::spec::{SpecialIds, TokenizerSpec, token_type};
use super::text_index::TextIndex;

pub type TokenId = u32;

/// Token attributes, the bits of llama.cpp's `llama_token_attr`.
pub mod attr {
    pub const UNDEFINED: u32 = 0;
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// Which algorithm turns a word into tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE (`tokenizer.ggml.model = gpt2`).
    Bpe,
    /// SentencePiece with score-based merges (`tokenizer.ggml.model = llama`).
    Spm,
}

/// Special token ids after defaults and validation.
#[derive(Clone, Debug, Default)]
pub struct SpecialTokens {
    pub bos: Option<TokenId>,
    pub eos: Option<TokenId>,
    pub eot: Option<TokenId>,
    pub eom: Option<TokenId>,
    pub unk: Option<TokenId>,
    pub sep: Option<TokenId>,
    pub pad: Option<TokenId>,
    pub mask: Option<TokenId>,
    pub fim_pre: Option<TokenId>,
    pub fim_suf: Option<TokenId>,
    pub fim_mid: Option<TokenId>,
    pub fim_pad: Option<TokenId>,
    pub fim_rep: Option<TokenId>,
    pub fim_sep: Option<TokenId>,
}

/// Picks one id out of the special tokens.
type SlotOf = fn(&mut SpecialTokens) -> &mut Option<TokenId>;

pub(crate) struct Vocab {
    /// Token texts: the file's own string array (shared, not copied) unless
    /// empty tokens had to be renamed.
    texts: StringArray,
    pub scores: Vec<f32>,
    pub attrs: Vec<u32>,
    ids: TextIndex,
    pub special: SpecialTokens,
    /// Tokens that end generation.
    pub eog: BTreeSet<TokenId>,
    /// Control, user-defined and unknown tokens, longest text first: the order in
    /// which they are looked for in raw text.
    pub special_by_length: Vec<TokenId>,
}

fn type_to_attr(t: i32) -> u32 {
    match t {
        token_type::UNKNOWN => attr::UNKNOWN,
        token_type::UNUSED => attr::UNUSED,
        token_type::NORMAL => attr::NORMAL,
        token_type::CONTROL => attr::CONTROL,
        token_type::USER_DEFINED => attr::USER_DEFINED,
        token_type::BYTE => attr::BYTE,
        _ => attr::UNDEFINED,
    }
}

// Texts by which llama.cpp recognises tokens that the converter may not have
// marked (src/llama-vocab.cpp, "auto-detect special tokens by text").
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// gpt-oss: llama.cpp always renders these.
const ALWAYS_SHOWN_TEXTS: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

impl Vocab {
    pub(crate) fn build(
        spec: &TokenizerSpec,
        kind: VocabKind,
        no_default_bos: bool,
    ) -> Result<Self, TokenizerError> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::BadVocab {
                reason: "tokenizer.ggml.tokens is empty".into(),
            });
        }
        if n > i32::MAX as usize {
            return Err(TokenizerError::BadVocab {
                reason: format!("{n} tokens is more than ids can hold"),
            });
        }
        for (what, len) in [
            ("tokenizer.ggml.scores", spec.scores.as_ref().map(Vec::len)),
            (
                "tokenizer.ggml.token_type",
                spec.token_types.as_ref().map(Vec::len),
            ),
        ] {
            if let Some(len) = len
                && len < n
            {
                return Err(TokenizerError::BadVocab {
                    reason: format!("{what} has {len} entries for {n} tokens"),
                });
            }
        }

        // llama.cpp renames empty tokens so that every text is unique.
        let texts = if spec.tokens.iter_bytes().any(<[u8]>::is_empty) {
            spec.tokens
                .iter_bytes()
                .enumerate()
                .map(|(i, t)| {
                    if t.is_empty() {
                        format!("[EMPTY_{i}]").into_bytes()
                    } else {
                        t.to_vec()
                    }
                })
                .collect()
        } else {
            spec.tokens.clone()
        };
        let mut ids = TextIndex::with_capacity(n);
        for i in 0..n as TokenId {
            if let Some(first) = ids.insert(&texts, i) {
                return Err(TokenizerError::BadVocab {
                    reason: format!(
                        "token {i} ({}) appears twice (first as {first})",
                        String::from_utf8_lossy(texts.get_bytes(i as usize).unwrap_or_default())
                    ),
                });
            }
        }
        let scores = match &spec.scores {
            Some(s) => s[..n].to_vec(),
            None => vec![0.0; n],
        };
        let attrs = match &spec.token_types {
            Some(t) => t[..n].iter().map(|&t| type_to_attr(t)).collect(),
            None => vec![attr::NORMAL; n],
        };

        let special = resolve_special_ids(&spec.special, kind, no_default_bos, n);
        let mut vocab = Self {
            texts,
            scores,
            attrs,
            ids,
            special,
            eog: BTreeSet::new(),
            special_by_length: Vec::new(),
        };
        vocab.detect_special_by_text();
        vocab.collect_eog();
        vocab.special_by_length = (0..n as TokenId)
            .filter(|&id| {
                vocab.attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        // Longest first; ties by id so the order is deterministic.
        let texts = &vocab.texts;
        let len_of = |id: TokenId| texts.get_bytes(id as usize).map_or(0, <[u8]>::len);
        vocab
            .special_by_length
            .sort_by_key(|&id| (std::cmp::Reverse(len_of(id)), id));
        vocab.apply_model_attrs(spec);
        Ok(vocab)
    }

    pub(crate) fn n_tokens(&self) -> usize {
        self.texts.len()
    }

    pub(crate) fn id_of(&self, text: &[u8]) -> Option<TokenId> {
        self.ids.get(&self.texts, text)
    }

    /// The text of token `id` (empty for an id outside the vocabulary).
    pub(crate) fn text(&self, id: TokenId) -> &[u8] {
        self.texts.get_bytes(id as usize).unwrap_or_default()
    }

    /// Every token's text, in id order.
    pub(crate) fn texts(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.texts.iter_bytes()
    }

    fn id_of_str(&self, text: &str) -> Option<TokenId> {
        self.id_of(text.as_bytes())
    }

    fn add_attr(&mut self, id: TokenId, bits: u32) {
        self.attrs[id as usize] |= bits;
    }

    /// Marks tokens found by text as control, filling unset ids the way
    /// llama.cpp does (the first match of a family becomes the id).
    fn detect_special_by_text(&mut self) {
        let families: [(&[&str], SlotOf); 8] = [
            (EOT_TEXTS, |s| &mut s.eot),
            (EOM_TEXTS, |s| &mut s.eom),
            (FIM_PRE_TEXTS, |s| &mut s.fim_pre),
            (FIM_SUF_TEXTS, |s| &mut s.fim_suf),
            (FIM_MID_TEXTS, |s| &mut s.fim_mid),
            (FIM_PAD_TEXTS, |s| &mut s.fim_pad),
            (FIM_REP_TEXTS, |s| &mut s.fim_rep),
            (FIM_SEP_TEXTS, |s| &mut s.fim_sep),
        ];
        for (texts, slot) in families {
            if slot(&mut self.special).is_some() {
                continue;
            }
            // llama.cpp walks a hash map, so which of several candidates wins is
            // unspecified there; the lowest id is taken here.
            let found = texts.iter().filter_map(|t| self.id_of_str(t)).min();
            if let Some(id) = found {
                *slot(&mut self.special) = Some(id);
                self.add_attr(id, attr::CONTROL);
            }
        }
        // Control tokens named "unused" are unused.
        for id in 0..self.attrs.len() {
            if self.attrs[id] & attr::CONTROL != 0 && contains(self.text(id as TokenId), b"unused")
            {
                self.attrs[id] |= attr::UNUSED;
            }
        }
    }

    fn collect_eog(&mut self) {
        let mut eog = BTreeSet::new();
        for id in [
            self.special.fim_pad,
            self.special.fim_rep,
            self.special.fim_sep,
        ]
        .into_iter()
        .flatten()
        {
            eog.insert(id);
        }
        for t in EOG_TEXTS {
            if let Some(id) = self.id_of_str(t) {
                eog.insert(id);
                self.add_attr(id, attr::CONTROL);
            }
        }
        for t in ALWAYS_SHOWN_TEXTS {
            if let Some(id) = self.id_of_str(t) {
                self.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        for id in [self.special.eos, self.special.eot, self.special.eom]
            .into_iter()
            .flatten()
        {
            eog.insert(id);
        }
        // o200k_harmony and solar-open: "<|end|>" ends a message, not generation.
        let in_eog = |v: &Self, eog: &BTreeSet<TokenId>, t: &str| {
            v.id_of_str(t).is_some_and(|id| eog.contains(&id))
        };
        if ((in_eog(self, &eog, "<|return|>") && in_eog(self, &eog, "<|call|>"))
            || (in_eog(self, &eog, "<|calls|>") && in_eog(self, &eog, "<|flush|>")))
            && let Some(end) = self.id_of_str("<|end|>").filter(|id| eog.contains(id))
        {
            eog.remove(&end);
            self.attrs[end as usize] = attr::USER_DEFINED;
        }
        // gemma4 and plamo have an ordinary "</s>".
        if (in_eog(self, &eog, "<|tool_response>") || in_eog(self, &eog, "<|plamo:eos|>"))
            && let Some(s) = self.id_of_str("</s>").filter(|id| eog.contains(id))
        {
            eog.remove(&s);
            self.attrs[s as usize] = attr::NORMAL;
        }
        self.eog = eog;
    }

    /// Per-model attributes llama.cpp derives from names (after the special
    /// token list is built, as there).
    fn apply_model_attrs(&mut self, spec: &TokenizerSpec) {
        let name = spec
            .model_name
            .as_deref()
            .unwrap_or("")
            .to_ascii_lowercase();
        let pre = spec.pre.as_deref().unwrap_or("");
        let arch = spec.architecture.as_deref().unwrap_or("");
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| pre.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|a| arch.contains(a))
        {
            if let Some(id) = self.id_of_str("<mask>") {
                self.add_attr(id, attr::LSTRIP);
            }
        } else if name.contains("phi-3") || name.contains("phi3") {
            for i in 0..self.special_by_length.len() {
                let id = self.special_by_length[i];
                self.add_attr(id, attr::RSTRIP);
            }
            if let Some(id) = self.id_of_str("</s>") {
                self.add_attr(id, attr::RSTRIP);
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(id) = self.id_of_str(t) {
                    self.attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        } else if name.contains("modern-bert")
            && let Some(id) = self.id_of_str("[MASK]")
        {
            self.add_attr(id, attr::LSTRIP);
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// llama.cpp's default ids per model type, replaced by the metadata's ids when
/// those are in range; ids out of range are dropped.
fn resolve_special_ids(
    meta: &SpecialIds,
    kind: VocabKind,
    no_default_bos: bool,
    n: usize,
) -> SpecialTokens {
    let (bos, eos, unk) = match kind {
        VocabKind::Spm => (Some(1), Some(2), Some(0)),
        VocabKind::Bpe => (Some(11), Some(11), None),
    };
    let bos = if no_default_bos { None } else { bos };
    let pick = |default: Option<TokenId>, from_meta: Option<u32>| {
        let default = default.filter(|&d| (d as usize) < n);
        match from_meta {
            Some(id) if (id as usize) < n => Some(id),
            Some(id) => {
                tracing::warn!(
                    "special token id {id} is outside the vocabulary of {n}; using the default"
                );
                default
            }
            None => default,
        }
    };
    SpecialTokens {
        bos: pick(bos, meta.bos),
        eos: pick(eos, meta.eos),
        eot: pick(None, meta.eot),
        eom: pick(None, meta.eom),
        unk: pick(unk, meta.unk),
        sep: pick(None, meta.sep),
        pad: pick(None, meta.pad),
        mask: pick(None, meta.mask),
        fim_pre: pick(None, meta.fim_pre),
        fim_suf: pick(None, meta.fim_suf),
        fim_mid: pick(None, meta.fim_mid),
        fim_pad: pick(None, meta.fim_pad),
        fim_rep: pick(None, meta.fim_rep),
        fim_sep: pick(None, meta.fim_sep),
    }
}
