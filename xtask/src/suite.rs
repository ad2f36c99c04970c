//! `cargo xtask test`: the whole suite CI runs (`.ci/run`), in one command —
//! `cargo test --workspace --locked`, the parity table (`cargo xtask parity`), the Python
//! package's tests (`bindings/python/tests`, pytest) against the wheel we would ship, every
//! library crate packaged and built from its `.crate` alone (`cargo xtask package`), and the C
//! release tarball checked from the outside (`cargo xtask dist --check`).
//!
//! The Python step builds the manylinux abi3 wheel (`maturin build --release --zig`), installs
//! it into a fresh virtual environment without Rust on its `PATH` and runs pytest there
//! (`wheel.rs`). GPU tests are skipped where no CUDA device exists; `cargo xtask gpu-test` runs
//! them on a GPU machine.
use anyhow::{bail, Context, Result};
use std::process::Command;
use std::time::Instant;

use crate::workspace_root;

/// Entry point of `cargo xtask test [--no-python | --python-only] [--no-package] [--no-dist]
/// [--no-fuzz]`.
pub fn run(args: &[String]) -> Result<()> {
    let (mut rust, mut python, mut package, mut dist, mut fuzz) = (true, true, true, true, true);
    for a in args {
        match a.as_str() {
            "--no-python" => python = false,
            "--python-only" => (rust, package, dist, fuzz) = (false, false, false, false),
            "--no-package" => package = false,
            "--no-dist" => dist = false,
            "--no-fuzz" => fuzz = false,
            other => bail!(
                "usage: cargo xtask test [--no-python | --python-only] [--no-package] [--no-dist] [--no-fuzz] (unknown argument {other})"
            ),
        }
    }
    if rust {
        timed("the Rust tests and parity", rust_tests)?;
    }
    if python {
        timed("the Python step", || python_tests(&[]))?;
    }
    // What is checked is what the tree holds: CI's clean clone, or a checkout's edits (cargo's
    // refusal of uncommitted files guards `cargo publish`, not this build).
    if package {
        step("cargo xtask package --allow-dirty");
        timed("the packaging step", || {
            crate::package::run(&["--allow-dirty".into()])
        })?;
    }
    if dist {
        timed("the C tarball step", || {
            crate::dist::run(&["--check".into()])
        })?;
    }
    // The fuzz step (crate::fuzz): its own module; `--python-only` skips it with the Rust steps.
    if fuzz {
        step("cargo xtask fuzz");
        timed("the fuzz step", || crate::fuzz::run(&[]))?;
    }
    Ok(())
}

fn timed(what: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let start = Instant::now();
    let r = f();
    println!("\n==> {what}: {:.0} s", start.elapsed().as_secs_f64());
    r
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

/// Builds the wheel, installs it in a fresh environment and runs the package's tests there with
/// `pytest_args` added (`wheel.rs`).
pub fn python_tests(pytest_args: &[&str]) -> Result<()> {
    crate::wheel::python_tests(pytest_args)
}

fn step(what: &str) {
    println!("\n==> {what}");
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}
