#![no_main]
//! One file of a fixture model directory replaced by arbitrary bytes, then opened through the
//! facade: `Model::open` (weight file, `preprocessor_for`, the host tower with its config) and,
//! when it opens, a plan of a 20×15 PNG (no encode: the host forward under ASan takes 0.3-8 s
//! a run; the `inputs` target fuzzes it). First byte: bits 0-1 pick the family (gemma4,
//! glm5_next, glm_ocr, step3p7), bits 2-7 (mod 5) the file (config.json,
//! preprocessor_config.json, processor_config.json, tokenizer_config.json, tokenizer.json).
//! Must never panic.

use std::sync::OnceLock;

use vision_towers::vision_prep::ImageSource;
use vision_towers::{Device, Model};
use vision_towers_fuzz::{small_png, small_settings, ModelDir, CONFIG_FILES, FAMILIES};

fn dirs() -> &'static ([ModelDir; 4], Vec<u8>) {
    static DIRS: OnceLock<([ModelDir; 4], Vec<u8>)> = OnceLock::new();
    DIRS.get_or_init(|| (FAMILIES.map(ModelDir::new), small_png()))
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let (dirs, png) = dirs();
    let file = CONFIG_FILES[usize::from(sel >> 2) % CONFIG_FILES.len()];
    dirs[usize::from(sel & 3)].with_file(file, body, |dir| {
        if let Ok(model) = Model::open(dir, Device::Cpu, small_settings()) {
            let _ = model.plan(ImageSource::Bytes(png));
        }
    });
});
