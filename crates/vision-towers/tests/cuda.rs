//! The facade on a CUDA device: encodes against the host path, concurrency through one shared
//! model, a device out-of-memory inside a pass, and `vtower encode --device cuda`.
//!
//! Every test is `#[ignore = "needs a CUDA device"]`; `cargo xtask gpu-test` runs them with
//! `--ignored --test-threads=1` (the out-of-memory test fills the card). Without a device they
//! fail. On a machine without this checkout, `VT_FIXTURES` names the fixtures and `VT_VTOWER`
//! the `vtower` binary.
//!
//! Bounds: bf16 against the host f32 path ≤ 2e-2 rel-L2 per image (README), f32 ≤ 1e-4; no NaN
//! or infinity ever. Repeated encodes of the same request (threads, after an out-of-memory) must
//! equal the first one bitwise, as docs/RELIABILITY.md states (one tower behind a mutex, the
//! same kernels and GEMM plans on the same inputs); the 2e-2 check runs first, so a failure
//! also says how far apart they are.

mod common;

use common::{fill_the_card, fixtures, image_bytes, largest_image, CUDA_MODELS, IMAGES};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use vision_towers::gpu_core;
use vision_towers::tower_core::rel_l2;
use vision_towers::vision_prep::ImageSource;
use vision_towers::{Device, Encoded, Model, Precision};

/// The tests here run eagerly (graphs off); `tests/graphs.rs` covers the replays.
fn open(model: &str, device: Device, precision: Option<Precision>, ceiling: usize) -> Model {
    common::open(model, device, precision, ceiling, false)
}

/// bf16 against the host f32 path, rel-L2 per image; f16 (10 mantissa bits against bf16's 7) is
/// held to the same bound.
const BF16_BOUND: f64 = 2e-2;

/// The precision a model opened on CUDA with none asked runs in here: bf16, or f16 on a tier
/// without bf16 tensor cores (7.5, native or forced with `GPU_CORE_FORCE_TIER`).
fn default_half() -> Precision {
    gpu_core::Device::new(0)
        .expect("this test needs a CUDA device")
        .default_precision()
}
/// CUDA f32 (exactness mode) against the host f32 path.
const F32_BOUND: f64 = 1e-4;

fn bitwise(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Checks `got` against `want` image by image: same plans and shapes, finite, within `bound`.
/// Returns the worst rel-L2.
fn check(what: &str, got: &[Encoded], want: &[Encoded], bound: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}");
    let mut worst = 0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.plan, w.plan, "{what}: image {i}");
        assert_eq!(
            (g.width, g.rows.len()),
            (w.width, w.rows.len()),
            "{what}: image {i}"
        );
        assert!(
            g.rows.iter().all(|v| v.is_finite()),
            "{what}: image {i} has NaN or infinite rows"
        );
        let rel = rel_l2(&g.rows, &w.rows);
        assert!(
            rel <= bound,
            "{what}: image {i} rel-L2 {rel:e} over {bound:e}"
        );
        worst = worst.max(rel);
    }
    worst
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_encode_of_every_fixture_model_matches_the_host_path() {
    let bytes = image_bytes();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    let half = default_half();
    for model in CUDA_MODELS {
        let host = open(model, Device::Cpu, None, usize::MAX)
            .encode(&sources)
            .unwrap();
        let runs = [
            (None, half, BF16_BOUND, usize::MAX),
            (Some(Precision::F32), Precision::F32, F32_BOUND, usize::MAX),
            // The largest image's worth per pass: several passes, one workspace across them.
            (None, half, BF16_BOUND, largest_image(model, &sources)),
        ];
        for (asked, precision, bound, ceiling) in runs {
            let m = open(model, Device::Cuda(0), asked, ceiling);
            assert_eq!((m.device(), m.precision()), (Device::Cuda(0), precision));
            let what = format!("{model} cuda {precision} ceiling {ceiling}");
            let got = m.encode(&sources).unwrap_or_else(|e| panic!("{what}: {e}"));
            let worst = check(&what, &got, &host, bound);
            println!("CUDA-ENCODE {what}: worst rel-L2 {worst:.3e} (bound {bound:e})");
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn auto_picks_cuda_when_a_device_opens() {
    let m = open("models/gemma4", Device::Auto, None, usize::MAX);
    assert_eq!(
        (m.device(), m.precision()),
        (Device::Cuda(0), default_half())
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn concurrent_cuda_encodes_through_one_model_equal_serial_ones() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 3;
    let bytes = Arc::new(image_bytes());
    for model in [
        "models/gemma4",
        "models/glm5_next",
        "models/glm_ocr",
        "models/step3p7",
    ] {
        let m = Arc::new(open(model, Device::Cuda(0), None, usize::MAX));
        let serial: Vec<Encoded> = bytes
            .iter()
            .map(|b| m.encode(&[ImageSource::Bytes(b)]).unwrap().remove(0))
            .collect();
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (m, bytes) = (Arc::clone(&m), Arc::clone(&bytes));
                std::thread::spawn(move || {
                    (0..ROUNDS)
                        .map(|r| {
                            let i = (t + r) % bytes.len();
                            let got = m.encode(&[ImageSource::Bytes(&bytes[i])]);
                            (i, got.map_err(|e| e.to_string()))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut worst = 0f64;
        for h in handles {
            for (i, got) in h.join().unwrap() {
                let got = got.unwrap_or_else(|e| panic!("{model} {}: {e}", IMAGES[i]));
                let what = format!("{model} {} from a thread", IMAGES[i]);
                let rel = check(&what, &got, &serial[i..=i], BF16_BOUND);
                worst = worst.max(rel);
                assert!(
                    bitwise(&got[0].rows, &serial[i].rows),
                    "{what}: not bitwise equal to the serial encode (rel-L2 {rel:e})"
                );
            }
        }
        println!(
            "CUDA-CONCURRENCY {model}: {THREADS} threads × {ROUNDS} encodes, all bitwise equal \
             to the serial ones (worst rel-L2 {worst:.3e})"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn out_of_memory_in_a_pass_is_an_error_and_the_model_stays_usable() {
    let bytes = image_bytes();
    let one = [ImageSource::Bytes(&bytes[0])];
    let all: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    for model in ["models/gemma4", "models/glm5_next", "models/step3p7"] {
        let m = open(model, Device::Cuda(0), None, usize::MAX);
        let before = m.encode(&one).unwrap();
        let dev = gpu_core::Device::new(0).unwrap();
        let (ballast, held) = fill_the_card(&dev);
        assert!(held >= 1 << 30, "{model}: only {held} bytes of ballast");
        let err = match m.encode(&all) {
            Err(e) => e,
            Ok(_) => panic!("{model}: an encode with {held} bytes of ballast succeeded"),
        };
        assert!(
            err.is_out_of_memory(),
            "{model}: expected out of memory, got {err}"
        );
        let text = err.to_string();
        assert_eq!(text.lines().count(), 1, "{text}");
        println!("CUDA-OOM {model}: ballast {held} bytes; error: {text}");
        drop(ballast);
        dev.synchronize().unwrap();
        let after = m.encode(&one).unwrap();
        let worst = check(&format!("{model} after OOM"), &after, &before, BF16_BOUND);
        assert!(
            bitwise(&after[0].rows, &before[0].rows),
            "{model}: the encode after the out-of-memory is not bitwise the one before (rel-L2 {worst:e})"
        );
        let host = open(model, Device::Cpu, None, usize::MAX);
        check(
            &format!("{model} whole request after OOM"),
            &m.encode(&all).unwrap(),
            &host.encode(&all).unwrap(),
            BF16_BOUND,
        );
        println!("CUDA-OOM {model}: after the ballast, bitwise equal to the encode before");
    }
}

/// `vtower`: `VT_VTOWER` (a test binary run on another machine), else this build's.
fn vtower() -> PathBuf {
    std::env::var_os("VT_VTOWER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vtower")))
}

/// `vtower encode --device <device>` of every image in one request; the rows and stderr.
fn cli_encode(model: &str, device: &str, out: &Path) -> (Vec<f32>, Vec<usize>, String) {
    let mut cmd = Command::new(vtower());
    cmd.args(["encode", "--device", device, "--model"])
        .arg(fixtures().join(model));
    for i in IMAGES {
        cmd.arg("--image").arg(fixtures().join("images").join(i));
    }
    let run = cmd.arg("--out").arg(out).output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "{model} --device {device}: {stderr}");
    let ck = vision_towers::st_reader::Checkpoint::open(out).unwrap();
    let t = ck.tensor("embeddings").unwrap();
    (t.to_f32().unwrap(), t.shape().to_vec(), stderr)
}

#[test]
#[ignore = "needs a CUDA device"]
fn cli_encode_on_cuda_matches_cpu_for_every_fixture_model() {
    let dir = std::env::temp_dir();
    let tag_of_cuda = format!("(cuda:0 {})", default_half());
    for model in CUDA_MODELS {
        let tag = model.replace('/', "_");
        let cuda_out = dir.join(format!("vt-cuda-{}-{tag}.st", std::process::id()));
        let cpu_out = dir.join(format!("vt-cpu-{}-{tag}.st", std::process::id()));
        let (gpu, gpu_shape, stderr) = cli_encode(model, "cuda", &cuda_out);
        assert!(stderr.contains(&tag_of_cuda), "{model}: {stderr}");
        let (cpu, cpu_shape, _) = cli_encode(model, "cpu", &cpu_out);
        assert_eq!(gpu_shape, cpu_shape, "{model}");
        assert!(
            gpu.iter().all(|v| v.is_finite()),
            "{model}: NaN in CUDA rows"
        );
        let rel = rel_l2(&gpu, &cpu);
        assert!(
            rel <= BF16_BOUND,
            "{model}: vtower cuda vs cpu rel-L2 {rel:e}"
        );
        println!("CUDA-CLI {model}: {gpu_shape:?} rows, cuda vs cpu rel-L2 {rel:.3e}");
        let _ = (
            std::fs::remove_file(cuda_out),
            std::fs::remove_file(cpu_out),
        );
    }
}
