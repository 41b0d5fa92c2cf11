//! A draft model: a second, small model with the same vocabulary, decoding greedily in a
//! context of its own on the same device. It keeps the K/V of the conversation between
//! windows and only feeds what changed: the tokens the target accepted or chose since.

use strata_model::Model;
use strata_model::tokenizer::TokenizerSpec;

use super::drafter::Drafter;
use crate::context::Context;
use crate::error::{EngineError, Result};

#[derive(Debug, thiserror::Error)]
pub enum DraftModelError {
    #[error("the draft model cannot draft for this model: {0}")]
    Vocabulary(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

pub struct DraftModel {
    ctx: Context,
}

impl DraftModel {
    /// Drafts with `ctx` (a context of the draft model) for `target`; refuses a draft
    /// model whose token ids mean other texts than the target's.
    pub fn new(ctx: Context, target: &Model) -> Result<Self, DraftModelError> {
        same_vocabulary(&ctx.model, target)?;
        Ok(DraftModel { ctx })
    }
}

/// The token lists must be equal, text for text, and so must the models' output rows.
pub fn same_vocabulary(draft: &Model, target: &Model) -> Result<(), DraftModelError> {
    let spec = |m: &Model| {
        TokenizerSpec::from_gguf(&m.gguf).map_err(|e| DraftModelError::Engine(e.into()))
    };
    let (d, t) = (spec(draft)?, spec(target)?);
    let bad = |m: String| Err(DraftModelError::Vocabulary(m));
    if d.model != t.model {
        return bad(format!(
            "its tokenizer is `{}`, the target's `{}`",
            d.model, t.model
        ));
    }
    if d.tokens.len() != t.tokens.len() || draft.hp.n_vocab != target.hp.n_vocab {
        return bad(format!(
            "it has {} tokens ({} output rows), the target {} ({})",
            d.tokens.len(),
            draft.hp.n_vocab,
            t.tokens.len(),
            target.hp.n_vocab
        ));
    }
    let pairs = d.tokens.iter_bytes().zip(t.tokens.iter_bytes());
    if let Some((i, (a, b))) = pairs.enumerate().find(|(_, (a, b))| a != b) {
        return bad(format!(
            "token {i} is {:?} there and {:?} in the target",
            String::from_utf8_lossy(a),
            String::from_utf8_lossy(b)
        ));
    }
    Ok(())
}

impl Drafter for DraftModel {
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        let n_ctx = self.ctx.n_ctx();
        // The drafts' own K/V must fit too (the last draft is not fed).
        let k = k.min((n_ctx + 1).saturating_sub(history.len()));
        if k == 0 || history.is_empty() {
            return Ok(Vec::new());
        }
        // Keep what the draft context shares with the history, but feed at least the
        // last token: its logits give the first draft.
        let held = self.ctx.tokens();
        let common = held
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len() - 1);
        self.ctx.truncate(common);
        // Greedy drafts: only each step's chosen id leaves the device.
        let mut t = self.ctx.eval_argmax(&history[common..])?;
        let mut drafts = Vec::with_capacity(k);
        loop {
            drafts.push(t);
            if drafts.len() == k {
                break;
            }
            t = self.ctx.eval_argmax(&[t])?;
        }
        Ok(drafts)
    }
}
