#![no_main]
//! Arbitrary bytes as an mmproj GGUF, loaded by tower-gemma (host f32 with either activation,
//! and the validate-only path the CUDA upload uses) and seen by the facade (`detect_family`,
//! `inspect_json`, `preprocessor_for` and a plan). Must never panic.

use std::path::Path;

use vision_towers::gguf_reader::GgufFile;
use vision_towers::tower_gemma::{self, GemmaTower, GgufActivation};
use vision_towers::{detect_family, inspect_json, preprocessor_for, WeightFile};
use vision_towers_fuzz::small_settings;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(g) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let _ = GemmaTower::from_gguf(&g, GgufActivation::Model);
    let _ = tower_gemma::load_gguf_mapped(&g, GgufActivation::LlamaCppGeluQuick);
    let file = WeightFile::Gguf(g);
    let _ = (detect_family(&file), inspect_json(&file));
    let pre = preprocessor_for(Path::new("fuzz.gguf"), &file, small_settings());
    let _ = pre.map(|p| p.plan_size(640, 480));
});
