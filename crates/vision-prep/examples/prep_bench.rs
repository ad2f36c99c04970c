//! Time decode + resize + patchify per image, one thread and all threads, and check the output
//! against the upstream tensors `fixtures/oracle/prep_bench.py` saved.
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

/// CPU time of this process in ms (utime + stime from /proc/self/stat, clock ticks of 10 ms):
/// robust against other jobs on a shared machine; used over a batch of runs.
fn cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = after
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // Fields after the command: state(skipped, not numeric) ... utime = 14th, stime = 15th overall.
    f.get(10).copied().unwrap_or(0.0) * 10.0 + f.get(11).copied().unwrap_or(0.0) * 10.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root = Path::new(args.get(1).map(String::as_str).unwrap_or("/tmp/prep_bench"));
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let upstream: Vec<serde_json::Value> = read_json(&root.join("upstream.json"))
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    println!("| family | image | upstream 1 thread ms (CPU ms) | ours 1 thread ms (CPU ms; decode ms) | ours all threads ms | speed-up wall / CPU | identical f32 |");
    println!("|---|---|---|---|---|---|---|");
    for fam in ["gemma4", "glm5_next", "glm_ocr", "step3p7"] {
        let dir = root.join(fam);
        let cfg = ModelConfigs {
            config: read_json(&dir.join("config.json")),
            preprocessor_config: read_json(&dir.join("preprocessor_config.json")),
            ..Default::default()
        };
        let single = Preprocessor::from_configs(
            &cfg,
            PrepSettings {
                parallel: false,
                ..Default::default()
            },
        )
        .expect("cfg");
        let multi = Preprocessor::from_configs(
            &cfg,
            PrepSettings {
                parallel: true,
                ..Default::default()
            },
        )
        .expect("cfg");
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
            let run = |p: &Preprocessor| {
                std::hint::black_box(p.prepare(ImageSource::Bytes(&bytes)).expect("prepare"));
            };
            let c0 = cpu_ms();
            let t1 = min_ms(reps, || run(&single));
            let c1 = (cpu_ms() - c0) / reps as f64;
            let tn = min_ms(reps, || run(&multi));
            let td = min_ms(reps, || {
                std::hint::black_box(
                    vision_prep::source::load(ImageSource::Bytes(&bytes), &Default::default())
                        .expect("load"),
                );
            });
            let up = upstream
                .iter()
                .find(|r| r["family"] == fam && r["image"] == name.as_str())
                .and_then(|r| r["min_ms"].as_f64());
            let up_cpu = upstream
                .iter()
                .find(|r| r["family"] == fam && r["image"] == name.as_str())
                .and_then(|r| r["cpu_ms"].as_f64());
            // Identity check against the saved upstream tensors.
            let prep = single.prepare(ImageSource::Bytes(&bytes)).expect("prepare");
            let identical = std::fs::read(dir.join(format!("{name}.safetensors")))
                .ok()
                .map(|b| {
                    let st = SafeTensors::deserialize(&b).expect("st");
                    prep.tensors.iter().all(|t| {
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
                    })
                });
            println!(
                "| {fam} | {name} | {} | {t1:.1} ({c1:.0}; {td:.1}) | {tn:.1} | {} | {} |",
                up.map_or("-".into(), |u| format!(
                    "{u:.1} ({:.0})",
                    up_cpu.unwrap_or(f64::NAN)
                )),
                up.map_or("-".into(), |u| format!(
                    "{:.1}× / {:.1}×",
                    u / t1,
                    up_cpu.unwrap_or(f64::NAN) / c1
                )),
                identical.map_or("-", |b| if b { "yes" } else { "no" })
            );
        }
    }
}
