//! Per-function device time for profiling (`STRATA_KERNEL_TIMING=1`): a pair of timing
//! events around every launch, summed per function (a kernel or the variant that ran) when
//! [`KernelTiming::drain`] is called.
//! Off by default: the events cost a few µs a launch.
//!
//! Eager launches: the pair brackets the kernel, and also any wait for the host to submit
//! it (small kernels then show the host's launch rate). Launches inside a graph capture:
//! the events become event-record nodes of the graph (CU_EVENT_RECORD_EXTERNAL), so each
//! replay re-records them and `drain` reports the last replay of the graph replayed last,
//! kernel by kernel as the device ran it (each graph keeps its own events: a verify
//! window's graph and the decode step's are told apart). Those events are never destroyed
//! (a graph holding them may replay later); profiling runs only.

use std::sync::Mutex;

use cudarc::driver::sys;
use strata_core::{KernelId, KernelTime, Result};

use crate::driver::check;

/// One launch's timing events: (kernel, function, start, end), the events as raw
/// `CUevent`s.
type EventPair = (KernelId, &'static str, usize, usize);

/// Events of launches not yet summed ([`EventPair`]s).
#[derive(Default)]
pub(crate) struct KernelTiming {
    pending: Mutex<Vec<EventPair>>,
    /// Event pairs inside the latest capture (replaced when a new capture begins).
    captured: Mutex<Captured>,
}

#[derive(Default)]
struct Captured {
    /// Event pairs of the capture under way (or of the latest, until it is instantiated).
    events: Vec<EventPair>,
    /// Whether the previous launch was captured: a captured launch after an eager one
    /// begins a new capture.
    capturing: bool,
    /// Each instantiated graph's event pairs, by its executable's handle.
    graphs: Vec<(u64, Vec<EventPair>)>,
    /// The graph replayed last.
    replayed: Option<u64>,
}

fn timing_event() -> Result<sys::CUevent> {
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: writes the event handle; default flags keep timing enabled.
    check("cuEventCreate", unsafe { sys::cuEventCreate(&mut e, 0) })?;
    Ok(e)
}

fn is_capturing(s: sys::CUstream) -> bool {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid stream; writes the status.
    let r = unsafe { sys::cuStreamIsCapturing(s, &mut status) };
    r != sys::CUresult::CUDA_SUCCESS
        || status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

impl KernelTiming {
    /// Whether `STRATA_KERNEL_TIMING=1` asks for it.
    pub(crate) fn enabled_by_env() -> bool {
        std::env::var("STRATA_KERNEL_TIMING").is_ok_and(|v| v == "1")
    }

    /// Records the start event of a launch on `s`.
    pub(crate) fn start(&self, s: sys::CUstream) -> Result<Option<usize>> {
        let capturing = is_capturing(s);
        {
            let mut c = self.captured.lock().unwrap_or_else(|e| e.into_inner());
            if capturing && !c.capturing {
                c.events.clear();
            }
            c.capturing = capturing;
        }
        Ok(Some(record(s, capturing)?))
    }

    /// Records the end event of the launch that `start` began.
    pub(crate) fn end(
        &self,
        kernel: KernelId,
        function: &'static str,
        start: usize,
        s: sys::CUstream,
    ) -> Result<()> {
        let capturing = is_capturing(s);
        let e = record(s, capturing)?;
        if capturing {
            let mut c = self.captured.lock().unwrap_or_else(|e| e.into_inner());
            c.events.push((kernel, function, start, e));
        } else {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.push((kernel, function, start, e));
        }
        Ok(())
    }

    /// The capture that recorded the latest event pairs became graph `exec`.
    pub(crate) fn captured_as(&self, exec: u64) {
        let mut c = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        let events = std::mem::take(&mut c.events);
        c.graphs.retain(|(g, _)| *g != exec);
        c.graphs.push((exec, events));
    }

    /// Graph `exec` was launched.
    pub(crate) fn replayed(&self, exec: u64) {
        self.captured
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replayed = Some(exec);
    }

    /// Graph `exec` was destroyed (its handle may be reused by a later graph).
    pub(crate) fn destroyed(&self, exec: u64) {
        let mut c = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        c.graphs.retain(|(g, _)| *g != exec);
        if c.replayed == Some(exec) {
            c.replayed = None;
        }
    }

    /// Waits for the recorded launches and returns their time per kernel, most first:
    /// the eager launches since the last call, else the last replay of the graph
    /// replayed last.
    pub(crate) fn drain(&self) -> Result<Vec<KernelTime>> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if pending.is_empty() {
            return Ok(self.last_replay());
        }
        let mut out: Vec<KernelTime> = Vec::new();
        let mut first_err = None;
        for (kernel, function, start, end) in pending {
            let r = elapsed_ms(start, end);
            // SAFETY: events this module created and recorded; destroyed once, here.
            unsafe {
                sys::cuEventDestroy_v2(start as sys::CUevent);
                sys::cuEventDestroy_v2(end as sys::CUevent);
            }
            match r {
                Ok(ms) => add(&mut out, kernel, function, ms, false),
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        Ok(out)
    }

    /// Per kernel, what the last replay of the graph replayed last took (nothing when no
    /// graph has been replayed).
    fn last_replay(&self) -> Vec<KernelTime> {
        let c = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<KernelTime> = Vec::new();
        let events = c
            .replayed
            .and_then(|r| c.graphs.iter().find(|(g, _)| *g == r))
            .map_or(&[][..], |(_, e)| &e[..]);
        for &(kernel, function, start, end) in events {
            // A pair no replay has recorded yet fails the query and is skipped.
            if let Ok(ms) = elapsed_ms(start, end) {
                add(&mut out, kernel, function, ms, true);
            }
        }
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        out
    }
}

/// Milliseconds between two recorded events of this module (waits for the second).
fn elapsed_ms(start: usize, end: usize) -> Result<f32> {
    let (a, b) = (start as sys::CUevent, end as sys::CUevent);
    let mut ms = 0f32;
    // SAFETY: events this module created; writes one float.
    unsafe {
        check("cuEventSynchronize", sys::cuEventSynchronize(b))?;
        check(
            "cuEventElapsedTime",
            sys::cuEventElapsedTime_v2(&mut ms, a, b),
        )?;
    }
    Ok(ms)
}

/// Adds one launch of `kernel` (as `function`) taking `ms` to the per-function sums.
fn add(
    out: &mut Vec<KernelTime>,
    kernel: KernelId,
    function: &'static str,
    ms: f32,
    one_replay: bool,
) {
    let seconds = f64::from(ms) / 1e3;
    match out
        .iter_mut()
        .find(|t| t.kernel == kernel && t.function == function)
    {
        Some(t) => {
            t.launches += 1;
            t.seconds += seconds;
        }
        None => out.push(KernelTime {
            kernel,
            function,
            launches: 1,
            seconds,
            one_replay,
        }),
    }
}

/// A new timing event recorded on `s`; inside a capture, as a node of the graph.
fn record(s: sys::CUstream, capturing: bool) -> Result<usize> {
    let e = timing_event()?;
    if capturing {
        let external = sys::CUevent_record_flags_enum::CU_EVENT_RECORD_EXTERNAL as u32;
        // SAFETY: valid event and stream (in capture: becomes an event-record node).
        check("cuEventRecordWithFlags", unsafe {
            sys::cuEventRecordWithFlags(e, s, external)
        })?;
    } else {
        // SAFETY: valid event and stream.
        check("cuEventRecord", unsafe { sys::cuEventRecord(e, s) })?;
    }
    Ok(e as usize)
}
