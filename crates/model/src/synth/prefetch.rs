//! Tensors generated ahead of the writer on worker threads. Each tensor's bytes come
//! from its own random stream (seeded by the spec and its name), so generating several
//! at once changes nothing in the file; a 17 GB model then takes a fraction of the time.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::plan::PlannedTensor;
use super::{SynthSpec, fill_tensor};

type Job = JoinHandle<io::Result<Vec<u8>>>;

pub(super) struct Prefetcher {
    spec: Arc<SynthSpec>,
    tensors: Vec<Arc<PlannedTensor>>,
    /// Tensors being generated; the next to start is `next`.
    running: Mutex<(HashMap<usize, Job>, usize)>,
    window: usize,
}

impl Prefetcher {
    pub(super) fn new(spec: &SynthSpec, tensors: &[PlannedTensor]) -> Arc<Self> {
        let window = std::thread::available_parallelism().map_or(1, |n| n.get());
        Arc::new(Prefetcher {
            spec: Arc::new(spec.clone()),
            tensors: tensors.iter().cloned().map(Arc::new).collect(),
            running: Mutex::new((HashMap::new(), 0)),
            window,
        })
    }

    /// The bytes of tensor `i`, starting the generation of the next few meanwhile.
    /// Tensors must be taken in order (the writer does).
    pub(super) fn take(&self, i: usize) -> io::Result<Vec<u8>> {
        let job = {
            let mut guard = self
                .running
                .lock()
                .map_err(|_| io::Error::other("a synth worker panicked"))?;
            let (jobs, next) = &mut *guard;
            *next = (*next).max(i);
            while *next < self.tensors.len() && *next < i + self.window {
                let (spec, t) = (self.spec.clone(), self.tensors[*next].clone());
                jobs.insert(
                    *next,
                    std::thread::spawn(move || {
                        let mut out = Vec::new();
                        fill_tensor(&spec, &t, &mut out)?;
                        Ok(out)
                    }),
                );
                *next += 1;
            }
            jobs.remove(&i)
        };
        match job {
            Some(job) => job
                .join()
                .map_err(|_| io::Error::other("a synth worker panicked"))?,
            None => Err(io::Error::other(format!(
                "synth tensor {i} taken out of order"
            ))),
        }
    }
}
