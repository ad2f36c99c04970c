//! `Model::max_rows_per_image` on every fixture model (safetensors, sharded, GGUF): the rows
//! upstream's processor gives on the size our search reports (`fixtures/prep/max_rows.json`,
//! made by `fixtures/oracle/prep_max_rows.py`), and the preprocessor's own answer.

use serde_json::Value;
use std::path::{Path, PathBuf};
use vision_towers::vision_prep::PrepSettings;
use vision_towers::{Device, Model, TowerOptions};

fn fixtures() -> PathBuf {
    std::env::var_os("VT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
}

#[test]
fn max_rows_per_image_is_upstreams_rows_at_the_reported_size() {
    let oracle: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("prep/max_rows.json")).unwrap(),
    )
    .unwrap();
    let options = TowerOptions {
        device: Device::Cpu,
        precision: None,
        max_patches_per_pass: vision_towers::DEFAULT_MAX_PATCHES_PER_PASS,
        graphs: false,
        force_tier: None,
    };
    // The model and the oracle configuration whose processor it carries (a GGUF mmproj has no
    // processor config: gemma4's defaults, 280 soft tokens).
    for (model, config) in [
        ("models/gemma4", "models/gemma4"),
        ("models/gemma4_gguf/mmproj-BF16.gguf", "plans.json gemma4"),
        ("models/glm5_next", "models/glm5_next"),
        ("models/glm_ocr", "models/glm_ocr"),
        ("models/step3p7", "models/step3p7"),
        ("models/step3p7_sharded", "models/step3p7"),
        ("models/step3p7_hf", "models/step3p7"),
    ] {
        let m = Model::open_with(&fixtures().join(model), &options, PrepSettings::default())
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        let max = m.preprocessor().max_rows();
        assert_eq!(m.max_rows_per_image(), max.rows, "{model}");
        let (w, h) = max
            .reached_by
            .unwrap_or_else(|| panic!("{model}: {max:?} not exact"));
        let entry = &oracle["configs"][config];
        let upstream = entry["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == u64::from(w) && r[1] == u64::from(h))
            .and_then(|r| r[2].as_u64());
        assert_eq!(
            upstream,
            Some(max.rows),
            "{model}: upstream rows at {w}x{h}"
        );
    }
}
