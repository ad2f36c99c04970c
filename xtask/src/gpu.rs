//! `cargo xtask ptx` and `cargo xtask gpu-test`.
//!
//! GPU gating lives here, not in `#[cfg]`s: every device test is `#[ignore = "needs a CUDA device"]`
//! (a test below checks that no test is ignored for another reason, so `--ignored` selects exactly
//! them) and `gpu-test` runs them all with `--ignored`, every test target of every workspace package
//! ([`GPU_TEST_RUNS`]), counts the tests that ran against the attributes in the sources, then runs
//! `parity --require-cuda`. It fails when it ran no GPU test or fewer than the sources hold. With
//! `--prepare` (for a GPU machine that has no cargo) it builds the release test binaries, a release
//! xtask (its `kernel-bench`) and a release `vtower` and copies them into `.device/` (git-ignored):
//! `kernels/device_run.sh` runs gpu-core's, `.device/facade/run.sh` (written here) the others'
//! ([`STAGED_GPU_TESTS`]), `.device/capi/run.sh` the C ABI's (`vision-towers-c`'s `tests/gpu.rs`,
//! with the release `libvision_towers_c.so` and the C test program built here against it).
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::workspace_root;

/// The attribute every GPU test carries, exactly; `cargo test -- --ignored` runs these and only these.
pub(crate) const GPU_IGNORE: &str = r#"#[ignore = "needs a CUDA device"]"#;

/// The `cargo test` selections `gpu-test` runs with `--ignored`: every test target (library and
/// binary unit tests, integration tests; not doctests) of every workspace package.
const GPU_TEST_RUNS: &[&[&str]] = &[&["--workspace", "--tests"]];

/// The integration-test targets (package, `tests/<name>.rs`) that hold GPU tests outside gpu-core,
/// staged by `--prepare` for `.device/facade/run.sh` (gpu-core's own go to `kernels/device_run.sh`).
const STAGED_GPU_TESTS: [(&str, &str); 5] = [
    ("vision-towers", "cuda"),
    ("vision-towers", "graphs"),
    ("vision-towers", "device_rows"),
    ("vision-towers", "video"),
    ("tower-step", "cuda"),
];

/// Entry point of `cargo xtask ptx`: runs `kernels/build_ptx.sh`, then `kernels/build_sass.sh`
/// (needs nvcc, ptxas and fatbinary, or `NVCC=/path/to/nvcc`), so the SASS always follows the PTX.
/// Both write into `crates/gpu-core/kernels/` (`ptx/`, `sass/`), inside gpu-core's package.
pub fn ptx(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    if Command::new(&nvcc).arg("--version").output().is_err() {
        bail!("`{nvcc}` not found: install the CUDA toolkit (or set NVCC), or run kernels/build_ptx.sh on a CUDA machine and copy crates/gpu-core/kernels/ptx/ back");
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
    // SASS only for the committed location: a PTX built elsewhere (an argument) is a trial.
    if args.is_empty() {
        let status = Command::new("bash")
            .arg(root.join("kernels/build_sass.sh"))
            .status()
            .context("running kernels/build_sass.sh")?;
        if !status.success() {
            bail!("kernels/build_sass.sh failed ({status})");
        }
    }
    Ok(())
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
    let mut prepare = false;
    for a in args {
        match a.as_str() {
            "--prepare" => prepare = true,
            other => bail!("unknown argument `{other}`\nusage: cargo xtask gpu-test [--prepare]"),
        }
    }
    if prepare {
        return stage_device(&root);
    }
    match gpu_core::device_count() {
        Ok(0) => bail!(
            "{}: no GPU test ran; on a machine without CUDA, `cargo xtask gpu-test --prepare` \
             stages the test binaries for a GPU machine",
            gpu_core::Device::new(0).map_or_else(|e| e.to_string(), |_| "no CUDA device".into())
        ),
        Ok(n) => println!("the CUDA driver reports {n} device(s)"),
        // A GPU machine with a broken stack: the tests say what fails.
        Err(e) => println!("the CUDA driver fails to start ({e}); running the GPU tests anyway"),
    }
    let sources = gpu_test_sources(&root)?;
    let expected: usize = sources.iter().map(|(_, n)| n).sum();
    let missed: Vec<_> = sources
        .iter()
        .filter(|(f, _)| !covered(GPU_TEST_RUNS, &root, f))
        .map(|(f, _)| f.display().to_string())
        .collect();
    if !missed.is_empty() {
        bail!("GPU tests outside every selection gpu-test runs: {missed:?}");
    }
    let mut ran = 0;
    for sel in GPU_TEST_RUNS {
        ran += cargo_test_counting(&root, sel)?;
    }
    if ran == 0 {
        bail!("no GPU test ran (the sources hold {expected})");
    }
    if ran < expected {
        bail!(
            "{ran} GPU tests ran but the sources hold {expected} (`{GPU_IGNORE}` in {} files)",
            sources.len()
        );
    }
    println!("{ran} GPU tests passed; now the Python package's");
    python_gpu_tests(&root)?;
    println!("now every CUDA parity row");
    crate::parity::run(&["--require-cuda".to_string()])
}

/// Runs `cargo test <sel> --release -- --ignored` (output passed through) and returns how many
/// tests passed; an error when cargo or a test fails.
fn cargo_test_counting(root: &Path, sel: &[&str]) -> Result<usize> {
    let mut child = Command::new("cargo")
        .current_dir(root)
        .arg("test")
        .args(sel)
        .args([
            "--release",
            "--",
            "--ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting cargo test")?;
    let mut passed = 0;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.context("reading cargo test's output")?;
            println!("{line}");
            passed += passed_in(&line);
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("GPU tests failed: cargo test {} ({status})", sel.join(" "));
    }
    Ok(passed)
}

/// The passed count of a libtest summary line (`test result: ok. 3 passed; 0 failed; …`), else 0.
fn passed_in(line: &str) -> usize {
    let Some(at) = line.find("test result: ") else {
        return 0;
    };
    line[at..]
        .split(['.', ';'])
        .find_map(|part| part.trim().strip_suffix(" passed"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Every `.rs` file under `crates/` and `xtask/` with its number of [`GPU_IGNORE`] attributes
/// (files with none left out), sorted.
fn gpu_test_sources(root: &Path) -> Result<Vec<(PathBuf, usize)>> {
    let mut out = Vec::new();
    for f in rust_sources(root)? {
        let text = std::fs::read_to_string(&f).with_context(|| f.display().to_string())?;
        let n = text.lines().filter(|l| l.trim() == GPU_IGNORE).count();
        if n > 0 {
            out.push((f, n));
        }
    }
    Ok(out)
}

/// Every `.rs` file under `crates/` and `xtask/`, sorted.
fn rust_sources(root: &Path) -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for e in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
            let p = e?.path();
            if p.is_dir() {
                walk(&p, out)?;
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    for d in ["crates", "xtask"] {
        walk(&root.join(d), &mut out)?;
    }
    out.sort();
    Ok(out)
}

/// Whether one of the `cargo test` selections `runs` runs the tests in `file` (a workspace
/// path): its package is selected (`--workspace` or `-p <folder name>`, crate name = folder name)
/// and so is its target (`tests/<t>.rs` by `--tests` or `--test t`; anything else by `--tests` or
/// `--lib`/`--bins`; all by no target flag).
fn covered(runs: &[&[&str]], root: &Path, file: &Path) -> bool {
    let Ok(rel) = file.strip_prefix(root) else {
        return false;
    };
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let (package, rest) = match parts.first().map(String::as_str) {
        Some("crates") if parts.len() > 2 => (parts[1].as_str(), &parts[2..]),
        Some("xtask") => ("xtask", &parts[1..]),
        _ => return false,
    };
    let test_target = match rest {
        [dir, f] if dir == "tests" => f.strip_suffix(".rs"),
        _ => None,
    };
    runs.iter().any(|r| {
        let pair = |flag: &str, v: &str| r.windows(2).any(|w| w[0] == flag && w[1] == v);
        let package_ok = r.contains(&"--workspace") || pair("-p", package);
        let filtered = r
            .iter()
            .any(|a| matches!(*a, "--lib" | "--bins" | "--tests" | "--test"));
        let target_ok = !filtered
            || r.contains(&"--tests")
            || match test_target {
                Some(t) => pair("--test", t),
                None => r.contains(&"--lib") || r.contains(&"--bins"),
            };
        package_ok && target_ok
    })
}

/// `--prepare`: builds the release test binaries that hold GPU tests, a release xtask (for
/// `xtask kernel-bench`) and a release `vtower`, and copies them into `.device/` for a GPU machine
/// without cargo.
fn stage_device(root: &Path) -> Result<()> {
    let root = root.to_path_buf();
    // Build the test binary and xtask (the kernel bench), copy them into .device/.
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
        .args(["build", "-p", "xtask", "--release", "--bin", "xtask"])
        .status()?;
    if !status.success() {
        bail!("building xtask failed");
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    let bench = target.join("release/xtask");
    let dev = root.join(".device");
    std::fs::create_dir_all(&dev)?;
    copy(&test_bin, &dev.join("gpu_core_tests"))?;
    copy(&bench, &dev.join("xtask"))?;
    strip_debug(&[dev.join("gpu_core_tests"), dev.join("xtask")]);
    println!(
        "copied {} and {} into {}",
        test_bin.display(),
        bench.display(),
        dev.display()
    );
    stage_facade(&root, &target, &dev.join("facade"))?;
    stage_capi(&root, &target, &dev.join("capi"))?;
    println!(
        "staged: on the GPU machine run `bash kernels/device_run.sh` (gpu-core, `.device` \
         carried), `bash .device/facade/run.sh` (the other Rust GPU tests and `vtower`, \
         `.device/facade` carried) and `bash .device/capi/run.sh` (the C ABI, `.device/capi` \
         carried)"
    );
    Ok(())
}

/// The name a staged test binary gets: `<package>_<test>` with `-` as `_`.
fn staged_name(package: &str, test: &str) -> String {
    format!("{}_{test}", package.replace('-', "_"))
}

/// Builds the GPU test binaries of [`STAGED_GPU_TESTS`] and a release `vtower`, copies them
/// (stripped) into `facade` and writes `facade/run.sh`, which runs them there.
fn stage_facade(root: &Path, target: &Path, facade: &Path) -> Result<()> {
    let mut found = Vec::new();
    let mut packages: Vec<&str> = STAGED_GPU_TESTS.iter().map(|(p, _)| *p).collect();
    packages.dedup();
    for package in packages {
        let mut args = vec![
            "test",
            "-p",
            package,
            "--release",
            "--no-run",
            "--message-format=json",
        ];
        let tests: Vec<&str> = STAGED_GPU_TESTS
            .iter()
            .filter(|(p, _)| *p == package)
            .map(|(_, t)| *t)
            .collect();
        for t in &tests {
            args.extend(["--test", t]);
        }
        let out = Command::new("cargo")
            .current_dir(root)
            .args(&args)
            .output()
            .with_context(|| format!("cargo test -p {package} --no-run"))?;
        if !out.status.success() {
            bail!(
                "building the {package} GPU test binaries failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let name = v["target"]["name"].as_str().unwrap_or_default();
            if v["reason"] == "compiler-artifact"
                && v["profile"]["test"] == true
                && v["target"]["kind"][0] == "test"
                && tests.contains(&name)
            {
                if let Some(exe) = v["executable"].as_str() {
                    found.push((staged_name(package, name), PathBuf::from(exe)));
                }
            }
        }
    }
    for (p, t) in STAGED_GPU_TESTS {
        if !found.iter().any(|(n, _)| *n == staged_name(p, t)) {
            bail!("no {p} test executable `{t}` in cargo's output");
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
        let to = facade.join(name);
        copy(exe, &to)?;
        staged.push(to);
    }
    let vtower = facade.join("vtower");
    copy(&target.join("release/vtower"), &vtower)?;
    staged.push(vtower);
    strip_debug(&staged);
    // The GPU tests the staged binaries hold, from their sources: run.sh fails on fewer.
    let expected: usize = gpu_test_sources(root)?
        .iter()
        .filter(|(f, _)| {
            STAGED_GPU_TESTS
                .iter()
                .any(|(p, t)| f.ends_with(format!("crates/{p}/tests/{t}.rs")))
        })
        .map(|(_, n)| n)
        .sum();
    std::fs::write(facade.join("run.sh"), facade_script(expected))?;
    for f in &staged {
        println!("staged {}", f.display());
    }
    Ok(())
}

/// Builds the C ABI's GPU test binary and the release `libvision_towers_c.so`, compiles the C
/// test program against it (`$CC` or `cc`, RUNPATH `$ORIGIN`), copies all three into `capi` and
/// writes `capi/run.sh`.
fn stage_capi(root: &Path, target: &Path, capi: &Path) -> Result<()> {
    let out = Command::new("cargo")
        .current_dir(root)
        .args([
            "test",
            "-p",
            "vision-towers-c",
            "--release",
            "--no-run",
            "--test",
            "gpu",
            "--message-format=json",
        ])
        .output()
        .context("cargo test -p vision-towers-c --no-run")?;
    if !out.status.success() {
        bail!(
            "building the vision-towers-c GPU test binary failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut test_bin = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact"
            && v["profile"]["test"] == true
            && v["target"]["name"] == "gpu"
        {
            if let Some(exe) = v["executable"].as_str() {
                test_bin = Some(PathBuf::from(exe));
            }
        }
    }
    let test_bin =
        test_bin.context("no vision-towers-c `gpu` test executable in cargo's output")?;
    // The library the test build made with its rlib (deps/ holds the fresh one).
    let lib = target.join("release/deps/libvision_towers_c.so");
    if !lib.exists() {
        bail!("{} is missing after the build", lib.display());
    }
    std::fs::create_dir_all(capi)?;
    let staged_test = capi.join("vision_towers_c_gpu");
    let staged_lib = capi.join("libvision_towers_c.so");
    copy(&test_bin, &staged_test)?;
    copy(&lib, &staged_lib)?;
    let ctest = capi.join("vt_ctest");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let crate_dir = root.join("crates/vision-towers-c");
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c/vt_ctest.c"))
        .arg("-o")
        .arg(&ctest)
        .arg("-L")
        .arg(capi)
        .args([
            "-lvision_towers_c",
            "-Wl,-rpath,$ORIGIN",
            "-lpthread",
            "-ldl",
        ])
        .status()
        .with_context(|| format!("running {cc}"))?;
    if !status.success() {
        bail!("compiling vt_ctest failed");
    }
    strip_debug(&[staged_test.clone(), staged_lib.clone()]);
    std::fs::write(capi.join("run.sh"), capi_script())?;
    for f in [&staged_test, &staged_lib, &ctest] {
        println!("staged {}", f.display());
    }
    Ok(())
}

/// `.device/capi/run.sh`: the C ABI's GPU tests (`vision-towers-c` `tests/gpu.rs`) with the
/// staged library and C test program. Logs under `$OUT`.
fn capi_script() -> String {
    r#"#!/usr/bin/env bash
# Written by `cargo xtask gpu-test --prepare`. The C ABI's GPU tests (crates/vision-towers-c/tests/gpu.rs).
# Needs .device/capi carried; run from the checkout's root or anywhere: bash .device/capi/run.sh
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${OUT:-/tmp/capi-out}"
mkdir -p "$OUT" /tmp/capi-scratch
export VT_FIXTURES="${VT_FIXTURES:-$ROOT/fixtures}" VT_CAPI_LIB_DIR="$HERE" VT_CTEST="$HERE/vt_ctest"     VT_CAPI_SCRATCH=/tmp/capi-scratch
# The PTX the crates/gpu-core/kernels/*.cu of this tree give where it differs from the committed one (else the
# embedded SASS, what a user loads), unless GPU_CORE_PTX_DIR already names one.
if [ -z "${GPU_CORE_PTX_DIR:-}" ] && command -v "${NVCC:-nvcc}" >/dev/null; then
    fresh=$(bash "$ROOT/kernels/ptx_override.sh" /tmp/capi-ptx) && [ -n "$fresh" ] && export GPU_CORE_PTX_DIR="$fresh"
fi
echo "kernels: ${GPU_CORE_PTX_DIR:-embedded SASS}"
"$HERE/vision_towers_c_gpu" --ignored --test-threads=1 --nocapture 2>&1 | tee "$OUT/capi_tests.log"
rc=${PIPESTATUS[0]}
grep -E "^CAPI-|panicked|^test |test result" "$OUT/capi_tests.log" > "$OUT/capi_summary.txt" || true
echo "=== C ABI summary ==="
cat "$OUT/capi_summary.txt"
exit $rc
"#
    .to_string()
}

/// `.device/facade/run.sh`: the staged GPU tests (the facade's encode parity against the host
/// path on every fixture model, concurrency, out-of-memory, graphs, `vtower encode --device cuda`
/// against `--device cpu`; tower-step's batches), then the README's command with
/// `--device auto`. Fails when a test fails or fewer than `expected` GPU tests passed. Logs under `$OUT`.
fn facade_script(expected: usize) -> String {
    let tests: String = STAGED_GPU_TESTS
        .iter()
        .map(|(p, t)| {
            let name = staged_name(p, t);
            format!(
                "\"$HERE/{name}\" --ignored --test-threads=1 --nocapture 2>&1 | tee -a \"$OUT/facade_tests.log\"\n\
                 [ \"${{PIPESTATUS[0]}}\" -eq 0 ] || rc=1\n"
            )
        })
        .collect();
    format!(
        r#"#!/usr/bin/env bash
# Written by `cargo xtask gpu-test --prepare`. The staged GPU tests and `vtower` on CUDA.
# Needs .device/facade carried; run from anywhere: bash .device/facade/run.sh
set -uo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${{OUT:-/tmp/facade-out}}"
mkdir -p "$OUT"
export VT_FIXTURES="$ROOT/fixtures" VT_VTOWER="$HERE/vtower"
# The PTX the crates/gpu-core/kernels/*.cu of this tree give where it differs from the committed one (else the
# embedded SASS, what a user loads), unless GPU_CORE_PTX_DIR already names one (e.g. the one
# kernels/device_run.sh built).
if [ -z "${{GPU_CORE_PTX_DIR:-}}" ] && command -v "${{NVCC:-nvcc}}" >/dev/null; then
    fresh=$(bash "$ROOT/kernels/ptx_override.sh" /tmp/facade-ptx) && [ -n "$fresh" ] && export GPU_CORE_PTX_DIR="$fresh"
fi
echo "kernels: ${{GPU_CORE_PTX_DIR:-embedded SASS}}"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader || true
rc=0
: > "$OUT/facade_tests.log"
{tests}PASSED=$(grep -o "test result: [a-zA-Z]*\. [0-9]* passed" "$OUT/facade_tests.log" | awk '{{s += $4}} END {{print s + 0}}')
echo "GPU tests passed: $PASSED of {expected}" | tee -a "$OUT/facade_tests.log"
[ "$PASSED" -ge {expected} ] || {{ echo "FEWER GPU TESTS RAN THAN THE SOURCES HOLD ({expected})" | tee -a "$OUT/facade_tests.log"; rc=1; }}
"$VT_VTOWER" encode --device auto --model "$VT_FIXTURES/models/gemma4" --image "$VT_FIXTURES/images/coffee_144x96.jpg" --out /tmp/embeddings.safetensors 2>&1 | tee "$OUT/facade_cli.log"
[ "${{PIPESTATUS[0]}}" -eq 0 ] || rc=1
grep -E "^CUDA-|panicked|^test |test result|^GPU tests passed|^FEWER" "$OUT/facade_tests.log" > "$OUT/facade_summary.txt" || true
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `--ignored` selects exactly the GPU tests: no test in the workspace is ignored for another
    /// reason (a slow CPU test ignored that way would run on the GPU machine and count as a GPU
    /// test), and the GPU tests are where the sources say (tower-step's included).
    #[test]
    fn every_ignored_test_needs_a_cuda_device() {
        let root = workspace_root();
        let mut other = Vec::new();
        for f in rust_sources(&root).unwrap() {
            let text = std::fs::read_to_string(&f).unwrap();
            for (i, l) in text.lines().enumerate() {
                let l = l.trim();
                if l.starts_with("#[ignore") && l != GPU_IGNORE {
                    other.push(format!("{}:{}: {l}", f.display(), i + 1));
                }
            }
        }
        assert!(other.is_empty(), "{other:#?}");
        let sources = gpu_test_sources(&root).unwrap();
        for f in [
            "crates/gpu-core/src/gpu_tests.rs",
            "crates/tower-step/tests/cuda.rs",
            "crates/vision-towers/tests/cuda.rs",
            "crates/vision-towers/tests/graphs.rs",
        ] {
            assert!(
                sources.iter().any(|(p, n)| p.ends_with(f) && *n > 0),
                "{f}: {sources:?}"
            );
        }
    }

    /// Every file that holds a GPU test is in a target `gpu-test` runs (it once ran gpu-core's and
    /// two of vision-towers' targets only, and skipped tower-step's).
    #[test]
    fn gpu_test_runs_every_file_that_holds_a_gpu_test() {
        let root = workspace_root();
        let missed: Vec<_> = gpu_test_sources(&root)
            .unwrap()
            .into_iter()
            .filter(|(f, _)| !covered(GPU_TEST_RUNS, &root, f))
            .collect();
        assert!(missed.is_empty(), "not run by gpu-test: {missed:?}");
        // The coverage rule itself, on selections that miss.
        let r = root.join("crates/tower-step/tests/cuda.rs");
        assert!(!covered(&[&["-p", "gpu-core"]], &root, &r));
        assert!(!covered(&[&["-p", "tower-step", "--lib"]], &root, &r));
        assert!(!covered(
            &[&["-p", "tower-step", "--test", "graphs"]],
            &root,
            &r
        ));
        assert!(covered(
            &[&["-p", "tower-step", "--test", "cuda"]],
            &root,
            &r
        ));
        assert!(covered(&[&["-p", "tower-step"]], &root, &r));
        let lib = root.join("crates/gpu-core/src/gpu_tests.rs");
        assert!(covered(&[&["-p", "gpu-core", "--lib"]], &root, &lib));
        assert!(!covered(&[&["--workspace", "--test", "cuda"]], &root, &lib));
    }

    /// The staged binaries hold every GPU test outside gpu-core's library.
    #[test]
    fn prepare_stages_every_gpu_test_target() {
        let root = workspace_root();
        for (f, _) in gpu_test_sources(&root).unwrap() {
            if f.starts_with(root.join("crates/gpu-core/src")) {
                continue; // kernels/device_run.sh runs gpu-core's test binary
            }
            if f.ends_with("crates/vision-towers-c/tests/gpu.rs") {
                continue; // stage_capi stages it with the library and the C program
            }
            let staged = STAGED_GPU_TESTS
                .iter()
                .any(|(p, t)| f.ends_with(format!("crates/{p}/tests/{t}.rs")));
            assert!(staged, "{} is not staged by --prepare", f.display());
        }
    }

    #[test]
    fn libtest_summaries_are_counted() {
        assert_eq!(
            passed_in("test result: ok. 14 passed; 0 failed; 0 ignored; 0 measured; 120 filtered out; finished in 3.2s"),
            14
        );
        assert_eq!(
            passed_in("test result: FAILED. 2 passed; 1 failed; 0 ignored"),
            2
        );
        assert_eq!(
            passed_in("test result: ok. 0 passed; 0 failed; 3 ignored"),
            0
        );
        assert_eq!(passed_in("test foo ... ok"), 0);
        assert_eq!(passed_in("running 3 tests"), 0);
    }

    #[test]
    fn gpu_test_refuses_unknown_arguments() {
        assert!(gpu_test(&["--prepair".to_string()]).is_err());
    }
}
