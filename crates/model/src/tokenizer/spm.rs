//! SentencePiece-style tokenization as llama.cpp does it (`llm_tokenizer_spm`):
//! characters are merged pairwise whenever the pair is a token, highest score
//! first (leftmost on ties); what never becomes a token falls back to byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::{TokenId, Vocab};

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

/// Appends the tokens of `text` (spaces already escaped as U+2581) to `out`.
pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<TokenId>) {
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
