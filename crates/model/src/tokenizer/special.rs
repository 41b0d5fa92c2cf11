//! Finding special tokens in raw text before tokenization (llama.cpp's
//! `tokenizer_st_partition`): each special token, longest first, splits every
//! remaining text fragment at each of its non-overlapping occurrences.

use std::collections::HashMap;
use std::ops::Range;

use super::vocab::{TokenId, Vocab, attr};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(Range<usize>),
    Token(TokenId),
}

/// A byte trie of the special tokens, to find all their occurrences in one pass.
pub(crate) struct SpecialMatcher {
    /// (node, byte) → child node; node 0 is the root.
    edges: HashMap<(u32, u8), u32>,
    /// Token ending at each node, if any.
    token_at: Vec<Option<TokenId>>,
    /// Bytes that start some special token, for a fast skip.
    first_byte: [bool; 256],
}

impl SpecialMatcher {
    pub(crate) fn new(vocab: &Vocab, tokens: &[TokenId]) -> Self {
        let mut m = Self {
            edges: HashMap::new(),
            token_at: vec![None],
            first_byte: [false; 256],
        };
        for &id in tokens {
            let text = vocab.text(id);
            let Some(&first) = text.first() else { continue };
            m.first_byte[first as usize] = true;
            let mut node = 0u32;
            for &b in text.iter() {
                let next = m.token_at.len() as u32;
                node = *m.edges.entry((node, b)).or_insert_with(|| next);
                if node == next {
                    m.token_at.push(None);
                }
            }
            m.token_at[node as usize] = Some(id);
        }
        m
    }

    /// Every occurrence (start, token) of every special token, overlapping ones included.
    fn occurrences(&self, text: &[u8]) -> Vec<(usize, TokenId)> {
        let mut found = Vec::new();
        for start in 0..text.len() {
            if !self.first_byte[text[start] as usize] {
                continue;
            }
            let mut node = 0u32;
            for &b in &text[start..] {
                match self.edges.get(&(node, b)) {
                    Some(&child) => node = child,
                    None => break,
                }
                if let Some(id) = self.token_at[node as usize] {
                    found.push((start, id));
                }
            }
        }
        found
    }
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Splits `text` into raw-text fragments and special tokens. `order` lists the
/// tokens to look for, highest priority (longest) first.
pub(crate) fn partition(
    vocab: &Vocab,
    matcher: &SpecialMatcher,
    order: &[TokenId],
    text: &str,
) -> Vec<Fragment> {
    if text.is_empty() {
        return Vec::new();
    }
    let bytes = text.as_bytes();
    let mut fragments = vec![Fragment::Text(0..bytes.len())];

    let mut by_token: HashMap<TokenId, Vec<usize>> = HashMap::new();
    for (pos, id) in matcher.occurrences(bytes) {
        by_token.entry(id).or_default().push(pos);
    }
    if by_token.is_empty() {
        return fragments;
    }

    for &id in order {
        let Some(positions) = by_token.get(&id) else {
            continue;
        };
        let len = vocab.text(id).len();
        let attrs = vocab.attrs[id as usize];
        let mut next = Vec::with_capacity(fragments.len() + 2 * positions.len());
        let mut p = 0; // index into positions (ascending)
        for frag in fragments {
            let Fragment::Text(range) = frag else {
                next.push(frag);
                continue;
            };
            let mut cursor = range.start;
            while p < positions.len() && positions[p] < cursor {
                p += 1;
            }
            while p < positions.len() && positions[p] + len <= range.end {
                let at = positions[p];
                p += 1;
                if at < cursor {
                    continue;
                }
                let mut left_end = at;
                if attrs & attr::LSTRIP != 0 {
                    while left_end > cursor && is_c_space(bytes[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > cursor {
                    next.push(Fragment::Text(cursor..left_end));
                }
                next.push(Fragment::Token(id));
                cursor = at + len;
                if attrs & attr::RSTRIP != 0 {
                    while cursor < range.end && is_c_space(bytes[cursor]) {
                        cursor += 1;
                    }
                }
            }
            if cursor < range.end {
                next.push(Fragment::Text(cursor..range.end));
            }
        }
        fragments = next;
    }
    fragments
}
