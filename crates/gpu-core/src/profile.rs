//! Per-operation timing of eager passes: with profiling on, every kernel launch and every GEMM is
//! bracketed by two CUDA events on the compute stream, and [`Device::profile_end`] adds up the
//! elapsed times per operation label (kernel name and grid, or GEMM shape). What a tower's pass
//! spends where, for the speed work (issue 21). Launches made while the stream captures a CUDA
//! graph are not recorded (a captured event has no time), so profile with graphs off.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::sys::{CUevent_flags, CUstreamCaptureStatus};
use cudarc::driver::CudaEvent;

use crate::{Device, Result};

/// Time spent in one kind of operation during a profiled span.
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    /// What ran: `gemm m×n×k` (`+C` when it accumulated into its output) or a kernel's name with
    /// its grid, which tells a kernel's shapes apart.
    pub label: String,
    /// How many times it ran.
    pub calls: usize,
    /// Total GPU time between its bracketing events, in milliseconds.
    pub ms: f64,
}

/// One bracketed operation, its stop event still to be recorded.
pub(crate) struct Open {
    label: String,
    start: CudaEvent,
}

/// The events recorded since [`Device::profile_begin`]: (label, start, stop), in launch order.
/// `on` is read by every launch; the list is locked only while a profile is recorded.
#[derive(Default)]
pub(crate) struct Recorder {
    on: AtomicBool,
    spans: Mutex<Option<Vec<(String, CudaEvent, CudaEvent)>>>,
}

impl Recorder {
    fn spans(&self) -> MutexGuard<'_, Option<Vec<(String, CudaEvent, CudaEvent)>>> {
        // a panic elsewhere while the lock was held leaves at worst a half-filled list
        self.spans.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Device {
    /// Starts recording every launch and GEMM of this device (forgets an earlier unfinished span).
    pub fn profile_begin(&self) {
        *self.prof.spans() = Some(Vec::new());
        self.prof.on.store(true, Ordering::Release);
    }

    /// Whether a profile is being recorded.
    pub fn profiling(&self) -> bool {
        self.prof.on.load(Ordering::Acquire)
    }

    /// Stops recording, waits for the stream and returns the time per operation label, largest
    /// first. Empty when nothing was recorded (or [`Device::profile_begin`] was not called).
    pub fn profile_end(&self) -> Result<Vec<OpTime>> {
        self.prof.on.store(false, Ordering::Release);
        let Some(spans) = self.prof.spans().take() else {
            return Ok(Vec::new());
        };
        self.stream.synchronize()?;
        let mut out: Vec<OpTime> = Vec::new();
        for (label, start, stop) in spans {
            let ms = start.elapsed_ms(&stop)? as f64;
            match out.iter_mut().find(|o| o.label == label) {
                Some(o) => {
                    o.calls += 1;
                    o.ms += ms;
                }
                None => out.push(OpTime {
                    label,
                    calls: 1,
                    ms,
                }),
            }
        }
        out.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        Ok(out)
    }

    /// Records the start of an operation when profiling is on and the stream is not capturing;
    /// `label` is only evaluated then.
    pub(crate) fn prof_open(&self, label: impl FnOnce() -> String) -> Result<Option<Open>> {
        if !self.prof.on.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if self.stream.capture_status()? != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(None);
        }
        let start = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(&self.stream)?;
        Ok(Some(Open {
            label: label(),
            start,
        }))
    }

    /// Records the end of an operation [`Device::prof_open`] started (nothing for `None`).
    pub(crate) fn prof_close(&self, open: Option<Open>) -> Result<()> {
        let Some(Open { label, start }) = open else {
            return Ok(());
        };
        let stop = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        stop.record(&self.stream)?;
        if let Some(spans) = self.prof.spans().as_mut() {
            spans.push((label, start, stop));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::gpu_tests::{dev, to_bf, Rng};
    use crate::*;

    #[test]
    #[ignore = "needs a CUDA device"]
    fn profile_counts_launches_and_gemms() {
        let d = dev();
        let mut r = Rng::new(5);
        let (m, n, k) = (256usize, 512usize, 128usize);
        let x = d.upload(&to_bf(&r.vec(m * k, 1.0))).unwrap();
        let w = d.upload(&to_bf(&r.vec(n * k, 0.1))).unwrap();
        let mut y = d.upload(&vec![0.0f32; m * n]).unwrap();
        let mut yb = d.upload(&vec![bf16::from_f32(0.0); m * n]).unwrap();
        let gemm = |y: &mut DeviceBuffer<f32>| {
            d.gemm(
                GemmInputs::Bf16 { x: &x, w: &w },
                None,
                GemmOutput::F32(y),
                GemmShape::dense(m, n, k),
                Epilogue::None,
            )
        };
        gemm(&mut y).unwrap(); // plans (and tunes) the shape outside the profile
        assert!(
            d.profile_end().unwrap().is_empty(),
            "nothing recorded before profile_begin"
        );
        d.profile_begin();
        assert!(d.profiling());
        gemm(&mut y).unwrap();
        gemm(&mut y).unwrap();
        d.cast_f32_bf16(&y, &mut yb).unwrap();
        let ops = d.profile_end().unwrap();
        println!("PROFILE {ops:?}");
        assert!(!d.profiling());
        assert_eq!(ops.len(), 2, "{ops:?}");
        let g = ops
            .iter()
            .find(|o| o.label == "gemm 256×512×128")
            .expect("the gemm");
        assert_eq!(g.calls, 2);
        let c = ops
            .iter()
            .find(|o| o.label.starts_with("cast_f32_bf16 grid "))
            .expect("the cast");
        assert_eq!(c.calls, 1);
        assert!(ops.iter().all(|o| o.ms > 0.0 && o.ms < 1e3), "{ops:?}");
        gemm(&mut y).unwrap();
        assert!(
            d.profile_end().unwrap().is_empty(),
            "nothing recorded after profile_end"
        );
    }
}
