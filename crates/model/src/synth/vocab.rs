//! The synthetic model's tokenizer: a built-in byte-level BPE vocabulary
//! (GPT-2 style, as llama.cpp's `gpt2` tokenizer model reads it), or every
//! `tokenizer.*` key copied from a donor GGUF file.
//!
//! Built-in layout: ids 0..3 are the specials `<|endoftext|>` (padding),
//! `<|im_start|>` (BOS) and `<|im_end|>` (EOS); ids 3..259 the 256 byte tokens
//! in byte order, spelled with GPT-2's byte-to-unicode map; then the merges
//! learnt from a small built-in text (most frequent pair first, ties broken by
//! the lower token ids); any ids left over are control tokens
//! `<|reserved_N|>`. The chat template is ChatML.

use std::collections::BTreeMap;
use std::path::Path;

use strata_gguf::{Array, GgufFile, GgufWriter, StringArray, Value};

use super::SynthError;

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const N_SPECIAL: u32 = SPECIALS.len() as u32;
pub(crate) const MIN_BUILTIN_VOCAB: u32 = 256 + N_SPECIAL;

/// llama.cpp's token types (`llama_token_type`).
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;

const CHAT_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The text the built-in merges are learnt from.
const CORPUS: &str = "\
The quick brown fox jumps over the lazy dog. A model reads the text as tokens, \
and each token is a piece of a word. The tokenizer merges the pairs of pieces \
that are seen most often, so common words become one token and rare words \
stay split into smaller parts. This is a small model made for tests: its \
weights are random, its answers mean nothing, and it runs in a moment. \
Hello, world! How are you today? I am fine, thank you. What is the time? \
It is ten past three in the afternoon, and the weather is warm and clear. \
Once upon a time there was a little house at the end of the road, where an \
old man lived with his cat and his garden of roses and tomatoes. \
Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 42 100 256 1024 2025 3.14159 \
fn main() { let x = vec![1, 2, 3]; println!(\"{:?}\", x); } \
def hello(name): return f\"Hello, {name}!\" \
for (int i = 0; i < n; i++) { sum += a[i] * b[i]; } \
if the expert is hot, it stays in the cache; otherwise the layer is computed \
on the processor from the mapped file, and the two partial sums are added. \
Bonjour, comment allez-vous? Guten Tag! Hola, amigo. Ciao, come stai? \
The user asks a question and the assistant answers it in a short sentence. \
Please write a function that returns the sum of the numbers in a list. \
There are many ways to learn: read a book, ask a friend, or try it yourself. \
";

/// GPT-2's byte → printable code point map (`bytes_to_unicode`).
fn byte_to_char(b: u8) -> char {
    let printable = |c: u8| (b'!'..=b'~').contains(&c) || (0xA1..=0xAC).contains(&c) || c >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    // Non-printable bytes map to 256 + their rank among the non-printable ones.
    let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

pub(crate) struct BuiltinVocab {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
}

/// Splits text roughly as GPT-2's pre-tokenizer does (a leading space stays
/// with the letters, digits or punctuation after it).
fn pretokenize(text: &str) -> Vec<&str> {
    #[derive(PartialEq, Clone, Copy)]
    enum Class {
        Letter,
        Digit,
        Space,
        Other,
    }
    let class = |c: u8| {
        if c.is_ascii_alphabetic() {
            Class::Letter
        } else if c.is_ascii_digit() {
            Class::Digit
        } else if c.is_ascii_whitespace() {
            Class::Space
        } else {
            Class::Other
        }
    };
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let mut c = class(b[i]);
        if b[i] == b' ' && i + 1 < b.len() && class(b[i + 1]) != Class::Space {
            i += 1;
            c = class(b[i]);
        }
        while i < b.len() && class(b[i]) == c {
            i += 1;
        }
        out.push(&text[start..i]);
    }
    out
}

/// The built-in vocabulary of exactly `size` tokens (`size ≥ MIN_BUILTIN_VOCAB`).
pub(crate) fn builtin(size: u32) -> BuiltinVocab {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    let mut types = vec![TOKEN_CONTROL; SPECIALS.len()];
    for b in 0..=255u8 {
        tokens.push(byte_to_char(b).to_string());
        types.push(TOKEN_NORMAL);
    }
    let mut ids: BTreeMap<String, u32> = tokens
        .iter()
        .enumerate()
        .skip(SPECIALS.len())
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();

    // Unique pre-tokenized words as token-id sequences, with their counts.
    let mut word_counts: BTreeMap<&str, u64> = BTreeMap::new();
    for w in pretokenize(CORPUS) {
        *word_counts.entry(w).or_default() += 1;
    }
    let mut words: Vec<(Vec<u32>, u64)> = word_counts
        .into_iter()
        .map(|(w, n)| (w.bytes().map(|b| N_SPECIAL + u32::from(b)).collect(), n))
        .collect();

    let mut merges = Vec::new();
    while (tokens.len() as u32) < size {
        let mut pairs: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *pairs.entry((p[0], p[1])).or_default() += n;
            }
        }
        // Most frequent; the first in id order among equals.
        let Some((&(a, b), _)) =
            pairs
                .iter()
                .fold(None, |best: Option<(&(u32, u32), &u64)>, cur| match best {
                    Some(bst) if bst.1 >= cur.1 => Some(bst),
                    _ => Some(cur),
                })
        else {
            break;
        };
        let text = format!("{}{}", tokens[a as usize], tokens[b as usize]);
        merges.push(format!("{} {}", tokens[a as usize], tokens[b as usize]));
        let id = match ids.get(&text) {
            Some(&id) => id,
            None => {
                let id = tokens.len() as u32;
                ids.insert(text.clone(), id);
                tokens.push(text);
                types.push(TOKEN_NORMAL);
                id
            }
        };
        for (w, _) in &mut words {
            let mut out = Vec::with_capacity(w.len());
            let mut i = 0;
            while i < w.len() {
                if i + 1 < w.len() && w[i] == a && w[i + 1] == b {
                    out.push(id);
                    i += 2;
                } else {
                    out.push(w[i]);
                    i += 1;
                }
            }
            *w = out;
        }
    }
    let mut reserved = 0;
    while (tokens.len() as u32) < size {
        tokens.push(format!("<|reserved_{reserved}|>"));
        types.push(TOKEN_CONTROL);
        reserved += 1;
    }
    BuiltinVocab {
        tokens,
        types,
        merges,
    }
}

/// Writes the built-in tokenizer of `size` tokens.
pub(crate) fn add_builtin(w: &mut GgufWriter<'_>, size: u32) {
    let v = builtin(size);
    let mut tokens = StringArray::new();
    for t in &v.tokens {
        tokens.push(t);
    }
    let mut merges = StringArray::new();
    for m in &v.merges {
        merges.push(m);
    }
    w.add("tokenizer.ggml.model", "gpt2");
    w.add("tokenizer.ggml.pre", "gpt-2");
    w.add("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    w.add(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(v.types)),
    );
    w.add("tokenizer.ggml.merges", Value::Array(Array::String(merges)));
    w.add("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.add("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.add("tokenizer.ggml.padding_token_id", Value::U32(0));
    w.add("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.add("tokenizer.chat_template", CHAT_TEMPLATE);
}

/// Copies every `tokenizer.*` key of `path`, in order and byte-exact; returns
/// the donor's vocabulary size.
pub(crate) fn copy_donor(w: &mut GgufWriter<'_>, path: &Path) -> Result<u32, SynthError> {
    let donor_err = |reason: String| SynthError::Donor {
        path: path.to_path_buf(),
        reason,
    };
    let donor = GgufFile::open(path).map_err(|e| donor_err(e.to_string()))?;
    let n_vocab = donor
        .get_string_array("tokenizer.ggml.tokens")
        .map_err(|e| donor_err(e.to_string()))?
        .len();
    let n_vocab = u32::try_from(n_vocab).map_err(|_| donor_err("vocabulary too large".into()))?;
    for (key, value) in donor.metadata().iter() {
        if !key.starts_with("tokenizer.") {
            continue;
        }
        match value {
            Value::String(_) => {
                let bytes = donor.metadata().string_bytes(key).unwrap_or_default();
                w.add_string_bytes(key, bytes);
            }
            v => w.add(key, v.clone()),
        }
    }
    Ok(n_vocab)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2s() {
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(b' '), 'Ġ'); // U+0120
        assert_eq!(byte_to_char(b'\n'), 'Ċ'); // U+010A
        assert_eq!(byte_to_char(0), 'Ā'); // U+0100
        assert_eq!(byte_to_char(0xAD), 'Ń'); // U+0143
        let mut all: Vec<char> = (0..=255u8).map(byte_to_char).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn builtin_has_exact_size_and_valid_merges() {
        for size in [259, 300, 512, 1024, 2000] {
            let v = builtin(size);
            assert_eq!(v.tokens.len(), size as usize);
            assert_eq!(v.types.len(), size as usize);
            let set: std::collections::BTreeSet<&str> =
                v.tokens.iter().map(|s| s.as_str()).collect();
            assert_eq!(set.len(), v.tokens.len(), "tokens are unique");
            for m in &v.merges {
                let (a, b) = m.split_once(' ').unwrap_or(("", ""));
                assert!(set.contains(a) && set.contains(b), "merge {m}");
                assert!(set.contains(format!("{a}{b}").as_str()), "merge result {m}");
            }
        }
        assert!(builtin(512).merges.len() >= 250);
    }
}
