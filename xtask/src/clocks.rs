//! The card's SM clock, power draw and clock-event reasons, sampled through NVML on a thread while
//! `xtask bench` runs. Each timed window (ours, PyTorch's eager and compiled runs, the GEMM
//! ceilings) then says at what clock it ran: an H200 at its 700 W limit drops from 1980 MHz to
//! ~1600 MHz during a long GEMM-heavy case, so a ceiling measured in a short burst overstates what
//! the same card sustains (docs/PERF.md, v0.13).
//!
//! NVML is loaded at run time (`libnvidia-ml.so.1`, part of the driver); where it is missing (no
//! GPU, CI) the sampler is simply absent and the report prints "—".

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time between two samples. NVML's clock query costs tens of µs; 20 ms gives a batch-1 case
/// (40 runs of ~8 ms) about 15 samples.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(20);

/// `nvmlClockType_t::NVML_CLOCK_SM` (nvml.h).
const NVML_CLOCK_SM: u32 = 1;
/// `nvmlClocksEventReasonSwPowerCap` (nvml.h): the driver lowers clocks to stay within the power limit.
pub const REASON_SW_POWER_CAP: u64 = 0x4;
/// The other slowdowns of nvml.h (`HwSlowdown` 0x8, `SwThermalSlowdown` 0x20, `HwThermalSlowdown`
/// 0x40, `HwPowerBrakeSlowdown` 0x80): thermal or external limits, not the power limit.
pub const REASONS_OTHER_SLOWDOWN: u64 = 0x8 | 0x20 | 0x40 | 0x80;

/// Seconds since the Unix epoch: the time base both sides share (PyTorch's `time.time()`).
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One reading of the card.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When it was read (Unix seconds).
    pub t: f64,
    /// SM clock (MHz).
    pub sm_mhz: u32,
    /// Power draw (W, NVML's averaged reading).
    pub power_w: f64,
    /// The clock-event reason bits (nvml.h `nvmlClocksEventReason*`).
    pub reasons: u64,
}

/// What the samples inside one window say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockStats {
    /// Samples in the window.
    pub samples: usize,
    /// Mean SM clock (MHz).
    pub mean_mhz: f64,
    /// Lowest SM clock (MHz).
    pub min_mhz: u32,
    /// Mean power draw (W).
    pub mean_w: f64,
    /// Share of samples with the power-cap reason set (0..=1).
    pub power_capped: f64,
    /// Share of samples with a thermal or hardware slowdown set (0..=1).
    pub other_slowdown: f64,
}

/// The statistics of the samples in `[t0, t1]`; `None` when none fell inside (a window from an
/// earlier run, or no sampler).
pub fn window_stats(samples: &[Sample], t0: f64, t1: f64) -> Option<ClockStats> {
    let w: Vec<&Sample> = samples.iter().filter(|s| s.t >= t0 && s.t <= t1).collect();
    if w.is_empty() {
        return None;
    }
    let n = w.len() as f64;
    let share = |mask: u64| w.iter().filter(|s| s.reasons & mask != 0).count() as f64 / n;
    Some(ClockStats {
        samples: w.len(),
        mean_mhz: w.iter().map(|s| f64::from(s.sm_mhz)).sum::<f64>() / n,
        min_mhz: w.iter().map(|s| s.sm_mhz).min().unwrap_or(0),
        mean_w: w.iter().map(|s| s.power_w).sum::<f64>() / n,
        power_capped: share(REASON_SW_POWER_CAP),
        other_slowdown: share(REASONS_OTHER_SLOWDOWN),
    })
}

/// A window's statistics as a table cell: `1616 MHz (min 1590), capped 100 %, 691 W`.
pub fn cell(s: Option<ClockStats>) -> String {
    match s {
        None => "—".into(),
        Some(s) => format!(
            "{:.0} MHz (min {}), capped {:.0} %{}, {:.0} W",
            s.mean_mhz,
            s.min_mhz,
            100.0 * s.power_capped,
            if s.other_slowdown > 0.0 {
                format!(" + other slowdowns {:.0} %", 100.0 * s.other_slowdown)
            } else {
                String::new()
            },
            s.mean_w
        ),
    }
}

/// The cell for window `w` of `samples` (`—` without a window or samples in it).
pub fn window_cell(samples: &[Sample], w: Option<(f64, f64)>) -> String {
    cell(w.and_then(|(t0, t1)| window_stats(samples, t0, t1)))
}

/// The NVML entry points the sampler calls, resolved from the loaded library.
struct Nvml {
    _lib: libloading::Library,
    device: *mut c_void,
    clock: unsafe extern "C" fn(*mut c_void, u32, *mut u32) -> i32,
    power: unsafe extern "C" fn(*mut c_void, *mut u32) -> i32,
    reasons: unsafe extern "C" fn(*mut c_void, *mut u64) -> i32,
    shutdown: unsafe extern "C" fn() -> i32,
}

impl Nvml {
    /// Loads NVML and opens device 0 (the lent machines have one card; on a host with several,
    /// NVML's index 0 need not be CUDA's device 0).
    fn open() -> Result<Self, String> {
        // SAFETY: loading the driver's NVML runs its initialisers, which have no preconditions.
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }
            .map_err(|e| format!("no NVML ({e})"))?;
        macro_rules! sym {
            ($t:ty, $($name:literal),+) => {{
                let mut found: Option<$t> = None;
                $(
                    if found.is_none() {
                        // SAFETY: the symbol's C signature (nvml.h) is the type named here.
                        found = unsafe { lib.get::<$t>($name) }.ok().map(|s| *s);
                    }
                )+
                found.ok_or_else(|| format!("NVML lacks {}", stringify!($($name),+)))?
            }};
        }
        let init = sym!(unsafe extern "C" fn() -> i32, b"nvmlInit_v2\0");
        let by_index = sym!(
            unsafe extern "C" fn(u32, *mut *mut c_void) -> i32,
            b"nvmlDeviceGetHandleByIndex_v2\0"
        );
        let clock = sym!(
            unsafe extern "C" fn(*mut c_void, u32, *mut u32) -> i32,
            b"nvmlDeviceGetClockInfo\0"
        );
        let power = sym!(
            unsafe extern "C" fn(*mut c_void, *mut u32) -> i32,
            b"nvmlDeviceGetPowerUsage\0"
        );
        let reasons = sym!(
            unsafe extern "C" fn(*mut c_void, *mut u64) -> i32,
            b"nvmlDeviceGetCurrentClocksEventReasons\0",
            b"nvmlDeviceGetCurrentClocksThrottleReasons\0"
        );
        let shutdown = sym!(unsafe extern "C" fn() -> i32, b"nvmlShutdown\0");
        // SAFETY: nvmlInit_v2 takes no arguments; it returns a status.
        let rc = unsafe { init() };
        if rc != 0 {
            return Err(format!("nvmlInit_v2 returned {rc}"));
        }
        let mut device = std::ptr::null_mut();
        // SAFETY: `device` is a valid out-pointer for the handle.
        let rc = unsafe { by_index(0, &mut device) };
        if rc != 0 {
            // SAFETY: NVML was initialised above.
            unsafe { shutdown() };
            return Err(format!("nvmlDeviceGetHandleByIndex_v2(0) returned {rc}"));
        }
        Ok(Self {
            _lib: lib,
            device,
            clock,
            power,
            reasons,
            shutdown,
        })
    }

    /// One reading; `None` when NVML reports an error for the clock.
    fn read(&self) -> Option<Sample> {
        let (mut mhz, mut mw, mut bits) = (0u32, 0u32, 0u64);
        // SAFETY: the handle came from nvmlDeviceGetHandleByIndex_v2 on an initialised NVML, and
        // every out-pointer is a live local.
        let ok = unsafe { (self.clock)(self.device, NVML_CLOCK_SM, &mut mhz) } == 0;
        // SAFETY: as above.
        let power_ok = unsafe { (self.power)(self.device, &mut mw) } == 0;
        // SAFETY: as above.
        let reasons_ok = unsafe { (self.reasons)(self.device, &mut bits) } == 0;
        ok.then(|| Sample {
            t: unix_now(),
            sm_mhz: mhz,
            power_w: if power_ok {
                f64::from(mw) / 1e3
            } else {
                f64::NAN
            },
            reasons: if reasons_ok { bits } else { 0 },
        })
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: NVML was initialised in `open`; the library is still loaded (`_lib` drops after).
        unsafe { (self.shutdown)() };
    }
}

/// The sampling thread and what it has read so far.
pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling device 0 every [`SAMPLE_INTERVAL`]; `Err` says why not (no NVML, no device).
    pub fn start() -> Result<Self, String> {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, opened) = mpsc::channel();
        let (s, st) = (samples.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            // NVML's handle is a raw pointer: it lives and dies on this thread.
            let nvml = match Nvml::open() {
                Ok(n) => {
                    let _ = ready.send(Ok(()));
                    n
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            while !st.load(Ordering::Relaxed) {
                if let Some(x) = nvml.read() {
                    if let Ok(mut v) = s.lock() {
                        v.push(x);
                    }
                }
                std::thread::sleep(SAMPLE_INTERVAL);
            }
        });
        match opened.recv() {
            Ok(Ok(())) => Ok(Self {
                samples,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err("the NVML sampling thread ended before it opened NVML".into()),
        }
    }

    /// A copy of every sample so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: f64, mhz: u32, w: f64, reasons: u64) -> Sample {
        Sample {
            t,
            sm_mhz: mhz,
            power_w: w,
            reasons,
        }
    }

    #[test]
    fn window_takes_only_its_samples_and_counts_reasons() {
        let v = [
            s(1.0, 1980, 300.0, 0),
            s(2.0, 1700, 690.0, REASON_SW_POWER_CAP),
            s(3.0, 1600, 700.0, REASON_SW_POWER_CAP | 0x1),
            s(4.0, 1900, 500.0, 0x40),
            s(5.0, 345, 70.0, 0x1),
        ];
        let w = window_stats(&v, 2.0, 4.0).expect("three samples");
        assert_eq!(w.samples, 3);
        assert!((w.mean_mhz - 5200.0 / 3.0).abs() < 1e-3, "{w:?}");
        assert_eq!(w.min_mhz, 1600);
        assert!((w.mean_w - 630.0).abs() < 1e-9);
        assert!((w.power_capped - 2.0 / 3.0).abs() < 1e-12);
        assert!((w.other_slowdown - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(window_stats(&v, 6.0, 9.0), None);
    }

    #[test]
    fn cell_names_clock_cap_and_power() {
        let v = [s(1.0, 1616, 691.4, REASON_SW_POWER_CAP)];
        assert_eq!(
            cell(window_stats(&v, 0.0, 2.0)),
            "1616 MHz (min 1616), capped 100 %, 691 W"
        );
        assert_eq!(cell(None), "—");
        assert_eq!(window_cell(&v, None), "—");
        assert_eq!(window_cell(&v, Some((3.0, 4.0))), "—");
        assert_eq!(
            window_cell(&v, Some((0.0, 2.0))),
            cell(window_stats(&v, 0.0, 2.0))
        );
    }

    #[test]
    fn sampler_without_nvml_says_why() {
        // On a machine with a driver this samples; without one it must fail with a reason, not panic.
        match Sampler::start() {
            Ok(sm) => {
                std::thread::sleep(SAMPLE_INTERVAL * 3);
                let v = sm.samples();
                assert!(!v.is_empty(), "a running sampler read nothing");
                assert!(v.iter().all(|x| x.sm_mhz > 0));
            }
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
