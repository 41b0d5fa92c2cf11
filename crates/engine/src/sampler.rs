//! Token sampling in llama.cpp's default order: penalties, top-k, top-p, min-p,
//! temperature, then a draw (or the arg-max when the temperature is 0).

use crate::error::{EngineError, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// 1 disables (llama.cpp's repeat penalty: divides positive logits, multiplies negative).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            penalty_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Whether the arg-max of the raw logits alone decides every token (greedy, with no
    /// penalty to apply first), so a step may take it from the device instead of the row.
    pub fn argmax_decides(&self) -> bool {
        self.temperature <= 0.0
            && self.repeat_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::BadSampling(m));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad(format!(
                "repeat_penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !v.is_finite() || !(-2.0..=2.0).contains(&v) {
                return bad(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        Ok(())
    }
}

/// xoshiro256** seeded by splitmix64: small, fast and the same on every machine.
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
}

/// Index of the largest logit (the lowest index among equals; NaN below every number):
/// core's `argmax_row`, the rule the devices' argmax_rows computes too.
pub fn argmax(logits: &[f32]) -> u32 {
    strata_core::argmax_row(logits)
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = Rng::new(params.seed);
        Ok(Sampler { params, rng })
    }

    /// Applies the penalties for `history` (the tokens so far) to `logits` in place.
    pub fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return;
        }
        let recent = &history[history.len().saturating_sub(p.penalty_last_n)..];
        let mut counts: std::collections::BTreeMap<u32, u32> = Default::default();
        for &t in recent {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &c) in &counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if *l > 0.0 {
                *l /= p.repeat_penalty;
            } else {
                *l *= p.repeat_penalty;
            }
            *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Picks the next token from `logits` given the tokens so far.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let dist = self.distribution(logits, history);
        self.draw(&dist)
    }

    /// The distribution [`Sampler::sample`] draws from after `history`: the penalties, the
    /// cuts (top-k, top-p, min-p) and the temperature applied to `logits`. Speculative
    /// sampling accepts a draft with its probability here, so this is the one definition.
    pub fn distribution(&self, logits: &[f32], history: &[u32]) -> Distribution {
        let mut logits = logits.to_vec();
        self.apply_penalties(&mut logits, history);
        let p = &self.params;
        let point = |t: u32| Distribution {
            tokens: vec![t],
            probs: vec![1.0],
            random: false,
        };
        if p.temperature <= 0.0 {
            return point(argmax(&logits));
        }
        // Candidates sorted by logit, descending (stable: lower id first among equals).
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        if cand.is_empty() {
            return point(argmax(&logits));
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1));
        if p.top_k > 0 {
            cand.truncate(p.top_k.max(1));
        }
        if p.top_p < 1.0 {
            let probs = softmax(&cand, 1.0);
            let mut cum = 0.0;
            let mut keep = cand.len();
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let threshold = cand[0].1 + p.min_p.ln();
            let keep = cand.iter().take_while(|c| c.1 >= threshold).count();
            cand.truncate(keep.max(1));
        }
        Distribution {
            probs: softmax(&cand, p.temperature),
            tokens: cand.into_iter().map(|c| c.0).collect(),
            random: true,
        }
    }

    /// One draw from `dist`. Greedy choices use none of the random stream; a sampled one
    /// uses one number even with a single candidate (so seeded output stays as it was).
    pub fn draw(&mut self, dist: &Distribution) -> u32 {
        if !dist.random {
            return dist.tokens[0];
        }
        let r = self.rng.next_f64();
        dist.pick(r, None)
    }

    /// One draw from `dist` without `excluded`, renormalised: speculative sampling's
    /// residual after a rejected draft (the drafter's distribution being a point mass on
    /// `excluded`). `excluded` itself only when it is the only candidate.
    pub fn draw_excluding(&mut self, dist: &Distribution, excluded: u32) -> u32 {
        let rest = 1.0 - dist.prob(excluded);
        if rest <= 0.0 || dist.tokens.len() == 1 {
            return dist
                .tokens
                .iter()
                .copied()
                .find(|&t| t != excluded)
                .unwrap_or(excluded);
        }
        let r = self.rng.next_f64() * rest;
        dist.pick(r, Some(excluded))
    }

    /// Uniform in [0, 1) from the sampler's random stream.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }
}

/// The candidates a draw picks from, with their probabilities (summing to 1), most
/// likely first.
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    pub tokens: Vec<u32>,
    pub probs: Vec<f64>,
    /// Drawn with a random number (false for greedy's arg-max).
    random: bool,
}

impl Distribution {
    /// The probability of `token` (0 when it is cut).
    pub fn prob(&self, token: u32) -> f64 {
        self.tokens
            .iter()
            .position(|&t| t == token)
            .map_or(0.0, |i| self.probs[i])
    }

    /// The candidate where the running sum (skipping `excluded`) first passes `r`.
    fn pick(&self, r: f64, excluded: Option<u32>) -> u32 {
        let mut cum = 0.0;
        let mut last = self.tokens[0];
        for (&t, &pr) in self.tokens.iter().zip(&self.probs) {
            if Some(t) == excluded {
                continue;
            }
            cum += pr;
            last = t;
            if r < cum {
                return t;
            }
        }
        last
    }
}

/// Softmax of the candidates' logits divided by `temperature`, in f64.
fn softmax(cand: &[(u32, f32)], temperature: f32) -> Vec<f64> {
    let t = temperature as f64;
    let max = cand.iter().map(|c| c.1 as f64 / t).fold(f64::MIN, f64::max);
    let exps: Vec<f64> = cand.iter().map(|c| (c.1 as f64 / t - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_arg_max_and_the_lower_id_on_ties() {
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(s.sample(&[0.1, 2.0, 2.0, -1.0], &[]), 1);
    }

    #[test]
    fn only_plain_greedy_is_decided_by_the_arg_max() {
        assert!(SamplingParams::greedy().argmax_decides());
        assert!(!SamplingParams::default().argmax_decides());
        for p in [
            SamplingParams {
                repeat_penalty: 1.1,
                ..SamplingParams::greedy()
            },
            SamplingParams {
                presence_penalty: 0.5,
                ..SamplingParams::greedy()
            },
            SamplingParams {
                frequency_penalty: -0.5,
                ..SamplingParams::greedy()
            },
        ] {
            assert!(!p.argmax_decides(), "{p:?}");
        }
        // Where it says yes, sampling is the arg-max, NaN and ties included.
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        for row in [
            vec![f32::NAN, 1.0, 3.0, 3.0],
            vec![-0.0, 0.0],
            vec![f32::NAN; 3],
        ] {
            assert_eq!(s.sample(&row, &[1, 2]), argmax(&row));
        }
        assert_eq!(argmax(&[f32::NAN, 1.0, 3.0, 3.0]), 2);
    }

    #[test]
    fn repeat_penalty_follows_llama_cpp_signs() {
        let s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplingParams::greedy()
        })
        .unwrap();
        let mut l = vec![4.0, -4.0, 1.0];
        s.apply_penalties(&mut l, &[0, 1, 1]);
        assert_eq!(
            l,
            vec![4.0 / 2.0 - 0.5 - 0.25, -4.0 * 2.0 - 1.0 - 0.25, 1.0]
        );
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_reproduce() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let mut a = Sampler::new(SamplingParams {
            top_k: 1,
            temperature: 1.5,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(a.sample(&logits, &[]), argmax(&logits));
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams {
                seed,
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..Default::default()
            })
            .unwrap();
            (0..20).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn sampling_follows_the_softmax_distribution() {
        // Three tokens with probabilities 0.5, 0.3, 0.2 at temperature 1: frequencies over
        // 20,000 draws stay within 2% of them.
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 3,
            ..Default::default()
        })
        .unwrap();
        let mut counts = [0usize; 3];
        for _ in 0..20_000 {
            counts[s.sample(&logits, &[]) as usize] += 1;
        }
        for (c, p) in counts.iter().zip([0.5, 0.3, 0.2]) {
            assert!((*c as f64 / 20_000.0 - p).abs() < 0.02, "{counts:?}");
        }
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        let logits = [10.0f32, 9.0, 0.0, -5.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.2,
            seed: 1,
            ..Default::default()
        })
        .unwrap();
        for _ in 0..200 {
            assert!(s.sample(&logits, &[]) <= 1);
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        })
        .unwrap();
        for _ in 0..200 {
            assert_eq!(s.sample(&logits, &[]), 0);
        }
    }

    #[test]
    fn bad_parameters_are_refused() {
        for p in [
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            SamplingParams {
                min_p: 1.5,
                ..Default::default()
            },
            SamplingParams {
                repeat_penalty: 0.0,
                ..Default::default()
            },
            SamplingParams {
                presence_penalty: f32::NAN,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(p).is_err());
        }
    }
}
