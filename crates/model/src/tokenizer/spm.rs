//! SentencePiece-style tokenization as llama.cpp does it (`llm_tokenizer_spm`):
//! characters are merged pairwise whenever the pair is a token, highest score
//! first (leftmost on ties); what never becomes a token falls back to byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashSet};

use super::fxhash::FxBuildHasher;
use super::vocab::{TokenId, Vocab};

/// Adjacent character pairs that occur inside some token. Where two neighbouring
/// characters of the input form no such pair, no merge can ever join them, so
/// the text is cut there and each piece merged on its own: same tokens, far
/// smaller merge queues.
pub(crate) struct SpmModel {
    pairs: HashSet<(char, char), FxBuildHasher>,
}

impl SpmModel {
    pub(crate) fn new(vocab: &Vocab) -> Self {
        let mut pairs = HashSet::default();
        for text in vocab.texts() {
            let s = String::from_utf8_lossy(text);
            let mut chars = s.chars();
            if let Some(mut prev) = chars.next() {
                for c in chars {
                    pairs.insert((prev, c));
                    prev = c;
                }
            }
        }
        Self { pairs }
    }

    /// Appends the tokens of `text` (spaces already escaped as U+2581) to `out`.
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<TokenId>) {
        let mut start = 0;
        let mut prev: Option<char> = None;
        for (i, c) in text.char_indices() {
            if let Some(p) = prev
                && !self.pairs.contains(&(p, c))
            {
                encode_piece(vocab, &text[start..i], out);
                start = i;
            }
            prev = Some(c);
        }
        encode_piece(vocab, &text[start..], out);
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    end: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// The merge loop on one piece of text.
fn encode_piece(vocab: &Vocab, text: &str, out: &mut Vec<TokenId>) {
    let bytes = text.as_bytes();
    let mut symbols: Vec<Symbol> = text
        .char_indices()
        .enumerate()
        .map(|(i, (start, c))| Symbol {
            start,
            end: start + c.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        })
        .collect();
    let n = symbols.len();
    for (i, s) in symbols.iter_mut().enumerate() {
        s.next = (i + 1 < n).then_some(i + 1);
    }

    let mut queue = BinaryHeap::new();
    let try_add = |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, l: usize, r: usize| {
        let piece = &bytes[symbols[l].start..symbols[r].end];
        if let Some(id) = vocab.id_of(piece) {
            queue.push(Bigram {
                score: vocab.scores[id as usize],
                left: l,
                right: r,
                len: piece.len(),
            });
        }
    };
    for i in 1..n {
        try_add(&symbols, &mut queue, i - 1, i);
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        // Stale if either side changed since it was queued.
        if l.start == l.end || r.start == r.end || (l.end - l.start) + (r.end - r.start) != b.len {
            continue;
        }
        symbols[b.left].end = r.end;
        symbols[b.left].next = r.next;
        symbols[b.right].end = symbols[b.right].start; // dead
        if let Some(nx) = r.next {
            symbols[nx].prev = Some(b.left);
        }
        if let Some(p) = symbols[b.left].prev {
            try_add(&symbols, &mut queue, p, b.left);
        }
        if let Some(nx) = symbols[b.left].next {
            try_add(&symbols, &mut queue, b.left, nx);
        }
    }

    let mut i = if n > 0 { Some(0) } else { None };
    while let Some(k) = i {
        let s = symbols[k];
        let piece = &bytes[s.start..s.end];
        match vocab.id_of(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece {
                    if let Some(id) = byte_token(vocab, b) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}

/// The token for one byte: `<0xXX>`, else the byte itself as a token, else
/// the unknown token (llama.cpp throws there).
pub(crate) fn byte_token(vocab: &Vocab, b: u8) -> Option<TokenId> {
    vocab
        .id_of(format!("<0x{b:02X}>").as_bytes())
        .or_else(|| vocab.id_of(&[b]))
        .or(vocab.special.unk)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::Tokenizer;

    /// Cutting the text where no token spans two characters must not change a
    /// single token: compare with the merge loop run on the whole text.
    #[test]
    fn cutting_at_impossible_pairs_changes_nothing() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/vocab/ggml-vocab-llama-spm.gguf");
        let tok = Tokenizer::from_gguf_file(path).unwrap();
        let super::super::Model::Spm(spm) = &tok.model else {
            panic!("not SPM")
        };
        // A small deterministic generator over a pool with spaces, letters, CJK,
        // emoji and punctuation (xorshift).
        let pool: Vec<char> = "▁▁▁▁abcdeeinorsthTHE,.!?'\"0123456789中文字日本😀é\n\t<>|"
            .chars()
            .collect();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..300 {
            let mut text = String::new();
            for _ in 0..60 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push(pool[(state % pool.len() as u64) as usize]);
            }
            let mut cut = Vec::new();
            spm.encode(&tok.vocab, &text, &mut cut);
            let mut whole = Vec::new();
            encode_piece(&tok.vocab, &text, &mut whole);
            assert_eq!(cut, whole, "{text:?}");
        }
    }
}
