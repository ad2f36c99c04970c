//! Helpers shared by the fuzz targets in `fuzz_targets/`: fixture paths, small budgets, and
//! private copies of fixture model directories that a target may write one file of per run.
//!
//! Every target must hold to one property: the library returns (`Ok` or a typed error) and never
//! panics, aborts or touches memory it does not own, whatever the bytes.

use std::path::{Path, PathBuf};

use vision_towers::vision_prep::{AdmissionLimits, ModelConfigs, PrepSettings};

// vision-prep reports libjpeg's fatal errors by unwinding a Rust panic through the C decoder to a
// `catch_unwind`. Built with `-Cpanic=abort`, a corrupt JPEG would abort the fuzzer: a false
// crash. cargo-fuzz 0.13 does not pass `-Cpanic=abort` and the profiles in fuzz/Cargo.toml say
// `panic = "unwind"`; this refuses any build that would abort all the same.
#[cfg(not(panic = "unwind"))]
compile_error!("the fuzz targets must be built with panic = \"unwind\" (libjpeg errors unwind)");

/// The four fixture families, in the order the targets' selector bits index them.
pub const FAMILIES: [&str; 4] = ["gemma4", "glm5_next", "glm_ocr", "step3p7"];

/// The JSON files a model directory may hold, in the order the targets' selector bits index them.
pub const CONFIG_FILES: [&str; 5] = [
    "config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
];

/// `fixtures/models`.
pub fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models")
}

/// Small budgets so that huge-but-valid inputs cost the fuzzer little: 4 MP, 256 KiB data URIs,
/// 64 MiB of output tensors, one thread.
pub fn small_settings() -> PrepSettings {
    PrepSettings {
        limits: AdmissionLimits {
            max_pixels: 4_000_000,
            max_data_uri_bytes: 256 << 10,
        },
        parallel: false,
        max_output_bytes: 64 << 20,
        ..PrepSettings::default()
    }
}

/// The fixture configs of each family in [`FAMILIES`] order.
pub fn fixture_configs() -> [ModelConfigs; 4] {
    FAMILIES.map(|f| ModelConfigs::from_dir(&models().join(f)).expect("fixture configs"))
}

/// The slot of `cfg` that selector value `slot` names (modulo [`CONFIG_FILES`]).
pub fn config_slot(cfg: &mut ModelConfigs, slot: u8) -> &mut Option<serde_json::Value> {
    match usize::from(slot) % CONFIG_FILES.len() {
        0 => &mut cfg.config,
        1 => &mut cfg.preprocessor_config,
        2 => &mut cfg.processor_config,
        3 => &mut cfg.tokenizer_config,
        _ => &mut cfg.tokenizer_json,
    }
}

/// A private copy of the fixture model directory `fixture` for this process, under
/// `<tmp>/vt-fuzz-<pid>/<fixture>`: small files (the JSON) are copied, weight files linked
/// (targets never write through a link: they replace a file with [`ModelDir::with_file`]).
pub struct ModelDir {
    /// The copy.
    pub path: PathBuf,
    fixture: PathBuf,
}

impl ModelDir {
    /// Makes the copy (replacing one left by a previous process of the same id).
    pub fn new(fixture: &str) -> ModelDir {
        let from = models().join(fixture);
        let path = std::env::temp_dir()
            .join(format!("vt-fuzz-{}", std::process::id()))
            .join(fixture);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp model dir");
        for e in std::fs::read_dir(&from).expect("fixture dir") {
            let e = e.expect("fixture entry");
            let to = path.join(e.file_name());
            if e.path().extension().is_some_and(|x| x == "json") {
                std::fs::copy(e.path(), &to).expect("copy fixture json");
            } else {
                std::os::unix::fs::symlink(e.path(), &to).expect("link fixture weights");
            }
        }
        ModelDir {
            path,
            fixture: from,
        }
    }

    /// Writes `bytes` as `name` (replacing a link, never writing through it), runs `f` on the
    /// directory, then puts back the fixture's file (or removes `name` if the fixture has none).
    pub fn with_file<R>(&self, name: &str, bytes: &[u8], f: impl FnOnce(&Path) -> R) -> R {
        let file = self.path.join(name);
        let _ = std::fs::remove_file(&file);
        std::fs::write(&file, bytes).expect("write fuzz file");
        let r = f(&self.path);
        std::fs::remove_file(&file).expect("remove fuzz file");
        let orig = self.fixture.join(name);
        if orig.extension().is_some_and(|x| x == "json") && orig.exists() {
            std::fs::copy(&orig, &file).expect("restore fixture json");
        } else if orig.exists() {
            std::os::unix::fs::symlink(&orig, &file).expect("restore fixture link");
        }
        r
    }
}

/// A 20×15 RGB PNG from the fixtures, for the targets that encode an image through a model.
pub fn small_png() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/images/tiny_20x15.png");
    std::fs::read(path).expect("fixtures/images/tiny_20x15.png")
}
