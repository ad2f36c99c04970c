//! Video input: a video's frames plus its metadata → upstream's video processor tensors
//! (`pixel_values_videos`, `video_grid_thw`) and the prompt plan (issue 24; laws and citations in
//! `docs/VIDEO.md`).
//!
//! Decoding a container (MP4, WebM, …) is the caller's job, as in the engines: the caller hands in
//! every frame of the video, each an encoded image (admitted one by one as an image is) or raw RGB
//! u8, with the metadata upstream's sampling reads (`fps`, the frame count, optionally the
//! duration). Admission runs on the metadata first ([`VideoLimits`]: frames, sampled pixels,
//! bytes handed in, output bytes), before any frame is decoded or resized; then only the sampled
//! frames are decoded (one per worker thread at a time, only their canvases kept), resized onto
//! the canvas and patchified.
//!
//! glm5_next (`Glm5NextVideoProcessor`) and gemma4 (`Gemma4VideoProcessor`) have a video path;
//! every other family is refused with [`PrepError::NoVideoPath`].

use rayon::prelude::*;
use serde_json::Value;

use crate::config::{self, ModelConfigs, PrepSettings, Token};
use crate::error::{PrepError, Result};
use crate::law::{self, Law, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD};
use crate::norm::{Normalize, Window};
use crate::plan::{Family, PromptRun};
use crate::prepare::{grid_row, Gemma4Inputs, GlmInputs, NamedTensor, TensorData};
use crate::resize::{resize_rgb, Filter};
use crate::source::{self, AdmissionLimits, ImageSource, RgbImage};

/// Default cap on the frames a video may have (its metadata's `total_num_frames`): 4096, a bit
/// over two minutes at 30 fps. Ours, not upstream's (which has none).
pub const DEFAULT_MAX_VIDEO_FRAMES: u64 = 4096;
/// Default cap on the pixels of the sampled frames together (`sampled · width · height`), the
/// frames that are decoded and resized: 2²⁸ (128 sampled 1920×1080 frames). Ours.
pub const DEFAULT_MAX_VIDEO_PIXELS: u64 = 1 << 28;
/// Default cap on the bytes handed in (the encoded frames' lengths together, or
/// `frames · width · height · 3` raw): 1 GiB. Ours.
pub const DEFAULT_MAX_VIDEO_BYTES: u64 = 1 << 30;

/// Largest `max_frames` / `num_frames` a config or setting may ask for (2²⁰): the sampling
/// builds an index list that long before deduplicating it, so the value bounds that allocation.
pub const MAX_SAMPLED_FRAMES: u64 = 1 << 20;

/// glm5_next video processor: target sampling rate in frames per second
/// (video_processing_glm5_next.py:156 `fps = 2`).
pub const GLM5_NEXT_VIDEO_FPS: f64 = 2.0;
/// glm5_next video processor: most frames sampled (video_processing_glm5_next.py:160 `max_frames = 2048`).
pub const GLM5_NEXT_VIDEO_MAX_FRAMES: u64 = 2048;
/// glm5_next video processor: duration cap in seconds, 0 = none
/// (video_processing_glm5_next.py:152 `max_duration = 0`).
pub const GLM5_NEXT_VIDEO_MAX_DURATION: f64 = 0.0;
/// glm5_next video processor: token budget of the whole video
/// (video_processing_glm5_next.py:162 `max_image_tokens = 240000`; the image processor's is 8000).
pub const GLM5_NEXT_VIDEO_MAX_IMAGE_TOKENS: u64 = 240_000;
/// glm5_next video processor: minimum token budget (video_processing_glm5_next.py:161 `min_image_tokens = 16`).
pub const GLM5_NEXT_VIDEO_MIN_IMAGE_TOKENS: u64 = 16;

/// Budgets a video must meet, checked on its metadata before any frame is decoded or resized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VideoLimits {
    /// Most frames in the video (`total_num_frames`; default [`DEFAULT_MAX_VIDEO_FRAMES`]).
    pub max_frames: u64,
    /// Most pixels of the sampled frames together (default [`DEFAULT_MAX_VIDEO_PIXELS`]).
    pub max_pixels: u64,
    /// Most bytes handed in (default [`DEFAULT_MAX_VIDEO_BYTES`]).
    pub max_bytes: u64,
}

impl Default for VideoLimits {
    fn default() -> Self {
        VideoLimits {
            max_frames: DEFAULT_MAX_VIDEO_FRAMES,
            max_pixels: DEFAULT_MAX_VIDEO_PIXELS,
            max_bytes: DEFAULT_MAX_VIDEO_BYTES,
        }
    }
}

/// What upstream's sampling reads of a video (transformers `VideoMetadata`, video_utils.py:80-119).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoMetadata {
    /// Frames in the video (= frames handed in).
    pub total_num_frames: u64,
    /// The video's frame rate (required by glm5_next's sampling).
    pub fps: Option<f64>,
    /// Duration in seconds, if the container states it (`None` or 0: upstream derives it from
    /// the frame count and fps).
    pub duration: Option<f64>,
}

/// The frames of one video, every frame of it, in order.
#[derive(Debug, Clone, Copy)]
pub enum VideoFrames<'a> {
    /// Encoded images (JPEG, PNG, WebP, GIF, BMP, or `data:` URIs), each admitted as an image is.
    Encoded(&'a [ImageSource<'a>]),
    /// Raw RGB u8 frames, `height·width·3` bytes each, row-major.
    Rgb {
        /// Frame width.
        width: u32,
        /// Frame height.
        height: u32,
        /// The frames.
        frames: &'a [&'a [u8]],
    },
}

impl VideoFrames<'_> {
    fn len(&self) -> usize {
        match self {
            VideoFrames::Encoded(f) => f.len(),
            VideoFrames::Rgb { frames, .. } => frames.len(),
        }
    }
}

/// A video: its frames and metadata.
#[derive(Debug, Clone, Copy)]
pub struct Video<'a> {
    /// The frames.
    pub frames: VideoFrames<'a>,
    /// The metadata.
    pub metadata: VideoMetadata,
}

/// Parameters of `Glm5NextVideoProcessor` (video_processing_glm5_next.py:139-162).
#[derive(Debug, Clone, PartialEq)]
pub struct Glm5NextVideoLaw {
    /// `patch_size` (14).
    pub patch_size: u32,
    /// `temporal_patch_size` (2).
    pub temporal_patch_size: u32,
    /// `merge_size` (2).
    pub merge_size: u32,
    /// `patch_expand_factor` (1).
    pub patch_expand_factor: u32,
    /// `min_image_tokens` ([`GLM5_NEXT_VIDEO_MIN_IMAGE_TOKENS`]).
    pub min_image_tokens: u64,
    /// `max_image_tokens` ([`GLM5_NEXT_VIDEO_MAX_IMAGE_TOKENS`]).
    pub max_image_tokens: u64,
    /// Target `fps` ([`GLM5_NEXT_VIDEO_FPS`]).
    pub fps: f64,
    /// `max_frames` ([`GLM5_NEXT_VIDEO_MAX_FRAMES`]).
    pub max_frames: u64,
    /// `max_duration` in seconds, ≤ 0 = none ([`GLM5_NEXT_VIDEO_MAX_DURATION`]).
    pub max_duration: f64,
    /// Resampling filter (BICUBIC).
    pub filter: Filter,
    /// `image_mean` (CLIP).
    pub mean: [f64; 3],
    /// `image_std` (CLIP).
    pub std: [f64; 3],
    /// `rescale_factor` (1/255).
    pub rescale_factor: f64,
}

impl Default for Glm5NextVideoLaw {
    fn default() -> Self {
        Glm5NextVideoLaw {
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
            patch_expand_factor: 1,
            min_image_tokens: GLM5_NEXT_VIDEO_MIN_IMAGE_TOKENS,
            max_image_tokens: GLM5_NEXT_VIDEO_MAX_IMAGE_TOKENS,
            fps: GLM5_NEXT_VIDEO_FPS,
            max_frames: GLM5_NEXT_VIDEO_MAX_FRAMES,
            max_duration: GLM5_NEXT_VIDEO_MAX_DURATION,
            filter: Filter::Bicubic,
            mean: OPENAI_CLIP_MEAN,
            std: OPENAI_CLIP_STD,
            rescale_factor: 1.0 / 255.0,
        }
    }
}

impl Glm5NextVideoLaw {
    /// The image law with the same sizes and this video's frame budget: `smart_resize` is one
    /// function for both (video_processing_glm5_next.py:74-135 = image_processing_glm5_next.py:59-…).
    fn image_law(&self) -> law::Glm5NextLaw {
        law::Glm5NextLaw {
            patch_size: self.patch_size,
            temporal_patch_size: self.temporal_patch_size,
            merge_size: self.merge_size,
            patch_expand_factor: self.patch_expand_factor,
            min_image_tokens: self.min_image_tokens,
            max_image_tokens: self.max_image_tokens,
            filter: self.filter,
            mean: self.mean,
            std: self.std,
            rescale_factor: self.rescale_factor,
        }
    }
}

/// gemma4 video processor: frames sampled, uniformly (video_processing_gemma4.py:165 `num_frames = 32`).
pub const GEMMA4_VIDEO_NUM_FRAMES: u64 = 32;
/// gemma4 video processor: soft tokens per frame (video_processing_gemma4.py:168 `max_soft_tokens = 70`).
pub const GEMMA4_VIDEO_MAX_SOFT_TOKENS: u32 = 70;
/// Frame rate the gemma4 processor assumes for timestamps when the metadata has none
/// (processing_gemma4.py:207-213).
pub const GEMMA4_VIDEO_DEFAULT_FPS: f64 = 24.0;

/// Parameters of `Gemma4VideoProcessor` (video_processing_gemma4.py:155-170).
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4VideoLaw {
    /// `patch_size` (16).
    pub patch_size: u32,
    /// `pooling_kernel_size` (3).
    pub pooling_kernel_size: u32,
    /// `max_soft_tokens` per frame ([`GEMMA4_VIDEO_MAX_SOFT_TOKENS`]; one of 70, 140, 280, 560, 1120).
    pub max_soft_tokens: u32,
    /// `num_frames` sampled uniformly ([`GEMMA4_VIDEO_NUM_FRAMES`]).
    pub num_frames: u64,
    /// Resampling filter (BICUBIC).
    pub filter: Filter,
    /// `do_normalize` (true: the fused `(x − mean·255)/(std·255)`; false: `x · rescale_factor`).
    pub normalize: bool,
    /// `image_mean` (0).
    pub mean: [f64; 3],
    /// `image_std` (1).
    pub std: [f64; 3],
    /// `rescale_factor` (1/255).
    pub rescale_factor: f64,
}

impl Default for Gemma4VideoLaw {
    fn default() -> Self {
        Gemma4VideoLaw {
            patch_size: 16,
            pooling_kernel_size: 3,
            max_soft_tokens: GEMMA4_VIDEO_MAX_SOFT_TOKENS,
            num_frames: GEMMA4_VIDEO_NUM_FRAMES,
            filter: Filter::Bicubic,
            normalize: true,
            mean: [0.0; 3],
            std: [1.0; 3],
            rescale_factor: 1.0 / 255.0,
        }
    }
}

impl Gemma4VideoLaw {
    /// The image law with this video law's sizes: `get_aspect_ratio_preserving_size` is the
    /// image processor's (video_processing_gemma4.py:67-119, "Copied from").
    fn image_law(&self) -> law::Gemma4Law {
        law::Gemma4Law {
            patch_size: self.patch_size,
            pooling_kernel_size: self.pooling_kernel_size,
            max_soft_tokens: self.max_soft_tokens,
            filter: self.filter,
            rescale_factor: self.rescale_factor,
        }
    }
}

/// Caller settings of a [`VideoPreprocessor`] (each `Some` overrides the video processor config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoSettings {
    /// Metadata budgets.
    pub limits: VideoLimits,
    /// Per-frame admission (each encoded frame is admitted as an image).
    pub frame_limits: AdmissionLimits,
    /// glm5_next target sampling rate (upstream's `fps` kwarg; gemma4 refuses one, as upstream).
    pub fps: Option<f64>,
    /// `max_frames`.
    pub max_frames: Option<u64>,
    /// `min_image_tokens`.
    pub min_image_tokens: Option<u64>,
    /// `max_image_tokens`.
    pub max_image_tokens: Option<u64>,
    /// gemma4 `num_frames`.
    pub num_frames: Option<u64>,
    /// gemma4 `max_soft_tokens` per frame.
    pub max_soft_tokens: Option<u32>,
    /// Refuse when the output tensors would exceed this many bytes (default 2 GiB).
    pub max_output_bytes: u64,
    /// Decode and resize the sampled frames over the rayon pool (default true).
    pub parallel: bool,
}

impl Default for VideoSettings {
    fn default() -> Self {
        VideoSettings {
            limits: VideoLimits::default(),
            frame_limits: AdmissionLimits::default(),
            fps: None,
            max_frames: None,
            min_image_tokens: None,
            max_image_tokens: None,
            num_frames: None,
            max_soft_tokens: None,
            max_output_bytes: config::DEFAULT_MAX_OUTPUT_BYTES,
            parallel: true,
        }
    }
}

/// The prompt tokens of a video (ids from `config.json`, else the tokenizer files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VideoTokens {
    /// glm5_next.
    Glm5Next {
        /// `<|begin_of_video|>` (`video_start_token_id`), written by the chat template.
        begin_of_video: Token,
        /// `<|end_of_video|>` (`video_end_token_id`), written by the chat template.
        end_of_video: Token,
        /// `<|begin_of_image|>` (`image_start_token_id`), per frame pair.
        begin_of_image: Token,
        /// `<|end_of_image|>` (`image_end_token_id`), per frame pair.
        end_of_image: Token,
        /// `<|image|>` (`image_token_id`): the positions that receive rows.
        image: Token,
    },
    /// gemma4 (processing_gemma4.py:203-220).
    Gemma4 {
        /// Begin of image (`boi_token_id`), per frame.
        boi: Token,
        /// `<|video|>` (`video_token_id`): the positions that receive rows.
        video: Token,
        /// End of image (`eoi_token_id`), per frame.
        eoi: Token,
    },
}

impl VideoTokens {
    /// Every token of the table.
    pub fn all(&self) -> Vec<&Token> {
        match self {
            VideoTokens::Glm5Next {
                begin_of_video,
                end_of_video,
                begin_of_image,
                end_of_image,
                image,
            } => vec![
                begin_of_video,
                end_of_video,
                begin_of_image,
                end_of_image,
                image,
            ],
            VideoTokens::Gemma4 { boi, video, eoi } => vec![boi, video, eoi],
        }
    }
}

/// One piece of a video's prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VideoPiece {
    /// A run of one special token.
    Run(PromptRun),
    /// Plain text for the tokenizer (the timestamps, e.g. `0.5 seconds`).
    Text(String),
}

/// Everything the metadata and frame size determine about one video.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoPlan {
    /// Family (glm5_next or gemma4).
    pub family: Family,
    /// Upstream video processor class whose law was applied.
    pub processor_class: &'static str,
    /// Frame width.
    pub width: u32,
    /// Frame height.
    pub height: u32,
    /// Sampled frame indices (upstream's `metadata.frames_indices`), even in number.
    pub frames_indices: Vec<u64>,
    /// `index / fps` per sampled frame (upstream's `metadata.timestamps`).
    pub timestamps: Vec<f64>,
    /// Size `(width, height)` every sampled frame is brought to (glm5_next: the canvas it is
    /// padded to; gemma4: the resized frame).
    pub target: (u64, u64),
    /// Resized content `(width, height)` at the canvas' top-left (gemma4: = `target`).
    pub content: (u64, u64),
    /// glm5_next: `video_grid_thw` `[frame pairs, patch rows, patch columns]`; gemma4 (which has
    /// no grid tensor): `[frames, patch rows, patch columns]`.
    pub grid_thw: [u64; 3],
    /// Values in a row of `pixel_values_videos` (glm5_next `3 · temporal patch · patch²`,
    /// gemma4 `3 · patch²`).
    pub values_per_row: u64,
    /// Bytes of the output tensors.
    pub tensor_bytes: u64,
    /// Embedding rows the tower emits for the video (glm5_next `t·h·w / merge²`; gemma4
    /// frames × soft tokens per frame).
    pub rows: u64,
    /// The prompt. glm5_next: the chat template's `<|begin_of_video|>`, then the processor's
    /// expansion of `<|video|>` (per frame pair: `<|begin_of_image|>`, the `<|image|>` run,
    /// `<|end_of_image|>`, the timestamp text), then `<|end_of_video|>`; only the `<|image|>`
    /// runs receive rows. gemma4: per frame the text `mm:ss `, `<boi>`, the `<|video|>` run
    /// (receiving rows), `<eoi>`, frames separated by a space.
    pub prompt: Vec<VideoPiece>,
}

impl VideoPlan {
    /// The plan as one JSON object (what `vtower` prints): `prompt` lists the pieces in order,
    /// `[id, count, embeds]` for a token run (`id` null when unknown) and `{"text": …}` for text.
    pub fn to_json(&self) -> Value {
        let prompt: Vec<Value> = self
            .prompt
            .iter()
            .map(|p| match p {
                VideoPiece::Run(r) => serde_json::json!([r.token.id, r.count, r.embeds]),
                VideoPiece::Text(t) => serde_json::json!({ "text": t }),
            })
            .collect();
        let tokens: Vec<Value> = self
            .prompt
            .iter()
            .map(|p| match p {
                VideoPiece::Run(r) => serde_json::json!(r.token.text),
                VideoPiece::Text(_) => Value::Null,
            })
            .collect();
        serde_json::json!({
            "family": self.family.name(),
            "processor": self.processor_class,
            "width": self.width,
            "height": self.height,
            "frames_indices": self.frames_indices,
            "timestamps": self.timestamps,
            "target": [self.target.0, self.target.1],
            "content": [self.content.0, self.content.1],
            "video_grid_thw": self.grid_thw,
            "rows": self.rows,
            "prompt": prompt,
            "prompt_tokens": tokens,
        })
    }

    /// Bytes of the output tensors.
    pub fn output_bytes(&self) -> u64 {
        self.tensor_bytes
    }
}

/// A prepared video: upstream's tensors and the plan they land on.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedVideo {
    /// The plan (from the metadata and frame size alone).
    pub plan: VideoPlan,
    /// Under upstream's names: glm5_next `pixel_values_videos [N, 3·2·p²]` F32 and
    /// `video_grid_thw [1, 3]` I64; gemma4 `pixel_values_videos [F, max_patches, 3·p²]` F32,
    /// `video_position_ids [F, max_patches, 2]` I64, `num_frames_per_video [1]`,
    /// `num_soft_tokens_per_video [1]` I64.
    pub tensors: Vec<NamedTensor>,
}

impl PreparedVideo {
    /// Tensor by upstream name.
    pub fn tensor(&self, name: &str) -> Option<&NamedTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The glm tower inputs: the rows and `[t, h, w]` (the tower runs `t` attention segments,
    /// one per frame pair, as upstream's `get_video_features` does).
    pub fn glm(&self) -> Option<GlmInputs<'_>> {
        let rows = match &self.tensor("pixel_values_videos")?.data {
            TensorData::F32(v) => v.as_slice(),
            _ => return None,
        };
        let g = match &self.tensor("video_grid_thw")?.data {
            TensorData::I64(v) => v,
            _ => return None,
        };
        Some(GlmInputs {
            rows,
            grid_thw: grid_row(g)?,
        })
    }

    /// The gemma4 tower inputs, one image per frame (its real patches, no padding rows).
    pub fn gemma4_frames(&self) -> Option<Vec<Gemma4Inputs<'_>>> {
        let pv = match &self.tensor("pixel_values_videos")?.data {
            TensorData::F32(v) => v.as_slice(),
            _ => return None,
        };
        let pos_t = self.tensor("video_position_ids")?;
        let pos = match &pos_t.data {
            TensorData::I64(v) => v.as_slice(),
            _ => return None,
        };
        let (frames, max_patches) = (*pos_t.shape.first()?, *pos_t.shape.get(1)?);
        let row = pv.len().checked_div(frames * max_patches)?;
        (0..frames)
            .map(|f| {
                let p = pos.get(f * max_patches * 2..(f + 1) * max_patches * 2)?;
                let n = p.chunks_exact(2).take_while(|xy| xy != &[-1, -1]).count();
                Some(Gemma4Inputs {
                    patches: pv.get(f * max_patches * row..(f * max_patches + n) * row)?,
                    positions: p.get(..n * 2)?,
                    num_patches: n,
                })
            })
            .collect()
    }
}

/// The video law of a model.
#[derive(Debug, Clone, PartialEq)]
pub enum VideoLaw {
    /// `Glm5NextVideoProcessor`.
    Glm5Next(Glm5NextVideoLaw),
    /// `Gemma4VideoProcessor`.
    Gemma4(Gemma4VideoLaw),
}

/// A configured video preprocessor for one model.
#[derive(Debug, Clone)]
pub struct VideoPreprocessor {
    law: VideoLaw,
    tokens: VideoTokens,
    settings: VideoSettings,
}

/// The video processor dict the way `AutoVideoProcessor` finds it: `processor_config.json`
/// `video_processor` if present, else `video_preprocessor_config.json` (read by the caller).
pub fn video_processor_dict<'a>(
    cfg: &'a ModelConfigs,
    video_preprocessor_config: Option<&'a Value>,
) -> Option<&'a Value> {
    cfg.processor_config
        .as_ref()
        .and_then(|p| p.get("video_processor"))
        .or(video_preprocessor_config)
}

/// Read `video_preprocessor_config.json` from a model directory (`None` when absent).
pub fn read_video_config(dir: &std::path::Path) -> Result<Option<Value>> {
    let path = dir.join("video_preprocessor_config.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| cfg_err(&path.display().to_string(), format!("not JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(cfg_err(&path.display().to_string(), e.to_string())),
    }
}

fn cfg_err(file: &str, reason: impl Into<String>) -> PrepError {
    PrepError::Config {
        file: file.into(),
        reason: reason.into(),
    }
}

const VIDEO_FILE: &str = "video processor config";

fn get_u64(v: Option<&Value>, key: &str, default: u64, max: u64) -> Result<u64> {
    match v.and_then(|v| v.get(key)) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x
            .as_u64()
            .or_else(|| {
                x.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= max as f64)
                    .map(|f| f as u64)
            })
            .filter(|n| *n <= max)
            .ok_or_else(|| {
                cfg_err(
                    VIDEO_FILE,
                    format!("`{key}` = {x} out of range (0..={max})"),
                )
            }),
    }
}

fn get_f64(v: Option<&Value>, key: &str, default: f64) -> Result<f64> {
    match v.and_then(|v| v.get(key)) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x
            .as_f64()
            .filter(|f| f.is_finite())
            .ok_or_else(|| cfg_err(VIDEO_FILE, format!("`{key}` = {x} is not a finite number"))),
    }
}

fn get_triple(v: Option<&Value>, key: &str, default: [f64; 3]) -> Result<[f64; 3]> {
    match v.and_then(|v| v.get(key)) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Number(n)) => n
            .as_f64()
            .map(|f| [f; 3])
            .ok_or_else(|| cfg_err(VIDEO_FILE, format!("`{key}`"))),
        Some(Value::Array(a)) if a.len() == 3 => {
            let mut out = [0.0; 3];
            for (o, x) in out.iter_mut().zip(a) {
                *o = x
                    .as_f64()
                    .ok_or_else(|| cfg_err(VIDEO_FILE, format!("`{key}` must hold numbers")))?;
            }
            Ok(out)
        }
        Some(x) => Err(cfg_err(
            VIDEO_FILE,
            format!("`{key}` must be a number or 3 numbers, found {x}"),
        )),
    }
}

/// The glm5_next video law from its video processor dict (absent: the class defaults).
fn glm5_next_video_law(v: Option<&Value>, s: &VideoSettings) -> Result<Glm5NextVideoLaw> {
    for key in [
        "do_resize",
        "do_rescale",
        "do_normalize",
        "do_convert_rgb",
        "do_sample_frames",
    ] {
        match v.and_then(|v| v.get(key)) {
            None | Some(Value::Null) | Some(Value::Bool(true)) => {}
            Some(x) => {
                return Err(cfg_err(
                    VIDEO_FILE,
                    format!("`{key}` = {x} is not supported (the vendor processor uses true)"),
                ))
            }
        }
    }
    let d = Glm5NextVideoLaw::default();
    let side = u64::from(config::MAX_CONFIG_SIDE);
    let small = |key: &str, dflt: u32| -> Result<u32> {
        let n = get_u64(v, key, u64::from(dflt), side)?;
        u32::try_from(n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| cfg_err(VIDEO_FILE, format!("`{key}` = {n} out of range")))
    };
    let filter = match v.and_then(|v| v.get("resample")) {
        None | Some(Value::Null) => d.filter,
        Some(x) => x.as_i64().and_then(Filter::from_pil_code).ok_or_else(|| {
            cfg_err(
                VIDEO_FILE,
                format!("`resample` = {x}: only BILINEAR (2) and BICUBIC (3) are implemented"),
            )
        })?,
    };
    let law = Glm5NextVideoLaw {
        patch_size: small("patch_size", d.patch_size)?,
        temporal_patch_size: small("temporal_patch_size", d.temporal_patch_size)?,
        merge_size: small("merge_size", d.merge_size)?,
        patch_expand_factor: small("patch_expand_factor", d.patch_expand_factor)?,
        min_image_tokens: match s.min_image_tokens {
            Some(n) => n,
            None => get_u64(
                v,
                "min_image_tokens",
                d.min_image_tokens,
                config::MAX_CONFIG_TOKENS,
            )?,
        },
        max_image_tokens: match s.max_image_tokens {
            Some(n) => n,
            None => get_u64(
                v,
                "max_image_tokens",
                d.max_image_tokens,
                config::MAX_CONFIG_TOKENS,
            )?,
        },
        fps: match s.fps {
            Some(f) => f,
            None => get_f64(v, "fps", d.fps)?,
        },
        max_frames: match s.max_frames {
            Some(n) => n,
            None => get_u64(v, "max_frames", d.max_frames, MAX_SAMPLED_FRAMES)?,
        },
        max_duration: get_f64(v, "max_duration", d.max_duration)?,
        filter,
        mean: get_triple(v, "image_mean", d.mean)?,
        std: get_triple(v, "image_std", d.std)?,
        rescale_factor: get_f64(v, "rescale_factor", d.rescale_factor)?,
    };
    if !(law.fps.is_finite() && law.fps > 0.0) {
        return Err(PrepError::BadSetting(format!(
            "target fps must be a positive number, got {}",
            law.fps
        )));
    }
    if law.max_image_tokens == 0
        || law.min_image_tokens > law.max_image_tokens
        || law.max_image_tokens > config::MAX_CONFIG_TOKENS
    {
        return Err(PrepError::BadSetting(format!(
            "video token budget {}..{} is empty",
            law.min_image_tokens, law.max_image_tokens
        )));
    }
    if law.max_frames == 0 {
        return Err(PrepError::BadSetting(
            "max_frames must be at least 1".into(),
        ));
    }
    // The same bounds the image laws meet (alignment ≤ 4096, temporal patch ≤ 16).
    config::check_law_bounds(VIDEO_FILE, &Law::Glm5Next(law.image_law()))?;
    Ok(law)
}

/// The gemma4 video law from its video processor dict (absent: the class defaults).
fn gemma4_video_law(v: Option<&Value>, s: &VideoSettings) -> Result<Gemma4VideoLaw> {
    for key in [
        "do_resize",
        "do_rescale",
        "do_convert_rgb",
        "do_sample_frames",
    ] {
        match v.and_then(|v| v.get(key)) {
            None | Some(Value::Null) | Some(Value::Bool(true)) => {}
            Some(x) => {
                return Err(cfg_err(
                    VIDEO_FILE,
                    format!("`{key}` = {x} is not supported (the vendor processor uses true)"),
                ))
            }
        }
    }
    // `sample_frames` raises when both are set (video_processing_utils.py:629-630), and a
    // config's `num_frames: null` keeps the class default 32: an `fps` always raises upstream.
    if let Some(x) = v.and_then(|v| v.get("fps")).filter(|x| !x.is_null()) {
        return Err(cfg_err(
            VIDEO_FILE,
            format!("`fps` = {x}: `num_frames` and `fps` are mutually exclusive upstream"),
        ));
    }
    let d = Gemma4VideoLaw::default();
    let side = u64::from(config::MAX_CONFIG_SIDE);
    let small = |key: &str, dflt: u32| -> Result<u32> {
        let n = get_u64(v, key, u64::from(dflt), side)?;
        u32::try_from(n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| cfg_err(VIDEO_FILE, format!("`{key}` = {n} out of range")))
    };
    let normalize = match v.and_then(|v| v.get("do_normalize")) {
        None | Some(Value::Null) => d.normalize,
        Some(Value::Bool(b)) => *b,
        Some(x) => return Err(cfg_err(VIDEO_FILE, format!("`do_normalize` = {x}"))),
    };
    let filter = match v.and_then(|v| v.get("resample")) {
        None | Some(Value::Null) => d.filter,
        Some(x) => x.as_i64().and_then(Filter::from_pil_code).ok_or_else(|| {
            cfg_err(
                VIDEO_FILE,
                format!("`resample` = {x}: only BILINEAR (2) and BICUBIC (3) are implemented"),
            )
        })?,
    };
    let mst = match s.max_soft_tokens {
        Some(m) => m,
        None => small("max_soft_tokens", d.max_soft_tokens)?,
    };
    if !law::GEMMA4_SUPPORTED_SOFT_TOKENS.contains(&mst) {
        return Err(PrepError::BadSetting(format!(
            "max_soft_tokens must be one of {:?}, got {mst}",
            law::GEMMA4_SUPPORTED_SOFT_TOKENS
        )));
    }
    if let Some(f) = s.fps {
        return Err(PrepError::BadSetting(format!(
            "a target fps ({f}) with gemma4: `num_frames` and `fps` are mutually exclusive upstream"
        )));
    }
    let num_frames = match s.num_frames {
        Some(n) => n,
        None => get_u64(v, "num_frames", d.num_frames, MAX_SAMPLED_FRAMES)?,
    };
    if num_frames == 0 {
        return Err(PrepError::BadSetting(
            "num_frames must be at least 1".into(),
        ));
    }
    let law = Gemma4VideoLaw {
        patch_size: small("patch_size", d.patch_size)?,
        pooling_kernel_size: small("pooling_kernel_size", d.pooling_kernel_size)?,
        max_soft_tokens: mst,
        num_frames,
        filter,
        normalize,
        mean: get_triple(v, "image_mean", d.mean)?,
        std: get_triple(v, "image_std", d.std)?,
        rescale_factor: get_f64(v, "rescale_factor", d.rescale_factor)?,
    };
    config::check_law_bounds(VIDEO_FILE, &Law::Gemma4(law.image_law()))?;
    Ok(law)
}

impl VideoPreprocessor {
    /// Build from the model's configs and its video processor config (`video_preprocessor_config.json`,
    /// see [`read_video_config`]; `None` = the class defaults). The video law follows the video
    /// processor class the config names, else the image processor's family; a family without a
    /// video path here is [`PrepError::NoVideoPath`].
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

    /// The indices of the frames upstream's sampling picks for this metadata (after the metadata
    /// checks): a caller holding encoded frames needs to read only these, and may hand in empty
    /// sources for the others (they are never looked at).
    pub fn sampled_indices(&self, meta: &VideoMetadata) -> Result<Vec<u64>> {
        match &self.law {
            VideoLaw::Glm5Next(l) => {
                check_metadata(meta, &self.settings.limits, true)?;
                glm5_next_sample(l, meta)
            }
            VideoLaw::Gemma4(l) => {
                check_metadata(meta, &self.settings.limits, false)?;
                gemma4_sample(l, meta)
            }
        }
    }

    /// The plan of a video of `width × height` frames with this metadata: sampling, sizes, grid,
    /// rows and prompt, from the metadata alone. The metadata budgets apply (frame count, sampled
    /// pixels, output bytes); nothing is decoded.
    pub fn plan_video(&self, meta: &VideoMetadata, width: u32, height: u32) -> Result<VideoPlan> {
        let indices = self.sampled_indices(meta)?;
        if width == 0 || height == 0 {
            return Err(PrepError::ZeroSized { width, height });
        }
        let n = indices.len() as u64;
        let pixels = n
            .saturating_mul(u64::from(width))
            .saturating_mul(u64::from(height));
        if pixels > self.settings.limits.max_pixels {
            return Err(PrepError::VideoOverBudget {
                what: format!("pixels of the {n} sampled {width}x{height} frames"),
                amount: pixels,
                budget: self.settings.limits.max_pixels,
            });
        }
        let plan = match &self.law {
            VideoLaw::Glm5Next(l) => self.plan_glm5_next(l, meta, indices, width, height)?,
            VideoLaw::Gemma4(l) => self.plan_gemma4(l, meta, indices, width, height)?,
        };
        if plan.tensor_bytes > self.settings.max_output_bytes {
            return Err(PrepError::OutputTooLarge {
                bytes: plan.tensor_bytes,
                budget: self.settings.max_output_bytes,
                rows: plan.rows,
            });
        }
        Ok(plan)
    }

    fn plan_glm5_next(
        &self,
        l: &Glm5NextVideoLaw,
        meta: &VideoMetadata,
        indices: Vec<u64>,
        width: u32,
        height: u32,
    ) -> Result<VideoPlan> {
        let n = indices.len() as u64;
        let il = l.image_law();
        let (th, tw) = smart_resize(&il, height, width, n)?;
        let (ch, cw) = content_size(&il, height, width, (th, tw), n);
        let p = u64::from(l.patch_size);
        let m = u64::from(l.merge_size);
        let tp = u64::from(l.temporal_patch_size);
        // patchify (:325-330): an odd count would repeat the last frame; sampling made it even.
        let gt = n.div_ceil(tp);
        let (gh, gw) = (th / p, tw / p);
        let rows = gt * gh * gw / (m * m);
        let fps = meta.fps.unwrap_or(24.0);
        let timestamps: Vec<f64> = indices.iter().map(|&i| i as f64 / fps).collect();
        let prompt = self.prompt_glm5_next(&timestamps, gt, rows / gt.max(1));
        let values_per_row = 3 * tp * p * p;
        let tensor_bytes = gt
            .saturating_mul(gh)
            .saturating_mul(gw)
            .saturating_mul(values_per_row)
            .saturating_mul(4)
            .saturating_add(24);
        Ok(VideoPlan {
            family: Family::Glm5Next,
            processor_class: "Glm5NextVideoProcessor",
            width,
            height,
            frames_indices: indices,
            timestamps,
            target: (tw, th),
            content: (cw, ch),
            grid_thw: [gt, gh, gw],
            values_per_row,
            tensor_bytes,
            rows,
            prompt,
        })
    }

    fn plan_gemma4(
        &self,
        l: &Gemma4VideoLaw,
        meta: &VideoMetadata,
        indices: Vec<u64>,
        width: u32,
        height: u32,
    ) -> Result<VideoPlan> {
        let n = indices.len() as u64;
        let (th, tw) = law::gemma4_target(&l.image_law(), height, width).map_err(|e| match e {
            PrepError::Unplannable {
                width,
                height,
                reason,
                ..
            } => PrepError::Unplannable {
                processor: "Gemma4VideoProcessor".into(),
                width,
                height,
                reason,
            },
            e => e,
        })?;
        let (th, tw) = (u64::from(th), u64::from(tw));
        let p = u64::from(l.patch_size);
        let k = u64::from(l.pooling_kernel_size);
        let (gh, gw) = (th / p, tw / p);
        let per_frame = gh * gw / (k * k);
        let max_patches = u64::from(l.max_soft_tokens) * k * k;
        let values_per_row = 3 * p * p;
        // processing_gemma4.py:207-213: no fps → 24 for the timestamps.
        let fps = meta.fps.unwrap_or(GEMMA4_VIDEO_DEFAULT_FPS);
        let timestamps: Vec<f64> = indices.iter().map(|&i| i as f64 / fps).collect();
        let prompt = self.prompt_gemma4(&timestamps, per_frame);
        let tensor_bytes = n
            .saturating_mul(max_patches)
            .saturating_mul(values_per_row * 4 + 16)
            .saturating_add(16);
        Ok(VideoPlan {
            family: Family::Gemma4,
            processor_class: "Gemma4VideoProcessor",
            width,
            height,
            frames_indices: indices,
            timestamps,
            target: (tw, th),
            content: (tw, th),
            grid_thw: [n, gh, gw],
            values_per_row,
            tensor_bytes,
            rows: n * per_frame,
            prompt,
        })
    }

    /// processing_glm5_next.py `replace_video_token` (:62-91) wrapped in the chat template's
    /// begin/end of video.
    fn prompt_glm5_next(&self, timestamps: &[f64], pairs: u64, per_pair: u64) -> Vec<VideoPiece> {
        let VideoTokens::Glm5Next {
            begin_of_video,
            end_of_video,
            begin_of_image,
            end_of_image,
            image,
        } = &self.tokens
        else {
            return Vec::new();
        };
        let mut out = vec![run(begin_of_video, 1, false)];
        // `metadata.timestamps[::2]`, padded with its last value (or 0) to `num_frames` (:76-84).
        let firsts: Vec<f64> = timestamps.iter().step_by(2).copied().collect();
        for k in 0..pairs as usize {
            let ts = firsts.get(k).or(firsts.last()).copied().unwrap_or(0.0);
            out.push(run(begin_of_image, 1, false));
            out.push(run(image, per_pair, true));
            out.push(run(end_of_image, 1, false));
            // `f"{timestamp_sec:.1f} seconds"` (:183): Rust's `{:.1}` rounds the exact binary
            // value half to even, as Python's format does.
            out.push(VideoPiece::Text(format!("{ts:.1} seconds")));
        }
        out.push(run(end_of_video, 1, false));
        out
    }

    /// processing_gemma4.py `replace_video_token` (:203-220): per sampled frame
    /// `f"{mm:02d}:{ss:02d} "` + boi + `n × <|video|>` + eoi, joined by a space.
    fn prompt_gemma4(&self, timestamps: &[f64], per_frame: u64) -> Vec<VideoPiece> {
        let VideoTokens::Gemma4 { boi, video, eoi } = &self.tokens else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(timestamps.len() * 4);
        for (i, &t) in timestamps.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            out.push(VideoPiece::Text(format!("{sep}{} ", gemma4_timestamp(t))));
            out.push(run(boi, 1, false));
            out.push(run(video, per_frame, true));
            out.push(run(eoi, 1, false));
        }
        out
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

/// A run of one prompt token.
fn run(t: &Token, count: u64, embeds: bool) -> VideoPiece {
    VideoPiece::Run(PromptRun {
        token: t.clone(),
        count,
        embeds,
    })
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

/// The metadata checks that need nothing else: a frame rate (where the law samples by time), at
/// least one frame, finite values, and the frame budget.
fn check_metadata(meta: &VideoMetadata, limits: &VideoLimits, fps_required: bool) -> Result<()> {
    if meta.total_num_frames == 0 {
        return Err(PrepError::BadVideo("a video of 0 frames".into()));
    }
    if meta.total_num_frames > limits.max_frames {
        return Err(PrepError::VideoOverBudget {
            what: "frames".into(),
            amount: meta.total_num_frames,
            budget: limits.max_frames,
        });
    }
    match meta.fps {
        // video_processing_glm5_next.py:182-186: glm5_next's sampling needs the video's fps
        // (gemma4 samples by count and assumes 24 fps for its timestamps).
        None if !fps_required => {}
        None => {
            return Err(PrepError::BadVideo(
                "no fps in the metadata: glm5_next samples frames by time (fps is required)".into(),
            ))
        }
        Some(f) if !(f.is_finite() && f > 0.0) => {
            return Err(PrepError::BadVideo(format!(
                "fps must be a positive number, got {f}"
            )))
        }
        Some(_) => {}
    }
    if let Some(d) = meta.duration {
        if !(d.is_finite() && d >= 0.0) {
            return Err(PrepError::BadVideo(format!(
                "duration must be a non-negative number of seconds, got {d}"
            )));
        }
    }
    Ok(())
}

/// `np.linspace(start, stop, num, dtype=int)` (numpy 2.4 `function_base.py`): `k·step + start`
/// in f64 with `step = (stop − start)/(num − 1)` (a zero step: `k/(num−1)·delta + start`), the
/// last value set to `stop`, then floored.
fn linspace_int(start: f64, stop: f64, num: u64) -> Vec<i64> {
    let delta = stop - start;
    let div = num.saturating_sub(1) as f64;
    let mut out: Vec<f64> = (0..num)
        .map(|k| {
            let k = k as f64;
            if num > 1 {
                let step = delta / div;
                if step == 0.0 {
                    k / div * delta + start
                } else {
                    k * step + start
                }
            } else {
                k * delta + start
            }
        })
        .collect();
    if num > 1 {
        if let Some(last) = out.last_mut() {
            *last = stop;
        }
    }
    out.iter_mut().for_each(|y| *y = y.floor());
    out.into_iter().map(|y| y as i64).collect()
}

/// `Glm5NextVideoProcessor.sample_frames` (video_processing_glm5_next.py:167-236), exactly: the
/// sampled indices, deduplicated in order, an odd count completed by repeating the last.
/// `meta` must have passed [`check_metadata`] (fps present, at least one frame).
pub fn glm5_next_sample(law: &Glm5NextVideoLaw, meta: &VideoMetadata) -> Result<Vec<u64>> {
    let fps = meta
        .fps
        .ok_or_else(|| PrepError::BadVideo("no fps in the metadata".into()))?;
    let total = meta.total_num_frames;
    if total == 0 {
        return Err(PrepError::BadVideo("a video of 0 frames".into()));
    }
    let max_frame_idx = (total - 1) as f64;
    // `metadata.duration or round(max_frame_idx / fps) + 1` (:190): Python's round, half to even.
    let duration = match meta.duration {
        Some(d) if d != 0.0 => d,
        _ => (max_frame_idx / fps).round_ties_even() + 1.0,
    };
    // `int(duration)` before the max_duration cap (:192).
    let max_seconds = duration.trunc();
    let duration = if law.max_duration <= 0.0 {
        duration
    } else {
        duration.min(law.max_duration)
    };
    let target = law.fps;
    // `int(duration * target_fps)`, capped by max_frames (:196-197); a product past u64 is
    // over max_frames anyway.
    let product = (duration * target).trunc();
    let extract_t = if product >= law.max_frames as f64 {
        law.max_frames
    } else {
        product.max(0.0) as u64
    };
    let per_frame = 1.0 / fps;
    let mut indices: Vec<i64> = if total < extract_t {
        linspace_int(0.0, max_frame_idx, extract_t)
    } else {
        let mut taken = Vec::new();
        let mut current = 0.0f64;
        let inv = 1.0 / target;
        for i in 0..total {
            if i as f64 * per_frame >= current {
                current += inv;
                taken.push(i as i64);
                if current >= max_seconds {
                    break;
                }
            }
        }
        taken
    };
    let len = indices.len() as u64;
    if len < extract_t {
        let (start, end) = match (indices.first(), indices.last()) {
            (Some(&a), Some(&b)) => (a as f64, b as f64),
            _ => (0.0, max_frame_idx.max(0.0)),
        };
        indices = linspace_int(start, end, extract_t);
    } else if len > extract_t {
        indices = linspace_int(0.0, max_frame_idx, extract_t);
    }
    let mut seen = std::collections::HashSet::new();
    let mut uniq: Vec<u64> = Vec::with_capacity(indices.len() + 1);
    for i in indices {
        // Every index lies in 0..total (linspace between indices of the video); a negative or
        // past-the-end one would be upstream's IndexError.
        let u = u64::try_from(i)
            .ok()
            .filter(|&u| u < total)
            .ok_or_else(|| {
                PrepError::BadVideo(format!("sampled frame index {i} outside the video"))
            })?;
        if seen.insert(u) {
            uniq.push(u);
        }
    }
    if uniq.len() % 2 == 1 {
        if let Some(&last) = uniq.last() {
            uniq.push(last);
        }
    }
    if uniq.is_empty() {
        // upstream returns the empty list; its processor then fails on the empty video
        // (ZeroDivisionError in smart_resize, checked against transformers 5.23).
        return Err(PrepError::BadVideo(format!(
            "no frame sampled ({} s at {target} fps gives 0 frames)",
            duration
        )));
    }
    Ok(uniq)
}

/// The base `sample_frames` → `default_sample_indices_fn` with `num_frames`
/// (video_processing_utils.py:605-633, video_utils.py:317-356): `arange(n) · total // n`;
/// `n > total` is upstream's ValueError.
pub fn gemma4_sample(law: &Gemma4VideoLaw, meta: &VideoMetadata) -> Result<Vec<u64>> {
    let total = meta.total_num_frames;
    let n = law.num_frames;
    if n > total {
        return Err(PrepError::BadVideo(format!(
            "num_frames={n} exceeds the video's {total} frames (upstream raises; set num_frames lower)"
        )));
    }
    Ok((0..n)
        .map(|k| (u128::from(k) * u128::from(total) / u128::from(n)) as u64)
        .collect())
}

/// Python's float `//` and `%` for `x ≥ 0`, `y > 0` (CPython `float_divmod`: `mod = fmod(x, y)`,
/// `div = (x − mod)/y`, floored, plus one when `div − floor > 0.5`).
fn py_divmod(x: f64, y: f64) -> (f64, f64) {
    let m = x % y;
    let div = (x - m) / y;
    let mut fd = div.floor();
    if div - fd > 0.5 {
        fd += 1.0;
    }
    (fd, m)
}

/// processing_gemma4.py:216 `f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"`.
fn gemma4_timestamp(seconds: f64) -> String {
    let (minutes, rest) = py_divmod(seconds, 60.0);
    format!("{:02}:{:02}", minutes.trunc() as u64, rest.trunc() as u64)
}

/// glm5_next `smart_resize` over `num_frames` frames (video_processing_glm5_next.py:74-135,
/// called by `resize` with the sampled frame count, :250-259): the canvas `(height, width)` within
/// the whole video's budget `min/max_image_tokens · temporal · factor²`. With `num_frames` =
/// the temporal patch size it is the image law (`law::glm5_next_canvas`; a test holds them equal).
pub fn smart_resize(
    law: &law::Glm5NextLaw,
    height: u32,
    width: u32,
    num_frames: u64,
) -> Result<(u64, u64)> {
    let factor =
        u64::from(law.patch_size) * u64::from(law.merge_size) * u64::from(law.patch_expand_factor);
    let tf = u64::from(law.temporal_patch_size);
    let ppt = tf * factor * factor;
    let min_pixels = law.min_image_tokens.saturating_mul(ppt);
    let max_pixels = law.max_image_tokens.saturating_mul(ppt);
    let align = |v: f64| -> u64 { (v / factor as f64).ceil() as u64 * factor };
    let (h, w) = (u64::from(height), u64::from(width));
    // `max(temporal_factor, round(num_frames / temporal_factor) * temporal_factor)` (:119).
    let aligned_frames = tf.max((num_frames as f64 / tf as f64).round_ties_even() as u64 * tf);
    let mut ah = align(h as f64);
    let mut aw = align(w as f64);
    let mut budget = aligned_frames.saturating_mul(ah).saturating_mul(aw);
    if budget < min_pixels {
        // `sqrt(min_pixels / (num_frames * height * width))` (:126): the frame count, not the aligned one.
        let scale = (min_pixels as f64 / (num_frames * h * w) as f64).sqrt();
        ah = align(((h as f64 * scale).ceil()).max(1.0));
        aw = align(((w as f64 * scale).ceil()).max(1.0));
        budget = aligned_frames.saturating_mul(ah).saturating_mul(aw);
    }
    if budget > max_pixels {
        let minimum = aligned_frames.saturating_mul(factor * factor);
        if max_pixels < minimum {
            return Err(PrepError::Unplannable {
                processor: "Glm5NextVideoProcessor".into(),
                width,
                height,
                reason: format!(
                    "max_pixels={max_pixels} is too small: at least {minimum} pixels are \
                     required for one aligned patch of {num_frames} frames"
                ),
            });
        }
        let (mut low, mut high) = (1i64, h as i64);
        let (mut bh, mut bw) = (factor, factor);
        while low <= high {
            let ch = (low + high) / 2;
            let cw = ((w * ch as u64) as f64 / h as f64).floor().max(1.0);
            let cand_h = align(ch as f64);
            let cand_w = align(cw);
            if aligned_frames.saturating_mul(cand_h).saturating_mul(cand_w) <= max_pixels {
                bh = cand_h;
                bw = cand_w;
                low = ch + 1;
            } else {
                high = ch - 1;
            }
        }
        ah = bh;
        aw = bw;
    }
    Ok((ah, aw))
}

/// The content `(height, width)` pasted at the canvas' top-left (video_processing_glm5_next.py:262-267):
/// `s = min(H/h, W/w)`, capped at 1 unless `num_frames·h·w` is under the minimum budget;
/// `content = max(1, min(canvas, floor(side·s)))`.
pub fn content_size(
    law: &law::Glm5NextLaw,
    height: u32,
    width: u32,
    canvas: (u64, u64),
    num_frames: u64,
) -> (u64, u64) {
    let factor =
        u64::from(law.patch_size) * u64::from(law.merge_size) * u64::from(law.patch_expand_factor);
    let ppt = u64::from(law.temporal_patch_size) * factor * factor;
    let (h, w) = (f64::from(height), f64::from(width));
    let (th, tw) = canvas;
    let mut scale = (th as f64 / h).min(tw as f64 / w);
    let pixels = num_frames
        .saturating_mul(u64::from(height))
        .saturating_mul(u64::from(width));
    if pixels >= ppt.saturating_mul(law.min_image_tokens) {
        scale = scale.min(1.0);
    }
    let ch = ((h * scale).floor() as u64).min(th).max(1);
    let cw = ((w * scale).floor() as u64).min(tw).max(1);
    (ch, cw)
}

/// One sampled frame resized to the plan's content size and (glm5_next, `pad`) pasted at the
/// top-left of a black canvas (video_processing_glm5_next.py:262-275); gemma4 resizes only
/// (video_processing_gemma4.py:187-212). Either skips the resize when the size is unchanged.
fn canvas(
    frame: &[u8],
    width: usize,
    height: usize,
    plan: &VideoPlan,
    filter: Filter,
    pad: bool,
) -> Result<RgbImage> {
    let (cw, ch) = (plan.content.0 as usize, plan.content.1 as usize);
    let (tw, th) = (plan.target.0 as usize, plan.target.1 as usize);
    let resized = if (cw, ch) == (width, height) {
        None
    } else {
        Some(resize_rgb(frame, width, height, cw, ch, filter, false)?)
    };
    if !pad {
        return Ok(RgbImage {
            width: cw,
            height: ch,
            data: resized.unwrap_or_else(|| frame.to_vec()),
        });
    }
    let content: &[u8] = resized.as_deref().unwrap_or(frame);
    let mut data = vec![0u8; tw * th * 3];
    for (dst, src) in data
        .chunks_exact_mut(tw * 3)
        .zip(content.chunks_exact(cw * 3))
    {
        dst[..cw * 3].copy_from_slice(src);
    }
    Ok(RgbImage {
        width: tw,
        height: th,
        data,
    })
}

/// `patchify` (video_processing_glm5_next.py:314-352) of the normalised canvases: rows ordered
/// by frame pair, then 2×2 block-major; each row `(c, tp, ky, kx)`, frames `2k`, `2k+1` as
/// `tp` = 0, 1 of pair `k`.
fn patchify(
    frames: &[RgbImage],
    p: usize,
    tp: usize,
    merge: usize,
    plan: &VideoPlan,
    norm: &Normalize,
    parallel: bool,
) -> Vec<f32> {
    let [t, gh, gw] = plan.grid_thw.map(|x| x as usize);
    let pp = p * p;
    let row = 3 * tp * pp;
    let per_pair = gh * gw * row;
    let mut out = vec![0f32; t * per_pair];
    let body = |(k, dst): (usize, &mut [f32])| {
        let mut stage = vec![0f32; 3 * pp];
        for (j, r) in dst.chunks_exact_mut(row).enumerate() {
            let (bh, rest) = (
                j / ((gw / merge) * merge * merge),
                j % ((gw / merge) * merge * merge),
            );
            let (bw, m) = (rest / (merge * merge), rest % (merge * merge));
            let (py, px) = (bh * merge + m / merge, bw * merge + m % merge);
            for s in 0..tp {
                // patchify pads an odd count with the last frame (:325-328).
                let f = &frames[(k * tp + s).min(frames.len() - 1)];
                let (a, rest) = stage.split_at_mut(pp);
                let (b, c) = rest.split_at_mut(pp);
                norm.window(
                    &f.data,
                    Window::square(f.width, px * p, py * p, p),
                    [a, b, c],
                );
                for ch in 0..3 {
                    let o = ch * tp * pp + s * pp;
                    r[o..o + pp].copy_from_slice(&stage[ch * pp..(ch + 1) * pp]);
                }
            }
        }
    };
    if parallel {
        out.par_chunks_mut(per_pair).enumerate().for_each(body);
    } else {
        out.chunks_mut(per_pair).enumerate().for_each(body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::law::Glm5NextLaw;
    use safetensors::SafeTensors;
    use sha2::{Digest, Sha256};
    use std::path::{Path, PathBuf};

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
    }

    fn sha256_hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn glm5_configs() -> ModelConfigs {
        ModelConfigs::from_dir(&fixtures().join("models/glm5_next")).expect("glm5_next configs")
    }

    /// One upstream video case: its input frames (HWC), metadata JSON and tensors.
    struct Case {
        name: String,
        width: u32,
        height: u32,
        frames: Vec<Vec<u8>>,
        meta: Value,
        indices: Vec<i64>,
        /// glm5_next `video_grid_thw`.
        grid: Option<Vec<i64>>,
        /// gemma4 `num_frames_per_video`, `num_soft_tokens_per_video`.
        counts: Option<(i64, i64)>,
        resized: Option<Vec<u8>>,
    }

    fn i64s(st: &SafeTensors<'_>, name: &str) -> Vec<i64> {
        st.tensor(name)
            .expect(name)
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect()
    }

    /// Every case of `fixtures/outputs/<variant>/` (written by `oracle/fam_video.py` from
    /// upstream's video processors); at least `min` of them.
    fn cases(variant: &str, min: usize) -> Vec<Case> {
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
    fn preprocessor_for(meta: &Value) -> VideoPreprocessor {
        let dict = &meta["video_processor_config"];
        let model = meta["model"].as_str().expect("model");
        let cfg = ModelConfigs::from_dir(&fixtures().join(model)).expect("configs");
        VideoPreprocessor::from_configs(&cfg, Some(dict), VideoSettings::default())
            .expect("video preprocessor")
    }

    fn metadata_of(meta: &Value) -> VideoMetadata {
        let m = &meta["video_metadata"];
        VideoMetadata {
            total_num_frames: m["total_num_frames"].as_u64().expect("total_num_frames"),
            fps: m["fps"].as_f64(),
            duration: m["duration"].as_f64(),
        }
    }

    /// The prompt against upstream's runs: special tokens `{token, id, count}` (only `<|image|>`
    /// receiving rows) and timestamp text `{text}`.
    fn assert_prompt(case: &str, got: &[VideoPiece], want: &Value) {
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
    fn chw(frames: &[RgbImage]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            for c in 0..3 {
                out.extend(f.data.iter().skip(c).step_by(3));
            }
        }
        out
    }

    fn png(frame: &[u8], w: u32, h: u32) -> Vec<u8> {
        use image::ImageEncoder;
        let mut buf = Vec::new();
        image::codecs::png::PngEncoder::new(&mut buf)
            .write_image(frame, w, h, image::ExtendedColorType::Rgb8)
            .expect("png");
        buf
    }

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

    /// The video `smart_resize` with `num_frames` = the temporal patch is the image law.
    #[test]
    fn smart_resize_of_two_frames_is_the_image_law() {
        for max_t in [8000u64, 240_000, 12] {
            let l = Glm5NextLaw {
                max_image_tokens: max_t,
                ..Default::default()
            };
            for (w, h) in [
                (20, 15),
                (1, 1),
                (28, 28),
                (1000, 60),
                (60, 1000),
                (1920, 1080),
                (4000, 3000),
                (333, 777),
                (12000, 17),
            ] {
                let canvas = law::glm5_next_canvas(&l, h, w).map_err(|e| e.to_string());
                let video = smart_resize(&l, h, w, 2).map_err(|e| e.to_string());
                assert_eq!(video, canvas, "{w}x{h} max {max_t}");
                if let Ok(c) = canvas {
                    assert_eq!(
                        content_size(&l, h, w, c, 2),
                        law::glm5_next_content(&l, h, w, c),
                        "{w}x{h}"
                    );
                }
            }
        }
    }

    fn glm5() -> VideoPreprocessor {
        VideoPreprocessor::from_configs(&glm5_configs(), None, VideoSettings::default())
            .expect("glm5_next video")
    }

    /// 10 000 frames are refused from the metadata alone: no frame is looked at (the raw frames
    /// here are empty slices and the encoded ones are not images: a frame check would say so).
    #[test]
    fn ten_thousand_frames_are_refused_from_the_metadata() {
        let pre = glm5();
        let meta = VideoMetadata {
            total_num_frames: 10_000,
            fps: Some(30.0),
            duration: None,
        };
        let empty: Vec<&[u8]> = vec![&[]; 10_000];
        let junk = [0u8; 4];
        let sources = vec![ImageSource::Bytes(&junk); 10_000];
        for frames in [
            VideoFrames::Rgb {
                width: 1920,
                height: 1080,
                frames: &empty,
            },
            VideoFrames::Encoded(&sources),
        ] {
            let video = Video {
                frames,
                metadata: meta,
            };
            for r in [
                pre.plan(&video).map(|_| ()),
                pre.prepare_video(&video).map(|_| ()),
            ] {
                match r {
                    Err(PrepError::VideoOverBudget {
                        what,
                        amount: 10_000,
                        budget: DEFAULT_MAX_VIDEO_FRAMES,
                    }) => assert_eq!(what, "frames"),
                    other => panic!("{other:?}"),
                }
            }
        }
        assert!(matches!(
            pre.plan_video(&meta, 1920, 1080),
            Err(PrepError::VideoOverBudget { .. })
        ));
    }

    /// 10⁹ pixels in total (4000 frames of 500×500 at the target rate, 2048 of them sampled)
    /// are refused from the metadata: by the sampled-pixel budget when planning, by the byte
    /// budget for raw frames (whose empty slices show no frame was read).
    #[test]
    fn a_billion_pixels_are_refused_from_the_metadata() {
        let pre = glm5();
        let meta = VideoMetadata {
            total_num_frames: 4000,
            fps: Some(2.0),
            duration: None,
        };
        match pre.plan_video(&meta, 500, 500) {
            Err(PrepError::VideoOverBudget { amount, budget, .. }) => {
                assert_eq!(amount, 2048 * 500 * 500);
                assert_eq!(budget, DEFAULT_MAX_VIDEO_PIXELS);
            }
            other => panic!("{other:?}"),
        }
        let empty: Vec<&[u8]> = vec![&[]; 4000];
        let video = Video {
            frames: VideoFrames::Rgb {
                width: 500,
                height: 500,
                frames: &empty,
            },
            metadata: meta,
        };
        match pre.prepare_video(&video) {
            Err(PrepError::VideoOverBudget { amount, budget, .. }) => {
                assert_eq!(amount, 4000 * 500 * 500 * 3);
                assert_eq!(budget, DEFAULT_MAX_VIDEO_BYTES);
            }
            other => panic!("{other:?}"),
        }
        // Within the frame and byte budgets, the sampled pixels still decide (encoded frames:
        // refused before any header is read, the bytes here are no image).
        let junk = [0u8; 4];
        let sources = vec![ImageSource::Bytes(&junk); 4000];
        let small = VideoPreprocessor::from_configs(
            &glm5_configs(),
            None,
            VideoSettings {
                limits: VideoLimits {
                    max_pixels: 1000,
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .expect("pre");
        let raw = vec![0u8; 20 * 20 * 3];
        let frames: Vec<&[u8]> = vec![&raw; 4000];
        let video = Video {
            frames: VideoFrames::Rgb {
                width: 20,
                height: 20,
                frames: &frames,
            },
            metadata: meta,
        };
        assert!(matches!(
            small.prepare_video(&video),
            Err(PrepError::VideoOverBudget { .. })
        ));
        let video = Video {
            frames: VideoFrames::Encoded(&sources),
            metadata: meta,
        };
        // the sampled encoded frames' headers are read first (to learn the size): junk is a frame error
        assert!(matches!(
            small.prepare_video(&video),
            Err(PrepError::VideoFrame { index: 0, .. })
        ));
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

    /// Runs `[[first, step, count], …]` back to an index list.
    fn expand(runs: &Value) -> Vec<u64> {
        let mut out = Vec::new();
        for r in runs.as_array().expect("runs") {
            let (a, d, n) = (
                r[0].as_i64().unwrap_or(0),
                r[1].as_i64().unwrap_or(0),
                r[2].as_i64().unwrap_or(0),
            );
            out.extend((0..n).map(|k| (a + k * d) as u64));
        }
        out
    }

    /// A float written as Python's repr, parsed exactly (`str::parse` rounds correctly).
    fn float(v: &Value) -> Option<f64> {
        v.as_str().map(|s| s.parse::<f64>().expect("a float repr"))
    }

    /// Upstream's own functions on a grid of inputs (`outputs/video_laws/grid.safetensors`,
    /// written by `oracle/fam_video.py`): `Glm5NextVideoProcessor.sample_frames` over frame
    /// counts, frame rates, durations, target rates, `max_frames` and `max_duration`; its
    /// `smart_resize` over frame counts, sizes and budgets; gemma4's `num_frames` sampling and
    /// `mm:ss` timestamps. Every value equal, every upstream refusal an error here.
    #[test]
    fn upstream_law_grids() {
        let path = fixtures().join("outputs/video_laws/grid.safetensors");
        let bytes = std::fs::read(&path).expect("video_laws/grid (cargo xtask fixtures)");
        let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
        let meta: Value = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get("fixture"))
            .and_then(|s| serde_json::from_str(s).ok())
            .expect("fixture metadata");
        let rows = |key: &str| meta[key]["rows"].as_array().cloned().expect(key);
        let mut checked = 0;
        for r in rows("glm5_next_sample_frames") {
            let law = Glm5NextVideoLaw {
                fps: float(&r[3]).expect("target"),
                max_frames: r[4].as_u64().expect("max_frames"),
                max_duration: r[5].as_f64().expect("max_duration"),
                ..Default::default()
            };
            let m = VideoMetadata {
                total_num_frames: r[0].as_u64().expect("total"),
                fps: float(&r[1]),
                duration: float(&r[2]),
            };
            let got = glm5_next_sample(&law, &m);
            match &r[6] {
                Value::String(e) => assert!(got.is_err(), "{r}: upstream {e}, here {got:?}"),
                // an empty sample: upstream's processor then fails (ZeroDivisionError in
                // smart_resize); refused here at once
                runs if expand(runs).is_empty() => assert!(got.is_err(), "{r}: {got:?}"),
                runs => assert_eq!(got.ok(), Some(expand(runs)), "{r}"),
            }
            checked += 1;
        }
        for r in rows("glm5_next_smart_resize") {
            let l = Glm5NextLaw {
                max_image_tokens: r[3].as_u64().expect("max"),
                min_image_tokens: r[4].as_u64().expect("min"),
                ..Default::default()
            };
            let (n, h, w) = (
                r[0].as_u64().expect("n"),
                r[1].as_u64().expect("h") as u32,
                r[2].as_u64().expect("w") as u32,
            );
            let got = smart_resize(&l, h, w, n);
            match &r[5] {
                Value::String(e) => assert!(got.is_err(), "{r}: upstream {e}, here {got:?}"),
                hw => assert_eq!(
                    got.ok(),
                    Some((hw[0].as_u64().unwrap_or(0), hw[1].as_u64().unwrap_or(0))),
                    "{r}"
                ),
            }
            checked += 1;
        }
        for r in rows("gemma4_sample_frames") {
            let law = Gemma4VideoLaw {
                num_frames: r[1].as_u64().expect("num_frames"),
                ..Default::default()
            };
            let m = VideoMetadata {
                total_num_frames: r[0].as_u64().expect("total"),
                fps: Some(24.0),
                duration: None,
            };
            let got = gemma4_sample(&law, &m);
            match &r[2] {
                Value::String(e) => assert!(got.is_err(), "{r}: upstream {e}, here {got:?}"),
                idx => {
                    let want: Vec<u64> = idx
                        .as_array()
                        .expect("indices")
                        .iter()
                        .filter_map(Value::as_u64)
                        .collect();
                    assert_eq!(got.ok(), Some(want), "{r}");
                }
            }
            checked += 1;
        }
        for r in rows("gemma4_timestamps") {
            let seconds = r[0].as_u64().expect("index") as f64 / float(&r[1]).expect("fps");
            assert_eq!(
                Some(gemma4_timestamp(seconds).as_str()),
                r[2].as_str(),
                "{r}"
            );
            checked += 1;
        }
        assert!(checked >= 800, "{checked} grid rows");
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
