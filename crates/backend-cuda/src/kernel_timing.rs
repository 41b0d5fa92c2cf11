//! Per-kernel device time for profiling (`STRATA_KERNEL_TIMING=1`): a pair of timing
//! events around every launch that is not being captured, summed per kernel when
//! [`KernelTiming::drain`] is called. Off by default: the events cost a few µs a launch.

use std::sync::Mutex;

use cudarc::driver::sys;
use strata_core::{KernelId, KernelTime, Result};

use crate::driver::check;

/// Events of launches not yet summed: (kernel, start, end) as raw `CUevent`s.
#[derive(Default)]
pub(crate) struct KernelTiming {
    pending: Mutex<Vec<(KernelId, usize, usize)>>,
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
    pub(crate) fn from_env() -> Option<Self> {
        std::env::var("STRATA_KERNEL_TIMING")
            .is_ok_and(|v| v == "1")
            .then(Self::default)
    }

    /// Records the start event of a launch on `s` (None inside a capture).
    pub(crate) fn start(&self, s: sys::CUstream) -> Result<Option<usize>> {
        if is_capturing(s) {
            return Ok(None);
        }
        let e = timing_event()?;
        // SAFETY: valid event and stream.
        check("cuEventRecord", unsafe { sys::cuEventRecord(e, s) })?;
        Ok(Some(e as usize))
    }

    /// Records the end event of the launch that `start` began.
    pub(crate) fn end(&self, kernel: KernelId, start: usize, s: sys::CUstream) -> Result<()> {
        let e = timing_event()?;
        // SAFETY: valid event and stream.
        check("cuEventRecord", unsafe { sys::cuEventRecord(e, s) })?;
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((kernel, start, e as usize));
        Ok(())
    }

    /// Waits for the recorded launches and returns their time per kernel, most first.
    pub(crate) fn drain(&self) -> Result<Vec<KernelTime>> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let mut out: Vec<KernelTime> = Vec::new();
        let mut first_err = None;
        for (kernel, start, end) in pending {
            let (a, b) = (start as sys::CUevent, end as sys::CUevent);
            let mut ms = 0f32;
            // SAFETY: events this module created and recorded; destroyed once, here.
            let r = unsafe {
                check("cuEventSynchronize", sys::cuEventSynchronize(b)).and_then(|_| {
                    check(
                        "cuEventElapsedTime",
                        sys::cuEventElapsedTime_v2(&mut ms, a, b),
                    )
                })
            };
            unsafe {
                sys::cuEventDestroy_v2(a);
                sys::cuEventDestroy_v2(b);
            }
            match r {
                Ok(()) => match out.iter_mut().find(|t| t.kernel == kernel) {
                    Some(t) => {
                        t.launches += 1;
                        t.seconds += f64::from(ms) / 1e3;
                    }
                    None => out.push(KernelTime {
                        kernel,
                        launches: 1,
                        seconds: f64::from(ms) / 1e3,
                    }),
                },
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        Ok(out)
    }
}
