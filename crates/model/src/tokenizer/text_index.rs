//! Token text → id over the vocabulary's one string buffer: an open-addressing
//! table of ids (4 bytes a slot) that compares against the
//! texts where they already are, instead of a map holding a second copy of
//! every text as its keys.

use std::hash::Hasher;

use strata_gguf::StringArray;

use super::fxhash::FxHasher;
use super::vocab::TokenId;

const EMPTY: TokenId = TokenId::MAX;

pub(crate) struct TextIndex {
    slots: Vec<TokenId>,
    /// `64 - log2(slots.len())`: the hash's top bits pick the slot (Fx mixes
    /// by multiplication, so its high bits are the well-mixed ones).
    shift: u32,
}

fn hash(text: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(text);
    // The length too, so that texts differing only in trailing zero bytes differ.
    h.write_usize(text.len());
    h.finish()
}

impl TextIndex {
    /// An index with room for `n` texts: at most three quarters full (a few
    /// probes a look-up with linear probing; half full would double its size).
    pub(crate) fn with_capacity(n: usize) -> Self {
        let size = (n.max(8) + n / 3 + 1).next_power_of_two();
        Self {
            slots: vec![EMPTY; size],
            shift: 64 - size.trailing_zeros(),
        }
    }

    fn start(&self, text: &[u8]) -> usize {
        (hash(text) >> self.shift) as usize
    }

    /// Indexes `texts[id]`; returns the id that already has that text, if any
    /// (then nothing changes).
    pub(crate) fn insert(&mut self, texts: &StringArray, id: TokenId) -> Option<TokenId> {
        let text = texts.get_bytes(id as usize).unwrap_or_default();
        let mask = self.slots.len() - 1;
        let mut i = self.start(text);
        loop {
            match self.slots[i] {
                EMPTY => {
                    self.slots[i] = id;
                    return None;
                }
                other if texts.get_bytes(other as usize) == Some(text) => return Some(other),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The id of `text`, if it is one of `texts` (the array this index was built over).
    pub(crate) fn get(&self, texts: &StringArray, text: &[u8]) -> Option<TokenId> {
        let mask = self.slots.len() - 1;
        let mut i = self.start(text);
        loop {
            match self.slots[i] {
                EMPTY => return None,
                id if texts.get_bytes(id as usize) == Some(text) => return Some(id),
                _ => i = (i + 1) & mask,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_text_and_reports_duplicates() {
        let words: Vec<String> = (0..5000).map(|i| format!("w{i}")).collect();
        let mut texts: StringArray = words.iter().collect();
        texts.push("w17");
        let mut index = TextIndex::with_capacity(texts.len());
        for id in 0..5000 {
            assert_eq!(index.insert(&texts, id), None);
        }
        assert_eq!(
            index.insert(&texts, 5000),
            Some(17),
            "a repeated text is caught"
        );
        for (id, w) in words.iter().enumerate() {
            assert_eq!(index.get(&texts, w.as_bytes()), Some(id as TokenId));
        }
        assert_eq!(index.get(&texts, b"w5000"), None);
        assert_eq!(index.get(&texts, b""), None);
    }
}
