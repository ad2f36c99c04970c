#![no_main]
//! One model JSON replaced by arbitrary bytes, in memory. First byte: bits 0-1 pick the fixture
//! family (gemma4, glm5_next, glm_ocr, step3p7), bits 2-6 (mod 5) the file (config.json,
//! preprocessor_config.json, processor_config.json, tokenizer_config.json, tokenizer.json); the
//! rest, when it is JSON, replaces that file. Then vision-prep builds its law and prompt tokens
//! and plans five sizes, and each tower crate reads its config from `config.json`. Must never panic.

use std::sync::OnceLock;

use vision_towers::vision_prep::{ModelConfigs, Preprocessor};
use vision_towers::{family_from_model_type, tower_gemma, tower_glm5, tower_step};
use vision_towers_fuzz::{config_slot, fixture_configs, small_settings};

/// Sizes planned with every preprocessor built: tiny, the fixture image, a wide and a tall
/// strip, and the 4 MP budget.
const SIZES: [(u32, u32); 5] = [(1, 1), (20, 15), (4000, 3), (2, 1999), (2000, 2000)];
/// The gemma4 fixture's position table rows and the step3p7 fixture's projector width (what the
/// loaders pass from the weights).
const GEMMA_POS_ROWS: usize = 64;
const STEP_TEXT_HIDDEN: usize = 80;

fn fixtures() -> &'static [ModelConfigs; 4] {
    static CFG: OnceLock<[ModelConfigs; 4]> = OnceLock::new();
    CFG.get_or_init(fixture_configs)
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, json)) = data.split_first() else {
        return;
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else {
        return;
    };
    let mut cfg = fixtures()[usize::from(sel & 3)].clone();
    *config_slot(&mut cfg, (sel >> 2) & 31) = Some(value);
    if let Ok(pre) = Preprocessor::from_configs(&cfg, small_settings()) {
        for (w, h) in SIZES {
            let _ = pre.plan_size(w, h).map(|p| p.output_bytes());
        }
    }
    let Some(config) = &cfg.config else { return };
    let _ = config["model_type"].as_str().map(family_from_model_type);
    let _ = tower_gemma::GemmaConfig::from_hf(config, GEMMA_POS_ROWS, sel & 0x80 != 0)
        .map(|c| c.patch_dim());
    let _ = tower_glm5::GlmConfig::from_hf(config).map(|c| (c.patch_dim(), c.merge_unit()));
    let _ = tower_step::StepConfig::from_hf(config, STEP_TEXT_HIDDEN)
        .map(|c| (c.patch_dim(), c.pos_rows()));
});
