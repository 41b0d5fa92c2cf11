//! Graph capture and replay. A captured graph remembers every buffer it reads and
//! writes; replaying it orders it like a launch of all of them. Capture refuses host
//! synchronisation, uploads, downloads and allocation.

use std::sync::Arc;

use crate::backend::RawGraph;
use crate::buffer::BufferState;
use crate::device::{Capture, Deferred, Device, Inner, Stream};
use crate::error::{Error, Result};
use crate::kernel::Access;

/// A captured sequence of launches and device copies on one stream.
pub struct Graph {
    inner: Arc<Inner>,
    raw: Option<RawGraph>,
    /// Each buffer once, with the union of its accesses. Holding them keeps them alive:
    /// a table a graph reads is updated in place, never reallocated.
    accesses: Vec<(Arc<BufferState>, Access)>,
    /// The stream of the latest replay, so destruction waits for it.
    last_fence: Option<crate::fence::Fence>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({} buffers)", self.accesses.len())
    }
}

impl Graph {
    /// How many distinct buffers the graph reads or writes.
    pub fn buffer_count(&self) -> usize {
        self.accesses.len()
    }
}

impl Device {
    /// Captures what `record` queues on `stream` into a graph. Only launches and device
    /// copies on `stream` are allowed inside; anything else fails the capture.
    #[track_caller]
    pub fn capture<F>(&self, stream: Stream, record: F) -> Result<Graph>
    where
        F: FnOnce(&Device) -> Result<()>,
    {
        let site = std::panic::Location::caller();
        self.inner.check_stream(stream, site)?;
        {
            let mut st = self.inner.lock();
            if let Some(c) = &st.capture {
                return Err(Error::Capture(format!(
                    "stream {} is already capturing; one capture at a time (at {site})",
                    c.stream
                )));
            }
            let raw = st.streams[stream.index as usize].raw;
            let pre_event = self.inner.backend.record_event(raw)?;
            if let Err(e) = self.inner.backend.begin_capture(raw) {
                self.inner.backend.destroy_event(pre_event);
                return Err(e);
            }
            st.capture = Some(Capture {
                stream: stream.index,
                pre_event,
                accesses: Vec::new(),
            });
        }
        let recorded = record(self);
        let mut st = self.inner.lock();
        let raw_stream = st.streams[stream.index as usize].raw;
        let ended = self.inner.backend.end_capture(raw_stream);
        let cap = st.capture.take();
        drop(st);
        let cap = cap.ok_or_else(|| Error::Capture("capture state lost".into()))?;
        self.inner.backend.destroy_event(cap.pre_event);
        let raw = match (recorded, ended) {
            (Ok(()), Ok(g)) => g,
            (Err(e), Ok(g)) => {
                self.inner.backend.destroy_graph(g);
                return Err(e);
            }
            (Err(e), Err(_)) | (Ok(()), Err(e)) => return Err(e),
        };
        let mut accesses: Vec<(Arc<BufferState>, Access)> = Vec::new();
        for (b, a) in cap.accesses {
            match accesses.iter_mut().find(|(x, _)| Arc::ptr_eq(x, &b)) {
                Some((_, acc)) => {
                    if *acc != a {
                        *acc = Access::ReadWrite;
                    }
                }
                None => accesses.push((b, a)),
            }
        }
        Ok(Graph {
            inner: self.inner.clone(),
            raw: Some(raw),
            accesses,
            last_fence: None,
        })
    }

    /// Replays `graph` on `stream`, after every conflicting access of the buffers it
    /// recorded, exactly as a launch would be ordered.
    #[track_caller]
    pub fn replay(&self, graph: &mut Graph, stream: Stream) -> Result<()> {
        let site = std::panic::Location::caller();
        self.inner.check_stream(stream, site)?;
        if !Arc::ptr_eq(&graph.inner, &self.inner) {
            return Err(Error::ForeignBuffer { site });
        }
        let raw = graph
            .raw
            .ok_or_else(|| Error::Capture("graph was already destroyed".into()))?;
        let mut st = self.inner.lock();
        self.inner
            .refuse_during_capture(&st, "graph replay", site)?;
        self.inner.order(&mut st, stream.index, &graph.accesses)?;
        let raw_stream = st.streams[stream.index as usize].raw;
        self.inner.backend.replay(raw, raw_stream, site)?;
        let fence = self.inner.complete(&mut st, stream.index, &graph.accesses);
        graph.last_fence = Some(fence);
        Ok(())
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            let fences = self.last_fence.into_iter().collect();
            self.inner.defer(Deferred::Graph(raw), fences);
        }
    }
}
