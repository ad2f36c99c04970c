#![no_main]
//! Image bytes through `vision_prep::Preprocessor::{plan, prepare}` for the four laws built from
//! the fixture configs. First byte: bits 0-1 pick the law (gemma4, glm5_next, glm_ocr, step3p7),
//! bit 2 sends the rest as raw bytes or as a `data:image/png;base64,` URI. Must never panic;
//! when both succeed, `prepare`'s plan equals `plan`'s.

use std::path::Path;
use std::sync::OnceLock;

use base64::Engine;
use vision_prep::{AdmissionLimits, ImageSource, ModelConfigs, PrepSettings, Preprocessor};

const FAMILIES: [&str; 4] = ["gemma4", "glm5_next", "glm_ocr", "step3p7"];

/// Small budgets so that huge-but-valid images cost the fuzzer little: 4 MP, 256 KiB data URIs,
/// 256 MiB of output tensors, one thread.
fn settings() -> PrepSettings {
    PrepSettings {
        limits: AdmissionLimits { max_pixels: 4_000_000, max_data_uri_bytes: 256 << 10 },
        parallel: false,
        max_output_bytes: 256 << 20,
        ..PrepSettings::default()
    }
}

fn preprocessors() -> &'static [Preprocessor; 4] {
    static PRE: OnceLock<[Preprocessor; 4]> = OnceLock::new();
    PRE.get_or_init(|| {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models");
        FAMILIES.map(|f| {
            let cfg = ModelConfigs::from_dir(&models.join(f)).expect("fixture configs");
            Preprocessor::from_configs(&cfg, settings()).expect("fixture preprocessor")
        })
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let pre = &preprocessors()[usize::from(sel & 3)];
    let uri;
    let source = if sel & 4 == 0 {
        ImageSource::Bytes(body)
    } else {
        uri = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(body)
        );
        ImageSource::DataUri(&uri)
    };
    let plan = pre.plan(source);
    let prepared = pre.prepare(source);
    match (&plan, &prepared) {
        (Ok(plan), Ok(prepared)) => assert_eq!(*plan, prepared.plan, "plan and prepare disagree"),
        // The header is all `plan` reads; if it refuses, `prepare` (which reads more) must too.
        (Err(_), Ok(_)) => panic!("plan refused what prepare accepted: {plan:?}"),
        _ => {}
    }
});
