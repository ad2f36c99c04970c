#![no_main]
//! Arbitrary bytes as `model.safetensors` in a copy of a fixture model directory (its JSON
//! configs kept), read into memory (`Checkpoint::open_in_memory`) and loaded by each tower
//! crate: host f32 (`from_checkpoint`) and the validate-only path the CUDA upload uses
//! (`load_*_mapped`). First byte (mod 6) picks the directory: gemma4, gemma4_clipped,
//! glm5_next, glm_ocr, step3p7, step3p7_hf. Must never panic.

use std::sync::OnceLock;

use vision_towers::st_reader::Checkpoint;
use vision_towers::tower_gemma::{self, GemmaTower};
use vision_towers::tower_glm5::{self, GlmTower};
use vision_towers::tower_step::{self, StepTower};
use vision_towers_fuzz::ModelDir;

const DIRS: [&str; 6] = [
    "gemma4",
    "gemma4_clipped",
    "glm5_next",
    "glm_ocr",
    "step3p7",
    "step3p7_hf",
];

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    static MODELS: OnceLock<[ModelDir; 6]> = OnceLock::new();
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let dir = &MODELS.get_or_init(|| DIRS.map(ModelDir::new))[usize::from(sel) % DIRS.len()];
    dir.with_file("model.safetensors", body, |dir| {
        let Ok(ck) = Checkpoint::open_in_memory(dir) else {
            return;
        };
        let _ = (
            GemmaTower::from_checkpoint(&ck),
            tower_gemma::load_hf_mapped(&ck),
        );
        let _ = (
            GlmTower::from_checkpoint(&ck),
            tower_glm5::load_hf_mapped(&ck),
        );
        let _ = StepTower::from_checkpoint(&ck);
        let _ = ck.config().map(|c| tower_step::load_mapped(&ck, c));
    });
});
