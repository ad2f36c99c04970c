#![no_main]
//! An arbitrary string (the bytes, lossily UTF-8) as an image URI: `ImageSource::parse_uri`, then
//! for a data URI the base64 decoding under the length cap, admission from the header and a
//! glm5_next plan; the facade's `read_image_arg` gets the strings it treats as URIs (never a
//! path: it would read files). Must never panic; a data URI's payload decodes to at most ¾ of
//! its length.

use std::sync::OnceLock;

use vision_towers::read_image_arg;
use vision_towers::vision_prep::{source, ImageSource, ModelConfigs, PrepError, Preprocessor};
use vision_towers_fuzz::{models, small_settings};

fn pre() -> &'static Preprocessor {
    static PRE: OnceLock<Preprocessor> = OnceLock::new();
    PRE.get_or_init(|| {
        let cfg = ModelConfigs::from_dir(&models().join("glm5_next")).expect("fixture configs");
        Preprocessor::from_configs(&cfg, small_settings()).expect("fixture preprocessor")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let uri = String::from_utf8_lossy(data);
    let limits = small_settings().limits;
    match ImageSource::parse_uri(&uri) {
        Ok(src @ ImageSource::DataUri(s)) => {
            assert!(
                s.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("data:")),
                "{s:?}"
            );
            if let Ok(bytes) = src.bytes(&limits) {
                assert!(
                    bytes.len() <= s.len() / 4 * 3,
                    "{} bytes from {s:?}",
                    bytes.len()
                );
                if let Ok(h) = source::admit(&bytes, &limits) {
                    let _ = pre().plan_size(h.width, h.height);
                }
            }
        }
        Ok(ImageSource::Bytes(_)) => panic!("parse_uri gave bytes for {uri:?}"),
        Err(PrepError::SchemeRefused(_)) => {}
        Err(e) => panic!("parse_uri: {e} is not SchemeRefused"),
    }
    let uri_like = uri
        .trim_start()
        .as_bytes()
        .get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"data:"))
        || uri.contains("://");
    if uri_like {
        let _ = read_image_arg(&uri);
    }
});
