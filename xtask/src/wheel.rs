//! The Python step of `cargo xtask test`: what ships is what is tested.
//!
//! 1. A build environment (`target/py-venv`, `python3 -m venv`; `VT_PYTHON` names another
//!    interpreter) with the pinned build tools ([`BUILD_TOOLS`]: maturin, and zig from PyPI as
//!    the C compiler and linker for an older glibc).
//! 2. The wheel we would ship: `maturin build --release --locked --zig --compatibility
//!    manylinux_2_28 --auditwheel check` (abi3, CPython ≥ 3.9, x86_64), with
//!    `VT_REQUIRE_JPEG_SIMD=1` (no wheel without libjpeg-turbo's SIMD). maturin's manylinux
//!    audit refuses it where a symbol needs a newer glibc or a library outside the policy is
//!    linked; the step prints the wheel's tag and the highest `GLIBC_x.y` its extension needs
//!    (`objdump -T`) and fails above [`GLIBC_CEILING`].
//! 3. A fresh environment (`target/py-wheel-venv`, made anew each run) with the pinned test
//!    tools ([`TEST_TOOLS`]) and that wheel installed from its file, run with a `PATH` that has
//!    no `cargo` or `rustc` on it; it checks that `vision_towers` imports from that
//!    environment, then runs pytest on `bindings/python/tests`.
use anyhow::{bail, ensure, Context, Result};
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::workspace_root;

/// Build tools of the wheel and of the C tarball (`dist.rs`), pinned (pip installs exactly
/// these). maturin's `--zig` and cargo-zigbuild (the version maturin embeds) run zig through
/// `python -m ziglang`.
pub const BUILD_TOOLS: [&str; 3] = [
    "maturin==1.16.0",
    "ziglang==0.14.1",
    "cargo-zigbuild==0.24.0",
];

/// Test tools of the installed wheel, pinned.
pub const TEST_TOOLS: [&str; 2] = ["pytest==9.2.0", "numpy==2.4.6"];

/// The manylinux policy of the wheel: glibc 2.28 (RHEL 8, Debian 10, Ubuntu 18.10 and later).
pub const MANYLINUX: &str = "manylinux_2_28";

/// The highest `GLIBC_` symbol version the extension may need (the [`MANYLINUX`] policy's).
pub const GLIBC_CEILING: [u32; 2] = [2, 28];

fn step(what: &str) {
    println!("\n==> {what}");
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The build environment, made if missing, with [`BUILD_TOOLS`] installed.
pub fn build_env() -> Result<PathBuf> {
    let venv = target_dir().join("py-venv");
    make_venv(&venv)?;
    pip_install(&venv, &BUILD_TOOLS, "the Python build tools")?;
    Ok(venv)
}

fn make_venv(venv: &Path) -> Result<()> {
    if venv.join("bin/python").exists() {
        return Ok(());
    }
    step(&format!("python3 -m venv {}", venv.display()));
    let interpreter = std::env::var("VT_PYTHON").unwrap_or_else(|_| "python3".into());
    run_checked(
        Command::new(&interpreter).args(["-m", "venv"]).arg(venv),
        "creating a virtual environment",
    )
}

fn pip_install(venv: &Path, what: &[&str], label: &str) -> Result<()> {
    step(&format!("pip install {}", what.join(" ")));
    run_checked(
        Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(what),
        &format!("installing {label}"),
    )
}

/// Entry point of `cargo xtask wheel`: [`build_wheel`] alone (the wheel the Python step tests,
/// for a machine that carries it elsewhere), its path printed last.
pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("wheel takes no arguments (got `{a}`)");
    }
    println!("{}", build_wheel()?.display());
    Ok(())
}

/// Builds the manylinux wheel into `target/wheels-ship/` (emptied first) and returns its path.
pub fn build_wheel() -> Result<PathBuf> {
    let root = workspace_root();
    let venv = build_env()?;
    let out = target_dir().join("wheels-ship");
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("emptying {}", out.display()))?;
    }
    step(&format!(
        "maturin build --release --locked --zig --compatibility {MANYLINUX} --auditwheel check (bindings/python)"
    ));
    let start = Instant::now();
    run_checked(
        Command::new(venv.join("bin/maturin"))
            .current_dir(root.join("bindings/python"))
            .args(["build", "--release", "--locked", "--zig", "--compatibility"])
            .arg(MANYLINUX)
            .args(["--auditwheel", "check", "--out"])
            .arg(&out)
            .env("VT_REQUIRE_JPEG_SIMD", "1")
            .env("VIRTUAL_ENV", &venv)
            .env("PATH", path_with(&venv.join("bin"))),
        "building the wheel",
    )?;
    println!("built the wheel in {:.0} s", start.elapsed().as_secs_f64());
    let wheels: Vec<PathBuf> = fs::read_dir(&out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let [wheel] = wheels.as_slice() else {
        bail!("{}: expected one wheel, found {wheels:?}", out.display());
    };
    Ok(wheel.clone())
}

/// The wheel's tags: `cp39-abi3-manylinux_2_28_x86_64` from its file name.
fn wheel_tag(wheel: &Path) -> Result<String> {
    let stem = wheel
        .file_stem()
        .and_then(|s| s.to_str())
        .context("a wheel file name")?;
    let parts: Vec<&str> = stem.split('-').collect();
    ensure!(parts.len() >= 5, "{stem} is not a wheel file name");
    Ok(parts[parts.len() - 3..].join("-"))
}

/// Unpacks the wheel's extension module next to it, prints the wheel's tag and the glibc
/// ceiling, and fails where the tag is not abi3 + [`MANYLINUX`] or the ceiling is above
/// [`GLIBC_CEILING`].
pub fn audit(wheel: &Path, python: &Path) -> Result<()> {
    let tag = wheel_tag(wheel)?;
    let dir = wheel.with_extension("contents");
    let script = "import sys, zipfile\n\
                  z = zipfile.ZipFile(sys.argv[1])\n\
                  so = [n for n in z.namelist() if n.endswith('.so')]\n\
                  assert len(so) == 1, so\n\
                  print(z.extract(so[0], sys.argv[2]))\n";
    let out = Command::new(python)
        .args(["-c", script])
        .arg(wheel)
        .arg(&dir)
        .output()
        .context("unpacking the wheel")?;
    ensure!(
        out.status.success(),
        "unpacking the wheel: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let so = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let ceiling = glibc_ceiling(&so)?.unwrap_or_else(|| "0".into());
    println!(
        "wheel {}\n  tag {tag}; the extension needs glibc {ceiling} (highest GLIBC_ symbol version, objdump -T)",
        wheel.display()
    );
    ensure!(
        tag.starts_with("cp39-abi3-") && tag.contains(&format!("{MANYLINUX}_x86_64")),
        "the wheel's tag {tag} is not cp39-abi3 {MANYLINUX}_x86_64"
    );
    let version: Vec<u32> = ceiling.split('.').filter_map(|p| p.parse().ok()).collect();
    ensure!(
        version.as_slice() <= GLIBC_CEILING.as_slice(),
        "the extension needs glibc {ceiling}, above {MANYLINUX}'s {}.{}",
        GLIBC_CEILING[0],
        GLIBC_CEILING[1]
    );
    Ok(())
}

/// Builds the wheel, installs it into a fresh environment without Rust on its `PATH`, and runs
/// the package's tests with `pytest_args` added.
pub fn python_tests(pytest_args: &[&str]) -> Result<()> {
    let root = workspace_root();
    let wheel = build_wheel()?;
    let venv = target_dir().join("py-wheel-venv");
    if venv.exists() {
        fs::remove_dir_all(&venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    make_venv(&venv)?;
    let python = venv.join("bin/python");
    audit(&wheel, &python)?;
    pip_install(&venv, &TEST_TOOLS, "the Python test tools")?;
    let wheel_arg = wheel.display().to_string();
    pip_install(&venv, &["--no-deps", &wheel_arg], "the wheel")?;

    // The tests' environment: this venv first, and no directory that holds cargo or rustc.
    let path = path_without_rust(&venv.join("bin"));
    let env = |cmd: &mut Command| {
        cmd.current_dir(&root)
            .env("PATH", &path)
            .env("VIRTUAL_ENV", &venv)
            .env_remove("PYTHONPATH")
            .env_remove("CARGO")
            .env_remove("RUSTUP_TOOLCHAIN");
    };
    let mut probe = Command::new(&python);
    env(&mut probe);
    let script = "import shutil, vision_towers as vt\n\
                  print(vt.__file__)\n\
                  print(shutil.which('cargo') or '', shutil.which('rustc') or '')\n";
    let out = probe
        .args(["-c", script])
        .output()
        .context("importing the installed package")?;
    ensure!(
        out.status.success(),
        "importing the installed package: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let file = PathBuf::from(lines.next().unwrap_or_default());
    ensure!(
        file.starts_with(&venv),
        "vision_towers imports from {}, not from the wheel installed in {}",
        file.display(),
        venv.display()
    );
    ensure!(
        lines.next().unwrap_or_default().trim().is_empty(),
        "cargo or rustc is still on the tests' PATH"
    );
    println!("vision_towers imports from {}", file.display());

    step("pytest bindings/python/tests (against the installed wheel)");
    let mut pytest = Command::new(&python);
    env(&mut pytest);
    run_checked(
        pytest
            .args(["-m", "pytest", "bindings/python/tests", "-q", "-rs"])
            .args(["-p", "no:cacheprovider"])
            .args(pytest_args),
        "the Python tests",
    )
}

/// The highest `GLIBC_x.y` symbol version `file` needs (`objdump -T`), e.g. `2.28`; `None`
/// where it needs none.
pub fn glibc_ceiling(file: &Path) -> Result<Option<String>> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(file)
        .output()
        .context("running objdump -T")?;
    ensure!(
        out.status.success(),
        "objdump -T {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(highest_glibc(&String::from_utf8_lossy(&out.stdout)))
}

/// The highest `GLIBC_x.y[.z]` version named in `objdump -T` output (`GLIBC_PRIVATE` aside).
fn highest_glibc(objdump: &str) -> Option<String> {
    let mut best: Option<(Vec<u32>, String)> = None;
    for word in objdump.split_whitespace() {
        let Some(v) = word.trim_matches(['(', ')']).strip_prefix("GLIBC_") else {
            continue;
        };
        let Ok(key) = v
            .split('.')
            .map(str::parse)
            .collect::<Result<Vec<u32>, _>>()
        else {
            continue; // GLIBC_PRIVATE
        };
        if best.as_ref().is_none_or(|(k, _)| key > *k) {
            best = Some((key, v.to_string()));
        }
    }
    best.map(|(_, v)| v)
}

/// `PATH` with `dir` in front.
pub fn path_with(dir: &Path) -> OsString {
    let mut parts = vec![dir.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        parts.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(parts).unwrap_or_default()
}

/// `dir` then `PATH` without the directories that hold `cargo` or `rustc`.
fn path_without_rust(dir: &Path) -> OsString {
    let mut parts = vec![dir.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        parts.extend(
            std::env::split_paths(&p)
                .filter(|d| !d.join("cargo").exists() && !d.join("rustc").exists()),
        );
    }
    std::env::join_paths(parts).unwrap_or_default()
}

/// Runs `cmd` to its end; an error naming `what` unless it started and exited 0.
pub fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_glibc_version_is_compared_numerically() {
        let text = "0000 DF *UND* 0000 (GLIBC_2.2.5) memcpy\n\
                    0000 DF *UND* 0000 (GLIBC_2.9) pipe2\n\
                    0000 DF *UND* 0000 (GLIBC_2.28) statx\n\
                    0000 DF *UND* 0000 (GLIBC_PRIVATE) _dl_x\n";
        assert_eq!(highest_glibc(text).as_deref(), Some("2.28"));
        assert_eq!(highest_glibc("no versions"), None);
    }
}
