//! Log-probabilities of generated tokens, from the model's raw logits (before penalties,
//! temperature and truncation, as OpenAI reports them): the chosen token's and the most
//! likely alternatives'.

use strata_model::tokenizer::Tokenizer;

use crate::engine_handle::TokenLogprob;

/// Most alternatives a request may ask for (OpenAI's `top_logprobs` limit).
pub const MAX_TOP: usize = 20;

/// The log-softmax of `logits` at `chosen`, and the `top` most likely tokens (most likely
/// first, the lower id first among equals).
pub fn token_logprobs(logits: &[f32], chosen: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| ((l - max) as f64).exp())
        .sum();
    let log_z = max as f64 + sum.ln();
    let lp = |l: f32| (l as f64 - log_z) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if !l.is_finite() || (best.len() == top && l <= best[top - 1].1) {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (i as u32, l));
            best.truncate(top);
        }
    }
    let chosen_lp = logits
        .get(chosen as usize)
        .map_or(f32::NEG_INFINITY, |&l| lp(l));
    (
        chosen_lp,
        best.into_iter().map(|(i, l)| (i, lp(l))).collect(),
    )
}

/// A token's text (lossy for a piece of a character) and bytes.
fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_to_piece(id, 0, false).to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// The entry OpenAI reports for `chosen` sampled from `logits`.
pub fn entry(tok: &Tokenizer, logits: &[f32], chosen: u32, top: usize) -> TokenLogprob {
    let (logprob, best) = token_logprobs(logits, chosen, top.min(MAX_TOP));
    let (token, bytes) = piece(tok, chosen);
    TokenLogprob {
        token,
        bytes,
        logprob,
        top: best
            .into_iter()
            .map(|(id, lp)| {
                let (t, b) = piece(tok, id);
                (t, b, lp)
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::token_logprobs;

    #[test]
    fn log_softmax_and_the_most_likely_alternatives() {
        // Probabilities 0.5, 0.3, 0.2 as logits (shifted: log-softmax ignores a constant).
        let logits = [0.2f32.ln() + 3.0, 0.5f32.ln() + 3.0, 0.3f32.ln() + 3.0];
        let (lp, top) = token_logprobs(&logits, 2, 2);
        assert!((lp - 0.3f32.ln()).abs() < 1e-5, "{lp}");
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].0, top[1].0), (1, 2));
        assert!((top[0].1 - 0.5f32.ln()).abs() < 1e-5);
        let (_, none) = token_logprobs(&logits, 0, 0);
        assert!(none.is_empty());
        // Ties keep the lower id first; asking for more than there are gives all.
        let (_, all) = token_logprobs(&[1.0, 1.0, 0.0], 0, 5);
        assert_eq!(all.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1, 2]);
    }
}
