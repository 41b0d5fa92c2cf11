//! Parked conversations: the contexts (K/V + tokens) of finished requests, kept so that a
//! follow-up whose prompt starts with the same tokens feeds only what is new.

use strata_engine::Context;

/// At most `slots` idle contexts, least recently used first.
pub struct ParkedContexts {
    slots: usize,
    /// Oldest first; a context is taken out while a request uses it.
    parked: Vec<Context>,
}

/// A context to serve a request with, and how many of its tokens are reused.
pub struct Taken {
    pub ctx: Option<Context>,
    pub reused: usize,
}

/// How many leading tokens two sequences share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl ParkedContexts {
    pub fn new(slots: usize) -> Self {
        ParkedContexts {
            slots,
            parked: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.parked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }

    /// The parked context sharing the longest prefix with `prompt`, truncated to that
    /// prefix (at most `prompt.len() - 1`, so one token is left to feed). Without a shared
    /// prefix: the least recently used context emptied (its buffers reused) once every slot
    /// is full, else none (the caller makes a new one).
    pub fn take(&mut self, prompt: &[u32]) -> Taken {
        let best = self
            .parked
            .iter()
            .enumerate()
            .map(|(i, c)| (i, common_prefix(c.tokens(), prompt)))
            .max_by_key(|&(i, n)| (n, i));
        let limit = prompt.len().saturating_sub(1);
        match best {
            Some((i, n)) if n > 0 && limit > 0 => {
                let mut ctx = self.parked.remove(i);
                let reused = n.min(limit);
                ctx.truncate(reused);
                Taken {
                    ctx: Some(ctx),
                    reused,
                }
            }
            _ if self.parked.len() >= self.slots && !self.parked.is_empty() => {
                let mut ctx = self.parked.remove(0);
                ctx.truncate(0);
                Taken {
                    ctx: Some(ctx),
                    reused: 0,
                }
            }
            _ => Taken {
                ctx: None,
                reused: 0,
            },
        }
    }

    /// Parks `ctx` as the most recently used, dropping the oldest past the limit.
    pub fn park(&mut self, ctx: Context) {
        if self.slots == 0 {
            return;
        }
        self.parked.push(ctx);
        while self.parked.len() > self.slots {
            self.parked.remove(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::common_prefix;

    #[test]
    fn common_prefix_counts_shared_leading_tokens() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[5], &[1]), 0);
    }
}
