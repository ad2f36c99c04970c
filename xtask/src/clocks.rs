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
    /// The card's energy counter (mJ since the driver loaded; `nvmlDeviceGetTotalEnergyConsumption`),
    /// `None` where NVML does not report it.
    pub energy_mj: Option<u64>,
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
    /// Mean power over the window from the energy counter (W; see `counter_power`): energy over
    /// time, where `mean_w` is NVML's 1 s running average of the draw; `None` when the counter did
    /// not step twice [`MIN_COUNTER_SPAN_S`] apart inside the window.
    pub energy_w: Option<f64>,
}

impl ClockStats {
    /// The window's power (W): the energy counter's where there is one, else NVML's averaged reading.
    pub fn power_w(&self) -> f64 {
        self.energy_w.unwrap_or(self.mean_w)
    }

    /// Joules per image of a run of `ms` milliseconds over `images` images at this window's
    /// counter power.
    pub fn joules_per_image(&self, ms: f64, images: usize) -> Option<f64> {
        let w = self.energy_w?;
        (images > 0).then(|| w * ms / 1e3 / images as f64)
    }
}

/// Shortest timed window `xtask bench` (and torch_anchor.py's `ENERGY_WINDOW_S`) holds open, with
/// more untimed runs of the same work where the timed ones end sooner, so that the energy counter
/// steps often enough inside it (see [`MIN_COUNTER_SPAN_S`]).
pub const ENERGY_WINDOW_S: f64 = 1.0;

/// Shortest span between the first and the last counter update a window's power is read from:
/// the counter moves in steps (every 100 ms on an H100), and an update is seen up to one sample
/// interval late, so the span's error is about ±[`SAMPLE_INTERVAL`] — ±10 % at this span, less on
/// longer windows.
const MIN_COUNTER_SPAN_S: f64 = 0.25;

/// Mean power (W) of the energy counter between its first and its last update inside the window
/// (a sample whose reading differs from the one before it): the energy of the whole steps between
/// them over their time. `None` without two updates [`MIN_COUNTER_SPAN_S`] apart.
fn counter_power(w: &[&Sample]) -> Option<f64> {
    let readings: Vec<(f64, u64)> = w
        .iter()
        .filter_map(|s| s.energy_mj.map(|e| (s.t, e)))
        .collect();
    let mut updates = readings
        .windows(2)
        .filter(|p| p[1].1 != p[0].1)
        .map(|p| p[1]);
    let first = updates.next()?;
    let last = updates.next_back()?;
    let dt = last.0 - first.0;
    (dt >= MIN_COUNTER_SPAN_S && last.1 >= first.1).then(|| (last.1 - first.1) as f64 / 1e3 / dt)
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
        energy_w: counter_power(&w),
    })
}

/// A window's statistics as a table cell: `1616 MHz (min 1590), capped 100 %, 691 W` (the power
/// from the energy counter where there is one, else NVML's averaged reading).
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
            s.power_w()
        ),
    }
}

/// Joules per image of a run of `ms` over `images` images inside window `w` of `samples`.
pub fn window_joules(
    samples: &[Sample],
    w: Option<(f64, f64)>,
    ms: Option<f64>,
    images: usize,
) -> Option<f64> {
    let (t0, t1) = w?;
    window_stats(samples, t0, t1)?.joules_per_image(ms?, images)
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
    energy: Option<unsafe extern "C" fn(*mut c_void, *mut u64) -> i32>,
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
        // SAFETY: the symbol's C signature (nvml.h: device, unsigned long long *energy) is this type.
        let energy = unsafe {
            lib.get::<unsafe extern "C" fn(*mut c_void, *mut u64) -> i32>(
                b"nvmlDeviceGetTotalEnergyConsumption\0",
            )
        }
        .ok()
        .map(|s| *s);
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
            energy,
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
        let mut mj = 0u64;
        // SAFETY: as above.
        let energy_ok = self
            .energy
            .is_some_and(|f| unsafe { f(self.device, &mut mj) } == 0);
        ok.then(|| Sample {
            t: unix_now(),
            sm_mhz: mhz,
            power_w: if power_ok {
                f64::from(mw) / 1e3
            } else {
                f64::NAN
            },
            reasons: if reasons_ok { bits } else { 0 },
            energy_mj: energy_ok.then_some(mj),
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
            energy_mj: None,
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
        assert_eq!(w.energy_w, None, "no counter readings");
    }

    #[test]
    fn counter_power_is_energy_over_time_inside_the_window() {
        let e = |t: f64, mj: Option<u64>| Sample {
            energy_mj: mj,
            ..s(t, 1600, 650.0, REASON_SW_POWER_CAP)
        };
        // The counter steps by 7 J every 0.1 s and is sampled every 0.05 s; inside [1.02, 2.0] it
        // is first seen to step at t = 1.1 (77 J) and last at t = 2.0 (140 J): 63 J over 0.9 s.
        // Outside the window (t = 0, 2.5) it does not count.
        let mut v = vec![e(0.0, Some(0))];
        for i in 0..=20 {
            let t = 1.0 + 0.05 * f64::from(i);
            v.push(e(t, Some(1000 * (t * 10.0).floor() as u64 * 7)));
        }
        v.push(e(2.5, Some(1_000_000)));
        let w = window_stats(&v, 1.02, 2.0).expect("samples");
        let p = w.energy_w.expect("updates 0.9 s apart");
        assert!((p - 70.0).abs() < 1e-9, "{p}");
        // 8 images in 100 ms at 70 W: 0.875 J each.
        assert!((w.joules_per_image(100.0, 8).expect("power") - 0.875).abs() < 1e-12);
        assert_eq!(w.joules_per_image(100.0, 0), None);
        // updates closer than MIN_COUNTER_SPAN_S: no power
        assert_eq!(window_stats(&v, 1.02, 1.2).and_then(|w| w.energy_w), None);
        // a reading without the counter in between does not break the count
        v[5].energy_mj = None;
        assert!(window_stats(&v, 1.02, 2.0)
            .and_then(|w| w.energy_w)
            .is_some());
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
