//! Byte-level BPE: words from the pre-tokenizer are merged pairwise, lowest
//! merge rank first (leftmost on ties), as llama.cpp's `llm_tokenizer_bpe_session`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use strata_gguf::StringArray;

use super::fxhash::FxHashMap;

use super::error::TokenizerError;
use super::pre_table::PreDef;
use super::pretokenize::{ByteLevel, PreTokenizer};
use super::vocab::{TokenId, Vocab};

/// A symbol id: a vocabulary id, or (at or above the vocabulary size) a merge
/// piece that is not itself a token.
type SymId = u32;

/// A queued merge: (rank, left index, right index, left symbol, right symbol).
type Candidate = Reverse<(u32, usize, usize, SymId, SymId)>;

pub(crate) struct BpeModel {
    pretokenizer: PreTokenizer,
    byte_level: ByteLevel,
    /// (left, right) → (rank, merged symbol).
    merges: FxHashMap<(SymId, SymId), (u32, SymId)>,
    n_vocab: u32,
    ignore_merges: bool,
    /// The symbol of each byte's character.
    byte_symbol: [Option<SymId>; 256],
}

/// Words longer than this are not cached (they rarely repeat).
const MAX_CACHED_WORD: usize = 64;
const MAX_CACHE_ENTRIES: usize = 1 << 16;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    end: usize,
    id: Option<SymId>,
    prev: Option<usize>,
    next: Option<usize>,
}

impl BpeModel {
    pub(crate) fn new(
        vocab: &Vocab,
        merges: &StringArray,
        pre: &PreDef,
    ) -> Result<Self, TokenizerError> {
        let n_vocab = vocab.n_tokens() as u32;
        let mut extra_symbols: FxHashMap<Box<[u8]>, SymId> = FxHashMap::default();
        let mut intern = |text: &[u8]| -> SymId {
            if let Some(id) = vocab.id_of(text) {
                return id;
            }
            let next = n_vocab + extra_symbols.len() as u32;
            *extra_symbols.entry(text.into()).or_insert(next)
        };
        let mut table = FxHashMap::with_capacity_and_hasher(merges.len(), Default::default());
        let mut merged_text = Vec::new();
        for (rank, m) in merges.iter_bytes().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let Some(pos) = m.iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&m[..pos], &m[pos + 1..]);
            let l = intern(left);
            let r = intern(right);
            merged_text.clear();
            merged_text.extend_from_slice(left);
            merged_text.extend_from_slice(right);
            let merged = intern(&merged_text);
            // The first rank of a repeated pair wins, as with llama.cpp's emplace.
            table.entry((l, r)).or_insert((rank as u32, merged));
        }
        let byte_level = ByteLevel::new();
        let mut byte_symbol = [None; 256];
        for (b, slot) in byte_symbol.iter_mut().enumerate() {
            let mut s = String::new();
            byte_level.encode_into(&[b as u8], &mut s);
            *slot = vocab
                .id_of(s.as_bytes())
                .or_else(|| extra_symbols.get(s.as_bytes()).copied());
        }
        Ok(Self {
            pretokenizer: PreTokenizer::new(pre.regexes),
            byte_level,
            merges: table,
            n_vocab,
            ignore_merges: pre.ignore_merges,
            byte_symbol,
        })
    }

    /// Appends the tokens of `text` (a raw-text fragment) to `out`.
    pub(crate) fn encode(
        &self,
        vocab: &Vocab,
        text: &str,
        out: &mut Vec<TokenId>,
    ) -> Result<(), TokenizerError> {
        // Words repeat: a word's tokens are computed once per call.
        let mut cache: FxHashMap<&str, (usize, usize)> = FxHashMap::default();
        let mut word = String::new();
        for range in self.pretokenizer.split(text)? {
            let raw = &text[range];
            if let Some(&(start, len)) = cache.get(raw) {
                out.extend_from_within(start..start + len);
                continue;
            }
            let start = out.len();
            word.clear();
            self.byte_level.encode_into(raw.as_bytes(), &mut word);
            self.encode_word(vocab, raw.as_bytes(), &word, out);
            if raw.len() <= MAX_CACHED_WORD && cache.len() < MAX_CACHE_ENTRIES {
                cache.insert(raw, (start, out.len() - start));
            }
        }
        Ok(())
    }

    /// `raw` is the word's text, `word` the same after the byte-to-character
    /// mapping: each raw byte is one character, so one initial symbol.
    fn encode_word(&self, vocab: &Vocab, raw: &[u8], word: &str, out: &mut Vec<TokenId>) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges
            && let Some(id) = vocab.id_of(word.as_bytes())
        {
            out.push(id);
            return;
        }
        let bytes = word.as_bytes();
        let mut symbols: Vec<Symbol> = Vec::with_capacity(raw.len());
        let mut start = 0;
        for (i, &b) in raw.iter().enumerate() {
            let end = start + self.byte_level.encoded_len(b);
            symbols.push(Symbol {
                start,
                end,
                id: self.byte_symbol[b as usize],
                prev: i.checked_sub(1),
                next: None,
            });
            start = end;
        }
        let n = symbols.len();
        for (i, s) in symbols.iter_mut().enumerate() {
            s.next = (i + 1 < n).then_some(i + 1);
        }

        // (rank, left index, right index, left symbol, right symbol), smallest first.
        let mut queue = BinaryHeap::new();
        let candidate = |symbols: &[Symbol], l: usize, r: usize| -> Option<Candidate> {
            let (a, b) = (symbols[l].id?, symbols[r].id?);
            let &(rank, _) = self.merges.get(&(a, b))?;
            Some(Reverse((rank, l, r, a, b)))
        };
        for i in 1..n {
            if let Some(c) = candidate(&symbols, i - 1, i) {
                queue.push(c);
            }
        }
        while let Some(Reverse((_, l, r, a, b))) = queue.pop() {
            // Skip pairs that changed since they were queued.
            if symbols[l].next != Some(r) || symbols[l].id != Some(a) || symbols[r].id != Some(b) {
                continue;
            }
            let merged = self.merges.get(&(a, b)).map(|&(_, m)| m);
            let right = symbols[r];
            let left = &mut symbols[l];
            left.end = right.end;
            left.id = merged;
            left.next = right.next;
            symbols[r].id = None;
            symbols[r].next = None;
            symbols[r].start = symbols[r].end; // dead
            if let Some(nx) = right.next {
                symbols[nx].prev = Some(l);
            }
            if let Some(p) = symbols[l].prev
                && let Some(c) = candidate(&symbols, p, l)
            {
                queue.push(c);
            }
            if let Some(nx) = symbols[l].next
                && let Some(c) = candidate(&symbols, l, nx)
            {
                queue.push(c);
            }
        }

        let mut i = Some(0);
        while let Some(k) = i {
            let s = symbols[k];
            match s.id {
                Some(id) if id < self.n_vocab => out.push(id),
                _ => {
                    // Not a token: fall back to one token per byte where one exists.
                    for &b in &bytes[s.start..s.end] {
                        if let Some(id) = vocab.id_of(&[b]) {
                            out.push(id);
                        }
                    }
                }
            }
            i = s.next;
        }
    }
}
