//! JPEG decode agreement with Pillow on a corpus written by `fixtures/oracle/prep_jpeg.py --wide DIR`:
//! share of exact bytes and max difference per class (subsampling or mode, baseline or progressive).
//!
//! ```text
//! fixtures/oracle/.venv/bin/python fixtures/oracle/prep_jpeg.py --wide /tmp/jpeg_wide
//! cargo run --release -p vision-prep --example jpeg_agreement -- /tmp/jpeg_wide
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use vision_prep::{AdmissionLimits, ImageSource};

#[derive(Default)]
struct Stat {
    files: usize,
    failed: usize,
    bytes: usize,
    exact: usize,
    max_diff: u8,
}

/// The class of a case from its file name (`<kind>_<w>x<h>_<444|422|420|440|411|l|cmyk>[_q..][_prog]`).
fn class(file: &str) -> String {
    let name = file.trim_end_matches(".jpg");
    let prog = if name.contains("_prog") {
        " progressive"
    } else {
        " baseline"
    };
    for tag in ["444", "422", "420", "440", "411", "cmyk", "l"] {
        if name.split('_').any(|p| p == tag) {
            return format!("{tag}{prog}");
        }
    }
    name.split('_').next().unwrap_or("other").to_string()
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/tmp/jpeg_wide".into());
    let dir = Path::new(&dir);
    let text = std::fs::read_to_string(dir.join("cases.json")).expect("cases.json");
    let table: serde_json::Value = serde_json::from_str(&text).expect("json");
    let mut stats: BTreeMap<String, Stat> = BTreeMap::new();
    for case in table["cases"].as_array().expect("cases") {
        let file = case["file"].as_str().expect("file");
        let bytes = std::fs::read(dir.join(file)).expect("jpeg");
        let got =
            vision_prep::source::load(ImageSource::Bytes(&bytes), &AdmissionLimits::default());
        // A case Pillow refuses (e.g. truncated): we must refuse it too.
        if let Some(pil) = case["pil_error"].as_str() {
            let s = stats.entry("pillow refuses".into()).or_default();
            s.files += 1;
            if got.is_ok() {
                s.failed += 1;
                eprintln!("{file}: Pillow refuses ({pil}), we decode it");
            }
            continue;
        }
        let want = std::fs::read(dir.join(file.replace(".jpg", ".rgb"))).expect("rgb");
        for key in [class(file), "all".to_string()] {
            let s = stats.entry(key).or_default();
            s.files += 1;
            match &got {
                Ok((_, img)) if img.data.len() == want.len() => {
                    s.bytes += want.len();
                    s.exact += img.data.iter().zip(&want).filter(|(a, b)| a == b).count();
                    let d = img.data.iter().zip(&want).map(|(a, b)| a.abs_diff(*b));
                    s.max_diff = s.max_diff.max(d.max().unwrap_or(0));
                }
                Ok(_) => s.failed += 1,
                Err(e) => {
                    s.failed += 1;
                    eprintln!("{file}: {e}");
                }
            }
        }
    }
    println!("| class | files | failed | bytes | exact | max diff |");
    println!("|---|---|---|---|---|---|");
    for (k, s) in &stats {
        println!(
            "| {k} | {} | {} | {} | {:.4} % | {} |",
            s.files,
            s.failed,
            s.bytes,
            100.0 * s.exact as f64 / s.bytes.max(1) as f64,
            s.max_diff
        );
    }
}
