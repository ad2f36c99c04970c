//! `vtower encode` on the fixture models, from every weight source, against the upstream f64
//! rows (host f32 bound 1e-5 rel-L2); device selection without a GPU. The CUDA runs of the
//! command line are in `tests/cuda.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use vision_towers::tower_core::rel_l2;

/// The fixtures: `VT_FIXTURES` (a test binary run on another machine), else this checkout's.
fn fixtures() -> PathBuf {
    std::env::var_os("VT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
}

fn f64_tensor(ck: &st_reader::Checkpoint, name: &str) -> Vec<f64> {
    let v = ck.tensor(name).unwrap();
    v.bytes()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn encode_matches_upstream_rows_for_every_family_and_source() {
    let cases = [
        ("outputs/gemma4/tiny_20x15", "models/gemma4", 63, 80),
        (
            "outputs/gemma4/tiny_20x15",
            "models/gemma4_gguf/mmproj-BF16.gguf",
            63,
            80,
        ),
        (
            "outputs/gemma4/tiny_20x15",
            "models/gemma4_gguf/mmproj-F16.gguf",
            63,
            80,
        ),
        ("outputs/gemma4/batch2", "models/gemma4", 127, 80),
        ("outputs/glm5_next/batch2", "models/glm5_next", 0, 48),
        ("outputs/glm_ocr/tiny_20x15", "models/glm_ocr", 0, 48),
        ("outputs/step3p7/batch2", "models/step3p7", 0, 80),
        ("outputs/step3p7/batch2", "models/step3p7_hf", 0, 80),
        (
            "outputs/step3p7/tiny_20x15",
            "models/step3p7_sharded",
            0,
            80,
        ),
    ];
    for (case, model, rows_expected, width) in cases {
        let case_path = fixtures().join(format!("{case}.safetensors"));
        let reference = f64_tensor(
            &st_reader::Checkpoint::open(&case_path).unwrap(),
            "f64/rows",
        );
        let out = std::env::temp_dir().join(format!(
            "vtower-encode-{}-{}.safetensors",
            std::process::id(),
            model.replace('/', "_")
        ));
        let status = Command::new(env!("CARGO_BIN_EXE_vtower"))
            .args(["encode", "--device", "cpu", "--model"])
            .arg(fixtures().join(model))
            .arg("--inputs")
            .arg(&case_path)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        let ck = st_reader::Checkpoint::open(&out).unwrap();
        let rows = ck.tensor("embeddings").unwrap();
        assert_eq!(rows.shape()[1], width, "{model} on {case}");
        if rows_expected > 0 {
            assert_eq!(rows.shape()[0], rows_expected, "{model} on {case}");
        }
        let rel = rel_l2(&rows.to_f32().unwrap(), &reference);
        assert!(
            rel <= 1e-5,
            "{model} on {case}: rel-L2 {rel:e} over the host f32 bound 1e-5"
        );
        let _ = std::fs::remove_file(out);
    }
}

#[test]
fn encode_refuses_bad_inputs_with_one_line() {
    let bad = std::env::temp_dir().join(format!(
        "vtower-bad-inputs-{}.safetensors",
        std::process::id()
    ));
    std::fs::write(&bad, b"not a safetensors file at all").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vtower"))
        .args(["encode", "--model"])
        .arg(fixtures().join("models/gemma4"))
        .arg("--inputs")
        .arg(&bad)
        .arg("--out")
        .arg(std::env::temp_dir().join("never-written.safetensors"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("vtower-bad-inputs"), "{stderr}");
    let _ = std::fs::remove_file(bad);
}

/// Runs `vtower encode` on the gemma4 fixture and one image with `device`.
fn encode_with_device(device: &str, out: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vtower"))
        .args(["encode", "--device", device, "--model"])
        .arg(fixtures().join("models/gemma4"))
        .arg("--image")
        .arg(fixtures().join("images/coffee_144x96.jpg"))
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn a_named_cuda_device_without_one_is_one_line_and_exit_1() {
    if vision_towers::gpu_core::is_available() {
        return; // covered by tests/cuda.rs on a GPU machine
    }
    let out = std::env::temp_dir().join(format!("vtower-nocuda-{}.st", std::process::id()));
    for device in ["cuda", "cuda:1"] {
        let run = encode_with_device(device, &out);
        assert_eq!(run.status.code(), Some(1), "--device {device}");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("no usable CUDA device"), "{stderr}");
        assert!(!out.exists(), "--device {device} wrote {}", out.display());
    }
}

#[test]
fn auto_without_a_device_gives_the_cpu_rows() {
    if vision_towers::gpu_core::is_available() {
        return; // auto picks the GPU there: tests/cuda.rs
    }
    let dir = std::env::temp_dir();
    let (auto, cpu) = (
        dir.join(format!("vtower-auto-{}.st", std::process::id())),
        dir.join(format!("vtower-cpu-{}.st", std::process::id())),
    );
    let a = encode_with_device("auto", &auto);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(String::from_utf8_lossy(&a.stderr).contains("(cpu f32)"));
    let c = encode_with_device("cpu", &cpu);
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    assert_eq!(std::fs::read(&auto).unwrap(), std::fs::read(&cpu).unwrap());
    let _ = (std::fs::remove_file(auto), std::fs::remove_file(cpu));
}
