//! Perplexity as llama.cpp's `llama-perplexity` defines it (tools/perplexity, without
//! `--ppl-stride`): the text's tokens are cut into chunks of `n_ctx`; each chunk is read
//! into an empty context (its first token replaced by BOS when the vocabulary adds one);
//! the second half of the chunk is scored: row i (i from n_ctx/2 to n_ctx - 2) predicts
//! token i + 1, its negative log-probability `-(logit - max - ln Σ exp(logit_j - max))`
//! (exponentials in f32, their sum and the result in f64) added to the total. After each
//! chunk the running perplexity is exp(total / scored tokens), as llama-perplexity prints.

use crate::context::Context;
use crate::error::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(
        "the text has {tokens} tokens; perplexity with a context of {n_ctx} needs at least {} (two chunks)",
        2 * n_ctx
    )]
    TooShort { tokens: usize, n_ctx: usize },
    #[error("a perplexity chunk of {n_ctx} tokens does not fit a context of {ctx}")]
    ChunkOverContext { n_ctx: usize, ctx: usize },
    #[error("a perplexity chunk needs at least 4 tokens, got {0}")]
    ChunkTooSmall(usize),
}

/// How the text is cut and read.
#[derive(Clone, Copy, Debug)]
pub struct PerplexityOptions {
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// Chunks to score at most (`None`: every whole chunk of the text).
    pub max_chunks: Option<usize>,
    /// The token that replaces each chunk's first one (the vocabulary's BOS, when it adds one).
    pub bos: Option<u32>,
}

/// What one chunk gave: its scored rows' logits (row after row, for drift checks) and the
/// running perplexity after it.
pub struct ChunkResult<'a> {
    pub index: usize,
    pub logits: &'a [f32],
    pub running: f64,
}

/// Sums over the scored tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Perplexity {
    /// The running perplexity after each chunk.
    pub running: Vec<f64>,
    /// Σ -log p and Σ (log p)² over the scored tokens, and their count.
    pub nll: f64,
    pub nll2: f64,
    pub count: usize,
}

impl Perplexity {
    /// exp(mean negative log-likelihood).
    pub fn value(&self) -> f64 {
        (self.nll / self.count.max(1) as f64).exp()
    }

    /// llama-perplexity's "+/-": the standard error of the mean NLL, times the perplexity.
    pub fn uncertainty(&self) -> f64 {
        let n = self.count.max(1) as f64;
        let mean = self.nll / n;
        let var = self.nll2 / n - mean * mean;
        if var > 0.0 && self.count > 1 {
            (var / (n - 1.0)).sqrt() * self.value()
        } else {
            0.0
        }
    }
}

/// `log p(token)` of one row of logits, as llama-perplexity's `log_softmax`.
pub fn log_softmax(logits: &[f32], token: usize) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let sum: f64 = logits.iter().map(|&x| (x - max).exp() as f64).sum();
    (logits[token] - max) as f64 - sum.ln()
}

/// Scores `tokens` in `ctx` (which must hold `opts.n_ctx` positions), calling `on_chunk`
/// after each chunk.
pub fn perplexity(
    ctx: &mut Context,
    tokens: &[u32],
    opts: &PerplexityOptions,
    mut on_chunk: impl FnMut(&ChunkResult<'_>),
) -> Result<Perplexity, PerplexityError> {
    let n_ctx = opts.n_ctx;
    if n_ctx < 4 {
        return Err(PerplexityError::ChunkTooSmall(n_ctx));
    }
    if n_ctx > ctx.n_ctx() {
        return Err(PerplexityError::ChunkOverContext {
            n_ctx,
            ctx: ctx.n_ctx(),
        });
    }
    if tokens.len() < 2 * n_ctx {
        return Err(PerplexityError::TooShort {
            tokens: tokens.len(),
            n_ctx,
        });
    }
    let n_chunks = (tokens.len() / n_ctx).min(opts.max_chunks.unwrap_or(usize::MAX));
    let vocab = ctx.model.hp.n_vocab as usize;
    let first = n_ctx / 2;
    let mut out = Perplexity::default();
    for index in 0..n_chunks {
        let chunk = &tokens[index * n_ctx..(index + 1) * n_ctx];
        let mut input = chunk.to_vec();
        if let Some(bos) = opts.bos {
            input[0] = bos;
        }
        ctx.truncate(0);
        let logits = ctx.eval_all(&input)?;
        for i in first..n_ctx - 1 {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let v = -log_softmax(row, chunk[i + 1] as usize);
            out.nll += v;
            out.nll2 += v * v;
        }
        out.count += n_ctx - 1 - first;
        let running = out.value();
        out.running.push(running);
        on_chunk(&ChunkResult {
            index,
            logits: &logits[first * vocab..(n_ctx - 1) * vocab],
            running,
        });
    }
    ctx.truncate(0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_is_the_log_of_the_normalised_exponential() {
        let logits = [1.0f32, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
        for (t, &x) in logits.iter().enumerate() {
            let want = (x as f64).exp() / z;
            assert!((log_softmax(&logits, t).exp() - want).abs() < 1e-7);
        }
    }

    #[test]
    fn the_uncertainty_is_llama_perplexitys() {
        // Three tokens of NLL 1, 2, 3: mean 2, variance 2/3, standard error sqrt(1/3).
        let p = Perplexity {
            running: vec![],
            nll: 6.0,
            nll2: 14.0,
            count: 3,
        };
        assert!((p.value() - 2f64.exp()).abs() < 1e-12);
        assert!((p.uncertainty() - (1.0f64 / 3.0).sqrt() * 2f64.exp()).abs() < 1e-12);
    }
}
