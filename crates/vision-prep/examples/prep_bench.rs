//! Time decode + resize + patchify per image, one thread and all threads, and check the output
//! against the upstream tensors `fixtures/oracle/prep_bench.py` saved. Each case runs twice: with
//! fresh outputs (each `Prepared` dropped) and with recycled ones (each handed back with
//! `Preprocessor::recycle`, as an engine preparing many images would), on separate preprocessors.
//!
//! ```text
//! fixtures/oracle/.venv/bin/python fixtures/oracle/prep_bench.py 5
//! cargo run --release -p vision-prep --example prep_bench -- /tmp/prep_bench 5
//! ```

use std::path::Path;
use std::time::Instant;

use safetensors::SafeTensors;
use vision_prep::{ImageSource, ModelConfigs, PrepSettings, Preprocessor, TensorData};

fn read_json(p: &Path) -> Option<serde_json::Value> {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
}

/// Minimum over `reps` runs (the machine is shared; the minimum is the least disturbed run).
fn min_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// CPU time of this process in ms (`CLOCK_PROCESS_CPUTIME_ID`, what Python's `time.process_time`
/// reads on the upstream side): robust against other jobs on a shared machine.
fn cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 * 1e-6
}

/// Whether our f32 tensors equal the upstream ones saved in `file` (`None`: no file).
fn identical(file: &Path, prep: &vision_prep::Prepared) -> Option<bool> {
    let b = std::fs::read(file).ok()?;
    let st = SafeTensors::deserialize(&b).expect("st");
    Some(prep.tensors.iter().all(|t| {
        let TensorData::F32(ours) = &t.data else {
            return true;
        };
        let Ok(theirs) = st.tensor(t.name) else {
            return false;
        };
        let theirs: Vec<f32> = theirs
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // gemma4 upstream pads rows with zeros up to max_patches.
        theirs.len() >= ours.len()
            && ours
                .iter()
                .zip(&theirs)
                .all(|(a, b)| a.to_bits() == b.to_bits())
            && theirs[ours.len()..].iter().all(|&x| x == 0.0)
    }))
}

/// CPU ms per run of `f` over `reps` runs (after one warm-up run), and the minimum wall ms.
fn timed(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let c0 = cpu_ms();
    let wall = min_ms(reps, &mut f);
    ((cpu_ms() - c0) / reps as f64, wall)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root = Path::new(args.get(1).map(String::as_str).unwrap_or("/tmp/prep_bench"));
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let upstream: Vec<serde_json::Value> = read_json(&root.join("upstream.json"))
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    println!(
        "| family | image | upstream 1 thread ms (CPU ms) | ours fresh 1 thread ms (CPU ms; decode ms) \
         | ours recycled 1 thread ms (CPU ms) | ours all threads ms fresh / recycled \
         | speed-up wall fresh / recycled | speed-up CPU fresh / recycled \
         | identical f32 fresh / recycled |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for fam in ["gemma4", "glm5_next", "glm_ocr", "step3p7"] {
        let dir = root.join(fam);
        let cfg = ModelConfigs {
            config: read_json(&dir.join("config.json")),
            preprocessor_config: read_json(&dir.join("preprocessor_config.json")),
            ..Default::default()
        };
        let make = |parallel| {
            Preprocessor::from_configs(
                &cfg,
                PrepSettings {
                    parallel,
                    ..Default::default()
                },
            )
            .expect("cfg")
        };
        // Fresh and recycled runs on separate preprocessors: a fresh one's output pool stays empty.
        let (single, single_rec, multi, multi_rec) =
            (make(false), make(false), make(true), make(true));
        let mut names: Vec<String> = std::fs::read_dir(root)
            .expect("root")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("astronaut_"))
            .collect();
        names.sort();
        for name in names {
            if std::env::var("PREP_ONLY").is_ok_and(|o| o != format!("{fam}:{name}")) {
                continue;
            }
            let bytes = std::fs::read(root.join(&name)).expect("image");
            let fresh = |p: &Preprocessor| {
                std::hint::black_box(p.prepare(ImageSource::Bytes(&bytes)).expect("prepare"));
            };
            let recycled = |p: &Preprocessor| {
                let out = p.prepare(ImageSource::Bytes(&bytes)).expect("prepare");
                p.recycle(std::hint::black_box(out));
            };
            let (c1, t1) = timed(reps, || fresh(&single));
            let (c1r, t1r) = timed(reps, || recycled(&single_rec));
            let (_, tn) = timed(reps, || fresh(&multi));
            let (_, tnr) = timed(reps, || recycled(&multi_rec));
            let td = min_ms(reps, || {
                std::hint::black_box(
                    vision_prep::source::load(ImageSource::Bytes(&bytes), &Default::default())
                        .expect("load"),
                );
            });
            let row = upstream
                .iter()
                .find(|r| r["family"] == fam && r["image"] == name.as_str());
            let up = row.and_then(|r| r["min_ms"].as_f64());
            let up_cpu = row.and_then(|r| r["cpu_ms"].as_f64()).unwrap_or(f64::NAN);
            // Identity check against the saved upstream tensors, of a fresh output and of one
            // written into recycled buffers.
            let file = dir.join(format!("{name}.safetensors"));
            let a = single.prepare(ImageSource::Bytes(&bytes)).expect("prepare");
            let b = single_rec
                .prepare(ImageSource::Bytes(&bytes))
                .expect("prepare");
            let yes = |x: Option<bool>| x.map_or("-", |b| if b { "yes" } else { "no" });
            let (ia, ib) = (yes(identical(&file, &a)), yes(identical(&file, &b)));
            single_rec.recycle(b);
            println!(
                "| {fam} | {name} | {} | {t1:.1} ({c1:.1}; {td:.1}) | {t1r:.1} ({c1r:.1}) \
                 | {tn:.1} / {tnr:.1} | {} | {:.1}× / {:.1}× | {ia} / {ib} |",
                up.map_or("-".into(), |u| format!("{u:.1} ({up_cpu:.0})")),
                up.map_or("-".into(), |u| format!("{:.1}× / {:.1}×", u / t1, u / t1r)),
                up_cpu / c1,
                up_cpu / c1r,
            );
        }
    }
}
