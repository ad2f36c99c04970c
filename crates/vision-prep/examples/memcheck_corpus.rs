//! A driver for valgrind memcheck (docs/RELIABILITY.md, "Memcheck"): every image and data-URI
//! case of `fixtures/adversarial/manifest.json` through `plan` and `prepare` of each fixture
//! law, so that the unsafe and FFI paths (the PNG fast path, the AVX2 resize, normalisation,
//! libjpeg-turbo) run on hostile bytes under a memory checker. The outcomes themselves are
//! checked by `crates/vision-towers/tests/adversarial.rs`; here only: no panic, and `plan`
//! refuses nothing `prepare` accepts.
//!
//! An example rather than an ignored test: `--ignored` selects the GPU tests alone (xtask's
//! `every_ignored_test_needs_a_cuda_device`).
//!
//! ```text
//! cargo build -p vision-prep --example memcheck_corpus
//! valgrind --error-exitcode=1 --leak-check=full target/debug/examples/memcheck_corpus
//! ```

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use serde_json::Value;
use vision_prep::{ImageSource, ModelConfigs, PrepSettings, Preprocessor};

const FAMILIES: [&str; 4] = ["gemma4", "glm5_next", "glm_ocr", "step3p7"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// The case's bytes or URI, built as `adversarial.rs` builds them.
fn source(src: &Value) -> Option<Result<Vec<u8>, String>> {
    let adv = fixtures().join("adversarial");
    if let Some(f) = src["file"].as_str() {
        return Some(Ok(std::fs::read(adv.join(f)).expect("corpus file")));
    }
    if let Some(d) = src.get("derive") {
        let base = d["base"].as_str().expect("base");
        let mut b = std::fs::read(fixtures().join(base)).expect("fixture image");
        if let Some(n) = d["truncate"].as_u64() {
            b.truncate(usize::try_from(n).expect("length"));
        }
        if let Some(f) = d["flip"].as_array() {
            let pos = usize::try_from(f[0].as_u64().expect("pos")).expect("pos");
            b[pos] ^= 1 << f[1].as_u64().expect("bit");
        }
        return Some(Ok(b));
    }
    if let Some(u) = src["uri"].as_str() {
        return Some(Err(u.to_string()));
    }
    let g = src.get("uri_gen")?;
    let mut u = g["prefix"].as_str().expect("prefix").to_string();
    let len = usize::try_from(g["len"].as_u64().expect("len")).expect("len");
    let fill = g["fill"].as_str().expect("fill");
    while u.len() < len {
        u.push_str(fill);
    }
    u.truncate(len);
    Some(Err(u))
}

fn main() {
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("adversarial/manifest.json")).expect("manifest"),
    )
    .expect("manifest is JSON");
    let settings = PrepSettings {
        parallel: false,
        ..PrepSettings::default()
    };
    let pres: Vec<Preprocessor> = FAMILIES
        .iter()
        .map(|f| {
            let cfg = ModelConfigs::from_dir(&fixtures().join("models").join(f)).expect("configs");
            Preprocessor::from_configs(&cfg, settings).expect("fixture preprocessor")
        })
        .collect();
    let (mut cases, mut ok, mut bad) = (0, 0, Vec::new());
    for case in manifest["cases"].as_array().expect("cases") {
        let Some(input) = source(&case["source"]) else {
            continue;
        };
        cases += 1;
        let src = match &input {
            Ok(b) => ImageSource::Bytes(b),
            Err(u) => ImageSource::DataUri(u),
        };
        for (pre, fam) in pres.iter().zip(FAMILIES) {
            let run = catch_unwind(AssertUnwindSafe(|| (pre.plan(src), pre.prepare(src))));
            match run {
                Ok((Err(e), Ok(_))) => {
                    bad.push(format!("{} {fam}: plan refused ({e})", case["id"]))
                }
                Ok((_, Ok(p))) => {
                    ok += 1;
                    pre.recycle(p);
                }
                Ok(_) => {}
                Err(_) => bad.push(format!("{} {fam}: panicked", case["id"])),
            }
        }
    }
    eprintln!("{cases} cases x {} laws: {ok} prepared", FAMILIES.len());
    assert!(cases > 700, "only {cases} image cases in the manifest");
    assert!(bad.is_empty(), "{bad:#?}");
}
