//! Test helpers shared by the video modules' tests: the fixture directory, the glm5_next
//! preprocessor, PNG frames, and the upstream video fixture cases.

use safetensors::SafeTensors;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

use super::{VideoMetadata, VideoPiece, VideoPreprocessor, VideoSettings};
use crate::config::ModelConfigs;
use crate::source::RgbImage;

pub(super) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(super) fn glm5_configs() -> ModelConfigs {
    ModelConfigs::from_dir(&fixtures().join("models/glm5_next")).expect("glm5_next configs")
}

/// One upstream video case: its input frames (HWC), metadata JSON and tensors.
pub(super) struct Case {
    pub(super) name: String,
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) frames: Vec<Vec<u8>>,
    pub(super) meta: Value,
    pub(super) indices: Vec<i64>,
    /// glm5_next `video_grid_thw`.
    pub(super) grid: Option<Vec<i64>>,
    /// gemma4 `num_frames_per_video`, `num_soft_tokens_per_video`.
    pub(super) counts: Option<(i64, i64)>,
    pub(super) resized: Option<Vec<u8>>,
}

pub(super) fn i64s(st: &SafeTensors<'_>, name: &str) -> Vec<i64> {
    st.tensor(name)
        .expect(name)
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        .collect()
}

/// Every case of `fixtures/outputs/<variant>/` (written by `oracle/fam_video.py` from
/// upstream's video processors); at least `min` of them.
pub(super) fn cases(variant: &str, min: usize) -> Vec<Case> {
    let dir = fixtures().join("outputs").join(variant);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (cargo xtask fixtures)", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    paths.sort();
    assert!(paths.len() >= min, "{variant}: {} video cases", paths.len());
    paths
        .iter()
        .map(|p| {
            let bytes = std::fs::read(p).expect("read");
            let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
            let meta: Value = header
                .metadata()
                .as_ref()
                .and_then(|m| m.get("fixture"))
                .and_then(|s| serde_json::from_str(s).ok())
                .expect("fixture metadata");
            let st = SafeTensors::deserialize(&bytes).expect("safetensors");
            let f = st.tensor("frames_u8").expect("frames_u8");
            let [n, h, w, 3] = f.shape() else {
                panic!("frames_u8 shape {:?}", f.shape())
            };
            let frames = f
                .data()
                .chunks_exact(h * w * 3)
                .map(<[u8]>::to_vec)
                .collect::<Vec<_>>();
            assert_eq!(frames.len(), *n);
            Case {
                name: p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                width: *w as u32,
                height: *h as u32,
                frames,
                indices: i64s(&st, "frames_indices"),
                grid: st
                    .tensor("video_grid_thw")
                    .is_ok()
                    .then(|| i64s(&st, "video_grid_thw")),
                counts: st.tensor("num_frames_per_video").is_ok().then(|| {
                    (
                        i64s(&st, "num_frames_per_video")[0],
                        i64s(&st, "num_soft_tokens_per_video")[0],
                    )
                }),
                resized: st.tensor("resized_u8").ok().map(|t| t.data().to_vec()),
                meta,
            }
        })
        .collect()
}

/// The case's video processor settings given as a checkpoint's
/// `video_preprocessor_config.json` (upstream took them at construction), on its model.
pub(super) fn preprocessor_for(meta: &Value) -> VideoPreprocessor {
    let dict = &meta["video_processor_config"];
    let model = meta["model"].as_str().expect("model");
    let cfg = ModelConfigs::from_dir(&fixtures().join(model)).expect("configs");
    VideoPreprocessor::from_configs(&cfg, Some(dict), VideoSettings::default())
        .expect("video preprocessor")
}

pub(super) fn metadata_of(meta: &Value) -> VideoMetadata {
    let m = &meta["video_metadata"];
    VideoMetadata {
        total_num_frames: m["total_num_frames"].as_u64().expect("total_num_frames"),
        fps: m["fps"].as_f64(),
        duration: m["duration"].as_f64(),
    }
}

/// The prompt against upstream's runs: special tokens `{token, id, count}` (only `<|image|>`
/// receiving rows) and timestamp text `{text}`.
pub(super) fn assert_prompt(case: &str, got: &[VideoPiece], want: &Value) {
    let want = want.as_array().expect("prompt_plan");
    assert_eq!(got.len(), want.len(), "{case}: prompt pieces {got:?}");
    for (g, w) in got.iter().zip(want) {
        match g {
            VideoPiece::Run(r) => {
                assert_eq!(Some(r.token.text.as_str()), w["token"].as_str(), "{case}");
                assert_eq!(r.token.id.map(u64::from), w["id"].as_u64(), "{case}");
                assert_eq!(Some(r.count), w["count"].as_u64(), "{case}");
                let placeholder = ["<|image|>", "<|video|>"].contains(&r.token.text.as_str());
                assert_eq!(r.embeds, placeholder, "{case}");
            }
            VideoPiece::Text(t) => assert_eq!(Some(t.as_str()), w["text"].as_str(), "{case}"),
        }
    }
}

/// The canvases as upstream's `[n, 3, H, W]` uint8 tensor.
pub(super) fn chw(frames: &[RgbImage]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        for c in 0..3 {
            out.extend(f.data.iter().skip(c).step_by(3));
        }
    }
    out
}

pub(super) fn png(frame: &[u8], w: u32, h: u32) -> Vec<u8> {
    use image::ImageEncoder;
    let mut buf = Vec::new();
    image::codecs::png::PngEncoder::new(&mut buf)
        .write_image(frame, w, h, image::ExtendedColorType::Rgb8)
        .expect("png");
    buf
}

pub(super) fn glm5() -> VideoPreprocessor {
    VideoPreprocessor::from_configs(&glm5_configs(), None, VideoSettings::default())
        .expect("glm5_next video")
}
