//! Per-stage on-CPU time of one image, one thread: decode, resized views, prepare from RGB (the
//! difference is patchify), and the whole `prepare`; the minimum over N runs of this thread's
//! on-CPU time (`CLOCK_THREAD_CPUTIME_ID`, Linux), which other jobs on a shared machine inflate
//! less than wall time. Inputs: the directory `fixtures/oracle/prep_bench.py` writes.
//!
//! ```text
//! cargo run --release -p vision-prep --example prep_stages -- /tmp/prep_bench 10 [FILTER]
//! ALL_ONLY=1 cargo run --release -p vision-prep --example prep_stages -- /tmp/prep_bench 10 glm
//! ```
//! FILTER keeps the `family:image` names containing it; `ALL_ONLY` times only the whole `prepare`.
//! `all` is a `prepare` whose outputs are dropped (fresh memory each call), `recycled` one whose
//! outputs go back to the preprocessor (`Preprocessor::recycle`) for the next call to write into.

use std::path::Path;

use vision_prep::{ImageSource, ModelConfigs, PrepSettings, Preprocessor};

fn read_json(p: &Path) -> Option<serde_json::Value> {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
}

/// This thread's on-CPU time in ns (`CLOCK_THREAD_CPUTIME_ID`, exact; /proc's schedstat of a
/// running thread is only updated at scheduler ticks).
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Minimum on-CPU time of one run, ms.
fn min_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t0 = cpu_ns();
            f();
            cpu_ns().saturating_sub(t0) as f64 * 1e-6
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root = Path::new(args.get(1).map(String::as_str).unwrap_or("/tmp/prep_bench"));
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let only = args.get(3).cloned().unwrap_or_default();
    let all_only = std::env::var_os("ALL_ONLY").is_some();
    for fam in ["gemma4", "glm5_next", "glm_ocr", "step3p7"] {
        let dir = root.join(fam);
        let cfg = ModelConfigs {
            config: read_json(&dir.join("config.json")),
            preprocessor_config: read_json(&dir.join("preprocessor_config.json")),
            ..Default::default()
        };
        let one_thread = PrepSettings {
            parallel: false,
            ..Default::default()
        };
        let pre = Preprocessor::from_configs(&cfg, one_thread).expect("processor config");
        for name in [
            "astronaut_640x480.png",
            "astronaut_1920x1080.png",
            "astronaut_4032x3024.png",
            "astronaut_1920x1080.jpg",
        ] {
            if !format!("{fam}:{name}").contains(&only) {
                continue;
            }
            let bytes = std::fs::read(root.join(name)).expect("bench image");
            let src = || ImageSource::Bytes(&bytes);
            let all = || {
                std::hint::black_box(pre.prepare(src()).expect("prepare"));
            };
            let recycled = || {
                let p = pre.prepare(src()).expect("prepare");
                pre.recycle(std::hint::black_box(p));
            };
            if all_only {
                println!(
                    "{fam:10} {name:26} all {:7.1} ms  recycled {:7.1} ms",
                    min_ms(reps, all),
                    min_ms(reps, recycled)
                );
                continue;
            }
            let limits = Default::default();
            let (_, rgb) = vision_prep::source::load(src(), &limits).expect("load");
            let td = min_ms(reps, || {
                std::hint::black_box(vision_prep::source::load(src(), &limits).expect("load"));
            });
            let tv = min_ms(reps, || {
                std::hint::black_box(pre.resized_views(&rgb).expect("views"));
            });
            let tp = min_ms(reps, || {
                std::hint::black_box(pre.prepare_rgb(&rgb).expect("prepare_rgb"));
            });
            println!(
                "{fam:10} {name:26} decode {td:7.1}  views {tv:7.1}  prepare_rgb {tp:7.1}  \
                 all {:7.1}  recycled {:7.1} ms",
                min_ms(reps, all),
                min_ms(reps, recycled)
            );
        }
    }
}
