//! "Nothing silent": where a CUDA device exists but cannot run the tower, `auto` runs on the CPU
//! and keeps the reason on the tower and the model (`cpu_reason`), `vtower` prints one warning
//! line and writes it into the output's metadata, and a named `cuda:N` is an error with the same
//! reason. Without a GPU here, gpu-core's `GPU_CORE_FAKE_DEVICE` stands in for such a device: a
//! compute capability 7.0 card (older than the tier table) and an 8.0 card forced to Hopper's
//! tier. Its own test binary: the variable is process-wide.

use std::path::{Path, PathBuf};
use std::process::Command;

use vision_towers::vision_prep::PrepSettings;
use vision_towers::{Device, Model, Tower, TowerError, TowerOptions, FAKE_DEVICE_ENV};

fn fixtures() -> PathBuf {
    std::env::var_os("VT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
}

fn options(device: Device, force_tier: Option<(u32, u32)>) -> TowerOptions {
    TowerOptions {
        device,
        force_tier,
        ..TowerOptions::default()
    }
}

#[test]
fn a_device_that_cannot_run_the_tower_is_reported_never_silent() {
    // SAFETY (of the process): this binary's only test sets the variable before any thread reads it.
    std::env::set_var(FAKE_DEVICE_ENV, "7.0");
    let model = fixtures().join("models/gemma4");

    // auto: the CPU, with the reason kept on the model and its tower
    let m = Model::open_with(
        &model,
        &options(Device::Auto, None),
        PrepSettings::default(),
    )
    .expect("auto falls back to the CPU");
    assert_eq!(m.device(), Device::Cpu);
    let why = m.cpu_reason().expect("the reason is kept").to_string();
    assert!(why.contains("7.0") && why.contains("Volta"), "{why}");
    assert_eq!(m.tower().cpu_reason(), Some(why.as_str()));
    assert_eq!(m.tier(), None);

    // an explicit cpu has nothing to report
    let t = Tower::open_with(&model, &options(Device::Cpu, None)).unwrap();
    assert_eq!(t.cpu_reason(), None);

    // a named device: an error with the same reason
    match Tower::open_with(&model, &options(Device::Cuda(0), None)) {
        Err(TowerError::NoDevice { reason, .. }) => assert_eq!(reason, why),
        other => panic!("cuda:0 on a 7.0 card: {other:?}"),
    }

    // bf16 asked for under auto: an error (bf16 runs on CUDA only), naming the reason
    let bf16 = TowerOptions {
        precision: Some(vision_towers::Precision::Bf16),
        ..options(Device::Auto, None)
    };
    let e = Tower::open_with(&model, &bf16).unwrap_err().to_string();
    assert!(e.contains("Volta"), "{e}");
    // f16 likewise (CUDA only, as bf16)
    let f16 = TowerOptions {
        precision: Some(vision_towers::Precision::F16),
        ..options(Device::Auto, None)
    };
    let e = Tower::open_with(&model, &f16).unwrap_err().to_string();
    assert!(
        e.contains("f16 runs on CUDA only") && e.contains("Volta"),
        "{e}"
    );

    // a forced tier the card cannot run: Hopper's on an 8.0 card
    std::env::set_var(FAKE_DEVICE_ENV, "8.0");
    let t = Tower::open_with(&model, &options(Device::Auto, Some((9, 0)))).unwrap();
    let why = t.cpu_reason().expect("the reason is kept");
    assert!(why.contains("9.0") && why.contains("sm_90a"), "{why}");
    // a card with a tier that fails to load: the failure, not silence
    let t = Tower::open_with(&model, &options(Device::Auto, None)).unwrap();
    assert!(
        t.cpu_reason().is_some_and(|w| w.contains(FAKE_DEVICE_ENV)),
        "{:?}",
        t.cpu_reason()
    );
    std::env::set_var(FAKE_DEVICE_ENV, "7.0");

    // vtower: one warning line, the reason in the output's metadata, rows as on the CPU
    let out = std::env::temp_dir().join(format!(
        "vtower-cpu-reason-{}.safetensors",
        std::process::id()
    ));
    let run = Command::new(env!("CARGO_BIN_EXE_vtower"))
        .env(FAKE_DEVICE_ENV, "7.0")
        .args(["encode", "--model"])
        .arg(&model)
        .arg("--image")
        .arg(fixtures().join("images/coffee_144x96.jpg"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].starts_with("vtower: warning: running on the CPU: "),
        "{stderr}"
    );
    assert!(warnings[0].contains("Volta"), "{stderr}");
    assert!(stderr.contains("(cpu f32)"), "{stderr}");
    let ck = st_reader::Checkpoint::open(&out).unwrap();
    let meta = ck.metadata();
    assert_eq!(meta.get("device").map(String::as_str), Some("cpu"));
    assert!(
        meta.get("cpu_reason").is_some_and(|r| r.contains("Volta")),
        "{meta:?}"
    );
    let _ = std::fs::remove_file(&out);

    // vtower --device cuda: exit 1 and one line with the reason
    let run = Command::new(env!("CARGO_BIN_EXE_vtower"))
        .env(FAKE_DEVICE_ENV, "7.0")
        .args(["encode", "--device", "cuda", "--model"])
        .arg(&model)
        .arg("--image")
        .arg(fixtures().join("images/coffee_144x96.jpg"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("Volta"), "{stderr}");
}
