//! `cargo xtask ptx` and `cargo xtask gpu-test`.
//!
//! GPU gating lives here, not in `#[cfg]`s: the device tests are `#[ignore = "needs a CUDA device"]`
//! and this runs them with `--ignored` where a device exists: gpu-core's, then the facade's
//! (`vision-towers`' test targets in [`FACADE_GPU_TESTS`]). Where none exists (or with
//! `--prepare`) it builds the release test binaries, the bench binary and a release `vtower` and
//! copies them into `.device/` (git-ignored), for a GPU machine that has no cargo:
//! `kernels/device_run.sh` runs gpu-core's, `.device/facade/run.sh` (written here) the facade's.
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::workspace_root;

/// The `vision-towers` integration-test targets that hold GPU tests (`tests/<name>.rs`).
const FACADE_GPU_TESTS: [&str; 2] = ["cuda", "graphs"];

/// Entry point of `cargo xtask ptx`: runs `kernels/build_ptx.sh` (needs nvcc, or `NVCC=/path/to/nvcc`).
pub fn ptx(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    if Command::new(&nvcc).arg("--version").output().is_err() {
        bail!("`{nvcc}` not found: install the CUDA toolkit (or set NVCC), or run kernels/build_ptx.sh on a CUDA machine and copy kernels/ptx/ back");
    }
    let status = Command::new("bash")
        .arg(root.join("kernels/build_ptx.sh"))
        .args(args)
        .env("NVCC", &nvcc)
        .status()
        .context("running kernels/build_ptx.sh")?;
    if !status.success() {
        bail!("kernels/build_ptx.sh failed ({status})");
    }
    Ok(())
}

fn has_cuda_device() -> bool {
    Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The Python package's GPU tests (`bindings/python/tests`, marker `gpu`), with the interpreter
/// that has PyTorch (`VT_PYTHON`, else `python3`) and the package installed (the wheel of
/// `maturin build --release`, installed with `pip install --no-index --no-deps`).
fn python_gpu_tests(root: &Path) -> Result<()> {
    let python = std::env::var("VT_PYTHON").unwrap_or_else(|_| "python3".into());
    let ready = Command::new(&python)
        .args(["-c", "import vision_towers, torch"])
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        bail!(
            "the Python GPU tests need `vision_towers` and `torch` importable by {python}: build \
             the wheel (`maturin build --release -o bindings/python/target/wheels` in \
             bindings/python) and `pip install --no-index --no-deps` it there"
        );
    }
    let status = Command::new(&python)
        .current_dir(root)
        .args([
            "-m",
            "pytest",
            "bindings/python/tests",
            "-m",
            "gpu",
            "--gpu",
            "-v",
        ])
        .status()
        .context("running pytest")?;
    if !status.success() {
        bail!("Python GPU tests failed ({status})");
    }
    Ok(())
}

/// Entry point of `cargo xtask gpu-test [--prepare]`.
pub fn gpu_test(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let prepare = args.iter().any(|a| a == "--prepare");
    if has_cuda_device() && !prepare {
        let mut runs = vec![vec!["-p", "gpu-core"]];
        for t in FACADE_GPU_TESTS {
            runs.push(vec!["-p", "vision-towers", "--test", t]);
        }
        for target in runs {
            let status = Command::new("cargo")
                .current_dir(&root)
                .arg("test")
                .args(&target)
                .args([
                    "--release",
                    "--",
                    "--ignored",
                    "--test-threads=1",
                    "--nocapture",
                ])
                .status()?;
            if !status.success() {
                bail!("GPU tests failed: cargo test {}", target.join(" "));
            }
        }
        return python_gpu_tests(&root);
    }
    // Build the test binary and the bench binary, copy them into .device/.
    let out = Command::new("cargo")
        .current_dir(&root)
        .args([
            "test",
            "-p",
            "gpu-core",
            "--release",
            "--no-run",
            "--message-format=json",
        ])
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!(
            "building the gpu-core test binary failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut test_bin: Option<PathBuf> = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact"
            && v["target"]["name"] == "gpu_core"
            && v["profile"]["test"] == true
        {
            if let Some(exe) = v["executable"].as_str() {
                test_bin = Some(PathBuf::from(exe));
            }
        }
    }
    let test_bin = test_bin.context("no gpu_core test executable in cargo's output")?;
    let status = Command::new("cargo")
        .current_dir(&root)
        .args([
            "build",
            "-p",
            "gpu-core",
            "--release",
            "--bin",
            "gpu-core-bench",
        ])
        .status()?;
    if !status.success() {
        bail!("building gpu-core-bench failed");
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    let bench = target.join("release/gpu-core-bench");
    let dev = root.join(".device");
    std::fs::create_dir_all(&dev)?;
    copy(&test_bin, &dev.join("gpu_core_tests"))?;
    copy(&bench, &dev.join("gpu-core-bench"))?;
    strip_debug(&[dev.join("gpu_core_tests"), dev.join("gpu-core-bench")]);
    println!(
        "copied {} and {} into {}",
        test_bin.display(),
        bench.display(),
        dev.display()
    );
    stage_facade(&root, &target, &dev.join("facade"))?;
    println!(
        "no CUDA device here: on the GPU machine run `bash kernels/device_run.sh` (gpu-core, \
         `.device` carried) and `bash .device/facade/run.sh` (the facade, `.device/facade` carried)"
    );
    Ok(())
}

/// Builds the facade's GPU test binaries and a release `vtower`, copies them (stripped) into
/// `facade` and writes `facade/run.sh`, which runs them there.
fn stage_facade(root: &Path, target: &Path, facade: &Path) -> Result<()> {
    let mut args = vec![
        "test",
        "-p",
        "vision-towers",
        "--release",
        "--no-run",
        "--message-format=json",
    ];
    for t in FACADE_GPU_TESTS {
        args.extend(["--test", t]);
    }
    let out = Command::new("cargo")
        .current_dir(root)
        .args(&args)
        .output()
        .context("cargo test -p vision-towers --no-run")?;
    if !out.status.success() {
        bail!(
            "building the vision-towers GPU test binaries failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let name = v["target"]["name"].as_str().unwrap_or_default();
        if v["reason"] == "compiler-artifact"
            && v["profile"]["test"] == true
            && v["target"]["kind"][0] == "test"
            && FACADE_GPU_TESTS.contains(&name)
        {
            if let Some(exe) = v["executable"].as_str() {
                found.push((name.to_string(), PathBuf::from(exe)));
            }
        }
    }
    for t in FACADE_GPU_TESTS {
        if !found.iter().any(|(n, _)| n == t) {
            bail!("no vision-towers test executable `{t}` in cargo's output");
        }
    }
    let status = Command::new("cargo")
        .current_dir(root)
        .args([
            "build",
            "-p",
            "vision-towers",
            "--release",
            "--bin",
            "vtower",
        ])
        .status()?;
    if !status.success() {
        bail!("building vtower failed");
    }
    std::fs::create_dir_all(facade)?;
    let mut staged = Vec::new();
    for (name, exe) in &found {
        let to = facade.join(format!("vision_towers_{name}"));
        copy(exe, &to)?;
        staged.push(to);
    }
    let vtower = facade.join("vtower");
    copy(&target.join("release/vtower"), &vtower)?;
    staged.push(vtower);
    strip_debug(&staged);
    std::fs::write(facade.join("run.sh"), facade_script())?;
    for f in &staged {
        println!("staged {}", f.display());
    }
    Ok(())
}

/// `.device/facade/run.sh`: the facade's GPU tests (encode parity against the host path on
/// every fixture model, concurrency, out-of-memory, `vtower encode --device cuda` against
/// `--device cpu`), then the README's command with `--device auto`. Logs under `$OUT`.
fn facade_script() -> String {
    let tests: String = FACADE_GPU_TESTS
        .iter()
        .map(|t| {
            format!(
                "\"$HERE/vision_towers_{t}\" --ignored --test-threads=1 --nocapture 2>&1 | tee -a \"$OUT/facade_tests.log\"\n\
                 [ \"${{PIPESTATUS[0]}}\" -eq 0 ] || rc=1\n"
            )
        })
        .collect();
    format!(
        r#"#!/usr/bin/env bash
# Written by `cargo xtask gpu-test --prepare`. The facade's GPU tests and `vtower` on CUDA.
# Needs .device/facade carried; run from anywhere: bash .device/facade/run.sh
set -uo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${{OUT:-/tmp/facade-out}}"
mkdir -p "$OUT"
export VT_FIXTURES="$ROOT/fixtures" VT_VTOWER="$HERE/vtower"
# The PTX the kernels/*.cu of this tree give (the embedded copy may predate them), unless
# GPU_CORE_PTX_DIR already names one (e.g. the one kernels/device_run.sh built).
if [ -z "${{GPU_CORE_PTX_DIR:-}}" ] && command -v "${{NVCC:-nvcc}}" >/dev/null; then
    bash "$ROOT/kernels/build_ptx.sh" /tmp/facade-ptx >/dev/null && export GPU_CORE_PTX_DIR=/tmp/facade-ptx
fi
echo "PTX: ${{GPU_CORE_PTX_DIR:-embedded}}"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader || true
rc=0
: > "$OUT/facade_tests.log"
{tests}"$VT_VTOWER" encode --device auto --model "$VT_FIXTURES/models/gemma4" --image "$VT_FIXTURES/images/coffee_144x96.jpg" --out /tmp/embeddings.safetensors 2>&1 | tee "$OUT/facade_cli.log"
[ "${{PIPESTATUS[0]}}" -eq 0 ] || rc=1
grep -E "^CUDA-|panicked|^test |test result" "$OUT/facade_tests.log" > "$OUT/facade_summary.txt" || true
echo "=== facade summary ==="
cat "$OUT/facade_summary.txt" "$OUT/facade_cli.log"
exit $rc
"#
    )
}

/// Drops the debug info (symbols stay, for backtraces) where `strip` exists: the binaries travel
/// to the GPU machine under a size limit.
fn strip_debug(files: &[PathBuf]) {
    for f in files {
        let _ = Command::new("strip").arg("--strip-debug").arg(f).status();
    }
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}
