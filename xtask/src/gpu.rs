//! `cargo xtask ptx` and `cargo xtask gpu-test`.
//!
//! GPU gating lives here, not in `#[cfg]`s: the device tests are `#[ignore = "needs a CUDA device"]`
//! and this runs them with `--ignored` where a device exists. Where none exists (or with
//! `--prepare`) it builds the release test binary and the bench binary and copies them into
//! `.device/` (git-ignored), for `kernels/device_run.sh` on a GPU machine that has no cargo.
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::workspace_root;

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

/// Entry point of `cargo xtask gpu-test [--prepare]`.
pub fn gpu_test(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let prepare = args.iter().any(|a| a == "--prepare");
    if has_cuda_device() && !prepare {
        let status = Command::new("cargo")
            .current_dir(&root)
            .args([
                "test",
                "-p",
                "gpu-core",
                "--release",
                "--",
                "--ignored",
                "--test-threads=1",
                "--nocapture",
            ])
            .status()?;
        if !status.success() {
            bail!("GPU tests failed");
        }
        return Ok(());
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
    println!(
        "copied {} and {} into {}",
        test_bin.display(),
        bench.display(),
        dev.display()
    );
    println!("no CUDA device here: on the GPU machine run `bash kernels/device_run.sh` with `.device` carried");
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}
