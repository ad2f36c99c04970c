//! Building a [`VideoPreprocessor`] from a model's configs, admitting a video's frames, and
//! preparing its tensors: decode the sampled frames, resize onto the canvas, normalise and
//! patchify.

use rayon::prelude::*;
use serde_json::Value;

use super::config::{gemma4_video_law, glm5_next_video_law, video_processor_dict};
use super::geometry::{canvas, patchify};
use super::{
    Gemma4VideoLaw, PreparedVideo, Video, VideoFrames, VideoLaw, VideoPlan, VideoPreprocessor,
    VideoSettings, VideoTokens,
};
use crate::config::{self, ModelConfigs, PrepSettings};
use crate::error::{PrepError, Result};
use crate::law::Law;
use crate::norm::Normalize;
use crate::plan::Family;
use crate::prepare::{NamedTensor, TensorData};
use crate::source::{self, ImageSource, RgbImage};

impl VideoPreprocessor {
    /// Build from the model's configs and its video processor config (`video_preprocessor_config.json`,
    /// see [`read_video_config`](super::read_video_config); `None` = the class defaults). The
    /// video law follows the video processor class the config names, else the image processor's
    /// family; a family without a video path here is [`PrepError::NoVideoPath`].
    pub fn from_configs(
        cfg: &ModelConfigs,
        video_preprocessor_config: Option<&Value>,
        settings: VideoSettings,
    ) -> Result<VideoPreprocessor> {
        let dict = video_processor_dict(cfg, video_preprocessor_config);
        let named = dict
            .and_then(|d| d.get("video_processor_type"))
            .and_then(Value::as_str);
        let family = match named {
            Some("Glm5NextVideoProcessor") => Family::Glm5Next,
            Some("Gemma4VideoProcessor") => Family::Gemma4,
            Some(other) => return Err(PrepError::NoVideoPath(format!("`{other}`"))),
            None => match config::law_from_configs(cfg, &PrepSettings::default())? {
                Law::Glm5Next(_) => Family::Glm5Next,
                Law::Gemma4(_) => Family::Gemma4,
                other => {
                    return Err(PrepError::NoVideoPath(format!(
                        "`{}` (family {})",
                        other.processor_class(),
                        family_of(&other).name()
                    )))
                }
            },
        };
        let tok = |attr: Option<&str>, text: &str, key: &str| {
            config::resolve_token(cfg, attr, text, Some(key))
        };
        let (law, tokens) = match family {
            Family::Gemma4 => (
                VideoLaw::Gemma4(gemma4_video_law(dict, &settings)?),
                // the labels the image plan uses; ids from config.json (processing_gemma4.py:118-126)
                VideoTokens::Gemma4 {
                    boi: tok(Some("boi_token"), "<|image>", "boi_token_id"),
                    video: tok(None, "<|video|>", "video_token_id"),
                    eoi: tok(Some("eoi_token"), "<image|>", "eoi_token_id"),
                },
            ),
            _ => (
                VideoLaw::Glm5Next(glm5_next_video_law(dict, &settings)?),
                VideoTokens::Glm5Next {
                    begin_of_video: tok(None, "<|begin_of_video|>", "video_start_token_id"),
                    end_of_video: tok(None, "<|end_of_video|>", "video_end_token_id"),
                    begin_of_image: tok(None, "<|begin_of_image|>", "image_start_token_id"),
                    end_of_image: tok(None, "<|end_of_image|>", "image_end_token_id"),
                    image: tok(Some("image_token"), "<|image|>", "image_token_id"),
                },
            ),
        };
        Ok(VideoPreprocessor {
            law,
            tokens,
            settings,
        })
    }

    /// Build from an explicit law and token table (the table must be the law's family's).
    pub fn from_law(law: VideoLaw, tokens: VideoTokens, settings: VideoSettings) -> Result<Self> {
        match (&law, &tokens) {
            (VideoLaw::Glm5Next(_), VideoTokens::Glm5Next { .. })
            | (VideoLaw::Gemma4(_), VideoTokens::Gemma4 { .. }) => Ok(VideoPreprocessor {
                law,
                tokens,
                settings,
            }),
            _ => Err(PrepError::BadSetting(
                "the video token table is another family's than the law".into(),
            )),
        }
    }

    /// The law in use.
    pub fn law(&self) -> &VideoLaw {
        &self.law
    }
    /// The token table in use.
    pub fn tokens(&self) -> &VideoTokens {
        &self.tokens
    }
    /// The settings.
    pub fn settings(&self) -> &VideoSettings {
        &self.settings
    }
    /// The family (glm5_next or gemma4).
    pub fn family(&self) -> Family {
        match self.law {
            VideoLaw::Glm5Next(_) => Family::Glm5Next,
            VideoLaw::Gemma4(_) => Family::Gemma4,
        }
    }

    /// The video's frame size and the checks on what was handed in, before the plan: the frame
    /// count matches the metadata, the bytes handed in are within budget, and (encoded frames)
    /// every sampled frame's header is admitted as an image and has the first one's size.
    fn admit(&self, video: &Video<'_>) -> Result<(u32, u32, Vec<Option<source::Header>>)> {
        let meta = &video.metadata;
        let indices = self.sampled_indices(meta)?;
        let given = video.frames.len() as u64;
        if given != meta.total_num_frames {
            return Err(PrepError::BadVideo(format!(
                "{given} frames handed in, the metadata says {}",
                meta.total_num_frames
            )));
        }
        let limits = &self.settings.limits;
        match video.frames {
            VideoFrames::Rgb {
                width,
                height,
                frames,
            } => {
                let each = u64::from(width) * u64::from(height) * 3;
                let total = each.saturating_mul(given);
                if total > limits.max_bytes {
                    return Err(PrepError::VideoOverBudget {
                        what: format!("bytes of {given} raw {width}x{height} frames"),
                        amount: total,
                        budget: limits.max_bytes,
                    });
                }
                if let Some((i, f)) = frames
                    .iter()
                    .enumerate()
                    .find(|(_, f)| f.len() as u64 != each)
                {
                    return Err(PrepError::BadVideo(format!(
                        "frame {i} holds {} bytes, a {width}x{height} RGB frame {each}",
                        f.len()
                    )));
                }
                Ok((width, height, Vec::new()))
            }
            VideoFrames::Encoded(frames) => {
                let total = frames.iter().fold(0u64, |a, f| {
                    a.saturating_add(match f {
                        ImageSource::Bytes(b) => b.len() as u64,
                        ImageSource::DataUri(u) => u.len() as u64,
                    })
                });
                if total > limits.max_bytes {
                    return Err(PrepError::VideoOverBudget {
                        what: format!("bytes of {given} encoded frames"),
                        amount: total,
                        budget: limits.max_bytes,
                    });
                }
                let mut headers = vec![None; frames.len()];
                let mut size = None;
                for &i in &indices {
                    let i = i as usize;
                    if headers[i].is_some() {
                        continue;
                    }
                    let h = frames[i]
                        .bytes(&self.settings.frame_limits)
                        .and_then(|b| source::admit(&b, &self.settings.frame_limits))
                        .map_err(|e| frame_err(i, e))?;
                    let (w0, h0) = *size.get_or_insert((h.width, h.height));
                    if (h.width, h.height) != (w0, h0) {
                        return Err(PrepError::BadVideo(format!(
                            "frame {i} is {}x{}, the video's frames {w0}x{h0}",
                            h.width, h.height
                        )));
                    }
                    headers[i] = Some(h);
                }
                let (w, h) = size.ok_or_else(|| PrepError::BadVideo("no frame sampled".into()))?;
                Ok((w, h, headers))
            }
        }
    }

    /// Plan a video from its metadata and frames' size (encoded frames: the sampled frames'
    /// headers only); nothing is decoded or resized.
    pub fn plan(&self, video: &Video<'_>) -> Result<VideoPlan> {
        let (w, h, _) = self.admit(video)?;
        self.plan_video(&video.metadata, w, h)
    }

    /// The sampled frames as upstream has them right before normalisation (uint8): glm5_next
    /// resized and padded onto the canvas, gemma4 resized; with the plan.
    pub fn resized_frames(&self, video: &Video<'_>) -> Result<(VideoPlan, Vec<RgbImage>)> {
        let (w, h, headers) = self.admit(video)?;
        let plan = self.plan_video(&video.metadata, w, h)?;
        let (filter, pad) = match &self.law {
            VideoLaw::Glm5Next(l) => (l.filter, true),
            VideoLaw::Gemma4(l) => (l.filter, false),
        };
        let one = |&idx: &u64| -> Result<RgbImage> {
            let i = idx as usize;
            let view = |data: &[u8], fw: u32, fh: u32| {
                canvas(data, fw as usize, fh as usize, &plan, filter, pad)
            };
            match video.frames {
                VideoFrames::Rgb { frames, .. } => view(frames[i], w, h),
                VideoFrames::Encoded(frames) => {
                    let hdr = headers[i]
                        .ok_or_else(|| PrepError::BadVideo(format!("frame {i} not admitted")))?;
                    let bytes = frames[i]
                        .bytes(&self.settings.frame_limits)
                        .map_err(|e| frame_err(i, e))?;
                    let rgb = source::decode(&bytes, &hdr).map_err(|e| frame_err(i, e))?;
                    view(&rgb.data, hdr.width, hdr.height)
                }
            }
            .map_err(|e| match e {
                e @ PrepError::VideoFrame { .. } => e,
                e => frame_err(i, e),
            })
        };
        // One decoded frame per worker at a time; only the resized frames are kept.
        let idx = &plan.frames_indices;
        let frames = if self.settings.parallel {
            idx.par_iter().map(one).collect::<Result<Vec<_>>>()?
        } else {
            idx.iter().map(one).collect::<Result<Vec<_>>>()?
        };
        Ok((plan, frames))
    }

    /// Admit (metadata first), sample, decode the sampled frames, resize, (glm5_next) pad,
    /// normalise and patchify: upstream's video tensors, on the plan.
    pub fn prepare_video(&self, video: &Video<'_>) -> Result<PreparedVideo> {
        let (plan, frames) = self.resized_frames(video)?;
        let tensors = match &self.law {
            VideoLaw::Glm5Next(l) => {
                let (m, s) = crate::prepare::fused(&l.mean, &l.std, l.rescale_factor);
                let norm = Normalize::new(m, s);
                let rows = patchify(
                    &frames,
                    l.patch_size as usize,
                    l.temporal_patch_size as usize,
                    l.merge_size as usize,
                    &plan,
                    &norm,
                    self.settings.parallel,
                );
                let [t, gh, gw] = plan.grid_thw;
                vec![
                    NamedTensor {
                        name: "pixel_values_videos",
                        shape: vec![(t * gh * gw) as usize, plan.values_per_row as usize],
                        data: TensorData::F32(rows),
                    },
                    NamedTensor {
                        name: "video_grid_thw",
                        shape: vec![1, 3],
                        data: TensorData::I64(vec![t as i64, gh as i64, gw as i64]),
                    },
                ]
            }
            VideoLaw::Gemma4(l) => gemma4_tensors(l, &plan, &frames),
        };
        Ok(PreparedVideo { plan, tensors })
    }
}

/// gemma4 `_preprocess` (video_processing_gemma4.py:255-281) on the resized frames: per frame
/// the fused rescale+normalise (mean 0, std 1 → `f32(u8) / f32(255)`, image_processing_backends.py
/// :329-367), patches `(ky, kx, c)` raster over the frame, positions `(x, y)`, both padded to
/// `max_patches` rows with 0 / `(−1, −1)` (`pad_to_max_patches`, :138-152).
fn gemma4_tensors(l: &Gemma4VideoLaw, plan: &VideoPlan, frames: &[RgbImage]) -> Vec<NamedTensor> {
    let p = l.patch_size as usize;
    let k2 = (l.pooling_kernel_size as usize).pow(2);
    let max_patches = l.max_soft_tokens as usize * k2;
    let row = 3 * p * p;
    let [_, gh, gw] = plan.grid_thw.map(|x| x as usize);
    let n = frames.len();
    let mut pv = vec![0f32; n * max_patches * row];
    let mut pos = vec![-1i64; n * max_patches * 2];
    let lut: [[f32; 256]; 3] = if l.normalize {
        let (m, s) = crate::prepare::fused(&l.mean, &l.std, l.rescale_factor);
        std::array::from_fn(|c| std::array::from_fn(|v| (v as f32 - m[c]) / s[c]))
    } else {
        let r = l.rescale_factor as f32;
        [std::array::from_fn(|v| v as f32 * r); 3]
    };
    for (f, frame) in frames.iter().enumerate() {
        let out = &mut pv[f * max_patches * row..(f + 1) * max_patches * row];
        for i in 0..gh * gw {
            let (py, px) = (i / gw, i % gw);
            let dst = &mut out[i * row..(i + 1) * row];
            for ky in 0..p {
                let src = ((py * p + ky) * frame.width + px * p) * 3;
                for (j, &v) in frame.data[src..src + p * 3].iter().enumerate() {
                    dst[ky * p * 3 + j] = lut[j % 3][usize::from(v)];
                }
            }
            let at = (f * max_patches + i) * 2;
            pos[at] = px as i64;
            pos[at + 1] = py as i64;
        }
    }
    vec![
        NamedTensor {
            name: "pixel_values_videos",
            shape: vec![n, max_patches, row],
            data: TensorData::F32(pv),
        },
        NamedTensor {
            name: "video_position_ids",
            shape: vec![n, max_patches, 2],
            data: TensorData::I64(pos),
        },
        NamedTensor {
            name: "num_frames_per_video",
            shape: vec![1],
            data: TensorData::I64(vec![n as i64]),
        },
        NamedTensor {
            name: "num_soft_tokens_per_video",
            shape: vec![1],
            data: TensorData::I64(vec![(gh * gw / k2) as i64]),
        },
    ]
}

fn frame_err(index: usize, e: PrepError) -> PrepError {
    PrepError::VideoFrame {
        index,
        source: Box::new(e),
    }
}

fn family_of(law: &Law) -> Family {
    match law {
        Law::Gemma4(_) => Family::Gemma4,
        Law::Glm5Next(_) => Family::Glm5Next,
        Law::Glm46V(_) => Family::GlmOcr,
        Law::Step3p7(_) => Family::Step3p7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::video::test_util::{
        assert_prompt, cases, chw, fixtures, glm5, glm5_configs, metadata_of, png,
        preprocessor_for, sha256_hex, Case,
    };
    use crate::video::VideoMetadata;

    /// Sampled indices, grid, timestamps, prompt, resized frames and `pixel_values_videos`
    /// against upstream's `Glm5NextVideoProcessor`, for raw RGB frames and for the same frames
    /// as PNG files: indices, grid, prompt and both tensors exactly equal (the tensors by sha256).
    #[test]
    fn upstream_glm5_next_video_fixtures() {
        check_cases(cases("glm5_next_video", 6));
    }

    /// The same against upstream's `Gemma4VideoProcessor` (plus `video_position_ids` by sha256
    /// and the frame and soft-token counts).
    #[test]
    fn upstream_gemma4_video_fixtures() {
        check_cases(cases("gemma4_video", 5));
    }

    fn check_cases(cases: Vec<Case>) {
        for case in cases {
            let name = &case.name;
            let pre = preprocessor_for(&case.meta);
            let meta = metadata_of(&case.meta);
            let refs: Vec<&[u8]> = case.frames.iter().map(Vec::as_slice).collect();
            let pngs: Vec<Vec<u8>> = case
                .frames
                .iter()
                .map(|f| png(f, case.width, case.height))
                .collect();
            let sources: Vec<ImageSource<'_>> =
                pngs.iter().map(|b| ImageSource::Bytes(b)).collect();
            let raw = Video {
                frames: VideoFrames::Rgb {
                    width: case.width,
                    height: case.height,
                    frames: &refs,
                },
                metadata: meta,
            };
            let encoded = Video {
                frames: VideoFrames::Encoded(&sources),
                metadata: meta,
            };
            for (kind, video) in [("raw", raw), ("png", encoded)] {
                let plan = pre
                    .plan(&video)
                    .unwrap_or_else(|e| panic!("{name} {kind}: {e}"));
                let want: Vec<u64> = case.indices.iter().map(|&i| i as u64).collect();
                assert_eq!(plan.frames_indices, want, "{name} {kind}: frames_indices");
                if let Some(g) = &case.grid {
                    let grid: Vec<u64> = g.iter().map(|&i| i as u64).collect();
                    assert_eq!(
                        plan.grid_thw.to_vec(),
                        grid,
                        "{name} {kind}: video_grid_thw"
                    );
                    assert_eq!(
                        plan.rows,
                        grid.iter().product::<u64>() / 4,
                        "{name}: rows = prod(grid) / merge²"
                    );
                }
                // JSON carries Python's repr of each timestamp; both are `idx / fps` in f64.
                let ts: Vec<f64> = case.meta["timestamps"]
                    .as_array()
                    .expect("timestamps")
                    .iter()
                    .filter_map(Value::as_f64)
                    .collect();
                assert_eq!(plan.timestamps.len(), ts.len(), "{name}");
                for (a, b) in plan.timestamps.iter().zip(&ts) {
                    assert!(
                        (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                        "{name}: {a} vs {b}"
                    );
                }
                assert_prompt(name, &plan.prompt, &case.meta["prompt_plan"]);

                let (_, frames) = pre.resized_frames(&video).expect("resized");
                let u8s = chw(&frames);
                assert_eq!(
                    sha256_hex(&u8s),
                    case.meta["resized_u8_sha256"].as_str().unwrap_or(""),
                    "{name} {kind}: resized frames differ from upstream's"
                );
                if let Some(r) = &case.resized {
                    assert!(&u8s == r, "{name} {kind}: resized_u8");
                }
                let prepared = pre.prepare_video(&video).expect("prepare");
                let pv = prepared
                    .tensor("pixel_values_videos")
                    .expect("pixel_values_videos");
                let shape: Vec<u64> = case.meta["pixel_values_videos_shape"]
                    .as_array()
                    .expect("shape")
                    .iter()
                    .filter_map(Value::as_u64)
                    .collect();
                assert_eq!(
                    pv.shape.iter().map(|&s| s as u64).collect::<Vec<_>>(),
                    shape,
                    "{name}"
                );
                assert_eq!(
                    sha256_hex(&pv.to_le_bytes()),
                    case.meta["pixel_values_videos_sha256"]
                        .as_str()
                        .unwrap_or(""),
                    "{name} {kind}: pixel_values_videos differ from upstream's"
                );
                if let Some((frames, soft)) = case.counts {
                    let pos = prepared.tensor("video_position_ids").expect("positions");
                    assert_eq!(
                        sha256_hex(&pos.to_le_bytes()),
                        case.meta["video_position_ids_sha256"]
                            .as_str()
                            .unwrap_or(""),
                        "{name} {kind}: video_position_ids"
                    );
                    let one = |n: &str| match prepared.tensor(n).map(|t| &t.data) {
                        Some(TensorData::I64(v)) => v.first().copied(),
                        _ => None,
                    };
                    assert_eq!(one("num_frames_per_video"), Some(frames), "{name}");
                    assert_eq!(one("num_soft_tokens_per_video"), Some(soft), "{name}");
                    assert_eq!(plan.rows, (frames * soft) as u64, "{name}: rows");
                }
                assert_eq!(prepared.plan, plan, "{name} {kind}");
                let bytes: u64 = prepared
                    .tensors
                    .iter()
                    .map(|t| t.to_le_bytes().len() as u64)
                    .sum();
                assert_eq!(plan.output_bytes(), bytes, "{name}: output bytes");
            }
        }
    }
    /// Metadata and frames that do not fit together are typed errors.
    #[test]
    fn inconsistent_videos_are_errors() {
        let pre = glm5();
        let frame = vec![7u8; 28 * 21 * 3];
        let frames: Vec<&[u8]> = vec![&frame; 5];
        let video = |meta: VideoMetadata| Video {
            frames: VideoFrames::Rgb {
                width: 28,
                height: 21,
                frames: &frames,
            },
            metadata: meta,
        };
        let ok = VideoMetadata {
            total_num_frames: 5,
            fps: Some(2.0),
            duration: None,
        };
        assert!(pre.prepare_video(&video(ok)).is_ok());
        for bad in [
            VideoMetadata { fps: None, ..ok },
            VideoMetadata {
                fps: Some(0.0),
                ..ok
            },
            VideoMetadata {
                fps: Some(f64::NAN),
                ..ok
            },
            VideoMetadata {
                total_num_frames: 6,
                ..ok
            },
            VideoMetadata {
                total_num_frames: 0,
                ..ok
            },
            VideoMetadata {
                duration: Some(-1.0),
                ..ok
            },
        ] {
            assert!(
                matches!(pre.prepare_video(&video(bad)), Err(PrepError::BadVideo(_))),
                "{bad:?}"
            );
        }
        // a raw frame of the wrong length
        let short = vec![0u8; 10];
        let mut mixed = frames.clone();
        mixed[3] = &short;
        let v = Video {
            frames: VideoFrames::Rgb {
                width: 28,
                height: 21,
                frames: &mixed,
            },
            metadata: ok,
        };
        assert!(matches!(pre.prepare_video(&v), Err(PrepError::BadVideo(_))));
        // encoded frames of two sizes
        let a = png(&frame, 28, 21);
        let b = png(&vec![1u8; 21 * 28 * 3], 21, 28);
        let sources = [ImageSource::Bytes(&a), ImageSource::Bytes(&b)];
        let v = Video {
            frames: VideoFrames::Encoded(&sources),
            metadata: VideoMetadata {
                total_num_frames: 2,
                fps: Some(2.0),
                duration: None,
            },
        };
        match pre.prepare_video(&v) {
            Err(PrepError::BadVideo(m)) => assert!(m.contains("frame 1 is 21x28"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// Families without a video path here refuse video with a typed error; gemma4 and glm5_next
    /// follow the video processor class a config names.
    #[test]
    fn families_without_video_refuse_it() {
        for model in ["glm_ocr", "step3p7"] {
            let cfg = ModelConfigs::from_dir(&fixtures().join("models").join(model)).expect("cfg");
            match VideoPreprocessor::from_configs(&cfg, None, VideoSettings::default()) {
                Err(PrepError::NoVideoPath(m)) => assert!(m.contains("family"), "{m}"),
                other => panic!("{model}: {other:?}"),
            }
        }
        let other = serde_json::json!({"video_processor_type": "Qwen3VLVideoProcessor"});
        assert!(matches!(
            VideoPreprocessor::from_configs(
                &glm5_configs(),
                Some(&other),
                VideoSettings::default()
            ),
            Err(PrepError::NoVideoPath(_))
        ));
        let named = serde_json::json!({"video_processor_type": "Glm5NextVideoProcessor", "fps": 1});
        let pre = VideoPreprocessor::from_configs(
            &glm5_configs(),
            Some(&named),
            VideoSettings::default(),
        )
        .expect("named glm5_next video processor");
        assert!(matches!(pre.law(), VideoLaw::Glm5Next(l) if l.fps == 1.0));
        let gemma = ModelConfigs::from_dir(&fixtures().join("models/gemma4")).expect("cfg");
        let pre = VideoPreprocessor::from_configs(&gemma, None, VideoSettings::default())
            .expect("gemma4 video");
        assert_eq!(pre.family(), Family::Gemma4);
        // upstream raises when a config sets fps (num_frames is always set)
        let fps = serde_json::json!({"fps": 2});
        assert!(matches!(
            VideoPreprocessor::from_configs(&gemma, Some(&fps), VideoSettings::default()),
            Err(PrepError::Config { .. })
        ));
        // more frames asked than the video has: upstream's ValueError, typed here
        let meta = VideoMetadata {
            total_num_frames: 31,
            fps: None,
            duration: None,
        };
        assert!(matches!(
            pre.sampled_indices(&meta),
            Err(PrepError::BadVideo(_))
        ));
    }
    /// Only the sampled frames are ever looked at: a 20 s, 30 fps video (600 frames) whose
    /// unsampled frames are not images at all prepares, for glm5_next (40 frames sampled at
    /// 2 fps) and gemma4 (`num_frames` 4); the decoded frames never all exist at once.
    #[test]
    fn only_sampled_frames_are_read() {
        let frame = png(&vec![90u8; 40 * 30 * 3], 40, 30);
        let junk = [0u8; 16];
        let meta = VideoMetadata {
            total_num_frames: 600,
            fps: Some(30.0),
            duration: None,
        };
        let gemma = ModelConfigs::from_dir(&fixtures().join("models/gemma4")).expect("cfg");
        let settings = VideoSettings {
            num_frames: Some(4),
            ..Default::default()
        };
        for pre in [
            glm5(),
            VideoPreprocessor::from_configs(&gemma, None, settings).expect("gemma4"),
        ] {
            let sampled = pre.sampled_indices(&meta).expect("sample");
            let sources: Vec<ImageSource<'_>> = (0..600u64)
                .map(|i| ImageSource::Bytes(if sampled.contains(&i) { &frame } else { &junk }))
                .collect();
            let video = Video {
                frames: VideoFrames::Encoded(&sources),
                metadata: meta,
            };
            let prepared = pre
                .prepare_video(&video)
                .expect("only sampled frames are decoded");
            assert_eq!(prepared.plan.frames_indices, sampled);
            assert!(
                sampled.len() < 64,
                "{:?}: {} sampled",
                pre.family(),
                sampled.len()
            );
        }
    }
}
