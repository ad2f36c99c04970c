//! The video laws (`Glm5NextVideoProcessor`, `Gemma4VideoProcessor`) and reading them from a
//! video processor config (`processor_config.json` `video_processor` or
//! `video_preprocessor_config.json`), with the caller's [`VideoSettings`] overriding it.

use serde_json::Value;

use super::{VideoSettings, MAX_SAMPLED_FRAMES};
use crate::config::{self, ModelConfigs};
use crate::error::{PrepError, Result};
use crate::law::{self, Law, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD};
use crate::resize::Filter;

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
    pub(super) fn image_law(&self) -> law::Glm5NextLaw {
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
    pub(super) fn image_law(&self) -> law::Gemma4Law {
        law::Gemma4Law {
            patch_size: self.patch_size,
            pooling_kernel_size: self.pooling_kernel_size,
            max_soft_tokens: self.max_soft_tokens,
            filter: self.filter,
            rescale_factor: self.rescale_factor,
        }
    }
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
pub(super) fn glm5_next_video_law(
    v: Option<&Value>,
    s: &VideoSettings,
) -> Result<Glm5NextVideoLaw> {
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
pub(super) fn gemma4_video_law(v: Option<&Value>, s: &VideoSettings) -> Result<Gemma4VideoLaw> {
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
