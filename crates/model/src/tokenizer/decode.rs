//! Tokens back to text: llama.cpp's `token_to_piece` and `detokenize`, and a
//! streaming decoder that only ever emits whole UTF-8 characters.

use strata_gguf::StringArray;

use super::Tokenizer;
use super::pretokenize::ByteLevel;
use super::vocab::{TokenId, Vocab, VocabKind, attr};

const ESCAPED_SPACE: &str = "\u{2581}";

/// The piece of every token as llama.cpp caches it (special tokens included).
pub(crate) fn build_piece_cache(vocab: &Vocab, kind: VocabKind) -> StringArray {
    let byte_level = ByteLevel::new();
    let n = vocab.n_tokens();
    // Sized first: the cache is held for the whole run.
    let total = vocab.texts().map(<[u8]>::len).sum::<usize>();
    let mut pieces = StringArray::with_capacity(n, total);
    for id in 0..n {
        pieces.push(piece_of(vocab, kind, &byte_level, id));
    }
    pieces
}

fn piece_of(vocab: &Vocab, kind: VocabKind, byte_level: &ByteLevel, id: usize) -> Vec<u8> {
    let a = vocab.attrs[id];
    let text = vocab.text(id as TokenId);
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return text.to_vec();
    }
    if a & attr::NORMAL != 0 {
        return match kind {
            VocabKind::Spm => unescape_spaces(text),
            VocabKind::Bpe => decode_byte_level(byte_level, text),
        };
    }
    if a & attr::BYTE != 0 {
        return hex_byte(text).map(|b| vec![b]).unwrap_or_default();
    }
    Vec::new()
}

fn unescape_spaces(text: &[u8]) -> Vec<u8> {
    match std::str::from_utf8(text) {
        Ok(s) => s.replace(ESCAPED_SPACE, " ").into_bytes(),
        Err(_) => text.to_vec(),
    }
}

/// `<0xAB>` → 0xAB.
fn hex_byte(text: &[u8]) -> Option<u8> {
    let hex = std::str::from_utf8(text.get(3..5)?).ok()?;
    u8::from_str_radix(hex, 16).ok()
}

/// Maps each character of a byte-level token back to its byte; a character
/// outside the map is written as llama.cpp writes it.
fn decode_byte_level(byte_level: &ByteLevel, text: &[u8]) -> Vec<u8> {
    let s = String::from_utf8_lossy(text);
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        match byte_level.char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(s.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

impl Tokenizer {
    /// The bytes of one token (llama.cpp's `llama_token_to_piece`): control and
    /// unknown tokens are empty unless `special`; up to `lstrip` leading spaces
    /// are dropped. An id outside the vocabulary gives an empty piece.
    pub fn token_to_piece(&self, id: TokenId, lstrip: usize, special: bool) -> &[u8] {
        let pieces = self
            .pieces
            .get_or_init(|| build_piece_cache(&self.vocab, self.kind()));
        let Some(piece) = pieces.get_bytes(id as usize) else {
            return &[];
        };
        if !special && self.vocab.attrs[id as usize] & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return &[];
        }
        let skip = piece
            .iter()
            .take(lstrip)
            .take_while(|&&b| b == b' ')
            .count();
        &piece[skip..]
    }

    /// Tokens to bytes as llama.cpp's `llama_detokenize`: `remove_special`
    /// drops a leading BOS and trailing EOS the model adds, `unparse_special`
    /// writes control tokens out; BPE vocabularies that ask for it get their
    /// spaces before punctuation cleaned up.
    pub fn detokenize_bytes(
        &self,
        ids: &[TokenId],
        remove_special: bool,
        unparse_special: bool,
    ) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special
            && self.add_bos
            && ids
                .first()
                .is_some_and(|&t| Some(t) == self.vocab.special.bos)
        {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special
            && self.add_eos
            && ids
                .last()
                .is_some_and(|&t| Some(t) == self.vocab.special.eos)
        {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            text.extend_from_slice(self.token_to_piece(
                id,
                usize::from(remove_space),
                unparse_special,
            ));
            remove_space = false;
        }
        if self.clean_spaces {
            text = clean_up_spaces(&text);
        }
        text
    }

    /// [`Tokenizer::detokenize_bytes`] as a string, invalid UTF-8 replaced.
    pub fn detokenize(
        &self,
        ids: &[TokenId],
        remove_special: bool,
        unparse_special: bool,
    ) -> String {
        String::from_utf8_lossy(&self.detokenize_bytes(ids, remove_special, unparse_special))
            .into_owned()
    }

    /// A decoder for tokens arriving one at a time.
    pub fn stream_decoder(&self, show_special: bool) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            show_special,
            pending: Vec::new(),
        }
    }
}

/// llama.cpp's three clean-up passes (" ?" → "?", " ' " → "'", " 's" → "'s" ...).
fn clean_up_spaces(text: &[u8]) -> Vec<u8> {
    // Pass 1: no space before ? ! . ,
    let mut a: Vec<u8> = Vec::with_capacity(text.len());
    for (i, &x) in text.iter().enumerate() {
        if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            a.pop();
        }
        a.push(x);
    }
    // Pass 2: a lone apostrophe between spaces loses both spaces. llama.cpp
    // zeroes the skipped space in place, so it no longer counts as a space
    // before the next character; the copy `t` reproduces that.
    let mut t = a;
    let mut b: Vec<u8> = Vec::with_capacity(t.len());
    if let Some(&first) = t.first() {
        b.push(first);
    }
    let mut i = 1;
    while i < t.len() {
        let x = t[i];
        if x == b'\'' && i + 1 < t.len() && t[i - 1] == b' ' && t[i + 1] == b' ' {
            b.pop();
            t[i + 1] = 0;
            b.push(x);
            i += 2;
            continue;
        }
        b.push(x);
        i += 1;
    }
    // Pass 3: " 's", " 'm", " 're", " 've" lose the space.
    let mut c: Vec<u8> = Vec::with_capacity(b.len());
    for (i, &x) in b.iter().enumerate() {
        if i > 0 && b[i - 1] == b' ' && x == b'\'' && i + 1 < b.len() {
            let x1 = b[i + 1];
            let joins = match x1 {
                b's' | b'm' => true,
                b'r' | b'v' => i + 2 < b.len() && b[i + 2] == b'e',
                _ => false,
            };
            if joins {
                c.pop();
            }
        }
        c.push(x);
    }
    c
}

/// Turns tokens into text as they arrive, holding back the bytes of a
/// character that is not complete yet, so no half character is ever emitted.
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    show_special: bool,
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Adds one token; returns the text that is now complete (maybe empty).
    /// Bytes that can never form a character come out as U+FFFD.
    pub fn push(&mut self, id: TokenId) -> String {
        let piece = self.tokenizer.token_to_piece(id, 0, self.show_special);
        self.push_bytes(piece)
    }

    fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` was just validated.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &bad[n..];
                        }
                        None => {
                            rest = bad; // an incomplete character: wait for more
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Ends the stream: whatever is still held back, U+FFFD for an incomplete character.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_up_matches_llama_cpp_rules() {
        assert_eq!(clean_up_spaces(b"Hello , world !"), b"Hello, world!");
        assert_eq!(clean_up_spaces(b"a ' b"), b"a'b");
        assert_eq!(clean_up_spaces(b"a ' ' b"), b"a'' b");
        assert_eq!(
            clean_up_spaces(b"it 's we 're I 'll he 'd"),
            b"it's we're I 'll he 'd"
        );
    }

    #[test]
    fn hex_bytes() {
        assert_eq!(hex_byte(b"<0x0A>"), Some(10));
        assert_eq!(hex_byte(b"<0xFF>"), Some(255));
        assert_eq!(hex_byte(b"<0x"), None);
    }
}
