//! Splitting text into words before BPE: regexes in cascade, then GPT-2's
//! byte-to-character mapping.

use std::ops::Range;
use std::sync::OnceLock;

use fancy_regex::Regex;

use super::error::TokenizerError;
use super::pre_table::{AFMOE_DIGITS, RegexList};

/// One step of a pre-tokenizer.
enum Step {
    Regex(Regex),
    /// llama.cpp's AFMoE digit splitter.
    DigitGroups,
}

/// The steps of one pre-tokenizer, compiled on first use: a model loaded to be
/// benchmarked, or served token ids, never pays for the regex engine (its automata, and
/// the code and Unicode tables compiling them touches: ~1.5 MB of resident memory).
pub(crate) struct PreTokenizer {
    list: RegexList,
    steps: OnceLock<Result<Vec<Step>, TokenizerError>>,
}

impl PreTokenizer {
    /// The pre-tokenizer of `list`, compiled when it first splits a text (every table
    /// entry compiles: tested below).
    pub(crate) fn new(list: RegexList) -> Self {
        Self {
            list,
            steps: OnceLock::new(),
        }
    }

    fn compile(list: RegexList) -> Result<Vec<Step>, TokenizerError> {
        list.iter()
            .map(|p| {
                if *p == AFMOE_DIGITS {
                    return Ok(Step::DigitGroups);
                }
                Regex::new(p)
                    .map(Step::Regex)
                    .map_err(|e| TokenizerError::BadRegex {
                        pattern: (*p).to_owned(),
                        reason: e.to_string(),
                    })
            })
            .collect()
    }

    fn steps(&self) -> Result<&[Step], TokenizerError> {
        match self.steps.get_or_init(|| Self::compile(self.list)) {
            Ok(steps) => Ok(steps),
            Err(TokenizerError::BadRegex { pattern, reason }) => Err(TokenizerError::BadRegex {
                pattern: pattern.clone(),
                reason: reason.clone(),
            }),
            Err(e) => Err(TokenizerError::BadVocab {
                reason: e.to_string(),
            }),
        }
    }

    /// Byte ranges of the words of `text`. Each regex runs on every piece left
    /// by the previous one, and both its matches and the text between them
    /// become pieces (llama.cpp's `unicode_regex_split`).
    pub(crate) fn split(&self, text: &str) -> Result<Vec<Range<usize>>, TokenizerError> {
        let mut pieces = vec![Range {
            start: 0,
            end: text.len(),
        }];
        for step in self.steps()? {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                match step {
                    Step::Regex(re) => split_by_regex(re, text, piece, &mut next)?,
                    Step::DigitGroups => split_digit_groups(text, piece, &mut next),
                }
            }
            pieces = next;
        }
        Ok(pieces)
    }
}

fn split_by_regex(
    re: &Regex,
    text: &str,
    piece: Range<usize>,
    next: &mut Vec<Range<usize>>,
) -> Result<(), TokenizerError> {
    let frag = &text[piece.clone()];
    let mut last = 0;
    for m in re.find_iter(frag) {
        let m = m.map_err(|e| TokenizerError::RegexRuntime {
            pattern: re.as_str().to_owned(),
            reason: e.to_string(),
        })?;
        if m.start() > last {
            next.push(piece.start + last..piece.start + m.start());
        }
        if m.end() > m.start() {
            next.push(piece.start + m.start()..piece.start + m.end());
        }
        last = m.end();
    }
    if last < frag.len() {
        next.push(piece.start + last..piece.end);
    }
    Ok(())
}

/// llama.cpp's AFMoE digit splitter: a run of n digits (\p{N}) ends a piece
/// after its first n mod 3 digits and after every third digit from there; the
/// text before the run stays in the piece of the first group, as there.
fn split_digit_groups(text: &str, piece: Range<usize>, next: &mut Vec<Range<usize>>) {
    let frag = &text[piece.clone()];
    let mut prev_end = 0;
    let mut cut = |end: usize, next: &mut Vec<Range<usize>>| {
        if end > prev_end {
            next.push(piece.start + prev_end..piece.start + end);
        }
        prev_end = end;
    };
    let chars: Vec<(usize, char)> = frag.char_indices().collect();
    let offset = |i: usize| chars.get(i).map_or(frag.len(), |&(o, _)| o);
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].1.is_numeric() {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && chars[i].1.is_numeric() {
            i += 1;
        }
        let mut at = start + (i - start) % 3;
        if at > start {
            cut(offset(at), next);
        }
        while at < i {
            at += 3;
            cut(offset(at), next);
        }
    }
    cut(frag.len(), next);
}

/// GPT-2's reversible map of the 256 byte values to printable characters.
pub(crate) struct ByteLevel {
    to_char: [char; 256],
    /// Indexed by code point (all mapped characters are below U+0144).
    from_char: Vec<Option<u8>>,
}

impl ByteLevel {
    pub(crate) fn new() -> Self {
        let printable = |b: u32| {
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
        };
        let mut to_char = ['\0'; 256];
        let mut from_char = vec![None; 0x144];
        let mut extra = 0u32;
        for b in 0u32..256 {
            let cp = if printable(b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            // Every value is below U+0144, so always a valid char.
            let c = char::from_u32(cp).unwrap_or('\u{FFFD}');
            to_char[b as usize] = c;
            from_char[cp as usize] = Some(b as u8);
        }
        Self { to_char, from_char }
    }

    pub(crate) fn encode_into(&self, bytes: &[u8], out: &mut String) {
        for &b in bytes {
            out.push(self.to_char[b as usize]);
        }
    }

    /// UTF-8 length of the character that stands for byte `b`.
    pub(crate) fn encoded_len(&self, b: u8) -> usize {
        self.to_char[b as usize].len_utf8()
    }

    pub(crate) fn char_to_byte(&self, c: char) -> Option<u8> {
        self.from_char.get(c as usize).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_is_a_bijection_onto_gpt2_alphabet() {
        let bl = ByteLevel::new();
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let mut s = String::new();
            bl.encode_into(&[b], &mut s);
            let c = s.chars().next().unwrap();
            assert_eq!(bl.char_to_byte(c), Some(b));
            assert!(seen.insert(c));
        }
        // Known points of GPT-2's table: space is 'Ġ', newline 'Ċ'.
        let mut s = String::new();
        bl.encode_into(b" \n", &mut s);
        assert_eq!(s, "ĠĊ");
    }

    #[test]
    fn digit_groups_cut_like_llama_cpp() {
        fn pieces(text: &str) -> Vec<&str> {
            let mut out = Vec::new();
            split_digit_groups(text, 0..text.len(), &mut out);
            out.into_iter().map(|r| &text[r]).collect()
        }
        assert_eq!(pieces("1234567"), ["1", "234", "567"]);
        assert_eq!(pieces("abc12345def"), ["abc12", "345", "def"]);
        assert_eq!(pieces("x1y234"), ["x1", "y234"]);
        assert_eq!(pieces("no digits"), ["no digits"]);
    }

    #[test]
    fn every_table_regex_compiles() {
        for d in super::super::pre_table::all_defs() {
            PreTokenizer::compile(d.regexes).unwrap();
        }
    }
}
