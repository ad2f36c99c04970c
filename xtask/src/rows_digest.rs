//! `cargo xtask rows-digest`: one sha256 of the host (CPU, f32) rows per (fixture model, image),
//! through the facade, so a refactor can show its rows are bitwise unchanged: run it before and
//! after and diff the output.
//!
//! Every weight source under `fixtures/models/` (each model directory, and each GGUF file of a
//! directory of GGUF files) encodes every image of `fixtures/images/` twice: alone, and all
//! images in one request (the facade's padding-free passes). A line per image and mode:
//! `<model> <image> <mode> <rows>x<width> <sha256 of the little-endian f32 row bytes>`, or the
//! refusal's message in place of the shape and digest.

use crate::fixtures::fixtures_dir;
use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use vision_towers::vision_prep::{ImageSource, PrepSettings};
use vision_towers::{Device, Encoded, Model, TowerOptions};

/// Prints the digests (see the module docs); `args` takes no options.
pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        anyhow::bail!("rows-digest takes no arguments (got `{a}`)");
    }
    let fixtures = fixtures_dir();
    let images = sorted_files(&fixtures.join("images"))?;
    let bytes = images
        .iter()
        .map(|p| std::fs::read(p).with_context(|| p.display().to_string()))
        .collect::<Result<Vec<_>>>()?;
    let names: Vec<String> = images.iter().map(|p| file_name(p)).collect();
    for model in weight_sources(&fixtures.join("models"))? {
        let label = model
            .strip_prefix(fixtures.join("models"))
            .unwrap_or(&model)
            .display()
            .to_string();
        let options = TowerOptions {
            device: Device::Cpu,
            ..TowerOptions::default()
        };
        let m = Model::open_with(&model, &options, PrepSettings::default())
            .with_context(|| format!("opening {label}"))?;
        let mut taken = Vec::new();
        for (i, (name, b)) in names.iter().zip(&bytes).enumerate() {
            let line = match m.encode(&[ImageSource::Bytes(b)]) {
                Ok(enc) => {
                    taken.push(i);
                    enc.first().map_or_else(|| "no rows".to_string(), digest)
                }
                Err(e) => format!("refused: {e}"),
            };
            println!("{label} {name} alone {line}");
        }
        let all: Vec<usize> = (0..bytes.len()).collect();
        if let Err(e) = batch(&m, &label, "batch", &names, &bytes, &all) {
            println!("{label} * batch refused: {e}");
            // the images the model takes alone, in one request
            if let Err(e) = batch(&m, &label, "batch-taken", &names, &bytes, &taken) {
                println!("{label} * batch-taken refused: {e}");
            }
        }
    }
    Ok(())
}

/// Encodes images `which` in one request and prints a line per image tagged `mode`.
fn batch(
    m: &Model,
    label: &str,
    mode: &str,
    names: &[String],
    bytes: &[Vec<u8>],
    which: &[usize],
) -> Result<(), vision_towers::ModelError> {
    let sources: Vec<ImageSource<'_>> = which
        .iter()
        .map(|&i| ImageSource::Bytes(&bytes[i]))
        .collect();
    let enc = m.encode(&sources)?;
    for (&i, e) in which.iter().zip(&enc) {
        println!("{label} {} {mode} {}", names[i], digest(e));
    }
    Ok(())
}

/// `<rows>x<width> <sha256>` of one image's rows.
fn digest(e: &Encoded) -> String {
    let mut h = Sha256::new();
    for v in &e.rows {
        h.update(v.to_le_bytes());
    }
    let rows = e.rows.len() / e.width.max(1);
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("{rows}x{} {hex}", e.width)
}

/// The files of `dir`, sorted by name.
fn sorted_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        if path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// Every weight source under `models/`: each directory, except that a directory holding only
/// GGUF files gives each file.
fn weight_sources(models: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(models)
        .with_context(|| models.display().to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        let files = sorted_files(&dir)?;
        let ggufs: Vec<PathBuf> = files
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .cloned()
            .collect();
        if !ggufs.is_empty() && ggufs.len() == files.len() {
            out.extend(ggufs);
        } else {
            out.push(dir);
        }
    }
    Ok(out)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
