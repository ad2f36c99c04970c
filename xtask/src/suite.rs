//! `cargo xtask test`: the whole suite CI runs (`.ci/run`), in one command —
//! `cargo test --workspace --locked`, the parity table (`cargo xtask parity`), and the Python
//! package's tests (`bindings/python/tests`, pytest) against a build of the package.
//!
//! The Python step makes its own virtual environment under the target directory
//! (`target/py-venv`, `python3 -m venv`; `VT_PYTHON` names another interpreter), installs the
//! pinned build and test tools from the registry ([`PY_TOOLS`]), builds and installs the package
//! with `maturin develop` (the dev profile, in the workspace's target directory: the Rust tests'
//! artifacts are reused) and runs pytest. GPU tests there are skipped where no CUDA device
//! exists; `cargo xtask gpu-test` runs them on a GPU machine.
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::workspace_root;

/// Build and test tools of the Python step, pinned (pip installs exactly these).
pub const PY_TOOLS: [&str; 3] = ["maturin==1.16.0", "pytest==9.2.0", "numpy==2.4.6"];

/// Entry point of `cargo xtask test [--no-python | --python-only]`.
pub fn run(args: &[String]) -> Result<()> {
    let (mut rust, mut python) = (true, true);
    let mut fuzz = true;
    for a in args {
        match a.as_str() {
            "--no-python" => python = false,
            "--python-only" => rust = false,
            "--no-fuzz" => fuzz = false,
            other => bail!(
                "usage: cargo xtask test [--no-python | --python-only] [--no-fuzz] (unknown argument {other})"
            ),
        }
    }
    if rust {
        rust_tests()?;
    }
    if python {
        python_tests(&[])?;
    }
    // The fuzz step (crate::fuzz): its own module; `--python-only` skips it with the Rust steps.
    if fuzz && rust {
        step("cargo xtask fuzz");
        crate::fuzz::run(&[])?;
    }
    Ok(())
}

fn rust_tests() -> Result<()> {
    let root = workspace_root();
    step("cargo test --workspace --locked");
    let status = Command::new(cargo())
        .current_dir(&root)
        .args(["test", "--workspace", "--locked"])
        .status()
        .context("running cargo test")?;
    if !status.success() {
        bail!("cargo test --workspace --locked failed ({status})");
    }
    step("cargo xtask parity");
    crate::parity::run(&[])
}

fn step(what: &str) {
    println!("\n==> {what}");
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The virtual environment of the Python step, made (with [`PY_TOOLS`]) if missing.
pub fn python_env() -> Result<PathBuf> {
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let venv = target.join("py-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        step(&format!("python3 -m venv {}", venv.display()));
        let interpreter = std::env::var("VT_PYTHON").unwrap_or_else(|_| "python3".into());
        run_checked(
            Command::new(&interpreter).args(["-m", "venv"]).arg(&venv),
            "creating the virtual environment",
        )?;
    }
    step(&format!("pip install {}", PY_TOOLS.join(" ")));
    run_checked(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(PY_TOOLS),
        "installing the Python build and test tools",
    )?;
    Ok(venv)
}

/// Builds and installs the package into the step's environment and runs its tests with
/// `pytest_args` added.
pub fn python_tests(pytest_args: &[&str]) -> Result<()> {
    let root = workspace_root();
    let venv = python_env()?;
    let python = venv.join("bin/python");
    step("maturin develop --locked (bindings/python)");
    run_checked(
        Command::new(venv.join("bin/maturin"))
            .current_dir(root.join("bindings/python"))
            .args(["develop", "--locked", "--quiet"])
            .env("VIRTUAL_ENV", &venv)
            .env("PATH", path_with(&venv.join("bin"))),
        "building the Python package",
    )?;
    step("pytest bindings/python/tests");
    run_checked(
        Command::new(&python)
            .current_dir(&root)
            .args(["-m", "pytest", "bindings/python/tests", "-q", "-rs"])
            .args(pytest_args),
        "the Python tests",
    )
}

fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut parts = vec![dir.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        parts.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(parts).unwrap_or_default()
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}
