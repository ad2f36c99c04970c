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
//! every other family is refused with [`PrepError::NoVideoPath`](crate::PrepError::NoVideoPath).

mod config;
mod geometry;
mod plan;
mod preprocess;
mod sample;
#[cfg(test)]
mod test_util;

pub use config::{
    read_video_config, video_processor_dict, Gemma4VideoLaw, Glm5NextVideoLaw,
    GEMMA4_VIDEO_DEFAULT_FPS, GEMMA4_VIDEO_MAX_SOFT_TOKENS, GEMMA4_VIDEO_NUM_FRAMES,
    GLM5_NEXT_VIDEO_FPS, GLM5_NEXT_VIDEO_MAX_DURATION, GLM5_NEXT_VIDEO_MAX_FRAMES,
    GLM5_NEXT_VIDEO_MAX_IMAGE_TOKENS, GLM5_NEXT_VIDEO_MIN_IMAGE_TOKENS,
};
pub use geometry::{content_size, smart_resize};
pub use sample::{gemma4_sample, glm5_next_sample};

use serde_json::Value;

use crate::config::Token;
use crate::plan::{Family, PromptRun};
use crate::prepare::{grid_row, NamedTensor, TensorData};
use crate::source::{AdmissionLimits, ImageSource};
use tower_core::{GemmaImage, GlmImage};

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
            max_output_bytes: crate::config::DEFAULT_MAX_OUTPUT_BYTES,
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
    pub fn glm(&self) -> Option<GlmImage<'_>> {
        let rows = match &self.tensor("pixel_values_videos")?.data {
            TensorData::F32(v) => v.as_slice(),
            _ => return None,
        };
        let g = match &self.tensor("video_grid_thw")?.data {
            TensorData::I64(v) => v,
            _ => return None,
        };
        Some(GlmImage {
            patches: rows,
            grid_thw: grid_row(g)?,
        })
    }

    /// The gemma4 tower inputs, one image per frame (its real patches, no padding rows).
    pub fn gemma4_frames(&self) -> Option<Vec<GemmaImage<'_>>> {
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
                Some(GemmaImage {
                    patches: pv.get(f * max_patches * row..(f * max_patches + n) * row)?,
                    positions: p.get(..n * 2)?,
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
