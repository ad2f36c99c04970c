//! `cargo xtask package [--allow-dirty]`: every library crate as the `.crate` `cargo publish`
//! would upload, checked, then built from those packaged sources alone.
//!
//! 1. `cargo package --no-verify --exclude-lockfile -p <each of LIBRARY_CRATES>`, into
//!    `target/package/`. `publish = false` keeps the crates off crates.io, and cargo adds only
//!    publishable crates to the local registry overlay that `cargo package --workspace` verifies
//!    interdependent crates with: so the verify step is ours (3). No lockfile: resolving one would
//!    look the sibling crates up on crates.io, where they are not.
//! 2. Each `.crate`'s size (compressed, as uploaded) and file count; a crate over crates.io's
//!    10 MiB limit fails, and so does gpu-core's when it lacks a file gpu-core needs: every PTX,
//!    fatbin and source its two manifests list, and the manifests (`include_str!` /
//!    `include_bytes!` need the code; its tests hash the sources).
//! 3. The `.crate`s unpacked side by side under `target/package/verify/` as the members of a
//!    scratch workspace whose `[patch.crates-io]` points each crate's name at its unpacked
//!    sources, the repository's `Cargo.lock` copied in to pin the other dependencies; then
//!    `cargo build --workspace` there (libraries and the `vtower` binary, default features), in
//!    its own target directory (`target/package/verify-target`, kept between runs). Nothing of
//!    the repository outside the `.crate`s is in reach of that build.
//! 4. A scratch crate in that workspace (`scratch-encode`, not published) depends on
//!    `vision-towers` by version, as an engine would from a registry (the patch resolves it to the
//!    packaged sources), and runs the README's encode (`Model::open` on the CPU, `encode` of one
//!    image) on each fixture family; its rows must be bitwise the rows this repository's library
//!    gives for the same model and image (what `vtower encode --device cpu` writes).
use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::workspace_root;

/// The published crates, dependencies first (the order they are listed and built in). xtask,
/// the Python package and the fuzz targets are not published.
pub(crate) const LIBRARY_CRATES: [&str; 10] = [
    "tower-core",
    "gguf-reader",
    "st-reader",
    "vision-prep",
    "gpu-core",
    "tower-gemma",
    "tower-glm5",
    "tower-step",
    "vision-towers",
    "vision-towers-c",
];

/// crates.io refuses a `.crate` larger than this (its default `max_upload_size`, 10 MiB).
const CRATES_IO_MAX_BYTES: u64 = 10 << 20;

/// gpu-core's kernel directory, inside its package.
const GPU_CORE_KERNELS: &str = "crates/gpu-core/kernels";

/// Entry point of `cargo xtask package [--allow-dirty]`.
pub fn run(args: &[String]) -> Result<()> {
    let mut allow_dirty = false;
    for a in args {
        match a.as_str() {
            "--allow-dirty" => allow_dirty = true,
            other => bail!("usage: cargo xtask package [--allow-dirty] (unknown argument {other})"),
        }
    }
    let root = workspace_root();
    let version = env!("CARGO_PKG_VERSION");
    let out = crate::dist::target_dir().join("package");

    let mut cmd = Command::new(cargo());
    cmd.current_dir(&root)
        .args(["package", "--no-verify", "--exclude-lockfile"]);
    for name in LIBRARY_CRATES {
        cmd.args(["-p", name]);
    }
    if allow_dirty {
        cmd.arg("--allow-dirty");
    }
    let status = cmd.status().context("running cargo package")?;
    ensure!(status.success(), "cargo package failed ({status})");

    let mut crates = Vec::new();
    let mut failures = Vec::new();
    println!("\n| crate | .crate size | files |\n|---|---:|---:|");
    for name in LIBRARY_CRATES {
        let path = out.join(format!("{name}-{version}.crate"));
        let size = fs::metadata(&path)
            .with_context(|| format!("{}: cargo package wrote no such file", path.display()))?
            .len();
        let files = list(&path)?;
        println!("| {name} | {} | {} |", human(size), files.len());
        if size > CRATES_IO_MAX_BYTES {
            failures.push(format!(
                "{name}: {size} bytes, over crates.io's limit of {CRATES_IO_MAX_BYTES}"
            ));
        }
        if name == "gpu-core" {
            let missing: Vec<_> = gpu_core_needs(&root)?
                .into_iter()
                .filter(|f| !files.contains(f))
                .collect();
            if !missing.is_empty() {
                failures.push(format!(
                    "gpu-core's .crate lacks {} (its `include` in crates/gpu-core/Cargo.toml)",
                    missing.join(", ")
                ));
            }
        }
        crates.push((name, path));
    }
    if !failures.is_empty() {
        bail!("packaging:\n  {}", failures.join("\n  "));
    }
    verify(&root, &out, version, &crates)
}

/// The files of a `.crate`, relative to its top directory (`<name>-<version>/`).
fn list(crate_file: &Path) -> Result<BTreeSet<String>> {
    let output = Command::new("tar")
        .arg("-tzf")
        .arg(crate_file)
        .output()
        .context("running tar")?;
    ensure!(
        output.status.success(),
        "tar -tzf {}: {}",
        crate_file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?
        .lines()
        .filter(|l| !l.ends_with('/'))
        .filter_map(|l| l.split_once('/').map(|(_, rel)| rel.to_string()))
        .collect())
}

/// The files gpu-core's package must carry, relative to the crate: both manifests, and every
/// source (`ptx/MANIFEST.json`'s `sources`), PTX (`sass/MANIFEST.json`'s `ptx`) and fatbin
/// (its `fatbin`, tiers included) they list. gpu-core's own tests tie the manifests to the
/// embedded modules, so this list is the crate's.
fn gpu_core_needs(root: &Path) -> Result<Vec<String>> {
    let kernels = root.join(GPU_CORE_KERNELS);
    let read = |rel: &str| -> Result<serde_json::Value> {
        let path = kernels.join(rel);
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    };
    let (ptx, sass) = (read("ptx/MANIFEST.json")?, read("sass/MANIFEST.json")?);
    let mut needs = vec![
        "kernels/ptx/MANIFEST.json".to_string(),
        "kernels/sass/MANIFEST.json".to_string(),
    ];
    for (manifest, key, dir) in [
        (&ptx, "sources", "kernels/"),
        (&sass, "ptx", "kernels/ptx/"),
        (&sass, "fatbin", "kernels/sass/"),
    ] {
        let names = manifest[key]
            .as_object()
            .with_context(|| format!("{GPU_CORE_KERNELS}: a manifest without its `{key}` map"))?;
        ensure!(
            !names.is_empty(),
            "{GPU_CORE_KERNELS}: `{key}` lists nothing"
        );
        needs.extend(names.keys().map(|n| format!("{dir}{n}")));
    }
    Ok(needs)
}

/// Builds the packaged crates from their `.crate`s alone (the module docs, step 3).
fn verify(root: &Path, out: &Path, version: &str, crates: &[(&str, PathBuf)]) -> Result<()> {
    let work = out.join("verify");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("clearing {}", work.display()))?;
    }
    fs::create_dir_all(&work)?;
    let mut members = String::new();
    let mut patches = String::new();
    for (name, file) in crates {
        // `-m`: the files get the time of unpacking, not the .crate's fixed 2006 mtime, so cargo's
        // mtime fingerprints rebuild these crates instead of trusting a previous run's artifacts.
        let status = Command::new("tar")
            .arg("-xzmf")
            .arg(file)
            .arg("-C")
            .arg(&work)
            .status()
            .context("running tar")?;
        ensure!(status.success(), "unpacking {} failed", file.display());
        members.push_str(&format!("    \"{name}-{version}\",\n"));
        patches.push_str(&format!("{name} = {{ path = \"{name}-{version}\" }}\n"));
    }
    write_scratch(&work, version)?;
    members.push_str(&format!("    \"{SCRATCH}\",\n"));
    fs::write(
        work.join("Cargo.toml"),
        format!(
            "# Written by `cargo xtask package`: the packaged crates, built from their .crate alone.\n\
             [workspace]\nresolver = \"2\"\nmembers = [\n{members}]\n\n[patch.crates-io]\n{patches}"
        ),
    )?;
    fs::copy(root.join("Cargo.lock"), work.join("Cargo.lock")).context("copying Cargo.lock")?;
    let target = out.join("verify-target");
    println!("\n==> cargo build --workspace in {}", work.display());
    let status = Command::new(cargo())
        .current_dir(&work)
        .env("CARGO_TARGET_DIR", &target)
        .args(["build", "--workspace"])
        .status()
        .context("running cargo build")?;
    ensure!(
        status.success(),
        "the packaged crates do not build from their .crate files alone ({status}; sources in {})",
        work.display()
    );
    println!(
        "packaged crates: {} .crate files in {}, built from them alone",
        crates.len(),
        out.display()
    );
    scratch_encodes(root, &target)
}

/// The scratch crate's name (a member of the verify workspace, never published).
const SCRATCH: &str = "scratch-encode";

/// The fixture models and image the scratch crate encodes, one per family's program.
const SCRATCH_CASES: [&str; 4] = ["gemma4", "glm5_next", "glm_ocr", "step3p7"];
const SCRATCH_IMAGE: &str = "fixtures/images/coffee_144x96.jpg";

/// Writes the scratch crate: a binary that depends on `vision-towers` by version (as an engine
/// from a registry) and writes the README's CPU encode of one image as little-endian f32.
fn write_scratch(work: &Path, version: &str) -> Result<()> {
    let dir = work.join(SCRATCH);
    fs::create_dir_all(dir.join("src"))?;
    fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"{SCRATCH}\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
             [dependencies]\nvision-towers = {{ version = \"{version}\", default-features = false }}\n"
        ),
    )?;
    fs::write(
        dir.join("src/main.rs"),
        r#"//! The README's encode, from the packaged crates: MODEL IMAGE OUT (rows as f32 LE).
use std::io::Write;
use std::path::Path;
use vision_towers::vision_prep::{ImageSource, PrepSettings};
use vision_towers::{Device, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, model, image, out] = args.as_slice() else {
        return Err("usage: scratch-encode MODEL IMAGE OUT".into());
    };
    let model = Model::open(Path::new(model), Device::Cpu, PrepSettings::default())?;
    let bytes = std::fs::read(image)?;
    let encoded = model.encode(&[ImageSource::Bytes(&bytes)])?;
    let mut file = std::io::BufWriter::new(std::fs::File::create(out)?);
    for e in &encoded {
        for v in &e.rows {
            file.write_all(&v.to_le_bytes())?;
        }
    }
    file.flush()?;
    Ok(())
}
"#,
    )?;
    Ok(())
}

/// Runs the scratch crate's encode on every fixture family and compares its rows, bitwise, with
/// this repository's library on the same model and image.
fn scratch_encodes(root: &Path, target: &Path) -> Result<()> {
    use vision_towers::vision_prep::{ImageSource, PrepSettings};
    let exe = target.join("debug").join(SCRATCH);
    let image = root.join(SCRATCH_IMAGE);
    let bytes = fs::read(&image).with_context(|| format!("reading {}", image.display()))?;
    println!("\n| fixture model | rows × width | scratch crate vs repository |\n|---|---|---|");
    for case in SCRATCH_CASES {
        let model = root.join("fixtures/models").join(case);
        let out = target.join(format!("scratch-{case}.f32"));
        let status = Command::new(&exe)
            .arg(&model)
            .arg(&image)
            .arg(&out)
            .status()
            .with_context(|| format!("running {}", exe.display()))?;
        ensure!(
            status.success(),
            "the scratch crate's encode of {case} failed ({status})"
        );
        let got = fs::read(&out)?;
        let m = vision_towers::Model::open(
            &model,
            vision_towers::Device::Cpu,
            PrepSettings::default(),
        )?;
        let want: Vec<u8> = m
            .encode(&[ImageSource::Bytes(&bytes)])?
            .iter()
            .flat_map(|e| e.rows.iter().flat_map(|v| v.to_le_bytes()))
            .collect();
        let rows = want.len() / 4 / m.width().max(1);
        ensure!(
            got == want,
            "{case}: the packaged crates' rows differ from the repository's ({} vs {} bytes)",
            got.len(),
            want.len()
        );
        println!("| {case} | {rows} × {} | bitwise equal |", m.width());
    }
    Ok(())
}

/// A size in KiB under a MiB, else in MiB.
fn human(bytes: u64) -> String {
    if bytes < 1 << 20 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{:.2} MiB", bytes as f64 / (1 << 20) as f64)
    }
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every crate under `crates/` is a member of the workspace and one of [`LIBRARY_CRATES`]
    /// (so a new crate is packaged, or left out on purpose here), and each of those exists.
    #[test]
    fn library_crates_are_the_workspace_crates() {
        let root = workspace_root();
        let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let members: BTreeSet<&str> = manifest
            .lines()
            .filter_map(|l| l.trim().strip_prefix("\"crates/"))
            .filter_map(|l| l.strip_suffix("\","))
            .collect();
        let listed: BTreeSet<&str> = LIBRARY_CRATES.into_iter().collect();
        assert_eq!(
            members, listed,
            "workspace members under crates/ vs LIBRARY_CRATES"
        );
        for name in LIBRARY_CRATES {
            assert!(
                root.join("crates").join(name).join("Cargo.toml").is_file(),
                "{name}"
            );
        }
    }

    /// gpu-core's needs come from its committed manifests: the sources, the PTX and the fatbins
    /// of every tier, each of which exists in the repository.
    #[test]
    fn gpu_core_needs_name_committed_files() {
        let root = workspace_root();
        let needs = gpu_core_needs(&root).unwrap();
        for f in &needs {
            assert!(
                root.join("crates/gpu-core").join(f).is_file(),
                "{f} is not in {GPU_CORE_KERNELS}"
            );
        }
        for want in [
            "kernels/act.cu",
            "kernels/common.cuh",
            "kernels/ptx/act.ptx",
            "kernels/sass/act.fatbin",
            "kernels/sass/sm80/act.fatbin",
            "kernels/sass/sm75/act.fatbin",
        ] {
            assert!(
                needs.iter().any(|n| n == want),
                "{want} missing from {needs:?}"
            );
        }
    }
}
