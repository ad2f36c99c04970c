//! `cargo xtask dist [--check]`: the C library as one relocatable tarball,
//! `target/dist/vision-towers-<version>-x86_64-linux.tar.gz`:
//!
//! ```text
//! vision-towers-<version>-x86_64-linux/
//!   include/vision_towers.h                     the committed cbindgen header
//!   lib/libvision_towers_c.so.<abi>             SONAME libvision_towers_c.so.<abi> (VT_ABI_VERSION)
//!   lib/libvision_towers_c.so -> .so.<abi>      the link-time name
//!   lib/libvision_towers_c.a
//!   lib/pkgconfig/vision_towers.pc              prefix=${pcfiledir}/../..
//!   lib/cmake/vision_towers/vision_towersConfig.cmake, …ConfigVersion.cmake
//!   LICENSE, README.md
//! ```
//!
//! The templates are `crates/vision-towers-c/dist/*.in` (`@VERSION@`, `@ABI@`, `@SONAME@`,
//! `@MAJOR@`, `@MAJOR_MINOR@`). The library is built by the pinned cargo-zigbuild (the wheel's
//! build environment, `wheel.rs`) for glibc 2.28, in its own target directory
//! (`target/dist-build`: zig's linker is part of cargo's fingerprint, so sharing the wheel's
//! would rebuild one or the other every run), with `VT_REQUIRE_JPEG_SIMD=1` (libjpeg-turbo's SIMD
//! or no build), through `cargo rustc` so the SONAME link argument reaches the cdylib alone: the
//! `.so` under `target/<profile>/` that the C tests link by path keeps none.
//!
//! `--check` (a step of `cargo xtask test`) then unpacks the tarball elsewhere and builds the
//! examples against the unpacked tree only: `examples/c/encode.c` with pkg-config, and
//! `examples/cpp` with CMake `find_package(vision_towers)`; runs both on the fixture models on
//! the CPU and compares the rows they write with upstream's float64 rows (`fixtures/outputs`,
//! rel-L2 ≤ the host bound), and checks that each program loaded the unpacked library.
use anyhow::{bail, ensure, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::parity_case::{rel_l2, Arith, Case};
use crate::workspace_root;

/// The cargo profile of the tarball's libraries (the Python wheel's too).
pub const PROFILE: &str = "release";

/// The target of the tarball's libraries: x86_64 Linux with glibc 2.28 symbols at most
/// (cargo-zigbuild, zig as the C compiler and linker), as the wheel's `manylinux_2_28`.
const ZIG_TARGET: &str = "x86_64-unknown-linux-gnu.2.28";

/// Entry point of `cargo xtask dist [--check]`.
pub fn run(args: &[String]) -> Result<()> {
    let mut check_it = false;
    for a in args {
        match a.as_str() {
            "--check" => check_it = true,
            other => bail!("usage: cargo xtask dist [--check] (unknown argument {other})"),
        }
    }
    let tarball = build()?;
    if check_it {
        check(&tarball)?;
    }
    Ok(())
}

/// What the tarball is named after.
struct Names {
    version: String,
    abi: u32,
    /// `vision-towers-<version>-x86_64-linux`: the tarball's stem and its top directory.
    stem: String,
    soname: String,
}

fn names() -> Result<Names> {
    let version = env!("CARGO_PKG_VERSION").to_string();
    let header = header_path();
    let text =
        fs::read_to_string(&header).with_context(|| format!("reading {}", header.display()))?;
    let abi = text
        .lines()
        .find_map(|l| l.strip_prefix("#define VT_ABI_VERSION "))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("{}: no `#define VT_ABI_VERSION <n>`", header.display()))?;
    Ok(Names {
        stem: format!("vision-towers-{version}-x86_64-linux"),
        soname: format!("libvision_towers_c.so.{abi}"),
        version,
        abi,
    })
}

fn header_path() -> PathBuf {
    workspace_root().join("crates/vision-towers-c/include/vision_towers.h")
}

/// The cargo target directory: `$CARGO_TARGET_DIR`, else the workspace's `target/`.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn step(what: &str) {
    println!("\n==> {what}");
}

/// Builds the library and writes the tarball; returns its path.
pub fn build() -> Result<PathBuf> {
    let root = workspace_root();
    let n = names()?;
    ensure!(
        cfg!(all(target_os = "linux", target_arch = "x86_64")),
        "cargo xtask dist makes the x86_64 Linux tarball; run it on x86_64 Linux"
    );
    let soname_arg = format!("link-arg=-Wl,-soname,{}", n.soname);
    let venv = crate::wheel::build_env()?;
    let build_dir = target_dir().join("dist-build");
    step(&format!(
        "cargo-zigbuild rustc --target {ZIG_TARGET} --profile {PROFILE} --locked -p vision-towers-c --lib -- -C {soname_arg}"
    ));
    let start = std::time::Instant::now();
    crate::wheel::run_checked(
        Command::new(venv.join("bin/cargo-zigbuild"))
            .current_dir(&root)
            .args([
                "rustc",
                "--target",
                ZIG_TARGET,
                "--profile",
                PROFILE,
                "--locked",
            ])
            .arg("--target-dir")
            .arg(&build_dir)
            .args(["-p", "vision-towers-c", "--lib", "--", "-C", &soname_arg])
            .env("VT_REQUIRE_JPEG_SIMD", "1")
            .env("PATH", crate::wheel::path_with(&venv.join("bin"))),
        "building the C library",
    )?;
    println!(
        "built the C library in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    let built = build_dir.join("x86_64-unknown-linux-gnu").join(PROFILE);

    let dist = target_dir().join("dist");
    let top = dist.join(&n.stem);
    if top.exists() {
        fs::remove_dir_all(&top).with_context(|| format!("removing {}", top.display()))?;
    }
    let (inc, lib) = (top.join("include"), top.join("lib"));
    let (pc, cmake) = (lib.join("pkgconfig"), lib.join("cmake/vision_towers"));
    for d in [&inc, &pc, &cmake] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    copy(&header_path(), &inc.join("vision_towers.h"))?;
    copy(&built.join("libvision_towers_c.so"), &lib.join(&n.soname))?;
    copy(
        &built.join("libvision_towers_c.a"),
        &lib.join("libvision_towers_c.a"),
    )?;
    std::os::unix::fs::symlink(&n.soname, lib.join("libvision_towers_c.so"))
        .context("linking libvision_towers_c.so")?;
    // The release profile keeps line tables (debug = 1) for profiling; a shipped library does
    // not need them, nor the shared library its local symbols (its exports stay in .dynsym).
    crate::wheel::run_checked(
        Command::new("strip")
            .arg("--strip-unneeded")
            .arg(lib.join(&n.soname)),
        "stripping the shared library",
    )?;
    crate::wheel::run_checked(
        Command::new("strip")
            .arg("--strip-debug")
            .arg(lib.join("libvision_towers_c.a")),
        "stripping the static library's debug info",
    )?;
    let templates = root.join("crates/vision-towers-c/dist");
    for (from, to) in [
        ("vision_towers.pc.in", pc.join("vision_towers.pc")),
        (
            "vision_towersConfig.cmake.in",
            cmake.join("vision_towersConfig.cmake"),
        ),
        (
            "vision_towersConfigVersion.cmake.in",
            cmake.join("vision_towersConfigVersion.cmake"),
        ),
        ("README.md.in", top.join("README.md")),
    ] {
        fill(&templates.join(from), &to, &n)?;
    }
    copy(&root.join("LICENSE"), &top.join("LICENSE"))?;

    let tarball = dist.join(format!("{}.tar.gz", n.stem));
    crate::wheel::run_checked(
        Command::new("tar")
            .current_dir(&dist)
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "-czf",
            ])
            .arg(&tarball)
            .arg(&n.stem),
        "writing the tarball",
    )?;
    let so = lib.join(&n.soname);
    println!(
        "{} ({:.1} MiB): SONAME {}, needs glibc {} (highest GLIBC_ symbol version of {})",
        tarball.display(),
        fs::metadata(&tarball)?.len() as f64 / (1 << 20) as f64,
        soname(&so)?,
        crate::wheel::glibc_ceiling(&so)?.unwrap_or_else(|| "(none)".into()),
        n.soname,
    );
    Ok(tarball)
}

fn fill(template: &Path, to: &Path, n: &Names) -> Result<()> {
    let text =
        fs::read_to_string(template).with_context(|| format!("reading {}", template.display()))?;
    let mut parts = n.version.split('.');
    let major = parts.next().unwrap_or("0");
    let minor = parts.next().unwrap_or("0");
    let out = text
        .replace("@VERSION@", &n.version)
        .replace("@ABI@", &n.abi.to_string())
        .replace("@SONAME@", &n.soname)
        .replace("@MAJOR_MINOR@", &format!("{major}.{minor}"))
        .replace("@MAJOR@", major);
    ensure!(
        !out.contains('@'),
        "{}: a placeholder is left unfilled",
        template.display()
    );
    fs::write(to, out).with_context(|| format!("writing {}", to.display()))
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .map(drop)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))
}

/// The SONAME of a shared library (`objdump -p`).
fn soname(so: &Path) -> Result<String> {
    let out = output(Command::new("objdump").arg("-p").arg(so), "objdump -p")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("SONAME"))
        .map(|s| s.trim().to_string())
        .with_context(|| format!("{} has no SONAME", so.display()))
}

/// Unpacks `tarball` in a fresh directory, builds the C example (pkg-config) and the C++
/// example (CMake) against that tree alone, runs both on fixture models and compares their rows
/// with upstream's.
pub fn check(tarball: &Path) -> Result<()> {
    let root = workspace_root();
    let n = names()?;
    let work = target_dir().join("dist-check");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    fs::create_dir_all(&work)?;
    step(&format!(
        "unpack {} in {}",
        tarball.display(),
        work.display()
    ));
    crate::wheel::run_checked(
        Command::new("tar")
            .arg("-xzf")
            .arg(tarball)
            .arg("-C")
            .arg(&work),
        "unpacking the tarball",
    )?;
    let prefix = work.join(&n.stem);
    for f in [
        "include/vision_towers.h",
        "lib/libvision_towers_c.a",
        "lib/libvision_towers_c.so",
        "lib/pkgconfig/vision_towers.pc",
        "lib/cmake/vision_towers/vision_towersConfig.cmake",
        "lib/cmake/vision_towers/vision_towersConfigVersion.cmake",
        "LICENSE",
        "README.md",
    ] {
        ensure!(prefix.join(f).exists(), "the tarball lacks {f}");
    }
    let so = prefix.join("lib").join(&n.soname);
    let found = soname(&so)?;
    ensure!(found == n.soname, "SONAME {found}, expected {}", n.soname);
    let lib_dir = fs::canonicalize(prefix.join("lib"))?;
    let examples = root.join("crates/vision-towers-c/examples");
    let fixtures = root.join("fixtures");

    // C, through pkg-config.
    step("examples/c/encode.c with pkg-config against the unpacked tree");
    let pkg = |args: &[&str]| -> Result<String> {
        let out = output(
            Command::new("pkg-config")
                .args(args)
                .arg("vision_towers")
                .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
                .env_remove("PKG_CONFIG_LIBDIR"),
            "pkg-config",
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let version = pkg(&["--modversion"])?;
    ensure!(
        version == n.version,
        "pkg-config says {version}, the tarball is {}",
        n.version
    );
    let cflags = pkg(&["--cflags"])?;
    let libs = pkg(&["--libs"])?;
    let libdir = pkg(&["--variable=libdir"])?;
    ensure!(
        fs::canonicalize(&libdir).ok().as_deref() == Some(lib_dir.as_path()),
        "pkg-config's libdir {libdir} is not the unpacked tree's lib/ ({})",
        lib_dir.display()
    );
    println!("pkg-config --cflags --libs vision_towers: {cflags} {libs}");
    let encode = work.join("encode");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    crate::wheel::run_checked(
        Command::new(&cc)
            .args(["-std=c99", "-Wall", "-Wextra", "-Werror"])
            .args(cflags.split_whitespace())
            .arg(examples.join("c/encode.c"))
            .arg("-o")
            .arg(&encode)
            .args(libs.split_whitespace())
            .arg(format!("-Wl,-rpath,{libdir}")),
        "compiling examples/c/encode.c",
    )?;
    let case = fixtures.join("outputs/gemma4/tiny_20x15.safetensors");
    let (model, images) = case_inputs(&fixtures, &case)?;
    let rows = work.join("encode-rows.f32");
    let mut cmd = Command::new(&encode);
    cmd.arg(&model).args(&images).arg("cpu").arg(&rows);
    let out = output(&mut cmd, "examples/c/encode.c")?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    loads_from(&encode, &lib_dir, &n.soname)?;
    compare_rows(&rows, &case)?;

    // C++, through CMake.
    step("examples/cpp with CMake find_package(vision_towers) against the unpacked tree");
    let build = work.join("build-cpp");
    crate::wheel::run_checked(
        Command::new("cmake")
            .arg("-S")
            .arg(examples.join("cpp"))
            .arg("-B")
            .arg(&build)
            .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
            .args(["-DCMAKE_BUILD_TYPE=Release", "--log-level=WARNING"]),
        "configuring examples/cpp",
    )?;
    crate::wheel::run_checked(
        Command::new("cmake").arg("--build").arg(&build),
        "building examples/cpp",
    )?;
    let case = fixtures.join("outputs/glm5_next/batch2.safetensors");
    let (model, images) = case_inputs(&fixtures, &case)?;
    for name in ["engine", "engine_static"] {
        let engine = build.join(name);
        let rows = work.join(format!("{name}-rows.f32"));
        let mut cmd = Command::new(&engine);
        cmd.arg("-o")
            .arg(&rows)
            .arg(&model)
            .arg("cpu")
            .args(&images);
        let out = output(&mut cmd, &format!("examples/cpp {name}"))?;
        print!("{name}: {}", String::from_utf8_lossy(&out.stdout));
        if name == "engine" {
            loads_from(&engine, &lib_dir, &n.soname)?;
        }
        compare_rows(&rows, &case)?;
    }
    println!("dist check: both examples built against the unpacked tree and match upstream");
    Ok(())
}

/// The model directory and the image files of a fixture case (its `fixture` metadata).
fn case_inputs(fixtures: &Path, case: &Path) -> Result<(PathBuf, Vec<PathBuf>)> {
    let c = Case::open(case)?;
    let model = c.meta["model"]
        .as_str()
        .with_context(|| format!("{}: no model in its metadata", case.display()))?;
    let images = c.meta["images"]
        .as_array()
        .with_context(|| format!("{}: no images in its metadata", case.display()))?
        .iter()
        .map(|i| i.as_str().map(|i| fixtures.join("images").join(i)))
        .collect::<Option<Vec<_>>>()
        .with_context(|| format!("{}: an image name is not a string", case.display()))?;
    Ok((fixtures.join(model), images))
}

/// The rows a program wrote (raw f32) against the case's float64 `rows`: same shape, rel-L2
/// within the host bound.
fn compare_rows(rows: &Path, case: &Path) -> Result<()> {
    let want = Case::open(case)?.tensor("f64/rows")?;
    let bytes = fs::read(rows).with_context(|| format!("reading {}", rows.display()))?;
    let got: Vec<f64> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
        .collect();
    ensure!(
        bytes.len() % 4 == 0 && got.len() == want.data.len(),
        "{}: {} values, upstream's rows {:?} are {}",
        rows.display(),
        bytes.len() as f64 / 4.0,
        want.shape,
        want.data.len()
    );
    let rel = rel_l2(&got, &want.data);
    let bound = Arith::HostF32.bound();
    println!(
        "rows {:?} against {}: rel-L2 {rel:.3e} (bound {bound:.0e})",
        want.shape,
        case.strip_prefix(workspace_root())
            .unwrap_or(case)
            .display()
    );
    ensure!(
        rel <= bound,
        "rel-L2 {rel:.3e} is over the bound {bound:.0e}"
    );
    Ok(())
}

/// `program` resolves the library to the unpacked tree (`ldd`), not to a build directory.
fn loads_from(program: &Path, lib_dir: &Path, soname: &str) -> Result<()> {
    let out = output(Command::new("ldd").arg(program), "ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(soname))
        .with_context(|| format!("{} does not need {soname}:\n{text}", program.display()))?;
    let path = line
        .split("=>")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .map(PathBuf::from)
        .with_context(|| format!("ldd: {line}"))?;
    let dir = fs::canonicalize(&path)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    ensure!(
        dir.as_deref() == Some(lib_dir),
        "{} loads {} from {}, not from the unpacked tree {}",
        program.display(),
        soname,
        path.display(),
        lib_dir.display()
    );
    Ok(())
}

fn output(cmd: &mut Command, what: &str) -> Result<Output> {
    let out = cmd
        .output()
        .with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows check fails on rows off by more than the host bound and on a wrong row count,
    /// and passes on upstream's own rows rounded to f32.
    #[test]
    fn the_rows_check_can_fail() {
        let case = workspace_root().join("fixtures/outputs/gemma4/tiny_20x15.safetensors");
        let want = Case::open(&case).unwrap().tensor("f64/rows").unwrap();
        let dir = std::env::temp_dir().join(format!("xtask-dist-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, values: &[f64]| {
            let path = dir.join(name);
            let bytes: Vec<u8> = values
                .iter()
                .flat_map(|&v| (v as f32).to_le_bytes())
                .collect();
            fs::write(&path, bytes).unwrap();
            path
        };
        let exact = write("exact.f32", &want.data);
        assert!(compare_rows(&exact, &case).is_ok());
        let off: Vec<f64> = want.data.iter().map(|v| v * (1.0 + 1e-4)).collect();
        let off = write("off.f32", &off);
        assert!(compare_rows(&off, &case).is_err());
        let short = write("short.f32", &want.data[..want.data.len() - 1]);
        assert!(compare_rows(&short, &case).is_err());
        fs::remove_dir_all(&dir).ok();
    }
}
