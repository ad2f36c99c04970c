//! `cargo xtask fixtures [--check]`: regenerate the oracle fixtures from upstream HF transformers
//! (`fixtures/oracle/generate.py`, run in its own venv `fixtures/oracle/.venv`) and write
//! `fixtures/oracle/MANIFEST.json`, the sha256 of every generated file.
//!
//! `--check` regenerates into a temporary directory and fails if any hash differs from the
//! manifest (the generator is deterministic: same seeds, one thread, bf16-exact weights).
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The generated fixture trees, relative to `fixtures/`. Everything in them is hashed.
pub(crate) const GENERATED_DIRS: [&str; 3] = ["images", "models", "outputs"];

/// Where the manifest lives, relative to `fixtures/`.
pub(crate) const MANIFEST: &str = "oracle/MANIFEST.json";

/// Entry point of `cargo xtask fixtures`.
pub fn run(args: &[String]) -> Result<()> {
    let check = match args {
        [] => false,
        [a] if a == "--check" => true,
        _ => bail!("usage: cargo xtask fixtures [--check]"),
    };
    let fixtures = fixtures_dir();
    let python = ensure_venv(&fixtures.join("oracle"))?;
    if check {
        let tmp =
            std::env::temp_dir().join(format!("vision-towers-fixtures-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp)?;
        }
        fs::create_dir_all(&tmp)?;
        let result = generate(&python, &fixtures, &tmp).and_then(|()| {
            let fresh = hash_tree(&tmp)?;
            let committed = read_manifest(&fixtures.join(MANIFEST))?;
            let diff = compare(&committed, &fresh);
            if diff.is_empty() {
                println!("fixtures: {} files match {MANIFEST}", fresh.len());
                Ok(())
            } else {
                for d in &diff {
                    eprintln!("  {d}");
                }
                bail!(
                    "regenerated fixtures differ from {MANIFEST} ({} files)",
                    diff.len()
                )
            }
        });
        let _ = fs::remove_dir_all(&tmp);
        return result;
    }
    for d in GENERATED_DIRS {
        let p = fixtures.join(d);
        if p.exists() {
            fs::remove_dir_all(&p).with_context(|| format!("removing stale {}", p.display()))?;
        }
    }
    generate(&python, &fixtures, &fixtures)?;
    let hashes = hash_tree(&fixtures)?;
    write_manifest(&fixtures.join(MANIFEST), &hashes)?;
    let total: u64 = hashes.values().map(|(_, n)| n).sum();
    println!(
        "fixtures: wrote {} files ({:.1} MB) and {MANIFEST}",
        hashes.len(),
        total as f64 / 1e6
    );
    Ok(())
}

/// Environment variable naming the fixtures directory (for a carried xtask binary run where the
/// compile-time workspace path does not exist, e.g. on the GPU machine).
pub(crate) const FIXTURES_ENV: &str = "VT_FIXTURES";

/// `$VT_FIXTURES` if set; else `<workspace>/fixtures` if it exists (the compile-time path); else
/// `./fixtures` when the current directory holds one (a repository copy elsewhere).
pub(crate) fn fixtures_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(FIXTURES_ENV) {
        return PathBuf::from(dir);
    }
    let built = crate::workspace_root().join("fixtures");
    let cwd = PathBuf::from("fixtures");
    if !built.join("outputs").exists() && cwd.join("outputs").exists() {
        return cwd;
    }
    built
}

/// Creates `oracle/.venv` if missing and installs the pinned requirements; returns its python.
fn ensure_venv(oracle: &Path) -> Result<PathBuf> {
    let venv = oracle.join(".venv");
    let python = venv.join("bin").join("python");
    if !python.exists() {
        println!("fixtures: creating {}", venv.display());
        status(
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
            "python3 -m venv",
        )?;
    }
    println!(
        "fixtures: installing {} (torch is ~5 GB on first run)",
        oracle.join("requirements.txt").display()
    );
    status(
        Command::new(&python)
            .args(["-m", "pip", "install", "-q", "-r"])
            .arg(oracle.join("requirements.txt")),
        "pip install -r requirements.txt",
    )?;
    Ok(python)
}

fn generate(python: &Path, fixtures: &Path, out: &Path) -> Result<()> {
    status(
        Command::new(python)
            .arg(fixtures.join("oracle").join("generate.py"))
            .arg("--out")
            .arg(out)
            .env("PYTHONHASHSEED", "0")
            .env("CUDA_VISIBLE_DEVICES", "")
            .env("OMP_NUM_THREADS", "1"),
        "fixtures/oracle/generate.py",
    )
}

fn status(cmd: &mut Command, what: &str) -> Result<()> {
    let st = cmd
        .status()
        .with_context(|| format!("could not start {what}"))?;
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(())
}

/// sha256 (lower hex) and size of every file under `root/{images,models,outputs}`, keyed by
/// its `/`-separated path relative to `root`.
pub(crate) fn hash_tree(root: &Path) -> Result<BTreeMap<String, (String, u64)>> {
    let mut out = BTreeMap::new();
    for d in GENERATED_DIRS {
        let dir = root.join(d);
        if dir.exists() {
            walk(root, &dir, &mut out)?;
        }
    }
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (String, u64)>) -> Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            walk(root, &p, out)?;
        } else {
            let bytes = fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            let rel = p
                .strip_prefix(root)?
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            out.insert(rel, (sha256_hex(&bytes), bytes.len() as u64));
        }
    }
    Ok(())
}

/// Lower-case hex sha256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn write_manifest(path: &Path, hashes: &BTreeMap<String, (String, u64)>) -> Result<()> {
    let files: serde_json::Map<String, Value> = hashes
        .iter()
        .map(|(k, (h, n))| (k.clone(), json!({ "sha256": h, "bytes": n })))
        .collect();
    let v = json!({
        "about": "sha256 of every file under fixtures/{images,models,outputs}; written by `cargo xtask fixtures`",
        "files": files,
    });
    fs::write(path, serde_json::to_string_pretty(&v)? + "\n")?;
    Ok(())
}

/// The `files` map of a manifest: path → sha256.
pub(crate) fn read_manifest(path: &Path) -> Result<BTreeMap<String, String>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let files = v
        .get("files")
        .and_then(Value::as_object)
        .context("manifest has no `files` object")?;
    files
        .iter()
        .map(|(k, e)| {
            let h = e
                .get("sha256")
                .and_then(Value::as_str)
                .with_context(|| format!("{k}: no sha256"))?;
            Ok((k.clone(), h.to_string()))
        })
        .collect()
}

/// Human-readable differences between the manifest and a fresh hash table.
pub(crate) fn compare(
    manifest: &BTreeMap<String, String>,
    fresh: &BTreeMap<String, (String, u64)>,
) -> Vec<String> {
    let mut diff = Vec::new();
    for (k, h) in manifest {
        match fresh.get(k) {
            None => diff.push(format!("missing: {k}")),
            Some((f, _)) if f != h => diff.push(format!(
                "changed: {k} (manifest {}…, now {}…)",
                &h[..12],
                &f[..12]
            )),
            _ => {}
        }
    }
    for k in fresh.keys() {
        if !manifest.contains_key(k) {
            diff.push(format!("extra (not in manifest): {k}"));
        }
    }
    diff
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed fixtures are exactly the ones the manifest lists (no Python needed).
    #[test]
    fn committed_fixtures_match_manifest() {
        let fixtures = fixtures_dir();
        let manifest =
            read_manifest(&fixtures.join(MANIFEST)).expect("fixtures/oracle/MANIFEST.json");
        let fresh = hash_tree(&fixtures).expect("hashing fixtures");
        let diff = compare(&manifest, &fresh);
        assert!(
            diff.is_empty(),
            "fixtures differ from MANIFEST.json (run `cargo xtask fixtures`):\n{}",
            diff.join("\n")
        );
        assert!(!manifest.is_empty());
    }

    #[test]
    fn sha256_known_answer() {
        // FIPS 180-2 example "abc"
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn compare_reports_missing_extra_changed() {
        let m: BTreeMap<String, String> =
            [("a".into(), "0".repeat(64)), ("b".into(), "1".repeat(64))]
                .into_iter()
                .collect();
        let f: BTreeMap<String, (String, u64)> = [
            ("a".into(), ("2".repeat(64), 1)),
            ("c".into(), ("3".repeat(64), 1)),
        ]
        .into_iter()
        .collect();
        let d = compare(&m, &f);
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].starts_with("changed: a"));
        assert!(d[1].starts_with("missing: b"));
        assert!(d[2].starts_with("extra (not in manifest): c"));
    }
}
