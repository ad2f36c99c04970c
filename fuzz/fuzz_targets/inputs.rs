#![no_main]
//! Arbitrary bytes as a prepared-input safetensors file, fed to the tiny gemma4, glm5_next,
//! glm_ocr and step3p7 fixture towers through `Tower::encode_prepared_file`. Must never panic.
//!
//! The facade reads prepared inputs only from a path, so each process writes the bytes to one
//! fixed file of its own (in a private temporary directory, so no config JSON sits beside it)
//! and reopens it per run; the file is rewritten only after the previous checkpoint is dropped.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use vision_towers::{Device, Tower};

const FAMILIES: [&str; 4] = ["gemma4", "glm5_next", "glm_ocr", "step3p7"];

struct State {
    towers: Vec<Tower>,
    file: PathBuf,
}

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models");
        let towers = FAMILIES
            .iter()
            .map(|f| Tower::open(&models.join(f), Device::Cpu).expect("fixture tower"))
            .collect();
        let dir = std::env::temp_dir().join(format!("vt-fuzz-inputs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        State { towers, file: dir.join("inputs.safetensors") }
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let st = state();
    std::fs::write(&st.file, data).expect("write temp inputs");
    for tower in &st.towers {
        let _ = tower.encode_prepared_file(&st.file);
    }
});
